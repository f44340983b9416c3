//! Lost-callback recovery (spec 6.7): a result fetched from the aggregator goes through the
//! same handler and deduplication as its callback, so it is booked once whichever comes first.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::gateway::GatewayClient;
use payhook::model::TransactionStatus;
use payhook::server::{ReconcileError, Reconciled};
use serde_json::json;
use support::gateway::FakeGateway;
use support::{CALLBACK, CALLBACK_PATH, TestServer, with};
use uuid::Uuid;

const LOST: &str = "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e";

fn record(nonce: &str, status: i32) -> serde_json::Value {
    json!({
        "id": 1001, "transactionReferenceId": LOST, "providerId": 11, "merchantClientId": "client-42",
        "accountData": {"orderId": "o-1"}, "nonce": nonce, "amount": 25.50, "currency": "EUR",
        "transactionType": 1, "transactionStatus": status, "transactionStatusMessage": "Success",
        "callbackDeliveryStatus": "Failed", "isCallbackSendingCanceled": true,
        "createdUtc": "2026-01-02T03:04:05Z", "updatedUtc": "2026-01-02T03:04:06Z"
    })
}

async fn setup(status: i32) -> (FakeGateway, GatewayClient, TestServer) {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.transactions
            .insert(LOST.to_owned(), record("nonce-lost", status))
    });
    let client = GatewayClient::new(&gateway.config()).unwrap();
    let server = TestServer::start().await;
    (gateway, client, server)
}

fn callback_count(server: &TestServer) -> usize {
    server
        .merchant
        .calls()
        .iter()
        .filter(|c| c.endpoint == "callback")
        .count()
}

#[tokio::test]
async fn a_reconciled_result_is_booked_once_and_its_late_callback_is_a_duplicate() {
    let (_gateway, client, server) = setup(4).await;
    let id: Uuid = LOST.parse().unwrap();
    let outcome = server.app.reconcile(&client, &[id]).await;
    assert!(
        matches!(outcome[..], [(i, Ok(Reconciled::Booked(TransactionStatus::Success)))] if i == id),
        "{outcome:?}"
    );
    let again = server.app.reconcile(&client, &[id]).await;
    assert!(
        matches!(again[0].1, Ok(Reconciled::AlreadyBooked(_))),
        "{again:?}"
    );
    // The real callback arrives late: a duplicate, the handler is not called again.
    let late = with(CALLBACK, "/nonce", Some(json!("nonce-lost")));
    let response = server.post_json(CALLBACK_PATH, &late).await;
    assert_eq!(
        (response.status, response.message()),
        (200, "callback already processed".into())
    );
    assert_eq!(callback_count(&server), 1);
    let seen = &server.merchant.calls()[0];
    assert_eq!(
        (seen.nonce.as_str(), seen.amount.as_str()),
        ("nonce-lost", "25.5")
    );
}

#[tokio::test]
async fn a_callback_that_arrived_first_makes_the_reconcile_a_no_op() {
    let (_gateway, client, server) = setup(4).await;
    let first = with(CALLBACK, "/nonce", Some(json!("nonce-lost")));
    assert_eq!(server.post_json(CALLBACK_PATH, &first).await.status, 200);
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap()])
        .await;
    assert!(
        matches!(outcome[0].1, Ok(Reconciled::AlreadyBooked(_))),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 1);
}

#[tokio::test]
async fn a_pending_transaction_or_an_unknown_reference_books_nothing() {
    let (_gateway, client, server) = setup(3).await;
    let unknown: Uuid = "00000000-0000-0000-0000-000000000001".parse().unwrap();
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap(), unknown])
        .await;
    assert!(
        matches!(
            outcome[0].1,
            Ok(Reconciled::NotFinal(TransactionStatus::Pending))
        ),
        "{outcome:?}"
    );
    assert!(
        matches!(&outcome[1].1, Err(ReconcileError::Gateway(e)) if e.status() == Some(404)),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 0);
}
