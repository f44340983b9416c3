//! Deduplication through the real server: repeats and concurrent deliveries of one nonce
//! run the handler once; a new status runs it again and says what came before; validations
//! replay their recorded decision and refuse a nonce reused for a different payment.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use support::*;

fn with_client(body: &str, client: &str) -> String {
    with(body, "/clientId", Some(json!(client)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_simultaneous_deliveries_of_one_nonce_run_the_handler_once_and_all_get_200() {
    let server = Arc::new(TestServer::start().await);
    // The first delivery holds the handler at a gate while the others arrive.
    let body = Arc::new(with_client(CALLBACK, "gate"));
    // Set just before the gate opens: no sender may get its 200 while the one handler run is
    // still held (an acknowledgement before the booking would be a lie).
    let released = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for _ in 0..50 {
        let (server, body) = (Arc::clone(&server), Arc::clone(&body));
        let released = Arc::clone(&released);
        senders.push(tokio::spawn(async move {
            // As the aggregator does: retry until a 2xx.
            loop {
                let response = server.post_json(CALLBACK_PATH, &body).await;
                if response.status == 200 {
                    assert!(
                        released.load(Ordering::SeqCst),
                        "200 before the handler was let go"
                    );
                    return;
                }
                assert_eq!(
                    response.status,
                    503,
                    "{}",
                    String::from_utf8_lossy(&response.body)
                );
            }
        }));
    }
    tokio::time::timeout(DEADLINE, server.merchant.entered_gate.notified())
        .await
        .unwrap();
    released.store(true, Ordering::SeqCst);
    server.merchant.gate.notify_one();
    for sender in senders {
        tokio::time::timeout(DEADLINE, sender)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(server.merchant.calls().len(), 1, "exactly one handler run");
}

#[tokio::test]
async fn a_repeat_of_an_acknowledged_callback_is_200_without_the_handler() {
    let server = TestServer::start().await;
    for _ in 0..3 {
        let response = server.post_json(CALLBACK_PATH, CALLBACK).await;
        assert_eq!(response.status, 200);
    }
    let calls = server.merchant.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].attempt, calls[0].previous_status), (1, None));
}

#[tokio::test]
async fn a_new_final_status_reaches_the_handler_with_the_previous_one() {
    let server = TestServer::start().await;
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    let reversal = with(CALLBACK, "/transactionStatus", Some(json!(-2)));
    assert_eq!(server.post_json(CALLBACK_PATH, &reversal).await.status, 200);
    assert_eq!(server.post_json(CALLBACK_PATH, &reversal).await.status, 200);
    assert_eq!(
        server.post_json(CALLBACK_PATH, CALLBACK).await.status,
        200,
        "a late retry of the success"
    );
    let calls = server.merchant.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!((calls[1].attempt, calls[1].previous_status), (2, Some(4)));
}

#[tokio::test]
async fn a_delivery_that_was_not_acknowledged_runs_again_and_counts_its_attempts() {
    let server = TestServer::start().await;
    let retry = with_client(CALLBACK, "retry");
    assert_eq!(server.post_json(CALLBACK_PATH, &retry).await.status, 503);
    assert_eq!(server.post_json(CALLBACK_PATH, &retry).await.status, 503);
    let fail = with_client(CALLBACK, "fail");
    assert_eq!(server.post_json(CALLBACK_PATH, &fail).await.status, 503);
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    let attempts: Vec<u32> = server.merchant.calls().iter().map(|c| c.attempt).collect();
    assert_eq!(
        attempts,
        [1, 2, 3, 4],
        "the acknowledged fourth attempt is the last run"
    );
}

#[tokio::test]
async fn a_repeated_validation_gets_the_recorded_decision_without_the_handler() {
    let server = TestServer::start().await;
    for _ in 0..3 {
        assert_eq!(
            server
                .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
                .await
                .status,
            200
        );
    }
    let denied = with(
        &with(
            TRANSACTION_VALIDATION,
            "/merchantData/clientId",
            Some(json!("deny")),
        ),
        "/paymentData/nonce",
        Some(json!("nonce-denied")),
    );
    for _ in 0..2 {
        let response = server.post_json(VALIDATION_PATH, &denied).await;
        assert_eq!(
            (response.status, response.message().as_str()),
            (403, "client is blocked")
        );
    }
    // The same payment written differently is the same payment.
    let same = TRANSACTION_VALIDATION.replace("\"amount\": 250.00", "\"amount\": 250");
    assert_eq!(server.post_json(VALIDATION_PATH, &same).await.status, 200);
    assert_eq!(
        server.merchant.calls().len(),
        2,
        "one handler run per nonce"
    );
}

#[tokio::test]
async fn a_nonce_reused_for_a_different_payment_is_refused_without_the_handler() {
    let server = TestServer::start().await;
    assert_eq!(
        server
            .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
            .await
            .status,
        200
    );
    let changes = [
        ("/paymentData/amount", json!(250.01)),
        ("/paymentData/currency", json!("USD")),
        ("/paymentData/providerId", json!(12)),
        ("/merchantData/clientId", json!("client-43")),
        ("/cashIn", json!(false)),
    ];
    for (pointer, value) in changes {
        let response = server
            .post_json(
                VALIDATION_PATH,
                &with(TRANSACTION_VALIDATION, pointer, Some(value)),
            )
            .await;
        assert_eq!(response.status, 403, "{pointer}");
        assert_eq!(
            response.message(),
            "nonce already used for a different payment"
        );
    }
    assert_eq!(server.merchant.calls().len(), 1);
}

#[tokio::test]
async fn a_failed_validation_is_not_recorded() {
    let server = TestServer::start().await;
    let failing = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!("fail")),
    );
    assert_eq!(
        server.post_json(VALIDATION_PATH, &failing).await.status,
        500
    );
    assert_eq!(
        server.post_json(VALIDATION_PATH, &failing).await.status,
        500
    );
    assert_eq!(
        server.merchant.calls().len(),
        2,
        "an error is not a decision: the handler runs again"
    );
}
