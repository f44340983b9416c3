//! The time postponed validations are measured in.

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// Wall-clock time, advancing with tokio's clock: under `tokio::time::pause()` it stands
/// still and `advance` moves it, so that deadlines and the outbox's schedule can be tested
/// without sleeping. It reads in whole milliseconds, the store's resolution.
///
/// ```
/// let clock = payhook::postponed::Clock::new();
/// assert!(clock.now().timestamp() > 1_700_000_000);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base_ms: u64,
    base: Instant,
}

impl Clock {
    /// A clock reading the wall time now.
    pub fn new() -> Self {
        Self {
            base_ms: crate::store::now_ms(),
            base: Instant::now(),
        }
    }

    /// The time now (UTC).
    pub fn now(&self) -> DateTime<Utc> {
        crate::store::time_from_ms(self.now_ms())
    }

    /// Milliseconds since the Unix epoch, now.
    pub(crate) fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.base_ms.saturating_add(elapsed)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
