//! The time postponed validations are measured in.

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// Wall-clock time, advancing with tokio's clock: under `tokio::time::pause()` it stands
/// still and `advance` moves it, so that deadlines and the outbox's schedule can be tested
/// without sleeping. It reads in whole milliseconds, the store's resolution.
///
/// It is the wall clock read when it was made, advanced by tokio's clock since — and moved
/// with the wall clock when that is stepped (NTP setting it after boot, a VM resumed):
/// deadlines, retries and decisions are compared with times other processes wrote (another
/// instance on the same database, this one after a restart), so a step must not shift every
/// time this process writes for the rest of its life. A step is followed in whole seconds;
/// what is less is the jitter of reading two clocks, which would otherwise make the clock
/// go back by a millisecond now and then.
///
/// ```
/// let clock = payhook::postponed::Clock::new();
/// assert!(clock.now().timestamp() > 1_700_000_000);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base_ms: u64,
    /// When `base_ms` was read, by tokio's clock (which `advance` moves)…
    base: Instant,
    /// …and by the system's monotonic clock (which it does not).
    base_system: std::time::Instant,
}

impl Clock {
    /// A clock reading the wall time now.
    pub fn new() -> Self {
        Self {
            base_ms: crate::store::now_ms(),
            base: Instant::now(),
            base_system: std::time::Instant::now(),
        }
    }

    /// The time now (UTC).
    pub fn now(&self) -> DateTime<Utc> {
        crate::store::time_from_ms(self.now_ms())
    }

    /// Milliseconds since the Unix epoch, now.
    pub(crate) fn now_ms(&self) -> u64 {
        let elapsed = millis(self.base.elapsed());
        let system_elapsed = millis(self.base_system.elapsed());
        reading(
            self.base_ms,
            elapsed,
            system_elapsed,
            crate::store::now_ms(),
        )
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// The clock's reading: `base_ms` advanced by tokio's `elapsed`, moved by how far the wall
/// clock (`wall_ms` now) has stepped away from the monotonic clock (`system_elapsed` since
/// `base_ms`), in whole seconds.
fn reading(base_ms: u64, elapsed: u64, system_elapsed: u64, wall_ms: u64) -> u64 {
    let expected = i128::from(base_ms) + i128::from(system_elapsed);
    let step = (i128::from(wall_ms) - expected) / 1000 * 1000;
    let reading = i128::from(base_ms) + i128::from(elapsed) + step;
    u64::try_from(reading.max(0)).unwrap_or(u64::MAX)
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_step_of_the_wall_clock_moves_it_and_the_jitter_of_two_clocks_does_not() {
        let base = 1_800_000_000_000;
        // As the clocks agree: tokio's elapsed time, to the millisecond.
        assert_eq!(reading(base, 5_000, 5_000, base + 5_001), base + 5_000);
        assert_eq!(reading(base, 5_000, 5_000, base + 4_999), base + 5_000);
        // The wall clock stepped an hour ahead, or 90 s back.
        assert_eq!(
            reading(base, 5_000, 5_000, base + 5_000 + 3_600_000),
            base + 5_000 + 3_600_000
        );
        assert_eq!(
            reading(base, 5_000, 5_000, base + 5_000 - 90_000),
            base + 5_000 - 90_000
        );
        // Paused time advanced by 300 s while 2 ms passed: the advance.
        assert_eq!(reading(base, 300_000, 2, base + 3), base + 300_000);
    }

    #[tokio::test]
    async fn it_reads_the_wall_clock() {
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
        assert_eq!(clock.now_ms(), before);
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(clock.now_ms(), before + 300_000);
    }
}
