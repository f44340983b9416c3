//! The Awaitable state on PostgreSQL: postponed validations, decisions (first wins, under
//! the row's lock) and the shared outbox, leased to one instance at a time.

use crate::model::ValidationId;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::super::record::RecordedDecision;
use super::super::{
    Due, DurableFuture, PostponedStore, ResolveFuture, StoreError, StoreFuture,
    unless_gone_or_unreadable,
};
use super::{OUTBOX_BATCH, OUTBOX_LEASE, PgStore, decode_json, encode_json};
use crate::model::TransactionValidationRequest;
use crate::postponed::record::{
    Decision, Delivery, NextDue, PostponedPage, PostponedState, PostponedValidation, Repeat,
    Resolution,
};

/// The statement that reads the validations of `state` (`{s}` for the schema). For
/// Pending and Queued its condition is exactly the predicate of a partial index
/// (`postponed_pending` and `postponed_queued` in `schema.rs`): what waits is read without
/// the rest (see [`PgStore::indexed_reads`]). Delivered and
/// refused ones are both `final`, told apart once decoded.
pub(super) fn in_state_sql(state: PostponedState) -> String {
    format!(
        "SELECT validation_id, record::text FROM {{s}}.postponed WHERE {} \
         ORDER BY validation_id",
        state_condition(Some(state))
    )
}

/// The statement that reads a page of the validations in `state` (any when `None`): ids
/// from `$1` on, by id, at most `$2`. What waits is read through its partial index by id
/// (`postponed_pending`, `postponed_queued` in `schema.rs`); the rest along the primary key
/// from `$1`. Delivered and refused ones are both `final`: the caller tells them apart once
/// decoded — never in SQL, where reading inside a `json` record fails on a `\u0000`
/// anywhere in it (see `0003_records_as_json_text.sql`).
pub(super) fn page_sql(state: Option<PostponedState>) -> String {
    format!(
        "SELECT validation_id, record::text FROM {{s}}.postponed \
         WHERE {} AND validation_id >= $1 ORDER BY validation_id LIMIT $2",
        state_condition(state)
    )
}

/// The condition on a row of `postponed` that holds for a validation in `state` (any when
/// `None`): for Pending and Queued, exactly the predicate of their partial indexes; for
/// Delivered and Conflict, `final`, which holds for both.
fn state_condition(state: Option<PostponedState>) -> &'static str {
    match state {
        None => "true",
        Some(PostponedState::Pending) => "NOT final AND deliver_at IS NULL",
        Some(PostponedState::Queued) => "deliver_at IS NOT NULL",
        Some(PostponedState::Delivered | PostponedState::Conflict) => "final",
    }
}

/// When the outbox has work next for this instance (`$2`) after `$1`: a result not leased
/// elsewhere when it falls due, one leased to a live instance when that lease runs out.
/// Each part reads its few rows through an index — the first result due after `$1`
/// (`postponed_outbox`), the results leased now (`postponed_leased`) — where one expression
/// over both would read every queued result on every pass: an aggregator's outage queues
/// tens of thousands.
pub(super) fn outbox_next_sql() -> String {
    format!(
        "SELECT least( \
           (SELECT deliver_at FROM {{s}}.postponed \
            WHERE deliver_at > $1 \
              AND (lease_until > now() AND lease_owner <> $2 AND {alive}) IS NOT TRUE \
            ORDER BY deliver_at LIMIT 1), \
           (SELECT min(greatest(deliver_at, lease_until)) FROM {{s}}.postponed \
            WHERE lease_until > now() AND deliver_at IS NOT NULL AND lease_owner <> $2 \
              AND {alive} AND greatest(deliver_at, lease_until) > $1))",
        alive = super::liveness::owner_alive("lease_owner")
    )
}

/// The statement that reads the validations of nonce `$1`, the latest first, among which
/// the one that holds its decision is found ([`PgStore::original_of_nonce`]). Read through
/// the `postponed_nonce_hash` index (`schema.rs`).
pub(super) const VALIDATIONS_OF_NONCE: &str = "SELECT validation_id, record::text FROM {s}.postponed \
     WHERE nonce = $1 ORDER BY validation_id DESC";

/// Rolls back `tx`, which wrote nothing, so that the rows it locked are let go now. A
/// transaction only dropped is rolled back when its connection is next used: until then
/// its locks stay, and the outbox's `SKIP LOCKED` passes over a result due for delivery.
async fn let_go(tx: sqlx::Transaction<'_, sqlx::Postgres>) -> Result<(), StoreError> {
    tx.rollback().await?;
    Ok(())
}

/// The columns that index a record: its deadline while undecided, its next attempt while
/// its result awaits delivery, and whether it is final.
struct Indexed {
    deadline_at: Option<DateTime<Utc>>,
    deliver_at: Option<DateTime<Utc>>,
    is_final: bool,
}

fn indexed(record: &PostponedValidation) -> Indexed {
    let (deadline_at, deliver_at) = match record.next_due() {
        NextDue::Deadline(deadline) => (deadline, None),
        NextDue::Delivery(next_attempt) => (None, Some(next_attempt)),
        NextDue::Nothing => (None, None),
    };
    Indexed {
        deadline_at,
        deliver_at,
        is_final: record.is_final(),
    }
}

impl PostponedStore for PgStore {
    fn resolve<'a>(
        &'a self,
        validation_id: ValidationId,
        decision: &'a Decision,
        by: Option<&'a str>,
        now: DateTime<Utc>,
    ) -> ResolveFuture<'a> {
        Box::pin(async move {
            let (success, description) = (decision.allows(), decision.description());
            let by = by.map(str::to_owned);
            let mut tx = self.pool().begin().await?;
            let Some(mut record) = self.locked(&mut tx, validation_id).await? else {
                return Ok(Resolution::Unknown);
            };
            // A repeat is decided through the validation it repeats. Every resolve locks an
            // original before its repeats, so this lock is let go first (a repeat never
            // stops being one); an original gone (purged once delivered) leaves it alone.
            if let Some(original) = record.repeat_of {
                tx.rollback().await?;
                tx = self.pool().begin().await?;
                record = match unless_gone_or_unreadable(self.locked(&mut tx, original).await)? {
                    Some(original) => original,
                    None => match self.locked(&mut tx, validation_id).await? {
                        Some(repeat) => repeat,
                        None => return Ok(Resolution::Unknown),
                    },
                };
            }
            let resolution = record.resolve(success, description.to_owned(), by.clone(), now);
            if resolution == Resolution::Recorded {
                self.update_postponed(&mut tx, &record, false).await?;
                for id in &record.repeats {
                    if let Some(mut repeat) =
                        unless_gone_or_unreadable(self.locked(&mut tx, *id).await)?
                        && repeat.resolve(success, description.to_owned(), by.clone(), now)
                            == Resolution::Recorded
                    {
                        self.update_postponed(&mut tx, &repeat, false).await?;
                    }
                }
                tx.commit().await?;
            } else {
                // The row's lock goes now (see `let_go`).
                let_go(tx).await?;
            }
            Ok(resolution)
        })
    }

    fn repeat<'a>(
        &'a self,
        request: &'a TransactionValidationRequest,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Repeat> {
        Box::pin(async move {
            let mut tx = self.pool().begin().await?;
            // The nonce's record first, renewed and locked: the repeats of one nonce, on
            // every instance, are recorded one at a time (and in the order a validation's
            // own records are written: the nonce's, then its postponed validation's).
            let Some(decision) = self.renewed_nonce(&mut tx, request).await? else {
                let_go(tx).await?;
                return Err(StoreError::purged_as_asked_again());
            };
            // The original holds the nonce's decision.
            let original = self
                .original_of_nonce(&mut tx, request.nonce().as_str())
                .await?;
            // Read under the nonce's lock: a repeat recorded by another instance a moment
            // ago is seen here.
            if let Some(known) = self.known(&mut tx, request).await? {
                let_go(tx).await?;
                return Ok(known);
            }
            let Some(mut original) = original else {
                // An approval no postponed validation holds is recorded afresh (see
                // `Repeat::RecordedAfresh`).
                if decision != RecordedDecision::Allow {
                    let_go(tx).await?;
                    return Ok(Repeat::Unlinked);
                }
                let approved = PostponedValidation::approved(request.clone(), now);
                return self.insert_repeat(tx, request, &approved, None).await;
            };
            let Some(repeat) = original.repeated_by(request.clone(), now) else {
                let_go(tx).await?;
                return Ok(Repeat::Full);
            };
            self.insert_repeat(tx, request, &repeat, Some(&original))
                .await
        })
    }

    fn record_delivery(
        &self,
        validation_id: ValidationId,
        delivery: Delivery,
    ) -> DurableFuture<'_> {
        Box::pin(async move {
            let mut tx = self.pool().begin().await?;
            let Some(mut record) = self.locked(&mut tx, validation_id).await? else {
                return Ok(());
            };
            // Unchanged (already final): the lease ends all the same.
            let _ = record.record_delivery(delivery);
            self.update_postponed(&mut tx, &record, true).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn make_due(&self, validation_id: ValidationId, now: DateTime<Utc>) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut tx = self.pool().begin().await?;
            let Some(mut record) = self.locked(&mut tx, validation_id).await? else {
                return Ok(false);
            };
            if !record.due_now(now) {
                let_go(tx).await?;
                return Ok(false);
            }
            // A lease is this instance's only while its outbox posts the result: ended here,
            // another instance could post the same attempt beside it. The post's outcome
            // ends it.
            self.update_postponed(&mut tx, &record, false).await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    fn postponed(
        &self,
        validation_id: ValidationId,
    ) -> StoreFuture<'_, Option<PostponedValidation>> {
        Box::pin(async move {
            let row = sqlx::query(
                &self.sql("SELECT record::text FROM {s}.postponed WHERE validation_id = $1"),
            )
            .bind(validation_id.get())
            .fetch_optional(self.pool())
            .await?;
            row.map(|r| decode_json(&validation_id.to_string(), &r.try_get::<String, _>(0)?))
                .transpose()
        })
    }

    fn postponed_all(&self) -> StoreFuture<'_, Vec<PostponedValidation>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql(
                "SELECT validation_id, record::text FROM {s}.postponed ORDER BY validation_id",
            ))
            .fetch_all(self.pool())
            .await?;
            records(&rows)
        })
    }

    fn postponed_in(&self, state: PostponedState) -> StoreFuture<'_, Vec<PostponedValidation>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql(&in_state_sql(state)))
                .fetch_all(self.pool())
                .await?;
            let found = records(&rows)?;
            // The index conditions are exactly Pending and Queued; "final" is both of the
            // others.
            Ok(match state {
                PostponedState::Delivered | PostponedState::Conflict => {
                    super::super::in_state(found, state)
                }
                PostponedState::Pending | PostponedState::Queued => found,
            })
        })
    }

    fn postponed_settled(&self, limit: usize) -> StoreFuture<'_, Vec<PostponedValidation>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql(
                "SELECT validation_id, record::text FROM {s}.postponed WHERE final \
                 ORDER BY validation_id DESC LIMIT $1",
            ))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await?;
            records(&rows)
        })
    }

    fn postponed_page(
        &self,
        state: Option<PostponedState>,
        after: Option<ValidationId>,
        limit: usize,
    ) -> StoreFuture<'_, PostponedPage> {
        Box::pin(async move {
            let limit = limit.max(1);
            let wanted = limit.saturating_add(1);
            let sql = self.sql(&page_sql(state));
            let mut found = Vec::new();
            let mut from = after.map_or(Some(i64::MIN), |after| after.get().checked_add(1));
            // One read, but for a delivered or refused page: `final` holds both, so reads
            // go on from the last row read until the page is full or the rows end.
            while let Some(start) = from {
                let rows = sqlx::query(&sql)
                    .bind(start)
                    .bind(i64::try_from(wanted).unwrap_or(i64::MAX))
                    .fetch_all(self.pool())
                    .await?;
                let read = records(&rows)?;
                let ended = read.len() < wanted;
                from = read
                    .last()
                    .and_then(|last| last.validation_id.get().checked_add(1));
                found.extend(
                    read.into_iter()
                        .filter(|v| state.is_none_or(|state| v.state() == state)),
                );
                if ended || found.len() >= wanted {
                    break;
                }
            }
            Ok(PostponedPage::of(found, limit))
        })
    }

    fn outbox_due(&self, now: DateTime<Utc>) -> StoreFuture<'_, Due> {
        Box::pin(async move {
            // Leased to this instance: free ones, expired leases, and its own.
            let rows = sqlx::query(&self.sql(&format!(
                "WITH due AS ( \
                   SELECT validation_id FROM {{s}}.postponed \
                   WHERE deliver_at <= $1 \
                     AND (lease_until IS NULL OR lease_until < now() OR lease_owner = $2 \
                       OR NOT {alive}) \
                   ORDER BY deliver_at LIMIT $4 \
                   FOR UPDATE SKIP LOCKED) \
                 UPDATE {{s}}.postponed p \
                   SET lease_owner = $2, lease_until = now() + make_interval(secs => $3) \
                 FROM due WHERE p.validation_id = due.validation_id \
                 RETURNING p.validation_id, p.record::text",
                alive = super::liveness::owner_alive("lease_owner")
            )))
            .bind(now)
            .bind(self.inner.liveness.owner)
            .bind(OUTBOX_LEASE.as_secs_f64())
            .bind(OUTBOX_BATCH)
            .fetch_all(self.pool())
            .await?;
            let now_due = self.due_records(&rows, "deliver_at").await?;
            let mut due = Due {
                now: now_due,
                next: None,
            };
            due.now.sort_by_key(|r| r.validation_id);
            let next = sqlx::query(&self.sql(&outbox_next_sql()))
                .bind(now)
                .bind(self.inner.liveness.owner)
                .fetch_one(self.pool())
                .await?;
            due.next = next.try_get(0)?;
            Ok(due)
        })
    }

    fn renew_outbox_leases<'a>(
        &'a self,
        ids: &'a [ValidationId],
    ) -> StoreFuture<'a, Vec<ValidationId>> {
        Box::pin(async move {
            // Still this instance's: not taken over (a lease that ran out and nobody took
            // is renewed), and not posted meanwhile.
            let ids: Vec<i64> = ids.iter().map(|id| id.get()).collect();
            let rows = sqlx::query(&self.sql(
                "UPDATE {s}.postponed \
                   SET lease_until = now() + make_interval(secs => $3) \
                 WHERE validation_id = ANY($1) AND lease_owner = $2 \
                   AND deliver_at IS NOT NULL \
                 RETURNING validation_id",
            ))
            .bind(&ids)
            .bind(self.inner.liveness.owner)
            .bind(OUTBOX_LEASE.as_secs_f64())
            .fetch_all(self.pool())
            .await?;
            rows.iter()
                .map(|row| Ok(ValidationId::from(row.try_get::<i64, _>(0)?)))
                .collect()
        })
    }

    fn outbox_len(&self) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let row = sqlx::query(
                &self.sql("SELECT count(*) FROM {s}.postponed WHERE deliver_at IS NOT NULL"),
            )
            .fetch_one(self.pool())
            .await?;
            Ok(usize::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0))
        })
    }

    fn outbox_summary(&self) -> StoreFuture<'_, crate::store::OutboxSummary> {
        Box::pin(async move {
            // Counted and dated in the database, each record's decision read there, where
            // it can be: PostgreSQL cannot read inside a `json` record that holds a
            // `\u0000` anywhere (see `0003_records_as_json_text.sql`), so those few are
            // read here instead. `chr(92) || 'u0000'` is the escape as the text holds it,
            // whatever the server's `standard_conforming_strings`; looked for once a row
            // (`OFFSET 0` keeps the planner from copying the test into both aggregates).
            let row = sqlx::query(&self.sql(
                "SELECT count(*), \
                   min(CASE WHEN NOT nul THEN (record->'result'->>'decided_ms')::bigint END), \
                   count(*) FILTER (WHERE nul) \
                 FROM (SELECT record, strpos(record::text, chr(92) || 'u0000') > 0 AS nul \
                       FROM {s}.postponed WHERE deliver_at IS NOT NULL OFFSET 0) AS queued",
            ))
            .fetch_one(self.pool())
            .await?;
            let queued = usize::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0);
            let mut oldest_decided = row
                .try_get::<Option<i64>, _>(1)?
                .and_then(DateTime::from_timestamp_millis);
            if row.try_get::<i64, _>(2)? > 0 {
                let rows = sqlx::query(&self.sql(
                    "SELECT validation_id, record::text FROM {s}.postponed \
                     WHERE deliver_at IS NOT NULL AND strpos(record::text, chr(92) || 'u0000') > 0",
                ))
                .fetch_all(self.pool())
                .await?;
                for row in &rows {
                    let (id, text) = (row.try_get::<i64, _>(0)?, row.try_get::<String, _>(1)?);
                    // One that does not decode is the outbox's to log (`unless_unreadable`).
                    let Ok(record) = decode_json::<PostponedValidation>(&id.to_string(), &text)
                    else {
                        continue;
                    };
                    let decided = record.result.map(|result| result.decided);
                    oldest_decided = match (oldest_decided, decided) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
            Ok(crate::store::OutboxSummary {
                queued,
                oldest_decided,
            })
        })
    }

    fn deadlines_due(&self, now: DateTime<Utc>) -> StoreFuture<'_, Due> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql(
                "SELECT validation_id, record::text FROM {s}.postponed \
                 WHERE deadline_at <= $1 ORDER BY deadline_at LIMIT $2",
            ))
            .bind(now)
            .bind(OUTBOX_BATCH)
            .fetch_all(self.pool())
            .await?;
            let next = sqlx::query(
                &self.sql("SELECT min(deadline_at) FROM {s}.postponed WHERE deadline_at > $1"),
            )
            .bind(now)
            .fetch_one(self.pool())
            .await?;
            Ok(Due {
                now: self.due_records(&rows, "deadline_at").await?,
                next: next.try_get(0)?,
            })
        })
    }
}

fn records(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<PostponedValidation>, StoreError> {
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get(0)?;
            decode_json(&id.to_string(), &row.try_get::<String, _>(1)?)
        })
        .collect()
}

impl PgStore {
    /// [`records`] for the outbox and the deadlines: a record that cannot be decoded is left
    /// out ([`super::super::unless_unreadable`]), and its time in `column` (`deliver_at`,
    /// `deadline_at`) moved [`super::super::UNREADABLE_LEFT_FOR`] on, with its lease ended:
    /// it would otherwise come first in every batch, taken again each pass, until enough of
    /// them kept every other record out of the batch.
    async fn due_records(
        &self,
        rows: &[sqlx::postgres::PgRow],
        column: &str,
    ) -> Result<Vec<PostponedValidation>, StoreError> {
        let mut due = Vec::with_capacity(rows.len());
        let mut unreadable = Vec::new();
        for row in rows {
            let id: i64 = row.try_get(0)?;
            let read = decode_json(&id.to_string(), &row.try_get::<String, _>(1)?);
            match super::super::unless_unreadable(read)? {
                Some(record) => due.push(record),
                None => unreadable.push(id),
            }
        }
        if !unreadable.is_empty() {
            let left_for = super::super::UNREADABLE_LEFT_FOR.as_secs();
            sqlx::query(&self.sql(&format!(
                "UPDATE {{s}}.postponed SET {column} = now() + make_interval(secs => {left_for}), \
                   lease_owner = NULL, lease_until = NULL \
                 WHERE validation_id = ANY($1) AND {column} IS NOT NULL"
            )))
            .bind(&unreadable)
            .execute(self.pool())
            .await?;
        }
        Ok(due)
    }

    /// The validation that holds `nonce`'s decision, locked: of its validations that repeat
    /// none, the one received last (an older one is from before the nonce's record expired;
    /// received, not numbered, last: the aggregator's ids need not grow with time). The
    /// sled store keeps the link in the nonce's record itself.
    ///
    /// Which one repeats none is read from the records in Rust, not with `record->>` in SQL:
    /// PostgreSQL reads inside a `json` value only by converting all of it, which fails on a
    /// `\u0000` anywhere in it (migration 3 keeps records as `json` for that character), and
    /// every repeat of such a validation was refused for ever. The original is then locked
    /// and read again; it stays an original (a record's `repeat_of` never changes), and a
    /// repeat recorded meanwhile is in what is read under the lock.
    async fn original_of_nonce(
        &self,
        conn: &mut PgConnection,
        nonce: &str,
    ) -> Result<Option<PostponedValidation>, StoreError> {
        match self.latest_original(&mut *conn, nonce).await? {
            Some(original) => self.locked(conn, original.validation_id).await,
            None => Ok(None),
        }
    }

    /// The validation that holds `nonce`'s decision (see [`Self::original_of_nonce`]), as
    /// read now, unlocked.
    pub(super) async fn latest_original<'c>(
        &self,
        conn: impl sqlx::PgExecutor<'c>,
        nonce: &str,
    ) -> Result<Option<PostponedValidation>, StoreError> {
        let rows = sqlx::query(&self.sql(VALIDATIONS_OF_NONCE))
            .bind(nonce)
            .fetch_all(conn)
            .await?;
        let mut latest: Option<PostponedValidation> = None;
        for row in rows {
            let id = row.try_get::<i64, _>(0)?;
            let record: PostponedValidation =
                decode_json(&id.to_string(), &row.try_get::<String, _>(1)?)?;
            // Rows come by id, highest first: of two received at once, the higher id.
            if record.repeat_of.is_none()
                && latest
                    .as_ref()
                    .is_none_or(|latest| record.received > latest.received)
            {
                latest = Some(record);
            }
        }
        Ok(latest)
    }

    /// The record of `validation_id`, locked for the rest of the transaction.
    async fn locked(
        &self,
        conn: &mut PgConnection,
        validation_id: ValidationId,
    ) -> Result<Option<PostponedValidation>, StoreError> {
        let row = sqlx::query(
            &self.sql("SELECT record::text FROM {s}.postponed WHERE validation_id = $1 FOR UPDATE"),
        )
        .bind(validation_id.get())
        .fetch_optional(&mut *conn)
        .await?;
        row.map(|r| decode_json(&validation_id.to_string(), &r.try_get::<String, _>(0)?))
            .transpose()
    }

    /// Writes `record` back with its index columns; `end_lease` ends this instance's outbox
    /// lease on it. Another instance's lease stays: it took the result over (this one's ran
    /// out) and may be posting it now; ended, a third instance would post it beside it.
    async fn update_postponed(
        &self,
        conn: &mut PgConnection,
        record: &PostponedValidation,
        end_lease: bool,
    ) -> Result<(), StoreError> {
        let index = indexed(record);
        let lease = if end_lease {
            ", lease_owner = CASE WHEN lease_owner = $7 THEN NULL ELSE lease_owner END, \
               lease_until = CASE WHEN lease_owner = $7 THEN NULL ELSE lease_until END"
        } else {
            ""
        };
        sqlx::query(&self.sql(&format!(
            "UPDATE {{s}}.postponed SET record = $2::json, final = $3, deadline_at = $4, \
               deliver_at = $5, expires_at = now() + make_interval(secs => $6){lease} \
             WHERE validation_id = $1"
        )))
        .bind(record.validation_id.get())
        .bind(encode_json(record))
        .bind(index.is_final)
        .bind(index.deadline_at)
        .bind(index.deliver_at)
        .bind(self.retention_secs())
        .bind(self.inner.liveness.owner)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Whom `request`'s validation id is held for, when it is: [`Repeat::Known`] for its own
    /// nonce, [`Repeat::Taken`] for another's; `None` when it is not held. (A repeat's
    /// answer, and a postponed validation's refusal under a taken id.)
    pub(super) async fn known(
        &self,
        conn: &mut PgConnection,
        request: &TransactionValidationRequest,
    ) -> Result<Option<Repeat>, StoreError> {
        let nonce: Option<String> = sqlx::query_scalar(
            &self.sql("SELECT nonce FROM {s}.postponed WHERE validation_id = $1"),
        )
        .bind(request.validation_id.get())
        .fetch_optional(&mut *conn)
        .await?;
        Ok(nonce.map(|nonce| {
            if nonce == request.nonce().as_str() {
                Repeat::Known
            } else {
                Repeat::Taken
            }
        }))
    }

    /// Renews the record of `request`'s nonce, as it is asked about again, and holds it until
    /// the transaction ends: a purge that chose it as expired (its snapshot blind to the
    /// repeat being recorded, which makes the nonce one that awaits a result) waits for the
    /// row, reads it again and passes over it. Returns the nonce's recorded decision;
    /// `None` when no record is left to renew (a purge took it first, and asked again, the
    /// nonce is validated afresh — rather than its handler run again while this repeat's
    /// result is delivered).
    async fn renewed_nonce(
        &self,
        tx: &mut PgConnection,
        request: &TransactionValidationRequest,
    ) -> Result<Option<RecordedDecision>, StoreError> {
        let nonce = request.nonce().as_str();
        let decision: Option<String> = sqlx::query_scalar(&self.sql(
            "UPDATE {s}.validations \
             SET expires_at = greatest(expires_at, now() + make_interval(secs => $2)) \
             WHERE nonce_key = $1 RETURNING decision::text",
        ))
        .bind(super::nonce_key(nonce))
        .bind(self.retention_secs())
        .fetch_optional(&mut *tx)
        .await?;
        decision
            .map(|decision| decode_json(nonce, &decision))
            .transpose()
    }

    /// Inserts `record`, the postponed validation of `request` — a repeat of `original`,
    /// written back with its new repeat, or an approval recorded afresh — and commits; what
    /// was done.
    async fn insert_repeat(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        request: &TransactionValidationRequest,
        record: &PostponedValidation,
        original: Option<&PostponedValidation>,
    ) -> Result<Repeat, StoreError> {
        if !self.insert_postponed(&mut tx, record).await? {
            // Another validation wrote the id between the read of it and this insert
            // (another nonce's takes no lock of the original's): nothing is linked to it,
            // or a decision of this nonce would decide that payment.
            let known = self.known(&mut tx, request).await?;
            tx.rollback().await?;
            return Ok(known.unwrap_or(Repeat::Known));
        }
        let Some(original) = original else {
            tx.commit().await?;
            return Ok(Repeat::RecordedAfresh);
        };
        self.update_postponed(&mut tx, original, false).await?;
        tx.commit().await?;
        Ok(Repeat::Recorded {
            of: original.validation_id,
            decided: record.result.is_some(),
        })
    }

    /// Stores a new postponed validation, unless its id is known (the first one stays);
    /// `true` when written.
    pub(super) async fn insert_postponed(
        &self,
        conn: &mut PgConnection,
        record: &PostponedValidation,
    ) -> Result<bool, StoreError> {
        let inserted = self.insert_postponed_row(conn, record).await?;
        if !inserted {
            tracing::warn!(
                security_event = "validation_id_reuse",
                validation_id = record.validation_id.get(),
                "a validation id arrived again; the first record is kept"
            );
        }
        Ok(inserted)
    }

    /// Inserts `record` unless a record of its validation id is there already; `true` when
    /// it was inserted. (A copy run again meets its own records: no validation id arrived
    /// again, and nothing is said.)
    pub(super) async fn insert_postponed_row(
        &self,
        conn: &mut PgConnection,
        record: &PostponedValidation,
    ) -> Result<bool, StoreError> {
        let index = indexed(record);
        let inserted = sqlx::query(&self.sql(
            "INSERT INTO {s}.postponed (validation_id, nonce, record, final, deadline_at, \
               deliver_at, expires_at) \
             VALUES ($1, $2, $3::json, $4, $5, $6, now() + make_interval(secs => $7)) \
             ON CONFLICT (validation_id) DO NOTHING",
        ))
        .bind(record.validation_id.get())
        .bind(record.request.nonce().as_str())
        .bind(encode_json(record))
        .bind(index.is_final)
        .bind(index.deadline_at)
        .bind(index.deliver_at)
        .bind(self.retention_secs())
        .execute(&mut *conn)
        .await?
        .rows_affected();
        Ok(inserted > 0)
    }
}
