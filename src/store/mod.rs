//! Exactly-once effects: deduplication records, the durable acknowledgement, retention.
//!
//! The aggregator retries a callback up to 17 times, and the same transaction validation
//! may arrive more than once. The store remembers, per nonce, what was already done, so that
//! a merchant's handler books each result once.
//!
//! ## Life cycle of a callback record (key: nonce)
//!
//! ```text
//!   (absent) ──claim──▶ InFlight { since, status } ──handler Ack + effects──▶ Done { status, response }
//!       ▲                    │ handler error / RetryLater / timeout                │
//!       └──── release ◀──────┘                                                     │
//!   Done { s } ──delivery with status s──▶ duplicate: 200, handler not called      │
//!   Done { s } ──delivery with a new final status t──▶ claim again (handler told s) ┘
//! ```
//!
//! A claim is taken atomically (under a lock, against the durable record), so two deliveries
//! of one nonce never both win it. `InFlight` lives in memory: on one machine a claim of a
//! process that died is void anyway, and writing it would cost a disk write per delivery. The
//! handler's effects and the `Done` mark are written in one atomic batch; the writes of all
//! concurrent requests are applied together by whichever request leads (under steady load,
//! a thread of the runtime's blocking pool that it handed the leading to), and made durable
//! by one flush (group commit, see `committer.rs`); the answer (200) is sent only after that
//! flush. A crash
//! before the flush loses the claim, the mark and the effects together, so the aggregator's
//! next attempt runs the handler again: **at-least-once until acknowledged, never again
//! after**.
//!
//! ## Life cycle of a validation record (key: nonce)
//!
//! `InFlight` → `Done { decision }` the same way. A repeat with the same payment data
//! (amount, currency, client, provider, direction) gets the recorded decision; with different
//! data it is refused ([`ValidationBegin::Mismatch`]). The record is read back for the
//! nonce's callback ([`DedupStore::validated_payment`], a [`ValidatedPayment`]): what was
//! validated and decided, to compare with what the callback reports.
//!
//! ## Integrity
//!
//! sled recovers from a damaged log by silently cutting it short. payhook keeps a
//! high-water mark of its acknowledged commits outside sled's files and refuses to open a
//! store that holds fewer ([`IntegrityError`]); see [`SledStore::check`] and
//! [`SledStore::accept_loss`].
//!
//! ## Retention
//!
//! Every write also writes an entry in an expiry index; a background sweeper removes records
//! older than the retention (default 30 days), so the store stays bounded — but for a
//! postponed validation still waiting for its decision or its delivery, which is kept with
//! its nonce's record until it is final.
//!
//! [`Store`] is the seam for other backends, asynchronous throughout: [`DedupStore`] (claims,
//! marks written with the merchant's effects, failures) and [`PostponedStore`] (the
//! Awaitable state and its outbox). [`SledStore`] is the embedded default; `PgStore`
//! (feature `postgres`) the shared one; [`ConfiguredStore`] opens what `store.url` names.
//! `tests/every_store_backend_behaves_alike.rs` is the behaviour every backend passes.
//!
//! ## sled 0.34, and what payhook does about it
//!
//! sled 0.34 has had no release since 2021; its 1.0 is an alpha with another on-disk
//! format. What is known of 0.34 and how payhook answers it:
//!
//! * its `flush` uses `sync_file_range`, which does not survive a power loss: payhook
//!   follows every flush with `fdatasync` of sled's data file;
//! * it writes a log message over about 128 KiB (a large value, or a node of its tree
//!   written whole) to a file of its own, `blobs/<lsn>`, synced nowhere, and passes over a
//!   missing one at recovery: payhook `fsync`s each new blob file and the directory before a
//!   commit is acknowledged (`blobs.rs`);
//! * it recovers a damaged log by silently cutting it short: payhook's integrity watermark
//!   refuses to open a store that lost acknowledged commits ([`IntegrityError`]);
//! * its background flusher rewrites log segments of a store with many removals (about
//!   1 MB/s while idle): payhook turns it off and flushes what it writes itself;
//! * it keeps keys in memory beyond its cache and does not give that memory back: payhook
//!   keys long identifiers by their digest, so a record's size does not depend on what a
//!   sender chose to send;
//! * one process may open a directory: a service with a sled store is one instance.
//!
//! A merchant who needs a maintained engine, or more than one instance, sets `store.url`
//! and runs on PostgreSQL (`PgStore`, feature `postgres`; see its module's docs).
//!
//! ## The guarantees in detail
//!
//! **Durability contract.** The writes of concurrent requests are applied in one atomic sled
//! batch and made durable by one flush (group commit: a batch is whatever arrived during the
//! previous flush, no fixed window). sled's `flush()` writes through `sync_file_range` on Linux
//! (spacejam/sled#1452), which survives a process crash but not the disk's volatile write
//! cache, so payhook follows every flush with `fdatasync` of sled's data file. Nothing
//! acknowledged is lost to a process crash or kill -9; after a power loss nothing acknowledged
//! is lost either, provided the disk honours cache flushes (datacentre disks and cloud volumes
//! do; a consumer disk that lies about flushes can lose the last acknowledged batches). What is
//! written but *not yet acknowledged* (a handler still running) can be lost on a crash — by
//! design: it is retried. payhook flushes what it writes itself (each batch, and each sweep
//! that purged something); sled's own background flusher is off (`store.flush_every`, default
//! `0s`), because on sled 0.34 it keeps relocating log segments of a store with many removals
//! — about 1 MB/s written while idle. If a flush ever fails, the store refuses all
//! further work with 503 until the service restarts, so that a write of unknown durability is
//! never acknowledged later as a duplicate; `/readyz` answers 503 from then on, so that an
//! orchestrator replaces the instance.
//!
//! **Integrity at open.** sled 0.34 recovers from a damaged log (a truncated data file, garbage
//! in it) by cutting it short at the first bad record, and opens what is left as if nothing had
//! happened; the aggregator never resends an acknowledged callback, so that would lose money
//! without a trace. Every committed batch therefore carries a seal (the store's id and the
//! commit's number), and after the batch is durable, before anyone is answered, the number is
//! written to `payhook.watermark` beside sled's files (two checksummed slots, fdatasync'd). At
//! open, sled must hold the watermark's commit of this store: a damaged, emptied or replaced
//! data file, a missing `conf` or watermark make the service refuse to start, naming the store,
//! how many acknowledged commits are missing and from when, and what to do. `payhook store
//! check --data DIR` says the same without serving (exit 1 when something is lost);
//! `payhook store accept-loss --data DIR` is the operator's explicit decision to serve on what
//! is left (logged, and appended to `payhook.audit.log` in the store's directory), after which
//! `payhook reconcile --admin-url`, through the service started again, books what the loss
//! took; the commands that read the store refuse it before. A directory restored from a backup passes the check, holding the backup's own
//! watermark: what was booked after the backup is reconciled the same way. The watermark is
//! written only after sled holds the commit, so a crash at any moment (the kill -9 tests restart
//! after every kill) or a clean stop is never a false alarm.
//!
//! **Failing callbacks.** A delivery whose handler fails (an error, `RetryLater`, a timeout, a
//! panic, effects that abort) is answered 503 and retried by the aggregator, at most 17 times.
//! Each failure is logged at error level with the nonce and counted durably per (nonce,
//! status) with its reason and the payment's reference, client, amount and currency, until that
//! status is booked: `GET /payhook/admin/callbacks/failing[?limit=N][&after=CURSOR]` (a page
//! at a time, the next one linked) and `payhook callbacks failing [--latest N] [--admin-url
//! URL]` (a running service, or a stopped one's store) list them, or the N that failed last,
//! `/metrics` has `payhook_callbacks_failing` (alert on it) and
//! `payhook_callback_failures_total`. An incident can leave hundreds of thousands: both
//! backends read each page through an index by time, without the pages before it, and both
//! keep their count instead of counting them on every scrape (the embedded one in memory
//! since it opened, see `failing.rs`; PostgreSQL in a table a trigger keeps, see
//! `postgres::schema`). What the
//! aggregator gave up on is booked by hand with `payhook reconcile --ref ID --admin-url URL`.
//! A callback whose body is refused (400) is recorded the same way, under the nonce and
//! status read from it, with the refusal as its reason (see `server::refusal`).
//!
//! **Held results.** A result the merchant's effects hold instead of booking
//! ([`Booking::Held`], a quarantine) is acknowledged like a booking, and kept as a
//! [`HeldCallback`] in the same atomic write as its mark, never purged: it waits for a
//! person, who resolves it with a note once the merchant's books are right
//! ([`DedupStore::resolve_held`]; `payhook callbacks held` / `resolve`, the operating API,
//! the inspector). `payhook_callbacks_held_unresolved` counts the waiting ones, and a
//! reconcile tells held (and resolved) from booked. See `held.rs`.
//!
//! **Retention.** Records expire `store.retention` (default 30 days, far beyond any retry
//! horizon) after their last write; a sweeper purges them every `store.sweep_interval` through
//! an expiry index, so the store stays bounded under a constant stream of new nonces. A sweep
//! purges in steps of 256 records and lets go of the write lock between steps, so requests are
//! never held behind everything that expired at once. A postponed validation that is not
//! final (undecided, or its result undelivered) is kept, and so is its nonce's validation
//! record while it, or a repeat of it, is: asked about again, the nonce gets the recorded
//! answer, never the handler a second time. Each record keeps the expiry it was written
//! with: a store also keeps the retention its records were written with (`horizon`), and
//! [`Store::reach`], not the configured retention alone, is how far back a missing record
//! proves a callback was never booked — after `store.retention` grows, the reach grows back
//! to it as the older records age out.
//!
//! **In flight.** A claim ("this delivery is processing this nonce") lives in memory: on one
//! machine, the claim of a process that died is void anyway. The PostgreSQL store keeps claims
//! in the database instead, as leases on its clock. Only one process may open a sled
//! directory at a time.
//!
//! **Retries skip the signature operation.** A retry carries the same bytes and signature; a
//! (signature, body) pair that verified before (16k keyed tags are remembered, see
//! `signature/cache.rs`) is accepted without the public-key operation; any changed byte is
//! verified afresh. On sled, a retry of a pair whose callback this process booked is answered
//! as a duplicate without reading the store, until the booking's retention ends counted from
//! before it began (when the store may forget the record) and unless the store has failed
//! ([`Store::process_may_remember_bookings`]).
//!
//! ## What durability costs
//!
//! `cargo run --release --example bench_callbacks` measures the callback endpoint against a
//! raw hyper baseline in one run (its docs list the scenarios and options; the README gives
//! the latest figures). Four of its scenarios take B apart: E adds payhook's durable path
//! to D, and F and B each add to E a way of making the batch durable:
//!
//! | scenario | what it does per callback | server CPU per request |
//! |---|---|---|
//! | D | verification, parsing, the handler; no store | 44–45 µs |
//! | E | D plus payhook's durable path: claims, effects, the group commit, the waits; each batch written nowhere | 50–52 µs |
//! | F | E plus each batch appended to a file of its own (zero-filled at open, written in place) and `fdatasync`ed before anyone is answered: one sync per batch; nothing written to sled, no watermark | 64–70 µs |
//! | B | E plus each batch applied to sled, flushed and `fdatasync`ed, then the integrity watermark written and `fdatasync`ed: two syncs per batch | 107–117 µs |
//!
//! (`-- 5 B D E F --rounds 3 --slices 10` on 2026-11-26, build b4b2119, on a 2-core AMD EPYC
//! VM that the load driver shares; each round ran the four servers side by side.) So, per
//! request: payhook's own mechanics cost about 6 µs (E − D); making each batch durable costs
//! 14–18 (F − E: the write, the `fdatasync`, and the threads it puts to sleep and wakes —
//! about 0.7 context switches per request in F against 0.3 in E, by `perf stat`); sled and
//! the watermark's second sync cost 43–47 more (B − F). **F/D was 0.63–0.67 where B/D was
//! 0.36–0.38** (0.62–0.70 and 0.36–0.39 in the nine rounds of the README's three full runs):
//! F is B on an engine that costs nothing and syncs once per batch, so F/D is as high as B/D
//! can go on this machine with any store that makes each batch durable before it answers.
//! The target B/D ≥ 0.65 is that floor's own level (F/D's median over those twelve rounds
//! was 0.65), and B/A ≥ 0.25 is above it (F/A about 0.2). A second sync per batch, as the
//! watermark takes, lowers the floor further: on 2026-11-25 the same kind of store measured
//! 0.67–0.68 with one sync and 0.54–0.59 with the watermark's write and sync added (rounds
//! not yet sliced). A store that reaches the floor must prove what it acknowledged without a
//! second sync, for instance by sealing each batch in its own log.
//!
//! **The same on an Intel Xeon VM** of the same kind at 2.5 GHz, without SHA instructions
//! (2026-11-27, build b2e0497, nine rounds of three full runs): D 60–66 µs, E 72–81, F
//! 81–93, B 117–140; F/D 0.70–0.76 and B/D 0.44–0.48. There the floor lies above 0.65 —
//! verification and hashing cost more, so D is slower and each store's cost weighs less —
//! and B's distance to it is again sled with the watermark's second sync (B − F 36–47 µs,
//! round by round). payhook's own mechanics cost more there too (E − D 12–15 µs), spread
//! thin: in `perf record` profiles of D's and E's servers the allocator took about 2.6 µs
//! more per request in E, and no other symbol 1 µs more (sled's reads, the example
//! merchant's booking, the clock, the group commit); the system time and the context
//! switches per request barely differed. glibc's allocator tuned for the path
//! (`GLIBC_TUNABLES=glibc.malloc.tcache_count=2000:glibc.malloc.mxfast=0`) left B/D at
//! 0.44–0.45 and raised B's peak RSS to 219–231 MiB.
//!
//! **Where B's CPU goes** (a profile of B's server, 2026-11-25): RSA verification 19 % (of
//! which ring re-deriving the public key's Montgomery constants on every verification 6 %;
//! ring 0.17 has no public way to verify with a parsed RSA key); sled 31 % (`apply_batch`
//! 11 %, its I/O threads 15 %); the allocator about 19 %; payhook's durable path about 5 %.
//! B switches context 1.9 times per request, half of it in sled's seven I/O threads, which its
//! thread pool wakes all at once for every job.
//!
//! **B's p99 follows its throughput.** The load is a closed loop of 64 connections, so a
//! scenario's mean latency is 64 ÷ its req/s (Little's law). On the Intel Xeon at 2.1 GHz
//! (2026-11-26, nine rounds of three full runs) B's p99 was 1.83–1.91 times that mean — D's
//! 1.92–2.06, A's 2.15–4.54 — and 1.8–2.05 at both ends of the README's other columns: the tail
//! is the shape of a closed loop on two shared cores, not of the durable path, so the p99 of B
//! ≤ 10 ms holds where B reaches about 12,000 req/s. Measured inside B's server on the
//! Intel Xeon at 2.1 GHz (2026-11-26, 9,000–11,000 req/s, a probe not kept): a batch's writers
//! were polled a median 0.25–0.5 ms after their replies were sent, 16 % of them more than 1 ms
//! after — the time a woken task waits behind the others for a core; more than half of the
//! batches held 1–7 writes and a fifth 32–63, but most requests were in the large ones; half
//! of the commits took more than 1 ms.
//!
//! **sled, apart from payhook.** `cargo run --release --example bench_sled` writes the same
//! keys — a nonce lookup, the record, the ledger entry, one of 100 hot balances — in batches
//! of `apply_batch` and `flush()`, and takes sled's CPU per callback: 383 µs flushing per
//! callback, 38 at 20 callbacks per batch (B's batches hold about 18), 28 at 60, 25 at 2,000.
//! A throwaway program outside the repository (its crates are not payhook's dependencies)
//! wrote that workload, each batch made durable, into other engines:
//!
//! | engine, each batch made durable by | 20 per batch | 60 per batch |
//! |---|---|---|
//! | sled 0.34: `apply_batch`, `flush`, `fdatasync` of its data file (as payhook does) | 31–34 µs | 18–20 µs |
//! | redb 2.6: one write transaction, `Durability::Immediate` | 16–19 µs | 10 µs |
//! | fjall 2.11: one batch, its journal persisted with `SyncData` (memtables flushed at the end) | 11–12 µs | 9–10 µs |
//! | a bare append and `fdatasync` | 4 µs | 2 µs |
//!
//! **Measured and not kept**, each a temporary change run side by side with the build of its
//! day (B/D and the CPU per request move by ±20 % between hours on this VM, so only rounds
//! run together are compared):
//!
//! | change | measured | why not kept |
//! |---|---|---|
//! | a journal acknowledged at `write()`, before any sync, checkpointed into sled every 500 ms | B/D 0.71, p99 13.6 ms, RSS 68 MiB (2026-11-23) | it acknowledges before the write is durable: a power loss loses acknowledged callbacks |
//! | a journal in front of sled: each batch appended and `fdatasync`ed, applied to sled without its flush, no watermark | B/D medians 0.37 and 0.37 against 0.38 and 0.35, p99 of B unchanged (2026-11-25); 0.38–0.41 on 2026-11-26, as the shipped build | B is bound by sled's CPU, not by its syncs |
//! | the same journal, its writes applied to sled in coalesced, sorted batches of 4,096 keys | B/D 0.44–0.45, peak RSS 156–162 MiB (2026-11-26) | sled's cost is per key, batched or not |
//! | applying each batch to sled while the previous one is flushed | B 3,548 req/s against 9,211 | batches shrank to one or two requests (see `committer.rs`) |
//! | the leader writing on its runtime worker, not under `block_in_place` | B/D 0.36 and 0.33 against 0.43 | a worker blocked in `fdatasync` holds up its queued tasks |
//! | no `fdatasync` after sled's flush | within the runs' noise | acknowledgements stay power-loss durable |
//! | the watermark's `fdatasync` overlapped with the next batch's flush | no better (the watermark's sync costs about 2.5 %) | the sequential order is simpler |
//! | sled's cache at 128 MiB instead of 16 | no gain | a run's records fit the default |
//! | sled's I/O pool waking one thread per job (a fork of sled 0.34.7) | B/D +0.02–0.04 | not worth a fork |
//! | mimalloc as the server's allocator | B/D +0.03, B's peak RSS 113 MiB against 55 | the memory |
//! | a dedicated commit thread, or handing off every commit (see `committer.rs`) | the same throughput at 79–98 MiB, or B a sixth slower | the memory, the CPU |
//! | a request going on leading the batches queued behind its own for up to 500 µs before it hands the leading off (a hand-off costs a thread's wake-up; E's batches cost less) | E/D medians 0.90 and 0.90 against 0.90 and 0.90, B/D 0.41 and 0.41 against 0.42 and 0.43 (Intel Xeon at 2.1 GHz, 2026-11-26, runs alternated) | no gain |
//! | the replies of a handed-off batch sent from a task spawned on the runtime, so that their wake-ups reach a worker's own queue and not, one by one, the runtime's shared queue | B's p99 × req/s ÷ 64 (the p99 over the closed loop's mean latency) 1.76–1.92 against 1.76–1.83 | no gain |
//! | the hand-off's thread waiting 300 µs before a batch of fewer than 8 writes | a quarter fewer commits, B within the runs' noise (11,609 and 10,704 req/s against 10,386 and 11,505) | no gain |
//!
//! sled's configuration holds no lever left: 0.34.7 reads `Config::mode` nowhere;
//! `segment_size` is written into a store's `conf` and checked at open, so another size would
//! refuse every existing store; compression is a cargo feature payhook does not enable.
//!
//! **The durable path's instructions.** `cargo run --release --example bench_durable_path`
//! counts them per callback under callgrind (see the example's docs), a figure the VM does not
//! move: 21,854 on 2026-11-26, one callback per commit, sled's reads included (about 1,200
//! each on an empty tree, three per callback) — a fifth of it the allocator. The same at the
//! server, HTTP and all: `bench_callbacks -- 20 D E --instructions` counted 509,480
//! instructions per request in D and 538,982 in E (2026-11-26), so E − D is 29,501, of
//! which about 10,700 are the example merchant's own booking (its reads, JSON entries and
//! decimal balances). Natively E − D costs more than those instructions: E switches context
//! 0.52 times per request against D's 0.39 (`perf stat`), and its memory moves between the
//! requests' threads and the leader's; E allocates 94 times per request against D's 53
//! (callgrind's call counts). On an AMD EPYC VM the same count gave E − D 29,529 with
//! build d31ca14 and 27,312 with 906ed37 (a waiters key built only when someone waits, the
//! nonce borrowed instead of cloned for the booking); `--keep DIR` leaves the dumps, and
//! `callgrind_annotate` then says where the rest goes (about 8,600 of the 29,529 were the
//! allocator's).

mod blobs;
mod claims;
mod clock_watch;
mod commit_metrics;
mod committer;
mod configured;
mod effects;
mod failing;
pub(crate) mod held;
mod horizon;
mod keys;
#[cfg(feature = "postgres")]
mod postgres;
mod postponed_records;
mod record;
mod settings;
mod sled_store;
mod staging;
mod uptime;
mod validated;
mod watermark;

use crate::model::{Nonce, ValidationId};
use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use crate::postponed::record::{
    Decision, Delivery, PostponedPage, PostponedState, PostponedValidation, Repeat, Resolution,
};

use chrono::{DateTime, Utc};

use crate::model::{TransactionStatus, TransactionValidationRequest};

pub use commit_metrics::CommitMetrics;
pub use configured::ConfiguredStore;
pub use effects::{Booking, EffectTx, Effects, Tree};
#[cfg(feature = "postgres")]
pub use effects::{SqlBookingFuture, SqlFuture};
pub(crate) use failing::sort_latest_first;
pub use failing::{CallbackFailure, FailingCallback, FailingCursor, FailingPage, NotACursor};
pub use held::HeldCallback;
pub(crate) use held::Subject;
#[cfg(feature = "postgres")]
pub use postgres::{Imported, IndexedRead, OUTBOX_LEASE, PURGE_BATCH, PgStore, TX_ATTEMPTS};
pub use record::{Fingerprint, RecordedDecision};
pub use settings::StoreConfig;
#[cfg(feature = "sim")]
pub(crate) use sled_store::open_locked;
pub use sled_store::{BenchmarkStore, CommitHold, HoldPoint, KeyValue, MOVED_FILE_NAME, SledStore};
pub use validated::{Difference, ValidatedDecision, ValidatedPayment};
pub use watermark::{IntegrityError, IntegrityReport, Seal};

/// The store's traits, for calling their methods on a concrete store (`SledStore`,
/// `PgStore`) or on `Arc<dyn Store>`:
///
/// ```
/// use payhook::store::prelude::*;
/// use payhook::store::{SledStore, StoreConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), payhook::store::StoreError> {
/// # let dir = tempfile::tempdir().map_err(|e| payhook::store::StoreError::abort(e.to_string()))?;
/// # let config = StoreConfig { path: dir.path().join("data"), ..StoreConfig::default() };
/// let store = SledStore::open(&config, &[])?;
/// let status = payhook::model::TransactionStatus::Success;
/// assert!(!store.callback_acknowledged(&"n-1".into(), status).await?);
/// assert_eq!(store.outbox_len().await?, 0);
/// # Ok(())
/// # }
/// ```
pub mod prelude {
    pub use super::{DedupStore, PostponedStore, Store};
}

/// A claim on a nonce: proof that this delivery owns it until it finishes or releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Unique within the store instance.
    pub id: u64,
}

/// What to do with a callback delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackBegin {
    /// Run the handler; this delivery owns the nonce until it finishes or releases.
    Claimed {
        /// The claim to finish or release.
        claim: Claim,
        /// Deliveries of this nonce that reached the handler, this one included.
        attempt: u32,
        /// The last acknowledged status of this nonce, when this is a new status.
        previous_status: Option<TransactionStatus>,
    },
    /// This (nonce, status) was already acknowledged: answer 200, do not call the handler.
    Duplicate,
    /// Another delivery of this nonce is being processed right now.
    Busy,
}

/// What to do with a transaction validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidationBegin {
    /// Run the handler.
    Claimed {
        /// The claim to finish or release.
        claim: Claim,
    },
    /// The same payment was decided before: answer with this decision.
    Recorded(RecordedDecision),
    /// The nonce was used for a different payment: refuse.
    Mismatch,
    /// Another request with this nonce is being processed right now.
    Busy,
}

/// A storage failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend failed (I/O, sled, a lock held by another process): what the store was
    /// doing, with the failure beneath as the error's [`source`](std::error::Error::source).
    #[error("{context}")]
    Backend {
        /// What the store was doing, or what is wrong.
        context: String,
        /// The error beneath, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// An earlier write could not be made durable: the store refuses all further work until
    /// the service restarts (and the integrity check at open decides what it holds).
    #[error("an earlier write could not be made durable; restart the service")]
    Stopped,
    /// A tree that was not declared when the store was opened.
    #[error("tree `{name}` was not declared when the store was opened (declared: {declared:?})")]
    UnknownTree {
        /// The name asked for.
        name: String,
        /// The trees the store was opened with.
        declared: Vec<String>,
    },
    /// A record could not be read.
    #[error("corrupt record for `{key}`: {reason}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The handler's effects gave up ([`StoreError::abort`]) or panicked; nothing was
    /// written, and the callback is not acknowledged.
    #[error("effects aborted: {reason}")]
    Aborted {
        /// Why, in the effect's words.
        reason: String,
    },
    /// The claim was lost (taken over as stale); nothing was written.
    #[error("claim on `{0}` was lost")]
    ClaimLost(String),
    /// A postponed validation's id is held for another nonce (the aggregator never reuses
    /// one: one of the two is not the aggregator's); nothing of the validation was written.
    #[error("validation id {0} is held for another nonce; nothing was written")]
    ValidationIdTaken(i64),
    /// The store cannot prove it holds everything it acknowledged; it refuses to open.
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
    /// What was asked needs another backend (SQL effects on sled).
    #[error("{0}")]
    Unsupported(String),
}

impl StoreError {
    /// An effect that finds it cannot apply gives up with this: nothing of the callback's
    /// effects is written, and it is not acknowledged (the aggregator retries it).
    ///
    /// ```
    /// use payhook::store::StoreError;
    ///
    /// let error = StoreError::abort("insufficient funds");
    /// assert_eq!(error.to_string(), "effects aborted: insufficient funds");
    /// ```
    pub fn abort(reason: impl Into<String>) -> Self {
        Self::Aborted {
            reason: reason.into(),
        }
    }

    /// A backend failure: `context` says what the store was doing, `source` what failed.
    pub(crate) fn backend(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            context: context.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// A backend failure with nothing beneath it.
    pub(crate) fn backend_message(context: impl Into<String>) -> Self {
        Self::Backend {
            context: context.into(),
            source: None,
        }
    }

    /// A repeat under a new validation id whose nonce's record a sweep took since the
    /// caller read it ([`PostponedStore::repeat`]): nothing is recorded, and the caller is
    /// not answered on a decision no record holds any more.
    pub(crate) fn purged_as_asked_again() -> Self {
        Self::backend_message(
            "the nonce's validation record was purged as it was asked about again; \
             asked again, it is validated afresh",
        )
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        Self::backend("PostgreSQL failed", error)
    }
}

impl From<sled::Error> for StoreError {
    fn from(error: sled::Error) -> Self {
        Self::backend("sled failed", error)
    }
}

/// The future of a store operation: every operation of the seam is asynchronous, so that a
/// backend over the network (PostgreSQL) and the embedded one (sled) serve behind one trait.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The future of a write that resolves once the write is durable.
pub type DurableFuture<'a> = StoreFuture<'a, ()>;

/// The future of a resolve: what it did, once durable.
pub type ResolveFuture<'a> = StoreFuture<'a, Resolution>;

/// A future already resolved: how a backend whose operation finished synchronously (a sled
/// read) answers through the seam.
pub(crate) fn ready<'a, T: Send + 'a>(outcome: Result<T, StoreError>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(outcome))
}

/// A page of a listing: the first `limit` of `listed` (read with one more than a page, in
/// the listing's order), and — when `listed` held more — where the next page starts,
/// `cursor` of this page's last.
pub(crate) fn first_page<T, C>(
    mut listed: Vec<T>,
    limit: usize,
    cursor: impl FnOnce(&T) -> C,
) -> (Vec<T>, Option<C>) {
    let more = listed.len() > limit;
    listed.truncate(limit);
    let next = listed.last().filter(|_| more).map(cursor);
    (listed, next)
}

/// Postponed validations one pass of the outbox takes at most, of those whose delivery, or of
/// those whose deadline, is due: an aggregator down for hours can leave many thousands, and a
/// pass posts a few at a time; the rest are the next pass's, at once.
pub(crate) const DUE_BATCH: usize = 256;

/// Postponed validations due for some work, and when the next one falls due.
#[derive(Debug, Clone, Default)]
pub struct Due {
    /// Due now.
    pub now: Vec<PostponedValidation>,
    /// When the next of the others falls due (UTC).
    pub next: Option<DateTime<Utc>>,
}

/// The results awaiting delivery, as `/metrics` reports them on every scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxSummary {
    /// How many there are.
    pub queued: usize,
    /// When the oldest of them was decided (UTC); `None` when there are none.
    pub oldest_decided: Option<DateTime<Utc>>,
}

impl OutboxSummary {
    /// The summary of `queued`, results awaiting delivery.
    pub fn of(queued: &[PostponedValidation]) -> Self {
        Self {
            queued: queued.len(),
            oldest_decided: queued
                .iter()
                .filter_map(|v| v.result.as_ref().map(|r| r.decided))
                .min(),
        }
    }
}

/// How long a postponed record that cannot be decoded is left out of what is due before it
/// is read again (and logged again): it would otherwise be met, and logged at error level, on
/// every pass of the outbox.
pub(crate) const UNREADABLE_LEFT_FOR: Duration = Duration::from_secs(3600);

/// A postponed validation read for the outbox or its deadline, or `None` when its record
/// cannot be decoded: logged at error level and left out, so that one damaged record does
/// not keep every other result from the aggregator (an error would fail each pass before any
/// post). Any other error is the store's and stands.
pub(crate) fn unless_unreadable(
    read: Result<PostponedValidation, StoreError>,
) -> Result<Option<PostponedValidation>, StoreError> {
    match read {
        Ok(record) => Ok(Some(record)),
        Err(StoreError::Corrupt { key, reason }) => {
            tracing::error!(
                validation_id = %key,
                reason,
                "a postponed validation's record cannot be read: left out, and its result is not delivered until it is repaired"
            );
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// A postponed validation read as another's decision is written to it (a repeat, or the
/// original a repeat is decided through), or `None` when it is gone or its record cannot be
/// decoded (logged, as by [`unless_unreadable`]): one damaged repeat does not keep its
/// original and the other repeats from their decision, nor the outbox, which decides them
/// at their deadline, from every other result. Any other error is the store's and stands.
pub(crate) fn unless_gone_or_unreadable(
    read: Result<Option<PostponedValidation>, StoreError>,
) -> Result<Option<PostponedValidation>, StoreError> {
    read.transpose()
        .map(unless_unreadable)
        .transpose()
        .map(Option::flatten)
}

/// What a store that keeps no held results answers when asked for them.
fn keeps_no_held_results() -> StoreError {
    StoreError::Unsupported("this store keeps no held results".into())
}

/// Deduplication: what was done per nonce, the claims of deliveries in progress, and the
/// merchant's effects committed with the mark. `finish_*` must be atomic with what it
/// writes, and resolve only once the write is durable.
pub trait DedupStore: Send + Sync + 'static {
    /// Starts processing a callback delivery of `nonce` with `status`. A status already
    /// booked durably is a duplicate, whatever else of the nonce is being booked. A claim
    /// older than `stale_after` (by the backend's clock: the database's for a shared store)
    /// is taken over; a younger one answers [`CallbackBegin::Busy`].
    fn begin_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> StoreFuture<'a, CallbackBegin>;

    /// Marks the callback done and applies `effects` ([`Effects::apply`]), in one atomic
    /// write; resolves once it is durable. The claim ends either way. A store that finds the
    /// status done already (a delivery whose claim this one took over booked it) drops the
    /// effects unrun and resolves: payhook then answers the delivery as a duplicate
    /// ([`Effects::ran`]).
    ///
    /// Resolves to [`StoreError::Aborted`] when an effect aborts and
    /// [`StoreError::ClaimLost`] when the claim was taken over; nothing is written then.
    fn finish_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
        status: TransactionStatus,
        effects: Effects,
    ) -> DurableFuture<'a>;

    /// Gives the claim up (the handler failed or asked for a retry).
    fn release_callback<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()>;

    /// Gives the claim up before any handler ran (a reconcile whose lookup another status
    /// overtook): unlike [`DedupStore::release_callback`], the claim does not count as a delivery
    /// that reached the handler, and the next one's attempt number is what it would have
    /// been without it. By default, [`DedupStore::release_callback`].
    fn give_back_callback<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()> {
        self.release_callback(nonce, claim)
    }

    /// Counts a failed delivery of (nonce, status) for operators; forgotten once that status
    /// is booked, or with the retention. A backend may write it without waiting.
    fn record_callback_failure(&self, failure: CallbackFailure) -> StoreFuture<'_, ()>;

    /// Removes the failure record of (`nonce`, `status`) if that status is booked: for a
    /// failure recorded beside a booking of the pair in progress — by a delivery that gave
    /// up waiting for it — which could not see that booking's mark before its commit. The
    /// default does nothing: right for a store that writes failures and bookings in one
    /// order (sled), where a booking removes every failure recorded before it.
    fn forget_failure_if_booked<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, ()> {
        let _ = (nonce, status);
        Box::pin(async { Ok(()) })
    }

    /// Counts a delivery of (nonce, status) refused for its body, before any claim: like
    /// [`DedupStore::record_callback_failure`], but where another instance may be booking
    /// the pair at this moment (a reconcile, a corrected delivery), after that booking ends,
    /// so that a failure is never recorded beside a booking that then commits. The default
    /// records it at once: right for a store whose writes are serialised (sled).
    fn record_refused_callback(&self, failure: CallbackFailure) -> StoreFuture<'_, ()> {
        self.record_callback_failure(failure)
    }

    /// The (nonce, status) pairs whose handler failed, or whose body was refused, and that
    /// are not booked yet, most recent failure first.
    fn failing_callbacks(&self) -> StoreFuture<'_, Vec<FailingCallback>>;

    /// At most `limit` pairs of [`DedupStore::failing_callbacks`], in its order, after
    /// `after` (from the first without it), and where the next page starts: how the
    /// operating API lists them while an incident may leave hundreds of thousands, each
    /// page read through an index by time where the backend keeps one, without the pages
    /// before it. The default lists them all and keeps the page.
    fn failing_page(
        &self,
        after: Option<FailingCursor>,
        limit: usize,
    ) -> StoreFuture<'_, FailingPage> {
        Box::pin(async move {
            let listed = self.failing_callbacks().await?;
            let after_cursor = listed
                .into_iter()
                .filter(|pair| after.as_ref().is_none_or(|cursor| cursor.precedes(pair)))
                .take(limit.saturating_add(1))
                .collect();
            Ok(FailingPage::of(after_cursor, limit))
        })
    }

    /// The `limit` (nonce, status) pairs of [`DedupStore::failing_callbacks`] that failed
    /// last, most recent first: what the inspector's panel reads every second. The first
    /// of [`DedupStore::failing_page`].
    fn failing_latest(&self, limit: usize) -> StoreFuture<'_, Vec<FailingCallback>> {
        Box::pin(async move { Ok(self.failing_page(None, limit).await?.failing) })
    }

    /// How many (nonce, status) pairs [`DedupStore::failing_callbacks`] would list: what
    /// `/metrics` reports on every scrape, counted without building each one (an incident
    /// can leave thousands for the retention period). The default lists them.
    fn failing_count(&self) -> StoreFuture<'_, usize> {
        Box::pin(async move { Ok(self.failing_callbacks().await?.len()) })
    }

    /// Whether (`nonce`, `status`) was acknowledged (read-only: claims nothing).
    fn callback_acknowledged<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, bool>;

    /// The result of (`nonce`, `status`) that the merchant's effects held instead of
    /// booking ([`Booking::Held`]), waiting for a person or resolved by one
    /// ([`HeldCallback::resolved_at`]). A store that keeps held results writes one in
    /// [`DedupStore::finish_callback`]'s atomic write whenever [`Effects::held`] says so
    /// after the effects ran (the first one of a pair stands), and keeps it, resolved or
    /// not. The default keeps none.
    fn held_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, Option<HeldCallback>> {
        let _ = (nonce, status);
        Box::pin(async { Ok(None) })
    }

    /// The `limit` unresolved held results ([`DedupStore::held_callback`]) held last,
    /// latest first.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] by default: a store that keeps no held results (an empty
    /// list would say none waits).
    fn held_callbacks(&self, limit: usize) -> StoreFuture<'_, Vec<HeldCallback>> {
        let _ = limit;
        Box::pin(async { Err(keeps_no_held_results()) })
    }

    /// How many held results ([`DedupStore::held_callback`]) are unresolved: what `/metrics`
    /// reports on every scrape.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] by default (`/metrics` then leaves the gauge out, rather
    /// than say 0).
    fn held_count(&self) -> StoreFuture<'_, usize> {
        Box::pin(async { Err(keeps_no_held_results()) })
    }

    /// Says, durably, that a person resolved the held result of (`nonce`, `status`) in the
    /// merchant's books, with `resolution` (their note) and `by` (their name, when they
    /// said): it is kept resolved, no longer listed by [`DedupStore::held_callbacks`] nor
    /// counted. Resolves to the result as it is kept now, or `None` when none waits (not
    /// held, or resolved already).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] by default: a store that keeps no held results.
    fn resolve_held<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
        resolution: &'a str,
        by: Option<&'a str>,
    ) -> StoreFuture<'a, Option<HeldCallback>> {
        let _ = (nonce, status, resolution, by);
        Box::pin(async { Err(keeps_no_held_results()) })
    }

    /// Starts processing a transaction validation; like [`DedupStore::begin_callback`].
    fn begin_validation<'a>(
        &'a self,
        nonce: &'a Nonce,
        fingerprint: &'a Fingerprint,
        stale_after: Duration,
    ) -> StoreFuture<'a, ValidationBegin>;

    /// Records the decision, and with it `postponed` (Awaitable mode: a pending validation,
    /// or one whose result is queued for delivery) in the same atomic write; resolves once
    /// it is durable. The claim ends either way.
    fn finish_validation<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
        fingerprint: &'a Fingerprint,
        decision: &'a RecordedDecision,
        postponed: Option<PostponedValidation>,
    ) -> DurableFuture<'a>;

    /// Gives a validation claim up.
    fn release_validation<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()>;

    /// The payment the transaction validation of `nonce` was asked about and what was
    /// decided, as recorded ([`DedupStore::finish_validation`]) — in Awaitable mode with the
    /// decision taken later, while the postponed validation is kept; `None` when no
    /// validation of `nonce` is recorded (none was asked here, or it was purged with the
    /// retention). What a callback handler reads through
    /// [`CallbackContext::validated_payment`](crate::handler::CallbackContext::validated_payment).
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when the validation's record, or its postponed validation's,
    /// does not decode (a decision not known is not a decision to book on);
    /// [`StoreError::Unsupported`] by default: a store that cannot read its validations
    /// back (`None` would say none was made).
    fn validated_payment<'a>(
        &'a self,
        nonce: &'a Nonce,
    ) -> StoreFuture<'a, Option<ValidatedPayment>> {
        let _ = nonce;
        Box::pin(async {
            Err(StoreError::Unsupported(
                "this store does not read its validations back".into(),
            ))
        })
    }

    /// [`DedupStore::validated_payment`], read by the delivery that holds `claim` on a
    /// callback of `nonce` ([`DedupStore::begin_callback`]), while it holds it: what
    /// [`CallbackContext::validated_payment`](crate::handler::CallbackContext::validated_payment)
    /// calls. A store whose claim holds a connection reads through it — PostgreSQL does,
    /// in the claim's transaction, so that a callback in flight needs no connection beyond
    /// its claim's. The default reads as [`DedupStore::validated_payment`] does.
    ///
    /// # Errors
    ///
    /// Those of [`DedupStore::validated_payment`]; and [`StoreError::ClaimLost`] when the
    /// claim was given up (its booking would not commit either).
    fn validated_payment_in_claim<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
    ) -> StoreFuture<'a, Option<ValidatedPayment>> {
        let _ = claim;
        self.validated_payment(nonce)
    }
}

/// The validations of `all` in `state`: how a backend without an index of `state` lists it.
pub(crate) fn in_state(
    mut all: Vec<PostponedValidation>,
    state: PostponedState,
) -> Vec<PostponedValidation> {
    all.retain(|v| v.state() == state);
    all
}

/// The Awaitable mode's state: postponed validations, their decisions, and the outbox of
/// results to post to the aggregator.
pub trait PostponedStore: Send + Sync + 'static {
    /// Decides postponed validation `validation_id` and queues the result for delivery, in
    /// one atomic write; the first decision wins (see [`Resolution`]). `by`: who decided,
    /// kept with the decision ([`ValidationResult::decided_by`](crate::postponed::ValidationResult::decided_by),
    /// already cut to 128 bytes); the same decision by another is unchanged, not a
    /// conflict. Resolves once durable.
    fn resolve<'a>(
        &'a self,
        validation_id: ValidationId,
        decision: &'a Decision,
        by: Option<&'a str>,
        now: DateTime<Utc>,
    ) -> ResolveFuture<'a>;

    /// Records `request`, a repeat of a recorded validation (same nonce, same payment) that
    /// arrived under a new validation id, as a repeat of the postponed validation that holds
    /// its nonce's decision, in one atomic write; resolves once durable. The new id then
    /// gets that decision — queued for delivery now if it was taken, or when it is — so
    /// that the aggregator, which waits for a result per validation id, gets one for each.
    /// A resolve of either id decides both. When no postponed validation holds the nonce's
    /// decision and that is an approval, the id is recorded as an approved validation of
    /// its own, its result queued ([`Repeat::RecordedAfresh`]). See [`Repeat`] for what it
    /// did: an id already held is [`Repeat::Known`] when it is this nonce's,
    /// [`Repeat::Taken`] when another nonce's, and nothing is written.
    fn repeat<'a>(
        &'a self,
        request: &'a TransactionValidationRequest,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Repeat>;

    /// Records the outcome of a delivery attempt; a delivered or refused result stays so.
    /// Ends this instance's lease on the result (see [`PostponedStore::outbox_due`]).
    fn record_delivery(&self, validation_id: ValidationId, delivery: Delivery)
    -> DurableFuture<'_>;

    /// Makes the next delivery attempt of `validation_id`'s result due at `now`, queueing it
    /// again when the aggregator refused it as conflicting (403): an operator's decision.
    /// `true` when it was queued or refused (an undecided or delivered one is left as it
    /// is). Resolves once durable.
    fn make_due(&self, validation_id: ValidationId, now: DateTime<Utc>) -> StoreFuture<'_, bool>;

    /// One postponed validation.
    fn postponed(
        &self,
        validation_id: ValidationId,
    ) -> StoreFuture<'_, Option<PostponedValidation>>;

    /// Every postponed validation held, by id.
    fn postponed_all(&self) -> StoreFuture<'_, Vec<PostponedValidation>>;

    /// The postponed validations in `state`, by id.
    ///
    /// What waits — for a decision ([`PostponedState::Pending`]) or for delivery
    /// ([`PostponedState::Queued`]) — is a few records among the retention period's many
    /// (30 days of them by default), and it is read often: by a review loop like the example
    /// merchant's. sled and PostgreSQL read those two states from their indexes, so the cost
    /// follows what waits, not what is kept. The default
    /// reads every record and keeps those in `state`: a backend should do better.
    fn postponed_in(&self, state: PostponedState) -> StoreFuture<'_, Vec<PostponedValidation>> {
        Box::pin(async move { Ok(in_state(self.postponed_all().await?, state)) })
    }

    /// At most `limit` postponed validations (0 is taken as 1) in `state` (in any when
    /// `None`) whose id follows `after` (from the lowest without it), by id, and where the
    /// next page starts:
    /// how the operating API and `payhook validations list` read a listing that may hold the
    /// whole retention period's records (30 days of them by default), a page at a time.
    ///
    /// sled and PostgreSQL read a page of what waits ([`PostponedState::Pending`],
    /// [`PostponedState::Queued`]) through its index, and of the rest from their records by
    /// id, starting at `after` and stopping once the page is full (a page of a rare state,
    /// such as [`PostponedState::Conflict`], passes over the records of other states between
    /// its own). The default reads every record and keeps the page: a backend should do
    /// better.
    fn postponed_page(
        &self,
        state: Option<PostponedState>,
        after: Option<ValidationId>,
        limit: usize,
    ) -> StoreFuture<'_, PostponedPage> {
        Box::pin(async move {
            let limit = limit.max(1);
            let listed = match state {
                Some(state) => self.postponed_in(state).await?,
                None => self.postponed_all().await?,
            };
            let after_cursor = listed
                .into_iter()
                .filter(|v| after.is_none_or(|after| v.validation_id > after))
                .take(limit.saturating_add(1))
                .collect();
            Ok(PostponedPage::of(after_cursor, limit))
        })
    }

    /// At most `limit` of the validations whose result was delivered or refused (final),
    /// those with the highest ids first: the latest ones, as the aggregator numbers them.
    ///
    /// For a view of recent outcomes, such as the inspector's outbox panel, which shows them
    /// every second. sled reads its records from the highest id down and stops at `limit`;
    /// PostgreSQL walks its primary key the same way. The default reads every record.
    fn postponed_settled(&self, limit: usize) -> StoreFuture<'_, Vec<PostponedValidation>> {
        Box::pin(async move {
            let mut all = self.postponed_all().await?;
            all.retain(PostponedValidation::is_final);
            all.reverse();
            all.truncate(limit);
            Ok(all)
        })
    }

    /// Results whose next delivery attempt is due at `now`, for this instance to post. Only
    /// durable ones: what is returned is posted to the aggregator, so it must survive a power
    /// failure. A shared backend leases what it returns to this instance, so that one
    /// instance at a time posts a result; a lease not ended by
    /// [`PostponedStore::record_delivery`] (the instance died mid-post) runs out and another
    /// instance takes the result over.
    fn outbox_due(&self, now: DateTime<Utc>) -> StoreFuture<'_, Due>;

    /// Of `ids`, results [`PostponedStore::outbox_due`] leased to this instance, those it
    /// still holds, each held for a whole lease again: what the outbox asks before each few
    /// posts of a pass, so that a long pass (a slow aggregator, hundreds of results) never
    /// posts a result whose lease ran out and another instance took over. The default, for a
    /// store one process writes (no leases), holds them all.
    fn renew_outbox_leases<'a>(
        &'a self,
        ids: &'a [ValidationId],
    ) -> StoreFuture<'a, Vec<ValidationId>> {
        Box::pin(std::future::ready(Ok(ids.to_vec())))
    }

    /// How many results await delivery — a count for monitoring, read without waiting for
    /// writes in progress (it may miss or include a result being written).
    fn outbox_len(&self) -> StoreFuture<'_, usize>;

    /// How many results await delivery and when the oldest of them was decided: what
    /// `/metrics` reads on every scrape, read without waiting for writes in progress, like
    /// [`PostponedStore::outbox_len`]. sled reads both from its outbox index without reading
    /// a record; PostgreSQL counts them and reads each one's decision in one statement,
    /// sending no record; the default reads and sends the records awaiting delivery, which
    /// an aggregator that is down for long makes many: another backend should answer it
    /// from an index.
    fn outbox_summary(&self) -> StoreFuture<'_, OutboxSummary> {
        Box::pin(async move {
            let queued = self.postponed_in(PostponedState::Queued).await?;
            Ok(OutboxSummary::of(&queued))
        })
    }

    /// Undecided validations whose deadline passed at `now`.
    fn deadlines_due(&self, now: DateTime<Utc>) -> StoreFuture<'_, Due>;
}

/// A whole store: deduplication and the Awaitable state, with their retention. Implement
/// [`DedupStore`] and [`PostponedStore`] and this for another backend; [`SledStore`] is the
/// embedded default.
pub trait Store: DedupStore + PostponedStore {
    /// Removes records that expired at or before `now`, in bounded steps.
    fn purge_expired(&self, now: DateTime<Utc>) -> StoreFuture<'_, usize>;

    /// How long a record is kept after its last write: a repeat of an older nonce is no
    /// longer recognised.
    fn retention(&self) -> Duration;

    /// How far back from now the store's records reach: what a missing record proves by
    /// (a callback changed, or a transaction created, before that may have been booked and
    /// its record purged). The retention, unless it grew lately: records written before
    /// keep the expiry they were written with, and the reach grows back to the retention as
    /// they age out. [`SledStore`] and PostgreSQL keep what they were written with; the
    /// default is [`Store::retention`], right for a store whose retention never changes.
    fn reach(&self) -> Duration {
        self.retention()
    }

    /// `true` once the store has failed for good — a write could not be made durable — and
    /// refuses all further work until the service restarts. `/readyz` answers 503 then, so
    /// that an orchestrator replaces the instance. A backend that cannot fail this way keeps
    /// the default, `false`.
    fn failed(&self) -> bool {
        false
    }

    /// The store's commit time and batch size, for `/metrics`; `None` (the default) when
    /// the backend does not measure them.
    fn commit_metrics(&self) -> Option<CommitMetrics> {
        None
    }

    /// `true` when the process that booked a callback may answer retries of the same signed
    /// bytes from memory, without reading the store, until the booking's retention ends: the
    /// process is the store's only writer, the record of a booked (nonce, status) stays for
    /// the whole retention counted on the process's own clock, and the store stops serving
    /// ([`Store::failed`]) — or refuses to open — rather than go on without something it
    /// acknowledged. [`SledStore`] is such a store. The default, `false`, has every retry
    /// read the store: right for a shared database, which another instance, a failover or an
    /// operator can change underneath a process.
    fn process_may_remember_bookings(&self) -> bool {
        false
    }

    /// `true` when every claim of the store was taken by a delivery of this process and is
    /// held in its memory only, so that it dies with the process: the server then never
    /// takes a claim over as stale. Its delivery is alive however long its handler blocks a
    /// thread past `server.handler_timeout` (a timed-out handler is aborted at its next
    /// await, not before), and a delivery ends its claim however it ends; a takeover could
    /// only run a second handler beside the first. [`SledStore`] is such a store. The
    /// default, `false`, suits a shared database, where a claim may be held by an instance
    /// that hangs.
    fn claims_end_with_this_process(&self) -> bool {
        false
    }

    /// Keeps that the operating API's session `session` (its login time and random id, as
    /// its cookie names them; no secret) was ended by logging out, until `until`, when its
    /// life would have ended anyway: every instance on the store refuses it from then on,
    /// and so does this one after a restart. Resolves once durable. The default keeps
    /// nothing: the instance that ended it refuses it until it restarts.
    fn end_session<'a>(&'a self, session: &'a str, until: DateTime<Utc>) -> DurableFuture<'a> {
        let _ = (session, until);
        ready(Ok(()))
    }

    /// Whether `session` was ended and is kept so ([`Store::end_session`]).
    fn session_ended<'a>(&'a self, session: &'a str) -> StoreFuture<'a, bool> {
        let _ = session;
        ready(Ok(false))
    }
}

pub(crate) use crate::model::timestamp::{epoch_ms, ms_from_time, now_ms, time_from_ms};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_convert_to_and_from_milliseconds_without_panicking() {
        let t = time_from_ms(1_700_000_000_123);
        assert_eq!(t.timestamp_millis(), 1_700_000_000_123);
        assert_eq!(ms_from_time(t), 1_700_000_000_123);
        assert_eq!(time_from_ms(0), DateTime::<Utc>::UNIX_EPOCH);
        assert_eq!(time_from_ms(u64::MAX), DateTime::<Utc>::MAX_UTC);
        assert_eq!(time_from_ms(i64::MAX as u64), DateTime::<Utc>::MAX_UTC);
        assert_eq!(ms_from_time(DateTime::<Utc>::MIN_UTC), 0);
        // The latest time there is reads back to its millisecond.
        let max = ms_from_time(DateTime::<Utc>::MAX_UTC);
        assert_eq!(time_from_ms(max).timestamp_millis(), max as i64);
        assert_eq!(ms_from_time(time_from_ms(max)), max);
    }
}
