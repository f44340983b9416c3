//! `[signature]`: how the aggregator signs callbacks, and the public keys to verify with.
//! [`super::Verifier::from_config`] checks a section, keys included.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use super::{Algorithm, Encoding, Error, PublicKey};

/// `[signature]`: how the aggregator signs, and the public keys to verify with.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignatureConfig {
    /// Header carrying the signature.
    pub header: String,
    /// Algorithm of every key that does not name its own.
    pub algorithm: Algorithm,
    /// Text encoding of the signature.
    pub encoding: Encoding,
    /// Scheme prefix before the signature (e.g. `sha256=`); empty for none.
    pub prefix: String,
    /// The public keys; a signature passes when any of them verifies it (rotation).
    pub keys: Vec<KeySource>,
}

impl Default for SignatureConfig {
    fn default() -> Self {
        Self {
            header: super::DEFAULT_HEADER.to_owned(),
            algorithm: Algorithm::default(),
            encoding: Encoding::default(),
            prefix: String::new(),
            keys: Vec::new(),
        }
    }
}

/// One entry of `signature.keys`: a file or an inline value, in any format
/// [`PublicKey::parse`] reads (PEM, DER, .NET XML, JWK, JWKS).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeySource {
    /// Id logged when this key verifies (a JWK's `kid` takes precedence).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Path of the key file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The key itself, inline (PEM, base64 DER, XML or JSON text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// This key's algorithm, when it differs from `signature.algorithm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Algorithm>,
}

impl KeySource {
    /// Reads the key(s) of this entry.
    ///
    /// # Errors
    ///
    /// [`Error`]: the file cannot be read, any user could change it
    /// ([`Error::KeyFileChangeable`]), its content is no key, or the entry gives both or
    /// neither of `file` and `value`.
    pub fn load(&self) -> Result<Vec<PublicKey>, Error> {
        let bytes = match (&self.file, &self.value) {
            (Some(path), None) => {
                crate::secret::check_trusted_file(path, "an aggregator's key").map_err(|why| {
                    Error::KeyFileChangeable {
                        path: path.clone(),
                        why,
                    }
                })?;
                std::fs::read(path).map_err(|source| Error::KeyFile {
                    path: path.clone(),
                    source: std::sync::Arc::new(source),
                })?
            }
            (None, Some(value)) => value.as_bytes().to_vec(),
            _ => return Err(Error::AmbiguousKeySource),
        };
        PublicKey::parse(&bytes)
    }

    /// `id …, file …` for error messages.
    pub fn describe(&self) -> String {
        let id = self.id.as_deref().map(|id| format!("id `{id}`"));
        let file = self.file.as_ref().map(|f| format!("file {}", f.display()));
        let parts: Vec<String> = [id, file].into_iter().flatten().collect();
        if parts.is_empty() {
            "inline key".to_owned()
        } else {
            parts.join(", ")
        }
    }
}
