//! PostgreSQL goes away under traffic: its connections are killed (`pg_terminate_backend`),
//! once between a handler's return and COMMIT on purpose, and new connections are refused
//! for a while (the role loses LOGIN). Meanwhile every answer is 2xx or 503 with
//! `Retry-After`; afterwards every (nonce, status) is booked exactly once — in the
//! merchant's own SQL tables, written in the mark's transaction (`Effects::postgres`).
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use payhook::handler::{CallbackContext, CallbackDecision, CallbackReceiver};
use payhook::model::CallbackBody;
use payhook::store::{PgStore, StoreConfig};
use payhook::{App, HandlerError};
use rust_decimal::Decimal;
use sqlx::Row;
use support::*;
use tokio::sync::{Notify, mpsc};

const CALLBACKS: usize = 400;
const SENDERS: usize = 16;

/// Books each result into the merchant's own tables, in payhook's transaction; the first
/// delivery of nonce `pause` stops after writing, until the test lets it go on to COMMIT.
struct Books {
    schema: String,
    reached: mpsc::UnboundedSender<()>,
    go: Arc<Notify>,
    paused_once: Arc<AtomicBool>,
}

impl CallbackReceiver for Books {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        let schema = self.schema.clone();
        let pause = callback.nonce == "pause" && !self.paused_once.swap(true, Ordering::SeqCst);
        let (reached, go) = (self.reached.clone(), Arc::clone(&self.go));
        ctx.effects.postgres(move |conn| {
            let (schema, callback) = (schema.clone(), callback.clone());
            let (reached, go) = (reached.clone(), Arc::clone(&go));
            Box::pin(async move {
                sqlx::query(&format!(
                    "INSERT INTO {schema}.ledger (nonce, status, client, amount) VALUES ($1, $2, $3, $4::numeric)"
                ))
                .bind(&callback.nonce)
                .bind(callback.transaction_status.code())
                .bind(&callback.client_id)
                .bind(callback.amount.to_string())
                .execute(&mut *conn)
                .await?;
                sqlx::query(&format!(
                    "INSERT INTO {schema}.balances (client, total) VALUES ($1, $2::numeric) \
                     ON CONFLICT (client) DO UPDATE SET total = balances.total + EXCLUDED.total"
                ))
                .bind(&callback.client_id)
                .bind(callback.amount.to_string())
                .execute(&mut *conn)
                .await?;
                if pause {
                    let _ = reached.send(());
                    go.notified().await;
                }
                Ok(())
            })
        });
        Ok(CallbackDecision::Ack)
    }
}

fn body(i: usize) -> String {
    let nonce = if i == 0 {
        "pause".to_owned()
    } else {
        format!("away-{i:04}")
    };
    CALLBACK
        .replace("\"nonce-cb-1\"", &format!("\"{nonce}\""))
        .replace("\"amount\": 0.1", &format!("\"amount\": {}.25", i + 1))
        .replace(
            "\"clientId\": \"client-42\"",
            &format!("\"clientId\": \"client-{}\"", i % 7),
        )
}

#[derive(Default)]
struct Seen {
    unavailable: AtomicUsize,
    wrong: Mutex<Vec<String>>,
    acknowledged: AtomicUsize,
}

async fn deliver(addr: std::net::SocketAddr, request: &[u8], seen: &Seen) {
    loop {
        let answer = tokio::time::timeout(DEADLINE, exchange(addr, request)).await;
        match answer {
            Ok(answer) if answer.status == 200 => return,
            Ok(answer) if answer.status == 503 && answer.header("retry-after").is_some() => {
                seen.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            Ok(answer) => seen.wrong.lock().unwrap().push(format!(
                "{} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )),
            Err(_) => seen.wrong.lock().unwrap().push("no answer in time".into()),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn admin(db: &support::postgres::TestDb, sql: &str) {
    let mut conn = db.connect().await;
    sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_and_refused_answer_503_and_lose_nothing() {
    let Some(db) = support::postgres::database("the_database_going_away").await else {
        return;
    };
    // A role of the test's own, whose connections can be killed and refused.
    let (role, url) = db.own_role().await;
    admin(
        &db,
        &format!(
            "CREATE TABLE {s}.ledger (nonce text, status int, client text, amount numeric, \
               PRIMARY KEY (nonce, status)); \
             CREATE TABLE {s}.balances (client text PRIMARY KEY, total numeric NOT NULL); \
             ALTER TABLE {s}.ledger OWNER TO {role}; ALTER TABLE {s}.balances OWNER TO {role};",
            s = db.schema
        ),
    )
    .await;
    let store_config = StoreConfig {
        url: Some(url.as_str().into()),
        schema: db.schema.clone(),
        pool_size: 8,
        connect_timeout: Duration::from_secs(1),
        ..StoreConfig::default()
    };
    let store = PgStore::open(&store_config, &[]).await.unwrap();
    let (reached_tx, mut reached) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let mut config = test_config();
    config.store = store_config;
    config.callback.retry_after = Duration::from_secs(1);
    let app = App::builder(config)
        .store(store)
        .callback_receiver(Books {
            schema: db.schema.clone(),
            reached: reached_tx,
            go: Arc::clone(&go),
            paused_once: Arc::default(),
        })
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));

    let requests: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..CALLBACKS)
            .map(|i| {
                post(
                    CALLBACK_PATH,
                    &[("Content-Type", "application/json")],
                    body(i).as_bytes(),
                )
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Seen::default());
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (requests, next, seen) =
                (Arc::clone(&requests), Arc::clone(&next), Arc::clone(&seen));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(request) = requests.get(i) else {
                        return;
                    };
                    deliver(addr, request, &seen).await;
                    seen.acknowledged.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();

    let kill =
        format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'");
    // Between the handler's return and COMMIT: the rows are written, the transaction open.
    if tokio::time::timeout(DEADLINE, reached.recv())
        .await
        .is_err()
    {
        panic!(
            "the paused delivery never reached its effect; answers: {:?}",
            seen.wrong
                .lock()
                .unwrap()
                .iter()
                .take(3)
                .collect::<Vec<_>>()
        );
    }
    admin(&db, &kill).await;
    go.notify_waiters();
    // Killed again under traffic, twice.
    for _ in 0..2 {
        let at = seen.acknowledged.load(Ordering::SeqCst) + 60;
        while seen.acknowledged.load(Ordering::SeqCst) < at.min(CALLBACKS - 50) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        admin(&db, &kill).await;
    }
    // Refused for a while: no new connection, the open ones killed.
    admin(&db, &format!("ALTER ROLE {role} NOLOGIN")).await;
    admin(&db, &kill).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = seen.acknowledged.load(Ordering::SeqCst);
    admin(&db, &format!("ALTER ROLE {role} LOGIN")).await;

    for sender in senders {
        tokio::time::timeout(Duration::from_secs(120), sender)
            .await
            .unwrap()
            .unwrap();
    }
    let wrong = seen.wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "answers other than 200 or 503 with Retry-After: {wrong:?}"
    );
    assert!(
        seen.unavailable.load(Ordering::Relaxed) > 0,
        "the database's absence was answered 503"
    );
    assert!(during < CALLBACKS, "the outage fell within the traffic");

    let mut conn = db.connect().await;
    let s = &db.schema;
    let booked: i64 = sqlx::query(&format!("SELECT count(*) FROM {s}.ledger"))
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        booked,
        i64::try_from(CALLBACKS).unwrap(),
        "each result booked once"
    );
    let marked: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {s}.callbacks WHERE done = ARRAY[4]"
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap()
    .get(0);
    assert_eq!(marked, i64::try_from(CALLBACKS).unwrap());
    let paused: i64 = sqlx::query(&format!(
        "SELECT count(*) FROM {s}.ledger WHERE nonce = 'pause'"
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        paused, 1,
        "the transaction cut before COMMIT wrote nothing; its retry did"
    );
    let rows = sqlx::query(&format!(
        "SELECT b.client, b.total::text, (SELECT sum(amount)::text FROM {s}.ledger l WHERE l.client = b.client) \
         FROM {s}.balances b"
    ))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows.len(), 7);
    for row in rows {
        let (client, total, sum): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(
            total.parse::<Decimal>().unwrap(),
            sum.parse::<Decimal>().unwrap(),
            "{client}: the balance is the sum of its entries"
        );
    }
    support::announce(&format!(
        "the database going away: {CALLBACKS} results booked once each; {} answers 503 with Retry-After meanwhile",
        seen.unavailable.load(Ordering::Relaxed)
    ));
    drop(conn);
    db.drop_schema().await;
    admin(&db, &format!("DROP ROLE {role}")).await;
}

/// A server or role that closes sessions idle in a transaction (here after 100 ms) does not
/// end a claim: its transaction idles while the handler runs, and closed, it let a retry's
/// handler run beside the first one, whose booking then failed. payhook's connections turn
/// the limit off for themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_outlives_an_idle_in_transaction_limit_of_the_database() {
    let Some(db) = support::postgres::database("idle_in_transaction").await else {
        return;
    };
    let (role, url) = db.own_role().await;
    admin(
        &db,
        &format!("ALTER ROLE {role} SET idle_in_transaction_session_timeout = '100ms'"),
    )
    .await;
    let mut config = test_config();
    config.store = StoreConfig {
        url: Some(url.into()),
        ..db.store_config(Duration::from_secs(3600))
    };
    let store = PgStore::open(&config.store, &[]).await.unwrap();
    let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store).await;
    let body = with(CALLBACK, "/clientId", Some(serde_json::json!("gate")));
    let request = post(
        CALLBACK_PATH,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    let first = tokio::spawn({
        let (addr, request) = (server.addr, request.clone());
        async move { exchange(addr, &request).await }
    });
    tokio::time::timeout(DEADLINE, server.merchant.entered_gate.notified())
        .await
        .unwrap();
    // The claim's transaction idles five times the role's limit while the handler runs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.merchant.gate.notify_one();
    let first = tokio::time::timeout(DEADLINE, first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.status, 200, "{}", first.message());
    let retry = exchange(server.addr, &request).await;
    assert_eq!(retry.status, 200, "{}", retry.message());
    assert_eq!(retry.message(), "callback already processed");
    assert_eq!(server.merchant.calls().len(), 1, "the handler ran once");
    drop(server);
    db.drop_schema().await;
    admin(&db, &format!("DROP ROLE {role}")).await;
}

/// A server or role that closes idle sessions (`idle_session_timeout`, here after 100 ms)
/// does not close the connections holding an instance's liveness lock, whether payhook's
/// own pool or a merchant's ([`PgStore::with_pool`]) opens them. They idle between their
/// checks: closed so, the instance looked dead to the others (which take a dead instance's
/// validation claims and result leases over) for all but a moment after each check. (A
/// pooled connection closed so is replaced when a callback takes it: the callbacks pass
/// either way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_outlive_an_idle_session_limit_of_the_database() {
    for merchants_pool in [false, true] {
        let Some(db) = support::postgres::database("idle_session").await else {
            return;
        };
        let (role, url) = db.own_role().await;
        admin(
            &db,
            &format!("ALTER ROLE {role} SET idle_session_timeout = '100ms'"),
        )
        .await;
        let mut config = test_config();
        config.store = StoreConfig {
            url: Some(url.clone().into()),
            ..db.store_config(Duration::from_secs(3600))
        };
        let store = if merchants_pool {
            let pool = support::postgres::pool_at(&url, 8, &[]).await;
            PgStore::with_pool(pool, &config.store, &[]).await.unwrap()
        } else {
            PgStore::open(&config.store, &[]).await.unwrap()
        };
        let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store).await;
        let mut conn = db.connect().await;
        let holders = liveness_holders(&mut conn, &role).await;
        assert_eq!(holders.len(), 2, "the lock is held on two connections");
        for nonce in ["idle-1", "idle-2", "idle-3"] {
            let body = with(CALLBACK, "/nonce", Some(serde_json::json!(nonce)));
            let request = post(
                CALLBACK_PATH,
                &[("Content-Type", "application/json")],
                body.as_bytes(),
            );
            let answer = exchange(server.addr, &request).await;
            assert_eq!(answer.status, 200, "{nonce}: {}", answer.message());
            // Every connection idles ten times the role's limit; the three together outlast
            // the liveness lock's check (every 2 s).
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(
            liveness_holders(&mut conn, &role).await,
            holders,
            "the same two connections hold the lock (merchant's pool: {merchants_pool})"
        );
        assert_eq!(server.merchant.calls().len(), 3);
        drop((server, conn));
        db.drop_schema().await;
        admin(&db, &format!("DROP ROLE {role}")).await;
    }
}

/// The sessions of role `role` holding a liveness lock.
async fn liveness_holders(conn: &mut sqlx::PgConnection, role: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND l.granted AND l.classid = x'70617968'::int::oid \
           AND a.usename = $1 ORDER BY l.pid",
    )
    .bind(role)
    .fetch_all(conn)
    .await
    .unwrap()
}
