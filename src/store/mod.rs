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
//! concurrent requests are applied together by whichever request leads, and made durable by
//! one flush (group commit, see `committer.rs`); the answer (200) is sent only after that
//! flush. A crash
//! before the flush loses the claim, the mark and the effects together, so the aggregator's
//! next attempt runs the handler again: **at-least-once until acknowledged, never again
//! after**.
//!
//! ## Life cycle of a validation record (key: nonce)
//!
//! `InFlight` → `Done { decision }` the same way. A repeat with the same payment data
//! (amount, currency, client, provider, direction) gets the recorded decision; with different
//! data it is refused ([`ValidationBegin::Mismatch`]).
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
//! older than the retention (default 30 days), so the store stays bounded.
//!
//! [`Store`] is the seam for other backends; [`SledStore`] is the embedded default.

mod claims;
mod committer;
mod effects;
mod failing;
mod keys;
mod postponed;
mod record;
mod sled_store;
mod watermark;

use std::{future::Future, pin::Pin, time::Duration};

use crate::model::TransactionStatus;

pub use effects::{EffectError, EffectTx, Effects};
pub use failing::{CallbackFailure, FailingCallback};
pub use postponed::{Delivery, PostponedState, PostponedValidation, Resolution, ValidationResult};
pub use record::{Fingerprint, RecordedDecision};
pub(crate) use sled_store::open_locked;
pub use sled_store::{CommitHold, HoldPoint, KeyValue, SledStore};
pub use watermark::{IntegrityError, IntegrityReport, Seal};

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
pub enum StoreError {
    /// The backend failed (I/O, corruption).
    #[error("storage: {0}")]
    Backend(String),
    /// A record could not be read.
    #[error("corrupt record for `{key}`: {reason}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The handler's effects refused to apply; nothing was written.
    #[error("effects aborted: {0}")]
    Effects(#[from] EffectError),
    /// The claim was lost (taken over as stale); nothing was written.
    #[error("claim on `{0}` was lost")]
    ClaimLost(String),
    /// The store cannot prove it holds everything it acknowledged; it refuses to open.
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
}

impl From<sled::Error> for StoreError {
    fn from(error: sled::Error) -> Self {
        Self::Backend(error.to_string())
    }
}

/// The future of a write that resolves once the write is durable.
pub type DurableFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// The future of a resolve: what it did, once durable.
pub type ResolveFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Resolution, StoreError>> + Send + 'a>>;

/// Postponed validations due for some work, and when the next one falls due.
#[derive(Debug, Clone, Default)]
pub struct Due {
    /// Due now.
    pub now: Vec<PostponedValidation>,
    /// When the next of the others falls due, ms since the Unix epoch.
    pub next_ms: Option<u64>,
}

/// Durable deduplication records. `finish_*` must be atomic with the effects, and resolve
/// only once the write is durable.
pub trait Store: Send + Sync + 'static {
    /// Starts processing a callback delivery of `nonce` with `status`. An in-flight claim
    /// older than `stale_after` is taken over.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn begin_callback(
        &self,
        nonce: &str,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> Result<CallbackBegin, StoreError>;

    /// Marks the callback done and applies `effects`, in one atomic write; resolves once it
    /// is durable. The claim ends either way.
    ///
    /// Resolves to [`StoreError::Effects`] when an effect aborts and
    /// [`StoreError::ClaimLost`] when the claim was taken over; nothing is written then.
    fn finish_callback(
        &self,
        nonce: &str,
        claim: Claim,
        status: TransactionStatus,
        effects: Effects,
    ) -> DurableFuture<'_>;

    /// Gives the claim up (the handler failed or asked for a retry).
    fn release_callback(&self, nonce: &str, claim: Claim);

    /// Counts a failed delivery of (nonce, status) for operators, durably but without
    /// waiting; forgotten once that status is booked, or with the retention.
    fn record_callback_failure(&self, failure: CallbackFailure);

    /// The (nonce, status) pairs whose handler failed and that are not booked yet, most
    /// recent failure first.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn failing_callbacks(&self) -> Result<Vec<FailingCallback>, StoreError>;

    /// Whether (`nonce`, `status`) was acknowledged (read-only: claims nothing).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn callback_acknowledged(
        &self,
        nonce: &str,
        status: TransactionStatus,
    ) -> Result<bool, StoreError>;

    /// Starts processing a transaction validation.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn begin_validation(
        &self,
        nonce: &str,
        fingerprint: &Fingerprint,
        stale_after: Duration,
    ) -> Result<ValidationBegin, StoreError>;

    /// Records the decision, and with it `postponed` (Awaitable mode: a pending validation,
    /// or one whose result is queued for delivery) in the same atomic write; resolves once
    /// it is durable. The claim ends either way.
    fn finish_validation(
        &self,
        nonce: &str,
        claim: Claim,
        fingerprint: &Fingerprint,
        decision: &RecordedDecision,
        postponed: Option<PostponedValidation>,
    ) -> DurableFuture<'_>;

    /// Gives a validation claim up.
    fn release_validation(&self, nonce: &str, claim: Claim);

    /// Decides postponed validation `validation_id` and queues the result for delivery, in
    /// one atomic write; the first decision wins (see [`Resolution`]). Resolves once durable.
    fn resolve(
        &self,
        validation_id: i64,
        success: bool,
        description: &str,
        now_ms: u64,
    ) -> ResolveFuture<'_>;

    /// Records the outcome of a delivery attempt; a delivered or refused result stays so.
    fn record_delivery(&self, validation_id: i64, delivery: Delivery) -> DurableFuture<'_>;

    /// One postponed validation.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn postponed(&self, validation_id: i64) -> Result<Option<PostponedValidation>, StoreError>;

    /// Every postponed validation held, by id.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn postponed_all(&self) -> Result<Vec<PostponedValidation>, StoreError>;

    /// Results whose next delivery attempt is due at `now_ms`. Only durable ones: what is
    /// returned is posted to the aggregator, so it must survive a power failure.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn outbox_due(&self, now_ms: u64) -> Result<Due, StoreError>;

    /// How many results await delivery — a count for monitoring, read without waiting for
    /// writes in progress (it may miss or include a result being written).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn outbox_len(&self) -> Result<usize, StoreError>;

    /// Undecided validations whose deadline passed at `now_ms`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn deadlines_due(&self, now_ms: u64) -> Result<Due, StoreError>;

    /// Removes records that expired at or before `now_ms` (milliseconds since the Unix epoch).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the backend fails.
    fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError>;

    /// How long a record is kept after its last write: a repeat of an older nonce is no
    /// longer recognised.
    fn retention(&self) -> Duration;

    /// `true` once the store has failed for good — a write could not be made durable — and
    /// refuses all further work until the service restarts. `/readyz` answers 503 then, so
    /// that an orchestrator replaces the instance. A backend that cannot fail this way keeps
    /// the default, `false`.
    fn failed(&self) -> bool {
        false
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or_default()
}
