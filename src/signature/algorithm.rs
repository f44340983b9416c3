//! The signature algorithms payhook verifies and signs with, and their names in config.

use ring::signature as ring_sig;
use std::fmt;

use super::error::Error;

/// The family of public key an algorithm needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// RSA, 2048 to 8192 bits.
    Rsa,
    /// ECDSA on NIST P-256.
    EcP256,
    /// ECDSA on NIST P-384.
    EcP384,
    /// Ed25519.
    Ed25519,
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rsa => "RSA",
            Self::EcP256 => "P-256",
            Self::EcP384 => "P-384",
            Self::Ed25519 => "Ed25519",
        })
    }
}

/// A signature algorithm, named in config as [`Algorithm::name`] gives.
///
/// ```
/// use payhook::signature::Algorithm;
///
/// let alg: Algorithm = "ecdsa-p256-sha256-fixed".parse()?;
/// assert_eq!(alg, Algorithm::EcdsaP256Sha256Fixed);
/// assert_eq!(Algorithm::default(), Algorithm::RsaPkcs1Sha256);
/// # Ok::<(), payhook::signature::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256: what .NET's `RSA.SignData` produces. The default.
    #[default]
    RsaPkcs1Sha256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    RsaPkcs1Sha384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    RsaPkcs1Sha512,
    /// RSASSA-PSS with SHA-256, MGF1-SHA-256, salt as long as the digest.
    RsaPssSha256,
    /// RSASSA-PSS with SHA-384.
    RsaPssSha384,
    /// RSASSA-PSS with SHA-512.
    RsaPssSha512,
    /// ECDSA P-256 with SHA-256, ASN.1 DER signature (OpenSSL, Java).
    EcdsaP256Sha256,
    /// ECDSA P-256 with SHA-256, fixed 64-byte `r‖s` signature (.NET's `ECDsa.SignData`).
    EcdsaP256Sha256Fixed,
    /// ECDSA P-384 with SHA-384, ASN.1 DER signature.
    EcdsaP384Sha384,
    /// ECDSA P-384 with SHA-384, fixed 96-byte `r‖s` signature.
    EcdsaP384Sha384Fixed,
    /// Ed25519.
    Ed25519,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 11] = [
        Self::RsaPkcs1Sha256,
        Self::RsaPkcs1Sha384,
        Self::RsaPkcs1Sha512,
        Self::RsaPssSha256,
        Self::RsaPssSha384,
        Self::RsaPssSha512,
        Self::EcdsaP256Sha256,
        Self::EcdsaP256Sha256Fixed,
        Self::EcdsaP384Sha384,
        Self::EcdsaP384Sha384Fixed,
        Self::Ed25519,
    ];

    /// The name used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::RsaPkcs1Sha256 => "rsa-pkcs1-sha256",
            Self::RsaPkcs1Sha384 => "rsa-pkcs1-sha384",
            Self::RsaPkcs1Sha512 => "rsa-pkcs1-sha512",
            Self::RsaPssSha256 => "rsa-pss-sha256",
            Self::RsaPssSha384 => "rsa-pss-sha384",
            Self::RsaPssSha512 => "rsa-pss-sha512",
            Self::EcdsaP256Sha256 => "ecdsa-p256-sha256",
            Self::EcdsaP256Sha256Fixed => "ecdsa-p256-sha256-fixed",
            Self::EcdsaP384Sha384 => "ecdsa-p384-sha384",
            Self::EcdsaP384Sha384Fixed => "ecdsa-p384-sha384-fixed",
            Self::Ed25519 => "ed25519",
        }
    }

    /// The key family this algorithm needs.
    pub fn key_kind(self) -> KeyKind {
        match self {
            Self::RsaPkcs1Sha256
            | Self::RsaPkcs1Sha384
            | Self::RsaPkcs1Sha512
            | Self::RsaPssSha256
            | Self::RsaPssSha384
            | Self::RsaPssSha512 => KeyKind::Rsa,
            Self::EcdsaP256Sha256 | Self::EcdsaP256Sha256Fixed => KeyKind::EcP256,
            Self::EcdsaP384Sha384 | Self::EcdsaP384Sha384Fixed => KeyKind::EcP384,
            Self::Ed25519 => KeyKind::Ed25519,
        }
    }

    /// The algorithms that a key of `kind` can verify.
    pub fn for_key(kind: KeyKind) -> impl Iterator<Item = Algorithm> {
        Self::ALL
            .into_iter()
            .filter(move |alg| alg.key_kind() == kind)
    }

    /// ring's RSA verification parameters (RSA algorithms only).
    pub(crate) fn rsa_verification(self) -> Option<&'static ring_sig::RsaParameters> {
        Some(match self {
            Self::RsaPkcs1Sha256 => &ring_sig::RSA_PKCS1_2048_8192_SHA256,
            Self::RsaPkcs1Sha384 => &ring_sig::RSA_PKCS1_2048_8192_SHA384,
            Self::RsaPkcs1Sha512 => &ring_sig::RSA_PKCS1_2048_8192_SHA512,
            Self::RsaPssSha256 => &ring_sig::RSA_PSS_2048_8192_SHA256,
            Self::RsaPssSha384 => &ring_sig::RSA_PSS_2048_8192_SHA384,
            Self::RsaPssSha512 => &ring_sig::RSA_PSS_2048_8192_SHA512,
            _ => return None,
        })
    }

    /// ring's RSA signing padding (RSA algorithms only).
    pub(crate) fn rsa_signing(self) -> Option<&'static dyn ring_sig::RsaEncoding> {
        Some(match self {
            Self::RsaPkcs1Sha256 => &ring_sig::RSA_PKCS1_SHA256,
            Self::RsaPkcs1Sha384 => &ring_sig::RSA_PKCS1_SHA384,
            Self::RsaPkcs1Sha512 => &ring_sig::RSA_PKCS1_SHA512,
            Self::RsaPssSha256 => &ring_sig::RSA_PSS_SHA256,
            Self::RsaPssSha384 => &ring_sig::RSA_PSS_SHA384,
            Self::RsaPssSha512 => &ring_sig::RSA_PSS_SHA512,
            _ => return None,
        })
    }

    /// ring's verification algorithm for the non-RSA algorithms.
    pub(crate) fn point_verification(self) -> Option<&'static dyn ring_sig::VerificationAlgorithm> {
        Some(match self {
            Self::EcdsaP256Sha256 => &ring_sig::ECDSA_P256_SHA256_ASN1,
            Self::EcdsaP256Sha256Fixed => &ring_sig::ECDSA_P256_SHA256_FIXED,
            Self::EcdsaP384Sha384 => &ring_sig::ECDSA_P384_SHA384_ASN1,
            Self::EcdsaP384Sha384Fixed => &ring_sig::ECDSA_P384_SHA384_FIXED,
            Self::Ed25519 => &ring_sig::ED25519,
            _ => return None,
        })
    }

    /// ring's ECDSA signing algorithm (ECDSA algorithms only).
    pub(crate) fn ecdsa_signing(self) -> Option<&'static ring_sig::EcdsaSigningAlgorithm> {
        Some(match self {
            Self::EcdsaP256Sha256 => &ring_sig::ECDSA_P256_SHA256_ASN1_SIGNING,
            Self::EcdsaP256Sha256Fixed => &ring_sig::ECDSA_P256_SHA256_FIXED_SIGNING,
            Self::EcdsaP384Sha384 => &ring_sig::ECDSA_P384_SHA384_ASN1_SIGNING,
            Self::EcdsaP384Sha384Fixed => &ring_sig::ECDSA_P384_SHA384_FIXED_SIGNING,
            _ => return None,
        })
    }
}

named_enum!(Algorithm, Error::UnknownAlgorithm);

/// `--alg`-style arguments of a command line list every name (`clap` feature).
#[cfg(feature = "clap")]
impl clap::ValueEnum for Algorithm {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back() {
        for alg in Algorithm::ALL {
            assert_eq!(alg.name().parse::<Algorithm>().unwrap(), alg);
        }
        assert_eq!(
            "RSA_PKCS1_SHA256".parse::<Algorithm>().unwrap(),
            Algorithm::RsaPkcs1Sha256
        );
        assert!(
            "rsa-sha1"
                .parse::<Algorithm>()
                .unwrap_err()
                .to_string()
                .contains("ed25519")
        );
    }

    #[test]
    fn each_algorithm_has_exactly_one_ring_backend_for_each_direction() {
        for alg in Algorithm::ALL {
            let verifiers = usize::from(alg.rsa_verification().is_some())
                + usize::from(alg.point_verification().is_some());
            assert_eq!(verifiers, 1, "{alg}");
            let signers = usize::from(alg.rsa_signing().is_some())
                + usize::from(alg.ecdsa_signing().is_some())
                + usize::from(alg == Algorithm::Ed25519);
            assert_eq!(signers, 1, "{alg}");
        }
    }
}
