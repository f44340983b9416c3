//! The handler runner: the merchant's three handlers, each run on a task of its own within
//! `server.handler_timeout`, their failures, panics and overruns turned into the problem to
//! answer. Nothing below it in the server: the exactly-once delivery and the Awaitable
//! decisions call it, never the other way round.

use std::{future::Future, sync::Arc, time::Duration};
use tokio::task::JoinError;
use tracing::Instrument;

use super::problem::Problem;
use super::route::Endpoint;
use crate::HandlerError;
use crate::handler::{
    BoxFuture, CallbackContext, CallbackDecision, ErasedCallback, ErasedProviders,
    ErasedValidation, ProvidersDecision, RequestContext, ValidationDecision,
};
use crate::model::{CallbackBody, ProvidersValidationRequest, TransactionValidationRequest};
use crate::postponed::{HandlerTask, ValidationHandler};
use crate::store::RecordedDecision;

/// The handlers and how they are run. Cheap to clone: clones share the handlers.
#[derive(Clone)]
pub(super) struct Runner {
    inner: Arc<Handlers>,
}

/// Created once by the app's builder; lives as long as any clone of the runner.
struct Handlers {
    providers: Option<Arc<dyn ErasedProviders>>,
    validation: Option<Arc<dyn ErasedValidation>>,
    callbacks: Option<Arc<dyn ErasedCallback>>,
    handler_timeout: Duration,
    /// What a 503 asks the aggregator to wait (`callback.retry_after`).
    retry_after: Duration,
}

impl Runner {
    pub(super) fn new(
        providers: Option<Arc<dyn ErasedProviders>>,
        validation: Option<Arc<dyn ErasedValidation>>,
        callbacks: Option<Arc<dyn ErasedCallback>>,
        handler_timeout: Duration,
        retry_after: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Handlers {
                providers,
                validation,
                callbacks,
                handler_timeout,
                retry_after,
            }),
        }
    }

    /// `true` when a handler of `endpoint` was given.
    pub(super) fn serves(&self, endpoint: Endpoint) -> bool {
        match endpoint {
            Endpoint::ProvidersValidation => self.inner.providers.is_some(),
            Endpoint::TransactionValidation => self.inner.validation.is_some(),
            Endpoint::Callback => self.inner.callbacks.is_some(),
        }
    }

    pub(super) fn handler_timeout(&self) -> Duration {
        self.inner.handler_timeout
    }

    pub(super) fn retry_after(&self) -> Duration {
        self.inner.retry_after
    }

    /// The providers handler's decision.
    pub(super) async fn providers(
        &self,
        request: ProvidersValidationRequest,
        ctx: RequestContext,
    ) -> Result<ProvidersDecision, Problem> {
        let handler = self.inner.providers.clone().ok_or(Problem::NotFound)?;
        self.run(Endpoint::ProvidersValidation, handler.call(request, ctx))
            .await
    }

    /// The validation handler's decision on an endpoint that is not Awaitable: a decision
    /// to record, or the problem to answer (`Postpone` there is a configuration error).
    pub(super) async fn validate(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Result<RecordedDecision, Problem> {
        let handler = self.inner.validation.clone().ok_or(Problem::NotFound)?;
        let validation_id = request.validation_id;
        match self
            .run(Endpoint::TransactionValidation, handler.call(request, ctx))
            .await?
        {
            ValidationDecision::Allow => Ok(RecordedDecision::Allow),
            ValidationDecision::Deny { message } => Ok(RecordedDecision::Deny { message }),
            ValidationDecision::Postpone => {
                tracing::error!(
                    validation_id = validation_id.get(),
                    "handler postponed a validation, but the endpoint is not declared Awaitable; answering 500"
                );
                Err(Problem::NotAwaitable)
            }
        }
    }

    /// Runs the callback handler: `Ok` when it acknowledged, the problem to answer otherwise.
    pub(super) async fn acknowledge(
        &self,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> Result<(), Problem> {
        let handler = self.inner.callbacks.clone().ok_or(Problem::NotFound)?;
        match self
            .run(Endpoint::Callback, handler.call(callback, ctx))
            .await?
        {
            CallbackDecision::Ack => Ok(()),
            CallbackDecision::RetryLater { reason } => Err(Problem::RetryLater {
                reason,
                retry_after: self.inner.retry_after,
            }),
        }
    }

    /// Runs `work` on its own task, so that the caller going away (a disconnected client, a
    /// dropped future) cannot stop it half-way; a panic in it is answered as a failed handler.
    pub(super) async fn detached<T: Send + 'static>(
        &self,
        endpoint: Endpoint,
        work: impl Future<Output = Result<T, Problem>> + Send + 'static,
    ) -> Result<T, Problem> {
        // Boxed: the task then holds a pointer, not the work's whole state, which tokio
        // would otherwise copy in and out of the task's cell at spawn and at each stage.
        tokio::spawn(carried(Box::pin(work.in_current_span())))
            .await
            .unwrap_or_else(|error| {
                tracing::error!(endpoint = endpoint.name(), %error, "request processing panicked");
                Err(Problem::HandlerFailed {
                    endpoint,
                    retry_after: self.inner.retry_after,
                })
            })
    }

    /// Runs a handler on its own task within the handler timeout.
    ///
    /// The task is not cancelled when the client goes away, so that a handler is never
    /// stopped half-way by a dropped connection; the timeout runs on that task too, so a
    /// handler is stopped when it overruns, whoever is still waiting for it. A stopped
    /// handler ends at its next await (until then it still runs); the answer waits for that,
    /// and the nonce stays claimed meanwhile, so that no second run can start beside it.
    async fn run<T: Send + 'static>(
        &self,
        endpoint: Endpoint,
        handler: BoxFuture<T>,
    ) -> Result<T, Problem> {
        let timeout = self.inner.handler_timeout;
        let started = tokio::time::Instant::now();
        let task = tokio::spawn(carried(
            tokio::time::timeout(timeout, handler).in_current_span(),
        ));
        match task.await {
            // A handler that blocked its thread past the timeout is late when it returns,
            // whatever it returns: its claim may have been taken over meanwhile.
            Ok(Ok(decided)) if started.elapsed() < timeout => self.settle(endpoint, Ok(decided)),
            Ok(_) => {
                tracing::error!(endpoint = endpoint.name(), ?timeout, "handler timed out");
                Err(Problem::HandlerTimedOut {
                    endpoint,
                    retry_after: self.inner.retry_after,
                })
            }
            Err(join_error) => self.settle(endpoint, Err(join_error)),
        }
    }

    /// The outcome of a handler's task: its decision, or the problem to answer.
    pub(super) fn settle<T>(
        &self,
        endpoint: Endpoint,
        joined: Result<Result<T, HandlerError>, JoinError>,
    ) -> Result<T, Problem> {
        match joined {
            Ok(Ok(decision)) => Ok(decision),
            Ok(Err(error)) => {
                tracing::error!(endpoint = endpoint.name(), error = %crate::report::InLine(error.source_error()), "handler failed");
                Err(self.failed(endpoint))
            }
            Err(join_error) => {
                tracing::error!(endpoint = endpoint.name(), error = %join_error, "handler panicked");
                Err(self.failed(endpoint))
            }
        }
    }

    /// A handler that failed, panicked or whose effects did not apply.
    pub(super) fn failed(&self, endpoint: Endpoint) -> Problem {
        Problem::HandlerFailed {
            endpoint,
            retry_after: self.inner.retry_after,
        }
    }
}

/// The Awaitable decisions run the validation handler through the runner, and bound it by
/// their time budget themselves.
impl ValidationHandler for Runner {
    fn spawn(
        &self,
        request: TransactionValidationRequest,
        ctx: RequestContext,
    ) -> Option<HandlerTask> {
        let handler = self.inner.validation.clone()?;
        Some(tokio::spawn(handler.call(request, ctx).in_current_span()))
    }

    fn settle(
        &self,
        joined: Result<Result<ValidationDecision, HandlerError>, JoinError>,
    ) -> Option<ValidationDecision> {
        Runner::settle(self, Endpoint::TransactionValidation, joined).ok()
    }

    fn timeout(&self) -> Duration {
        self.inner.handler_timeout
    }
}

/// `work` with the request's trace context and inspector note, for a task of its own: what
/// it does belongs to the request that spawned it (its gateway calls to the request's
/// trace, its outcome to the request's note).
fn carried<F: Future>(work: F) -> impl Future<Output = F::Output> {
    use crate::{inspector::note, trace_context::TraceContext};
    // Wrappers, not an `async` block: the work is held once, not once per layer.
    note::scope(
        note::current(),
        TraceContext::scope_of(TraceContext::current(), work),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{ProvidersValidator, RequestContext};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A providers handler that waits for ever, telling whether it was stopped.
    #[derive(Default)]
    struct Hangs {
        stopped: Arc<AtomicBool>,
    }

    /// Sets its flag when dropped: the handler's future went without finishing.
    struct Stopped(Arc<AtomicBool>);

    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    impl ProvidersValidator for Hangs {
        async fn validate_providers(
            &self,
            _: ProvidersValidationRequest,
            _: RequestContext,
        ) -> Result<crate::handler::ProvidersDecision, crate::HandlerError> {
            let _stopped = Stopped(Arc::clone(&self.stopped));
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_providers_handler_is_stopped_at_its_timeout_when_its_client_went_away() {
        let handler = Hangs::default();
        let stopped = Arc::clone(&handler.stopped);
        let runner = Runner::new(
            Some(Arc::new(handler)),
            None,
            None,
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        let request: ProvidersValidationRequest = serde_json::from_str(
            r#"{"transactionData": {"merchantData": {"merchantHash": "h", "clientId": "c"},
                "paymentData": {"nonce": "n-1", "amount": 10, "currency": "EUR"},
                "cashIn": true},
               "providers": []}"#,
        )
        .unwrap();
        let ctx = RequestContext {
            request_id: "r-1".into(),
            peer: None,
            received_at: chrono::Utc::now(),
            headers: http::HeaderMap::new(),
        };
        // The request's future, dropped as a closed connection drops it.
        let answering = tokio::spawn(async move { runner.providers(request, ctx).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        answering.abort();
        let _ = answering.await;
        assert!(
            !stopped.load(Ordering::SeqCst),
            "not stopped before its timeout"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(stopped.load(Ordering::SeqCst), "stopped at its timeout");
    }
}
