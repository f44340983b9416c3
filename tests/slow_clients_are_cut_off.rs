//! A client that sends its headers slowly and never finishes is disconnected after the
//! header-read timeout, while other clients keep being served; a client whose body does not
//! arrive in time gets 408.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn a_client_dripping_its_headers_is_disconnected_while_others_are_served() {
    let mut config = test_config();
    config.server.header_read_timeout = Duration::from_millis(500);
    let server = TestServer::start_with(config).await;

    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(b"POST /payhook/callback HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let drip = async {
        // One header byte every 100 ms, forever: only the server can end this.
        loop {
            if slow.write_all(b"X").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut probe = [0u8; 1];
            let closed =
                tokio::time::timeout(Duration::from_millis(1), slow.read(&mut probe)).await;
            if let Ok(Ok(0) | Err(_)) = closed {
                break;
            }
        }
    };

    let others = async {
        for _ in 0..5 {
            assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 200);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let ((), disconnected) = tokio::join!(others, tokio::time::timeout(DEADLINE, drip));
    assert!(
        disconnected.is_ok(),
        "the slow client was never disconnected"
    );
    assert!(
        server
            .merchant
            .calls()
            .iter()
            .all(|c| c.endpoint == "callback")
    );
    // Five deliveries of one callback: the handler ran once, the repeats were answered 200
    // from the record.
    assert_eq!(server.merchant.calls().len(), 1);
}

#[tokio::test]
async fn a_client_that_connects_and_sends_nothing_or_a_partial_preface_is_disconnected() {
    let mut config = test_config();
    config.server.header_read_timeout = Duration::from_millis(300);
    let server = TestServer::start_with(config).await;
    for first_bytes in [&b""[..], b"P", b"PRI * HTTP/2.0\r\n"] {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream.write_all(first_bytes).await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut rest)).await;
        assert!(
            closed.is_ok(),
            "a connection that sent {first_bytes:?} was never closed"
        );
    }
    assert_eq!(
        server.post_json(CALLBACK_PATH, CALLBACK).await.status,
        200,
        "others are still served"
    );
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408() {
    let mut config = test_config();
    config.server.request_timeout = Duration::from_millis(300);
    let server = TestServer::start_with(config).await;

    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        CALLBACK.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&CALLBACK.as_bytes()[..10]).await.unwrap();
    // The rest of the body never comes.
    let response = read_response(&mut stream).await;
    assert_eq!(response.status, 408);
    assert_eq!(response.message(), "request body not received in time");
    assert!(server.merchant.calls().is_empty());
}

/// Sends a gated callback with `nonce` on a new keep-alive connection; returns the stream.
async fn gated_callback(server: &TestServer, nonce: &str) -> TcpStream {
    let body = with(CALLBACK, "/nonce", Some(serde_json::json!(nonce)));
    let body = with(&body, "/clientId", Some(serde_json::json!("gate")));
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    tokio::time::timeout(DEADLINE, server.merchant.entered_gate.notified())
        .await
        .expect("the handler was entered");
    stream
}

async fn health(mut stream: TcpStream) -> std::io::Result<([u8; 12], TcpStream)> {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.map(|_| (head, stream))
}

#[tokio::test]
async fn a_new_connection_waits_while_every_connection_is_working_and_takes_an_idle_ones_place() {
    let mut config = test_config();
    config.server.max_connections = 2;
    config.server.header_read_timeout = Duration::from_secs(60);
    let server = TestServer::start_with(config).await;
    // Both slots are held by connections whose handler runs.
    let mut first = gated_callback(&server, "gated-1").await;
    let mut second = gated_callback(&server, "gated-2").await;

    // A third waits: no working connection is ever shed...
    let third = tokio::spawn(health(TcpStream::connect(server.addr).await.unwrap()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "a third connection was served");

    // ...and once the handlers answer, both connections are idle (kept alive): the third
    // takes the place of one of them.
    server.merchant.gate.notify_one();
    server.merchant.gate.notify_one();
    for stream in [&mut first, &mut second] {
        assert!(
            read_keep_alive_answer(stream)
                .await
                .starts_with("HTTP/1.1 200")
        );
    }
    let (head, _third) = tokio::time::timeout(DEADLINE, third)
        .await
        .expect("the third connection was served once the others were idle")
        .unwrap()
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let (first_closed, second_closed) = tokio::join!(is_closed(&mut first), is_closed(&mut second));
    assert!(
        first_closed ^ second_closed,
        "exactly one idle connection gave its place up (first: {first_closed}, second: {second_closed})"
    );
}

/// Reads one answer on a kept-alive connection (head and `Content-Length` bytes of body).
async fn read_keep_alive_answer(stream: &mut TcpStream) -> String {
    let mut raw = Vec::new();
    let read = async {
        loop {
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before a whole answer: {raw:?}");
            raw.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&raw);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    return text.into_owned();
                }
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("an answer within the deadline")
}

/// Whether the server closed `stream` (it sends nothing more on an idle connection).
async fn is_closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}
