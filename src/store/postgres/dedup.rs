//! Deduplication on PostgreSQL: a callback's claim is the transaction that books it
//! ([`HeldClaim`]), a validation's a lease on the database's clock; marks committed with
//! the merchant's effects; failures for operators.

use std::time::Duration;

use sqlx::{Executor, Row};

use super::super::failing::REASON_BYTES;
use super::super::record::{KeptFingerprint, RecordedDecision};
use super::super::{
    CallbackBegin, CallbackFailure, Claim, DedupStore, DurableFuture, Effects, FailingCallback,
    FailingCursor, FailingPage, Fingerprint, HeldCallback, StoreError, StoreFuture,
    ValidatedPayment, ValidationBegin,
};
use super::claim::{HeldClaim, Lending};
use super::{
    PgStore, TX_ATTEMPTS, claim_id, connection_lost, decode_json, encode_json, new_claim,
    nonce_key, readable, retryable,
};
use crate::logged::cut_bytes;
use crate::model::{Nonce, TransactionStatus};
use crate::postponed::record::PostponedValidation;

/// The failing pairs, most recent failure first, at most `$1` of them (`NULL`: all);
/// through the `callback_failures_latest` index (see [`PgStore::indexed_reads`]).
///
/// A pair whose status is booked is left out: its row is removed by the booking, but a
/// failure recorded while the booking's transaction was open (by a delivery that gave up
/// waiting for it, which cannot see the uncommitted mark) outlives it until that delivery
/// has it forgotten a handler timeout later (`forget_failure_if_booked`), or else until the
/// sweep ([`BOOKED_FAILURES`]). A refused body waits for the booking instead
/// (`record_refused_callback`).
pub(super) const FAILING_LATEST: &str = "SELECT nonce, status, failures, first_failed, last_failed, last_reason, \
       reference_id, client_id, amount, currency \
     FROM {s}.callback_failures f WHERE NOT EXISTS (SELECT 1 FROM {s}.callbacks c \
       WHERE c.nonce_key = f.nonce_key AND c.done @> ARRAY[f.status]) \
     ORDER BY last_failed DESC, nonce COLLATE \"C\", status LIMIT $1";

/// Removes at most `$2` failing pairs whose status is booked (see [`FAILING_LATEST`]); `$1`,
/// the sweep's time, is not needed.
pub(super) const BOOKED_FAILURES: &str = "DELETE FROM {s}.callback_failures WHERE (nonce_key, status) IN \
       (SELECT f.nonce_key, f.status FROM {s}.callback_failures f JOIN {s}.callbacks c \
         ON c.nonce_key = f.nonce_key AND c.done @> ARRAY[f.status] \
       WHERE $1::timestamptz IS NOT NULL LIMIT $2)";

/// [`FAILING_LATEST`] after the pair (`$2` last failed, `$3` nonce, `$4` status): from `$2`
/// down through the same index, the pages before it not read.
pub(super) const FAILING_AFTER: &str = "SELECT nonce, status, failures, first_failed, last_failed, last_reason, \
       reference_id, client_id, amount, currency \
     FROM {s}.callback_failures f \
     WHERE last_failed <= $2 AND (last_failed < $2 OR nonce COLLATE \"C\" > $3 \
       OR (nonce COLLATE \"C\" = $3 AND status > $4)) \
       AND NOT EXISTS (SELECT 1 FROM {s}.callbacks c \
         WHERE c.nonce_key = f.nonce_key AND c.done @> ARRAY[f.status]) \
     ORDER BY last_failed DESC, nonce COLLATE \"C\", status LIMIT $1";

/// Takes the claim lock of the nonce keyed `$1` (the key `{schema}.claim_callback` of
/// migration 2 tries) until the transaction ends, waiting for a claim that holds it: a
/// delivery claiming the nonce meanwhile is told it is busy.
pub(super) const WAIT_FOR_NONCE_CLAIM: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('{s}/callback/' || $1, 11))";

/// What `{schema}.claim_callback` read, with the claim.
struct ClaimRead {
    claimed: bool,
    acknowledged: bool,
    previous: Option<i32>,
    attempts: i32,
    failing: bool,
    /// The claim's transaction, once it wrote the mark.
    transaction: Option<i64>,
}

impl PgStore {
    /// The failing pairs, most recent failure first, after `after` (from the first without
    /// it): the first `limit` (through the `callback_failures_latest` index), or all of them.
    fn failing_first(
        &self,
        after: Option<&FailingCursor>,
        limit: Option<usize>,
    ) -> StoreFuture<'_, Vec<FailingCallback>> {
        let limit = limit.map(|limit| i64::try_from(limit).unwrap_or(i64::MAX));
        let after = after.cloned();
        Box::pin(async move {
            let sql = self.sql(if after.is_some() {
                FAILING_AFTER
            } else {
                FAILING_LATEST
            });
            let mut query = sqlx::query(&sql).bind(limit);
            if let Some(cursor) = &after {
                query = query
                    .bind(cursor.last_failed())
                    .bind(cursor.nonce().as_str())
                    .bind(cursor.status());
            }
            let rows = query.fetch_all(self.pool()).await?;
            rows.iter()
                .map(|row| {
                    Ok(FailingCallback {
                        nonce: row.try_get::<String, _>(0)?.into(),
                        status: row.try_get(1)?,
                        failures: u32::try_from(row.try_get::<i32, _>(2)?).unwrap_or(0),
                        first_failed: row.try_get(3)?,
                        last_failed: row.try_get(4)?,
                        last_reason: row.try_get(5)?,
                        transaction_reference_id: row.try_get(6)?,
                        client_id: row.try_get(7)?,
                        amount: row.try_get(8)?,
                        currency: row.try_get(9)?,
                    })
                })
                .collect()
        })
    }
}

/// The columns of `callbacks_held` that [`held_of`] reads, in its order, but the last.
const HELD_COLUMNS: &str = "nonce, status, reason, held_at, reference_id, client_id, amount, \
     currency, resolved_at, resolution";

/// Held results, each with who resolved it ([`HELD_COLUMNS`], then `resolved_by`).
const HELD_FROM: &str =
    "{s}.callbacks_held LEFT JOIN {s}.callbacks_held_by USING (nonce_key, status)";

/// A row of [`HELD_COLUMNS`] and `resolved_by`.
fn held_of(row: &sqlx::postgres::PgRow) -> Result<HeldCallback, StoreError> {
    Ok(HeldCallback {
        nonce: row.try_get::<String, _>(0)?.into(),
        status: row.try_get(1)?,
        reason: row.try_get(2)?,
        held_at: row.try_get(3)?,
        transaction_reference_id: row.try_get(4)?,
        client_id: row.try_get(5)?,
        amount: row.try_get(6)?,
        currency: row.try_get(7)?,
        resolved_at: row.try_get(8)?,
        resolution: row.try_get(9)?,
        resolved_by: row.try_get(10)?,
    })
}

impl DedupStore for PgStore {
    fn begin_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> StoreFuture<'a, CallbackBegin> {
        Box::pin(self.begin_callback_now(nonce, status, stale_after))
    }

    fn finish_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
        status: TransactionStatus,
        effects: Effects,
    ) -> DurableFuture<'a> {
        Box::pin(async move {
            let Some(held) = self.inner.claims.take(claim.id) else {
                return Err(StoreError::ClaimLost(nonce.to_string()));
            };
            if let Some(why) = held.spoiled.clone() {
                self.end_spoiled(nonce, held).await;
                return Err(StoreError::backend_message(format!(
                    "the validation's read failed in the claim's transaction, which books \
                     nothing after it: {why}"
                )));
            }
            self.finish_callback_now(nonce, held, status, &effects)
                .await
        })
    }

    fn release_callback<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            match self.inner.claims.take(claim.id) {
                Some(held) if held.spoiled.is_some() => {
                    self.end_spoiled(nonce, held).await;
                    Ok(())
                }
                Some(held) => self.give_back(nonce, held).await,
                // Finished, given up, or never this instance's: nothing is held.
                None => Ok(()),
            }
        })
    }

    /// Rolled back: the claim's mark and its attempt with it.
    fn give_back_callback<'a>(&'a self, _: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if let Some(held) = self.inner.claims.take(claim.id) {
                self.roll_back(held).await;
            }
            Ok(())
        })
    }

    fn record_callback_failure(&self, failure: CallbackFailure) -> StoreFuture<'_, ()> {
        Box::pin(async move { self.insert_failure(self.pool(), &failure).await })
    }

    fn forget_failure_if_booked<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(&self.sql(
                "DELETE FROM {s}.callback_failures \
                 WHERE nonce_key = $1 AND status = $2 AND EXISTS (SELECT 1 FROM {s}.callbacks \
                   WHERE nonce_key = $1 AND done @> ARRAY[$2]::int4[])",
            ))
            .bind(nonce_key(nonce))
            .bind(status.code())
            .execute(self.pool())
            .await?;
            Ok(())
        })
    }

    fn record_refused_callback(&self, failure: CallbackFailure) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            // The nonce's claim lock (the key `{schema}.claim_callback` of migration 0002
            // takes), waited for: a booking of the pair in progress ends first, and the
            // insert's check then sees its mark (it runs in a statement of its own, with a
            // snapshot taken after the wait). Nothing here holds a claim to wait on itself.
            let mut tx = self.pool().begin().await?;
            sqlx::query(&self.sql(WAIT_FOR_NONCE_CLAIM))
                .bind(nonce_key(&failure.nonce))
                .execute(&mut *tx)
                .await?;
            self.insert_failure(&mut *tx, &failure).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn failing_count(&self) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            // Kept by the database as rows come and go (see `schema::FAILING_COUNT`).
            if self.count_to_fold() {
                self.fold_failing_count().await?;
            }
            let row = sqlx::query(
                &self.sql("SELECT coalesce(sum(n), 0)::bigint FROM {s}.callback_failures_count"),
            )
            .fetch_one(self.pool())
            .await?;
            Ok(usize::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0))
        })
    }

    fn failing_callbacks(&self) -> StoreFuture<'_, Vec<FailingCallback>> {
        self.failing_first(None, None)
    }

    fn failing_page(
        &self,
        after: Option<FailingCursor>,
        limit: usize,
    ) -> StoreFuture<'_, FailingPage> {
        Box::pin(async move {
            let listed = self
                .failing_first(after.as_ref(), Some(limit.saturating_add(1)))
                .await?;
            Ok(FailingPage::of(listed, limit))
        })
    }

    fn callback_acknowledged<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let row =
                sqlx::query(&self.sql(
                    "SELECT done @> ARRAY[$2]::int4[] FROM {s}.callbacks WHERE nonce_key = $1",
                ))
                .bind(nonce_key(nonce))
                .bind(status.code())
                .fetch_optional(self.pool())
                .await?;
            Ok(row
                .map(|r| r.try_get::<bool, _>(0))
                .transpose()?
                .unwrap_or(false))
        })
    }

    fn held_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, Option<HeldCallback>> {
        Box::pin(async move {
            let row = sqlx::query(&self.sql(&format!(
                "SELECT {HELD_COLUMNS}, resolved_by FROM {HELD_FROM} \
                 WHERE nonce_key = $1 AND status = $2"
            )))
            .bind(nonce_key(nonce))
            .bind(status.code())
            .fetch_optional(self.pool())
            .await?;
            row.as_ref().map(held_of).transpose()
        })
    }

    fn held_callbacks(&self, limit: usize) -> StoreFuture<'_, Vec<HeldCallback>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(async move {
            let rows = sqlx::query(&self.sql(&format!(
                "SELECT {HELD_COLUMNS}, resolved_by FROM {HELD_FROM} WHERE resolved_at IS NULL \
                 ORDER BY held_at DESC, nonce COLLATE \"C\", status LIMIT $1"
            )))
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
            rows.iter().map(held_of).collect()
        })
    }

    fn held_count(&self) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let row = sqlx::query(
                &self.sql("SELECT count(*) FROM {s}.callbacks_held WHERE resolved_at IS NULL"),
            )
            .fetch_one(self.pool())
            .await?;
            Ok(usize::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0))
        })
    }

    fn resolve_held<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
        resolution: &'a str,
        by: Option<&'a str>,
    ) -> StoreFuture<'a, Option<HeldCallback>> {
        Box::pin(async move {
            // Kept as the embedded store keeps it (to the millisecond, the note and the
            // name cut).
            let at = crate::store::held::to_the_millisecond(chrono::Utc::now());
            let resolving = crate::store::held::Resolving::new(resolution, by);
            let row = sqlx::query(&self.sql(&format!(
                "WITH resolved AS ( \
                   UPDATE {{s}}.callbacks_held \
                   SET resolved_at = greatest(held_at, $3), resolution = $4 \
                   WHERE nonce_key = $1 AND status = $2 AND resolved_at IS NULL \
                   RETURNING nonce_key, {HELD_COLUMNS}), \
                 named AS ( \
                   INSERT INTO {{s}}.callbacks_held_by (nonce_key, status, resolved_by) \
                   SELECT nonce_key, status, $5 FROM resolved WHERE $5::text IS NOT NULL \
                   ON CONFLICT (nonce_key, status) DO UPDATE SET resolved_by = EXCLUDED.resolved_by) \
                 SELECT {HELD_COLUMNS}, $5::text FROM resolved"
            )))
            .bind(nonce_key(nonce))
            .bind(status.code())
            .bind(at)
            .bind(&resolving.note)
            .bind(resolving.by.as_deref())
            .fetch_optional(self.pool())
            .await?;
            row.as_ref().map(held_of).transpose()
        })
    }

    fn begin_validation<'a>(
        &'a self,
        nonce: &'a Nonce,
        fingerprint: &'a Fingerprint,
        stale_after: Duration,
    ) -> StoreFuture<'a, ValidationBegin> {
        Box::pin(self.begin_validation_now(nonce, fingerprint, stale_after))
    }

    fn finish_validation<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
        fingerprint: &'a Fingerprint,
        decision: &'a RecordedDecision,
        postponed: Option<PostponedValidation>,
    ) -> DurableFuture<'a> {
        Box::pin(async move {
            let outcome = self
                .finish_validation_now(nonce, claim, fingerprint, decision, postponed.as_ref())
                .await;
            if outcome.is_err() {
                let _ = self.release_validation(nonce, claim).await;
            }
            outcome
        })
    }

    fn validated_payment<'a>(
        &'a self,
        nonce: &'a Nonce,
    ) -> StoreFuture<'a, Option<ValidatedPayment>> {
        Box::pin(async move {
            let mut conn = self.pool().acquire().await?;
            self.validated_payment_on(&mut conn, nonce).await
        })
    }

    /// Read in the claim's transaction, on its connection: a callback in flight holds no
    /// other connection of the pool, whose last two are left for everything else. The claim
    /// is lent to the read and kept again after it, or once it is cut off (the handler's
    /// timeout), so that its release still counts the attempt; a read while another holds
    /// it (two at once in one handler) reads on the pool instead. A read that fails spoils
    /// the claim's transaction (PostgreSQL refuses every statement after in it), and so does
    /// one cut off (its statement may still run, and its answer would be the next one's):
    /// the finish then says so, rather than run the effects for them to fail, and the
    /// release closes the connection and counts the attempt on the pool. Read in the
    /// claim's transaction, `validations` (and `postponed`) stay locked in ACCESS SHARE
    /// mode until its COMMIT, as the tables its effects write do: a migration that alters
    /// them waits for the callbacks in flight.
    fn validated_payment_in_claim<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
    ) -> StoreFuture<'a, Option<ValidatedPayment>> {
        Box::pin(async move {
            let mut lent = match self.inner.claims.lend(claim.id) {
                Lending::Lent(lent) => lent,
                Lending::Busy => return self.validated_payment(nonce).await,
                // Finished, released or given up: the booking would not commit either.
                Lending::Gone => return Err(StoreError::ClaimLost(nonce.to_string())),
            };
            // Until the read is answered: a read cut off leaves its statement running, and
            // its answer (an error, perhaps) would be the next statement's on this
            // connection — the claim is closed rather than used again.
            lent.spoiled = Some("its read was cut off (the handler's timeout)".into());
            let read = self.validated_payment_on(&mut lent, nonce).await;
            lent.spoiled = match &read {
                Err(error @ StoreError::Backend { .. }) => {
                    Some(crate::report::InLine(error).to_string().into())
                }
                _ => None,
            };
            read
        })
    }

    fn release_validation<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(&self.sql(&format!(
                "DELETE FROM {{s}}.validation_claims USING {} \
                 WHERE nonce_key = $1 AND claim_id = $2 AND NOT decided",
                super::UNSYNCED
            )))
            .bind(nonce_key(nonce))
            .bind(claim_id(claim))
            .execute(self.pool())
            .await?;
            Ok(())
        })
    }
}

impl PgStore {
    /// Inserts or counts `failure` (see [`DedupStore::record_callback_failure`]) through
    /// `executor`: the pool, or a transaction.
    async fn insert_failure<'e>(
        &self,
        executor: impl Executor<'e, Database = sqlx::Postgres>,
        failure: &CallbackFailure,
    ) -> Result<(), StoreError> {
        let reason = cut_bytes(&failure.reason, REASON_BYTES).into_owned();
        // A failure recorded late (an instance's clock behind, two refusals racing)
        // moves neither end of the pair back.
        sqlx::query(&self.sql(&format!(
            "INSERT INTO {{s}}.callback_failures AS f (nonce_key, status, nonce, failures, \
               first_failed, last_failed, last_reason, reference_id, client_id, amount, \
               currency, expires_at) \
             SELECT $1, $2, $3, 1, $4, $4, $5, $6, $7, $8, $9, \
               now() + make_interval(secs => $10) FROM {unsynced} \
             WHERE NOT EXISTS (SELECT 1 FROM {{s}}.callbacks \
               WHERE nonce_key = $1 AND done @> ARRAY[$2]::int4[]) \
             ON CONFLICT (nonce_key, status) DO UPDATE SET failures = f.failures + 1, \
               first_failed = LEAST(f.first_failed, EXCLUDED.first_failed), \
               last_failed = GREATEST(f.last_failed, EXCLUDED.last_failed), \
               last_reason = CASE WHEN EXCLUDED.last_failed >= f.last_failed \
                 THEN EXCLUDED.last_reason ELSE f.last_reason END, \
               expires_at = EXCLUDED.expires_at",
            unsynced = super::UNSYNCED
        )))
        .bind(nonce_key(&failure.nonce))
        .bind(failure.status.code())
        .bind(readable(&failure.nonce))
        .bind(failure.at)
        .bind(readable(&reason))
        .bind(failure.transaction_reference_id.to_string())
        .bind(readable(&failure.client_id))
        .bind(failure.amount.to_string())
        .bind(readable(&failure.currency))
        .bind(self.retention_secs())
        .execute(executor)
        .await?;
        Ok(())
    }

    /// What the booking writes besides the mark (written at the claim): the removal of the
    /// status's failure record, when the claim saw one, and the tree effects' writes — one
    /// statement, when there is anything to write.
    async fn write_booking(
        &self,
        held: &mut HeldClaim,
        key: &str,
        status: TransactionStatus,
        writes: super::trees::Writes,
        kept: Option<&HeldCallback>,
    ) -> Result<(), StoreError> {
        let (upserts, removals) = (!writes.trees.is_empty(), !writes.removed_trees.is_empty());
        if !(held.failing || upserts || removals || kept.is_some()) {
            return Ok(());
        }
        // Its first part fails the statement when an effect ended the claim's transaction:
        // the writes would otherwise commit on their own before the COMMIT's check refused
        // the booking, and its repeat would write them again.
        let mut parts = vec![format!("still AS (SELECT {} AS ok)", held.still_its_own())];
        let mut next = 1;
        if held.failing {
            parts.push(format!(
                "booked AS (DELETE FROM {{s}}.callback_failures \
                 WHERE nonce_key = ${} AND status = ${})",
                next,
                next + 1
            ));
            next += 2;
        }
        if upserts {
            parts.push(format!(
                "written AS (INSERT INTO {{s}}.trees (tree, key, value) \
                 SELECT * FROM unnest(${}::text[], ${}::bytea[], ${}::bytea[]) \
                 ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value)",
                next,
                next + 1,
                next + 2
            ));
            next += 3;
        }
        if removals {
            parts.push(format!(
                "removed AS (DELETE FROM {{s}}.trees t \
                 USING unnest(${}::text[], ${}::bytea[]) AS r(tree, key) \
                 WHERE t.tree = r.tree AND t.key = r.key)",
                next,
                next + 1
            ));
            next += 2;
        }
        if kept.is_some() {
            // A status is held once: its mark makes every later delivery a duplicate.
            parts.push(format!(
                "kept AS (INSERT INTO {{s}}.callbacks_held (nonce_key, status, nonce, reason, \
                   held_at, reference_id, client_id, amount, currency) \
                 VALUES (${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}) \
                 ON CONFLICT (nonce_key, status) DO NOTHING)",
                next,
                next + 1,
                next + 2,
                next + 3,
                next + 4,
                next + 5,
                next + 6,
                next + 7,
                next + 8
            ));
        }
        let sql = self.sql(&format!("WITH {} SELECT ok FROM still", parts.join(", ")));
        let mut query = sqlx::query(&sql);
        if held.failing {
            query = query.bind(key).bind(status.code());
        }
        if upserts {
            query = query
                .bind(writes.trees)
                .bind(writes.keys)
                .bind(writes.values);
        }
        if removals {
            query = query.bind(writes.removed_trees).bind(writes.removed_keys);
        }
        if let Some(kept) = kept {
            query = query
                .bind(key)
                .bind(status.code())
                .bind(kept.nonce.as_str())
                .bind(&kept.reason)
                .bind(kept.held_at)
                .bind(&kept.transaction_reference_id)
                .bind(&kept.client_id)
                .bind(&kept.amount)
                .bind(&kept.currency);
        }
        let conn: &mut sqlx::PgConnection = held;
        query.execute(conn).await?;
        Ok(())
    }

    /// Begins a transaction on `held`, claims the nonce `key` in it, and writes the mark of
    /// `status` when claimed for it (`{schema}.claim_callback`).
    async fn claim_on(
        &self,
        held: &mut HeldClaim,
        key: &str,
        status: TransactionStatus,
    ) -> Result<ClaimRead, StoreError> {
        if !held.opening() {
            let begin = held.begin().sql();
            let conn: &mut sqlx::PgConnection = held;
            conn.execute(sqlx::raw_sql(begin)).await?;
        }
        let stale_after = held.stale_after().as_secs_f64();
        let conn: &mut sqlx::PgConnection = held;
        let row = sqlx::query(&self.inner.claim_sql)
            .bind(key)
            .bind(status.code())
            .bind(stale_after)
            .bind(self.retention_secs())
            .fetch_one(conn)
            .await?;
        Ok(ClaimRead {
            claimed: row.try_get(0)?,
            acknowledged: row.try_get(1)?,
            previous: row.try_get(2)?,
            attempts: row.try_get(3)?,
            failing: row.try_get(4)?,
            transaction: row.try_get(5)?,
        })
    }

    async fn begin_callback_now(
        &self,
        nonce: &str,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> Result<CallbackBegin, StoreError> {
        let key = nonce_key(nonce);
        let connection = |fresh| {
            self.inner.claims.connection(
                self.pool(),
                stale_after,
                self.pool().options().get_acquire_timeout(),
                fresh,
            )
        };
        let mut held = connection(false).await?;
        let was_parked = held.parked();
        // On an error the claim's connection is closed (dropped open): nothing is held. A
        // parked connection the database closed meanwhile is replaced by a pooled one.
        let read = match self.claim_on(&mut held, &key, status).await {
            Err(error) if was_parked && connection_lost(&error) => {
                drop(held);
                held = connection(true).await?;
                self.claim_on(&mut held, &key, status).await?
            }
            read => read?,
        };
        if read.claimed && !read.acknowledged {
            held.attempt = read.attempts;
            held.failing = read.failing;
            held.transaction = read.transaction;
            held.status = status.code();
            held.previous = read.previous;
            let attempt = u32::try_from(held.attempt).unwrap_or(1);
            let claim = self.inner.claims.keep(held);
            return Ok(CallbackBegin::Claimed {
                claim,
                attempt,
                previous_status: read.previous.map(TransactionStatus::from_code),
            });
        }
        if read.acknowledged {
            // Committed, not rolled back: where a synchronous standby is configured, the
            // claim wrote a message for this COMMIT to wait on until the standby has the
            // mark (migration 5). Until it returns, the duplicate is not answered; on an
            // error, it is not answered at all (the connection is closed, dropped open).
            held.commit_and_park().await?;
            self.inner.claims.ended(held);
            return Ok(CallbackBegin::Duplicate);
        }
        // Claimed elsewhere now: the answer stands, however the rollback goes.
        self.roll_back(held).await;
        Ok(CallbackBegin::Busy)
    }

    /// Rolls the claim's transaction back and parks its connection for the next claim; a
    /// connection that cannot roll back is closed instead (dropped open), and the database
    /// rolls the transaction back all the same.
    async fn roll_back(&self, mut held: HeldClaim) {
        match held.rollback_and_park().await {
            Ok(()) => self.inner.claims.ended(held),
            Err(error) => {
                tracing::debug!(%error, "a claim's connection could not roll back; closing it");
            }
        }
    }

    /// Ends a claim whose transaction a failed read spoiled: its connection is closed (the
    /// database rolls the transaction back and releases the claim), and the attempt is
    /// counted on the pool, as after a COMMIT that failed.
    async fn end_spoiled(&self, nonce: &str, held: HeldClaim) {
        let attempt = held.attempt;
        drop(held);
        self.count_after(&nonce_key(nonce), attempt).await;
    }

    /// Ends a claim whose handler did not book it: the status leaves the mark written at
    /// the claim and the attempt stays counted, committed before the lock is released, so
    /// the next delivery reads the count.
    async fn give_back(&self, nonce: &str, mut held: HeldClaim) -> Result<(), StoreError> {
        let status = held.status;
        let conn: &mut sqlx::PgConnection = &mut held;
        sqlx::query(&self.sql(&format!(
            "UPDATE {{s}}.callbacks SET done = array_remove(done, $2) FROM {unsynced} \
             WHERE nonce_key = $1",
            unsynced = super::UNSYNCED
        )))
        .bind(nonce_key(nonce))
        .bind(status)
        .execute(conn)
        .await?;
        held.commit_and_park().await?;
        self.inner.claims.ended(held);
        Ok(())
    }

    /// Records that `attempt` deliveries of the nonce `key` reached a handler.
    async fn count_attempt(&self, key: &str, attempt: i32) -> Result<(), StoreError> {
        sqlx::query(&self.sql(&format!(
            "INSERT INTO {{s}}.callbacks AS cb (nonce_key, done, attempts, expires_at) \
             SELECT $1, '{{}}', $2, now() + make_interval(secs => $3) FROM {unsynced} \
             ON CONFLICT (nonce_key) DO UPDATE SET attempts = greatest(cb.attempts, $2)",
            unsynced = super::UNSYNCED
        )))
        .bind(key)
        .bind(attempt)
        .bind(self.retention_secs())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The effects, what the booking writes besides the mark, and COMMIT, in the claim's
    /// transaction; `Ok` only after COMMIT. A deadlock or serialization failure rolls back
    /// and claims the nonce again in a new transaction on the same connection, up to
    /// [`TX_ATTEMPTS`] times.
    async fn finish_callback_now(
        &self,
        nonce: &str,
        mut held: HeldClaim,
        status: TransactionStatus,
        effects: &Effects,
    ) -> Result<(), StoreError> {
        let key = nonce_key(nonce);
        let lost = || StoreError::ClaimLost(nonce.to_string());
        let attempt = held.attempt;
        let mut tries = 0;
        loop {
            tries += 1;
            let (back, failed) =
                match super::trees::apply(held, effects, &self.inner.schema, &self.inner.trees)
                    .await
                {
                    (Some(mut back), Ok(writes)) => {
                        let booking = std::time::Instant::now();
                        // What the effects said in this run, the one that commits.
                        let held = effects.held().map(|reason| {
                            HeldCallback::new(
                                nonce,
                                status.code(),
                                &reason,
                                effects.subject(),
                                chrono::Utc::now(),
                            )
                        });
                        let written = self
                            .write_booking(&mut back, &key, status, writes, held.as_ref())
                            .await;
                        match written {
                            // A COMMIT that fails may or may not have happened: not retried
                            // here. The next delivery finds the mark, or claims again.
                            Ok(()) => {
                                if let Err(error) = back.commit_and_park().await {
                                    // Rolled back (or, with the connection lost, perhaps
                                    // not): the attempt is counted either way.
                                    drop(back);
                                    self.count_after(&key, attempt).await;
                                    return Err(super::trees::merchant_fault(error.into()));
                                }
                                self.inner
                                    .commit_metrics
                                    .observe(booking.elapsed().as_secs_f64(), 1);
                                self.inner.claims.ended(back);
                                return Ok(());
                            }
                            // Its check that the transaction is still the claim's is an
                            // effect's fault when it fails, as the COMMIT's is.
                            Err(error) => (Some(back), super::trees::when_ended_by_effect(error)),
                        }
                    }
                    (back, Err(error)) => (back, error),
                    (None, Ok(_)) => (None, StoreError::abort("the transaction was lost")),
                };
            // The connection gone (the database closed it, or a takeover terminated it):
            // the transaction and the claim went with it; nothing was written.
            if connection_lost(&failed) {
                return Err(lost());
            }
            let Some(mut back) = back else {
                // An effect panicked, and its transaction was dropped (closed) with it.
                self.count_after(&key, attempt).await;
                return Err(failed);
            };
            if back.rollback().await.is_err() {
                return Err(lost());
            }
            if !(retryable(&failed) && tries < TX_ATTEMPTS) {
                drop(back);
                self.count_after(&key, attempt).await;
                return Err(failed);
            }
            tracing::info!(
                attempt = tries,
                "the callback's transaction met a deadlock; retrying it"
            );
            #[cfg(test)]
            self.inner.between_tries.pass().await;
            let read = self.claim_on(&mut back, &key, status).await?;
            // Taken in the moment between the two transactions — or taken, booked and let
            // go: the effects were staged by a handler told of another status booked
            // before (a deposit's credit, staged before its reversal was booked, must not
            // be written after it). The delivery is answered 503, and its retry's handler
            // is told what is booked now.
            if !read.claimed || read.acknowledged || read.previous != back.previous {
                let _ = back.rollback().await;
                return Err(lost());
            }
            back.failing = read.failing;
            back.transaction = read.transaction;
            held = back;
        }
    }

    /// Counts the attempt of a claim that ended without booking, once its transaction is
    /// gone. (A delivery claiming the nonce in between reads the count before it; the
    /// count is for people, and no booking depends on it.)
    async fn count_after(&self, key: &str, attempt: i32) {
        if let Err(error) = self.count_attempt(key, attempt).await {
            tracing::warn!(error = %crate::report::InLine(&error), "the callback's attempt could not be counted");
        }
    }

    /// The record of `nonce`'s validation, read on `conn`: its payment, and its decision as
    /// the JSON text kept (decoded by whoever needs it: a repeat for another payment does
    /// not).
    async fn validation_row<'c>(
        &self,
        conn: impl sqlx::PgExecutor<'c>,
        nonce: &str,
    ) -> Result<Option<(KeptFingerprint, String)>, StoreError> {
        let row = sqlx::query(&self.sql(
            "SELECT fingerprint::text, decision::text FROM {s}.validations WHERE nonce_key = $1",
        ))
        .bind(nonce_key(nonce))
        .fetch_optional(conn)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let kept: KeptFingerprint = decode_json(nonce, &row.try_get::<String, _>(0)?)?;
        Ok(Some((kept, row.try_get(1)?)))
    }

    /// The validation of `nonce` as recorded, with its postponed validation's record while
    /// that is kept (the latest original of the nonce, as a repeat finds it), read on
    /// `conn`.
    async fn validated_payment_on(
        &self,
        conn: &mut sqlx::PgConnection,
        nonce: &str,
    ) -> Result<Option<ValidatedPayment>, StoreError> {
        let Some((kept, decision)) = self.validation_row(&mut *conn, nonce).await? else {
            return Ok(None);
        };
        let decision: RecordedDecision = decode_json(nonce, &decision)?;
        // A postponed record that does not decode is an error: a success is not booked
        // past it.
        let postponed = match decision {
            RecordedDecision::Postponed => self.latest_original(conn, nonce).await?,
            _ => None,
        };
        ValidatedPayment::of(nonce, &kept, &decision, postponed.as_ref()).map(Some)
    }

    async fn begin_validation_now(
        &self,
        nonce: &str,
        fingerprint: &Fingerprint,
        stale_after: Duration,
    ) -> Result<ValidationBegin, StoreError> {
        let key = nonce_key(nonce);
        let claim = new_claim()?;
        let claimed = sqlx::query(&self.sql(&format!(
            "INSERT INTO {{s}}.validation_claims AS v (nonce_key, claim_id, claim_owner, \
               claimed_at, expires_at) \
             SELECT $1, $2, $5, now(), now() + make_interval(secs => $3) FROM {unsynced} \
             WHERE NOT EXISTS (SELECT 1 FROM {{s}}.validations WHERE nonce_key = $1) \
             ON CONFLICT (nonce_key) DO UPDATE \
               SET claim_id = EXCLUDED.claim_id, claim_owner = EXCLUDED.claim_owner, \
                 claimed_at = now(), expires_at = EXCLUDED.expires_at \
               WHERE NOT v.decided \
                 AND (v.claim_id IS NULL \
                   OR v.claimed_at <= now() - make_interval(secs => $4) \
                   OR NOT {alive}) \
             RETURNING 1",
            alive = super::liveness::owner_alive("v.claim_owner"),
            unsynced = super::UNSYNCED
        )))
        .bind(&key)
        .bind(claim_id(claim))
        .bind(self.retention_secs())
        .bind(stale_after.as_secs_f64())
        .bind(self.inner.liveness.owner)
        .fetch_optional(self.pool())
        .await?;
        if claimed.is_some() {
            return Ok(ValidationBegin::Claimed { claim });
        }
        let Some((kept, decision)) = self.validation_row(self.pool(), nonce).await? else {
            return Ok(ValidationBegin::Busy);
        };
        if !kept.matches(fingerprint) {
            return Ok(ValidationBegin::Mismatch);
        }
        let decision = decode_json(nonce, &decision)?;
        self.on_the_standby(&key).await?;
        Ok(ValidationBegin::Recorded(decision))
    }

    /// Returns once a decision read from the primary is on the synchronous standby too,
    /// where one is configured: the decision's COMMIT may have been cut short in its wait for
    /// the standby (an operator's `pg_cancel_backend`, a crashed backend), and answered from
    /// the primary alone, a failover would lose it — a postponed validation's record with
    /// it, its result then never delivered. A transactional logical message (WAL and a
    /// commit, no row) commits after it, and its COMMIT waits for the standby to have the WAL
    /// so far; a role the function is revoked from rewrites the decision's row as it is
    /// instead. Without synchronous replication nothing is written. (Callbacks do the same in
    /// their claim: migration 5.)
    async fn on_the_standby(&self, key: &str) -> Result<(), StoreError> {
        const REPLICATING: &str = "current_setting('synchronous_standby_names') <> '' \
             AND current_setting('synchronous_commit') NOT IN ('off', 'local')";
        let message = sqlx::query(&format!(
            "SELECT pg_logical_emit_message(true, 'payhook', 'validation answered') \
             WHERE {REPLICATING}"
        ))
        .execute(self.pool())
        .await;
        match message {
            Ok(_) => Ok(()),
            // Revoked (insufficient privilege), or not there (undefined function).
            Err(error) if super::refused_with(&error, &["42501", "42883"]) => {
                sqlx::query(&self.sql(&format!(
                    "UPDATE {{s}}.validations SET expires_at = expires_at \
                     WHERE nonce_key = $1 AND {REPLICATING}"
                )))
                .bind(key)
                .execute(self.pool())
                .await?;
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }

    async fn finish_validation_now(
        &self,
        nonce: &str,
        claim: Claim,
        fingerprint: &Fingerprint,
        decision: &RecordedDecision,
        postponed: Option<&PostponedValidation>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        let marked = sqlx::query(&self.sql(
            "WITH claimed AS ( \
               UPDATE {s}.validation_claims SET decided = true, claim_id = NULL, claimed_at = NULL \
               WHERE nonce_key = $1 AND claim_id = $2 RETURNING 1) \
             INSERT INTO {s}.validations (nonce_key, fingerprint, decision, expires_at) \
             SELECT $1, $3::json, $4::json, now() + make_interval(secs => $5) FROM claimed \
             ON CONFLICT (nonce_key) DO NOTHING",
        ))
        .bind(nonce_key(nonce))
        .bind(claim_id(claim))
        .bind(encode_json(&KeptFingerprint::of(fingerprint)))
        .bind(encode_json(decision))
        .bind(self.retention_secs())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if marked == 0 {
            return Err(StoreError::ClaimLost(nonce.to_string()));
        }
        if let Some(record) = postponed
            && !self.insert_postponed(&mut tx, record).await?
            && self.known(&mut tx, &record.request).await? == Some(crate::postponed::Repeat::Taken)
        {
            // Nothing of this validation is written; its claim stays the caller's to
            // release.
            tx.rollback().await?;
            return Err(StoreError::ValidationIdTaken(record.validation_id.get()));
        }
        tx.commit().await?;
        Ok(())
    }
}
