//! The simulator from Rust, as a merchant's own integration test uses it: a mock gateway, a
//! service in Awaitable mode, a postponed validation resolved and its result awaited at the
//! mock, then a callback delivered as the aggregator delivers it.
//!
//! ```text
//! cargo run --example simulate
//! ```
//!
//! `cargo test` runs it too (it is a test of its own).

#![allow(clippy::print_stdout, reason = "an example prints its outcome")]

use payhook::handler::{
    CallbackContext, CallbackDecision, CallbackReceiver, RequestContext, TransactionValidator,
    ValidationDecision,
};
use payhook::model::{CallbackBody, CallbackSettings, TransactionValidationRequest};
use payhook::postponed::Decision;
use payhook::sim::{
    MockControl, MockGateway, MockGatewayConfig, Payment, RequestKind, Schedule, Trigger,
    deliver_callback, to_text,
};
use payhook::{App, Config, HandlerError};
use std::time::Duration;

/// The merchant under test: postpones every validation, acknowledges every callback (it books
/// nothing: the test looks at what the aggregator's side sees).
struct Shop;

impl TransactionValidator for Shop {
    async fn validate_transaction(
        &self,
        _: TransactionValidationRequest,
        _: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        Ok(ValidationDecision::Postpone)
    }
}

impl CallbackReceiver for Shop {
    async fn receive_callback(
        &self,
        _: CallbackBody,
        _: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        Ok(CallbackDecision::Ack)
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The aggregator's side: a mock gateway on a free loopback port.
    let mock = MockGateway::start(MockGatewayConfig::default()).await?;

    // 2. The merchant's service, Awaitable, talking to the mock.
    let data = tempfile::tempdir()?;
    let mut config = Config::default();
    config.store.path = data.path().join("store");
    config.callback.allow_unsigned = true; // a test without keys; production verifies
    config.gateway = mock.gateway_config();
    config.validation.awaitable = true;
    // Its decisions are posted to the aggregator, so the endpoint answers only its caller:
    // here the simulated aggregator on this machine (a service sets a method or the
    // aggregator's addresses).
    config.auth.transaction_validation.allow_ips = vec!["127.0.0.1/32".into()];
    let app = App::builder(config)
        .transaction_validator(Shop)
        .callback_receiver(Shop)
        .build()?;
    let resolver = app.resolver().ok_or("Awaitable mode")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));

    // 3. A transaction validation: postponed, then resolved; the result reaches the mock.
    let trigger = Trigger::new(None)?;
    let payment = Payment::default();
    let body = to_text(&payment.body(RequestKind::TransactionValidation));
    let url = format!(
        "{base}{}",
        RequestKind::TransactionValidation.default_path()
    );
    let answer = trigger.send(&url, body.as_bytes()).await?;
    assert_eq!(answer.message().as_deref(), Some("validation postponed"));
    resolver
        .resolve(payment.validation_id, Decision::allow("documents checked"))
        .await?;
    let control = MockControl::new(&mock.url())?;
    let result = control
        .await_validation_result(payment.validation_id, Duration::from_secs(10))
        .await?
        .ok_or("no result posted")?;
    assert!(result.success);

    // 4. The payment's callback, delivered as the aggregator does, recorded on the mock.
    let settings = [CallbackSettings {
        collab_id: payment.collab_id,
        callback_url: format!("{base}{}", RequestKind::Callback.default_path()),
        max_attempts: 17,
        is_enabled: true,
        add_signature: false,
        transaction_type_id: None,
    }];
    let body = to_text(&payment.body(RequestKind::Callback));
    let report = deliver_callback(
        &trigger,
        &payment,
        body.as_bytes(),
        &settings,
        &Schedule::default().fast(),
        Some(&control),
        |_, _| {},
    )
    .await?;
    assert_eq!(report.status(), "Delivered");
    let record = mock
        .transaction(payment.reference_id)
        .ok_or("no record at the mock")?;
    println!(
        "validation {} → {}; callback {} → {}",
        payment.validation_id,
        result.description,
        record.nonce,
        record.callback_delivery_status.unwrap_or_default()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run().await
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_simulated_flow_runs() {
        super::run().await.expect("the flow runs");
    }
}
