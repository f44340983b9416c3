//! The embedded default [`Store`]: sled 0.34.

use sled::transaction::{
    ConflictableTransactionError, TransactionError, TransactionalTree, UnabortableTransactionError,
};
use sled::{Transactional, Tree};
use std::{
    cell::RefCell,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use super::effects::{EffectError, EffectTx, Effects};
use super::flusher::GroupCommit;
use super::record::{
    CallbackRecord, Fingerprint, InFlight, RecordedDecision, ValidationRecord, decode, encode,
};
use super::{CallbackBegin, Claim, DurableFuture, Store, StoreError, ValidationBegin, now_ms};
use crate::config::StoreConfig;
use crate::model::TransactionStatus;

const CALLBACKS: &str = "payhook.callbacks";
const VALIDATIONS: &str = "payhook.validations";
const EXPIRY: &str = "payhook.expiry";
/// Expiry index tags: which tree a nonce belongs to.
const TAG_CALLBACK: u8 = b'c';
const TAG_VALIDATION: u8 = b'v';

/// The sled store. Cheap to clone: clones share the database and its threads.
///
/// ```no_run
/// use payhook::config::StoreConfig;
/// use payhook::store::SledStore;
///
/// let store = SledStore::open(&StoreConfig::default(), &["ledger_entries", "ledger_balances"])?;
/// let balances = store.tree("ledger_balances")?;
/// # let _ = balances;
/// # Ok::<(), payhook::store::StoreError>(())
/// ```
#[derive(Clone)]
pub struct SledStore {
    inner: Arc<Inner>,
}

/// Opened once by [`SledStore::open`]; dropping the last clone stops the flusher (after a
/// final flush) and the sweeper.
struct Inner {
    db: sled::Db,
    callbacks: Tree,
    validations: Tree,
    expiry: Tree,
    /// `[callbacks, expiry, effect trees...]`: the trees of a callback's finishing write.
    finish_trees: Vec<Tree>,
    effect_names: Vec<String>,
    /// This process's identity in claims: a claim of another epoch was left by a crash.
    epoch: u64,
    next_claim: AtomicU64,
    retention_ms: u64,
    commit: GroupCommit,
    sweeper: Sweeper,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("epoch", &self.inner.epoch)
            .field("trees", &self.inner.effect_names)
            .finish()
    }
}

impl SledStore {
    /// Opens (or creates) the store at `config.path`, declaring the merchant's own `trees`
    /// that callback effects may write.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the directory cannot be opened (e.g. another process
    /// holds it).
    pub fn open(config: &StoreConfig, trees: &[&str]) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(&config.path)
            .flush_every_ms(Some(
                u64::try_from(config.flush_every.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            ))
            .open()?;
        let callbacks = db.open_tree(CALLBACKS)?;
        let validations = db.open_tree(VALIDATIONS)?;
        let expiry = db.open_tree(EXPIRY)?;
        let mut finish_trees = vec![callbacks.clone(), expiry.clone()];
        for name in trees {
            finish_trees.push(db.open_tree(name)?);
        }
        let commit = GroupCommit::start(db.clone(), &config.path.join("db"))
            .map_err(|e| StoreError::Backend(format!("cannot start the flusher: {e}")))?;
        let retention_ms = u64::try_from(config.retention.as_millis()).unwrap_or(u64::MAX);
        let sweeper = Sweeper::start(
            Purger {
                callbacks: callbacks.clone(),
                validations: validations.clone(),
                expiry: expiry.clone(),
            },
            config.sweep_interval,
        )?;
        let epoch = uuid::Uuid::new_v4().as_u64_pair().0;
        tracing::info!(path = %config.path.display(), epoch, "store opened");
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                callbacks,
                validations,
                expiry,
                finish_trees,
                effect_names: trees.iter().map(|t| (*t).to_owned()).collect(),
                epoch,
                next_claim: AtomicU64::new(1),
                retention_ms,
                commit,
                sweeper,
            }),
        })
    }

    /// One of the trees declared at [`SledStore::open`], to read (or write outside a
    /// callback) the merchant's own records.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the tree was not declared.
    pub fn tree(&self, name: &str) -> Result<Tree, StoreError> {
        let index = self.inner.effect_names.iter().position(|n| n == name);
        index
            .map(|i| self.inner.finish_trees[i + 2].clone())
            .ok_or_else(|| StoreError::Backend(format!("tree `{name}` was not declared at open")))
    }

    /// Number of callback and validation records held (for monitoring and tests).
    pub fn record_count(&self) -> usize {
        self.inner.callbacks.len() + self.inner.validations.len()
    }

    /// The sled database itself.
    pub fn db(&self) -> &sled::Db {
        &self.inner.db
    }

    fn claim(&self) -> Claim {
        Claim {
            epoch: self.inner.epoch,
            id: self.inner.next_claim.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn in_flight(&self, claim: Claim, now: u64) -> InFlight {
        InFlight {
            since_ms: now,
            epoch: claim.epoch,
            claim: claim.id,
        }
    }

    fn expires(&self, now: u64) -> u64 {
        now.saturating_add(self.inner.retention_ms)
    }

    fn index(&self, tag: u8, nonce: &str, expires_ms: u64) -> Result<(), StoreError> {
        self.inner
            .expiry
            .insert(index_key(tag, nonce, expires_ms), &[])?;
        Ok(())
    }
}

fn index_key(tag: u8, nonce: &str, expires_ms: u64) -> Vec<u8> {
    let mut key = expires_ms.to_be_bytes().to_vec();
    key.push(tag);
    key.extend_from_slice(nonce.as_bytes());
    key
}

/// Compare-and-swap of one record: `update` computes the new value (or `None` to leave it)
/// and an outcome from the current one; the swap is retried until it wins.
fn swap<R, T>(
    tree: &Tree,
    nonce: &str,
    mut update: impl FnMut(Option<R>) -> Result<(Option<R>, T), StoreError>,
) -> Result<T, StoreError>
where
    R: serde::Serialize + for<'de> serde::Deserialize<'de>,
{
    loop {
        let current = tree.get(nonce)?;
        let record = current
            .as_deref()
            .map(|bytes| decode::<R>(nonce, bytes))
            .transpose()?;
        let (new, outcome) = update(record)?;
        let Some(new) = new else { return Ok(outcome) };
        if tree
            .compare_and_swap(nonce, current, Some(encode(&new)))?
            .is_ok()
        {
            return Ok(outcome);
        }
    }
}

impl Store for SledStore {
    fn begin_callback(
        &self,
        nonce: &str,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> Result<CallbackBegin, StoreError> {
        let now = now_ms();
        let stale_ms = u64::try_from(stale_after.as_millis()).unwrap_or(u64::MAX);
        let claim = self.claim();
        let expires_ms = self.expires(now);
        let begin = swap(
            &self.inner.callbacks,
            nonce,
            |record: Option<CallbackRecord>| {
                let mut record = record.unwrap_or(CallbackRecord {
                    in_flight: None,
                    in_flight_status: None,
                    done: Vec::new(),
                    attempts: 0,
                    expires_ms,
                });
                if let Some(flight) = &record.in_flight {
                    if !flight.is_stale(self.inner.epoch, now, stale_ms) {
                        return Ok((None, CallbackBegin::Busy));
                    }
                    tracing::warn!(
                        nonce,
                        "taking over a claim abandoned by a crash or a stuck delivery"
                    );
                }
                if record.done.contains(&status.code()) {
                    return Ok((None, CallbackBegin::Duplicate));
                }
                record.attempts = record.attempts.saturating_add(1);
                record.in_flight = Some(self.in_flight(claim, now));
                record.in_flight_status = Some(status.code());
                record.expires_ms = expires_ms;
                let begin = CallbackBegin::Claimed {
                    claim,
                    attempt: record.attempts,
                    previous_status: record
                        .done
                        .last()
                        .map(|code| TransactionStatus::from_code(*code)),
                };
                Ok((Some(record), begin))
            },
        )?;
        if matches!(begin, CallbackBegin::Claimed { .. }) {
            self.index(TAG_CALLBACK, nonce, expires_ms)?;
        }
        Ok(begin)
    }

    fn finish_callback(
        &self,
        nonce: &str,
        claim: Claim,
        status: TransactionStatus,
        effects: &Effects,
    ) -> Result<(), StoreError> {
        let expires_ms = self.expires(now_ms());
        let names = &self.inner.effect_names;
        let result = self.inner.finish_trees[..].transaction(|views: &Vec<TransactionalTree>| {
            let bytes = views[0]
                .get(nonce)?
                .ok_or_else(|| abort(StoreError::ClaimLost(nonce.to_owned())))?;
            let mut record: CallbackRecord = decode(nonce, &bytes).map_err(abort)?;
            if !record.in_flight.as_ref().is_some_and(|f| f.owned_by(claim)) {
                return Err(abort(StoreError::ClaimLost(nonce.to_owned())));
            }
            record.in_flight = None;
            record.in_flight_status = None;
            if !record.done.contains(&status.code()) {
                record.done.push(status.code());
            }
            record.expires_ms = expires_ms;
            views[0].insert(nonce.as_bytes(), encode(&record))?;
            views[1].insert(index_key(TAG_CALLBACK, nonce, expires_ms), &[][..])?;
            let tx = SledEffectTx {
                names,
                views: &views[2..],
                failure: RefCell::new(None),
            };
            match effects.apply(&tx) {
                Ok(()) => Ok(()),
                Err(error) => match tx.failure.into_inner() {
                    Some(sled_error) => Err(sled_error.into()),
                    None => Err(abort(StoreError::Effects(error))),
                },
            }
        });
        result.map_err(|error| match error {
            TransactionError::Abort(error) => error,
            TransactionError::Storage(error) => error.into(),
        })
    }

    fn release_callback(&self, nonce: &str, claim: Claim) -> Result<(), StoreError> {
        swap(
            &self.inner.callbacks,
            nonce,
            |record: Option<CallbackRecord>| {
                Ok(match record {
                    Some(mut record)
                        if record.in_flight.as_ref().is_some_and(|f| f.owned_by(claim)) =>
                    {
                        record.in_flight = None;
                        record.in_flight_status = None;
                        (Some(record), ())
                    }
                    _ => (None, ()),
                })
            },
        )
    }

    fn begin_validation(
        &self,
        nonce: &str,
        fingerprint: &Fingerprint,
        stale_after: Duration,
    ) -> Result<ValidationBegin, StoreError> {
        let now = now_ms();
        let stale_ms = u64::try_from(stale_after.as_millis()).unwrap_or(u64::MAX);
        let claim = self.claim();
        let expires_ms = self.expires(now);
        let begin = swap(
            &self.inner.validations,
            nonce,
            |record: Option<ValidationRecord>| {
                let Some(mut record) = record else {
                    let record = ValidationRecord {
                        fingerprint: fingerprint.clone(),
                        in_flight: Some(self.in_flight(claim, now)),
                        decision: None,
                        expires_ms,
                    };
                    return Ok((Some(record), ValidationBegin::Claimed { claim }));
                };
                if &record.fingerprint != fingerprint {
                    return Ok((None, ValidationBegin::Mismatch));
                }
                if let Some(decision) = &record.decision {
                    return Ok((None, ValidationBegin::Recorded(decision.clone())));
                }
                if record
                    .in_flight
                    .as_ref()
                    .is_some_and(|f| !f.is_stale(self.inner.epoch, now, stale_ms))
                {
                    return Ok((None, ValidationBegin::Busy));
                }
                record.in_flight = Some(self.in_flight(claim, now));
                record.expires_ms = expires_ms;
                Ok((Some(record), ValidationBegin::Claimed { claim }))
            },
        )?;
        if matches!(begin, ValidationBegin::Claimed { .. }) {
            self.index(TAG_VALIDATION, nonce, expires_ms)?;
        }
        Ok(begin)
    }

    fn finish_validation(
        &self,
        nonce: &str,
        claim: Claim,
        decision: &RecordedDecision,
    ) -> Result<(), StoreError> {
        swap(
            &self.inner.validations,
            nonce,
            |record: Option<ValidationRecord>| match record {
                Some(mut record)
                    if record.in_flight.as_ref().is_some_and(|f| f.owned_by(claim)) =>
                {
                    record.in_flight = None;
                    record.decision = Some(decision.clone());
                    Ok((Some(record), ()))
                }
                _ => Err(StoreError::ClaimLost(nonce.to_owned())),
            },
        )
    }

    fn release_validation(&self, nonce: &str, claim: Claim) -> Result<(), StoreError> {
        swap(
            &self.inner.validations,
            nonce,
            |record: Option<ValidationRecord>| {
                Ok(match record {
                    Some(mut record)
                        if record.in_flight.as_ref().is_some_and(|f| f.owned_by(claim)) =>
                    {
                        record.in_flight = None;
                        (Some(record), ())
                    }
                    _ => (None, ()),
                })
            },
        )
    }

    fn durable(&self) -> DurableFuture<'_> {
        Box::pin(self.inner.commit.durable())
    }

    fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.inner.sweeper.purger.purge(now_ms)
    }
}

fn abort(error: StoreError) -> ConflictableTransactionError<StoreError> {
    ConflictableTransactionError::Abort(error)
}

/// [`EffectTx`] over the effect trees of a sled transaction. A sled error is kept aside so
/// that a conflict still makes sled retry the transaction.
struct SledEffectTx<'a> {
    names: &'a [String],
    views: &'a [TransactionalTree],
    failure: RefCell<Option<UnabortableTransactionError>>,
}

impl SledEffectTx<'_> {
    fn view(&self, tree: &str) -> Result<&TransactionalTree, EffectError> {
        self.names
            .iter()
            .position(|name| name == tree)
            .map(|i| &self.views[i])
            .ok_or_else(|| EffectError::UnknownTree(tree.to_owned()))
    }

    fn keep<T>(&self, result: Result<T, UnabortableTransactionError>) -> Result<T, EffectError> {
        result.map_err(|error| {
            let message = error.to_string();
            *self.failure.borrow_mut() = Some(error);
            EffectError::Backend(message)
        })
    }
}

impl EffectTx for SledEffectTx<'_> {
    fn get(&self, tree: &str, key: &[u8]) -> Result<Option<Vec<u8>>, EffectError> {
        let value = self.keep(self.view(tree)?.get(key))?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn insert(&self, tree: &str, key: &[u8], value: &[u8]) -> Result<(), EffectError> {
        self.keep(self.view(tree)?.insert(key, value)).map(|_| ())
    }

    fn remove(&self, tree: &str, key: &[u8]) -> Result<(), EffectError> {
        self.keep(self.view(tree)?.remove(key)).map(|_| ())
    }
}

/// Removes expired records through the expiry index.
#[derive(Clone)]
struct Purger {
    callbacks: Tree,
    validations: Tree,
    expiry: Tree,
}

impl Purger {
    fn purge(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut purged = 0;
        let upper = now_ms.saturating_add(1).to_be_bytes();
        for entry in self.expiry.range(..upper.as_slice()) {
            let (key, _) = entry?;
            if key.len() < 9 {
                self.expiry.remove(&key)?;
                continue;
            }
            let nonce = String::from_utf8_lossy(&key[9..]).into_owned();
            let tree = if key[8] == TAG_CALLBACK {
                &self.callbacks
            } else {
                &self.validations
            };
            if let Some(current) = tree.get(&nonce)? {
                // Only a record whose own expiry has passed goes: a later write re-indexed it.
                if record_expiry(key[8], &nonce, &current)?.is_none_or(|expires| expires <= now_ms)
                    && tree
                        .compare_and_swap(&nonce, Some(current), None::<&[u8]>)?
                        .is_ok()
                {
                    purged += 1;
                }
            }
            self.expiry.remove(&key)?;
        }
        if purged > 0 {
            tracing::debug!(purged, "expired records purged");
        }
        Ok(purged)
    }
}

fn record_expiry(tag: u8, nonce: &str, bytes: &[u8]) -> Result<Option<u64>, StoreError> {
    Ok(Some(if tag == TAG_CALLBACK {
        decode::<CallbackRecord>(nonce, bytes)?.expires_ms
    } else {
        decode::<ValidationRecord>(nonce, bytes)?.expires_ms
    }))
}

/// The background sweeper thread: purges every `interval`, stops when dropped.
struct Sweeper {
    purger: Purger,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Sweeper {
    fn start(purger: Purger, interval: Duration) -> Result<Self, StoreError> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let (thread_purger, thread_stop) = (purger.clone(), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("payhook-sweeper".into())
            .spawn(move || {
                let (lock, cond) = &*thread_stop;
                let mut stopped = lock
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                while !*stopped {
                    let (guard, _) = cond
                        .wait_timeout(stopped, interval)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    stopped = guard;
                    if !*stopped && let Err(error) = thread_purger.purge(now_ms()) {
                        tracing::error!(%error, "purging expired records failed");
                    }
                }
            })
            .map_err(|e| StoreError::Backend(format!("cannot start the sweeper: {e}")))?;
        Ok(Self {
            purger,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        let (lock, cond) = &*self.stop;
        *lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        cond.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
