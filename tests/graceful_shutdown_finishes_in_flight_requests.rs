//! On shutdown the server stops accepting, lets in-flight requests finish, then returns.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn an_in_flight_callback_finishes_after_shutdown_begins() {
    let mut server = TestServer::start().await;
    let body = with(CALLBACK, "/clientId", Some(json!("gate")));

    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(&post(
            CALLBACK_PATH,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ))
        .await
        .unwrap();
    // The handler is now running and holds the request open.
    tokio::time::timeout(DEADLINE, server.merchant.entered_gate.notified())
        .await
        .unwrap();

    server.shut_down();
    // The listener closes: new connections are refused while the old one is still served.
    let addr = server.addr;
    let refused = async {
        loop {
            if TcpStream::connect(addr).await.is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(DEADLINE, refused)
        .await
        .expect("the listener closes on shutdown");
    assert!(
        !server.task.is_finished(),
        "serve() waits for the in-flight request"
    );

    server.merchant.gate.notify_one();
    let response = read_response(&mut stream).await;
    assert_eq!(
        response.status, 200,
        "the in-flight request completed normally"
    );
    server.stopped().await;
}

#[tokio::test]
async fn shutdown_with_no_requests_returns_at_once() {
    let mut server = TestServer::start().await;
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
    server.shut_down();
    server.stopped().await;
}

#[tokio::test]
async fn readiness_turns_503_once_shutdown_begins() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = dir.path().join("store");
    let app = payhook::App::builder(config)
        .callback_receiver(TestMerchant::default())
        .build()
        .unwrap();
    let ready = || {
        http::Request::get("/readyz")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    assert_eq!(app.handle(ready()).await.status(), 200);
    app.begin_shutdown();
    let response = app.handle(ready()).await;
    assert_eq!(response.status(), 503);
    let health = http::Request::get("/healthz")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    assert_eq!(
        app.handle(health).await.status(),
        200,
        "still alive while draining"
    );
}

#[tokio::test]
async fn shutdown_waits_for_a_validation_handler_deciding_after_its_time_budget() {
    // Awaitable: a handler over its budget was answered 200 (postponed); the aggregator
    // waits for its decision, which a restart must not cut off.
    let mut config = test_config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.validation.time_budget = std::time::Duration::from_millis(100);
    config.gateway.auth_url = Some("http://127.0.0.1:1".into());
    config.gateway.gateway_url = Some("http://127.0.0.1:1".into());
    config.gateway.username = Some("shop".into());
    config.gateway.password = Some("pw".into());
    let mut server = TestServer::start_with(config).await;
    let body = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!("gate")),
    );
    let response = server.post_json(VALIDATION_PATH, &body).await;
    assert_eq!(
        (response.status, response.message().as_str()),
        (200, "validation postponed")
    );
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["validationId"]
        .as_i64()
        .unwrap();

    server.shut_down();
    let addr = server.addr;
    tokio::time::timeout(DEADLINE, async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the listener closes on shutdown");
    // No connection is open; serve() still waits for the handler.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !server.task.is_finished(),
        "serve() waits for the handler still deciding"
    );

    server.merchant.gate.notify_one();
    server.stopped().await;
    let record = server
        .app
        .resolver()
        .unwrap()
        .get(id)
        .await
        .unwrap()
        .unwrap();
    let result = record.result.expect("the handler's decision was recorded");
    assert!(result.success, "{result:?}");
}
