//! `/metrics` counts answers, bookings, duplicates and validation decisions, and only the
//! allowed networks may read it.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use support::*;

async fn metrics(server: &TestServer) -> (u16, String) {
    let response = server.send(&request("GET", "/metrics", &[], None)).await;
    (
        response.status,
        String::from_utf8_lossy(&response.body).into_owned(),
    )
}

#[tokio::test]
async fn what_the_server_did_is_counted() {
    let server = TestServer::start().await;
    for _ in 0..2 {
        assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    }
    assert_eq!(
        server
            .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
            .await
            .status,
        200
    );
    assert_eq!(
        server
            .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
            .await
            .status,
        200
    );
    let reused = with(
        TRANSACTION_VALIDATION,
        "/paymentData/amount",
        Some(json!(1)),
    );
    assert_eq!(server.post_json(VALIDATION_PATH, &reused).await.status, 403);
    let denied = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!("deny")),
    );
    let denied = with(&denied, "/paymentData/nonce", Some(json!("n-denied")));
    assert_eq!(server.post_json(VALIDATION_PATH, &denied).await.status, 403);
    assert_eq!(server.post_json("/nowhere", "{}").await.status, 404);

    server
        .assert_metrics(&[
            "payhook_answers_total{route=\"callback\",status=\"200\"} 2",
            "payhook_answers_total{route=\"transaction_validation\",status=\"200\"} 2",
            "payhook_answers_total{route=\"transaction_validation\",status=\"403\"} 2",
            "payhook_answers_total{route=\"unknown\",status=\"404\"} 1",
            "payhook_callbacks_booked_total 1",
            "payhook_callbacks_duplicate_total 1",
            "payhook_validations_total{decision=\"allow\"} 1",
            "payhook_validations_total{decision=\"deny\"} 1",
            "payhook_validations_replayed_total 1",
            "payhook_nonce_reuse_refused_total 1",
        ])
        .await;
}

#[tokio::test]
async fn only_allowed_networks_read_metrics_and_an_empty_list_turns_them_off() {
    let mut config = test_config();
    config.server.metrics_allow_ips = vec!["10.0.0.0/8".into()];
    let server = TestServer::start_with(config).await;
    let (status, text) = metrics(&server).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("address not allowed"));

    let mut config = test_config();
    config.server.metrics_allow_ips = Vec::new();
    let server = TestServer::start_with(config).await;
    assert_eq!(metrics(&server).await.0, 404);

    let mut config = test_config();
    config.server.metrics_allow_ips = vec!["not-a-network".into()];
    let error = payhook::App::builder(config)
        .callback_receiver(TestMerchant::default())
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("server.metrics_allow_ips"), "{error}");
}

/// A store that does not answer (here PostgreSQL holding the failing count's table locked,
/// as a long migration or a stuck session would) costs a scrape that figure only: the rest
/// is answered, the store's health and every counter kept in memory among it, where the
/// scrape used to wait as long as the database's statement timeout (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_does_not_answer_leaves_out_its_figures_only() {
    use std::time::Duration;
    let Some(db) = support::postgres::database("scrape_store_locked").await else {
        return;
    };
    let mut config = test_config();
    config.store = db.store_config(Duration::from_secs(3600));
    config.store.statement_timeout = Duration::from_secs(3600);
    let store = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store).await;
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    let (status, text) = metrics(&server).await;
    assert_eq!(status, 200);
    assert!(text.contains("payhook_callbacks_failing 0"), "{text}");

    let locked = db.lock("callback_failures_count", "ACCESS EXCLUSIVE").await;
    let (status, text) = tokio::time::timeout(DEADLINE, metrics(&server))
        .await
        .expect("the scrape waited for the locked table");
    assert_eq!(status, 200);
    assert!(!text.contains("payhook_callbacks_failing"), "{text}");
    for kept in ["payhook_store_failed 0", "payhook_callbacks_booked_total 1"] {
        assert!(text.lines().any(|line| line == kept), "{kept} in {text}");
    }
    locked.release().await;
    let (_, text) = metrics(&server).await;
    assert!(text.contains("payhook_callbacks_failing 0"), "{text}");
    db.drop_schema().await;
}

/// A request the store fails (here PostgreSQL's statement timeout, its table locked) is
/// answered 503 and counted in `payhook_store_errors_total`: on PostgreSQL
/// `payhook_store_failed` (sled's stop) stays 0, and this counter is what an outage shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_store_fails_are_counted() {
    use std::time::Duration;
    let Some(db) = support::postgres::database("store_errors_counted").await else {
        return;
    };
    let mut config = test_config();
    config.store = db.store_config(Duration::from_secs(3600));
    config.store.statement_timeout = Duration::from_millis(300);
    let store = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store).await;
    let (_, text) = metrics(&server).await;
    assert!(
        text.lines().any(|l| l == "payhook_store_errors_total 0"),
        "{text}"
    );

    let locked = db.lock("callbacks", "ACCESS EXCLUSIVE").await;
    let answer = server.post_json(CALLBACK_PATH, CALLBACK).await;
    locked.release().await;
    assert_eq!(answer.status, 503, "{}", answer.message());
    let (_, text) = metrics(&server).await;
    for line in ["payhook_store_errors_total 1", "payhook_store_failed 0"] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    // The store answers again: the aggregator's retry is booked.
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    db.drop_schema().await;
}

/// One app served on two listeners (an IPv4 and an IPv6 address, say) counts the connections
/// of both, where each listener used to write its own count over the other's.
#[tokio::test]
async fn connections_are_counted_across_listeners() {
    let server = TestServer::start().await;
    let second = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second_addr = second.local_addr().unwrap();
    tokio::spawn(payhook::serve(
        second,
        server.app.clone(),
        std::future::pending(),
    ));
    let mut held = Vec::new();
    for addr in [server.addr, second_addr] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut stream,
            b"GET /healthz HTTP/1.1\r\nHost: payhook\r\n\r\n",
        )
        .await
        .unwrap();
        // Answered (so admitted), and kept open.
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 512];
            let read = tokio::time::timeout(
                DEADLINE,
                tokio::io::AsyncReadExt::read(&mut stream, &mut chunk),
            )
            .await
            .unwrap()
            .unwrap();
            assert!(read > 0, "closed before its answer");
            head.extend_from_slice(&chunk[..read]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
        held.push(stream);
    }
    // The scrape's own connection is the third.
    assert_eq!(server.metric("payhook_connections_open").await, Some(3.0));
    drop(held);
}
