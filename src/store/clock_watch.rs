//! The sweeper's clock, watched by the commits that stamp records with the time.
//!
//! A sweep catches a step of the clock ([`PurgeClock`]) and the store keeps it before it
//! purges; but sweeps are an interval apart (an hour by default), and every commit in
//! between writes its seal and its records' expiry by the stepped clock. A crash there
//! left a store whose newest write reads as recent by that clock, and no step kept: the
//! restart purged by it, records still within their retention with it. So each commit
//! compares its reading with the clock's *alarm* — the reading past which the sweeper's
//! clock would catch a step — for the price of one reading of the elapsed time and one
//! atomic load; the first commit past it has the clock judge its reading as a sweep would
//! ([`PurgeClock::catches`](super::horizon::PurgeClock::catches): a reading within the
//! slewing a long run allows, or taken before the sweeper's, catches nothing) and keeps a
//! step it catches in its own batch, durable with it ([`super::committer`]). Where the sweeper caught the step
//! first, or changed what is kept of it, the alarm is down (every commit rings) until the
//! change is written, by whichever comes first: a commit does not wait for the sweeper's
//! write. The sweeper reads the wall clock under the clock's lock, and a commit's reading
//! only adds to the step (it is applied only where it steps): a reading taken before
//! another's never undoes what the later one caught. Nothing is written by a clock that
//! stepped further than the sweeper's bound allows (the slack, and a thousandth of the time
//! elapsed) before the store keeps the step.
//!
//! One clock is watched: the one of the sweeper started last (a store has one; a test may
//! start another beside it). A sweeper that stops stops being watched.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};

use super::horizon::PurgeClock;
use super::staging::lock;
use super::uptime::Uptime;

/// A sweeper's clock, shared with the commits.
pub(crate) type SharedClock = Arc<Mutex<PurgeClock>>;

/// The clock the commits watch, and its alarm.
#[derive(Debug)]
pub(crate) struct ClockWatch {
    /// What the alarm is counted from.
    epoch: Uptime,
    /// The watched clock's [`PurgeClock::alarm_at`] `epoch`; 0 while a change of its step
    /// is still to be written; `u64::MAX` while no clock is watched.
    alarm_ms: AtomicU64,
    watched: Mutex<Option<SharedClock>>,
}

impl Default for ClockWatch {
    fn default() -> Self {
        Self {
            epoch: Uptime::now(),
            alarm_ms: AtomicU64::new(u64::MAX),
            watched: Mutex::default(),
        }
    }
}

impl ClockWatch {
    /// Watches `clock` from now on, instead of any watched before.
    pub(crate) fn watch(&self, clock: &SharedClock) {
        let alarm = self.alarm_of(&lock(clock));
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
        let alarm = self.alarm_of(&held);
        let watched = lock(&self.watched);
        if watched.as_ref().is_some_and(|w| Arc::ptr_eq(w, clock)) {
            self.alarm_ms.store(alarm, Ordering::SeqCst);
        }
        outcome
    }

    /// The watched clock, where a clock reading `now_ms` is past its alarm: it may catch a
    /// step, or it has a change of its step to write. Readings within the slack of the time
    /// elapsed pass for a load and a reading of the elapsed time.
    pub(crate) fn stepped(&self, now_ms: u64) -> Option<SharedClock> {
        let past = self.past(self.alarm_ms.load(Ordering::SeqCst), now_ms);
        past.then(|| lock(&self.watched).clone()).flatten()
    }

    /// The alarm published for `clock`: where a change of its step is still to be written,
    /// none — the next commit writes it, whatever it reads — else its own. So no batch
    /// written by a clock that stepped is durable before the step is: a commit reading a
    /// clock the sweeper just caught stepping does not wait for the sweeper's write.
    fn alarm_of(&self, clock: &PurgeClock) -> u64 {
        if clock.take_change().is_some() {
            0
        } else {
            clock.alarm_at(self.epoch)
        }
    }

    /// Whether a reading `now_ms` is past `alarm` (see [`PurgeClock::alarm_at`]).
    fn past(&self, alarm: u64, now_ms: u64) -> bool {
        let elapsed = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        now_ms > alarm.saturating_add(elapsed)
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
    /// ahead does not; once the clock caught the step, every reading rings until the step is
    /// written, and then only a further one.
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
        let change = lock(&clock).take_change().expect("caught: a step to keep");
        assert!(
            watch.stepped(now).is_some(),
            "every commit rings while the step is not written"
        );
        watch.with(&clock, |clock| clock.written(change));
        assert!(watch.stepped(ahead).is_none(), "the step in force");
        assert!(
            watch.stepped(ahead + 2 * HOUR_MS).is_some(),
            "a further step"
        );
    }

    /// A commit's reading taken before the sweeper's caught the step (the commit staged
    /// meanwhile) is not applied: it would read as the clock set right, and drop the step.
    #[test]
    fn a_reading_from_before_the_step_does_not_undo_it() {
        let watch = ClockWatch::default();
        let now = 1_800_000_000_000;
        let clock = started(&watch, now);
        let ahead = now + 24 * HOUR_MS;
        watch.with(&clock, |clock| clock.purge_by(ahead, Some(ahead)));
        let change = lock(&clock).take_change().expect("caught");
        watch.with(&clock, |clock| clock.written(change));
        assert!(watch.stepped(now).is_none());
        let held = lock(&clock);
        assert!(!held.catches(now), "from before the step");
        assert!(!held.catches(ahead), "the step in force");
        assert!(held.catches(ahead + 2 * HOUR_MS), "a further one");
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
