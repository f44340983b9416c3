//! Callbacks and validations through the store: each acknowledged (nonce, status) reaches the
//! handler once, and each answer is sent only after its record is durable.
//!
//! One delivery of a nonce claims it; a second delivery of the same nonce at the same moment
//! waits (at most the handler timeout) for the first to finish and then answers from the
//! record — or gets 503 with `Retry-After`. The waiting is in memory ([`Waiters`]); the
//! claim itself is the store's: on sled it is in the process's memory and goes with it (one
//! process writes a sled store), on PostgreSQL it is the database's, and a claim left by an
//! instance that crashed is taken over.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::metrics::{Decision, Metrics};
use super::problem::{Problem, json_response};
use super::route::Endpoint;
use super::runner::Runner;
use crate::handler::{CallbackContext, RequestContext};
use crate::logged::Logged;
use crate::model::Nonce;
use crate::model::timestamp::now_ms;
use crate::model::{CallbackBody, ErrorBody, TransactionStatus, TransactionValidationRequest};
use crate::postponed::record::Repeat;
use crate::postponed::{Awaitable, Decided, Undecided};
use crate::signature::SignedPair;
use crate::store::{
    CallbackBegin, CallbackFailure, Claim, Effects, Fingerprint, RecordedDecision, Store,
    StoreError, Subject, ValidationBegin,
};

/// How much longer than the handler timeout a claim held in a shared store may stand before
/// the next delivery takes it over (its holder, another instance, hangs). A store whose
/// claims end with this process ([`Store::claims_end_with_this_process`]) never has one
/// taken over: see [`ExactlyOnce::stale_after`].
const STALE_MARGIN: Duration = Duration::from_secs(60);

/// How often a delivery waiting for a busy nonce reads its record again.
const BUSY_POLL: Duration = Duration::from_millis(100);

/// What deliveries wait on: a nonce of one endpoint. Its text (the map's key) is built only
/// when someone waits, not by every delivery that finishes.
#[derive(Clone, Copy)]
struct WaitKey<'a> {
    /// `"c:"` for a callback's nonce, `"v:"` for a validation's.
    kind: &'static str,
    nonce: &'a str,
}

impl<'a> WaitKey<'a> {
    fn callback(nonce: &'a str) -> Self {
        Self { kind: "c:", nonce }
    }

    fn validation(nonce: &'a str) -> Self {
        Self { kind: "v:", nonce }
    }

    fn text(self) -> String {
        [self.kind, self.nonce].concat()
    }
}

/// Deliveries waiting for another delivery of the same nonce to finish.
///
/// Almost no delivery waits: one registers only after its nonce was found busy, and a
/// finished delivery looks at the map only while some key is registered.
#[derive(Default)]
pub(crate) struct Waiters {
    by_key: Mutex<HashMap<String, Arc<Notify>>>,
    /// Keys in `by_key`, read without its lock by [`Self::finished`].
    registered: AtomicUsize,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.by_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn for_key(&self, key: WaitKey<'_>) -> Arc<Notify> {
        let key = key.text();
        let mut map = self.lock();
        if let Some(notify) = map.get(&key) {
            return Arc::clone(notify);
        }
        let notify = Arc::new(Notify::new());
        map.insert(key, Arc::clone(&notify));
        // Fences on both sides: a waiter registers, then reads the store; a finisher writes
        // the store, then looks at the count. One of the two sees the other's write (and a
        // wake-up missed all the same would cost the waiter one BUSY_POLL, not a booking).
        self.registered.fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        notify
    }

    /// Forgets `key` when nobody waits on it any more (a delivery that did not have to wait).
    fn forget_if_unused(&self, key: WaitKey<'_>) {
        let key = key.text();
        let mut map = self.lock();
        if map
            .get(&key)
            .is_some_and(|notify| Arc::strong_count(notify) == 1)
        {
            map.remove(&key);
            self.registered.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Wakes every delivery waiting on `key`; called after the record changed.
    fn finished(&self, key: WaitKey<'_>) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.registered.load(Ordering::SeqCst) == 0 {
            return;
        }
        let removed = self.lock().remove(&key.text());
        if let Some(notify) = removed {
            self.registered.fetch_sub(1, Ordering::SeqCst);
            notify.notify_waiters();
        }
    }
}

use crate::inspector::note::{self, Outcome};

type Answer = Result<Response<Full<Bytes>>, Problem>;

/// What became of a callback delivery that succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Delivered {
    /// The handler acknowledged it; its effects and the mark are durable.
    Booked,
    /// The handler acknowledged it, but its effects held the result instead of booking it
    /// ([`Booking::Held`](crate::store::Booking::Held), why): durable as a booking is,
    /// answered 200 alike, reported as held.
    Held(String),
    /// This (nonce, status) was acknowledged before; the handler was not called.
    Duplicate,
}

/// Whether a claimed callback may be booked after `previous`, the nonce's last acknowledged
/// status when it is another — decided at once, under the claim. A delivered callback is
/// booked as the aggregator signed it, after whatever was booked (`()`); a reconcile's
/// lookup may be older than a callback booked while the reconcile waited for the claim
/// (`reconcile::ReadAfter`), and is then not booked: the claim is given back (counting no
/// attempt), and the reconcile reads the record again.
pub(super) trait BookAfter: Send + 'static {
    /// Why the callback is not booked after `previous`.
    type Refused: Send + 'static;
    /// `Ok` to book after `previous`.
    fn book_after(&self, previous: TransactionStatus) -> Result<(), Self::Refused>;
}

impl BookAfter for () {
    type Refused = std::convert::Infallible;

    fn book_after(&self, _: TransactionStatus) -> Result<(), Self::Refused> {
        Ok(())
    }
}

fn ok(message: &str) -> Answer {
    Ok(json_response(StatusCode::OK, &ErrorBody::new(message)))
}

/// Exactly-once delivery: the store's records per nonce, the deliveries waiting for another
/// of the same nonce, and the handlers (through the runner, or the Awaitable decisions) run
/// only for what is not recorded yet. Cheap to clone: clones share everything.
#[derive(Clone)]
pub(super) struct ExactlyOnce {
    inner: Arc<Records>,
}

/// Created once by the app's builder.
struct Records {
    /// Deduplication records; `None` only when the app was built `without_store`.
    store: Option<Arc<dyn Store>>,
    waiters: Waiters,
    runner: Runner,
    /// The Awaitable decisions, when the validation endpoint is Awaitable.
    awaitable: Option<Arc<Awaitable>>,
    metrics: Arc<Metrics>,
    /// [`STALE_MARGIN`]; shorter in tests.
    stale_margin: Duration,
}

impl ExactlyOnce {
    pub(super) fn new(
        store: Option<Arc<dyn Store>>,
        runner: Runner,
        awaitable: Option<Arc<Awaitable>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner: Arc::new(Records {
                store,
                waiters: Waiters::default(),
                runner,
                awaitable,
                metrics,
                stale_margin: STALE_MARGIN,
            }),
        }
    }

    /// The store the records are kept in.
    pub(super) fn store(&self) -> Option<&Arc<dyn Store>> {
        self.inner.store.as_ref()
    }

    /// `true` when the app has a callback handler.
    pub(super) fn receives_callbacks(&self) -> bool {
        self.inner.runner.serves(Endpoint::Callback)
    }

    /// How old a claim must be for a delivery to take it over. Never, on a store whose
    /// claims end with this process: there a claim's delivery is alive, however long its
    /// handler blocks a thread, and [`Held`] ends it however the delivery ends — a takeover
    /// would run a second handler beside the first.
    fn stale_after(&self, store: &dyn Store) -> Duration {
        if store.claims_end_with_this_process() {
            Duration::MAX
        } else {
            self.inner.runner.handler_timeout() + self.inner.stale_margin
        }
    }

    fn store_failed(&self, endpoint: Endpoint, error: &StoreError) -> Problem {
        tracing::error!(endpoint = endpoint.name(), error = %crate::report::InLine(error), "store failed");
        self.inner
            .metrics
            .store_errors
            .fetch_add(1, Ordering::Relaxed);
        Problem::StoreFailed {
            retry_after: self.inner.runner.retry_after(),
        }
    }

    /// Repeats `begin` until it says something other than "busy", waiting between tries for
    /// the busy delivery to finish — at most until the handler timeout has passed.
    async fn begin_when_free<'s, B>(
        &self,
        key: WaitKey<'_>,
        mut begin: impl FnMut() -> crate::store::StoreFuture<'s, B>,
        is_busy: impl Fn(&B) -> bool,
    ) -> Result<Result<B, StoreError>, Problem> {
        let deadline = Instant::now() + self.inner.runner.handler_timeout();
        let mut waited = false;
        loop {
            let outcome = begin().await;
            if !matches!(&outcome, Ok(b) if is_busy(b)) {
                if waited {
                    self.inner.waiters.forget_if_unused(key);
                }
                return Ok(outcome);
            }
            // Busy: registered before the store is read again, so that a finish between the
            // two reads is not missed.
            let again = {
                let notify = self.inner.waiters.for_key(key);
                let notified = notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                match begin().await {
                    // Woken when a delivery of this process finishes; a shared store's claim
                    // may be another instance's, which no one here announces, so the record
                    // is also read again every so often — until the deadline.
                    Ok(outcome) if is_busy(&outcome) && Instant::now() >= deadline => {
                        tracing::warn!(
                            "another delivery of this nonce is still in flight; answering 503"
                        );
                        Some(Err(Problem::InFlight {
                            retry_after: self.inner.runner.retry_after(),
                        }))
                    }
                    Ok(outcome) if is_busy(&outcome) => {
                        let poll = Instant::now() + BUSY_POLL;
                        let _ = tokio::time::timeout_at(poll.min(deadline), notified).await;
                        None
                    }
                    other => Some(Ok(other)),
                }
            };
            waited = true;
            // Out of the block, this delivery's hold on the key's entry is let go: the entry
            // goes with the last of them, whatever the answer.
            if let Some(answer) = again {
                self.inner.waiters.forget_if_unused(key);
                return answer;
            }
        }
    }

    /// A callback delivery with deduplication. `pair` is its verified (signature, body) pair,
    /// when pairs are remembered.
    ///
    /// On a store that allows it ([`Store::process_may_remember_bookings`]: sled, not a
    /// shared database), retries of bytes this process booked are answered as duplicates
    /// without reading the store — the answer the store would give, once free of any other
    /// delivery of the nonce, since their record is kept until their mark ends (see
    /// `signature/cache.rs`) — unless the store has failed, which refuses every request.
    pub(super) async fn deliver_once(
        &self,
        callback: CallbackBody,
        request: RequestContext,
        pair: Option<SignedPair>,
    ) -> Answer {
        let delivered = match pair {
            Some(pair) if self.booked_here(&pair) => self.duplicate(callback.transaction_status),
            _ => {
                // Before the booking: its record's retention counts from its commit, later.
                let started_ms = now_ms();
                let delivered = self.deliver(callback, request).await?;
                if let (Some(pair), Delivered::Booked | Delivered::Held(_)) = (&pair, &delivered) {
                    self.mark_booked(pair, started_ms);
                }
                delivered
            }
        };
        match delivered {
            Delivered::Booked => {
                note::with(|n| n.outcome = Some(Outcome::Booked));
                ok("callback accepted")
            }
            // The aggregator is answered as for a booking: the result is acknowledged (its
            // retries are duplicates).
            Delivered::Held(_) => {
                note::with(|n| n.outcome = Some(Outcome::Held));
                ok("callback accepted")
            }
            Delivered::Duplicate => {
                note::with(|n| n.outcome = Some(Outcome::Duplicate));
                ok("callback already processed")
            }
        }
    }

    /// A callback through the deduplication records: booked now, or already before.
    ///
    /// The delivery runs on its own task, so a caller that goes away (a client that
    /// disconnects, an operator's request that is dropped) cannot stop it between the claim
    /// and its release — half-way, it would leave the nonce claimed with the handler running.
    pub(super) async fn deliver(
        &self,
        callback: CallbackBody,
        request: RequestContext,
    ) -> Result<Delivered, Problem> {
        let delivered = self.deliver_after(callback, request, ()).await?;
        Ok(delivered.unwrap_or_else(|never| match never {}))
    }

    /// [`Self::deliver`], booked only if `after` agrees to the nonce's last acknowledged
    /// status when it is another; when it does not, nothing is booked and the claim is
    /// given back at once.
    pub(super) async fn deliver_after<A: BookAfter>(
        &self,
        callback: CallbackBody,
        request: RequestContext,
        after: A,
    ) -> Result<Result<Delivered, A::Refused>, Problem> {
        let this = self.clone();
        self.inner
            .runner
            .detached(Endpoint::Callback, async move {
                this.deliver_claimed(callback, request, after).await
            })
            .await
    }

    async fn deliver_claimed<A: BookAfter>(
        &self,
        callback: CallbackBody,
        request: RequestContext,
        after: A,
    ) -> Result<Result<Delivered, A::Refused>, Problem> {
        let Some(store) = self.inner.store.clone() else {
            return self.deliver_unrecorded(callback, request).await.map(Ok);
        };
        let nonce = callback.nonce.clone();
        let status = callback.transaction_status;
        let key = WaitKey::callback(&nonce);
        let stale_after = self.stale_after(store.as_ref());
        let begin = match self
            .begin_when_free(
                key,
                || store.begin_callback(&nonce, status, stale_after),
                |b| *b == CallbackBegin::Busy,
            )
            .await
        {
            Ok(begun) => begun.map_err(|e| self.store_failed(Endpoint::Callback, &e))?,
            // Still in flight after a whole handler timeout: that delivery's handler hangs
            // (or the instance that holds it does). Counted among the failing callbacks, so
            // that a result whose every retry meets it is seen by operators.
            Err(problem) => {
                keep_failure(store.as_ref(), failure_of(&callback, problem.message())).await;
                self.forget_failure_once_booked(&store, &nonce, status);
                return Err(problem);
            }
        };
        let (held, attempt, previous_status) = match begin {
            CallbackBegin::Claimed {
                claim,
                attempt,
                previous_status,
            } => (
                Held::new(&store, &nonce, claim, Kind::Callback),
                attempt,
                previous_status,
            ),
            // `begin_when_free` returns only once the nonce is free; should a busy answer
            // ever get here, it is not an acknowledgement.
            CallbackBegin::Busy => {
                return Err(Problem::InFlight {
                    retry_after: self.inner.runner.retry_after(),
                });
            }
            CallbackBegin::Duplicate => return Ok(Ok(self.duplicate(status))),
        };
        if let Some(previous) = previous_status.filter(|previous| *previous != status)
            && let Err(refused) = after.book_after(previous)
        {
            let_go(store.as_ref(), &nonce, held.claim, Ran::NoHandler).await;
            held.ended();
            self.inner.waiters.finished(key);
            return Ok(Err(refused));
        }
        let effects = Effects::default();
        // What an operator needs of a delivery that fails, or whose result the merchant
        // holds, kept before the handler takes the callback.
        effects.about(subject_of(&callback));
        let ctx = CallbackContext::delivered(
            request,
            attempt,
            previous_status,
            effects.clone(),
            Some((Arc::clone(&store), held.claim)),
        );
        // Past the retention a missing record proves nothing: the callback may have been
        // booked and its record purged since. Its handler is not run; operators see it among
        // the failing callbacks.
        let changed =
            crate::model::timestamp::last_change(callback.updated_utc, callback.created_utc);
        let answer = match beyond_horizon(changed, callback_horizon(store.reach())) {
            Some(changed) => Err(NotBooked::claim_held(Problem::BeyondRetention { changed })),
            None => {
                self.book(store.as_ref(), &nonce, callback, ctx, held.claim)
                    .await
            }
        };
        if let Err(NotBooked {
            problem,
            claim_ended,
        }) = &answer
        {
            // The failure is recorded while the claim is still held, so that the next
            // delivery, which claims after the release, finds it (and its booking removes
            // it).
            if !matches!(problem, Problem::StoreFailed { .. })
                && let Some(subject) = effects.subject()
            {
                let failure = subject.failure(&nonce, status, problem.message());
                self.failing(store.as_ref(), failure, (attempt, problem))
                    .await;
                // A booking that failed ended a shared store's claim with its transaction:
                // a delivery booking the pair meanwhile may not have been seen.
                if *claim_ended {
                    self.forget_failure_once_booked(&store, &nonce, status);
                }
            }
            let_go(store.as_ref(), &nonce, held.claim, Ran::Handler).await;
        }
        held.ended();
        self.inner.waiters.finished(key);
        answer.map(Ok).map_err(|not_booked| not_booked.problem)
    }

    /// A delivery of a (nonce, status) acknowledged before: the handler is not called.
    fn duplicate(&self, status: TransactionStatus) -> Delivered {
        tracing::info!(
            status = status.code(),
            "duplicate callback: already acknowledged, handler not called"
        );
        self.inner
            .metrics
            .callbacks_duplicate
            .fetch_add(1, Ordering::Relaxed);
        Delivered::Duplicate
    }

    /// `true` when this process booked `pair`'s callback and its record is still kept, on a
    /// store that lets it remember and has not failed.
    fn booked_here(&self, pair: &SignedPair) -> bool {
        self.inner.store.as_ref().is_some_and(|store| {
            store.process_may_remember_bookings() && !store.failed() && pair.booked(now_ms())
        })
    }

    /// Marks `pair` booked for the store's retention from `started_ms`, on a store that lets
    /// this process remember.
    fn mark_booked(&self, pair: &SignedPair, started_ms: u64) {
        if let Some(store) = self
            .inner
            .store
            .as_ref()
            .filter(|store| store.process_may_remember_bookings())
        {
            let retention_ms = u64::try_from(store.retention().as_millis()).unwrap_or(u64::MAX);
            pair.mark_booked(started_ms.saturating_add(retention_ms));
        }
    }

    /// A callback body refused with `problem` before any handler (see [`super::refusal`]):
    /// an error-level line for operators, and, where its nonce and status can be read, a
    /// durable count among the failing callbacks.
    pub(super) async fn refused(&self, bytes: &[u8], problem: &Problem, max_chars: usize) {
        let Some(store) = self.inner.store.as_deref() else {
            return;
        };
        let reason = problem.message();
        let Some(failure) = super::refusal::failure(bytes, reason.clone(), max_chars) else {
            tracing::error!(
                reason = %Logged(&reason),
                "callback refused: its body could not be read, nor its nonce and status; the aggregator's retries will be refused alike and it cannot be listed among the failing callbacks"
            );
            return;
        };
        tracing::error!(
            nonce = %Logged(&failure.nonce),
            status = failure.status.code(),
            reference_id = %failure.transaction_reference_id,
            reason = %Logged(&failure.reason),
            "callback refused: its body could not be read; the aggregator's retries will be refused alike (see GET /payhook/admin/callbacks/failing)"
        );
        if let Err(error) = store.record_refused_callback(failure).await {
            tracing::warn!(error = %crate::report::InLine(&error), "the failure could not be recorded for operators");
        }
    }

    /// A delivery not booked: a line for operators while the aggregator's retries are still
    /// coming — error-level unless the handler itself asked for the retry — and a durable
    /// count per (nonce, status).
    async fn failing(
        &self,
        store: &dyn Store,
        failure: CallbackFailure,
        (attempt, problem): (u32, &Problem),
    ) {
        let why = match problem {
            Problem::RetryLater { .. } => "its handler asked to be called again later",
            Problem::HandlerTimedOut { .. } => "its handler did not decide in time",
            Problem::BeyondRetention { .. } => {
                "it changed before what the store's records vouch for, so its handler was not run"
            }
            _ => "its handler failed",
        };
        macro_rules! not_booked {
            ($level:ident) => {
                tracing::$level!(
                    nonce = %Logged(&failure.nonce),
                    status = failure.status.code(),
                    attempt,
                    reference_id = %failure.transaction_reference_id,
                    reason = %Logged(&failure.reason),
                    "callback not booked: {why}; the aggregator will retry it (see GET /payhook/admin/callbacks/failing)"
                )
            };
        }
        if matches!(problem, Problem::RetryLater { .. }) {
            not_booked!(warn);
        } else {
            not_booked!(error);
        }
        self.inner
            .metrics
            .callback_failures
            .fetch_add(1, Ordering::Relaxed);
        keep_failure(store, failure).await;
    }

    /// The failure a delivery that gave up waiting recorded, beside a booking in flight
    /// that could not be seen, is removed if that booking commits: looked at once the
    /// booking has had the time a handler has (spawned; nothing waits for it). Without it,
    /// a shared store would count the booked pair as failing until its retention sweep.
    fn forget_failure_once_booked(
        &self,
        store: &Arc<dyn Store>,
        nonce: &Nonce,
        status: TransactionStatus,
    ) {
        // A store whose claims end with this process writes failures and bookings in one
        // order, and keeps no such record.
        if store.claims_end_with_this_process() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, nonce) = (Arc::clone(store), nonce.clone());
        let after = self
            .inner
            .runner
            .handler_timeout()
            .max(Duration::from_secs(1));
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            if let Err(error) = store.forget_failure_if_booked(&nonce, status).await {
                tracing::debug!(error = %crate::report::InLine(&error), "a booked pair's failure record stays until the sweep");
            }
        });
    }

    /// Runs the handler for a claimed callback, then writes its effects and the mark
    /// atomically and waits for them to be durable.
    async fn book(
        &self,
        store: &dyn Store,
        nonce: &Nonce,
        callback: CallbackBody,
        ctx: CallbackContext,
        claim: Claim,
    ) -> Result<Delivered, NotBooked> {
        let status = callback.transaction_status;
        let effects = ctx.effects.clone();
        self.inner
            .runner
            .acknowledge(callback, ctx)
            .await
            .map_err(NotBooked::claim_held)?;
        // Resolves once the mark and the effects are durable (group commit).
        if let Err(error) = store
            .finish_callback(nonce, claim, status, effects.clone())
            .await
        {
            let problem = match error {
                effect @ (StoreError::Aborted { .. }
                | StoreError::UnknownTree { .. }
                | StoreError::Unsupported(_)) => {
                    tracing::error!(error = %crate::report::InLine(&effect), "the handler's effects did not apply; not acknowledged");
                    self.callback_failed()
                }
                other => self.store_failed(Endpoint::Callback, &other),
            };
            return Err(NotBooked {
                problem,
                claim_ended: true,
            });
        }
        if !effects.is_empty() && !effects.ran() {
            // Booked already, by a delivery whose claim this one took over: its booking,
            // not this one, is what the store holds. (Nothing staged tells nothing: a store
            // of the merchant's own may skip running an empty list.)
            return Ok(self.duplicate(status));
        }
        match effects.held() {
            Some(reason) => {
                self.held(nonce, status, &reason);
                Ok(Delivered::Held(reason))
            }
            None => {
                self.booked();
                Ok(Delivered::Booked)
            }
        }
    }

    fn booked(&self) {
        self.inner
            .metrics
            .callbacks_booked
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A result acknowledged but held by the handler's effects, not booked: said once, at
    /// error level, now that it is durable (an effect may run more than once, and its
    /// writes may not commit), and counted.
    fn held(&self, nonce: &Nonce, status: TransactionStatus, reason: &str) {
        tracing::error!(
            nonce = %Logged(nonce),
            status = status.code(),
            reason = %crate::Escaped(reason),
            "callback acknowledged and held, not booked: the merchant's effects kept it aside for a person to resolve"
        );
        self.inner
            .metrics
            .callbacks_held
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a handler's decision on a validation.
    fn decided(&self, decision: &RecordedDecision) {
        self.inner.metrics.decided(match decision {
            RecordedDecision::Allow => Decision::Allow,
            RecordedDecision::Deny { .. } => Decision::Deny,
            RecordedDecision::Postponed => Decision::Postponed,
        });
    }

    fn callback_failed(&self) -> Problem {
        self.inner.runner.failed(Endpoint::Callback)
    }

    /// Without a store: every delivery runs the handler (no deduplication).
    async fn deliver_unrecorded(
        &self,
        callback: CallbackBody,
        request: RequestContext,
    ) -> Result<Delivered, Problem> {
        let effects = Effects::default();
        let ctx = CallbackContext::delivered(request, 1, None, effects.clone(), None);
        self.inner.runner.acknowledge(callback, ctx).await?;
        if !effects.is_empty() {
            tracing::error!(
                "the handler staged effects, but the app has no store to write them to"
            );
            return Err(self.callback_failed());
        }
        self.booked();
        Ok(Delivered::Booked)
    }

    /// A transaction validation with its decision recorded per nonce. It runs on its own
    /// task: a client that disconnects cannot interrupt it between the handler's decision
    /// and the durable record of it.
    pub(super) async fn validate_once(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Answer {
        let this = self.clone();
        self.inner
            .runner
            .detached(Endpoint::TransactionValidation, async move {
                this.validate_claimed(request, ctx).await
            })
            .await
    }

    /// Refuses (403) a validation whose id the store holds for another nonce, before its
    /// handler runs or a recorded decision is answered: the aggregator never reuses an id,
    /// so one of the two is not the aggregator's (a forgery on an endpoint open to others,
    /// sent under an id it guessed ahead), and answered "postponed", the aggregator would
    /// wait for a result for the id — the other payment's.
    async fn refuse_a_taken_validation_id(
        &self,
        store: &dyn Store,
        request: &TransactionValidationRequest,
    ) -> Result<(), Problem> {
        let kept = store
            .postponed(request.validation_id)
            .await
            .map_err(|e| self.store_failed(Endpoint::TransactionValidation, &e))?;
        match kept {
            Some(kept) if kept.request.nonce() != request.nonce() => Err(self.refused_as_reuse(
                "validation_id_reuse",
                request,
                Problem::ValidationIdReused,
            )),
            _ => Ok(()),
        }
    }

    /// `problem`, for a validation refused because what identifies it (its nonce, its id)
    /// was used for a different payment: counted, and logged as security event `event`.
    fn refused_as_reuse(
        &self,
        event: &'static str,
        request: &TransactionValidationRequest,
        problem: Problem,
    ) -> Problem {
        self.inner
            .metrics
            .nonce_reuse_refused
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            security_event = event,
            validation_id = request.validation_id.get(),
            client = %Logged(&request.merchant_data.client_id),
            "{}; refused",
            problem.message()
        );
        problem
    }

    async fn validate_claimed(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Answer {
        let Some(store) = self.inner.store.clone() else {
            let decision = self.inner.runner.validate(request, ctx).await?;
            self.decided(&decision);
            return answer_for(&decision);
        };
        let nonce = request.nonce().to_owned();
        if self.inner.awaitable.is_some() {
            self.refuse_a_taken_validation_id(store.as_ref(), &request)
                .await?;
        }
        let fingerprint = Fingerprint::of(&request);
        let key = WaitKey::validation(&nonce);
        let stale_after = self.stale_after(store.as_ref());
        let begin = self
            .begin_when_free(
                key,
                || store.begin_validation(&nonce, &fingerprint, stale_after),
                |b| *b == ValidationBegin::Busy,
            )
            .await?
            .map_err(|e| self.store_failed(Endpoint::TransactionValidation, &e))?;
        let held = match begin {
            ValidationBegin::Claimed { claim } => {
                Held::new(&store, &nonce, claim, Kind::Validation)
            }
            ValidationBegin::Recorded(decision) => {
                tracing::info!(
                    "repeated validation: the recorded decision is returned, handler not called"
                );
                self.inner
                    .metrics
                    .validations_replayed
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(awaitable) = self.inner.awaitable.as_ref() {
                    // Under a new validation id, the aggregator waits for a result for it.
                    let linked = awaitable.repeated(store.as_ref(), &request).await.map_err(
                        |e| match e {
                            // Another nonce's validation took the id after the check above.
                            StoreError::ValidationIdTaken(_) => self.refused_as_reuse(
                                "validation_id_reuse",
                                &request,
                                Problem::ValidationIdReused,
                            ),
                            e => self.store_failed(Endpoint::TransactionValidation, &e),
                        },
                    )?;
                    // A denial (403) leaves the aggregator waiting on nothing; a 200 has it
                    // wait for a result, which the store queued for the id (as a repeat, or
                    // an approval recorded afresh) unless it said otherwise: "postponed"
                    // with no result to follow would leave it waiting for ever.
                    let validation_id = request.validation_id.get();
                    match (linked, &decision) {
                        (_, RecordedDecision::Deny { .. }) => {}
                        (Repeat::Full, _) => {
                            return Err(refused_repeat(Problem::TooManyRepeats { validation_id }));
                        }
                        (Repeat::Unlinked, RecordedDecision::Postponed) => {
                            return Err(refused_repeat(Problem::RepeatUnlinked { validation_id }));
                        }
                        _ => {}
                    }
                }
                let answer = answer_for(&decision);
                note::with(|n| n.outcome = Some(Outcome::Replayed));
                return answer;
            }
            ValidationBegin::Mismatch => {
                return Err(self.refused_as_reuse("nonce_reuse", &request, Problem::NonceReused));
            }
            ValidationBegin::Busy => {
                return Err(Problem::InFlight {
                    retry_after: self.inner.runner.retry_after(),
                });
            }
        };
        let validation_id = request.validation_id;
        // Until its record is durable, a resolve of this id waits for it (dropped on return).
        let awaitable = self.inner.awaitable.as_ref();
        let _recording = awaitable.map(|a| a.resolver().recording(validation_id));
        let decided = if let Some(awaitable) = awaitable {
            awaitable
                .decide(request, ctx)
                .await
                .map_err(|undecided| match undecided {
                    Undecided::NoHandler => Problem::NotFound,
                    Undecided::HandlerFailed => {
                        self.inner.runner.failed(Endpoint::TransactionValidation)
                    }
                })
        } else {
            self.inner
                .runner
                .validate(request, ctx)
                .await
                .map(|decision| Decided {
                    decision,
                    postponed: None,
                    later: None,
                })
        };
        let answer = match decided {
            Ok(decided) => {
                let queued = decided
                    .postponed
                    .as_ref()
                    .is_some_and(|p| p.result.is_some());
                match store
                    .finish_validation(
                        &nonce,
                        held.claim,
                        &fingerprint,
                        &decided.decision,
                        decided.postponed,
                    )
                    .await
                {
                    Ok(()) => {
                        self.decided(&decided.decision);
                        if let Some(awaitable) = awaitable {
                            if queued {
                                awaitable.result_queued();
                            }
                            if let Some(task) = decided.later {
                                awaitable.resolve_later(validation_id, task);
                            }
                        }
                        answer_for(&decided.decision)
                    }
                    Err(error) => {
                        if let StoreError::ValidationIdTaken(_) = error {
                            // Another nonce's validation took the id between the check
                            // before the handler and this write: nothing was recorded.
                            if let Some(task) = decided.later {
                                task.abort();
                            }
                            if let Err(error) = store.release_validation(&nonce, held.claim).await {
                                tracing::warn!(error = %crate::report::InLine(&error), "the claim could not be released; it will be taken over when stale");
                            }
                            Err(Problem::ValidationIdReused)
                        } else {
                            // The write's fate is unknown: a commit whose answer was lost may
                            // have made the postponed record durable, and a retry is then
                            // answered "postponed" while only this handler can decide it. Its
                            // decision is recorded if the record is there (and dropped as
                            // unknown if not). The claim is kept until stale, after the
                            // handler timeout: no other handler runs for the nonce meanwhile.
                            if let (Some(awaitable), Some(task)) = (awaitable, decided.later) {
                                awaitable.resolve_later(validation_id, task);
                            }
                            Err(self.store_failed(Endpoint::TransactionValidation, &error))
                        }
                    }
                }
            }
            Err(problem) => {
                if let Err(error) = store.release_validation(&nonce, held.claim).await {
                    tracing::warn!(error = %crate::report::InLine(&error), "the claim could not be released; it will be taken over when stale");
                }
                Err(problem)
            }
        };
        held.ended();
        self.inner.waiters.finished(key);
        answer
    }
}

/// Which kind of claim a [`Held`] is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Callback,
    Validation,
}

/// A claim a delivery holds until it finishes or releases it ([`Held::ended`]). Dropped
/// before that — a delivery that panicked half-way, a bug of payhook's, since handlers and
/// effects are run where their panics are caught — it releases the claim, so that a claim
/// never outlives its delivery: what lets a store whose claims end with this process never
/// take one over.
/// It borrows the delivery's store and nonce: nothing is copied unless it has to release.
struct Held<'a> {
    store: &'a Arc<dyn Store>,
    nonce: &'a Nonce,
    claim: Claim,
    kind: Kind,
    ended: bool,
}

impl<'a> Held<'a> {
    fn new(store: &'a Arc<dyn Store>, nonce: &'a Nonce, claim: Claim, kind: Kind) -> Self {
        Self {
            store,
            nonce,
            claim,
            kind,
            ended: false,
        }
    }

    /// The claim was finished or released: nothing is left to give back.
    fn ended(mut self) {
        self.ended = true;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        tracing::error!(
            nonce = %Logged(self.nonce),
            "a delivery ended without finishing or releasing its claim; released"
        );
        let (store, nonce, claim, kind) = (
            Arc::clone(self.store),
            self.nonce.clone(),
            self.claim,
            self.kind,
        );
        // Off the runtime (it shuts down) the process ends, and claims in memory with it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let released = match kind {
                    Kind::Callback => store.release_callback(&nonce, claim).await,
                    Kind::Validation => store.release_validation(&nonce, claim).await,
                };
                if let Err(error) = released {
                    tracing::warn!(error = %crate::report::InLine(&error), "the claim could not be released; it will be taken over when stale");
                }
            });
        }
    }
}

/// `callback` as a failing callback, for `reason`, now.
fn failure_of(callback: &CallbackBody, reason: String) -> CallbackFailure {
    subject_of(callback).failure(&callback.nonce, callback.transaction_status, reason)
}

/// The payment `callback` books, as a failure or a held result's record keeps it.
fn subject_of(callback: &CallbackBody) -> Subject {
    Subject {
        transaction_reference_id: callback.transaction_reference_id,
        client_id: callback.client_id.clone(),
        amount: callback.amount,
        currency: CallbackFailure::kept_currency(&callback.currency),
    }
}

/// Why a claimed delivery was not booked, and whether its claim ended with the attempt (a
/// shared store's claim is its booking's transaction, and ends with it).
struct NotBooked {
    problem: Problem,
    claim_ended: bool,
}

impl NotBooked {
    /// Not booked before the booking was tried: the claim is still held.
    fn claim_held(problem: Problem) -> Self {
        Self {
            problem,
            claim_ended: false,
        }
    }
}

/// What ran under a claim let go of.
#[derive(Clone, Copy)]
enum Ran {
    /// The handler (or the booking was refused before it for the record's sake): the attempt
    /// counts.
    Handler,
    /// Nothing: given back before any handler ran, it counts no attempt.
    NoHandler,
}

/// Lets go of the claim of a callback not booked: released, or given back when no handler
/// ran. An in-memory claim (sled) ends at once; a shared store's claim ends with its
/// connection if this fails, or is taken over when stale.
async fn let_go(store: &dyn Store, nonce: &Nonce, claim: Claim, ran: Ran) {
    let ended = match ran {
        Ran::Handler => store.release_callback(nonce, claim),
        Ran::NoHandler => store.give_back_callback(nonce, claim),
    };
    if let Err(error) = ended.await {
        tracing::warn!(error = %crate::report::InLine(&error), "the claim could not be let go of; it will be taken over when stale");
    }
}

/// Records `failure` for operators; a store that cannot is only logged.
async fn keep_failure(store: &dyn Store, failure: CallbackFailure) {
    if let Err(error) = store.record_callback_failure(failure).await {
        tracing::warn!(error = %crate::report::InLine(&error), "the failure could not be recorded for operators");
    }
}

/// The refusal of a repeat under a new validation id that no result would follow: of a
/// validation that takes no more repeats (`MAX_REPEATS`, [`Problem::TooManyRepeats`]), or
/// of a postponed one whose decision no record holds any more ([`Problem::RepeatUnlinked`]).
/// A 200 would have the aggregator wait for a result that never comes; refused with 409
/// instead, the payment fails at once rather than hang. Logged with its message.
fn refused_repeat(problem: Problem) -> Problem {
    tracing::warn!(
        refused = %problem.message(),
        "the nonce's validation asked about again under a new validation id: no result could follow a 200, refused with 409"
    );
    problem
}

fn answer_for(decision: &RecordedDecision) -> Answer {
    note::with(|n| {
        n.outcome = Some(match decision {
            RecordedDecision::Allow => Outcome::Allowed,
            RecordedDecision::Deny { .. } => Outcome::Denied,
            RecordedDecision::Postponed => Outcome::Postponed,
        });
    });
    match decision {
        RecordedDecision::Allow => ok("client allowed"),
        RecordedDecision::Deny { message } => Err(Problem::Denied(message.clone())),
        RecordedDecision::Postponed => ok("validation postponed"),
    }
}

/// `changed` (a transaction's last change, by the aggregator's clock) when it lies `horizon`
/// or more in the past: then a missing record of its callback proves nothing, since a record
/// is kept for the store's retention after its booking, which came after that change. `None`
/// for a time within the horizon, in the future, or unknown.
pub(super) fn beyond_horizon(
    changed: Option<chrono::DateTime<chrono::Utc>>,
    horizon: Duration,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let changed = changed?;
    let age = chrono::Utc::now()
        .signed_duration_since(changed)
        .to_std()
        .ok()?;
    (age >= horizon).then_some(changed)
}

/// How far back a callback's last change may lie for its delivery to trust a missing record:
/// the retention, less an allowance for the aggregator's clock running ahead of this one (a
/// tenth of the retention, at most an hour).
fn callback_horizon(retention: Duration) -> Duration {
    retention.saturating_sub((retention / 10).min(Duration::from_secs(3600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_nobody_waits_on_is_forgotten_and_one_in_use_is_kept() {
        let waiters = Waiters::default();
        drop(waiters.for_key(WaitKey::callback("n-1")));
        waiters.forget_if_unused(WaitKey::callback("n-1"));
        assert!(waiters.by_key.lock().unwrap().is_empty());
        let held = waiters.for_key(WaitKey::callback("n-2"));
        waiters.forget_if_unused(WaitKey::callback("n-2"));
        assert_eq!(
            waiters.by_key.lock().unwrap().len(),
            1,
            "a waiter still holds it"
        );
        drop(held);
        waiters.finished(WaitKey::callback("n-2"));
        assert!(waiters.by_key.lock().unwrap().is_empty());
        assert_eq!(waiters.registered.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_finish_wakes_the_registered_waiter_and_costs_nothing_without_one() {
        let waiters = Waiters::default();
        // Nobody registered: nothing to look up, nothing kept.
        waiters.finished(WaitKey::callback("n-1"));
        assert!(waiters.by_key.lock().unwrap().is_empty());
        let notify = waiters.for_key(WaitKey::callback("n-1"));
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        assert_eq!(waiters.registered.load(Ordering::SeqCst), 1);
        waiters.finished(WaitKey::callback("n-1"));
        tokio::time::timeout(Duration::from_secs(5), notified)
            .await
            .expect("the waiter is woken by the finish");
        assert_eq!(waiters.registered.load(Ordering::SeqCst), 0);
        assert!(waiters.by_key.lock().unwrap().is_empty());
    }

    /// The store, the runner and the exactly-once delivery of one test, with a callback
    /// handler and a claim margin (short: a test cannot wait 60 s).
    fn delivery(
        dir: &tempfile::TempDir,
        handler: Arc<dyn crate::handler::ErasedCallback>,
        handler_timeout: Duration,
        stale_margin: Duration,
    ) -> ExactlyOnce {
        let config = crate::config::StoreConfig {
            path: dir.path().join("store"),
            ..crate::config::StoreConfig::default()
        };
        let store: Arc<dyn Store> = Arc::new(crate::store::SledStore::open(&config, &[]).unwrap());
        let runner = Runner::new(
            None,
            None,
            Some(handler),
            handler_timeout,
            Duration::from_secs(1),
        );
        ExactlyOnce {
            inner: Arc::new(Records {
                store: Some(store),
                waiters: Waiters::default(),
                runner,
                awaitable: None,
                metrics: Arc::default(),
                stale_margin,
            }),
        }
    }

    fn callback() -> CallbackBody {
        serde_json::from_str(
            r#"{"id": 1001, "transactionReferenceId": "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
                "nonce": "n-blocking", "providerId": 11, "transactionType": 1,
                "transactionStatus": 4, "clientId": "client-42", "amount": 10.5,
                "currency": "EUR"}"#,
        )
        .unwrap()
    }

    fn context() -> RequestContext {
        RequestContext {
            request_id: "r-1".into(),
            peer: None,
            received_at: chrono::Utc::now(),
            headers: http::HeaderMap::new(),
        }
    }

    /// A callback handler whose first call blocks its thread, as a synchronous client's
    /// call would, until the test lets it go.
    struct BlocksItsThread {
        calls: std::sync::atomic::AtomicU32,
        started: tokio::sync::mpsc::UnboundedSender<()>,
        let_go: Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl crate::handler::CallbackReceiver for BlocksItsThread {
        async fn receive_callback(
            &self,
            _: CallbackBody,
            _: CallbackContext,
        ) -> Result<crate::handler::CallbackDecision, crate::HandlerError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = self.started.send(());
                let _ = self
                    .let_go
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(30));
            }
            Ok(crate::handler::CallbackDecision::Ack)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_that_blocks_its_thread_past_the_claim_margin_runs_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let (let_go, let_go_rx) = std::sync::mpsc::channel();
        let handler = Arc::new(BlocksItsThread {
            calls: std::sync::atomic::AtomicU32::new(0),
            started: started_tx,
            let_go: Mutex::new(let_go_rx),
        });
        let handler_timeout = Duration::from_millis(50);
        let margin = Duration::from_millis(100);
        let once = delivery(&dir, handler.clone(), handler_timeout, margin);
        let first = tokio::spawn({
            let once = once.clone();
            async move { once.deliver(callback(), context()).await }
        });
        started.recv().await.unwrap();
        // The first delivery's claim is now older than the handler timeout and the margin;
        // its handler still blocks its thread (aborting it waits for its next await).
        tokio::time::sleep(handler_timeout + margin * 2).await;
        let second = once.deliver(callback(), context()).await;
        assert!(
            matches!(second, Err(Problem::InFlight { .. })),
            "a second delivery waits, then is answered 503: {second:?}"
        );
        assert!(
            once.inner.waiters.by_key.lock().unwrap().is_empty(),
            "the waiter's entry goes with its answer"
        );
        assert_eq!(once.inner.waiters.registered.load(Ordering::SeqCst), 0);
        assert_eq!(
            handler.calls.load(Ordering::SeqCst),
            1,
            "no second handler ran beside the first"
        );
        // Operators see it among the failing callbacks (written without waiting).
        let store = once.store().unwrap();
        let mut failing = Vec::new();
        for _ in 0..200 {
            failing = store.failing_callbacks().await.unwrap();
            if !failing.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(failing.len(), 1, "{failing:?}");
        assert!(
            failing[0].last_reason.contains("being processed"),
            "{failing:?}"
        );
        let_go.send(()).unwrap();
        let first = first.await.unwrap();
        assert!(
            matches!(first, Err(Problem::HandlerTimedOut { .. })),
            "{first:?}"
        );
        // The overrun released the claim: the next delivery books the callback.
        let third = once.deliver(callback(), context()).await;
        assert_eq!(third.unwrap(), Delivered::Booked);
        assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
        assert!(
            store.failing_callbacks().await.unwrap().is_empty(),
            "booked"
        );
    }

    #[tokio::test]
    async fn a_claim_its_delivery_left_behind_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let (started, _) = tokio::sync::mpsc::unbounded_channel();
        let (_, let_go) = std::sync::mpsc::channel();
        let handler = Arc::new(BlocksItsThread {
            calls: std::sync::atomic::AtomicU32::new(0),
            started,
            let_go: Mutex::new(let_go),
        });
        let once = delivery(&dir, handler, Duration::from_secs(1), STALE_MARGIN);
        let store = once.store().unwrap();
        let nonce = Nonce::from("n-left");
        let begin = || store.begin_callback(&nonce, TransactionStatus::Success, Duration::MAX);
        let CallbackBegin::Claimed { claim, .. } = begin().await.unwrap() else {
            panic!("claimed")
        };
        // Ended: nothing is given back.
        Held::new(store, &nonce, claim, Kind::Callback).ended();
        tokio::task::yield_now().await;
        assert_eq!(begin().await.unwrap(), CallbackBegin::Busy);
        // Dropped as by a panic half-way: released.
        drop(Held::new(store, &nonce, claim, Kind::Callback));
        let mut begun = begin().await.unwrap();
        for _ in 0..100 {
            if begun != CallbackBegin::Busy {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            begun = begin().await.unwrap();
        }
        assert!(
            matches!(begun, CallbackBegin::Claimed { .. }),
            "the claim was released: {begun:?}"
        );
    }
}
