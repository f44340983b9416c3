//! Three example-merchant processes on one PostgreSQL database receive 2,000 signed
//! callbacks from 50 senders; each callback is delivered 2–3 times at once to instances
//! chosen at random, every copy retried until it is acknowledged (as the aggregator does),
//! and every tenth success is later reversed (status −2). Instance 0 is killed with SIGKILL
//! and restarted four times during the storm. Afterwards, read from the database: every
//! (nonce, status) is booked exactly once, each balance is the sum of its entries, and the
//! outbox holds nothing. Meanwhile every answer was 2xx or 503 with `Retry-After`.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use payhook::signature::{Algorithm, SigningKey};
use rust_decimal::Decimal;
use sqlx::Row;
use support::postgres::TestDb;
use support::*;

const CALLBACKS: usize = 2_000;
const SENDERS: usize = 50;
const INSTANCES: usize = 3;
const KILLS: [usize; 4] = [300, 800, 1_300, 1_800];

fn start_instance(db: &TestDb, listen: &str) -> (Spawned, SocketAddr) {
    let mut env = ed25519_example_env();
    env.push(("PAYHOOK_SERVER_LISTEN", listen.to_owned()));
    env.push(("PAYHOOK_STORE_URL", db.url.clone()));
    env.push(("PAYHOOK_STORE_SCHEMA", db.schema.clone()));
    env.push(("PAYHOOK_STORE_POOL_SIZE", "8".to_owned()));
    spawn_example(&env)
}

/// One result to deliver.
#[derive(Clone)]
struct Result_ {
    nonce: String,
    status: i32,
    amount: Decimal,
    request: Vec<u8>,
}

fn callback(signer: &SigningKey, i: usize, status: i32, amount: Decimal) -> Result_ {
    let nonce = format!("storm-{i:04}");
    // A reversal is a later status: it carries a later time.
    let updated = if status == -2 {
        "2099-01-02T03:05:00Z"
    } else {
        "2099-01-02T03:04:06Z"
    };
    let request = signed_callback_changed_at(
        signer,
        &nonce,
        status,
        &amount.to_string(),
        &format!("client-{}", i % 50),
        updated,
    );
    Result_ {
        nonce,
        status,
        amount,
        request,
    }
}

/// What the storm checks of every answer.
#[derive(Default)]
struct Answers {
    acknowledged: AtomicUsize,
    unavailable: AtomicUsize,
    cut: AtomicUsize,
    wrong: Mutex<Vec<String>>,
}

/// Sends `request` to a random instance until one acknowledges it.
async fn deliver(
    addresses: &RwLock<Vec<SocketAddr>>,
    request: &[u8],
    seed: u64,
    answers: &Answers,
) {
    let mut rng = Rng(seed | 1);
    loop {
        let addr = {
            let addresses = addresses.read().unwrap();
            addresses[usize::try_from(rng.below(INSTANCES as u64)).unwrap()]
        };
        match tokio::time::timeout(DEADLINE, exchange_raw(addr, request)).await {
            Ok(Some(answer)) if (200..300).contains(&answer.status) => return,
            Ok(Some(answer)) if answer.status == 503 && answer.retry_after => {
                answers.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Some(answer)) => answers.wrong.lock().unwrap().push(format!(
                "{} (Retry-After: {})",
                answer.status, answer.retry_after
            )),
            Ok(None) => {
                answers.cut.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => answers
                .wrong
                .lock()
                .unwrap()
                .push("no answer in time".into()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Answer {
    status: u16,
    retry_after: bool,
}

/// One exchange; `None` when there was no connection or no answer (a killed instance).
async fn exchange_raw(addr: SocketAddr, request: &[u8]) -> Option<Answer> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(request).await.ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let retry_after = text
        .lines()
        .take_while(|l| !l.is_empty())
        .any(|l| l.to_ascii_lowercase().starts_with("retry-after:"));
    Some(Answer {
        status,
        retry_after,
    })
}

/// The JSON values of one of the example merchant's trees in `schema`, by key.
async fn tree<T: serde::de::DeserializeOwned>(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    name: &str,
) -> BTreeMap<String, T> {
    sqlx::query(&format!(
        "SELECT key, value FROM {schema}.trees WHERE tree = $1"
    ))
    .bind(name)
    .fetch_all(conn)
    .await
    .unwrap()
    .iter()
    .map(|r| {
        let (key, value): (Vec<u8>, Vec<u8>) = (r.get(0), r.get(1));
        (
            String::from_utf8(key).unwrap(),
            serde_json::from_slice(&value).unwrap(),
        )
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_book_every_result_once_through_kills() {
    let Some(db) = support::postgres::database("three_instances").await else {
        return;
    };
    // Each instance migrates at start; they start together.
    let started: Vec<(Spawned, SocketAddr)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..INSTANCES)
            .map(|_| scope.spawn(|| start_instance(&db, "127.0.0.1:0")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (children, addresses): (Vec<Spawned>, Vec<SocketAddr>) = started.into_iter().unzip();
    let children = Arc::new(Mutex::new(children));
    let addresses = Arc::new(RwLock::new(addresses));

    let signer = Arc::new(fixture_signer("ed25519", Algorithm::Ed25519));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let originals: Vec<Result_> = (0..CALLBACKS)
        .map(|i| {
            let status = if rng.below(10) < 7 { 4 } else { -1 };
            let amount = Decimal::new(i64::try_from(rng.below(100_000)).unwrap() + 1, 2);
            callback(&signer, i, status, amount)
        })
        .collect();
    let queue: Arc<Mutex<VecDeque<(usize, Result_)>>> =
        Arc::new(Mutex::new(originals.iter().cloned().enumerate().collect()));
    let answers = Arc::new(Answers::default());
    let reversed = Arc::new(Mutex::new(Vec::new()));

    let senders: Vec<_> = (0..SENDERS)
        .map(|sender| {
            let (queue, addresses, answers, signer, reversed) = (
                Arc::clone(&queue),
                Arc::clone(&addresses),
                Arc::clone(&answers),
                Arc::clone(&signer),
                Arc::clone(&reversed),
            );
            tokio::spawn(async move {
                let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (sender as u64 + 1));
                loop {
                    let next = queue.lock().unwrap().pop_front();
                    let Some((i, result)) = next else {
                        // Reversals come after their success is acknowledged.
                        if answers.acknowledged.load(Ordering::SeqCst) >= CALLBACKS {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let copies = 2 + usize::try_from(rng.below(2)).unwrap();
                    futures_util::future::join_all((0..copies).map(|_| {
                        deliver(&addresses, &result.request, rng.below(u64::MAX), &answers)
                    }))
                    .await;
                    if result.status == 4 && i % 10 == 0 {
                        let reversal = callback(&signer, i, -2, result.amount);
                        reversed.lock().unwrap().push(reversal.nonce.clone());
                        queue.lock().unwrap().push_back((i, reversal));
                    }
                    if result.status != -2 {
                        answers.acknowledged.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();

    let port = addresses.read().unwrap()[0].port();
    for point in KILLS {
        while answers.acknowledged.load(Ordering::SeqCst) < point {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut children = children.lock().unwrap();
        children[0].kill(); // SIGKILL: mid-request, mid-transaction
        let (restarted, address) = start_instance(&db, &format!("127.0.0.1:{port}"));
        children[0] = restarted;
        addresses.write().unwrap()[0] = address;
    }
    for sender in senders {
        tokio::time::timeout(Duration::from_secs(300), sender)
            .await
            .unwrap()
            .unwrap();
    }
    drop(children);

    let wrong = answers.wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "answers other than 2xx or 503 with Retry-After: {wrong:?}"
    );
    let reversed = reversed.lock().unwrap().clone();
    assert!(reversed.len() > 100, "{} reversals", reversed.len());

    // From the database.
    let mut conn = db.connect().await;
    let schema = &db.schema;
    let marks: BTreeMap<String, Vec<i32>> =
        sqlx::query(&format!("SELECT nonce_key, done FROM {schema}.callbacks"))
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
    let entries: BTreeMap<String, serde_json::Value> =
        tree(&mut conn, schema, "ledger_entries").await;
    assert_eq!(
        entries.len(),
        CALLBACKS,
        "every nonce is booked, none missing"
    );
    let mut sums: BTreeMap<String, Decimal> = BTreeMap::new();
    for original in &originals {
        let was_reversed = reversed.contains(&original.nonce);
        let expected: Vec<i32> = if was_reversed {
            vec![original.status, -2]
        } else {
            vec![original.status]
        };
        assert_eq!(
            marks.get(&original.nonce),
            Some(&expected),
            "{}: each (nonce, status) marked once",
            original.nonce
        );
        let entry = &entries[&original.nonce];
        assert_eq!(
            entry["bookings"],
            expected.len(),
            "{} booked once per status: {entry}",
            original.nonce
        );
        assert_eq!(entry["status"], *expected.last().unwrap());
        let effect: Decimal = serde_json::from_value(entry["balance_effect"].clone()).unwrap();
        let booked = if original.status == 4 && !was_reversed {
            original.amount
        } else {
            Decimal::ZERO
        };
        assert_eq!(effect, booked, "{}", original.nonce);
        let client = entry["client_id"].as_str().unwrap().to_owned();
        *sums.entry(format!("{client}|EUR")).or_default() += effect;
    }
    let balances: BTreeMap<String, Decimal> = tree(&mut conn, schema, "ledger_balances").await;
    for (client, sum) in &sums {
        assert_eq!(
            balances.get(client).copied().unwrap_or_default(),
            *sum,
            "the balance of {client} is the sum of its entries"
        );
    }
    let outbox: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {schema}.postponed WHERE deliver_at IS NOT NULL"
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap()
    .get(0);
    assert_eq!(outbox, 0, "nothing pending in the outbox");
    support::announce(&format!(
        "three instances: {CALLBACKS} results and {} reversals booked once each; {} answers 503 with Retry-After, {} cut by kills",
        reversed.len(),
        answers.unavailable.load(Ordering::Relaxed),
        answers.cut.load(Ordering::Relaxed)
    ));
    drop(conn);
    db.drop_schema().await;
}

/// Stops `child` gracefully (SIGTERM: it finishes what it is doing) and waits for it.
fn terminate(child: &mut Spawned) {
    signal(child.0.id(), "TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no graceful stop within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_steady_traffic_answers_and_loses_nothing() {
    const RESULTS: usize = 1_200;
    let Some(db) = support::postgres::database("rolling_restart").await else {
        return;
    };
    let started: Vec<(Spawned, SocketAddr)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..INSTANCES)
            .map(|_| scope.spawn(|| start_instance(&db, "127.0.0.1:0")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (mut children, addresses): (Vec<Spawned>, Vec<SocketAddr>) = started.into_iter().unzip();
    let addresses = Arc::new(RwLock::new(addresses));
    let signer = fixture_signer("ed25519", Algorithm::Ed25519);
    let results: Arc<Vec<Result_>> = Arc::new(
        (0..RESULTS)
            .map(|i| {
                callback(
                    &signer,
                    i,
                    4,
                    Decimal::new(i64::try_from(i).unwrap() + 100, 2),
                )
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Answers::default());
    let senders: Vec<_> = (0..20u64)
        .map(|sender| {
            let (results, next, addresses, answers) = (
                Arc::clone(&results),
                Arc::clone(&next),
                Arc::clone(&addresses),
                Arc::clone(&answers),
            );
            tokio::spawn(async move {
                let mut rng = Rng(0x5851_f42d_4c95_7f2d ^ (sender + 1));
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(result) = results.get(i) else { return };
                    deliver(&addresses, &result.request, rng.below(u64::MAX), &answers).await;
                    answers.acknowledged.fetch_add(1, Ordering::SeqCst);
                    // Steady, not flat out: the restarts fall within the traffic.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    for (instance, child) in children.iter_mut().enumerate() {
        let at = answers.acknowledged.load(Ordering::SeqCst) + 150;
        while answers.acknowledged.load(Ordering::SeqCst) < at {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let port = addresses.read().unwrap()[instance].port();
        tokio::task::block_in_place(|| terminate(child));
        let (restarted, address) =
            tokio::task::block_in_place(|| start_instance(&db, &format!("127.0.0.1:{port}")));
        *child = restarted;
        addresses.write().unwrap()[instance] = address;
    }
    assert!(
        answers.acknowledged.load(Ordering::SeqCst) < RESULTS,
        "the restarts fell within the traffic"
    );
    for sender in senders {
        tokio::time::timeout(Duration::from_secs(300), sender)
            .await
            .unwrap()
            .unwrap();
    }
    drop(children);
    let wrong = answers.wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "answers other than 2xx or 503 with Retry-After: {wrong:?}"
    );
    let mut conn = db.connect().await;
    let schema = &db.schema;
    let marked: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {schema}.callbacks WHERE done = ARRAY[4]"
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap()
    .get(0);
    assert_eq!(marked, i64::try_from(RESULTS).unwrap(), "nothing lost");
    let once: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {schema}.trees WHERE tree = 'ledger_entries' \
         AND convert_from(value, 'UTF8')::jsonb ->> 'bookings' = '1'"
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap()
    .get(0);
    assert_eq!(once, i64::try_from(RESULTS).unwrap(), "each booked once");
    support::announce(&format!(
        "rolling restart: {RESULTS} results booked once each; {} answers 503 with Retry-After, {} connections refused or cut while an instance restarted",
        answers.unavailable.load(Ordering::Relaxed),
        answers.cut.load(Ordering::Relaxed)
    ));
    drop(conn);
    db.drop_schema().await;
}
