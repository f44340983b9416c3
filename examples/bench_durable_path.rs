//! What payhook's durable path costs per callback, counted in instructions: a figure that
//! does not move with the VM's speed, so that a change to the path of a few per cent can be
//! judged by itself (the req/s of `bench_callbacks` move by ±20 % from one minute to the
//! next on a shared VM).
//!
//! One thread drives the store of `bench_callbacks`' scenario E — the whole durable path,
//! with commits that build their batch and write it nowhere — through what a callback does
//! with it: `begin_callback` (the claim, the nonce's record read), effects like the example
//! merchant's ledger (two reads, two writes, JSON values), `finish_callback` (the group
//! commit: claim checked, effects run, record and expiry entry encoded, the seal) and the
//! claim's end. No HTTP, no signature: those are D's, the same with or without a store.
//! With one thread each commit holds one callback, where E under load batches a few.
//!
//! ```text
//! cargo build --release --example bench_durable_path
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='*drive_callbacks*' target/release/examples/bench_durable_path 20000
//! ```
//!
//! callgrind prints `Collected : N`: the instructions of 20,000 callbacks (the store's open
//! and the runtime's start are outside `drive_callbacks`). Without valgrind it prints the
//! time per callback, which moves with the machine like any timing.
//!
//! A second number runs that many tasks at once on a runtime of one worker per core, as a
//! server under load drives the store (`bench_durable_path 200000 64`): commits then batch
//! the callbacks of several tasks, and the CPU time per callback includes what concurrency
//! costs — batches' larger maps, hand-offs, wake-ups, contention. A timing again: compare it
//! with one task's (`bench_durable_path 200000`) run the same minute.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    reason = "a benchmark prints and stops at the first failure"
)]

#[path = "common/server.rs"]
#[allow(dead_code, reason = "only the CPU time is used here")]
mod child;

use payhook::config::StoreConfig;
use payhook::model::{Nonce, TransactionStatus};
use payhook::store::{
    BenchmarkStore, CallbackBegin, DedupStore, Effects, SledStore, StoreError, Tree,
};
use std::time::{Duration, Instant};

/// Clients whose balances the callbacks move (hot keys, like a merchant's).
const CLIENTS: usize = 100;
/// After this long a claim could be taken over; never reached here.
const STALE: Duration = Duration::from_secs(600);

fn main() {
    let callbacks: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        path: dir.path().join("store"),
        ..StoreConfig::default()
    };
    let store = SledStore::open_for_benchmarks(
        &config,
        &["ledger_entries", "ledger_balances"],
        BenchmarkStore::WritesNowhere,
    )
    .unwrap();
    let tasks: usize = std::env::args()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    if tasks > 1 {
        return concurrently(&store, callbacks, tasks);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    drive_callbacks(&runtime, &store, callbacks);
    let took = started.elapsed();
    println!(
        "{callbacks} callbacks through the durable path in {:.3} s: {:.2} µs each (time; \
         count instructions with callgrind, see the module's docs)",
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / callbacks.max(1) as f64
    );
}

/// The same callbacks from `tasks` tasks at once on a runtime of one worker per core, as a
/// server under load drives the store: commits batch the callbacks of several tasks, and
/// the time per callback includes what concurrency costs (hand-offs, wake-ups, contention).
/// A timing, which moves with the machine: compare it with one task's, the same minute.
fn concurrently(store: &SledStore, callbacks: usize, tasks: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let cpu = child::cpu_seconds_of("self");
    let started = Instant::now();
    runtime.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let store = store.clone();
                let share = callbacks / tasks;
                tokio::spawn(async move {
                    callbacks_in_turn(&store, task * share..(task + 1) * share).await;
                })
            })
            .collect();
        for handle in handles {
            handle.await.unwrap();
        }
    });
    let took = started.elapsed().as_secs_f64();
    let done = (callbacks / tasks * tasks).max(1) as f64;
    println!(
        "{done} callbacks from {tasks} tasks in {took:.3} s: {:.0} callbacks/s, {:.2} µs of CPU \
         each (all threads; time, not instructions)",
        done / took,
        (child::cpu_seconds_of("self") - cpu) * 1e6 / done
    );
}

/// Claims, books and acknowledges `callbacks` new nonces, one after another. A plain
/// function, never inlined, so that callgrind can collect what runs inside it.
#[inline(never)]
fn drive_callbacks(runtime: &tokio::runtime::Runtime, store: &SledStore, callbacks: usize) {
    runtime.block_on(callbacks_in_turn(store, 0..callbacks));
}

/// Claims, books and acknowledges the nonces numbered `numbers`, one after another.
async fn callbacks_in_turn(store: &SledStore, numbers: std::ops::Range<usize>) {
    let entries = store.tree("ledger_entries").unwrap();
    let balances = store.tree("ledger_balances").unwrap();
    for n in numbers {
        let nonce = Nonce::from(format!("bench-{n:08}"));
        let status = TransactionStatus::Success;
        let CallbackBegin::Claimed { claim, .. } =
            store.begin_callback(&nonce, status, STALE).await.unwrap()
        else {
            panic!("nonce {n} was not claimed");
        };
        let effects = ledger(&entries, &balances, nonce.as_str(), n % CLIENTS);
        store
            .finish_callback(&nonce, claim, status, effects)
            .await
            .unwrap();
    }
}

/// A ledger entry, as the example merchant keeps one.
#[derive(serde::Serialize)]
struct Entry<'a> {
    client_id: &'a str,
    amount: &'a str,
    status: i32,
    bookings: u32,
}

/// Effects shaped like the example merchant's: read the entry and the client's balance,
/// write both back (JSON, as the example does).
fn ledger(entries: &Tree, balances: &Tree, nonce: &str, client: usize) -> Effects {
    let (entries, balances) = (entries.clone(), balances.clone());
    let nonce = nonce.as_bytes().to_vec();
    let client = format!("client-{client}|EUR");
    let effects = Effects::default();
    effects.write(move |tx| {
        let previous = tx.get(&entries, &nonce)?;
        // A balance that does not read stops the booking (as the example merchant's does):
        // read as zero, it would be overwritten.
        let balance: i64 = match tx.get(&balances, client.as_bytes())? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| StoreError::abort(format!("balance of {client}: {e}")))?,
            None => 0,
        };
        let entry = Entry {
            client_id: &client,
            amount: "10.00",
            status: TransactionStatus::Success.code(),
            bookings: u32::from(previous.is_some()) + 1,
        };
        tx.insert(
            &balances,
            client.as_bytes(),
            &serde_json::to_vec(&(balance + 10)).unwrap(),
        )?;
        tx.insert(&entries, &nonce, &serde_json::to_vec(&entry).unwrap())
    });
    effects
}
