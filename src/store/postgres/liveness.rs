//! Each instance's liveness, as other instances see it: a session advisory lock
//! `(LOCK_KEY, owner)` held in shared mode on [`HOLDERS`] connections of the instance's own
//! for as long as the store is open. A process that dies loses its connections, and with
//! them every hold; a claim or lease naming it is then taken over at once (see `mod.rs`).
//! A host that vanishes without closing them is seen gone by the database's keepalives,
//! which these connections shorten to about half a minute. One connection lost while the
//! process lives — a proxy's idle cut, an operator's `pg_terminate_backend`, a network
//! blip — leaves the other holding, so a live instance's validation handler is not run a
//! second time beside it nor its result posted twice; the lost hold is taken again at the
//! next check ([`CHECK_EVERY`]). A check that takes too long replaces its connection only
//! once the new one holds.
//!
//! The owner number is the instance's name in claims and leases: random, and checked at
//! open to be held by nobody (an exclusive try-lock, given up once the shared hold is
//! taken), so that two instances never answer to one name.
//!
//! The same connections hold `(OPEN_KEY, hashtext(schema))` shared: the schema is open.
//! A copy from sled ([`CopyLock`]) holds `(COPY_KEY, hashtext(schema))` exclusively while
//! it writes, and writes only while no other store has the schema open; a store does not
//! open while a copy holds it. Each side takes its own lock before it looks for the
//! other's, so that of a store and a copy starting together, one sees the other; and the
//! copy looks again before each batch it commits, so that a store whose holds were all
//! lost when it first looked stops the copy once it holds again. (An instance serving
//! beside the copy would book again a retry of a callback sled booked, not yet copied.)

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::{Connection, Executor as _, PgConnection};

use super::super::StoreError;

/// The first key of every liveness lock ("payh").
const LOCK_KEY: i32 = 0x7061_7968;

/// The first key of the lock every open store of a schema holds shared ("payo").
const OPEN_KEY: i32 = 0x7061_796f;

/// The first key of the lock a copy from sled holds exclusively while it writes ("payc").
const COPY_KEY: i32 = 0x7061_7963;

/// How many connections hold an instance's lock: all of them must be gone for other
/// instances to take its claims over.
pub(super) const HOLDERS: usize = 2;

/// How often each holding connection is checked (and how long its check may take), and a
/// lost hold taken again.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// How long a copy waits for the stores of its schema to close (an instance stopped just
/// before: its connections end a moment after its process) before it refuses.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Owner numbers tried at open before giving up (each taken by a live instance, which with
/// 2³¹ numbers means something else is wrong).
const OWNER_TRIES: usize = 8;

/// The session settings of a holding connection: never closed for idling between its
/// checks, whatever the server's or role's `idle_session_timeout` (a merchant's pool given
/// to [`PgStore::with_pool`](super::PgStore::with_pool) does not turn it off as payhook's
/// does), and its client seen gone within about 25 s by the server's keepalives when its
/// host vanishes (the server's default waits two hours). Ignored over a Unix socket.
const HOLDER_SETTINGS: [(&str, &str); 5] = [
    ("idle_session_timeout", "0"),
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "25000"),
];

/// A statement setting `settings` for the session, each only where the server knows it
/// (`idle_session_timeout` is new in PostgreSQL 14, `tcp_user_timeout` in 12): a server
/// too old for payhook is then refused by the version check, saying so, not by a setting.
pub(super) fn set_where_known(settings: &[(&str, &str)]) -> String {
    let wanted: Vec<String> = settings
        .iter()
        .map(|(name, value)| format!("('{name}', '{value}')"))
        .collect();
    format!(
        "SELECT set_config(name, value, false) FROM (VALUES {}) AS wanted (name, value) \
         WHERE current_setting(name, true) IS NOT NULL",
        wanted.join(", ")
    )
}

/// An instance's liveness: its owner number and the task keeping its holds, which ends
/// (letting every hold go) when this is dropped.
pub(super) struct Liveness {
    /// The instance's number in claims and leases.
    pub(super) owner: i32,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Picks an owner number nobody holds, holds it and `schema` open on [`HOLDERS`]
/// connections, and keeps the holds on a task for as long as the [`Liveness`] lives.
///
/// # Errors
///
/// [`StoreError::Backend`] when a copy from sled holds `schema`, or the database fails.
pub(super) async fn hold(pool: &PgPool, schema: &str) -> Result<Liveness, StoreError> {
    let (owner, mut first) = take_owner(pool).await?;
    open_schema(&mut first, schema).await?;
    if copying(&mut first, schema, owner).await? {
        return Err(StoreError::backend_message(format!(
            "a copy from sled (payhook store copy-from-sled) holds schema {schema}: open it \
             once the copy has finished (an instance serving beside the copy would book again \
             a retry of a callback sled booked)"
        )));
    }
    let mut holders = vec![Some(first)];
    for _ in 1..HOLDERS {
        holders.push(Some(lock(pool, owner, schema).await?));
    }
    let (pool, schema) = (pool.clone(), schema.to_owned());
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            for holder in &mut holders {
                keep(&pool, owner, &schema, holder).await;
            }
        }
    });
    Ok(Liveness { owner, task })
}

/// Checks one holding connection, and takes the hold again on a new one where it is lost.
/// A connection whose check does not answer in time is kept until the new one holds: it
/// may hold still, and with every holder dropped at once the instance would look dead.
async fn keep(pool: &PgPool, owner: i32, schema: &str, holder: &mut Option<PgConnection>) {
    if let Some(conn) = holder.as_mut() {
        match tokio::time::timeout(CHECK_EVERY, conn.ping()).await {
            Ok(Ok(())) => return,
            Ok(Err(_)) => {
                tracing::warn!(
                    "a connection holding the instance's liveness lock is lost; taking it again"
                );
                *holder = None;
            }
            Err(_) => tracing::warn!(
                "a connection holding the instance's liveness lock does not answer; holding \
                 it on a new one"
            ),
        }
    }
    match lock(pool, owner, schema).await {
        Ok(mut conn) => {
            tracing::info!("the instance's liveness lock is held on a new connection");
            // Only possible had every hold been lost at once, when the copy looked: it stops
            // at its next batch, seeing this hold.
            if copying(&mut conn, schema, owner).await.unwrap_or(false) {
                tracing::error!(
                    schema,
                    "a copy from sled holds the schema this instance serves: it stops at its \
                     next batch; a retry of a callback sled booked that it has not reached may \
                     be booked again meanwhile"
                );
            }
            *holder = Some(conn);
        }
        Err(error) => {
            tracing::warn!(error = %crate::report::InLine(&error), "the instance's liveness lock cannot be taken on a new connection; if no connection holds it, its claims may be taken over");
        }
    }
}

/// A random owner number held by no other instance, and a connection holding it.
async fn take_owner(pool: &PgPool) -> Result<(i32, PgConnection), StoreError> {
    for _ in 0..OWNER_TRIES {
        let owner = random_owner()?;
        let mut conn = connection(pool).await?;
        // Nobody else holds the number if its exclusive lock is free; the shared hold is
        // taken under it (a session never waits for its own lock), then the exclusive one
        // is given up so that the instance's other connections can share the number.
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(LOCK_KEY)
            .bind(owner)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| StoreError::backend("cannot take the liveness lock", e))?;
        if !free {
            continue;
        }
        share(&mut conn, owner).await?;
        sqlx::query("SELECT pg_advisory_unlock($1, $2)")
            .bind(LOCK_KEY)
            .bind(owner)
            .execute(&mut conn)
            .await
            .map_err(|e| StoreError::backend("cannot take the liveness lock", e))?;
        return Ok((owner, conn));
    }
    Err(StoreError::backend_message(
        "no free number for the instance's liveness lock: every one tried is held",
    ))
}

/// A new connection (taken out of the pool) sharing the lock of `owner`, and holding
/// `schema` open.
async fn lock(pool: &PgPool, owner: i32, schema: &str) -> Result<PgConnection, StoreError> {
    let mut conn = connection(pool).await?;
    share(&mut conn, owner).await?;
    open_schema(&mut conn, schema).await?;
    Ok(conn)
}

async fn share(conn: &mut PgConnection, owner: i32) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_lock_shared($1, $2)")
        .bind(LOCK_KEY)
        .bind(owner)
        .execute(conn)
        .await
        .map_err(|e| StoreError::backend("cannot take the liveness lock", e))?;
    Ok(())
}

/// Holds `schema` open on `conn` (shared with every other store of it).
async fn open_schema(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "SELECT pg_advisory_lock_shared({OPEN_KEY}, hashtext($1))"
    ))
    .bind(schema)
    .execute(conn)
    .await
    .map_err(|e| StoreError::backend("cannot hold the schema open", e))?;
    Ok(())
}

/// Whether a copy from sled other than one of instance `owner`'s holds `schema`.
async fn copying(conn: &mut PgConnection, schema: &str, owner: i32) -> Result<bool, StoreError> {
    sqlx::query_scalar(&format!(
        "SELECT EXISTS (SELECT 1 FROM pg_locks c WHERE {} AND {})",
        schema_lock("c", COPY_KEY),
        not_of(owner, "c")
    ))
    .bind(schema)
    .fetch_one(conn)
    .await
    .map_err(|e| StoreError::backend("cannot read whether a copy from sled is under way", e))
}

/// SQL true of a row `row` of `pg_locks` that is a granted advisory lock `(key, second)` of
/// this database (`second`: SQL for the lock's second key).
fn advisory_held(row: &str, key: i32, second: &str) -> String {
    format!(
        "{row}.locktype = 'advisory' AND {row}.granted AND {row}.classid = {key}::oid \
           AND {row}.objid = ({second})::oid AND {row}.objsubid = 2 \
           AND {row}.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
}

/// SQL true of a granted row `row` of `pg_locks` for `(key, hashtext($1))`.
fn schema_lock(row: &str, key: i32) -> String {
    advisory_held(row, key, "hashtext($1)")
}

/// SQL true of a row `row` of `pg_locks` held by a session that does not hold instance
/// `owner`'s liveness lock.
fn not_of(owner: i32, row: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = {row}.pid AND {})",
        advisory_held("l", LOCK_KEY, &owner.to_string())
    )
}

/// SQL that is true while the instance named by the claim owner column `column` lives
/// (holds its liveness lock on some connection).
pub(super) fn owner_alive(column: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM pg_locks l WHERE {})",
        advisory_held("l", LOCK_KEY, column)
    )
}

/// A schema's copy lock, held on a connection of its own for as long as the copy writes
/// (see the module docs).
pub(super) struct CopyLock {
    conn: PgConnection,
    schema: String,
    /// The copy's own store, whose connections are not another store's.
    owner: i32,
}

impl CopyLock {
    /// The copy lock of `schema`, once no store but the copy's own (instance `owner`) has
    /// the schema open.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when another copy holds the schema, when other stores
    /// still have it open after [`CLOSE_WAIT`], or when the database fails.
    pub(super) async fn take(pool: &PgPool, schema: &str, owner: i32) -> Result<Self, StoreError> {
        let mut conn = connection(pool).await?;
        // Counted as the copy's store's own: its copy lock is not another copy's.
        share(&mut conn, owner).await?;
        let alone: bool = sqlx::query_scalar(&format!(
            "SELECT pg_try_advisory_lock({COPY_KEY}, hashtext($1))"
        ))
        .bind(schema)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| StoreError::backend("cannot lock the schema for the copy", e))?;
        if !alone {
            return Err(StoreError::backend_message(format!(
                "another copy from sled holds schema {schema}: let it finish"
            )));
        }
        let mut lock = Self {
            conn,
            schema: schema.to_owned(),
            owner,
        };
        let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
        loop {
            match lock.others().await? {
                None => return Ok(lock),
                Some(others) if tokio::time::Instant::now() >= deadline => {
                    return Err(lock.open_elsewhere(&others));
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Fails when another store has opened the schema since (one whose every hold was lost
    /// when the copy looked, now holding again), or the lock's connection is lost (and the
    /// lock with it).
    pub(super) async fn still_alone(&mut self) -> Result<(), StoreError> {
        match self.others().await {
            Ok(None) => Ok(()),
            Ok(Some(others)) => Err(self.open_elsewhere(&others)),
            Err(error) => Err(StoreError::backend(
                "the copy's lock on the schema is lost; run the copy again (it writes nothing \
                 twice)",
                error,
            )),
        }
    }

    /// Lets the schema go, at once (a store opened next does not see it held).
    pub(super) async fn release(mut self) {
        let unlocked = sqlx::query(&format!(
            "SELECT pg_advisory_unlock({COPY_KEY}, hashtext($1))"
        ))
        .bind(&self.schema)
        .execute(&mut self.conn)
        .await;
        if let Err(error) = unlocked.map(drop).and(self.conn.close().await) {
            tracing::debug!(error = %crate::report::InLine(&error), "the copy's lock connection closed uncleanly");
        }
    }

    /// The sessions of other stores holding the schema open, described, if any.
    async fn others(&mut self) -> Result<Option<String>, StoreError> {
        let described: Option<String> = sqlx::query_scalar(&format!(
            "SELECT string_agg(format('pid %s (%s from %s, connected %s)', a.pid, \
               a.application_name, coalesce(host(a.client_addr), 'a local socket'), \
               to_char(a.backend_start, 'YYYY-MM-DD HH24:MI:SS TZ')), ', ' ORDER BY a.pid) \
             FROM pg_stat_activity a WHERE a.pid IN \
               (SELECT o.pid FROM pg_locks o WHERE {} AND {})",
            schema_lock("o", OPEN_KEY),
            not_of(self.owner, "o")
        ))
        .bind(&self.schema)
        .fetch_one(&mut self.conn)
        .await
        .map_err(|e| StoreError::backend("cannot read which stores have the schema open", e))?;
        Ok(described)
    }

    fn open_elsewhere(&self, others: &str) -> StoreError {
        StoreError::backend_message(format!(
            "schema {} is open elsewhere (two sessions per payhook instance or tool: {others}): \
             stop every one using it, then copy (an instance serving beside the copy would book \
             again a retry of a callback sled booked)",
            self.schema
        ))
    }
}

/// A connection of the instance's own: taken out of the pool, so that it stays open for as
/// long as the store does, with [`HOLDER_SETTINGS`].
async fn connection(pool: &PgPool) -> Result<PgConnection, StoreError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| StoreError::backend("cannot connect for the liveness lock", e))?
        .detach();
    conn.execute(set_where_known(&HOLDER_SETTINGS).as_str())
        .await
        .map_err(|e| StoreError::backend("cannot connect for the liveness lock", e))?;
    Ok(conn)
}

/// A positive `int4`, random, so that instances starting together pick different numbers.
fn random_owner() -> Result<i32, StoreError> {
    let mut id = [0u8; 4];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id)
        .map_err(|_| StoreError::backend_message("no randomness for the instance's name"))?;
    Ok(i32::from_le_bytes(id) & 0x7fff_ffff)
}
