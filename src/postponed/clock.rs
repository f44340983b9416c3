//! The time postponed validations are measured in.

use tokio::time::Instant;

/// Wall-clock milliseconds since the Unix epoch, advancing with tokio's clock: under
/// `tokio::time::pause()` it stands still and `advance` moves it, so that deadlines and the
/// outbox's schedule can be tested without sleeping.
///
/// ```
/// let clock = payhook::postponed::Clock::new();
/// assert!(clock.now_ms() > 1_700_000_000_000);
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

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.base_ms.saturating_add(elapsed)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
