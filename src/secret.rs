//! Secrets that must not leak: passwords, tokens, shared keys.
//!
//! A [`Secret`] prints as `Secret(***)` in `Debug` and has no `Display`, so that a stray
//! `{:?}` on a config or a login request never writes a password into a log. The value is
//! reached only through [`Secret::expose`], which makes every use easy to find.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A string that redacts itself in `Debug` output.
///
/// ```
/// use payhook::Secret;
///
/// let password = Secret::new("hunter2");
/// assert_eq!(format!("{password:?}"), "Secret(***)");
/// assert_eq!(password.expose(), "hunter2");
/// ```
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value itself. Call this only where the value is sent or compared.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `true` when the secret is the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}
