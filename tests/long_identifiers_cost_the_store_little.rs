//! A sender chooses how long its nonces and client ids are (up to the configured bound).
//! The store keeps a long one by its SHA-256, so what it writes per record, and what sled
//! keeps of it in memory, does not grow with that choice; exactly-once holds as for short
//! ones; and records an older store kept under a long nonce spelled out are still found.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::config::StoreConfig;
use payhook::model::Nonce;
use payhook::model::TransactionStatus;
use payhook::store::{
    CallbackBegin, DedupStore, Effects, Fingerprint, RecordedDecision, SledStore, Store,
    ValidationBegin,
};
use std::path::Path;
use std::time::Duration;

const STALE: Duration = Duration::from_secs(60);
/// The longest identifier `server.max_identifier_chars` allows.
const LONGEST: usize = 4096;
/// payhook's records live in this sled tree of the store's directory.
const TREE: &str = "payhook";

fn config(dir: &Path, retention: Duration) -> StoreConfig {
    StoreConfig {
        path: dir.join("store"),
        retention,
        ..StoreConfig::default()
    }
}

fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap()
}

/// A `LONGEST`-byte identifier: `tag` then filler, so that two tags differ only at the start.
fn long(tag: &str) -> String {
    format!("{tag}{}", "x".repeat(LONGEST - tag.len()))
}

fn fingerprint(client_id: &str) -> Fingerprint {
    Fingerprint {
        amount: "10.5".into(),
        currency: "EUR".into(),
        client_id: client_id.into(),
        provider_id: 11,
        cash_in: true,
    }
}

async fn acknowledge(store: &SledStore, nonce: &str, status: TransactionStatus) {
    let CallbackBegin::Claimed { claim, .. } = store
        .begin_callback(&Nonce::from(nonce), status, STALE)
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    store
        .finish_callback(&Nonce::from(nonce), claim, status, Effects::default())
        .await
        .unwrap();
}

async fn deny(store: &SledStore, nonce: &str, fingerprint: &Fingerprint) {
    let ValidationBegin::Claimed { claim } = store
        .begin_validation(&Nonce::from(nonce), fingerprint, STALE)
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    let decision = RecordedDecision::Deny {
        message: "no".into(),
    };
    store
        .finish_validation(&Nonce::from(nonce), claim, fingerprint, &decision, None)
        .await
        .unwrap();
}

/// Every key and value of payhook's tree, read with sled directly (the store closed).
fn raw_entries(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let db = support::sled_when_free(&dir.join("store"));
    let tree = db.open_tree(TREE).unwrap();
    tree.iter()
        .map(|entry| {
            let (key, value) = entry.unwrap();
            (key.to_vec(), value.to_vec())
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn long_nonces_and_client_ids_are_kept_small_and_still_answered_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (nonce, client) = (long("callback-1"), long("client-1"));
    let validated = long("validation-1");
    {
        let store = SledStore::open(&config(dir.path(), Duration::from_secs(3600)), &[]).unwrap();
        acknowledge(&store, &nonce, TransactionStatus::Success).await;
        deny(&store, &validated, &fingerprint(&client)).await;
    }
    // What the store wrote holds neither the nonces nor the client id, and no key is long.
    let entries = raw_entries(dir.path());
    assert!(entries.len() >= 3, "{} entries", entries.len());
    let filler = "x".repeat(100);
    for (key, value) in &entries {
        assert!(key.len() <= 64, "a key of {} bytes", key.len());
        assert!(value.len() <= 512, "a value of {} bytes", value.len());
        assert!(!contains(key, filler.as_bytes()) && !contains(value, filler.as_bytes()));
    }

    // After a restart: repeats are recognised, and identifiers that differ only in their
    // first bytes are other records.
    let store = SledStore::open(&config(dir.path(), Duration::from_secs(3600)), &[]).unwrap();
    assert_eq!(
        store
            .begin_callback(&Nonce::from(&nonce), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Duplicate
    );
    assert!(matches!(
        store
            .begin_callback(
                &Nonce::from(&long("callback-2")),
                TransactionStatus::Success,
                STALE
            )
            .await
            .unwrap(),
        CallbackBegin::Claimed { attempt: 1, .. }
    ));
    assert_eq!(
        store
            .begin_validation(&Nonce::from(&validated), &fingerprint(&client), STALE)
            .await
            .unwrap(),
        ValidationBegin::Recorded(RecordedDecision::Deny {
            message: "no".into()
        })
    );
    for other in [long("client-2"), "client-1".to_owned()] {
        assert_eq!(
            store
                .begin_validation(&Nonce::from(&validated), &fingerprint(&other), STALE)
                .await
                .unwrap(),
            ValidationBegin::Mismatch,
            "client id of {} bytes",
            other.len()
        );
    }
    assert_eq!(store.record_count(), 2);
    assert_eq!(
        store
            .purge_expired(chrono::Utc::now() + chrono::TimeDelta::milliseconds(3_600_001))
            .await
            .unwrap(),
        2
    );
    assert_eq!(store.record_count(), 0);
}

#[tokio::test]
async fn records_an_older_store_kept_under_a_long_nonce_spelled_out_are_still_found() {
    let dir = tempfile::tempdir().unwrap();
    let (nonce, validated, client) = (long("callback-1"), long("validation-1"), long("client-1"));
    drop(SledStore::open(&config(dir.path(), Duration::from_secs(3600)), &[]).unwrap());
    // The layout before long identifiers were digested: the nonce in the key, the client id
    // in the record.
    let expires_ms = now_ms() + 3_600_000;
    {
        let db = support::sled_when_free(&dir.path().join("store"));
        let tree = db.open_tree(TREE).unwrap();
        let callback = format!(r#"{{"done":[4],"attempts":1,"expires_ms":{expires_ms}}}"#);
        tree.insert([b"c\0", nonce.as_bytes()].concat(), callback.as_bytes())
            .unwrap();
        let validation = format!(
            r#"{{"fingerprint":{{"amount":"10.5","currency":"EUR","client_id":"{client}","provider_id":11,"cash_in":true}},"decision":{{"decision":"deny","message":"no"}},"expires_ms":{expires_ms}}}"#
        );
        tree.insert(
            [b"v\0", validated.as_bytes()].concat(),
            validation.as_bytes(),
        )
        .unwrap();
        db.flush().unwrap();
    }

    let store = SledStore::open(&config(dir.path(), Duration::from_secs(3600)), &[]).unwrap();
    assert_eq!(
        store
            .begin_callback(&Nonce::from(&nonce), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Duplicate,
        "a status booked by the older store is not booked again"
    );
    assert!(
        store
            .callback_acknowledged(&Nonce::from(&nonce), TransactionStatus::Success)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .begin_validation(&Nonce::from(&validated), &fingerprint(&client), STALE)
            .await
            .unwrap(),
        ValidationBegin::Recorded(RecordedDecision::Deny {
            message: "no".into()
        })
    );
    assert_eq!(
        store
            .begin_validation(
                &Nonce::from(&validated),
                &fingerprint(&long("client-2")),
                STALE
            )
            .await
            .unwrap(),
        ValidationBegin::Mismatch
    );

    // A new status moves the record to its new key, with the status booked before.
    let CallbackBegin::Claimed {
        claim,
        previous_status,
        ..
    } = store
        .begin_callback(&Nonce::from(&nonce), TransactionStatus::Cancelled, STALE)
        .await
        .unwrap()
    else {
        panic!("a new status is not claimed");
    };
    assert_eq!(previous_status, Some(TransactionStatus::Success));
    store
        .finish_callback(
            &Nonce::from(&nonce),
            claim,
            TransactionStatus::Cancelled,
            Effects::default(),
        )
        .await
        .unwrap();
    for status in [TransactionStatus::Success, TransactionStatus::Cancelled] {
        assert_eq!(
            store
                .begin_callback(&Nonce::from(&nonce), status, STALE)
                .await
                .unwrap(),
            CallbackBegin::Duplicate
        );
    }
    drop(store);
    let entries = raw_entries(dir.path());
    let spelled_out = [b"c\0", nonce.as_bytes()].concat();
    assert!(
        !entries.iter().any(|(key, _)| *key == spelled_out),
        "the older key is removed when the record is written again"
    );
}
