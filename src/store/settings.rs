//! `[store]`: where and how the records are kept — the embedded sled store in a directory
//! (the default), or PostgreSQL when `store.url` is set (feature `postgres`).

use serde::{Deserialize, Serialize};
use std::{path::PathBuf, time::Duration};

use crate::secret::Secret;
use crate::setting::InvalidSetting;

/// `[store]`: where deduplication records and the Awaitable state are kept.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Data directory of the embedded sled store (created if missing). Only one process may
    /// open it at a time. Unused when `url` is set.
    pub path: PathBuf,
    /// A PostgreSQL database shared by every instance (`postgres://user:pass@host/db`;
    /// `?sslmode=verify-full&sslrootcert=ca.pem` for TLS, on rustls). When set, the store is
    /// PostgreSQL and `path`, `flush_every` and `cache_bytes` are unused. Redacted when the
    /// configuration is shown: the address may carry a password.
    #[serde(
        serialize_with = "crate::setting::redacted",
        skip_serializing_if = "Option::is_none"
    )]
    pub url: Option<Secret>,
    /// The PostgreSQL schema that holds payhook's tables (created by the migrations).
    pub schema: String,
    /// Connections in the PostgreSQL pool of each instance.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub pool_size: u32,
    /// How long to wait for a PostgreSQL connection (connecting, or one free in the pool).
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub connect_timeout: Duration,
    /// The longest one PostgreSQL statement may run (`statement_timeout`), so that a stuck
    /// lock is an error answered 503 and retried, not a request hanging.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub statement_timeout: Duration,
    /// How long a record is kept after its last write; longer than any retry horizon. It
    /// bounds deduplication too: a callback whose transaction last changed longer ago (less
    /// a tenth, at most an hour, for the clocks) is refused with 409 unless its record is
    /// still kept, since a missing record no longer proves it was never booked.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub retention: Duration,
    /// How often the sweeper purges expired records.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub sweep_interval: Duration,
    /// sled's background flush interval; `0` (the default): off. payhook flushes every batch
    /// before answering and every sweep that purged something, so nothing needs it; and on
    /// sled 0.34 it keeps relocating log segments of a store with many removals, writing
    /// about 1 MB/s while idle.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub flush_every: Duration,
    /// Bytes of sled's page cache (sled's own default is 1 GiB, far more than records of a
    /// retention period need).
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub cache_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("payhook-data"),
            url: None,
            schema: "payhook".to_owned(),
            pool_size: 10,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
            retention: Duration::from_secs(30 * 24 * 3600),
            sweep_interval: Duration::from_secs(3600),
            flush_every: Duration::ZERO,
            cache_bytes: 16 * 1024 * 1024,
        }
    }
}

impl StoreConfig {
    /// Checks values that have the right type but are not acceptable.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        if self.retention < Duration::from_secs(1) {
            return Err(InvalidSetting::new(
                "store.retention",
                "must be at least 1s",
            ));
        }
        if let Some(url) = &self.url {
            let url = url.expose();
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(InvalidSetting::new(
                    "store.url",
                    "must be a PostgreSQL address (postgres://user@host:5432/database)",
                ));
            }
            if !cfg!(feature = "postgres") {
                return Err(InvalidSetting::new(
                    "store.url",
                    "PostgreSQL needs payhook's `postgres` feature (payhook = { features = [\"postgres\"] })",
                ));
            }
        }
        if !plain_identifier(&self.schema) {
            return Err(InvalidSetting::new("store.schema", PLAIN_IDENTIFIER));
        }
        if self.pool_size == 0 {
            return Err(InvalidSetting::new("store.pool_size", "must be at least 1"));
        }
        // PostgreSQL reads a statement_timeout of 0 as no limit at all, and a connect
        // timeout of 0 fails every wait for a pooled connection at once.
        // PostgreSQL takes a statement_timeout of at most 2147483647 ms (about 24.8 days):
        // a longer one would fail every connection.
        if self.statement_timeout.as_millis() > i32::MAX as u128 {
            return Err(InvalidSetting::new(
                "store.statement_timeout",
                "must be at most 24d (PostgreSQL's limit)",
            ));
        }
        crate::setting::longer_than_zero(&[
            ("store.sweep_interval", self.sweep_interval),
            ("store.connect_timeout", self.connect_timeout),
            ("store.statement_timeout", self.statement_timeout),
        ])
    }
}

impl StoreConfig {
    /// `true` when the store is PostgreSQL (`store.url` is set).
    pub fn is_postgres(&self) -> bool {
        self.url.is_some()
    }
}

/// What `store.schema` must be.
pub(crate) const PLAIN_IDENTIFIER: &str =
    "must be a plain PostgreSQL identifier: lower-case letters, digits and _, at most 63";

/// `true` for a plain PostgreSQL identifier: it stands in SQL as it is, unquoted (the schema
/// is written into every statement payhook sends, its migrations included).
pub(crate) fn plain_identifier(text: &str) -> bool {
    text.chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(config: StoreConfig) -> String {
        let error = config.validate().unwrap_err();
        format!("{}: {}", error.key, error.reason)
    }

    #[test]
    fn a_store_url_that_is_no_postgresql_address_and_bad_pool_settings_are_refused() {
        let with = |f: fn(&mut StoreConfig)| {
            let mut config = StoreConfig::default();
            f(&mut config);
            config
        };
        let url = refused(with(|c| c.url = Some("mysql://db/payments".into())));
        assert!(
            url.starts_with("store.url: must be a PostgreSQL address"),
            "{url}"
        );
        // The address is a secret: the refusal does not quote it.
        assert!(!url.contains("mysql://"), "{url}");
        for schema in [
            "",
            "Payhook",
            "pay-hook",
            "1payhook",
            "a;drop schema x",
            &"s".repeat(64),
        ] {
            let config = StoreConfig {
                schema: schema.to_owned(),
                ..StoreConfig::default()
            };
            assert!(refused(config).starts_with("store.schema:"), "{schema}");
        }
        assert!(refused(with(|c| c.pool_size = 0)).starts_with("store.pool_size:"));
        let sound = StoreConfig {
            url: Some("postgres://payhook@db/payments".into()),
            schema: "payhook_2".into(),
            ..StoreConfig::default()
        };
        if cfg!(feature = "postgres") {
            assert!(sound.validate().is_ok());
        } else {
            assert!(refused(sound).contains("`postgres` feature"));
        }
    }
}
