//! Group commit: one thread applies every pending write in one atomic batch, flushes once,
//! then answers all of them.
//!
//! sled's `flush_async` deadlocks on 0.34 (spacejam/sled#1308) and concurrent `flush()`
//! calls do not coalesce, so flushing once per request caps a server at a few thousand
//! requests per second. Here request tasks hand their writes to the committer and wait; the
//! committer takes everything queued, builds one `sled::Batch` (atomic within the store's
//! tree) — running each callback's effects against the batch so far, so that effects on the
//! same keys see each other — applies it, flushes, and replies. A batch is as large as the
//! writes that arrived during the previous flush: adaptive, with no fixed window.
//!
//! sled's `flush()` ends in `sync_file_range` on Linux, which does not empty the disk's
//! write cache (spacejam/sled#1452); every flush is therefore followed by `fdatasync` of
//! sled's data file, so an acknowledged write survives power loss too. A failed flush makes
//! the store refuse all further work (503) until restarted: a write whose durability is
//! unknown must not be acknowledged later as a duplicate.
//!
//! Being the only writer, the committer also purges expired records, every sweep interval.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    fs::File,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};
use tokio::sync::oneshot;

use super::claims::Claims;
use super::effects::{EffectError, EffectTx, Effects};
use super::keys;
use super::record::{
    CallbackRecord, Fingerprint, RecordedDecision, ValidationRecord, decode, encode,
};
use super::{Claim, StoreError, now_ms};

/// A write waiting for the committer.
pub(crate) enum Job {
    Callback {
        nonce: String,
        claim: Claim,
        status: i32,
        attempts: u32,
        effects: Effects,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Validation {
        nonce: String,
        claim: Claim,
        fingerprint: Fingerprint,
        decision: RecordedDecision,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Purge {
        now_ms: u64,
        reply: std::sync::mpsc::Sender<Result<usize, StoreError>>,
    },
}

/// What the committer thread works with. Created by [`Committer::start`].
pub(crate) struct Context {
    pub(crate) db: sled::Db,
    pub(crate) tree: sled::Tree,
    pub(crate) data_file: File,
    pub(crate) effect_trees: Vec<String>,
    pub(crate) callback_claims: Arc<Claims>,
    pub(crate) validation_claims: Arc<Claims>,
    pub(crate) retention_ms: u64,
    pub(crate) sweep_interval: Duration,
    pub(crate) failed: Arc<AtomicBool>,
}

struct Queue {
    jobs: Vec<Job>,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The committer thread; it finishes the queued work and stops when this is dropped.
pub(crate) struct Committer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(context: Context) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: Vec::new(),
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("payhook-committer".into())
            .spawn(move || run(&thread_shared, &context))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    pub(crate) fn submit(&self, job: Job) {
        let mut queue = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        queue.jobs.push(job);
        self.shared.wake.notify_one();
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        {
            let mut queue = self
                .shared
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.stop = true;
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the committer thread panicked");
        }
    }
}

fn run(shared: &Shared, context: &Context) {
    let mut next_sweep = Instant::now() + context.sweep_interval;
    loop {
        let (jobs, stop) = {
            let mut queue = shared
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while queue.jobs.is_empty() && !queue.stop && Instant::now() < next_sweep {
                let wait = next_sweep.saturating_duration_since(Instant::now());
                queue = shared
                    .wake
                    .wait_timeout(queue, wait)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            (std::mem::take(&mut queue.jobs), queue.stop)
        };
        if !jobs.is_empty() {
            commit(context, jobs);
        }
        if Instant::now() >= next_sweep {
            let now = now_ms();
            if let Err(error) = purge(context, now) {
                tracing::error!(%error, "purging expired records failed");
            }
            context
                .callback_claims
                .prune(now.saturating_sub(context.retention_ms));
            context
                .validation_claims
                .prune(now.saturating_sub(context.retention_ms));
            next_sweep = Instant::now() + context.sweep_interval;
        }
        if stop {
            return;
        }
    }
}

/// Writes of the batch being built: `None` removes the key.
type Overlay = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

fn read(context: &Context, overlay: &Overlay, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
    match overlay.get(key) {
        Some(value) => Ok(value.clone()),
        None => Ok(context.tree.get(key)?.map(|v| v.to_vec())),
    }
}

fn commit(context: &Context, jobs: Vec<Job>) {
    let mut overlay = Overlay::new();
    let mut replies = Vec::new();
    let mut purges = Vec::new();
    let now = now_ms();
    let expires_ms = now.saturating_add(context.retention_ms);
    for job in jobs {
        match job {
            Job::Callback {
                nonce,
                claim,
                status,
                attempts,
                effects,
                reply,
            } => {
                if !context.callback_claims.owns(&nonce, claim) {
                    let _ = reply.send(Err(StoreError::ClaimLost(nonce)));
                    continue;
                }
                match stage_callback(
                    context,
                    &mut overlay,
                    &nonce,
                    status,
                    attempts,
                    &effects,
                    expires_ms,
                ) {
                    Ok(()) => replies.push(reply),
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                }
            }
            Job::Validation {
                nonce,
                claim,
                fingerprint,
                decision,
                reply,
            } => {
                if !context.validation_claims.owns(&nonce, claim) {
                    let _ = reply.send(Err(StoreError::ClaimLost(nonce)));
                    continue;
                }
                let record = ValidationRecord {
                    fingerprint,
                    decision,
                    expires_ms,
                };
                overlay.insert(keys::validation(&nonce), Some(encode(&record)));
                overlay.insert(
                    keys::expiry(expires_ms, keys::TAG_VALIDATION, &nonce),
                    Some(Vec::new()),
                );
                replies.push(reply);
            }
            Job::Purge { now_ms, reply } => purges.push((now_ms, reply)),
        }
    }
    let outcome = if replies.is_empty() {
        Ok(())
    } else {
        apply_durably(context, overlay)
    };
    if let Err(error) = &outcome {
        tracing::error!(%error, "committing a batch failed; the store refuses further work until restarted");
        context.failed.store(true, Ordering::SeqCst);
    }
    for reply in replies {
        let _ = reply.send(outcome.clone());
    }
    for (now, reply) in purges {
        let _ = reply.send(purge(context, now));
    }
}

/// Adds one acknowledged callback to the batch: its effects, its record, its expiry entry.
fn stage_callback(
    context: &Context,
    overlay: &mut Overlay,
    nonce: &str,
    status: i32,
    attempts: u32,
    effects: &Effects,
    expires_ms: u64,
) -> Result<(), StoreError> {
    let key = keys::callback(nonce);
    let mut record = match read(context, overlay, &key)? {
        Some(bytes) => decode::<CallbackRecord>(nonce, &bytes)?,
        None => CallbackRecord::default(),
    };
    let tx = OverlayTx {
        context,
        batch: overlay,
        local: RefCell::default(),
        failure: RefCell::default(),
    };
    if let Err(error) = effects.apply(&tx) {
        return Err(tx
            .failure
            .into_inner()
            .unwrap_or(StoreError::Effects(error)));
    }
    let local = tx.local.into_inner();
    overlay.extend(local);
    if !record.done.contains(&status) {
        record.done.push(status);
    }
    record.attempts = record.attempts.max(attempts);
    record.expires_ms = expires_ms;
    overlay.insert(key, Some(encode(&record)));
    overlay.insert(
        keys::expiry(expires_ms, keys::TAG_CALLBACK, nonce),
        Some(Vec::new()),
    );
    Ok(())
}

fn apply_durably(context: &Context, overlay: Overlay) -> Result<(), StoreError> {
    let mut batch = sled::Batch::default();
    for (key, value) in overlay {
        match value {
            Some(value) => batch.insert(key, value),
            None => batch.remove(key),
        }
    }
    context.tree.apply_batch(batch)?;
    context.db.flush()?;
    context
        .data_file
        .sync_data()
        .map_err(|e| StoreError::Backend(format!("fdatasync: {e}")))
}

/// Removes records whose expiry passed, through the expiry index.
fn purge(context: &Context, now_ms: u64) -> Result<usize, StoreError> {
    let mut batch = sled::Batch::default();
    let mut purged = 0;
    for entry in context
        .tree
        .range(keys::EXPIRY_PREFIX.to_vec()..keys::expiry_upper(now_ms))
    {
        let (key, _) = entry?;
        batch.remove(key.clone());
        let Some((tag, nonce)) = keys::parse_expiry(&key) else {
            continue;
        };
        let record_key = if tag == keys::TAG_CALLBACK {
            keys::callback(&nonce)
        } else {
            keys::validation(&nonce)
        };
        let Some(bytes) = context.tree.get(&record_key)? else {
            continue;
        };
        // A later write moved the record's expiry (and indexed it again): keep it.
        let expires = if tag == keys::TAG_CALLBACK {
            decode::<CallbackRecord>(&nonce, &bytes)?.expires_ms
        } else {
            decode::<ValidationRecord>(&nonce, &bytes)?.expires_ms
        };
        if expires <= now_ms {
            batch.remove(record_key);
            purged += 1;
        }
    }
    context.tree.apply_batch(batch)?;
    if purged > 0 {
        tracing::debug!(purged, "expired records purged");
    }
    Ok(purged)
}

/// [`EffectTx`] over the batch being built: reads see earlier writes of this batch and of
/// this callback; writes go to `local` and join the batch only if every effect succeeds.
struct OverlayTx<'a> {
    context: &'a Context,
    batch: &'a Overlay,
    local: RefCell<Overlay>,
    failure: RefCell<Option<StoreError>>,
}

impl OverlayTx<'_> {
    fn key(&self, tree: &str, key: &[u8]) -> Result<Vec<u8>, EffectError> {
        if self.context.effect_trees.iter().any(|t| t == tree) {
            Ok(keys::merchant(tree, key))
        } else {
            Err(EffectError::UnknownTree(tree.to_owned()))
        }
    }
}

impl EffectTx for OverlayTx<'_> {
    fn get(&self, tree: &str, key: &[u8]) -> Result<Option<Vec<u8>>, EffectError> {
        let key = self.key(tree, key)?;
        if let Some(value) = self.local.borrow().get(&key) {
            return Ok(value.clone());
        }
        read(self.context, self.batch, &key).map_err(|error| {
            let message = error.to_string();
            *self.failure.borrow_mut() = Some(error);
            EffectError::Backend(message)
        })
    }

    fn insert(&self, tree: &str, key: &[u8], value: &[u8]) -> Result<(), EffectError> {
        let key = self.key(tree, key)?;
        self.local.borrow_mut().insert(key, Some(value.to_vec()));
        Ok(())
    }

    fn remove(&self, tree: &str, key: &[u8]) -> Result<(), EffectError> {
        let key = self.key(tree, key)?;
        self.local.borrow_mut().insert(key, None);
        Ok(())
    }
}
