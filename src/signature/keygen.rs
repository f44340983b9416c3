//! Key pair generation for `payhook keygen` and for tests: ring for EC and Ed25519, and,
//! with the `keygen-rsa` feature, the `rsa` crate for the one thing ring cannot do,
//! generating RSA keys. The feature is off for a merchant's service: verification never
//! needs it, and it keeps the `rsa` crate (and its advisories) out of the service's build.

use ring::{rand::SystemRandom, signature as ring_sig};
#[cfg(feature = "keygen-rsa")]
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};

use super::algorithm::{Algorithm, KeyKind};
use super::error::Error;

/// Size of generated RSA keys.
#[cfg(feature = "keygen-rsa")]
const RSA_BITS: usize = 2048;

/// DER prefixes of a SubjectPublicKeyInfo, to which the raw public key is appended.
const SPKI_P256_PREFIX: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
const SPKI_P384_PREFIX: &[u8] = &[
    0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b,
    0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00,
];
const SPKI_ED25519_PREFIX: &[u8] = &[
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// An Ed25519 private key as RFC 8410 writes it (a version 1 `OneAsymmetricKey`, the
/// 32-byte seed in an OCTET STRING), to which the seed is appended: the form OpenSSL,
/// Python's `cryptography`, Go and Java read.
const PKCS8_V1_ED25519_PREFIX: &[u8] = &[
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];
/// ring's Ed25519 private key: version 2, the same algorithm and seed, then the public key
/// (RFC 5958's `[1]`), which OpenSSL 3.0 and `cryptography` refuse to read.
const PKCS8_V2_ED25519_PREFIX: &[u8] = &[
    0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];
const ED25519_SEED_BYTES: usize = 32;

/// A new key pair as PEM text.
#[derive(Clone)]
pub struct KeyPairPem {
    /// PKCS#8 `BEGIN PRIVATE KEY`.
    pub private_pem: String,
    /// SubjectPublicKeyInfo `BEGIN PUBLIC KEY`.
    pub public_pem: String,
}

impl std::fmt::Debug for KeyPairPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPairPem")
            .field("private_pem", &"***")
            .field("public_pem", &self.public_pem)
            .finish()
    }
}

/// Generates a key pair for `algorithm` (RSA keys are 2048 bits).
///
/// # Errors
///
/// [`Error`] when the system's random source or encoder fails, or for an RSA
/// algorithm when payhook was built without the `keygen-rsa` feature.
pub fn generate_key_pair(algorithm: Algorithm) -> Result<KeyPairPem, Error> {
    let rng = SystemRandom::new();
    let fail = |e: &dyn std::fmt::Display| Error::Keygen(e.to_string());
    let (pkcs8, spki) = match algorithm.key_kind() {
        KeyKind::Rsa => return generate_rsa(),
        KeyKind::EcP256 | KeyKind::EcP384 => {
            let signing = algorithm
                .ecdsa_signing()
                .ok_or_else(|| Error::Keygen("not ECDSA".into()))?;
            let pkcs8 =
                ring_sig::EcdsaKeyPair::generate_pkcs8(signing, &rng).map_err(|e| fail(&e))?;
            let pair = ring_sig::EcdsaKeyPair::from_pkcs8(signing, pkcs8.as_ref(), &rng)
                .map_err(|e| fail(&e))?;
            let prefix = if algorithm.key_kind() == KeyKind::EcP256 {
                SPKI_P256_PREFIX
            } else {
                SPKI_P384_PREFIX
            };
            (
                pkcs8.as_ref().to_vec(),
                [prefix, ring_sig::KeyPair::public_key(&pair).as_ref()].concat(),
            )
        }
        KeyKind::Ed25519 => {
            let pkcs8 = ring_sig::Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| fail(&e))?;
            let pair =
                ring_sig::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|e| fail(&e))?;
            (
                rfc8410_private_key(pkcs8.as_ref())?,
                [
                    SPKI_ED25519_PREFIX,
                    ring_sig::KeyPair::public_key(&pair).as_ref(),
                ]
                .concat(),
            )
        }
    };
    Ok(KeyPairPem {
        private_pem: pem("PRIVATE KEY", &pkcs8)?,
        public_pem: pem("PUBLIC KEY", &spki)?,
    })
}

/// ring's version 2 Ed25519 key rewritten in RFC 8410's version 1 form (the seed alone).
fn rfc8410_private_key(ring_pkcs8: &[u8]) -> Result<Vec<u8>, Error> {
    let seed = ring_pkcs8
        .strip_prefix(PKCS8_V2_ED25519_PREFIX)
        .and_then(|rest| rest.get(..ED25519_SEED_BYTES))
        .ok_or_else(|| Error::Keygen("ring wrote an Ed25519 key in an unexpected form".into()))?;
    Ok([PKCS8_V1_ED25519_PREFIX, seed].concat())
}

#[cfg(not(feature = "keygen-rsa"))]
fn generate_rsa() -> Result<KeyPairPem, Error> {
    Err(Error::Keygen(
        "RSA key generation needs payhook's `keygen-rsa` feature (the `payhook keygen` command has it)"
            .into(),
    ))
}

#[cfg(feature = "keygen-rsa")]
fn generate_rsa() -> Result<KeyPairPem, Error> {
    let fail = |e: &dyn std::fmt::Display| Error::Keygen(e.to_string());
    let private =
        rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, RSA_BITS).map_err(|e| fail(&e))?;
    let private_pem = private
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| fail(&e))?
        .to_string();
    let public_pem = private
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| fail(&e))?;
    Ok(KeyPairPem {
        private_pem,
        public_pem,
    })
}

fn pem(label: &str, der: &[u8]) -> Result<String, Error> {
    pem_rfc7468::encode_string(label, pem_rfc7468::LineEnding::LF, der)
        .map_err(|e| Error::Keygen(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::SigningKey;

    #[test]
    fn ed25519_private_keys_are_written_in_rfc_8410_form_and_both_forms_still_load() {
        let pair = generate_key_pair(Algorithm::Ed25519).unwrap();
        let (_, der) = pem_rfc7468::decode_vec(pair.private_pem.as_bytes()).unwrap();
        assert_eq!(
            der.len(),
            PKCS8_V1_ED25519_PREFIX.len() + ED25519_SEED_BYTES
        );
        assert!(der.starts_with(PKCS8_V1_ED25519_PREFIX));
        assert!(SigningKey::from_pkcs8(pair.private_pem.as_bytes(), Algorithm::Ed25519).is_ok());

        // A key written by an earlier payhook (ring's version 2) still signs.
        let ring_form = ring_sig::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        let old_pem = pem("PRIVATE KEY", ring_form.as_ref()).unwrap();
        assert!(SigningKey::from_pkcs8(old_pem.as_bytes(), Algorithm::Ed25519).is_ok());
        // The same seed, in either form, is the same key.
        let rewritten = rfc8410_private_key(ring_form.as_ref()).unwrap();
        assert_eq!(
            rewritten[PKCS8_V1_ED25519_PREFIX.len()..],
            ring_form.as_ref()[PKCS8_V2_ED25519_PREFIX.len()..][..ED25519_SEED_BYTES]
        );
        assert!(rfc8410_private_key(b"not a key").is_err());
    }
}
