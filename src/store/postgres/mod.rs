//! The shared store: PostgreSQL, for a service of more than one instance (feature
//! `postgres`).
//!
//! Every instance opens the same database; what one instance records, every other sees.
//!
//! * **Deduplication.** `callbacks` and `validations` hold what was acknowledged or decided.
//!   A callback's claim is the transaction that will book it: one round trip begins it and
//!   takes a transaction advisory lock on the nonce (`{schema}.claim_callback`, a try-lock:
//!   it never waits), then reads the nonce's record in a new snapshot, which sees what the
//!   lock's previous holder committed. The handler runs while the transaction is open; its
//!   effects, the mark and COMMIT follow on the same connection ([`claim`]). Two
//!   deliveries of one nonce at two instances therefore run one handler, and the other
//!   waits for it (trying again) or answers 503 with `Retry-After`. A claim lives as long
//!   as its connection: an instance that dies gives its claims up at once. A claim held
//!   past `stale_after` by the database's clock (the transaction's start) is taken over:
//!   the claimant terminates the holder's session (`pg_terminate_backend`, which needs the
//!   instances to connect as one role), whose transaction then writes nothing. Each
//!   callback in flight holds a pooled connection from its claim to its COMMIT, so
//!   `store.pool_size` bounds the callbacks handled at once on an instance (all but two
//!   connections, in the order they came: see [`claim`]). The lock is
//!   named by a 64-bit hash of the schema and the nonce: two services in two schemas never
//!   block each other, and two nonces whose hashes collide only wait for each other.
//!   A validation's claim is a row of `validation_claims` (UNLOGGED: a claim needs no
//!   durability, so claiming writes no WAL): a lease taken and judged by the database's
//!   clock (`now()`), so that an instance whose clock is off can neither steal a live claim
//!   nor keep a dead one. It also names the instance that holds it, and every instance
//!   holds a session advisory lock of its own for as long as it lives, shared on two
//!   connections of its own (`liveness`; a connection that drops is replaced, and the
//!   other holds meanwhile): a claim whose instance holds its lock on no connection is
//!   taken over at once instead of after its lease.
//! * **The merchant's rows commit with the mark.** A callback's mark, the removal of its
//!   failure record and every effect the handler staged run in one transaction; 200 is
//!   sent only after COMMIT. Effects on the merchant's declared trees
//!   ([`EffectTx`](crate::store::EffectTx)) are rows of `{schema}.trees`, and a read of a
//!   key in an effect takes a transaction-scoped lock on that key (`pg_advisory_xact_lock`)
//!   before reading it, so that concurrent read-modify-writes of one balance — a key that
//!   exists or one that does not yet — are serialised: row locks, not SERIALIZABLE. SQL of
//!   the merchant's own ([`Effects::postgres`](crate::store::Effects::postgres)) runs on the
//!   same connection. A deadlock or serialization failure (SQLSTATE 40P01, 40001) retries
//!   the whole transaction, up to [`TX_ATTEMPTS`] times; effects therefore may run more
//!   than once, and must write only through the transaction. (Not where another status of
//!   the nonce was booked between the two transactions: the handler staged its effects
//!   told of the status booked before, so the delivery answers 503, and its retry's handler
//!   is told what is booked now.) Only payhook commits it: the
//!   claim declares the transaction a booking (`payhook.booking`), and a deferred trigger
//!   on the mark's row refuses any other COMMIT (migration 6), so that an effect's own
//!   `commit()` cannot acknowledge the callback with its effects half run.
//! * **Awaitable.** Postponed validations and their results are rows of
//!   `{schema}.postponed`; a decision locks its row (`FOR UPDATE`), so the first decision
//!   wins whichever instance takes it. Each instance's outbox worker leases the results due
//!   (`FOR UPDATE SKIP LOCKED`, a lease of [`OUTBOX_LEASE`] on the database's clock), so
//!   one instance at a time posts a result; the lease of an instance that dies mid-post is
//!   void at once (its liveness lock is gone, as for claims), and another instance posts
//!   the result; a lease of a live instance that stalls runs out after [`OUTBOX_LEASE`].
//! * **Retention** purges expired rows in batches of [`PURGE_BATCH`], each its own short
//!   statement, so that no lock is held long.
//! * **Durability.** Every connection sets `synchronous_commit = on`: a COMMIT returns once
//!   the database's WAL is flushed on its primary. With asynchronous replication, a failover
//!   to a replica loses what the replica had not received — acknowledged callbacks among
//!   it, which the aggregator will not resend; use synchronous replication
//!   (`synchronous_standby_names` with `synchronous_commit = on` or `remote_apply`) where a
//!   failover must lose nothing. A COMMIT waits for the standby however long it takes
//!   (`store.statement_timeout` ends before the commit itself begins), and a claim whose
//!   COMMIT waits so is not taken over (migration 4): terminating it would not undo the
//!   commit. A duplicate is answered only once the mark it was answered from is on the
//!   standby (migration 5): a mark can be on the primary alone — its transaction's wait was
//!   cancelled, its backend crashed, or it began waiting just as another instance took its
//!   claim over — so with synchronous replication on, the claim that reads an acknowledged
//!   status writes a transactional logical message (`pg_logical_emit_message`, prefix
//!   `payhook`; for a role the function is revoked from, it rewrites the nonce's row as it
//!   is), and its COMMIT waits for the standby before the duplicate's 200. A validation's
//!   recorded decision is answered again the same way (`on_the_standby`).
//!
//! The schema is created and migrated at open ([`schema`]); see the README for its tables.
//!
//! ## What it costs
//!
//! `cargo run --release --example bench_callbacks -- 5 postgres` measures payhook on
//! PostgreSQL (P: the mark with a ledger entry and a balance upsert in SQL, 16 pooled
//! connections) against the same database work straight from Rust (Q: one transaction of
//! three statements, the engine's ceiling on the machine). A callback's transaction needs
//! the claim (which writes the mark), the merchant's two statements, and COMMIT, which
//! also BEGINs the next claim's transaction on the same connection, kept for it
//! ([`claim`]) where sqlx would test a pooled connection with a round trip of its own: two
//! round trips fewer per transaction than Q's. On a 2-core VM with the database on the
//! same cores, P reached 0.75–0.83 of Q in four consecutive runs on 2026-11-25 (target
//! 0.60), with p99 17–22 ms (target 25); both are CPU-bound. On 2026-11-29 the same machine
//! ran the database slower (Q 3,855–4,784 transactions/s), and five runs gave P/Q 0.52–0.75
//! with p99 31–45 ms, before and after that day's changes alike: the targets did not hold
//! in most runs. Three runs later that day, once a claim on payhook's own pool no longer
//! spent a statement on `synchronous_commit`, gave P/Q 0.65–0.69 and p99 27–28 ms (README,
//! Performance). Measured with pgbench on the same
//! machine, the database side of P's transaction runs at about 0.8 of Q's (the claim's
//! lock and read); the rest is the service's own CPU, which shares the two cores with the
//! database: verification, HTTP, and the client side of the round trips (sqlx, TLS,
//! tokio's wake-ups, the kernel's loopback: a send to PostgreSQL runs the receiving side's
//! network stack and wakes its backend).

mod claim;
mod dedup;
mod horizon;
mod import;
mod liveness;
mod postponed;
mod schema;
mod trees;

use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use import::Imported;

use super::effects::{Tree, check_declared};
use super::failing::readable;
use super::horizon::Opener;
use super::{KeyValue, StoreConfig, StoreError, StoreFuture, keys};

/// The keys (as `keys::identifier` names them: the nonce, or the digest's for a long one) of
/// the nonces whose postponed validation still waits for its decision or its delivery: their
/// validation record is kept past its retention, since a new validation of the nonce would
/// run the handler again. The purge keeps them; a copy from sled brings them over.
macro_rules! awaiting_nonce_keys {
    () => {
        "SELECT CASE WHEN octet_length(convert_to(p.nonce, 'UTF8')) <= 64 THEN p.nonce \
           ELSE 'sha256:' || encode(sha256(convert_to(p.nonce, 'UTF8')), 'hex') END \
           FROM {s}.postponed p WHERE (NOT p.final AND p.deliver_at IS NULL) OR p.deliver_at IS NOT NULL"
    };
}
use awaiting_nonce_keys;

/// How long after this instance records a growth of the retention it counts: two of its
/// sweeps, at each of which an instance still writing with the shorter retention moves the
/// record back — one that stopped before its next sweep wrote nothing after that (the
/// instances share `store.sweep_interval`).
fn settle_of(sweep_interval: Duration) -> Duration {
    sweep_interval.saturating_mul(2)
}

/// Attempts of a transaction that meets a deadlock or a serialization failure.
pub const TX_ATTEMPTS: u32 = 5;

/// How long an instance holds a result it is posting before another may take it over.
pub const OUTBOX_LEASE: Duration = Duration::from_secs(60);

/// Rows removed by one statement of a purge.
pub const PURGE_BATCH: i64 = 500;

/// The database's clock, the latest expiry the schema holds, and the step of the clock it
/// keeps (see [`crate::store::horizon::PurgeClock`]; read once a sweep, and where a check
/// between sweeps finds the clock stepped, another instance's step kept, or a change of
/// its own still to be written: `postponed` is indexed by expiry only where final,
/// `sessions_ended` not at all).
const LATEST_EXPIRY: &str = "SELECT now(), greatest(\
     (SELECT max(expires_at) FROM {s}.callbacks), \
     (SELECT max(expires_at) FROM {s}.validations), \
     (SELECT max(expires_at) FROM {s}.validation_claims), \
     (SELECT max(expires_at) FROM {s}.callback_failures), \
     (SELECT max(expires_at) FROM {s}.postponed), \
     (SELECT max(expires_at) FROM {s}.sessions_ended)), \
     (SELECT record FROM {s}.clock_step)";

/// How often a sweeper reads the database's clock between sweeps. Records are written by
/// the database's clock, in statements that do not look at the sweeper's: a step caught at
/// the next sweep alone, an interval after it (an hour by default), left every instance
/// that crashed meanwhile, having written by the stepped clock, to purge by it when it
/// started again. Read this often, a step is kept at most this long after it, for one
/// query a minute per instance ([`CLOCK_NOW`]).
const CLOCK_CHECK: Duration = Duration::from_secs(60);

/// The database's clock and the step of the clock the schema keeps: what a check between
/// sweeps reads, [`LATEST_EXPIRY`] only where it finds the clock stepped, the step kept
/// changed by another instance, or a change of its own still to be written.
const CLOCK_NOW: &str = "SELECT now(), (SELECT record FROM {s}.clock_step)";

/// Results one outbox pass leases at most ([`super::DUE_BATCH`]).
const OUTBOX_BATCH: i64 = super::DUE_BATCH as i64;

/// The PostgreSQL store. Cheap to clone: clones share the pool.
///
/// ```no_run
/// use payhook::store::{PgStore, StoreConfig};
///
/// # async fn open() -> Result<(), payhook::store::StoreError> {
/// let config = StoreConfig {
///     url: Some("postgres://payhook@db.internal/payments?sslmode=verify-full".into()),
///     ..StoreConfig::default()
/// };
/// let store = PgStore::open(&config, &["ledger_entries", "ledger_balances"]).await?;
/// let balances = store.tree("ledger_balances")?;
/// let balance = store.get(&balances, b"client-42|EUR").await?;
/// # let _ = balance;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    trees: Vec<String>,
    retention: Duration,
    /// What the schema's records reach back to (see [`horizon`]), as read last.
    vouched: std::sync::Mutex<crate::store::horizon::Vouched>,
    /// Whether this instance serves (and moves the record on at each sweep).
    opener: Opener,
    /// How long after it is recorded a growth of the retention counts ([`settle_of`]).
    settle: Duration,
    /// This instance's number in claims (`liveness.owner`, the second key of its liveness
    /// lock); its holds let go when the store is dropped.
    liveness: liveness::Liveness,
    sweeper: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The callbacks this instance has claimed and not yet booked or released.
    claims: claim::HeldClaims,
    /// The statement of a callback's claim, made once for the schema (it runs per claim).
    claim_sql: String,
    /// Each booking's write and COMMIT (one booking per transaction).
    commit_metrics: crate::store::CommitMetrics,
    /// When this instance last folded the count of failing callbacks' rows (see
    /// [`PgStore::fold_failing_count`]).
    count_folded: std::sync::Mutex<Option<std::time::Instant>>,
    /// Test-only: holds a callback's booking between a transaction that met a deadlock
    /// and the claim of the next.
    #[cfg(test)]
    between_tries: tests::Hold,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .sweeper
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// Test-only: one of [`PgStore::indexed_reads`].
#[doc(hidden)]
#[derive(Debug)]
pub struct IndexedRead {
    /// The index the statement must be planned through.
    pub index: &'static str,
    /// The statement, with its schema, as the store sends it.
    pub sql: String,
    /// Each parameter's type and a value to plan it with.
    pub parameters: &'static [(&'static str, &'static str)],
    /// The index condition the scan must begin at, where it must not read the rows before
    /// it (a page after a cursor).
    pub condition: Option<&'static str>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.inner.schema)
            .field("trees", &self.inner.trees)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `config.url` with a pool of `config.pool_size`, applies the migrations
    /// the database lacks, and declares the merchant's `trees` that callback effects may
    /// write. Starts the retention sweeper on the current tokio runtime. Besides the pool,
    /// the store keeps two connections of its own holding its liveness lock (three for a
    /// moment while it replaces one that stopped answering), and opens one more while it
    /// migrates and, during a copy from sled, one for the copy's lock.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when `store.url` is unset or unusable, the database cannot be
    /// reached, a copy from sled holds the schema (`payhook store copy-from-sled`; start
    /// again once it has finished), or a migration fails.
    pub async fn open(config: &StoreConfig, trees: &[&str]) -> Result<Self, StoreError> {
        Self::open_as(config, trees, Opener::Service).await
    }

    /// [`PgStore::open`] for a copy into the schema ([`PgStore::import_sled`]): an open that
    /// reads the schema's record of the retention its records were written with and never
    /// moves it, at open or at a sweep, as an operator's command does — the copy writes what
    /// sled's records reach back to instead, whatever `config.retention` says.
    ///
    /// # Errors
    ///
    /// As [`PgStore::open`].
    pub async fn open_for_copy(config: &StoreConfig) -> Result<Self, StoreError> {
        Self::open_as(config, &[], Opener::Operator).await
    }

    /// [`PgStore::open`] for an operator's command, which reads the schema's record of its
    /// retention and does not move it (see `horizon`).
    pub(crate) async fn open_for_operator(
        config: &StoreConfig,
        trees: &[&str],
    ) -> Result<Self, StoreError> {
        Self::open_as(config, trees, Opener::Operator).await
    }

    async fn open_as(
        config: &StoreConfig,
        trees: &[&str],
        opener: Opener,
    ) -> Result<Self, StoreError> {
        let pool = connect(config, config.pool_size).await?;
        if let Some(host) = config
            .url
            .as_ref()
            .and_then(|url| unverified_remote(url.expose()))
        {
            tracing::warn!(
                host = %crate::Logged(&host),
                "store.url reaches PostgreSQL on another machine without checking its \
                 certificate (sslmode is not verify-full or verify-ca): the ledger's rows and \
                 every COMMIT may cross the network in the clear, or to whoever answers at that \
                 address; add ?sslmode=verify-full&sslrootcert=/path/ca.pem to store.url"
            );
        }
        Self::over(pool, config, trees, (claim::Begin::OwnPool, opener)).await
    }

    /// The store over a pool the service already has (its own queries share the
    /// connections); `config.url` and the pool settings are not used. A callback's booking
    /// is READ COMMITTED and commits synchronously whatever the pool's defaults; the other
    /// records (validations, postponed results) follow the pool's, which should commit
    /// synchronously too (`synchronous_commit = on`, PostgreSQL's default). The connections
    /// must not be closed for idling in a transaction (`idle_in_transaction_session_timeout
    /// = 0`, the default; a claim's transaction idles while its handler runs): one that is
    /// set is warned of at open. The connections the store keeps to hold its liveness lock
    /// (see [`PgStore::open`]) are detached from the pool, which opens others in their place:
    /// the pool's connections and these together may exceed its `max_connections` by two
    /// or three. They turn `idle_session_timeout` off for themselves.
    ///
    /// # Errors
    ///
    /// As [`PgStore::open`].
    pub async fn with_pool(
        pool: PgPool,
        config: &StoreConfig,
        trees: &[&str],
    ) -> Result<Self, StoreError> {
        Self::over(
            pool,
            config,
            trees,
            (claim::Begin::GivenPool, Opener::Service),
        )
        .await
    }

    /// The store over `pool`, its claims' transactions begun by `begin`, opened by `opener`.
    async fn over(
        pool: PgPool,
        config: &StoreConfig,
        trees: &[&str],
        (begin, opener): (claim::Begin, Opener),
    ) -> Result<Self, StoreError> {
        crate::store::effects::check_tree_names(trees)?;
        let schema = config.schema.clone();
        // Before the migrations: a copy from sled holding the schema refuses the store
        // before it writes anything (the migrations' locks would stall the copy).
        let liveness = liveness::hold(&pool, &schema).await?;
        // Taken out of the pool: an open given up mid-way (its future dropped) closes it
        // with its statements unbounded and the migrations' lock held or awaited, rather
        // than hand it so to the pool's next user.
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| StoreError::backend("cannot connect to PostgreSQL (store.url)", e))?
            .detach();
        schema::migrate(&mut conn, &schema).await?;
        let vouched = horizon::at_open(
            &mut conn,
            &schema,
            config.retention,
            (opener, settle_of(config.sweep_interval)),
        )
        .await?;
        let retention = crate::store::horizon::writes_with(&vouched, config.retention, opener);
        let idle_limit: String =
            sqlx::query_scalar("SELECT current_setting('idle_in_transaction_session_timeout')")
                .fetch_one(&mut conn)
                .await?;
        if idle_limit != "0" {
            tracing::warn!(
                idle_in_transaction_session_timeout = %idle_limit,
                "the pool's connections are closed after idling in a transaction: a claim idles \
                 so while its handler runs, and closed, a retry's handler runs beside it and its \
                 booking fails; set idle_in_transaction_session_timeout = 0 on the pool's \
                 connections (PgStore::open does)"
            );
        }
        if let Err(error) = sqlx::Connection::close(conn).await {
            tracing::debug!(error = %crate::report::InLine(&error), "the migrations' connection closed uncleanly");
        }
        let pool_size = pool.options().get_max_connections();
        let claim_sql = format!(
            "SELECT claimed, acknowledged, previous, attempts, failing, \
             txid_current_if_assigned(), set_config('payhook.booking', 'held', true) \
             FROM {schema}.claim_callback($1, $2, $3, $4)"
        );
        let store = Self {
            inner: Arc::new(Inner {
                pool,
                schema,
                trees: trees.iter().map(|t| (*t).to_owned()).collect(),
                retention,
                vouched: std::sync::Mutex::new(vouched),
                opener,
                settle: settle_of(config.sweep_interval),
                liveness,
                sweeper: std::sync::Mutex::default(),
                claims: claim::HeldClaims::new(pool_size, begin),
                claim_sql,
                commit_metrics: crate::store::CommitMetrics::default(),
                count_folded: std::sync::Mutex::default(),
                #[cfg(test)]
                between_tries: tests::Hold::default(),
            }),
        };
        store.start_sweeper(config.sweep_interval);
        tracing::info!(schema = %store.inner.schema, "PostgreSQL store opened");
        Ok(store)
    }

    /// Applies the migrations the database at `config.url` lacks, without opening a store
    /// (`payhook store migrate`). Returns the versions applied now.
    ///
    /// # Errors
    ///
    /// As [`PgStore::open`].
    pub async fn migrate(config: &StoreConfig) -> Result<Vec<i32>, StoreError> {
        let mut conn = connect(config, 1).await?.acquire().await?;
        schema::migrate(&mut conn, &config.schema).await
    }

    /// Refuses a `store.schema` in which no payhook has created its tables (see
    /// [`ConfiguredStore::open_existing`](crate::store::ConfiguredStore::open_existing)).
    pub(crate) async fn require_existing(config: &StoreConfig) -> Result<(), StoreError> {
        let pool = connect(config, 1).await?;
        let found: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("{}.schema_migrations", config.schema))
            .fetch_one(&pool)
            .await?;
        pool.close().await;
        if found {
            Ok(())
        } else {
            Err(StoreError::backend_message(format!(
                "there is no payhook store in schema {} of store.url's database (store.schema, \
                 PAYHOOK_STORE_SCHEMA): point it at the service's schema",
                config.schema
            )))
        }
    }

    /// The newest schema version this payhook migrates to.
    pub fn schema_version() -> i32 {
        schema::latest()
    }

    /// The pool: the service's own queries may share it.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema that holds payhook's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The handle of one of the merchant's trees declared at [`PgStore::open`].
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] when `name` was not declared at open.
    pub fn tree(&self, name: &str) -> Result<Tree, StoreError> {
        check_declared(&self.inner.trees, name)?;
        Ok(Tree::declared(name))
    }

    /// The value of `key` in one of the merchant's trees (committed writes only).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] for a handle of another store; [`StoreError::Backend`]
    /// when PostgreSQL fails.
    pub async fn get(&self, tree: &Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        check_declared(&self.inner.trees, tree.name())?;
        let row =
            sqlx::query(&self.sql("SELECT value FROM {s}.trees WHERE tree = $1 AND key = $2"))
                .bind(tree.name())
                .bind(key)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    /// Every `(key, value)` of one of the merchant's trees, in key order.
    ///
    /// # Errors
    ///
    /// As [`PgStore::get`].
    pub async fn entries(&self, tree: &Tree) -> Result<Vec<KeyValue>, StoreError> {
        check_declared(&self.inner.trees, tree.name())?;
        let rows =
            sqlx::query(&self.sql("SELECT key, value FROM {s}.trees WHERE tree = $1 ORDER BY key"))
                .bind(tree.name())
                .fetch_all(self.pool())
                .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Test-only: the reads that must go through an index — an operator's or a scrape's,
    /// among an incident's many rows — as this store sends them, each with the index it
    /// relies on, so that a test can `EXPLAIN` the statement itself rather than a copy.
    #[doc(hidden)]
    pub fn indexed_reads(&self) -> Vec<IndexedRead> {
        use crate::postponed::record::PostponedState;
        vec![
            IndexedRead {
                index: "postponed_pending",
                sql: self.sql(&postponed::in_state_sql(PostponedState::Pending)),
                parameters: &[],
                condition: None,
            },
            IndexedRead {
                index: "postponed_queued",
                sql: self.sql(&postponed::in_state_sql(PostponedState::Queued)),
                parameters: &[],
                condition: None,
            },
            IndexedRead {
                index: "postponed_pending",
                sql: self.sql(&postponed::page_sql(Some(PostponedState::Pending))),
                // A page of the validations waiting for a decision, after the one before.
                parameters: &[("bigint", "1001"), ("bigint", "1001")],
                condition: Some("Index Cond: (validation_id >="),
            },
            IndexedRead {
                index: "postponed_queued",
                sql: self.sql(&postponed::page_sql(Some(PostponedState::Queued))),
                // A page of the results waiting for delivery, after the one before.
                parameters: &[("bigint", "1001"), ("bigint", "1001")],
                condition: Some("Index Cond: (validation_id >="),
            },
            IndexedRead {
                index: "postponed_pkey",
                sql: self.sql(&postponed::page_sql(Some(PostponedState::Conflict))),
                // A page of the refused results, among every record, after the one before.
                parameters: &[("bigint", "1001"), ("bigint", "1001")],
                condition: Some("Index Cond: (validation_id >="),
            },
            IndexedRead {
                index: "postponed_nonce_hash",
                sql: self.sql(postponed::VALIDATIONS_OF_NONCE),
                // A nonce asked about again under a new validation id.
                parameters: &[("text", "'n-1'")],
                condition: None,
            },
            IndexedRead {
                index: "postponed_outbox",
                sql: self.sql(&postponed::outbox_next_sql()),
                // When this instance's outbox has work next, each pass: the first result
                // due after now...
                parameters: &[("timestamptz", "now()"), ("int4", "1")],
                condition: Some("Index Cond: (deliver_at >"),
            },
            IndexedRead {
                index: "postponed_leased",
                sql: self.sql(&postponed::outbox_next_sql()),
                // ... and the results leased elsewhere now.
                parameters: &[("timestamptz", "now()"), ("int4", "1")],
                condition: Some("Index Cond: (lease_until >"),
            },
            IndexedRead {
                index: "callback_failures_latest",
                sql: self.sql(dedup::FAILING_LATEST),
                // The inspector's latest failures, refreshed every second.
                parameters: &[("bigint", "100")],
                condition: None,
            },
            IndexedRead {
                index: "callback_failures_latest",
                sql: self.sql(dedup::FAILING_AFTER),
                // A page of an incident's failures, after the one before it.
                parameters: &[
                    ("bigint", "1001"),
                    ("timestamptz", "now()"),
                    ("text", "'n-1'"),
                    ("int4", "4"),
                ],
                condition: Some("Index Cond: (last_failed <="),
            },
        ]
    }

    /// Number of callback and validation records held.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when PostgreSQL fails.
    pub async fn record_count(&self) -> Result<usize, StoreError> {
        let row = sqlx::query(&self.sql(
            "SELECT (SELECT count(*) FROM {s}.callbacks WHERE done <> '{}') \
               + (SELECT count(*) FROM {s}.validations)",
        ))
        .fetch_one(self.pool())
        .await?;
        Ok(usize::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0))
    }

    /// `template` with `{s}` replaced by the schema. The schema is a checked identifier
    /// (`store.schema`), so it is safe in SQL text.
    fn sql(&self, template: &str) -> String {
        template.replace("{s}", &self.inner.schema)
    }

    /// The retention as PostgreSQL seconds.
    fn retention_secs(&self) -> f64 {
        self.inner.retention.as_secs_f64()
    }

    fn start_sweeper(&self, every: Duration) {
        self.start_sweeper_reading((every, every.min(CLOCK_CHECK)), |now| now);
    }

    /// [`Self::start_sweeper`], reading the database's clock every `check` (at most `every`)
    /// and purging at the first check `every` after the last purge, each reading passed
    /// through `read` (a test's clock that steps; as read in production). Replaces a
    /// sweeper started before, which it stops.
    fn start_sweeper_reading(
        &self,
        (every, check): (Duration, Duration),
        read: fn(DateTime<Utc>) -> DateTime<Utc>,
    ) {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no tokio runtime: the PostgreSQL store's sweeper is not started");
            return;
        };
        let check = check.min(every).max(Duration::from_millis(1));
        let task = runtime.spawn(async move {
            let mut ticks = tokio::time::interval(check);
            // A check that took longer than the interval is not made up for in a burst.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut swept = ticks.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let mut clock = crate::store::horizon::PurgeClock::new(inner.retention);
            let mut started = PgStore { inner }.start_clock(&mut clock, read).await;
            loop {
                let tick = ticks.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let store = PgStore { inner };
                let sweep = tick.duration_since(swept) >= every;
                if sweep {
                    swept = tick;
                    let given_up = store.inner.claims.give_up_outlived();
                    if given_up > 0 {
                        tracing::warn!(given_up, "callback claims held past their time were given up");
                    }
                }
                if !started {
                    // Unread as the sweeper started: read again at each check, purged from
                    // the next sweep on.
                    started = store.start_clock(&mut clock, read).await;
                    continue;
                }
                if !sweep {
                    // Between sweeps, the clock alone: a step caught now is kept before
                    // much is written by it (see `CLOCK_CHECK`).
                    if let Err(error) = store.check_the_clock(&mut clock, read).await {
                        tracing::debug!(error = %crate::report::InLine(&error), "the database's clock could not be read between sweeps; read again at the next check");
                    }
                    continue;
                }
                // By the database's clock, which set the expiry times: an instance whose
                // clock runs ahead would purge marks early, and a retry arriving in between
                // would run its handler again.
                match store.purge_now(&mut clock, read).await {
                    Ok(0) => {}
                    Ok(purged) => tracing::info!(purged, "expired records purged"),
                    Err(error) => {
                        tracing::warn!(error = %crate::report::InLine(&error), "purging expired records failed; trying again later");
                    }
                }
            }
        });
        let replaced = self
            .inner
            .sweeper
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(task);
        if let Some(replaced) = replaced {
            replaced.abort();
        }
    }

    /// Starts the sweeper's `clock` with the database's clock (as `read` reads it), when the
    /// store last wrote, and the step of the clock it keeps; `false` where they could not be
    /// read (said): the sweeper purges nothing until they are, since purging by the clock
    /// alone could be by a clock a sweep caught ahead.
    async fn start_clock(
        &self,
        clock: &mut crate::store::horizon::PurgeClock,
        read: fn(DateTime<Utc>) -> DateTime<Utc>,
    ) -> bool {
        match self.clock_at_start().await {
            Ok((now, last_write, kept)) => {
                clock.read_at_start(
                    crate::store::ms_from_time(read(now)),
                    last_write.map(crate::store::ms_from_time),
                    kept,
                );
                true
            }
            Err(error) => {
                tracing::warn!(
                    error = %crate::report::InLine(&error),
                    "the database's clock, the store's newest write or the clock's step it keeps \
                     could not be read for the store's sweeper: nothing is purged until they are \
                     (tried again at the next check, every minute at most)"
                );
                false
            }
        }
    }

    /// [`Self::clock_and_last_write`], and the step of the database's clock the schema keeps
    /// (see [`crate::store::horizon::PurgeClock`]).
    async fn clock_at_start(
        &self,
    ) -> Result<
        (
            DateTime<Utc>,
            Option<DateTime<Utc>>,
            Option<crate::store::horizon::Step>,
        ),
        StoreError,
    > {
        let (now, last_write) = self.clock_and_last_write().await?;
        let mut conn = self.pool().acquire().await?;
        let kept = horizon::kept_step(&mut conn, &self.inner.schema).await?;
        Ok((now, last_write, kept))
    }

    /// The database's clock, and when the newest booking or validation was written as far
    /// as its expiry tells (its expiry less the retention this instance writes with: earlier
    /// than it was where the retention grew since, so that the sweeper holds back more);
    /// `None` for a schema that holds none.
    async fn clock_and_last_write(
        &self,
    ) -> Result<(DateTime<Utc>, Option<DateTime<Utc>>), StoreError> {
        let sql = self.sql(
            "SELECT now(), greatest((SELECT max(expires_at) FROM {s}.callbacks), \
             (SELECT max(expires_at) FROM {s}.validations))",
        );
        let (now, newest): (DateTime<Utc>, Option<DateTime<Utc>>) =
            sqlx::query_as(&sql).fetch_one(self.pool()).await?;
        let retention =
            chrono::TimeDelta::from_std(self.inner.retention).unwrap_or(chrono::TimeDelta::MAX);
        Ok((now, newest.and_then(|n| n.checked_sub_signed(retention))))
    }

    /// [`Self::purge`] at the database's `now()`, after the schema's record of its retention
    /// is read again and — by an instance that serves — moved on by this instance's
    /// retention: an instance opened since with another retention changed it, and one
    /// still writing with a shorter retention than another recorded must count. The
    /// database's clock, as `read` reads it, is held back by `clock` (see
    /// [`crate::store::horizon::PurgeClock`]).
    async fn purge_now(
        &self,
        clock: &mut crate::store::horizon::PurgeClock,
        read: fn(DateTime<Utc>) -> DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        // What the records are deleted by is their own expiry, not this record: a failure
        // to read it keeps the last one read and purges all the same.
        let mut conn = self.pool().acquire().await?;
        let vouched = horizon::at_open(
            &mut conn,
            &self.inner.schema,
            self.inner.retention,
            (self.inner.opener, self.inner.settle),
        )
        .await;
        drop(conn);
        match vouched {
            Ok(vouched) => {
                *self
                    .inner
                    .vouched
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = vouched;
            }
            Err(error) => {
                tracing::warn!(error = %crate::report::InLine(&error), "the record of the retention the records were written with could not be read; the last one read stands");
            }
        }
        let by = self.read_the_clock(clock, read).await?;
        self.purge(by).await
    }

    /// Between sweeps: the database's clock read, and the step kept; read as a sweep reads
    /// them (what changed kept) only where the clock catches a step, another instance's
    /// step is kept meanwhile, or a change of this clock's is still to be written (its
    /// write failed). What else a reading changes (a step the clock no longer leads by, or
    /// that aged out) holds back less, and waits for the next sweep.
    async fn check_the_clock(
        &self,
        clock: &mut crate::store::horizon::PurgeClock,
        read: fn(DateTime<Utc>) -> DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (now, kept): (DateTime<Utc>, Option<String>) = sqlx::query_as(&self.sql(CLOCK_NOW))
            .fetch_one(self.pool())
            .await?;
        let now = crate::store::ms_from_time(read(now));
        let kept = crate::store::horizon::Step::decode(kept.as_deref().map(str::as_bytes));
        if clock.catches(now) || kept != clock.kept() || clock.take_change().is_some() {
            self.read_the_clock(clock, read).await?;
        }
        Ok(())
    }

    /// The time to purge by: the database's clock, as `read` reads it, held back by `clock`
    /// (see [`crate::store::horizon::PurgeClock`]) — another instance's step kept since the
    /// last reading counted in it, and what it changed of the step kept before it returns
    /// (failing that, said: the next reading tries again, and purging by the elapsed time
    /// is safe meanwhile).
    async fn read_the_clock(
        &self,
        clock: &mut crate::store::horizon::PurgeClock,
        read: fn(DateTime<Utc>) -> DateTime<Utc>,
    ) -> Result<DateTime<Utc>, StoreError> {
        let (now, latest, kept): (DateTime<Utc>, Option<DateTime<Utc>>, Option<String>) =
            sqlx::query_as(&self.sql(LATEST_EXPIRY))
                .fetch_one(self.pool())
                .await?;
        let now = read(now);
        // Another instance's step since the last sweep counts in this one.
        clock.kept_as(crate::store::horizon::Step::decode(
            kept.as_deref().map(str::as_bytes),
        ));
        let by = crate::store::time_from_ms(clock.purge_by(
            crate::store::ms_from_time(now),
            latest.map(crate::store::ms_from_time),
        ));
        // Kept before the purge; failing, the purge goes on (by the elapsed time, which is
        // safe) and the next sweep tries again.
        if let Some(change) = clock.take_change() {
            let kept = match self.pool().acquire().await {
                Ok(mut conn) => horizon::keep_step(&mut conn, &self.inner.schema, change).await,
                Err(error) => Err(error.into()),
            };
            match kept {
                Ok(kept) => clock.kept_as(kept),
                Err(error) => {
                    tracing::error!(error = %crate::report::InLine(&error), "keeping the step of the database's clock failed; trying again at the next check");
                }
            }
        }
        Ok(now.min(by))
    }

    /// Removes expired rows, [`PURGE_BATCH`] per statement; a postponed validation only once
    /// its result is delivered or refused.
    ///
    /// Each statement says twice what expired: the rows it picks, and the rows it deletes.
    /// Under READ COMMITTED a row picked while a booking held it (a new status of a nonce
    /// whose record had expired: its claim renews the row until its COMMIT) would be deleted
    /// once the booking commits, and only the outer condition is checked again on the
    /// committed row: without it, a mark just acknowledged would be deleted, and a repeat of
    /// its callback run again. (A callback's row a claim holds is passed over, not waited
    /// for: `SKIP LOCKED`.)
    async fn purge(&self, now: DateTime<Utc>) -> Result<usize, StoreError> {
        let tables = [
            // A row a claim holds (its handler running, up to the handler's timeout) is
            // passed over, not waited for: the wait would outlast the statement's timeout
            // and fail the whole sweep, and a later sweep removes it if it still expired.
            "DELETE FROM {s}.callbacks WHERE nonce_key IN (SELECT nonce_key FROM {s}.callbacks WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) AND expires_at <= $1",
            // A nonce whose validation still waits for its decision or its delivery keeps
            // its record (a new validation of it would run the handler again).
            concat!(
                "DELETE FROM {s}.validations WHERE nonce_key IN (SELECT nonce_key FROM {s}.validations WHERE expires_at <= $1 \
                   AND nonce_key NOT IN (",
                awaiting_nonce_keys!(),
                ") LIMIT $2) AND expires_at <= $1"
            ),
            "DELETE FROM {s}.validation_claims WHERE nonce_key IN (SELECT nonce_key FROM {s}.validation_claims WHERE expires_at <= $1 LIMIT $2) AND expires_at <= $1",
            "DELETE FROM {s}.callback_failures WHERE (nonce_key, status) IN (SELECT nonce_key, status FROM {s}.callback_failures WHERE expires_at <= $1 LIMIT $2) AND expires_at <= $1",
            "DELETE FROM {s}.postponed WHERE validation_id IN (SELECT validation_id FROM {s}.postponed WHERE final AND expires_at <= $1 LIMIT $2) AND final AND expires_at <= $1",
            dedup::BOOKED_FAILURES,
            "DELETE FROM {s}.sessions_ended WHERE session IN (SELECT session FROM {s}.sessions_ended WHERE expires_at <= $1 LIMIT $2) AND expires_at <= $1",
        ];
        let mut purged = 0usize;
        for table in tables {
            let sql = self.sql(table);
            loop {
                let done = sqlx::query(&sql)
                    .bind(now)
                    .bind(PURGE_BATCH)
                    .execute(self.pool())
                    .await?
                    .rows_affected();
                purged += usize::try_from(done).unwrap_or(usize::MAX);
                if done < u64::try_from(PURGE_BATCH).unwrap_or(u64::MAX) {
                    break;
                }
            }
        }
        self.fold_failing_count().await?;
        Ok(purged)
    }

    /// Folds the rows of +1 and −1 of the count of failing callbacks into one (nothing is
    /// written when there is one already): at each sweep, and when the count is read and
    /// this instance last folded them [`COUNT_FOLDED_EVERY`] ago or more, so that reading
    /// the count sums a few seconds' failures at most, not an incident's.
    async fn fold_failing_count(&self) -> Result<(), StoreError> {
        *self
            .inner
            .count_folded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::time::Instant::now());
        sqlx::query(&self.sql(
            "WITH gone AS (DELETE FROM {s}.callback_failures_count \
               WHERE (SELECT count(*) FROM {s}.callback_failures_count) > 1 RETURNING n) \
             INSERT INTO {s}.callback_failures_count (n) \
               SELECT coalesce(sum(n), 0) FROM gone HAVING count(*) > 0",
        ))
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Whether reading the count should fold its rows first (see
    /// [`PgStore::fold_failing_count`]).
    fn count_to_fold(&self) -> bool {
        self.inner
            .count_folded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none_or(|folded| folded.elapsed() >= COUNT_FOLDED_EVERY)
    }
}

/// How often reading the count of failing callbacks folds its rows, at most (see
/// [`PgStore::fold_failing_count`]).
const COUNT_FOLDED_EVERY: Duration = Duration::from_secs(5);

/// A `FROM` item that turns off the wait for the WAL flush at the commit of the statement
/// it is in (`synchronous_commit = off` for that transaction only): for claims, releases
/// and failure records, which may be lost in a crash of the database without harm — a
/// claim lost is taken again, a release lost runs out, a failure count is a count. The
/// marks and the merchant's effects always commit synchronously.
const UNSYNCED: &str = "(SELECT set_config('synchronous_commit', 'off', true)) AS unsynced";

/// The host `url` names when it is another machine's and the connection would not check
/// its certificate (`sslmode` — in the address, else `PGSSLMODE` — neither `verify-full`
/// nor `verify-ca`); `None` for a Unix socket, this machine, or a checked channel.
fn unverified_remote(url: &str) -> Option<String> {
    let options = PgConnectOptions::from_str(url).ok()?;
    let host = options.get_host();
    // A host that is a directory is a Unix socket's (`postgres:///db`, PGHOST=/run/...).
    let here = host == "localhost"
        || host.starts_with('/')
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback());
    let checked = matches!(
        options.get_ssl_mode(),
        sqlx::postgres::PgSslMode::VerifyCa | sqlx::postgres::PgSslMode::VerifyFull
    );
    (options.get_socket().is_none() && !here && !checked).then(|| host.to_owned())
}

/// A pool of `size` connections to `config.url`: every connection commits synchronously,
/// bounds its statements by `store.statement_timeout`, and is not closed for idling in a
/// transaction (`idle_in_transaction_session_timeout`, which a server or role may set): a
/// claim is a transaction that idles while its handler runs, and closed it would let a
/// retry's handler run beside the first one, and the first one's booking fail. Nor is one
/// closed for idling outside a transaction (`idle_session_timeout`): a pooled connection is
/// not tested before it is used, and one closed so would fail the request that took it
/// next. (The liveness lock's connections set both themselves: see `liveness`.)
async fn connect(config: &StoreConfig, size: u32) -> Result<PgPool, StoreError> {
    let url = config.url.as_ref().ok_or_else(|| {
        StoreError::backend_message("store.url is not set: PostgreSQL needs its address")
    })?;
    let statement_ms = config.statement_timeout.as_millis().to_string();
    let options = PgConnectOptions::from_str(url.expose())
        // The error would quote the address, password included: say what, not the text.
        .map_err(|_| StoreError::backend_message("store.url is not a PostgreSQL address"))?
        .application_name("payhook")
        .options([
            ("synchronous_commit", "on"),
            ("statement_timeout", statement_ms.as_str()),
            ("idle_in_transaction_session_timeout", "0"),
        ]);
    PgPoolOptions::new()
        .max_connections(size)
        // Not a start-up option: a server before 14 would refuse the connection over a
        // setting it does not know, before the version check could say what is wrong.
        .after_connect(|conn, _| {
            Box::pin(async move {
                let off = liveness::set_where_known(&[("idle_session_timeout", "0")]);
                sqlx::Executor::execute(conn, off.as_str()).await.map(drop)
            })
        })
        .acquire_timeout(config.connect_timeout)
        // No round trip before each use: a connection the database dropped fails its
        // request (503, retried) and is replaced.
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .map_err(|e| StoreError::backend("cannot connect to PostgreSQL (store.url)", e))
}

/// A nonce as its rows are keyed: itself, or `sha256:` and its digest when long (see
/// `keys.rs`), so that an index entry stays small whatever a sender chose.
fn nonce_key(nonce: &str) -> String {
    keys::describe(&keys::identifier(nonce))
}

/// A new claim: random, so that instances never hand out the same one.
fn new_claim() -> Result<super::Claim, StoreError> {
    let mut id = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id)
        .map_err(|_| StoreError::backend_message("no randomness for a claim"))?;
    // Positive in PostgreSQL's bigint.
    Ok(super::Claim {
        id: u64::from_le_bytes(id) >> 1,
    })
}

/// A claim as PostgreSQL keeps it.
fn claim_id(claim: super::Claim) -> i64 {
    i64::try_from(claim.id).unwrap_or(i64::MAX)
}

/// The sqlx error a backend failure carries, if it carries one.
fn sqlx_cause(error: &StoreError) -> Option<&sqlx::Error> {
    let StoreError::Backend {
        source: Some(source),
        ..
    } = error
    else {
        return None;
    };
    let source: &(dyn std::error::Error + 'static) = source.as_ref();
    source.downcast_ref::<sqlx::Error>()
}

/// The SQLSTATE of the database error a backend failure carries.
fn sqlstate(error: &StoreError) -> Option<String> {
    sqlx_cause(error).and_then(code_of)
}

/// The SQLSTATE of `error`, when the database refused a statement.
fn code_of(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .map(std::borrow::Cow::into_owned)
}

/// Whether the database refused a statement with one of the SQLSTATE `codes`.
fn refused_with(error: &sqlx::Error, codes: &[&str]) -> bool {
    code_of(error).is_some_and(|code| codes.contains(&code.as_str()))
}

/// `true` for a failure that a retry of the whole transaction may not meet again: a
/// deadlock (40P01) or a serialization failure (40001).
fn retryable(error: &StoreError) -> bool {
    sqlstate(error).is_some_and(|code| code == "40P01" || code == "40001")
}

/// `true` for a failure that took the connection with it: an I/O error, or the database
/// closing the session (SQLSTATE class 08; 57P01–57P05: terminated, shutting down, idle
/// too long; 25P03: idle in a transaction too long).
fn connection_lost(error: &StoreError) -> bool {
    matches!(
        sqlx_cause(error),
        Some(sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed)
    ) || sqlstate(error)
        .is_some_and(|code| code.starts_with("08") || code.starts_with("57P0") || code == "25P03")
}

fn decode_json<T: serde::de::DeserializeOwned>(key: &str, text: &str) -> Result<T, StoreError> {
    super::record::decode(key, text.as_bytes())
}

fn encode_json<T: serde::Serialize>(value: &T) -> String {
    String::from_utf8(super::record::encode(value)).unwrap_or_default()
}

impl super::Store for PgStore {
    fn purge_expired(&self, now: DateTime<Utc>) -> StoreFuture<'_, usize> {
        Box::pin(self.purge(now))
    }

    fn retention(&self) -> Duration {
        self.inner.retention
    }

    fn reach(&self) -> Duration {
        self.inner
            .vouched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .reach_within(self.inner.retention, crate::store::now_ms())
    }

    fn commit_metrics(&self) -> Option<super::CommitMetrics> {
        Some(self.inner.commit_metrics.clone())
    }

    fn end_session<'a>(
        &'a self,
        session: &'a str,
        until: DateTime<Utc>,
    ) -> super::DurableFuture<'a> {
        Box::pin(async move {
            sqlx::query(&self.sql(
                "INSERT INTO {s}.sessions_ended (session, expires_at) VALUES ($1, $2) \
                 ON CONFLICT (session) DO UPDATE \
                 SET expires_at = greatest({s}.sessions_ended.expires_at, excluded.expires_at)",
            ))
            .bind(session)
            .bind(until)
            .execute(self.pool())
            .await?;
            Ok(())
        })
    }

    fn session_ended<'a>(&'a self, session: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let found: Option<i32> = sqlx::query_scalar(
                &self.sql("SELECT 1 FROM {s}.sessions_ended WHERE session = $1"),
            )
            .bind(session)
            .fetch_optional(self.pool())
            .await?;
            Ok(found.is_some())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{PgStore, unverified_remote};
    use crate::model::{Nonce, TransactionStatus};
    use crate::store::{CallbackBegin, DedupStore, Effects, StoreConfig};
    use chrono::{DateTime, TimeDelta, Utc};
    use sqlx::Connection;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::Notify;

    /// The test database (`PAYHOOK_TEST_DATABASE_URL`, as the integration tests read it),
    /// or `None`, said, where no server answers outside CI; under CI that fails the test.
    async fn test_database(test: &str) -> Option<String> {
        let url = std::env::var("PAYHOOK_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let reached =
            tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&url)).await;
        let why = match reached {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                return Some(url);
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => "no answer within 5 s".to_owned(),
        };
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: PostgreSQL at {url} is unreachable ({why}), and CI must run the PostgreSQL tests"
        );
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: PostgreSQL at {url} is unreachable ({why}); set PAYHOOK_TEST_DATABASE_URL or start it"
        );
        None
    }

    static STEPPED_READINGS: AtomicUsize = AtomicUsize::new(0);

    /// The database's clock, stepped 40 days forward after its first reading (a database
    /// server whose clock an operator or a VM's first NTP sync moved while the service ran).
    fn stepped_forward(now: DateTime<Utc>) -> DateTime<Utc> {
        stepped_after_the_first(now, &STEPPED_READINGS)
    }

    /// The database's clock `now`, right at its first reading (counted in `readings`), 40
    /// days ahead from the second on.
    fn stepped_after_the_first(now: DateTime<Utc>, readings: &AtomicUsize) -> DateTime<Utc> {
        let earlier = readings.fetch_add(1, Ordering::SeqCst);
        now + if earlier == 0 {
            TimeDelta::zero()
        } else {
            TimeDelta::days(40)
        }
    }

    /// The database's clock `now`, 40 days ahead, counted in `readings`.
    fn forty_days_ahead(now: DateTime<Utc>, readings: &AtomicUsize) -> DateTime<Utc> {
        readings.fetch_add(1, Ordering::SeqCst);
        now + TimeDelta::days(40)
    }

    static AHEAD_READINGS: AtomicUsize = AtomicUsize::new(0);

    /// The database's clock, 40 days ahead from its first reading on (a database server
    /// that started with a wrong clock).
    fn ahead_from_the_start(now: DateTime<Utc>) -> DateTime<Utc> {
        forty_days_ahead(now, &AHEAD_READINGS)
    }

    /// A booking of a store kept 30 days, swept by a database clock stepped 40 days
    /// forward: kept. The sweep purged it by the clock, and the store then vouched for 30
    /// days it no longer held (the purge clock's own test is `horizon`'s; this one fails
    /// if the sweeper stops holding the database's clock back by it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_clock_stepped_forward_purges_nothing_early() {
        let test = "a_database_clock_stepped_forward_purges_nothing_early";
        if let Some(kept) = kept_when_swept_by(test, stepped_forward, &STEPPED_READINGS).await {
            assert!(kept, "a sweep purged by a database clock stepped forward");
        }
    }

    /// The same with a database clock already 40 days ahead when the sweeper starts: held
    /// back to the store's newest write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_clock_ahead_at_start_purges_nothing_early() {
        let test = "a_database_clock_ahead_at_start_purges_nothing_early";
        if let Some(kept) = kept_when_swept_by(test, ahead_from_the_start, &AHEAD_READINGS).await {
            assert!(kept, "a sweep purged by a database clock ahead at start");
        }
    }

    /// Whether a booking of a store kept 30 days is still acknowledged after a sweeper
    /// reading the database's clock through `read` (counted in `readings`) swept a few
    /// times; `None` where PostgreSQL is unreachable (said).
    async fn kept_when_swept_by(
        test: &str,
        read: fn(DateTime<Utc>) -> DateTime<Utc>,
        readings: &AtomicUsize,
    ) -> Option<bool> {
        let swept = Swept::open(test).await?;
        let nonce = book(&swept.store, "n-1").await;
        swept.sweep(read, readings).await;
        let kept = swept.acknowledged(&nonce).await;
        swept.drop_schema().await;
        Some(kept)
    }

    /// How many times [`stepped_while_running`] was read.
    static STEPPED_WHILE_RUNNING_READINGS: AtomicUsize = AtomicUsize::new(0);

    /// [`stepped_forward`], read by one test alone.
    fn stepped_while_running(now: DateTime<Utc>) -> DateTime<Utc> {
        stepped_after_the_first(now, &STEPPED_WHILE_RUNNING_READINGS)
    }

    /// How many times [`still_ahead_at_restart`] was read.
    static STILL_AHEAD_READINGS: AtomicUsize = AtomicUsize::new(0);

    /// The database's clock 40 days ahead, as an instance started again finds it.
    fn still_ahead_at_restart(now: DateTime<Utc>) -> DateTime<Utc> {
        forty_days_ahead(now, &STILL_AHEAD_READINGS)
    }

    /// How many times [`stepped_between_sweeps`] was read.
    static STEPPED_BETWEEN_SWEEPS_READINGS: AtomicUsize = AtomicUsize::new(0);

    /// [`stepped_forward`], read by one test alone.
    fn stepped_between_sweeps(now: DateTime<Utc>) -> DateTime<Utc> {
        stepped_after_the_first(now, &STEPPED_BETWEEN_SWEEPS_READINGS)
    }

    /// A step of the database's clock is kept long before the next sweep: the sweeper
    /// reads the clock between sweeps. Caught at the sweep alone, an hour later by
    /// default, an instance that crashed meanwhile, having written by the stepped clock,
    /// purged by it when it started again (the hole the kept step closes, below). The
    /// sweeper here sweeps once an hour: only its start and its readings between sweeps
    /// run in the test.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_step_is_kept_between_sweeps() {
        let test = "a_database_step_is_kept_between_sweeps";
        let Some(swept) = Swept::open(test).await else {
            return;
        };
        let booked = book(&swept.store, "n-1").await;
        swept
            .read_clock(
                (Duration::from_secs(3600), Duration::from_millis(5)),
                stepped_between_sweeps,
                &STEPPED_BETWEEN_SWEEPS_READINGS,
            )
            .await;
        let mut conn = swept.store.pool().acquire().await.unwrap();
        let step = super::horizon::kept_step(&mut conn, &swept.schema)
            .await
            .unwrap()
            .expect("the step is kept before the next sweep");
        drop(conn);
        let days_39 = Duration::from_secs(39 * 86_400);
        assert!(
            (days_39..=days_39 + Duration::from_secs(2 * 86_400)).contains(&step.lead()),
            "{step:?}"
        );
        assert!(swept.acknowledged(&booked).await);
        swept.drop_schema().await;
    }

    /// How many times [`stepped_while_refused`] was read.
    static STEPPED_WHILE_REFUSED_READINGS: AtomicUsize = AtomicUsize::new(0);

    /// [`stepped_forward`], read by one test alone.
    fn stepped_while_refused(now: DateTime<Utc>) -> DateTime<Utc> {
        stepped_after_the_first(now, &STEPPED_WHILE_REFUSED_READINGS)
    }

    /// A step caught between sweeps whose write the database refuses is written at a later
    /// check, once the database takes it, not at the next sweep (an hour on): the clock
    /// holds the step, so its readings no longer catch it, and the row kept is unchanged;
    /// the change still to be written is what sends the check to write it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_whose_write_failed_is_written_at_a_later_check() {
        let test = "a_step_whose_write_failed_is_written_at_a_later_check";
        let Some(swept) = Swept::open(test).await else {
            return;
        };
        let s = &swept.schema;
        swept
            .execute(&format!(
                "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; \
                 CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON {s}.clock_step \
                 FOR EACH ROW EXECUTE FUNCTION {s}.refuse();"
            ))
            .await;
        let every_hour = (Duration::from_secs(3600), Duration::from_millis(5));
        swept
            .read_clock(
                every_hour,
                stepped_while_refused,
                &STEPPED_WHILE_REFUSED_READINGS,
            )
            .await;
        let mut conn = swept.store.pool().acquire().await.unwrap();
        let refused = super::horizon::kept_step(&mut conn, s).await.unwrap();
        assert_eq!(refused, None, "the database refused the step");
        swept
            .execute(&format!("DROP TRIGGER refuse ON {s}.clock_step"))
            .await;
        let before = STEPPED_WHILE_REFUSED_READINGS.load(Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let step = loop {
            let kept = super::horizon::kept_step(&mut conn, s).await.unwrap();
            let read_since = STEPPED_WHILE_REFUSED_READINGS.load(Ordering::SeqCst) - before;
            if let Some(step) = kept {
                break step;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the step was not written in {read_since} checks after the database took it"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        drop(conn);
        let days_39 = Duration::from_secs(39 * 86_400);
        assert!(
            (days_39..=days_39 + Duration::from_secs(2 * 86_400)).contains(&step.lead()),
            "{step:?}"
        );
        swept.drop_schema().await;
    }

    /// The hole a kept step closes, on PostgreSQL: a database clock stepped 40 days forward
    /// while an instance runs is caught by its sweep and kept in `{schema}.clock_step`; a
    /// booking is then written by the stepped clock (its expiry moved so), and a sweeper
    /// starts again, the clock still ahead. The newest write reads as recent by that clock:
    /// without the step kept (shown last, the row deleted), the sweeper purges by it and a
    /// booking made before the step, within its 30 days, is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_step_caught_before_a_restart_holds_the_sweeper_back() {
        let test = "a_database_step_caught_before_a_restart_holds_the_sweeper_back";
        let Some(swept) = Swept::open(test).await else {
            return;
        };
        let before = book(&swept.store, "n-1").await;
        swept
            .sweep(stepped_while_running, &STEPPED_WHILE_RUNNING_READINGS)
            .await;
        let after = book(&swept.store, "n-2").await;
        swept
            .execute(&format!(
                "UPDATE {s}.callbacks SET expires_at = expires_at + interval '40 days' \
                 WHERE expires_at = (SELECT max(expires_at) FROM {s}.callbacks)",
                s = swept.schema
            ))
            .await;
        let mut conn = swept.store.pool().acquire().await.unwrap();
        let step = super::horizon::kept_step(&mut conn, &swept.schema)
            .await
            .unwrap()
            .expect("the step is kept");
        drop(conn);
        let days_39 = Duration::from_secs(39 * 86_400);
        assert!(
            (days_39..=days_39 + Duration::from_secs(2 * 86_400)).contains(&step.lead()),
            "{step:?}"
        );
        swept
            .sweep(still_ahead_at_restart, &STILL_AHEAD_READINGS)
            .await;
        assert!(
            swept.acknowledged(&before).await,
            "the restarted sweeper purged by the stepped clock"
        );
        assert!(swept.acknowledged(&after).await);
        // Stopped first: a sweeper holding the step writes it back.
        swept.stop_sweeper().await;
        swept
            .execute(&format!("DELETE FROM {}.clock_step", swept.schema))
            .await;
        swept
            .sweep(still_ahead_at_restart, &STILL_AHEAD_READINGS)
            .await;
        assert!(
            !swept.acknowledged(&before).await,
            "without the step kept, the stepped clock purges what it holds back"
        );
        assert!(swept.acknowledged(&after).await);
        swept.drop_schema().await;
    }

    /// A point where a test holds the store's work once: the work says it arrived, and
    /// waits until the test lets it go on.
    #[derive(Default)]
    pub(super) struct Hold(std::sync::Mutex<Option<(Arc<Notify>, Arc<Notify>)>>);

    impl Hold {
        /// Holds the next work to pass; what it returns is told of the arrival, and lets
        /// the work go on.
        fn arm(&self) -> (Arc<Notify>, Arc<Notify>) {
            let pair = (Arc::new(Notify::new()), Arc::new(Notify::new()));
            *self.0.lock().unwrap() = Some(pair.clone());
            pair
        }

        /// Where the work passes: held once, if armed.
        pub(super) async fn pass(&self) {
            let armed = self.0.lock().unwrap().take();
            if let Some((arrived, go_on)) = armed {
                arrived.notify_one();
                go_on.notified().await;
            }
        }
    }

    /// A success's booking whose transaction meets a deadlock, while in the moment between
    /// that transaction and the next the nonce's reversal is claimed and booked: the
    /// success's effects, staged by a handler told nothing was booked before, are not
    /// written after the reversal (its credit would outlive the refund). Its claim is lost
    /// (503, the aggregator sends it again), and the next claim is told of the reversal.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_booking_retried_after_a_deadlock_is_not_written_after_another_status() {
        let test = "a_booking_retried_after_a_deadlock_is_not_written_after_another_status";
        let Some(swept) = Swept::open(test).await else {
            return;
        };
        let store = swept.store.clone();
        let nonce = Nonce::from("n-reversed");
        let claimed = |status| {
            let (store, nonce) = (store.clone(), nonce.clone());
            async move {
                match store
                    .begin_callback(&nonce, status, Duration::from_secs(60))
                    .await
                    .unwrap()
                {
                    CallbackBegin::Claimed {
                        claim,
                        previous_status,
                        ..
                    } => (claim, previous_status),
                    _ => panic!("{status:?} not claimed"),
                }
            }
        };
        let (success, before) = claimed(TransactionStatus::Success).await;
        assert_eq!(before, None);
        let runs = Arc::new(AtomicUsize::new(0));
        let effects = Effects::default();
        effects.postgres({
            let runs = Arc::clone(&runs);
            move |conn| {
                let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
                Box::pin(async move {
                    if first {
                        sqlx::query(
                            "DO $$ BEGIN RAISE EXCEPTION 'the test''s deadlock' \
                             USING ERRCODE = 'deadlock_detected'; END $$",
                        )
                        .execute(&mut *conn)
                        .await?;
                    }
                    Ok(())
                })
            }
        });
        let (arrived, go_on) = store.inner.between_tries.arm();
        let booking = tokio::spawn({
            let (store, nonce) = (store.clone(), nonce.clone());
            async move {
                store
                    .finish_callback(&nonce, success, TransactionStatus::Success, effects)
                    .await
            }
        });
        arrived.notified().await;
        let (reversal, before) = claimed(TransactionStatus::PaymentSystemError).await;
        assert_eq!(before, None);
        store
            .finish_callback(
                &nonce,
                reversal,
                TransactionStatus::PaymentSystemError,
                Effects::default(),
            )
            .await
            .unwrap();
        go_on.notify_one();
        let booked = booking.await.unwrap();
        assert!(
            matches!(booked, Err(crate::store::StoreError::ClaimLost(_))),
            "{booked:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "its effects ran once, and failed"
        );
        let (again, before) = claimed(TransactionStatus::Success).await;
        assert_eq!(
            before,
            Some(TransactionStatus::PaymentSystemError),
            "the success's retry is told of the reversal"
        );
        store.give_back_callback(&nonce, again).await.unwrap();
        drop(store);
        swept.drop_schema().await;
    }

    /// Books a success of `nonce`.
    async fn book(store: &PgStore, nonce: &str) -> Nonce {
        let (nonce, status) = (Nonce::from(nonce), TransactionStatus::Success);
        let CallbackBegin::Claimed { claim, .. } = store
            .begin_callback(&nonce, status, Duration::from_secs(60))
            .await
            .unwrap()
        else {
            panic!("not claimed");
        };
        store
            .finish_callback(&nonce, claim, status, Effects::default())
            .await
            .unwrap();
        nonce
    }

    /// A store kept 30 days in a schema of its own, for a test's sweepers.
    struct Swept {
        url: String,
        schema: String,
        store: PgStore,
    }

    impl Swept {
        /// `None` where PostgreSQL is unreachable (said).
        async fn open(test: &str) -> Option<Self> {
            let url = test_database(test).await?;
            static SCHEMAS: AtomicUsize = AtomicUsize::new(0);
            let schema = format!(
                "t_sweep_{}_{}_{}",
                std::process::id(),
                SCHEMAS.fetch_add(1, Ordering::Relaxed),
                Utc::now().timestamp_subsec_micros()
            );
            let config = StoreConfig {
                url: Some(url.as_str().into()),
                schema: schema.clone(),
                retention: Duration::from_secs(30 * 24 * 3600),
                sweep_interval: Duration::from_secs(3600),
                ..StoreConfig::default()
            };
            let store = PgStore::open(&config, &[]).await.unwrap();
            Some(Self { url, schema, store })
        }

        /// A sweeper started (replacing the one before) reading the database's clock
        /// through `read` (counted in `readings`), once it swept a few times.
        async fn sweep(&self, read: fn(DateTime<Utc>) -> DateTime<Utc>, readings: &AtomicUsize) {
            let often = Duration::from_millis(5);
            self.read_clock((often, often), read, readings).await;
        }

        /// A sweeper started (replacing the one before) purging `every` and reading the
        /// database's clock `check` through `read` (counted in `readings`), once it read
        /// the clock a few times.
        async fn read_clock(
            &self,
            (every, check): (Duration, Duration),
            read: fn(DateTime<Utc>) -> DateTime<Utc>,
            readings: &AtomicUsize,
        ) {
            let before = readings.load(Ordering::SeqCst);
            self.store.start_sweeper_reading((every, check), read);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while readings.load(Ordering::SeqCst) < before + 4 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the sweeper never read the clock"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }

        /// Stops the sweeper running, once its task ended.
        async fn stop_sweeper(&self) {
            let running = self
                .store
                .inner
                .sweeper
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(running) = running {
                running.abort();
                let _ = running.await;
            }
        }

        async fn acknowledged(&self, nonce: &Nonce) -> bool {
            self.store
                .callback_acknowledged(nonce, TransactionStatus::Success)
                .await
                .unwrap()
        }

        async fn execute(&self, sql: &str) {
            sqlx::raw_sql(sql).execute(self.store.pool()).await.unwrap();
        }

        /// Drops the store and its schema. The sweeper ends at its next tick: a sweep still
        /// under way may deadlock with the drop's locks, which PostgreSQL breaks by failing
        /// one of them; the drop is tried again.
        async fn drop_schema(self) {
            let Self { url, schema, store } = self;
            drop(store);
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            let drop_schema = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
            for attempt in 1.. {
                match sqlx::raw_sql(&drop_schema).execute(&mut conn).await {
                    Ok(_) => break,
                    Err(error) => {
                        assert!(attempt < 20, "{schema} could not be dropped: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }

    #[test]
    fn a_remote_database_without_a_checked_certificate_is_named() {
        // An address without sslmode means what PGSSLMODE says: unset here, as in CI.
        for (url, named) in [
            (
                "postgres://payhook@db.internal/payments",
                Some("db.internal"),
            ),
            (
                "postgres://payhook@10.0.0.5/payments?sslmode=require",
                Some("10.0.0.5"),
            ),
            (
                "postgres://payhook@db.internal/payments?sslmode=prefer",
                Some("db.internal"),
            ),
            (
                "postgres://payhook@db.internal/payments?sslmode=verify-full",
                None,
            ),
            (
                "postgres://payhook@db.internal/payments?sslmode=verify-ca",
                None,
            ),
            ("postgres://postgres@127.0.0.1:5432/test", None),
            ("postgres://postgres@localhost/test", None),
            ("postgres://postgres@[::1]:5432/test", None),
            ("postgres:///payments?host=/var/run/postgresql", None),
            (
                "postgres://payhook@%2Fvar%2Frun%2Fpostgresql/payments",
                None,
            ),
        ] {
            assert_eq!(
                unverified_remote(url).as_deref(),
                named,
                "{url} (PGSSLMODE = {:?})",
                std::env::var_os("PGSSLMODE")
            );
        }
    }
}
