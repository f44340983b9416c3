//! The sweeper's clock, watched by the commits that stamp records with the time.
//!
//! A sweep catches a step of the clock ([`PurgeClock`]) and the store keeps it before it
//! purges; but sweeps are an interval apart (an hour by default), and every commit in
//! between writes its seal and its records' expiry by the stepped clock. A crash there
//! left a store whose newest write reads as recent by that clock, and no step kept: the
//! restart purged by it, records still within their retention with it. So each commit
//! compares its reading with the clock's *alarm* — the reading past which the sweeper's
//! clock would catch a step — for the price of one monotonic reading and one atomic load;
//! the first commit past it has the clock catch the step and keeps the step in its own
//! batch, durable with it ([`super::committer`]). Nothing is written by a stepped clock
//! before the store keeps the step.
//!
//! One clock is watched: the one of the sweeper started last (a store has one; a test may
//! start another beside it). A sweeper that stops stops being watched.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};
use std::time::Instant;

use super::horizon::PurgeClock;
use super::staging::lock;

/// A sweeper's clock, shared with the commits.
pub(crate) type SharedClock = Arc<Mutex<PurgeClock>>;

/// The clock the commits watch, and its alarm.
#[derive(Debug)]
pub(crate) struct ClockWatch {
    /// What the alarm is counted from.
    epoch: Instant,
    /// The watched clock's [`PurgeClock::alarm_at`] `epoch`; `u64::MAX` while none is.
    alarm_ms: AtomicU64,
    watched: Mutex<Option<SharedClock>>,
}

impl Default for ClockWatch {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            alarm_ms: AtomicU64::new(u64::MAX),
            watched: Mutex::default(),
        }
    }
}

impl ClockWatch {
    /// Watches `clock` from now on, instead of any watched before.
    pub(crate) fn watch(&self, clock: &SharedClock) {
        let alarm = lock(clock).alarm_at(self.epoch);
        let mut watched = lock(&self.watched);
        *watched = Some(Arc::clone(clock));
        self.alarm_ms.store(alarm, Ordering::SeqCst);
    }

    /// Stops watching `clock`, where it is the one watched.
    pub(crate) fn unwatch(&self, clock: &SharedClock) {
        let mut watched = lock(&self.watched);
        if watched.as_ref().is_some_and(|w| Arc::ptr_eq(w, clock)) {
            *watched = None;
            self.alarm_ms.store(u64::MAX, Ordering::SeqCst);
        }
    }

    /// `change` done to `clock`, under its lock, and the alarm moved with it where `clock`
    /// is the one watched.
    pub(crate) fn with<R>(
        &self,
        clock: &SharedClock,
        change: impl FnOnce(&mut PurgeClock) -> R,
    ) -> R {
        let mut held = lock(clock);
        let outcome = change(&mut held);
        let alarm = held.alarm_at(self.epoch);
        let watched = lock(&self.watched);
        if watched.as_ref().is_some_and(|w| Arc::ptr_eq(w, clock)) {
            self.alarm_ms.store(alarm, Ordering::SeqCst);
        }
        outcome
    }

    /// The watched clock, where a clock reading `now_ms` is past its alarm: it would catch
    /// a step. Readings within the slack of the time elapsed pass for a load and a
    /// monotonic reading.
    pub(crate) fn stepped(&self, now_ms: u64) -> Option<SharedClock> {
        let alarm = self.alarm_ms.load(Ordering::SeqCst);
        let elapsed = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let past = now_ms > alarm.saturating_add(elapsed).saturating_add(elapsed / 1000);
        past.then(|| lock(&self.watched).clone()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const HOUR_MS: u64 = 3_600_000;

    fn started(watch: &ClockWatch, first_ms: u64) -> SharedClock {
        let clock = Arc::new(Mutex::new(PurgeClock::new(Duration::from_secs(
            30 * 86_400,
        ))));
        lock(&clock).read_at_start(first_ms, Some(first_ms), None);
        watch.watch(&clock);
        clock
    }

    /// The alarm lies the slack past the time elapsed: a clock within it passes, one a day
    /// ahead does not; once the clock caught the step, only a further one rings it again.
    #[test]
    fn the_alarm_rings_for_a_step_and_then_only_for_a_further_one() {
        let watch = ClockWatch::default();
        let now = 1_800_000_000_000;
        let clock = started(&watch, now);
        assert!(watch.stepped(now).is_none());
        assert!(
            watch.stepped(now + HOUR_MS - 1_000).is_none(),
            "within the slack"
        );
        let ahead = now + 24 * HOUR_MS;
        let rung = watch.stepped(ahead).expect("a day ahead rings");
        assert!(Arc::ptr_eq(&rung, &clock));

        watch.with(&clock, |clock| clock.purge_by(ahead, Some(ahead)));
        assert!(
            lock(&clock).take_change().is_some(),
            "caught: a step to keep"
        );
        assert!(watch.stepped(ahead).is_none(), "the step in force");
        assert!(
            watch.stepped(ahead + 2 * HOUR_MS).is_some(),
            "a further step"
        );
    }

    /// A clock that is not watched, or no longer, rings nothing.
    #[test]
    fn only_the_clock_watched_rings() {
        let watch = ClockWatch::default();
        let now = 1_800_000_000_000;
        assert!(watch.stepped(u64::MAX - 1).is_none(), "none watched");
        let first = started(&watch, now);
        let second = started(&watch, now);
        watch.unwatch(&first);
        assert!(
            watch.stepped(now + 24 * HOUR_MS).is_some(),
            "the second is watched"
        );
        watch.with(&first, |clock| clock.purge_by(now, None));
        assert!(watch.stepped(now + 24 * HOUR_MS).is_some());
        watch.unwatch(&second);
        assert!(watch.stepped(now + 24 * HOUR_MS).is_none());
    }
}
