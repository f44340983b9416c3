//! What the schema's records reach back to across changes of `store.retention` (see
//! [`crate::store::horizon`]): one row, `{schema}.vouched`, shared by every instance.
//!
//! Each instance that serves moves it on by its own retention when it opens and again at
//! each sweep (under a lock on the table, so that two do not both start from the same row):
//! an instance opened since with a longer retention recorded a growth that an instance
//! still writing with the shorter one takes back at its next sweep, and the growth counts
//! from the next sweep of one with the longer — from when no shorter writer is left, give
//! or take a sweep. An operator's command reads it. An instance judges by its own retention
//! at most. Like the read indexes, the table has no schema version: an older payhook
//! ignores it (and does not move it on).

use sqlx::PgConnection;
use sqlx::{Connection as _, Executor as _};
use std::time::Duration;

use crate::store::StoreError;
use crate::store::horizon::{self, Opener, Vouched};

/// The table, where the schema lacks it.
const TABLE: &str = "CREATE TABLE IF NOT EXISTS {schema}.vouched (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    record text NOT NULL
)";

/// Builds the table where the schema lacks it (under the migrations' lock).
pub(super) async fn build(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    (&mut *conn)
        .execute(sqlx::raw_sql(&TABLE.replace("{schema}", schema)))
        .await
        .map_err(|e| StoreError::backend(format!("cannot build {schema}.vouched"), e))?;
    Ok(())
}

/// The schema's record as an open with `retention` by `opener` finds it (see
/// [`horizon::at_open`]); a service's open moves it on and writes it back, under a lock on
/// the table (two opens do not both start from the same record). Times are this process's,
/// as [`crate::store::Store::reach`] reads them.
pub(super) async fn at_open(
    conn: &mut PgConnection,
    schema: &str,
    retention: Duration,
    opener: Opener,
) -> Result<Vouched, StoreError> {
    let failed = |e| StoreError::backend(format!("cannot update {schema}.vouched"), e);
    let mut tx = conn.begin().await.map_err(failed)?;
    let serves = opener == Opener::Service;
    if serves {
        sqlx::query(&format!(
            "LOCK TABLE {schema}.vouched IN SHARE ROW EXCLUSIVE MODE"
        ))
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    }
    let stored: Option<String> =
        sqlx::query_scalar(&format!("SELECT record FROM {schema}.vouched"))
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed)?;
    let newest_expiry_ms: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT (extract(epoch FROM max(expires_at)) * 1000)::bigint FROM {schema}.callbacks"
    ))
    .fetch_one(&mut *tx)
    .await
    .map_err(failed)?;
    let vouched = horizon::at_open(
        stored.as_deref().map(str::as_bytes),
        retention,
        || Ok(newest_expiry_ms.map(|ms| u64::try_from(ms).unwrap_or_default())),
        (crate::store::now_ms(), serves),
    )?;
    let record = vouched.encode()?;
    if serves && stored.as_deref() != Some(record.as_str()) {
        sqlx::query(&format!(
            "INSERT INTO {schema}.vouched (record) VALUES ($1) \
             ON CONFLICT (only_row) DO UPDATE SET record = EXCLUDED.record"
        ))
        .bind(record)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)?;
    Ok(vouched)
}
