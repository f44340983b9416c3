//! What the schema's records reach back to across changes of `store.retention` (see
//! [`crate::store::horizon`]): one row, `{schema}.vouched`, shared by every instance.
//!
//! Each instance moves it on when it opens (under a lock on the table, so that two opens do
//! not both start from the same row), and reads it again at each sweep: an instance opened
//! since with another retention changed what every instance's records reach. An instance
//! still judges by its own retention at most. Like the read indexes, the table has no schema
//! version: an older payhook ignores it (and does not move it on when it opens).

use sqlx::PgConnection;
use sqlx::{Connection as _, Executor as _};
use std::time::Duration;

use crate::store::StoreError;
use crate::store::horizon::Vouched;

/// The table, where the schema lacks it.
const TABLE: &str = "CREATE TABLE IF NOT EXISTS {schema}.vouched (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    record text NOT NULL
)";

/// The database's time, in milliseconds since the Unix epoch: the clock its records'
/// expiries are written by.
const NOW_MS: &str = "SELECT (extract(epoch FROM now()) * 1000)::bigint";

/// Builds the table where the schema lacks it (under the migrations' lock).
pub(super) async fn build(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    (&mut *conn)
        .execute(sqlx::raw_sql(&TABLE.replace("{schema}", schema)))
        .await
        .map_err(|e| StoreError::backend(format!("cannot build {schema}.vouched"), e))?;
    Ok(())
}

/// The schema's row moved on by an open with `retention`, and written back.
pub(super) async fn at_open(
    conn: &mut PgConnection,
    schema: &str,
    retention: Duration,
) -> Result<Vouched, StoreError> {
    let failed = |e| StoreError::backend(format!("cannot update {schema}.vouched"), e);
    let mut tx = conn.begin().await.map_err(failed)?;
    sqlx::query(&format!(
        "LOCK TABLE {schema}.vouched IN SHARE ROW EXCLUSIVE MODE"
    ))
    .execute(&mut *tx)
    .await
    .map_err(failed)?;
    let stored = read(&mut tx, schema).await?;
    let now: i64 = sqlx::query_scalar(NOW_MS)
        .fetch_one(&mut *tx)
        .await
        .map_err(failed)?;
    let vouched = stored
        .unwrap_or_else(|| Vouched::new(retention))
        .opened_with(retention, u64::try_from(now).unwrap_or_default());
    let record = serde_json::to_string(&vouched)
        .map_err(|e| StoreError::backend("cannot encode the store's retention record", e))?;
    sqlx::query(&format!(
        "INSERT INTO {schema}.vouched (record) VALUES ($1) \
         ON CONFLICT (only_row) DO UPDATE SET record = EXCLUDED.record"
    ))
    .bind(record)
    .execute(&mut *tx)
    .await
    .map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    Ok(vouched)
}

/// The schema's row, if any.
pub(super) async fn read(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<Option<Vouched>, StoreError> {
    let record: Option<String> =
        sqlx::query_scalar(&format!("SELECT record FROM {schema}.vouched"))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| StoreError::backend(format!("cannot read {schema}.vouched"), e))?;
    record
        .map(|record| {
            serde_json::from_str(&record)
                .map_err(|e| StoreError::backend("the store's retention record does not decode", e))
        })
        .transpose()
}
