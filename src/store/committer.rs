//! Group commit: the writes of all concurrent requests are applied in one atomic batch and
//! made durable by one flush.
//!
//! sled's `flush_async` deadlocks on 0.34 (spacejam/sled#1308) and concurrent `flush()`
//! calls do not coalesce, so flushing once per request caps a server at a few thousand
//! requests per second. Here a request queues its write and then tries to become the
//! *leader*: the one that holds the write lock takes everything queued, builds one
//! `sled::Batch` (atomic within the store's tree) — running each callback's effects against
//! the batch so far, so that effects on the same keys see each other — applies it, flushes,
//! answers every request of the batch, and looks at the queue again before it lets go. The
//! others wait for their answer. A batch is as large as the writes that arrived during the
//! previous flush: adaptive, with no fixed window. While the queue stays empty between
//! batches, there is no hand-off to another thread: the request leads and is answered by
//! its own batch.
//!
//! A request leads one batch only. If writes queued meanwhile, it hands the leading to a
//! thread of the runtime's blocking pool, which commits batch after batch until the queue
//! is empty, while requests only queue. Under steady load the queue is never empty when a
//! batch ends; a request that went on leading was answered only after every batch that
//! queued behind its own. `bench_callbacks -- 5 B --rounds 2`, runs alternated with the
//! build before on 2026-11-26 (four rounds before, eight after): the slowest answer of a
//! round went from 97–204 ms to 13–20 ms (one round 69 ms), with B's throughput within the
//! rounds' noise (11.5–14.3k req/s before, 12.2–14.0k after). Also measured, not kept:
//!
//! * a dedicated commit thread, started with the store: the same throughput, but B's peak
//!   RSS 79–98 MiB against 59 (79 even with `MALLOC_ARENA_MAX=4`; not explained further);
//! * handing off every durable commit, not only the batches queued behind a request's own:
//!   B about a sixth slower (11.1–12.5k req/s, 105–119 µs of CPU per request).
//!
//! Staging (claims, effects, records) is CPU work and runs on the leader's own thread; only
//! the write — sled's apply, flush and `fdatasync`, the watermark — runs under
//! `block_in_place`, which hands the runtime worker's other tasks to another thread while
//! the leader waits for the disk. (Staging under `block_in_place` too cost a hand-off per
//! batch for nothing; measured with `bench_callbacks -- 5 B D E --rounds 3`, E/D went from
//! a median of 0.80 to 0.86 and B did not move.)
//!
//! The write itself is not overlapped with staging the next batch: applying small batches
//! to sled while a flush is under way was measured (a temporary change on 2026-11-25) at
//! 3,548 req/s for B against 9,211 the same hour, with the server's CPU per request up from
//! 149 to 401 µs: each applied batch shrank to the one or two requests that arrived while
//! the previous was staged, so sled's cost per batch (its write lock, log reservations, the
//! seal and the expiry entry) was paid per request, while sled's writers contended with its
//! flush (not profiled further).
//!
//! sled's `flush()` ends in `sync_file_range` on Linux, which does not empty the disk's
//! write cache (spacejam/sled#1452); every flush is therefore followed by `fdatasync` of
//! sled's data file, so an acknowledged write survives power loss too. A failed flush makes
//! the store refuse all further work (503) until restarted: a write whose durability is
//! unknown must not be acknowledged later as a duplicate. So does a commit that panics (a
//! bug of payhook's: effects' panics are caught where they run): the panic is caught around
//! the batch, its writers are answered with an error once the store has stopped, and the
//! writer's lock is not poisoned, so that later work is refused at once instead of waiting
//! for a leader. A panic on the blocking pool's leading thread outside a commit half-writes
//! nothing: the writes it left queued are answered with an error (503, retried), and the
//! store goes on (see `Handed`).
//!
//! The lock also serialises the purge of expired records, which a sweeper thread runs every
//! sweep interval, and the reads whose answer leaves the process: there is one writer at a
//! time. A purge step takes the lock ahead of the leaders: while it waits, no leader takes
//! the lock again (the hand-off's thread, letting go between batches, would otherwise take
//! it back before the sweeper wakes, batch after batch, for as long as requests keep
//! coming), and the sweeper leads what queued meanwhile once its step is done: one batch,
//! then it hands the leading to a thread of its own rather than lead while requests keep
//! coming, so that its sweep goes on. (Only the sweeper: reads taking it ahead too, one
//! waiting while another held it, could keep every write waiting for as long as they
//! overlapped.) payhook flushes everything it writes
//! itself (each batch, and each sweep that purged something), so sled's own background
//! flusher is off by default: after many removals it kept relocating log segments forever,
//! writing about 1 MB/s to an idle store (`store.flush_every` turns it back on).
//!
//! Each batch also looks at the wall clock's alarm the sweeper's purge clock publishes
//! (`clock_watch.rs`: one reading of the elapsed time and one atomic load a batch). Where
//! the clock stepped since the sweeper last read it, the batch writes the step it catches
//! (`m\0clock-step`) with its own records: records stamped by a stepped clock are never
//! durable before the step that tells a restart not to purge by it.

use chrono::{DateTime, Utc};
use std::{
    cell::RefCell,
    fs::File,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};
use tokio::sync::oneshot;

use super::claims::{Claims, Owned};
use super::clock_watch::{ClockWatch, SharedClock};
use super::effects::{EffectTx, Effects, Tree, check_declared};
use super::failing::{self, CallbackFailure, FailureRecord};
use super::held::{self, HeldCallback};
use super::horizon::{PurgeClock, Step, StepChange};
use super::keys;
use super::postponed_records::{self, PostponedOp};
use super::record::{
    CallbackRecord, EndedSession, Fingerprint, KeptFingerprint, RecordedDecision, ValidationRecord,
    decode, encode,
};
use super::staging::{Overlay, Staging, lock, read, read_record, try_lock, write_record};
use super::watermark::Watermark;
use super::{Claim, StoreError, now_ms};
use crate::model::{TransactionValidationRequest, ValidationId};
use crate::postponed::record::{PostponedValidation, Repeat, Resolution};

/// A write waiting for a leader.
pub(crate) enum Job {
    Callback {
        nonce: String,
        claim: Claim,
        status: i32,
        effects: Effects,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Validation {
        nonce: String,
        claim: Claim,
        fingerprint: Fingerprint,
        decision: RecordedDecision,
        postponed: Option<Box<PostponedValidation>>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Postponed {
        op: PostponedOp,
        reply: oneshot::Sender<Result<Resolution, StoreError>>,
    },
    /// A validation repeated under a new validation id (Awaitable mode): recorded as a
    /// repeat of the one that holds its nonce's decision.
    Repeat {
        request: Box<TransactionValidationRequest>,
        now: DateTime<Utc>,
        reply: oneshot::Sender<Result<Repeat, StoreError>>,
    },
    /// A callback's handler failed: counted for operators (nobody waits for it).
    Failure(Box<CallbackFailure>),
    /// An operating API session ended by logging out, kept as ended until `until_ms`.
    EndSession {
        session: String,
        until_ms: u64,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// A person resolved a held result: it is kept, resolved at `at` as `resolving` says.
    Resolve {
        nonce: String,
        status: i32,
        resolving: held::Resolving,
        at: DateTime<Utc>,
        reply: oneshot::Sender<Result<Option<HeldCallback>, StoreError>>,
    },
}

impl Job {
    /// Answers the job with `error`, nothing of it written.
    fn refuse(self, error: StoreError) {
        // A requester that went away no longer waits for its answer.
        match self {
            Self::Callback { reply, .. }
            | Self::Validation { reply, .. }
            | Self::EndSession { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Postponed { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Repeat { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Resolve { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Failure(_) => {}
        }
    }
}

/// Answers a job once its batch is durable (or failed). An enum, not a boxed closure: one
/// allocation fewer per job.
enum Reply {
    /// A callback's or a validation's write.
    Written(oneshot::Sender<Result<(), StoreError>>),
    /// A postponed validation's operation, and what it did.
    Resolved(oneshot::Sender<Result<Resolution, StoreError>>, Resolution),
    /// A repeat's record, and what recording it did.
    Repeated(oneshot::Sender<Result<Repeat, StoreError>>, Repeat),
    /// A held result resolved, as it is kept now.
    HeldResolved(
        oneshot::Sender<Result<Option<HeldCallback>, StoreError>>,
        Option<HeldCallback>,
    ),
}

impl Reply {
    fn send(self, outcome: &Result<(), StoreError>) {
        // A requester that went away no longer waits for its answer.
        match self {
            Self::Written(reply) => {
                let _ = reply.send(outcome.clone());
            }
            Self::Resolved(reply, resolution) => {
                let _ = reply.send(outcome.clone().map(|()| resolution));
            }
            Self::Repeated(reply, repeat) => {
                let _ = reply.send(outcome.clone().map(|()| repeat));
            }
            Self::HeldResolved(reply, held) => {
                let _ = reply.send(outcome.clone().map(|()| held));
            }
        }
    }
}

/// What a writer works with. Created by [`super::SledStore::open`].
pub(crate) struct Context {
    pub(crate) db: sled::Db,
    pub(crate) tree: sled::Tree,
    pub(crate) data_file: File,
    pub(crate) effect_trees: Vec<String>,
    pub(crate) callback_claims: Arc<Claims>,
    pub(crate) validation_claims: Arc<Claims>,
    pub(crate) retention_ms: u64,
    pub(crate) failed: Arc<AtomicBool>,
    /// Advanced after each durable commit, before anyone is answered.
    pub(crate) watermark: Watermark,
    /// sled's blob files, synced before a commit is acknowledged.
    pub(crate) blobs: super::blobs::Blobs,
    /// Test-only: where commits wait for a test to let them go.
    pub(crate) gate: Gate,
    /// Where each batch goes: into sled, except in two benchmarks' stores.
    pub(crate) destination: Destination,
    /// Each durable commit's time and size.
    pub(crate) metrics: super::CommitMetrics,
    /// Whether the store may hold a failing callback's record: `false` only while none was
    /// found at open and none was recorded since, so that booking a callback need not look
    /// for one to forget. Never goes back to `false` (a purge may leave it `true`).
    pub(crate) may_hold_failures: AtomicBool,
    /// The failing (nonce, status) pairs the store holds: changed as each batch and each
    /// purge step that changed failing records is applied.
    pub(crate) failing: Arc<failing::Count>,
    /// The held results the store keeps: changed as each batch that changed them is
    /// applied.
    pub(crate) held: Arc<failing::Count>,
    /// The sweeper's clock, whose alarm each commit's reading is compared with: the first
    /// commit by a stepped clock keeps the step in its own batch.
    pub(crate) clock_watch: ClockWatch,
}

/// Where a commit's batch goes, once staged.
pub(crate) enum Destination {
    /// Applied to sled, flushed, `fdatasync`ed, the watermark advanced: every store a
    /// service opens.
    Sled,
    /// Benchmark-only ([`super::BenchmarkStore::WritesNowhere`]):
    /// commits build their batch (claims checked, effects run against the tree and the
    /// batch, records encoded) and write it nowhere — not to sled, no flush, no fdatasync,
    /// no watermark — so that a benchmark measures payhook's durable path apart from sled
    /// and the disk.
    Nowhere,
    /// Benchmark-only ([`super::BenchmarkStore::AppendsOnly`]): each
    /// batch is appended to this file and `fdatasync`ed before anyone is answered, and
    /// written nowhere else (not to sled, no watermark): the floor of any store that makes
    /// each batch durable before it answers, whatever its engine. Nothing reads the file
    /// back; the store keeps no acknowledged write.
    Appended(Mutex<BenchFile>),
}

/// [`Destination::Appended`]'s file, written as a log of payhook's own would be: zero-filled
/// when created and then written in place, each batch after the one before, from the start
/// again when the next would not fit. The file never grows, so an `fdatasync` writes the
/// batch and no metadata: measured side by side on 2026-11-26 (runs alternated), scenario
/// F's F/D medians were 0.68 and 0.69 this way against 0.65 and 0.66 appending to a growing
/// file — a gain about the size of what rounds of different hours move by.
pub(crate) struct BenchFile {
    file: File,
    /// Where the next batch goes.
    at: u64,
}

impl BenchFile {
    /// The file's size: more than a 5-second round writes (a longer one wraps around), small
    /// enough to fill at once.
    const SIZE: u64 = 64 << 20;

    /// Creates (or empties) the file at `path` and fills it with zeros, durably.
    pub(crate) fn create(path: &std::path::Path) -> std::io::Result<Self> {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)?;
        let zeros = vec![0; 1 << 20];
        for _ in 0..Self::SIZE >> 20 {
            file.write_all(&zeros)?;
        }
        file.sync_all()?;
        Ok(Self { file, at: 0 })
    }

    /// Writes `bytes` after the last batch (or at the start) and `fdatasync`s them.
    fn write_durably(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom, Write};
        let end = |at: u64| at.saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
        if end(self.at) > Self::SIZE {
            self.at = 0;
        }
        self.file.seek(SeekFrom::Start(self.at))?;
        self.file.write_all(bytes)?;
        self.at = end(self.at);
        self.file.sync_data()
    }
}

/// Where a commit may be held by a test ([`super::SledStore::hold_commits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum HoldPoint {
    /// The batch is staged (claims checked, effects run) but not applied to sled.
    BeforeApply,
    /// The batch is applied to sled (readable) but not flushed: not durable.
    BeforeFlush,
    /// A sweep purged one step, let go of the write lock and has more to purge.
    BetweenPurgeSteps,
    /// The blocking pool's thread, handed the leading, is about to commit the next batch.
    BeforeHandedBatch,
    /// The thread handed the leading is giving it up to a thread waiting for the lock
    /// ([`Writer::lock_ahead`]).
    BeforeHandedYield,
    /// A purge step holds the write lock, taken ahead of the leaders.
    InPurgeStep,
}

/// A hold on commits, shared by the test and the leaders that meet it.
#[derive(Debug, Default)]
pub(crate) struct HoldState {
    /// How many leaders reached the point.
    reached: Mutex<usize>,
    released: Mutex<bool>,
    changed: Condvar,
    /// Test-only: a commit that reaches the point panics instead of waiting.
    #[cfg(test)]
    panics: bool,
}

impl HoldState {
    /// Blocks until `count` leaders reached the point, at most `timeout`; `false` if
    /// they did not.
    pub(crate) fn wait_reached(&self, count: usize, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut reached = lock(&self.reached);
        while *reached < count {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            reached = self
                .changed
                .wait_timeout(reached, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }

    pub(crate) fn release(&self) {
        *lock(&self.released) = true;
        self.changed.notify_all();
    }

    fn pass(&self) {
        *lock(&self.reached) += 1;
        self.changed.notify_all();
        #[cfg(test)]
        assert!(!self.panics, "a test made this commit panic");
        let mut released = lock(&self.released);
        while !*released {
            released = self
                .changed
                .wait(released)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// Test-only holds on commits: empty in production (an atomic load per batch, and one more
/// per batch of the hand-off's thread).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    armed: AtomicBool,
    hold: Mutex<Option<(HoldPoint, Arc<HoldState>)>>,
    /// Test-only: how far ahead of the wall clock commits read the time (a clock stepped
    /// forward while the store runs).
    #[cfg(test)]
    clock_ahead_ms: std::sync::atomic::AtomicU64,
}

impl Gate {
    /// Test-only: the next commits read the time `ahead` of the wall clock.
    #[cfg(test)]
    pub(crate) fn step_clock(&self, ahead: Duration) {
        let ahead = u64::try_from(ahead.as_millis()).unwrap_or(u64::MAX);
        self.clock_ahead_ms.store(ahead, Ordering::SeqCst);
    }

    /// The time a commit reads: the wall clock (stepped in a test).
    fn now_ms(&self) -> u64 {
        let now = now_ms();
        #[cfg(test)]
        let now = now.saturating_add(self.clock_ahead_ms.load(Ordering::SeqCst));
        now
    }

    pub(crate) fn arm(&self, point: HoldPoint) -> Arc<HoldState> {
        self.arm_with(point, HoldState::default())
    }

    /// Test-only: the next commits that reach `point` panic there.
    #[cfg(test)]
    pub(crate) fn arm_panic(&self, point: HoldPoint) -> Arc<HoldState> {
        self.arm_with(
            point,
            HoldState {
                panics: true,
                ..HoldState::default()
            },
        )
    }

    fn arm_with(&self, point: HoldPoint, state: HoldState) -> Arc<HoldState> {
        let state = Arc::new(state);
        *lock(&self.hold) = Some((point, Arc::clone(&state)));
        self.armed.store(true, Ordering::SeqCst);
        state
    }

    pub(crate) fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
        if let Some((_, state)) = lock(&self.hold).take() {
            state.release();
        }
    }

    /// Waits here while a test holds commits at `point`.
    fn pass(&self, point: HoldPoint) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let state = match &*lock(&self.hold) {
            Some((held, state)) if *held == point => Arc::clone(state),
            _ => return,
        };
        state.pass();
    }
}

/// The queue of writes and the lock its leader holds.
pub(crate) struct Writer {
    context: Context,
    queue: Mutex<Vec<Job>>,
    /// Held by the leader while it commits, and by a purge.
    lock: Mutex<()>,
    /// Whether a thread of the runtime's blocking pool leads (see [`Writer::lead`]): while
    /// it does, a request queues its job and leaves the commit to it.
    handed_off: AtomicBool,
    /// Purge steps waiting for the lock ([`Writer::lock_ahead`]): while one waits, no
    /// leader takes the lock, and the step leads once it is done.
    waiting: std::sync::atomic::AtomicUsize,
    /// The thread the sweeper last handed the leading to ([`Writer::hand_off_to_a_new_thread`]),
    /// joined when the sweeper stops: it holds the writer, and sled's files with it.
    commit_thread: Mutex<Option<JoinHandle<()>>>,
    /// Test-only: purge steps done.
    #[cfg(test)]
    purge_steps: std::sync::atomic::AtomicUsize,
    /// Test-only: how many reads wait for the lock in [`Writer::read_durable`].
    #[cfg(test)]
    readers_waiting: std::sync::atomic::AtomicUsize,
}

impl Writer {
    pub(crate) fn new(context: Context) -> Self {
        Self {
            context,
            queue: Mutex::default(),
            lock: Mutex::default(),
            handed_off: AtomicBool::new(false),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            commit_thread: Mutex::default(),
            #[cfg(test)]
            purge_steps: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            readers_waiting: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Queues `job`, then commits the queued work unless another caller or the blocking
    /// pool's thread is committing. The job's reply arrives when its batch is durable.
    pub(crate) fn submit(self: &Arc<Self>, job: Job) {
        lock(&self.queue).push(job);
        self.lead();
    }

    /// Commits queued work while the lock is free. Whoever holds the lock looks at the queue
    /// again after letting go, so a job queued while the lock is held is never left behind.
    ///
    /// A caller commits one batch — the one that holds its own write, if it queued one —
    /// and, if more queued meanwhile, hands the leading to a thread of the runtime's
    /// blocking pool, which commits until the queue is empty (see the module's docs for
    /// why). Without a multi-threaded runtime, the caller goes on leading.
    fn lead(self: &Arc<Self>) {
        // SeqCst, with the hand-off thread's store and second look in `lead_handed_off`:
        // either that thread sees this caller's job, or this caller sees it gone.
        if !self.handed_off.load(Ordering::SeqCst) {
            self.commit_while_free(|| self.hand_off());
        }
    }

    /// Commits queued work on this thread while the lock is free and the queue is not
    /// empty, handing nothing to anyone.
    fn lead_here(&self) {
        self.commit_while_free(|| false);
    }

    /// Commits batch after batch while the lock is free and work is queued, until
    /// `handed_on` says another thread took the leading — or a purge step waits for the
    /// lock ([`Writer::lock_ahead`]), which leads once it is done.
    fn commit_while_free(&self, mut handed_on: impl FnMut() -> bool) {
        while self.waiting.load(Ordering::SeqCst) == 0
            && let Some(guard) = try_lock(&self.lock)
        {
            self.commit_queued(&guard);
            drop(guard);
            if lock(&self.queue).is_empty() || handed_on() {
                return;
            }
        }
    }

    /// Commits what is queued, in one batch; the caller holds the lock.
    fn commit_queued(&self, _held: &std::sync::MutexGuard<'_, ()>) {
        let jobs = {
            // The next batch's queue starts at this one's size: no regrowing it from
            // empty, job by job, under the queue's lock.
            let mut queue = lock(&self.queue);
            let capacity = queue.len();
            std::mem::replace(&mut *queue, Vec::with_capacity(capacity))
        };
        if jobs.is_empty() {
            return;
        }
        // A store that failed commits nothing more, not even for claims taken before it
        // failed: what a failed flush left unwritten may be lost with what follows it.
        if self.context.failed.load(Ordering::SeqCst) {
            for job in jobs {
                job.refuse(StoreError::Stopped);
            }
            return;
        }
        // The batch's replies live here, not in `commit`: should it panic (a bug of
        // payhook's; effects' panics are caught where they run), they are dropped — their
        // writers answered with an error — only once the store refuses further work. What
        // the batch applied to sled may not be durable, and must not be reported as booked
        // meanwhile. Caught here, the panic does not poison the writer's lock either.
        let mut replies = Vec::with_capacity(jobs.len());
        let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            commit(&self.context, jobs, &mut replies);
        }));
        if committed.is_err() {
            tracing::error!(
                "committing a batch panicked; the store refuses further work until restarted"
            );
            self.context.failed.store(true, Ordering::SeqCst);
            drop(replies);
        }
    }

    /// Hands the leading to a thread of the runtime's blocking pool (or leaves it with the
    /// one that has it); `false` where there is no multi-threaded runtime to hand it to.
    fn hand_off(self: &Arc<Self>) -> bool {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                if !self.handed_off.swap(true, Ordering::SeqCst) {
                    let handed = Handed(Some(Arc::clone(self)));
                    handle.spawn_blocking(move || handed.run());
                }
                true
            }
            _ => false,
        }
    }

    /// Takes the write lock for a purge step ahead of the leaders: none takes it while this
    /// waits, so what queues meanwhile is left to this thread, which leads it when it lets
    /// go ([`Ahead`]): one batch, then it hands the rest to another thread (outside the
    /// runtime, a thread of its own), rather than lead for as long as requests keep coming,
    /// its sweep waiting.
    fn lock_ahead(self: &Arc<Self>) -> Ahead<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let guard = lock(&self.lock);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        Ahead {
            writer: self,
            guard: Some(guard),
        }
    }

    /// Hands the leading to a thread started for it (joined when the sweeper stops).
    /// Should the thread not start, the unrun hand-off leads on this thread when dropped
    /// (see `Handed`).
    fn hand_off_to_a_new_thread(self: &Arc<Self>) -> bool {
        if !self.handed_off.swap(true, Ordering::SeqCst) {
            let handed = Handed(Some(Arc::clone(self)));
            match std::thread::Builder::new()
                .name("payhook-commit".into())
                .spawn(move || handed.run())
            {
                Ok(thread) => {
                    // The one before gave the leading up (it was free to take): it ends now.
                    let before = lock(&self.commit_thread).replace(thread);
                    if let Some(before) = before {
                        let _ = before.join();
                    }
                }
                Err(error) => tracing::warn!(
                    error = %error,
                    "no thread could be started to commit the queued writes; this one commits them (unwinding, it answers them with an error)"
                ),
            }
        }
        true
    }

    /// Waits for the thread the sweeper last handed the leading to, if any — unless it is
    /// this thread (the store's last handle dropped in its commit, by an effect that held
    /// one): a thread cannot wait for itself.
    pub(crate) fn join_commit_thread(&self) {
        let thread = lock(&self.commit_thread).take();
        if let Some(thread) = thread
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }

    /// The blocking pool's thread: commits until the queue is empty, then gives the leading
    /// back to the requests.
    fn lead_handed_off(&self) {
        loop {
            self.context.gate.pass(HoldPoint::BeforeHandedBatch);
            if self.waiting.load(Ordering::SeqCst) > 0 && self.give_up_to_the_sweeper() {
                return;
            }
            // Not `try_lock`: requests leave the committing to this thread.
            let guard = lock(&self.lock);
            self.commit_queued(&guard);
            // Read with the lock held: a purge step counted now cannot have taken it yet.
            let sweeper_waits = self.waiting.load(Ordering::SeqCst) > 0;
            drop(guard);
            if sweeper_waits && self.give_up_to_the_sweeper() {
                return;
            }
            if lock(&self.queue).is_empty() {
                self.handed_off.store(false, Ordering::SeqCst);
                // A job queued between the look and the store was left to this thread.
                if lock(&self.queue).is_empty() || self.handed_off.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
        }
    }

    /// Gives the leading up to a purge step waiting for the lock, which leads once it is
    /// done (see `lock_ahead`); `false` when it is this thread's again: the step was done
    /// before the leading was given up, found it still taken, and left what queued to it.
    fn give_up_to_the_sweeper(&self) -> bool {
        self.context.gate.pass(HoldPoint::BeforeHandedYield);
        self.handed_off.store(false, Ordering::SeqCst);
        self.waiting.load(Ordering::SeqCst) > 0
            || lock(&self.queue).is_empty()
            || self.handed_off.swap(true, Ordering::SeqCst)
    }

    /// Runs `read` holding the write lock: every write it can see is durable (a leader lets
    /// go of the lock only after its batch is flushed) — unless the store stopped meanwhile:
    /// a leader whose flush failed lets go with its batch applied, so `read` must ask
    /// whether the store is healthy itself, under the lock. For reads whose result leaves
    /// the process — the outbox's, whose entries are posted to the aggregator.
    pub(crate) fn read_durable<R>(self: &Arc<Self>, read: impl FnOnce() -> R) -> R {
        // Writes queued while the lock was held are committed once it is let go — also
        // should `read` panic (see `LeadsAfter`).
        let _lead = LeadsAfter(self);
        blocking(|| {
            #[cfg(test)]
            self.readers_waiting.fetch_add(1, Ordering::SeqCst);
            let _guard = lock(&self.lock);
            #[cfg(test)]
            self.readers_waiting.fetch_sub(1, Ordering::SeqCst);
            read()
        })
    }

    /// Test-only: how many purge steps wait for the write lock.
    #[cfg(test)]
    pub(crate) fn waiting_ahead(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Test-only: how many reads wait for the write lock.
    #[cfg(test)]
    pub(crate) fn readers_waiting(&self) -> usize {
        self.readers_waiting.load(Ordering::SeqCst)
    }

    /// Test-only: how many purge steps were done.
    #[cfg(test)]
    pub(crate) fn purge_steps(&self) -> usize {
        self.purge_steps.load(Ordering::SeqCst)
    }

    /// Test-only: whether a thread of the blocking pool leads.
    #[cfg(test)]
    pub(crate) fn handed_off(&self) -> bool {
        self.handed_off.load(Ordering::SeqCst)
    }

    /// Test-only: how many jobs wait for a leader.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        lock(&self.queue).len()
    }

    /// The test-only holds on this writer's commits.
    pub(crate) fn gate(&self) -> &Gate {
        &self.context.gate
    }

    /// sled's blob files as this writer's commits sync them (for tests).
    #[cfg(test)]
    pub(crate) fn blobs(&self) -> &super::blobs::Blobs {
        &self.context.blobs
    }

    /// Purges expired records now, in steps of at most [`PURGE_STEP`] records: the write
    /// lock is held for one step at a time, and the writes queued meanwhile are committed
    /// between steps, so a sweep never holds a request for long however much expired.
    pub(crate) fn purge(self: &Arc<Self>, now_ms: u64) -> Result<usize, StoreError> {
        let started = Instant::now();
        let mut purged = 0;
        let (mut steps, mut longest_hold) = (0u32, Duration::ZERO);
        loop {
            let step = {
                // Let go at the block's end: writes queued while the step waited for the
                // lock or held it are committed then.
                let _ahead = self.lock_ahead();
                self.context.gate.pass(HoldPoint::InPurgeStep);
                let held = Instant::now();
                let step = purge_step(&self.context, now_ms, PURGE_STEP);
                longest_hold = longest_hold.max(held.elapsed());
                #[cfg(test)]
                self.purge_steps.fetch_add(1, Ordering::SeqCst);
                step
            };
            steps += 1;
            let (count, more) = step?;
            purged += count;
            if !more {
                break;
            }
            self.context.gate.pass(HoldPoint::BetweenPurgeSteps);
        }
        self.context
            .callback_claims
            .prune(now_ms.saturating_sub(self.context.retention_ms));
        self.context
            .validation_claims
            .prune(now_ms.saturating_sub(self.context.retention_ms));
        if purged > 0 {
            // sled's background flusher is off (see `open_sled`): the purge's removals are
            // written out here, once per sweep. They need no fdatasync: a purge lost to a
            // power cut is redone by the next sweep.
            let flushing = Instant::now();
            self.write_out("a purge", false)?;
            tracing::info!(
                purged,
                steps,
                longest_step_ms = longest_hold.as_secs_f64() * 1e3,
                flush_ms = flushing.elapsed().as_secs_f64() * 1e3,
                took_ms = started.elapsed().as_secs_f64() * 1e3,
                "expired records purged"
            );
        }
        Ok(purged)
    }

    /// Writes what was written to sled outside a commit (a purge's removals, the clock's
    /// step) out, flushed and its new blobs synced — and, where it must survive a power cut,
    /// sled's data file `fdatasync`ed, as a commit's is. A node rewritten whole may have gone
    /// to a blob: synced before the next commit acknowledges anything on top of it. Any of
    /// them failing stops the store, as a commit's would: a later flush or sync could
    /// succeed without writing what this one left unwritten, and a commit would be
    /// acknowledged on top of it.
    fn write_out(&self, what: &str, fdatasync: bool) -> Result<(), StoreError> {
        let durable =
            self.context
                .db
                .flush()
                .map_err(StoreError::from)
                .and_then(|_| self.context.blobs.sync_new())
                .and_then(|_| match fdatasync {
                    true => self.context.data_file.sync_data().map_err(|e| {
                        StoreError::backend("fdatasync of sled's data file failed", e)
                    }),
                    false => Ok(()),
                });
        if let Err(error) = &durable {
            tracing::error!(error = %crate::report::InLine(error), "writing out {what} failed; the store refuses further work until restarted");
            self.context.failed.store(true, Ordering::SeqCst);
        }
        durable
    }

    /// The step of the clock the store keeps (see [`PurgeClock`]); one that does not decode
    /// is taken as none.
    pub(crate) fn kept_step(&self) -> Option<Step> {
        let stored = self
            .context
            .tree
            .get(keys::CLOCK_STEP)
            .inspect_err(|error| {
                tracing::warn!(%error, "the store's record of a step of the clock cannot be read: taken as none");
            })
            .ok()
            .flatten();
        Step::decode(stored.as_deref())
    }

    /// Keeps `step` (`None`: drops the one kept), durably — flushed, synced, `fdatasync`ed,
    /// as a commit — whatever the clock says (a test's hand).
    #[cfg(test)]
    pub(crate) fn keep_step(self: &Arc<Self>, step: Option<&Step>) -> Result<(), StoreError> {
        self.write_step(self.lock_ahead(), step)
    }

    /// Keeps what `clock` changed of the clock's step, durably, before the sweep that
    /// changed it purges (the commits since the step caught it first, each commit comparing
    /// its reading with the clock's alarm; the sweep catches what they did not: a commit
    /// needs no write to see a step, nor to see the clock set back). Failing, it is said,
    /// and the next commit or sweep tries again (the alarm stays down while a change is not
    /// written).
    fn keep_clocks_step(self: &Arc<Self>, clock: &SharedClock) {
        let ahead = self.lock_ahead();
        // Let go before the write lock is: letting go, this thread leads what queued
        // meanwhile, whose commits may look at the clock.
        let change = lock(clock).take_change();
        let Some(change) = change else {
            return;
        };
        match self.write_step(ahead, change.step.as_ref()) {
            Ok(()) => self
                .context
                .clock_watch
                .with(clock, |clock| clock.written(change)),
            Err(error) => {
                tracing::error!(error = %crate::report::InLine(&error), "keeping the clock's step failed");
            }
        }
    }

    /// Writes `step` into the tree under the write lock held by `ahead`, then lets go and
    /// writes it out, `fdatasync`ed.
    fn write_step(&self, ahead: Ahead<'_>, step: Option<&Step>) -> Result<(), StoreError> {
        let record = step.map(Step::encode).transpose()?;
        match &record {
            Some(record) => self
                .context
                .tree
                .insert(keys::CLOCK_STEP, record.as_bytes()),
            None => self.context.tree.remove(keys::CLOCK_STEP),
        }?;
        drop(ahead);
        self.write_out("the clock's step", true)
    }

    /// The latest expiry the store holds; see [`latest_expiry`].
    fn latest_expiry(&self) -> Option<u64> {
        latest_expiry(&self.context.tree)
    }
}

/// The latest expiry `tree` holds (`None`: it holds no record). One that cannot be read is
/// taken as the furthest: a step caught now holds until the clock is set right.
fn latest_expiry(tree: &sled::Tree) -> Option<u64> {
    let latest = tree.scan_prefix(keys::EXPIRY_PREFIX).next_back()?;
    let read = latest.map_err(StoreError::from).and_then(|(key, _)| {
        keys::expires_of(&key)
            .ok_or_else(|| StoreError::backend_message("an expiry index key does not decode"))
    });
    match read {
        Ok(latest) => Some(latest),
        Err(error) => {
            tracing::error!(error = %crate::report::InLine(&error), "the store's latest expiry cannot be read: a step of the clock caught now holds until the clock is set right");
            Some(u64::MAX)
        }
    }
}

/// Records a purge step looks at, at most (plus the rest of the index entry it is in): a
/// step holds the write lock for a few milliseconds.
const PURGE_STEP: usize = 256;

/// The leading, handed to a thread of the blocking pool. A runtime that shuts down drops
/// the pool's tasks that have not started: the leading then comes back to whoever drops it,
/// which commits what is queued (the pool will not), so no write waits for a leader that
/// never comes.
///
/// A panic on that thread outside a commit (a bug of payhook's: [`Writer::commit_queued`]
/// catches a commit's own) leaves nothing half-written, but commits nothing more either:
/// committing while unwinding would abort the process at a second panic. The leading comes
/// back, and the writes still queued are answered with an error — their requests answer 503
/// and the aggregator retries them — instead of waiting for the next request to lead, which
/// may be a long time coming. The store goes on.
struct Handed(Option<Arc<Writer>>);

impl Handed {
    fn run(mut self) {
        // The writer stays in `self` while it leads, so that a panic's unwinding gives the
        // leading back (in `drop`); a return has given it back already.
        if let Some(writer) = &self.0 {
            writer.lead_handed_off();
        }
        self.0 = None;
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        let Some(writer) = self.0.take() else {
            return;
        };
        writer.handed_off.store(false, Ordering::SeqCst);
        if std::thread::panicking() {
            // After the leading is back: a write queued from now on leads its own commit, but
            // for one queued before this takes the queue, which is answered with the rest.
            let stranded = std::mem::take(&mut *lock(&writer.queue));
            if !stranded.is_empty() {
                tracing::error!(
                    writes = stranded.len(),
                    "the thread committing queued writes panicked; they are answered with an error and will be retried"
                );
            }
            // Dropped, each reply tells its writer the write was dropped.
            drop(stranded);
        } else {
            writer.lead_here();
        }
    }
}

/// The write lock, taken ahead of the leaders for a purge step ([`Writer::lock_ahead`]).
/// Let go, it leads what queued meanwhile, which was left to it: one batch, then the rest
/// goes to another thread. Should the step panic, all of it goes to a thread of its own
/// (a commit while unwinding would abort the process at a second panic; so would tokio's
/// `spawn_blocking` failing to start a thread, where `std` returns an error), so that no
/// write waits for a leader that is not coming.
pub(crate) struct Ahead<'w> {
    writer: &'w Arc<Writer>,
    guard: Option<std::sync::MutexGuard<'w, ()>>,
}

impl Drop for Ahead<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let writer = self.writer;
        if writer.handed_off.load(Ordering::SeqCst) {
            return;
        }
        if std::thread::panicking() {
            writer.hand_off_to_a_new_thread();
        } else {
            writer.commit_while_free(|| writer.hand_off() || writer.hand_off_to_a_new_thread());
        }
    }
}

/// Leads when dropped, after a durable read let the write lock go: the writes queued while
/// it held the lock were left to it. Should the read panic, they go to a thread of their
/// own instead (no commit while unwinding, see [`Ahead`]).
struct LeadsAfter<'w>(&'w Arc<Writer>);

impl Drop for LeadsAfter<'_> {
    fn drop(&mut self) {
        let writer = self.0;
        if !std::thread::panicking() {
            writer.lead();
        } else if !writer.handed_off.load(Ordering::SeqCst)
            && writer.waiting.load(Ordering::SeqCst) == 0
        {
            // (A purge step waiting leads them itself.)
            writer.hand_off_to_a_new_thread();
        }
    }
}

/// Runs blocking storage work: on a multi-threaded tokio runtime the worker's other tasks
/// move to another thread meanwhile; elsewhere it simply runs.
fn blocking<R>(work: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// The sweeper thread: purges every interval through the [`Writer`]; stops when dropped.
/// Its clock is the one the commits watch ([`ClockWatch`]) while it runs.
pub(crate) struct Sweeper {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    writer: Arc<Writer>,
    clock: SharedClock,
}

impl Sweeper {
    pub(crate) fn start(writer: Arc<Writer>, interval: Duration) -> std::io::Result<Self> {
        Self::start_with(writer, interval, now_ms)
    }

    /// [`Self::start`], reading the wall clock through `wall_ms` (a test's clock that
    /// steps forward).
    pub(crate) fn start_with(
        writer: Arc<Writer>,
        interval: Duration,
        wall_ms: fn() -> u64,
    ) -> std::io::Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_stop = Arc::clone(&stop);
        let sweeper_writer = Arc::clone(&writer);
        // Read before the thread starts: a commit landing first would hide the gap.
        let mut clock = PurgeClock::new(Duration::from_millis(writer.context.retention_ms));
        clock.read_at_start(
            wall_ms(),
            Some(super::ms_from_time(writer.context.watermark.last().at)),
            writer.kept_step(),
        );
        let clock = Arc::new(Mutex::new(clock));
        writer.context.clock_watch.watch(&clock);
        let thread_clock = Arc::clone(&clock);
        let thread = std::thread::Builder::new()
            .name("payhook-sweeper".into())
            .spawn(move || {
                let (flag, cond) = &*thread_stop;
                let mut stopped = lock(flag);
                while !*stopped {
                    stopped = cond
                        .wait_timeout(stopped, interval)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                    if !*stopped {
                        sweep(&sweeper_writer, &thread_clock, wall_ms);
                    }
                }
                // The clock read once more as the store stops: a step no commit saw (none
                // was written since) is kept for the next start all the same.
                drop(stopped);
                read_the_clock(&sweeper_writer, &thread_clock, wall_ms);
            });
        let thread = thread.inspect_err(|_| writer.context.clock_watch.unwatch(&clock))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            writer,
            clock,
        })
    }
}

/// One sweep by the clock `wall_ms` reads: the clock's step kept first where the reading
/// changed it (failing, the sweep purges all the same — by the elapsed time, which is safe
/// — and the next commit or sweep tries again), then the purge.
fn sweep(writer: &Arc<Writer>, clock: &SharedClock, wall_ms: fn() -> u64) {
    let by = read_the_clock(writer, clock, wall_ms);
    if let Err(error) = writer.purge(by) {
        tracing::error!(error = %crate::report::InLine(&error), "purging expired records failed");
    }
}

/// The time to purge by, the clock read through `wall_ms`, the clock's step kept where the
/// reading changed it. Read under the clock's lock: a commit that caught a step meanwhile
/// (its reading taken after this one's, had it been read before) would otherwise see the
/// step dropped by this older reading, and the store left without it.
fn read_the_clock(writer: &Arc<Writer>, clock: &SharedClock, wall_ms: fn() -> u64) -> u64 {
    let latest = writer.latest_expiry();
    let by = writer
        .context
        .clock_watch
        .with(clock, |clock| clock.purge_by(wall_ms(), latest));
    writer.keep_clocks_step(clock);
    by
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        let (flag, cond) = &*self.stop;
        *lock(flag) = true;
        cond.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.writer.context.clock_watch.unwatch(&self.clock);
        // The thread a sweep handed the leading to ends once the queue is empty.
        self.writer.join_commit_thread();
    }
}

/// Writes of the batch being built: `None` removes the key.
fn commit(context: &Context, jobs: Vec<Job>, replies: &mut Vec<Reply>) {
    let started = Instant::now();
    let writes = jobs.len();
    let mut overlay = Overlay::new();
    // One expiry index entry for the whole batch: its records share their expiry.
    let mut indexed = keys::IndexValue::with_capacity(jobs.len());
    let now = context.gate.now_ms();
    let expires_ms = now.saturating_add(context.retention_ms);
    for job in jobs {
        match job {
            Job::Callback {
                nonce,
                claim,
                status,
                effects,
                reply,
            } => {
                let Some(owned) = context.callback_claims.take_owned(&nonce, claim) else {
                    let _ = reply.send(Err(StoreError::ClaimLost(nonce)));
                    continue;
                };
                match stage_callback(
                    context,
                    &mut overlay,
                    &nonce,
                    status,
                    owned,
                    &effects,
                    expires_ms,
                ) {
                    Ok(key) => {
                        indexed.push(keys::TAG_CALLBACK, key.identifier());
                        replies.push(Reply::Written(reply));
                    }
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                }
            }
            Job::Validation {
                nonce,
                claim,
                fingerprint,
                decision,
                postponed,
                reply,
            } => {
                if !context.validation_claims.owns(&nonce, claim) {
                    let _ = reply.send(Err(StoreError::ClaimLost(nonce)));
                    continue;
                }
                let mut validation_id = None;
                if let Some(record) = postponed {
                    let mut staging = Staging::new(&context.tree, &mut overlay);
                    match postponed_records::create(&mut staging, &record) {
                        Ok(postponed_records::Created::New) => {
                            indexed.push(
                                keys::TAG_POSTPONED,
                                record.validation_id.to_string().as_bytes(),
                            );
                            validation_id = Some(record.validation_id);
                        }
                        Ok(postponed_records::Created::Known) => {}
                        // Nothing of this validation is written: answered as refused, its
                        // nonce free for the aggregator to ask again.
                        Ok(postponed_records::Created::TakenByAnotherNonce) => {
                            let id = record.validation_id.get();
                            let _ = reply.send(Err(StoreError::ValidationIdTaken(id)));
                            continue;
                        }
                        Err(error) => {
                            let _ = reply.send(Err(error));
                            continue;
                        }
                    }
                }
                let record = ValidationRecord {
                    fingerprint: KeptFingerprint::of(&fingerprint),
                    decision,
                    expires_ms,
                    validation_id,
                    repeats_awaiting: Vec::new(),
                };
                // Claimed: no record of this nonce under either key, nothing to move.
                let key = keys::validation(&nonce);
                indexed.push(keys::TAG_VALIDATION, key.identifier());
                overlay.insert(key.key, Some(encode(&record)));
                replies.push(Reply::Written(reply));
            }
            Job::EndSession {
                session,
                until_ms,
                reply,
            } => {
                // Indexed at its own end, not the batch's expiry: purged once its session
                // could no longer be presented, whatever the retention.
                let record = EndedSession {
                    expires_ms: until_ms,
                };
                let key = keys::ended_session(&session);
                let own_entry = [(keys::TAG_SESSION, key.identifier().to_vec())];
                let batch_id = uuid::Uuid::new_v4().as_u64_pair().0;
                overlay.insert(
                    keys::expiry(until_ms, batch_id),
                    Some(keys::encode_index(&own_entry)),
                );
                overlay.insert(key.key, Some(encode(&record)));
                replies.push(Reply::Written(reply));
            }
            Job::Failure(failure) => {
                // Before the record is staged: a later callback of this batch looks for it.
                context.may_hold_failures.store(true, Ordering::Relaxed);
                let mut staging = Staging::new(&context.tree, &mut overlay);
                match failing::record(&mut staging, &failure, expires_ms) {
                    Ok(true) => {
                        indexed.push(keys::TAG_FAILING, &keys::identifier(&failure.nonce));
                    }
                    Ok(false) => {}
                    Err(error) => {
                        tracing::error!(error = %crate::report::InLine(&error), "recording a callback failure failed");
                    }
                }
            }
            Job::Repeat {
                request,
                now,
                reply,
            } => {
                let mut staging = Staging::new(&context.tree, &mut overlay);
                match repeat(&mut staging, *request, now, expires_ms) {
                    Ok(Repeated {
                        repeat,
                        written,
                        relinked,
                    }) => {
                        // The nonce's record first: a sweep that reaches this entry looks
                        // at it while the new record is still there.
                        if let Some(nonce) = relinked {
                            indexed.push(keys::TAG_VALIDATION, &nonce);
                        }
                        if let Some(id) = written {
                            indexed.push(keys::TAG_POSTPONED, id.to_string().as_bytes());
                        }
                        replies.push(Reply::Repeated(reply, repeat));
                    }
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                }
            }
            Job::Resolve {
                nonce,
                status,
                resolving,
                at,
                reply,
            } => {
                let pair = (nonce.as_str(), status);
                match held::resolve(&context.tree, &overlay, pair, at, &resolving) {
                    Ok(resolved) => {
                        let resolved = resolved.map(|(resolved, writes)| {
                            overlay.extend(writes);
                            resolved
                        });
                        replies.push(Reply::HeldResolved(reply, resolved));
                    }
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                }
            }
            Job::Postponed { op, reply } => {
                let mut staging = Staging::new(&context.tree, &mut overlay);
                match postponed_records::apply(&mut staging, op) {
                    Ok(resolution) => replies.push(Reply::Resolved(reply, resolution)),
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                }
            }
        }
    }
    let mut clock_step = None;
    let outcome = if overlay.is_empty() && indexed.is_empty() {
        Ok(())
    } else {
        clock_step = stage_clock_step(context, now, &mut overlay);
        // The seal goes into the batch; the watermark follows once the batch is durable,
        // before any reply: an acknowledged commit is always at or below the watermark.
        let seal = context.watermark.next(now);
        if !indexed.is_empty() {
            // The commit's number tells this batch's index entry from others of the same
            // expiry (no random number to draw per batch).
            overlay.insert(
                keys::expiry(expires_ms, seal.commit),
                Some(indexed.into_value()),
            );
        }
        overlay.insert(keys::SEAL.to_vec(), Some(seal.encode()));
        match &context.destination {
            // The one step that waits for the disk: on the blocking pool.
            Destination::Sled => blocking(|| {
                let (added, removed) = failing::pairs_changed(&context.tree, &overlay)?;
                let (held, resolved) = held::changed(&context.tree, &overlay)?;
                apply(context, overlay)?;
                // As readers see the records from now on (should the flush fail, the store
                // stops, and the next open counts again).
                context.failing.change(added, removed);
                make_durable(context)?;
                // Once durable: a person counts on a held result only as it is kept (its
                // listing reads under the writer lock, durable records only, too).
                context.held.change(held, resolved);
                context.watermark.advance(seal)
            }),
            // Built in full, written nowhere: see `Destination::Nowhere`.
            Destination::Nowhere => {
                drop(overlay);
                Ok(())
            }
            Destination::Appended(file) => blocking(|| append_durably(file, &overlay)),
        }
    };
    match &outcome {
        Err(error) => {
            tracing::error!(error = %crate::report::InLine(error), "committing a batch failed; the store refuses further work until restarted");
            context.failed.store(true, Ordering::SeqCst);
        }
        Ok(()) => {
            context
                .metrics
                .observe(started.elapsed().as_secs_f64(), writes);
            if let Some((clock, change)) = clock_step {
                context
                    .clock_watch
                    .with(&clock, |clock| clock.written(change));
            }
        }
    }
    for reply in replies.drain(..) {
        reply.send(&outcome);
    }
}

/// Where the clock reads `now_ms` past the watched clock's alarm ([`ClockWatch`]), or the
/// watched clock has a change of its step not yet written: what the clock now keeps of its
/// step — the step this reading catches, first of all — staged into the batch, durable with
/// the first records written by the stepped clock, and the change, for the clock to take as
/// written once the batch is durable. A batch of a clock within the slack looks no further.
fn stage_clock_step(
    context: &Context,
    now_ms: u64,
    overlay: &mut Overlay,
) -> Option<(SharedClock, StepChange)> {
    let clock = context.clock_watch.stepped(now_ms)?;
    let change = context.clock_watch.with(&clock, |held| {
        // Only a reading that steps adds to the clock: an earlier one (taken before the
        // sweeper's latest) could drop the step it caught. A change still to be written
        // is staged whatever the reading.
        if held.catches(now_ms) {
            held.purge_by(now_ms, latest_expiry(&context.tree));
        }
        held.take_change()
    })?;
    let record = change
        .step
        .as_ref()
        .map(Step::encode)
        .transpose()
        .inspect_err(|error| {
            tracing::error!(error = %crate::report::InLine(error), "the clock's step could not be kept with the batch; the next commit or sweep tries again");
        })
        .ok()?;
    overlay.insert(keys::CLOCK_STEP.to_vec(), record.map(String::into_bytes));
    Some((clock, change))
}

/// Adds one acknowledged callback to the batch: its effects and its record. Returns where
/// the record is kept, for the batch's expiry entry.
fn stage_callback(
    context: &Context,
    overlay: &mut Overlay,
    nonce: &str,
    status: i32,
    owned: Owned,
    effects: &Effects,
    expires_ms: u64,
) -> Result<keys::RecordKey, StoreError> {
    let key = keys::callback(nonce);
    // The record read when the claim was taken, unless this batch wrote it since (it does
    // not, while claims hold: one write per claim) or the claim took over a stale one.
    let kept = owned.record.filter(|_| !overlay.contains_key(&key.key));
    let mut record = match kept {
        Some(record) => record,
        None => match read_record(&context.tree, overlay, &key)? {
            Some(bytes) => decode::<CallbackRecord>(nonce, &bytes)?,
            None => CallbackRecord::default(),
        },
    };
    if record.done.contains(&status) {
        // Booked already, by a delivery whose claim this one took over (its batch is this
        // one or durable before it): the effects must not run twice. The answer, 200, is
        // true once this batch is durable.
        tracing::warn!(
            nonce = %crate::logged::Logged(nonce),
            "a delivery finished a status already booked by a taken-over claim; its effects are dropped"
        );
        return Ok(key);
    }
    let tx = OverlayTx {
        context,
        batch: overlay,
        local: RefCell::default(),
        failure: RefCell::default(),
    };
    // The effects are the merchant's code, run on whichever request leads this batch: a
    // panic in them fails this callback only, not the batch.
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| effects.apply(&tx)))
        .unwrap_or_else(|_| Err(StoreError::abort("an effect panicked")));
    let (local, failure) = (tx.local.into_inner(), tx.failure.into_inner());
    // A backend failure met by an effect fails this callback, whatever the effect made of it
    // (an effect that took a failed read for an absent key would book a wrong balance);
    // otherwise the effect's own refusal.
    if let Some(error) = failure.or(applied.err()) {
        return Err(error);
    }
    // Read before anything of this callback is written (see below).
    let held = match effects.held() {
        Some(reason) => {
            let held = HeldCallback::new(nonce, status, &reason, effects.subject(), Utc::now());
            held::write_of(&context.tree, overlay, &held)?
        }
        None => None,
    };
    // Nothing of this callback is in the batch yet: an error from here on would leave the
    // batch as it was (the failing record is read before anything is written), and what
    // follows cannot fail. A callback answered with an error must leave nothing behind: the
    // batch is still applied and made durable for the others, and the next delivery of this
    // nonce would find its effects.
    if context.may_hold_failures.load(Ordering::Relaxed) {
        failing::booked(&mut Staging::new(&context.tree, overlay), nonce, status)?;
    }
    overlay.extend(local);
    if let Some((key, value)) = held {
        overlay.insert(key, Some(value));
    }
    if !record.done.contains(&status) {
        record.done.push(status);
    }
    record.attempts = record.attempts.max(owned.attempts);
    record.expires_ms = expires_ms;
    write_record(overlay, &key, Some(encode(&record)));
    Ok(key)
}

/// Flushes what was applied to sled, and `fdatasync`s sled's data file.
fn make_durable(context: &Context) -> Result<(), StoreError> {
    context.gate.pass(HoldPoint::BeforeFlush);
    context.db.flush()?;
    context.blobs.sync_new()?;
    context
        .data_file
        .sync_data()
        .map_err(|e| StoreError::backend("fdatasync of sled's data file failed", e))
}

/// Appends `overlay` to `file` and `fdatasync`s it: [`Destination::Appended`]'s write, one
/// buffer per batch, each key and value length-prefixed (a removal's length `u32::MAX`).
fn append_durably(file: &Mutex<BenchFile>, overlay: &Overlay) -> Result<(), StoreError> {
    let length = |bytes: usize| u32::try_from(bytes).unwrap_or(u32::MAX).to_le_bytes();
    let size = overlay
        .iter()
        .map(|(key, value)| 8 + key.len() + value.as_ref().map_or(0, Vec::len))
        .sum();
    let mut buffer = Vec::with_capacity(size);
    for (key, value) in overlay {
        buffer.extend_from_slice(&length(key.len()));
        buffer.extend_from_slice(key);
        match value {
            Some(value) => {
                buffer.extend_from_slice(&length(value.len()));
                buffer.extend_from_slice(value);
            }
            None => buffer.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
    lock(file)
        .write_durably(&buffer)
        .map_err(|e| StoreError::backend("appending a batch to the benchmark's file failed", e))
}

/// Applies `overlay` to sled in one atomic batch (not yet durable).
fn apply(context: &Context, overlay: Overlay) -> Result<(), StoreError> {
    let mut batch = sled::Batch::default();
    for (key, value) in overlay {
        match value {
            Some(value) => batch.insert(key, value),
            None => batch.remove(key),
        }
    }
    context.gate.pass(HoldPoint::BeforeApply);
    context.tree.apply_batch(batch)?;
    Ok(())
}

/// Removes records whose expiry passed, through the expiry index, stopping after the index
/// entry that brings the records looked at to `step`. Returns how many were removed and
/// whether expired entries remain.
fn purge_step(context: &Context, now_ms: u64, step: usize) -> Result<(usize, bool), StoreError> {
    let mut batch = sled::Batch::default();
    let mut indexed = 0usize;
    let mut purged = 0;
    let mut failing_purged = 0;
    let mut looked_at = 0;
    let mut more = false;
    let mut kept = Vec::new();
    // A record written twice is in two index entries: removed (and counted) once.
    let mut removed = std::collections::HashSet::new();
    for entry in context
        .tree
        .range(keys::EXPIRY_PREFIX.to_vec()..keys::expiry_upper(now_ms))
    {
        if looked_at >= step {
            more = true;
            break;
        }
        let (key, value) = entry?;
        batch.remove(key);
        indexed += 1;
        for (tag, identifier) in keys::decode_index(&value) {
            looked_at += 1;
            let Some(record_key) = keys::indexed_record(tag, &identifier) else {
                if purge_postponed(context, &mut batch, &identifier)? {
                    purged += 1;
                } else {
                    kept.push((tag, identifier));
                }
                continue;
            };
            let Some((found_at, bytes)) = record_key.find(|k| context.tree.get(k))? else {
                continue;
            };
            // A later write moved the record's expiry (and indexed it again): keep it.
            let named = keys::describe(&identifier);
            // A failing record goes with its pairs and its keys by time.
            let decoded = match tag {
                keys::TAG_CALLBACK => {
                    decode::<CallbackRecord>(&named, &bytes).map(|r| (r.expires_ms, None, None))
                }
                keys::TAG_FAILING => decode::<FailureRecord>(&named, &bytes)
                    .map(|record| (record.expires_ms, Some(record), None)),
                keys::TAG_SESSION => {
                    decode::<EndedSession>(&named, &bytes).map(|r| (r.expires_ms, None, None))
                }
                _ => decode::<ValidationRecord>(&named, &bytes)
                    .map(|r| (r.expires_ms, None, Some(r))),
            };
            // One that does not decode (damaged, or written by a newer payhook) is kept and
            // looked at again a retention later: it must not stop every purge behind it.
            let (expires, failing, nonce_record) = match decoded {
                Ok(decoded) => decoded,
                Err(error) => {
                    tracing::error!(error = %crate::report::InLine(&error), "a record past its retention does not decode; kept, the sweep goes on");
                    kept.push((tag, identifier));
                    continue;
                }
            };
            // An ended session is kept until its own end (ended again later than it was
            // first): looked at once more a retention later.
            if tag == keys::TAG_SESSION && expires > now_ms {
                kept.push((tag, identifier));
                continue;
            }
            if expires <= now_ms && removed.insert(found_at.to_vec()) {
                // A nonce whose validation still waits for its decision, or for its delivery,
                // keeps its record: a new validation of it would otherwise run the handler
                // again, and could decide it otherwise.
                if awaits_its_result(context, nonce_record.as_ref())? {
                    kept.push((tag, identifier));
                    continue;
                }
                batch.remove(found_at);
                purged += 1;
                if let Some(record) = failing {
                    failing_purged += record.failing.len();
                    for time in record.times() {
                        batch.remove(keys::failing_by_time(time, keys::identifier_in(found_at)));
                    }
                }
            }
        }
    }
    if !kept.is_empty() {
        let expires_ms = now_ms.saturating_add(context.retention_ms);
        let batch_id = uuid::Uuid::new_v4().as_u64_pair().0;
        batch.insert(
            keys::expiry(expires_ms, batch_id),
            keys::encode_index(&kept),
        );
    }
    // Nothing expired: nothing to write (an empty batch would still cost sled a log write).
    if indexed > 0 {
        context.tree.apply_batch(batch)?;
        context.failing.change(0, failing_purged);
    }
    Ok((purged, more))
}

/// What recording a repeat did: the store's answer, the id of the postponed validation
/// written, and the identifier of the nonce's record when it was written again (to be
/// indexed at its new expiry).
struct Repeated {
    repeat: Repeat,
    written: Option<ValidationId>,
    relinked: Option<Vec<u8>>,
}

/// Records a repeat under a new validation id as a repeat of the postponed validation that
/// holds its nonce's decision, found through the nonce's validation record. An approval
/// recorded afresh under the id becomes the validation the nonce's record names, and the
/// record is renewed to `expires_ms`, as a PostgreSQL store renews it: its later repeats
/// are the new record's repeats, and the nonce's record is kept while it awaits delivery.
/// A nonce with no record (a sweep took it since the caller read it) is an error: asked
/// again, it is validated afresh, rather than answered 200 with no result to follow.
fn repeat(
    staging: &mut Staging<'_>,
    request: TransactionValidationRequest,
    now: DateTime<Utc>,
    expires_ms: u64,
) -> Result<Repeated, StoreError> {
    let key = keys::validation(request.nonce().as_str());
    let Some(bytes) = staging.get_record(&key)? else {
        return Err(StoreError::purged_as_asked_again());
    };
    let mut nonce_record = decode::<ValidationRecord>(request.nonce().as_str(), &bytes)?;
    let recorded = postponed_records::Recorded {
        original: nonce_record.validation_id,
        approved: nonce_record.decision == RecordedDecision::Allow,
    };
    let (repeat, written) = postponed_records::repeat(staging, &recorded, request, now)?;
    let mut relinked = None;
    if repeat == Repeat::RecordedAfresh {
        nonce_record.validation_id = written;
        nonce_record.expires_ms = nonce_record.expires_ms.max(expires_ms);
        staging.put_record(&key, Some(encode(&nonce_record)));
        relinked = Some(key.identifier().to_vec());
    }
    Ok(Repeated {
        repeat,
        written,
        relinked,
    })
}

/// Postponed validation `id` as held: `None` when it is not; `Err` named by its id when it
/// does not decode.
fn held_postponed(
    context: &Context,
    id: ValidationId,
) -> Result<Option<Result<PostponedValidation, StoreError>>, StoreError> {
    let Some(bytes) = context.tree.get(keys::by_id(keys::POSTPONED_PREFIX, id))? else {
        return Ok(None);
    };
    Ok(Some(super::record::decode_named(&bytes, || id.to_string())))
}

/// Whether `record`, or one of the repeats that share its decision, is not final:
/// undecided, or its result not delivered yet. A repeat that does not decode counts as not
/// final (logged): what it awaits cannot be told.
fn awaits(context: &Context, record: &PostponedValidation) -> Result<bool, StoreError> {
    if !record.is_final() {
        return Ok(true);
    }
    any_awaits(context, &record.repeats)
}

/// Whether one of the postponed validations `repeats` is held and not final (or does not
/// decode, logged).
fn any_awaits(context: &Context, repeats: &[ValidationId]) -> Result<bool, StoreError> {
    for repeat in repeats {
        match held_postponed(context, *repeat)? {
            Some(Ok(repeat)) if repeat.is_final() => {}
            None => {}
            Some(Ok(_)) => return Ok(true),
            Some(Err(error)) => {
                tracing::error!(error = %crate::report::InLine(&error), "a repeat of a postponed validation does not decode; kept, with the validation it repeats");
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether the postponed validation that holds a nonce's decision (`record` names it), or
/// one of its repeats, awaits its result (see [`awaits`]): the nonce's record is kept
/// meanwhile. One that does not decode counts as awaiting (logged). Once the original is
/// purged, the repeats that awaited then are those `record` lists.
fn awaits_its_result(
    context: &Context,
    record: Option<&ValidationRecord>,
) -> Result<bool, StoreError> {
    let Some(ValidationRecord {
        validation_id: Some(id),
        repeats_awaiting,
        ..
    }) = record
    else {
        return Ok(false);
    };
    let held = match held_postponed(context, *id)? {
        None => false,
        Some(Ok(record)) => awaits(context, &record)?,
        Some(Err(error)) => {
            tracing::error!(error = %crate::report::InLine(&error), "the postponed validation of a nonce past its retention does not decode; the nonce's record is kept, the sweep goes on");
            true
        }
    };
    // An original recorded afresh ([`Repeat::RecordedAfresh`]) after an earlier one went
    // leaves the repeats that earlier one handed over.
    Ok(held || any_awaits(context, repeats_awaiting)?)
}

/// Removes an expired postponed validation whose result was delivered or refused; returns
/// `false` when it must be kept (still undecided or undelivered). An original goes though a
/// repeat of it still awaits its result (the repeat holds its decision itself); the nonce's
/// record, which names the original, is then given the repeats to look at in its place
/// ([`awaits_its_result`]): without them it would go a retention later, and the nonce asked
/// about again would reach the handler a second time.
fn purge_postponed(
    context: &Context,
    batch: &mut sled::Batch,
    id: &[u8],
) -> Result<bool, StoreError> {
    let id = String::from_utf8_lossy(id);
    let Ok(id_number) = id.parse::<crate::model::ValidationId>() else {
        return Ok(true);
    };
    match held_postponed(context, id_number)? {
        None => Ok(true),
        Some(Ok(record)) => {
            if !record.is_final() {
                return Ok(false);
            }
            if any_awaits(context, &record.repeats)? {
                hand_repeats_to_nonce_record(context, batch, &record)?;
            }
            batch.remove(keys::by_id(keys::POSTPONED_PREFIX, id_number));
            Ok(true)
        }
        // Kept, and looked at again later, like any other record that does not decode.
        Some(Err(error)) => {
            tracing::error!(error = %crate::report::InLine(&error), "a postponed validation past its retention does not decode; kept, the sweep goes on");
            Ok(false)
        }
    }
}

/// Writes `original`'s repeats into its nonce's record, which names it, as `original` goes
/// while one of them awaits its result. A nonce record that does not decode is left as it
/// is (it is kept anyway, see `purge_step`).
fn hand_repeats_to_nonce_record(
    context: &Context,
    batch: &mut sled::Batch,
    original: &PostponedValidation,
) -> Result<(), StoreError> {
    let nonce = original.request.nonce().as_str();
    let key = keys::validation(nonce);
    let Some((found_at, bytes)) = key.find(|k| context.tree.get(k))? else {
        return Ok(());
    };
    let Ok(mut record) = decode::<ValidationRecord>(nonce, &bytes) else {
        return Ok(());
    };
    if record.validation_id == Some(original.validation_id) {
        // Added to those an earlier original handed over (see `awaits_its_result`).
        for repeat in &original.repeats {
            if !record.repeats_awaiting.contains(repeat) {
                record.repeats_awaiting.push(*repeat);
            }
        }
        batch.insert(found_at, encode(&record));
    }
    Ok(())
}

/// [`EffectTx`] over the batch being built: reads see earlier writes of this batch and of
/// this callback; writes go to `local` and join the batch only if every effect succeeds.
struct OverlayTx<'a> {
    context: &'a Context,
    batch: &'a Overlay,
    local: RefCell<Overlay>,
    failure: RefCell<Option<StoreError>>,
}

thread_local! {
    /// Where an effect's read builds its key: reused by every read on the thread, since a
    /// read keeps no key.
    static READ_KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Test-only: the keys (tree prefix and key) whose reads by an effect fail, as a
/// backend's read would.
#[cfg(test)]
pub(crate) static FAILING_READS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

impl OverlayTx<'_> {
    fn key(&self, tree: &Tree, key: &[u8]) -> Result<Vec<u8>, StoreError> {
        check_declared(&self.context.effect_trees, tree.name())?;
        Ok(tree.key(key))
    }
}

impl EffectTx for OverlayTx<'_> {
    fn get(&self, tree: &Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        check_declared(&self.context.effect_trees, tree.name())?;
        READ_KEY.with_borrow_mut(|full| {
            full.clear();
            full.extend_from_slice(tree.prefix());
            full.extend_from_slice(key);
            if let Some(value) = self.local.borrow().get(full.as_slice()) {
                return Ok(value.clone());
            }
            #[cfg(test)]
            let read = |tree: &sled::Tree, batch: &Overlay, key: &[u8]| {
                if lock(&FAILING_READS).iter().any(|failing| failing == key) {
                    return Err(StoreError::backend_message("a read failed (a test's)"));
                }
                read(tree, batch, key)
            };
            read(&self.context.tree, self.batch, full).inspect_err(|error| {
                *self.failure.borrow_mut() = Some(error.clone());
            })
        })
    }

    fn insert(&self, tree: &Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let key = self.key(tree, key)?;
        self.local.borrow_mut().insert(key, Some(value.to_vec()));
        Ok(())
    }

    fn remove(&self, tree: &Tree, key: &[u8]) -> Result<(), StoreError> {
        let key = self.key(tree, key)?;
        self.local.borrow_mut().insert(key, None);
        Ok(())
    }
}
