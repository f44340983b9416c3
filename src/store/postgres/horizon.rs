//! What the schema's records reach back to across changes of `store.retention` (see
//! [`crate::store::horizon`]): one row, `{schema}.vouched`, shared by every instance.
//!
//! Each instance that serves moves it on by its own retention when it opens and again at
//! each sweep (under a lock on the table, so that two do not both start from the same row):
//! a growth an instance with a longer retention records counts from two of its sweeps
//! later, and an instance still writing with the shorter one moves the record back at its
//! next sweep — so the growth counts only once none has written with the shorter one since
//! (one that stopped before its next sweep wrote nothing after that). An operator's command
//! reads it. An instance judges by its own retention at most. Like the read indexes, the
//! table has no schema version: an older payhook ignores it (and does not move it on), so
//! every instance is upgraded before the retention is raised.
//!
//! Beside it, `{schema}.clock_step` keeps a step of the database's clock a sweeper caught
//! (one row, or none; see [`horizon::PurgeClock`]): read as an instance's sweeper starts, at
//! each of its sweeps and at each check of the clock between them (every minute), and
//! written — merged with what another instance wrote since, under a lock — by the sweep or
//! the check that caught, shrank or dropped it, before anything is purged by it. An instance
//! drops only a step it holds itself, or one that aged out by its own elapsed time.

use sqlx::PgConnection;
use sqlx::{Connection as _, Executor as _};
use std::time::Duration;

use crate::store::StoreError;
use crate::store::horizon::{self, Opener, Step, StepChange, Vouched};

/// The table, where the schema lacks it.
const TABLE: &str = "CREATE TABLE IF NOT EXISTS {schema}.vouched (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    record text NOT NULL
)";

/// The table of the step of the database's clock a sweep caught (see
/// [`horizon::PurgeClock`]), where the schema lacks it: one row, shared by every instance,
/// since they all read the same clock.
const STEP_TABLE: &str = "CREATE TABLE IF NOT EXISTS {schema}.clock_step (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    record text NOT NULL
)";

/// Builds the tables where the schema lacks them (under the migrations' lock).
pub(super) async fn build(conn: &mut PgConnection, schema: &str) -> Result<(), StoreError> {
    (&mut *conn)
        .execute(sqlx::raw_sql(&TABLE.replace("{schema}", schema)))
        .await
        .map_err(|e| StoreError::backend(format!("cannot build {schema}.vouched"), e))?;
    (&mut *conn)
        .execute(sqlx::raw_sql(&STEP_TABLE.replace("{schema}", schema)))
        .await
        .map_err(|e| StoreError::backend(format!("cannot build {schema}.clock_step"), e))?;
    Ok(())
}

/// The step of the database's clock the schema keeps; one that does not decode is taken as
/// none.
pub(super) async fn kept_step(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<Option<Step>, StoreError> {
    let stored = stored_step(conn, schema)
        .await
        .map_err(|e| StoreError::backend(format!("cannot read {schema}.clock_step"), e))?;
    Ok(Step::decode(stored.as_deref().map(str::as_bytes)))
}

/// The schema's step record as stored, if any.
async fn stored_step(conn: &mut PgConnection, schema: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(&format!("SELECT record FROM {schema}.clock_step"))
        .fetch_optional(conn)
        .await
}

/// Keeps the step `change` gives as the schema's, under a lock on the table, and returns
/// what the schema keeps then. Where another instance changed it since this one last read
/// it (`change.kept`), the two are merged, never to hold back less: a step of both, the
/// further ([`Step::further`]); theirs where this one would drop it; this one's where
/// theirs was dropped. A new step with a smaller lead than the one kept is merged too.
pub(super) async fn keep_step(
    conn: &mut PgConnection,
    schema: &str,
    change: StepChange,
) -> Result<Option<Step>, StoreError> {
    let failed = |e| StoreError::backend(format!("cannot update {schema}.clock_step"), e);
    let mut tx = conn.begin().await.map_err(failed)?;
    lock(&mut tx, &format!("{schema}.clock_step"))
        .await
        .map_err(failed)?;
    let stored = stored_step(&mut tx, schema).await.map_err(failed)?;
    let current = Step::decode(stored.as_deref().map(str::as_bytes));
    let keep = if current == change.kept {
        match (current, change.step) {
            (Some(current), Some(ours)) => Some(current.replaced_by(ours)),
            _ => change.step,
        }
    } else {
        match (current, change.step) {
            (Some(theirs), Some(ours)) => Some(theirs.further(ours)),
            (Some(theirs), None) => Some(theirs),
            (None, ours) => ours,
        }
    };
    if keep != current || (stored.is_some() && current.is_none()) {
        let sql = match keep {
            Some(_) => format!(
                "INSERT INTO {schema}.clock_step (record) VALUES ($1) \
                 ON CONFLICT (only_row) DO UPDATE SET record = EXCLUDED.record"
            ),
            None => format!("DELETE FROM {schema}.clock_step"),
        };
        let query = sqlx::query(&sql);
        let query = match keep {
            Some(step) => query.bind(step.encode()?),
            None => query,
        };
        query.execute(&mut *tx).await.map_err(failed)?;
    }
    tx.commit().await.map_err(failed)?;
    Ok(keep)
}

/// The schema's record as an open with `retention` by `opener` finds it (see
/// [`horizon::at_open`]); a service's open moves it on and writes it back, under a lock on
/// the table (two opens do not both start from the same record), a growth counting from
/// `settle` later (see the module docs). A lock not granted within [`LOCK_WAIT`] (another
/// instance's transaction on it stalled), or within a shorter `store.statement_timeout`,
/// leaves the record as it is, read: the sweep and the open go on. Times are this
/// process's, as [`crate::store::Store::reach`] reads them.
pub(super) async fn at_open(
    conn: &mut PgConnection,
    schema: &str,
    retention: Duration,
    (opener, settle): (Opener, Duration),
) -> Result<Vouched, StoreError> {
    if opener == Opener::Service {
        if let Some(moved) = moved_on(conn, schema, retention, settle).await? {
            return Ok(moved);
        }
        tracing::warn!(
            schema,
            "the record of the retention the records were written with is locked by a \
             stalled transaction: read, not moved on, this time"
        );
    }
    let stored = stored(conn, schema)
        .await
        .map_err(|e| StoreError::backend(format!("cannot read {schema}.vouched"), e))?;
    Ok(horizon::at_open(
        stored.as_deref().map(str::as_bytes),
        retention,
        false,
        (crate::store::now_ms(), false, settle),
    ))
}

/// How long an open or a sweep waits for the record's lock.
const LOCK_WAIT: &str = "2s";

/// [`at_open`] for a service: the record moved on and written back, in one transaction;
/// `None` when its lock was not granted within [`LOCK_WAIT`] (55P03), or within a statement
/// timeout shorter than that (57014).
async fn moved_on(
    conn: &mut PgConnection,
    schema: &str,
    retention: Duration,
    settle: Duration,
) -> Result<Option<Vouched>, StoreError> {
    let failed = |e| StoreError::backend(format!("cannot update {schema}.vouched"), e);
    let mut tx = conn.begin().await.map_err(failed)?;
    match lock(&mut tx, &format!("{schema}.vouched")).await {
        Err(error) if super::refused_with(&error, &["55P03", "57014"]) => return Ok(None),
        locked => locked.map_err(failed)?,
    };
    let (stored, holds_records) = read_locked(&mut tx, schema).await.map_err(failed)?;
    let vouched = horizon::at_open(
        stored.as_deref().map(str::as_bytes),
        retention,
        holds_records,
        (crate::store::now_ms(), true, settle),
    );
    let record = vouched.encode()?;
    if stored.as_deref() != Some(record.as_str()) {
        write(&mut tx, schema, record).await.map_err(failed)?;
    }
    tx.commit().await.map_err(failed)?;
    Ok(Some(vouched))
}

/// Locks a one-row `table` in the transaction on `conn`, waiting at most [`LOCK_WAIT`]: two
/// that move its record on do not both start from the same record.
async fn lock(conn: &mut PgConnection, table: &str) -> Result<(), sqlx::Error> {
    conn.execute(sqlx::raw_sql(&format!(
        "SET LOCAL lock_timeout = '{LOCK_WAIT}'; \
         LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"
    )))
    .await
    .map(|_| ())
}

/// The schema's record, and whether it holds callback records, read under [`lock`].
async fn read_locked(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<(Option<String>, bool), sqlx::Error> {
    let stored = stored(conn, schema).await?;
    let holds_records =
        sqlx::query_scalar(&format!("SELECT EXISTS (SELECT 1 FROM {schema}.callbacks)"))
            .fetch_one(&mut *conn)
            .await?;
    Ok((stored, holds_records))
}

/// Writes `record` as the schema's.
async fn write(conn: &mut PgConnection, schema: &str, record: String) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "INSERT INTO {schema}.vouched (record) VALUES ($1) \
         ON CONFLICT (only_row) DO UPDATE SET record = EXCLUDED.record"
    ))
    .bind(record)
    .execute(conn)
    .await
    .map(|_| ())
}

/// Writes into the schema's record that a copy from sled brings records reaching back to
/// `copied` (sled's record, as read): a schema that holds no callback records takes it as it
/// is — sled's store moved, as it was — and one that holds some (read as an open with
/// `retention` would) joins it, no further back than either (see [`Vouched::joined`]) —
/// unless its record is `copied` already (the copy run again). Written before the first
/// record is copied, so that a copy run again finds it. No
/// instance serves the schema meanwhile (the copy holds it alone); the lock is waited for
/// [`LOCK_WAIT`], then the copy fails.
pub(super) async fn copied_in(
    conn: &mut PgConnection,
    schema: &str,
    retention: Duration,
    copied: Vouched,
) -> Result<(), StoreError> {
    let failed = |e| StoreError::backend(format!("cannot update {schema}.vouched"), e);
    let mut tx = conn.begin().await.map_err(failed)?;
    lock(&mut tx, &format!("{schema}.vouched"))
        .await
        .map_err(failed)?;
    let (stored, holds_records) = read_locked(&mut tx, schema).await.map_err(failed)?;
    let now = crate::store::now_ms();
    let ours = copied.encode()?;
    // The copy run again (after an interruption, or with --again before any instance
    // served): the record it wrote, kept as it is — joined with itself, its growth would
    // age from now.
    let vouched = if stored.as_deref() == Some(ours.as_str()) {
        copied
    } else if holds_records {
        let own = horizon::at_open(
            stored.as_deref().map(str::as_bytes),
            retention,
            true,
            (now, false, Duration::ZERO),
        );
        own.joined(copied, now)
    } else {
        copied
    };
    write(&mut tx, schema, vouched.encode()?)
        .await
        .map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    tracing::info!(
        reach_days = vouched.reach(now).as_secs() / 86_400,
        joined = vouched != copied,
        "how far back the records reach, with the copy's: recorded in {schema}.vouched"
    );
    Ok(())
}

/// The schema's record, if any.
async fn stored(conn: &mut PgConnection, schema: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(&format!("SELECT record FROM {schema}.vouched"))
        .fetch_optional(&mut *conn)
        .await
}
