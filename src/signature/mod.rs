//! Signatures of callback bodies: verify whatever scheme a real aggregator uses, refuse
//! everything else, and sign with exactly the same code (for the simulator and the tests).
//!
//! The spec says the aggregator signs the callback body with its private key and puts the
//! signature in a header (§5.5, §6.6), but not which header, algorithm or encoding. payhook
//! makes all three configurable ([`SignatureConfig`]):
//!
//! * **algorithms** ([`Algorithm`]): RSA PKCS#1 v1.5 and RSA-PSS with SHA-256/384/512, ECDSA
//!   P-256/SHA-256 and P-384/SHA-384 in DER and fixed `r‖s` form, Ed25519 — all by ring;
//! * **encodings** ([`Encoding`]): base64, base64url (padded or not), hex; an optional scheme
//!   prefix such as `sha256=`;
//! * **keys** ([`PublicKey`]): PEM (SPKI or PKCS#1), DER, .NET XML, JWK, JWKS; several at once
//!   for rotation — a signature passes when any key verifies it.
//!
//! The signature is checked over the exact raw body bytes, before any JSON parsing.
//! [`sniff`] finds the scheme of a captured request when nobody can say which it is.

/// `Display`, `FromStr`, `Serialize` and `Deserialize` by name for a small enum with `ALL` and `name()`:
/// names are read case-blind, with `_` taken as `-`.
macro_rules! named_enum {
    ($type:ty, $error:path) => {
        impl std::fmt::Display for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $type {
            type Err = $crate::signature::Error;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                let wanted = text.trim().to_ascii_lowercase().replace('_', "-");
                Self::ALL
                    .into_iter()
                    .find(|v| v.name() == wanted)
                    .ok_or_else(|| $error(text.to_owned()))
            }
        }

        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

mod algorithm;
mod cache;
mod encoding;
mod error;
mod key;
mod keygen;
mod retired;
mod settings;
mod sniff;

use http::{HeaderMap, HeaderName};

pub(crate) use cache::{SignedPair, VerifiedCache};
pub(crate) use retired::RetiredKeys;

pub use algorithm::{Algorithm, KeyKind};
pub use encoding::Encoding;
pub use error::Error;
pub use key::{PublicKey, SigningKey};
pub use keygen::{KeyPairPem, generate_key_pair};
pub use settings::{KeySource, SignatureConfig};
pub use sniff::{CapturedRequest, SniffMatch, parse_raw_request, sniff};

/// Default name of the signature header.
pub const DEFAULT_HEADER: &str = "X-Signature";
/// Longest signature header value read. RSA-8192 in hex is 2048 characters; anything much
/// longer is refused before any decoding work.
pub const MAX_HEADER_LEN: usize = 4096;

/// Checks signatures of request bodies against a set of keys.
///
/// ```
/// use payhook::signature::{Algorithm, Encoding, SigningKey, Verifier, generate_key_pair};
///
/// let pair = generate_key_pair(Algorithm::EcdsaP256Sha256Fixed)?;
/// let signer = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), Algorithm::EcdsaP256Sha256Fixed)?;
/// let verifier = Verifier::new("X-Signature", Encoding::Base64, None)?
///     .with_key(signer.public_key().with_id("2026-01"), Algorithm::EcdsaP256Sha256Fixed)?;
///
/// let body = br#"{"nonce":"n-1"}"#;
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-signature", signer.header_value(body, Encoding::Base64, None)?.parse()?);
/// assert_eq!(verifier.verify(&headers, body)?, Some("2026-01"));
/// assert!(verifier.verify(&headers, b"{\"nonce\":\"n-2\"}").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Verifier {
    header: HeaderName,
    encoding: Encoding,
    prefix: Option<String>,
    keys: Vec<(PublicKey, Algorithm)>,
}

impl Verifier {
    /// A verifier without keys yet, reading signatures from `header` in `encoding`, with an
    /// optional scheme `prefix` (e.g. `sha256=`) stripped first.
    ///
    /// # Errors
    ///
    /// [`Error::UnrecognisedKey`] when `header` is not a valid header name.
    pub fn new(header: &str, encoding: Encoding, prefix: Option<&str>) -> Result<Self, Error> {
        let header = HeaderName::try_from(header.trim()).map_err(|_| {
            Error::UnrecognisedKey(format!("`{header}` is not a valid header name"))
        })?;
        let prefix = prefix.filter(|p| !p.is_empty()).map(str::to_owned);
        Ok(Self {
            header,
            encoding,
            prefix,
            keys: Vec::new(),
        })
    }

    /// Adds a key that verifies `algorithm` signatures (rotation: add several).
    ///
    /// # Errors
    ///
    /// [`Error::WrongKeyKind`] when the key cannot verify `algorithm`.
    pub fn with_key(mut self, key: PublicKey, algorithm: Algorithm) -> Result<Self, Error> {
        key.check_fits(algorithm)?;
        self.keys.push((key, algorithm));
        Ok(self)
    }

    /// Builds the verifier of `[signature]`, reading every key file.
    ///
    /// # Errors
    ///
    /// [`Error::Setting`] naming the key entry (`signature.keys[i]`, its id and file) that
    /// cannot be read or does not fit its algorithm, with the reason as its source.
    pub fn from_config(config: &SignatureConfig) -> Result<Self, Error> {
        let mut verifier = Self::new(&config.header, config.encoding, Some(&config.prefix))
            .map_err(|e| e.in_setting("signature.header"))?;
        for (index, source) in config.keys.iter().enumerate() {
            let setting = format!("signature.keys[{index}] ({})", source.describe());
            let algorithm = source.algorithm.unwrap_or(config.algorithm);
            for key in source.load().map_err(|e| e.in_setting(&setting))? {
                let key = match (&source.id, key.id()) {
                    (Some(id), None) => key.with_id(id.clone()),
                    _ => key,
                };
                let label = key
                    .id()
                    .map(|id| format!("{setting}, key `{id}`"))
                    .unwrap_or_else(|| setting.clone());
                verifier = verifier
                    .with_key(key, algorithm)
                    .map_err(|e| e.in_setting(label))?;
            }
        }
        Ok(verifier)
    }

    /// The keys, each with the algorithm it verifies, in the order they are tried.
    pub fn keys(&self) -> impl Iterator<Item = (&PublicKey, Algorithm)> {
        self.keys.iter().map(|(key, algorithm)| (key, *algorithm))
    }

    /// The keys, each with its name — its id, or `#n without an id` by its place — and the
    /// algorithm it verifies, in the order they are tried.
    pub(crate) fn named_keys(&self) -> impl Iterator<Item = (String, &PublicKey, Algorithm)> {
        self.keys().enumerate().map(|(index, (key, algorithm))| {
            let name = match key.id() {
                Some(id) => id.to_owned(),
                None => format!("#{} without an id", index + 1),
            };
            (name, key, algorithm)
        })
    }

    /// The header signatures are read from.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// Reads the signature from `headers` without looking at the body: cheap, so a request
    /// without a usable signature is refused before its body is read.
    ///
    /// # Errors
    ///
    /// [`Error::MissingSignature`] or [`Error::MalformedSignature`] (also for a header longer
    /// than [`MAX_HEADER_LEN`], which is refused before decoding).
    pub fn read_signature(&self, headers: &HeaderMap) -> Result<Vec<u8>, Error> {
        let mut values = headers.get_all(&self.header).iter();
        let value = values
            .next()
            .ok_or_else(|| Error::MissingSignature(self.header.clone()))?;
        if values.next().is_some() {
            return Err(Error::MalformedSignature(format!(
                "more than one {} header",
                self.header
            )));
        }
        if value.len() > MAX_HEADER_LEN {
            return Err(Error::MalformedSignature(format!(
                "header longer than {MAX_HEADER_LEN} bytes"
            )));
        }
        let text = value
            .to_str()
            .map_err(|_| Error::MalformedSignature("header is not ASCII".into()))?
            .trim();
        let text = match &self.prefix {
            Some(prefix) => strip_prefix_ignore_case(text, prefix).ok_or_else(|| {
                Error::MalformedSignature(format!("expected the prefix `{prefix}`"))
            })?,
            None => text,
        };
        if text.is_empty() {
            return Err(Error::MalformedSignature("empty signature".into()));
        }
        self.encoding
            .decode(text)
            .map_err(|e| Error::MalformedSignature(e.to_string()))
    }

    /// Checks `signature` over `body` with every key; returns the id of the key that verified.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSignature`] when no key verifies it.
    pub fn check(&self, body: &[u8], signature: &[u8]) -> Result<Option<&str>, Error> {
        self.keys
            .iter()
            .find(|(key, algorithm)| key.verifies(*algorithm, body, signature))
            .map(|(key, _)| key.id())
            .ok_or(Error::InvalidSignature)
    }

    /// [`Verifier::read_signature`] then [`Verifier::check`].
    ///
    /// # Errors
    ///
    /// Any [`Error`].
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Option<&str>, Error> {
        let signature = self.read_signature(headers)?;
        self.check(body, &signature)
    }
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

impl SigningKey {
    /// Signs `message` and writes the signature as a header value: `prefix` then the
    /// signature in `encoding`.
    ///
    /// # Errors
    ///
    /// [`Error`] if signing fails.
    pub fn header_value(
        &self,
        message: &[u8],
        encoding: Encoding,
        prefix: Option<&str>,
    ) -> Result<String, Error> {
        let signature = self.sign(message)?;
        Ok(format!(
            "{}{}",
            prefix.unwrap_or_default(),
            encoding.encode(&signature)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(algorithm: Algorithm) -> (SigningKey, PublicKey) {
        let pem = generate_key_pair(algorithm).unwrap();
        let signer = SigningKey::from_pkcs8(pem.private_pem.as_bytes(), algorithm).unwrap();
        let public = signer.public_key();
        (signer, public)
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-signature", value.parse().unwrap());
        headers
    }

    #[test]
    fn missing_malformed_and_invalid_are_told_apart() {
        let (signer, public) = pair(Algorithm::Ed25519);
        let verifier = Verifier::new(DEFAULT_HEADER, Encoding::Base64, None)
            .unwrap()
            .with_key(public, Algorithm::Ed25519)
            .unwrap();
        assert!(matches!(
            verifier.verify(&HeaderMap::new(), b"x"),
            Err(Error::MissingSignature(_))
        ));
        assert!(matches!(
            verifier.verify(&headers("!!!"), b"x"),
            Err(Error::MalformedSignature(_))
        ));
        assert!(matches!(
            verifier.verify(&headers(""), b"x"),
            Err(Error::MalformedSignature(_))
        ));
        let good = signer.header_value(b"x", Encoding::Base64, None).unwrap();
        assert_eq!(verifier.verify(&headers(&good), b"x").unwrap(), None);
        assert!(matches!(
            verifier.verify(&headers(&good), b"y"),
            Err(Error::InvalidSignature)
        ));
    }

    #[test]
    fn an_oversized_header_is_refused_before_decoding() {
        let (_, public) = pair(Algorithm::Ed25519);
        let verifier = Verifier::new(DEFAULT_HEADER, Encoding::Base64, None)
            .unwrap()
            .with_key(public, Algorithm::Ed25519)
            .unwrap();
        let huge = "A".repeat(64 * 1024);
        let error = verifier.verify(&headers(&huge), b"x").unwrap_err();
        assert_eq!(
            error.to_string(),
            Error::MalformedSignature(format!("header longer than {MAX_HEADER_LEN} bytes"))
                .to_string()
        );
    }

    #[test]
    fn the_prefix_is_required_and_stripped() {
        let (signer, public) = pair(Algorithm::EcdsaP256Sha256);
        let verifier = Verifier::new(DEFAULT_HEADER, Encoding::Hex, Some("sha256="))
            .unwrap()
            .with_key(public, Algorithm::EcdsaP256Sha256)
            .unwrap();
        let value = signer
            .header_value(b"x", Encoding::Hex, Some("sha256="))
            .unwrap();
        assert!(verifier.verify(&headers(&value), b"x").is_ok());
        assert!(
            verifier
                .verify(&headers(&value.to_uppercase()), b"x")
                .is_ok(),
            "prefix and hex are case-blind"
        );
        let bare = value.trim_start_matches("sha256=");
        assert!(matches!(
            verifier.verify(&headers(bare), b"x"),
            Err(Error::MalformedSignature(_))
        ));
    }

    #[test]
    fn a_key_of_the_wrong_kind_is_refused() {
        let (_, public) = pair(Algorithm::EcdsaP256Sha256);
        let error = Verifier::new(DEFAULT_HEADER, Encoding::Base64, None)
            .unwrap()
            .with_key(public, Algorithm::RsaPkcs1Sha256)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "a P-256 key cannot verify rsa-pkcs1-sha256"
        );
    }
}
