//! The crash test: the example merchant, as a child process, receives 2,000 signed callbacks
//! from 100 concurrent senders that retry until a 2xx (as the aggregator does), and is
//! killed with SIGKILL three times at arbitrary moments, restarting on the same data
//! directory. At the end every nonce is booked exactly once and the ledger adds up.
//!
//! What it proves is process death: SIGKILL leaves the kernel's page cache intact, so this
//! test cannot tell whether the fdatasync after each flush happened. Power loss is not
//! simulated; the durability contract for it rests on the group commit's fdatasync.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::signature::Algorithm;
use rust_decimal::Decimal;
use std::{
    collections::VecDeque,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use support::*;

const CALLBACKS: usize = 2_000;
const SENDERS: usize = 100;
const KILLS: usize = 3;

/// Starts the example on `listen` with the store in `data`; returns it and its address.
fn start_merchant(listen: &str, data: &Path) -> (Spawned, SocketAddr) {
    let mut env = ed25519_example_env();
    env.push(("PAYHOOK_SERVER_LISTEN", listen.to_owned()));
    env.push(("PAYHOOK_STORE_PATH", data.display().to_string()));
    spawn_example(&env)
}

/// One callback to deliver: its nonce, amount, success, body and signature.
struct Delivery {
    nonce: String,
    amount: Decimal,
    success: bool,
    request: Vec<u8>,
}

fn deliveries() -> Vec<Delivery> {
    let signer = fixture_signer("ed25519", Algorithm::Ed25519);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let failures = [-1, -2, -3, -4, -5, -6];
    (0..CALLBACKS)
        .map(|i| {
            let success = rng.below(10) < 7;
            let status = if success {
                4
            } else {
                failures[usize::try_from(rng.below(6)).unwrap()]
            };
            let amount = Decimal::new(i64::try_from(rng.below(1_000_000)).unwrap() + 1, 2);
            let nonce = format!("crash-{i:04}");
            let request = signed_callback(
                &signer,
                &nonce,
                status,
                &amount.to_string(),
                &format!("client-{}", i % 10),
            );
            Delivery {
                nonce,
                amount,
                success,
                request,
            }
        })
        .collect()
}

/// Sends `request` to whatever address the merchant has now, until it answers 2xx; counts
/// in `cut` the attempts a kill cut off after the request was sent.
async fn deliver(address: &RwLock<SocketAddr>, request: &[u8], cut: &AtomicUsize) {
    loop {
        let addr = *address.read().unwrap();
        match tokio::time::timeout(DEADLINE, try_send(addr, request)).await {
            Ok(Attempt::Answered(status)) if (200..300).contains(&status) => return,
            Ok(Attempt::Answered(status)) => {
                assert!(status == 503 || status == 408, "unexpected answer {status}");
            }
            Ok(Attempt::Cut) => {
                cut.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Attempt::Refused) | Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What became of one attempt.
enum Attempt {
    /// No connection (the server is down or restarting).
    Refused,
    /// Sent, but the connection ended without an answer: a kill in the middle of it.
    Cut,
    /// The server answered with this status.
    Answered(u16),
}

async fn try_send(addr: SocketAddr, request: &[u8]) -> Attempt {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return Attempt::Refused;
    };
    if stream.write_all(request).await.is_err() {
        return Attempt::Cut;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .map_or(Attempt::Cut, Attempt::Answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_nonce_is_booked_exactly_once_across_three_kill_9s() {
    let data = tempfile::tempdir().unwrap();
    let store_path = data.path().join("store");
    let (child, address) = start_merchant("127.0.0.1:0", &store_path);
    let child = Arc::new(Mutex::new(child));
    let address = Arc::new(RwLock::new(address));
    let deliveries = Arc::new(deliveries());
    let queue = Arc::new(Mutex::new((0..CALLBACKS).collect::<VecDeque<_>>()));
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let cut = Arc::new(AtomicUsize::new(0));

    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (queue, deliveries, address, acknowledged, cut) = (
                Arc::clone(&queue),
                Arc::clone(&deliveries),
                Arc::clone(&address),
                Arc::clone(&acknowledged),
                Arc::clone(&cut),
            );
            tokio::spawn(async move {
                loop {
                    let Some(next) = queue.lock().unwrap().pop_front() else {
                        return;
                    };
                    deliver(&address, &deliveries[next].request, &cut).await;
                    acknowledged.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();

    // Kill points spread over the run, chosen by the seeded generator.
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut kill_points: Vec<usize> = (0..KILLS)
        .map(|k| 200 + k * 550 + usize::try_from(rng.below(300)).unwrap())
        .collect();
    kill_points.sort_unstable();
    let port = address.read().unwrap().port();
    for point in kill_points {
        while acknowledged.load(Ordering::SeqCst) < point {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut running = child.lock().unwrap();
        running.kill(); // SIGKILL: no shutdown, no flush
        let (restarted, new_address) = start_merchant(&format!("127.0.0.1:{port}"), &store_path);
        *running = restarted;
        *address.write().unwrap() = new_address;
    }
    for sender in senders {
        tokio::time::timeout(Duration::from_secs(300), sender)
            .await
            .unwrap()
            .unwrap();
    }
    {
        let mut running = child.lock().unwrap();
        running.kill();
    }
    // The kills landed mid-request: deliveries were cut off after being sent, so the path
    // "processed, maybe booked, not acknowledged; retried" was exercised, not only restarts.
    assert!(
        cut.load(Ordering::SeqCst) > 0,
        "no delivery was cut off by a kill"
    );

    // Read the ledger the example kept, from its data directory.
    let config = payhook::config::StoreConfig {
        path: store_path,
        ..Default::default()
    };
    let store =
        payhook::store::SledStore::open(&config, &["ledger_entries", "ledger_balances"]).unwrap();
    let (entries, balances) = (
        store.tree("ledger_entries").unwrap(),
        store.tree("ledger_balances").unwrap(),
    );
    assert_eq!(
        store.entries(&entries).unwrap().len(),
        CALLBACKS,
        "every nonce is booked, none missing"
    );
    let mut booked_total = Decimal::ZERO;
    for delivery in deliveries.iter() {
        let entry: serde_json::Value = serde_json::from_slice(
            &store
                .get(&entries, delivery.nonce.as_bytes())
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            entry["bookings"], 1,
            "{} booked more than once: {entry}",
            delivery.nonce
        );
        let effect: Decimal = serde_json::from_value(entry["balance_effect"].clone()).unwrap();
        let expected = if delivery.success {
            delivery.amount
        } else {
            Decimal::ZERO
        };
        assert_eq!(effect, expected, "{}", delivery.nonce);
        booked_total += effect;
    }
    let successful_total: Decimal = deliveries
        .iter()
        .filter(|d| d.success)
        .map(|d| d.amount)
        .sum();
    assert_eq!(booked_total, successful_total);
    let balance_total: Decimal = store
        .entries(&balances)
        .unwrap()
        .iter()
        .map(|(_, value)| serde_json::from_slice::<Decimal>(value).unwrap())
        .sum();
    assert_eq!(
        balance_total, successful_total,
        "the balances add up to the successful amounts"
    );
}
