//! Awaitable decisions (see [`crate::postponed`]): the handler's decision within the time
//! budget, the pending record, the decision that arrives after the answer, and the outbox
//! worker that delivers the results. A component of the server that owns its state; the
//! exactly-once delivery calls it, and it calls the handler runner.

use std::sync::{
    Arc, Mutex, PoisonError,
    atomic::{AtomicBool, Ordering},
};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::BuildError;
use super::problem::Problem;
use super::route::Endpoint;
use super::runner::Runner;
use crate::HandlerError;
use crate::config::Config;
use crate::gateway::GatewayClient;
use crate::handler::{RequestContext, ValidationDecision};
use crate::model::TransactionValidationRequest;
use crate::postponed::{Clock, Delivery, Outbox, PostponedValidation, Resolver, ValidationResult};
use crate::postponed::{DeadlineOutcome, Decision, ValidationConfig};
use crate::store::{RecordedDecision, Store, time_from_ms};

/// A validation's decision, ready to be recorded.
pub(super) struct Decided {
    pub(super) decision: RecordedDecision,
    /// Awaitable mode: the validation's postponed record.
    pub(super) postponed: Option<PostponedValidation>,
    /// Awaitable mode: the handler, still deciding after its time budget.
    pub(super) later: Option<JoinHandle<Result<ValidationDecision, HandlerError>>>,
}

/// The Awaitable transaction validation endpoint: its settings, clock, resolver and outbox,
/// and the handler runner it decides with. Built by the app's builder when
/// `validation.awaitable` is set; dropped with the app's last clone.
pub(super) struct Awaitable {
    config: ValidationConfig,
    clock: Clock,
    resolver: Resolver,
    outbox: Outbox,
    runner: Runner,
    started: AtomicBool,
    /// Started by the first request, unless the builder said `manual_background`.
    automatic: bool,
    /// The outbox worker once started; it stops when the app is dropped (its last clone),
    /// so that a dropped app lets go of its store. What it had not delivered stays in the
    /// outbox for the next start.
    worker: Mutex<Option<tokio::task::AbortHandle>>,
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
    /// The Awaitable machinery when `validation.awaitable` is set; `None` otherwise.
    /// `gateway` is the app's client of the aggregator (one session for the whole app).
    pub(super) fn from_config(
        config: &Config,
        store: Option<&Arc<dyn Store>>,
        gateway: Option<&GatewayClient>,
        runner: &Runner,
    ) -> Result<Option<Self>, BuildError> {
        if !config.validation.awaitable {
            return Ok(None);
        }
        let store = store.ok_or(BuildError::AwaitableWithoutStore)?;
        // A complete [gateway] is checked by the configuration's validation.
        let gateway = match gateway {
            Some(gateway) => gateway.clone(),
            None => GatewayClient::new(&config.gateway)?,
        };
        let clock = Clock::new();
        let wake = Arc::default();
        let resolver = Resolver::new(Arc::clone(store), clock, Arc::clone(&wake));
        let outbox = Outbox::new(
            Arc::clone(store),
            gateway,
            config.validation.clone(),
            clock,
            wake,
        );
        Ok(Some(Self {
            config: config.validation.clone(),
            clock,
            resolver,
            outbox,
            runner: runner.clone(),
            started: AtomicBool::new(false),
            automatic: true,
            worker: Mutex::default(),
        }))
    }

    /// Whether the first request starts the background work.
    pub(super) fn automatic(mut self, automatic: bool) -> Self {
        self.automatic = automatic;
        self
    }

    pub(super) fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    pub(super) fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Starts the outbox worker on the current tokio runtime, once.
    pub(super) fn start(&self) {
        if !self.started.swap(true, Ordering::SeqCst) {
            let worker = tokio::spawn(self.outbox.clone().run()).abort_handle();
            *self.worker.lock().unwrap_or_else(PoisonError::into_inner) = Some(worker);
        }
    }

    /// Starts the worker unless the builder said `manual_background`: called by `serve` and
    /// with every request (a cheap check once started).
    pub(super) fn start_automatically(&self) {
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
    pub(super) async fn decide(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Result<Decided, Problem> {
        let received_ms = self.clock.now_ms();
        let received = time_from_ms(received_ms);
        let mut postponed = PostponedValidation {
            validation_id: request.validation_id,
            request: request.clone(),
            received,
            deadline: self
                .config
                .deadline
                .map(|d| time_from_ms(received_ms.saturating_add(millis(d)))),
            result: None,
        };
        let mut task = self.runner.spawn_validation(request, ctx)?;
        let Ok(joined) = tokio::time::timeout(self.config.time_budget, &mut task).await else {
            tracing::info!(
                budget = ?self.config.time_budget,
                "the handler is still deciding after its time budget; answering 200 (postponed)"
            );
            return Ok(Decided {
                decision: RecordedDecision::Postponed,
                postponed: Some(postponed),
                later: Some(task),
            });
        };
        let (decision, result) = match self
            .runner
            .settle(Endpoint::TransactionValidation, joined)?
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
        postponed.result = result.map(|(success, description)| ValidationResult {
            success,
            description,
            decided: received,
            delivery: Delivery::queued(received),
        });
        Ok(Decided {
            decision,
            postponed: Some(postponed),
            later: None,
        })
    }

    /// Wakes the outbox worker: a result was queued with the validation's record.
    pub(super) fn result_queued(&self) {
        self.outbox.wake();
    }

    /// Waits (within the handler timeout) for a handler that overran its time budget, and
    /// resolves the validation with its decision.
    pub(super) fn resolve_later(
        &self,
        validation_id: i64,
        mut task: JoinHandle<Result<ValidationDecision, HandlerError>>,
    ) {
        let (runner, resolver) = (self.runner.clone(), self.resolver.clone());
        let limit = runner.handler_timeout();
        // A handler that fails after its budget has no decision to give, and nothing would
        // ever decide the validation (the aggregator waits for a result): it gets the
        // deadline's outcome — a refusal unless configured otherwise.
        let failed = (
            self.config.deadline_outcome == DeadlineOutcome::Allow,
            self.config.deadline_description.clone(),
        );
        let later = async move {
            let decision = match tokio::time::timeout(limit, &mut task).await {
                Ok(joined) => runner.settle(Endpoint::TransactionValidation, joined).ok(),
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
            if let Err(error) = resolver
                .resolve(validation_id, Decision::allow_if(success, description))
                .await
            {
                tracing::warn!(%error, "the handler's late decision was not recorded");
            }
        };
        tokio::spawn(later.in_current_span());
    }
}

/// The description posted with an `Allow`.
const ALLOWED: &str = "client allowed";

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
