//! A callback's record is kept for the store's retention after its booking, so a callback
//! whose transaction last changed longer ago than that may have been booked and its record
//! purged since: a signed body replayed after the retention, or an attempt the aggregator
//! makes that late, must not run the handler a second time. payhook answers 409 and lists
//! it among the failing callbacks for an operator. Within the retention nothing changes,
//! a duplicate whose record is still kept is answered 200 from it, and a callback that
//! carries no times is delivered as before.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use chrono::{DateTime, SecondsFormat, Utc};
use payhook::signature::{Algorithm, SigningKey};
use serde_json::{Value, json};
use std::time::Duration;
use support::*;

const TOKEN: &str = "admin-token-0123456789";

fn signer() -> SigningKey {
    fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256)
}

/// A server whose callbacks are signed by the `rsa2048` fixture key, its records kept for
/// `retention`.
async fn server(retention: Duration) -> TestServer {
    let mut config = signed_config(&["rsa2048"]);
    config.admin.token = Some(TOKEN.into());
    config.store.retention = retention;
    TestServer::start_with(config).await
}

fn time(at: DateTime<Utc>) -> Value {
    json!(at.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// [`CALLBACK`] with `nonce`, its `createdUtc` and `updatedUtc` set (or removed, `None`).
fn body(nonce: &str, created: Option<DateTime<Utc>>, updated: Option<DateTime<Utc>>) -> String {
    let body = with(CALLBACK, "/nonce", Some(json!(nonce)));
    let body = with(&body, "/createdUtc", created.map(time));
    with(&body, "/updatedUtc", updated.map(time))
}

fn signed(body: &str) -> Vec<u8> {
    signed_post(&signer(), body)
}

fn days_ago(days: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::days(days)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_older_than_the_retention_is_refused_and_listed_not_booked() {
    // The default retention: 30 days.
    let server = server(payhook::config::StoreConfig::default().retention).await;
    let replayed = signed(&body("old-1", Some(days_ago(32)), Some(days_ago(31))));
    for attempt in 1..=2 {
        let answer = server.send(&replayed).await;
        assert_eq!(
            answer.status,
            409,
            "attempt {attempt}: {}",
            answer.message()
        );
        assert!(
            answer
                .message()
                .contains("older than the store's retention"),
            "{}",
            answer.message()
        );
        assert_eq!(answer.header("Retry-After"), None);
    }
    assert_eq!(
        callbacks_handled(&server, "old-1"),
        0,
        "the handler was never called"
    );
    // Only `createdUtc`: the transaction's last known change.
    let created_only = server
        .send(&signed(&body("old-2", Some(days_ago(40)), None)))
        .await;
    assert_eq!(created_only.status, 409, "{}", created_only.message());
    assert_eq!(callbacks_handled(&server, "old-2"), 0);

    let listed = failing_listed(&server, TOKEN).await;
    let old_1 = listed
        .iter()
        .find(|f| f["nonce"] == "old-1")
        .unwrap_or_else(|| panic!("old-1 not listed: {listed:?}"));
    assert_eq!(old_1["failures"], 2);
    assert!(
        old_1["lastReason"]
            .as_str()
            .is_some_and(|reason| reason.contains("retention")),
        "{old_1}"
    );
    assert!(listed.iter().any(|f| f["nonce"] == "old-2"), "{listed:?}");

    // A transaction that changed within the retention (`updatedUtc` counts, however old its
    // creation), one whose callback carries no times (nothing to judge by), and ones whose
    // times are a sender's unset dates (.NET's `DateTime.MinValue`, the Unix epoch: no real
    // time, so the other one counts, or none) are booked as before.
    let min_value: DateTime<Utc> = "0001-01-01T00:00:00Z".parse().unwrap();
    for (nonce, created, updated) in [
        ("recent-1", Some(days_ago(29)), Some(days_ago(29))),
        ("updated-1", Some(days_ago(90)), Some(days_ago(1))),
        ("untimed-1", None, None),
        ("unset-1", Some(days_ago(2)), Some(min_value)),
        ("unset-2", Some(min_value), Some(DateTime::UNIX_EPOCH)),
    ] {
        let answer = server.send(&signed(&body(nonce, created, updated))).await;
        assert_eq!(answer.status, 200, "{nonce}: {}", answer.message());
        assert_eq!(callbacks_handled(&server, nonce), 1, "{nonce}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_past_the_horizon_is_answered_from_its_kept_record() {
    // Records kept 30 s; a callback is trusted to be new while its transaction changed less
    // than 27 s ago (a tenth of the retention allows for the aggregator's clock).
    let server = server(Duration::from_secs(30)).await;
    let changed = Utc::now() - chrono::Duration::seconds(25);
    let first = signed(&body("late-1", Some(changed), Some(changed)));
    let answer = server.send(&first).await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    assert_eq!(callbacks_handled(&server, "late-1"), 1);

    // Past the horizon: the booked callback's record is still kept (30 s from its booking).
    let horizon = changed + chrono::Duration::milliseconds(27_200);
    if let Ok(wait) = (horizon - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
    let again = server.send(&first).await;
    assert_eq!(again.status, 200, "{}", again.message());
    assert!(
        again.message().contains("already processed"),
        "{}",
        again.message()
    );
    assert_eq!(
        callbacks_handled(&server, "late-1"),
        1,
        "a duplicate, not booked again"
    );
    // Another nonce of that age has no record to answer from: refused.
    let unknown = server
        .send(&signed(&body("late-2", Some(changed), Some(changed))))
        .await;
    assert_eq!(unknown.status, 409, "{}", unknown.message());
    assert_eq!(callbacks_handled(&server, "late-2"), 0);
}
