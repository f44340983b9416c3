//! The callback endpoint's throughput and latency against a raw hyper baseline, measured in
//! one run with one load driver on loopback.
//!
//! Run it in release mode (it takes about a minute, most of it signing the bodies):
//!
//! ```text
//! cargo run --release --example bench_callbacks            # 5 s per scenario
//! cargo run --release --example bench_callbacks -- 10      # 10 s per scenario
//! cargo run --release --example bench_callbacks -- 5 postgres   # P, P' and Q only
//! cargo run --release --example bench_callbacks -- 5 D E        # the scenarios named only
//! cargo run --release --example bench_callbacks -- 5 B D E --rounds 3   # three rounds
//! cargo run --release --example bench_callbacks -- 5 B D E --rounds 3 --slices 10
//! cargo run --release --example bench_callbacks -- 5 B D E F --rounds 3 --slices 10   # and the floor
//! ```
//!
//! `--rounds N` runs the chosen scenarios (all but P, P' and Q, which run once) N times in
//! turn, each round on fresh servers and stores, after one signing: a table per round, then
//! each ratio in every round, its median, and whether its target held in every round. On a
//! VM whose speed moves by ±20 % between runs, a change is judged by rounds run side by
//! side, not by one run against another taken earlier.
//!
//! `--rate N` signs N unique bodies per second of the duration instead of 45,000 (6,000 for
//! the PostgreSQL scenarios alone): enough for a slower machine or a profiling run, and far
//! quicker to sign. A scenario that runs out of unique bodies says so in its row, and so does
//! D when it sends a body again: it cycles through them rather than stop, and a body sent
//! again is verified from the signature cache, cheaper than a fresh delivery.
//!
//! `--instructions` counts instead of timing: each chosen scenario's server (A–I) runs
//! under `valgrind --tool=callgrind`, one at a time, and the program prints the instructions
//! it executed per request, and E − D and B − D. A count does not move with the VM's speed,
//! so a change to payhook's own path (E − D) can be judged by it alone; it says nothing of
//! waits, contention or the disk. About a minute per scenario for `-- 20 D E --instructions`
//! (valgrind must be on the PATH; `--rate` defaults to 2,000 bodies per second here; one
//! round, each scenario alone, so `--rounds` and `--slices` do not apply). `--keep DIR`
//! leaves each counted window's dump in DIR (`callgrind.E.1` for E), for
//! `callgrind_annotate` to say where the instructions went.
//!
//! `--slices N` starts all of a round's servers at once and moves the load from one to the
//! next in turn, N times, each slice lasting 1/N of the duration: each scenario still gets the
//! whole duration, but a change of the machine's speed during the round falls on every
//! scenario alike, so the ratios of a round are taken under the same conditions. Without
//! it, each scenario runs alone for the whole duration, one after the other.
//!
//! Each scenario's server runs as a child process (so that its peak RSS is its own); the
//! load driver keeps 64 HTTP/1.1 keep-alive connections busy for the same duration:
//!
//! * **A** — a minimal hyper server that reads the body and answers 200 (the baseline);
//! * **B** — payhook's callback endpoint: RSA-2048-signed ~1 KB bodies with unique nonces,
//!   durable deduplication (group commit), the example merchant's ledger write;
//! * **C** — the same server receiving only retries of already-acknowledged nonces;
//! * **D** — B without the store: verification, parsing and the handler only;
//! * **E** — B's whole durable path (claims, effects, group commit, waits) on a store whose
//!   commits build their batch and write it nowhere (not to sled, no flush, no fdatasync):
//!   what payhook's own mechanics cost, apart from sled and the disk;
//! * **F** — B's whole durable path on a store whose commits append their batch to a file of
//!   its own and `fdatasync` it before answering, and write nothing to sled and no watermark:
//!   B with an engine that costs nothing and one sync per batch, the floor of any store that
//!   makes each batch durable before it answers. The file is zero-filled at the store's open
//!   and written in place, as a log of payhook's own would be, so that a sync writes no
//!   metadata. F/D is printed as a reference, with no target: where B/D would be, whatever
//!   the engine;
//! * **I** — B with the inspector recording every request (the operating API on,
//!   `admin.inspector_recent` at its default): what recording costs the callback path;
//! * **P** — B on PostgreSQL (`store.url`): the same callbacks, the mark and the example's
//!   ledger committed in one transaction, with a pool of [`PG_POOL`] connections;
//! * **Q** — the engine's ceiling, straight from Rust: the same database work alone (the
//!   mark, a ledger entry and a balance upsert per transaction) from [`CONNECTIONS`] tasks
//!   on a pool of [`PG_POOL`] connections, no HTTP and no payhook.
//!
//! P and Q use the PostgreSQL of `PAYHOOK_BENCH_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), each in a schema of its own, dropped
//! afterwards; without a reachable server they are skipped, and the program says so.
//!
//! It prints req/s, p50, p99, the slowest answer, non-2xx answers, peak RSS and the server's
//! CPU time per request for each, and the ratios against
//! the targets (B/A ≥ 0.25, B/D ≥ 0.65, C/A ≥ 0.50, E/D ≥ 0.90, I/B ≥ 0.95, p99 of B ≤ 10 ms, no non-2xx,
//! peak RSS of B ≤ 64 MiB; P/Q ≥ 0.60, p99 of P ≤ 25 ms).
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    reason = "a benchmark prints and stops at the first failure"
)]

#[path = "common/server.rs"]
#[allow(dead_code, reason = "not every program uses every part")]
mod child;
use payhook::sim::example_merchant as merchant;

use bytes::Bytes;
use child::Server;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use payhook::handler::{CallbackContext, CallbackDecision, CallbackReceiver};
use payhook::model::{CallbackBody, TransactionStatus, TransactionType};
use payhook::signature::{Algorithm, Encoding, SigningKey};
use payhook::{App, Config, HandlerError};
use std::{
    net::SocketAddr,
    path::Path,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::net::{TcpListener, TcpStream};

const CONNECTIONS: usize = 64;
/// The scenarios a run may choose; P stands for P, P' and Q together.
const SCENARIOS: [&str; 8] = ["A", "B", "C", "D", "E", "F", "I", "P"];

/// The scenarios chosen on the command line (none chosen is all), and how many rounds.
struct Chosen {
    scenarios: Vec<String>,
    rounds: usize,
    /// Slices each scenario's load is cut into, taken in turn across the round's servers.
    slices: usize,
    /// Bodies signed per second of the duration, when not the default.
    rate: Option<usize>,
    /// Where `--instructions` leaves its callgrind dumps, when they are to be kept.
    keep: Option<std::path::PathBuf>,
}

impl Chosen {
    fn runs(&self, scenario: &str) -> bool {
        self.scenarios.is_empty() || self.scenarios.iter().any(|s| s == scenario)
    }
}
const PATH: &str = "/payhook/callback";
/// Acknowledged nonces whose retries scenario C replays.
const RETRIED_NONCES: usize = 2_000;
/// PostgreSQL connections of P's service and of Q's pool.
const PG_POOL: u32 = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        serve(
            &args[2],
            Path::new(&args[3]),
            Path::new(&args[4]),
            args.get(5).map(String::as_str),
        );
    } else {
        let seconds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
        let mut rest: Vec<&String> = args.iter().skip(2).collect();
        let rounds = take_count(&mut rest, "--rounds", "a number of rounds");
        let slices = take_count(&mut rest, "--slices", "a number of slices per scenario");
        let rate = take_number(&mut rest, "--rate", "a number of bodies per second");
        let instructions = take_flag(&mut rest, "--instructions");
        let keep = take_value(&mut rest, "--keep", "a directory");
        let chosen: Vec<String> = rest
            .into_iter()
            .map(|s| {
                if s == "postgres" {
                    "P".to_owned()
                } else {
                    s.to_uppercase()
                }
            })
            .collect();
        if let Some(unknown) = chosen.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
            eprintln!("unknown scenario `{unknown}`: choose among {SCENARIOS:?} (or `postgres`)");
            std::process::exit(2);
        }
        let chosen = Chosen {
            scenarios: chosen,
            rounds,
            slices,
            rate,
            keep: keep.map(std::path::PathBuf::from),
        };
        if keep_without_instructions(instructions, &chosen) {
            std::process::exit(2);
        }
        if instructions {
            count_instructions(Duration::from_secs(seconds), &chosen);
        } else {
            drive(Duration::from_secs(seconds), &chosen);
        }
    }
}

/// Takes `name` out of `rest`: whether it was there.
fn take_flag(rest: &mut Vec<&String>, name: &str) -> bool {
    let at = rest.iter().position(|s| *s == name);
    at.map(|at| rest.remove(at)).is_some()
}

/// Takes `name VALUE` out of `rest`, if there; exits with status 2 when VALUE is missing.
fn take_value(rest: &mut Vec<&String>, name: &str, what: &str) -> Option<String> {
    let at = rest.iter().position(|s| *s == name)?;
    let Some(value) = rest.get(at + 1).map(|v| (*v).clone()) else {
        eprintln!("{name} takes {what}");
        std::process::exit(2);
    };
    rest.drain(at..at + 2);
    Some(value)
}

/// `true` (having said so) when `--keep` was given without `--instructions`.
fn keep_without_instructions(instructions: bool, chosen: &Chosen) -> bool {
    let alone = chosen.keep.is_some() && !instructions;
    if alone {
        eprintln!("--keep keeps the dumps of --instructions: give both");
    }
    alone
}

/// Takes `name N` out of `rest` (1 when absent); exits with status 2 unless N ≥ 1.
fn take_count(rest: &mut Vec<&String>, name: &str, what: &str) -> usize {
    take_number(rest, name, what).unwrap_or(1)
}

/// Takes `name N` out of `rest`, if there; exits with status 2 unless N ≥ 1.
fn take_number(rest: &mut Vec<&String>, name: &str, what: &str) -> Option<usize> {
    let value = take_value(rest, name, what)?;
    let Some(n) = value.parse().ok().filter(|n| *n > 0) else {
        eprintln!("{name} takes {what}, at least 1");
        std::process::exit(2);
    };
    Some(n)
}

// ---------------------------------------------------------------- the servers (children)

/// P's handler on PostgreSQL: B's ledger written the way a merchant on PostgreSQL writes it,
/// in payhook's transaction — an entry per (nonce, status), the client's balance upserted.
/// It books successful deposits (+) and withdrawals (−) only, which is all the benchmark
/// sends; any other result is failed (503: retried, and listed among the failing callbacks)
/// rather than booked wrong. A ledger that takes every result — a reversal undoing the
/// success it follows — is the example merchant's (`src/sim/example_merchant.rs`, `book`).
struct SqlLedger {
    schema: String,
}

impl CallbackReceiver for SqlLedger {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        let change = match (callback.transaction_status, callback.transaction_type) {
            (TransactionStatus::Success, TransactionType::Deposit) => callback.amount,
            (TransactionStatus::Success, TransactionType::Withdrawal) => -callback.amount,
            (status, kind) => {
                return Err(HandlerError::msg(format!(
                    "this ledger books successful deposits and withdrawals only, not status {} \
                     of type {kind:?}",
                    status.code()
                )));
            }
        };
        let entry = format!(
            "INSERT INTO {}.ledger_entries (nonce, status, client, amount) \
             VALUES ($1, $2, $3, $4::numeric)",
            self.schema
        );
        let balance = format!(
            "INSERT INTO {s}.ledger_balances (client, amount) VALUES ($1, $2::numeric) \
             ON CONFLICT (client) DO UPDATE SET amount = ledger_balances.amount + EXCLUDED.amount",
            s = self.schema
        );
        ctx.effects.postgres(move |conn| {
            let (entry, balance, callback) = (entry.clone(), balance.clone(), callback.clone());
            Box::pin(async move {
                let client = format!("{}|{}", callback.client_id, callback.currency);
                sqlx::query(&entry)
                    .bind(&callback.nonce)
                    .bind(callback.transaction_status.code())
                    .bind(&client)
                    .bind(callback.amount.to_string())
                    .execute(&mut *conn)
                    .await?;
                sqlx::query(&balance)
                    .bind(&client)
                    .bind(change.to_string())
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        });
        Ok(CallbackDecision::Ack)
    }
}

/// D's handler: acknowledges, writes nothing.
struct Acknowledge;

impl CallbackReceiver for Acknowledge {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        _: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        std::hint::black_box(&callback);
        Ok(CallbackDecision::Ack)
    }
}

fn serve(scenario: &str, data: &Path, public_key: &Path, schema: Option<&str>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("listening on {}", listener.local_addr().unwrap());
        if scenario == "baseline" {
            return serve_baseline(listener).await;
        }
        let mut config = Config::default();
        config.server.body_limit = 64 * 1024;
        config.store.path = data.to_owned();
        config.signature.keys = vec![payhook::config::KeySource {
            file: Some(public_key.to_owned()),
            ..Default::default()
        }];
        if let Some(schema) = schema {
            config.store.url = Some(database_url().into());
            config.store.schema = schema.to_owned();
            config.store.pool_size = PG_POOL;
        }
        let app = if scenario == "payhook-sql" {
            let schema = schema.unwrap();
            let store = payhook::store::PgStore::open(&config.store, &[])
                .await
                .unwrap();
            sqlx::raw_sql(&format!(
                "CREATE TABLE IF NOT EXISTS {schema}.ledger_entries \
                   (nonce text, status int4, client text NOT NULL, amount numeric NOT NULL, \
                    PRIMARY KEY (nonce, status)); \
                 CREATE TABLE IF NOT EXISTS {schema}.ledger_balances \
                   (client text PRIMARY KEY, amount numeric NOT NULL);"
            ))
            .execute(store.pool())
            .await
            .unwrap();
            App::builder(config)
                .store(store)
                .callback_receiver(SqlLedger {
                    schema: schema.to_owned(),
                })
                .build()
                .unwrap()
        } else if scenario == "payhook-e" || scenario == "payhook-f" {
            let trees = [merchant::ENTRIES, merchant::BALANCES, merchant::QUARANTINE];
            let kind = if scenario == "payhook-e" {
                payhook::store::BenchmarkStore::WritesNowhere
            } else {
                payhook::store::BenchmarkStore::AppendsOnly
            };
            let store = payhook::store::SledStore::open_for_benchmarks(&config.store, &trees, kind)
                .unwrap();
            merchant::app(
                config,
                merchant::Merchant {
                    max_amount: 1_000_000.into(),
                    review_above: None,
                    provider_tags: merchant::ProviderTags::default(),
                },
                payhook::store::ConfiguredStore::Sled(store),
            )
            .unwrap()
        } else if scenario == "payhook" || scenario == "payhook-inspected" {
            if scenario == "payhook-inspected" {
                config.admin.token = Some("bench-admin-token-0123456789".into());
            }
            let store = merchant::open_store(&config).await.unwrap();
            merchant::app(
                config,
                merchant::Merchant {
                    max_amount: 1_000_000.into(),
                    review_above: None,
                    provider_tags: merchant::ProviderTags::default(),
                },
                store,
            )
            .unwrap()
        } else {
            App::builder(config)
                .callback_receiver(Acknowledge)
                .without_store()
                .build()
                .unwrap()
        };
        payhook::serve(listener, app, std::future::pending())
            .await
            .unwrap();
    });
}

/// A: read the body, answer 200.
async fn serve_baseline(listener: TcpListener) {
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                |request: hyper::Request<hyper::body::Incoming>| async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    std::hint::black_box(body);
                    Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::from_static(
                        b"{}",
                    ))))
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

// ---------------------------------------------------------------- the driver (parent)

/// One signed request.
#[derive(Clone)]
struct Signed {
    body: Bytes,
    signature: String,
}

/// Signs `count` ~1 KB callback bodies with unique nonces, on every core.
fn sign_bodies(key: &SigningKey, count: usize) -> Vec<Signed> {
    let padding = "x".repeat(560);
    // Transactions that changed now: a callback older than the store's retention is refused.
    let now = chrono::Utc::now();
    // As .NET writes it, seven digits of a second (the body keeps its size).
    let created = format!(
        "{}.{:07}",
        now.format("%Y-%m-%dT%H:%M:%S"),
        now.timestamp_subsec_nanos() / 100
    );
    let updated = now.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    std::thread::scope(|scope| {
        let chunks: Vec<_> = (0..threads)
            .map(|t| {
                let (padding, created, updated) = (&padding, &created, &updated);
                scope.spawn(move || {
                    (t..count)
                        .step_by(threads)
                        .map(|i| {
                            let body = format!(
                                r#"{{"id":{i},"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-{i:012}","nonce":"bench-{i}","providerId":11,"providerTransactionId":"pt-{i}","transactionType":1,"transactionStatus":4,"transactionStatusMessage":"Success","transactionInternalMessage":"Thank you","clientId":"client-{}","additionalData":{{"orderId":"o-{i}","note":"{padding}"}},"amount":{}.{:02},"currency":"EUR","destinationAmount":null,"destinationCurrency":"EUR","createdUtc":"{created}","updatedUtc":"{updated}"}}"#,
                                i % 100,
                                i % 1000,
                                i % 100
                            );
                            let signature = key.header_value(body.as_bytes(), Encoding::Base64, None).unwrap();
                            (i, Signed { body: Bytes::from(body), signature })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, Signed)> =
            chunks.into_iter().flat_map(|c| c.join().unwrap()).collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, s)| s).collect()
    })
}

/// Signs enough unique bodies for `rate` requests per second over `duration`, saying so.
fn sign_for(key: &SigningKey, rate: usize, duration: Duration) -> Arc<Vec<Signed>> {
    let count = rate * usize::try_from(duration.as_secs()).unwrap_or(5);
    eprintln!("signing {count} RSA-2048 bodies of ~1 KB ...");
    let signing = Instant::now();
    let bodies = sign_bodies(key, count);
    eprintln!(
        "signed in {:.1}s; body size {} bytes",
        signing.elapsed().as_secs_f64(),
        bodies[0].body.len()
    );
    Arc::new(bodies)
}

/// Which body each request sends.
#[derive(Clone)]
enum Bodies {
    /// Each body once, in order; the run ends early if they run out.
    Unique(Arc<Vec<Signed>>, Arc<AtomicUsize>),
    /// The first `n` bodies, over and over.
    Cycle(Arc<Vec<Signed>>, usize, Arc<AtomicUsize>),
}

impl Bodies {
    /// Each of `bodies` once.
    fn unique(bodies: &Arc<Vec<Signed>>) -> Self {
        Self::Unique(Arc::clone(bodies), Arc::new(AtomicUsize::new(0)))
    }

    /// The first `n` of `bodies`, over and over.
    fn cycle(bodies: &Arc<Vec<Signed>>, n: usize) -> Self {
        Self::Cycle(Arc::clone(bodies), n, Arc::new(AtomicUsize::new(0)))
    }

    /// Whether a body meant to stand for a unique one was sent again: a cycle over every
    /// body that wrapped around. Its verification is then answered from the signature
    /// cache, and the server's work per request is not a fresh delivery's.
    fn repeated(&self) -> bool {
        match self {
            Self::Unique(..) => false,
            Self::Cycle(all, n, next) => *n == all.len() && next.load(Ordering::Relaxed) > *n,
        }
    }

    fn next(&self) -> Option<&Signed> {
        match self {
            Self::Unique(all, next) => all.get(next.fetch_add(1, Ordering::Relaxed)),
            Self::Cycle(all, n, next) => all.get(next.fetch_add(1, Ordering::Relaxed) % n),
        }
    }
}

/// The outcome of one scenario.
#[derive(Default)]
struct Outcome {
    requests: usize,
    non_2xx: usize,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    ran_out: bool,
}

impl Outcome {
    /// Adds a later slice of the same scenario (latencies left unsorted).
    fn absorb(&mut self, slice: Self) {
        self.requests += slice.requests;
        self.non_2xx += slice.non_2xx;
        self.elapsed += slice.elapsed;
        self.latencies_us.extend(slice.latencies_us);
        self.ran_out |= slice.ran_out;
    }

    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let index = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        f64::from(self.latencies_us[index]) / 1000.0
    }
}

/// Keeps [`CONNECTIONS`] connections busy for `duration` (or until `bodies` run out).
async fn load(address: SocketAddr, bodies: Bodies, duration: Duration) -> Outcome {
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let bodies = bodies.clone();
            tokio::spawn(async move {
                let stream = TcpStream::connect(address).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(connection);
                let (mut latencies, mut non_2xx, mut ran_out) = (Vec::new(), 0usize, false);
                while Instant::now() < deadline {
                    let Some(signed) = bodies.next() else {
                        ran_out = true;
                        break;
                    };
                    let request = hyper::Request::post(PATH)
                        .header("host", "127.0.0.1")
                        .header("content-type", "application/json")
                        .header("x-signature", &signed.signature)
                        .body(Full::new(signed.body.clone()))
                        .unwrap();
                    let sent = Instant::now();
                    let response = sender.send_request(request).await.unwrap();
                    let status = response.status();
                    response.into_body().collect().await.unwrap();
                    latencies.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                    if !status.is_success() {
                        non_2xx += 1;
                    }
                }
                (latencies, non_2xx, ran_out)
            })
        })
        .collect();
    let mut outcome = Outcome {
        requests: 0,
        non_2xx: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
        ran_out: false,
    };
    for task in tasks {
        let (latencies, non_2xx, ran_out) = task.await.unwrap();
        outcome.requests += latencies.len();
        outcome.latencies_us.extend(latencies);
        outcome.non_2xx += non_2xx;
        outcome.ran_out |= ran_out;
    }
    outcome.elapsed = started.elapsed();
    outcome.latencies_us.sort_unstable();
    outcome
}

fn drive(duration: Duration, chosen: &Chosen) {
    let dir = tempfile::tempdir().unwrap();
    let (public_key, key) = child::signing_key(dir.path(), Algorithm::RsaPkcs1Sha256);
    // Enough unique bodies for ~45k req/s over the duration (P alone needs far fewer); D,
    // which keeps nothing, and A cycle through them.
    let only_postgres = ["A", "B", "C", "D", "E", "F", "I"]
        .iter()
        .all(|s| !chosen.runs(s));
    let rate = chosen
        .rate
        .unwrap_or(if only_postgres { 6_000 } else { 45_000 });
    let bodies = sign_for(&key, rate, duration);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let unique = || Bodies::unique(&bodies);
    // A scenario's server, started (and, for C, its nonces acknowledged first).
    let start = |spec: Spec| -> Running {
        let data = dir.path().join(&spec.data).display().to_string();
        let key = public_key.display().to_string();
        let server = Server::start(&["serve", spec.scenario, &data, &key], Stdio::inherit());
        if let Some(acknowledged) = spec.warm_up {
            // C: acknowledge the nonces first; their retries are the load.
            let seeded = runtime.block_on(load_count(server.address, unique(), acknowledged));
            assert_eq!(seeded, 0, "acknowledging the nonces to retry failed");
        }
        Running::new(spec, server)
    };
    // Each round on fresh servers and stores; the bodies are signed once.
    let rounds: Vec<Round> = (1..=chosen.rounds)
        .map(|round| {
            if chosen.rounds > 1 {
                eprintln!("round {round} of {}", chosen.rounds);
            }
            let specs = Spec::chosen(chosen, round, &bodies);
            let measured: Vec<(&str, Measured)> = if chosen.slices == 1 {
                // One server at a time, for the whole duration.
                specs
                    .into_iter()
                    .map(|spec| {
                        let mut running = [start(spec)];
                        runtime.block_on(measure(&mut running, duration, 1));
                        let [running] = running;
                        running.finish()
                    })
                    .collect()
            } else {
                // Every server up, the load moving from one to the next each slice: a
                // change of the machine's speed during the round falls on all alike.
                let mut running: Vec<Running> = specs.into_iter().map(start).collect();
                runtime.block_on(measure(&mut running, duration, chosen.slices));
                running.into_iter().map(Running::finish).collect()
            };
            Round::from(measured)
        })
        .collect();
    let reachable = chosen.runs("P") && runtime.block_on(reachable());
    let postgres = reachable.then(|| {
        let schema = format!("bench_p_{}", std::process::id());
        let data = dir.path().join("p").display().to_string();
        let key = public_key.display().to_string();
        // One of the two services on PostgreSQL, under the same load; its schema dropped.
        let measure = |scenario: &str, label: &str| {
            let data = format!("{data}-{scenario}");
            let server =
                Server::start(&["serve", scenario, &data, &key, &schema], Stdio::inherit());
            eprintln!("{label} for {}s ...", duration.as_secs());
            let cpu = server.cpu_seconds();
            let outcome = runtime.block_on(load(server.address, unique(), duration));
            let cpu_us = (server.cpu_seconds() - cpu) * 1e6 / outcome.requests as f64;
            let rss = server.rss_mib().1;
            drop(server);
            runtime.block_on(drop_schema(&schema));
            (outcome, rss, cpu_us)
        };
        let p = measure(
            "payhook-sql",
            "P: payhook on PostgreSQL, B's ledger in SQL,",
        );
        let trees = measure(
            "payhook",
            "P': payhook on PostgreSQL, the example's ledger in trees,",
        );
        eprintln!(
            "Q: the same database work straight from Rust for {}s ...",
            duration.as_secs()
        );
        let q = runtime.block_on(ceiling(duration));
        (p, q, trees)
    });
    if chosen.runs("P") && postgres.is_none() {
        eprintln!(
            "P and Q SKIPPED: no PostgreSQL answers at {} (set PAYHOOK_BENCH_DATABASE_URL)",
            database_url()
        );
    }
    let (p, q, trees) = match postgres {
        Some((p, q, trees)) => (Some(p), Some(q), Some(trees)),
        None => (None, None, None),
    };

    let postgres = Postgres { p, q, trees };
    let mut all_checks = Vec::new();
    for (index, round) in rounds.iter().enumerate() {
        let heading = if rounds.len() > 1 {
            format!(", round {} of {}", index + 1, rounds.len())
        } else {
            String::new()
        };
        // P, P' and Q run once: they are reported with the last round.
        let last = index + 1 == rounds.len();
        let none = Postgres::default();
        all_checks.push(print_round(
            duration,
            &heading,
            round,
            if last { &postgres } else { &none },
        ));
    }
    if rounds.len() > 1 {
        print_summary(&all_checks);
    }
    let all_met = all_checks.iter().flatten().all(Check::met);
    if all_met {
        println!("\nevery target measured is met");
    } else {
        println!("\nsome targets MISSED");
    }
}

// ------------------------------------------------ instructions per request (callgrind)

/// How long each server warms up under load before its instructions are counted: valgrind
/// translates code on first use, and the first requests fill caches and pools.
const WARM_UP: Duration = Duration::from_secs(3);

/// `--instructions`: runs each chosen scenario's server (A–I) under callgrind, one at a
/// time, and counts the instructions it executes per request — a figure that does not move
/// with the machine's speed, unlike req/s and CPU time, so that E − D (payhook's durable
/// path, with the example merchant's ledger) can be compared between builds by itself.
///
/// Each server warms up under load for [`WARM_UP`]; then, with the server idle (every
/// request of the warm-up answered), callgrind's counts are zeroed, the load runs for the
/// duration, and once every request is answered the counts are dumped: the instructions of
/// exactly the requests counted, plus whatever the idle server's timers ran meanwhile.
/// `--fair-sched=yes` keeps callgrind's one-thread-at-a-time schedule from starving the
/// store's leader. Under callgrind a server answers a few hundred requests per second, and
/// its batches hold one or two callbacks where a native run's hold about ten, so per-batch
/// costs weigh more than they do natively.
fn count_instructions(duration: Duration, chosen: &Chosen) {
    if chosen.runs("P") {
        eprintln!("--instructions counts A–I only: P, P' and Q are left out");
    }
    if chosen.rounds > 1 || chosen.slices > 1 {
        eprintln!(
            "--instructions counts one round, each scenario alone: --rounds and --slices do not apply"
        );
    }
    if std::process::Command::new("callgrind_control")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("--instructions needs valgrind (its callgrind_control) on the PATH");
        std::process::exit(2);
    }
    let dir = tempfile::tempdir().unwrap();
    let (public_key, key) = child::signing_key(dir.path(), Algorithm::RsaPkcs1Sha256);
    let bodies = sign_for(&key, chosen.rate.unwrap_or(2_000), duration + WARM_UP);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = public_key.display().to_string();
    let dumps = chosen.keep.clone().unwrap_or_else(|| dir.path().to_owned());
    std::fs::create_dir_all(&dumps).unwrap();
    let mut counted: Vec<Counted> = Vec::new();
    for spec in Spec::chosen(chosen, 1, &bodies) {
        let data = dir.path().join(&spec.data).display().to_string();
        let out = dumps.join(format!("callgrind.{}", spec.name));
        // callgrind numbers each dump after `out`; the counted window's is the first.
        let dumped = dumps.join(format!("callgrind.{}.1", spec.name));
        // A kept directory may hold an earlier run's dumps: never read one of those.
        for stale in [&out, &dumped] {
            let _ = std::fs::remove_file(stale);
        }
        let wrapper: Vec<std::ffi::OsString> = vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            "--fair-sched=yes".into(),
            format!("--callgrind-out-file={}", out.display()).into(),
        ];
        let server = Server::start_under(
            &wrapper,
            &["serve", spec.scenario, &data, &key],
            Stdio::null(),
        );
        eprintln!(
            "{}: {} under callgrind, warming up ...",
            spec.name, spec.scenario
        );
        if let Some(acknowledged) = spec.warm_up {
            let seeded = runtime.block_on(load_count(
                server.address,
                Bodies::unique(&bodies),
                acknowledged,
            ));
            assert_eq!(seeded, 0, "acknowledging the nonces to retry failed");
        }
        runtime.block_on(load(server.address, spec.bodies.clone(), WARM_UP));
        callgrind_control(&server, "--zero");
        eprintln!("{}: counting for {}s ...", spec.name, duration.as_secs());
        let outcome = runtime.block_on(load(server.address, spec.bodies.clone(), duration));
        callgrind_control(&server, "--dump");
        let instructions = dumped_total(&dumped);
        assert_eq!(outcome.non_2xx, 0, "{}: non-2xx answers", spec.name);
        counted.push(Counted {
            name: spec.name,
            requests: outcome.requests,
            instructions,
            ran_out: outcome.ran_out || spec.repeated_bodies(),
        });
    }
    print_instructions(duration, &counted);
    if let (Some(kept), Some(Counted { name: first, .. })) = (&chosen.keep, counted.first()) {
        println!(
            "\nthe counted windows' dumps are kept in {}: `callgrind_annotate --inclusive=yes \
             {}/callgrind.{first}.1` says where {first}'s instructions went",
            kept.display(),
            kept.display()
        );
    }
}

/// Sends `command` (`--zero`, `--dump`) to the callgrind that runs `server`, and waits for
/// it to be carried out.
fn callgrind_control(server: &Server, command: &str) {
    let status = std::process::Command::new("callgrind_control")
        .arg(command)
        .arg(server.pid().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "callgrind_control {command} failed");
}

/// The instructions a callgrind dump counted: its `totals:` line, once the file is whole.
fn dumped_total(path: &Path) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(total) = text
            .lines()
            .find_map(|line| line.strip_prefix("totals:"))
            .and_then(|n| n.trim().parse().ok())
        {
            return total;
        }
        assert!(
            Instant::now() < deadline,
            "no callgrind dump at {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `--instructions` counted of one scenario.
struct Counted {
    name: &'static str,
    requests: usize,
    instructions: u64,
    /// The unique bodies ran out (or were sent again): the count is not of fresh deliveries
    /// alone.
    ran_out: bool,
}

/// The instructions per request of each scenario counted, and E − D and B − D.
fn print_instructions(duration: Duration, counted: &[Counted]) {
    println!(
        "\npayhook callback benchmark — instructions per request under callgrind, \
         {CONNECTIONS} connections, {}s counted per scenario",
        duration.as_secs()
    );
    println!("scenario   requests   instructions per request");
    let per_request = |name: &str| {
        counted
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.instructions as f64 / c.requests.max(1) as f64)
    };
    for c in counted {
        let per = per_request(c.name).unwrap_or(f64::NAN);
        let note = if c.ran_out {
            "  (ran out of unique bodies: raise --rate)"
        } else {
            ""
        };
        println!("{:<8} {:>10} {per:>26.0}{note}", c.name, c.requests);
    }
    let Some(d) = per_request("D") else {
        return;
    };
    for (name, what) in [
        ("E", "payhook's durable path and the example's ledger"),
        ("B", "and sled"),
    ] {
        if let Some(x) = per_request(name) {
            println!(
                "{name} − D {:>12.0} instructions per request ({what}); D/{name} {:.3}",
                x - d,
                d / x
            );
        }
    }
}

/// One round's scenarios (those not chosen are `None`).
struct Round {
    a: Option<Measured>,
    b: Option<Measured>,
    c: Option<Measured>,
    d: Option<Measured>,
    e: Option<Measured>,
    f: Option<Measured>,
    i: Option<Measured>,
}

impl Round {
    fn from(mut measured: Vec<(&str, Measured)>) -> Self {
        let mut take = |name: &str| {
            let at = measured.iter().position(|(n, _)| *n == name)?;
            Some(measured.swap_remove(at).1)
        };
        Self {
            a: take("A"),
            b: take("B"),
            c: take("C"),
            d: take("D"),
            e: take("E"),
            f: take("F"),
            i: take("I"),
        }
    }
}

/// A scenario of a round: its server, its store's directory and its load.
struct Spec {
    name: &'static str,
    /// The server's kind (`serve`'s argument).
    scenario: &'static str,
    data: String,
    bodies: Bodies,
    /// Nonces acknowledged before the load (C).
    warm_up: Option<usize>,
}

impl Spec {
    /// Whether a body that stands for a unique one was sent again (see
    /// [`Bodies::repeated`]); A verifies nothing, and a body sent again costs it the same.
    fn repeated_bodies(&self) -> bool {
        self.name != "A" && self.bodies.repeated()
    }

    /// The chosen scenarios among A–I, in that order, for `round` (each its own store).
    fn chosen(chosen: &Chosen, round: usize, bodies: &Arc<Vec<Signed>>) -> Vec<Self> {
        let spec = |name, scenario, data: &str, bodies, warm_up| Spec {
            name,
            scenario,
            data: format!("{data}{round}"),
            bodies,
            warm_up,
        };
        let (unique, cycle) = (
            || Bodies::unique(bodies),
            || Bodies::cycle(bodies, bodies.len()),
        );
        let retries = || Bodies::cycle(bodies, RETRIED_NONCES);
        [
            spec("A", "baseline", "a", cycle(), None),
            spec("B", "payhook", "b", unique(), None),
            spec("C", "payhook", "c", retries(), Some(RETRIED_NONCES)),
            spec("D", "payhook-nostore", "d", cycle(), None),
            spec("E", "payhook-e", "e", unique(), None),
            spec("F", "payhook-f", "f", unique(), None),
            spec("I", "payhook-inspected", "i", unique(), None),
        ]
        .into_iter()
        .filter(|spec| chosen.runs(spec.name))
        .collect()
    }
}

/// A scenario's server under measurement, and what it measured so far.
struct Running {
    spec: Spec,
    server: Server,
    outcome: Outcome,
    cpu_seconds: f64,
}

impl Running {
    fn new(spec: Spec, server: Server) -> Self {
        Self {
            spec,
            server,
            outcome: Outcome::default(),
            cpu_seconds: 0.0,
        }
    }

    /// The scenario's figures; its server stops.
    fn finish(mut self) -> (&'static str, Measured) {
        self.outcome.latencies_us.sort_unstable();
        self.outcome.ran_out |= self.spec.repeated_bodies();
        let cpu_us = self.cpu_seconds * 1e6 / self.outcome.requests as f64;
        let rss = self.server.rss_mib().1;
        (self.spec.name, (self.outcome, rss, cpu_us))
    }
}

/// Loads each of `running` for `duration` in all, cut into `slices` taken in turn.
async fn measure(running: &mut [Running], duration: Duration, slices: usize) {
    let slice = duration / u32::try_from(slices).unwrap_or(u32::MAX);
    let names: Vec<&str> = running.iter().map(|r| r.spec.name).collect();
    if slices == 1 {
        eprintln!(
            "{}: {} for {}s ...",
            names.join(" "),
            running[0].spec.scenario,
            duration.as_secs()
        );
    } else {
        eprintln!(
            "{} in turn, {slices} slices of {:.2}s each ...",
            names.join(" "),
            slice.as_secs_f64()
        );
    }
    for _ in 0..slices {
        for scenario in running.iter_mut() {
            let cpu = scenario.server.cpu_seconds();
            let outcome = load(scenario.server.address, scenario.spec.bodies.clone(), slice).await;
            scenario.cpu_seconds += scenario.server.cpu_seconds() - cpu;
            scenario.outcome.absorb(outcome);
        }
    }
}

/// The PostgreSQL scenarios, run once.
#[derive(Default)]
struct Postgres {
    p: Option<Measured>,
    q: Option<Measured>,
    trees: Option<Measured>,
}

/// One figure against its target.
struct Check {
    label: &'static str,
    value: Option<f64>,
    /// `None`: a reference figure, printed with no target.
    target: Option<f64>,
    /// The figure must be at least the target (else at most).
    at_least: bool,
}

impl Check {
    /// Met, not measured, or with no target.
    fn met(&self) -> bool {
        let Some(target) = self.target else {
            return true;
        };
        self.value.is_none_or(|value| {
            if self.at_least {
                value >= target
            } else {
                value <= target
            }
        })
    }

    /// The target as printed: `≥ 0.65`, or what a reference figure stands for.
    fn target_text(&self) -> String {
        match self.target {
            Some(target) => {
                let sign = if self.at_least { "≥" } else { "≤" };
                format!("target {sign} {target:<6}")
            }
            None => "no target".to_owned(),
        }
    }

    /// Whether it held, as printed.
    fn verdict(&self) -> &'static str {
        match (self.target, self.met()) {
            (None, _) => "(B/D on an engine that costs nothing)",
            (Some(_), true) => "ok",
            (Some(_), false) => "MISSED",
        }
    }
}

/// Prints one round's table and its figures against the targets; returns the figures.
fn print_round(
    duration: Duration,
    heading: &str,
    round: &Round,
    postgres: &Postgres,
) -> Vec<Check> {
    let Round {
        a,
        b,
        c,
        d,
        e,
        f,
        i,
    } = round;
    let Postgres { p, q, trees } = postgres;
    println!(
        "\npayhook callback benchmark — {CONNECTIONS} connections, {}s per scenario, loopback{heading}",
        duration.as_secs()
    );
    println!(
        "{:<44} {:>10} {:>9} {:>9} {:>9} {:>8} {:>9} {:>11}",
        "scenario", "req/s", "p50 ms", "p99 ms", "max ms", "non-2xx", "RSS MiB", "CPU µs/req"
    );
    let rows = [
        ("A  raw hyper: read body, 200", &a),
        ("B  payhook: RSA verify, dedup, ledger, fsync", &b),
        ("C  payhook: retries of acknowledged nonces", &c),
        ("D  payhook without the store", &d),
        ("E  B's durable path, nothing written", &e),
        ("F  B's durable path, appended + fdatasync", &f),
        ("I  B with the inspector recording", &i),
        ("P  payhook on PostgreSQL: B's ledger in SQL", &p),
        ("P' payhook on PostgreSQL: B's ledger in trees", &trees),
        ("Q  the database work alone (ceiling)", &q),
    ];
    for (name, measured) in rows {
        let Some((outcome, rss, cpu_us)) = measured else {
            continue;
        };
        let note = if outcome.ran_out {
            "  (ran out of bodies)"
        } else {
            ""
        };
        println!(
            "{name:<44} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>8} {:>9} {:>11}{note}",
            outcome.rate(),
            outcome.percentile_ms(0.50),
            outcome.percentile_ms(0.99),
            outcome.percentile_ms(1.0),
            outcome.non_2xx,
            // Q runs in this process: it has no RSS of its own.
            if rss.is_nan() {
                "—".to_owned()
            } else {
                format!("{rss:.1}")
            },
            if cpu_us.is_nan() {
                "—".to_owned()
            } else {
                format!("{cpu_us:.0}")
            }
        );
    }
    println!();
    let ratio = |x: &Option<Measured>, y: &Option<Measured>| {
        x.as_ref()
            .zip(y.as_ref())
            .map(|(x, y)| x.0.rate() / y.0.rate())
    };
    let check = |label, value, target, at_least| Check {
        label,
        value,
        target: Some(target),
        at_least,
    };
    let b_p99 = b.as_ref().map(|b| b.0.percentile_ms(0.99));
    let non_2xx = [a, b, c, d, e, f, i]
        .iter()
        .filter_map(|m| m.as_ref().map(|m| m.0.non_2xx as f64))
        .reduce(|x, y| x + y);
    let checks = vec![
        check("B/A", ratio(b, a), 0.25, true),
        check("B/D", ratio(b, d), 0.65, true),
        check("C/A", ratio(c, a), 0.50, true),
        check("p99 of B (ms)", b_p99, 10.0, false),
        check("non-2xx (all)", non_2xx, 0.0, false),
        check("peak RSS of B (MiB)", b.as_ref().map(|b| b.1), 64.0, false),
        check("E/D", ratio(e, d), 0.90, true),
        // No target: where B/D would be with an engine that costs nothing.
        Check {
            label: "F/D",
            value: ratio(f, d),
            target: None,
            at_least: true,
        },
        check("I/B", ratio(i, b), 0.95, true),
        check("P/Q", ratio(p, q), 0.60, true),
        check(
            "p99 of P (ms)",
            p.as_ref().map(|p| p.0.percentile_ms(0.99)),
            25.0,
            false,
        ),
        check(
            "non-2xx of P",
            p.as_ref().map(|p| p.0.non_2xx as f64),
            0.0,
            false,
        ),
    ];
    for check in &checks {
        let (label, target) = (check.label, check.target_text());
        let Some(value) = check.value else {
            println!("{label:<22} {:>8}   {target:<15} not measured", "—");
            continue;
        };
        println!(
            "{label:<22} {value:>8.2}   {target:<15} {}",
            check.verdict()
        );
    }
    checks
}

/// Each figure in every round, its median, and whether its target held in every round.
fn print_summary(rounds: &[Vec<Check>]) {
    println!(
        "\nover {} rounds (round by round, then the median):",
        rounds.len()
    );
    for (index, first) in rounds[0].iter().enumerate() {
        let values: Vec<f64> = rounds.iter().filter_map(|r| r[index].value).collect();
        if values.is_empty() {
            continue;
        }
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) {
            f64::midpoint(sorted[middle - 1], sorted[middle])
        } else {
            sorted[middle]
        };
        let missed = rounds.iter().filter(|r| !r[index].met()).count();
        let each: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
        println!(
            "{:<22} {}   median {median:.2}   {:<15} {}",
            first.label,
            each.join(" "),
            first.target_text(),
            match (first.target, missed) {
                (None, _) => first.verdict().to_owned(),
                (Some(_), 0) => "ok in every round".to_owned(),
                (Some(_), _) => format!("MISSED in {missed} of {}", rounds.len()),
            }
        );
    }
}

/// A scenario's outcome, its server's peak RSS (MiB) and the server's CPU time (user and
/// system, all threads) per request, µs.
type Measured = (Outcome, f64, f64);

/// Sends `count` requests (each body once) as fast as the connections allow; returns the
/// number of non-2xx answers.
async fn load_count(address: SocketAddr, bodies: Bodies, count: usize) -> usize {
    let limited = match bodies {
        Bodies::Unique(all, next) => Bodies::Unique(Arc::new(all[..count].to_vec()), next),
        cycle @ Bodies::Cycle(..) => cycle,
    };
    load(address, limited, Duration::from_secs(3600))
        .await
        .non_2xx
}

// ---------------------------------------------------------------- PostgreSQL (P and Q)

fn database_url() -> String {
    std::env::var("PAYHOOK_BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

async fn reachable() -> bool {
    use sqlx::Connection;
    let url = database_url();
    tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&url))
        .await
        .is_ok_and(|connected| connected.is_ok())
}

async fn drop_schema(schema: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// Q: per transaction, the mark of a new nonce, its ledger entry and its client's balance
/// upserted, from [`CONNECTIONS`] tasks on a pool of [`PG_POOL`] connections, for
/// `duration`. Latencies are per transaction.
async fn ceiling(duration: Duration) -> Measured {
    let schema = format!("bench_q_{}", std::process::id());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(PG_POOL)
        .connect(&database_url())
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
         CREATE TABLE {schema}.marks (nonce text PRIMARY KEY, done integer[] NOT NULL);
         CREATE TABLE {schema}.entries (nonce text PRIMARY KEY, entry bytea NOT NULL);
         CREATE TABLE {schema}.balances (client text PRIMARY KEY, amount numeric NOT NULL);"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let (mark, entry, balance) = (
        format!("INSERT INTO {schema}.marks (nonce, done) VALUES ($1, ARRAY[4])"),
        format!("INSERT INTO {schema}.entries (nonce, entry) VALUES ($1, $2)"),
        format!(
            "INSERT INTO {schema}.balances (client, amount) VALUES ($1, $2::numeric) \
             ON CONFLICT (client) DO UPDATE SET amount = balances.amount + EXCLUDED.amount"
        ),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (pool, next) = (pool.clone(), Arc::clone(&next));
            let (mark, entry, balance) = (mark.clone(), entry.clone(), balance.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let nonce = format!("bench-{i}");
                    let sent = Instant::now();
                    let mut tx = pool.begin().await.unwrap();
                    sqlx::query(&mark)
                        .bind(&nonce)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    sqlx::query(&entry)
                        .bind(&nonce)
                        .bind(
                            format!("{{\"amount\":\"{}.{:02}\"}}", i % 1000, i % 100).into_bytes(),
                        )
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    sqlx::query(&balance)
                        .bind(format!("client-{}|EUR", i % 100))
                        .bind(format!("{}.{:02}", i % 1000, i % 100))
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    latencies.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                latencies
            })
        })
        .collect();
    let mut outcome = Outcome {
        requests: 0,
        non_2xx: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
        ran_out: false,
    };
    for task in tasks {
        let latencies = task.await.unwrap();
        outcome.requests += latencies.len();
        outcome.latencies_us.extend(latencies);
    }
    outcome.elapsed = started.elapsed();
    outcome.latencies_us.sort_unstable();
    pool.close().await;
    drop_schema(&schema).await;
    (outcome, f64::NAN, f64::NAN)
}
