//! The crate-level error: what a merchant's `main` may get from payhook as a whole.
//!
//! Modules have precise error types of their own ([`ConfigError`], [`BuildError`], the
//! model's parse errors); this enum wraps them at the boundary so that a binary can use one
//! `?` for all of them.

use crate::config::ConfigError;
use crate::server::BuildError;
use crate::store::StoreError;

/// Any error payhook returns to an application.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration could not be loaded or is invalid.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// The app could not be built from its handlers and configuration.
    #[error("app: {0}")]
    Build(#[from] BuildError),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Binding or serving the socket failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}
