//! A merchant moves from sled to PostgreSQL: `payhook store copy-from-sled` copies what the
//! sled store holds within retention — callback marks, validation decisions (and those sled
//! keeps past it while their validation awaits its result), failing callbacks, pending
//! validations and their outbox, the merchant's trees — so that a retry
//! of a callback acknowledged before the move is answered as a duplicate after it. The copy
//! is idempotent: run twice, it writes nothing the second time.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::model::Nonce;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use payhook::model::TransactionStatus;
use payhook::postponed::{Decision, PostponedState, PostponedValidation};
use payhook::store::{
    Booking, CallbackBegin, CallbackFailure, ConfiguredStore, DedupStore, Effects, Fingerprint,
    PostponedStore, RecordedDecision, SledStore, Store, StoreConfig, ValidationBegin,
};

const STALE: Duration = Duration::from_secs(600);
const LONG: &str = "a-nonce-longer-than-sixty-four-bytes-is-keyed-by-its-digest-0123456789";

fn validation(nonce: &str, id: i64) -> payhook::model::TransactionValidationRequest {
    serde_json::from_value(serde_json::json!({
        "merchantData": {"merchantHash": "h", "clientId": "client-1"},
        "paymentData": {"nonce": nonce, "amount": "10.50", "currency": "EUR", "providerId": 1},
        "validationId": id,
        "cashIn": true
    }))
    .unwrap()
}

/// Decides validation `id` of `nonce` on `store` with `decision`; when `postponed` is
/// `Some(deadline)`, with its postponed record (Awaitable), undecided until `deadline`.
async fn decide(
    store: &SledStore,
    nonce: &str,
    id: i64,
    decision: RecordedDecision,
    postponed: Option<Option<chrono::DateTime<Utc>>>,
) {
    let request = validation(nonce, id);
    let fingerprint = Fingerprint::of(&request);
    let ValidationBegin::Claimed { claim } = store
        .begin_validation(&Nonce::from(nonce), &fingerprint, STALE)
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    let record =
        postponed.map(|deadline| PostponedValidation::new(request.clone(), Utc::now(), deadline));
    store
        .finish_validation(&Nonce::from(nonce), claim, &fingerprint, &decision, record)
        .await
        .unwrap();
}

/// A sled store with history: two callbacks acknowledged (one long nonce, whose result the
/// merchant held), one failing, a validation denied, one postponed and decided (its result
/// in the outbox), a ledger key.
async fn history(config: &StoreConfig) {
    let store = SledStore::open(config, &["ledger"]).unwrap();
    let ledger = store.tree("ledger").unwrap();
    for nonce in ["moved-1", LONG] {
        let effects = Effects::default();
        let ledger = ledger.clone();
        let key = nonce.as_bytes().to_vec();
        let held = nonce == LONG;
        effects.book(move |tx| {
            tx.insert(&ledger, &key, b"booked")?;
            Ok(if held {
                Booking::held("kept aside before the move")
            } else {
                Booking::Booked
            })
        });
        book_in_sled(&store, nonce, effects).await;
    }
    // A later status of the long nonce, held too, and resolved by a person before the move.
    let effects = Effects::default();
    effects.book(|_| Ok(Booking::held("a reversal kept aside")));
    book_status_in_sled(&store, LONG, TransactionStatus::Cancelled, effects).await;
    store
        .resolve_held(
            &Nonce::from(LONG),
            TransactionStatus::Cancelled,
            "reversed by hand",
            Some("Erin"),
        )
        .await
        .unwrap()
        .unwrap();
    store
        .record_callback_failure(CallbackFailure {
            nonce: "failing-1".into(),
            status: TransactionStatus::Success,
            reason: "the ledger was down".into(),
            transaction_reference_id: uuid::Uuid::nil(),
            client_id: "client-1".into(),
            amount: rust_decimal::Decimal::ONE,
            currency: "EUR".into(),
            at: Utc::now(),
        })
        .await
        .unwrap();
    for (nonce, id, decision, postponed) in [
        (
            "v-denied",
            1,
            RecordedDecision::Deny {
                message: "limit".into(),
            },
            false,
        ),
        ("v-postponed", 2, RecordedDecision::Postponed, true),
    ] {
        let deadline = postponed.then(|| Some(Utc::now() + TimeDelta::hours(1)));
        decide(&store, nonce, id, decision, deadline).await;
    }
    store
        .resolve(2.into(), &Decision::allow("reviewed"), None, Utc::now())
        .await
        .unwrap();
    // Wait for the failure's write (it is not waited for) before the store closes.
    while store.failing_callbacks().await.unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Books a success of `nonce` in the sled `store`, with `effects`.
async fn book_in_sled(store: &SledStore, nonce: &str, effects: Effects) {
    book_status_in_sled(store, nonce, TransactionStatus::Success, effects).await;
}

/// Books `status` of `nonce` in the sled `store`, with `effects`.
async fn book_status_in_sled(
    store: &SledStore,
    nonce: &str,
    status: TransactionStatus,
    effects: Effects,
) {
    let nonce = Nonce::from(nonce);
    let CallbackBegin::Claimed { claim, .. } =
        store.begin_callback(&nonce, status, STALE).await.unwrap()
    else {
        panic!("{nonce:?} was not claimed");
    };
    store
        .finish_callback(&nonce, claim, status, effects)
        .await
        .unwrap();
}

/// Asserts that `store` answers a retry of `nonce`'s success as a duplicate.
async fn retried_as_duplicate(store: &dyn DedupStore, nonce: &str) {
    assert_eq!(
        store
            .begin_callback(&Nonce::from(nonce), TransactionStatus::Success, STALE)
            .await
            .unwrap(),
        CallbackBegin::Duplicate,
        "{nonce}: acknowledged before the move, a duplicate after it"
    );
}

/// A test's database (`None`: skipped, and said so) and a stopped sled store with
/// [`history`] in a directory of its own, to copy into it.
async fn history_to_copy(
    test: &str,
) -> Option<(support::postgres::TestDb, tempfile::TempDir, StoreConfig)> {
    let db = support::postgres::database(test).await?;
    let dir = tempfile::tempdir().unwrap();
    let sled = sled_with_history(&dir).await;
    Some((db, dir, sled))
}

/// A stopped sled store in `dir` with [`history`] in it.
async fn sled_with_history(dir: &tempfile::TempDir) -> StoreConfig {
    let sled = StoreConfig {
        path: dir.path().join("store"),
        ..StoreConfig::default()
    };
    history(&sled).await;
    sled
}

/// The command, as an operator runs it: the service stopped, PAYHOOK_STORE_URL set.
fn copy_from_sled(sled: &StoreConfig, db: &support::postgres::TestDb) -> std::process::Output {
    copy_with(sled, db, &[])
}

/// The command run again over a copy that finished (`--again`).
fn copy_from_sled_again(
    sled: &StoreConfig,
    db: &support::postgres::TestDb,
) -> std::process::Output {
    copy_with(sled, db, &["--again"])
}

fn copy_with(
    sled: &StoreConfig,
    db: &support::postgres::TestDb,
    extra: &[&str],
) -> std::process::Output {
    copy_configured(sled, db, extra, &[])
}

/// The command with `extra` arguments and `env` settings.
fn copy_configured(
    sled: &StoreConfig,
    db: &support::postgres::TestDb,
    extra: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(["store", "copy-from-sled", "--data"])
        .arg(&sled.path)
        .args(extra)
        .env_clear()
        .env("PAYHOOK_STORE_URL", &db.url)
        .env("PAYHOOK_STORE_SCHEMA", &db.schema)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// The standard output of a command `run` that must have succeeded (else its output is told).
fn succeeded(run: &std::process::Output) -> String {
    let said = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    said
}

/// A copy of a sled store with history (in `dir`) into `db`, once migrated, run by the
/// command and held by the test after it wrote its callbacks' rows and before it commits
/// them: the `trees` table, which it writes next, is locked until the test releases it.
async fn copy_held_at_the_trees(
    dir: &tempfile::TempDir,
    db: &support::postgres::TestDb,
    config: &StoreConfig,
) -> (
    support::postgres::Locked,
    tokio::task::JoinHandle<std::process::Output>,
) {
    let sled = sled_with_history(dir).await;
    copy_held_at("trees", sled, db, config).await
}

/// The copy of `sled` into `db`, once migrated, run by the command and held by the test
/// where it first writes `table`, which is locked until the test releases it.
async fn copy_held_at(
    table: &str,
    sled: StoreConfig,
    db: &support::postgres::TestDb,
    config: &StoreConfig,
) -> (
    support::postgres::Locked,
    tokio::task::JoinHandle<std::process::Output>,
) {
    payhook::store::PgStore::migrate(config).await.unwrap();
    let locked = db.lock(table, "ACCESS EXCLUSIVE").await;
    let copy = tokio::task::spawn_blocking({
        let db = db.clone();
        move || copy_from_sled(&sled, &db)
    });
    let held = format!(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = '{}.{table}'::regclass",
        db.schema
    );
    db.until_counted(&held, &format!("the copy's wait for {table}"), || {
        copy.is_finished()
    })
    .await;
    (locked, copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_store_answers_retries_as_duplicates_and_keeps_its_outbox() {
    let Some((db, _dir, sled)) = history_to_copy("moving_from_sled").await else {
        return;
    };

    let copy = || copy_from_sled(&sled, &db);
    let said = succeeded(&copy());
    assert!(
        said.contains("copied 2 callback record(s), 2 validation record(s), 1 failing callback(s), 2 held result(s), 1 postponed validation(s), 2 tree key(s)"),
        "{said}"
    );
    // A copy that finished is not run again by mistake: after the instances served, it
    // would add back what they removed.
    let refused = copy();
    let why = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success(), "{why}");
    assert!(
        why.contains(&format!(
            "was copied into PostgreSQL schema {} on ",
            db.schema
        )) && why.contains("run it again with --again"),
        "{why}"
    );
    let again = copy_from_sled_again(&sled, &db);
    let said = succeeded(&again);
    assert!(
        said.contains("copied 0 callback record(s), 0 validation record(s), 0 failing callback(s), 0 held result(s), 0 postponed validation(s), 0 tree key(s)"),
        "a second copy writes nothing: {said}"
    );
    let logged = String::from_utf8_lossy(&again.stderr);
    assert!(
        !logged.contains("validation_id_reuse") && !said.contains("validation_id_reuse"),
        "a second copy meets its own records, not a validation id arriving again: {logged}"
    );

    let store = ConfiguredStore::open(
        &db.store_config(Duration::from_secs(30 * 86_400)),
        &["ledger"],
    )
    .await
    .unwrap();
    let shared = store.shared();
    for nonce in ["moved-1", LONG] {
        retried_as_duplicate(shared.as_ref(), nonce).await;
        let ledger = store.tree("ledger").unwrap();
        assert_eq!(
            store
                .get(&ledger, nonce.as_bytes())
                .await
                .unwrap()
                .as_deref(),
            Some(b"booked".as_slice())
        );
    }
    let failing = shared.failing_callbacks().await.unwrap();
    assert_eq!(failing.len(), 1);
    assert_eq!(failing[0].last_reason, "the ledger was down");
    let held = shared.held_callbacks(10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].nonce.as_str(), held[0].reason.as_str()),
        (LONG, "kept aside before the move")
    );
    let long = Nonce::from(LONG);
    let found = shared
        .held_callback(&long, TransactionStatus::Success)
        .await
        .unwrap();
    assert_eq!(found.as_ref(), held.first(), "keyed as PostgreSQL keys it");
    assert_eq!(shared.held_count().await.unwrap(), 1);
    let resolved = shared
        .held_callback(&long, TransactionStatus::Cancelled)
        .await
        .unwrap()
        .expect("the resolved one moved too");
    assert_eq!(
        (
            resolved.resolution.as_str(),
            resolved.resolved_by.as_deref(),
            resolved.unresolved()
        ),
        ("reversed by hand", Some("Erin"), false)
    );
    assert_eq!(
        shared
            .begin_validation(
                &Nonce::from("v-denied"),
                &Fingerprint::of(&validation("v-denied", 1)),
                STALE
            )
            .await
            .unwrap(),
        ValidationBegin::Recorded(RecordedDecision::Deny {
            message: "limit".into()
        })
    );
    let moved = shared.postponed(2.into()).await.unwrap().unwrap();
    assert_eq!(moved.state(), PostponedState::Queued);
    assert_eq!(shared.outbox_due(Utc::now()).await.unwrap().now.len(), 1);
    drop((shared, store));
    db.drop_schema().await;
}

fn days(n: u64) -> Duration {
    Duration::from_secs(n * 86_400)
}

/// `reach` is `wanted`, give or take the seconds the test took.
fn assert_reach(reach: Duration, wanted: Duration) {
    assert!(
        reach <= wanted && wanted - reach < Duration::from_secs(60),
        "reach {reach:?}, wanted {wanted:?}"
    );
}

/// What sled's records reach back to moves with them. Its retention raised from 7 to 90
/// days just before the move, they reach back 7 days, not 90: PostgreSQL, fresh, said 90,
/// and a callback retried or a transaction reconciled 20 days after its booking found no
/// record and was booked again. And a copy run with a shorter retention than sled's (7
/// days, for sled's 30) does not make PostgreSQL refuse, for weeks, what sled's records
/// still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_copy_carries_how_far_back_sled_s_records_reach() {
    let Some(db) = support::postgres::database("copy_carries_reach").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let week = StoreConfig {
        path: dir.path().join("store"),
        retention: days(7),
        ..StoreConfig::default()
    };
    history(&week).await;
    let raised = StoreConfig {
        retention: days(90),
        ..week.clone()
    };
    drop(SledStore::open(&raised, &["ledger"]).unwrap());
    succeeded(&copy_configured(
        &raised,
        &db,
        &[],
        &[("PAYHOOK_STORE_RETENTION", "90d")],
    ));
    // Run again (--again: no instance served since), the record it wrote stays as it is:
    // joined with itself, its growth would age from the second copy, not from the raise.
    let recorded = vouched_row(&db).await;
    succeeded(&copy_configured(
        &raised,
        &db,
        &["--again"],
        &[("PAYHOOK_STORE_RETENTION", "90d")],
    ));
    assert_eq!(vouched_row(&db).await, recorded);
    let served = payhook::store::PgStore::open(&db.store_config(days(90)), &[])
        .await
        .unwrap();
    assert_reach(served.reach(), days(7));
    drop(served);
    db.drop_schema().await;

    let Some(db) = support::postgres::database("copy_carries_reach").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let month = sled_with_history(&dir).await;
    assert_eq!(month.retention, days(30));
    succeeded(&copy_configured(
        &month,
        &db,
        &[],
        &[("PAYHOOK_STORE_RETENTION", "7d")],
    ));
    let served = payhook::store::PgStore::open(&db.store_config(days(30)), &[])
        .await
        .unwrap();
    assert_reach(served.reach(), days(30));
    drop(served);
    db.drop_schema().await;
}

/// The schema's record of how far back its records reach, as it is stored.
async fn vouched_row(db: &support::postgres::TestDb) -> String {
    let mut conn = db.connect().await;
    sqlx::query_scalar(&format!("SELECT record FROM {}.vouched", db.schema))
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

/// A sled store an earlier payhook wrote keeps no record of the retention its records were
/// written with: the copy refuses it, saying what to do, rather than take the copy's
/// `store.retention` for it — longer than sled's, the database would vouch for records
/// sled purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_store_without_its_retention_record_is_not_copied() {
    let Some((db, _dir, sled)) = history_to_copy("copy_needs_the_record").await else {
        return;
    };
    {
        let earlier = support::sled_when_free(&sled.path);
        let tree = earlier.open_tree("payhook").unwrap();
        tree.remove(b"m\0vouched").unwrap().unwrap();
        earlier.flush().unwrap();
    }
    let refused = copy_from_sled(&sled, &db);
    let why = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success(), "{why}");
    assert!(
        why.contains("keeps no record of the retention") && why.contains("copy again"),
        "{why}"
    );
    // Started once by this payhook, it has one, and is copied.
    drop(SledStore::open(&sled, &["ledger"]).unwrap());
    succeeded(&copy_from_sled(&sled, &db));
    db.drop_schema().await;
}

/// Once copied, the sled directory says so, and a sled instance started on it by mistake
/// is refused: it would book again the retries of callbacks PostgreSQL booked since. The
/// copy itself still reads it (run again, it writes nothing); removing the file (a move
/// abandoned) serves from sled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_sled_store_is_not_served_again() {
    let Some((db, _dir, sled)) = history_to_copy("moved_sled_refused").await else {
        return;
    };
    succeeded(&copy_from_sled(&sled, &db));
    let marker = sled.path.join(payhook::store::MOVED_FILE_NAME);
    let said = std::fs::read_to_string(&marker).unwrap();
    assert!(
        said.starts_with(&format!("copied into PostgreSQL schema {} on ", db.schema)),
        "{said}"
    );
    let Err(refused) = SledStore::open(&sled, &["ledger"]) else {
        panic!("a moved sled store opened");
    };
    let refused = refused.to_string();
    assert!(
        refused.contains(&format!(
            "was copied into PostgreSQL schema {} on ",
            db.schema
        )) && refused.contains("a sled instance would book their retries again")
            && refused.contains(&marker.display().to_string()),
        "{refused}"
    );
    // The operator's check of the directory says so too.
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(["store", "check", "--data"])
        .arg(&sled.path)
        .env_clear()
        .output()
        .unwrap();
    let said = succeeded(&checked);
    assert!(
        said.contains(&format!(
            "it is not served: {} says it was copied into PostgreSQL schema {} on ",
            marker.display(),
            db.schema
        )),
        "{said}"
    );
    let said = succeeded(&copy_from_sled_again(&sled, &db));
    assert!(said.contains("copied 0 callback record(s)"), "{said}");
    std::fs::remove_file(&marker).unwrap();
    let store = SledStore::open(&sled, &["ledger"]).unwrap();
    retried_as_duplicate(&store, "moved-1").await;
    drop(store);
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_keeps_the_statuses_the_database_booked_meanwhile() {
    // PostgreSQL booked a later status of a moved nonce before the copy reached it (the
    // instances started early, or the copy is run again): the copy adds sled's statuses to
    // it, and drops none, so a retry of that status stays a duplicate.
    let Some((db, _dir, sled)) = history_to_copy("moving_from_sled_merges").await else {
        return;
    };
    let config = db.store_config(Duration::from_secs(30 * 86_400));
    let store = ConfiguredStore::open(&config, &["ledger"]).await.unwrap();
    let shared = store.shared();
    let nonce = Nonce::from("moved-1");
    let CallbackBegin::Claimed { claim, .. } = shared
        .begin_callback(&nonce, TransactionStatus::Cancelled, STALE)
        .await
        .unwrap()
    else {
        panic!("not claimed");
    };
    shared
        .finish_callback(
            &nonce,
            claim,
            TransactionStatus::Cancelled,
            Effects::default(),
        )
        .await
        .unwrap();
    drop((shared, store));

    succeeded(&copy_from_sled(&sled, &db));
    let store = ConfiguredStore::open(&config, &["ledger"]).await.unwrap();
    let shared = store.shared();
    for status in [TransactionStatus::Cancelled, TransactionStatus::Success] {
        assert_eq!(
            shared.begin_callback(&nonce, status, STALE).await.unwrap(),
            CallbackBegin::Duplicate,
            "{status:?} stays acknowledged"
        );
    }
    // sled's success came first, PostgreSQL's cancellation after it: the next status is
    // told it follows the cancellation.
    let next = shared
        .begin_callback(&nonce, TransactionStatus::PaymentSystemError, STALE)
        .await
        .unwrap();
    assert!(
        matches!(
            next,
            CallbackBegin::Claimed {
                previous_status: Some(TransactionStatus::Cancelled),
                ..
            }
        ),
        "{next:?}"
    );
    drop((shared, store));
    db.drop_schema().await;
}

/// The claim of a delivery at an instance serving `schema` as a payhook older than the
/// copy's guard does (it holds the schema open by no lock, so neither refuses the other):
/// whether it claimed the nonce, and whether it found `status` acknowledged. Its
/// transaction is rolled back.
async fn older_instance_claims(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    nonce: &str,
    status: TransactionStatus,
) -> (bool, bool) {
    sqlx::Executor::execute(&mut *conn, "BEGIN").await.unwrap();
    let claimed = sqlx::query_as(&format!(
        "SELECT claimed, acknowledged FROM {schema}.claim_callback($1, $2, 600, 2592000)"
    ))
    .bind(nonce)
    .bind(status.code())
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    sqlx::Executor::execute(&mut *conn, "ROLLBACK")
        .await
        .unwrap();
    claimed
}

/// A delivery at a PostgreSQL instance that serves while the copy runs (a payhook older
/// than the copy's guard, which takes no part in it) meets a moved nonce whose copied row
/// is not committed yet: it is told the nonce is busy, and once the copy commits its retry
/// is a duplicate. It used to read no status, run its handler for one sled had booked, and
/// append that status a second time. The copy is held between the nonce's row and its
/// commit by the `trees` table, locked by the test (sled's ledger key is copied after the
/// callbacks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_beside_the_copy_of_its_nonce_is_not_booked_again() {
    let Some(db) = support::postgres::database("moving_beside_a_delivery").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = db.store_config(Duration::from_secs(30 * 86_400));
    let (locked, copy) = copy_held_at_the_trees(&dir, &db, &config).await;
    let claim = tokio::spawn({
        let schema = db.schema.clone();
        let mut older = db.connect().await;
        async move {
            older_instance_claims(&mut older, &schema, "moved-1", TransactionStatus::Success).await
        }
    });
    // The delivery is answered at once; were it to wait behind the copy's row instead, the
    // copy is let go, and its answer told.
    let behind_the_copy = format!(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid' \
         AND pid <> pg_backend_pid() AND EXISTS (SELECT 1 FROM pg_stat_activity a \
           WHERE a.pid = pg_locks.pid AND a.query LIKE '%{}.claim_callback%')",
        db.schema
    );
    let mut watcher = db.connect().await;
    let deadline = tokio::time::Instant::now() + support::DEADLINE;
    while !claim.is_finished() {
        let (n,): (i64,) = sqlx::query_as(&behind_the_copy)
            .fetch_one(&mut watcher)
            .await
            .unwrap();
        if n > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the delivery neither answered nor waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    locked.release().await;
    assert_eq!(
        claim.await.unwrap(),
        (false, false),
        "the copy's nonce is busy, not claimed"
    );
    succeeded(&copy.await.unwrap());
    assert_eq!(
        older_instance_claims(
            &mut watcher,
            &db.schema,
            "moved-1",
            TransactionStatus::Success
        )
        .await,
        (true, true),
        "the retry after the copy is a duplicate"
    );
    drop(watcher);
    db.drop_schema().await;
}

/// The copy refuses while an instance (or a tool) has the schema open: that instance would
/// book again a retry of a callback sled booked that the copy has not reached yet. It waits
/// a few seconds first, for an instance stopped just before it to close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_copy_refuses_while_an_instance_has_the_schema_open() {
    let Some((db, _dir, sled)) = history_to_copy("moving_beside_an_instance").await else {
        return;
    };
    let config = db.store_config(Duration::from_secs(30 * 86_400));
    let store = ConfiguredStore::open(&config, &["ledger"]).await.unwrap();
    let refused = tokio::task::spawn_blocking({
        let (sled, db) = (sled.clone(), db.clone());
        move || copy_from_sled(&sled, &db)
    })
    .await
    .unwrap();
    stopped_as_open_elsewhere(&refused, &db, "stop every one using it, then copy").await;
    drop(store);
    db.drop_schema().await;
}

/// Asserts that the copy `run` stopped because `db`'s schema is open elsewhere, saying
/// `saying` too, and committed no callback's row.
async fn stopped_as_open_elsewhere(
    run: &std::process::Output,
    db: &support::postgres::TestDb,
    saying: &str,
) {
    let said = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(!run.status.success(), "{said}");
    assert!(
        said.contains(&format!("schema {} is open elsewhere", db.schema)) && said.contains(saying),
        "{said}"
    );
    let mut conn = db.connect().await;
    let (copied,): (i64,) =
        sqlx::query_as(&format!("SELECT count(*) FROM {}.callbacks", db.schema))
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(copied, 0, "no callback's row was committed");
}

/// No store opens while the copy writes: an instance starting then is refused, saying so,
/// and opens once the copy has finished. The copy is held mid-way by the `trees` table,
/// locked by the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_does_not_open_while_the_copy_writes() {
    let Some(db) = support::postgres::database("opening_beside_the_copy").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = db.store_config(Duration::from_secs(30 * 86_400));
    let (locked, copy) = copy_held_at_the_trees(&dir, &db, &config).await;
    // Nor a sled instance on the directory being copied: it is marked from the start.
    let sled = StoreConfig {
        path: dir.path().join("store"),
        ..StoreConfig::default()
    };
    let Err(moving) = SledStore::open(&sled, &["ledger"]) else {
        panic!("a sled instance opened on the directory being copied");
    };
    assert!(
        moving.to_string().contains(&format!(
            "was being copied into PostgreSQL schema {} since ",
            db.schema
        )),
        "{moving}"
    );
    let Err(refused) = ConfiguredStore::open(&config, &["ledger"]).await else {
        panic!("an instance opened while the copy writes");
    };
    let refused = refused.to_string();
    assert!(
        refused.contains(&format!(
            "a copy from sled (payhook store copy-from-sled) holds schema {}",
            db.schema
        )),
        "{refused}"
    );
    locked.release().await;
    succeeded(&copy.await.unwrap());
    let store = ConfiguredStore::open(&config, &["ledger"]).await.unwrap();
    retried_as_duplicate(store.shared().as_ref(), "moved-1").await;
    drop(store);
    db.drop_schema().await;
}

/// A store whose every connection holding the schema open was lost at the moment the copy
/// looked (a proxy restarted, its sessions terminated) holds it again at its next check: the
/// copy sees it before it commits its next batch, and stops saying who has the schema open,
/// rather than copy on beside an instance that serves. The test holds the schema open as
/// such a store does, while the copy waits for the `trees` table it locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_holding_the_schema_again_mid_copy_stops_the_copy() {
    let Some(db) = support::postgres::database("store_back_mid_copy").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = db.store_config(Duration::from_secs(30 * 86_400));
    let (locked, copy) = copy_held_at_the_trees(&dir, &db, &config).await;
    let mut back = db.connect().await;
    let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(&mut back)
        .await
        .unwrap();
    // The schema's open lock ("payo", hashtext of the schema), as a store holds it.
    sqlx::query("SELECT pg_advisory_lock_shared(x'7061796f'::int, hashtext($1))")
        .bind(&db.schema)
        .execute(&mut back)
        .await
        .unwrap();
    locked.release().await;
    let stopped = copy.await.unwrap();
    // The session is named, that an operator may find it.
    stopped_as_open_elsewhere(&stopped, &db, &format!("pid {pid} (")).await;
    drop(back);
    db.drop_schema().await;
}

/// The copy looks again before each batch it commits, not only at its end: a store that
/// holds the schema again while the first batch of a long copy is written stops it there,
/// that batch not committed. (The test holds the copy at its first callback's row with the
/// `callbacks` table locked; 600 callbacks make more than one batch of 500.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_holding_the_schema_again_stops_a_long_copy_at_its_next_batch() {
    let Some((db, _dir, sled)) = history_to_copy("store_back_mid_batch").await else {
        return;
    };
    {
        let store = SledStore::open(&sled, &["ledger"]).unwrap();
        let mut booked = tokio::task::JoinSet::new();
        for n in 0..600 {
            let store = store.clone();
            booked.spawn(async move {
                book_in_sled(&store, &format!("many-{n}"), Effects::default()).await;
            });
        }
        while let Some(done) = booked.join_next().await {
            done.unwrap();
        }
    }
    let config = db.store_config(Duration::from_secs(30 * 86_400));
    let (locked, copy) = copy_held_at("callbacks", sled, &db, &config).await;
    let mut back = db.connect().await;
    sqlx::query("SELECT pg_advisory_lock_shared(x'7061796f'::int, hashtext($1))")
        .bind(&db.schema)
        .execute(&mut back)
        .await
        .unwrap();
    locked.release().await;
    let stopped = copy.await.unwrap();
    stopped_as_open_elsewhere(&stopped, &db, "stop every one using it, then copy").await;
    drop(back);
    db.drop_schema().await;
}

/// A sled store written before identifiers with U+0000 were refused (or through the
/// library) may hold records of such a nonce, which PostgreSQL cannot hold in text: the copy
/// leaves them behind, says how many, and copies everything else. It used to fail on the
/// first of them, every run, and never finish. (No delivery of such a nonce reaches a
/// handler on PostgreSQL: it is refused with 400.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_nonce_postgresql_cannot_hold_are_left_behind_and_counted() {
    let Some((db, _dir, sled)) = history_to_copy("moving_unstorable").await else {
        return;
    };
    {
        let store = SledStore::open(&sled, &["ledger"]).unwrap();
        book_in_sled(&store, "nul-\u{0}-1", Effects::default()).await;
    }
    let said = succeeded(&copy_from_sled(&sled, &db));
    assert!(
        said.contains("copied 2 callback record(s)")
            && said.contains("1 record(s) of a nonce with U+0000 left behind"),
        "{said}"
    );
    let config = db.store_config(Duration::from_secs(30 * 86_400));
    let store = ConfiguredStore::open(&config, &["ledger"]).await.unwrap();
    let shared = store.shared();
    retried_as_duplicate(shared.as_ref(), "moved-1").await;
    drop((shared, store));
    db.drop_schema().await;
}

/// A tree key PostgreSQL cannot index (a btree row holds about 2,700 bytes) stops the copy
/// at it on every run: the copy says which tree, how long the key is, and what to do, not
/// only PostgreSQL's index row size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_key_postgresql_cannot_index_stops_the_copy_saying_what_to_do() {
    let Some((db, _dir, sled)) = history_to_copy("moving_unindexable").await else {
        return;
    };
    {
        let store = SledStore::open(&sled, &["ledger"]).unwrap();
        let ledger = store.tree("ledger").unwrap();
        // 3,000 bytes no compression shortens.
        let mut state = 12_345_u32;
        let key: Vec<u8> = (0..3_000)
            .map(|_| {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                state.to_be_bytes()[1]
            })
            .collect();
        let effects = Effects::default();
        effects.write(move |tx| tx.insert(&ledger, &key, b"booked"));
        book_in_sled(&store, "long-key-1", effects).await;
    }
    let copied = copy_from_sled(&sled, &db);
    let said = String::from_utf8_lossy(&copied.stderr);
    assert!(!copied.status.success(), "{said}");
    assert!(
        said.contains("tree `ledger`: a key of 3000 bytes is more than PostgreSQL can index")
            && said.contains("shorten it in the sled store"),
        "{said}"
    );
    db.drop_schema().await;
}

/// sled keeps a nonce's validation record past its retention while the nonce's postponed
/// validation awaits its result (a validation without a deadline, undecided): the copy
/// brings it over, so that the aggregator asking about the nonce again after the move is
/// answered from it, and the handler does not run a second time. A record past its
/// retention whose validation awaits nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_awaiting_its_result_past_the_retention_keeps_its_record_when_copied() {
    let Some(db) = support::postgres::database("moving_from_sled_awaiting").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sled = StoreConfig {
        path: dir.path().join("store"),
        retention: Duration::from_secs(1),
        ..StoreConfig::default()
    };
    {
        let store = SledStore::open(&sled, &[]).unwrap();
        for (nonce, id, decision, postponed) in [
            ("v-awaits", 5, RecordedDecision::Postponed, true),
            ("v-allowed", 6, RecordedDecision::Allow, false),
        ] {
            if !postponed {
                // Past the retention, and swept: sled keeps the awaiting nonce's record.
                let later = Utc::now() + TimeDelta::seconds(5);
                store.purge_expired(later).await.unwrap();
                let fingerprint = Fingerprint::of(&validation("v-awaits", 5));
                assert_eq!(
                    store
                        .begin_validation(&Nonce::from("v-awaits"), &fingerprint, STALE)
                        .await
                        .unwrap(),
                    ValidationBegin::Recorded(RecordedDecision::Postponed)
                );
            }
            decide(&store, nonce, id, decision, postponed.then_some(None)).await;
        }
    }
    // The allowed validation's record past its retention too, not yet swept.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let said = succeeded(&copy_from_sled(&sled, &db));
    assert!(
        said.contains("1 validation record(s), 0 failing callback(s), 0 held result(s), 1 postponed validation(s), 0 tree key(s); 1 expired record(s) left behind"),
        "{said}"
    );
    let said = succeeded(&copy_from_sled_again(&sled, &db));
    assert!(
        said.contains("copied 0 callback record(s), 0 validation record(s), 0 failing callback(s), 0 held result(s), 0 postponed validation(s), 0 tree key(s); 1 expired record(s) left behind"),
        "a second copy writes nothing, and leaves the same behind: {said}"
    );

    let store = ConfiguredStore::open(&db.store_config(Duration::from_secs(1)), &[])
        .await
        .unwrap();
    let shared = store.shared();
    let fingerprint = Fingerprint::of(&validation("v-awaits", 5));
    assert_eq!(
        shared
            .begin_validation(&Nonce::from("v-awaits"), &fingerprint, STALE)
            .await
            .unwrap(),
        ValidationBegin::Recorded(RecordedDecision::Postponed),
        "asked again after the move: answered from its record, not run again"
    );
    // The other, awaiting nothing, was left behind: its nonce is new to the database.
    assert!(matches!(
        shared
            .begin_validation(
                &Nonce::from("v-allowed"),
                &Fingerprint::of(&validation("v-allowed", 6)),
                STALE
            )
            .await
            .unwrap(),
        ValidationBegin::Claimed { .. }
    ));
    // PostgreSQL's sweep keeps the awaiting one, as sled's did.
    shared
        .purge_expired(Utc::now() + TimeDelta::seconds(5))
        .await
        .unwrap();
    assert_eq!(
        shared
            .begin_validation(&Nonce::from("v-awaits"), &fingerprint, STALE)
            .await
            .unwrap(),
        ValidationBegin::Recorded(RecordedDecision::Postponed)
    );
    drop((shared, store));
    db.drop_schema().await;
}
