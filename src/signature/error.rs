//! The one error of the signature module: a request's signature refused, a key that cannot
//! be read or used, a signature that cannot be made, a name that is no algorithm or
//! encoding, a captured request that cannot be read.
//!
//! The first four variants are what a request's verification answers (each a 401 on the
//! wire, decided in `server/problem.rs`); [`Error::is_refusal`] tells them apart from the
//! configuration and tooling errors, which never reach the wire.

use std::path::PathBuf;
use std::sync::Arc;

use http::HeaderName;

use super::{Algorithm, KeyKind};

/// Why a signature, a key or a signing operation failed.
///
/// ```
/// use payhook::signature::{Error, PublicKey};
///
/// let error = PublicKey::parse(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
///     .unwrap_err();
/// assert!(matches!(error, Error::PrivateKey));
/// assert!(!error.is_refusal());
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request has no signature header.
    #[error("missing signature: no {0} header")]
    MissingSignature(HeaderName),
    /// The header is there but is not a signature in the configured encoding.
    #[error("malformed signature: {0}")]
    MalformedSignature(String),
    /// The signature is well-formed but no configured key verifies it over this body.
    #[error("invalid signature: it does not verify with any configured key")]
    InvalidSignature,
    /// The signature verifies only with a key taken out of the configured keys while the
    /// service ran (named by its id, or its place among the keys then): refused like an
    /// invalid one, and told apart in the log, the metrics and the inspector so that a
    /// rotation taken too early shows (the answer on the wire is an invalid signature's).
    #[error(
        "invalid signature: it verifies only with key {0}, which was taken out of the \
         configured keys"
    )]
    RetiredKey(String),

    /// The text or bytes are in no recognised key format.
    #[error("not a public key in a known format (PEM, DER, RSAKeyValue XML, JWK, JWKS): {0}")]
    UnrecognisedKey(String),
    /// A private key was given where a public key belongs.
    #[error(
        "this is a private key; give the aggregator's PUBLIC key (never put a private key in the config)"
    )]
    PrivateKey,
    /// An X.509 certificate was given.
    #[error(
        "certificates are not read; extract the key with `openssl x509 -pubkey -noout -in cert.pem`"
    )]
    Certificate,
    /// The key is of a kind payhook does not verify with.
    #[error("unsupported key type: {0}")]
    UnsupportedKey(String),
    /// The key is too weak.
    #[error("RSA key of {0} bits is too small; at least 2048 bits are required")]
    KeyTooSmall(usize),
    /// An RSA key no verification accepts: over 8192 bits, or a public exponent that is
    /// even, below 3 or over 2^33 − 1. Refused when read, rather than answering every
    /// callback 401.
    #[error("RSA key cannot verify anything: {0}")]
    UnusableRsaKey(String),
    /// An EC key whose point is not on its curve: no verification accepts it. Refused when
    /// read, rather than answering every callback 401.
    #[error("EC key cannot verify anything: {0}")]
    UnusableEcKey(String),
    /// A key that verifies signatures made without its private key: an Ed25519 point of
    /// small order (all zero bytes, a placeholder, is one). Refused when read.
    #[error("key accepts forged signatures: {0}")]
    ForgeableKey(String),
    /// The key cannot verify the configured algorithm.
    #[error("a {kind} key cannot verify {algorithm}")]
    WrongKeyKind {
        /// What the key is.
        kind: KeyKind,
        /// What it was configured for.
        algorithm: Algorithm,
    },
    /// The key itself allows other algorithms only than the one configured (an
    /// `id-RSASSA-PSS` key, a JWK's `alg`).
    #[error("the key cannot verify {algorithm}: {by} restricts it to other algorithms")]
    KeyRestricted {
        /// What restricts the key.
        by: String,
        /// What it was configured for.
        algorithm: Algorithm,
    },
    /// A private key for signing could not be read.
    #[error("not a PKCS#8 private key for {algorithm}: {reason}")]
    BadPrivateKey {
        /// What it was meant to sign with.
        algorithm: Algorithm,
        /// What is wrong.
        reason: String,
    },
    /// A key file of `signature.keys` could not be read.
    #[error("cannot read {}", path.display())]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A key file of `signature.keys` that any user on the machine may write: whoever put
    /// their own key there would have forged callbacks accepted. `why` says so, with the
    /// fix.
    #[error(
        "{} {why}: whoever put their own key there would have forged callbacks accepted",
        path.display()
    )]
    KeyFileChangeable {
        /// The file.
        path: PathBuf,
        /// Who could change it, and how to stop them.
        why: String,
    },
    /// An entry of `signature.keys` gives both `file` and `value`, or neither.
    #[error("give exactly one of `file` and `value`")]
    AmbiguousKeySource,
    /// A setting of `[signature]` gives no usable verifier: `setting` names it (e.g.
    /// `signature.keys[1]`, with the key's id and file), the source says why.
    #[error("{setting}")]
    Setting {
        /// The setting, e.g. `signature.keys[1] (id "2026-01", file keys/new.pem)`.
        setting: String,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },

    /// Signing failed (ring reports no detail).
    #[error("signing failed")]
    Signing,
    /// A key pair could not be generated.
    #[error("key generation failed: {0}")]
    Keygen(String),
    /// A text is not valid in its encoding.
    #[error("not valid {encoding}: {reason}")]
    Decode {
        /// The encoding.
        encoding: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A name that is no [`Algorithm`].
    #[error("unknown signature algorithm `{0}` (known: {known})", known = Algorithm::ALL.map(Algorithm::name).join(", "))]
    UnknownAlgorithm(String),
    /// A name that is no [`Encoding`](super::Encoding).
    #[error("unknown signature encoding `{0}` (known: base64, base64url, base64url-nopad, hex)")]
    UnknownEncoding(String),
    /// A captured HTTP request that cannot be read (`payhook sniff`).
    #[error("not a captured HTTP request: {0}")]
    RawRequest(String),
}

impl Error {
    /// `true` for a request's signature refused (missing, malformed, invalid, or made with
    /// a key taken out): what verification answers, a 401 on the wire. Everything else is a
    /// configuration or tooling error.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::MissingSignature(_)
                | Self::MalformedSignature(_)
                | Self::InvalidSignature
                | Self::RetiredKey(_)
        )
    }

    /// This error in the context of `setting`.
    pub(crate) fn in_setting(self, setting: impl Into<String>) -> Self {
        Self::Setting {
            setting: setting.into(),
            source: Box::new(self),
        }
    }
}
