//! Since when a store's records vouch for what was booked, across changes of
//! `store.retention`.
//!
//! A record's expiry is fixed when it is written, with the retention configured then. A store
//! kept for 30 days and opened again with 90 still holds only the last 30 days of what it
//! booked before: a callback retried, or a transaction reconciled, 40 days after its booking
//! would find no record and be booked a second time, were the horizon read from the new
//! retention alone. So a store keeps, beside its records, the retention they were written
//! with and — when it grew — when, and how far back the records written before then reach:
//! [`Vouched`]. What it vouches for grows back to the new retention as the old records age
//! out. A retention made shorter needs nothing: the records written before outlive it.
//!
//! Only an instance that serves moves the record on ([`at_open`]); an operator's command
//! that opens a stopped store (`payhook reconcile`, `validations`, `callbacks`) reads it,
//! so that a command run with another `store.retention` than the service's does not stand
//! for a change of the service's, and writes with the longer of the two ([`writes_with`]),
//! so that what it books is kept as long as the service vouches for. A sweep purges by
//! [`PurgeClock`]: the clock, but never ahead of the time elapsed since the sweeper
//! started (since the store's newest write, where the clock at start reads well past
//! it); a step of the clock it catches is kept beside the records ([`Step`]), so that a
//! restart before the clock is set right purges by the clock less the step.
//! Where several instances write (PostgreSQL), a growth counts from a little after it was recorded (`settle`): an instance still writing with
//! the shorter retention moves the record back at its next sweep, and one that stopped
//! before its next sweep wrote nothing after that.
//!
//! A store that kept no record — written by an earlier payhook — is taken to have been
//! written with the retention it is opened with, as before there was one (said in a
//! warning when it holds records): upgrade first, and raise the retention afterwards.
//! Guessing from its newest record would refuse every callback of a store whose records
//! had all expired. A record that does not decode is taken so too, with a warning.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::StoreError;

/// Who opens a store: a service, which moves its record of its retention on, or an
/// operator's command on a stopped store, which reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opener {
    Service,
    Operator,
}

/// What a store's records reach back to: every record written since [`Vouched::since_ms`]
/// is still kept.
///
/// ```text
/// since(now) = max(now − retention, min(now − kept, grew_at))
/// ```
///
/// where `kept` is how far back the records reached when the retention last grew, at
/// `grew_at`: those written before it expire by the retention they were written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Vouched {
    /// The retention records are written with now, in milliseconds.
    retention_ms: u64,
    /// When the retention last grew, while what was written before still matters.
    grew: Option<Grew>,
}

/// A growth of the retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Grew {
    /// When (milliseconds since the Unix epoch).
    at_ms: u64,
    /// How far back the records reached then, in milliseconds.
    kept_ms: u64,
}

impl Vouched {
    /// A store whose records were all written with `retention`: one opened for the first
    /// time, or one kept before stores kept this.
    pub(crate) fn new(retention: Duration) -> Self {
        Self {
            retention_ms: millis(retention),
            grew: None,
        }
    }

    /// The record as a store keeps it (JSON).
    pub(crate) fn encode(&self) -> Result<String, StoreError> {
        serde_json::to_string(self)
            .map_err(|e| StoreError::backend("cannot encode the store's retention record", e))
    }

    /// The store opened at `now_ms` with `retention`: what it vouches for from then on. A
    /// growth counts from `settle` after now: what another instance still writing with the
    /// shorter retention writes meanwhile was written for that one.
    pub(crate) fn opened_with(
        self,
        retention: Duration,
        (now_ms, settle): (u64, Duration),
    ) -> Self {
        let retention_ms = millis(retention);
        let grew = if retention_ms > self.retention_ms {
            Some(Grew {
                at_ms: now_ms.saturating_add(millis(settle)),
                kept_ms: now_ms.saturating_sub(self.since_ms(now_ms)),
            })
        } else {
            self.grew
        };
        // Once the records written before the growth have aged out, it no longer matters.
        let grew = grew.filter(|g| now_ms.saturating_sub(retention_ms) < g.at_ms);
        Self { retention_ms, grew }
    }

    /// The earliest time (milliseconds since the Unix epoch) since which every record
    /// written is still kept, at `now_ms`.
    pub(crate) fn since_ms(&self, now_ms: u64) -> u64 {
        let written_now = now_ms.saturating_sub(self.retention_ms);
        match self.grew {
            None => written_now,
            Some(grew) => written_now.max(now_ms.saturating_sub(grew.kept_ms).min(grew.at_ms)),
        }
    }

    /// How far back from `now_ms` the records reach: the retention to judge a horizon by.
    pub(crate) fn reach(&self, now_ms: u64) -> Duration {
        Duration::from_millis(now_ms.saturating_sub(self.since_ms(now_ms)))
    }

    /// What a store whose records are this one's and `other`'s (copied into it at `now_ms`)
    /// vouches for: no further back, then or later, than either. The records written before
    /// now are taken to reach back as far as the nearer of the two did now, and to age from
    /// then on (each reach grows no faster than time passes), counting from the later of
    /// now and a growth of either still settling; those written from now on, with the
    /// shorter of their retentions.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "copies into PostgreSQL")
    )]
    pub(crate) fn joined(self, other: Self, now_ms: u64) -> Self {
        let kept = self.reach(now_ms).min(other.reach(now_ms));
        let settling = [self.grew, other.grew]
            .into_iter()
            .flatten()
            .map(|grew| grew.at_ms)
            .fold(now_ms, u64::max);
        let retention_ms = self.retention_ms.min(other.retention_ms);
        let grew = Some(Grew {
            at_ms: settling,
            kept_ms: millis(kept),
        })
        .filter(|g| now_ms.saturating_sub(retention_ms) < g.at_ms);
        Self { retention_ms, grew }
    }

    /// The retention records are written with now, as the store records it.
    pub(crate) fn retention(&self) -> Duration {
        Duration::from_millis(self.retention_ms)
    }

    /// [`Vouched::reach`] for an instance that writes with `retention` itself: no further
    /// back than that, whatever another instance recorded.
    pub(crate) fn reach_within(&self, retention: Duration, now_ms: u64) -> Duration {
        self.reach(now_ms).min(retention)
    }
}

/// What an open with `retention` at `now_ms` makes of the `stored` record (its JSON; `None`
/// when there is none): read — or, when there is none or it does not decode, taken to be
/// the retention the store is opened with (said in a warning when the store `holds_records`,
/// or the record does not decode) — and moved on by the open when it `moves` (an instance
/// that serves: see the module docs), a growth counting from `settle` after now.
pub(crate) fn at_open(
    stored: Option<&[u8]>,
    retention: Duration,
    holds_records: bool,
    (now_ms, moves, settle): (u64, bool, Duration),
) -> Vouched {
    let vouched = match stored.map(serde_json::from_slice::<Vouched>) {
        Some(Ok(vouched)) => vouched,
        Some(Err(error)) => {
            tracing::warn!(
                %error,
                "the store's record of the retention its records were written with does not \
                 decode: they are taken to have been written with store.retention"
            );
            Vouched::new(retention)
        }
        None => {
            if holds_records {
                tracing::warn!(
                    "this store kept no record of the retention its records were written with \
                     (an earlier payhook wrote them): they are taken to have been written with \
                     store.retention; if it was raised in this restart, records of the old \
                     one's length may be missing (see the README, Exactly once)"
                );
            }
            Vouched::new(retention)
        }
    };
    if moves {
        vouched.opened_with(retention, (now_ms, settle))
    } else {
        vouched
    }
}

/// The retention an opener writes records with, `configured` being its `store.retention`
/// and `vouched` the store's record as its open left it. A service writes with its own (its
/// open moved the record to it). An operator's command writes with the longer of its own
/// and the store's: run without the service's `store.retention` (a shell lacking the
/// variable its unit sets), a booking it made would expire while the service still vouched
/// for the retention's whole length, and a retry of that transaction would be booked again.
pub(crate) fn writes_with(vouched: &Vouched, configured: Duration, opener: Opener) -> Duration {
    match opener {
        Opener::Service => configured,
        Opener::Operator => {
            let recorded = vouched.retention();
            if recorded > configured {
                tracing::info!(
                    store_retention = %crate::setting::format_duration(configured),
                    written_with = %crate::setting::format_duration(recorded),
                    "this command writes records with the retention the store's records are \
                     written with, longer than its store.retention"
                );
            }
            configured.max(recorded)
        }
    }
}

/// The time a sweep purges by: the wall clock (or the database's), held back to the time
/// elapsed since the sweeper started (its first reading) on the monotonic clock, plus
/// [`PurgeClock::SLACK`] and a thousandth of the elapsed time (what NTP's slewing moves a
/// clock by, and more).
///
/// A record expires by the wall clock, so a clock stepped forward past the retention (a VM
/// that booted with a wrong clock and was corrected by NTP, an operator's typo) would purge
/// every record at the next sweep, and for good: once the clock is right again the store
/// would vouch for the retention's whole length over records it no longer holds, and a
/// retried callback, or a reconcile, would be booked a second time. Held back, such a sweep
/// purges what expired by the elapsed time, and says that the clock ran ahead. A clock
/// that moves back purges less: records are kept longer, never shorter; so does a machine
/// that was suspended (the monotonic clock stops meanwhile).
///
/// A step caught so is kept in the store ([`Step`]: how far the clock leads, and since
/// when), written before the sweep that caught it purges: the records written after the
/// step carry the stepped clock's times, so the store's newest write (below) no longer
/// tells, and a restart before the clock is set right would purge by it. A sweeper that
/// starts with a step kept reads the clock less its lead. The step is dropped once the
/// clock agrees with the elapsed time again (it was set right), when the sweeper starts to
/// a clock that reads earlier than the store's newest write and the step's own reading (set
/// right while stopped), or once the retention and the slack have elapsed since it: what
/// was written before it has expired by then, and what was written after carries the
/// clock's own times — the sweep takes the clock as it reads from then on.
///
/// A clock already wrong when the sweeper starts is caught where the store knows when it
/// last wrote (sled's seal; on PostgreSQL, the newest booking's or validation's expiry less
/// the retention): the first reading is then held back to that write when the clock reads
/// more than the slack past it. So the time a store was stopped (or idle: sweeps write no
/// seal) does not count towards its records' retention — they are kept that much longer,
/// while this process runs — and a clock 40 days ahead at start purges nothing early. Such
/// a clock is not kept as a step (it cannot be told from a store stopped or idle that
/// long): a store that writes by it and starts again before it is set right purges by it,
/// its newest write read by the same clock. A newest write longer ago than the retention, by the clock,
/// is said in a warning: a store stopped or idle that long, or a clock that is wrong. On
/// PostgreSQL the newest write is read off its expiry less this instance's retention: an
/// instance whose retention is shorter than another's holds back less (not at all where
/// the difference exceeds the gap), one whose retention is longer holds back more.
#[derive(Debug)]
pub(crate) struct PurgeClock {
    /// The retention records are written with: a step older than it no longer matters.
    retention: Duration,
    /// The first reading (less the lead of a step kept) and when it was taken.
    first: Option<(u64, std::time::Instant)>,
    /// How far the clock read past the newest write at start, where the first reading was
    /// held back to it: the clock runs that far ahead of the bound without having stepped.
    held_at_start_ms: u64,
    /// The step in force: the clock leads the elapsed time by it.
    step: Option<Step>,
    /// Whether `step` changed since the store was last given it to keep.
    changed: bool,
}

/// A step of the clock a sweep caught, as the store keeps it (JSON): since `since_ms` (by
/// the elapsed time), the clock reads `lead_ms` ahead of the time elapsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Step {
    /// How far the clock reads ahead of the time elapsed, in milliseconds.
    lead_ms: u64,
    /// When the step was caught, by the time elapsed (the clock less its lead).
    since_ms: u64,
}

impl Step {
    /// How far the clock reads ahead of the time elapsed.
    pub(crate) fn lead(&self) -> Duration {
        Duration::from_millis(self.lead_ms)
    }

    /// The record as a store keeps it (JSON).
    pub(crate) fn encode(&self) -> Result<String, StoreError> {
        serde_json::to_string(self)
            .map_err(|e| StoreError::backend("cannot encode the clock's step", e))
    }

    /// A kept record (`None`: none kept); one that does not decode is said in a warning and
    /// taken as none.
    pub(crate) fn decode(stored: Option<&[u8]>) -> Option<Self> {
        let stored = stored?;
        serde_json::from_slice(stored)
            .inspect_err(|error| {
                tracing::warn!(
                    %error,
                    "the store's record of a step of the clock does not decode: taken as none \
                     (the sweeper holds back by the store's newest write alone)"
                );
            })
            .ok()
    }
}

/// What the store is to keep of the clock's step: a new or further step, or none (dropped).
pub(crate) type StepChange = Option<Step>;

impl PurgeClock {
    /// How far the clock may run ahead of the elapsed time before a sweep is held back.
    pub(crate) const SLACK: Duration = Duration::from_secs(3600);

    /// A sweeper's clock, for records written with `retention`.
    pub(crate) fn new(retention: Duration) -> Self {
        Self {
            retention,
            first: None,
            held_at_start_ms: 0,
            step: None,
            changed: false,
        }
    }

    /// Takes the first reading, `clock_ms` now, when none was taken: as the sweeper starts,
    /// a sweep interval before its first sweep. `kept` is the step the store keeps, read
    /// less its lead while in force. `last_commit_ms`, when the store knows when it last
    /// committed, holds the reading back to that commit where the clock reads more than
    /// [`Self::SLACK`] past it (a warning beyond the retention).
    pub(crate) fn read_at_start(
        &mut self,
        clock_ms: u64,
        last_commit_ms: Option<u64>,
        kept: Option<Step>,
    ) {
        if self.first.is_some() {
            return;
        }
        self.step = kept.filter(|step| self.in_force_at_start(step, clock_ms, last_commit_ms));
        self.changed = kept.is_some() && self.step.is_none();
        let lead = self.step.map_or(0, |step| step.lead_ms);
        if let Some(step) = self.step {
            tracing::warn!(
                lead = %crate::setting::format_duration(step.lead()),
                "the clock still reads ahead of the time elapsed, as a sweep caught before \
                 this start (a clock stepped forward, or a machine that was suspended): \
                 records are purged by the clock less that lead until it is set right, or \
                 the retention has elapsed since the step; check the machine's time"
            );
            tracing::debug!(
                since_ms = step.since_ms,
                "the clock's step kept by the store"
            );
        }
        let clock_ms = clock_ms.saturating_sub(lead);
        let last_commit_ms = last_commit_ms.map(|last| last.saturating_sub(lead));
        let first = match last_commit_ms {
            Some(last) if clock_ms > last.saturating_add(millis(Self::SLACK)) => {
                let gap = Duration::from_millis(clock_ms - last);
                Self::say_held_back(gap, self.retention);
                self.held_at_start_ms = clock_ms - last;
                last
            }
            _ => clock_ms,
        };
        self.first = Some((first, std::time::Instant::now()));
    }

    /// Whether the `step` kept still holds at a start whose clock reads `clock_ms`: the
    /// clock was not set back past what the store last read by it, and the retention (and
    /// the slack) has not elapsed since the step.
    fn in_force_at_start(&self, step: &Step, clock_ms: u64, last_commit_ms: Option<u64>) -> bool {
        let last_read = last_commit_ms
            .unwrap_or(0)
            .max(step.since_ms.saturating_add(step.lead_ms));
        let set_back = clock_ms.saturating_add(millis(Self::SLACK)) < last_read;
        let elapsed = clock_ms
            .saturating_sub(step.lead_ms)
            .saturating_sub(step.since_ms);
        let aged_out = elapsed > millis(self.retention + Self::SLACK);
        if set_back || aged_out {
            tracing::info!(
                set_back,
                aged_out,
                "a step of the clock caught before this start no longer holds: records are \
                 purged by the clock"
            );
        }
        !set_back && !aged_out
    }

    /// Says that the store's last commit lies `gap` behind the clock at start.
    fn say_held_back(gap: Duration, retention: Duration) {
        let beyond = gap > retention;
        let gap = crate::setting::format_duration(gap);
        if beyond {
            tracing::warn!(
                %gap,
                retention = %crate::setting::format_duration(retention),
                "the store's newest write is longer before this start than its retention, by \
                 the clock: a store stopped or idle that long, or a clock that is wrong (which \
                 would purge every record at the first sweep); records are purged by the time \
                 elapsed since that write instead, and kept that much longer; if the store was \
                 in use lately, check the machine's time"
            );
        } else {
            tracing::debug!(
                %gap,
                "the store's newest write is a while before this start, by the clock: records \
                 are purged by the time elapsed since that write (the time the store was \
                 stopped or idle does not count towards their retention)"
            );
        }
    }

    /// The time to purge by when the clock reads `clock_ms` now. Where it changed what the
    /// store is to keep of the clock's step, [`Self::take_change`] gives it: the store keeps
    /// it before it purges.
    pub(crate) fn purge_by(&mut self, clock_ms: u64) -> u64 {
        let now = std::time::Instant::now();
        let (_, first_at) = *self.first.get_or_insert((clock_ms, now));
        self.bounded(clock_ms, now.saturating_duration_since(first_at))
    }

    /// What the store is to keep of the clock's step, where it changed since last taken.
    pub(crate) fn take_change(&mut self) -> Option<StepChange> {
        std::mem::take(&mut self.changed).then_some(self.step)
    }

    /// The change [`Self::take_change`] gave could not be kept: it is given again.
    pub(crate) fn unkept(&mut self) {
        self.changed = true;
    }

    /// [`Self::purge_by`], the first reading taken `elapsed` ago.
    fn bounded(&mut self, clock_ms: u64, elapsed: Duration) -> u64 {
        let Some((first_ms, _)) = self.first else {
            return clock_ms;
        };
        let slewed = elapsed + elapsed / 1000;
        // What the clock reads, had it not stepped; the bound lets it run the slack ahead.
        let expected = first_ms
            .saturating_add(millis(slewed))
            .saturating_add(self.held_at_start_ms);
        let bound = first_ms.saturating_add(millis(slewed + Self::SLACK));
        let lead = clock_ms.saturating_sub(expected);
        if lead <= millis(Self::SLACK) {
            if self.step.take().is_some() {
                self.changed = true;
                tracing::info!(
                    "the clock agrees with the time elapsed again: records are purged by it"
                );
            }
            return clock_ms.min(bound);
        }
        let Some(step) = self
            .step
            .filter(|step| lead <= step.lead_ms + millis(Self::SLACK))
        else {
            // A new step, or a further one: what was written before it is kept by the
            // elapsed time until the retention has elapsed since.
            self.step = Some(Step {
                lead_ms: lead,
                since_ms: expected,
            });
            self.changed = true;
            tracing::warn!(
                ahead = %crate::setting::format_duration(Duration::from_millis(lead)),
                "the clock runs ahead of the time elapsed since the store's sweeper started \
                 (a clock stepped forward, or a machine that was suspended): records are \
                 purged by the elapsed time, not by the clock, so that a wrong clock cannot \
                 purge records still within the retention — across restarts too, until the \
                 clock is set right or the retention has elapsed; check the machine's time"
            );
            return bound;
        };
        if expected.saturating_sub(step.since_ms) > millis(self.retention + Self::SLACK) {
            // Aged out: the clock is taken as it reads from now on.
            self.step = None;
            self.changed = true;
            self.held_at_start_ms = 0;
            self.first = self
                .first
                .map(|(_, at)| (clock_ms.saturating_sub(millis(slewed)), at));
            tracing::info!(
                "the retention has elapsed since the clock stepped ahead: records are purged \
                 by the clock as it reads"
            );
            return clock_ms;
        }
        bound
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;
    const DAY: u64 = 24 * HOUR;

    fn days(n: u64) -> Duration {
        Duration::from_millis(n * DAY)
    }

    /// Kept 30 days, opened with 90 on day 100: the records reach back 30 days then, and
    /// for 30 days more (the records written before the change expire after 30 days); from
    /// then on the reach is from the change, growing day by day until it is 90, 90 days
    /// after the change.
    #[test]
    fn a_longer_retention_vouches_only_for_what_the_old_one_kept_until_it_ages_out() {
        let now = 100 * DAY;
        let vouched = Vouched::new(days(30)).opened_with(days(90), (now, Duration::ZERO));
        assert_eq!(vouched.reach(now), days(30));
        // Ten days on, the records written before the change still expire after 30 days.
        assert_eq!(vouched.reach(now + 10 * DAY), days(30));
        // Thirty days on, those are gone: the reach is from the change on.
        assert_eq!(vouched.reach(now + 30 * DAY), days(30));
        assert_eq!(vouched.reach(now + 45 * DAY), days(45));
        assert_eq!(vouched.reach(now + 90 * DAY), days(90));
        assert_eq!(vouched.reach(now + 200 * DAY), days(90));
        // Opened again once it has aged out, nothing of the change is kept.
        let later = vouched.opened_with(days(90), (now + 95 * DAY, Duration::ZERO));
        assert_eq!(later, Vouched::new(days(90)));
    }

    /// A sweeper's clock for a 30-day retention, its first reading `first` (the store's
    /// newest write `last`, the step kept `kept`).
    fn started(first: u64, last: Option<u64>, kept: Option<Step>) -> PurgeClock {
        let mut clock = PurgeClock::new(days(30));
        clock.read_at_start(first, last, kept);
        clock
    }

    fn hours(n: u64) -> Duration {
        Duration::from_millis(n * HOUR)
    }

    /// A clock stepped forward by more than the slack purges by the elapsed time, however
    /// long it stays ahead, and gives the step to keep once; one that agrees again, or
    /// moves back, purges by itself, and the step is dropped.
    #[test]
    fn a_clock_stepped_forward_does_not_purge_ahead_of_the_elapsed_time() {
        let first = 1_000 * DAY;
        let mut clock = started(first, None, None);
        // An hour on, the clock agrees: by the clock.
        assert_eq!(clock.bounded(first + HOUR, hours(1)), first + HOUR);
        assert_eq!(clock.take_change(), None);
        // Two hours on, the clock reads 40 days on: held back to the elapsed time and the slack.
        let slew = (2 * HOUR) / 1000;
        let held = first + 2 * HOUR + HOUR + slew;
        assert_eq!(clock.bounded(first + 40 * DAY, hours(2)), held);
        let step = clock.take_change().flatten().expect("a step to keep");
        assert_eq!(step.lead_ms, 40 * DAY - 2 * HOUR - slew);
        assert_eq!(step.since_ms, first + 2 * HOUR + slew);
        // Still ahead a day later: still held back, nothing new to keep.
        let day_on = Duration::from_millis(DAY + 2 * HOUR);
        let bound = first + millis(day_on + PurgeClock::SLACK + day_on / 1000);
        assert_eq!(clock.bounded(first + 41 * DAY, day_on), bound);
        assert_eq!(clock.take_change(), None);
        // Set right again, and behind: by the clock; the step is dropped.
        assert_eq!(clock.bounded(first + DAY, day_on), first + DAY);
        assert_eq!(clock.take_change(), Some(None));
        // Within a thousandth of a year's elapsed time (slewing), by the clock.
        let year = Duration::from_millis(365 * DAY);
        let slewed = first + 365 * DAY + HOUR + 8 * HOUR;
        assert_eq!(clock.bounded(slewed, year), slewed);
        assert_eq!(clock.take_change(), None);
    }

    /// The hole the kept step closes: a clock stepped 40 days ahead at runtime, caught by a
    /// sweep; the store wrote by it for a day and restarted, the clock still ahead. Its
    /// newest write reads as recent by that clock: without the step, the restart would
    /// purge by the clock, 40 days ahead; with it, by about the true time.
    #[test]
    fn a_step_kept_holds_a_restart_back_while_the_clock_is_still_ahead() {
        let t0 = 1_000 * DAY;
        let mut running = started(t0, Some(t0), None);
        running.bounded(t0 + 40 * DAY + 2 * HOUR, hours(2));
        let step = running.take_change().flatten().expect("a step to keep");
        let stepped_now = t0 + 41 * DAY + 2 * HOUR;
        let true_now = t0 + DAY + 2 * HOUR;
        let last_write = stepped_now - HOUR;
        let mut restarted = started(stepped_now, Some(last_write), Some(step));
        let by = restarted.purge_by(stepped_now);
        assert!(
            (true_now..=true_now + HOUR + HOUR / 100).contains(&by),
            "purged by {by}, not near the true time {true_now}"
        );
        assert_eq!(restarted.take_change(), None, "the step still holds");
        assert_eq!(
            started(stepped_now, Some(last_write), None).purge_by(stepped_now),
            stepped_now,
            "without the step kept, by the stepped clock"
        );
        // Stepped a further ten days: a further step to keep, with the whole lead.
        restarted.bounded(stepped_now + 10 * DAY + HOUR, hours(1));
        let further = restarted.take_change().flatten().expect("a further step");
        assert!(further.lead_ms > step.lead_ms + 10 * DAY - HOUR);
        // Set right while running: by the clock, and the step is dropped.
        assert_eq!(
            restarted.bounded(true_now + 2 * HOUR, hours(2)),
            true_now + 2 * HOUR
        );
        assert_eq!(restarted.take_change(), Some(None));
    }

    /// A step kept no longer holds at a start whose clock was set right meanwhile (it reads
    /// earlier than the store's newest write), nor once the retention and the slack have
    /// elapsed since it; while running, it ages out so too, and the clock is taken as it
    /// reads from then on.
    #[test]
    fn a_step_kept_is_dropped_once_the_clock_is_set_right_or_the_retention_elapsed() {
        let t0 = 1_000 * DAY;
        let mut running = started(t0, Some(t0), None);
        running.bounded(t0 + 40 * DAY + 2 * HOUR, hours(2));
        let step = running.take_change().flatten().expect("a step to keep");
        let last_write = t0 + 41 * DAY;
        // Set right while stopped: a day on, the clock reads the true time.
        let set_right = t0 + DAY + 2 * HOUR;
        let mut restarted = started(set_right, Some(last_write), Some(step));
        assert_eq!(restarted.take_change(), Some(None));
        assert_eq!(restarted.purge_by(set_right), set_right);
        // Still ahead, but 31 days after the step: aged out.
        let aged = t0 + 40 * DAY + 31 * DAY + 2 * HOUR;
        let mut restarted = started(aged, Some(aged - HOUR), Some(step));
        assert_eq!(restarted.take_change(), Some(None));
        assert_eq!(restarted.purge_by(aged), aged);
        // A day after the step, still ahead: it holds; 30 days and two hours on, it ages
        // out while running, and the clock is taken as it reads.
        let stepped_now = t0 + 41 * DAY + 2 * HOUR;
        let mut restarted = started(stepped_now, Some(stepped_now - HOUR), Some(step));
        let month = Duration::from_millis(30 * DAY);
        assert!(restarted.bounded(stepped_now + 29 * DAY, month - days(1)) < stepped_now);
        assert_eq!(restarted.take_change(), None);
        let later = stepped_now + 30 * DAY;
        assert_eq!(restarted.bounded(later, month), later);
        assert_eq!(restarted.take_change(), Some(None));
        assert_eq!(
            restarted.bounded(later + DAY, month + Duration::from_millis(DAY)),
            later + DAY
        );
        assert_eq!(restarted.take_change(), None);
    }

    /// A step record that does not decode is taken as none; one kept reads back the same.
    #[test]
    fn a_step_record_reads_back_and_a_garbled_one_is_none() {
        let step = Step {
            lead_ms: 40 * DAY,
            since_ms: 1_000 * DAY,
        };
        let kept = step.encode().unwrap();
        assert_eq!(Step::decode(Some(kept.as_bytes())), Some(step));
        assert_eq!(Step::decode(Some(b"{not json")), None);
        assert_eq!(Step::decode(None), None);
    }

    /// A clock already 40 days ahead when the sweeper starts is held back to the store's
    /// last commit; one within the slack of it, or behind it, or a store that does not say,
    /// purges by the clock.
    #[test]
    fn a_clock_ahead_at_start_is_held_back_to_the_last_commit() {
        let last = 1_000 * DAY;
        let ahead = &mut started(last + 40 * DAY, Some(last), None);
        let by = ahead.purge_by(last + 40 * DAY);
        assert!(
            (last + HOUR..last + 2 * HOUR).contains(&by),
            "purged by {by}, not near the last commit {last}"
        );
        // Three days stopped: the three days do not count towards the retention.
        let stopped = &mut started(last + 3 * DAY, Some(last), None);
        assert!(stopped.purge_by(last + 3 * DAY) < last + 2 * HOUR);
        assert_eq!(
            stopped.take_change(),
            None,
            "three days stopped is no step of the clock"
        );
        // A step forward after such a start is caught all the same.
        let start = last + 3 * DAY;
        assert!(stopped.bounded(start + 40 * DAY, hours(1)) < start);
        assert!(stopped.take_change().flatten().is_some());
        for (clock, known) in [
            (last + HOUR / 2, Some(last)),
            (last - DAY, Some(last)),
            (last + 40 * DAY, None),
        ] {
            let clock_at = &mut started(clock, known, None);
            assert_eq!(clock_at.purge_by(clock), clock, "{clock} {known:?}");
        }
    }

    /// An operator's command writes with the longer of its retention and the store's; a
    /// service, with its own.
    #[test]
    fn an_operators_command_writes_with_the_longer_retention() {
        let recorded = Vouched::new(days(90));
        assert_eq!(writes_with(&recorded, days(30), Opener::Operator), days(90));
        assert_eq!(
            writes_with(&recorded, days(120), Opener::Operator),
            days(120)
        );
        assert_eq!(writes_with(&recorded, days(30), Opener::Service), days(30));
    }

    /// A shorter retention vouches for itself at once: what was written before outlives it.
    #[test]
    fn a_shorter_retention_vouches_for_itself() {
        let now = 100 * DAY;
        let vouched = Vouched::new(days(90)).opened_with(days(30), (now, Duration::ZERO));
        assert_eq!(vouched.reach(now), days(30));
        assert_eq!(vouched.reach(now + DAY), days(30));
    }

    /// Grown twice, the second time before the first aged out: the reach never exceeds what
    /// either regime's records still hold.
    #[test]
    fn a_retention_grown_twice_reaches_no_further_than_its_oldest_records() {
        let first = 100 * DAY;
        let vouched = Vouched::new(days(30)).opened_with(days(60), (first, Duration::ZERO));
        let second = first + 10 * DAY;
        let vouched = vouched.opened_with(days(90), (second, Duration::ZERO));
        assert_eq!(vouched.reach(second), days(30));
        // Records written before the first growth are gone 30 days after it; those written
        // between the two were written for 60 days.
        assert_eq!(vouched.reach(first + 30 * DAY), days(30));
        assert_eq!(vouched.reach(first + 40 * DAY), days(30));
        assert!(vouched.reach(first + 80 * DAY) <= days(80));
        assert_eq!(vouched.reach(second + 90 * DAY), days(90));
    }

    /// Several writers: a growth recorded now counts from `settle` later — what an instance
    /// still writing with the shorter retention writes until then was written for that one.
    #[test]
    fn a_growth_among_several_writers_counts_from_its_settling() {
        let now = 100 * DAY;
        let settle = Duration::from_millis(2 * HOUR);
        let vouched = Vouched::new(days(30)).opened_with(days(90), (now, settle));
        // Thirty days after the growth, what was written up to its settling is still taken
        // as written for 30 days.
        assert_eq!(vouched.reach(now + 30 * DAY), days(30));
        assert_eq!(
            vouched.reach(now + 31 * DAY),
            Duration::from_millis(31 * DAY - 2 * HOUR)
        );
    }

    /// Joined, two stores' records reach no further back than either, at any time after:
    /// checked day by day over both retentions, growths settling or not.
    #[test]
    fn joined_records_reach_no_further_than_either_from_then_on() {
        let now = 300 * DAY;
        let settle = Duration::from_millis(2 * HOUR);
        let grown = Vouched::new(days(7)).opened_with(days(30), (now - 3 * DAY, Duration::ZERO));
        let settling = Vouched::new(days(30)).opened_with(days(90), (now, settle));
        let stores = [
            Vouched::new(days(30)),
            Vouched::new(days(7)),
            grown,
            settling,
        ];
        for a in stores {
            for b in stores {
                let joined = a.joined(b, now);
                for hours in 0..=(100 * 24) {
                    let then = now + hours * HOUR;
                    assert!(
                        joined.since_ms(then) >= a.since_ms(then).max(b.since_ms(then)),
                        "{a:?} + {b:?} at +{hours}h"
                    );
                }
                assert_eq!(joined.reach(now), a.reach(now).min(b.reach(now)));
            }
        }
        // Grown three days ago from 7 to 30: 7 days back, and a week on still 7 (the grown
        // store's own would say 10: joined, what was written before the copy ages from it).
        let fresh = Vouched::new(days(30));
        assert_eq!(fresh.joined(grown, now).reach(now), days(7));
        assert_eq!(fresh.joined(grown, now).reach(now + 7 * DAY), days(7));
        assert_eq!(fresh.joined(grown, now).reach(now + 30 * DAY), days(30));
    }

    /// A store without a record is taken to have been written with the retention it is
    /// opened with; one whose record does not decode too. An operator's open reads and does
    /// not move what it finds.
    #[test]
    fn a_store_without_a_record_is_taken_at_its_retention_and_an_operator_moves_nothing() {
        let now = 100 * DAY;
        let still = (now, true, Duration::ZERO);
        let new = at_open(None, days(90), true, still);
        assert_eq!(new, Vouched::new(days(90)));
        let garbled = at_open(Some(b"{not json"), days(90), true, still);
        assert_eq!(garbled, Vouched::new(days(90)));
        let stored = Vouched::new(days(30)).encode().unwrap();
        let read = at_open(
            Some(stored.as_bytes()),
            days(90),
            true,
            (now, false, Duration::ZERO),
        );
        assert_eq!(read, Vouched::new(days(30)));
        assert_eq!(read.reach_within(days(90), now), days(30));
        assert_eq!(Vouched::new(days(90)).reach_within(days(30), now), days(30));
    }

    /// The same retention, opened again: unchanged.
    #[test]
    fn the_same_retention_changes_nothing() {
        let vouched = Vouched::new(days(30));
        assert_eq!(
            vouched.opened_with(days(30), (100 * DAY, Duration::ZERO)),
            vouched
        );
        assert_eq!(vouched.reach(100 * DAY), days(30));
    }
}
