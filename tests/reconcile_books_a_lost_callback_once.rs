//! Lost-callback recovery (spec 6.7): a result fetched from the aggregator goes through the
//! same handler and deduplication as its callback, so it is booked once whichever comes first.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::gateway::GatewayClient;
use payhook::model::TransactionStatus;
use payhook::server::{ReconcileError, Reconciled};
use serde_json::json;
use support::gateway::FakeGateway;
use support::{CALLBACK, CALLBACK_PATH, TestServer, test_config, with};
use uuid::Uuid;

const LOST: &str = "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e";

/// The aggregator's record of the lost transaction, last changed `age` ago.
fn record(nonce: &str, status: i32, age: chrono::Duration) -> serde_json::Value {
    let updated = chrono::Utc::now() - age;
    let created = updated - chrono::Duration::seconds(1);
    json!({
        "id": 1001, "transactionReferenceId": LOST, "providerId": 11, "merchantClientId": "client-42",
        "accountData": {"orderId": "o-1"}, "nonce": nonce, "amount": 25.50, "currency": "EUR",
        "transactionType": 1, "transactionStatus": status, "transactionStatusMessage": "Success",
        "callbackDeliveryStatus": "Failed", "isCallbackSendingCanceled": true,
        "createdUtc": created.to_rfc3339(), "updatedUtc": updated.to_rfc3339()
    })
}

async fn setup(status: i32) -> (FakeGateway, GatewayClient, TestServer) {
    setup_aged(status, chrono::Duration::minutes(5), test_config()).await
}

async fn setup_aged(
    status: i32,
    age: chrono::Duration,
    config: payhook::Config,
) -> (FakeGateway, GatewayClient, TestServer) {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.transactions
            .insert(LOST.to_owned(), record("nonce-lost", status, age))
    });
    let client = GatewayClient::new(&gateway.config()).unwrap();
    let server = TestServer::start_with(config).await;
    (gateway, client, server)
}

fn callback_count(server: &TestServer) -> usize {
    server
        .merchant
        .calls()
        .iter()
        .filter(|c| c.endpoint == "callback")
        .count()
}

#[tokio::test]
async fn a_reconciled_result_is_booked_once_and_its_late_callback_is_a_duplicate() {
    let (_gateway, client, server) = setup(4).await;
    let id: Uuid = LOST.parse().unwrap();
    let outcome = server.app.reconcile(&client, &[id]).await;
    assert!(
        matches!(outcome[..], [(i, Ok(Reconciled::Booked(TransactionStatus::Success)))] if i == id),
        "{outcome:?}"
    );
    let again = server.app.reconcile(&client, &[id]).await;
    assert!(
        matches!(again[0].1, Ok(Reconciled::AlreadyBooked(_))),
        "{again:?}"
    );
    // The real callback arrives late: a duplicate, the handler is not called again.
    let late = with(CALLBACK, "/nonce", Some(json!("nonce-lost")));
    let response = server.post_json(CALLBACK_PATH, &late).await;
    assert_eq!(
        (response.status, response.message()),
        (200, "callback already processed".into())
    );
    assert_eq!(callback_count(&server), 1);
    let seen = &server.merchant.calls()[0];
    assert_eq!(
        (seen.nonce.as_str(), seen.amount.as_str()),
        ("nonce-lost", "25.5")
    );
}

#[tokio::test]
async fn a_callback_that_arrived_first_makes_the_reconcile_a_no_op() {
    let (_gateway, client, server) = setup(4).await;
    let first = with(CALLBACK, "/nonce", Some(json!("nonce-lost")));
    assert_eq!(server.post_json(CALLBACK_PATH, &first).await.status, 200);
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap()])
        .await;
    assert!(
        matches!(outcome[0].1, Ok(Reconciled::AlreadyBooked(_))),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 1);
}

/// Reconciles [`LOST`] with a lookup that reads the aggregator's record (as set up) and,
/// before its answer arrives, the record changes to `now` and a callback of `callback` is
/// booked — the reconcile then claims the nonce after that booking. `after` changes the
/// record again before the reconcile goes on. Returns the outcome, the handler's calls and
/// the lookups made.
async fn reconcile_overtaken(
    (gateway, client, server): (FakeGateway, GatewayClient, TestServer),
    (now, callback): (i32, i32),
    after: impl FnOnce(&mut support::gateway::GatewayState),
) -> (Result<Reconciled, ReconcileError>, Vec<support::Seen>, u32) {
    let (release, hold) = tokio::sync::oneshot::channel();
    gateway.with(|s| s.hold_next_lookup = Some(hold));
    let id: Uuid = LOST.parse().unwrap();
    let reconcile = {
        let (app, client) = (server.app.clone(), client.clone());
        tokio::spawn(async move { app.reconcile(&client, &[id]).await })
    };
    gateway
        .until("the reconcile's lookup", |s| s.lookups == 1)
        .await;
    let changed = record("nonce-lost", now, chrono::Duration::minutes(1));
    gateway.with(|s| s.transactions.insert(LOST.to_owned(), changed));
    let delivered = with(
        &with(CALLBACK, "/nonce", Some(json!("nonce-lost"))),
        "/transactionStatus",
        Some(json!(callback)),
    );
    assert_eq!(
        server.post_json(CALLBACK_PATH, &delivered).await.status,
        200
    );
    gateway.with(after);
    release.send(()).unwrap();
    let mut outcome = reconcile.await.unwrap();
    let calls = server.merchant.calls();
    (outcome.remove(0).1, calls, gateway.with(|s| s.lookups))
}

/// The lookup answered −4; before its answer arrived the aggregator moved the transaction to
/// 4 and its callback was booked. The reconcile, claiming the nonce after that booking, reads
/// the record again and books nothing stale: it handed the handler −4 after 4 (a booked
/// success then read as reversed by a network error).
#[tokio::test]
async fn a_lookup_overtaken_by_a_booked_callback_books_nothing_stale() {
    let overtaken = reconcile_overtaken(setup(-4).await, (4, 4), |_| {}).await;
    assert_nothing_stale_booked(overtaken);
}

/// As [`a_lookup_overtaken_by_a_booked_callback_books_nothing_stale`], on PostgreSQL: the
/// claim read again under is the database's, rolled back when nothing is booked.
#[tokio::test]
async fn a_lookup_overtaken_on_a_shared_database_books_nothing_stale() {
    let test = "a_lookup_overtaken_on_a_shared_database_books_nothing_stale";
    let Some(db) = support::postgres::database(test).await else {
        return;
    };
    let overtaken = reconcile_overtaken(setup_on(&db).await, (4, 4), |_| {}).await;
    assert_nothing_stale_booked(overtaken);
    db.drop_schema().await;
    let Some(db) = support::postgres::database(test).await else {
        return;
    };
    let overtaken = reconcile_overtaken(setup_on(&db).await, (-4, 4), |_| {}).await;
    assert_booked_after_the_booked_one(overtaken);
    db.drop_schema().await;
}

/// [`setup`] on PostgreSQL, in `db`'s schema: the record of [`LOST`] says −4.
async fn setup_on(db: &support::postgres::TestDb) -> (FakeGateway, GatewayClient, TestServer) {
    let mut config = test_config();
    config.store = db.store_config(std::time::Duration::from_secs(3600));
    let store = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let gateway = FakeGateway::start().await;
    let looked_up = record("nonce-lost", -4, chrono::Duration::minutes(5));
    gateway.with(|s| s.transactions.insert(LOST.to_owned(), looked_up));
    let client = GatewayClient::new(&gateway.config()).unwrap();
    let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store).await;
    (gateway, client, server)
}

/// The reconcile of a lookup overtaken by the booking of 4 is told booked, and the handler
/// saw the callback's booking only.
fn assert_nothing_stale_booked(
    (outcome, calls, lookups): (Result<Reconciled, ReconcileError>, Vec<support::Seen>, u32),
) {
    assert!(
        matches!(
            outcome,
            Ok(Reconciled::AlreadyBooked(TransactionStatus::Success))
        ),
        "{outcome:?}"
    );
    let callbacks: Vec<_> = calls.iter().filter(|c| c.endpoint == "callback").collect();
    assert_eq!(callbacks.len(), 1, "{calls:?}");
    assert_eq!(callbacks[0].previous_status, None);
    assert_eq!(lookups, 2, "the record is read again under the claim");
}

/// A status the aggregator really moved to after the booked one (read again under the
/// claim, it still says so) is booked, after the booked one.
#[tokio::test]
async fn a_status_the_record_still_holds_when_read_again_is_booked_after_the_booked_one() {
    let overtaken = reconcile_overtaken(setup(-4).await, (-4, 4), |_| {}).await;
    assert_booked_after_the_booked_one(overtaken);
}

/// The reconcile of a lookup overtaken by the booking of 4, whose record still says −4 when
/// read again, booked −4 after 4: the second delivery to reach the handler (the claim given
/// back before any handler ran counted none).
fn assert_booked_after_the_booked_one(
    (outcome, calls, lookups): (Result<Reconciled, ReconcileError>, Vec<support::Seen>, u32),
) {
    assert!(
        matches!(
            outcome,
            Ok(Reconciled::Booked(TransactionStatus::NetworkError))
        ),
        "{outcome:?}"
    );
    let seen: Vec<_> = calls
        .iter()
        .map(|c| (c.previous_status, c.attempt))
        .collect();
    assert_eq!(seen, [(None, 1), (Some(4), 2)]);
    assert_eq!(lookups, 2);
}

/// The record read again under the claim is a third status: that one is reconciled (here,
/// still in progress: nothing booked); and a record that cannot be read again books nothing.
#[tokio::test]
async fn a_record_that_changed_again_or_cannot_be_read_again_books_nothing_stale() {
    let (outcome, calls, _) = reconcile_overtaken(setup(-4).await, (4, 4), |s| {
        s.transactions.insert(
            LOST.to_owned(),
            record("nonce-lost", 3, chrono::Duration::zero()),
        );
    })
    .await;
    assert!(
        matches!(
            outcome,
            Ok(Reconciled::NotFinal(TransactionStatus::Pending))
        ),
        "{outcome:?}"
    );
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (outcome, calls, _) =
        reconcile_overtaken(setup(-4).await, (4, 4), |s| s.transactions.clear()).await;
    assert!(
        matches!(&outcome, Err(ReconcileError::Gateway(e)) if e.status() == Some(404)),
        "{outcome:?}"
    );
    assert_eq!(calls.len(), 1, "{calls:?}");
}

#[tokio::test]
async fn a_pending_transaction_or_an_unknown_reference_books_nothing() {
    let (_gateway, client, server) = setup(3).await;
    let unknown: Uuid = "00000000-0000-0000-0000-000000000001".parse().unwrap();
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap(), unknown])
        .await;
    assert!(
        matches!(
            outcome[0].1,
            Ok(Reconciled::NotFinal(TransactionStatus::Pending))
        ),
        "{outcome:?}"
    );
    assert!(
        matches!(&outcome[1].1, Err(ReconcileError::Gateway(e)) if e.status() == Some(404)),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 0);
}

/// A status the spec does not define (a code the aggregator added since) is handed to the
/// handler, as its callback would be: the handler decides whether it is a result. It was
/// told "not final yet; nothing to book", and a lost result with a new code was dropped.
#[tokio::test]
async fn a_status_the_spec_does_not_define_is_handed_to_the_handler() {
    let (_gateway, client, server) = setup(-7).await;
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap()])
        .await;
    assert!(
        matches!(
            outcome[0].1,
            Ok(Reconciled::Booked(TransactionStatus::Unknown(-7)))
        ),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 1);
}

/// The store fails while the reconciled result is recorded, after its handler ran: whether
/// it was booked is not known (a commit that failed may have happened), and the operator is
/// told to reconcile again, not to book it by hand — it was told "not booked", on which a
/// person books it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_whose_store_failed_is_told_of_unknown_outcome() {
    let gateway = FakeGateway::start().await;
    let mut gated = record("nonce-lost", 4, chrono::Duration::minutes(5));
    gated["merchantClientId"] = json!("gate");
    gateway.with(|s| s.transactions.insert(LOST.to_owned(), gated));
    let client = GatewayClient::new(&gateway.config()).unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("store");
    let store = payhook::store::SledStore::open(&config.store, &[]).unwrap();
    let server = TestServer::start_on(config, data, store.clone()).await;
    let entered = server.merchant.entered_gate.notified();
    let app = server.app.clone();
    let reconciling =
        tokio::spawn(async move { app.reconcile(&client, &[LOST.parse().unwrap()]).await });
    entered.await;
    store.mark_failed_for_tests();
    server.merchant.gate.notify_one();
    let outcome = reconciling.await.unwrap();
    let told = match &outcome[0].1 {
        Err(error @ ReconcileError::OutcomeUnknown(_)) => error.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(
        told.starts_with("outcome unknown (")
            && told.contains("it may have been booked; reconcile again to see")
            && told.contains("do not book it by hand"),
        "{told}"
    );
}

/// A store kept for an hour, opened again with two days: its records reach back an hour,
/// not two days (each was written to expire with the retention of its day). A transaction
/// created three hours ago may have been booked then and its record purged since: neither
/// its reconcile nor its callback is booked again. It was: the horizon was read from the
/// new retention alone. A store opened for the first time with two days vouches for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_retention_does_not_vouch_for_what_the_shorter_one_purged() {
    let hour = std::time::Duration::from_secs(3600);
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("store");
    config.store.retention = hour;
    drop(payhook::store::SledStore::open(&config.store, &[]).unwrap());
    config.store.retention = 48 * hour;
    let store = payhook::store::SledStore::open(&config.store, &[]).unwrap();
    let reach = payhook::store::Store::reach(&store);
    assert!(
        reach <= hour && reach > hour - std::time::Duration::from_secs(60),
        "{reach:?}"
    );

    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.transactions.insert(
            LOST.to_owned(),
            record("nonce-lost", 4, chrono::Duration::hours(3)),
        )
    });
    let client = GatewayClient::new(&gateway.config()).unwrap();
    let server = TestServer::start_on(config, data, store).await;
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap()])
        .await;
    assert!(
        matches!(outcome[0].1, Err(ReconcileError::BeyondRetention { .. })),
        "{outcome:?}"
    );
    let three_hours_ago = (chrono::Utc::now() - chrono::Duration::hours(3)).to_rfc3339();
    let late = with(
        &with(CALLBACK, "/nonce", Some(json!("nonce-lost"))),
        "/updatedUtc",
        Some(json!(three_hours_ago)),
    );
    let late = with(&late, "/createdUtc", Some(json!(three_hours_ago)));
    assert_eq!(server.post_json(CALLBACK_PATH, &late).await.status, 409);
    assert_eq!(callback_count(&server), 0);

    // A new store with the same two days: nothing was written before, it vouches for them.
    let mut fresh = test_config();
    fresh.store.retention = 48 * hour;
    let (_gateway, client, server) = setup_aged(4, chrono::Duration::hours(3), fresh).await;
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap()])
        .await;
    assert!(
        matches!(outcome[0].1, Ok(Reconciled::Booked(_))),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_transaction_older_than_the_retention_is_not_booked_again() {
    // Its callback's record may be purged: a missing record no longer means "never booked".
    let reconcile_aged = |days: i64| async move {
        let mut config = test_config();
        config.store.retention = std::time::Duration::from_secs(40 * 24 * 3600);
        let (gateway, client, server) = setup_aged(4, chrono::Duration::days(days), config).await;
        let outcome = server
            .app
            .reconcile(&client, &[LOST.parse().unwrap()])
            .await;
        (outcome, server, gateway)
    };
    let (outcome, server, _gateway) = reconcile_aged(45).await;
    assert!(
        matches!(&outcome[0].1, Err(ReconcileError::BeyondRetention { .. })),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 0);
    // Created beyond it and changed yesterday (the aggregator records its callbacks'
    // delivery after the booking): the booking may be as old as the creation, its record
    // purged since. It used to be judged by the change, and booked again.
    let mut config = test_config();
    config.store.retention = std::time::Duration::from_secs(40 * 24 * 3600);
    let (gateway, client, server) = setup_aged(4, chrono::Duration::days(1), config).await;
    gateway.with(|s| {
        let created = chrono::Utc::now() - chrono::Duration::days(45);
        s.transactions.get_mut(LOST).unwrap()["createdUtc"] = json!(created.to_rfc3339());
    });
    let outcome = server
        .app
        .reconcile(&client, &[LOST.parse().unwrap()])
        .await;
    assert!(
        matches!(&outcome[0].1, Err(ReconcileError::BeyondRetention { .. })),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 0);
    // Within the retention less a day of clock skew, it is booked.
    let (outcome, server, _gateway) = reconcile_aged(38).await;
    assert!(
        matches!(outcome[0].1, Ok(Reconciled::Booked(_))),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 1);
}

#[tokio::test]
async fn without_a_store_reconcile_refuses_rather_than_book_twice() {
    let (_gateway, client, _server) = setup(4).await;
    let mut config = test_config();
    config.callback.allow_unsigned = true;
    let app = payhook::App::builder(config)
        .callback_receiver(support::TestMerchant::default())
        .without_store()
        .build()
        .unwrap();
    let outcome = app.reconcile(&client, &[LOST.parse().unwrap()]).await;
    assert!(
        matches!(&outcome[0].1, Err(ReconcileError::NoStore)),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_record_with_a_negative_amount_is_refused_not_booked() {
    let (gateway, client, server) = setup(4).await;
    gateway.with(|s| {
        let record = s.transactions.get_mut(LOST).unwrap();
        record["amount"] = json!(-25.5);
    });
    let id: Uuid = LOST.parse().unwrap();
    let outcome = server.app.reconcile(&client, &[id]).await;
    assert!(
        matches!(&outcome[0].1, Err(ReconcileError::Implausible(reason)) if reason.contains("negative")),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 0, "the handler never saw it");
}

/// A change made to the aggregator's record.
type Change = fn(&mut serde_json::Value);

#[tokio::test]
async fn a_record_without_a_time_a_client_or_a_nonce_is_refused_not_booked() {
    // Each change makes a record the lookup may answer, but that is not booked: without a
    // time its booking may be long purged; without a client or with a blank nonce its
    // callback would be refused (400); about another transaction it is not the one asked.
    let cases: [(&str, Change, &str); 7] = [
        (
            "no time",
            |r| {
                r["createdUtc"] = json!(null);
                r.as_object_mut().unwrap().remove("updatedUtc");
            },
            "no createdUtc",
        ),
        (
            // The last change comes after the booking, and says nothing of when it was.
            "only its last change",
            |r| {
                r.as_object_mut().unwrap().remove("createdUtc");
            },
            "no createdUtc",
        ),
        (
            "no client",
            |r| {
                r.as_object_mut().unwrap().remove("merchantClientId");
            },
            "merchantClientId",
        ),
        (
            "blank client",
            |r| r["merchantClientId"] = json!("  "),
            "merchantClientId",
        ),
        ("blank nonce", |r| r["nonce"] = json!(" "), "nonce"),
        ("NUL in nonce", |r| r["nonce"] = json!("n\u{0}1"), "U+0000"),
        (
            "another transaction",
            |r| r["transactionReferenceId"] = json!("0b7e5a52-2f59-4c1e-9d0c-000000000009"),
            "answered with transaction",
        ),
    ];
    let id: Uuid = LOST.parse().unwrap();
    for (case, change, said) in cases {
        let (gateway, client, server) = setup(4).await;
        gateway.with(|s| change(s.transactions.get_mut(LOST).unwrap()));
        let outcome = server.app.reconcile(&client, &[id]).await;
        let error = outcome[0].1.as_ref().expect_err(case);
        assert!(error.to_string().contains(said), "{case}: {error}");
        assert_eq!(
            callback_count(&server),
            0,
            "{case}: the handler never saw it"
        );
    }
}

#[tokio::test]
async fn a_booked_result_is_told_booked_whatever_its_record_lacks() {
    // Its callback was booked; the lookup's record has neither client nor time: it is not
    // booked again, and the operator is told it is booked, not that it failed.
    let (gateway, client, server) = setup(4).await;
    let delivered = with(CALLBACK, "/nonce", Some(json!("nonce-lost")));
    assert_eq!(
        server.post_json(CALLBACK_PATH, &delivered).await.status,
        200
    );
    gateway.with(|s| {
        let record = s
            .transactions
            .get_mut(LOST)
            .unwrap()
            .as_object_mut()
            .unwrap();
        record.remove("merchantClientId");
        record.remove("updatedUtc");
        record.remove("createdUtc");
    });
    let id: Uuid = LOST.parse().unwrap();
    let outcome = server.app.reconcile(&client, &[id]).await;
    assert!(
        matches!(outcome[0].1, Ok(Reconciled::AlreadyBooked(_))),
        "{outcome:?}"
    );
    assert_eq!(callback_count(&server), 1);
}
