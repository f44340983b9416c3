//! Connections that hold a slot without using it — idle HTTP/2 connections answering PINGs,
//! headers or bodies sent a few bytes at a time — cannot keep a genuine callback from being
//! answered: idle connections close, a body below the minimum rate is answered 408, the
//! least active connection gives its place to a new one, and one address cannot take more
//! than its share.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const GENUINE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A connection to `server` from `from` (any loopback address).
async fn connect(server: SocketAddr, from: IpAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(server).await.unwrap()
}

/// An HTTP/2 connection that answers PINGs and opens no stream; completes when the server
/// closes it.
async fn idle_http2(server: SocketAddr, from: IpAddr) {
    let stream = connect(server, from).await;
    let Ok((_sender, connection)) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Full<bytes::Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
    else {
        return;
    };
    // `_sender` is kept: the connection lives until the server ends it.
    let _ = connection.await;
}

/// Sends a request head one byte every 200 ms; completes when the server closes it.
async fn slow_headers(server: SocketAddr, from: IpAddr) {
    let mut stream = connect(server, from).await;
    for byte in format!("POST {CALLBACK_PATH} HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .bytes()
        .chain(std::iter::repeat(b'a'))
    {
        if stream.write_all(&[byte]).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends a whole head and then a body of 64 KiB, 16 bytes every 200 ms; returns the status
/// answered (0 when the connection was closed without one).
async fn slow_body(server: SocketAddr, from: IpAddr) -> u16 {
    dripping_body(server, from, 16).await
}

/// A callback whose body arrives `bytes` every 200 ms, for ever (it is 64 KiB long); its
/// status, or 0 when the connection closed without one.
async fn dripping_body(server: SocketAddr, from: IpAddr, bytes: usize) -> u16 {
    let mut stream = connect(server, from).await;
    let head = format!(
        "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 65536\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return 0;
    }
    let (mut read, mut write) = stream.into_split();
    let drip = async move {
        loop {
            if write.write_all(&vec![b' '; bytes]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let answer = async move {
        let mut raw = Vec::new();
        let _ = read.read_to_end(&mut raw).await;
        String::from_utf8_lossy(&raw)
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    tokio::select! {
        status = answer => status,
        () = drip => 0,
    }
}

/// A genuine callback with `nonce` from `from`; its status.
async fn genuine(server: SocketAddr, from: IpAddr, nonce: &str) -> u16 {
    let body = with(CALLBACK, "/nonce", Some(serde_json::json!(nonce)));
    send_callback(server, from, &body).await
}

/// A callback of `body` from `from`, on a connection of its own; its status.
async fn send_callback(server: SocketAddr, from: IpAddr, body: &str) -> u16 {
    let mut stream = connect(server, from).await;
    let request = post(
        CALLBACK_PATH,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    stream.write_all(&request).await.unwrap();
    read_response(&mut stream).await.status
}

/// Opens the attack from 127.0.0.1: `idle` HTTP/2, `headers` slow-header and `bodies`
/// slow-body connections, and waits until the server has accepted them.
async fn attack(
    server: &TestServer,
    idle: usize,
    headers: usize,
    bodies: usize,
) -> (JoinSet<()>, JoinSet<u16>) {
    let mut held = JoinSet::new();
    let mut answered = JoinSet::new();
    for _ in 0..idle {
        held.spawn(idle_http2(server.addr, ATTACKER));
    }
    for _ in 0..headers {
        held.spawn(slow_headers(server.addr, ATTACKER));
    }
    for _ in 0..bodies {
        answered.spawn(slow_body(server.addr, ATTACKER));
    }
    // Every attack connection is connected and has sent its first bytes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (held, answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_however_it_answers_pings() {
    let mut config = test_config();
    config.server.idle_timeout = Duration::from_millis(400);
    let server = TestServer::start_with(config).await;
    let closed = tokio::time::timeout(DEADLINE, idle_http2(server.addr, ATTACKER)).await;
    assert!(closed.is_ok(), "an idle HTTP/2 connection was never closed");
    server
        .assert_metrics(&["payhook_connections_shed_total{reason=\"idle\"} 1"])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_minimum_rate_is_408_after_its_grace() {
    let mut config = test_config();
    // 80 bytes/s arrive; 1,000 are required after 300 ms. The request timeout is far away.
    config.server.min_body_rate = 1_000;
    config.server.min_body_rate_grace = Duration::from_millis(300);
    config.server.request_timeout = Duration::from_secs(600);
    let server = TestServer::start_with(config).await;
    let status = tokio::time::timeout(DEADLINE, slow_body(server.addr, ATTACKER))
        .await
        .expect("the slow body was answered before the request timeout");
    assert_eq!(status, 408);
    server
        .assert_metrics(&[
            "payhook_connections_shed_total{reason=\"slow_body\"} 1",
            "payhook_answers_total{route=\"callback\",status=\"408\"} 1",
        ])
        .await;
    assert!(server.merchant.calls().is_empty());

    // A body that keeps the pace is read to the end, however long it takes in total.
    let body = with(
        CALLBACK,
        "/padding",
        Some(serde_json::json!(" ".repeat(2_000))),
    );
    let mut stream = connect(server.addr, GENUINE).await;
    let request = post(
        CALLBACK_PATH,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    for chunk in request.chunks(600) {
        stream.write_all(chunk).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(read_response(&mut stream).await.status, 200);
}

/// Connections that keep just above the minimum rate (a body dripping in at 640 bytes/s
/// against 240) hold their places only for `server.min_body_rate_grace`: past it, a genuine
/// callback takes the place of the one in its phase longest, instead of waiting in the
/// listen backlog until their request timeout (ten minutes away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_keeping_just_above_the_rate_give_their_places_up_past_the_grace() {
    let mut config = test_config();
    config.server.max_connections = 8;
    config.server.max_connections_per_address = 0;
    config.server.request_timeout = Duration::from_secs(600);
    config.server.min_body_rate_grace = Duration::from_millis(500);
    let server = TestServer::start_with(config).await;
    let mut steady = JoinSet::new();
    for _ in 0..8 {
        steady.spawn(dripping_body(server.addr, ATTACKER, 128));
    }
    // Every steady connection is connected and dripping.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = tokio::time::timeout(DEADLINE, genuine(server.addr, GENUINE, "n-steady"))
        .await
        .expect("the genuine callback waited for a place until the deadline");
    assert_eq!(status, 200);
    let closed = tokio::time::timeout(DEADLINE, steady.join_next())
        .await
        .expect("no steady connection gave its place up")
        .unwrap()
        .unwrap();
    assert_eq!(closed, 0, "closed without an answer");
}

/// A server whose timeouts alone would let the slow clients hold their slots for a minute:
/// only the shedding rules can free them.
fn patient(max_connections: usize, per_address: usize) -> payhook::Config {
    let mut config = test_config();
    config.server.max_connections = max_connections;
    config.server.max_connections_per_address = per_address;
    config.server.header_read_timeout = Duration::from_secs(60);
    config.server.request_timeout = Duration::from_secs(60);
    config.server.min_body_rate_grace = Duration::from_secs(60);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn genuine_callbacks_from_another_address_are_served_beside_an_attack_holding_every_slot() {
    let server = TestServer::start_with(patient(48, 24)).await;
    let (mut held, _answered) = attack(&server, 20, 40, 20).await;

    let mut callbacks = JoinSet::new();
    for i in 0..20 {
        let addr = server.addr;
        callbacks.spawn(async move {
            tokio::time::timeout(DEADLINE, genuine(addr, GENUINE, &format!("genuine-{i}"))).await
        });
    }
    while let Some(status) = callbacks.join_next().await {
        let status = status.unwrap().expect("a genuine callback was answered");
        assert_eq!(status, 200);
    }
    // The attack's connections beyond its address's share were closed.
    let mut closed = 0;
    while closed < 36 {
        match tokio::time::timeout(DEADLINE, held.join_next()).await {
            Ok(Some(_)) => closed += 1,
            _ => break,
        }
    }
    assert!(
        closed >= 36,
        "only {closed} of 60 held connections were shed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn genuine_callbacks_take_the_place_of_the_least_active_connections_from_the_same_address() {
    let server = TestServer::start_with(patient(32, 0)).await;
    let (_held, _answered) = attack(&server, 20, 40, 20).await;

    for i in 0..20 {
        let status = tokio::time::timeout(
            DEADLINE,
            genuine(server.addr, ATTACKER, &format!("same-address-{i}")),
        )
        .await
        .expect("a genuine callback was answered beside the attack");
        assert_eq!(status, 200);
    }
    assert_eq!(server.merchant.calls().len(), 20);
}

/// A request body that sends its bytes at once and then holds the stream open, never
/// ending it.
struct HeldBack(Option<bytes::Bytes>);

impl http_body::Body for HeldBack {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match self.0.take() {
            Some(bytes) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes)))),
            None => std::task::Poll::Pending,
        }
    }
}

/// Bodies of 6 KiB (one DATA frame each), `count` of them, sent from `from` on the streams
/// of one HTTP/2 connection and then held back: the connection's sender, its driver, and
/// the answers.
async fn held_back_bodies(
    server: SocketAddr,
    from: IpAddr,
    count: usize,
) -> (
    hyper::client::conn::http2::SendRequest<HeldBack>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
    JoinSet<Result<http::Response<hyper::body::Incoming>, hyper::Error>>,
) {
    let stream = connect(server, from).await;
    let (mut sender, connection) = hyper::client::conn::http2::handshake::<_, _, HeldBack>(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let driver = tokio::spawn(connection);
    let mut answers = JoinSet::new();
    for _ in 0..count {
        sender.ready().await.unwrap();
        answers.spawn(sender.send_request(held_back_request()));
    }
    (sender, driver, answers)
}

/// A callback whose body, 6 KiB in one DATA frame, is sent at once and then held back.
fn held_back_request() -> http::Request<HeldBack> {
    http::Request::post(format!("http://x{CALLBACK_PATH}"))
        .header("content-type", "application/json")
        .body(HeldBack(Some(vec![b' '; 6 * 1024].into())))
        .unwrap()
}

/// An answer's status, whether it carries `Retry-After`, and its message.
async fn status_and_message(
    answer: http::Response<hyper::body::Incoming>,
) -> (u16, bool, serde_json::Value) {
    let status = answer.status().as_u16();
    let retry_after = answer.headers().contains_key("retry-after");
    let body = http_body_util::BodyExt::collect(answer.into_body())
        .await
        .unwrap()
        .to_bytes();
    let message = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["message"].take();
    (status, retry_after, message)
}

/// The next of `answers` within the test's deadline: its status, `Retry-After` and message.
async fn next_answer(
    answers: &mut JoinSet<Result<http::Response<hyper::body::Incoming>, hyper::Error>>,
) -> (u16, bool, serde_json::Value) {
    let answer = tokio::time::timeout(DEADLINE, answers.join_next())
        .await
        .expect("no body was answered")
        .unwrap()
        .unwrap()
        .unwrap();
    status_and_message(answer).await
}

/// The next of `answers`: a 503 with `Retry-After` for want of body memory.
async fn refused_for_memory(
    answers: &mut JoinSet<Result<http::Response<hyper::body::Incoming>, hyper::Error>>,
) {
    assert_eq!(
        next_answer(answers).await,
        (
            503,
            true,
            serde_json::json!("too many request bodies arriving at once; retry later")
        )
    );
}

/// The answer of a body that gave its memory up after a grace of 5 s.
const GAVE_WAY: &str =
    "request body still arriving after 5s while other requests needed the memory it held";

/// Bodies sent quickly and then held back, on the streams of HTTP/2 connections, keep the
/// pace and could each hold up to `server.body_limit` until the request timeout: all
/// together they take no more than `server.body_memory_limit`, and those of one client no
/// more than a quarter of it. Past either a stream is answered 503 with `Retry-After`, a
/// genuine callback still fits in what is left, and what the held-back bodies took is given
/// back when their connection goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_held_back_on_http2_streams_take_no_more_than_the_body_memory() {
    let mut config = test_config();
    config.server.body_limit = 8 * 1024;
    config.server.body_memory_limit = 28 * 1024;
    config.server.request_timeout = Duration::from_secs(600);
    // No body gives way to another within the test (see the next test).
    config.server.min_body_rate_grace = Duration::from_secs(600);
    let server = TestServer::start_with(config).await;
    // Four clients: one body of 6 KiB each fits in a client's 8 KiB (a quarter of 28, and at
    // least one body of the limit), the second does not. A body in one frame is held as it
    // came, whole, so each client's other body is refused only once this one is held.
    let mut attacks = Vec::new();
    for client in 11..15 {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, client));
        let (sender, driver, mut answers) = held_back_bodies(server.addr, from, 2).await;
        refused_for_memory(&mut answers).await;
        attacks.push((sender, driver, answers));
    }
    // A fifth client's body does not fit in the 4 KiB the four left.
    let fifth = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 15));
    let (_fifth_sender, _fifth_driver, mut fifth_answers) =
        held_back_bodies(server.addr, fifth, 1).await;
    refused_for_memory(&mut fifth_answers).await;
    for (_, _, answers) in &mut attacks {
        assert!(
            tokio::time::timeout(Duration::from_millis(200), answers.join_next())
                .await
                .is_err(),
            "a body held back was answered"
        );
    }
    assert_eq!(genuine(server.addr, GENUINE, "n-small").await, 200);
    let large = with(
        CALLBACK,
        "/padding",
        Some(serde_json::json!(" ".repeat(5 * 1024))),
    );
    let send_large = || send_callback(server.addr, GENUINE, &large);
    assert_eq!(
        send_large().await,
        503,
        "a large body fitted beside the held-back ones"
    );

    // A connection gone, its bodies give back what they held: a large one fits again.
    let (sender, driver, mut answers) = attacks.pop().unwrap();
    drop(sender);
    driver.abort();
    answers.abort_all();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match send_large().await {
            200 => break,
            503 => {}
            other => panic!("a large body was answered {other}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held-back bodies' memory was never given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Four clients that each send bodies at once and then hold them back take all the body
/// memory, a quarter each, while keeping the minimum rate. Once they have been arriving for
/// longer than `server.min_body_rate_grace`, the oldest gives its memory up to a genuine
/// callback that needs it, is answered 408 and counted; the others hold on, and a client
/// short of its own quarter takes it from its own bodies, not from other clients'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_held_back_past_the_grace_give_their_memory_up_to_a_genuine_callback() {
    let mut config = test_config();
    config.server.body_limit = 8 * 1024;
    config.server.body_memory_limit = 28 * 1024;
    config.server.request_timeout = Duration::from_secs(600);
    // Long enough that the memory is seen full (a 503) within it on a loaded machine.
    let grace = Duration::from_secs(5);
    config.server.min_body_rate_grace = grace;
    let server = TestServer::start_with(config).await;
    // 6 KiB each, four clients: 24 KiB of 28 held, and each keeps the rate (240 bytes/s)
    // on average for 25 s.
    let mut attacks = Vec::new();
    for client in 11..15 {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, client));
        attacks.push(held_back_bodies(server.addr, from, 1).await);
    }
    // A callback of over 5 KiB does not fit in the 4 KiB left once all four are held:
    // answered 503 then, within their grace (200 before, while one is still on its way).
    let large = with(
        CALLBACK,
        "/padding",
        Some(serde_json::json!(" ".repeat(5 * 1024))),
    );
    let send_large = || send_callback(server.addr, GENUINE, &large);
    let until = |answer: u16| async move {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while send_large().await != answer {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never answered {answer}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    until(503).await;
    // Past the grace, the oldest held-back body gives way to it.
    tokio::time::sleep(grace).await;
    until(200).await;
    // The body that gave way is answered 408, however long its answer takes to come.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let gave_way = loop {
        let mut answered = None;
        for (index, (_, _, answers)) in attacks.iter_mut().enumerate() {
            if let Ok(Some(answer)) =
                tokio::time::timeout(Duration::from_millis(20), answers.join_next()).await
            {
                answered = Some((index, answer.unwrap().unwrap()));
                break;
            }
        }
        if let Some(answered) = answered {
            break answered;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no held-back body was answered"
        );
    };
    let (gave_way, answer) = (vec![gave_way.0], gave_way.1);
    assert_eq!(
        status_and_message(answer).await,
        (408, false, serde_json::json!(GAVE_WAY))
    );
    // One body was enough to make room: the others hold on.
    for (index, (_, _, answers)) in attacks.iter_mut().enumerate() {
        if !gave_way.contains(&index) {
            assert!(
                tokio::time::timeout(Duration::from_millis(200), answers.join_next())
                    .await
                    .is_err(),
                "a second body gave way"
            );
        }
    }
    server
        .assert_metrics(&["payhook_connections_shed_total{reason=\"body_memory\"} 1"])
        .await;

    // A held-back client sends a second body: short of its quarter (8 KiB), it takes the
    // memory of its own first body, not another client's.
    let kept = (0..4).find(|index| !gave_way.contains(index)).unwrap();
    let (sender, _, first) = &mut attacks[kept];
    sender.ready().await.unwrap();
    let mut second = JoinSet::new();
    second.spawn(sender.send_request(held_back_request()));
    assert_eq!(
        next_answer(first).await,
        (408, false, serde_json::json!(GAVE_WAY))
    );
    for (index, (_, _, answers)) in attacks.iter_mut().enumerate() {
        if index != kept && !gave_way.contains(&index) {
            assert!(
                tokio::time::timeout(Duration::from_millis(200), answers.join_next())
                    .await
                    .is_err(),
                "another client's body gave way"
            );
        }
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), second.join_next())
            .await
            .is_err(),
        "the second body was answered"
    );
}
