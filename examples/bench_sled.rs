//! What sled 0.34 itself costs per acknowledged callback, in CPU time, on this machine:
//! the floor under `bench_callbacks`' scenario B that no arrangement of payhook's own code
//! can go below while every record is a sled key.
//!
//! Run it in release mode (about half a minute):
//!
//! ```text
//! cargo run --release --example bench_sled
//! ```
//!
//! Each line writes 100,000 "callbacks" (10,000 with a batch of 1) into a fresh sled tree in a temporary directory,
//! laid out as payhook and the example merchant lay them out: one lookup of the nonce, a
//! dedup record (~80 bytes), and, with more keys per callback, the ledger entry (~150 bytes)
//! and the client's balance (one of 100 hot keys). The writes of `batch` callbacks go into
//! one `sled::Batch`, followed by one `flush()`: a batch of 1 is flushing per request, a
//! batch of 20–60 is what group commit reaches with 64 connections, and 2,000 is a lazily
//! materialised log's checkpoint. "CPU" is the whole process' user and system time — sled's
//! I/O threads included — per callback (Linux; elsewhere only wall time is printed).
//!
//! For scale: `bench_callbacks`' scenario F — B's path on a store that costs nothing but one
//! write and `fdatasync` per batch — already sits at about the target B/D ≥ 0.65 on the
//! README's 2-core VM, so that target leaves sled nothing (the `store` module's docs, "What
//! durability costs").
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    reason = "a benchmark prints and may panic"
)]

use std::time::Instant;

/// Callbacks written per line (a tenth of it when flushing per callback, which is slow).
const CALLBACKS: usize = 100_000;

/// The (batch size, sled keys per callback) combinations measured.
const CASES: [(usize, usize); 7] = [
    (1, 3),
    (20, 3),
    (60, 3),
    (2_000, 3),
    (20, 1),
    (2_000, 2),
    (2_000, 1),
];

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) start at field 3: state.
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // The kernel reports in USER_HZ, 100 on every Linux architecture Rust targets.
    Some(ticks / 100.0)
}

/// Writes up to [`CALLBACKS`] callbacks with `keys` sled keys each, `batch` per flush; returns
/// (wall µs, CPU µs) per callback.
fn measure(batch: usize, keys: usize) -> (f64, Option<f64>) {
    let callbacks = if batch == 1 {
        CALLBACKS / 10
    } else {
        CALLBACKS
    };
    let dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(16 * 1024 * 1024)
        .flush_every_ms(None)
        .open()
        .unwrap();
    let tree = db.open_tree("payhook").unwrap();
    let (started, cpu_before) = (Instant::now(), cpu_seconds());
    for first in (0..callbacks).step_by(batch) {
        let mut writes = sled::Batch::default();
        for i in first..(first + batch).min(callbacks) {
            let nonce = format!("0b7e5a52-2f59-4c1e-9d0c-{i:012}");
            let record_key = format!("c\0{nonce}");
            assert!(tree.get(&record_key).unwrap().is_none());
            writes.insert(record_key.into_bytes(), vec![b'r'; 80]);
            if keys > 1 {
                writes.insert(format!("tentries\0{nonce}").into_bytes(), vec![b'e'; 150]);
            }
            if keys > 2 {
                let balance = format!("tbalances\0client-{}|EUR", i % 100);
                writes.insert(balance.into_bytes(), vec![b'b'; 20]);
            }
        }
        tree.apply_batch(writes).unwrap();
        db.flush().unwrap();
    }
    let per = |seconds: f64| seconds * 1e6 / callbacks as f64;
    let cpu = cpu_seconds()
        .zip(cpu_before)
        .map(|(after, before)| per(after - before));
    (per(started.elapsed().as_secs_f64()), cpu)
}

fn main() {
    println!(
        "sled 0.34 cost per callback, up to {CALLBACKS} callbacks per line, release build: {}",
        !cfg!(debug_assertions)
    );
    println!(
        "{:>8} {:>15} {:>12} {:>12}",
        "batch", "keys/callback", "wall µs", "CPU µs"
    );
    for (batch, keys) in CASES {
        let (wall, cpu) = measure(batch, keys);
        let cpu = cpu.map_or_else(|| "n/a".to_owned(), |cpu| format!("{cpu:.1}"));
        println!("{batch:>8} {keys:>15} {wall:>12.1} {cpu:>12}");
    }
}
