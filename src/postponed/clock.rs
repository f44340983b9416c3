//! The time postponed validations are measured in.

use chrono::{DateTime, Utc};

/// Wall-clock time, advancing with tokio's clock: under `tokio::time::pause()` it stands
/// still and `advance` moves it, so that deadlines and the outbox's schedule can be tested
/// without sleeping. It reads in whole milliseconds, the store's resolution.
///
/// Outside paused time it is the system's wall clock as it reads now, not a reading taken
/// once and advanced since: deadlines, retries and decisions are compared with times other
/// processes wrote (another instance on the same database, this one after a restart), so a
/// step of the system clock after start-up (NTP setting it at boot, a VM resumed) must not
/// shift every time this process writes for the rest of its life.
///
/// ```
/// let clock = payhook::postponed::Clock::new();
/// assert!(clock.now().timestamp() > 1_700_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock;

impl Clock {
    /// A clock reading the wall time.
    pub fn new() -> Self {
        Self
    }

    /// The time now (UTC).
    pub fn now(&self) -> DateTime<Utc> {
        crate::store::time_from_ms(self.now_ms())
    }

    /// Milliseconds since the Unix epoch, now: the wall clock, moved by how far tokio's
    /// clock stands from the system's monotonic one (nothing, unless tokio's time is
    /// paused: then what was advanced less what really passed since the pause).
    pub(crate) fn now_ms(&self) -> u64 {
        let tokio = tokio::time::Instant::now().into_std();
        let system = std::time::Instant::now();
        let wall = crate::store::now_ms();
        match tokio.checked_duration_since(system) {
            Some(ahead) => wall.saturating_add(millis(ahead)),
            None => wall.saturating_sub(millis(system.duration_since(tokio))),
        }
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn it_reads_the_wall_clock_as_it_is_now() {
        let clock = Clock::new();
        // Read a moment apart: a preempted thread may see them further apart still.
        let difference = clock.now_ms().abs_diff(crate::store::now_ms());
        assert!(difference <= 50, "{difference} ms from the wall clock");
    }

    #[tokio::test(start_paused = true)]
    async fn in_paused_time_it_stands_still_and_advance_moves_it() {
        let clock = Clock::new();
        let before = clock.now_ms();
        std::thread::sleep(Duration::from_millis(30));
        let still = clock.now_ms();
        assert!(
            still.abs_diff(before) <= 50,
            "moved {} ms",
            still.abs_diff(before)
        );
        tokio::time::advance(Duration::from_secs(300)).await;
        let after = clock.now_ms();
        assert!(
            (after - before).abs_diff(300_000) <= 50,
            "advanced {} ms",
            after - before
        );
    }
}
