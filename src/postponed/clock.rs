//! The time postponed validations are measured in.

use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::time::Instant;

/// Wall-clock time, advancing with tokio's clock: under `tokio::time::pause()` it stands
/// still and `advance` moves it, so that deadlines and the outbox's schedule can be tested
/// without sleeping. It reads in whole milliseconds, the store's resolution.
///
/// It is the wall clock read when it was made, advanced by tokio's clock since — and moved
/// with the wall clock when that is stepped (NTP setting it after boot, a VM resumed):
/// deadlines, retries and decisions are compared with times other processes wrote (another
/// instance on the same database, this one after a restart), so a step must not shift every
/// time this process writes for the rest of its life. A step is followed once it moves the
/// wall clock a second or more from where the clock had it: less is the jitter of reading
/// two clocks, which would otherwise make the clock go back a millisecond now and then.
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
    /// How far the wall clock has been stepped since `base_ms` (ms), as last followed;
    /// shared by the copies of this clock. One per [`Clock::new`], kept for the life of the
    /// process (a service makes one or two).
    stepped: &'static AtomicI64,
}

impl Clock {
    /// A clock reading the wall time now.
    pub fn new() -> Self {
        Self {
            base_ms: crate::store::now_ms(),
            base: Instant::now(),
            base_system: std::time::Instant::now(),
            stepped: Box::leak(Box::new(AtomicI64::new(0))),
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
        let (now, stepped) = reading(
            self.base_ms,
            elapsed,
            (system_elapsed, crate::store::now_ms()),
            self.stepped.load(Ordering::Relaxed),
        );
        self.stepped.store(stepped, Ordering::Relaxed);
        now
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// The clock's reading, and the wall clock's step it follows: `base_ms` advanced by
/// tokio's `elapsed`, moved by how far the wall clock (`wall_ms` now) has stepped away from
/// the monotonic clock (`system_elapsed` since `base_ms`) — `stepped`, as followed so far,
/// until the two differ by a second or more.
fn reading(
    base_ms: u64,
    elapsed: u64,
    (system_elapsed, wall_ms): (u64, u64),
    stepped: i64,
) -> (u64, i64) {
    let moved = i128::from(wall_ms) - i128::from(base_ms) - i128::from(system_elapsed);
    let stepped = if (moved - i128::from(stepped)).abs() >= 1000 {
        i64::try_from(moved).unwrap_or(stepped)
    } else {
        stepped
    };
    let reading = i128::from(base_ms) + i128::from(elapsed) + i128::from(stepped);
    (u64::try_from(reading.max(0)).unwrap_or(u64::MAX), stepped)
}

/// `duration` in whole milliseconds, saturating.
pub(super) fn millis(duration: std::time::Duration) -> u64 {
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
        assert_eq!(
            reading(base, 5_000, (5_000, base + 5_001), 0),
            (base + 5_000, 0)
        );
        assert_eq!(
            reading(base, 5_000, (5_000, base + 4_999), 0),
            (base + 5_000, 0)
        );
        // The wall clock stepped an hour ahead, or 90 s back: followed.
        let hour = 3_600_000;
        assert_eq!(
            reading(base, 5_000, (5_000, base + 5_000 + hour), 0),
            (base + 5_000 + hour, 3_600_000)
        );
        assert_eq!(
            reading(base, 5_000, (5_000, base + 5_000 - 90_000), 0),
            (base + 5_000 - 90_000, -90_000)
        );
        // A step of a whole second, read with a millisecond's jitter either way: it stays
        // where it was followed, never flipping back and forth.
        let (first, stepped) = reading(base, 5_000, (5_000, base + 4_000), 0);
        assert_eq!((first, stepped), (base + 4_000, -1_000));
        for wall in [base + 3_998, base + 3_999, base + 4_001, base + 4_002] {
            assert_eq!(
                reading(base, 5_000, (5_000, wall), stepped),
                (base + 4_000, -1_000)
            );
        }
        // Paused time advanced by 300 s while 2 ms passed: the advance.
        assert_eq!(
            reading(base, 300_000, (2, base + 3), 0),
            (base + 300_000, 0)
        );
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
