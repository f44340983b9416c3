//! Decided validation results waiting in the outbox survive a kill -9 of the merchant: the
//! example merchant (Awaitable, with its review task) decides 15 validations while the
//! aggregator answers 503; it is killed with SIGKILL and restarted on the same data
//! directory, and every result then reaches the aggregator with the decision taken before.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use std::{collections::BTreeMap, net::SocketAddr, path::Path};
use support::gateway::FakeGateway;
use support::*;

const VALIDATIONS: i64 = 15;

fn start_merchant(gateway: &FakeGateway, data: &Path) -> (Spawned, SocketAddr) {
    let mut env = gateway_env(&gateway.config());
    env.extend([
        ("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".into()),
        ("PAYHOOK_STORE_PATH", data.display().to_string()),
        ("PAYHOOK_VALIDATION_AWAITABLE", "true".into()),
        ("PAYHOOK_VALIDATION_ALLOW_UNAUTHENTICATED", "true".into()),
        ("PAYHOOK_VALIDATION_RETRY_SCHEDULE", r#"["50ms"]"#.into()),
        ("MERCHANT_REVIEW_ABOVE", "100".into()),
        ("MERCHANT_REVIEW_EVERY", "50ms".into()),
        // No aggregator key here: unsigned callbacks only by explicit opt-in.
        ("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".into()),
    ]);
    spawn_example(&env)
}

/// Validation `id`: ids 0–4 are small (allowed at once), the others wait for review; ids
/// divisible by 4 belong to a blocked client.
fn validation(id: i64) -> (String, bool, &'static str) {
    let blocked = id % 4 == 0;
    let client = if blocked {
        format!("blocked-{id}")
    } else {
        format!("client-{id}")
    };
    let amount = if id < 5 { 50 } else { 500 };
    let body = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!(client)),
    );
    let body = with(&body, "/paymentData/nonce", Some(json!(format!("n-{id}"))));
    let body = with(&body, "/paymentData/amount", Some(json!(amount)));
    let body = with(&body, "/validationId", Some(json!(id)));
    let (success, answer) = match (id < 5, blocked) {
        (true, _) => (true, "client allowed"),
        (false, blocked) => (!blocked, "validation postponed"),
    };
    (body, success, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_results_waiting_in_the_outbox_survive_a_kill_9() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| s.fail_next.extend(std::iter::repeat_n(503, 1_000_000)));
    let data = tempfile::tempdir().unwrap();
    let (mut merchant, address) = start_merchant(&gateway, data.path());

    let mut expected = BTreeMap::new();
    for id in 0..VALIDATIONS {
        let (body, success, answer) = validation(id);
        let request = post(
            VALIDATION_PATH,
            &[("content-type", "application/json")],
            body.as_bytes(),
        );
        let response = exchange(address, &request).await;
        assert_eq!(
            (response.status, response.message().as_str()),
            (200, answer),
            "validation {id}"
        );
        expected.insert(id, success);
    }
    // Every result was decided and attempted at least once (so it sits in the outbox).
    gateway
        .until("an attempt for every validation", |s| {
            (0..VALIDATIONS).all(|id| s.attempted.contains(&id))
        })
        .await;
    assert!(gateway.with(|s| s.results.is_empty()));
    merchant.kill();

    gateway.with(|s| s.fail_next.clear());
    let (mut restarted, _) = start_merchant(&gateway, data.path());
    gateway
        .until("every result delivered", |s| {
            s.results.len() == expected.len()
        })
        .await;
    restarted.kill();

    let delivered: BTreeMap<i64, bool> = gateway.with(|s| {
        s.results
            .iter()
            .map(|(id, (success, _))| (*id, *success))
            .collect()
    });
    assert_eq!(
        delivered, expected,
        "each result as decided before the kill"
    );
    assert!(
        gateway.with(|s| s.posts.iter().all(|(_, _, status)| *status == 200)),
        "no conflicting result was ever sent"
    );
}
