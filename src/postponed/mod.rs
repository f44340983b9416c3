//! Awaitable (postponed) transaction validation: decide later, deliver the result for sure.
//!
//! With `validation.awaitable = true` (matching the aggregator's setting for the endpoint), a
//! [`TransactionValidator`](crate::handler::TransactionValidator) may answer
//! [`Postpone`](crate::handler::ValidationDecision::Postpone): payhook answers 200, keeps the
//! validation durably, and the merchant decides later from anywhere in its application with
//! a [`Resolver`] — or from the command line. Every decision in Awaitable mode (a resolve, a
//! passed deadline, and also an `Allow`/`Deny` returned at once) is posted to
//! `{gateway_url}/api/v1/transactions/validation` by the [`Outbox`] worker:
//!
//! * **first decision wins, locally**: a second, different decision is refused with
//!   [`ResolveError::Conflict`] before anything is sent; the same decision again is a no-op;
//! * **a result for every validation id**: a repeat of a validated nonce (same payment) is
//!   answered with the recorded decision, without the handler; under a new `validationId`
//!   it is also kept as a repeat of the validation the handler saw
//!   ([`PostponedValidation::repeat_of`]), which gets that decision posted under its own
//!   id, at once or when it is taken. A resolve of either decides both. A repeat beyond
//!   the 100 new ids one validation takes is refused with 409 unless denied: nothing
//!   would post its result;
//! * **an authenticated caller**: the endpoint's decisions are posted to the aggregator
//!   under the merchant's login, so `[auth.transaction_validation]` must name a method or
//!   `allow_ips`; an open endpoint is refused at start-up unless
//!   `validation.allow_unauthenticated = true` says it is open deliberately;
//! * **time budget**: a handler still deciding after `validation.time_budget` is answered 200
//!   (postponed) by payhook, and its decision, when it comes, is posted as the result;
//! * **deadline**: an undecided validation older than `validation.deadline` is resolved with
//!   `validation.deadline_outcome`, by the worker's next pass or by a decision asked for
//!   after the deadline (which then comes too late: a conflict) — but not while its
//!   handler, run on after its budget, has decided in time and this process is still
//!   recording that decision (a slow or failing store): the handler's decision is the one
//!   kept, and a decision asked for meanwhile waits for it;
//! * **durable outbox**: a decision and its outbox entry are one atomic, durable write; the
//!   worker posts with exponential backoff and jitter (`validation.retry_schedule`) until a
//!   200 (another 2xx is no delivery). A 401 renews the session (see [`crate::gateway`]);
//!   network errors, timeouts, 5xx and any other refusal are retried; a 429 or a 503 with
//!   `Retry-After` holds back every post of the worker until the wait is over (at most
//!   [`crate::gateway::MAX_RETRY_AFTER`]); the aggregator's 403 ("a different result was
//!   already received", with its `{"message": …}` body; one without it is retried) is final:
//!   recorded as a conflict, logged at error, visible in [`PostponedState::Conflict`]. No
//!   recorded decision is lost across restarts or crashes: the worker starts with whatever
//!   the outbox holds. A decision a handler is still making after its time budget is in
//!   memory until it is recorded: a crash before then loses it, and the validation, answered
//!   "postponed", waits for a decision (a resolve, or `validation.deadline`: set one to bound
//!   that wait).
//!
//! ```no_run
//! # async fn review(app: payhook::App) -> Result<(), payhook::postponed::ResolveError> {
//! use payhook::postponed::Decision;
//!
//! let resolver = app.resolver().expect("validation.awaitable = true");
//! resolver.resolve(42, Decision::allow("documents checked")).await?;
//! // The same decision again is a no-op; the other one is refused.
//! assert!(resolver.resolve(42, Decision::deny("changed my mind")).await.is_err());
//! # Ok(()) }
//! ```

mod clock;
mod decisions;
mod outbox;
pub(crate) mod record;
mod settings;

use crate::model::ValidationId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

use crate::store::{OutboxSummary, PostponedStore, StoreError};

pub use clock::Clock;
pub(crate) use decisions::{Awaitable, Decided, HandlerTask, Undecided, ValidationHandler};
pub use outbox::{Outbox, OutboxCounts, Pass};
pub use record::{
    Decision, Delivery, PostponedPage, PostponedState, PostponedValidation, Repeat, Resolution,
    ValidationResult,
};
pub use settings::{DeadlineOutcome, ValidationConfig};

/// Why a decision was not recorded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No postponed validation has this id.
    #[error("no postponed validation with id {0}")]
    Unknown(ValidationId),
    /// A different decision was recorded first; nothing was changed or sent.
    #[error(
        "validation {validation_id} was already decided differently (success = {recorded_success}: {recorded_description:?})"
    )]
    Conflict {
        /// The validation.
        validation_id: ValidationId,
        /// The decision recorded first.
        recorded_success: bool,
        /// Its description.
        recorded_description: String,
    },
    /// The store failed; the decision may not have been recorded — resolve again.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a successful resolve did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// Recorded now; the result is in the outbox.
    Recorded,
    /// The same decision was recorded before; nothing changed.
    Unchanged,
}

/// Decides postponed validations. Cheap to clone; use it from any task of the application.
#[derive(Clone)]
pub struct Resolver {
    store: Arc<dyn PostponedStore>,
    clock: Clock,
    /// Wakes the outbox worker when a result is queued.
    wake: Arc<Notify>,
    /// Validations whose record is being written.
    recording: Arc<Recording>,
    /// Validations whose handler, run on after its time budget, decides them: its decision
    /// is given in time, and a deadline passed before it is recorded must not take its place.
    deciding: Arc<Recording>,
    /// What a validation whose deadline passed undecided is resolved as
    /// (`validation.deadline_outcome`), when the resolver knows: a decision arriving after
    /// the deadline then comes too late.
    deadline_decision: Option<Decision>,
}

/// How long a resolve waits for the record of a validation still being written, or for the
/// decision of its handler.
const RECORDING_WAIT: Duration = Duration::from_secs(60);

/// What applying a passed deadline does where the validation's handler still decides it.
#[derive(Clone, Copy)]
enum WhileItsHandlerDecides {
    /// Leaves the validation undecided: the outbox's passes, which come again.
    Skip,
    /// Waits for the handler's decision (at most [`RECORDING_WAIT`]) before the deadline's
    /// outcome is tried: a decision asked for now comes after both.
    Wait,
}

/// Validation ids marked while something is under way for them — their record being
/// written ([`Resolver::recording`]), or their handler deciding after its time budget
/// ([`Resolver::deciding`]) — each with what wakes a resolve waiting for it.
#[derive(Default)]
struct Recording(Mutex<HashMap<ValidationId, Arc<Notify>>>);

impl Recording {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ValidationId, Arc<Notify>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks `validation_id` until the guard is dropped.
    fn mark(self: &Arc<Self>, validation_id: ValidationId) -> RecordingGuard {
        self.map().entry(validation_id).or_default();
        RecordingGuard {
            recording: Arc::clone(self),
            validation_id,
        }
    }

    fn is_marked(&self, validation_id: ValidationId) -> bool {
        self.map().contains_key(&validation_id)
    }

    /// Waits (at most [`RECORDING_WAIT`]) until `validation_id` is no longer marked;
    /// `false` when it was not.
    async fn unmarked(&self, validation_id: ValidationId) -> bool {
        let Some(notify) = self.map().get(&validation_id).cloned() else {
            return false;
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Unmarked between the lookup and the registration: nothing to wait for.
        if self.is_marked(validation_id) {
            let _ = tokio::time::timeout(RECORDING_WAIT, notified).await;
        }
        true
    }
}

/// Marks a validation until dropped (see [`Resolver::recording`], [`Resolver::deciding`]).
pub(crate) struct RecordingGuard {
    recording: Arc<Recording>,
    validation_id: ValidationId,
}

impl Drop for RecordingGuard {
    fn drop(&mut self) {
        if let Some(notify) = self.recording.map().remove(&self.validation_id) {
            notify.notify_waiters();
        }
    }
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver").finish_non_exhaustive()
    }
}

impl Resolver {
    /// A resolver over `store`; `wake` is notified whenever a result is queued.
    pub fn new(store: Arc<dyn PostponedStore>, clock: Clock, wake: Arc<Notify>) -> Self {
        Self {
            store,
            clock,
            wake,
            recording: Arc::default(),
            deciding: Arc::default(),
            deadline_decision: None,
        }
    }

    /// This resolver with the outcome of `config`'s deadline
    /// (`validation.deadline_outcome`, `validation.deadline_description`): a validation
    /// whose deadline passed undecided is resolved with it before any decision asked of
    /// this resolver, which then comes too late. The outbox applies deadlines only at its
    /// passes: without this, a reviewer's decision taken after the deadline and before the
    /// next pass would be posted as if in time.
    #[must_use]
    pub fn with_deadline_of(mut self, config: &ValidationConfig) -> Self {
        self.deadline_decision = config.deadline.map(|_| {
            Decision::allow_if(
                config.deadline_outcome == DeadlineOutcome::Allow,
                config.deadline_description.clone(),
            )
        });
        self
    }

    /// Marks `validation_id` as being recorded until the guard is dropped: a merchant's task
    /// that decides it before its record is durable (the handler postponed and handed it to
    /// a fast reviewer) then waits for the record instead of being told the id is unknown.
    pub(crate) fn recording(&self, validation_id: ValidationId) -> RecordingGuard {
        self.recording.mark(validation_id)
    }

    /// Marks `validation_id` as decided by its handler, run on after its time budget, until
    /// the guard is dropped (once the decision is recorded, or refused for good). Its
    /// deadline is not applied meanwhile by this resolver or its clones — the outbox's
    /// passes skip it, and a decision asked for past the deadline waits for the handler's
    /// (a minute at most, then fails with [`ResolveError::Store`]) — so that a decision
    /// given within the handler timeout and recorded only after the deadline (a slow or
    /// failing store) is the handler's, not the deadline's outcome.
    pub(crate) fn deciding(&self, validation_id: ValidationId) -> RecordingGuard {
        self.deciding.mark(validation_id)
    }

    /// Whether `validation_id` is marked by [`Self::deciding`].
    #[cfg(test)]
    pub(crate) fn is_deciding(&self, validation_id: ValidationId) -> bool {
        self.deciding.is_marked(validation_id)
    }

    /// Decides validation `validation_id`: the decision and its description are posted to
    /// the aggregator. Returns once the decision is durable.
    ///
    /// # Errors
    ///
    /// [`ResolveError::Conflict`] when a different decision was taken first,
    /// [`ResolveError::Unknown`] for an id never postponed, [`ResolveError::Store`] when the
    /// store fails. An id whose validation is still being recorded (its handler postponed it
    /// a moment ago) is waited for, up to a minute, rather than called unknown. So is, past
    /// the deadline, the decision of a handler run on after its time budget that decided in
    /// time and is not recorded yet; still not recorded after a minute, it is
    /// [`ResolveError::Store`]: try again.
    pub async fn resolve(
        &self,
        validation_id: impl Into<ValidationId>,
        decision: Decision,
    ) -> Result<Resolved, ResolveError> {
        self.resolve_by(validation_id, decision, None).await
    }

    /// [`Self::resolve`], kept with who decided
    /// ([`ValidationResult::decided_by`](crate::postponed::ValidationResult::decided_by):
    /// trimmed, cut after 128 bytes; blanks are no name) and logged with it — for a
    /// merchant's back office that knows who its user is.
    ///
    /// # Errors
    ///
    /// As [`Self::resolve`]. The same decision recorded before by someone else is
    /// [`Resolved::Unchanged`]: who took it first stays.
    pub async fn resolve_by(
        &self,
        validation_id: impl Into<ValidationId>,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Resolved, ResolveError> {
        let validation_id = validation_id.into();
        if let Some(outcome) = &self.deadline_decision {
            self.expire(validation_id, outcome, WhileItsHandlerDecides::Wait)
                .await?;
        }
        let by = crate::store::held::person(by);
        self.decide(validation_id, decision, by.as_deref()).await
    }

    /// [`Self::resolve`] for a decision nobody else holds — a handler's, given after its
    /// time budget: while the store fails for a while (a lost connection, a pool timeout, a
    /// failover), it is asked again, waiting [`LATE_RETRY_FIRST`] and then twice as long each
    /// time up to [`LATE_RETRY_MOST`], until the decision is recorded or refused. Given up
    /// on, the decision would be lost: without a deadline the validation would wait for
    /// ever, with one the aggregator would get the deadline's outcome instead of the
    /// handler's. The decision was given in time: a retry after the deadline records it
    /// still, unless the deadline's outcome was recorded meanwhile. A store that failed for
    /// good (it stopped after a write it could not make durable) is not asked again: the
    /// service is no longer ready, and the validation's deadline decides it after a restart.
    pub(crate) async fn resolve_until_recorded(
        &self,
        validation_id: ValidationId,
        decision: Decision,
    ) {
        let mut wait = LATE_RETRY_FIRST;
        // Not `resolve`, which applies a deadline passed first: the handler decided within
        // its timeout, which the deadline outlasts (`validation.deadline`), and a store
        // that answered late must not turn its decision into the deadline's outcome.
        let mut outcome = self.decide(validation_id, decision.clone(), None).await;
        loop {
            match outcome {
                Ok(_) => return,
                Err(ResolveError::Store(error @ StoreError::Backend { .. })) => {
                    tracing::error!(
                        validation_id = validation_id.get(),
                        error = %crate::report::InLine(&error),
                        retry_in = ?wait,
                        "the handler's late decision could not be recorded: trying again"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(LATE_RETRY_MOST);
                    outcome = self.decide(validation_id, decision.clone(), None).await;
                }
                Err(error) => {
                    tracing::error!(
                        validation_id = validation_id.get(),
                        error = %crate::report::InLine(&error),
                        "the handler's late decision was not recorded"
                    );
                    return;
                }
            }
        }
    }

    /// Resolves `validation_id` with the deadline's `outcome` when its deadline has passed
    /// and it is undecided; `true` when this did. A repeat (a validation asked about again
    /// under a new id) has no deadline of its own: it is decided with the validation it
    /// repeats, whose deadline it is judged by. A validation whose handler still decides it
    /// ([`Self::deciding`]) is left to its handler: `false`.
    pub(crate) async fn expire_if_past_deadline(
        &self,
        validation_id: ValidationId,
        outcome: &Decision,
    ) -> Result<bool, ResolveError> {
        self.expire(validation_id, outcome, WhileItsHandlerDecides::Skip)
            .await
    }

    /// [`Self::expire_if_past_deadline`], doing `meanwhile` where the validation's handler
    /// still decides it.
    async fn expire(
        &self,
        validation_id: ValidationId,
        outcome: &Decision,
        meanwhile: WhileItsHandlerDecides,
    ) -> Result<bool, ResolveError> {
        let now = self.clock.now();
        let mut record = self.store.postponed(validation_id).await?;
        if let Some(original) = record.as_ref().and_then(|r| r.repeat_of) {
            record = self.store.postponed(original).await?;
        }
        let Some(record) = record.filter(|record| {
            record.result.is_none() && record.deadline.is_some_and(|deadline| deadline <= now)
        }) else {
            return Ok(false);
        };
        // The handler gave (or will give, within its timeout, which the deadline outlasts)
        // its decision in time; only its record is late.
        let original = record.validation_id;
        if self.deciding.is_marked(original) {
            match meanwhile {
                WhileItsHandlerDecides::Skip => return Ok(false),
                // Then the deadline's outcome is tried: refused if the handler's was recorded.
                WhileItsHandlerDecides::Wait => {
                    self.deciding.unmarked(original).await;
                    // Still not recorded after the wait (the store fails, and the handler's
                    // decision is asked for again and again): nothing is decided now.
                    if self.deciding.is_marked(original) {
                        return Err(ResolveError::Store(StoreError::backend_message(
                            "the handler's decision, given in time, is still being recorded; try again later",
                        )));
                    }
                }
            }
        }
        match self.decide(validation_id, outcome.clone(), None).await {
            Ok(Resolved::Recorded) => {
                tracing::warn!(
                    validation_id = validation_id.get(),
                    success = outcome.allows(),
                    "postponed validation reached its deadline undecided; resolved with the configured outcome"
                );
                Ok(true)
            }
            // Decided meanwhile.
            Ok(Resolved::Unchanged) | Err(ResolveError::Conflict { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// [`Self::resolve`], whatever the deadline.
    async fn decide(
        &self,
        validation_id: ValidationId,
        decision: Decision,
        by: Option<&str>,
    ) -> Result<Resolved, ResolveError> {
        let success = decision.allows();
        // Noted first: a record whose write ends between this store's answer and the wait
        // below is no longer being recorded by then, but is durable.
        let was_recording = self.recording.is_marked(validation_id);
        let mut resolution = self
            .store
            .resolve(validation_id, &decision, by, self.clock.now())
            .await?;
        if resolution == Resolution::Unknown
            && (self.recording.unmarked(validation_id).await || was_recording)
        {
            resolution = self
                .store
                .resolve(validation_id, &decision, by, self.clock.now())
                .await?;
        }
        match resolution {
            Resolution::Recorded => {
                tracing::info!(
                    validation_id = validation_id.get(),
                    success,
                    decider = %crate::logged::Logged(by.unwrap_or("(not said)")),
                    "postponed validation decided"
                );
                self.wake.notify_one();
                Ok(Resolved::Recorded)
            }
            Resolution::AlreadyRecorded => Ok(Resolved::Unchanged),
            Resolution::Conflicting {
                success: recorded_success,
                description: recorded_description,
            } => {
                tracing::warn!(
                    validation_id = validation_id.get(),
                    success,
                    recorded_success,
                    "a different decision was taken first; refused"
                );
                Err(ResolveError::Conflict {
                    validation_id,
                    recorded_success,
                    recorded_description,
                })
            }
            Resolution::Unknown => Err(ResolveError::Unknown(validation_id)),
        }
    }

    /// Makes the next delivery attempt of a queued result due now, and wakes the outbox:
    /// an operator's "retry now" after fixing what made the attempts fail. A result the
    /// aggregator refused as conflicting (403) is queued again, due now: the operator judged
    /// the refusal not the aggregator's (a firewall, a missing role); if it was, the next
    /// attempt is refused again. Returns `false` when the result is undecided or delivered:
    /// nothing changes.
    ///
    /// ```no_run
    /// # async fn run(resolver: payhook::Resolver) -> Result<(), payhook::postponed::ResolveError> {
    /// if !resolver.retry_now(42).await? {
    ///     println!("validation 42 has no result waiting for delivery");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ResolveError::Unknown`] for an id never postponed, [`ResolveError::Store`] when the
    /// store fails.
    pub async fn retry_now(
        &self,
        validation_id: impl Into<ValidationId>,
    ) -> Result<bool, ResolveError> {
        let validation_id = validation_id.into();
        let record = self
            .store
            .postponed(validation_id)
            .await?
            .ok_or(ResolveError::Unknown(validation_id))?;
        let refused = matches!(
            record.result.map(|r| r.delivery),
            Some(Delivery::Conflict { .. })
        );
        if !self.store.make_due(validation_id, self.clock.now()).await? {
            return Ok(false);
        }
        if refused {
            tracing::warn!(
                validation_id = validation_id.get(),
                "a result the aggregator refused (403) was queued again by an operator"
            );
        } else {
            tracing::info!(
                validation_id = validation_id.get(),
                "delivery made due now by an operator"
            );
        }
        self.wake.notify_one();
        Ok(true)
    }

    /// One postponed validation.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store fails.
    pub async fn get(
        &self,
        validation_id: impl Into<ValidationId>,
    ) -> Result<Option<PostponedValidation>, StoreError> {
        self.store.postponed(validation_id.into()).await
    }

    /// Postponed validations in `state` (all of them when `None`), by id, in one piece.
    ///
    /// Listing what waits — [`PostponedState::Pending`] or [`PostponedState::Queued`] —
    /// reads the store's index of it, not the retention period's records: cheap enough to
    /// call every few seconds while little waits (see [`PostponedStore::postponed_in`]).
    /// Every validation, or the delivered ones, are the retention period's records (30
    /// days of them by default): read those with [`Resolver::page`], as is what waits when
    /// it may be many (an aggregator unreachable for hours leaves its results queued).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store fails.
    pub async fn list(
        &self,
        state: Option<PostponedState>,
    ) -> Result<Vec<PostponedValidation>, StoreError> {
        match state {
            Some(state) => self.store.postponed_in(state).await,
            None => self.store.postponed_all().await,
        }
    }

    /// How many results await delivery and when the oldest of them was decided (see
    /// [`PostponedStore::outbox_summary`]).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot be read.
    pub async fn outbox_summary(&self) -> Result<OutboxSummary, StoreError> {
        self.store.outbox_summary().await
    }

    /// A page of the postponed validations in `state` (in any when `None`): at most `limit`
    /// (0 is taken as 1) of those whose id follows `after` (from the lowest without it), by id, and the
    /// `after` of the next page while more follow. How a listing that may hold the whole
    /// retention period's records is read without holding them all (see
    /// [`PostponedStore::postponed_page`]).
    ///
    /// ```
    /// # async fn run(resolver: payhook::postponed::Resolver) -> Result<(), payhook::store::StoreError> {
    /// use payhook::postponed::PostponedState;
    ///
    /// let mut after = None;
    /// loop {
    ///     let page = resolver.page(Some(PostponedState::Pending), after, 500).await?;
    ///     for validation in &page.validations {
    ///         println!("{} waits for a decision", validation.validation_id);
    ///     }
    ///     match page.next {
    ///         Some(next) => after = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store fails.
    pub async fn page(
        &self,
        state: Option<PostponedState>,
        after: Option<ValidationId>,
        limit: usize,
    ) -> Result<PostponedPage, StoreError> {
        self.store.postponed_page(state, after, limit).await
    }

    /// At most `limit` of the validations whose result was delivered or refused, the
    /// latest (highest id) first; read without the rest of the retention period's records
    /// (see [`PostponedStore::postponed_settled`]).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store fails.
    pub async fn settled(&self, limit: usize) -> Result<Vec<PostponedValidation>, StoreError> {
        self.store.postponed_settled(limit).await
    }
}

/// How long a handler's late decision waits before the store is asked again after a failure
/// ([`Resolver::resolve_until_recorded`]); each wait doubles, up to [`LATE_RETRY_MOST`].
const LATE_RETRY_FIRST: Duration = Duration::from_millis(100);

/// The longest wait between two attempts to record a handler's late decision.
const LATE_RETRY_MOST: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TransactionValidationRequest;
    use crate::store::{DurableFuture, ResolveFuture, StoreFuture};
    use chrono::{DateTime, Utc};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// The methods of [`PostponedStore`] a resolve never calls, for the test stores below.
    macro_rules! not_used_by_resolve {
        () => {
            fn repeat<'a>(
                &'a self,
                _: &'a TransactionValidationRequest,
                _: DateTime<Utc>,
            ) -> StoreFuture<'a, Repeat> {
                unreachable!("not used by resolve")
            }

            fn record_delivery(&self, _: ValidationId, _: Delivery) -> DurableFuture<'_> {
                unreachable!("not used by resolve")
            }

            fn make_due(&self, _: ValidationId, _: DateTime<Utc>) -> StoreFuture<'_, bool> {
                unreachable!("not used by resolve")
            }

            fn postponed_all(&self) -> StoreFuture<'_, Vec<PostponedValidation>> {
                unreachable!("not used by resolve")
            }

            fn outbox_due(&self, _: DateTime<Utc>) -> StoreFuture<'_, crate::store::Due> {
                unreachable!("not used by resolve")
            }

            fn outbox_len(&self) -> StoreFuture<'_, usize> {
                unreachable!("not used by resolve")
            }

            fn deadlines_due(&self, _: DateTime<Utc>) -> StoreFuture<'_, crate::store::Due> {
                unreachable!("not used by resolve")
            }
        };
    }

    /// A store that only resolves, answering the `n`th resolve (from 0) with `answer(n)`.
    struct ResolvesOnly<F> {
        resolves: AtomicU32,
        answer: F,
    }

    impl<F> ResolvesOnly<F>
    where
        F: Fn(u32) -> Result<Resolution, StoreError> + Send + Sync + 'static,
    {
        /// The store, and a resolver over it.
        fn resolver(answer: F) -> (Arc<Self>, Resolver) {
            let store = Arc::new(Self {
                resolves: AtomicU32::new(0),
                answer,
            });
            let shared = Arc::clone(&store) as Arc<dyn PostponedStore>;
            (store, Resolver::new(shared, Clock::new(), Arc::default()))
        }
    }

    impl<F> PostponedStore for ResolvesOnly<F>
    where
        F: Fn(u32) -> Result<Resolution, StoreError> + Send + Sync + 'static,
    {
        fn resolve<'a>(
            &'a self,
            _: ValidationId,
            _: &'a Decision,
            _: Option<&'a str>,
            _: DateTime<Utc>,
        ) -> ResolveFuture<'a> {
            let n = self.resolves.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::ready((self.answer)(n)))
        }

        fn postponed(&self, _: ValidationId) -> StoreFuture<'_, Option<PostponedValidation>> {
            unreachable!("not used by resolve")
        }

        not_used_by_resolve!();
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_decision_is_recorded_once_the_store_answers_again() {
        // A store that fails 12 times (a pool timeout, a failover), then records.
        let (store, resolver) = ResolvesOnly::resolver(|n| {
            if n < 12 {
                Err(StoreError::backend_message("the pool timed out"))
            } else {
                Ok(Resolution::Recorded)
            }
        });
        let started = tokio::time::Instant::now();
        resolver
            .resolve_until_recorded(7.into(), Decision::allow("approved"))
            .await;
        assert_eq!(
            store.resolves.load(Ordering::SeqCst),
            13,
            "asked until recorded"
        );
        // 0.1 + 0.2 + … + 25.6 s, then 30 s each: the waits grow, and stop growing.
        let waited = started.elapsed();
        let doubling: Duration = (0..9).map(|n| LATE_RETRY_FIRST * 2u32.pow(n)).sum();
        assert_eq!(waited, doubling + LATE_RETRY_MOST * 3);

        // A store that stopped for good is not asked again.
        let (stopped, resolver) = ResolvesOnly::resolver(|_| Err(StoreError::Stopped));
        resolver
            .resolve_until_recorded(7.into(), Decision::allow("approved"))
            .await;
        assert_eq!(stopped.resolves.load(Ordering::SeqCst), 1);
    }

    /// One validation, undecided and past its deadline: what it was resolved with.
    struct PastItsDeadline(Mutex<PostponedValidation>);

    impl PostponedStore for PastItsDeadline {
        fn resolve<'a>(
            &'a self,
            _: ValidationId,
            decision: &'a Decision,
            by: Option<&'a str>,
            now: DateTime<Utc>,
        ) -> ResolveFuture<'a> {
            let mut record = self.0.lock().unwrap();
            let by = by.map(str::to_owned);
            let resolution = record.resolve(
                decision.allows(),
                decision.description().to_owned(),
                by,
                now,
            );
            Box::pin(std::future::ready(Ok(resolution)))
        }

        fn postponed(&self, _: ValidationId) -> StoreFuture<'_, Option<PostponedValidation>> {
            Box::pin(std::future::ready(Ok(Some(self.0.lock().unwrap().clone()))))
        }

        not_used_by_resolve!();
    }

    /// A handler's decision, taken within its timeout but recorded only after the deadline
    /// (a store slow to answer), is recorded as the handler's: not turned into the
    /// deadline's outcome (`allow` here) by the resolver that records it. An operator's
    /// decision after the deadline comes too late, as before.
    #[tokio::test]
    async fn a_late_handler_decision_past_the_deadline_is_the_handlers() {
        let past = || {
            let mut record = PostponedValidation::pending_for_tests(7);
            record.deadline = Some(DateTime::<Utc>::UNIX_EPOCH);
            Arc::new(PastItsDeadline(Mutex::new(record)))
        };
        let config = ValidationConfig {
            deadline: Some(Duration::from_secs(60)),
            deadline_outcome: DeadlineOutcome::Allow,
            ..ValidationConfig::default()
        };
        let store = past();
        let shared = Arc::clone(&store) as Arc<dyn PostponedStore>;
        let resolver =
            Resolver::new(shared, Clock::new(), Arc::default()).with_deadline_of(&config);
        resolver
            .resolve_until_recorded(7.into(), Decision::deny("no documents"))
            .await;
        let result = store.0.lock().unwrap().result.clone().unwrap();
        assert!(
            !result.success,
            "the handler's denial, not the deadline's approval"
        );

        let store = past();
        let shared = Arc::clone(&store) as Arc<dyn PostponedStore>;
        let resolver =
            Resolver::new(shared, Clock::new(), Arc::default()).with_deadline_of(&config);
        let asked = resolver.resolve(7, Decision::deny("no documents")).await;
        assert!(
            matches!(asked, Err(ResolveError::Conflict { .. })),
            "{asked:?}"
        );
        assert!(store.0.lock().unwrap().result.clone().unwrap().success);
    }

    /// While a handler run on after its budget still decides a validation (its decision,
    /// given within the handler timeout, not yet recorded: a slow or failing store), a
    /// deadline passed meanwhile is not applied: the outbox's passes leave it, and a
    /// decision asked for waits for the handler's and then comes too late. Once the handler
    /// gives up without a decision recorded, the deadline applies again.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_not_applied_while_its_handler_still_decides() {
        let store = Arc::new(PastItsDeadline(Mutex::new({
            let mut record = PostponedValidation::pending_for_tests(7);
            record.deadline = Some(DateTime::<Utc>::UNIX_EPOCH);
            record
        })));
        let config = ValidationConfig {
            deadline: Some(Duration::from_secs(60)),
            deadline_outcome: DeadlineOutcome::Allow,
            ..ValidationConfig::default()
        };
        let shared = Arc::clone(&store) as Arc<dyn PostponedStore>;
        let outboxes = Resolver::new(shared, Clock::new(), Arc::default());
        let resolver = outboxes.clone().with_deadline_of(&config);
        let allow = Decision::allow("validation timed out");
        let undecided = || store.0.lock().unwrap().result.is_none();

        let deciding = resolver.deciding(7.into());
        let expired = outboxes.expire_if_past_deadline(7.into(), &allow).await;
        assert!(matches!(expired, Ok(false)), "{expired:?}");
        assert!(undecided(), "left to the handler by the outbox's pass");

        let reviewer = tokio::spawn({
            let resolver = resolver.clone();
            async move { resolver.resolve(7, Decision::allow("looks fine")).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            !reviewer.is_finished(),
            "the reviewer waits for the handler"
        );
        assert!(undecided());

        resolver
            .resolve_until_recorded(7.into(), Decision::deny("no documents"))
            .await;
        drop(deciding);
        let asked = reviewer.await.unwrap();
        assert!(
            matches!(asked, Err(ResolveError::Conflict { .. })),
            "the reviewer came after the handler's denial: {asked:?}"
        );
        let result = store.0.lock().unwrap().result.clone().unwrap();
        assert_eq!(
            (result.success, result.description.as_str()),
            (false, "no documents"),
            "the handler's decision, not the deadline's approval nor the reviewer's"
        );

        // A handler whose decision is still not recorded after the reviewer's wait (its
        // store fails): the reviewer is told to try again, and nothing is decided.
        let store = Arc::new(PastItsDeadline(Mutex::new({
            let mut record = PostponedValidation::pending_for_tests(9);
            record.deadline = Some(DateTime::<Utc>::UNIX_EPOCH);
            record
        })));
        let resolver = Resolver::new(
            Arc::clone(&store) as Arc<dyn PostponedStore>,
            Clock::new(),
            Arc::default(),
        )
        .with_deadline_of(&config);
        let deciding = resolver.deciding(9.into());
        let asked = resolver.resolve(9, Decision::allow("looks fine")).await;
        assert!(
            matches!(asked, Err(ResolveError::Store(StoreError::Backend { .. }))),
            "{asked:?}"
        );
        assert!(store.0.lock().unwrap().result.is_none());
        drop(deciding);

        // A handler that gave up (its store stopped for good) leaves it to the deadline.
        let store = Arc::new(PastItsDeadline(Mutex::new({
            let mut record = PostponedValidation::pending_for_tests(8);
            record.deadline = Some(DateTime::<Utc>::UNIX_EPOCH);
            record
        })));
        let outboxes = Resolver::new(
            Arc::clone(&store) as Arc<dyn PostponedStore>,
            Clock::new(),
            Arc::default(),
        );
        drop(outboxes.clone().deciding(8.into()));
        let expired = outboxes.expire_if_past_deadline(8.into(), &allow).await;
        assert!(matches!(expired, Ok(true)), "{expired:?}");
        assert!(store.0.lock().unwrap().result.clone().unwrap().success);
    }

    #[tokio::test]
    async fn a_decision_whose_record_is_written_while_it_is_refused_is_resolved_again() {
        // The validation is recorded while the first resolve is answered: that resolve
        // finds nothing, and the record's write ends before the resolver waits.
        let recording: Arc<Mutex<Option<RecordingGuard>>> = Arc::default();
        let (store, resolver) = ResolvesOnly::resolver({
            let recording = Arc::clone(&recording);
            move |n| {
                if n == 0 {
                    drop(recording.lock().unwrap().take());
                    return Ok(Resolution::Unknown);
                }
                Ok(Resolution::Recorded)
            }
        });
        *recording.lock().unwrap() = Some(resolver.recording(ValidationId::from(7)));
        let resolved = resolver.resolve(7, Decision::allow("approved")).await;
        assert!(matches!(resolved, Ok(Resolved::Recorded)), "{resolved:?}");
        assert_eq!(store.resolves.load(Ordering::SeqCst), 2);
    }
}
