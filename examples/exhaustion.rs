//! Exhaustion without credentials, measured: an attack that holds connections and one that
//! fills memory with the longest identifiers allowed, against the example merchant, on
//! loopback only, bounded in time (about two minutes).
//!
//! ```text
//! cargo run --release --example exhaustion
//! ```
//!
//! The example merchant runs as a child process (default configuration, an RSA key for
//! callbacks, `server.max_identifier_chars = 4096` — the largest allowed — and a 30 s
//! retention so that the end of it is seen). Then:
//!
//! 1. **Connections.** From 127.0.0.1, 2,000 clients send request headers one byte a second,
//!    1,000 send a body ten bytes a second (under a signature header of the right form that
//!    verifies nothing, without which a body is refused before it is read), 1,000 keep an
//!    HTTP/2 connection open with no stream (answering PINGs); each reconnects when the
//!    server closes it. Beside them, 50
//!    genuine signed callbacks from 127.0.0.2, then 50 from 127.0.0.1 itself, each on a new
//!    connection, five at a time. Targets: all 200, p99 under 1 s from 127.0.0.2.
//! 2. **Identifiers.** 10,000 transaction validations the merchant denies, each with a
//!    4,096-byte nonce and client id, 32 at a time. Target: peak RSS under 128 MiB.
//! 3. **Retention.** Idle until the records' retention ended and the sweeper purged them:
//!    RSS back to the order of magnitude of the start; then 20 s more of idleness, with the
//!    bytes the service writes to disk meanwhile (an idle service should write nothing).
//! 4. **Bodies held back.** Four clients (127.0.0.11–14), 16 connections each, each sending
//!    a callback body of the limit (1 MiB) at once but for its last byte, which it holds
//!    back; each reconnects when the server closes it. Each client so holds its quarter of
//!    the body memory (64 MiB), keeping the minimum rate on average. After 7 s (past the
//!    bodies' grace), 50 genuine signed callbacks from 127.0.0.2, one every 100 ms or so.
//!    Target: all 200 (the bodies arriving longest give their memory up to them).
//!
//! It prints each figure, the server's shed counters, and the longest line the service
//! logged (target: at most 4 KiB, whatever the input).
//!
//! ```text
//! cargo run --release --example exhaustion -- soak 30 15
//! ```
//!
//! **Soak**: the same service (Ed25519 signatures, a 5-minute retention and a sweep every
//! 20 s, so that records expire and are purged all along) under a steady 400 signed
//! callbacks a second, one in five a repeat, over 8 keep-alive connections, for 30 minutes;
//! then 15 minutes idle. Every 30 s a sample: requests, non-2xx, p99 and worst latency of
//! the interval, RSS, bytes written to disk per second, the store's size. At the end: the
//! worst seconds, RSS over the last ten loaded minutes (it should plateau) and while idle
//! (flat), and the idle disk writes (none).
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    reason = "a load program prints and stops at the first failure"
)]

#[path = "common/server.rs"]
#[allow(dead_code, reason = "not every program uses every part")]
mod child;
use payhook::sim::example_merchant as merchant;

use bytes::Bytes;
use child::Server;
use payhook::Config;
use payhook::signature::{Algorithm, Encoding, SigningKey};
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const GENUINE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const SLOW_HEADERS: usize = 2_000;
const SLOW_BODIES: usize = 1_000;
const IDLE_HTTP2: usize = 1_000;
const GENUINE_CALLBACKS: usize = 50;
/// Clients holding bodies back, and connections each: a quarter of the default body memory
/// (64 MiB) each, in bodies of the default limit (1 MiB).
const HOLDING_CLIENTS: u8 = 4;
const HELD_BODIES_PER_CLIENT: usize = 16;
const VALIDATIONS: usize = 10_000;
const LONGEST_IDENTIFIER: usize = 4_096;
const RETENTION: Duration = Duration::from_secs(30);
/// The soak's retention: records expire and are purged while the load goes on.
const SOAK_RETENTION: Duration = Duration::from_secs(300);
/// The soak's load: signed callbacks per second, one in five a repeat of a recent one.
const SOAK_RATE: u64 = 400;
const SOAK_CONNECTIONS: u64 = 8;
/// How long the idle service's disk writes are sampled after the purges.
const IDLE_SAMPLE: Duration = Duration::from_secs(20);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let minutes = |i: usize, default: u64| {
        Duration::from_secs(60 * args.get(i).and_then(|m| m.parse().ok()).unwrap_or(default))
    };
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(Path::new(&args[2]), Path::new(&args[3]), &args[4]),
        Some("soak") => soak(minutes(2, 30), minutes(3, 15)),
        _ => drive(),
    }
}

// ---------------------------------------------------------------- the service (child)

fn serve(data: &Path, public_key: &Path, mode: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut config = Config::default();
        config.server.listen = "127.0.0.1:0".parse().unwrap();
        config.server.max_identifier_chars = LONGEST_IDENTIFIER;
        config.store.path = data.to_owned();
        if mode == "soak" {
            config.signature.algorithm = Algorithm::Ed25519;
            config.store.retention = SOAK_RETENTION;
            config.store.sweep_interval = Duration::from_secs(20);
        } else {
            config.store.retention = RETENTION;
            config.store.sweep_interval = Duration::from_secs(5);
        }
        config.signature.keys = vec![payhook::config::KeySource {
            file: Some(public_key.to_owned()),
            ..Default::default()
        }];
        let listener = payhook::bind(config.server.listen).await.unwrap();
        let store = merchant::open_store(&config).await.unwrap();
        let merchant = merchant::Merchant {
            max_amount: 10_000.into(),
            review_above: None,
            provider_tags: merchant::ProviderTags::default(),
        };
        let app = merchant::app(config, merchant, store).unwrap();
        println!("listening on {}", listener.local_addr().unwrap());
        payhook::serve(listener, app, std::future::pending())
            .await
            .unwrap();
    });
}

// ---------------------------------------------------------------- the driver (parent)

/// Bytes of the store's files on disk.
fn store_bytes(data: &Path) -> u64 {
    std::fs::read_dir(data)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Starts the service in `mode` (`attack` or `soak`), logging to `log`.
fn start(data: &Path, public_key: &Path, log: &Path, mode: &str) -> Server {
    let data = data.display().to_string();
    let key = public_key.display().to_string();
    Server::start(
        &["serve", &data, &key, mode],
        std::fs::File::create(log).unwrap().into(),
    )
}

/// What the attack did.
#[derive(Default)]
struct Attack {
    stop: AtomicBool,
    opened: AtomicU64,
    closed_by_server: AtomicU64,
}

impl Attack {
    /// The connections it opened and the server closed.
    fn connections(&self) -> String {
        format!(
            "attack: {} connections opened, {} closed by the server",
            self.opened.load(Ordering::Relaxed),
            self.closed_by_server.load(Ordering::Relaxed)
        )
    }
}

async fn connect(server: SocketAddr, from: IpAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::new(from, 0)).ok()?;
    socket.connect(server).await.ok()
}

/// Writes `first`, then `drip` every `every`, until the server closes the connection.
async fn trickle(mut stream: TcpStream, first: &[u8], drip: &[u8], every: Duration) {
    if stream.write_all(first).await.is_err() {
        return;
    }
    let (mut read, mut write) = stream.into_split();
    let closed = async move {
        let mut sink = [0u8; 1024];
        while read.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    };
    let dripping = async move {
        loop {
            tokio::time::sleep(every).await;
            if write.write_all(drip).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = closed => {}
        () = dripping => {}
    }
}

async fn idle_http2(stream: TcpStream) {
    if let Ok((_sender, connection)) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Full<Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
    {
        let _ = connection.await;
    }
}

#[derive(Clone, Copy)]
enum Kind {
    SlowHeaders,
    SlowBody,
    IdleHttp2,
    /// A body of the limit (1 MiB) sent at once but for its last byte, which is held back.
    HeldBody,
}

/// One attacking client: holds a connection its way, reconnects when it is closed.
async fn attacker(server: SocketAddr, from: IpAddr, kind: Kind, attack: Arc<Attack>) {
    let head = "POST /payhook/callback HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    // A signature of the right form and length (RSA-2048, base64) that verifies nothing:
    // without one a callback is refused before its body is read.
    let forged = format!("X-Signature: {}==\r\n", "A".repeat(342));
    while !attack.stop.load(Ordering::Relaxed) {
        let Some(stream) = connect(server, from).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        attack.opened.fetch_add(1, Ordering::Relaxed);
        let held = async {
            match kind {
                Kind::SlowHeaders => {
                    trickle(stream, head.as_bytes(), b"a", Duration::from_secs(1)).await;
                }
                Kind::SlowBody => {
                    let first = format!("{head}{forged}Content-Length: 100000\r\n\r\n{{");
                    trickle(
                        stream,
                        first.as_bytes(),
                        b"          ",
                        Duration::from_secs(1),
                    )
                    .await;
                }
                Kind::IdleHttp2 => idle_http2(stream).await,
                Kind::HeldBody => {
                    let limit = Config::default().server.body_limit;
                    let mut first =
                        format!("{head}{forged}Content-Length: {limit}\r\n\r\n").into_bytes();
                    first.resize(first.len() + limit - 1, b' ');
                    trickle(stream, &first, b"", Duration::from_secs(1)).await;
                }
            }
        };
        tokio::select! {
            () = held => { attack.closed_by_server.fetch_add(1, Ordering::Relaxed); }
            () = stopped(&attack) => return,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stopped(attack: &Attack) {
    while !attack.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `request` on a new connection from `from`; the status and how long it took.
async fn exchange(server: SocketAddr, from: IpAddr, request: &[u8]) -> (u16, Duration) {
    let started = Instant::now();
    let Some(mut stream) = connect(server, from).await else {
        return (0, started.elapsed());
    };
    if stream.write_all(request).await.is_err() {
        return (0, started.elapsed());
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    let status = String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, started.elapsed())
}

fn post(path: &str, body: &str, signature: Option<&str>) -> Vec<u8> {
    let signature = signature.map_or_else(String::new, |s| format!("X-Signature: {s}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n{signature}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Callback `i`, its transaction changed now (one older than the store's retention is
/// refused).
fn callback(i: usize) -> String {
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ");
    format!(
        r#"{{"id":{i},"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-{i:012}","nonce":"cb-{i}","providerId":11,"providerTransactionId":"pt-{i}","transactionType":1,"transactionStatus":4,"transactionStatusMessage":"Success","transactionInternalMessage":"Thank you","clientId":"client-{}","additionalData":{{"orderId":"o-{i}"}},"amount":10.{:02},"currency":"EUR","destinationAmount":null,"destinationCurrency":"EUR","createdUtc":"{now}","updatedUtc":"{now}"}}"#,
        i % 10,
        i % 100
    )
}

/// Callbacks `numbers`, signed with `key`, each a request of its own.
fn signed_callbacks(key: &SigningKey, numbers: std::ops::Range<usize>) -> Vec<Vec<u8>> {
    numbers
        .map(|i| {
            let body = callback(i);
            let signature = key
                .header_value(body.as_bytes(), Encoding::Base64, None)
                .unwrap();
            post("/payhook/callback", &body, Some(&signature))
        })
        .collect()
}

/// Runs `requests` (from `from`) `parallel` at a time; the statuses and latencies.
async fn run_all(
    server: SocketAddr,
    from: IpAddr,
    requests: Vec<Vec<u8>>,
    parallel: usize,
) -> Vec<(u16, Duration)> {
    let requests = Arc::new(std::sync::Mutex::new(requests.into_iter()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..parallel {
        let requests = Arc::clone(&requests);
        workers.spawn(async move {
            let mut results = Vec::new();
            loop {
                let next = requests.lock().unwrap().next();
                let Some(request) = next else { break };
                results.push(exchange(server, from, &request).await);
            }
            results
        });
    }
    let mut all = Vec::new();
    while let Some(results) = workers.join_next().await {
        all.extend(results.unwrap());
    }
    all
}

fn summary(results: &[(u16, Duration)]) -> String {
    let ok = results.iter().filter(|(s, _)| *s == 200).count();
    let mut latencies: Vec<Duration> = results.iter().map(|(_, d)| *d).collect();
    latencies.sort();
    let at = |p: f64| {
        let index = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[index].as_secs_f64() * 1000.0
    };
    format!(
        "{ok}/{} answered 200; p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        results.len(),
        at(0.50),
        at(0.99),
        at(1.0)
    )
}

/// The server's `payhook_connections_*` lines, read from 127.0.0.1 (the only address
/// `server.metrics_allow_ips` lets in by default), once its attack has stopped.
async fn connection_metrics(server: SocketAddr) -> String {
    let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let Some(mut stream) = connect(server, ATTACKER).await else {
        return String::new();
    };
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer)
        .lines()
        .filter(|l| l.starts_with("payhook_connections_"))
        .map(|l| format!("    {l}\n"))
        .collect()
}

fn drive() {
    let dir = tempfile::tempdir().unwrap();
    let (public_key, key) = child::signing_key(dir.path(), Algorithm::RsaPkcs1Sha256);
    let log = dir.path().join("service.log");
    let server = start(&dir.path().join("data"), &public_key, &log, "attack");
    let address = server.address;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (start_rss, _) = server.rss_mib();
    println!("service started: RSS {start_rss:.1} MiB");

    // 1. Connections.
    let signed = signed_callbacks(&key, 0..2 * GENUINE_CALLBACKS);
    let attack = Arc::new(Attack::default());
    let (from_elsewhere, from_attacker) = runtime.block_on(async {
        let mut attackers = tokio::task::JoinSet::new();
        for (kind, count) in [
            (Kind::SlowHeaders, SLOW_HEADERS),
            (Kind::SlowBody, SLOW_BODIES),
            (Kind::IdleHttp2, IDLE_HTTP2),
        ] {
            for _ in 0..count {
                attackers.spawn(attacker(address, ATTACKER, kind, Arc::clone(&attack)));
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (first, second) = signed.split_at(GENUINE_CALLBACKS);
        let elsewhere = run_all(address, GENUINE, first.to_vec(), 5).await;
        let same = run_all(address, ATTACKER, second.to_vec(), 5).await;
        attack.stop.store(true, Ordering::Relaxed);
        while attackers.join_next().await.is_some() {}
        (elsewhere, same)
    });
    let (_, connections_peak) = server.rss_mib();
    println!(
        "\n1. connections: {SLOW_HEADERS} slow-header + {SLOW_BODIES} slow-body + {IDLE_HTTP2} idle HTTP/2 clients from 127.0.0.1, reconnecting"
    );
    println!("  {}", attack.connections());
    println!(
        "  genuine callbacks from 127.0.0.2: {}",
        summary(&from_elsewhere)
    );
    println!(
        "  genuine callbacks from 127.0.0.1: {}",
        summary(&from_attacker)
    );
    println!("  peak RSS so far {connections_peak:.1} MiB");
    print!("{}", runtime.block_on(connection_metrics(address)));

    // 2. Identifiers.
    let long = |prefix: &str, i: usize| {
        format!("{prefix}{i}-{}", "n".repeat(LONGEST_IDENTIFIER))[..LONGEST_IDENTIFIER].to_owned()
    };
    let validations: Vec<Vec<u8>> = (0..VALIDATIONS)
        .map(|i| {
            let body = format!(
                r#"{{"merchantData":{{"merchantHash":"6f1c2b1e-8a8f-4d55-9a3e-1c2b3d4e5f60","clientId":"{}","additionalData":{{}}}},"paymentData":{{"nonce":"{}","amount":1000000,"currency":"EUR","providerId":11}},"providerData":null,"validationId":{i},"cashIn":true}}"#,
                long("c\u{1b}[2J", i).replace('\u{1b}', "\\u001b"),
                long("n", i)
            );
            post("/payhook/transaction-validation", &body, None)
        })
        .collect();
    let started = Instant::now();
    let results = runtime.block_on(run_all(address, GENUINE, validations, 32));
    let denied = results.iter().filter(|(s, _)| *s == 403).count();
    let (rss, peak) = server.rss_mib();
    println!(
        "\n2. identifiers: {VALIDATIONS} validations with {LONGEST_IDENTIFIER}-byte nonces and client ids, denied by the merchant"
    );
    println!(
        "  {denied}/{VALIDATIONS} answered 403 in {:.1} s; RSS {rss:.1} MiB, peak {peak:.1} MiB (target: peak < 128 MiB)",
        started.elapsed().as_secs_f64()
    );

    // 3. Retention, then idle.
    std::thread::sleep(RETENTION + Duration::from_secs(15));
    let (rss, _) = server.rss_mib();
    println!(
        "\n3. after the retention ({}s) and its sweeps: RSS {rss:.1} MiB (started at {start_rss:.1} MiB)",
        RETENTION.as_secs()
    );
    let written = server.written_bytes();
    std::thread::sleep(IDLE_SAMPLE);
    let idle_rate = (server.written_bytes() - written) as f64 / IDLE_SAMPLE.as_secs_f64();
    let (idle_rss, _) = server.rss_mib();
    println!(
        "  idle for {}s: {:.1} KiB/s written to disk, RSS {idle_rss:.1} MiB",
        IDLE_SAMPLE.as_secs(),
        idle_rate / 1024.0
    );

    // 4. Bodies held back.
    let (from_elsewhere, held) = runtime.block_on(async {
        let attack = Arc::new(Attack::default());
        let mut attackers = tokio::task::JoinSet::new();
        for client in 0..HOLDING_CLIENTS {
            let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 11 + client));
            for _ in 0..HELD_BODIES_PER_CLIENT {
                attackers.spawn(attacker(address, from, Kind::HeldBody, Arc::clone(&attack)));
            }
        }
        // Past the bodies' grace (`server.min_body_rate_grace`, 5 s): each now holds its
        // memory as long as it may.
        tokio::time::sleep(Duration::from_secs(7)).await;
        // One at a time, 100 ms apart: the attack fills again what a body gave up (it
        // reconnects 200 ms after it is closed), so that each may need room of its own.
        let mut elsewhere = Vec::new();
        for request in signed_callbacks(&key, 2 * GENUINE_CALLBACKS..3 * GENUINE_CALLBACKS) {
            elsewhere.push(exchange(address, GENUINE, &request).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        attack.stop.store(true, Ordering::Relaxed);
        while attackers.join_next().await.is_some() {}
        (elsewhere, attack)
    });
    let (_, peak) = server.rss_mib();
    println!(
        "\n4. bodies held back: {HOLDING_CLIENTS} clients (127.0.0.11–{}), {HELD_BODIES_PER_CLIENT} connections each, each sending a body of 1 MiB less a byte at once and holding the last byte back, reconnecting",
        10 + HOLDING_CLIENTS
    );
    println!("  {}", held.connections());
    println!(
        "  genuine callbacks from 127.0.0.2: {} (target: all 200)",
        summary(&from_elsewhere)
    );
    println!("  peak RSS {peak:.1} MiB");
    print!("{}", runtime.block_on(connection_metrics(address)));

    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    let control = text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t');
    println!(
        "\nlog: {} lines, the longest {longest} bytes (target: at most 4096); raw control characters from the wire: {}",
        text.lines().count(),
        if control { "FOUND" } else { "none" }
    );
}

// ---------------------------------------------------------------- the soak

/// Answers of one interval.
#[derive(Default)]
struct Window {
    answered: u64,
    not_2xx: u64,
    latencies_us: Vec<u64>,
    /// Each request: when it was sent (ms since the Unix epoch) and its latency (µs).
    requests: Vec<(u64, u64)>,
}

impl Window {
    fn p99_and_max_ms(&mut self) -> (f64, f64) {
        self.latencies_us.sort_unstable();
        let at = |p: f64| {
            if self.latencies_us.is_empty() {
                return 0.0;
            }
            let index = ((self.latencies_us.len() as f64 * p).ceil() as usize)
                .clamp(1, self.latencies_us.len())
                - 1;
            self.latencies_us[index] as f64 / 1000.0
        };
        (at(0.99), at(1.0))
    }
}

/// One of the soak's connections: `SOAK_RATE / SOAK_CONNECTIONS` callbacks a second over one
/// keep-alive connection (again after an error), until `stop`.
async fn soak_sender(
    server: SocketAddr,
    key: Arc<SigningKey>,
    first: usize,
    sent: Arc<std::sync::Mutex<std::collections::VecDeque<(Bytes, String)>>>,
    window: Arc<std::sync::Mutex<Window>>,
    stop: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(Duration::from_micros(
        1_000_000 * SOAK_CONNECTIONS / SOAK_RATE,
    ));
    let mut sender = None;
    let mut i = first;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if sender.is_none() {
            let Some(stream) = connect(server, GENUINE).await else {
                continue;
            };
            let Ok((s, connection)) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
            else {
                continue;
            };
            tokio::spawn(connection);
            sender = Some(s);
        }
        let Some(client) = sender.as_mut() else {
            continue;
        };
        i += SOAK_CONNECTIONS as usize;
        let repeat = (i / SOAK_CONNECTIONS as usize).is_multiple_of(5);
        let (body, signature) = match repeat.then(|| sent.lock().unwrap().front().cloned()) {
            Some(Some(recent)) => recent,
            _ => {
                let body = Bytes::from(callback(i));
                let signature = key.header_value(&body, Encoding::Base64, None).unwrap();
                let mut recent = sent.lock().unwrap();
                recent.push_back((body.clone(), signature.clone()));
                if recent.len() > 1_000 {
                    recent.pop_front();
                }
                (body, signature)
            }
        };
        let request = hyper::Request::post("/payhook/callback")
            .header("host", "x")
            .header("content-type", "application/json")
            .header("x-signature", signature)
            .body(http_body_util::Full::new(body))
            .unwrap();
        let sent_ms = unix_ms();
        let started = Instant::now();
        let status = match client.send_request(request).await {
            Ok(response) => {
                let status = response.status().as_u16();
                let _ = http_body_util::BodyExt::collect(response.into_body()).await;
                status
            }
            Err(_) => {
                sender = None;
                0
            }
        };
        let latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut window = window.lock().unwrap();
        window.answered += 1;
        window.not_2xx += u64::from(!(200..300).contains(&status));
        window.latencies_us.push(latency_us);
        window.requests.push((sent_ms, latency_us));
    }
}

fn unix_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

/// The sweeps the service logged: when each began and ended (ms since the Unix epoch), and
/// its log line's fields.
fn sweeps(log: &Path) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|line| line.contains("expired records purged"))
        .filter_map(|line| {
            let logged = chrono::DateTime::parse_from_rfc3339(line.split_whitespace().next()?)
                .ok()?
                .timestamp_millis();
            let field = |name: &str| -> Option<f64> {
                let at = line.find(&format!("{name}="))? + name.len() + 1;
                line[at..].split_whitespace().next()?.parse().ok()
            };
            let took = field("took_ms")?;
            let ended = u64::try_from(logged).ok()?;
            let details = format!(
                "{} purged in {:.0} ms, {} steps, longest step {:.1} ms, flush {:.1} ms",
                field("purged")?,
                took,
                field("steps")?,
                field("longest_step_ms")?,
                field("flush_ms")?
            );
            Some((ended.saturating_sub(took.ceil() as u64), ended, details))
        })
        .collect()
}

/// The worst latency of the requests that overlapped each sweep, and of those that
/// overlapped none (ms).
fn latency_around_sweeps(requests: &[(u64, u64)], sweeps: &[(u64, u64, String)]) {
    let overlaps = |(sent, latency_us): (u64, u64), (begin, end): (u64, u64)| {
        sent <= end && sent + latency_us.div_ceil(1000) >= begin
    };
    let mut outside = Vec::new();
    let mut during = vec![0u64; sweeps.len()];
    for &request in requests {
        let mut any = false;
        for (i, (begin, end, _)) in sweeps.iter().enumerate() {
            if overlaps(request, (*begin, *end)) {
                during[i] = during[i].max(request.1);
                any = true;
            }
        }
        if !any {
            outside.push(request.1);
        }
    }
    outside.sort_unstable();
    let at = |p: f64| {
        outside
            .get(((outside.len() as f64 * p) as usize).min(outside.len().saturating_sub(1)))
            .map_or(0.0, |us| *us as f64 / 1000.0)
    };
    println!(
        "
requests overlapping no sweep: {}, p99 {:.1} ms, p99.9 {:.1} ms, worst {:.1} ms",
        outside.len(),
        at(0.99),
        at(0.999),
        at(1.0)
    );
    println!(
        "sweeps ({}), with the worst latency of a request that overlapped each:",
        sweeps.len()
    );
    for ((_, _, details), worst) in sweeps.iter().zip(&during) {
        println!(
            "  {details}: worst request {:.1} ms",
            *worst as f64 / 1000.0
        );
    }
}

fn soak(loaded: Duration, idle: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let (public_key, key) = child::signing_key(dir.path(), Algorithm::Ed25519);
    let key = Arc::new(key);
    let data = dir.path().join("data");
    let log = dir.path().join("service.log");
    let server = start(&data, &public_key, &log, "soak");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let window = Arc::new(std::sync::Mutex::new(Window::default()));
    let sent = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    for first in 0..SOAK_CONNECTIONS as usize {
        runtime.spawn(soak_sender(
            server.address,
            Arc::clone(&key),
            first,
            Arc::clone(&sent),
            Arc::clone(&window),
            Arc::clone(&stop),
        ));
    }
    println!(
        "soak: {SOAK_RATE} signed callbacks/s (1 in 5 a repeat) for {} min, then {} min idle; retention {} s, a sweep every 20 s",
        loaded.as_secs() / 60,
        idle.as_secs() / 60,
        SOAK_RETENTION.as_secs()
    );
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>11} {:>10}",
        "t (s)", "req/s", "non-2xx", "p99 ms", "max ms", "RSS MiB", "disk KiB/s", "store MiB"
    );
    let started = Instant::now();
    let mut worst_seconds: Vec<(f64, u64)> = Vec::new();
    let mut second_maxima: Vec<f64> = Vec::new();
    let mut loaded_rss: Vec<(u64, f64)> = Vec::new();
    let mut idle_rss: Vec<f64> = Vec::new();
    let (mut answered, mut not_2xx) = (0, 0);
    let mut interval = Window::default();
    let mut requests = Vec::new();
    let mut written = server.written_bytes();
    let mut idle_written = None;
    let total = loaded + idle;
    let mut second = 0u64;
    while started.elapsed() < total {
        std::thread::sleep(Duration::from_secs(1));
        second += 1;
        let is_loaded = Duration::from_secs(second) <= loaded;
        if !is_loaded && !stop.swap(true, Ordering::Relaxed) {
            idle_written = Some(server.written_bytes());
        }
        let mut this = std::mem::take(&mut *window.lock().unwrap());
        let (_, max) = this.p99_and_max_ms();
        if this.answered > 0 {
            second_maxima.push(max);
            worst_seconds.push((max, second));
        }
        interval.answered += this.answered;
        interval.not_2xx += this.not_2xx;
        interval.latencies_us.append(&mut this.latencies_us);
        requests.append(&mut this.requests);
        if second.is_multiple_of(30) {
            let (p99, max) = interval.p99_and_max_ms();
            let (rss, _) = server.rss_mib();
            let now_written = server.written_bytes();
            let rate = (now_written - written) as f64 / 30.0 / 1024.0;
            written = now_written;
            if is_loaded {
                loaded_rss.push((second, rss));
            } else {
                idle_rss.push(rss);
            }
            println!(
                "{second:>6} {:>8.0} {:>8} {p99:>8.1} {max:>8.1} {rss:>8.1} {rate:>11.1} {:>10.1}",
                interval.answered as f64 / 30.0,
                interval.not_2xx,
                store_bytes(&data) as f64 / 1024.0 / 1024.0
            );
            answered += interval.answered;
            not_2xx += interval.not_2xx;
            interval = Window::default();
        }
    }
    stop.store(true, Ordering::Relaxed);

    worst_seconds.sort_by(|a, b| b.0.total_cmp(&a.0));
    second_maxima.sort_by(f64::total_cmp);
    let median = second_maxima
        .get(second_maxima.len() / 2)
        .copied()
        .unwrap_or(0.0);
    println!("\n{answered} requests, {not_2xx} not 2xx");
    println!(
        "worst latency of a second: median {median:.1} ms; the five worst: {}",
        worst_seconds
            .iter()
            .take(5)
            .map(|(ms, s)| format!("{ms:.1} ms at {s} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let last_ten: Vec<f64> = loaded_rss
        .iter()
        .filter(|(s, _)| *s + 600 > loaded.as_secs())
        .map(|(_, rss)| *rss)
        .collect();
    let range = |values: &[f64]| {
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{min:.1}–{max:.1} MiB")
    };
    println!("RSS over the last ten loaded minutes: {}", range(&last_ten));
    println!("RSS while idle: {}", range(&idle_rss));
    latency_around_sweeps(&requests, &sweeps(&log));
    if let Some(at_idle) = idle_written {
        let idle_seconds = idle.as_secs_f64().max(1.0);
        println!(
            "disk writes while idle: {:.1} KiB/s",
            (server.written_bytes() - at_idle) as f64 / idle_seconds / 1024.0
        );
    }
}
