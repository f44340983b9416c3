//! Awaitable mode on one PostgreSQL database shared by two instances: a validation postponed
//! on one instance is resolved on the other; both instances' outbox workers run, and each
//! result reaches the aggregator once; an instance that dies holding a result's lease (mid
//! post) hands it to the other at once, while one that only loses a connection keeps it; a
//! validation asked about again under new ids, on
//! either instance or on both at once, gets its result posted once under each id.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;

use chrono::Utc;
use payhook::handler::{RequestContext, TransactionValidator, ValidationDecision};
use payhook::model::TransactionValidationRequest;
use payhook::postponed::{Decision, Delivery, PostponedState, Resolved};
use payhook::store::{ConfiguredStore, StoreConfig};
use payhook::{App, Config, HandlerError};
use serde_json::json;
use support::gateway::FakeGateway;
use support::postgres::TestDb;
use support::{TRANSACTION_VALIDATION, VALIDATION_PATH, post, test_config, with};

/// Postpones every validation.
#[derive(Clone)]
struct Reviewer;

impl TransactionValidator for Reviewer {
    async fn validate_transaction(
        &self,
        _: TransactionValidationRequest,
        _: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        Ok(ValidationDecision::Postpone)
    }
}

fn config(gateway: &FakeGateway, store: StoreConfig) -> Config {
    let mut config = test_config();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.validation.retry_schedule = vec![Duration::from_millis(10)];
    config.store = store;
    config
}

/// An instance: an app on the shared database, served on loopback.
async fn instance(gateway: &FakeGateway, db: &TestDb) -> (App, std::net::SocketAddr) {
    let store_config = db.store_config(Duration::from_secs(86_400));
    let store = ConfiguredStore::open(&store_config, &[]).await.unwrap();
    let app = App::builder(config(gateway, store_config))
        .shared_store(store.shared())
        .transaction_validator(Reviewer)
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(
        listener,
        app.clone(),
        std::future::pending(),
    ));
    (app, addr)
}

/// Waits until every validation is recorded as delivered (the record of a delivery follows
/// the aggregator's answer by a moment); fails if they are not within [`support::DEADLINE`].
async fn settle(app: &App) {
    let resolver = app.resolver().unwrap();
    let deadline = tokio::time::Instant::now() + support::DEADLINE;
    loop {
        let all = resolver.list(None).await.unwrap();
        if all.iter().all(|v| v.state() == PostponedState::Delivered) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all delivered: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn validation(nonce: &str, id: i64) -> Vec<u8> {
    let body = with(
        TRANSACTION_VALIDATION,
        "/paymentData/nonce",
        Some(json!(nonce)),
    );
    let body = with(&body, "/validationId", Some(json!(id)));
    post(
        VALIDATION_PATH,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postponed_on_one_instance_resolved_on_another_and_posted_once() {
    let Some(db) = support::postgres::database("awaitable_across_instances").await else {
        return;
    };
    let gateway = FakeGateway::start().await;
    let (one, one_addr) = instance(&gateway, &db).await;
    let (other, other_addr) = instance(&gateway, &db).await;

    // Twenty validations postponed, each on one of the two instances.
    for id in 1..=20 {
        let addr = if id % 2 == 0 { one_addr } else { other_addr };
        let answer = support::exchange(addr, &validation(&format!("aw-{id}"), id)).await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    }
    // Each decided on the instance that did not receive it; the first decision wins
    // whichever instance takes the second.
    for id in 1..=20 {
        let (decider, loser) = if id % 2 == 0 {
            (&other, &one)
        } else {
            (&one, &other)
        };
        let resolved = decider
            .resolver()
            .unwrap()
            .resolve(id, Decision::allow_if(id % 3 != 0, "reviewed"))
            .await
            .unwrap();
        assert_eq!(resolved, Resolved::Recorded);
        assert!(
            loser
                .resolver()
                .unwrap()
                .resolve(id, Decision::allow_if(id % 3 == 0, "too late"))
                .await
                .is_err(),
            "a different decision on the other instance is refused"
        );
    }
    // Both outbox workers run; every result arrives once.
    gateway
        .until("every result posted", |s| s.results.len() == 20)
        .await;
    settle(&one).await;
    let (posts, results) = gateway.with(|s| (s.posts.clone(), s.results.clone()));
    assert_eq!(posts.len(), 20, "each result posted once: {posts:?}");
    for id in 1..=20 {
        assert_eq!(results[&id].0, id % 3 != 0, "validation {id}");
    }
    drop((one, other));
    db.drop_schema().await;
}

/// The app that postpones and decides (its outbox worker never started), served on the
/// shared database, with validations `ids` postponed through it and allowed: their results
/// wait in the outbox.
async fn decided(
    gateway: &FakeGateway,
    store_config: &StoreConfig,
    ids: &[i64],
) -> (ConfiguredStore, App) {
    let decider = ConfiguredStore::open(store_config, &[]).await.unwrap();
    let app = App::builder(config(gateway, store_config.clone()))
        .shared_store(decider.shared())
        .transaction_validator(Reviewer)
        .manual_background()
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(
        listener,
        app.clone(),
        std::future::pending(),
    ));
    for &id in ids {
        let nonce = format!("decided-{id}");
        assert_eq!(
            support::exchange(addr, &validation(&nonce, id))
                .await
                .status,
            200
        );
        app.resolver()
            .unwrap()
            .resolve(id, Decision::allow("ok"))
            .await
            .unwrap();
    }
    (decider, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_leased_by_an_instance_that_died_is_posted_by_another() {
    let Some(db) = support::postgres::database("outbox_lease_of_the_dead").await else {
        return;
    };
    let gateway = FakeGateway::start().await;
    let store_config = db.store_config(Duration::from_secs(86_400));
    let (decider, app) = decided(&gateway, &store_config, &[77]).await;

    // An instance takes the result for posting, then dies before it records the post.
    let doomed = ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap()
        .shared();
    assert_eq!(doomed.outbox_due(Utc::now()).await.unwrap().now.len(), 1);
    let survivor = ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap()
        .shared();
    assert!(
        survivor
            .outbox_due(Utc::now())
            .await
            .unwrap()
            .now
            .is_empty(),
        "a live instance's lease stands"
    );
    drop(doomed);
    let mut taken = false;
    for _ in 0..100 {
        if survivor.outbox_due(Utc::now()).await.unwrap().now.len() == 1 {
            taken = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(taken, "the dead instance's lease was void at once");
    survivor
        .record_delivery(
            77.into(),
            Delivery::Delivered {
                attempts: 1,
                at: Utc::now(),
            },
        )
        .await
        .unwrap();
    assert!(
        survivor
            .outbox_due(Utc::now())
            .await
            .unwrap()
            .now
            .is_empty()
    );
    drop((survivor, app, decider));
    db.drop_schema().await;
}

/// The liveness lock's first key ("payh"), as `src/store/postgres/liveness.rs` names it.
const LIVENESS_KEY: i64 = 0x7061_7968;

/// The backends holding the liveness lock of instance `owner`.
fn liveness_holders(owner: i32) -> String {
    format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
           AND classid = {LIVENESS_KEY}::oid AND objid = {owner}::oid AND objsubid = 2 \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_instance_that_loses_a_connection_keeps_its_lease() {
    // A proxy's idle cut or an operator's pg_terminate_backend ends one of a live
    // instance's connections: if that made it look dead, another instance would post the
    // result it is posting (and run a validation handler it is running) a second time.
    let Some(db) = support::postgres::database("outbox_lease_of_the_living").await else {
        return;
    };
    let gateway = FakeGateway::start().await;
    let store_config = db.store_config(Duration::from_secs(86_400));
    let (decider, app) = decided(&gateway, &store_config, &[78]).await;
    let holder = ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap()
        .shared();
    assert_eq!(holder.outbox_due(Utc::now()).await.unwrap().now.len(), 1);
    let mut conn = db.connect().await;
    let (owner,): (i32,) = sqlx::query_as(&format!(
        "SELECT lease_owner FROM {}.postponed WHERE validation_id = 78",
        db.schema
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let holders: Vec<i32> = sqlx::query_scalar(&liveness_holders(owner))
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(holders.len(), 2, "the lock is held on two connections");
    let (ended,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1, 10000)")
        .bind(holders[0])
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(ended);

    let other = ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap()
        .shared();
    assert!(
        other.outbox_due(Utc::now()).await.unwrap().now.is_empty(),
        "the lease of an instance holding its lock on its other connection stands"
    );
    db.until_counted(
        &format!(
            "SELECT count(*) FILTER (WHERE pid <> {}) / 2 FROM ({}) AS held",
            holders[0],
            liveness_holders(owner)
        ),
        "the lost hold taken again on a new connection",
        || false,
    )
    .await;
    assert!(other.outbox_due(Utc::now()).await.unwrap().now.is_empty());
    drop(holder);
    db.until_counted(
        &format!(
            "SELECT 1 - count(*) FROM ({}) AS held",
            liveness_holders(owner)
        ),
        "the closed instance's holds released",
        || false,
    )
    .await;
    assert_eq!(
        other.outbox_due(Utc::now()).await.unwrap().now.len(),
        1,
        "once the instance is gone, its lease is void"
    );
    drop((other, app, decider, conn));
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_whose_lease_ran_out_and_was_taken_over_is_left_to_its_new_holder() {
    // A long pass (a slow aggregator) outlasts the lease of results it has not posted yet;
    // another instance takes them over. Before each few posts the first asks which it still
    // holds: not those.
    let Some(db) = support::postgres::database("outbox_lease_renewed").await else {
        return;
    };
    let gateway = FakeGateway::start().await;
    let store_config = db.store_config(Duration::from_secs(86_400));
    let (decider, app) = decided(&gateway, &store_config, &[78, 79]).await;
    let first = ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap()
        .shared();
    assert_eq!(first.outbox_due(Utc::now()).await.unwrap().now.len(), 2);
    // 78's lease runs out while the first instance is still busy with others.
    let mut conn = db.connect().await;
    sqlx::query(&format!(
        "UPDATE {}.postponed SET lease_until = now() - interval '1 second' \
         WHERE validation_id = 78",
        db.schema
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let second = ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap()
        .shared();
    let taken = second.outbox_due(Utc::now()).await.unwrap().now;
    assert_eq!(
        taken
            .iter()
            .map(|r| r.validation_id.get())
            .collect::<Vec<_>>(),
        [78]
    );
    let ids = [78.into(), 79.into()];
    assert_eq!(
        first.renew_outbox_leases(&ids).await.unwrap(),
        [79.into()],
        "the first instance still holds 79 only"
    );
    assert_eq!(second.renew_outbox_leases(&ids).await.unwrap(), [78.into()]);

    // The first instance's late outcome for 78 (a post it made before its lease ran out,
    // failed: due again at once) leaves the second's lease alone, and so does an operator's
    // "retry now": a third instance takes 78 only once the second lets it go.
    first
        .record_delivery(
            78.into(),
            Delivery::Queued {
                attempts: 1,
                next_attempt: Utc::now(),
                last_error: Some("503 from the aggregator".into()),
            },
        )
        .await
        .unwrap();
    assert!(first.make_due(78.into(), Utc::now()).await.unwrap());
    let third = ConfiguredStore::open(&store_config, &[])
        .await
        .unwrap()
        .shared();
    assert!(
        third.outbox_due(Utc::now()).await.unwrap().now.is_empty(),
        "the second instance's lease was ended by another"
    );
    assert_eq!(second.renew_outbox_leases(&ids).await.unwrap(), [78.into()]);
    // Nor does a "retry now" on the instance that holds the lease (its outbox posting the
    // result): another instance would post the same attempt beside it.
    assert!(second.make_due(78.into(), Utc::now()).await.unwrap());
    assert!(
        third.outbox_due(Utc::now()).await.unwrap().now.is_empty(),
        "the lease holder's own retry ended its lease"
    );
    drop(conn);
    drop((first, second, third, app, decider));
    db.drop_schema().await;
}

/// Decides slowly (a manual review within the time budget), counting its calls.
#[derive(Clone, Default)]
struct SlowReviewer {
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl TransactionValidator for SlowReviewer {
    async fn validate_transaction(
        &self,
        _: TransactionValidationRequest,
        _: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok(ValidationDecision::Deny {
            message: "limit reached".into(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_waiting_on_another_instance_learns_the_decision_made_elsewhere() {
    let Some(db) = support::postgres::database("decision_made_elsewhere").await else {
        return;
    };
    let gateway = FakeGateway::start().await;
    let reviewer = SlowReviewer::default();
    let mut addresses = Vec::new();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let store_config = db.store_config(Duration::from_secs(86_400));
        let store = ConfiguredStore::open(&store_config, &[]).await.unwrap();
        let mut config = config(&gateway, store_config);
        config.validation.time_budget = Duration::from_secs(5);
        let app = App::builder(config)
            .shared_store(store.shared())
            .transaction_validator(reviewer.clone())
            .build()
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addresses.push(listener.local_addr().unwrap());
        tokio::spawn(payhook::serve(
            listener,
            app.clone(),
            std::future::pending(),
        ));
        apps.push(app);
    }
    // The same validation at both instances at once: one decides, the other waits for it.
    let request = validation("elsewhere-1", 501);
    let (first, second) = tokio::join!(support::exchange(addresses[0], &request), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        support::exchange(addresses[1], &request).await
    });
    for answer in [&first, &second] {
        assert_eq!(
            answer.status,
            403,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        assert!(String::from_utf8_lossy(&answer.body).contains("limit reached"));
    }
    assert_eq!(
        reviewer.calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one handler decided; the copy at the other instance learned its decision"
    );
    drop(apps);
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_asked_again_on_another_instance_gets_its_result_posted_under_each_id() {
    let Some(db) = support::postgres::database("awaitable_asked_again").await else {
        return;
    };
    let gateway = FakeGateway::start().await;
    let (one, one_addr) = instance(&gateway, &db).await;
    let (other, other_addr) = instance(&gateway, &db).await;
    let ask = |addr, id| async move {
        let answer = support::exchange(addr, &validation("aw-again", id)).await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    };
    ask(one_addr, 100).await;
    // Asked again on the other instance, and under a third id on both at once.
    ask(other_addr, 101).await;
    tokio::join!(ask(one_addr, 102), ask(other_addr, 102));
    let original = one.resolver().unwrap().get(100).await.unwrap().unwrap();
    assert_eq!(
        original.repeats,
        [101.into(), 102.into()],
        "each id kept once"
    );

    // Decided through a repeat, on the instance that did not receive the original.
    let resolved = other
        .resolver()
        .unwrap()
        .resolve(101, Decision::deny("documents missing"))
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Recorded);
    gateway
        .until("a result under every id", |s| s.results.len() == 3)
        .await;
    settle(&one).await;
    let (mut posts, results) = gateway.with(|s| (s.posts.clone(), s.results.clone()));
    posts.sort_unstable();
    assert_eq!(
        posts,
        [(100, false, 200), (101, false, 200), (102, false, 200)],
        "each posted once"
    );
    for id in [100, 101, 102] {
        assert_eq!(results[&id], (false, "documents missing".to_owned()));
    }
    drop((one, other));
    db.drop_schema().await;
}
