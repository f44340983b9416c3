//! The transaction validation endpoint in Awaitable mode (see [`crate::postponed`]): the
//! handler's decision within the time budget, the pending record, and the decision that
//! arrives after the answer.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::exactly_once::Decided;
use super::route::Endpoint;
use super::{App, BuildError, Problem};
use crate::HandlerError;
use crate::config::Config;
use crate::gateway::GatewayClient;
use crate::handler::{RequestContext, ValidationDecision};
use crate::model::TransactionValidationRequest;
use crate::postponed::{Clock, Delivery, Outbox, PostponedValidation, Resolver, ValidationResult};
use crate::postponed::{DeadlineOutcome, Decision, ValidationConfig};
use crate::store::{RecordedDecision, Store, time_from_ms};

/// What an app in Awaitable mode has besides the handlers.
pub(super) struct Awaitable {
    config: ValidationConfig,
    clock: Clock,
    resolver: Resolver,
    outbox: Outbox,
    started: AtomicBool,
    /// Started by the first request, unless the builder said `manual_background`.
    automatic: bool,
    /// The outbox worker once started; it stops when the app is dropped (its last clone),
    /// so that a dropped app lets go of its store. What it had not delivered stays in the
    /// outbox for the next start.
    worker: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Awaitable {
    fn drop(&mut self) {
        let worker = self
            .worker
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
            started: AtomicBool::new(false),
            automatic: true,
            worker: std::sync::Mutex::default(),
        }))
    }

    /// Whether the first request starts the background work.
    pub(super) fn automatic(mut self, automatic: bool) -> Self {
        self.automatic = automatic;
        self
    }
}

impl App {
    /// Decides validations postponed by this app (Awaitable mode); `None` when
    /// `validation.awaitable` is off.
    pub fn resolver(&self) -> Option<Resolver> {
        self.inner.awaitable.as_ref().map(|a| a.resolver.clone())
    }

    /// The app's store; `None` when built `without_store`.
    pub fn store(&self) -> Option<Arc<dyn Store>> {
        self.inner.store.clone()
    }

    /// The worker delivering this app's postponed results; `None` when not Awaitable.
    pub fn outbox(&self) -> Option<Outbox> {
        self.inner.awaitable.as_ref().map(|a| a.outbox.clone())
    }

    /// Starts the background work of the app (the outbox worker in Awaitable mode) on the
    /// current tokio runtime, once; it stops when the last clone of the app is dropped. [`crate::serve`] calls it, and an app mounted in a server
    /// of your own calls it with its first request; call it earlier to deliver the results
    /// a previous run left in the outbox before any request arrives.
    pub fn start_background(&self) {
        if let Some(awaitable) = &self.inner.awaitable
            && !awaitable.started.swap(true, Ordering::SeqCst)
        {
            let worker = tokio::spawn(awaitable.outbox.clone().run()).abort_handle();
            *awaitable
                .worker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(worker);
        }
    }

    /// Starts the background work unless the app was built with `manual_background`:
    /// called by `serve` and with every request (a cheap check once started).
    pub(super) fn start_automatic_background(&self) {
        // Outside a tokio runtime (an executor of the caller's own) there is nowhere to run
        // the worker: `start_background` on a runtime starts it then.
        if let Some(awaitable) = &self.inner.awaitable
            && awaitable.automatic
            && !awaitable.started.load(Ordering::Relaxed)
            && tokio::runtime::Handle::try_current().is_ok()
        {
            self.start_background();
        }
    }

    /// `true` when the transaction validation endpoint is Awaitable.
    pub(super) fn is_awaitable(&self) -> bool {
        self.inner.awaitable.is_some()
    }

    /// Runs the handler within the time budget and turns its decision into the record of an
    /// Awaitable validation: a decision taken is queued for delivery, a postponement (or a
    /// spent budget) leaves it pending.
    pub(super) async fn decide_awaitable(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Result<Decided, Problem> {
        let (awaitable, handler) = match (&self.inner.awaitable, &self.inner.validation) {
            (Some(awaitable), Some(handler)) => (awaitable, Arc::clone(handler)),
            _ => return Err(Problem::NotFound),
        };
        let received_ms = awaitable.clock.now_ms();
        let received = time_from_ms(received_ms);
        let mut postponed = PostponedValidation {
            validation_id: request.validation_id,
            request: request.clone(),
            received,
            deadline: awaitable
                .config
                .deadline
                .map(|d| time_from_ms(received_ms.saturating_add(millis(d)))),
            result: None,
        };
        let mut task = tokio::spawn(handler.call(request, ctx).in_current_span());
        let Ok(joined) = tokio::time::timeout(awaitable.config.time_budget, &mut task).await else {
            tracing::info!(
                budget = ?awaitable.config.time_budget,
                "the handler is still deciding after its time budget; answering 200 (postponed)"
            );
            return Ok(Decided {
                decision: RecordedDecision::Postponed,
                postponed: Some(postponed),
                later: Some(task),
            });
        };
        let (decision, result) = match self.settle(Endpoint::TransactionValidation, joined)? {
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
        if let Some(awaitable) = &self.inner.awaitable {
            awaitable.outbox.wake();
        }
    }

    /// Waits (within the handler timeout) for a handler that overran its time budget, and
    /// resolves the validation with its decision.
    pub(super) fn resolve_later(
        &self,
        validation_id: i64,
        mut task: JoinHandle<Result<ValidationDecision, HandlerError>>,
    ) {
        let (Some(resolver), Some(awaitable)) = (self.resolver(), self.inner.awaitable.as_ref())
        else {
            return;
        };
        let app = self.clone();
        let limit = self.inner.server.handler_timeout;
        // A handler that fails after its budget has no decision to give, and nothing would
        // ever decide the validation (the aggregator waits for a result): it gets the
        // deadline's outcome — a refusal unless configured otherwise.
        let failed = (
            awaitable.config.deadline_outcome == DeadlineOutcome::Allow,
            awaitable.config.deadline_description.clone(),
        );
        let later = async move {
            let decision = match tokio::time::timeout(limit, &mut task).await {
                Ok(joined) => app.settle(Endpoint::TransactionValidation, joined).ok(),
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
