//! Versioned migrations of payhook's tables, shipped in the crate and applied at open.
//!
//! Each migration is a SQL file under `migrations/`, numbered; `{schema}` in it stands for
//! the configured schema. [`migrate`] applies those the database lacks, each in its own
//! transaction with its row in `{schema}.schema_migrations`, under an advisory lock, so that
//! instances starting together apply each migration once. A database migrated by a newer
//! payhook (a version this one does not know) is refused rather than written to. Beside
//! them, [`migrate`] builds the read indexes the schema lacks (`READ_INDEXES`) and the count
//! of failing callbacks that the database keeps itself (`FAILING_COUNT`), and the tables of
//! held results, of who resolved them and of ended sessions (`HELD_TABLE`, `HELD_BY_TABLE`,
//! `SESSIONS_ENDED_TABLE`), which have no version: an older payhook simply does not use
//! them (and its writes keep the count).

use sqlx::Executor as _;
use sqlx::{Connection, PgConnection, Row};

use super::super::StoreError;

/// A migration: its version, what it does, and its SQL.
struct Migration {
    version: i32,
    description: &'static str,
    sql: &'static str,
}

/// Every migration, in order.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "callbacks, validations, failures, postponed validations, merchant trees",
        sql: include_str!("migrations/0001_tables.sql"),
    },
    Migration {
        version: 2,
        description: "a callback's claim is its booking transaction's advisory lock",
        sql: include_str!("migrations/0002_callback_claims_as_locks.sql"),
    },
    Migration {
        version: 3,
        description: "validation and postponed records as json, which keeps U+0000",
        sql: include_str!("migrations/0003_records_as_json_text.sql"),
    },
    Migration {
        version: 4,
        description: "a claim whose COMMIT waits for a synchronous standby is not taken over",
        sql: include_str!("migrations/0004_no_takeover_of_a_commit_waiting_for_a_standby.sql"),
    },
    Migration {
        version: 5,
        description: "a duplicate is answered once its mark is on the synchronous standby",
        sql: include_str!("migrations/0005_a_duplicate_waits_for_the_standby.sql"),
    },
    Migration {
        version: 6,
        description: "a booking is committed by payhook alone, never by one of its effects",
        sql: include_str!("migrations/0006_a_booking_is_committed_by_payhook_alone.sql"),
    },
];

/// An index that only makes reads cheaper: built when a store opens and finds it missing,
/// with no schema version of its own. A version would make an older payhook refuse the
/// database (it refuses versions it does not know), so that rolling an upgrade back would
/// need a hand-edited `schema_migrations`; an older payhook simply never uses the index.
struct ReadIndex {
    name: &'static str,
    /// What follows `CREATE INDEX name`; `{schema}` stands for the configured schema.
    definition: &'static str,
}

/// Every [`ReadIndex`].
const READ_INDEXES: &[ReadIndex] = &[
    // The validations waiting for a decision, read on their own by a review loop every few
    // seconds among the retention period's delivered ones (30 days by default); those
    // awaiting delivery have `postponed_outbox` and `postponed_queued`, the final ones
    // `postponed_expiry`.
    ReadIndex {
        name: "postponed_pending",
        definition: "ON {schema}.postponed (validation_id) WHERE NOT final AND deliver_at IS NULL",
    },
    // The results waiting for delivery by id, read a page at a time by the operating API
    // and the inspector's outbox panel (every second); `postponed_outbox` has them by the
    // time they fall due.
    ReadIndex {
        name: "postponed_queued",
        definition: "ON {schema}.postponed (validation_id) WHERE deliver_at IS NOT NULL",
    },
    // The validations of a nonce, read when the aggregator asks again about a validated
    // nonce under a new validation id, to find the one that holds its decision. By the
    // nonce's hash: a btree row holds about 2,700 bytes, and a nonce may be longer
    // (`server.max_identifier_chars` up to 4,096 characters), which a btree index refused
    // with the whole validation (`RETIRED_INDEXES`).
    ReadIndex {
        name: "postponed_nonce_hash",
        definition: "ON {schema}.postponed USING hash (nonce)",
    },
    // The results leased to an instance now, a few among an outage's queued thousands,
    // read on every pass of each instance's outbox for when their leases run out.
    ReadIndex {
        name: "postponed_leased",
        definition: "ON {schema}.postponed (lease_until) WHERE lease_until IS NOT NULL",
    },
    // The latest failing callbacks, which the inspector's panel reads every second among
    // an incident's hundreds of thousands.
    ReadIndex {
        name: "callback_failures_latest",
        definition: "ON {schema}.callback_failures (last_failed DESC)",
    },
];

/// Read indexes an earlier payhook built that this one drops at open: `postponed_nonce`, a
/// btree of whole nonces, refused a postponed validation whose nonce it could not hold
/// (index row size, SQLSTATE 54000). A payhook before it builds it again when it opens.
const RETIRED_INDEXES: &[&str] = &["postponed_nonce"];

/// The failing (nonce, status) pairs counted by the database itself, as rows of `callback_
/// failures` come and go, so that `/metrics` and the inspector read the count without a
/// `count(*)` over an incident's hundreds of thousands: each row inserted or deleted adds a
/// row of +1 or −1 to `callback_failures_count` (a row of its own, so that no writer waits
/// on another, nor on a counter row another transaction holds), the count is their sum, and
/// each sweep folds them into one. Built with the rows there are then, while writes to the
/// table wait, in one transaction. No version, like the read indexes: an older payhook
/// ignores the table, and its writes still keep the count.
///
/// Only what goes around the trigger makes it drift (a `TRUNCATE` of `callback_failures`,
/// the trigger dropped by hand). To count again, in one transaction: `LOCK TABLE
/// callback_failures IN SHARE ROW EXCLUSIVE MODE`, `DELETE FROM callback_failures_count`,
/// `INSERT INTO callback_failures_count (n) SELECT count(*) FROM callback_failures`. (Do not
/// drop the table while the trigger stands: failures could not be recorded until the next
/// open builds it again.)
const FAILING_COUNT: &str = "
LOCK TABLE {schema}.callback_failures IN SHARE ROW EXCLUSIVE MODE;
CREATE TABLE {schema}.callback_failures_count (n bigint NOT NULL);
CREATE OR REPLACE FUNCTION {schema}.count_callback_failures() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {schema}.callback_failures_count (n)
    VALUES (CASE WHEN TG_OP = 'INSERT' THEN 1 ELSE -1 END);
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS callback_failures_counted ON {schema}.callback_failures;
CREATE TRIGGER callback_failures_counted AFTER INSERT OR DELETE ON {schema}.callback_failures
  FOR EACH ROW EXECUTE FUNCTION {schema}.count_callback_failures();
INSERT INTO {schema}.callback_failures_count (n) SELECT count(*) FROM {schema}.callback_failures;
";

/// The results the merchant's effects held instead of booking, waiting for a person or
/// resolved by one (see `store::held`): written in a booking's transaction, the unresolved
/// ones listed latest first. No version, like the read indexes: an older payhook ignores
/// the table (and records no held result in it).
const HELD_TABLE: &str = "
CREATE TABLE {schema}.callbacks_held (
    nonce_key    text NOT NULL,
    status       integer NOT NULL,
    nonce        text NOT NULL,
    reason       text NOT NULL,
    held_at      timestamptz NOT NULL,
    reference_id text NOT NULL,
    client_id    text NOT NULL,
    amount       text NOT NULL,
    currency     text NOT NULL,
    resolved_at  timestamptz,
    resolution   text NOT NULL DEFAULT '',
    PRIMARY KEY (nonce_key, status)
);
CREATE INDEX callbacks_held_waiting ON {schema}.callbacks_held (held_at DESC)
    WHERE resolved_at IS NULL;
";

/// Who resolved a held result, as they named themselves (see `HeldCallback::resolved_by`):
/// a table of its own beside [`HELD_TABLE`], built at open like it, so that no store
/// written before it needs its table altered (an `ALTER TABLE` waits for every booking).
const HELD_BY_TABLE: &str = "
CREATE TABLE {schema}.callbacks_held_by (
    nonce_key   text NOT NULL,
    status      integer NOT NULL,
    resolved_by text NOT NULL,
    PRIMARY KEY (nonce_key, status)
);
";

/// The operating API's sessions ended by logging out (see `Store::end_session`), until
/// their life would have ended anyway: every instance refuses them. No version, like
/// [`HELD_TABLE`]: an older payhook ignores the table (and its logouts end a session at its
/// own instance only).
const SESSIONS_ENDED_TABLE: &str = "
CREATE TABLE {schema}.sessions_ended (
    session    text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
";

/// The newest version this payhook knows.
pub(crate) fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Applies the migrations `conn`'s database lacks in `schema`, then builds the read indexes
/// it lacks; returns the versions applied now (empty when it was up to date).
pub(crate) async fn migrate(conn: &mut PgConnection, schema: &str) -> Result<Vec<i32>, StoreError> {
    // Checked here too, whoever made the configuration: the schema is written into every
    // statement, and a `StoreConfig` built in code is not validated on its way.
    if !crate::store::settings::plain_identifier(schema) {
        return Err(StoreError::backend_message(format!(
            "store.schema {}",
            crate::store::settings::PLAIN_IDENTIFIER
        )));
    }
    check_version(conn).await?;
    // A migration takes the time it needs, and so does the wait for another instance's:
    // `store.statement_timeout` bounds a request's statements, and a rewrite of a large
    // table stopped by it would roll back on every start, the service never opening. The
    // connection's own limit, however it was set (a startup option, a pool's SET), is back
    // once migrated, whatever happened.
    let limit: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| StoreError::backend("cannot read the statement timeout", e))?;
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await
        .map_err(|e| StoreError::backend("cannot lift the statement timeout to migrate", e))?;
    let applied = migrate_unbounded(conn, schema).await;
    let reset = sqlx::query("SELECT set_config('statement_timeout', $1, false)")
        .bind(limit)
        .execute(&mut *conn)
        .await;
    let applied = applied?;
    reset.map_err(|e| StoreError::backend("cannot restore the statement timeout", e))?;
    Ok(applied)
}

/// [`migrate`] once its connection's statements are unbounded.
async fn migrate_unbounded(conn: &mut PgConnection, schema: &str) -> Result<Vec<i32>, StoreError> {
    // One instance at a time, whatever schema it migrates: a lock number of our own.
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(format!("payhook migrations {schema}"))
        .execute(&mut *conn)
        .await
        .map_err(|e| StoreError::backend("cannot lock the schema for its migrations", e))?;
    let applied = async {
        let applied = apply_missing(conn, schema).await?;
        build_read_indexes(conn, schema).await?;
        drop_retired_indexes(conn, schema).await?;
        build_failing_count(conn, schema).await?;
        build_held_table(conn, schema).await?;
        super::horizon::build(conn, schema).await?;
        Ok::<_, StoreError>(applied)
    }
    .await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(format!("payhook migrations {schema}"))
        .execute(&mut *conn)
        .await;
    let applied = applied?;
    unlocked.map_err(|e| StoreError::backend("cannot release the migrations' lock", e))?;
    Ok(applied)
}

/// How long a migration waits for a lock on a table it changes before it gives way
/// (`lock_timeout`): while it waits, every request's statement on that table waits behind
/// it, so it waits briefly, lets them through ([`LOCK_PAUSE`]), and tries again.
const LOCK_WAIT: &str = "2s";

/// The pause between two attempts of a migration that could not lock its tables.
const LOCK_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// How many times a migration tries to lock its tables (about 7 minutes) before the open
/// fails.
const LOCK_ATTEMPTS: u32 = 150;

/// Applies `migration` and records it, in one transaction.
async fn apply(
    conn: &mut PgConnection,
    schema: &str,
    migration: &Migration,
) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin().await?;
    let sql = format!(
        "SET LOCAL lock_timeout = '{LOCK_WAIT}'; {}",
        migration.sql.replace("{schema}", schema)
    );
    (&mut *tx).execute(sqlx::raw_sql(&sql)).await?;
    sqlx::query(&format!(
        "INSERT INTO {schema}.schema_migrations (version, description) VALUES ($1, $2)"
    ))
    .bind(migration.version)
    .bind(migration.description)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Whether `error` is a lock not granted within `lock_timeout` (SQLSTATE 55P03).
fn lock_not_available(error: &sqlx::Error) -> bool {
    super::refused_with(error, &["55P03"])
}

/// The oldest server this payhook runs on: a callback's claim is taken over with
/// `pg_terminate_backend(pid, timeout)`, new in PostgreSQL 14.
const OLDEST_SERVER: i32 = 140_000;

/// Refuses a server older than [`OLDEST_SERVER`], before anything is written.
async fn check_version(conn: &mut PgConnection) -> Result<(), StoreError> {
    let version: String = sqlx::query_scalar("SHOW server_version_num")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| StoreError::backend("cannot read the server's version", e))?;
    if supported(&version) {
        Ok(())
    } else {
        Err(StoreError::backend_message(format!(
            "PostgreSQL {version} (server_version_num) is too old: payhook needs PostgreSQL 14 \
             or newer"
        )))
    }
}

/// `true` when `server_version_num` names a server payhook runs on.
fn supported(server_version_num: &str) -> bool {
    server_version_num
        .trim()
        .parse::<i32>()
        .is_ok_and(|number| number >= OLDEST_SERVER)
}

async fn apply_missing(conn: &mut PgConnection, schema: &str) -> Result<Vec<i32>, StoreError> {
    let failed = |what: &str| {
        let what = format!("{what} (schema {schema})");
        move |e: sqlx::Error| StoreError::backend(what, e)
    };
    // A schema a DBA created beforehand needs no right to create one in the database.
    let exists = sqlx::query("SELECT 1 FROM pg_namespace WHERE nspname = $1")
        .bind(schema)
        .fetch_optional(&mut *conn)
        .await
        .map_err(failed("cannot look the schema up"))?
        .is_some();
    if !exists {
        let sql = format!("CREATE SCHEMA IF NOT EXISTS {schema}");
        (&mut *conn)
            .execute(sqlx::raw_sql(&sql))
            .await
            .map_err(failed("cannot create the schema"))?;
    }
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
             version integer PRIMARY KEY,
             description text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    );
    (&mut *conn)
        .execute(sqlx::raw_sql(&sql))
        .await
        .map_err(failed("cannot create the migrations' table"))?;
    let known: Vec<i32> = sqlx::query(&format!(
        "SELECT version FROM {schema}.schema_migrations ORDER BY version"
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(failed("cannot read the applied migrations"))?
    .iter()
    .map(|row| row.try_get::<i32, _>(0))
    .collect::<Result<_, _>>()
    .map_err(failed("cannot read the applied migrations"))?;
    if let Some(newer) = known.iter().find(|v| **v > latest()) {
        return Err(StoreError::backend_message(format!(
            "the database's schema {schema} is at version {newer}, newer than this payhook \
             knows ({}): run the payhook that migrated it, or a newer one",
            latest()
        )));
    }
    let mut applied = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| !known.contains(&m.version)) {
        let mut attempt = 1;
        while let Err(error) = apply(conn, schema, migration).await {
            if !lock_not_available(&error) || attempt >= LOCK_ATTEMPTS {
                return Err(failed(&format!("migration {} failed", migration.version))(
                    error,
                ));
            }
            tracing::info!(
                schema,
                version = migration.version,
                attempt,
                "a store migration waits for requests that hold the tables it changes; trying \
                 again (or apply it with `payhook store migrate` at a quiet time)"
            );
            attempt += 1;
            tokio::time::sleep(LOCK_PAUSE).await;
        }
        tracing::info!(
            schema,
            version = migration.version,
            description = migration.description,
            "store migration applied"
        );
        applied.push(migration.version);
    }
    Ok(applied)
}

/// Builds each [`ReadIndex`] the schema lacks. Building one blocks writes to its table for
/// as long as it takes — once, at the first open after an upgrade: 0.47 s for two million
/// rows of 1 KB records (PostgreSQL 15, a 2-core VM, 2026-11-26) — and reads go on; `CONCURRENTLY` would not block writes, but it waits
/// for every older transaction, among them other instances' waits for the migrations' lock
/// this one holds.
async fn build_read_indexes(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    for index in READ_INDEXES {
        let failed =
            |e| StoreError::backend(format!("cannot build index {schema}.{}", index.name), e);
        let exists = sqlx::query(
            "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
        )
        .bind(schema)
        .bind(index.name)
        .fetch_optional(&mut *conn)
        .await
        .map_err(failed)?
        .is_some();
        if exists {
            continue;
        }
        let definition = index.definition.replace("{schema}", schema);
        let sql = format!("CREATE INDEX IF NOT EXISTS {} {definition}", index.name);
        (&mut *conn)
            .execute(sqlx::raw_sql(&sql))
            .await
            .map_err(failed)?;
        tracing::info!(schema, index = index.name, "store index built");
    }
    Ok(())
}

/// Drops each of [`RETIRED_INDEXES`] the schema holds (after its replacement is built),
/// waiting at most [`LOCK_WAIT`] for its table's lock, as a migration does: requests on the
/// table wait behind the drop meanwhile. One not dropped is said and left for the next
/// open: its replacement serves the reads already.
async fn drop_retired_indexes(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    for name in RETIRED_INDEXES {
        let dropped = async {
            let mut tx = conn.begin().await?;
            let sql = format!(
                "SET LOCAL lock_timeout = '{LOCK_WAIT}'; DROP INDEX IF EXISTS {schema}.{name}"
            );
            (&mut *tx).execute(sqlx::raw_sql(&sql)).await?;
            tx.commit().await
        }
        .await;
        if let Err(error) = dropped {
            tracing::warn!(
                schema,
                index = name,
                %error,
                "a retired index could not be dropped now; the next open tries again"
            );
        }
    }
    Ok(())
}

/// Builds [`FAILING_COUNT`] where the schema lacks it.
async fn build_failing_count(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    if build_table(conn, schema, "callback_failures_count", FAILING_COUNT).await? {
        tracing::info!(schema, "store count of failing callbacks built");
    }
    Ok(())
}

/// Builds [`HELD_TABLE`], [`HELD_BY_TABLE`] and [`SESSIONS_ENDED_TABLE`] where the schema
/// lacks them.
async fn build_held_table(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    if build_table(conn, schema, "callbacks_held", HELD_TABLE).await? {
        tracing::info!(schema, "store table of held results built");
    }
    if build_table(conn, schema, "callbacks_held_by", HELD_BY_TABLE).await? {
        tracing::info!(schema, "store table of who resolved held results built");
    }
    if build_table(conn, schema, "sessions_ended", SESSIONS_ENDED_TABLE).await? {
        tracing::info!(schema, "store table of ended operating API sessions built");
    }
    Ok(())
}

/// Runs `sql` (`{schema}` standing for the schema) in one transaction unless the schema
/// holds table `name` already; `true` when it ran.
async fn build_table(
    conn: &mut PgConnection,
    schema: &str,
    name: &str,
    sql: &str,
) -> Result<bool, StoreError> {
    let failed = |e| StoreError::backend(format!("cannot build {schema}.{name}"), e);
    let exists = sqlx::query(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(schema)
    .bind(name)
    .fetch_optional(&mut *conn)
    .await
    .map_err(failed)?
    .is_some();
    if exists {
        return Ok(false);
    }
    let mut tx = conn.begin().await.map_err(failed)?;
    let sql = sql.replace("{schema}", schema);
    (&mut *tx)
        .execute(sqlx::raw_sql(&sql))
        .await
        .map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::supported;

    #[test]
    fn servers_older_than_14_are_refused() {
        assert!(supported("150020"));
        assert!(supported("140000"));
        assert!(!supported("130015"));
        assert!(!supported("90624"));
        assert!(!supported("not a number"));
    }
}
