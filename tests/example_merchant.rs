//! `examples/merchant.rs`, its very code, serves the three endpoints as its docs promise.
#![allow(clippy::unwrap_used, reason = "tests")]

#[path = "../examples/merchant.rs"]
#[allow(
    dead_code,
    unreachable_pub,
    reason = "the example is a binary of its own; here only its merchant is used"
)]
mod merchant;
mod support;

use rust_decimal::Decimal;
use serde_json::json;
use support::*;

async fn start() -> String {
    let app = merchant::app(
        test_config(),
        merchant::Merchant {
            max_amount: Decimal::from(1000),
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));
    addr.to_string()
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
    let addr = start().await;
    let response = post_to(&addr, PROVIDERS_PATH, PROVIDERS_VALIDATION).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["providers"].as_array().unwrap().len(), 1);
    assert_eq!(response.json()["message"], "1 of 3 providers available");
}

#[tokio::test]
async fn the_example_denies_amounts_above_its_limit_with_a_message() {
    let addr = start().await;
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
    let response = post_to(&addr, VALIDATION_PATH, &body).await;
    assert_eq!(response.status, 403);
    assert_eq!(
        response.message(),
        "amount 1000.01 EUR is above the limit of 1000 per transaction"
    );
}

#[tokio::test]
async fn the_example_acknowledges_callbacks() {
    let addr = start().await;
    assert_eq!(post_to(&addr, CALLBACK_PATH, CALLBACK).await.status, 200);
}
