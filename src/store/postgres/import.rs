//! Moving a running merchant from sled to PostgreSQL without losing history: the
//! deduplication records still within retention (and a validation record past it whose
//! nonce's postponed validation still awaits its result, which sled keeps: a new validation
//! of the nonce would run the handler again), the callbacks failing, the results held
//! (waiting for a person or resolved), the postponed
//! validations with their outbox, and the merchant's trees, copied from a stopped sled
//! store (`payhook store copy-from-sled`).
//!
//! The copy is idempotent and resumable: every row is inserted unless the database already
//! holds it (a callback's acknowledged statuses are merged: those the database lacks are
//! added before its own, which came later, and none it holds is dropped), so a copy that stopped half-way is run again from the
//! start. A retry of a callback acknowledged before the move is answered as a duplicate
//! after it, and one acknowledged by PostgreSQL meanwhile still is; a delivery that meets a
//! nonce the copy is writing is told it is busy (the copy holds the nonce's claim lock
//! until its batch commits). Run it before the PostgreSQL instances serve: one that serves
//! first books a retry of a callback sled booked again, and a run after they did adds back
//! tree keys, failing callbacks and delivered results they removed since (it never
//! overwrites what they wrote). The copy refuses while another store has the schema open
//! (waiting five seconds for one just stopped to close), stops when one holds it again
//! before a batch commits, and no store opens while the copy holds it (see `liveness`); a
//! payhook older than this check takes no part in it. A copy that finished runs again only
//! when asked ([`PgStore::import_sled_again`]): after instances served and stopped, it
//! would add back what they removed. The sled directory is marked as moving when the copy
//! begins and as moved when it ends (under sled's lock throughout), and a sled store refuses
//! to open on it.
//!
//! What the copied records reach back to (sled's record of the retention they were written
//! with, see `store::horizon`) is written into the schema before the first is copied —
//! joined with the schema's own when it holds callback records — so that the database
//! vouches for no more than sled did.

use chrono::Utc;

use super::super::failing::FailureRecord;
use super::super::held::HeldCallback;
use super::super::keys;
use super::super::record::{CallbackRecord, EndedSession, ValidationRecord, decode};
use super::super::{KeyValue, SledStore, StoreConfig, StoreError, time_from_ms};
use super::PgStore;
use super::liveness::CopyLock;
use crate::postponed::record::PostponedValidation;

/// What a copy wrote (rows already in the database are not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Imported {
    /// Callback records (nonce → acknowledged statuses).
    pub callbacks: u64,
    /// Validation records (nonce → payment and decision).
    pub validations: u64,
    /// Failing callbacks, per (nonce, status).
    pub failures: u64,
    /// Results held by the merchant, resolved or not, per (nonce, status).
    pub held: u64,
    /// Postponed validations, their results and outbox state included.
    pub postponed: u64,
    /// Keys of the merchant's trees.
    pub tree_keys: u64,
    /// Records past their retention, left behind.
    pub expired: u64,
    /// Records of a nonce carrying U+0000, left behind: PostgreSQL cannot hold it in text,
    /// and refuses a delivery or a validation of such a nonce before any handler (400).
    /// An older sled store, or one written through the library, may hold them.
    pub unstorable: u64,
}

impl std::fmt::Display for Imported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "copied {} callback record(s), {} validation record(s), {} failing callback(s), \
             {} held result(s), {} postponed validation(s), {} tree key(s); {} expired \
             record(s) left behind",
            self.callbacks,
            self.validations,
            self.failures,
            self.held,
            self.postponed,
            self.tree_keys,
            self.expired
        )?;
        if self.unstorable > 0 {
            write!(
                f,
                "; {} record(s) of a nonce with U+0000 left behind (PostgreSQL cannot hold it, \
                 and refuses its deliveries with 400)",
                self.unstorable
            )?;
        }
        Ok(())
    }
}

/// Rows written per transaction.
const BATCH: usize = 500;

/// What one sled entry came to.
enum Copied {
    /// A record, written or already there.
    Record,
    /// Nothing: not a record, or one past its retention left behind.
    Nothing,
    /// A validation record past its retention (its nonce's key and the record), copied once
    /// the postponed validations are, if one of its nonce awaits its result.
    Later(Box<(String, ValidationRecord)>),
}

impl PgStore {
    /// Copies the stopped sled store at `sled` into this database (see the module docs).
    ///
    /// # Errors
    ///
    /// [`StoreError::Integrity`] when the sled store lost acknowledged commits;
    /// [`StoreError::Backend`] when it cannot be read (it is in use: stop the service), when
    /// another store (an instance, a tool) still has the schema open five seconds on, when
    /// another copy writes into it, or when the database fails. What was copied before an
    /// error stays; run the copy again.
    ///
    /// The sled directory is marked as moving before the first record is read, and as
    /// moved once everything is copied ([`MOVED_FILE_NAME`](crate::store::MOVED_FILE_NAME)):
    /// [`SledStore::open`] refuses it from then on, so that a sled instance started by
    /// mistake does not book again what PostgreSQL books. A copy that did not finish is run
    /// again as it was; one that finished is refused (run after the instances served, it
    /// would add back what they removed since): see [`PgStore::import_sled_again`].
    pub async fn import_sled(&self, sled: &StoreConfig) -> Result<Imported, StoreError> {
        self.import(sled, false).await
    }

    /// [`PgStore::import_sled`] of a sled store whose copy finished before
    /// (`payhook store copy-from-sled --again`): for when no instance has served from
    /// PostgreSQL since — a copy after they did adds back the tree keys, failing callbacks
    /// and delivered results (which the outbox would post again) that their work removed.
    ///
    /// # Errors
    ///
    /// As [`PgStore::import_sled`].
    pub async fn import_sled_again(&self, sled: &StoreConfig) -> Result<Imported, StoreError> {
        self.import(sled, true).await
    }

    async fn import(&self, sled: &StoreConfig, again: bool) -> Result<Imported, StoreError> {
        // Held until the copy ends (its connection closed on an error).
        let mut alone =
            CopyLock::take(self.pool(), &self.inner.schema, self.inner.liveness.owner).await?;
        // sled's lock is held for as long as its records are: until the copy is marked done.
        let (vouched, mut records) = SledStore::export(sled)?;
        if let Some(said) = SledStore::moved(sled)?
            && said.starts_with(super::super::sled_store::COPIED_INTO)
            && !again
        {
            return Err(StoreError::backend_message(format!(
                "the sled store at {} was {said}: a copy run again after the instances served \
                 from PostgreSQL would add back what their work removed since (tree keys, \
                 failing callbacks, delivered results the outbox would post again); if none has \
                 served since, run it again with --again",
                sled.path.display()
            )));
        }
        SledStore::mark_moved(sled, &self.inner.schema, false)?;
        self.copy_vouched(vouched).await?;
        let imported = self.copy_records(&mut records, &mut alone).await?;
        SledStore::mark_moved(sled, &self.inner.schema, true)?;
        drop(records);
        alone.release().await;
        Ok(imported)
    }

    /// Records in the schema what the copied records reach back to (sled's `vouched`),
    /// before the first is copied: a schema that said it held the whole retention's
    /// records, with sled's reaching back less (its retention raised shortly before), let a
    /// result booked before the move be booked again.
    async fn copy_vouched(
        &self,
        vouched: super::super::horizon::Vouched,
    ) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await?;
        super::horizon::copied_in(&mut conn, &self.inner.schema, self.inner.retention, vouched)
            .await
    }

    /// [`PgStore::import_sled`] once the copy holds the schema alone; it checks that it
    /// still does before each batch it commits.
    async fn copy_records(
        &self,
        records: &mut impl Iterator<Item = Result<KeyValue, StoreError>>,
        alone: &mut CopyLock,
    ) -> Result<Imported, StoreError> {
        let mut imported = Imported::default();
        let now_ms = u64::try_from(Utc::now().timestamp_millis()).unwrap_or(0);
        let mut tx = self.pool().begin().await?;
        let mut in_batch = 0;
        let mut past_retention = Vec::new();
        for entry in records {
            let (key, value) = entry?;
            let written = self
                .import_one(&mut tx, (&key, &value), now_ms, &mut imported)
                .await?;
            match written {
                Copied::Record => in_batch += 1,
                Copied::Nothing => {}
                Copied::Later(validation) => past_retention.push(*validation),
            }
            if in_batch >= BATCH {
                alone.still_alone().await?;
                tx.commit().await?;
                tx = self.pool().begin().await?;
                in_batch = 0;
            }
        }
        alone.still_alone().await?;
        tx.commit().await?;
        // Once every postponed validation is in: those past their retention whose nonce's
        // validation still awaits its result.
        for batch in past_retention.chunks(BATCH) {
            let mut tx = self.pool().begin().await?;
            for (named, record) in batch {
                if self.awaited(&mut tx, named).await? {
                    imported.validations += self.copy_validation(&mut tx, named, record).await?;
                } else {
                    imported.expired += 1;
                }
            }
            alone.still_alone().await?;
            tx.commit().await?;
        }
        tracing::info!(%imported, "sled store copied into PostgreSQL");
        Ok(imported)
    }

    /// Whether a postponed validation of the nonce keyed `named` awaits its decision or its
    /// delivery (the rule by which PostgreSQL's sweep keeps its validation record).
    async fn awaited(
        &self,
        conn: &mut sqlx::PgConnection,
        named: &str,
    ) -> Result<bool, StoreError> {
        let row = sqlx::query(&self.sql(concat!(
            "SELECT $1 IN (",
            super::awaiting_nonce_keys!(),
            ")"
        )))
        .bind(named)
        .fetch_one(&mut *conn)
        .await?;
        Ok(sqlx::Row::try_get::<bool, _>(&row, 0)?)
    }

    /// Copies `record`, nonce `named`'s validation record, unless the database holds one.
    /// The rows written.
    async fn copy_validation(
        &self,
        conn: &mut sqlx::PgConnection,
        named: &str,
        record: &ValidationRecord,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.sql(
            "INSERT INTO {s}.validations (nonce_key, fingerprint, decision, expires_at) \
             VALUES ($1, $2::json, $3::json, $4) ON CONFLICT (nonce_key) DO NOTHING",
        ))
        .bind(named)
        .bind(super::encode_json(&record.fingerprint))
        .bind(super::encode_json(&record.decision))
        .bind(time_from_ms(record.expires_ms))
        .execute(&mut *conn)
        .await?
        .rows_affected();
        Ok(done)
    }

    /// Copies one sled entry: whether it was a record (written or already there), or a
    /// validation record past its retention, copied after the postponed validations.
    async fn import_one(
        &self,
        conn: &mut sqlx::PgConnection,
        (key, value): (&[u8], &[u8]),
        now_ms: u64,
        imported: &mut Imported,
    ) -> Result<Copied, StoreError> {
        let nonce_key = |rest: &[u8]| match rest.first() {
            // A digested identifier, as PostgreSQL keys it too.
            Some(0xFF) => keys::describe(rest),
            // A nonce spelled out (by an older store even when long).
            _ => super::nonce_key(&String::from_utf8_lossy(rest)),
        };
        let count = |done: u64| {
            if done > 0 {
                Copied::Record
            } else {
                Copied::Nothing
            }
        };
        if let Some(rest) = key.strip_prefix(keys::CALLBACK_PREFIX) {
            let named = nonce_key(rest);
            if unstorable(&named, imported) {
                return Ok(Copied::Nothing);
            }
            let record: CallbackRecord = decode(&named, value)?;
            if record.expires_ms <= now_ms {
                imported.expired += 1;
                return Ok(Copied::Nothing);
            }
            // The nonce's claim lock (migration 2's), held until the batch commits: a
            // delivery of the nonce at a serving instance meanwhile is told it is busy, and
            // claims again once the statuses copied are there to read. Without it, it read
            // none while the copy's row was uncommitted, ran its handler for a status sled
            // had booked, and its claim appended that status a second time.
            sqlx::query(&self.sql(super::dedup::WAIT_FOR_NONCE_CLAIM))
                .bind(&named)
                .execute(&mut *conn)
                .await?;
            let done = sqlx::query(&self.sql(
                "INSERT INTO {s}.callbacks AS c (nonce_key, done, attempts, expires_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (nonce_key) DO UPDATE \
                   SET done = ARRAY(SELECT status \
                       FROM unnest(EXCLUDED.done) WITH ORDINALITY AS sled(status, at) \
                       WHERE NOT status = ANY(c.done) ORDER BY at) || c.done, \
                     attempts = greatest(c.attempts, EXCLUDED.attempts), \
                     expires_at = greatest(c.expires_at, EXCLUDED.expires_at) \
                   WHERE NOT (c.done @> EXCLUDED.done)",
            ))
            .bind(&named)
            .bind(&record.done)
            .bind(i32::try_from(record.attempts).unwrap_or(i32::MAX))
            .bind(time_from_ms(record.expires_ms))
            .execute(&mut *conn)
            .await?
            .rows_affected();
            imported.callbacks += done;
            return Ok(count(done));
        }
        if let Some(rest) = key.strip_prefix(keys::VALIDATION_PREFIX) {
            let named = nonce_key(rest);
            if unstorable(&named, imported) {
                return Ok(Copied::Nothing);
            }
            let record: ValidationRecord = decode(&named, value)?;
            if record.expires_ms <= now_ms {
                // sled keeps it past its retention while the nonce's validation awaits its
                // result (a new validation of the nonce would run the handler again): whether
                // it does is known once the postponed validations are copied.
                return Ok(Copied::Later(Box::new((named, record))));
            }
            let done = self.copy_validation(conn, &named, &record).await?;
            imported.validations += done;
            return Ok(count(done));
        }
        if let Some(rest) = key
            .strip_prefix(keys::HELD_PREFIX)
            .or_else(|| key.strip_prefix(keys::RESOLVED_PREFIX))
        {
            // Waiting or resolved, kept with no retention to check.
            let Some(identifier) = rest.get(4..) else {
                return Err(StoreError::Corrupt {
                    key: keys::describe(rest),
                    reason: "a held result's key without its status".into(),
                });
            };
            let named = nonce_key(identifier);
            if unstorable(&named, imported) {
                return Ok(Copied::Nothing);
            }
            let held: HeldCallback = decode(&named, value)?;
            let done = sqlx::query(&self.sql(
                "INSERT INTO {s}.callbacks_held (nonce_key, status, nonce, reason, held_at, \
                   reference_id, client_id, amount, currency, resolved_at, resolution) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
                 ON CONFLICT (nonce_key, status) DO NOTHING",
            ))
            .bind(&named)
            .bind(held.status)
            .bind(super::readable(&held.nonce))
            .bind(super::readable(&held.reason))
            .bind(held.held_at)
            .bind(&held.transaction_reference_id)
            .bind(super::readable(&held.client_id))
            .bind(&held.amount)
            .bind(super::readable(&held.currency))
            .bind(held.resolved_at)
            .bind(super::readable(&held.resolution))
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if let Some(by) = held.resolved_by.as_deref().filter(|_| done > 0) {
                sqlx::query(&self.sql(
                    "INSERT INTO {s}.callbacks_held_by (nonce_key, status, resolved_by) \
                     VALUES ($1, $2, $3) ON CONFLICT (nonce_key, status) DO NOTHING",
                ))
                .bind(&named)
                .bind(held.status)
                .bind(super::readable(by))
                .execute(&mut *conn)
                .await?;
            }
            imported.held += done;
            return Ok(count(done));
        }
        if let Some(rest) = key.strip_prefix(keys::FAILING_PREFIX) {
            let named = nonce_key(rest);
            if unstorable(&named, imported) {
                return Ok(Copied::Nothing);
            }
            let record: FailureRecord = decode(&named, value)?;
            if record.expires_ms <= now_ms {
                imported.expired += 1;
                return Ok(Copied::Nothing);
            }
            for failing in record.failing {
                let done = sqlx::query(&self.sql(
                    "INSERT INTO {s}.callback_failures (nonce_key, status, nonce, failures, \
                       first_failed, last_failed, last_reason, reference_id, client_id, amount, \
                       currency, expires_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
                     ON CONFLICT (nonce_key, status) DO NOTHING",
                ))
                .bind(&named)
                .bind(failing.status)
                .bind(super::readable(&failing.nonce))
                .bind(i32::try_from(failing.failures).unwrap_or(i32::MAX))
                .bind(failing.first_failed)
                .bind(failing.last_failed)
                .bind(super::readable(&failing.last_reason))
                .bind(&failing.transaction_reference_id)
                .bind(super::readable(&failing.client_id))
                .bind(&failing.amount)
                .bind(super::readable(&failing.currency))
                .bind(time_from_ms(record.expires_ms))
                .execute(&mut *conn)
                .await?
                .rows_affected();
                imported.failures += done;
            }
            return Ok(Copied::Record);
        }
        if key.starts_with(keys::POSTPONED_PREFIX) {
            let id = keys::id_of(key).map_or_else(String::new, |id| id.to_string());
            let record: PostponedValidation = decode(&id, value)?;
            if unstorable(record.request.nonce(), imported) {
                return Ok(Copied::Nothing);
            }
            let done = self.insert_postponed_row(conn, &record).await?;
            imported.postponed += u64::from(done);
            return Ok(count(u64::from(done)));
        }
        if let Some(rest) = key.strip_prefix(keys::SESSION_PREFIX) {
            // A session logged out shortly before the move stays ended after it.
            let session = String::from_utf8_lossy(rest);
            let record: EndedSession = decode(&session, value)?;
            if record.expires_ms <= now_ms {
                return Ok(Copied::Nothing);
            }
            let done = sqlx::query(&self.sql(
                "INSERT INTO {s}.sessions_ended (session, expires_at) VALUES ($1, $2) \
                 ON CONFLICT (session) DO NOTHING",
            ))
            .bind(session.as_ref())
            .bind(time_from_ms(record.expires_ms))
            .execute(&mut *conn)
            .await?
            .rows_affected();
            return Ok(count(done));
        }
        if let Some(rest) = key.strip_prefix(b"t".as_slice())
            && let Some(end) = rest.iter().position(|b| *b == 0)
        {
            let (tree, tree_key) = (String::from_utf8_lossy(&rest[..end]), &rest[end + 1..]);
            let done = sqlx::query(&self.sql(
                "INSERT INTO {s}.trees (tree, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (tree, key) DO NOTHING",
            ))
            .bind(tree.as_ref())
            .bind(tree_key)
            .bind(value)
            .execute(&mut *conn)
            .await
            .map_err(|error| unindexable(error, &tree, tree_key.len()))?
            .rows_affected();
            imported.tree_keys += done;
            return Ok(count(done));
        }
        // The expiry index, the postponed indexes and the seal: PostgreSQL keeps their
        // content in columns of the rows above.
        Ok(Copied::Nothing)
    }
}

/// Whether the records of the nonce keyed `named` cannot be held by PostgreSQL (U+0000 in a
/// nonce short enough to be its own key): counted and logged, left behind.
fn unstorable(named: &str, imported: &mut Imported) -> bool {
    let unstorable = named.contains('\0');
    if unstorable {
        imported.unstorable += 1;
        tracing::warn!(
            nonce = %crate::Logged(named),
            "a record of a nonce with U+0000 is left behind: PostgreSQL cannot hold it"
        );
    }
    unstorable
}

/// `error`, or — where PostgreSQL cannot index the key of `len` bytes of `tree` (SQLSTATE
/// 54000: a btree row holds about 2,700 bytes) — what it means for the copy, which stops at
/// that key on every run.
fn unindexable(error: sqlx::Error, tree: &str, len: usize) -> StoreError {
    if !super::refused_with(&error, &["54000"]) {
        return error.into();
    }
    StoreError::backend_message(format!(
        "tree `{}`: a key of {len} bytes is more than PostgreSQL can index (about 2,700 bytes), \
         and the copy stops at it on every run; the keys before it were copied. A merchant's \
         effects cannot write such a key on PostgreSQL either: shorten it in the sled store \
         (with the service stopped) and run the copy again",
        crate::Logged(tree)
    ))
}
