//! A retry whose signed bytes this process booked is answered as a duplicate from memory,
//! without reading the store — and only while the store would answer the same: until the
//! booking's record may be gone (its retention), never once the store has failed, and never
//! on a shared database, which others can change underneath the process.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::signature::{Algorithm, Encoding};
use payhook::store::SledStore;
use payhook::store::prelude::*;
use std::time::Duration;
use support::{CALLBACK, CALLBACK_PATH, RawResponse, TestServer, post};

/// A server for signed callbacks, on a store the test keeps a handle to.
async fn serve(retention: Duration) -> (TestServer, SledStore) {
    let data = tempfile::tempdir().unwrap();
    let mut config = support::signed_config(&["rsa2048"]);
    config.store.path = data.path().join("store");
    config.store.retention = retention;
    let store = SledStore::open(&config.store, &[]).unwrap();
    (
        TestServer::start_on(config, data, store.clone()).await,
        store,
    )
}

/// The test callback, signed: the same bytes and signature each time, as a retry is.
async fn deliver(server: &TestServer) -> RawResponse {
    deliver_body(server, CALLBACK).await
}

async fn deliver_body(server: &TestServer, body: &str) -> RawResponse {
    let signature = support::fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256)
        .header_value(body.as_bytes(), Encoding::Base64, None)
        .unwrap();
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Signature", signature.as_str()),
    ];
    server
        .send(&post(CALLBACK_PATH, &headers, body.as_bytes()))
        .await
}

/// Removes every record as if `ahead` had passed: a purge told a later time.
async fn purge_as_if_later(store: &SledStore, ahead: Duration) -> usize {
    let later = chrono::Utc::now() + chrono::Duration::from_std(ahead).unwrap();
    store.purge_expired(later).await.unwrap()
}

#[tokio::test]
async fn a_retry_of_a_booking_of_this_process_is_answered_without_reading_the_store() {
    let (server, store) = serve(Duration::from_secs(3600)).await;
    let booked = deliver(&server).await;
    assert_eq!(
        (booked.status, booked.message()),
        (200, "callback accepted".into())
    );
    // The record goes behind the answer's back (a purge told a time two hours on): a store
    // read would now find nothing and book the callback again.
    assert!(purge_as_if_later(&store, Duration::from_secs(7200)).await >= 1);
    let retry = deliver(&server).await;
    assert_eq!(
        (retry.status, retry.message()),
        (200, "callback already processed".into()),
        "the retry was not answered from this process's mark"
    );
    assert_eq!(server.merchant.calls().len(), 1, "the handler ran again");
}

#[tokio::test]
async fn once_the_retention_has_passed_a_retry_is_answered_by_the_store() {
    let (server, store) = serve(Duration::from_secs(1)).await;
    assert_eq!(deliver(&server).await.status, 200);
    assert_eq!(
        deliver(&server).await.message(),
        "callback already processed"
    );
    // The retention ends; the record is purged as the sweeper would.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    purge_as_if_later(&store, Duration::ZERO).await;
    let after = deliver(&server).await;
    assert_eq!(
        (after.status, after.message()),
        (200, "callback accepted".into()),
        "beyond the retention the store no longer recognises the nonce, nor may the mark"
    );
    assert_eq!(server.merchant.calls().len(), 2);
}

#[tokio::test]
async fn once_the_store_has_failed_a_retry_of_a_booking_gets_503_like_every_request() {
    let (server, store) = serve(Duration::from_secs(3600)).await;
    assert_eq!(deliver(&server).await.status, 200);
    store.mark_failed_for_tests();
    let retry = deliver(&server).await;
    assert_eq!(retry.status, 503, "{}", retry.message());
    assert_eq!(server.merchant.calls().len(), 1);
}

#[tokio::test]
async fn a_retry_of_bytes_whose_handler_asked_for_a_retry_reaches_the_handler_again() {
    let (server, _store) = serve(Duration::from_secs(3600)).await;
    // The test merchant answers "retry later" to client "retry".
    let body = CALLBACK.replace("\"client-42\"", "\"retry\"");
    for attempt in 1..=2 {
        let answer = deliver_body(&server, &body).await;
        assert_eq!(
            answer.status,
            503,
            "attempt {attempt}: {}",
            answer.message()
        );
        assert_eq!(
            server.merchant.calls().len(),
            attempt,
            "not booked, not marked"
        );
    }
}

#[tokio::test]
async fn on_a_shared_database_every_retry_reads_the_store() {
    let test = "on_a_shared_database_every_retry_reads_the_store";
    let Some(db) = support::postgres::database(test).await else {
        return;
    };
    let mut config = support::signed_config(&["rsa2048"]);
    config.store = db.store_config(Duration::from_secs(3600));
    let store = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store.clone()).await;
    assert_eq!(deliver(&server).await.message(), "callback accepted");
    // The record goes underneath the process (as a failover or an operator could make it
    // go): the retry is booked again, as the database says.
    let later = chrono::Utc::now() + chrono::Duration::hours(2);
    assert!(store.purge_expired(later).await.unwrap() >= 1);
    assert_eq!(deliver(&server).await.message(), "callback accepted");
    assert_eq!(server.merchant.calls().len(), 2);
    db.drop_schema().await;
}
