//! With synchronous replication on PostgreSQL, a callback is acknowledged only once the
//! standby has its booking: a retry that another instance answers as a duplicate waits for
//! the standby too (its booking may be on the primary alone), so does a validation asked
//! again and answered from its record, and a booking whose COMMIT
//! waits for the standby is not taken over as stale (terminating it would not undo its
//! commit).
//!
//! The test names a standby that never connects (`synchronous_standby_names`), so that every
//! COMMIT that writes waits until the setting is removed. It is the whole server's setting
//! (`ALTER SYSTEM`), so this binary holds this one test (cargo runs test binaries one after
//! another), changes it only where it was empty, and removes it however the test ends;
//! `.ci/postgres` removes one left by a test that was killed.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;

use payhook::model::{Nonce, TransactionStatus};
use payhook::store::{CallbackBegin, DedupStore, Effects, PgStore};
use sqlx::{PgConnection, Row};
use support::postgres::TestDb;
use support::*;

/// The standby the test names: no such server ever connects.
const ABSENT: &str = "payhook_test_absent_standby";

/// The logical message payhook writes for a duplicate under synchronous replication, as a
/// privilege (some managed services revoke it from PUBLIC).
const EMIT: &str = "EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text)";

const TEST: &str = "acknowledgements_wait_for_the_synchronous_standby";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_wait_for_the_synchronous_standby() {
    let Some(db) = support::postgres::database(TEST).await else {
        return;
    };
    let mut admin = db.connect().await;
    if let Err(why) = may_name_a_standby(&mut admin).await {
        assert!(
            std::env::var_os("CI").is_none(),
            "{TEST}: {why}, and CI must run this test"
        );
        announce_skip(TEST, &why);
        return;
    }
    // payhook connects as a role of its own, no superuser: as a service does, and so that
    // what PUBLIC may run applies to it.
    let (role, url) = db.own_role().await;
    let standby = Removed(db.clone());
    scenario(&db, &url).await;
    drop(standby);
    db.drop_schema().await;
    sqlx::raw_sql(&format!("DROP ROLE {role}"))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// What the test changes server-wide, undone when dropped, however the test ends (a panic
/// too): the standby it names, and the logical messages it revokes from PUBLIC.
struct Removed(TestDb);

impl Drop for Removed {
    fn drop(&mut self) {
        let db = self.0.clone();
        // On a thread and runtime of its own: a drop cannot await on the test's.
        let removed = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let mut admin = db.connect().await;
                    // The standby first: the GRANT's COMMIT would wait for it.
                    name_standby(&db, &mut admin, None).await;
                    sqlx::raw_sql(&format!("GRANT {EMIT} TO PUBLIC"))
                        .execute(&mut admin)
                        .await
                        .unwrap();
                });
        })
        .join();
        if removed.is_err() {
            announce(&format!(
                "{TEST}: could not remove synchronous_standby_names = {ABSENT:?}: every COMMIT \
                 on the server waits until it is removed (.ci/postgres removes it)"
            ));
        }
    }
}

/// The test, with payhook connecting at `url` (as the test's own role).
async fn scenario(db: &TestDb, url: &str) {
    let retention = Duration::from_secs(3600);
    let mut config = test_config();
    config.store = db.store_config(retention);
    config.store.url = Some(url.into());
    // Two instances on the database: the first books, the second answers its retry.
    let first_store = PgStore::open(&config.store, &[]).await.unwrap();
    let second_store = PgStore::open(&config.store, &[]).await.unwrap();
    let first = TestServer::start_on(
        config.clone(),
        tempfile::tempdir().unwrap(),
        first_store.clone(),
    )
    .await;
    let second =
        TestServer::start_on(config, tempfile::tempdir().unwrap(), second_store.clone()).await;
    let booked = with(CALLBACK, "/nonce", Some("standby-booked".into()));
    let answer = first.post_json(CALLBACK_PATH, &booked).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );

    // A validation decided at the first instance, before the standby is required.
    let answer = first
        .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
        .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );

    let mut admin = db.connect().await;
    name_standby(db, &mut admin, Some(ABSENT)).await;

    // A booking whose COMMIT waits for the standby is not taken over, however stale.
    let nonce = Nonce::from("standby-waiting");
    let CallbackBegin::Claimed { claim, .. } = first_store
        .begin_callback(
            &nonce,
            TransactionStatus::Success,
            Duration::from_secs(3600),
        )
        .await
        .unwrap()
    else {
        panic!("a new nonce is claimed");
    };
    let holder = {
        let (store, nonce) = (first_store.clone(), nonce.clone());
        tokio::spawn(async move {
            store
                .finish_callback(
                    &nonce,
                    claim,
                    TransactionStatus::Success,
                    Effects::default(),
                )
                .await
        })
    };
    waiting_for_the_standby(&mut admin, (1, CLAIMS), || holder.is_finished()).await;
    let taking_over = tokio::time::timeout(
        DEADLINE,
        second_store.begin_callback(&nonce, TransactionStatus::Success, Duration::ZERO),
    )
    .await
    .expect(
        "the claimant did not answer: it took the booking over, and waits for the standby itself",
    );
    assert_eq!(
        taking_over.unwrap(),
        CallbackBegin::Busy,
        "a booking waiting for the standby is busy, not taken over (which would end its \
         transaction's wait, committed on the primary alone)"
    );
    assert!(
        !holder.is_finished(),
        "the booking still waits for the standby"
    );

    // A retry of the booked callback, at the other instance: not answered while the
    // standby lacks the booking.
    let retry = deliver(second.addr, &booked);
    waiting_for_the_standby(&mut admin, (2, CLAIMS), || retry.is_finished()).await;
    assert!(!retry.is_finished());
    // So is the validation's, which the second instance reads as decided: its decision's
    // COMMIT may have been cut short in its own wait.
    let asked_again = post_to(second.addr, VALIDATION_PATH, TRANSACTION_VALIDATION);
    waiting_for_the_standby(&mut admin, (1, ANSWERED), || asked_again.is_finished()).await;

    // The standby "answers" (it is no longer required): both go on.
    name_standby(db, &mut admin, None).await;
    tokio::time::timeout(DEADLINE, holder)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    answered_200(retry).await;
    answered_200(asked_again).await;
    assert!(
        second.merchant.seen.lock().unwrap().is_empty(),
        "the retries are answered from the records: no handler ran for them"
    );
    assert_eq!(
        first.merchant.seen.lock().unwrap().len(),
        2,
        "the first delivery and the first validation"
    );
    assert_eq!(
        second_store
            .begin_callback(&nonce, TransactionStatus::Success, Duration::ZERO)
            .await
            .unwrap(),
        CallbackBegin::Duplicate,
        "the booking that waited for the standby is acknowledged"
    );
    let marks: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {}.callbacks WHERE done = ARRAY[4]",
        db.schema
    ))
    .fetch_one(&mut admin)
    .await
    .unwrap()
    .get(0);
    assert_eq!(marks, 2, "each nonce booked once");

    // Where logical messages are revoked from PUBLIC, a duplicate still waits for the
    // standby (the claim rewrites the nonce's row instead), and is then answered.
    sqlx::raw_sql(&format!("REVOKE {EMIT} FROM PUBLIC"))
        .execute(&mut admin)
        .await
        .unwrap();
    name_standby(db, &mut admin, Some(ABSENT)).await;
    let retry = deliver(second.addr, &booked);
    waiting_for_the_standby(&mut admin, (1, CLAIMS), || retry.is_finished()).await;
    let asked_again = post_to(second.addr, VALIDATION_PATH, TRANSACTION_VALIDATION);
    waiting_for_the_standby(&mut admin, (1, REWRITTEN), || asked_again.is_finished()).await;
    name_standby(db, &mut admin, None).await;
    answered_200(retry).await;
    answered_200(asked_again).await;
    assert!(second.merchant.seen.lock().unwrap().is_empty());
    sqlx::raw_sql(&format!("GRANT {EMIT} TO PUBLIC"))
        .execute(&mut admin)
        .await
        .unwrap();
    support::announce(&format!(
        "{TEST}: a booking waiting for the standby answered Busy to a claimant; a duplicate \
         waited for the standby, with logical messages allowed and revoked"
    ));
}

/// What a validation answered again from its record reads as in `pg_stat_activity` while
/// it waits for the standby: the logical message, or the row rewritten where the message
/// is revoked.
const ANSWERED: &str = "%validation answered%";
const REWRITTEN: &str = "%SET expires_at = expires_at%";

/// The callback `body` delivered to `addr`, on a task of its own (its answer may wait).
fn deliver(
    addr: std::net::SocketAddr,
    body: &str,
) -> tokio::task::JoinHandle<support::RawResponse> {
    post_to(addr, CALLBACK_PATH, body)
}

/// `body` posted to `path` at `addr`, on a task of its own (its answer may wait).
fn post_to(
    addr: std::net::SocketAddr,
    path: &str,
    body: &str,
) -> tokio::task::JoinHandle<support::RawResponse> {
    let request = post(
        path,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    tokio::spawn(async move { exchange(addr, &request).await })
}

/// Waits for `delivery`'s answer, which must be 200.
async fn answered_200(delivery: tokio::task::JoinHandle<support::RawResponse>) {
    let answer = tokio::time::timeout(DEADLINE, delivery)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

/// `Err` (why) when the test cannot name a standby on this server: it must be its
/// superuser, able to replicate, and not replicating synchronously already (the test would
/// change a real setting).
async fn may_name_a_standby(admin: &mut PgConnection) -> Result<(), String> {
    let row = sqlx::query(
        "SELECT current_setting('synchronous_standby_names'), \
           current_setting('max_wal_senders')::int, \
           (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    let (names, senders, superuser): (String, i32, bool) = (row.get(0), row.get(1), row.get(2));
    if !superuser {
        return Err("naming a synchronous standby (ALTER SYSTEM) needs a superuser".into());
    }
    if senders == 0 {
        return Err("max_wal_senders is 0: the server cannot replicate".into());
    }
    if !names.is_empty() && names != ABSENT {
        return Err(format!(
            "the server replicates synchronously already (synchronous_standby_names = \
             {names:?}), and the test would change it"
        ));
    }
    Ok(())
}

/// Names `standby` as the server's synchronous standby (none: removes it), and returns
/// once the server's commits wait for it (or no longer do).
async fn name_standby(db: &TestDb, admin: &mut PgConnection, standby: Option<&str>) {
    let change = match standby {
        Some(name) => format!("ALTER SYSTEM SET synchronous_standby_names = '{name}'"),
        None => "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
    };
    // Two statements: ALTER SYSTEM cannot run in a transaction block.
    for statement in [change.as_str(), "SELECT pg_reload_conf()"] {
        sqlx::raw_sql(statement).execute(&mut *admin).await.unwrap();
    }
    // The server applies the change in its own time: probe until a commit does as told.
    let limit = tokio::time::Instant::now() + DEADLINE;
    while commits_wait(db, admin).await != standby.is_some() {
        assert!(
            tokio::time::Instant::now() < limit,
            "the server never applied {change}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a COMMIT that writes waits for a standby now: a probe's COMMIT either returns,
/// or shows waiting for one (and is then cancelled, committed on the primary alone).
async fn commits_wait(db: &TestDb, admin: &mut PgConnection) -> bool {
    let mut probe = db.connect().await;
    let pid: i32 = sqlx::query("SELECT pg_backend_pid()")
        .fetch_one(&mut probe)
        .await
        .unwrap()
        .get(0);
    sqlx::raw_sql("BEGIN; SELECT pg_logical_emit_message(true, 'payhook-test', 'probe')")
        .execute(&mut probe)
        .await
        .unwrap();
    let commit = tokio::spawn(async move { sqlx::query("COMMIT").execute(&mut probe).await });
    let limit = tokio::time::Instant::now() + DEADLINE;
    loop {
        if commit.is_finished() {
            commit.await.unwrap().unwrap();
            return false;
        }
        let waits: bool = sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep')",
        )
        .bind(pid)
        .fetch_one(&mut *admin)
        .await
        .unwrap()
        .get(0);
        if waits {
            sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(&mut *admin)
                .await
                .unwrap();
            tokio::time::timeout(DEADLINE, commit)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            return true;
        }
        assert!(
            tokio::time::Instant::now() < limit,
            "the probe's COMMIT neither returned nor waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What payhook's COMMIT of a claim's transaction (which begins the next one's) reads as
/// in `pg_stat_activity`.
const CLAIMS: &str = "%COMMIT; BEGIN%";

/// Returns once `count` of payhook's statements whose text is `like` (a claim's COMMIT,
/// [`CLAIMS`]; a validation answered again) wait for the standby; fails if `answered` first.
async fn waiting_for_the_standby(
    admin: &mut PgConnection,
    (count, like): (i64, &str),
    answered: impl Fn() -> bool,
) {
    let limit = tokio::time::Instant::now() + DEADLINE;
    loop {
        let waiting: i64 = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event = 'SyncRep' AND query LIKE $1",
        )
        .bind(like)
        .fetch_one(&mut *admin)
        .await
        .unwrap()
        .get(0);
        if waiting >= count {
            return;
        }
        assert!(
            !answered(),
            "answered before the standby had the booking ({waiting} of payhook's COMMITs \
             waiting for it, {count} expected)"
        );
        assert!(
            tokio::time::Instant::now() < limit,
            "{count} of payhook's COMMITs never waited for the standby"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
