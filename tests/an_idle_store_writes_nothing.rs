//! A store with nothing to do writes nothing to disk: no sweep of an empty expiry index, no
//! background flusher relocating sled's log segments. Measured with the bytes this process
//! caused to be written to storage (`/proc/self/io`), so this file holds one test only.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::config::StoreConfig;
use payhook::store::{DedupStore, SledStore};
use std::time::Duration;

/// Bytes this process caused to be written to storage so far.
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Runs a store future to its end on this thread (the test drives the store from threads).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

#[test]
fn an_idle_store_writes_nothing_through_many_sweeps() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        path: dir.path().join("store"),
        retention: Duration::from_secs(1),
        sweep_interval: Duration::from_millis(50),
        ..StoreConfig::default()
    };
    let store = SledStore::open(&config, &[]).unwrap();
    // Records that expire, and the sweeper's purge of them.
    let now = chrono::Utc::now();
    for i in 0..200u64 {
        block_on(
            store.record_callback_failure(payhook::store::CallbackFailure {
                nonce: format!("idle-{i}").into(),
                status: payhook::model::TransactionStatus::Success,
                reason: "handler failed".into(),
                transaction_reference_id: uuid::Uuid::nil(),
                client_id: "client".into(),
                amount: rust_decimal::Decimal::ONE,
                currency: "EUR".into(),
                at: now,
            }),
        )
        .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !block_on(store.failing_callbacks()).unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper purged nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The sweep that purged them flushes its removals after they are gone from view: the
    // store is idle once that flush is written, i.e. once several sweeps (every 50 ms) in a
    // row wrote nothing.
    let mut settled = written_bytes();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now = written_bytes();
        if now == settled {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store kept writing after its purge"
        );
        settled = now;
    }

    // Now idle: dozens of sweeps (every 50 ms) and sled's flush interval pass.
    let before = written_bytes();
    std::thread::sleep(Duration::from_secs(3));
    let written = written_bytes() - before;
    assert_eq!(written, 0, "an idle store wrote {written} bytes in 3 s");
    drop(store);
}
