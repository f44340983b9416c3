//! A callback's claim on PostgreSQL: the open transaction that will book it, holding the
//! nonce's transaction advisory lock (`{schema}.claim_callback`) from the claim to its
//! COMMIT or ROLLBACK.
//!
//! The claim, the read of what was acknowledged, the merchant's effects, the mark and the
//! COMMIT run on one connection, in one transaction: the claim writes nothing, and the
//! transaction's round trips are those of the merchant's own work plus two. A claim lives
//! as long as its connection: an instance that dies, or a connection the database closes,
//! gives its claims up at once.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::{Executor, PgConnection, Postgres};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::super::{Claim, StoreError};

/// A connection inside the transaction that holds a claim. Dropped while the transaction
/// is open, the connection is closed rather than returned to the pool (the database then
/// rolls the transaction back and releases the claim): a transaction left open can never
/// reach another user of the pool.
pub(super) struct HeldClaim {
    conn: PoolConnection<Postgres>,
    /// The claim's place among the connections callbacks may hold (none while spare).
    permit: Option<OwnedSemaphorePermit>,
    open: bool,
    /// The open transaction was begun for the next claim, and holds nothing yet.
    parked: bool,
    since: Instant,
    stale_after: Duration,
    /// The delivery's attempt number, written with the mark.
    pub(super) attempt: i32,
    /// A failure of the claimed status is recorded: the booking removes it.
    pub(super) failing: bool,
    /// The status claimed (its code).
    pub(super) status: i32,
    /// The status booked before, as the claim read it (its code): what the handler was told
    /// (`previous_status`), and what its effects were staged after.
    pub(super) previous: Option<i32>,
    /// The id of the transaction that holds the claim (`txid_current_if_assigned()` once it
    /// wrote the mark): what its COMMIT checks it still is.
    pub(super) transaction: Option<i64>,
    /// What begins a claim's transaction on this connection ([`Begin`]).
    begin: Begin,
    /// A read of the delivery's validation failed in the claim's transaction, which
    /// PostgreSQL then refuses to go on with: what failed, for the finish to say instead of
    /// running effects that would fail for it.
    pub(super) spoiled: Option<std::borrow::Cow<'static, str>>,
}

impl HeldClaim {
    /// A connection of the pool, for a claim judged stale after `stale_after`.
    fn new(conn: PoolConnection<Postgres>, stale_after: Duration, begin: Begin) -> Self {
        Self {
            begin,
            conn,
            permit: None,
            open: false,
            parked: false,
            since: Instant::now(),
            stale_after,
            attempt: 0,
            failing: false,
            status: 0,
            previous: None,
            transaction: None,
            spoiled: None,
        }
    }

    /// What begins a claim's transaction on this connection.
    pub(super) fn begin(&self) -> Begin {
        self.begin
    }

    /// The statement about to be sent begins the transaction, or the claim, in the
    /// transaction parked for it: from now on, a drop closes the connection. `true` when
    /// a transaction was parked (no BEGIN is needed).
    pub(super) fn opening(&mut self) -> bool {
        let parked = self.parked;
        self.open = true;
        self.parked = false;
        parked
    }

    /// COMMIT, and BEGIN the next claim's transaction in the same round trip: the claim
    /// ends, and the connection is parked for the next one (see [`HeldClaims`]).
    ///
    /// A statement first checks that the transaction is still the claim's, and neither
    /// COMMIT nor BEGIN after it is run when it fails:
    ///
    /// * PostgreSQL answers COMMIT in a failed transaction by rolling it back, without an
    ///   error: an effect that swallowed its statement's error would otherwise pass for
    ///   committed. The check fails in such a transaction (SQLSTATE 25P02).
    /// * An effect may have ended the claim's transaction: a COMMIT or ROLLBACK of its own,
    ///   or sqlx's `begin()` on the connection (payhook's BEGIN is not one sqlx counts, so
    ///   its transaction's `commit()` or `rollback()` sends COMMIT or ROLLBACK, not a
    ///   savepoint's). The mark is then gone: a ROLLBACK takes it, and a COMMIT fails and
    ///   takes it too (the claim declares the transaction a booking, which only this
    ///   statement's declaration lets commit: migration 6). What the effect wrote after
    ///   that committed on its own, and answering 200 would acknowledge a callback whose
    ///   repeat runs its handler again. The check fails when the transaction's id is not
    ///   the claim's ([`ENDED`], SQLSTATE 22P02).
    pub(super) async fn commit_and_park(&mut self) -> Result<(), sqlx::Error> {
        let check = self.still_its_own();
        self.conn
            .execute(sqlx::raw_sql(&format!(
                "SELECT {check}, set_config('payhook.booking', 'commit', true); COMMIT; {}",
                self.begin.sql()
            )))
            .await?;
        self.parked = true;
        self.transaction = None;
        Ok(())
    }

    /// An SQL expression that is 1 while the connection's transaction is still the claim's,
    /// and fails the statement it is in with [`ENDED`] (SQLSTATE 22P02) once an effect ended
    /// it (see [`Self::commit_and_park`]). In a statement that writes, it keeps the write
    /// from committing on its own, outside the claim's transaction.
    pub(super) fn still_its_own(&self) -> String {
        match self.transaction {
            Some(id) => format!(
                "(CASE WHEN txid_current_if_assigned() = {id} THEN '1' ELSE '{ENDED}' END)::int"
            ),
            None => "1".to_owned(),
        }
    }

    /// Fails with [`ENDED`] when an effect ended the claim's transaction: checked after an
    /// effect of the merchant's SQL, before anything else runs on the connection.
    pub(super) async fn check_still_its_own(&mut self) -> Result<(), sqlx::Error> {
        if self.transaction.is_some() {
            let check = format!("SELECT {}", self.still_its_own());
            self.conn.execute(sqlx::raw_sql(&check)).await?;
        }
        Ok(())
    }

    /// ROLLBACK, and BEGIN the next claim's transaction in the same round trip.
    pub(super) async fn rollback_and_park(&mut self) -> Result<(), sqlx::Error> {
        self.conn
            .execute(sqlx::raw_sql(&format!("ROLLBACK; {}", self.begin.sql())))
            .await?;
        self.parked = true;
        Ok(())
    }

    /// How long the claim may be held before another delivery takes it over.
    pub(super) fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// ROLLBACK; the claim ends with it, nothing the transaction wrote stays, and the
    /// connection may begin another.
    pub(super) async fn rollback(&mut self) -> Result<(), sqlx::Error> {
        self.conn.execute("ROLLBACK").await?;
        self.open = false;
        self.parked = false;
        Ok(())
    }

    /// `true` when the connection was parked for this claim (it may have been closed by
    /// the database meanwhile, as by `idle_in_transaction_session_timeout`).
    pub(super) fn parked(&self) -> bool {
        self.parked
    }

    /// `true` once the claim has been held longer than its delivery may take: another
    /// instance may take it over now.
    fn outlived(&self) -> bool {
        self.since.elapsed() > self.stale_after
    }
}

impl Deref for HeldClaim {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for HeldClaim {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Drop for HeldClaim {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// What begins a claim's transaction: READ COMMITTED whatever the pool's default, so that
/// each of the claim's statements reads what committed before it — after the nonce's lock
/// was taken, not before — and a COMMIT at least as synchronous as `on`, so that a booking is
/// acknowledged only once it is durable (on the synchronous standby, where one is
/// configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Begin {
    /// payhook's own pool, whose connections set `synchronous_commit = on` at start-up
    /// (which a role's or database's setting does not override): nothing more to say.
    OwnPool,
    /// A pool the merchant gave (`PgStore::with_pool`), whose connections may commit
    /// asynchronously: `off`, `local` and `remote_write` are raised to `on` for the
    /// transaction, and `remote_apply` is kept.
    GivenPool,
}

impl Begin {
    /// The statements that begin the transaction.
    pub(super) fn sql(self) -> &'static str {
        match self {
            Self::OwnPool => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Self::GivenPool => {
                "BEGIN ISOLATION LEVEL READ COMMITTED; \
                 SELECT set_config('synchronous_commit', 'on', true) \
                 WHERE current_setting('synchronous_commit') IN ('off', 'local', 'remote_write')"
            }
        }
    }
}

/// What the COMMIT of a claim's transaction fails with when an effect ended that
/// transaction (see [`HeldClaim::commit_and_park`]); no quote in it (it is an SQL literal).
pub(super) const ENDED: &str = "payhook: the transaction of this booking was ended by one of \
    its effects (a COMMIT or ROLLBACK of its own, or sqlx begin() on the connection, which \
    is not a savepoint there): nothing is acknowledged, and what the effect wrote after it \
    committed on its own; use SAVEPOINT statements for a part that may fail";

/// How long a connection whose claim ended is kept for the next claim before it goes back
/// to the pool.
const SPARE_FOR: Duration = Duration::from_secs(2);

/// Connections of the pool that callbacks never hold: the store's other work (validations,
/// the outbox, retention) and a service sharing the pool always find them.
const LEFT_FOR_OTHERS: u32 = 2;

/// The claims this instance holds, by claim id, between the claim and the finish or
/// release; and the connections of claims that ended, kept for the next ones.
///
/// sqlx tests a connection given back to its pool with a round trip (a Sync and its
/// ReadyForQuery) before pooling it again. The connection of a claim that ended is rather
/// kept here for at most [`SPARE_FOR`], and the next claim begins on it directly: the
/// round trip that ends a claim (COMMIT or ROLLBACK) also BEGINs the next one's
/// transaction, which holds nothing (no snapshot, no transaction id) until the claim. A
/// spare idle past its time is rolled back and pooled; one the database closed meanwhile
/// (`idle_in_transaction_session_timeout`) is replaced by a pooled connection when used.
/// Such a transaction's start (`xact_start`, by which another instance judges the claim
/// stale) is at most [`SPARE_FOR`] before the claim: well within the margin `stale_after`
/// gives a delivery beyond its handler's timeout. Claims
/// wait for their turn in one queue, first come first served (a fair semaphore of the
/// pool's size less [`LEFT_FOR_OTHERS`]), so that a kept connection never lets a new
/// delivery pass one that waits.
pub(super) struct HeldClaims {
    held: Mutex<HashMap<u64, Slot>>,
    /// The last claim id handed out: a callback's claim id names it in this instance only.
    last: AtomicU64,
    permits: Arc<Semaphore>,
    spare: Mutex<Vec<(HeldClaim, Instant)>>,
    begin: Begin,
}

impl HeldClaims {
    /// Claims on a pool of `pool_size` connections, their transactions begun by `begin`.
    pub(super) fn new(pool_size: u32, begin: Begin) -> Self {
        let permits = pool_size.saturating_sub(LEFT_FOR_OTHERS).max(1);
        Self {
            held: Mutex::default(),
            last: AtomicU64::new(0),
            permits: Arc::new(Semaphore::new(usize::try_from(permits).unwrap_or(1))),
            spare: Mutex::default(),
            begin,
        }
    }

    fn spares(&self) -> std::sync::MutexGuard<'_, Vec<(HeldClaim, Instant)>> {
        self.spare
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection for a new claim judged stale after `stale_after`, once the claims
    /// ahead of it have theirs: the one whose claim ended last, if it ended within
    /// [`SPARE_FOR`] (unless `fresh`), or one of the pool's. Waits at most `timeout` in
    /// all.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when no connection came within `timeout`, or the pool
    /// failed.
    pub(super) async fn connection(
        &self,
        pool: &PgPool,
        stale_after: Duration,
        timeout: Duration,
        fresh: bool,
    ) -> Result<HeldClaim, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let permit = tokio::time::timeout_at(deadline, Arc::clone(&self.permits).acquire_owned())
            .await
            .map_err(|_| {
                StoreError::backend_message(format!(
                    "no PostgreSQL connection for a callback within {timeout:?}: every one \
                     is held by a callback in flight"
                ))
            })?
            .map_err(|_| StoreError::backend_message("the store is closing"))?;
        let spare = if fresh {
            None
        } else {
            let mut spare = self.spares();
            let claim = spare.pop().filter(|(_, since)| since.elapsed() < SPARE_FOR);
            retire(take_idle(&mut spare));
            claim
        };
        let mut claim = match spare {
            Some((claim, _)) => claim,
            None => {
                let conn = tokio::time::timeout_at(deadline, pool.acquire())
                    .await
                    .map_err(|_| {
                        StoreError::backend_message(format!(
                            "no PostgreSQL connection within {timeout:?}"
                        ))
                    })??;
                HeldClaim::new(conn, stale_after, self.begin)
            }
        };
        claim.permit = Some(permit);
        claim.since = Instant::now();
        claim.stale_after = stale_after;
        claim.attempt = 0;
        claim.failing = false;
        claim.status = 0;
        claim.transaction = None;
        claim.spoiled = None;
        Ok(claim)
    }

    /// Keeps the connection of `claim`, whose transaction ended (and the next one is
    /// parked), for the next claim, and gives its place to the claim that waits longest.
    pub(super) fn ended(&self, mut claim: HeldClaim) {
        if claim.open && !claim.parked {
            return;
        }
        let permit = claim.permit.take();
        self.spares().push((claim, Instant::now()));
        drop(permit);
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Slot>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `claim` until it is taken back with the id returned.
    pub(super) fn keep(&self, claim: HeldClaim) -> Claim {
        let id = self.last.fetch_add(1, Ordering::Relaxed) + 1;
        self.held().insert(id, Slot::Here(claim));
        Claim { id }
    }

    /// The claim `id`, no longer kept here; `None` when it was given up — or is lent
    /// ([`Self::lend`]): it is then rolled back once its read is over, as a claim given up.
    pub(super) fn take(&self, id: u64) -> Option<HeldClaim> {
        match self.held().remove(&id)? {
            Slot::Here(claim) => Some(claim),
            Slot::Lent => None,
        }
    }

    /// The claim `id` lent to one read in its transaction, kept here again once the read is
    /// over — or cut off: whoever finishes or releases the claim then finds it.
    pub(super) fn lend(&self, id: u64) -> Lending<'_> {
        let mut held = self.held();
        let Some(slot) = held.get_mut(&id) else {
            return Lending::Gone;
        };
        match std::mem::replace(slot, Slot::Lent) {
            Slot::Here(claim) => Lending::Lent(LentClaim {
                claims: self,
                id,
                claim: Some(claim),
            }),
            Slot::Lent => Lending::Busy,
        }
    }

    /// `claim`, lent as `id`, is back: kept again, unless it was taken meanwhile (then it is
    /// dropped, and its transaction rolled back).
    fn returned(&self, id: u64, claim: HeldClaim) {
        let mut held = self.held();
        if let Some(slot @ Slot::Lent) = held.get_mut(&id) {
            *slot = Slot::Here(claim);
            return;
        }
        drop(held);
        drop(claim);
    }

    /// Gives up the claims held past their time (a delivery that never finished nor
    /// released its claim); their connections close, so their transactions roll back.
    /// Returns how many.
    pub(super) fn give_up_outlived(&self) -> usize {
        let outlived: Vec<HeldClaim> = {
            let mut held = self.held();
            let ids: Vec<u64> = held
                .iter()
                .filter(|(_, slot)| matches!(slot, Slot::Here(claim) if claim.outlived()))
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| match held.remove(id)? {
                    Slot::Here(claim) => Some(claim),
                    Slot::Lent => None,
                })
                .collect()
        };
        // Spares idle past their time go back to the pool.
        let idle = take_idle(&mut self.spares());
        retire(idle);
        outlived.len()
    }
}

/// A claim kept by [`HeldClaims`]: here, or lent to a read in its transaction.
enum Slot {
    Here(HeldClaim),
    Lent,
}

/// What [`HeldClaims::lend`] found.
pub(super) enum Lending<'a> {
    /// The claim, for one read; kept again when dropped.
    Lent(LentClaim<'a>),
    /// Lent to another read now.
    Busy,
    /// Finished, released or given up: nothing is held.
    Gone,
}

/// A claim lent to one read ([`HeldClaims::lend`]): kept again when dropped — once the read
/// is over, and also when it is cut off (the handler's timeout), so that the claim's release
/// still counts the attempt and ends it.
pub(super) struct LentClaim<'a> {
    claims: &'a HeldClaims,
    id: u64,
    claim: Option<HeldClaim>,
}

impl Deref for LentClaim<'_> {
    type Target = HeldClaim;

    fn deref(&self) -> &HeldClaim {
        self.claim
            .as_ref()
            .unwrap_or_else(|| unreachable!("kept until dropped"))
    }
}

impl DerefMut for LentClaim<'_> {
    fn deref_mut(&mut self) -> &mut HeldClaim {
        self.claim
            .as_mut()
            .unwrap_or_else(|| unreachable!("kept until dropped"))
    }
}

impl Drop for LentClaim<'_> {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            self.claims.returned(self.id, claim);
        }
    }
}

/// The spares idle past [`SPARE_FOR`], taken out of `spare`.
fn take_idle(spare: &mut Vec<(HeldClaim, Instant)>) -> Vec<HeldClaim> {
    let (kept, idle): (Vec<_>, Vec<_>) = spare
        .drain(..)
        .partition(|(_, since)| since.elapsed() < SPARE_FOR);
    *spare = kept;
    idle.into_iter().map(|(claim, _)| claim).collect()
}

/// Gives `idle` spares back to the pool, their parked transactions rolled back first (on a
/// task of their own); one that cannot roll back is closed instead.
fn retire(idle: Vec<HeldClaim>) {
    if idle.is_empty() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // dropped: closed
    };
    runtime.spawn(async move {
        for mut claim in idle {
            if claim.parked {
                // Rolled back, it is pooled when dropped; otherwise it is closed.
                let _ = claim.rollback().await;
            }
        }
    });
}
