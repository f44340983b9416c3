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

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::{Connection, PgConnection};

use super::super::StoreError;

/// The first key of every liveness lock ("payh").
pub(super) const LOCK_KEY: i32 = 0x7061_7968;

/// How many connections hold an instance's lock: all of them must be gone for other
/// instances to take its claims over.
pub(super) const HOLDERS: usize = 2;

/// How often each holding connection is checked (and how long its check may take), and a
/// lost hold taken again.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Owner numbers tried at open before giving up (each taken by a live instance, which with
/// 2³¹ numbers means something else is wrong).
const OWNER_TRIES: usize = 8;

/// An instance's liveness: its owner number and the task keeping its holds.
pub(super) struct Liveness {
    pub(super) owner: i32,
    pub(super) task: tokio::task::JoinHandle<()>,
}

/// Picks an owner number nobody holds, holds it on [`HOLDERS`] connections, and keeps the
/// holds on a task until the task is aborted.
pub(super) async fn hold(pool: &PgPool) -> Result<Liveness, StoreError> {
    let (owner, first) = take_owner(pool).await?;
    let mut holders = vec![Some(first)];
    for _ in 1..HOLDERS {
        holders.push(Some(lock(pool, owner).await?));
    }
    let pool = pool.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            for holder in &mut holders {
                keep(&pool, owner, holder).await;
            }
        }
    });
    Ok(Liveness { owner, task })
}

/// Checks one holding connection, and takes the hold again on a new one where it is lost.
async fn keep(pool: &PgPool, owner: i32, holder: &mut Option<PgConnection>) {
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
    match lock(pool, owner).await {
        Ok(conn) => {
            tracing::info!("the instance's liveness lock is held again");
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

/// A new connection (taken out of the pool) sharing the lock of `owner`.
async fn lock(pool: &PgPool, owner: i32) -> Result<PgConnection, StoreError> {
    let mut conn = connection(pool).await?;
    share(&mut conn, owner).await?;
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
