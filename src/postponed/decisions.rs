//! Awaitable decisions: the handler's decision within `validation.time_budget`, the record
//! of a validation it postponed (or that outlasted the budget), the decision that arrives
//! after the answer, and the outbox worker that delivers every result. The server's
//! exactly-once delivery calls it and records what it decides; it runs the merchant's
//! handler through [`ValidationHandler`], which the server implements.

use crate::model::ValidationId;
use std::sync::{
    Arc, Mutex, PoisonError,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};
use std::time::Duration;
use tokio::task::{JoinError, JoinHandle};
use tracing::Instrument;

use super::record::{ALLOWED, Decision, PostponedValidation, Repeat, ValidationResult};
use super::settings::{DeadlineOutcome, ValidationConfig};
use super::{Clock, Outbox, Resolver};
use crate::HandlerError;
use crate::gateway::GatewayClient;
use crate::handler::{RequestContext, ValidationDecision};
use crate::model::TransactionValidationRequest;
use crate::model::timestamp::time_from_ms;
use crate::store::{PostponedStore, RecordedDecision, Store, StoreError};

/// A validation handler's task and its outcome.
pub(crate) type HandlerTask = JoinHandle<Result<ValidationDecision, HandlerError>>;

/// The merchant's validation handler as the Awaitable decisions run it (the server's
/// handler runner implements it): on a task of its own, within a time limit.
pub(crate) trait ValidationHandler: Send + Sync + 'static {
    /// Starts the handler on its own task; `None` when the app has no validation handler.
    fn spawn(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Option<HandlerTask>;

    /// The decision of a finished task; `None` when the handler failed or panicked (which
    /// this logs).
    fn settle(
        &self,
        joined: Result<Result<ValidationDecision, HandlerError>, JoinError>,
    ) -> Option<ValidationDecision>;

    /// How long a handler may run in all (`server.handler_timeout`).
    fn timeout(&self) -> Duration;
}

/// Why a validation got no decision to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undecided {
    /// The app has no validation handler.
    NoHandler,
    /// The handler failed or panicked within the time budget.
    HandlerFailed,
}

/// A validation's decision, ready to be recorded.
pub(crate) struct Decided {
    pub(crate) decision: RecordedDecision,
    /// Awaitable mode: the validation's postponed record.
    pub(crate) postponed: Option<PostponedValidation>,
    /// Awaitable mode: the handler, still deciding after its time budget.
    pub(crate) later: Option<Later>,
}

/// A handler still deciding after its time budget, and when its handler timeout, counted
/// from its start, ends.
pub(crate) struct Later {
    task: HandlerTask,
    until: tokio::time::Instant,
}

impl Later {
    /// Stops the handler (its validation's record could not be written).
    pub(crate) fn abort(&self) {
        self.task.abort();
    }
}

/// The Awaitable transaction validation endpoint: its settings, clock, resolver and outbox,
/// and the handler it decides with. Built by the app's builder when `validation.awaitable`
/// is set; dropped with the app's last clone, which stops the outbox worker.
pub(crate) struct Awaitable {
    config: ValidationConfig,
    clock: Clock,
    resolver: Resolver,
    outbox: Outbox,
    handler: Arc<dyn ValidationHandler>,
    /// Set while a worker runs; its task clears it when it ends (the app dropped, or the
    /// runtime it ran on shut down), so that the next start starts another.
    started: Arc<AtomicBool>,
    /// Started by the first request, unless the builder said `manual_background`.
    automatic: bool,
    /// The outbox worker once started; it stops when the app is dropped (its last clone),
    /// so that a dropped app lets go of its store. What it had not delivered stays in the
    /// outbox for the next start.
    worker: Mutex<Option<tokio::task::AbortHandle>>,
    /// Handlers still deciding after their time budget.
    late: Arc<LateHandlers>,
}

/// Handlers still deciding after their time budget, counted so that a graceful shutdown can
/// wait for them: the aggregator waits for their decisions, and without a deadline nothing
/// else would ever decide their validations.
#[derive(Default)]
struct LateHandlers {
    running: AtomicUsize,
    none_left: tokio::sync::Notify,
}

/// One of [`LateHandlers`], counted until dropped (with its task, however it ends).
struct LateHandler(Arc<LateHandlers>);

impl LateHandler {
    fn new(late: &Arc<LateHandlers>) -> Self {
        late.running.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(late))
    }
}

impl Drop for LateHandler {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.none_left.notify_waiters();
        }
    }
}

impl Drop for Awaitable {
    fn drop(&mut self) {
        let worker = self
            .worker
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(worker) = worker.take() {
            worker.abort();
        }
    }
}

impl Awaitable {
    /// The Awaitable machinery over `store`, posting results through `gateway` (the app's
    /// one session with the aggregator), deciding with `handler`.
    pub(crate) fn new(
        config: &ValidationConfig,
        store: &Arc<dyn Store>,
        gateway: GatewayClient,
        handler: Arc<dyn ValidationHandler>,
    ) -> Self {
        let clock = Clock::new();
        let wake = Arc::default();
        let postponed: Arc<dyn PostponedStore> = Arc::clone(store) as Arc<dyn PostponedStore>;
        let outbox = Outbox::new(postponed, gateway, config.clone(), clock, wake);
        // A clone of the outbox's: its passes see which validations a handler still decides
        // (`Resolver::deciding`), and leave their deadline to them.
        let resolver = outbox.resolver().clone().with_deadline_of(config);
        Self {
            config: config.clone(),
            clock,
            resolver,
            outbox,
            handler,
            started: Arc::default(),
            automatic: true,
            worker: Mutex::default(),
            late: Arc::default(),
        }
    }

    /// Resolves once no handler is deciding after its time budget any more (each ends
    /// within the handler timeout).
    pub(crate) async fn late_handlers_finished(&self) {
        loop {
            let none_left = self.late.none_left.notified();
            tokio::pin!(none_left);
            none_left.as_mut().enable();
            if self.late.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            none_left.await;
        }
    }

    /// Whether the first request starts the background work.
    pub(crate) fn automatic(mut self, automatic: bool) -> Self {
        self.automatic = automatic;
        self
    }

    pub(crate) fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    pub(crate) fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Starts the outbox worker on the current tokio runtime, unless one runs.
    pub(crate) fn start(&self) {
        if !self.started.swap(true, Ordering::SeqCst) {
            let running = Running(Arc::clone(&self.started));
            let outbox = self.outbox.clone();
            let worker = tokio::spawn(async move {
                let _running = running;
                outbox.run().await;
            });
            *self.worker.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(worker.abort_handle());
        }
    }

    /// Starts the worker unless the builder said `manual_background`: called by `serve` and
    /// with every request (a cheap check once started).
    pub(crate) fn start_automatically(&self) {
        // Outside a tokio runtime (an executor of the caller's own) there is nowhere to run
        // the worker: `start` on a runtime starts it then.
        if self.automatic
            && !self.started.load(Ordering::Relaxed)
            && tokio::runtime::Handle::try_current().is_ok()
        {
            self.start();
        }
    }

    /// Runs the handler within the time budget and turns its decision into the record of an
    /// Awaitable validation: a decision taken is queued for delivery, a postponement (or a
    /// spent budget) leaves it pending.
    pub(crate) async fn decide(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Result<Decided, Undecided> {
        let received_ms = self.clock.now_ms();
        let received = time_from_ms(received_ms);
        let deadline = self
            .config
            .deadline
            .map(|d| time_from_ms(received_ms.saturating_add(millis(d))));
        let mut postponed = PostponedValidation::new(request.clone(), received, deadline);
        let started = tokio::time::Instant::now();
        let mut task = self
            .handler
            .spawn(request, ctx)
            .ok_or(Undecided::NoHandler)?;
        let Ok(joined) = tokio::time::timeout(self.config.time_budget, &mut task).await else {
            tracing::info!(
                budget = ?self.config.time_budget,
                "the handler is still deciding after its time budget; answering 200 (postponed)"
            );
            return Ok(Decided {
                decision: RecordedDecision::Postponed,
                postponed: Some(postponed),
                later: Some(Later {
                    task,
                    until: started + self.handler.timeout(),
                }),
            });
        };
        let (decision, result) = match self
            .handler
            .settle(joined)
            .ok_or(Undecided::HandlerFailed)?
        {
            ValidationDecision::Allow => (RecordedDecision::Allow, Some((true, ALLOWED.into()))),
            ValidationDecision::Deny { message } => (
                RecordedDecision::Deny {
                    message: message.clone(),
                },
                Some((false, message)),
            ),
            ValidationDecision::Postpone => (RecordedDecision::Postponed, None),
        };
        postponed.result = result.map(|(success, description)| {
            ValidationResult::queued(success, description, None, received)
        });
        Ok(Decided {
            decision,
            postponed: Some(postponed),
            later: None,
        })
    }

    /// A validation whose nonce has a recorded decision, asked about again: under a new
    /// validation id it is recorded as a repeat of the validation that holds the decision
    /// (see [`PostponedStore::repeat`]), so that the aggregator gets a result for that id
    /// too. Returns once that is durable, what the store did; a retry under the same id
    /// changes nothing. When none holds it, an approval is recorded afresh under the id
    /// ([`Repeat::RecordedAfresh`]). No result will be posted for the new id when the
    /// validation that holds the nonce's decision takes no more repeats ([`Repeat::Full`])
    /// or none holds a decision that is not an approval ([`Repeat::Unlinked`]): the caller
    /// must not answer a postponed decision with a 200 the aggregator would wait on.
    /// [`StoreError::ValidationIdTaken`] when the id is another nonce's validation.
    pub(crate) async fn repeated(
        &self,
        store: &dyn Store,
        request: &TransactionValidationRequest,
    ) -> Result<Repeat, StoreError> {
        let validation_id = request.validation_id;
        // A retry of the same validation, the usual repeat, is answered `Known` by the store
        // with nothing written. Not read here first: a record another request of the same id
        // is writing may be visible before it is durable (on sled, until its flush ends), and
        // this request would be answered on a record a crash could still lose.
        let repeat = store.repeat(request, self.clock.now()).await?;
        match &repeat {
            Repeat::Known | Repeat::Full => {}
            // Written by another nonce's validation after the service's check.
            Repeat::Taken => return Err(StoreError::ValidationIdTaken(validation_id.get())),
            Repeat::Recorded { of, decided } => {
                tracing::info!(
                    validation_id = validation_id.get(),
                    repeats = of.get(),
                    decided,
                    "the nonce's validation asked about again under a new validation id; it gets the same result"
                );
                if *decided {
                    self.result_queued();
                }
            }
            Repeat::RecordedAfresh => {
                tracing::warn!(
                    validation_id = validation_id.get(),
                    "the nonce's validation asked about again, but no postponed validation holds its approval (decided outside Awaitable mode, or its record is gone); the id is recorded as approved, and its result queued"
                );
                self.result_queued();
            }
            Repeat::Unlinked => tracing::warn!(
                validation_id = validation_id.get(),
                "the nonce's validation asked about again, but no postponed validation holds its decision (decided outside Awaitable mode, or its record is gone); answered as recorded where that was a denial, and no result is posted for the id"
            ),
        }
        Ok(repeat)
    }

    /// Wakes the outbox worker: a result was queued with the validation's record.
    pub(crate) fn result_queued(&self) {
        self.outbox.wake();
    }

    /// Waits for a handler that overran its time budget, until its handler timeout (counted
    /// from its start, the budget included) ends, and resolves the validation with its
    /// decision. A handler is never waited for longer: a deadline (which must be later than
    /// the handler timeout) then never decides a validation whose handler is still running,
    /// and a late decision is never refused as a conflict with the deadline's outcome. Nor
    /// is its record, when the store is slow to take it: until it is recorded (or refused
    /// for good), this process applies no deadline to the validation
    /// ([`Resolver::deciding`]). Another instance on the same PostgreSQL database may — the
    /// reason to keep the deadline well past the handler timeout, which the service warns of
    /// at start.
    pub(crate) fn resolve_later(&self, validation_id: ValidationId, later: Later) {
        let (handler, resolver) = (Arc::clone(&self.handler), self.resolver.clone());
        let Later { mut task, until } = later;
        let limit = handler.timeout();
        let counted = LateHandler::new(&self.late);
        // Marked before the task starts, until its decision is recorded (or refused for good).
        let deciding = resolver.deciding(validation_id);
        // A handler that fails after its budget has no decision to give, and nothing would
        // ever decide the validation (the aggregator waits for a result): it gets the
        // deadline's outcome — a refusal unless configured otherwise.
        let failed = (
            self.config.deadline_outcome == DeadlineOutcome::Allow,
            self.config.deadline_description.clone(),
        );
        let later = async move {
            let decision = match tokio::time::timeout_at(until, &mut task).await {
                Ok(joined) => handler.settle(joined),
                Err(_) => {
                    task.abort();
                    let _ = (&mut task).await;
                    tracing::error!(timeout = ?limit, "the handler overran its time budget and then the handler timeout");
                    None
                }
            };
            let (success, description) = match decision {
                Some(ValidationDecision::Allow) => (true, ALLOWED.to_owned()),
                Some(ValidationDecision::Deny { message }) => (false, message),
                Some(ValidationDecision::Postpone) => return,
                None => {
                    tracing::error!(
                        success = failed.0,
                        "the handler gave no decision after its time budget; resolving with the deadline outcome"
                    );
                    failed
                }
            };
            resolver
                .resolve_until_recorded(validation_id, Decision::allow_if(success, description))
                .await;
            drop(deciding);
            drop(counted);
        };
        tokio::spawn(later.in_current_span());
    }
}

/// Clears the worker's flag when its task ends, however it ends.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::GatewayConfig;

    /// A validation handler never run: the test asks only how the parts are wired.
    struct NeverRun;

    impl ValidationHandler for NeverRun {
        fn spawn(&self, _: TransactionValidationRequest, _: RequestContext) -> Option<HandlerTask> {
            None
        }

        fn settle(
            &self,
            _: Result<Result<ValidationDecision, HandlerError>, JoinError>,
        ) -> Option<ValidationDecision> {
            None
        }

        fn timeout(&self) -> Duration {
            Duration::from_secs(20)
        }
    }

    /// The outbox applies deadlines through a clone of the decisions' resolver: a
    /// validation a late handler still decides is marked where the outbox's passes look.
    #[test]
    fn the_outbox_sees_which_validations_a_handler_still_decides() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::StoreConfig {
            path: dir.path().join("store"),
            ..crate::config::StoreConfig::default()
        };
        let store: Arc<dyn Store> = Arc::new(crate::store::SledStore::open(&config, &[]).unwrap());
        let gateway = GatewayClient::new(&GatewayConfig {
            auth_url: Some("http://127.0.0.1:1".into()),
            gateway_url: Some("http://127.0.0.1:1".into()),
            username: Some("shop".into()),
            password: Some("pw".into()),
            ..GatewayConfig::default()
        })
        .unwrap();
        let awaitable = Awaitable::new(
            &ValidationConfig::default(),
            &store,
            gateway,
            Arc::new(NeverRun),
        );
        let validation_id = ValidationId::from(7);
        let deciding = awaitable.resolver().deciding(validation_id);
        assert!(awaitable.outbox().resolver().is_deciding(validation_id));
        drop(deciding);
        assert!(!awaitable.outbox().resolver().is_deciding(validation_id));
    }
}
