//! Each instance's liveness, as other instances see it: a session advisory lock
//! `(LOCK_KEY, owner)` held in shared mode on [`HOLDERS`] connections of the instance's own
//! for as long as the store is open. A process that dies loses its connections, and with
//! them every hold; a claim or lease naming it is then taken over at once (see `mod.rs`).
//! One connection lost while the process lives — a proxy's idle cut, an operator's
//! `pg_terminate_backend`, a network blip — leaves the other holding, so a live instance's
//! validation handler is not run a second time beside it nor its result posted twice; the
//! lost hold is taken again within [`CHECK_EVERY`].
//!
//! The owner number is the instance's name in claims and leases: random, and checked at
//! open to be held by nobody (an exclusive try-lock, given up once the shared hold is
//! taken), so that two instances never answer to one name.
//!
//! The same connections hold `(OPEN_KEY, hashtext(schema))` shared: the schema is open.
//! A copy from sled ([`copy_alone`]) holds `(COPY_KEY, hashtext(schema))` exclusively while
//! it writes, and starts only once no other store has the schema open; a store does not
//! open while a copy writes. Each side takes its own lock before it looks for the other's,
//! so that of a store and a copy starting together, one sees the other. (An instance
//! serving beside the copy would book again a retry of a callback sled booked, not yet
//! copied.)

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::{Connection, PgConnection};

use super::super::StoreError;

/// The first key of every liveness lock ("payh").
pub(super) const LOCK_KEY: i32 = 0x7061_7968;

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

/// An instance's liveness: its owner number and the task keeping its holds.
pub(super) struct Liveness {
    pub(super) owner: i32,
    pub(super) task: tokio::task::JoinHandle<()>,
}

/// Picks an owner number nobody holds, holds it and `schema` open on [`HOLDERS`]
/// connections, and keeps the holds on a task until the task is aborted.
///
/// # Errors
///
/// [`StoreError::Backend`] when a copy from sled writes into `schema`, or the database
/// fails.
pub(super) async fn hold(pool: &PgPool, schema: &str) -> Result<Liveness, StoreError> {
    let (owner, mut first) = take_owner(pool).await?;
    open_schema(&mut first, schema).await?;
    if copying(&mut first, schema).await? {
        return Err(StoreError::backend_message(format!(
            "a copy from sled (payhook store copy-from-sled) is writing into schema {schema}: \
             start the instances once it has finished (one serving beside it would book again \
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
async fn keep(pool: &PgPool, owner: i32, schema: &str, holder: &mut Option<PgConnection>) {
    if let Some(conn) = holder.as_mut() {
        if matches!(
            tokio::time::timeout(CHECK_EVERY, conn.ping()).await,
            Ok(Ok(()))
        ) {
            return;
        }
        tracing::warn!(
            "a connection holding the instance's liveness lock is lost; taking it again"
        );
        *holder = None;
    }
    match lock(pool, owner, schema).await {
        Ok(mut conn) => {
            tracing::info!("the instance's liveness lock is held again");
            // Only possible had every hold been lost at once: the copy then saw none.
            if copying(&mut conn, schema).await.unwrap_or(false) {
                tracing::error!(
                    schema,
                    "a copy from sled is writing into the schema this instance serves: a retry of a callback sled booked that the copy has not reached may be booked again; stop the instance until the copy has finished"
                );
            }
            *holder = Some(conn);
        }
        Err(error) => {
            tracing::warn!(error = %crate::report::InLine(&error), "the instance's liveness lock cannot be taken again; if no connection holds it, its claims may be taken over");
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

/// Whether a copy from sled writes into `schema` now.
async fn copying(conn: &mut PgConnection, schema: &str) -> Result<bool, StoreError> {
    sqlx::query_scalar(&format!(
        "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE {})",
        schema_lock("l", COPY_KEY)
    ))
    .bind(schema)
    .fetch_one(conn)
    .await
    .map_err(|e| StoreError::backend("cannot read whether a copy from sled is under way", e))
}

/// SQL true of a granted row `row` of `pg_locks` for `(key, hashtext($1))` in this
/// database.
fn schema_lock(row: &str, key: i32) -> String {
    format!(
        "{row}.locktype = 'advisory' AND {row}.granted AND {row}.classid = {key}::oid \
           AND {row}.objid = hashtext($1)::oid AND {row}.objsubid = 2 \
           AND {row}.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
}

/// A connection holding `schema`'s copy lock, once no store but the copy's own (instance
/// `owner`) has the schema open: for as long as the connection lives, no store opens it.
///
/// # Errors
///
/// [`StoreError::Backend`] when another copy writes into the schema, when other stores
/// still have it open after [`CLOSE_WAIT`], or when the database fails.
pub(super) async fn copy_alone(
    pool: &PgPool,
    schema: &str,
    owner: i32,
) -> Result<PgConnection, StoreError> {
    let mut conn = connection(pool).await?;
    let alone: bool = sqlx::query_scalar(&format!(
        "SELECT pg_try_advisory_lock({COPY_KEY}, hashtext($1))"
    ))
    .bind(schema)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| StoreError::backend("cannot lock the schema for the copy", e))?;
    if !alone {
        return Err(StoreError::backend_message(format!(
            "another copy from sled is writing into schema {schema}: let it finish"
        )));
    }
    // Connections holding the schema open that do not hold the copy's store's liveness.
    let others = format!(
        "SELECT count(DISTINCT o.pid) FROM pg_locks o WHERE {open} \
           AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = o.pid \
             AND l.locktype = 'advisory' AND l.classid = {LOCK_KEY}::oid \
             AND l.objid = {owner}::oid AND l.objsubid = 2)",
        open = schema_lock("o", OPEN_KEY)
    );
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
    loop {
        let open: i64 = sqlx::query_scalar(&others)
            .bind(schema)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| StoreError::backend("cannot read which stores are open", e))?;
        if open == 0 {
            return Ok(conn);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::backend_message(format!(
                "schema {schema} is open elsewhere ({open} connection(s) of other payhook \
                 instances or tools, two per instance): stop every one using it, then copy \
                 (an instance serving beside the copy would book again a retry of a callback \
                 sled booked)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

/// A connection of the instance's own: taken out of the pool, so that it stays open for as
/// long as the store does, and not closed for idling between its checks whatever the
/// server's or role's `idle_session_timeout` (a merchant's pool given to
/// [`PgStore::with_pool`](super::PgStore::with_pool) does not turn it off as payhook's does).
async fn connection(pool: &PgPool) -> Result<PgConnection, StoreError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| StoreError::backend("cannot connect for the liveness lock", e))?
        .detach();
    sqlx::query("SET idle_session_timeout = 0")
        .execute(&mut conn)
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
