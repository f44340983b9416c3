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
//! restart before the clock is set right purges by the clock less the step, until what the
//! store held when the step was caught has expired.
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
use super::uptime::Uptime;

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
/// elapsed since the sweeper started (its first reading; [`Uptime`], sleep included), plus
/// [`PurgeClock::SLACK`] and a thousandth of the elapsed time (what NTP's slewing moves a
/// clock by, and more).
///
/// A record expires by the wall clock, so a clock stepped forward past the retention (a VM
/// that booted with a wrong clock and was corrected by NTP, an operator's typo) would purge
/// every record at the next sweep, and for good: once the clock is right again the store
/// would vouch for the retention's whole length over records it no longer holds, and a
/// retried callback, or a reconcile, would be booked a second time. Held back, such a sweep
/// purges what expired by the elapsed time, and says that the clock ran ahead. A clock
/// that moves back purges less: records are kept longer, never shorter. A machine's sleep
/// counts as elapsed time on Linux (`CLOCK_BOOTTIME`); elsewhere it reads as a step, kept
/// like one, and its records are kept that much longer, across restarts too, until what the
/// store held then has expired.
///
/// A step caught so is kept in the store ([`Step`]: how far the clock leads, when it was
/// caught, and the latest expiry the store held then), written before the sweep that caught
/// it purges, and again when the store stops: the records written after the step carry the
/// stepped clock's times, so the store's newest write (below) no longer tells, and a restart
/// before the clock is set right would purge by it. A sweeper that starts with a step kept
/// reads the clock less its lead — less only what the clock can still lead by where it
/// reads earlier than when the step was caught (set back, perhaps part of the way, while
/// the store was stopped). A step whose lead shrinks while the store runs is kept with the
/// smaller lead; it is dropped once the clock agrees with the elapsed time again, and once
/// the elapsed time (as this process vouches for it: not the time the store was stopped)
/// passes the latest expiry held when it was caught — nothing written before it is left
/// then, and what was written after carries the clock's own times: a restart takes the
/// clock as it reads (held back by the time stopped, below), while this process goes on
/// purging by the elapsed time, the lead taken as no step. A clock read behind the elapsed
/// time lowers what it is taken to run ahead by, so that a step from there is caught. A
/// step is caught before much is written by the stepped clock: on sled, by the first
/// commit after it, which writes the step in its own batch ([`PurgeClock::alarm_at`]: the
/// reading past which, the elapsed time added, the clock may have stepped; one reading of the
/// elapsed time and one atomic load per batch); on PostgreSQL, whose writes read the
/// database's clock, by the sweeper reading that clock every minute between sweeps — an
/// instance that crashes within that minute, having written by the stepped clock, purges
/// by it when it starts again.
///
/// A clock already wrong when the sweeper starts is caught where the store knows when it
/// last wrote (sled's seal; on PostgreSQL, the newest booking's or validation's expiry less
/// the retention): the first reading is then held back to that write when the clock reads
/// more than the slack past it. So the time a store was stopped (or idle: sweeps write no
/// seal) does not count towards its records' retention — they are kept that much longer,
/// while this process runs — and a clock 40 days ahead at start purges nothing early. Such
/// a clock is not kept as a step (it cannot be told from a store stopped or idle that
/// long): a store that writes by it and starts again before it is set right purges by it,
/// its newest write read by the same clock. A newest write longer ago than the retention,
/// by the clock, is said in a warning: a store stopped or idle that long, or a clock that
/// is wrong. On PostgreSQL the newest write is read off its expiry less this instance's
/// retention: an instance whose retention is shorter than another's holds back less (not
/// at all where the difference exceeds the gap), one whose retention is longer holds back
/// more.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub(crate) struct PurgeClock {
    /// The retention records are written with (for the warnings).
    retention: Duration,
    /// The first reading (less the lead of a step kept, or held back to the newest write)
    /// and when it was taken; moved back where the clock is read behind it.
    first: Option<(u64, Uptime)>,
    /// The lead of the step the first reading was taken less of (at start, or taken up
    /// from another instance since).
    applied_ms: u64,
    /// How far the clock runs ahead of the bound without having stepped: how far it read
    /// past the newest write at start, where the first reading was held back to it, and the
    /// lead of a step that aged out; lowered where the clock is set back.
    held_ms: u64,
    /// The step in force: the clock leads the elapsed time by it.
    step: Option<Step>,
    /// The step the store keeps, as this clock last read or gave it.
    kept: Option<Step>,
    /// Whether `kept` is another instance's step this clock does not hold (it caught none,
    /// and its own readings were right when that step was caught): left to that instance
    /// to drop, never dropped by this one.
    foreign: bool,
}

/// A step of the clock a sweep caught, as the store keeps it (JSON): since `since_ms` (by
/// the elapsed time), the clock reads `lead_ms` ahead of the time elapsed; `until_ms` is the
/// latest expiry the store held when it was caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Step {
    /// How far the clock reads ahead of the time elapsed, in milliseconds.
    lead_ms: u64,
    /// When the step was caught, by the time elapsed (the clock less its lead).
    since_ms: u64,
    /// The latest expiry the store held when the step was caught (milliseconds since the
    /// Unix epoch): no record written before the step expires later.
    until_ms: u64,
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

    /// A kept record (`None`: none kept); one that does not decode is said in an error and
    /// taken as none.
    pub(crate) fn decode(stored: Option<&[u8]>) -> Option<Self> {
        let stored = stored?;
        serde_json::from_slice(stored)
            .inspect_err(|error| {
                tracing::error!(
                    %error,
                    "the store's record of a step of the clock does not decode: taken as none \
                     (the sweeper holds back by the store's newest write alone; if the clock \
                     is ahead, set it right before the first sweep)"
                );
            })
            .ok()
    }

    /// Of two steps caught by different instances, the one that holds back more (the later
    /// caught, of two as far ahead), until the later of their expiries: the same whichever
    /// is given first.
    pub(crate) fn further(self, other: Self) -> Self {
        let until_ms = self.until_ms.max(other.until_ms);
        let further = if (other.lead_ms, other.since_ms) > (self.lead_ms, self.since_ms) {
            other
        } else {
            self
        };
        Self {
            until_ms,
            ..further
        }
    }

    /// What a store keeping this step keeps when `ours` is written over it: `ours` — the
    /// same step shrunk, or a further one — unless it is another step with a smaller lead
    /// (caught in a frame another instance's step had moved), which is merged instead.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "PostgreSQL's instances share the step")
    )]
    pub(crate) fn replaced_by(self, ours: Self) -> Self {
        if ours.since_ms != self.since_ms && ours.lead_ms < self.lead_ms {
            self.further(ours)
        } else {
            ours
        }
    }

    /// This step at a start whose clock reads `clock_ms`. A clock that reads earlier than
    /// it did when the step was caught (beyond the slack) was set back meanwhile, by that
    /// much at least: since the time elapsed is no earlier than when the step was caught,
    /// the clock leads it by `clock − since` at most — the step's new lead, or none where
    /// that is within the slack (set right).
    fn at_start(self, clock_ms: u64) -> Option<Self> {
        let caught_reading = self.since_ms.saturating_add(self.lead_ms);
        if clock_ms.saturating_add(millis(PurgeClock::SLACK)) >= caught_reading {
            return Some(self);
        }
        let lead_ms = clock_ms.saturating_sub(self.since_ms);
        (lead_ms > millis(PurgeClock::SLACK)).then_some(Self { lead_ms, ..self })
    }
}

/// What the store is to keep of the clock's step: `step` (`None`: none), where it kept
/// `kept` as the clock last knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepChange {
    /// The store's step as the clock last read or gave it.
    pub(crate) kept: Option<Step>,
    /// The step to keep now.
    pub(crate) step: Option<Step>,
}

impl PurgeClock {
    /// How far the clock may run ahead of the elapsed time before a sweep is held back.
    pub(crate) const SLACK: Duration = Duration::from_secs(3600);

    /// A sweeper's clock, for records written with `retention`.
    pub(crate) fn new(retention: Duration) -> Self {
        Self {
            retention,
            first: None,
            applied_ms: 0,
            held_ms: 0,
            step: None,
            kept: None,
            foreign: false,
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
        self.kept = kept;
        self.step = kept.and_then(|step| step.at_start(clock_ms));
        let lead = self.step.map_or(0, |step| step.lead_ms);
        self.applied_ms = lead;
        if let Some(step) = self.step {
            tracing::warn!(
                lead = %crate::setting::format_duration(step.lead()),
                "the clock still reads ahead of the time elapsed, as a sweep caught before \
                 this start (a clock stepped forward; on macOS or a BSD, also a machine that was suspended): \
                 records are purged by the clock less that lead until it is set right; \
                 check the machine's time"
            );
        } else if kept.is_some() {
            tracing::info!(
                "the clock reads earlier than when a sweep caught it ahead: it was set right \
                 while the store was stopped, and records are purged by it"
            );
        }
        let clock_ms = clock_ms.saturating_sub(lead);
        // Less the lead where written by the stepped clock, after the step was caught.
        let last_commit_ms = last_commit_ms.map(|last| match self.step {
            Some(step) if last > step.since_ms.saturating_add(millis(Self::SLACK)) => {
                last.saturating_sub(lead)
            }
            _ => last,
        });
        let first = match last_commit_ms {
            Some(last) if clock_ms > last.saturating_add(millis(Self::SLACK)) => {
                let gap = Duration::from_millis(clock_ms - last);
                Self::say_held_back(gap, self.retention);
                self.held_ms = clock_ms - last;
                last
            }
            Some(last) if clock_ms.saturating_add(millis(Self::SLACK)) < last => {
                tracing::warn!(
                    behind = %crate::setting::format_duration(Duration::from_millis(last - clock_ms)),
                    "the clock reads earlier than the store's newest write: set right since a \
                     clock ahead wrote it, or behind (a machine without a clock that keeps \
                     time, started before NTP set it); set forward later, it reads as a step, \
                     and records are kept that much longer (start the service once the clock \
                     is synchronised: systemd's After=time-sync.target)"
                );
                clock_ms
            }
            _ => clock_ms,
        };
        self.first = Some((first, Uptime::now()));
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

    /// The time to purge by when the clock reads `clock_ms` now, the latest expiry the
    /// store holds being `latest_expiry_ms` (`None`: it holds no record). Where it changed
    /// what the store is to keep of the clock's step, [`Self::take_change`] gives it: the
    /// store keeps it before it purges.
    pub(crate) fn purge_by(&mut self, clock_ms: u64, latest_expiry_ms: Option<u64>) -> u64 {
        let (_, first_at) = *self.first.get_or_insert((clock_ms, Uptime::now()));
        self.bounded(clock_ms, first_at.elapsed(), latest_expiry_ms)
    }

    /// What the store is to keep of the clock's step, where it differs from what it keeps
    /// (another instance's step this clock does not hold is not dropped by it).
    pub(crate) fn take_change(&self) -> Option<StepChange> {
        let theirs = self.step.is_none() && self.foreign;
        (self.step != self.kept && !theirs).then_some(StepChange {
            kept: self.kept,
            step: self.step,
        })
    }

    /// `change`, from [`Self::take_change`], is written: the store keeps its step — unless
    /// what the store keeps moved on since it was taken (another write of this clock's
    /// step, by a commit or a sweep, came between), which is left as it is.
    pub(crate) fn written(&mut self, change: StepChange) {
        // This clock's own step: not taken up as another instance's would be (`kept_as`),
        // which, the step dropped meanwhile, would leave it kept as theirs.
        if self.kept == change.kept {
            self.kept = change.step;
            self.foreign = false;
        }
    }

    /// The store keeps `stored`: on PostgreSQL, read off the schema, or as this instance's
    /// write of [`Self::take_change`] left it, merged with the other instances'.
    /// Another instance's step is taken up where this clock's readings are still stepped by
    /// it: its first reading came after the step was caught, by more than the slack, and
    /// was taken less a smaller lead (this instance started between the step and the sweep
    /// that caught it) — the readings are moved back by the difference; or the time it held
    /// back at start holds the lead (the step was taken for a store stopped that long).
    /// Otherwise it merges with the step in force, never to hold back less
    /// ([`Step::further`]), and where none is, this clock's readings were right when it was
    /// caught: it is left to its instance (this one drops it only once what the store held
    /// then has expired by its own elapsed time).
    #[cfg(any(feature = "postgres", test))]
    pub(crate) fn kept_as(&mut self, stored: Option<Step>) {
        if stored == self.kept {
            return;
        }
        self.kept = stored;
        self.foreign = false;
        let Some(theirs) = stored else { return };
        let slack = millis(Self::SLACK);
        let merged = Some(self.step.map_or(theirs, |ours| ours.further(theirs)));
        match self.first {
            Some((first_ms, at))
                if first_ms > theirs.since_ms.saturating_add(slack)
                    && theirs.lead_ms > self.applied_ms.saturating_add(slack) =>
            {
                let back = theirs.lead_ms - self.applied_ms;
                tracing::warn!(
                    lead = %crate::setting::format_duration(theirs.lead()),
                    "another instance caught the clock ahead since before this one's sweeper \
                     started: its readings are taken less that lead"
                );
                self.first = Some((first_ms.saturating_sub(back), at));
                self.applied_ms = theirs.lead_ms;
                self.step = merged;
            }
            _ if self.step.is_some() => self.step = merged,
            _ if theirs.lead_ms > slack && self.held_ms.saturating_add(slack) >= theirs.lead_ms => {
                self.held_ms -= theirs.lead_ms.min(self.held_ms);
                self.step = merged;
            }
            _ => self.foreign = true,
        }
    }

    /// The reading past which, plus the milliseconds elapsed since `epoch`, this clock may
    /// catch a step — a new one (where the slewing a long run allows, a thousandth of the
    /// time elapsed, is left to [`Self::catches`] to tell), or one further than the step in
    /// force: `u64::MAX` before its first reading. A writer that stamps records with the
    /// clock compares each reading with it ([`super::clock_watch::ClockWatch`]). `epoch`
    /// is no later than the first reading.
    pub(crate) fn alarm_at(&self, epoch: Uptime) -> u64 {
        let Some((first_ms, at)) = self.first else {
            return u64::MAX;
        };
        first_ms
            .saturating_add(self.held_ms)
            .saturating_add(self.step.map_or(0, |step| step.lead_ms))
            .saturating_add(millis(Self::SLACK))
            .saturating_sub(millis(at.since(epoch)))
    }

    /// Whether a reading `clock_ms` now catches a step, as [`Self::purge_by`] would: one
    /// further than the step in force, or, where none is, ahead of the time elapsed by
    /// more than the slack and the slewing it allows. A reading earlier than that changes
    /// nothing a sweep must not wait for: it can only hold back less.
    pub(crate) fn catches(&self, clock_ms: u64) -> bool {
        let Some((_, at)) = self.first else {
            return false;
        };
        let elapsed = at.elapsed();
        let slewing = if self.step.is_some() {
            0
        } else {
            millis(elapsed / 1000)
        };
        clock_ms
            > self
                .alarm_at(at)
                .saturating_add(millis(elapsed))
                .saturating_add(slewing)
    }

    /// The step the store keeps, as this clock last read or wrote it.
    #[cfg(feature = "postgres")]
    pub(crate) fn kept(&self) -> Option<Step> {
        self.kept
    }

    /// [`Self::purge_by`], the first reading taken `elapsed` ago.
    fn bounded(&mut self, clock_ms: u64, elapsed: Duration, latest_expiry_ms: Option<u64>) -> u64 {
        let Some((first_ms, at)) = self.first else {
            return clock_ms;
        };
        let behind = first_ms
            .saturating_add(millis(elapsed))
            .saturating_add(self.held_ms)
            .saturating_sub(clock_ms);
        let first_ms = if behind > millis(Self::SLACK) {
            // Set back: it no longer runs that far ahead — nor, past what was held back, is
            // the time elapsed read from as far ahead — and a step forward from here is
            // caught as one.
            let from_held = behind.min(self.held_ms);
            self.held_ms -= from_held;
            let first_ms = first_ms.saturating_sub(behind - from_held);
            self.first = Some((first_ms, at));
            first_ms
        } else {
            first_ms
        };
        let slewed = elapsed + elapsed / 1000;
        // The time elapsed as this process vouches for it (the time the store was stopped,
        // held back at start, not counted), and what the clock reads had it not stepped
        // (nor been slewed).
        let vouched = first_ms.saturating_add(millis(elapsed));
        if self.foreign
            && let Some(theirs) = self.kept
            && vouched > theirs.until_ms.saturating_add(millis(Self::SLACK))
        {
            // What the store held when another instance caught its step has expired by this
            // one's elapsed time: dropped, should that instance be gone.
            self.foreign = false;
        }
        let expected = vouched.saturating_add(self.held_ms);
        let bound = first_ms.saturating_add(millis(slewed + Self::SLACK));
        let slack = millis(Self::SLACK);
        let lead = clock_ms.saturating_sub(expected);
        // Ahead by more than slewing explains.
        if lead.saturating_sub(millis(elapsed / 1000)) <= slack {
            if self.step.take().is_some() {
                tracing::info!(
                    "the clock agrees with the time elapsed again: records are purged by it"
                );
            }
            return clock_ms.min(bound);
        }
        match self.step {
            Some(step) if lead.saturating_add(slack) < step.lead_ms => {
                // Set back part of the way: what was written before the step is still
                // held back, by the smaller lead.
                self.step = Some(Step {
                    lead_ms: lead,
                    ..step
                });
            }
            Some(step) if lead <= step.lead_ms.saturating_add(slack) => {}
            _ => {
                // A new step, or a further one: what the store holds now is held back by
                // the elapsed time until it has all expired.
                self.step = Some(Step {
                    lead_ms: lead,
                    since_ms: expected,
                    until_ms: latest_expiry_ms.unwrap_or(expected).max(expected),
                });
                tracing::warn!(
                    ahead = %crate::setting::format_duration(Duration::from_millis(lead)),
                    "the clock runs ahead of the time elapsed since the store's sweeper started \
                     (a clock stepped forward; on macOS or a BSD, also a machine that was suspended): records are \
                     purged by the elapsed time, not by the clock, so that a wrong clock cannot \
                     purge records still within the retention — across restarts too, until the \
                     clock is set right; check the machine's time"
                );
            }
        }
        if let Some(step) = self.step
            && vouched > step.until_ms.saturating_add(slack)
        {
            // Nothing written before the step is left: the store drops it, and a restart
            // takes the clock as it reads. This process goes on purging by the elapsed
            // time, the lead taken as no step (what was written since is kept that much
            // longer), and catches a step from there.
            self.step = None;
            self.held_ms = self.held_ms.saturating_add(lead);
            tracing::info!(
                "what the store held when the clock stepped ahead has expired by the elapsed \
                 time: the step is dropped, and a restart purges by the clock as it reads"
            );
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

    /// What the store is to keep of the clock's step (`None`: unchanged), kept as a store
    /// keeps it.
    fn keep(clock: &mut PurgeClock) -> Option<Option<Step>> {
        let change = clock.take_change()?;
        clock.kept_as(change.step);
        Some(change.step)
    }

    const T0: u64 = 1_000 * DAY;

    /// A change written after another write of the clock's step moved what the store
    /// keeps on (a commit caught the step and kept it while a sweep wrote its own) is left
    /// as it is: the clock takes what the later write kept, not the earlier change.
    #[test]
    fn a_change_written_after_the_store_moved_on_is_left_as_it_is() {
        let mut clock = started(T0, Some(T0), None);
        clock.bounded(T0 + 10 * DAY, hours(1), Some(T0 + 30 * DAY));
        let swept = clock.take_change().expect("a step to keep");
        // A commit took the same change and wrote it first.
        let committed = clock.take_change().expect("the same step");
        assert_eq!(swept, committed);
        clock.written(committed);
        assert_eq!(clock.take_change(), None, "kept");
        // The sweep's write lands after: nothing moves.
        clock.written(swept);
        assert_eq!(clock.take_change(), None);
        // A further step caught meanwhile is still to be kept, whatever the earlier write.
        clock.bounded(T0 + 20 * DAY, hours(2), Some(T0 + 30 * DAY));
        let further = clock.take_change().expect("a further step");
        clock.written(swept);
        assert_eq!(clock.take_change(), Some(further));
    }

    /// The clock's own step, written while a later reading dropped it (the clock set right
    /// between a commit's staging and its batch's write), is kept as its own: dropped from
    /// the store at the next write, not held as another instance's until what the store
    /// held then has expired.
    #[test]
    fn a_step_written_after_the_clock_was_set_right_is_dropped_at_the_next_write() {
        let mut clock = started(T0, Some(T0), None);
        clock.bounded(T0 + 10 * DAY, hours(1), Some(T0 + 30 * DAY));
        let committed = clock.take_change().expect("a step to keep");
        clock.bounded(T0 + 2 * HOUR, hours(2), Some(T0 + 30 * DAY));
        assert_eq!(clock.step, None, "set right");
        clock.written(committed);
        let change = clock.take_change().expect("the step kept is to be dropped");
        assert_eq!(change.step, None);
    }

    /// A reading catches a step for [`PurgeClock::catches`] exactly where the clock would
    /// catch one from it: with no step in force, past the slack and the slewing; with one,
    /// past it by more than the slack. (The elapsed time is the test's own, well under a
    /// second, against readings a minute either side.)
    #[test]
    fn catches_agrees_with_what_a_reading_would_catch() {
        let minute = 60_000;
        // A new step, or a further one: the lead in force grows.
        let caught_by = |clock: &PurgeClock, reading: u64| {
            let mut read = clock.clone();
            read.purge_by(reading, Some(T0 + 30 * DAY));
            read.step.map(|step| step.lead_ms) > clock.step.map(|step| step.lead_ms)
        };
        let clock = started(T0, Some(T0), None);
        for reading in [T0, T0 + HOUR - minute, T0 + HOUR + minute, T0 + 40 * DAY] {
            assert_eq!(
                clock.catches(reading),
                caught_by(&clock, reading),
                "no step, {} ms on",
                reading - T0
            );
        }
        let mut stepped = clock.clone();
        stepped.purge_by(T0 + 10 * DAY, Some(T0 + 30 * DAY));
        assert!(stepped.step.is_some());
        for reading in [
            T0,
            T0 + 10 * DAY,
            T0 + 10 * DAY + HOUR - minute,
            T0 + 10 * DAY + HOUR + minute,
        ] {
            assert_eq!(
                stepped.catches(reading),
                caught_by(&stepped, reading),
                "a step in force, {} ms on",
                reading - T0
            );
        }
    }

    /// A clock right at `T0` and stepped 40 days forward two hours on, the store holding
    /// records expiring up to `latest`: the step its sweep caught.
    fn caught(latest: u64) -> (PurgeClock, Step) {
        let mut clock = started(T0, Some(T0), None);
        clock.bounded(T0 + 40 * DAY + 2 * HOUR, hours(2), Some(latest));
        let step = keep(&mut clock).flatten().expect("a step to keep");
        (clock, step)
    }

    /// A clock stepped forward by more than the slack purges by the elapsed time, however
    /// long it stays ahead, and gives the step to keep once; one that agrees again, or
    /// moves back, purges by itself, and the step is dropped.
    #[test]
    fn a_clock_stepped_forward_does_not_purge_ahead_of_the_elapsed_time() {
        let mut clock = started(T0, None, None);
        // An hour on, the clock agrees: by the clock.
        assert_eq!(clock.bounded(T0 + HOUR, hours(1), None), T0 + HOUR);
        assert_eq!(keep(&mut clock), None);
        // Two hours on, the clock reads 40 days on: held back to the elapsed time and the slack.
        let slew = (2 * HOUR) / 1000;
        let held = T0 + 2 * HOUR + HOUR + slew;
        let latest = Some(T0 + 30 * DAY);
        assert_eq!(clock.bounded(T0 + 40 * DAY, hours(2), latest), held);
        let step = keep(&mut clock).flatten().expect("a step to keep");
        assert_eq!(
            step,
            Step {
                lead_ms: 40 * DAY - 2 * HOUR,
                since_ms: T0 + 2 * HOUR,
                until_ms: T0 + 30 * DAY,
            }
        );
        // Still ahead a day later: still held back, nothing new to keep.
        let day_on = Duration::from_millis(DAY + 2 * HOUR);
        let bound = T0 + millis(day_on + PurgeClock::SLACK + day_on / 1000);
        assert_eq!(clock.bounded(T0 + 41 * DAY, day_on, latest), bound);
        assert_eq!(keep(&mut clock), None);
        // Set right again, and behind: by the clock; the step is dropped.
        assert_eq!(clock.bounded(T0 + DAY, day_on, latest), T0 + DAY);
        assert_eq!(keep(&mut clock), Some(None));
        // Within a thousandth of a year's elapsed time (slewing), by the clock.
        let mut clock = started(T0, None, None);
        let year = Duration::from_millis(365 * DAY);
        let slewed = T0 + 365 * DAY + HOUR + 8 * HOUR;
        assert_eq!(clock.bounded(slewed, year, latest), slewed);
        assert_eq!(keep(&mut clock), None);
    }

    /// A clock read behind the store's newest write at start (set right while stopped,
    /// after the store wrote by a clock ahead that no sweep caught), then stepped ahead
    /// again: a step, held back by the elapsed time — the newest write is no proof of the
    /// true time.
    #[test]
    fn a_clock_behind_the_newest_write_at_start_stepped_ahead_is_a_step() {
        let start = T0 + 30 * 60_000;
        let mut clock = started(start, Some(T0 + 40 * DAY + 10 * 60_000), None);
        let by = clock.bounded(T0 + 40 * DAY + 90 * 60_000, hours(1), Some(T0 + 30 * DAY));
        assert!(by <= start + 2 * HOUR + 4_000, "purged by {by}");
        assert!(keep(&mut clock).flatten().is_some());
    }

    /// A step that aged out, a restart with the clock still ahead (its readings stepped from
    /// the start: no step kept, the newest write by the same clock), the clock set right,
    /// then stepped ahead again: the readings were moved back to the clock set right, and
    /// the new step is caught — a booking made in between is not purged by it.
    #[test]
    fn a_clock_set_right_after_a_stepped_start_catches_the_next_step() {
        let stepped_start = T0 + 71 * DAY;
        let mut restarted = started(stepped_start, Some(stepped_start - HOUR), None);
        // A day on, set right (the true time is 40 days behind).
        let set_right = T0 + 32 * DAY;
        assert_eq!(restarted.bounded(set_right, days(1), None), set_right);
        let booked_expires = set_right + 30 * DAY;
        // A day later, 40 days ahead again: caught, held back by the elapsed time.
        let by = restarted.bounded(T0 + 73 * DAY, days(2), Some(booked_expires));
        assert!(by <= T0 + 33 * DAY + 2 * HOUR, "purged by {by}");
        let step = keep(&mut restarted).flatten().expect("the step caught");
        assert!(step.lead_ms > 39 * DAY, "{step:?}");
    }

    /// Two instances on one store (PostgreSQL), the shared row played by hand. The step
    /// stepped a further 10 days before B started and A caught it: B's readings, taken less
    /// the 40 days it read at start, were still 10 days ahead — moved back by the further
    /// lead when B reads A's row.
    #[test]
    fn an_instance_started_before_a_further_step_was_caught_takes_the_further_lead_up() {
        let (_, step) = caught(T0 + 30 * DAY);
        // B starts at true t0 + 1 day, the clock 50 days ahead, the row saying 40.
        let b_start = T0 + 51 * DAY;
        let mut b = started(b_start, Some(b_start - HOUR), Some(step));
        // A caught the further step a little later.
        let further = Step {
            lead_ms: 50 * DAY,
            since_ms: T0 + DAY + HOUR,
            until_ms: T0 + 31 * DAY,
        };
        b.kept_as(Some(further));
        let by = b.bounded(b_start + 2 * HOUR, hours(2), Some(T0 + 81 * DAY));
        assert!(by <= T0 + DAY + 3 * HOUR + HOUR / 10, "B purged by {by}");
        assert_eq!(
            keep(&mut b),
            None,
            "B holds the further step as the row says"
        );
    }

    /// B started while the store was idle, after a step no sweep had caught: its hold at
    /// start took the 40 days as time stopped. When it reads A's step, it takes the lead out
    /// of its hold; a further step of 10 days is then caught as 50 days, not 10.
    #[test]
    fn an_instance_whose_hold_took_a_step_for_time_stopped_takes_the_step_up() {
        let idle_since = T0 - HOUR;
        let b_start = T0 + 40 * DAY + 30 * 1000;
        let mut b = started(b_start, Some(idle_since), None);
        let a_step = Step {
            lead_ms: 40 * DAY,
            since_ms: T0 + 10 * 60_000,
            until_ms: T0 + 30 * DAY,
        };
        b.kept_as(Some(a_step));
        assert_eq!(b.take_change(), None);
        // A day on, 10 days further ahead.
        let by = b.bounded(b_start + 11 * DAY, days(1), Some(T0 + 71 * DAY));
        assert!(by <= T0 + DAY + HOUR, "B purged by {by}");
        let caught = keep(&mut b).flatten().expect("the further step");
        assert!(caught.lead_ms > 49 * DAY, "{caught:?}");
    }

    /// A step left by an instance that is gone, the clock right since: an instance whose
    /// readings were right when it was caught drops it once what the store held then has
    /// expired by its own elapsed time.
    #[test]
    fn a_step_left_by_a_gone_instance_is_dropped_once_it_aged_out() {
        let orphan = Step {
            lead_ms: 40 * DAY,
            since_ms: T0,
            until_ms: T0 + 30 * DAY,
        };
        let mut right = started(T0 + HOUR, None, None);
        right.kept_as(Some(orphan));
        assert_eq!(right.bounded(T0 + 20 * DAY, days(20), None), T0 + 20 * DAY);
        assert_eq!(right.take_change(), None, "not yet aged out");
        assert_eq!(right.bounded(T0 + 31 * DAY, days(31), None), T0 + 31 * DAY);
        assert_eq!(keep(&mut right), Some(None));
    }

    /// The hole the kept step closes: a clock stepped 40 days ahead at runtime, caught by a
    /// sweep; the store wrote by it for a day and restarted, the clock still ahead. Its
    /// newest write reads as recent by that clock: without the step kept, the restart would
    /// purge by the clock, 40 days ahead; with it, by about the true time.
    #[test]
    fn a_step_kept_holds_a_restart_back_while_the_clock_is_still_ahead() {
        let (_, step) = caught(T0 + 30 * DAY);
        let stepped_now = T0 + 41 * DAY + 2 * HOUR;
        let true_now = T0 + DAY + 2 * HOUR;
        let last_write = stepped_now - HOUR;
        let latest = Some(last_write + 30 * DAY);
        let mut restarted = started(stepped_now, Some(last_write), Some(step));
        let by = restarted.purge_by(stepped_now, latest);
        assert!(
            (true_now..=true_now + HOUR + HOUR / 100).contains(&by),
            "purged by {by}, not near the true time {true_now}"
        );
        assert_eq!(keep(&mut restarted), None, "the step still holds");
        assert_eq!(
            started(stepped_now, Some(last_write), None).purge_by(stepped_now, latest),
            stepped_now,
            "without the step kept, by the stepped clock"
        );
        // Stepped a further ten days: a further step to keep, with the whole lead.
        restarted.bounded(stepped_now + 10 * DAY + HOUR, hours(1), latest);
        let further = keep(&mut restarted).flatten().expect("a further step");
        assert!(further.lead_ms > step.lead_ms + 10 * DAY - HOUR);
        // Set right while running: by the clock, and the step is dropped.
        assert_eq!(
            restarted.bounded(true_now + 2 * HOUR, hours(2), latest),
            true_now + 2 * HOUR
        );
        assert_eq!(keep(&mut restarted), Some(None));
    }

    /// A clock set back only part of the way — to 20 days ahead — is no clock set right:
    /// at a start the step is kept with the most the clock can still lead by (what was
    /// written before the step stays held back by the time elapsed since it was caught);
    /// while running, with the lead the sweep reads. A booking of 9 days before the step
    /// (expiring 21 days after it) is kept either way.
    #[test]
    fn a_clock_set_back_part_of_the_way_keeps_the_step_with_a_smaller_lead() {
        let (mut running, step) = caught(T0 + 30 * DAY);
        let booked_expires = T0 + 21 * DAY;
        // Restarted a day on, the clock 20 days ahead, the store having written by it.
        let clock = T0 + 21 * DAY + 2 * HOUR;
        let mut restarted = started(clock, Some(clock - HOUR), Some(step));
        let shrunk = keep(&mut restarted)
            .flatten()
            .expect("the step holds, shrunk");
        assert_eq!(shrunk.lead_ms, clock - step.since_ms);
        assert_eq!(
            (shrunk.since_ms, shrunk.until_ms),
            (step.since_ms, step.until_ms)
        );
        let by = restarted.purge_by(clock, Some(clock + 30 * DAY));
        assert!(by < booked_expires && by <= T0 + DAY + 3 * HOUR, "{by}");
        // Set back to 20 days ahead while running: held back by the smaller lead.
        let by = running.bounded(T0 + 20 * DAY + 3 * HOUR, hours(3), None);
        assert!(
            by < booked_expires && by <= T0 + 4 * HOUR + HOUR / 100,
            "{by}"
        );
        let smaller = keep(&mut running).flatten().expect("the smaller lead");
        assert!((20 * DAY - HOUR..=20 * DAY).contains(&smaller.lead_ms));
        assert_eq!(smaller.since_ms, step.since_ms);
    }

    /// A clock set right while the store was stopped reads earlier than when the step was
    /// caught: within the slack of the time the step was caught, it is dropped; a day
    /// later, it leads that time by a day at most, and is kept so (the day stopped does not
    /// count towards the records' retention).
    #[test]
    fn a_clock_set_right_while_stopped_drops_the_step_or_keeps_what_it_may_still_lead_by() {
        let (_, step) = caught(T0 + 30 * DAY);
        let soon = T0 + 3 * HOUR;
        let mut restarted = started(soon, Some(T0 + 40 * DAY + 2 * HOUR), Some(step));
        assert_eq!(keep(&mut restarted), Some(None));
        assert_eq!(restarted.purge_by(soon, None), soon);
        let next_day = T0 + DAY + 2 * HOUR;
        let mut restarted = started(next_day, Some(T0 + 40 * DAY + 2 * HOUR), Some(step));
        let kept = keep(&mut restarted)
            .flatten()
            .expect("a lead of a day at most");
        assert_eq!(kept.lead_ms, next_day - step.since_ms);
        let by = restarted.purge_by(next_day, None);
        assert!((step.since_ms..=step.since_ms + HOUR).contains(&by), "{by}");
    }

    /// A step is dropped once the time elapsed passes the latest expiry the store held when
    /// it was caught — not the retention: records written with 90 days before it was made 30
    /// are kept until they expire. The process goes on purging by the elapsed time; a clock
    /// set right and stepped ahead again after that is caught as a step.
    #[test]
    fn a_step_ages_out_once_what_the_store_held_when_it_was_caught_has_expired() {
        let (mut clock, _) = caught(T0 + 40 * DAY);
        let month = days(31) + hours(2);
        assert!(clock.bounded(T0 + 71 * DAY + 2 * HOUR, month, None) < T0 + 32 * DAY);
        assert_eq!(keep(&mut clock), None);
        let by = clock.bounded(T0 + 81 * DAY, days(41), None);
        assert!(
            (T0 + 41 * DAY..=T0 + 41 * DAY + 3 * HOUR).contains(&by),
            "{by}"
        );
        assert_eq!(keep(&mut clock), Some(None));
        let by = clock.bounded(T0 + 82 * DAY, days(42), None);
        assert!(
            (T0 + 42 * DAY..=T0 + 42 * DAY + 3 * HOUR).contains(&by),
            "{by}"
        );
        assert_eq!(keep(&mut clock), None);
        // Set right, then 25 days ahead: a step, held back by the elapsed time.
        assert_eq!(clock.bounded(T0 + 43 * DAY, days(43), None), T0 + 43 * DAY);
        assert_eq!(keep(&mut clock), None);
        let by = clock.bounded(T0 + 69 * DAY, days(44), None);
        assert!(by <= T0 + 44 * DAY + 3 * HOUR, "{by}");
        let step = keep(&mut clock).flatten().expect("the new step");
        assert!(
            (25 * DAY - 2 * HOUR..=25 * DAY).contains(&step.lead_ms),
            "{step:?}"
        );
    }

    /// The time a store was stopped does not count towards a step's ageing: the clock
    /// stepped a further 30 days while stopped is held back by the store's newest write,
    /// and once the step ages out, the process still purges by the elapsed time — never
    /// by the stepped clock as it reads.
    #[test]
    fn the_time_stopped_does_not_age_a_step_and_its_hold_outlives_it() {
        let (_, step) = caught(T0 + 30 * DAY);
        // Written by the stepped clock until a day on; 30 days more while stopped.
        let clock = T0 + 71 * DAY + 2 * HOUR;
        let true_now = T0 + DAY + 2 * HOUR;
        let mut restarted = started(clock, Some(T0 + 41 * DAY), Some(step));
        assert_eq!(keep(&mut restarted), None, "the step still holds");
        let latest = Some(T0 + 71 * DAY);
        let by = restarted.purge_by(clock, latest);
        assert!(
            by <= true_now,
            "purged by {by}, after the true time {true_now}"
        );
        // 29 days on, what the store held at the step has not all expired: held back.
        assert!(restarted.bounded(clock + 29 * DAY, days(29), latest) < T0 + 31 * DAY);
        assert_eq!(keep(&mut restarted), None);
        // 30 days on it has: dropped, and still by the elapsed time.
        let by = restarted.bounded(clock + 30 * DAY, days(30), latest);
        assert_eq!(keep(&mut restarted), Some(None));
        assert!(by <= true_now + 30 * DAY, "purged by {by}");
    }

    /// Two instances' steps merge to the one that holds back more, until the later of
    /// their expiries. An instance whose readings were right when another caught a step
    /// leaves that step to it; one that started between the step and its catching takes
    /// it up, its readings moved back by the lead.
    #[test]
    fn steps_of_two_instances_merge_to_the_one_that_holds_back_more() {
        let far = Step {
            lead_ms: 40 * DAY,
            since_ms: T0,
            until_ms: T0 + 30 * DAY,
        };
        let near = Step {
            lead_ms: 10 * DAY,
            since_ms: T0 + DAY,
            until_ms: T0 + 60 * DAY,
        };
        let merged = Step {
            until_ms: T0 + 60 * DAY,
            ..far
        };
        assert_eq!(far.further(near), merged);
        assert_eq!(near.further(far), merged);
        // Written over the one kept: a smaller lead caught elsewhere merges; the same step
        // shrunk, or a further one, replaces it.
        assert_eq!(far.replaced_by(near), merged);
        let shrunk = Step {
            lead_ms: 20 * DAY,
            ..far
        };
        assert_eq!(far.replaced_by(shrunk), shrunk);
        assert_eq!(near.replaced_by(far), far);
        // Its own step, and another's found: merged, to be written.
        let (mut own, _) = caught(T0 + 30 * DAY);
        own.kept_as(Some(near));
        let change = own.take_change().expect("the merged step to write");
        assert_eq!(change.step.map(|step| step.until_ms), Some(T0 + 60 * DAY));
        // Right when it was caught: left to the other instance, never dropped by this one.
        let mut right = started(T0 - HOUR, None, None);
        right.kept_as(Some(far));
        assert_eq!(right.take_change(), None);
        assert_eq!(right.bounded(T0 + HOUR, hours(2), None), T0 + HOUR);
        assert_eq!(right.take_change(), None);
        // Started ten minutes before the catching, 40 days ahead: taken up.
        let first = T0 + 40 * DAY - 10 * 60_000;
        let mut stepped = started(first, None, None);
        stepped.kept_as(Some(far));
        assert_eq!(stepped.take_change(), None);
        let by = stepped.bounded(first + HOUR, hours(1), None);
        assert!(
            by <= T0 + 2 * HOUR,
            "purged by {by}, not by the time elapsed"
        );
        assert_eq!(stepped.take_change(), None, "the step it holds");
    }

    /// A clock already 40 days ahead when the sweeper starts is held back to the store's
    /// last commit; one within the slack of it, or behind it, or a store that does not say,
    /// purges by the clock.
    #[test]
    fn a_clock_ahead_at_start_is_held_back_to_the_last_commit() {
        let last = T0;
        let ahead = &mut started(last + 40 * DAY, Some(last), None);
        let by = ahead.purge_by(last + 40 * DAY, None);
        assert!(
            (last + HOUR..last + 2 * HOUR).contains(&by),
            "purged by {by}, not near the last commit {last}"
        );
        // Three days stopped: the three days do not count towards the retention.
        let stopped = &mut started(last + 3 * DAY, Some(last), None);
        assert!(stopped.purge_by(last + 3 * DAY, None) < last + 2 * HOUR);
        assert_eq!(
            keep(stopped),
            None,
            "three days stopped is no step of the clock"
        );
        // A step forward after such a start is caught all the same.
        let start = last + 3 * DAY;
        assert!(stopped.bounded(start + 40 * DAY, hours(1), None) < start);
        assert!(keep(stopped).flatten().is_some());
        for (clock, known) in [
            (last + HOUR / 2, Some(last)),
            (last - DAY, Some(last)),
            (last + 40 * DAY, None),
        ] {
            let clock_at = &mut started(clock, known, None);
            assert_eq!(clock_at.purge_by(clock, None), clock, "{clock} {known:?}");
        }
    }

    /// A step record that does not decode is taken as none; one kept reads back the same.
    #[test]
    fn a_step_record_reads_back_and_a_garbled_one_is_none() {
        let step = Step {
            lead_ms: 40 * DAY,
            since_ms: T0,
            until_ms: T0 + 30 * DAY,
        };
        let kept = step.encode().unwrap();
        assert_eq!(Step::decode(Some(kept.as_bytes())), Some(step));
        assert_eq!(Step::decode(Some(b"{not json")), None);
        assert_eq!(Step::decode(None), None);
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
