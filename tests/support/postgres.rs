//! The PostgreSQL of the tests: `PAYHOOK_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), a schema of its own per test so that tests
//! run in parallel. Where no server answers, a test says it was skipped and why — unless
//! `CI` is set: there, an unreachable server fails it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use payhook::store::StoreConfig;
use sqlx::Connection;

/// The database's address.
pub fn url() -> String {
    std::env::var("PAYHOOK_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema of this test's own in the test database; dropped by [`TestDb::drop_schema`].
#[derive(Debug, Clone)]
pub struct TestDb {
    pub url: String,
    pub schema: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The test database with a fresh schema name, or `None` (announced) when no server answers
/// outside CI. Under CI, panics when the server is unreachable.
pub async fn database(test: &str) -> Option<TestDb> {
    let url = url();
    let reached =
        tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&url)).await;
    match reached {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
        Ok(Err(error)) => return unreachable(test, &error.to_string()),
        Err(_) => return unreachable(test, "no answer within 5 s"),
    }
    let schema = format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        chrono::Utc::now().timestamp_subsec_micros()
    );
    Some(TestDb { url, schema })
}

fn unreachable(test: &str, why: &str) -> Option<TestDb> {
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: PostgreSQL at {} is unreachable ({why}), and CI must run the PostgreSQL tests",
        url()
    );
    super::announce_skip(
        test,
        &format!(
            "PostgreSQL at {} is unreachable ({why}); set PAYHOOK_TEST_DATABASE_URL or start it",
            url()
        ),
    );
    None
}

/// A pool of `max` connections to `url` whose connections start with `options` set (as a
/// merchant's service builds one to give `PgStore::with_pool`).
#[allow(dead_code, reason = "not every test binary builds a pool of its own")]
pub async fn pool_at(url: &str, max: u32, options: &[(&str, &str)]) -> sqlx::PgPool {
    use std::str::FromStr;
    let options = sqlx::postgres::PgConnectOptions::from_str(url)
        .unwrap()
        .options(options.iter().copied());
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .connect_with(options)
        .await
        .unwrap()
}

impl TestDb {
    /// The store settings of this schema, with `retention`.
    pub fn store_config(&self, retention: Duration) -> StoreConfig {
        StoreConfig {
            url: Some(self.url.as_str().into()),
            schema: self.schema.clone(),
            pool_size: 16,
            retention,
            ..StoreConfig::default()
        }
    }

    /// A role of this test's own, no superuser, owning the test's schema, and the database's
    /// address as that role: as a merchant's service connects. It has a password, so that
    /// it logs in however the server authenticates 127.0.0.1 (trust on the project's
    /// machines; a fresh install trusts only `postgres` there, and asks others for one).
    pub async fn own_role(&self) -> (String, String) {
        const PASSWORD: &str = "payhook-test-role";
        let role = format!("{}_role", self.schema);
        let mut conn = self.connect().await;
        sqlx::raw_sql(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'; \
             CREATE SCHEMA {} AUTHORIZATION {role}",
            self.schema
        ))
        .execute(&mut conn)
        .await
        .unwrap();
        let url = self
            .url
            .replacen("postgres@", &format!("{role}:{PASSWORD}@"), 1);
        (role, url)
    }

    /// A connection of its own, for the test's checks.
    pub async fn connect(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.url).await.unwrap()
    }

    /// Returns once `count` (a statement counting rows, e.g. of `pg_locks`) counts one or
    /// more; panics saying `what` never happened after [`super::DEADLINE`], or once
    /// `gave_up()` says the awaited work ended without it.
    #[allow(dead_code, reason = "not every test binary waits on the database")]
    pub async fn until_counted(&self, count: &str, what: &str, gave_up: impl Fn() -> bool) {
        let mut conn = self.connect().await;
        let deadline = tokio::time::Instant::now() + super::DEADLINE;
        loop {
            let (n,): (i64,) = sqlx::query_as(count).fetch_one(&mut conn).await.unwrap();
            if n > 0 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline && !gave_up(),
                "{what} never happened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A connection holding `table` of this schema locked in `mode` (`ACCESS EXCLUSIVE`, …)
    /// in a transaction of its own, until [`Locked::release`] (or the connection's end).
    #[allow(dead_code, reason = "not every test binary locks a table")]
    pub async fn lock(&self, table: &str, mode: &str) -> Locked {
        let mut conn = self.connect().await;
        // Waits at most the tests' deadline for the table: a test whose own transaction
        // holds it fails rather than hangs.
        let lock = format!(
            "BEGIN; SET LOCAL lock_timeout = '{}s'; LOCK TABLE {}.{table} IN {mode} MODE",
            super::DEADLINE.as_secs(),
            self.schema
        );
        sqlx::raw_sql(&lock).execute(&mut conn).await.unwrap();
        Locked(conn)
    }

    /// Removes the schema and everything in it.
    pub async fn drop_schema(&self) {
        let mut conn = self.connect().await;
        sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .execute(&mut conn)
            .await
            .unwrap();
    }
}

/// A table held locked by a test ([`TestDb::lock`]).
#[allow(dead_code, reason = "not every test binary locks a table")]
pub struct Locked(sqlx::PgConnection);

#[allow(dead_code, reason = "not every test binary locks a table")]
impl Locked {
    /// Lets the table go (ROLLBACK).
    pub async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .unwrap();
    }
}
