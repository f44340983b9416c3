//! A store that lost something it acknowledged refuses to open: sled cuts a damaged log
//! short and calls that recovery, but the aggregator never resends an acknowledged callback,
//! so serving on what is left would lose money without a trace. Each damage below gets a
//! clear error naming the store, what is missing and what to do; `check` reports the same
//! without serving; `accept_loss` is the operator's explicit way out; a clean reopen is never
//! a false alarm.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::config::StoreConfig;
use payhook::model::Nonce;
use payhook::model::TransactionStatus;
use payhook::store::{CallbackBegin, DedupStore, Effects, IntegrityError, SledStore, StoreError};
use std::path::{Path, PathBuf};
use std::time::Duration;

const STALE: Duration = Duration::from_secs(60);
const ACKNOWLEDGED: usize = 300;

fn config(path: &Path) -> StoreConfig {
    StoreConfig {
        path: path.to_path_buf(),
        ..StoreConfig::default()
    }
}

/// A store in `path` that acknowledged `count` callbacks, one commit each, then closed.
async fn store_with_acknowledged(path: &Path, count: usize) {
    let store = SledStore::open(&config(path), &["ledger"]).unwrap();
    let ledger = store.tree("ledger").unwrap();
    for i in 0..count {
        let nonce = format!("nonce-{i:04}");
        let CallbackBegin::Claimed { claim, .. } = store
            .begin_callback(&Nonce::from(&nonce), TransactionStatus::Success, STALE)
            .await
            .unwrap()
        else {
            panic!("{nonce} not claimed");
        };
        let effects = Effects::default();
        let key = nonce.clone();
        let ledger = ledger.clone();
        effects.write(move |tx| tx.insert(&ledger, key.as_bytes(), &[b'x'; 200]));
        store
            .finish_callback(
                &Nonce::from(&nonce),
                claim,
                TransactionStatus::Success,
                effects,
            )
            .await
            .unwrap();
    }
}

/// A copy of the directory `from` at `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn damage(path: &Path, how: &str, other_store: &Path) {
    let db = path.join("db");
    let length = std::fs::metadata(&db).unwrap().len();
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| u8::try_from(i.wrapping_mul(2_654_435_761) >> 24).unwrap())
        .collect();
    match how {
        "data file truncated to half" => truncate(&db, length / 2),
        "data file truncated to zero" => truncate(&db, 0),
        "4 KiB of garbage in the middle of the data file" => overwrite(&db, length / 2, &garbage),
        "garbage at the start of the data file" => overwrite(&db, 0, &garbage),
        "conf removed" => std::fs::remove_file(path.join("conf")).unwrap(),
        "garbage conf" => std::fs::write(path.join("conf"), &garbage[..64]).unwrap(),
        "data file of another store" => {
            std::fs::copy(other_store.join("db"), &db).unwrap();
            std::fs::copy(other_store.join("conf"), path.join("conf")).unwrap();
            for entry in std::fs::read_dir(path).unwrap() {
                let entry = entry.unwrap();
                if entry.file_name().to_string_lossy().starts_with("snap.") {
                    std::fs::remove_file(entry.path()).unwrap();
                }
            }
            for entry in std::fs::read_dir(other_store).unwrap() {
                let entry = entry.unwrap();
                if entry.file_name().to_string_lossy().starts_with("snap.") {
                    std::fs::copy(entry.path(), path.join(entry.file_name())).unwrap();
                }
            }
        }
        "watermark removed" => std::fs::remove_file(path.join("payhook.watermark")).unwrap(),
        "seal undecodable" => {
            // sled's own checks pass: the record is whole, its value is not a seal.
            let db = support::sled_when_free(path);
            let tree = db.open_tree("payhook").unwrap();
            tree.insert(b"m\0seal", &garbage[..7]).unwrap();
            db.flush().unwrap();
        }
        other => panic!("no damage {other}"),
    }
}

fn truncate(file: &Path, length: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(length)
        .unwrap();
}

fn overwrite(file: &Path, offset: u64, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

const DAMAGES: [&str; 9] = [
    "data file truncated to half",
    "4 KiB of garbage in the middle of the data file",
    "data file truncated to zero",
    "garbage at the start of the data file",
    "conf removed",
    "garbage conf",
    "data file of another store",
    "watermark removed",
    "seal undecodable",
];

/// The pristine store and another store's, built once per test.
async fn pristine(root: &Path) -> (PathBuf, PathBuf) {
    let pristine = root.join("pristine");
    let other = root.join("other");
    store_with_acknowledged(&pristine, ACKNOWLEDGED).await;
    store_with_acknowledged(&other, 20).await;
    (pristine, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_damage_is_refused_with_the_path_what_is_missing_and_the_way_out() {
    let root = tempfile::tempdir().unwrap();
    let (pristine, other) = pristine(root.path()).await;
    for (i, how) in DAMAGES.iter().enumerate() {
        let path = root.path().join(format!("damaged-{i}"));
        copy_dir(&pristine, &path);
        damage(&path, how, &other);

        let error = SledStore::open(&config(&path), &["ledger"])
            .err()
            .unwrap_or_else(|| panic!("{how}: the store opened"));
        let StoreError::Integrity(integrity) = &error else {
            panic!("{how}: not an integrity error: {error}");
        };
        let message = error.to_string();
        assert!(
            message.contains(&path.display().to_string()),
            "{how}: {message}"
        );
        match (*how, integrity) {
            (
                "data file truncated to half"
                | "4 KiB of garbage in the middle of the data file"
                | "data file truncated to zero"
                | "garbage at the start of the data file",
                IntegrityError::LostCommits {
                    acknowledged, held, ..
                },
            ) => {
                // 300 callbacks, one commit each, after the seal of creation.
                assert_eq!(acknowledged.commit, ACKNOWLEDGED as u64, "{how}");
                let missing = acknowledged.commit - held.map_or(0, |h| h.commit);
                assert!(missing > 0, "{how}");
                assert!(
                    message.contains(&format!("{missing} acknowledged commits are missing")),
                    "{how}: {message}"
                );
            }
            ("conf removed" | "garbage conf", IntegrityError::Unreadable { .. })
            | ("data file of another store", IntegrityError::ForeignData { .. })
            | ("watermark removed", IntegrityError::Watermark { missing: true, .. }) => {}
            ("seal undecodable", IntegrityError::DamagedSeal { acknowledged, .. }) => {
                assert_eq!(
                    acknowledged.map(|mark| mark.commit),
                    Some(ACKNOWLEDGED as u64),
                    "{message}"
                );
            }
            (how, other) => panic!("{how}: not the expected refusal: {other}"),
        }
        assert!(
            message.contains("payhook store accept-loss") || message.contains("backup"),
            "{how}: no way out in {message}"
        );
        // Refused again, and `check` says the same without serving.
        let checked = SledStore::check(&config(&path)).err().unwrap();
        assert!(
            matches!(checked, StoreError::Integrity(_)),
            "{how}: check said {checked}"
        );
        assert!(
            SledStore::open(&config(&path), &["ledger"]).is_err(),
            "{how}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_who_accepts_the_loss_can_serve_on_what_is_left_and_it_is_recorded() {
    let root = tempfile::tempdir().unwrap();
    let (pristine, other) = pristine(root.path()).await;
    let path = root.path().join("damaged");
    copy_dir(&pristine, &path);
    damage(&path, "data file truncated to half", &other);
    assert!(SledStore::open(&config(&path), &["ledger"]).is_err());

    let given_up = SledStore::accept_loss(&config(&path)).unwrap();
    assert!(
        matches!(given_up, Some(IntegrityError::LostCommits { .. })),
        "{given_up:?}"
    );
    let audit = std::fs::read_to_string(path.join("payhook.audit.log")).unwrap();
    assert!(audit.contains("accept-loss"), "{audit}");
    assert!(
        audit.contains("acknowledged commits are missing"),
        "{audit}"
    );

    // It serves now, and goes on sealing: a clean reopen after more work is sound.
    {
        let store = SledStore::open(&config(&path), &["ledger"]).unwrap();
        let CallbackBegin::Claimed { claim, .. } = store
            .begin_callback(&Nonce::from("after"), TransactionStatus::Success, STALE)
            .await
            .unwrap()
        else {
            panic!("not claimed");
        };
        store
            .finish_callback(
                &Nonce::from("after"),
                claim,
                TransactionStatus::Success,
                Effects::default(),
            )
            .await
            .unwrap();
    }
    SledStore::check(&config(&path)).unwrap();
    SledStore::open(&config(&path), &["ledger"]).unwrap();
    // Accepting on a sound store changes nothing.
    assert_eq!(SledStore::accept_loss(&config(&pristine)).unwrap(), None);
}

/// A seal that does not decode leaves the operator the same way out as any other damage:
/// accept-loss seals the store anew (a new id) and it serves on the records it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_seal_is_damaged_can_be_accepted_and_keeps_its_records() {
    let root = tempfile::tempdir().unwrap();
    let (pristine, other) = pristine(root.path()).await;
    let path = root.path().join("damaged");
    copy_dir(&pristine, &path);
    damage(&path, "seal undecodable", &other);
    assert!(SledStore::open(&config(&path), &["ledger"]).is_err());

    let given_up = SledStore::accept_loss(&config(&path)).unwrap();
    assert!(
        matches!(given_up, Some(IntegrityError::DamagedSeal { .. })),
        "{given_up:?}"
    );
    let audit = std::fs::read_to_string(path.join("payhook.audit.log")).unwrap();
    assert!(
        audit.contains("seal") && audit.contains("is damaged"),
        "{audit}"
    );
    let report = SledStore::check(&config(&path)).unwrap();
    assert_eq!(report.held.commit, 0, "sealed anew");
    let before = SledStore::check(&config(&pristine)).unwrap();
    assert_ne!(report.held.store_id, before.held.store_id);

    // The records it held are still there: an acknowledged nonce is a duplicate.
    let store = SledStore::open(&config(&path), &["ledger"]).unwrap();
    let begun = store
        .begin_callback(
            &Nonce::from("nonce-0007"),
            TransactionStatus::Success,
            STALE,
        )
        .await
        .unwrap();
    assert!(
        !matches!(begun, CallbackBegin::Claimed { .. }),
        "an acknowledged callback would be booked again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_closed_store_reopens_without_a_false_alarm_and_reports_its_last_commit() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("store");
    store_with_acknowledged(&path, 5).await;
    for _ in 0..3 {
        let report = SledStore::check(&config(&path)).unwrap();
        assert_eq!(report.held.commit, 5);
        assert!(report.to_string().contains("is sound"), "{report}");
        drop(SledStore::open(&config(&path), &["ledger"]).unwrap());
    }
    // A new store, and one never written to, are sound too.
    let empty = root.path().join("empty");
    drop(SledStore::open(&config(&empty), &[]).unwrap());
    assert_eq!(SledStore::check(&config(&empty)).unwrap().held.commit, 0);
    drop(SledStore::open(&config(&empty), &[]).unwrap());
    // `check` never creates a store.
    let nowhere = root.path().join("nowhere");
    assert!(SledStore::check(&config(&nowhere)).is_err());
    assert!(!nowhere.exists());
}
