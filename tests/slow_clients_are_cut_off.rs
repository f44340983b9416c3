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

#[tokio::test]
async fn connections_beyond_the_limit_wait_until_one_closes() {
    let mut config = test_config();
    config.server.max_connections = 2;
    config.server.header_read_timeout = Duration::from_secs(60);
    let server = TestServer::start_with(config).await;
    // Two idle connections take both slots (the first request makes sure both are accepted).
    let first = TcpStream::connect(server.addr).await.unwrap();
    let second = TcpStream::connect(server.addr).await.unwrap();
    let health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let answered = |mut stream: TcpStream| async move {
        stream.write_all(health).await.unwrap();
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.map(|_| (head, stream))
    };
    let (head, first) = answered(first).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    // A third waits in the backlog: it is not served while both are held...
    let third = tokio::spawn(answered(TcpStream::connect(server.addr).await.unwrap()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "a third connection was served");
    // ...and is served as soon as one of them closes.
    drop(first);
    let (head, _third) = tokio::time::timeout(DEADLINE, third)
        .await
        .expect("the third connection was served once a slot freed")
        .unwrap()
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    drop(second);
}
