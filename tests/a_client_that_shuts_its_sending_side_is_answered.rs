//! A client that shuts its sending side once its request is out (`nc -N`, a health check's
//! script, some proxies) still gets its answer, however long the handler takes, and its
//! callback is booked once: the end of its input after a whole request is no request cut
//! short.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// `body` sent as `nc -N` sends it: the request (no `Connection: close`), then the end of
/// the client's output.
async fn send_then_shut(server: &TestServer, body: &str) -> TcpStream {
    let request = format!(
        "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    stream
}

#[tokio::test]
async fn a_request_followed_by_the_end_of_its_input_is_answered_and_booked_once() {
    let server = TestServer::start().await;
    // The handler holds the callback until the end of input has long arrived.
    let body = with(CALLBACK, "/clientId", Some("gate".into()));
    let entered = server.merchant.entered_gate.notified();
    let mut stream = send_then_shut(&server, &body).await;
    tokio::time::timeout(DEADLINE, entered).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.merchant.gate.notify_waiters();
    let answer = tokio::time::timeout(DEADLINE, read_response(&mut stream))
        .await
        .expect("answered");
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(server.merchant.seen.lock().unwrap().len(), 1);
    // Its retry, sent the same way, is the duplicate it is.
    let mut again = send_then_shut(&server, &body).await;
    let answer = tokio::time::timeout(DEADLINE, read_response(&mut again))
        .await
        .expect("answered");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.message(), "callback already processed");
    assert_eq!(server.merchant.seen.lock().unwrap().len(), 1);
}

/// A request whose input ends before its declared body is whole is not waited for: it is
/// answered 400 at once, not held until the body's timeout, and reaches no handler.
#[tokio::test]
async fn a_body_cut_short_by_the_end_of_its_input_is_answered_at_once() {
    let server = TestServer::start().await;
    let request = format!(
        "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        CALLBACK.len(),
        &CALLBACK[..CALLBACK.len() / 2]
    );
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let answer = tokio::time::timeout(DEADLINE, read_response(&mut stream))
        .await
        .expect("not held");
    assert_eq!(answer.status, 400);
    assert_eq!(answer.message(), "request body could not be read");
    assert!(server.merchant.seen.lock().unwrap().is_empty());
}

/// A request whose head is cut short by the end of its input holds no connection: it is
/// closed, unanswered as hyper answers a head it cannot read, not kept until the
/// header-read timeout.
#[tokio::test]
async fn a_head_cut_short_by_the_end_of_its_input_frees_its_connection() {
    use tokio::io::AsyncReadExt;
    let mut config = test_config();
    // Far beyond the test's own deadline: a connection kept for it would fail the test.
    config.server.header_read_timeout = DEADLINE * 3;
    let server = TestServer::start_with(config).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /payhook/callback HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
        .await
        .expect("the connection was kept")
        .unwrap();
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
}
