//! The simulator against the example merchant and test merchants: signed triggers of every
//! kind are accepted and a tampered one refused; callback delivery picks recipients, stops at
//! the first 2xx, gives up after `maxAttempts`, and the mock gateway's record says so.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::postponed::Decision;
use payhook::sim::example_merchant as merchant;
mod support;

use payhook::Config;
use payhook::model::{CallbackSettings, TransactionStatus, TransactionType};
use payhook::signature::Algorithm;
use payhook::sim::{
    Fault, MockControl, MockGateway, MockGatewayConfig, Payment, RequestKind, Schedule, Signer,
    Trigger, deliver_callback, to_text,
};
use rust_decimal::Decimal;
use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};
use std::time::Duration;
use support::*;

/// The example merchant's app on port 0, verifying the Ed25519 fixture key.
struct Example {
    url: String,
    ledger: merchant::Ledger,
    _data: tempfile::TempDir,
}

impl Example {
    async fn start(tweak: impl FnOnce(&mut Config)) -> Self {
        let data = tempfile::tempdir().unwrap();
        let mut config = signed_config(&["ed25519"]);
        config.signature.algorithm = Algorithm::Ed25519;
        config.store.path = data.path().join("store");
        tweak(&mut config);
        let store = merchant::open_store(&config).await.unwrap();
        let shop = merchant::Merchant {
            max_amount: Decimal::from(1000),
            review_above: None,
            provider_tags: merchant::ProviderTags::default(),
        };
        let ledger = merchant::Ledger::of(&store).unwrap();
        let app = merchant::app(config, shop, store).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(payhook::serve(listener, app, std::future::pending()));
        Self {
            url,
            ledger,
            _data: data,
        }
    }

    /// The ledger entry of `nonce`, if booked.
    async fn entry(&self, nonce: &str) -> Option<merchant::Entry> {
        self.ledger.entry(nonce).await.unwrap()
    }
}

fn signing_trigger() -> Trigger {
    let mut signature = Config::default().signature;
    signature.algorithm = Algorithm::Ed25519;
    let key = fixture_signer("ed25519", Algorithm::Ed25519);
    Trigger::new(Some(Signer::new(key, &signature).unwrap())).unwrap()
}

#[tokio::test]
async fn signed_triggers_of_every_kind_are_accepted_and_a_tampered_one_refused() {
    let example = Example::start(|_| {}).await;
    let url = example.url.clone();
    let trigger = signing_trigger();
    let payment = Payment {
        amount: "25.50".parse().unwrap(),
        ..Payment::default()
    };
    for kind in [
        RequestKind::ProvidersValidation,
        RequestKind::TransactionValidation,
        RequestKind::Callback,
    ] {
        let body = to_text(&payment.body(kind));
        let exchange = trigger
            .send(&format!("{url}{}", kind.default_path()), body.as_bytes())
            .await
            .unwrap();
        assert_eq!(exchange.status, Some(200), "{kind:?}: {}", exchange.body);
    }
    // Signed, then one byte of the amount changed: the merchant refuses it.
    let body = to_text(&Payment::default().body(RequestKind::Callback));
    let signer = trigger.signer().unwrap();
    let signature = signer.value(body.as_bytes()).unwrap();
    let tampered = body.replace("\"amount\":10.00", "\"amount\":99.00");
    assert_ne!(tampered, body);
    let exchange = trigger
        .send_with(
            &format!("{url}/payhook/callback"),
            tampered.as_bytes(),
            Some((signer.header().clone(), signature)),
        )
        .await
        .unwrap();
    assert_eq!(exchange.status, Some(401));
    assert_eq!(
        exchange.message().unwrap(),
        "invalid signature: it does not verify with any configured key"
    );
}

/// A merchant that answers 503 to the first `failures` deliveries, then 200.
async fn flaky_merchant(failures: u32) -> (String, Arc<AtomicU32>) {
    let seen = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&seen);
    let addr = serve_http(move |_request| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let status = if n <= failures { 503 } else { 200 };
        async move {
            hyper::Response::builder()
                .status(status)
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    b"{\"message\":\"scripted\"}",
                )))
                .unwrap()
        }
    })
    .await;
    (format!("http://{addr}/hook"), seen)
}

fn settings(url: &str, max_attempts: u32, add_signature: bool) -> CallbackSettings {
    CallbackSettings {
        collab_id: 3,
        callback_url: url.to_owned(),
        max_attempts,
        is_enabled: true,
        add_signature,
        transaction_type_id: None,
    }
}

#[tokio::test]
async fn delivery_stops_at_the_first_2xx_and_the_record_says_delivered() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let control = MockControl::new(&mock.url()).unwrap();
    let (url, seen) = flaky_merchant(2).await;
    let payment = Payment::default();
    let body = to_text(&payment.body(RequestKind::Callback));
    let mut progress = Vec::new();
    let report = deliver_callback(
        &signing_trigger(),
        &payment,
        body.as_bytes(),
        &[settings(&url, 17, true)],
        &Schedule::default().fast(),
        Some(&control),
        |_, attempt| progress.push((attempt.number, attempt.at, attempt.exchange.status)),
    )
    .await
    .unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    assert_eq!(
        progress,
        [
            (1, Duration::ZERO, Some(503)),
            (2, Duration::from_secs(5), Some(503)),
            (3, Duration::from_secs(20), Some(200)),
        ],
        "attempts on the virtual clock of the default schedule"
    );
    assert_eq!(report.status(), "Delivered");
    let record = mock.transaction(payment.reference_id).unwrap();
    assert_eq!(
        record.callback_delivery_status.as_deref(),
        Some("Delivered")
    );
    assert!(!record.is_callback_sending_canceled);
    assert_eq!(record.nonce, payment.nonce);
}

#[tokio::test]
async fn delivery_gives_up_after_max_attempts_and_the_record_says_failed() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let control = MockControl::new(&mock.url()).unwrap();
    // The test merchant asks for a retry every time for client "retry".
    let server = TestServer::start().await;
    let payment = Payment {
        client_id: "retry".into(),
        status: TransactionStatus::PaymentSystemError,
        direction: TransactionType::Withdrawal,
        ..Payment::default()
    };
    let body = to_text(&payment.body(RequestKind::Callback));
    let url = format!("http://{}{CALLBACK_PATH}", server.addr);
    let report = deliver_callback(
        &Trigger::new(None).unwrap(),
        &payment,
        body.as_bytes(),
        &[settings(&url, 4, false)],
        &Schedule::default().fast(),
        Some(&control),
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(report.deliveries[0].attempts.len(), 4);
    assert!(!report.deliveries[0].delivered());
    assert_eq!(
        server.merchant.calls().len(),
        4,
        "every attempt reached the handler"
    );
    let record = mock.transaction(payment.reference_id).unwrap();
    assert_eq!(record.callback_delivery_status.as_deref(), Some("Failed"));
    assert!(record.is_callback_sending_canceled);
    assert_eq!(
        record.transaction_status,
        TransactionStatus::PaymentSystemError
    );
}

#[tokio::test]
async fn settings_with_more_than_17_attempts_or_a_signature_without_key_are_refused() {
    let payment = Payment::default();
    let body = to_text(&payment.body(RequestKind::Callback));
    let refuse = |settings: CallbackSettings| {
        let body = body.clone();
        let payment = payment.clone();
        async move {
            deliver_callback(
                &Trigger::new(None).unwrap(),
                &payment,
                body.as_bytes(),
                &[settings],
                &Schedule::default().fast(),
                None,
                |_, _| {},
            )
            .await
            .unwrap_err()
            .to_string()
        }
    };
    assert!(
        refuse(settings("http://127.0.0.1:1/", 18, false))
            .await
            .contains("1 to 17")
    );
    assert!(
        refuse(settings("http://127.0.0.1:1/", 3, true))
            .await
            .contains("signing key")
    );
}

#[tokio::test]
async fn an_awaitable_validation_triggered_by_the_simulator_gets_its_result_at_the_mock() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let mut config = test_config();
    config.gateway = mock.gateway_config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    let server = TestServer::start_with(config).await;
    let payment = Payment {
        client_id: "postpone".into(),
        ..Payment::default()
    };
    let body = to_text(&payment.body(RequestKind::TransactionValidation));
    let exchange = Trigger::new(None)
        .unwrap()
        .send(
            &format!("http://{}{VALIDATION_PATH}", server.addr),
            body.as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(exchange.message().as_deref(), Some("validation postponed"));
    server
        .app
        .resolver()
        .unwrap()
        .resolve(payment.validation_id, Decision::allow("approved"))
        .await
        .unwrap();
    let control = MockControl::new(&mock.url()).unwrap();
    let result = control
        .await_validation_result(payment.validation_id, DEADLINE)
        .await
        .unwrap()
        .unwrap();
    assert!(result.success);
    assert_eq!(result.description, "approved");
}

// ------------------------------------------------------------------------ fault injection

async fn inject(
    example: &Example,
    kind: RequestKind,
    payment: &Payment,
    fault: Fault,
) -> payhook::sim::Verdict {
    let url = format!("{}{}", example.url, kind.default_path());
    let verdict = payhook::sim::inject(&signing_trigger(), &url, kind, payment, fault)
        .await
        .unwrap();
    assert!(verdict.correct, "{fault:?}: {verdict:?}");
    verdict
}

#[tokio::test]
async fn duplicates_in_a_row_and_at_once_book_one_ledger_entry() {
    let example = Example::start(|_| {}).await;
    for fault in [Fault::Duplicate(4), Fault::Concurrent(8)] {
        let payment = Payment::default();
        let verdict = inject(&example, RequestKind::Callback, &payment, fault).await;
        let accepted = verdict
            .answers
            .iter()
            .filter(|a| a.ends_with("callback accepted"))
            .count();
        assert_eq!(accepted, 1, "{verdict:?}");
        let entry = example.entry(&payment.nonce).await.unwrap();
        assert_eq!((entry.bookings, entry.amount), (1, payment.amount));
    }
}

#[tokio::test]
async fn tampered_or_foreign_signatures_are_refused_and_change_nothing_booked() {
    let example = Example::start(|_| {}).await;
    for fault in [Fault::TamperBody, Fault::TamperSignature, Fault::WrongKey] {
        let payment = Payment::default();
        let verdict = inject(&example, RequestKind::Callback, &payment, fault).await;
        assert!(
            verdict.answers[0].starts_with("401 invalid signature"),
            "{verdict:?}"
        );
        // Then the genuine request: the receiver is shown to accept the aggregator's own,
        // the forgery having left no trace of its nonce.
        assert!(
            verdict.answers[1].ends_with("callback accepted"),
            "{verdict:?}"
        );
        let entry = example.entry(&payment.nonce).await.unwrap();
        assert_eq!((entry.bookings, entry.amount), (1, payment.amount));
    }
}

#[tokio::test]
async fn a_failure_delivered_after_the_later_success_leaves_the_success_booked() {
    let example = Example::start(|_| {}).await;
    let payment = Payment::default();
    inject(&example, RequestKind::Callback, &payment, Fault::Reorder).await;
    let entry = example.entry(&payment.nonce).await.unwrap();
    assert_eq!((entry.status, entry.bookings), (4, 1));
    assert_eq!(entry.balance_effect, payment.amount);
    // The late failure is kept aside for a person, not booked.
    let quarantined = example
        .ledger
        .quarantined(&payment.nonce, -3)
        .await
        .unwrap()
        .unwrap();
    assert!(quarantined.reason.contains("older"), "{quarantined:?}");
}

#[tokio::test]
async fn a_slow_body_gets_408_and_a_dropped_one_books_nothing_until_sent_whole() {
    let example = Example::start(|config| {
        config.server.request_timeout = Duration::from_millis(500);
    })
    .await;
    let payment = Payment::default();
    let verdict = inject(
        &example,
        RequestKind::Callback,
        &payment,
        Fault::SlowBody(Duration::from_secs(2)),
    )
    .await;
    assert!(verdict.answers[0].starts_with("408"), "{verdict:?}");
    assert!(example.entry(&payment.nonce).await.is_none());

    let payment = Payment::default();
    let verdict = inject(
        &example,
        RequestKind::Callback,
        &payment,
        Fault::DropMidRequest,
    )
    .await;
    assert!(verdict.answers[0].starts_with("no answer"), "{verdict:?}");
    assert_eq!(example.entry(&payment.nonce).await.unwrap().bookings, 1);
}

#[tokio::test]
async fn a_reused_nonce_with_other_payment_data_is_refused_or_not_booked_again() {
    let example = Example::start(|_| {}).await;
    let payment = Payment::default();
    let verdict = inject(
        &example,
        RequestKind::TransactionValidation,
        &payment,
        Fault::ReuseNonce,
    )
    .await;
    assert_eq!(
        verdict.answers[1],
        "403 nonce already used for a different payment"
    );
    let payment = Payment::default();
    inject(&example, RequestKind::Callback, &payment, Fault::ReuseNonce).await;
    let entry = example.entry(&payment.nonce).await.unwrap();
    assert_eq!(
        (entry.amount, entry.bookings),
        (payment.amount, 1),
        "the first amount stays"
    );
}

/// A receiver that tells payments apart by the aggregator's ids — a validation by its
/// `validationId`, a callback by its `id` — refusing a changed request under a known id and
/// taking a new id for a new payment, would approve a second payment under a used nonce:
/// the aggregator sends it with ids of its own. The `reuse-nonce` fault judges it wrong; it
/// sent the second payment under the first one's ids, and such a receiver passed.
#[tokio::test]
async fn reuse_nonce_sends_the_second_payment_with_ids_of_its_own() {
    use http_body_util::BodyExt;
    let seen: Arc<std::sync::Mutex<std::collections::HashMap<String, bytes::Bytes>>> =
        Arc::default();
    let keyed_by_id = serve_http(move |request: hyper::Request<hyper::body::Incoming>| {
        let seen = Arc::clone(&seen);
        async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let fields: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let id = fields
                .get("validationId")
                .or_else(|| fields.get("id"))
                .unwrap()
                .to_string();
            let mut seen = seen.lock().unwrap();
            let (status, message) = match seen.get(&id) {
                Some(before) if *before != body => (403, "changed under a known id"),
                Some(_) => (200, "already processed"),
                None => {
                    seen.insert(id, body);
                    (200, "ok")
                }
            };
            hyper::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                    r#"{{"message":"{message}"}}"#
                ))))
                .unwrap()
        }
    })
    .await;
    for kind in [RequestKind::TransactionValidation, RequestKind::Callback] {
        let url = format!("http://{keyed_by_id}{}", kind.default_path());
        let trigger = payhook::sim::Trigger::new(None).unwrap();
        let verdict =
            payhook::sim::inject(&trigger, &url, kind, &Payment::default(), Fault::ReuseNonce)
                .await
                .unwrap();
        assert!(!verdict.correct, "{kind:?}: {verdict:?}");
        assert_eq!(verdict.answers[1], "200 ok", "{kind:?}: {verdict:?}");
    }
}

#[tokio::test]
async fn a_slow_body_carries_the_shared_secret_the_endpoint_wants() {
    let example = Example::start(|config| {
        config.server.request_timeout = Duration::from_millis(500);
        let auth = &mut config.auth.transaction_validation;
        auth.method = payhook::config::AuthMethod::SharedSecret;
        auth.secret = Some(payhook::Secret::new("s3cr3t-for-validations"));
    })
    .await;
    let trigger = signing_trigger()
        .with_header("X-Api-Key: s3cr3t-for-validations")
        .unwrap();
    let url = format!(
        "{}{}",
        example.url,
        RequestKind::TransactionValidation.default_path()
    );
    let verdict = payhook::sim::inject(
        &trigger,
        &url,
        RequestKind::TransactionValidation,
        &Payment::default(),
        Fault::SlowBody(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    // Past the credentials, the body is too slow: 408, not a 401 for a missing secret.
    assert!(verdict.correct, "{verdict:?}");
    assert!(verdict.answers[0].starts_with("408"), "{verdict:?}");
}
