//! The example merchant (`payhook::sim::example_merchant`, which `examples/merchant.rs` serves) serves the three endpoints as its docs promise.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::sim::example_merchant as merchant;
mod support;

use rust_decimal::Decimal;
use serde_json::json;
use support::*;

/// The example's app on port 0, with its store in a temp dir.
struct Example {
    addr: String,
    ledger: merchant::Ledger,
    _data: tempfile::TempDir,
}

async fn start() -> Example {
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("store");
    let store = merchant::open_store(&config).await.unwrap();
    let merchant = merchant::Merchant {
        max_amount: Decimal::from(1000),
        review_above: None,
    };
    let ledger = merchant::Ledger::of(&store).unwrap();
    let app = merchant::app(config, merchant, store).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));
    Example {
        addr,
        ledger,
        _data: data,
    }
}

impl Example {
    async fn entry(&self, nonce: &str) -> Option<merchant::Entry> {
        self.ledger.entry(nonce).await.unwrap()
    }

    async fn balance(&self, client: &str, currency: &str) -> Decimal {
        self.ledger.balance(client, currency).await.unwrap()
    }

    /// Posts a callback body; its status.
    async fn callback(&self, body: &str) -> u16 {
        post_to(&self.addr, CALLBACK_PATH, body).await.status
    }
}

async fn post_to(addr: &str, path: &str, body: &str) -> RawResponse {
    exchange(
        addr.parse().unwrap(),
        &post(
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ),
    )
    .await
}

#[tokio::test]
async fn the_example_offers_only_providers_fit_for_the_request() {
    let example = start().await;
    let addr = &example.addr;
    let response = post_to(addr, PROVIDERS_PATH, PROVIDERS_VALIDATION).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["providers"].as_array().unwrap().len(), 1);
    assert_eq!(response.json()["message"], "1 of 3 providers available");
}

#[tokio::test]
async fn the_example_denies_amounts_above_its_limit_with_a_message() {
    let example = start().await;
    let addr = example.addr.clone();
    assert_eq!(
        post_to(&addr, VALIDATION_PATH, TRANSACTION_VALIDATION)
            .await
            .status,
        200
    );
    let body = with(
        TRANSACTION_VALIDATION,
        "/paymentData/amount",
        Some(json!(1000.01)),
    );
    let body = with(&body, "/paymentData/nonce", Some(json!("nonce-tv-2")));
    let response = post_to(&addr, VALIDATION_PATH, &body).await;
    assert_eq!(response.status, 403);
    assert_eq!(
        response.message(),
        "amount 1000.01 EUR is above the limit of 1000 per transaction"
    );
}

#[tokio::test]
async fn the_example_books_a_callback_once_however_often_it_is_delivered() {
    let example = start().await;
    for _ in 0..3 {
        assert_eq!(
            post_to(&example.addr, CALLBACK_PATH, CALLBACK).await.status,
            200
        );
    }
    let entry = example.entry("nonce-cb-1").await.expect("booked");
    assert_eq!(
        (
            entry.bookings,
            entry.status,
            entry.amount.to_string().as_str()
        ),
        (1, 4, "0.1")
    );
    assert_eq!(example.balance("client-42", "EUR").await.to_string(), "0.1");
}

#[tokio::test]
async fn the_example_corrects_the_balance_when_a_success_is_reversed() {
    let example = start().await;
    assert_eq!(
        post_to(&example.addr, CALLBACK_PATH, CALLBACK).await.status,
        200
    );
    let reversed = with(CALLBACK, "/transactionStatus", Some(json!(-2)));
    assert_eq!(
        post_to(&example.addr, CALLBACK_PATH, &reversed)
            .await
            .status,
        200
    );
    let entry = example.entry("nonce-cb-1").await.unwrap();
    assert_eq!((entry.bookings, entry.status), (2, -2));
    assert_eq!(example.balance("client-42", "EUR").await, Decimal::ZERO);
    // A late retry of the success changes nothing: it was acknowledged before.
    assert_eq!(
        post_to(&example.addr, CALLBACK_PATH, CALLBACK).await.status,
        200
    );
    assert_eq!(example.entry("nonce-cb-1").await.unwrap().bookings, 2);
}

#[tokio::test]
async fn the_example_acknowledges_callbacks() {
    let example = start().await;
    let addr = example.addr.clone();
    assert_eq!(post_to(&addr, CALLBACK_PATH, CALLBACK).await.status, 200);
}

/// A callback of `CALLBACK`'s shape for `nonce`, `client`, `kind` (1 deposit, 2 withdrawal)
/// and the exact amount text `amount`.
fn callback(nonce: &str, client: &str, kind: i32, amount: &str) -> String {
    let body = with(CALLBACK, "/nonce", Some(json!(nonce)));
    let body = with(&body, "/clientId", Some(json!(client)));
    let body = with(&body, "/transactionType", Some(json!(kind)));
    let replaced = body.replace("\"amount\":0.1", &format!("\"amount\":{amount}"));
    assert_ne!(replaced, body, "the amount was replaced");
    replaced
}

#[tokio::test]
async fn the_example_quarantines_what_would_overflow_a_balance_and_keeps_booking() {
    let example = start().await;
    let max = "79228162514264337593543950335";
    assert_eq!(
        example
            .callback(&callback("whale-1", "whale", 1, max))
            .await,
        200
    );
    assert_eq!(example.balance("whale", "EUR").await, Decimal::MAX);

    // The next deposit cannot be added: acknowledged (never a 503 that would come back
    // forever), kept in quarantine, the balance untouched.
    assert_eq!(
        example
            .callback(&callback("whale-2", "whale", 1, "10"))
            .await,
        200
    );
    assert_eq!(example.balance("whale", "EUR").await, Decimal::MAX);
    assert!(example.entry("whale-2").await.is_none(), "not booked");
    let quarantined = example
        .ledger
        .quarantined("whale-2")
        .await
        .unwrap()
        .expect("quarantined");
    assert_eq!(
        (quarantined.client_id.as_str(), quarantined.amount),
        ("whale", Decimal::from(10))
    );
    assert!(
        quarantined.reason.contains("cannot take"),
        "{quarantined:?}"
    );
    // Its retry is a duplicate: acknowledged once, quarantined once.
    assert_eq!(
        example
            .callback(&callback("whale-2", "whale", 1, "10"))
            .await,
        200
    );

    // Everything else keeps booking: the same client's withdrawal, and other clients.
    assert_eq!(
        example
            .callback(&callback("whale-3", "whale", 2, "5"))
            .await,
        200
    );
    assert_eq!(
        example.balance("whale", "EUR").await,
        Decimal::MAX - Decimal::from(5)
    );
    assert_eq!(
        example
            .callback(&callback("minnow-1", "minnow", 1, "10.50"))
            .await,
        200
    );
    assert_eq!(example.balance("minnow", "EUR").await.to_string(), "10.50");
}

#[tokio::test]
async fn the_example_quarantines_a_success_whose_direction_it_does_not_know() {
    let example = start().await;
    // Type 3 is neither a deposit nor a withdrawal: not credited as one.
    assert_eq!(
        example.callback(&callback("odd-1", "odd", 3, "500")).await,
        200
    );
    assert_eq!(example.balance("odd", "EUR").await, Decimal::ZERO);
    assert!(example.entry("odd-1").await.is_none(), "not booked");
    let quarantined = example
        .ledger
        .quarantined("odd-1")
        .await
        .unwrap()
        .expect("quarantined");
    assert!(
        quarantined.reason.contains("transaction type 3"),
        "{quarantined:?}"
    );
}

#[tokio::test]
async fn a_later_status_naming_another_client_corrects_the_balance_first_booked() {
    let example = start().await;
    assert_eq!(
        example
            .callback(&callback("n-moved", "first", 1, "10"))
            .await,
        200
    );
    assert_eq!(example.balance("first", "EUR").await, Decimal::from(10));
    // The same nonce reversed, the result naming another client: the first client's
    // deposit is undone, and nothing is taken from the other.
    let reversed = with(
        &callback("n-moved", "second", 1, "10"),
        "/transactionStatus",
        Some(json!(-2)),
    );
    assert_eq!(example.callback(&reversed).await, 200);
    assert_eq!(example.balance("first", "EUR").await, Decimal::ZERO);
    assert_eq!(example.balance("second", "EUR").await, Decimal::ZERO);
    let entry = example.entry("n-moved").await.unwrap();
    assert_eq!((entry.client_id.as_str(), entry.bookings), ("second", 2));
}
