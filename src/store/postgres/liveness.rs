//! Each instance's liveness, as other instances see it: a session advisory lock
//! (`pg_advisory_lock(LOCK_KEY, owner)`) held on a connection of the instance's own for as
//! long as the store is open. A process that dies loses its connections, and with them the
//! lock; a claim naming it is then taken over at once (see `mod.rs`).

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::{Connection, PgConnection};

use super::super::StoreError;

/// The first key of every liveness lock ("payh").
pub(super) const LOCK_KEY: i32 = 0x7061_7968;

/// How often the lock's connection is checked, and taken again once lost.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Takes the lock for `owner`, and keeps it on a task until the task is aborted.
pub(super) async fn hold(
    pool: &PgPool,
    owner: i32,
) -> Result<tokio::task::JoinHandle<()>, StoreError> {
    let conn = lock(pool, owner).await?;
    let pool = pool.clone();
    Ok(tokio::spawn(async move {
        let mut conn = Some(conn);
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let alive = match conn.as_mut() {
                Some(conn) => conn.ping().await.is_ok(),
                None => false,
            };
            if !alive {
                conn = match lock(&pool, owner).await {
                    Ok(conn) => {
                        tracing::info!("the instance's liveness lock is held again");
                        Some(conn)
                    }
                    Err(error) => {
                        tracing::warn!(error = %crate::report::InLine(&error), "the instance's liveness lock is lost; its claims may be taken over");
                        None
                    }
                };
            }
        }
    }))
}

/// A connection of its own (taken out of the pool) holding the lock.
async fn lock(pool: &PgPool, owner: i32) -> Result<PgConnection, StoreError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| StoreError::backend("cannot connect for the liveness lock", e))?
        .detach();
    sqlx::query("SELECT pg_advisory_lock($1, $2)")
        .bind(LOCK_KEY)
        .bind(owner)
        .execute(&mut conn)
        .await
        .map_err(|e| StoreError::backend("cannot take the liveness lock", e))?;
    Ok(conn)
}
