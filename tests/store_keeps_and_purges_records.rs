//! The sled store directly: effects are atomic with the mark, records survive a restart,
//! and retention purges expired records so that the store stays bounded.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::config::StoreConfig;
use payhook::model::Nonce;
use payhook::model::TransactionStatus;
use payhook::store::{CallbackBegin, Claim, DedupStore, Effects, SledStore, Store, StoreError};
use std::time::Duration;

const STALE: Duration = Duration::from_secs(60);

fn config(dir: &tempfile::TempDir, retention: Duration) -> StoreConfig {
    StoreConfig {
        path: dir.path().join("store"),
        retention,
        ..StoreConfig::default()
    }
}

/// `ms` milliseconds from now.
fn in_ms(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::TimeDelta::milliseconds(ms)
}

/// Claims `nonce` for a success, which must be free.
async fn claim(store: &SledStore, nonce: &str) -> Claim {
    match store
        .begin_callback(&Nonce::from(nonce), TransactionStatus::Success, STALE)
        .await
        .unwrap()
    {
        CallbackBegin::Claimed { claim, .. } => claim,
        other => panic!("{nonce} not claimed: {other:?}"),
    }
}

/// Claims and acknowledges `nonce` with status success, writing `effects`.
async fn acknowledge(store: &SledStore, nonce: &str, effects: &Effects) {
    let claim = claim(store, nonce).await;
    store
        .finish_callback(
            &Nonce::from(nonce),
            claim,
            TransactionStatus::Success,
            effects.clone(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn an_acknowledged_record_and_its_effects_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &["ledger"]).unwrap();
        let ledger = store.tree("ledger").unwrap();
        let effects = Effects::default();
        effects.write(move |tx| tx.insert(&ledger, b"n-1", b"10.50 EUR"));
        acknowledge(&store, "n-1", &effects).await;
    }
    let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &["ledger"]).unwrap();
    assert_eq!(
        store
            .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Duplicate
    );
    assert_eq!(
        store
            .get(&store.tree("ledger").unwrap(), b"n-1")
            .unwrap()
            .as_deref(),
        Some(&b"10.50 EUR"[..])
    );
}

#[tokio::test]
async fn effects_that_abort_leave_neither_the_mark_nor_any_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &["ledger"]).unwrap();
    let ledger = store.tree("ledger").unwrap();
    let claim = claim(&store, "n-1").await;
    let effects = Effects::default();
    let half = ledger.clone();
    effects.write(move |tx| tx.insert(&half, b"n-1", b"half"));
    effects.write(|_| Err(StoreError::abort("insufficient funds")));
    assert!(
        store
            .finish_callback(
                &Nonce::from("n-1"),
                claim,
                TransactionStatus::Success,
                effects
            )
            .await
            .is_err()
    );
    assert!(
        store.get(&ledger, b"n-1").unwrap().is_none(),
        "the first write was rolled back"
    );
    assert_eq!(store.record_count(), 0, "and the mark too");
    assert!(matches!(
        store
            .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Claimed { attempt: 2, .. }
    ));
}

#[tokio::test]
async fn a_claim_left_by_a_crashed_process_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &[]).unwrap();
        assert!(matches!(
            store
                .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
                .await
                .unwrap(),
            CallbackBegin::Claimed { .. }
        ));
        // The process "dies" here, holding the claim: it lived in memory only.
    }
    let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &[]).unwrap();
    let begin = store
        .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
        .await
        .unwrap();
    assert!(
        matches!(begin, CallbackBegin::Claimed { attempt: 1, .. }),
        "{begin:?}"
    );
    // Within one process, a live claim makes others wait.
    assert_eq!(
        store
            .begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Busy
    );
}

#[tokio::test]
async fn retention_purges_expired_records_and_keeps_the_store_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Duration::from_secs(2);
    let store = SledStore::open(&config(&dir, retention), &[]).unwrap();
    let effects = Effects::default();
    for batch in 0..10 {
        for i in 0..100 {
            acknowledge(&store, &format!("n-{batch}-{i}"), &effects).await;
        }
        assert_eq!(
            store.record_count(),
            100,
            "batch {batch}: only the live batch is kept"
        );
        // Everything written so far has expired by then.
        let purged = store.purge_expired(in_ms(2_001)).await.unwrap();
        assert_eq!(purged, 100, "batch {batch}");
        assert_eq!(store.record_count(), 0);
    }
}

#[tokio::test]
async fn unexpired_records_survive_a_purge_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &[]).unwrap();
        for i in 0..50 {
            acknowledge(&store, &format!("n-{i}"), &Effects::default()).await;
        }
        assert_eq!(store.purge_expired(chrono::Utc::now()).await.unwrap(), 0);
    }
    let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &[]).unwrap();
    assert_eq!(store.record_count(), 50);
    for i in 0..50 {
        let begin = store
            .begin_callback(&format!("n-{i}").into(), TransactionStatus::Success, STALE)
            .await
            .unwrap();
        assert_eq!(begin, CallbackBegin::Duplicate);
    }
}

#[tokio::test]
async fn the_background_sweeper_purges_without_being_asked() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        retention: Duration::from_millis(1),
        sweep_interval: Duration::from_millis(10),
        ..config(&dir, Duration::ZERO)
    };
    let store = SledStore::open(&config, &[]).unwrap();
    for i in 0..20 {
        acknowledge(&store, &format!("n-{i}"), &Effects::default()).await;
    }
    let emptied = async {
        while store.record_count() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), emptied)
        .await
        .expect("the sweeper purged the records");
}

#[test]
fn a_tree_not_declared_at_open_is_refused_when_its_handle_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &["ledger"]).unwrap();
    assert_eq!(store.tree("ledger").unwrap().name(), "ledger");
    let error = store.tree("leger").unwrap_err();
    assert!(matches!(error, StoreError::UnknownTree { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("`leger`") && text.contains("\"ledger\""),
        "{text}"
    );
}

#[tokio::test]
async fn effects_on_a_tree_of_another_store_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other =
        SledStore::open(&config(&other_dir, Duration::from_secs(3600)), &["audit"]).unwrap();
    let foreign = other.tree("audit").unwrap();
    let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &["ledger"]).unwrap();
    let claim = claim(&store, "n-1").await;
    let effects = Effects::default();
    effects.write(move |tx| tx.insert(&foreign, b"n-1", b"misfiled"));
    let error = store
        .finish_callback(
            &Nonce::from("n-1"),
            claim,
            TransactionStatus::Success,
            effects,
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("`audit`"), "{error}");
    assert_eq!(store.record_count(), 0, "not marked done");
}

#[tokio::test]
async fn a_panicking_effect_fails_its_callback_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&config(&dir, Duration::from_secs(3600)), &["ledger"]).unwrap();
    let claim = claim(&store, "n-1").await;
    let effects = Effects::default();
    effects.write(|_| panic!("a bug in the merchant's effect"));
    let outcome = store
        .finish_callback(
            &Nonce::from("n-1"),
            claim,
            TransactionStatus::Success,
            effects,
        )
        .await;
    assert!(
        outcome
            .unwrap_err()
            .to_string()
            .contains("an effect panicked")
    );
    // The store goes on working.
    acknowledge(&store, "n-2", &Effects::default()).await;
    assert_eq!(store.record_count(), 1);
}

/// A sweep of many expired records purges in steps and lets go of the write lock between
/// them: a callback acknowledged while a big sweep is under way is not held behind all of
/// it (with one lock for the whole sweep, a sweep of a busy day's records held every
/// request for a fifth of a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_sweep_lets_acknowledgements_through_between_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&config(&dir, Duration::from_secs(2)), &[]).unwrap();
    let effects = Effects::default();
    // Three steps' worth, written concurrently (a few commits).
    let nonces: Vec<String> = (0..600).map(|i| format!("old-{i}")).collect();
    futures_util::future::join_all(nonces.iter().map(|n| acknowledge(&store, n, &effects))).await;
    let hold = store.hold_commits(payhook::store::HoldPoint::BetweenPurgeSteps);
    let sweep = {
        let store = store.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(store.purge_expired(in_ms(2_001)))
                .unwrap()
        })
    };
    // The sweep stands between two steps, with more to purge: a callback goes through.
    hold.wait_reached(1);
    let claim = claim(&store, "new").await;
    store
        .finish_callback(
            &Nonce::from("new"),
            claim,
            TransactionStatus::Success,
            effects,
        )
        .await
        .unwrap();
    hold.release();
    assert_eq!(sweep.join().unwrap(), 600);
    assert_eq!(store.record_count(), 1);
}
