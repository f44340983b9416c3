//! Public keys in every format an aggregator hands out, and private keys to sign with.
//!
//! Public keys are read from PEM (`BEGIN PUBLIC KEY` or `BEGIN RSA PUBLIC KEY`, several
//! blocks allowed), the DER of either, .NET's `<RSAKeyValue>` XML, a JWK or a JWKS. The
//! format is recognised from the content. Private keys (for signing) are PKCS#8, PEM or DER.

use base64::Engine;
use ring::{
    agreement,
    rand::SystemRandom,
    signature::{self as ring_sig, KeyPair},
};
use serde::Deserialize;
use spki::der::{Decode, asn1::ObjectIdentifier};
use std::borrow::Cow;
use std::fmt;

use super::algorithm::{Algorithm, KeyKind};
use super::error::Error;

const OID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const OID_RSA_PSS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.10");
const OID_EC: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const OID_P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const OID_MGF1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.8");
const OID_SHA1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.14.3.2.26");
const OID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const OID_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.2");
const OID_SHA512: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.3");

/// Smallest RSA modulus accepted, in bits (ring's verifiers refuse smaller ones anyway).
const MIN_RSA_BITS: usize = 2048;

/// `signature` as long as the modulus `n` (its leading zeros stripped, as
/// [`Material::Rsa`] holds it), which ring wants; the same integer, so the same signature:
///
/// * shorter: with the zero bytes in front that a signer writing a minimal integer drops
///   (about once in 256 signatures);
/// * longer by zero bytes in front: without them — a signer writing a signed integer (Java's
///   `BigInteger.toByteArray()`, .NET's `BigInteger` bytes) puts a zero sign byte before
///   every signature whose first bit is set, about half of them.
///
/// A longer one whose extra bytes are not all zero is another integer, left as it is (ring
/// refuses it).
fn fitted_to_modulus<'a>(n: &[u8], signature: &'a [u8]) -> Cow<'a, [u8]> {
    match signature.len().checked_sub(n.len()) {
        None => {
            let mut padded = vec![0u8; n.len() - signature.len()];
            padded.extend_from_slice(signature);
            Cow::Owned(padded)
        }
        Some(extra) => match signature.split_at(extra) {
            (sign, rest) if sign.iter().all(|b| *b == 0) => Cow::Borrowed(rest),
            _ => Cow::Borrowed(signature),
        },
    }
}

/// The largest RSA modulus ring verifies with (`RSA_PKCS1_2048_8192_*`, `RSA_PSS_2048_8192_*`).
const MAX_RSA_BITS: usize = 8192;

/// The largest public exponent ring verifies with: 2^33 − 1.
const MAX_RSA_EXPONENT: u64 = (1 << 33) - 1;

/// Refuses an RSA key every verification would refuse (ring's bounds): a modulus of over
/// [`MAX_RSA_BITS`], or a public exponent `e` (big-endian, without leading zeros, as
/// [`Material::Rsa`] holds it) that is even, below 3 or over [`MAX_RSA_EXPONENT`].
fn check_rsa_verifiable(bits: usize, e: &[u8]) -> Result<(), Error> {
    if bits > MAX_RSA_BITS {
        return Err(Error::UnusableRsaKey(format!(
            "a modulus of {bits} bits; at most {MAX_RSA_BITS} are verified"
        )));
    }
    let exponent = (e.len() <= 8).then(|| {
        e.iter()
            .fold(0u64, |value, byte| (value << 8) | u64::from(*byte))
    });
    match exponent {
        Some(e) if (3..=MAX_RSA_EXPONENT).contains(&e) && e % 2 == 1 => Ok(()),
        Some(e) => Err(Error::UnusableRsaKey(format!(
            "public exponent {e}; it must be odd, at least 3 and at most 2^33 - 1"
        ))),
        None => Err(Error::UnusableRsaKey(
            "a public exponent of more than 64 bits; it must be at most 2^33 - 1".into(),
        )),
    }
}

/// Refuses an EC public key whose point is not on its curve (or is its point at infinity):
/// every verification would refuse it, and every callback would be answered 401. ring checks
/// the point only when it uses it, and its key agreement checks it the same way as its
/// verification does: an agreement with a key of our own, made for the purpose and
/// discarded, tells.
fn check_on_curve(
    (curve, name): (&'static agreement::Algorithm, &str),
    point: &[u8],
) -> Result<(), Error> {
    let ours =
        agreement::EphemeralPrivateKey::generate(curve, &SystemRandom::new()).map_err(|_| {
            Error::Keygen(format!(
                "no {name} key to check a point with: no randomness"
            ))
        })?;
    agreement::agree_ephemeral(
        ours,
        &agreement::UnparsedPublicKey::new(curve, point),
        |_| (),
    )
    .map_err(|_| Error::UnusableEcKey(format!("its point is not on the curve {name}")))
}

/// The Ed25519 points of small order (1, 2, 4 and 8) as encoded, but for the sign of x
/// (bit 255): the identity (y = 1), y = p − 1, y = 0, the two y of the points of order 8,
/// and the non-canonical encodings of 0 and 1 (p, p + 1). The list libsodium refuses
/// (`has_small_order`).
///
/// Under such a key, [k]A takes at most eight values, so a signature made without any
/// private key verifies: R the identity and S = 0 pass for one message in eight or more
/// (where [k]A is the identity). All zero bytes, a placeholder, is one of them.
const ED25519_SMALL_ORDER: [[u8; 32]; 7] = [
    [0; 32],
    [
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0,
    ],
    [
        0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98,
        0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53,
        0xfc, 0x05,
    ],
    [
        0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67,
        0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac,
        0x03, 0x7a,
    ],
    ed25519_near_p(0xec),
    ed25519_near_p(0xed),
    ed25519_near_p(0xee),
];

/// p − 1, p or p + 1 (p = 2^255 − 19) as an Ed25519 encoding, by its first byte.
const fn ed25519_near_p(first: u8) -> [u8; 32] {
    let mut bytes = [0xff; 32];
    bytes[0] = first;
    bytes[31] = 0x7f;
    bytes
}

/// Refuses an Ed25519 key of small order ([`ED25519_SMALL_ORDER`]): it would accept
/// signatures anyone can make.
fn check_ed25519_order(point: &[u8]) -> Result<(), Error> {
    let small = point.len() == 32
        && ED25519_SMALL_ORDER
            .iter()
            .any(|weak| weak[..31] == point[..31] && weak[31] == point[31] & 0x7f);
    if small {
        return Err(Error::ForgeableKey(
            "the Ed25519 point is of small order (all zero bytes, a placeholder, is one), so \
             signatures made without any private key verify under it; give the aggregator's \
             public key"
                .into(),
        ));
    }
    Ok(())
}

/// The key material itself.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Material {
    /// Big-endian modulus and exponent, without leading zeros.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// Uncompressed point `04‖x‖y`.
    EcP256(Vec<u8>),
    /// Uncompressed point `04‖x‖y`.
    EcP384(Vec<u8>),
    /// The 32-byte public key.
    Ed25519(Vec<u8>),
}

/// A public key, with the id it was given (config `id`, or a JWK's `kid`).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    id: Option<String>,
    material: Material,
    /// What the key itself says it may verify, when it says (an `id-RSASSA-PSS` key, a JWK's
    /// `alg`): a key is used for nothing else, whatever the configuration names.
    only: Option<Only>,
}

/// A key's own restriction to some algorithms.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Only {
    /// What restricts it, for the error that names it.
    by: String,
    algorithms: &'static [Algorithm],
}

/// The RSA-PSS algorithms: all an `id-RSASSA-PSS` key may verify.
const PSS: &[Algorithm] = &[
    Algorithm::RsaPssSha256,
    Algorithm::RsaPssSha384,
    Algorithm::RsaPssSha512,
];

/// The algorithms a JWK's `alg` (RFC 7518 §3.1, RFC 8037) allows. ES256 and ES384 are the
/// fixed `r‖s` signatures of JWS, and the same curve's DER ones carry the same values.
fn jwk_algorithms(alg: &str) -> Option<&'static [Algorithm]> {
    Some(match alg {
        "RS256" => &[Algorithm::RsaPkcs1Sha256],
        "RS384" => &[Algorithm::RsaPkcs1Sha384],
        "RS512" => &[Algorithm::RsaPkcs1Sha512],
        "PS256" => &[Algorithm::RsaPssSha256],
        "PS384" => &[Algorithm::RsaPssSha384],
        "PS512" => &[Algorithm::RsaPssSha512],
        "ES256" => &[Algorithm::EcdsaP256Sha256Fixed, Algorithm::EcdsaP256Sha256],
        "ES384" => &[Algorithm::EcdsaP384Sha384Fixed, Algorithm::EcdsaP384Sha384],
        "EdDSA" | "Ed25519" => &[Algorithm::Ed25519],
        _ => return None,
    })
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey")
            .field("id", &self.id)
            .field("kind", &self.kind())
            .finish()
    }
}

impl PublicKey {
    /// Reads every public key in `input`: one for PEM/DER/XML/JWK (or several PEM blocks),
    /// all of them for a JWKS.
    ///
    /// # Errors
    ///
    /// [`Error`] when the input is no public key, is a private key or a certificate, or is
    /// of an unsupported kind or size.
    ///
    /// # Examples
    ///
    /// ```
    /// use payhook::signature::{KeyKind, PublicKey};
    ///
    /// let jwk = r#"{"kty":"OKP","crv":"Ed25519","kid":"k1",
    ///               "x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#;
    /// let keys = PublicKey::parse(jwk.as_bytes())?;
    /// assert_eq!(keys[0].kind(), KeyKind::Ed25519);
    /// assert_eq!(keys[0].id(), Some("k1"));
    /// # Ok::<(), payhook::signature::Error>(())
    /// ```
    pub fn parse(input: &[u8]) -> Result<Vec<PublicKey>, Error> {
        let text = std::str::from_utf8(input).ok().map(str::trim);
        match text {
            Some(t) if t.contains("-----BEGIN") => parse_pem_blocks(t),
            Some(t) if t.starts_with('<') => parse_xml(t).map(|k| vec![k]),
            Some(t) if t.starts_with('{') => parse_jwk_or_jwks(t),
            Some(t)
                if !t.is_empty()
                    && t.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+/=\r\n".contains(&b)) =>
            {
                let der = base64::engine::general_purpose::STANDARD
                    .decode(t.replace(['\r', '\n'], ""))
                    .map_err(|e| Error::UnrecognisedKey(format!("base64: {e}")))?;
                parse_der(&der).map(|k| vec![k])
            }
            _ => parse_der(input).map(|k| vec![k]),
        }
    }

    /// The key's id, when it has one.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Gives the key an id (replacing any).
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The key's family.
    pub fn kind(&self) -> KeyKind {
        match self.material {
            Material::Rsa { .. } => KeyKind::Rsa,
            Material::EcP256(_) => KeyKind::EcP256,
            Material::EcP384(_) => KeyKind::EcP384,
            Material::Ed25519(_) => KeyKind::Ed25519,
        }
    }

    /// Checks that this key can verify `algorithm`.
    ///
    /// # Errors
    ///
    /// [`Error::WrongKeyKind`] when it cannot; [`Error::KeyRestricted`] when the key itself
    /// allows other algorithms only (an `id-RSASSA-PSS` key, a JWK's `alg`).
    pub fn check_fits(&self, algorithm: Algorithm) -> Result<(), Error> {
        if self.kind() != algorithm.key_kind() {
            return Err(Error::WrongKeyKind {
                kind: self.kind(),
                algorithm,
            });
        }
        match &self.only {
            Some(only) if !only.algorithms.contains(&algorithm) => Err(Error::KeyRestricted {
                by: only.by.clone(),
                algorithm,
            }),
            _ => Ok(()),
        }
    }

    /// `true` when `other` is the same key, whatever its id.
    pub(crate) fn same_key(&self, other: &PublicKey) -> bool {
        self.material == other.material
    }

    /// `true` when `signature` is a valid `algorithm` signature of `message` by this key.
    /// A key of the wrong kind verifies nothing.
    pub fn verifies(&self, algorithm: Algorithm, message: &[u8], signature: &[u8]) -> bool {
        if self.check_fits(algorithm).is_err() {
            return false;
        }
        match (
            &self.material,
            algorithm.rsa_verification(),
            algorithm.point_verification(),
        ) {
            // ring checks the modulus and derives its Montgomery constants again on every
            // call: about a quarter of a signed callback's instructions with a 2048-bit key
            // (`bench_callbacks -- 20 D --instructions`). ring 0.17 has no public way to keep
            // them with the key; aws-lc-rs's `ParsedPublicKey` does (21.5 µs per verification
            // against ring's 30 µs, measured outside the repository on 2026-11-26).
            (Material::Rsa { n, e }, Some(params), _) => ring_sig::RsaPublicKeyComponents { n, e }
                .verify(params, message, &fitted_to_modulus(n, signature))
                .is_ok(),
            (
                Material::EcP256(point) | Material::EcP384(point) | Material::Ed25519(point),
                _,
                Some(alg),
            ) => ring_sig::UnparsedPublicKey::new(alg, point)
                .verify(message, signature)
                .is_ok(),
            _ => false,
        }
    }

    fn new(material: Material) -> Result<Self, Error> {
        match &material {
            Material::Rsa { n, e } => {
                // An empty modulus (all zero bytes, stripped) has no bits.
                let bits = (n.len() * 8)
                    .saturating_sub(n.first().map_or(0, |b| b.leading_zeros() as usize));
                if bits < MIN_RSA_BITS {
                    return Err(Error::KeyTooSmall(bits));
                }
                check_rsa_verifiable(bits, e)?;
            }
            Material::EcP256(point) => check_on_curve((&agreement::ECDH_P256, "P-256"), point)?,
            Material::EcP384(point) => check_on_curve((&agreement::ECDH_P384, "P-384"), point)?,
            // ring has no public way to check that an Ed25519 point is on the curve apart
            // from a verification; one of small order is refused here.
            Material::Ed25519(point) => check_ed25519_order(point)?,
        }
        Ok(Self {
            id: None,
            material,
            only: None,
        })
    }

    fn only(mut self, by: impl Into<String>, algorithms: &'static [Algorithm]) -> Self {
        self.only = Some(Only {
            by: by.into(),
            algorithms,
        });
        self
    }
}

fn rsa(n: &[u8], e: &[u8]) -> Result<PublicKey, Error> {
    let strip = |bytes: &[u8]| {
        bytes
            .iter()
            .skip_while(|b| **b == 0)
            .copied()
            .collect::<Vec<u8>>()
    };
    PublicKey::new(Material::Rsa {
        n: strip(n),
        e: strip(e),
    })
}

fn parse_pem_blocks(text: &str) -> Result<Vec<PublicKey>, Error> {
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN") {
        let block = &rest[start..];
        let end_marker = block
            .find("-----END")
            .ok_or_else(|| Error::UnrecognisedKey("PEM block without END".into()))?;
        let end = block[end_marker + 8..]
            .find("-----")
            .map_or(block.len(), |i| end_marker + 8 + i + 5);
        keys.push(parse_pem(&block[..end])?);
        rest = &block[end..];
    }
    Ok(keys)
}

fn parse_pem(block: &str) -> Result<PublicKey, Error> {
    let (label, der) = pem_rfc7468::decode_vec(block.as_bytes())
        .map_err(|e| Error::UnrecognisedKey(format!("PEM: {e}")))?;
    match label {
        "PUBLIC KEY" => parse_spki(&der),
        "RSA PUBLIC KEY" => parse_pkcs1(&der),
        "CERTIFICATE" => Err(Error::Certificate),
        l if l.contains("PRIVATE KEY") => Err(Error::PrivateKey),
        other => Err(Error::UnrecognisedKey(format!("PEM label `{other}`"))),
    }
}

/// DER of either a SubjectPublicKeyInfo or a PKCS#1 `RSAPublicKey`.
fn parse_der(der: &[u8]) -> Result<PublicKey, Error> {
    parse_spki(der).or_else(|spki_error| parse_pkcs1(der).map_err(|_| spki_error))
}

fn parse_pkcs1(der: &[u8]) -> Result<PublicKey, Error> {
    let key = pkcs1::RsaPublicKey::from_der(der)
        .map_err(|e| Error::UnrecognisedKey(format!("PKCS#1: {e}")))?;
    rsa(key.modulus.as_bytes(), key.public_exponent.as_bytes())
}

fn parse_spki(der: &[u8]) -> Result<PublicKey, Error> {
    let spki = spki::SubjectPublicKeyInfoRef::from_der(der)
        .map_err(|e| Error::UnrecognisedKey(format!("SubjectPublicKeyInfo: {e}")))?;
    let key = spki.subject_public_key.raw_bytes();
    let oid = spki.algorithm.oid;
    if oid == OID_RSA {
        parse_pkcs1(key)
    } else if oid == OID_RSA_PSS {
        let key = parse_pkcs1(key)?;
        match spki.algorithm.parameters {
            None => Ok(key.only("its SubjectPublicKeyInfo (id-RSASSA-PSS)", PSS)),
            Some(parameters) => {
                let parameters = parameters
                    .decode_as::<pkcs1::RsaPssParams<'_>>()
                    .map_err(|e| Error::UnrecognisedKey(format!("RSASSA-PSS parameters: {e}")))?;
                let only = pss_algorithm(&parameters)?;
                Ok(key.only(
                    format!(
                        "its SubjectPublicKeyInfo (id-RSASSA-PSS with the parameters of {})",
                        only[0]
                    ),
                    only,
                ))
            }
        }
    } else if oid == OID_EC {
        let curve = spki
            .algorithm
            .parameters
            .and_then(|p| p.decode_as::<ObjectIdentifier>().ok())
            .ok_or_else(|| Error::UnsupportedKey("EC key without a named curve".into()))?;
        match curve {
            c if c == OID_P256 => ec_point(key, 32)
                .map(Material::EcP256)
                .and_then(PublicKey::new),
            c if c == OID_P384 => ec_point(key, 48)
                .map(Material::EcP384)
                .and_then(PublicKey::new),
            other => Err(Error::UnsupportedKey(format!(
                "EC curve {other} (P-256 and P-384 are supported)"
            ))),
        }
    } else if oid == OID_ED25519 {
        ed25519(key)
    } else {
        Err(Error::UnsupportedKey(format!("algorithm {oid}")))
    }
}

/// The one algorithm an `id-RSASSA-PSS` key with parameters verifies (RFC 4055 §3.1): its
/// hash, MGF1 with the same hash, and a salt as long as the hash, which is what ring's RSA-PSS
/// verification checks. A key that names anything else could never verify a signature here,
/// so it is refused when it is read rather than answering every callback 401.
fn pss_algorithm(parameters: &pkcs1::RsaPssParams<'_>) -> Result<&'static [Algorithm], Error> {
    let (only, hash_len): (&'static [Algorithm], usize) = match parameters.hash.oid {
        OID_SHA256 => (&[Algorithm::RsaPssSha256], 32),
        OID_SHA384 => (&[Algorithm::RsaPssSha384], 48),
        OID_SHA512 => (&[Algorithm::RsaPssSha512], 64),
        OID_SHA1 => {
            return Err(Error::UnsupportedKey(
                "RSA-PSS key restricted to SHA-1 (SHA-256, SHA-384 and SHA-512 are verified)"
                    .into(),
            ));
        }
        other => {
            return Err(Error::UnsupportedKey(format!(
                "RSA-PSS key restricted to hash {other} (SHA-256, SHA-384 and SHA-512 are verified)"
            )));
        }
    };
    let algorithm = only[0];
    let mask = &parameters.mask_gen;
    if mask.oid != OID_MGF1 || mask.parameters.map(|hash| hash.oid) != Some(parameters.hash.oid) {
        return Err(Error::UnsupportedKey(format!(
            "RSA-PSS key whose mask generation is not MGF1 with its own hash ({algorithm} is verified with MGF1 of the same hash)"
        )));
    }
    if usize::from(parameters.salt_len) != hash_len {
        return Err(Error::UnsupportedKey(format!(
            "RSA-PSS key with a salt of {} bytes ({algorithm} is verified with a salt as long as its hash, {hash_len} bytes)",
            parameters.salt_len
        )));
    }
    Ok(only)
}

/// An uncompressed point of a curve whose coordinates are `len` bytes.
fn ec_point(point: &[u8], len: usize) -> Result<Vec<u8>, Error> {
    if point.len() == 1 + 2 * len && point[0] == 4 {
        Ok(point.to_vec())
    } else {
        Err(Error::UnsupportedKey(
            "EC point not in uncompressed form".into(),
        ))
    }
}

fn ed25519(key: &[u8]) -> Result<PublicKey, Error> {
    if key.len() == 32 {
        PublicKey::new(Material::Ed25519(key.to_vec()))
    } else {
        Err(Error::UnrecognisedKey(format!(
            "Ed25519 key of {} bytes",
            key.len()
        )))
    }
}

/// .NET's `RSA.ToXmlString(false)`: `<RSAKeyValue><Modulus>…</Modulus><Exponent>…</Exponent>`.
fn parse_xml(text: &str) -> Result<PublicKey, Error> {
    let element = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let end = start + text[start..].find(&format!("</{name}>"))?;
        Some(text[start..end].split_whitespace().collect::<String>())
    };
    if !text.contains("<RSAKeyValue") {
        return Err(Error::UnrecognisedKey("XML without <RSAKeyValue>".into()));
    }
    if element("D").is_some() {
        return Err(Error::PrivateKey);
    }
    let decode = |name: &str| {
        let value = element(name)
            .ok_or_else(|| Error::UnrecognisedKey(format!("<RSAKeyValue> without <{name}>")))?;
        base64::engine::general_purpose::STANDARD
            .decode(value)
            .map_err(|e| Error::UnrecognisedKey(format!("<{name}>: {e}")))
    };
    rsa(&decode("Modulus")?, &decode("Exponent")?)
}

/// A JWK's members that matter here (RFC 7517/7518/8037).
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    key_ops: Option<Vec<String>>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
    d: Option<String>,
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<serde_json::Value>,
}

impl Jwk {
    /// `false` for a key a JWKS publishes for something other than verifying signatures:
    /// `use: enc`, `key_ops` without `verify`, or an `alg` of encryption (RFC 7518 §4), such
    /// as the aggregator's key for encrypting to it. A JWKS's other keys are read; a key
    /// meant to verify that payhook cannot read still stops the set (an error at start-up,
    /// rather than a callback signed with it refused later).
    fn may_verify(&self) -> bool {
        const ENCRYPTION: [&str; 6] = ["RSA1_5", "RSA-OAEP", "ECDH-ES", "A128", "A192", "A256"];
        let encrypts = |alg: &str| {
            alg == "dir"
                || alg.starts_with("PBES2")
                || ENCRYPTION.iter().any(|p| alg.starts_with(p))
        };
        self.usage.as_deref() != Some("enc")
            && self
                .key_ops
                .as_ref()
                .is_none_or(|ops| ops.iter().any(|op| op == "verify"))
            && !self.alg.as_deref().is_some_and(encrypts)
    }
}

fn parse_jwk_or_jwks(text: &str) -> Result<Vec<PublicKey>, Error> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::UnrecognisedKey(format!("JSON: {e}")))?;
    if value.get("keys").is_some() {
        let jwks: Jwks = serde_json::from_value(value)
            .map_err(|e| Error::UnrecognisedKey(format!("JWKS: {e}")))?;
        let keys = jwks
            .keys
            .into_iter()
            .map(|k| {
                serde_json::from_value::<Jwk>(k)
                    .map_err(|e| Error::UnrecognisedKey(format!("JWK: {e}")))
            })
            .filter(|jwk| !matches!(jwk, Ok(jwk) if !jwk.may_verify()))
            .map(|jwk| jwk.and_then(parse_jwk))
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(Error::UnrecognisedKey("JWKS without a signing key".into()));
        }
        Ok(keys)
    } else {
        let jwk: Jwk = serde_json::from_value(value)
            .map_err(|e| Error::UnrecognisedKey(format!("JWK: {e}")))?;
        if !jwk.may_verify() {
            return Err(Error::UnsupportedKey(
                "a JWK for encryption (its `use`, `key_ops` or `alg` says so), not for verifying signatures".into(),
            ));
        }
        Ok(vec![parse_jwk(jwk)?])
    }
}

fn parse_jwk(jwk: Jwk) -> Result<PublicKey, Error> {
    if jwk.d.is_some() {
        return Err(Error::PrivateKey);
    }
    let b64 = |field: &Option<String>, name: &str| {
        let text = field
            .as_deref()
            .ok_or_else(|| Error::UnrecognisedKey(format!("JWK without `{name}`")))?;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|e| Error::UnrecognisedKey(format!("JWK `{name}`: {e}")))
    };
    let point = |len: usize| -> Result<Vec<u8>, Error> {
        let (x, y) = (b64(&jwk.x, "x")?, b64(&jwk.y, "y")?);
        if x.len() != len || y.len() != len {
            return Err(Error::UnrecognisedKey(
                "JWK EC coordinates of the wrong length".into(),
            ));
        }
        Ok([&[4u8][..], &x, &y].concat())
    };
    let key = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
        ("RSA", _) => rsa(&b64(&jwk.n, "n")?, &b64(&jwk.e, "e")?)?,
        ("EC", Some("P-256")) => PublicKey::new(Material::EcP256(point(32)?))?,
        ("EC", Some("P-384")) => PublicKey::new(Material::EcP384(point(48)?))?,
        ("OKP", Some("Ed25519")) => ed25519(&b64(&jwk.x, "x")?)?,
        (kty, crv) => {
            return Err(Error::UnsupportedKey(format!(
                "JWK kty `{kty}` crv `{}`",
                crv.unwrap_or("-")
            )));
        }
    };
    let key = match jwk.alg.as_deref() {
        None => key,
        Some(alg) => {
            let algorithms = jwk_algorithms(alg)
                .ok_or_else(|| Error::UnsupportedKey(format!("JWK alg `{alg}`")))?;
            if algorithms[0].key_kind() != key.kind() {
                return Err(Error::UnsupportedKey(format!(
                    "JWK alg `{alg}` on a {} key: `{alg}` needs a {} key, so this key would verify nothing",
                    key.kind(),
                    algorithms[0].key_kind()
                )));
            }
            key.only(format!("its JWK alg `{alg}`"), algorithms)
        }
    };
    Ok(match jwk.kid {
        Some(kid) => key.with_id(kid),
        None => key,
    })
}

/// A private key that signs with one algorithm. Redacted in `Debug`.
///
/// ```
/// use payhook::signature::{Algorithm, Encoding, SigningKey, generate_key_pair};
///
/// let pair = generate_key_pair(Algorithm::Ed25519)?;
/// let key = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), Algorithm::Ed25519)?;
/// let header = Encoding::Base64.encode(&key.sign(b"{}")?);
/// assert!(!header.is_empty());
/// assert_eq!(format!("{key:?}"), "SigningKey(ed25519, ***)");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SigningKey {
    algorithm: Algorithm,
    pair: Pair,
}

enum Pair {
    Rsa(ring_sig::RsaKeyPair),
    Ecdsa(ring_sig::EcdsaKeyPair),
    Ed25519(ring_sig::Ed25519KeyPair),
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({}, ***)", self.algorithm)
    }
}

impl SigningKey {
    /// Reads a PKCS#8 private key (PEM `BEGIN PRIVATE KEY`, or DER) to sign with `algorithm`.
    ///
    /// # Errors
    ///
    /// [`Error::BadPrivateKey`] when it is not PKCS#8 or not a key for `algorithm`.
    pub fn from_pkcs8(input: &[u8], algorithm: Algorithm) -> Result<Self, Error> {
        let bad = |reason: String| Error::BadPrivateKey { algorithm, reason };
        let der = match std::str::from_utf8(input).map(str::trim) {
            Ok(text) if text.starts_with("-----BEGIN") => {
                let (label, der) = pem_rfc7468::decode_vec(text.as_bytes())
                    .map_err(|e| bad(format!("PEM: {e}")))?;
                if label != "PRIVATE KEY" {
                    return Err(bad(format!(
                        "PEM label `{label}`; convert with `openssl pkcs8 -topk8 -nocrypt`"
                    )));
                }
                der
            }
            _ => input.to_vec(),
        };
        let rejected = |e: ring::error::KeyRejected| bad(e.to_string());
        let pair = match algorithm.key_kind() {
            KeyKind::Rsa => Pair::Rsa(ring_sig::RsaKeyPair::from_pkcs8(&der).map_err(rejected)?),
            KeyKind::EcP256 | KeyKind::EcP384 => {
                let signing = algorithm
                    .ecdsa_signing()
                    .ok_or_else(|| bad("not an ECDSA algorithm".into()))?;
                Pair::Ecdsa(
                    ring_sig::EcdsaKeyPair::from_pkcs8(signing, &der, &SystemRandom::new())
                        .map_err(rejected)?,
                )
            }
            KeyKind::Ed25519 => Pair::Ed25519(
                ring_sig::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(rejected)?,
            ),
        };
        Ok(Self { algorithm, pair })
    }

    /// The algorithm this key signs with.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The public half, to verify this key's signatures with.
    pub fn public_key(&self) -> PublicKey {
        let material = match &self.pair {
            Pair::Rsa(pair) => {
                let components: ring_sig::RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
                Material::Rsa {
                    n: components.n,
                    e: components.e,
                }
            }
            Pair::Ecdsa(pair) if self.algorithm.key_kind() == KeyKind::EcP256 => {
                Material::EcP256(pair.public_key().as_ref().to_vec())
            }
            Pair::Ecdsa(pair) => Material::EcP384(pair.public_key().as_ref().to_vec()),
            Pair::Ed25519(pair) => Material::Ed25519(pair.public_key().as_ref().to_vec()),
        };
        PublicKey {
            id: None,
            material,
            only: None,
        }
    }

    /// Signs `message` (the raw body bytes).
    ///
    /// # Errors
    ///
    /// [`Error`] if ring fails, which does not happen with a valid key.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let rng = SystemRandom::new();
        match &self.pair {
            Pair::Rsa(pair) => {
                let padding = self.algorithm.rsa_signing().ok_or(Error::Signing)?;
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(padding, &rng, message, &mut signature)
                    .map_err(|_| Error::Signing)?;
                Ok(signature)
            }
            Pair::Ecdsa(pair) => Ok(pair
                .sign(&rng, message)
                .map_err(|_| Error::Signing)?
                .as_ref()
                .to_vec()),
            Pair::Ed25519(pair) => Ok(pair.sign(message).as_ref().to_vec()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_key_is_refused_where_a_public_key_belongs() {
        let pem = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIHv6f5Q8p5GBp8uA0h6f6a4i4C3n1bD1oW3o2bH6Gx9c\n-----END PRIVATE KEY-----";
        assert!(matches!(
            PublicKey::parse(pem.as_bytes()),
            Err(Error::PrivateKey)
        ));
        let jwk = r#"{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","d":"nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"}"#;
        assert!(matches!(
            PublicKey::parse(jwk.as_bytes()),
            Err(Error::PrivateKey)
        ));
        let xml = "<RSAKeyValue><Modulus>AQAB</Modulus><Exponent>AQAB</Exponent><D>AQAB</D></RSAKeyValue>";
        assert!(matches!(
            PublicKey::parse(xml.as_bytes()),
            Err(Error::PrivateKey)
        ));
    }

    #[test]
    fn certificates_and_garbage_get_clear_errors() {
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
        assert!(matches!(
            PublicKey::parse(cert.as_bytes()),
            Err(Error::Certificate)
        ));
        assert!(matches!(
            PublicKey::parse(b"\x00\x01garbage"),
            Err(Error::UnrecognisedKey(_))
        ));
        assert!(matches!(
            PublicKey::parse(b"{\"kty\":\"oct\",\"k\":\"AA\"}"),
            Err(Error::UnsupportedKey(_))
        ));
    }

    #[test]
    fn a_key_that_says_what_it_verifies_verifies_nothing_else() {
        // `openssl genpkey -algorithm RSA-PSS`: an id-RSASSA-PSS key.
        let pss = "-----BEGIN PUBLIC KEY-----
MIIBIDALBgkqhkiG9w0BAQoDggEPADCCAQoCggEBAM8Ln7qnuSRO4LWvVE6YHayW
W/Sc2U7if+pIn31f9BYWIKhB7ZsOv4t7DcMEwfX3oOxC3PRBX5dgdkkOOxZj4MXR
wE++yMwH9DlZYeTt5TtDS4OfgPh3JyRtzcdNrnGsaoVuPP0GuoEMXvaDAdD2Rx6h
0VC63M7LBLVyt3LC3y89i6yzFBy9/+emJ7qdOdw0c1qnCvnpmNw84Y1bYt7dbs3W
tTOY9j9SBNGKl0Ldh+kHHB4oEmzQd8VEwj33SYtFWfZA5o6MRJs1YNSg5wEs0eRe
T1M6feulOeQNcmJmysW0f/xmgv6f/sVyNvW5N5/0XYtm1BAiOY2bPmrX/BnWdWUC
AwEAAQ==
-----END PUBLIC KEY-----";
        let key = PublicKey::parse(pss.as_bytes()).unwrap().remove(0);
        assert_eq!(key.kind(), KeyKind::Rsa);
        assert!(key.check_fits(Algorithm::RsaPssSha256).is_ok());
        let refused = key.check_fits(Algorithm::RsaPkcs1Sha256).unwrap_err();
        assert!(
            matches!(&refused, Error::KeyRestricted { by, .. } if by.contains("RSASSA-PSS")),
            "{refused}"
        );
        assert!(!key.verifies(Algorithm::RsaPkcs1Sha256, b"body", &[0; 256]));

        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let jwk = |alg: &str| format!(r#"{{"kty":"OKP","crv":"Ed25519","alg":"{alg}","x":"{x}"}}"#);
        let eddsa = PublicKey::parse(jwk("EdDSA").as_bytes()).unwrap().remove(0);
        assert!(eddsa.check_fits(Algorithm::Ed25519).is_ok());
        // An alg that does not fit the key would verify nothing with it: refused when read.
        let mislabelled = PublicKey::parse(jwk("RS256").as_bytes()).unwrap_err();
        assert!(
            matches!(&mislabelled, Error::UnsupportedKey(why) if why.contains("needs a RSA key")),
            "{mislabelled}"
        );
        let p256 = r#"{"kty":"EC","crv":"P-256","alg":"ES384",
            "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
            "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}"#;
        assert!(matches!(
            PublicKey::parse(p256.as_bytes()),
            Err(Error::UnsupportedKey(_))
        ));
        assert!(
            PublicKey::parse(p256.replace("ES384", "ES256").as_bytes()).unwrap()[0]
                .check_fits(Algorithm::EcdsaP256Sha256Fixed)
                .is_ok()
        );
        assert!(matches!(
            PublicKey::parse(jwk("HS256").as_bytes()),
            Err(Error::UnsupportedKey(_))
        ));
    }

    /// `openssl genpkey -algorithm RSA-PSS -pkeyopt rsa_pss_keygen_md:sha384
    /// -pkeyopt rsa_pss_keygen_mgf1_md:sha384 -pkeyopt rsa_pss_keygen_saltlen:48`, and its
    /// signature of `body` (`openssl dgst -sha384 -sigopt rsa_padding_mode:pss
    /// -sigopt rsa_pss_saltlen:48 -sign`).
    const PSS_SHA384: &str = "-----BEGIN PUBLIC KEY-----
MIIBVjBBBgkqhkiG9w0BAQowNKAPMA0GCWCGSAFlAwQCAgUAoRwwGgYJKoZIhvcN
AQEIMA0GCWCGSAFlAwQCAgUAogMCATADggEPADCCAQoCggEBANE/QGdgPyFck2Rd
5e6tVReYJW4DvZPi8hSi40T/YfVdAyM7f7YnHrdQC30zkeNspdnTfdFTy7agzrJF
jTBkYXKilBdmbCqABUCmxTYlN2d/3f+6CGZTM457BjcfPx7K4+eL9b5shQnROqFP
UJRWI5XR41i/jHYA8DV4Z+H5JXHtZoWzUoD5CH1uO4nYkk+SA3xacbgTsD2bvRd1
OsFs5nk0qDDU62P9P69OiBUh3iXg9fMAlmaQ4vwYQwd7LQAADZs+ykV9KxwikII0
+0R8Uuyuecu5Wy1FBaa7OckMY9320dML0w6tCj+YGpJQVUXI0jBdjB+J3YoN31mg
4gIYYfECAwEAAQ==
-----END PUBLIC KEY-----";
    const PSS_SHA384_SIGNATURE: &str = "h0xMnkn3c1MMHGt0kIGWa2TlkVQyN/OXyfSw/oW9pBmDluN2RSUHIcdI+OANJhzWugQfS+4SmK8f4b5OvHQBqTHhZ0C+oqW6CMPMmI9YpMJKp87u9LVFc1onmvBjaX0AgbZDeGZHSDwkutAQ9aCQdEVimRPxxzI+sSSW6H5m7fuR5jLs1D03BhFPd8tEw9Pov/ZzL5DbSg3geFTvVfXLP5hTLe56cjdYWAi7MZdRoRwt3NgS7jJq4q8fNh/+cfP3mJdcmg+1QT1q0D8hab1RxAtsYvYcsLwSkiKutuRDkP5WIwmuAd2ffNEUY98Kt/xh59CaJ74ORewzDPiowCPWYg==";

    #[test]
    fn an_rsa_pss_key_with_parameters_verifies_only_what_they_name() {
        let key = PublicKey::parse(PSS_SHA384.as_bytes()).unwrap().remove(0);
        let signature = base64::engine::general_purpose::STANDARD
            .decode(PSS_SHA384_SIGNATURE)
            .unwrap();
        assert!(key.verifies(Algorithm::RsaPssSha384, b"body", &signature));
        assert!(!key.verifies(Algorithm::RsaPssSha384, b"bodY", &signature));
        for other in [Algorithm::RsaPssSha256, Algorithm::RsaPssSha512] {
            let refused = key.check_fits(other).unwrap_err();
            assert!(
                matches!(&refused, Error::KeyRestricted { by, .. } if by.contains("rsa-pss-sha384")),
                "{refused}"
            );
        }
    }

    #[test]
    fn an_rsa_pss_key_whose_parameters_ring_cannot_verify_is_refused() {
        // SHA-256 with the defaults for the rest: MGF1 with SHA-1 and a 20-byte salt.
        let sha256_defaults = "-----BEGIN PUBLIC KEY-----
MIIBMzAeBgkqhkiG9w0BAQowEaAPMA0GCWCGSAFlAwQCAQUAA4IBDwAwggEKAoIB
AQCaX7M9jgnHwfttX1frpJKSV50KpFulMfqSUk84LTEzwSF+QEpcbGypmkFAEtLm
IPINmzbf4u6SJas/iz7z3WsZnBFSihR5JA/63iVKCjdBFNyIIPba+SpWHetFENsb
tfCV1+6b6z9ewUyni/H9914ScuCgN9k1UcY8bp8OjEqR7R9/sS0G8+4p/cbMUMtY
4sKmdnKhG5fImeLLFC5XiBHwdV3He7+Zo2G76aQUxfTpVCQ5qfOUlVOhPGktCeiH
mWfgaPakauWQPGRljZh/bCgRNnrFAqyHlNbchoikVoVEtHjSKXulgm4Yzgtv8XTO
w76pH3mhY6G83FUaFv2AHQ/nAgMBAAE=
-----END PUBLIC KEY-----";
        let refused = PublicKey::parse(sha256_defaults.as_bytes()).unwrap_err();
        assert!(
            matches!(&refused, Error::UnsupportedKey(why) if why.contains("MGF1")),
            "{refused}"
        );
        // Empty parameters: every default, SHA-1.
        let sha1 = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQowAAOCAQ8AMIIBCgKCAQEAnwGb1sgnOVLo0+vxX3Ir
oYL7PtdNXGgl3LNJdvL5HQvrw0FFOZmy8a0iHTew4Ff/60TVshdHpiiJ68gKFKvy
EOyX48i/0DBUZ2MjnWDWgmP399rpmo4EBfEu881lWtsdIQ/VtK6JE8TcDbb+FMER
1cDKr1j6Ztj84xVf0NWhIDNdrg+4PjaJ2m42CS+EkVMIzu7F7YdSwozxTZuWNs0R
A6BK3GW+VZaAup9epQSQzYe/ctlPh6Si7VzpUIHhs9N7IJODlPdzVBlWZcmQSIVI
n/ptxmXQwL5Z3EGCjBqr2UitDE7B5uRHXWxH6c04IeOG27O+mYrs99jW8bBoO0Dg
QQIDAQAB
-----END PUBLIC KEY-----";
        let refused = PublicKey::parse(sha1.as_bytes()).unwrap_err();
        assert!(
            matches!(&refused, Error::UnsupportedKey(why) if why.contains("SHA-1")),
            "{refused}"
        );
    }

    #[test]
    fn a_jwks_skips_the_keys_it_publishes_for_encryption() {
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        let signing = format!(r#"{{"kty":"OKP","crv":"Ed25519","kid":"sig","x":"{x}"}}"#);
        // RSA members that are no key at all: read, they would stop the set.
        let rsa =
            |extra: &str| format!(r#"{{"kty":"RSA","kid":"enc","n":"AA","e":"AQAB",{extra}}}"#);
        for encryption in [
            rsa(r#""use":"enc""#),
            rsa(r#""alg":"RSA-OAEP-256""#),
            rsa(r#""alg":"RSA1_5""#),
            rsa(r#""key_ops":["encrypt","wrapKey"]"#),
            r#"{"kty":"oct","alg":"A256KW","k":"AA"}"#.to_owned(),
        ] {
            let jwks = format!(r#"{{"keys":[{encryption},{signing}]}}"#);
            let keys = PublicKey::parse(jwks.as_bytes()).unwrap();
            assert_eq!(keys.len(), 1, "{encryption}");
            assert_eq!(keys[0].id(), Some("sig"));
            // Alone, it is no key to verify with.
            assert!(matches!(
                PublicKey::parse(encryption.as_bytes()),
                Err(Error::UnsupportedKey(_))
            ));
        }
        // A key meant to verify that cannot be read still stops the set.
        let unreadable = rsa(r#""use":"sig""#);
        let jwks = format!(r#"{{"keys":[{unreadable},{signing}]}}"#);
        assert!(matches!(
            PublicKey::parse(jwks.as_bytes()),
            Err(Error::KeyTooSmall(0))
        ));
        let verify_op = rsa(r#""key_ops":["verify"]"#);
        let jwks = format!(r#"{{"keys":[{verify_op},{signing}]}}"#);
        assert!(PublicKey::parse(jwks.as_bytes()).is_err());
    }

    #[test]
    fn small_rsa_keys_are_refused() {
        let xml = format!(
            "<RSAKeyValue><Modulus>{}</Modulus><Exponent>AQAB</Exponent></RSAKeyValue>",
            base64::engine::general_purpose::STANDARD.encode([0xffu8; 128])
        );
        assert!(matches!(
            PublicKey::parse(xml.as_bytes()),
            Err(Error::KeyTooSmall(1024))
        ));
        // A zero modulus has no bits at all: refused, not wrapped around to a huge size.
        for modulus in ["AA==", "AAAA"] {
            let xml = format!(
                "<RSAKeyValue><Modulus>{modulus}</Modulus><Exponent>AQAB</Exponent></RSAKeyValue>"
            );
            assert!(matches!(
                PublicKey::parse(xml.as_bytes()),
                Err(Error::KeyTooSmall(0))
            ));
        }
        assert!(matches!(
            PublicKey::parse(br#"{"kty":"RSA","n":"AA","e":"AQAB"}"#),
            Err(Error::KeyTooSmall(0))
        ));
    }

    #[test]
    fn rsa_keys_no_verification_accepts_are_refused_when_read() {
        let xml = |modulus_bytes: usize, exponent: &[u8]| {
            let engine = base64::engine::general_purpose::STANDARD;
            format!(
                "<RSAKeyValue><Modulus>{}</Modulus><Exponent>{}</Exponent></RSAKeyValue>",
                engine.encode(vec![0xffu8; modulus_bytes]),
                engine.encode(exponent)
            )
        };
        let unusable = |modulus_bytes, exponent: &[u8]| {
            matches!(
                PublicKey::parse(xml(modulus_bytes, exponent).as_bytes()),
                Err(Error::UnusableRsaKey(_))
            )
        };
        // 8192 bits and 65537, 3, 2^33 - 1: taken.
        for exponent in [&[1u8, 0, 1][..], &[3], &[1, 0xff, 0xff, 0xff, 0xff]] {
            assert!(
                PublicKey::parse(xml(1024, exponent).as_bytes()).is_ok(),
                "{exponent:?}"
            );
        }
        assert!(unusable(1025, &[1, 0, 1]), "8200 bits");
        for exponent in [
            &[1u8][..],
            &[0],
            &[],
            &[0, 2],
            &[1, 0, 0],
            &[2, 0, 0, 0, 1],
            &[9; 9],
        ] {
            assert!(unusable(256, exponent), "{exponent:?}");
        }
    }

    #[test]
    fn ec_keys_whose_point_is_not_on_their_curve_are_refused_when_read() {
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        for (algorithm, curve, len) in [
            (Algorithm::EcdsaP256Sha256, "P-256", 32),
            (Algorithm::EcdsaP384Sha384, "P-384", 48),
        ] {
            let pair = super::super::generate_key_pair(algorithm).unwrap();
            let public = PublicKey::parse(pair.public_pem.as_bytes())
                .unwrap()
                .remove(0);
            let (Material::EcP256(point) | Material::EcP384(point)) = &public.material else {
                panic!("not an EC key");
            };
            let jwk = |y: &[u8]| {
                format!(
                    r#"{{"kty":"EC","crv":"{curve}","x":"{}","y":"{}"}}"#,
                    engine.encode(&point[1..=len]),
                    engine.encode(y)
                )
            };
            let y = &point[1 + len..];
            assert!(PublicKey::parse(jwk(y).as_bytes()).is_ok(), "{curve}");
            // The same x with y one off: a point of no curve, read from a JWK and from PEM.
            let mut off = y.to_vec();
            off[len - 1] ^= 1;
            let refused = PublicKey::parse(jwk(&off).as_bytes()).unwrap_err();
            assert!(
                matches!(&refused, Error::UnusableEcKey(reason) if reason.contains(curve)),
                "{refused}"
            );
            let mut der = pem_body(&pair.public_pem);
            let last = der.len() - 1;
            der[last] ^= 1;
            assert!(
                matches!(PublicKey::parse(&der), Err(Error::UnusableEcKey(_))),
                "{curve} DER"
            );
        }
    }

    #[test]
    fn generated_keys_sign_and_verify_with_every_algorithm() {
        for algorithm in Algorithm::ALL
            .into_iter()
            .filter(|a| a.key_kind() != KeyKind::Rsa)
        {
            let pair = super::super::generate_key_pair(algorithm).unwrap();
            let signer = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), algorithm).unwrap();
            let public = PublicKey::parse(pair.public_pem.as_bytes())
                .unwrap()
                .remove(0);
            assert_eq!(public, signer.public_key().clone());
            let signature = signer.sign(b"body").unwrap();
            assert!(
                public.verifies(algorithm, b"body", &signature),
                "{algorithm}"
            );
            assert!(
                !public.verifies(algorithm, b"bodY", &signature),
                "{algorithm}"
            );
        }
    }

    /// The DER inside a PEM block.
    /// A signature made with no private key: R the identity, S = 0.
    const FORGED: [u8; 64] = {
        let mut signature = [0; 64];
        signature[0] = 1;
        signature
    };

    /// Whether [`FORGED`] verifies under `point` for one of 256 messages.
    fn accepts_a_forgery(point: &[u8]) -> bool {
        (0..256u32).any(|i| {
            ring_sig::UnparsedPublicKey::new(&ring_sig::ED25519, point)
                .verify(&i.to_be_bytes(), &FORGED)
                .is_ok()
        })
    }

    #[test]
    fn ed25519_keys_of_small_order_accept_forged_signatures_and_are_refused_when_read() {
        let spki = |point: &[u8]| {
            let mut der = vec![
                0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
            ];
            der.extend_from_slice(point);
            der
        };
        let jwk = |point: &[u8]| {
            format!(
                r#"{{"kty":"OKP","crv":"Ed25519","x":"{}"}}"#,
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(point)
            )
        };
        for (i, weak) in ED25519_SMALL_ORDER.iter().enumerate() {
            // The list is what it says: under each canonical encoding (all but p and
            // p + 1), ring verifies a signature no one made.
            if i < 5 {
                assert!(accepts_a_forgery(weak), "entry {i}");
            }
            let mut signed = *weak;
            signed[31] |= 0x80;
            for point in [*weak, signed] {
                for read in [
                    PublicKey::parse(&spki(&point)),
                    PublicKey::parse(jwk(&point).as_bytes()),
                ] {
                    let refused = read.unwrap_err();
                    assert!(
                        matches!(&refused, Error::ForgeableKey(reason) if reason.contains("small order")),
                        "entry {i}: {refused}"
                    );
                }
            }
        }
        // A key of its own: refuses the forgery, and is read.
        let pair = super::super::generate_key_pair(Algorithm::Ed25519).unwrap();
        let public = PublicKey::parse(pair.public_pem.as_bytes())
            .unwrap()
            .remove(0);
        let Material::Ed25519(point) = &public.material else {
            panic!("not an Ed25519 key");
        };
        assert!(!accepts_a_forgery(point));
        assert!(PublicKey::parse(&spki(point)).is_ok());
    }

    fn pem_body(pem: &str) -> Vec<u8> {
        let base64: String = pem
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        base64::engine::general_purpose::STANDARD
            .decode(base64)
            .unwrap()
    }
}
