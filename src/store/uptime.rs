//! The time elapsed since the machine started, its sleep included: what the purge clock
//! ([`super::horizon::PurgeClock`]) measures the elapsed time by.
//!
//! `std::time::Instant` reads `CLOCK_MONOTONIC` on Linux, which stops while the machine is
//! suspended. Measured by it, a laptop's sleep, or a VM suspended by its guest, read as a
//! step of the wall clock of the sleep's length: said in a warning at the wake, written to
//! the store as a step, and every record kept that much longer, across restarts too.
//! `CLOCK_BOOTTIME` is the same clock, at the same rate (slewed alike by NTP), that goes on
//! counting through a suspend: the wall clock and the elapsed time then move together, and
//! records that expired during the sleep are purged at the next sweep, as they would have
//! been awake. A wall clock stepped forward still reads ahead of it.
//!
//! The length of a sleep is the kernel's: read off the machine's hardware clock (or the
//! hypervisor's) at the wake, and added to both clocks alike. A hardware clock wrong
//! across a suspend (a VM's emulated one, following a host whose clock stepped meanwhile)
//! moves the wall clock and the elapsed time together, and is not caught as a step: a
//! sweep before NTP sets the wall clock right purges by it. Servers are seldom suspended
//! (a hypervisor pausing or migrating a VM is no suspend: neither clock counts the pause);
//! `CLOCK_MONOTONIC` would take every sleep for a step, and keep records longer by it.
//!
//! Elsewhere than Linux the elapsed time is `Instant`'s: on macOS and the BSDs a sleep
//! still reads as a step (records kept longer, never shorter).

use std::time::Duration;

/// A reading of the time elapsed since the machine started, sleep included (see the
/// module's docs). Never goes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Uptime(Duration);

impl Uptime {
    /// The clock now.
    pub(crate) fn now() -> Self {
        Self(read())
    }

    /// The time elapsed since this reading.
    pub(crate) fn elapsed(self) -> Duration {
        Self::now().since(self)
    }

    /// The time from `earlier` to this reading (none where `earlier` is the later one).
    pub(crate) fn since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// `CLOCK_BOOTTIME`, through libc (which reads it off the vDSO where the kernel offers it,
/// Linux 5.3 on, and makes one system call otherwise).
#[cfg(target_os = "linux")]
fn read() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    // The kernel's readings are never negative, and their nanoseconds within a second.
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// `Instant`'s clock, counted from the first reading in the process.
#[cfg(not(target_os = "linux"))]
fn read() -> Duration {
    static FIRST: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    FIRST.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Its readings never go back, and it counts at least the time `Instant` counts
    /// between two of its readings: awake, they are the same clock (a sleep during the
    /// test would only add to it).
    #[test]
    fn counts_at_least_the_monotonic_clock_and_never_goes_back() {
        let mut last = Uptime::now();
        for _ in 0..1000 {
            let next = Uptime::now();
            assert!(next >= last, "{next:?} after {last:?}");
            last = next;
        }
        let started = Uptime::now();
        let monotonic = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let monotonic = monotonic.elapsed();
        let elapsed = started.elapsed();
        assert!(elapsed >= monotonic, "{elapsed:?} < {monotonic:?}");
    }

    #[test]
    fn a_reading_since_a_later_one_is_none() {
        let earlier = Uptime::now();
        let later = Uptime(earlier.0 + Duration::from_secs(1));
        assert_eq!(later.since(earlier), Duration::from_secs(1));
        assert_eq!(earlier.since(later), Duration::ZERO);
    }
}
