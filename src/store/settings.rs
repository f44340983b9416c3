//! `[store]`: where and how the embedded sled store keeps its records.

use serde::{Deserialize, Serialize};
use std::{path::PathBuf, time::Duration};

use crate::setting::InvalidSetting;

/// `[store]`: the embedded sled store of deduplication records.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Data directory (created if missing). Only one process may open it at a time.
    pub path: PathBuf,
    /// How long a record is kept after its last write; longer than any retry horizon.
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
        if self.sweep_interval.is_zero() {
            return Err(InvalidSetting::new(
                "store.sweep_interval",
                "must be longer than zero",
            ));
        }
        Ok(())
    }
}
