//! Deduplication on PostgreSQL: claims as leases on the database's clock, marks committed
//! with the merchant's effects, failures for operators.

use std::time::Duration;

use sqlx::Row;

use super::super::failing::{REASON_BYTES, truncate};
use super::super::record::{KeptFingerprint, RecordedDecision};
use super::super::{
    CallbackBegin, CallbackFailure, Claim, DedupStore, DurableFuture, Effects, FailingCallback,
    Fingerprint, StoreError, StoreFuture, ValidationBegin,
};
use super::{
    PgStore, TX_ATTEMPTS, claim_id, decode_json, encode_json, new_claim, nonce_key, retryable,
};
use crate::model::TransactionStatus;
use crate::postponed::record::PostponedValidation;

impl DedupStore for PgStore {
    fn begin_callback<'a>(
        &'a self,
        nonce: &'a str,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> StoreFuture<'a, CallbackBegin> {
        Box::pin(self.begin_callback_now(nonce, status, stale_after))
    }

    fn finish_callback<'a>(
        &'a self,
        nonce: &'a str,
        claim: Claim,
        status: TransactionStatus,
        effects: Effects,
    ) -> DurableFuture<'a> {
        Box::pin(async move {
            let outcome = self
                .finish_callback_now(nonce, claim, status, &effects)
                .await;
            if outcome.is_err() {
                // The claim ends either way; a failed release leaves it to run out.
                let _ = self.release_callback(nonce, claim).await;
            }
            outcome
        })
    }

    fn release_callback<'a>(&'a self, nonce: &'a str, claim: Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(&self.sql(&format!(
                "UPDATE {{s}}.callback_claims SET claim_id = NULL, claimed_at = NULL FROM {} \
                 WHERE nonce_key = $1 AND claim_id = $2",
                super::UNSYNCED
            )))
            .bind(nonce_key(nonce))
            .bind(claim_id(claim))
            .execute(self.pool())
            .await?;
            Ok(())
        })
    }

    fn record_callback_failure(&self, failure: CallbackFailure) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            sqlx::query(&self.sql(&format!(
                "INSERT INTO {{s}}.callback_failures AS f (nonce_key, status, nonce, failures, \
                   first_failed, last_failed, last_reason, reference_id, client_id, amount, \
                   currency, expires_at) \
                 SELECT $1, $2, $3, 1, $4, $4, $5, $6, $7, $8, $9, \
                   now() + make_interval(secs => $10) FROM {unsynced} \
                 WHERE NOT EXISTS (SELECT 1 FROM {{s}}.callbacks \
                   WHERE nonce_key = $1 AND done @> ARRAY[$2]::int4[]) \
                 ON CONFLICT (nonce_key, status) DO UPDATE SET failures = f.failures + 1, \
                   last_failed = EXCLUDED.last_failed, last_reason = EXCLUDED.last_reason, \
                   expires_at = EXCLUDED.expires_at",
                unsynced = super::UNSYNCED
            )))
            .bind(nonce_key(&failure.nonce))
            .bind(failure.status.code())
            .bind(&failure.nonce)
            .bind(failure.at)
            .bind(truncate(&failure.reason, REASON_BYTES))
            .bind(failure.transaction_reference_id.to_string())
            .bind(&failure.client_id)
            .bind(failure.amount.to_string())
            .bind(&failure.currency)
            .bind(self.retention_secs())
            .execute(self.pool())
            .await?;
            Ok(())
        })
    }

    fn failing_callbacks(&self) -> StoreFuture<'_, Vec<FailingCallback>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql(
                "SELECT nonce, status, failures, first_failed, last_failed, last_reason, \
                   reference_id, client_id, amount, currency \
                 FROM {s}.callback_failures ORDER BY last_failed DESC",
            ))
            .fetch_all(self.pool())
            .await?;
            rows.iter()
                .map(|row| {
                    Ok(FailingCallback {
                        nonce: row.try_get(0)?,
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

    fn callback_acknowledged<'a>(
        &'a self,
        nonce: &'a str,
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

    fn begin_validation<'a>(
        &'a self,
        nonce: &'a str,
        fingerprint: &'a Fingerprint,
        stale_after: Duration,
    ) -> StoreFuture<'a, ValidationBegin> {
        Box::pin(self.begin_validation_now(nonce, fingerprint, stale_after))
    }

    fn finish_validation<'a>(
        &'a self,
        nonce: &'a str,
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

    fn release_validation<'a>(&'a self, nonce: &'a str, claim: Claim) -> StoreFuture<'a, ()> {
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
    /// Marks (nonce, status) done if `claim` still holds it, removes the status's failure
    /// record and writes what the tree effects wrote — one statement; `false` when the
    /// claim was lost (nothing written).
    async fn mark_callback(
        &self,
        conn: &mut sqlx::PgConnection,
        key: &str,
        claim: Claim,
        status: TransactionStatus,
        writes: super::trees::Writes,
    ) -> Result<bool, StoreError> {
        let marked: i64 = sqlx::query(&self.sql(
            "WITH claimed AS ( \
               UPDATE {s}.callback_claims SET done = array_append(done, $3), claim_id = NULL, \
                 claimed_at = NULL \
               WHERE nonce_key = $1 AND claim_id = $2 RETURNING attempts), \
             marked AS ( \
               INSERT INTO {s}.callbacks AS cb (nonce_key, done, attempts, expires_at) \
               SELECT $1, ARRAY[$3]::int4[], attempts, now() + make_interval(secs => $4) \
               FROM claimed \
               ON CONFLICT (nonce_key) DO UPDATE SET done = array_append(cb.done, $3), \
                 attempts = EXCLUDED.attempts, expires_at = EXCLUDED.expires_at \
               WHERE NOT cb.done @> ARRAY[$3]::int4[] \
               RETURNING 1), \
             booked AS ( \
               DELETE FROM {s}.callback_failures \
               WHERE nonce_key = $1 AND status = $3 AND EXISTS (SELECT 1 FROM marked)), \
             written AS ( \
               INSERT INTO {s}.trees (tree, key, value) \
               SELECT * FROM unnest($5::text[], $6::bytea[], $7::bytea[]) \
               WHERE EXISTS (SELECT 1 FROM marked) \
               ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value), \
             removed AS ( \
               DELETE FROM {s}.trees WHERE (tree, key) IN \
                 (SELECT * FROM unnest($8::text[], $9::bytea[])) \
               AND EXISTS (SELECT 1 FROM marked)) \
             SELECT count(*) FROM marked",
        ))
        .bind(key)
        .bind(claim_id(claim))
        .bind(status.code())
        .bind(self.retention_secs())
        .bind(writes.trees)
        .bind(writes.keys)
        .bind(writes.values)
        .bind(writes.removed_trees)
        .bind(writes.removed_keys)
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
        Ok(marked > 0)
    }

    async fn begin_callback_now(
        &self,
        nonce: &str,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> Result<CallbackBegin, StoreError> {
        let key = nonce_key(nonce);
        let claim = new_claim()?;
        // Claimed unless the status is acknowledged or a live claim stands (by the
        // database's clock).
        // Claimed unless the status is acknowledged or a live claim stands (by the
        // database's clock). A claim row mirrors the acknowledged statuses: its latest
        // version refuses the claim, whatever this statement's snapshot saw of `callbacks`
        // (which answers alone only when the claims were lost with a crash).
        let claimed = sqlx::query(&self.sql(&format!(
            "INSERT INTO {{s}}.callback_claims AS c (nonce_key, done, attempts, claim_id, \
               claim_owner, claimed_at, expires_at) \
             SELECT $1, coalesce(cb.done, '{{}}'), coalesce(cb.attempts, 0) + 1, $2, $6, now(), \
               now() + make_interval(secs => $4) \
             FROM {unsynced} LEFT JOIN {{s}}.callbacks cb ON cb.nonce_key = $1 \
             WHERE NOT coalesce(cb.done @> ARRAY[$3]::int4[], false) \
             ON CONFLICT (nonce_key) DO UPDATE \
               SET attempts = c.attempts + 1, claim_id = EXCLUDED.claim_id, \
                 claim_owner = EXCLUDED.claim_owner, claimed_at = now(), \
                 expires_at = EXCLUDED.expires_at \
               WHERE NOT (c.done @> ARRAY[$3]::int4[]) \
                 AND (c.claim_id IS NULL \
                   OR c.claimed_at <= now() - make_interval(secs => $5) \
                   OR NOT {alive}) \
             RETURNING c.attempts, c.done",
            alive = super::owner_alive("c.claim_owner"),
            unsynced = super::UNSYNCED
        )))
        .bind(&key)
        .bind(claim_id(claim))
        .bind(status.code())
        .bind(self.retention_secs())
        .bind(stale_after.as_secs_f64())
        .bind(self.inner.owner)
        .fetch_optional(self.pool())
        .await?;
        if let Some(row) = claimed {
            let attempts: i32 = row.try_get(0)?;
            let done: Vec<i32> = row.try_get(1)?;
            return Ok(CallbackBegin::Claimed {
                claim,
                attempt: u32::try_from(attempts).unwrap_or(1),
                previous_status: done.last().map(|code| TransactionStatus::from_code(*code)),
            });
        }
        let acknowledged = sqlx::query(&self.sql(
            "SELECT done @> ARRAY[$2]::int4[] FROM {s}.callback_claims WHERE nonce_key = $1 \
             UNION ALL \
             SELECT done @> ARRAY[$2]::int4[] FROM {s}.callbacks WHERE nonce_key = $1 \
             ORDER BY 1 DESC LIMIT 1",
        ))
        .bind(&key)
        .bind(status.code())
        .fetch_optional(self.pool())
        .await?
        .map(|row| row.try_get::<bool, _>(0))
        .transpose()?;
        Ok(if acknowledged == Some(true) {
            CallbackBegin::Duplicate
        } else {
            // Claimed elsewhere (or purged a moment ago: the next try claims it).
            CallbackBegin::Busy
        })
    }

    /// The mark, the failure record's removal and the effects, in one transaction retried
    /// on a deadlock; `Ok` only after COMMIT.
    async fn finish_callback_now(
        &self,
        nonce: &str,
        claim: Claim,
        status: TransactionStatus,
        effects: &Effects,
    ) -> Result<(), StoreError> {
        let key = nonce_key(nonce);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let tx = self.pool().begin().await?;
            let failed =
                match super::trees::apply(tx, effects, &self.inner.schema, &self.inner.trees).await
                {
                    // The mark, the failure record of this status gone, and what the tree
                    // effects wrote, in one statement; then COMMIT.
                    (Some(mut tx), Ok(writes)) => {
                        match self
                            .mark_callback(&mut tx, &key, claim, status, writes)
                            .await
                        {
                            Ok(true) => {
                                // A COMMIT that fails may or may not have happened: not retried
                                // here. The next delivery finds the mark, or claims again.
                                tx.commit().await?;
                                return Ok(());
                            }
                            Ok(false) => return Err(StoreError::ClaimLost(nonce.to_owned())),
                            Err(error) => error,
                        }
                    }
                    (_, Err(error)) => error,
                    (None, Ok(_)) => StoreError::abort("the transaction was lost"),
                };
            if !(retryable(&failed) && attempt < TX_ATTEMPTS) {
                return Err(failed);
            }
            tracing::info!(
                attempt,
                "the callback's transaction met a deadlock; retrying it"
            );
        }
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
            alive = super::owner_alive("v.claim_owner"),
            unsynced = super::UNSYNCED
        )))
        .bind(&key)
        .bind(claim_id(claim))
        .bind(self.retention_secs())
        .bind(stale_after.as_secs_f64())
        .bind(self.inner.owner)
        .fetch_optional(self.pool())
        .await?;
        if claimed.is_some() {
            return Ok(ValidationBegin::Claimed { claim });
        }
        let row = sqlx::query(&self.sql(
            "SELECT fingerprint::text, decision::text FROM {s}.validations WHERE nonce_key = $1",
        ))
        .bind(&key)
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else {
            return Ok(ValidationBegin::Busy);
        };
        let (kept, decision): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let kept: KeptFingerprint = decode_json(nonce, &kept)?;
        Ok(if kept.matches(fingerprint) {
            ValidationBegin::Recorded(decode_json(nonce, &decision)?)
        } else {
            ValidationBegin::Mismatch
        })
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
             SELECT $1, $3::jsonb, $4::jsonb, now() + make_interval(secs => $5) FROM claimed \
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
            return Err(StoreError::ClaimLost(nonce.to_owned()));
        }
        if let Some(record) = postponed {
            let _ = self.insert_postponed(&mut tx, record).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
