//! A delivery that takes over a stale claim (its first delivery never finished within
//! `handler_timeout` + a margin) while that first delivery's commit is stalled: it must
//! neither answer "already processed" for a write that is not durable yet, nor book the
//! effects a second time. The flush is stalled with the store's test-only commit hold.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::config::StoreConfig;
use payhook::model::Nonce;
use payhook::model::TransactionStatus;
use payhook::store::{CallbackBegin, Claim, DedupStore, Effects, HoldPoint, SledStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

const STALE: Duration = Duration::from_secs(60);
/// A claim is stale at once: every claim is taken over.
const ALWAYS_STALE: Duration = Duration::ZERO;

fn open(dir: &tempfile::TempDir) -> SledStore {
    let config = StoreConfig {
        path: dir.path().join("store"),
        ..StoreConfig::default()
    };
    SledStore::open(&config, &["ledger"]).unwrap()
}

/// Effects that count the bookings of `nonce` in the ledger.
fn count_booking(store: &SledStore) -> Effects {
    let ledger = store.tree("ledger").unwrap();
    let effects = Effects::default();
    effects.write(move |tx| {
        let count = tx
            .get(&ledger, b"bookings")?
            .map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap_or([0; 8])));
        tx.insert(&ledger, b"bookings", &(count + 1).to_be_bytes())
    });
    effects
}

fn bookings(store: &SledStore) -> u64 {
    store
        .get(&store.tree("ledger").unwrap(), b"bookings")
        .unwrap()
        .map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()))
}

fn claim(store: &SledStore, stale_after: Duration) -> CallbackBegin {
    block_on(store.begin_callback(&Nonce::from("n-1"), TransactionStatus::Success, stale_after))
        .unwrap()
}

/// Runs a store future to its end on this thread (the test drives the store from threads).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

/// Finishes `claim` on a thread of its own (the commit may be held there): whether it was
/// written, and whether its effects ran.
fn finish_on_a_thread(store: &SledStore, claim: Claim) -> JoinHandle<(bool, bool)> {
    let store = store.clone();
    std::thread::spawn(move || {
        let nonce = Nonce::from("n-1");
        let effects = count_booking(&store);
        let written =
            store.finish_callback(&nonce, claim, TransactionStatus::Success, effects.clone());
        (block_on(written).is_ok(), effects.ran())
    })
}

/// Lets a held commit go after giving a racing thread time to overtake it, raising
/// `released` just before.
fn release_later(hold: payhook::store::CommitHold, released: &AtomicBool) {
    std::thread::sleep(Duration::from_millis(300));
    released.store(true, Ordering::SeqCst);
    hold.release();
}

#[test]
fn a_takeover_during_a_stalled_flush_waits_for_it_instead_of_answering_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let CallbackBegin::Claimed { claim: first, .. } = claim(&store, STALE) else {
        panic!("not claimed");
    };
    // The first delivery's batch is applied to sled (readable) but not flushed.
    let hold = store.hold_commits(HoldPoint::BeforeFlush);
    let first_delivery = finish_on_a_thread(&store, first);
    hold.wait_reached(1);

    let flushed = Arc::new(AtomicBool::new(false));
    let takeover = {
        let (store, flushed) = (store.clone(), Arc::clone(&flushed));
        std::thread::spawn(move || {
            let begin = claim(&store, ALWAYS_STALE);
            (begin, flushed.load(Ordering::SeqCst))
        })
    };
    release_later(hold, &flushed);
    let (begin, after_flush) = takeover.join().unwrap();
    assert_eq!(first_delivery.join().unwrap(), (true, true));
    assert_eq!(begin, CallbackBegin::Duplicate);
    assert!(
        after_flush,
        "the takeover answered `duplicate` before the write it saw was durable"
    );
    assert_eq!(bookings(&store), 1);
}

#[test]
fn a_takeover_racing_a_staged_batch_does_not_book_the_effects_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let CallbackBegin::Claimed { claim: first, .. } = claim(&store, STALE) else {
        panic!("not claimed");
    };
    // The first delivery's effects are staged in a batch that is not applied yet.
    let hold = store.hold_commits(HoldPoint::BeforeApply);
    let first_delivery = finish_on_a_thread(&store, first);
    hold.wait_reached(1);

    // The second delivery takes the stale claim over and books too, if it is let.
    let second_delivery = {
        let store = store.clone();
        std::thread::spawn(move || match claim(&store, ALWAYS_STALE) {
            CallbackBegin::Claimed { claim, .. } => {
                finish_on_a_thread(&store, claim).join().unwrap()
            }
            CallbackBegin::Duplicate => (true, false),
            CallbackBegin::Busy => (false, false),
        })
    };
    release_later(hold, &AtomicBool::new(false));
    assert_eq!(first_delivery.join().unwrap(), (true, true));
    let (answered, ran) = second_delivery.join().unwrap();
    assert!(answered, "the retry was not answered 200");
    // Its effects were dropped unrun: it is told so, and reported as a duplicate, not as a
    // booking (nor a hold) of its own.
    assert!(!ran, "the second delivery's effects say they ran");
    assert_eq!(bookings(&store), 1, "the effects were booked twice");
    assert_eq!(claim(&store, STALE), CallbackBegin::Duplicate);
}
