//! The embedded default [`Store`]: sled 0.34, one tree, group commit by a leader (see
//! `committer.rs`).

use crate::model::{Nonce, ValidationId};
use chrono::{DateTime, Utc};
use std::{
    ops::Bound,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::sync::oneshot;

use super::StoreConfig;
use super::claims::Claims;
pub use super::committer::HoldPoint;
use super::committer::{BenchFile, Context, Destination, Gate, HoldState, Job, Sweeper, Writer};
use super::effects::{Effects, Tree, check_declared};
use super::failing::{CallbackFailure, FailingCallback, FailureRecord};
use super::held::{HeldCallback, Resolving};
use super::horizon::Opener;
use super::keys;
use super::postponed_records::PostponedOp;
use super::record::{
    CallbackRecord, Fingerprint, RecordedDecision, ValidationRecord, decode, decode_named,
};
use super::watermark::{IntegrityError, IntegrityReport, Watermark};
use super::{
    CallbackBegin, Claim, DedupStore, Due, DurableFuture, FailingCursor, FailingPage,
    PostponedStore, ResolveFuture, Store, StoreError, StoreFuture, ValidatedPayment,
    ValidationBegin, ms_from_time, now_ms, ready, time_from_ms,
};
use crate::model::{TransactionStatus, TransactionValidationRequest};
use crate::postponed::record::{
    Decision, Delivery, PostponedPage, PostponedState, PostponedValidation, Repeat,
};

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// The tree that holds everything payhook writes.
const TREE: &str = "payhook";

/// **For benchmarks only.** What the store of [`SledStore::open_for_benchmarks`] does with
/// each committed batch instead of writing it to sled. Neither keeps an acknowledged write.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchmarkStore {
    /// Nothing: the batch is built in full (claims checked, effects run, records encoded) and
    /// written nowhere — not to sled, no flush, no fdatasync, no watermark. `bench_callbacks`'
    /// scenario E measures payhook's own cost of the durable path with it, apart from sled's
    /// and the disk's.
    WritesNowhere,
    /// The batch is appended to a file of its own (`appended.bench` in `config.path`: 64 MiB
    /// of zeros, written in place, from its start again when full) and `fdatasync`ed before
    /// anyone is answered; nothing goes to sled, and no watermark. Scenario F measures with it
    /// the floor of any store that makes each batch durable with one sync before it answers,
    /// whatever its engine: B's path on an engine that costs nothing.
    AppendsOnly,
}

/// The sled store. Cheap to clone: clones share the database and its writer.
///
/// ```no_run
/// use payhook::config::StoreConfig;
/// use payhook::store::SledStore;
///
/// let store = SledStore::open(&StoreConfig::default(), &["ledger_entries", "ledger_balances"])?;
/// let balances = store.tree("ledger_balances")?;
/// let balance = store.get(&balances, b"client-42|EUR")?;
/// # let _ = balance;
/// # Ok::<(), payhook::store::StoreError>(())
/// ```
#[derive(Clone)]
pub struct SledStore {
    inner: Arc<Inner>,
}

/// Opened once by [`SledStore::open`]; dropping the last clone stops the sweeper.
struct Inner {
    tree: sled::Tree,
    effect_trees: Vec<String>,
    callback_claims: Arc<Claims>,
    validation_claims: Arc<Claims>,
    /// Set when a batch could not be made durable: all further work is refused.
    failed: Arc<AtomicBool>,
    retention: Duration,
    /// What the records reach back to (see [`super::horizon`]), as kept at open.
    vouched: super::horizon::Vouched,
    writer: Arc<Writer>,
    commit_metrics: super::CommitMetrics,
    /// The failing pairs held, for `/metrics`.
    failing: Arc<super::failing::Count>,
    /// The held results kept, for `/metrics`.
    held: Arc<super::failing::Count>,
    /// Postponed validations whose record cannot be decoded, each left out of what is due
    /// until the time (ms) it holds ([`super::UNREADABLE_LEFT_FOR`] after it was met): kept
    /// in memory, where PostgreSQL moves the record's time on, since a fix needs the store
    /// stopped anyway (one process holds it) and a restart reads it again.
    left_out: Mutex<std::collections::HashMap<ValidationId, u64>>,
    _sweeper: Sweeper,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("trees", &self.inner.effect_trees)
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (or creates) the store at `config.path`, declaring the merchant's own `trees`
    /// that callback effects may write.
    ///
    /// Before it serves, the store proves that it still holds every commit it acknowledged
    /// (see [`IntegrityError`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::Integrity`] when the store lost acknowledged writes (a damaged or
    /// replaced data file, a missing watermark); [`StoreError::Backend`] when the directory
    /// cannot be opened (e.g. another process holds it) or a tree name contains a NUL byte;
    /// [`StoreError::Unsupported`] when `config.url` names a PostgreSQL database: a service
    /// configured for one must not go on alone on a directory of its own, each instance
    /// booking what the others booked (open [`super::ConfiguredStore`], which opens what
    /// the configuration names); [`StoreError::Unsupported`] too when the store was copied
    /// into PostgreSQL (`payhook store copy-from-sled` marks its directory): its callbacks
    /// are booked there since, and a sled instance would book their retries again.
    pub fn open(config: &StoreConfig, trees: &[&str]) -> Result<Self, StoreError> {
        Self::open_as(config, trees, Opener::Service)
    }

    /// [`SledStore::open`] for an operator's command on a stopped store, which reads the
    /// store's record of its retention and does not move it (see `horizon`).
    pub(crate) fn open_for_operator(
        config: &StoreConfig,
        trees: &[&str],
    ) -> Result<Self, StoreError> {
        Self::open_as(config, trees, Opener::Operator)
    }

    fn open_as(config: &StoreConfig, trees: &[&str], opener: Opener) -> Result<Self, StoreError> {
        if config.is_postgres() {
            return Err(StoreError::Unsupported(
                "store.url names PostgreSQL, and SledStore opens store.path only: open the store \
                 with `ConfiguredStore::open(&config.store, &trees).await` (PostgreSQL when \
                 store.url is set, sled otherwise) and give `store.shared()` to \
                 AppBuilder::shared_store"
                    .into(),
            ));
        }
        refuse_if_moved(config)?;
        Self::open_with(config, trees, (Destination::Sled, opener))
    }

    /// What the store at `config.path` says of its move to PostgreSQL: [`MOVED_FILE_NAME`]'s
    /// first clause (`being copied into PostgreSQL schema … since …`, or, once the copy
    /// finished, `copied into PostgreSQL schema … on …`); `None` when it was not moved.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the file is there but cannot be read.
    pub fn moved(config: &StoreConfig) -> Result<Option<String>, StoreError> {
        let path = config.path.join(MOVED_FILE_NAME);
        match std::fs::read_to_string(&path) {
            Ok(said) => Ok(Some(
                said.trim_end()
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            )),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(StoreError::backend(
                format!("cannot read {}", path.display()),
                error,
            )),
        }
    }

    /// Marks the store at `config.path` as being copied (`done`: as copied) into PostgreSQL
    /// schema `schema`, a file [`MOVED_FILE_NAME`] in its directory saying where and when:
    /// [`SledStore::open`] refuses it from then on. The copy marks it while it holds the
    /// store (sled's lock), before it reads a record and once it has written the last, so
    /// that no sled instance opens the store between the copy and its mark. A copy run again
    /// reads it as before.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the file cannot be written and made durable.
    #[cfg(feature = "postgres")]
    pub(crate) fn mark_moved(
        config: &StoreConfig,
        schema: &str,
        done: bool,
    ) -> Result<(), StoreError> {
        use std::io::Write as _;
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let said = if done {
            format!(
                "{COPIED_INTO} PostgreSQL schema {schema} on {now} by payhook store \
                 copy-from-sled; the service books its callbacks there since\n"
            )
        } else {
            format!(
                "being copied into PostgreSQL schema {schema} since {now} by payhook store \
                 copy-from-sled; run the copy again until it finishes\n"
            )
        };
        let path = config.path.join(MOVED_FILE_NAME);
        std::fs::File::create(&path)
            .and_then(|mut file| {
                file.write_all(said.as_bytes())?;
                file.sync_all()
            })
            .and_then(|()| std::fs::File::open(&config.path)?.sync_all())
            .map_err(|e| {
                let stage = if done {
                    "the copy is complete, but"
                } else {
                    "nothing is copied yet:"
                };
                StoreError::backend(
                    format!(
                        "{stage} {} cannot be written to mark the sled store as moved (a sled \
                         instance started on it would book again what PostgreSQL books); make \
                         the directory writable and run the copy again (it writes nothing twice)",
                        path.display()
                    ),
                    e,
                )
            })
    }

    /// **For benchmarks only — it keeps no acknowledged write.** The store with its whole
    /// request path (claims, effects, group commit, waits) whose commits do what `kind` says
    /// with each batch instead of writing it to sled (see [`BenchmarkStore`]).
    #[doc(hidden)]
    pub fn open_for_benchmarks(
        config: &StoreConfig,
        trees: &[&str],
        kind: BenchmarkStore,
    ) -> Result<Self, StoreError> {
        tracing::warn!(
            ?kind,
            "store opened WITHOUT durability: for benchmarks only"
        );
        let destination = match kind {
            BenchmarkStore::WritesNowhere => Destination::Nowhere,
            BenchmarkStore::AppendsOnly => {
                let file = std::fs::create_dir_all(&config.path)
                    .and_then(|()| BenchFile::create(&config.path.join("appended.bench")))
                    .map_err(|e| StoreError::backend("cannot create the benchmark's file", e))?;
                Destination::Appended(Mutex::new(file))
            }
        };
        Self::open_with(config, trees, (destination, Opener::Service))
    }

    fn open_with(
        config: &StoreConfig,
        trees: &[&str],
        (destination, opener): (Destination, Opener),
    ) -> Result<Self, StoreError> {
        super::effects::check_tree_names(trees)?;
        let (db, tree) = open_sled(config, false)?;
        let watermark = Watermark::open(&config.path, &db, &tree)?;
        let vouched = vouched_at_open(&tree, config.retention, opener)?;
        let retention = super::horizon::writes_with(&vouched, config.retention, opener);
        let data_file = std::fs::File::open(config.path.join("db"))
            .map_err(|e| StoreError::backend("cannot open sled's data file", e))?;
        let callback_claims = Arc::new(Claims::default());
        let validation_claims = Arc::new(Claims::default());
        let failed = Arc::new(AtomicBool::new(false));
        let effect_trees: Vec<String> = trees.iter().map(|t| (*t).to_owned()).collect();
        let commit_metrics = super::CommitMetrics::default();
        let counted = super::failing::count_at_open(&tree)?;
        let failing = Arc::new(super::failing::Count::new(counted.pairs));
        let may_hold_failures = counted.records > 0;
        let held = Arc::new(super::failing::Count::new(super::held::count(&tree)?));
        let writer = Arc::new(Writer::new(Context {
            db,
            tree: tree.clone(),
            data_file,
            effect_trees: effect_trees.clone(),
            callback_claims: Arc::clone(&callback_claims),
            validation_claims: Arc::clone(&validation_claims),
            retention_ms: u64::try_from(retention.as_millis()).unwrap_or(u64::MAX),
            failed: Arc::clone(&failed),
            watermark,
            blobs: super::blobs::Blobs::open(&config.path)?,
            gate: Gate::default(),
            destination,
            metrics: commit_metrics.clone(),
            may_hold_failures: AtomicBool::new(may_hold_failures),
            failing: Arc::clone(&failing),
            held: Arc::clone(&held),
            clock_watch: super::clock_watch::ClockWatch::default(),
        }));
        let sweeper = Sweeper::start(Arc::clone(&writer), config.sweep_interval)
            .map_err(|e| StoreError::backend("cannot start the sweeper", e))?;
        tracing::info!(path = %config.path.display(), "store opened");
        Ok(Self {
            inner: Arc::new(Inner {
                tree,
                effect_trees,
                callback_claims,
                validation_claims,
                failed,
                retention,
                vouched,
                writer,
                commit_metrics,
                failing,
                held,
                left_out: Mutex::default(),
                _sweeper: sweeper,
            }),
        })
    }

    /// Checks, without serving, that the store at `config.path` still holds every commit it
    /// acknowledged (`payhook store check`). Opening sled runs its recovery, but nothing of
    /// payhook's is written.
    ///
    /// # Errors
    ///
    /// [`StoreError::Integrity`] with what was lost; [`StoreError::Backend`] when there is
    /// no store there or it is in use.
    pub fn check(config: &StoreConfig) -> Result<IntegrityReport, StoreError> {
        require_existing(config)?;
        let (_db, tree) = open_sled(config, false)?;
        Watermark::check(&config.path, &tree)
    }

    /// Every `(key, value)` of payhook's tree in the stopped store at `config.path`, for a
    /// copy into another backend, with what its records reach back to (see
    /// [`super::horizon`]); refused when the store lost acknowledged commits (see
    /// [`SledStore::check`]): a copy must not carry a loss on unnoticed.
    #[cfg(feature = "postgres")]
    pub(crate) fn export(
        config: &StoreConfig,
    ) -> Result<
        (
            super::horizon::Vouched,
            impl Iterator<Item = Result<KeyValue, StoreError>>,
        ),
        StoreError,
    > {
        Self::check(config)?;
        let (_db, tree) = open_sled(config, false)?;
        // Without one, what its records reach back to would be taken from the copy's
        // `store.retention`: longer than the retention they were written with, the database
        // would vouch for records sled purged.
        if tree.get(keys::VOUCHED)?.is_none()
            && tree.scan_prefix(keys::EXPIRY_PREFIX).next().is_some()
        {
            return Err(StoreError::backend_message(format!(
                "the sled store at {} keeps no record of the retention its records were written \
                 with (an earlier payhook wrote them): start its service once with this payhook \
                 and its own store.retention, stop it, and copy again",
                config.path.display()
            )));
        }
        // As an operator's command reads it: a record not moved on.
        let vouched = vouched_at_open(&tree, config.retention, Opener::Operator)?;
        let records = tree.iter().map(|entry| {
            let (key, value) = entry?;
            Ok((key.to_vec(), value.to_vec()))
        });
        Ok((vouched, records))
    }

    /// The operator's decision to serve on what the store at `config.path` holds, after it
    /// lost acknowledged writes (`payhook store accept-loss`): the watermark moves down to
    /// the last commit sled holds, the decision is logged at error level and appended to
    /// `payhook.audit.log` in the directory. Returns what was given up (`None`: the store was
    /// sound and nothing changed).
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when there is no store there, it is in use, or the watermark
    /// cannot be written.
    pub fn accept_loss(config: &StoreConfig) -> Result<Option<IntegrityError>, StoreError> {
        require_existing(config)?;
        let (db, tree) = open_sled(config, true)?;
        Watermark::accept_loss(&config.path, &db, &tree)
    }

    /// Test-only: the next commits wait at `point` until the returned hold is released or
    /// dropped. For tests that need a flush to stall.
    #[doc(hidden)]
    pub fn hold_commits(&self, point: HoldPoint) -> CommitHold {
        CommitHold {
            state: self.inner.writer.gate().arm(point),
            store: self.clone(),
        }
    }

    /// The handle of one of the merchant's trees declared at [`SledStore::open`], for
    /// callback effects ([`EffectTx`](super::EffectTx)) and reads. Take the handles once, at
    /// start-up: a name that was not declared fails here.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] when `name` was not declared at open.
    pub fn tree(&self, name: &str) -> Result<Tree, StoreError> {
        check_declared(&self.inner.effect_trees, name)?;
        Ok(Tree::declared(name))
    }

    /// The value of `key` in one of the merchant's trees.
    ///
    /// Read outside the group commit, it may be a batch's that is applied but not flushed
    /// yet: should that flush fail, the store stops and the value is not kept. Read what
    /// decides money inside a callback's effects ([`EffectTx`](super::EffectTx)), which see
    /// only durable values and their own batch's.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] for a handle of another store; [`StoreError::Backend`]
    /// when sled fails.
    pub fn get(&self, tree: &Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.check_tree(tree)?;
        Ok(self.inner.tree.get(tree.key(key))?.map(|v| v.to_vec()))
    }

    /// Every `(key, value)` of one of the merchant's trees, in key order.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] for a handle of another store; [`StoreError::Backend`]
    /// when sled fails.
    pub fn entries(&self, tree: &Tree) -> Result<Vec<KeyValue>, StoreError> {
        self.check_tree(tree)?;
        let prefix = tree.prefix();
        self.inner
            .tree
            .scan_prefix(prefix)
            .map(|entry| {
                let (key, value) = entry?;
                Ok((key[prefix.len()..].to_vec(), value.to_vec()))
            })
            .collect()
    }

    /// Number of callback and validation records held (for monitoring and tests).
    pub fn record_count(&self) -> usize {
        let count = |prefix: &[u8]| self.inner.tree.scan_prefix(prefix).count();
        count(keys::CALLBACK_PREFIX) + count(keys::VALIDATION_PREFIX)
    }

    /// The record of one nonce, under its key or where an older store kept it.
    fn record(&self, key: &keys::RecordKey) -> Result<Option<sled::IVec>, StoreError> {
        Ok(key.read(|k| self.inner.tree.get(k))?)
    }

    fn check_tree(&self, tree: &Tree) -> Result<(), StoreError> {
        check_declared(&self.inner.effect_trees, tree.name())
    }

    fn check_healthy(&self) -> Result<(), StoreError> {
        if self.inner.failed.load(Ordering::SeqCst) {
            Err(StoreError::Stopped)
        } else {
            Ok(())
        }
    }

    fn submit<T: Send + 'static>(
        &self,
        job: Job,
        reply: oneshot::Receiver<Result<T, StoreError>>,
    ) -> StoreFuture<'_, T> {
        self.inner.writer.submit(job);
        Box::pin(async move {
            reply
                .await
                .unwrap_or_else(|_| Err(StoreError::backend_message("the write was dropped")))
        })
    }
}

/// Test-only: commits held at a [`HoldPoint`] until this is released or dropped.
#[doc(hidden)]
#[derive(Debug)]
pub struct CommitHold {
    state: Arc<HoldState>,
    store: SledStore,
}

impl CommitHold {
    /// Blocks until `count` commits reached the point (and wait there); panics when they
    /// did not within a minute (a test that would otherwise hang).
    pub fn wait_reached(&self, count: usize) {
        assert!(
            self.state.wait_reached(count, Duration::from_secs(60)),
            "no commit reached the held point within a minute"
        );
    }

    /// Lets the held commits go on (and later ones pass).
    pub fn release(self) {}
}

impl Drop for CommitHold {
    fn drop(&mut self) {
        self.store.inner.writer.gate().disarm();
    }
}

/// Opens sled and payhook's tree at `config.path`; an unreadable store is an
/// [`IntegrityError::Unreadable`]. Unless `repair`, a sealed store without sled's `conf`
/// is refused: sled would write a new one and open whatever the rest holds, but nothing
/// removes it short of damage (payhook seals a store only after sled created it).
fn open_sled(config: &StoreConfig, repair: bool) -> Result<(sled::Db, sled::Tree), StoreError> {
    if !repair
        && config.path.join(super::watermark::FILE_NAME).is_file()
        && !config.path.join("conf").is_file()
    {
        return Err(StoreError::Integrity(IntegrityError::Unreadable {
            path: config.path.clone(),
            reason: "sled's configuration file `conf` is missing".into(),
        }));
    }
    let sled_config = sled::Config::new()
        .path(&config.path)
        .cache_capacity(config.cache_bytes)
        // Off unless configured: payhook flushes what it writes itself, and sled's flusher
        // relocates segments endlessly after many removals (see `committer.rs`).
        .flush_every_ms(
            Some(u64::try_from(config.flush_every.as_millis()).unwrap_or(u64::MAX))
                .filter(|ms| *ms > 0),
        );
    let unreadable = |error: sled::Error| match error {
        sled::Error::Corruption { .. } | sled::Error::Unsupported(_) => {
            StoreError::Integrity(IntegrityError::Unreadable {
                path: config.path.clone(),
                reason: error.to_string(),
            })
        }
        other => other.into(),
    };
    let db = open_locked(&sled_config).map_err(|error| match error {
        sled::Error::Corruption { .. } | sled::Error::Unsupported(_) => unreadable(error),
        other => cannot_open(other, &config.path),
    })?;
    let tree = db.open_tree(TREE).map_err(unreadable)?;
    Ok((db, tree))
}

/// The file in a sled store's directory saying it is being, or was, copied into PostgreSQL
/// (see [`SledStore::open`]).
pub const MOVED_FILE_NAME: &str = "MOVED-TO-POSTGRESQL";

/// How [`SledStore::moved`] begins once the copy finished.
#[cfg(feature = "postgres")]
pub(crate) const COPIED_INTO: &str = "copied into";

/// Refuses a store copied into PostgreSQL (see [`SledStore::mark_moved`]), saying where to and
/// how to serve from sled again should the move be abandoned.
fn refuse_if_moved(config: &StoreConfig) -> Result<(), StoreError> {
    match SledStore::moved(config)? {
        Some(said) => Err(StoreError::Unsupported(format!(
            "the sled store at {} was {said}: its callbacks are booked in PostgreSQL since, and \
             a sled instance would book their retries again; set store.url to serve from \
             PostgreSQL (if the move was abandoned and nothing was served from PostgreSQL, \
             remove {} to serve from sled again)",
            config.path.display(),
            config.path.join(MOVED_FILE_NAME).display()
        ))),
        None => Ok(()),
    }
}

/// Refuses a `store.path` where no service has written a store: a command that reads what
/// a service holds must not create an empty one there and report everything missing.
pub(crate) fn require_existing(config: &StoreConfig) -> Result<(), StoreError> {
    if config.path.join("db").is_file() || config.path.join(super::watermark::FILE_NAME).is_file() {
        Ok(())
    } else {
        let path = std::path::absolute(&config.path).unwrap_or_else(|_| config.path.clone());
        Err(StoreError::backend_message(format!(
            "there is no store at {} (store.path, PAYHOOK_STORE_PATH, or the command's --data; \
             a relative path is read from the directory the command runs in): point it at the \
             service's data directory",
            path.display()
        )))
    }
}

/// sled words a held lock as `could not acquire lock on Some("…"): Os { code: 11, … }`;
/// say instead which directory is in use and what to do. Any other failure keeps sled's
/// error as its cause.
fn cannot_open(error: sled::Error, path: &std::path::Path) -> StoreError {
    if error.to_string().contains("could not acquire lock") {
        StoreError::backend_message(format!(
            "the data directory {} is in use by another process (one process may open it \
             at a time): stop that process, or give this one another store.path \
             (PAYHOOK_STORE_PATH)",
            path.display()
        ))
    } else {
        StoreError::backend(
            format!("cannot open the store at {}", path.display()),
            error,
        )
    }
}

/// How long `open` waits for the directory's lock: sled lets go of it only when its last
/// I/O thread has finished, a moment after the previous holder in this process was dropped.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Opens sled, waiting a little for a lock that a store of this process is still releasing;
/// a store held by another process is still refused (after [`LOCK_WAIT`]).
pub(crate) fn open_locked(config: &sled::Config) -> Result<sled::Db, sled::Error> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Ok(db) => return Ok(db),
            Err(error)
                if error.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => return Err(error),
        }
    }
}

impl DedupStore for SledStore {
    fn begin_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> StoreFuture<'a, CallbackBegin> {
        ready(self.begin_callback_now(nonce, status, stale_after))
    }

    fn finish_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
        status: TransactionStatus,
        effects: Effects,
    ) -> DurableFuture<'a> {
        let (reply, receiver) = oneshot::channel();
        let job = Job::Callback {
            nonce: nonce.as_str().to_owned(),
            claim,
            status: status.code(),
            effects,
            reply,
        };
        let written = self.submit(job, receiver);
        let claims = Arc::clone(&self.inner.callback_claims);
        Box::pin(async move {
            let outcome = written.await;
            claims.end(nonce, claim, outcome.is_ok(), now_ms());
            outcome
        })
    }

    fn callback_acknowledged<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, bool> {
        ready(self.callback_acknowledged_now(nonce, status))
    }

    fn release_callback<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()> {
        self.inner
            .callback_claims
            .end(nonce, claim, false, now_ms());
        ready(Ok(()))
    }

    fn give_back_callback<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()> {
        self.inner.callback_claims.give_back(nonce, claim, now_ms());
        ready(Ok(()))
    }

    fn record_callback_failure(&self, failure: CallbackFailure) -> StoreFuture<'_, ()> {
        if self.check_healthy().is_ok() {
            self.inner.writer.submit(Job::Failure(Box::new(failure)));
        }
        ready(Ok(()))
    }

    fn failing_callbacks(&self) -> StoreFuture<'_, Vec<FailingCallback>> {
        ready(self.failing_callbacks_now())
    }

    fn failing_page(
        &self,
        after: Option<FailingCursor>,
        limit: usize,
    ) -> StoreFuture<'_, FailingPage> {
        ready(super::failing::page(
            &self.inner.tree,
            after.as_ref(),
            limit,
        ))
    }

    /// Counted at open, kept since: no scan per scrape.
    fn failing_count(&self) -> StoreFuture<'_, usize> {
        ready(Ok(self.inner.failing.get()))
    }

    fn held_callback<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
    ) -> StoreFuture<'a, Option<HeldCallback>> {
        ready(self.check_healthy().and_then(|()| {
            // Under the writer lock: a held result still being flushed is not reported.
            self.inner.writer.read_durable(|| {
                self.check_healthy()?;
                super::held::get(&self.inner.tree, nonce, status.code())
            })
        }))
    }

    fn held_callbacks(&self, limit: usize) -> StoreFuture<'_, Vec<HeldCallback>> {
        if self.inner.held.get() == 0 {
            // What the inspector's panel reads every second: no scan, no lock, for none.
            return ready(self.check_healthy().map(|()| Vec::new()));
        }
        ready(self.check_healthy().and_then(|()| {
            // Under the writer lock, as `held_callback`: a person acts on what is durable.
            self.inner.writer.read_durable(|| {
                self.check_healthy()?;
                let mut held = super::held::unresolved(&self.inner.tree)?;
                held.truncate(limit);
                Ok(held)
            })
        }))
    }

    /// Counted at open, kept since: no scan per scrape.
    fn held_count(&self) -> StoreFuture<'_, usize> {
        ready(Ok(self.inner.held.get()))
    }

    fn resolve_held<'a>(
        &'a self,
        nonce: &'a Nonce,
        status: TransactionStatus,
        resolution: &'a str,
        by: Option<&'a str>,
    ) -> StoreFuture<'a, Option<HeldCallback>> {
        if let Err(error) = self.check_healthy() {
            return ready(Err(error));
        }
        let (reply, receiver) = oneshot::channel();
        let job = Job::Resolve {
            nonce: nonce.as_str().to_owned(),
            status: status.code(),
            resolving: Resolving::new(resolution, by),
            at: chrono::Utc::now(),
            reply,
        };
        self.submit(job, receiver)
    }

    fn begin_validation<'a>(
        &'a self,
        nonce: &'a Nonce,
        fingerprint: &'a Fingerprint,
        stale_after: Duration,
    ) -> StoreFuture<'a, ValidationBegin> {
        ready(self.begin_validation_now(nonce, fingerprint, stale_after))
    }

    fn finish_validation<'a>(
        &'a self,
        nonce: &'a Nonce,
        claim: Claim,
        fingerprint: &'a Fingerprint,
        decision: &'a RecordedDecision,
        postponed: Option<PostponedValidation>,
    ) -> DurableFuture<'a> {
        let (reply, receiver) = oneshot::channel();
        let job = Job::Validation {
            nonce: nonce.as_str().to_owned(),
            claim,
            fingerprint: fingerprint.clone(),
            decision: decision.clone(),
            postponed: postponed.map(Box::new),
            reply,
        };
        let written = self.submit(job, receiver);
        let claims = Arc::clone(&self.inner.validation_claims);
        Box::pin(async move {
            let outcome = written.await;
            claims.end(nonce, claim, outcome.is_ok(), now_ms());
            outcome
        })
    }

    fn release_validation<'a>(&'a self, nonce: &'a Nonce, claim: Claim) -> StoreFuture<'a, ()> {
        self.inner
            .validation_claims
            .end(nonce, claim, false, now_ms());
        ready(Ok(()))
    }

    fn validated_payment<'a>(
        &'a self,
        nonce: &'a Nonce,
    ) -> StoreFuture<'a, Option<ValidatedPayment>> {
        ready(self.validated_payment_now(nonce))
    }
}

impl PostponedStore for SledStore {
    fn resolve<'a>(
        &'a self,
        validation_id: ValidationId,
        decision: &'a Decision,
        by: Option<&'a str>,
        now: DateTime<Utc>,
    ) -> ResolveFuture<'a> {
        self.postponed_op(PostponedOp::Resolve {
            validation_id,
            success: decision.allows(),
            description: decision.description().to_owned(),
            by: by.map(str::to_owned),
            now,
        })
    }

    fn repeat<'a>(
        &'a self,
        request: &'a TransactionValidationRequest,
        now: DateTime<Utc>,
    ) -> StoreFuture<'a, Repeat> {
        if let Err(error) = self.check_healthy() {
            return Box::pin(async move { Err(error) });
        }
        let (reply, receiver) = oneshot::channel();
        let job = Job::Repeat {
            request: Box::new(request.clone()),
            now,
            reply,
        };
        self.submit(job, receiver)
    }

    fn record_delivery(
        &self,
        validation_id: ValidationId,
        delivery: Delivery,
    ) -> DurableFuture<'_> {
        let written = self.postponed_op(PostponedOp::Deliver {
            validation_id,
            delivery,
        });
        Box::pin(async move { written.await.map(|_| ()) })
    }

    fn make_due(&self, validation_id: ValidationId, now: DateTime<Utc>) -> StoreFuture<'_, bool> {
        let written = self.postponed_op(PostponedOp::MakeDue { validation_id, now });
        Box::pin(async move { Ok(matches!(written.await?, super::Resolution::Recorded)) })
    }

    fn postponed(
        &self,
        validation_id: ValidationId,
    ) -> StoreFuture<'_, Option<PostponedValidation>> {
        ready(self.postponed_now(validation_id))
    }

    fn postponed_all(&self) -> StoreFuture<'_, Vec<PostponedValidation>> {
        ready(self.postponed_all_now())
    }

    fn postponed_in(&self, state: PostponedState) -> StoreFuture<'_, Vec<PostponedValidation>> {
        ready(self.postponed_in_now(state))
    }

    fn postponed_settled(&self, limit: usize) -> StoreFuture<'_, Vec<PostponedValidation>> {
        ready(self.postponed_settled_now(limit))
    }

    fn postponed_page(
        &self,
        state: Option<PostponedState>,
        after: Option<ValidationId>,
        limit: usize,
    ) -> StoreFuture<'_, PostponedPage> {
        ready(self.postponed_page_now(state, after, limit))
    }

    fn outbox_due(&self, now: DateTime<Utc>) -> StoreFuture<'_, Due> {
        // Only durable decisions are posted: one lost to a power failure after being posted
        // would come back undecided, and a different decision would then conflict. A store
        // whose last batch failed to flush may show writes that are not durable: it posts
        // nothing. One process holds a sled store, so there is nothing to lease.
        //
        // Healthy is asked under the writer lock too: a leader whose flush failed lets go of
        // the lock with its batch applied and the store stopped.
        ready(self.check_healthy().and_then(|()| {
            self.inner.writer.read_durable(|| {
                self.check_healthy()?;
                self.due(keys::OUTBOX_PREFIX, ms_from_time(now))
            })
        }))
    }

    fn outbox_len(&self) -> StoreFuture<'_, usize> {
        let mut queued = 0;
        for entry in self.inner.tree.scan_prefix(keys::OUTBOX_PREFIX).values() {
            match entry {
                Ok(value) if !value.is_empty() => queued += 1,
                Ok(_) => {}
                Err(error) => return ready(Err(error.into())),
            }
        }
        ready(Ok(queued))
    }

    fn outbox_summary(&self) -> StoreFuture<'_, super::OutboxSummary> {
        ready(self.outbox_summary_now())
    }

    fn deadlines_due(&self, now: DateTime<Utc>) -> StoreFuture<'_, Due> {
        ready(self.check_healthy().and_then(|()| {
            self.inner.writer.read_durable(|| {
                self.check_healthy()?;
                self.due(keys::WAITING_PREFIX, ms_from_time(now))
            })
        }))
    }
}

/// What the records of `tree` reach back to, opened with `retention` by `opener` (see
/// [`super::horizon::at_open`]); a service's open writes it back, made durable before the
/// store serves, so that a crash cannot leave it behind a longer retention's records.
fn vouched_at_open(
    tree: &sled::Tree,
    retention: Duration,
    opener: Opener,
) -> Result<super::horizon::Vouched, StoreError> {
    let stored = tree.get(keys::VOUCHED)?;
    let holds_records = tree.scan_prefix(keys::EXPIRY_PREFIX).next().is_some();
    let serves = opener == Opener::Service;
    // One writer: a growth counts at once.
    let vouched = super::horizon::at_open(
        stored.as_deref(),
        retention,
        holds_records,
        (now_ms(), serves, Duration::ZERO),
    );
    let record = vouched.encode()?;
    if serves && stored.as_deref() != Some(record.as_bytes()) {
        tree.insert(keys::VOUCHED, record.as_bytes())?;
        tree.flush()?;
    }
    Ok(vouched)
}

impl Store for SledStore {
    fn retention(&self) -> Duration {
        self.inner.retention
    }

    fn reach(&self) -> Duration {
        self.inner
            .vouched
            .reach_within(self.inner.retention, now_ms())
    }

    fn commit_metrics(&self) -> Option<super::CommitMetrics> {
        Some(self.inner.commit_metrics.clone())
    }

    fn failed(&self) -> bool {
        self.inner.failed.load(Ordering::SeqCst)
    }

    /// One process writes a sled store; a record stays until the sweep removes it after its
    /// retention, on this process's clock; a failed flush stops the store, and the watermark
    /// refuses to open one that lost acknowledged commits.
    fn process_may_remember_bookings(&self) -> bool {
        true
    }

    /// Claims live in this process's memory (`store::claims`), never on disk.
    fn claims_end_with_this_process(&self) -> bool {
        true
    }

    fn purge_expired(&self, now: DateTime<Utc>) -> StoreFuture<'_, usize> {
        ready(self.inner.writer.purge(ms_from_time(now)))
    }

    fn end_session<'a>(&'a self, session: &'a str, until: DateTime<Utc>) -> DurableFuture<'a> {
        if let Err(error) = self.check_healthy() {
            return ready(Err(error));
        }
        let (reply, receiver) = oneshot::channel();
        let job = Job::EndSession {
            session: session.to_owned(),
            until_ms: ms_from_time(until),
            reply,
        };
        self.submit(job, receiver)
    }

    fn session_ended<'a>(&'a self, session: &'a str) -> StoreFuture<'a, bool> {
        // Read on a failed store too: what it holds stays true, and a logout it cannot keep
        // (refused) leaves the session good, for the logout to be asked again.
        let key = keys::ended_session(session);
        ready(self.record(&key).map(|found| found.is_some()))
    }
}

impl SledStore {
    fn begin_callback_now(
        &self,
        nonce: &str,
        status: TransactionStatus,
        stale_after: Duration,
    ) -> Result<CallbackBegin, StoreError> {
        self.check_healthy()?;
        if let Some(begin) = self.try_begin_callback(nonce, status, stale_after, false)? {
            return Ok(begin);
        }
        // A takeover: the stale claim's own write may be applied but not yet durable (a
        // flush stalled that long). Under the writer lock sled shows durable writes only.
        self.inner.writer.read_durable(|| {
            self.check_healthy()?;
            self.try_begin_callback(nonce, status, stale_after, true)
                .map(|begin| begin.unwrap_or(CallbackBegin::Busy))
        })
    }

    fn callback_acknowledged_now(
        &self,
        nonce: &str,
        status: TransactionStatus,
    ) -> Result<bool, StoreError> {
        self.check_healthy()?;
        // Under the writer lock: a mark still being flushed is not reported as booked.
        // Healthy asked again under it: see `outbox_due`.
        self.inner.writer.read_durable(|| {
            self.check_healthy()?;
            self.booked(nonce, status)
        })
    }

    /// Whether the record of `nonce` holds `status`, as sled shows it now (durable only
    /// under the writer lock).
    fn booked(&self, nonce: &str, status: TransactionStatus) -> Result<bool, StoreError> {
        Ok(match self.record(&keys::callback(nonce))? {
            Some(bytes) => decode::<CallbackRecord>(nonce, &bytes)?
                .done
                .contains(&status.code()),
            None => false,
        })
    }

    fn failing_callbacks_now(&self) -> Result<Vec<FailingCallback>, StoreError> {
        let mut failing = Vec::new();
        for entry in self.inner.tree.scan_prefix(keys::FAILING_PREFIX) {
            failing.extend(decode_failing::<FailureRecord>(entry?)?.failing);
        }
        super::failing::sort_latest_first(&mut failing);
        Ok(failing)
    }

    fn begin_validation_now(
        &self,
        nonce: &str,
        fingerprint: &Fingerprint,
        stale_after: Duration,
    ) -> Result<ValidationBegin, StoreError> {
        self.check_healthy()?;
        if let Some(begin) = self.try_begin_validation(nonce, fingerprint, stale_after, false)? {
            return Ok(begin);
        }
        // A takeover, read under the writer lock: see `begin_callback_now`.
        self.inner.writer.read_durable(|| {
            self.check_healthy()?;
            self.try_begin_validation(nonce, fingerprint, stale_after, true)
                .map(|begin| begin.unwrap_or(ValidationBegin::Busy))
        })
    }

    fn postponed_now(
        &self,
        validation_id: ValidationId,
    ) -> Result<Option<PostponedValidation>, StoreError> {
        self.inner
            .tree
            .get(keys::by_id(keys::POSTPONED_PREFIX, validation_id))?
            .map(|bytes| decode_named(&bytes, || validation_id.to_string()))
            .transpose()
    }

    /// The postponed validations in `state`. What waits for a decision or for delivery is
    /// read through its index (`w`, `o`: see `keys.rs`), one record per entry; a delivered or
    /// refused one has no index, and is found among every record.
    /// The outbox's length and its oldest decision, from its index: an entry holds when its
    /// result was decided; one written before it did has it read from its record.
    fn outbox_summary_now(&self) -> Result<super::OutboxSummary, StoreError> {
        let mut summary = super::OutboxSummary::default();
        for entry in self.inner.tree.scan_prefix(keys::OUTBOX_PREFIX) {
            let (key, value) = entry?;
            if value.is_empty() {
                continue;
            }
            summary.queued += 1;
            let decided = match keys::decided_of(&value) {
                Some(ms) => Some(time_from_ms(ms)),
                None => keys::id_of(&key)
                    .and_then(|id| self.postponed_now(id).ok().flatten())
                    .and_then(|record| record.result.map(|result| result.decided)),
            };
            summary.oldest_decided = summary.oldest_decided.into_iter().chain(decided).min();
        }
        Ok(summary)
    }

    fn postponed_in_now(
        &self,
        state: PostponedState,
    ) -> Result<Vec<PostponedValidation>, StoreError> {
        let Some(index) = index_of(state) else {
            return Ok(super::in_state(self.postponed_all_now()?, state));
        };
        self.indexed(state, self.in_id_order(index, false), usize::MAX)
    }

    /// Up to `wanted` records in `state`, read through `entries` of its index, in their
    /// order.
    fn indexed(
        &self,
        state: PostponedState,
        entries: IdOrder,
        wanted: usize,
    ) -> Result<Vec<PostponedValidation>, StoreError> {
        let mut found = Vec::new();
        for entry in entries {
            if found.len() >= wanted {
                break;
            }
            let Some(id) = keys::id_of(&entry?.0) else {
                continue;
            };
            // Read after its index entry, not with it: a record that changed state in
            // between is left out, as it would have been a moment later.
            if let Some(record) = self.postponed_now(id)?.filter(|v| v.state() == state) {
                found.push(record);
            }
        }
        Ok(found)
    }

    /// A page of [`PostponedStore::postponed_page`]: what waits read through its index, the
    /// rest from the records, by id from `after` on, stopping once the page holds one more
    /// than `limit` (which says that more follow).
    fn postponed_page_now(
        &self,
        state: Option<PostponedState>,
        after: Option<ValidationId>,
        limit: usize,
    ) -> Result<PostponedPage, StoreError> {
        let limit = limit.max(1);
        let wanted = limit.saturating_add(1);
        let found = match state.map(|state| (state, index_of(state))) {
            Some((state, Some(index))) => {
                self.indexed(state, self.in_id_order_after(index, after), wanted)?
            }
            _ => {
                let mut found = Vec::new();
                for entry in self.in_id_order_after(keys::POSTPONED_PREFIX, after) {
                    if found.len() >= wanted {
                        break;
                    }
                    let record = decode_postponed(entry?)?;
                    if state.is_none_or(|state| record.state() == state) {
                        found.push(record);
                    }
                }
                found
            }
        };
        Ok(PostponedPage::of(found, limit))
    }

    /// The entries under `prefix`, whose keys end in a validation id, in the ids' numeric
    /// order (descending when `highest_first`). Their 8-byte big-endian form puts a negative
    /// id after every positive one: the two halves are read apart.
    fn in_id_order(&self, prefix: &[u8], highest_first: bool) -> IdOrder {
        let (negative, end) = id_halves(prefix);
        let positives = self.inner.tree.range(prefix.to_vec()..negative.clone());
        let negatives = self.inner.tree.range(negative..end);
        if highest_first {
            Box::new(positives.rev().chain(negatives.rev()))
        } else {
            Box::new(negatives.chain(positives))
        }
    }

    /// The entries under `prefix`, as [`SledStore::in_id_order`] reads them lowest first,
    /// of the ids above `after` (all without it).
    fn in_id_order_after(&self, prefix: &[u8], after: Option<ValidationId>) -> IdOrder {
        let Some(after) = after else {
            return self.in_id_order(prefix, false);
        };
        let (negative, end) = id_halves(prefix);
        let from = Bound::Excluded(keys::by_id(prefix, after));
        if after.get() < 0 {
            let negatives = self.inner.tree.range((from, Bound::Excluded(end)));
            let positives = self.inner.tree.range(prefix.to_vec()..negative);
            Box::new(negatives.chain(positives))
        } else {
            Box::new(self.inner.tree.range((from, Bound::Excluded(negative))))
        }
    }

    /// At most `limit` final validations, highest id first: the records are read from the
    /// highest id down, those still waiting (few) passed over.
    fn postponed_settled_now(&self, limit: usize) -> Result<Vec<PostponedValidation>, StoreError> {
        let mut found = Vec::new();
        for entry in self.in_id_order(keys::POSTPONED_PREFIX, true) {
            if found.len() >= limit {
                break;
            }
            let record = decode_postponed(entry?)?;
            if record.is_final() {
                found.push(record);
            }
        }
        Ok(found)
    }

    fn postponed_all_now(&self) -> Result<Vec<PostponedValidation>, StoreError> {
        self.in_id_order(keys::POSTPONED_PREFIX, false)
            .map(|entry| decode_postponed(entry?))
            .collect()
    }
}

/// Entries of the store's tree, in some order of the validation ids their keys end in.
type IdOrder = Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>>;

/// Where the keys of the negative ids under `prefix` start (8-byte big-endian, they sort
/// after every positive one), and where `prefix`'s keys end.
fn id_halves(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let negative = [prefix, &[0x80]].concat();
    let mut end = prefix.to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    (negative, end)
}

/// The index that lists the validations in `state`: what waits for a decision (`w`) or
/// for delivery (`o`); a delivered or refused one has none.
fn index_of(state: PostponedState) -> Option<&'static [u8]> {
    match state {
        PostponedState::Pending => Some(keys::WAITING_PREFIX),
        PostponedState::Queued => Some(keys::OUTBOX_PREFIX),
        PostponedState::Delivered | PostponedState::Conflict => None,
    }
}

/// A failing callback's record (`f`), found by a scan: named by its nonce only if it does
/// not decode.
fn decode_failing<T: serde::de::DeserializeOwned>(
    (key, bytes): (sled::IVec, sled::IVec),
) -> Result<T, StoreError> {
    decode_named(&bytes, || keys::describe(keys::identifier_in(&key)))
}

/// A postponed validation's record, found by a scan: named by its id only if it does not
/// decode.
fn decode_postponed(
    (key, bytes): (sled::IVec, sled::IVec),
) -> Result<PostponedValidation, StoreError> {
    decode_named(&bytes, || format!("{:?}", keys::id_of(&key)))
}

impl SledStore {
    /// Begins a callback delivery: claims the nonce unless it is claimed (`Busy`) or this
    /// status is acknowledged (`Duplicate`). Taking over a stale claim needs `durable` (the
    /// caller holds the writer lock); without it, `None`.
    fn try_begin_callback(
        &self,
        nonce: &str,
        status: TransactionStatus,
        stale_after: Duration,
        durable: bool,
    ) -> Result<Option<CallbackBegin>, StoreError> {
        let now = now_ms();
        let mut shard = self.inner.callback_claims.shard(nonce);
        // Again under the shard's lock: a batch that failed is marked so before its claims
        // end, so a record it applied (never durable) is not answered as booked.
        self.check_healthy()?;
        let entry = shard.entry(nonce);
        if Claims::live(entry, stale_after) {
            // Another status of the nonce in progress. This one booked before that claim was
            // taken is a duplicate, not busy for as long as the other's handler runs (a
            // reversal's, say): its retries would be answered 503 until the aggregator gave
            // up. Read durably: only the claimed status may be written and not yet flushed.
            let other_status = entry.status != status.code();
            drop(shard);
            let booked = other_status
                && if durable {
                    // Under the writer lock already (a takeover's read).
                    self.booked(nonce, status)?
                } else {
                    self.callback_acknowledged_now(nonce, status)?
                };
            return Ok(Some(if booked {
                CallbackBegin::Duplicate
            } else {
                CallbackBegin::Busy
            }));
        }
        let takeover = entry.claim.is_some();
        if takeover {
            if !durable {
                return Ok(None);
            }
            tracing::warn!(nonce = %crate::logged::Logged(nonce), "taking over a claim whose delivery never finished");
        }
        let record = match self.record(&keys::callback(nonce))? {
            Some(bytes) => decode::<CallbackRecord>(nonce, &bytes)?,
            None => CallbackRecord::default(),
        };
        if record.done.contains(&status.code()) {
            if entry.claim.is_none() && entry.attempts == 0 {
                shard.remove(nonce);
            }
            return Ok(Some(CallbackBegin::Duplicate));
        }
        let claim = self.inner.callback_claims.new_claim();
        entry.attempts = entry.attempts.max(record.attempts).saturating_add(1);
        entry.claim = Some((claim, std::time::Instant::now()));
        entry.status = status.code();
        entry.touched_ms = now;
        let previous_status = record
            .done
            .last()
            .map(|code| TransactionStatus::from_code(*code));
        // The commit starts from this record instead of reading it again: while the claim
        // is live nobody else writes it. After a takeover the commit reads it itself.
        entry.record = (!takeover).then_some(record);
        Ok(Some(CallbackBegin::Claimed {
            claim,
            attempt: entry.attempts,
            previous_status,
        }))
    }

    /// The validation of `nonce` as recorded, with its postponed validation's record while
    /// that is kept (its id is in the record: not in records written before it was kept,
    /// whose postponed decision is then not known). A record that does not decode is an
    /// error, postponed or not: a success is not booked past it.
    fn validated_payment_now(&self, nonce: &str) -> Result<Option<ValidatedPayment>, StoreError> {
        self.check_healthy()?;
        let Some(bytes) = self.record(&keys::validation(nonce))? else {
            return Ok(None);
        };
        let record: ValidationRecord = decode(nonce, &bytes)?;
        let postponed = match (&record.decision, record.validation_id) {
            (RecordedDecision::Postponed, Some(id)) => self.postponed_now(id)?,
            _ => None,
        };
        ValidatedPayment::of(
            nonce,
            &record.fingerprint,
            &record.decision,
            postponed.as_ref(),
        )
        .map(Some)
    }

    /// Begins a transaction validation; like [`Self::try_begin_callback`].
    fn try_begin_validation(
        &self,
        nonce: &str,
        fingerprint: &Fingerprint,
        stale_after: Duration,
        durable: bool,
    ) -> Result<Option<ValidationBegin>, StoreError> {
        let now = now_ms();
        let mut shard = self.inner.validation_claims.shard(nonce);
        // Again under the shard's lock: see `try_begin_callback`.
        self.check_healthy()?;
        // A live claim first: its record may be written but not yet durable, and must not be
        // answered from before it is.
        match shard.get(nonce) {
            Some(entry) if Claims::live(entry, stale_after) => {
                return Ok(Some(ValidationBegin::Busy));
            }
            Some(entry) if entry.claim.is_some() && !durable => return Ok(None),
            _ => {}
        }
        if let Some(bytes) = self.record(&keys::validation(nonce))? {
            let record: ValidationRecord = decode(nonce, &bytes)?;
            return Ok(Some(if record.fingerprint.matches(fingerprint) {
                ValidationBegin::Recorded(record.decision)
            } else {
                ValidationBegin::Mismatch
            }));
        }
        let entry = shard.entry(nonce);
        let claim = self.inner.validation_claims.new_claim();
        entry.claim = Some((claim, std::time::Instant::now()));
        entry.touched_ms = now;
        Ok(Some(ValidationBegin::Claimed { claim }))
    }

    /// **For tests only**: marks the store failed, as a batch that could not be made durable
    /// does, so that a test can see how the service behaves then (every request 503,
    /// `/readyz` 503). There is no way back but reopening the store.
    #[doc(hidden)]
    pub fn mark_failed_for_tests(&self) {
        self.inner.failed.store(true, Ordering::SeqCst);
    }

    fn postponed_op(&self, op: PostponedOp) -> ResolveFuture<'_> {
        if let Err(error) = self.check_healthy() {
            return Box::pin(async move { Err(error) });
        }
        let (reply, receiver) = oneshot::channel();
        self.submit(Job::Postponed { op, reply }, receiver)
    }

    /// Until when (ms) validation `id`, whose record could not be decoded, is left out of
    /// what is due.
    fn left_out_until(&self, id: ValidationId) -> Option<u64> {
        let left_out = self
            .inner
            .left_out
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        left_out.get(&id).copied()
    }

    /// Leaves validation `id`, whose record could not be decoded at `now_ms`, out of what is
    /// due for [`super::UNREADABLE_LEFT_FOR`] (`None`: takes it back, read or gone).
    fn leave_out(&self, id: ValidationId, now_ms: Option<u64>) {
        let left_for = u64::try_from(super::UNREADABLE_LEFT_FOR.as_millis()).unwrap_or(u64::MAX);
        let mut left_out = self
            .inner
            .left_out
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match now_ms {
            Some(now_ms) => left_out.insert(id, now_ms.saturating_add(left_for)),
            None => left_out.remove(&id),
        };
    }

    /// The records indexed under `prefix` whose time (the index value) is at or before
    /// `now_ms`, at most [`super::DUE_BATCH`] of them (read under the writer lock, which
    /// every commit waits for: the rest are due at once, for the next pass); entries without
    /// a time are never due.
    fn due(&self, prefix: &[u8], now_ms: u64) -> Result<Due, StoreError> {
        let mut due = Due::default();
        let mut next_ms: Option<u64> = None;
        for entry in self.inner.tree.scan_prefix(prefix) {
            let (key, value) = entry?;
            if value.is_empty() {
                continue;
            }
            let at = keys::millis_of(&value);
            if at > now_ms {
                next_ms = Some(next_ms.map_or(at, |n| n.min(at)));
                continue;
            }
            if due.now.len() >= super::DUE_BATCH {
                // More are due: the next pass comes at once, whatever else the index holds.
                next_ms = Some(at);
                break;
            }
            let Some(id) = keys::id_of(&key) else {
                continue;
            };
            let left_out = self.left_out_until(id);
            if left_out.is_some_and(|until| until > now_ms) {
                continue;
            }
            let read = self.postponed_now(id).transpose();
            let unreadable = match read.map(super::unless_unreadable).transpose()? {
                Some(Some(record)) => {
                    due.now.push(record);
                    false
                }
                Some(None) => true,
                // Gone since its index entry was read: decided, delivered, purged.
                None => false,
            };
            if unreadable {
                self.leave_out(id, Some(now_ms));
            } else if left_out.is_some() {
                self.leave_out(id, None);
            }
        }
        due.next = next_ms.map(time_from_ms);
        Ok(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::{runtime::Runtime, task::JoinHandle};

    const PATIENCE: Duration = Duration::from_secs(60);

    /// Claims `nonce` and books it with no effects; the commit's outcome.
    async fn book(store: SledStore, nonce: &'static str) -> Result<(), StoreError> {
        let nonce = Nonce::from(nonce);
        let status = TransactionStatus::Success;
        let CallbackBegin::Claimed { claim, .. } =
            store.begin_callback(&nonce, status, PATIENCE).await?
        else {
            panic!("{nonce:?} was not claimed");
        };
        store
            .finish_callback(&nonce, claim, status, Effects::default())
            .await
    }

    /// A store on a multi-threaded runtime whose first write's batch waits before its flush
    /// while a second write queues behind it.
    struct Queued {
        runtime: Runtime,
        store: SledStore,
        first: JoinHandle<Result<(), StoreError>>,
        second: JoinHandle<Result<(), StoreError>>,
        /// Where the first write's batch waits.
        first_batch: Arc<HoldState>,
        held: Released,
        _dir: tempfile::TempDir,
    }

    fn a_write_queued_behind_a_held_one() -> Queued {
        let (runtime, store, dir) = on_two_threads();
        let first_batch = store.inner.writer.gate().arm(HoldPoint::BeforeFlush);
        let held = Released(vec![Arc::clone(&first_batch)]);
        let first = runtime.spawn(book(store.clone(), "n-1"));
        assert!(first_batch.wait_reached(1, PATIENCE));
        let second = runtime.spawn(book(store.clone(), "n-2"));
        wait_until(
            || store.inner.writer.queued() > 0,
            "the second write never queued",
        );
        Queued {
            runtime,
            store,
            first,
            second,
            first_batch,
            held,
            _dir: dir,
        }
    }

    /// [`a_write_queued_behind_a_held_one`], with the hand-off that commits the second write
    /// panicking at `point`: the first write is answered as booked, the second with an
    /// error, and every hold is let go. The runtime, the store and its directory.
    fn the_hand_off_panics_at(point: HoldPoint) -> (Runtime, SledStore, tempfile::TempDir) {
        let Queued {
            runtime,
            store,
            first,
            second,
            first_batch,
            held,
            _dir,
        } = a_write_queued_behind_a_held_one();
        let panicked = store.inner.writer.gate().arm_panic(point);
        first_batch.release();
        let first = within(&runtime, first);
        assert!(matches!(first, Ok(Ok(Ok(())))), "{first:?}");
        let second = within(&runtime, second);
        assert!(
            matches!(second, Ok(Ok(Err(_)))),
            "the write whose hand-off panicked at {point:?} was answered {second:?}"
        );
        assert!(panicked.wait_reached(1, PATIENCE));
        store.inner.writer.gate().disarm();
        drop(held);
        (runtime, store, _dir)
    }

    /// A read that leaves the process (is it booked? what is due for the aggregator?) waits
    /// for the batch being flushed; if the store stops meanwhile, that batch is applied but
    /// not durable, and the read must not report it.
    #[test]
    fn a_read_that_waited_for_a_batch_reports_the_store_stopped_not_the_batch() {
        let (runtime, store, _dir) = on_two_threads();
        let batch = store.inner.writer.gate().arm(HoldPoint::BeforeFlush);
        let held = Released(vec![Arc::clone(&batch)]);
        let booking = runtime.spawn(book(store.clone(), "n-1"));
        assert!(batch.wait_reached(1, PATIENCE));
        let reader = store.clone();
        let read = runtime.spawn(async move {
            reader
                .callback_acknowledged(&Nonce::from("n-1"), TransactionStatus::Success)
                .await
        });
        wait_until(
            || store.inner.writer.readers_waiting() == 1,
            "the read never waited for the lock",
        );
        // What a failed flush does: the store stops, and the leader lets go of the lock.
        store.mark_failed_for_tests();
        drop(held);
        let read = within(&runtime, read);
        assert!(
            matches!(read, Ok(Ok(Err(StoreError::Stopped)))),
            "the read reported {read:?}"
        );
        let _ = within(&runtime, booking);
    }

    /// Under steady load the queue is never empty when a batch ends: a request that kept
    /// leading would wait for every batch queued behind its own.
    #[test]
    fn a_request_that_led_a_batch_is_answered_without_leading_the_ones_queued_behind_it() {
        let Queued {
            runtime,
            store,
            first,
            second,
            first_batch,
            mut held,
            _dir,
        } = a_write_queued_behind_a_held_one();

        // The second batch waits before its flush too; the first request is answered
        // meanwhile.
        let second_batch = store.inner.writer.gate().arm(HoldPoint::BeforeFlush);
        held.0.push(Arc::clone(&second_batch));
        first_batch.release();
        assert!(second_batch.wait_reached(1, PATIENCE));
        let first = within(&runtime, first);
        assert!(
            matches!(first, Ok(Ok(Ok(())))),
            "the request that led the first batch was not answered while the second was held: {first:?}"
        );
        assert!(
            !second.is_finished(),
            "the second write was answered before it was durable"
        );

        drop(held);
        let second = within(&runtime, second);
        assert!(matches!(second, Ok(Ok(Ok(())))), "{second:?}");
        assert!(acknowledged(&runtime, &store, "n-1") && acknowledged(&runtime, &store, "n-2"));
    }

    /// [`a_write_queued_behind_a_held_one`], the second write handed off, its batch held
    /// before the flush; a sweep waiting for the lock the hand-off's thread holds, and a
    /// third write queued behind.
    struct SweepWaiting {
        runtime: Runtime,
        store: SledStore,
        /// The three writes, in order.
        writes: Vec<JoinHandle<Result<(), StoreError>>>,
        second_batch: Arc<HoldState>,
        held: Released,
        sweep: std::thread::JoinHandle<std::thread::Result<Result<usize, StoreError>>>,
        _dir: tempfile::TempDir,
    }

    fn a_sweep_waiting_behind_the_hand_off() -> SweepWaiting {
        let Queued {
            runtime,
            store,
            first,
            second,
            first_batch,
            mut held,
            _dir,
        } = a_write_queued_behind_a_held_one();
        let writer = &store.inner.writer;
        // The hand-off's thread commits the second write; its batch waits before the flush.
        let second_batch = writer.gate().arm(HoldPoint::BeforeFlush);
        held.0.push(Arc::clone(&second_batch));
        first_batch.release();
        assert!(second_batch.wait_reached(1, PATIENCE));
        assert!(writer.handed_off(), "the second batch was not handed off");
        let sweep = sweep_on_a_thread_of_its_own(&store);
        wait_until(
            || writer.waiting_ahead() == 1,
            "the sweep never waited for the lock",
        );
        let third = runtime.spawn(book(store.clone(), "n-3"));
        wait_until(|| writer.queued() > 0, "the third write never queued");
        SweepWaiting {
            runtime,
            store,
            writes: vec![first, second, third],
            second_batch,
            held,
            sweep,
            _dir,
        }
    }

    /// Under steady load, the hand-off's thread finds writes queued after every batch. A
    /// sweep waiting for the lock gets it between two batches: the thread let go of it and
    /// took it back before the sweeper woke, batch after batch, while requests kept coming.
    #[test]
    fn a_sweep_under_steady_load_takes_its_turn_between_two_batches() {
        let SweepWaiting {
            runtime,
            store,
            writes,
            second_batch,
            mut held,
            sweep,
            _dir,
        } = a_sweep_waiting_behind_the_hand_off();
        let writer = &store.inner.writer;
        // Whoever commits the third write waits before the flush.
        let third_batch = writer.gate().arm(HoldPoint::BeforeFlush);
        held.0.push(Arc::clone(&third_batch));
        second_batch.release();
        assert!(third_batch.wait_reached(1, PATIENCE));
        assert_eq!(
            writer.purge_steps(),
            1,
            "the third batch took the lock before the sweep that waited for it"
        );

        drop(held);
        assert!(matches!(sweep.join().unwrap(), Ok(Ok(0))));
        for write in writes {
            let answered = within(&runtime, write);
            assert!(matches!(answered, Ok(Ok(Ok(())))), "{answered:?}");
        }
        for nonce in ["n-1", "n-2", "n-3"] {
            assert!(acknowledged(&runtime, &store, nonce), "{nonce}");
        }
    }

    /// Books `nonce` on a current-thread runtime of a thread of its own: a request whose
    /// thread has no blocking pool to hand the leading to.
    fn book_on_a_thread_of_its_own(
        store: &SledStore,
        nonce: &'static str,
    ) -> std::thread::JoinHandle<Result<(), StoreError>> {
        let store = store.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(book(store, nonce))
        })
    }

    /// A sweep's step, on a thread of its own as the sweeper's; what it returned.
    fn sweep_on_a_thread_of_its_own(
        store: &SledStore,
    ) -> std::thread::JoinHandle<std::thread::Result<Result<usize, StoreError>>> {
        let sweeper = Arc::clone(&store.inner.writer);
        std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                sweeper.purge(ms_from_time(chrono::Utc::now()))
            }))
        })
    }

    /// A store on threads of its own (the sweeper's has no runtime) whose first write's batch
    /// waits before its flush, a sweep waiting for the lock ahead of the leaders, and a
    /// second write queued meanwhile, left to the sweep.
    struct SweepAhead {
        store: SledStore,
        /// Where the first write's batch waits.
        first_batch: Arc<HoldState>,
        held: Released,
        first: std::thread::JoinHandle<Result<(), StoreError>>,
        sweep: std::thread::JoinHandle<std::thread::Result<Result<usize, StoreError>>>,
        second: std::thread::JoinHandle<Result<(), StoreError>>,
        _dir: tempfile::TempDir,
    }

    fn a_sweep_ahead_of_a_queued_write() -> SweepAhead {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let writer = &store.inner.writer;
        let first_batch = writer.gate().arm(HoldPoint::BeforeFlush);
        let held = Released(vec![Arc::clone(&first_batch)]);
        let first = book_on_a_thread_of_its_own(&store, "n-1");
        assert!(first_batch.wait_reached(1, PATIENCE));
        let sweep = sweep_on_a_thread_of_its_own(&store);
        wait_until(
            || writer.waiting_ahead() == 1,
            "the sweep never waited for the lock",
        );
        // Left to the sweep: its request does not lead while the sweep waits.
        let second = book_on_a_thread_of_its_own(&store, "n-2");
        wait_until(|| writer.queued() > 0, "the second write never queued");
        SweepAhead {
            store,
            first_batch,
            held,
            first,
            sweep,
            second,
            _dir: dir,
        }
    }

    /// The writes queued while a sweep waited for the lock are left to the sweeper, which
    /// commits one batch and hands the rest to a thread of its own — it has no blocking pool
    /// to hand them to — instead of leading for as long as requests keep coming, its sweep
    /// waiting meanwhile.
    #[test]
    fn a_sweeper_leads_one_batch_and_hands_the_rest_to_a_thread_of_its_own() {
        let SweepAhead {
            store,
            first_batch,
            mut held,
            first,
            sweep,
            second,
            _dir,
        } = a_sweep_ahead_of_a_queued_write();
        let writer = &store.inner.writer;
        let second_batch = writer.gate().arm(HoldPoint::BeforeFlush);
        held.0.push(Arc::clone(&second_batch));
        first_batch.release();
        // The sweeper commits the second write; a third queues behind it.
        assert!(second_batch.wait_reached(1, PATIENCE));
        assert!(!sweep.is_finished() && !writer.handed_off());
        let third = book_on_a_thread_of_its_own(&store, "n-3");
        wait_until(|| writer.queued() > 0, "the third write never queued");
        let third_batch = writer.gate().arm(HoldPoint::BeforeFlush);
        held.0.push(Arc::clone(&third_batch));
        second_batch.release();
        assert!(third_batch.wait_reached(1, PATIENCE));
        wait_until(
            || sweep.is_finished(),
            "the sweep did not end while another thread committed the third batch",
        );
        assert!(matches!(sweep.join().unwrap(), Ok(Ok(0))));

        drop(held);
        for write in [first, second, third] {
            assert!(matches!(write.join().unwrap(), Ok(())));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for nonce in ["n-1", "n-2", "n-3"] {
            assert!(acknowledged(&runtime, &store, nonce), "{nonce}");
        }
    }

    /// The hand-off's thread gives the leading up to a sweep that waits for the lock; should
    /// the sweep's step be done before the thread has given it up — it found the leading
    /// still taken, and left the queue to that thread — a write queued meanwhile is
    /// committed all the same: it waited for a leader until the next request came.
    #[test]
    fn a_write_queued_while_the_hand_off_yields_to_a_sweep_is_committed() {
        let SweepWaiting {
            runtime,
            store,
            writes,
            second_batch,
            mut held,
            sweep,
            _dir,
        } = a_sweep_waiting_behind_the_hand_off();
        let writer = &store.inner.writer;
        // The thread stops as it gives the leading up; the sweep meanwhile takes the lock,
        // is done, and finds the leading still taken.
        let yielding = writer.gate().arm(HoldPoint::BeforeHandedYield);
        held.0.push(Arc::clone(&yielding));
        second_batch.release();
        assert!(yielding.wait_reached(1, PATIENCE));
        assert!(matches!(sweep.join().unwrap(), Ok(Ok(0))));
        assert!(writer.handed_off());
        assert_eq!(writer.queued(), 1, "the third write was committed before");

        drop(held);
        for write in writes {
            let answered = within(&runtime, write);
            assert!(matches!(answered, Ok(Ok(Ok(())))), "{answered:?}");
        }
        assert!(acknowledged(&runtime, &store, "n-3"));
    }

    /// A purge step that panics (only a bug of payhook's could) after waiting for the lock
    /// ahead of the leaders leaves no write behind: the write queued while it waited was
    /// left to it, and goes to a thread of its own.
    #[test]
    fn a_purge_step_that_panics_leaves_no_write_waiting() {
        let SweepAhead {
            store,
            held,
            first,
            sweep,
            second,
            _dir,
            ..
        } = a_sweep_ahead_of_a_queued_write();
        let writer = &store.inner.writer;
        let panicked = writer.gate().arm_panic(HoldPoint::InPurgeStep);

        drop(held);
        assert!(
            sweep.join().unwrap().is_err(),
            "the purge step did not panic"
        );
        assert!(panicked.wait_reached(1, PATIENCE));
        writer.gate().disarm();
        assert!(matches!(first.join().unwrap(), Ok(())));
        booked_by_another_leader(
            &store,
            second,
            "n-2",
            "the write left to the purge step that panicked was never committed",
        );
    }

    /// Waits for `write` of `nonce`, left to a thread that did not lead it, to be answered
    /// (panics saying `failure` otherwise), and checks it was booked.
    fn booked_by_another_leader(
        store: &SledStore,
        write: std::thread::JoinHandle<Result<(), StoreError>>,
        nonce: &str,
        failure: &str,
    ) {
        wait_until(|| write.is_finished(), failure);
        assert!(matches!(write.join().unwrap(), Ok(())));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(acknowledged(&runtime, store, nonce));
    }

    /// A durable read that panics (only a bug of payhook's could) while it holds the lock
    /// leaves no write behind: the write queued meanwhile, left to it, goes to a thread of
    /// its own (it waited for the next request to lead).
    #[test]
    fn a_durable_read_that_panics_leaves_no_write_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let writer = &store.inner.writer;
        let (holding, held) = std::sync::mpsc::channel();
        let (go_on, going_on) = std::sync::mpsc::channel::<()>();
        let reader = Arc::clone(writer);
        let read = std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                reader.read_durable(|| {
                    holding.send(()).unwrap();
                    let _ = going_on.recv();
                    panic!("a bug");
                })
            }))
        });
        held.recv_timeout(PATIENCE).unwrap();
        let write = book_on_a_thread_of_its_own(&store, "n-1");
        wait_until(|| writer.queued() > 0, "the write never queued");
        go_on.send(()).unwrap();
        assert!(read.join().unwrap().is_err(), "the read did not panic");
        booked_by_another_leader(
            &store,
            write,
            "n-1",
            "the write left to the read that panicked was never committed",
        );
    }

    /// A runtime that shuts down drops the blocking pool's tasks that have not started, the
    /// hand-off among them: the write it was to commit is committed all the same.
    #[test]
    fn a_write_handed_to_a_runtime_that_shut_down_is_committed_all_the_same() {
        let Queued {
            runtime,
            store,
            held,
            _dir,
            ..
        } = a_write_queued_behind_a_held_one();
        // The hand-off of the second write finds no pool to run on.
        runtime.shutdown_background();
        store.inner.writer.gate().disarm();
        drop(held);

        // Nothing else leads here (asking whether a nonce is booked would): the write leaves
        // the queue only if the dropped hand-off commits it.
        wait_until(
            || store.inner.writer.queued() == 0,
            "the second write was left in the queue",
        );
        let answer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(acknowledged(&answer, &store, "n-1"));
        assert!(acknowledged(&answer, &store, "n-2"));
    }

    /// A commit that panics (only a bug of payhook's could: effects' panics are caught where
    /// they run) after applying its batch to sled, before the flush: what it applied may not
    /// be durable. Its writer is answered with an error, the store stops as after a failed
    /// flush (nothing reports the batch as booked, new work is refused at once, not left
    /// waiting for a leader), and after a restart the write's retry is booked once.
    #[test]
    fn a_commit_that_panics_stops_the_store_and_its_write_is_booked_once_after_a_restart() {
        // The second write's batch, the hand-off's, panics once applied to sled.
        let (runtime, store, _dir) = the_hand_off_panics_at(HoldPoint::BeforeFlush);

        let status = TransactionStatus::Success;
        let asked = runtime.block_on(store.callback_acknowledged(&Nonce::from("n-2"), status));
        assert!(
            matches!(asked, Err(StoreError::Stopped)),
            "the unflushed write was reported {asked:?}"
        );
        let later = within(&runtime, runtime.spawn(book(store.clone(), "n-3")));
        assert!(
            matches!(later, Ok(Ok(Err(StoreError::Stopped)))),
            "a write after the panic: {later:?}"
        );

        // A restart: the retry of the write whose batch panicked is booked, once.
        drop(store);
        drop(runtime);
        let store = SledStore::open(&config_in(_dir.path()), &[]).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(acknowledged(&runtime, &store, "n-1"));
        let retried = runtime.block_on(async {
            let nonce = Nonce::from("n-2");
            match store.begin_callback(&nonce, status, PATIENCE).await? {
                CallbackBegin::Claimed { claim, .. } => {
                    store
                        .finish_callback(&nonce, claim, status, Effects::default())
                        .await
                }
                // The panicked batch reached the disk after all (sled flushes when closed).
                CallbackBegin::Duplicate => Ok(()),
                CallbackBegin::Busy => panic!("a claim outlived the restart"),
            }
        });
        assert!(matches!(retried, Ok(())), "the retry: {retried:?}");
        assert!(acknowledged(&runtime, &store, "n-2"));
        assert!(!acknowledged(&runtime, &store, "n-3"));
    }

    /// A panic on the hand-off's thread outside a commit (only a bug of payhook's could)
    /// commits nothing more: the write it was to commit is answered with an error instead of
    /// waiting for a leader that may never come, the leading comes back to the requests, and
    /// the store goes on — the write's retry is booked, once.
    #[test]
    fn a_hand_off_that_panics_between_batches_answers_the_writes_it_left_and_gives_the_leading_back()
     {
        // The hand-off's thread panics before it commits the second write's batch.
        let (runtime, store, _dir) = the_hand_off_panics_at(HoldPoint::BeforeHandedBatch);
        assert_eq!(store.inner.writer.queued(), 0);
        assert!(
            !store.inner.writer.handed_off(),
            "the leading did not come back"
        );

        // The store goes on: a new write leads its own commit, and the retry of the write
        // that was answered with an error is booked (its claim ended with the answer).
        let later = within(&runtime, runtime.spawn(book(store.clone(), "n-3")));
        assert!(
            matches!(later, Ok(Ok(Ok(())))),
            "a write after the panic: {later:?}"
        );
        assert!(!acknowledged(&runtime, &store, "n-2"));
        let retried = within(&runtime, runtime.spawn(book(store.clone(), "n-2")));
        assert!(matches!(retried, Ok(Ok(Ok(())))), "the retry: {retried:?}");
        assert!(acknowledged(&runtime, &store, "n-1"));
        assert!(acknowledged(&runtime, &store, "n-2"));
        assert!(acknowledged(&runtime, &store, "n-3"));
    }

    /// A record that does not decode stops a scan with an error that names it (its nonce,
    /// its validation id): names built only when one is needed, as they are now.
    #[test]
    fn a_scan_that_meets_a_corrupt_record_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let tree = &store.inner.tree;
        tree.insert(keys::failing("n-7").key, &b"not json"[..])
            .unwrap();
        tree.insert(
            keys::by_id(keys::POSTPONED_PREFIX, crate::model::ValidationId::new(-42)),
            &b"{"[..],
        )
        .unwrap();
        let named = |outcome: Result<usize, StoreError>| match outcome {
            Err(StoreError::Corrupt { key, .. }) => key,
            other => panic!("a corrupt record was read as {other:?}"),
        };
        assert_eq!(named(store.failing_callbacks_now().map(|f| f.len())), "n-7");
        let id = format!("{:?}", Some(crate::model::ValidationId::new(-42)));
        assert_eq!(named(store.postponed_all_now().map(|p| p.len())), id);
        assert_eq!(named(store.postponed_settled_now(10).map(|p| p.len())), id);
    }

    /// A postponed record that cannot be decoded is left out of what is due, and not read
    /// (nor logged) again for an hour, rather than on every pass of the outbox; the others
    /// are due as ever, and it is read again once the hour is over.
    #[test]
    fn an_unreadable_postponed_record_is_left_out_of_what_is_due_for_an_hour() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let tree = &store.inner.tree;
        let due_at = |id: i64, record: &[u8]| {
            let id = crate::model::ValidationId::new(id);
            tree.insert(keys::by_id(keys::POSTPONED_PREFIX, id), record)
                .unwrap();
            tree.insert(
                keys::by_id(keys::OUTBOX_PREFIX, id),
                &1_000u64.to_be_bytes(),
            )
            .unwrap();
        };
        let readable =
            |id| serde_json::to_vec(&PostponedValidation::pending_for_tests(id)).unwrap();
        due_at(21, b"{");
        due_at(22, &readable(22));
        let due_ids = |now_ms| -> Vec<i64> {
            let due = store.due(keys::OUTBOX_PREFIX, now_ms).unwrap();
            due.now.iter().map(|v| v.validation_id.get()).collect()
        };
        let met = 2_000;
        assert_eq!(due_ids(met), [22], "the other one is due");
        let hour = u64::try_from(super::super::UNREADABLE_LEFT_FOR.as_millis()).unwrap();
        assert_eq!(store.left_out_until(21.into()), Some(met + hour));
        // Repaired meanwhile (as a restart would find it): not read again within the hour.
        due_at(21, &readable(21));
        assert_eq!(due_ids(met + hour - 1), [22]);
        assert_eq!(due_ids(met + hour), [21, 22], "read again after the hour");
        assert_eq!(
            store.left_out_until(21.into()),
            None,
            "and no longer left out"
        );
    }

    /// `/metrics` reads the outbox's length and its oldest decision on every scrape: from
    /// the index alone, which holds each result's decision time; an entry written before it
    /// did has it read from the result's record.
    #[test]
    fn the_outbox_summary_is_read_from_its_index() {
        let (runtime, store, _dir) = on_two_threads();
        let tree = &store.inner.tree;
        let queued = |id: i64, decided_ms: u64| {
            let mut record = PostponedValidation::pending_for_tests(id);
            let _ = record.resolve(true, "ok".into(), None, time_from_ms(decided_ms));
            record
        };
        // Written by this version: the entry holds the decision time.
        let newer = queued(7, 5_000);
        let mut overlay = super::super::staging::Overlay::new();
        let mut staging = super::super::staging::Staging::new(tree, &mut overlay);
        super::super::postponed_records::put(&mut staging, &newer);
        for (key, value) in overlay {
            match value {
                Some(value) => tree.insert(key, value).unwrap(),
                None => tree.remove(key).unwrap(),
            };
        }
        let entry = tree
            .get(keys::by_id(keys::OUTBOX_PREFIX, 7.into()))
            .unwrap()
            .unwrap();
        assert_eq!(keys::decided_of(&entry), Some(5_000));
        // Written before: the next attempt alone, the decision in the record.
        let older = queued(8, 3_000);
        tree.insert(
            keys::by_id(keys::POSTPONED_PREFIX, older.validation_id),
            crate::store::record::encode(&older),
        )
        .unwrap();
        tree.insert(
            keys::by_id(keys::OUTBOX_PREFIX, 8.into()),
            &9_000u64.to_be_bytes(),
        )
        .unwrap();
        let summary = runtime.block_on(store.outbox_summary()).unwrap();
        assert_eq!(
            summary,
            crate::store::OutboxSummary {
                queued: 2,
                oldest_decided: Some(time_from_ms(3_000)),
            }
        );
        // Its record no longer needed for it: a damaged one is counted, its age unknown.
        tree.insert(keys::by_id(keys::POSTPONED_PREFIX, 7.into()), &b"{"[..])
            .unwrap();
        tree.remove(keys::by_id(keys::OUTBOX_PREFIX, 8.into()))
            .unwrap();
        let summary = runtime.block_on(store.outbox_summary()).unwrap();
        assert_eq!(
            (summary.queued, summary.oldest_decided),
            (1, Some(time_from_ms(5_000)))
        );
        // What is due reads the entry's first time: its next attempt.
        let Some(Delivery::Queued { next_attempt, .. }) = newer.result.map(|r| r.delivery) else {
            panic!("not queued");
        };
        assert_eq!(keys::millis_of(&entry), ms_from_time(next_attempt));
    }

    /// A pass takes at most a batch of what is due, read under the writer lock every commit
    /// waits for; the rest are due at once, for the next pass.
    #[test]
    fn what_is_due_is_read_a_batch_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let tree = &store.inner.tree;
        let due_count = super::super::DUE_BATCH + 10;
        for id in 1..=i64::try_from(due_count).unwrap() {
            let id = crate::model::ValidationId::new(id);
            let record = PostponedValidation::pending_for_tests(id.get());
            tree.insert(
                keys::by_id(keys::POSTPONED_PREFIX, id),
                serde_json::to_vec(&record).unwrap(),
            )
            .unwrap();
            tree.insert(
                keys::by_id(keys::OUTBOX_PREFIX, id),
                &1_000u64.to_be_bytes(),
            )
            .unwrap();
        }
        let due = store.due(keys::OUTBOX_PREFIX, 2_000).unwrap();
        assert_eq!(due.now.len(), super::super::DUE_BATCH);
        assert_eq!(
            due.next,
            Some(time_from_ms(1_000)),
            "the rest are due already"
        );
    }

    /// `/metrics` reads the failing pairs' count on every scrape, so it is counted once at
    /// open and kept since, never scanned per scrape: it follows each failure recorded, each
    /// booking and each purge, and a reopen counts the same (a record that does not decode
    /// counts none, and does not stop the store from opening). The keys that list the
    /// records by time follow them alike, and a store without them gets them at open.
    #[test]
    fn the_failing_count_and_keys_by_time_follow_failures_bookings_purges_and_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Each failure at its own millisecond, so that each one moves its record's key.
        let base = chrono::Utc::now();
        let failure = |nonce: &str, status, seconds_ago| CallbackFailure {
            at: base - chrono::Duration::seconds(seconds_ago),
            ..failure(nonce, status)
        };
        // Each failing record is listed by time once at each millisecond one of its pairs
        // last failed, and nothing else is.
        let counted = |store: &SledStore| {
            let count = runtime.block_on(store.failing_count()).unwrap();
            let listed = store.failing_callbacks_now().unwrap();
            assert_eq!(count, listed.len(), "the count is not what is listed");
            let mut expected: Vec<Vec<u8>> = listed
                .iter()
                .map(|f| {
                    let identifier = keys::failing(&f.nonce).identifier().to_vec();
                    let time = u64::try_from(f.last_failed.timestamp_millis()).unwrap();
                    keys::failing_by_time(time, &identifier)
                })
                .collect();
            expected.sort();
            expected.dedup();
            let by_time: Vec<Vec<u8>> = store
                .inner
                .tree
                .scan_prefix(keys::FAILING_BY_TIME_PREFIX)
                .keys()
                .map(|key| key.unwrap().to_vec())
                .collect();
            assert_eq!(by_time, expected, "failing pairs and their keys by time");
            count
        };
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        assert_eq!(counted(&store), 0);
        for (nonce, status, seconds_ago) in [
            ("n-1", TransactionStatus::Pending, 50),
            ("n-1", TransactionStatus::Success, 40),
            ("n-2", TransactionStatus::Success, 30),
            // Counted again, not a pair more; the record's key moves to its new time.
            ("n-2", TransactionStatus::Success, 20),
        ] {
            runtime
                .block_on(store.record_callback_failure(failure(nonce, status, seconds_ago)))
                .unwrap();
        }
        assert_eq!(counted(&store), 3);
        // n-1's latest failure is booked: its key at that time goes, its other status's stays.
        runtime.block_on(book(store.clone(), "n-1")).unwrap();
        assert_eq!(counted(&store), 2);
        // A late copy's failure of the booked status is not a pair.
        runtime
            .block_on(store.record_callback_failure(failure("n-1", TransactionStatus::Success, 10)))
            .unwrap();
        assert_eq!(counted(&store), 2);
        let latest = |store: &SledStore| {
            runtime
                .block_on(store.failing_latest(10))
                .unwrap()
                .iter()
                .map(|f| (f.nonce.as_str().to_owned(), f.status))
                .collect::<Vec<_>>()
        };
        let listed = vec![("n-2".to_owned(), 4), ("n-1".to_owned(), 3)];
        assert_eq!(latest(&store), listed);
        // A store written before the keys by time (or before a record's every pair had
        // one): its records are listed at open. Keys by time left by a build before them (a
        // rollback, then the upgrade again) go.
        let tree = &store.inner.tree;
        let by_time: Vec<_> = tree
            .scan_prefix(keys::FAILING_BY_TIME_PREFIX)
            .keys()
            .collect::<Result<_, _>>()
            .unwrap();
        for key in by_time {
            tree.remove(key).unwrap();
        }
        let identifier = keys::failing("n-1").identifier().to_vec();
        for (time, identifier) in [(7, &identifier), (8, &b"n-gone".to_vec())] {
            tree.insert(keys::failing_by_time(time, identifier), &b""[..])
                .unwrap();
        }
        assert!(latest(&store).is_empty());
        drop(store);

        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        assert_eq!(counted(&store), 2);
        assert_eq!(latest(&store), listed);
        let after_retention = chrono::Utc::now() + StoreConfig::default().retention * 2;
        assert!(
            runtime
                .block_on(store.purge_expired(after_retention))
                .unwrap()
                > 0
        );
        assert_eq!(counted(&store), 0);
        runtime
            .block_on(store.record_callback_failure(failure("n-3", TransactionStatus::Success, 0)))
            .unwrap();
        store
            .inner
            .tree
            .insert(keys::failing("n-7").key, &b"not json"[..])
            .unwrap();
        drop(store);

        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        assert_eq!(runtime.block_on(store.failing_count()).unwrap(), 1);
    }

    /// A failing record that a store written before long nonces were digested kept under
    /// the nonce spelled out: booking one of its statuses moves the rest to the digested
    /// key, and the purge still finds it there when it expires.
    #[test]
    fn a_failing_record_of_a_long_nonce_moved_by_a_booking_is_still_purged() {
        const LONG: &str =
            "n-0123456789012345678901234567890123456789012345678901234567890123456789";
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let key = keys::failing(LONG);
        let older = key
            .spelled_out
            .clone()
            .expect("a long nonce has an older key");
        let expires_ms = now_ms() + 1000;
        let now = chrono::Utc::now();
        let pair = |status| FailingCallback {
            nonce: LONG.into(),
            status,
            failures: 1,
            first_failed: now,
            last_failed: now,
            last_reason: "handler failed".into(),
            transaction_reference_id: uuid::Uuid::nil().to_string(),
            client_id: "c-1".into(),
            amount: "10.50".into(),
            currency: "EUR".into(),
        };
        let record = FailureRecord {
            failing: vec![pair(4), pair(3)],
            expires_ms,
        };
        let tree = &store.inner.tree;
        tree.insert(&older, super::super::record::encode(&record))
            .unwrap();
        tree.insert(
            keys::expiry(expires_ms, 1),
            keys::encode_index(&[(keys::TAG_FAILING, LONG.as_bytes().to_vec())]),
        )
        .unwrap();
        drop(store);

        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        assert_eq!(runtime.block_on(store.failing_count()).unwrap(), 2);
        runtime.block_on(book(store.clone(), LONG)).unwrap();
        assert_eq!(runtime.block_on(store.failing_count()).unwrap(), 1);
        let tree = &store.inner.tree;
        assert!(
            tree.get(&older).unwrap().is_none(),
            "moved from the older key"
        );
        assert!(
            tree.get(&key.key).unwrap().is_some(),
            "moved to the new key"
        );

        let after_retention = chrono::Utc::now() + StoreConfig::default().retention * 2;
        runtime
            .block_on(store.purge_expired(after_retention))
            .unwrap();
        assert_eq!(runtime.block_on(store.failing_count()).unwrap(), 0);
        assert_eq!(tree.scan_prefix(keys::FAILING_PREFIX).count(), 0);
        assert_eq!(tree.scan_prefix(keys::FAILING_BY_TIME_PREFIX).count(), 0);
    }

    /// A failure of `nonce`'s `status`, now.
    fn failure(nonce: &str, status: TransactionStatus) -> CallbackFailure {
        CallbackFailure {
            nonce: nonce.into(),
            status,
            reason: "handler failed".into(),
            transaction_reference_id: uuid::Uuid::nil(),
            client_id: "c-1".into(),
            amount: rust_decimal::Decimal::new(1050, 2),
            currency: "EUR".into(),
            at: chrono::Utc::now(),
        }
    }

    /// Scenario F's store (`bench_callbacks`) measures B's path on an engine that costs
    /// nothing: each batch is made durable in its file, and sled is left alone.
    #[test]
    fn a_benchmark_store_that_only_appends_syncs_each_batch_into_its_file_and_writes_no_sled() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_in(dir.path());
        let store =
            SledStore::open_for_benchmarks(&config, &[], BenchmarkStore::AppendsOnly).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(book(store.clone(), "n-1")).unwrap();
        let appended = std::fs::read(dir.path().join("appended.bench")).unwrap();
        let record = keys::callback("n-1").key;
        assert!(
            appended.windows(record.len()).any(|w| w == record),
            "the batch's record is not in the file"
        );
        assert!(
            store.inner.tree.get(&record).unwrap().is_none(),
            "the record was written to sled"
        );
    }

    /// One postponed record that cannot be decoded is left out of what is due; the others
    /// are still delivered (an error would fail every pass of the outbox before any post).
    #[test]
    fn a_damaged_postponed_record_keeps_no_other_result_from_delivery() {
        let (runtime, store, _dir) = on_two_threads();
        let tree = &store.inner.tree;
        let due_at = 1_000u64.to_be_bytes();
        let damaged = ValidationId::from(5);
        tree.insert(
            keys::by_id(keys::POSTPONED_PREFIX, damaged),
            &b"{not json"[..],
        )
        .unwrap();
        tree.insert(keys::by_id(keys::OUTBOX_PREFIX, damaged), &due_at[..])
            .unwrap();
        tree.insert(keys::by_id(keys::WAITING_PREFIX, damaged), &due_at[..])
            .unwrap();
        let mut sound = PostponedValidation::pending_for_tests(6);
        let _ = sound.resolve(true, "ok".into(), None, time_from_ms(500));
        tree.insert(
            keys::by_id(keys::POSTPONED_PREFIX, sound.validation_id),
            crate::store::record::encode(&sound),
        )
        .unwrap();
        tree.insert(
            keys::by_id(keys::OUTBOX_PREFIX, sound.validation_id),
            &due_at[..],
        )
        .unwrap();
        let now = time_from_ms(2_000);
        let due = runtime.block_on(store.outbox_due(now)).unwrap();
        let ids: Vec<i64> = due.now.iter().map(|r| r.validation_id.get()).collect();
        assert_eq!(ids, [6]);
        let deadlines = runtime.block_on(store.deadlines_due(now)).unwrap();
        assert!(deadlines.now.is_empty());
    }

    /// While another status of a nonce is being booked (a reversal whose handler is slow), a
    /// retry of a status booked before is a duplicate: answered 200 at once, not 503 for as
    /// long as the other handler runs. A retry of the status being booked is busy.
    #[test]
    fn a_status_booked_before_is_a_duplicate_while_another_of_its_nonce_is_being_booked() {
        let (runtime, store, _dir) = on_two_threads();
        book_with(&runtime, &store, "n-1", Effects::default()).unwrap();
        let nonce = Nonce::from("n-1");
        let begin = |status| {
            runtime
                .block_on(store.begin_callback(&nonce, status, PATIENCE))
                .unwrap()
        };
        let CallbackBegin::Claimed { claim, .. } = begin(TransactionStatus::Cancelled) else {
            panic!("the reversal was not claimed");
        };
        assert_eq!(begin(TransactionStatus::Success), CallbackBegin::Duplicate);
        assert_eq!(begin(TransactionStatus::Cancelled), CallbackBegin::Busy);
        assert_eq!(begin(TransactionStatus::NetworkError), CallbackBegin::Busy);
        runtime
            .block_on(store.finish_callback(
                &nonce,
                claim,
                TransactionStatus::Cancelled,
                Effects::default(),
            ))
            .unwrap();
        assert_eq!(
            begin(TransactionStatus::Cancelled),
            CallbackBegin::Duplicate
        );
    }

    /// Claims `nonce` and books it with `effects`; the commit's outcome.
    fn book_with(
        runtime: &Runtime,
        store: &SledStore,
        nonce: &str,
        effects: Effects,
    ) -> Result<(), StoreError> {
        let nonce = Nonce::from(nonce);
        let status = TransactionStatus::Success;
        runtime.block_on(async {
            let CallbackBegin::Claimed { claim, .. } =
                store.begin_callback(&nonce, status, PATIENCE).await?
            else {
                panic!("{nonce:?} was not claimed");
            };
            store.finish_callback(&nonce, claim, status, effects).await
        })
    }

    /// Effects that add 1 to `counter` in `tree`, reading it first the way a careless
    /// effect might: a failed read taken for an absent key.
    fn counting(tree: &Tree) -> Effects {
        let effects = Effects::default();
        let tree = tree.clone();
        effects.write(move |tx| {
            let count = tx
                .get(&tree, b"counter")
                .ok()
                .flatten()
                .map_or(0, |bytes| bytes[0]);
            tx.insert(&tree, b"counter", &[count + 1])
        });
        effects
    }

    /// A store in a new directory with one effect tree, `ledger`, on a current-thread
    /// runtime.
    fn with_a_ledger() -> (tempfile::TempDir, SledStore, Tree, Runtime) {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &["ledger"]).unwrap();
        let ledger = store.tree("ledger").unwrap();
        (dir, store, ledger, current_thread())
    }

    fn current_thread() -> Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A claim taken before the store failed (a batch's flush failed meanwhile) commits
    /// nothing: what that flush left unwritten may be lost with what would follow it.
    #[test]
    fn a_claim_taken_before_the_store_failed_books_nothing() {
        let (_dir, store, ledger, runtime) = with_a_ledger();
        let nonce = Nonce::from("n-1");
        let status = TransactionStatus::Success;
        let CallbackBegin::Claimed { claim, .. } = runtime
            .block_on(store.begin_callback(&nonce, status, PATIENCE))
            .unwrap()
        else {
            panic!("not claimed");
        };
        store.mark_failed_for_tests();
        let finished =
            runtime.block_on(store.finish_callback(&nonce, claim, status, counting(&ledger)));
        assert!(matches!(finished, Err(StoreError::Stopped)), "{finished:?}");
        assert_eq!(store.record_count(), 0);
        assert_eq!(store.get(&ledger, b"counter").unwrap(), None);
        let again = runtime.block_on(store.begin_callback(&nonce, status, PATIENCE));
        assert!(matches!(again, Err(StoreError::Stopped)), "{again:?}");
    }

    /// An effect that swallows a failed read (and would book a balance from nothing) fails
    /// its callback all the same; the callback leaves nothing in the batch, and the next
    /// delivery books it once.
    #[test]
    fn an_effect_that_swallows_a_failed_read_books_nothing() {
        let (_dir, store, ledger, runtime) = with_a_ledger();
        book_with(&runtime, &store, "n-0", counting(&ledger)).unwrap();
        let key = ledger.key(b"counter");
        super::super::staging::lock(&super::super::committer::FAILING_READS).push(key.clone());
        let failed = book_with(&runtime, &store, "n-1", counting(&ledger));
        super::super::staging::lock(&super::super::committer::FAILING_READS).retain(|k| *k != key);
        assert!(
            matches!(failed, Err(StoreError::Backend { .. })),
            "{failed:?}"
        );
        assert_eq!(store.get(&ledger, b"counter").unwrap(), Some(vec![1]));
        assert!(!acknowledged(&runtime, &store, "n-1"));
        book_with(&runtime, &store, "n-1", counting(&ledger)).unwrap();
        assert_eq!(store.get(&ledger, b"counter").unwrap(), Some(vec![2]));
        assert!(acknowledged(&runtime, &store, "n-1"));
    }

    /// A failing callback's record that does not decode (listed among the failing by
    /// operators only) keeps no callback from being booked: it is let go as the callback is
    /// booked, and the callback's effects are applied once.
    #[test]
    fn a_failing_record_that_does_not_decode_keeps_no_callback_from_being_booked() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_in(dir.path());
        let failing = keys::failing("n-1").key;
        {
            let store = SledStore::open(&config, &["ledger"]).unwrap();
            store
                .inner
                .tree
                .insert(&failing, b"not json".as_slice())
                .unwrap();
            store.inner.tree.flush().unwrap();
        }
        let store = SledStore::open(&config, &["ledger"]).unwrap();
        let ledger = store.tree("ledger").unwrap();
        let runtime = current_thread();
        book_with(&runtime, &store, "n-1", counting(&ledger)).unwrap();
        assert!(acknowledged(&runtime, &store, "n-1"));
        assert_eq!(store.get(&ledger, b"counter").unwrap(), Some(vec![1]));
        assert_eq!(store.inner.tree.get(&failing).unwrap(), None);
        let again = runtime
            .block_on(store.begin_callback(
                &Nonce::from("n-1"),
                TransactionStatus::Success,
                PATIENCE,
            ))
            .unwrap();
        assert_eq!(again, CallbackBegin::Duplicate);
    }

    #[test]
    fn a_record_that_does_not_decode_is_kept_and_stops_no_purge() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let runtime = current_thread();
        for nonce in ["n-1", "n-2"] {
            book_with(&runtime, &store, nonce, Effects::default()).unwrap();
        }
        // n-1's record damaged (or written by a newer payhook) before it expires.
        let damaged = keys::callback("n-1").key;
        store
            .inner
            .tree
            .insert(&damaged, b"not json".as_slice())
            .unwrap();
        let after_retention = Utc::now() + chrono::TimeDelta::days(3650);
        let purged = runtime
            .block_on(store.purge_expired(after_retention))
            .unwrap();
        assert_eq!(purged, 1, "n-2 purged past n-1");
        assert!(!acknowledged(&runtime, &store, "n-2"));
        assert_eq!(
            store.inner.tree.get(&damaged).unwrap().as_deref(),
            Some(b"not json".as_slice()),
            "kept for a person to look at"
        );
    }

    /// A value larger than a quarter of sled's segment goes to a blob file of its own, which
    /// sled syncs nowhere: the commit that wrote it syncs it before it is acknowledged.
    #[test]
    fn a_large_effect_s_blob_is_synced_before_its_callback_is_acknowledged() {
        let (dir, store, ledger, runtime) = with_a_ledger();
        let effects = Effects::default();
        let tree = ledger.clone();
        effects.write(move |tx| tx.insert(&tree, b"statement", &vec![7; 200 * 1024]));
        book_with(&runtime, &store, "n-1", effects).unwrap();
        let blobs = std::fs::read_dir(dir.path().join("blobs"))
            .map(Iterator::count)
            .unwrap_or(0);
        assert!(
            blobs > 0,
            "sled wrote no blob: the test no longer tests anything"
        );
        assert_eq!(store.inner.writer.blobs().synced(), blobs);
    }

    /// A configuration that names PostgreSQL is not opened as sled: a service built from
    /// the quick start, given `PAYHOOK_STORE_URL`, would otherwise keep a directory of its
    /// own on each instance, silently.
    #[test]
    fn a_configuration_naming_postgres_is_not_opened_as_sled() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            url: Some("postgres://payhook@db.internal/payments".into()),
            ..config_in(dir.path())
        };
        let error = SledStore::open(&config, &[]).unwrap_err().to_string();
        assert!(error.contains("ConfiguredStore::open"), "{error}");
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "nothing written"
        );
    }

    /// A sweep whose writing out fails (here a blob file that cannot be synced) stops the
    /// store as a commit's failure does: a later sync could succeed without writing what
    /// this one left unwritten, and a commit would be acknowledged on top of it.
    #[test]
    fn a_purge_that_cannot_be_made_durable_stops_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let runtime = current_thread();
        book_with(&runtime, &store, "n-1", Effects::default()).unwrap();
        let blob_dir = dir.path().join("blobs");
        std::fs::create_dir_all(&blob_dir).unwrap();
        std::os::unix::fs::symlink("9", blob_dir.join("9")).unwrap();
        let after_retention = Utc::now() + chrono::TimeDelta::days(3650);
        let purged = runtime.block_on(store.purge_expired(after_retention));
        assert!(purged.is_err(), "{purged:?}");
        assert!(store.failed(), "the store goes on after a failed purge");
        std::fs::remove_file(blob_dir.join("9")).unwrap();
        let next = book_with(&runtime, &store, "n-2", Effects::default());
        assert!(matches!(next, Err(StoreError::Stopped)), "{next:?}");
    }

    /// Lets every held commit go when dropped, a failed assertion's unwinding included (the
    /// runtime's drop waits for them).
    struct Released(Vec<Arc<HoldState>>);

    impl Drop for Released {
        fn drop(&mut self) {
            for held in &self.0 {
                held.release();
            }
        }
    }

    /// A runtime of two worker threads, and a new store in a directory of its own.
    fn on_two_threads() -> (Runtime, SledStore, tempfile::TempDir) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        (runtime, store, dir)
    }

    /// A service keeps its store 90 days; an operator's command opens the stopped store
    /// with 30 (its shell lacked the service's setting) and books a transaction. That
    /// booking's record outlives the 30 days: the service vouches for 90, and a retry of
    /// the transaction on day 40 must find it. It expired with the command's 30.
    #[test]
    fn an_operators_booking_is_kept_as_long_as_the_service_vouches_for() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let days = |n: u64| Duration::from_secs(n * 24 * 3600);
        let mut config = config_in(dir.path());
        config.retention = days(90);
        drop(SledStore::open(&config, &[]).unwrap());

        config.retention = days(30);
        let store = SledStore::open_for_operator(&config, &[]).unwrap();
        assert_eq!(store.retention(), days(90));
        runtime.block_on(book(store.clone(), "n-1")).unwrap();
        let day_40 = Utc::now() + chrono::TimeDelta::days(40);
        runtime.block_on(store.purge_expired(day_40)).unwrap();
        let nonce = Nonce::from("n-1");
        assert!(
            store
                .callback_acknowledged_now(&nonce, TransactionStatus::Success)
                .unwrap(),
            "the operator's booking expired before the service stopped vouching for it"
        );
        let day_91 = Utc::now() + chrono::TimeDelta::days(91);
        runtime.block_on(store.purge_expired(day_91)).unwrap();
        assert!(
            !store
                .callback_acknowledged_now(&nonce, TransactionStatus::Success)
                .unwrap()
        );
    }

    /// How many times [`stepped_forward`] was read.
    static STEPPED_READINGS: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// The wall clock, stepped 40 days forward after its first reading (a clock an
    /// operator or a VM's first NTP sync moved while the service ran).
    fn stepped_forward() -> u64 {
        stepped_after_the_first(&STEPPED_READINGS)
    }

    /// The wall clock, right at its first reading (counted in `readings`), 40 days ahead
    /// from the second on.
    fn stepped_after_the_first(readings: &std::sync::atomic::AtomicUsize) -> u64 {
        let earlier = readings.fetch_add(1, Ordering::SeqCst);
        now_ms() + if earlier == 0 { 0 } else { 40 * DAY_MS }
    }

    /// The wall clock, 40 days ahead, counted in `readings`.
    fn forty_days_ahead(readings: &std::sync::atomic::AtomicUsize) -> u64 {
        readings.fetch_add(1, Ordering::SeqCst);
        now_ms() + 40 * DAY_MS
    }

    /// A booking of a store kept 30 days, swept by a clock stepped 40 days forward: kept.
    /// The sweep purged it by the clock, and the store then vouched for 30 days it no
    /// longer held.
    #[test]
    fn a_clock_stepped_forward_purges_nothing_early() {
        assert!(
            kept_when_swept_by(stepped_forward, &STEPPED_READINGS),
            "a sweep purged by a clock stepped forward"
        );
    }

    /// How many times [`ahead_from_the_start`] was read.
    static AHEAD_READINGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// The wall clock, 40 days ahead from its first reading on (a VM that booted with a
    /// wrong clock, before NTP set it right).
    fn ahead_from_the_start() -> u64 {
        forty_days_ahead(&AHEAD_READINGS)
    }

    /// A booking of a store kept 30 days, swept by a clock already 40 days ahead when the
    /// sweeper starts: kept, the sweep held back to the store's last commit. Read from the
    /// start, the clock purged it.
    #[test]
    fn a_clock_ahead_at_start_purges_nothing_early() {
        assert!(
            kept_when_swept_by(ahead_from_the_start, &AHEAD_READINGS),
            "a sweep purged by a clock ahead at start"
        );
    }

    /// How many times [`stepped_while_running`] was read.
    static STEPPED_WHILE_RUNNING_READINGS: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// [`stepped_forward`], read by one test alone.
    fn stepped_while_running() -> u64 {
        stepped_after_the_first(&STEPPED_WHILE_RUNNING_READINGS)
    }

    /// How many times [`still_ahead_at_restart`] was read.
    static STILL_AHEAD_READINGS: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// The wall clock 40 days ahead, as a restart finds it before NTP set it right.
    fn still_ahead_at_restart() -> u64 {
        forty_days_ahead(&STILL_AHEAD_READINGS)
    }

    const DAY_MS: u64 = 24 * 3_600_000;

    /// The hole a kept step closes, end to end. A clock stepped 40 days forward while the
    /// store runs is caught by a sweep and kept; the store books by the stepped clock and
    /// restarts, the clock still ahead. Its newest write reads as recent by that clock:
    /// without the step kept, the restarted sweeper purges by it, and a booking made before
    /// the step, within its 30 days, is gone (a retry of it would be booked again) — shown
    /// last, the step dropped.
    #[test]
    fn a_step_caught_before_a_restart_holds_the_restarted_sweeper_back() {
        let (runtime, store, dir) = on_two_threads();
        runtime.block_on(book(store.clone(), "n-1")).unwrap();
        swept_while(
            &store,
            (stepped_while_running, &STEPPED_WHILE_RUNNING_READINGS),
            || {
                let commits = store.inner.writer.gate();
                commits.step_clock(Duration::from_millis(40 * DAY_MS));
                runtime.block_on(book(store.clone(), "n-2")).unwrap();
            },
        );
        drop(store);
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let step = store.inner.writer.kept_step().expect("the step is kept");
        let days_39 = Duration::from_millis(39 * DAY_MS);
        assert!(
            (days_39..=days_39 + Duration::from_millis(2 * DAY_MS)).contains(&step.lead()),
            "{step:?}"
        );
        assert_restart_kept_both(
            &runtime,
            &store,
            (still_ahead_at_restart, &STILL_AHEAD_READINGS),
        );
        store.inner.writer.keep_step(None).unwrap();
        swept_while(
            &store,
            (still_ahead_at_restart, &STILL_AHEAD_READINGS),
            || {},
        );
        assert!(
            !acknowledged(&runtime, &store, "n-1"),
            "without the step kept, the stepped clock purges what it holds back"
        );
        assert!(acknowledged(&runtime, &store, "n-2"));
    }

    /// How far ahead [`stepped_with_the_commits`] reads the wall clock.
    static COMMITS_STEP_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    /// How many times [`stepped_with_the_commits`] was read.
    static STEPPED_WITH_THE_COMMITS_READINGS: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// The wall clock, stepped as far as the commits' clock is ([`COMMITS_STEP_MS`]); read
    /// by one test alone.
    fn stepped_with_the_commits() -> u64 {
        STEPPED_WITH_THE_COMMITS_READINGS.fetch_add(1, Ordering::SeqCst);
        now_ms() + COMMITS_STEP_MS.load(Ordering::SeqCst)
    }

    /// How many times [`ahead_after_the_crash`] was read.
    static AHEAD_AFTER_THE_CRASH_READINGS: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// [`still_ahead_at_restart`], read by one test alone.
    fn ahead_after_the_crash() -> u64 {
        forty_days_ahead(&AHEAD_AFTER_THE_CRASH_READINGS)
    }

    /// The crash window between two sweeps, closed. A clock stepped 40 days forward while
    /// the store runs, its sweeper an hour from its next sweep: the first booking by the
    /// stepped clock keeps the step in its own batch, before any sweep saw it. A crash
    /// right after (nothing more read the clock) restarts with the step kept, and the
    /// restarted sweeper keeps a booking made before the step, within its 30 days. Kept
    /// by the sweeps alone, the step was not in the store until the next sweep.
    #[test]
    fn a_booking_by_a_stepped_clock_keeps_the_step_before_any_sweep() {
        let (runtime, store, dir) = on_two_threads();
        runtime.block_on(book(store.clone(), "n-1")).unwrap();
        let sweeper = Sweeper::start_with(
            Arc::clone(&store.inner.writer),
            Duration::from_secs(3600),
            stepped_with_the_commits,
        )
        .unwrap();
        let ahead = Duration::from_millis(40 * DAY_MS);
        COMMITS_STEP_MS.store(40 * DAY_MS, Ordering::SeqCst);
        store.inner.writer.gate().step_clock(ahead);
        assert_eq!(store.inner.writer.kept_step(), None);
        runtime.block_on(book(store.clone(), "n-2")).unwrap();
        assert_eq!(
            STEPPED_WITH_THE_COMMITS_READINGS.load(Ordering::SeqCst),
            1,
            "the sweeper read the clock after its start"
        );
        let step = store
            .inner
            .writer
            .kept_step()
            .expect("the booking by the stepped clock kept the step");
        let day = Duration::from_millis(DAY_MS);
        assert!(
            (ahead - day..=ahead + day).contains(&step.lead()),
            "{step:?}"
        );
        drop(sweeper);
        assert_eq!(
            store.inner.writer.kept_step(),
            Some(step),
            "unchanged as it stopped"
        );
        drop(store);
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        assert_eq!(store.inner.writer.kept_step(), Some(step));
        assert_restart_kept_both(
            &runtime,
            &store,
            (ahead_after_the_crash, &AHEAD_AFTER_THE_CRASH_READINGS),
        );
    }

    /// A store started again, its sweeper reading the wall clock through `wall_ms`
    /// (counted in `readings`), still acknowledges the booking made before the step
    /// (`n-1`) and the one made by the stepped clock (`n-2`) once it swept a few times.
    fn assert_restart_kept_both(
        runtime: &tokio::runtime::Runtime,
        store: &SledStore,
        clock: (fn() -> u64, &std::sync::atomic::AtomicUsize),
    ) {
        swept_while(store, clock, || {});
        assert!(
            acknowledged(runtime, store, "n-1"),
            "the restarted sweeper purged by the stepped clock"
        );
        assert!(acknowledged(runtime, store, "n-2"));
    }

    /// Whether a booking of a store kept 30 days (the default) is still acknowledged after
    /// a sweeper reading the wall clock through `wall_ms` (counted in `readings`) swept a
    /// few times.
    fn kept_when_swept_by(wall_ms: fn() -> u64, readings: &std::sync::atomic::AtomicUsize) -> bool {
        let (runtime, store, _dir) = on_two_threads();
        runtime.block_on(book(store.clone(), "n-1")).unwrap();
        swept_while(&store, (wall_ms, readings), || {});
        acknowledged(&runtime, &store, "n-1")
    }

    /// Runs a sweeper of `store` every 5 ms, reading the wall clock through the function
    /// given (its readings counted beside it), doing `meanwhile` once it started, until it
    /// swept a few times; then stops it.
    fn swept_while(
        store: &SledStore,
        (wall_ms, readings): (fn() -> u64, &std::sync::atomic::AtomicUsize),
        meanwhile: impl FnOnce(),
    ) {
        let before = readings.load(Ordering::SeqCst);
        let sweeper = Sweeper::start_with(
            Arc::clone(&store.inner.writer),
            Duration::from_millis(5),
            wall_ms,
        )
        .unwrap();
        meanwhile();
        wait_until(
            || readings.load(Ordering::SeqCst) >= before + 4,
            "the sweeper never swept",
        );
        drop(sweeper);
    }

    /// A store's configuration in `dir`, the defaults otherwise.
    fn config_in(dir: &std::path::Path) -> StoreConfig {
        StoreConfig {
            path: dir.to_owned(),
            ..StoreConfig::default()
        }
    }

    /// `task`'s outcome, or `Elapsed` when it takes longer than [`PATIENCE`].
    fn within<T>(
        runtime: &Runtime,
        task: JoinHandle<T>,
    ) -> Result<Result<T, tokio::task::JoinError>, tokio::time::error::Elapsed> {
        runtime.block_on(async { tokio::time::timeout(PATIENCE, task).await })
    }

    fn wait_until(done: impl Fn() -> bool, failure: &str) {
        let deadline = std::time::Instant::now() + PATIENCE;
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{failure}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn acknowledged(runtime: &Runtime, store: &SledStore, nonce: &str) -> bool {
        let nonce = Nonce::from(nonce);
        runtime
            .block_on(store.callback_acknowledged(&nonce, TransactionStatus::Success))
            .unwrap()
    }

    /// What a callback's handler reads of its validation: the payment and the decision; a
    /// postponed one's decision unknown when its record is gone, or when the validation's
    /// record is older than the link; and a record that does not decode, of the validation
    /// or of its postponed validation, an error rather than a decision unknown.
    #[test]
    fn a_validation_is_read_back_and_what_does_not_decode_is_an_error() {
        use super::super::ValidatedDecision;
        use super::super::record::{KeptFingerprint, encode};
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&config_in(dir.path()), &[]).unwrap();
        let fingerprint = KeptFingerprint::of(&Fingerprint {
            amount: "40".into(),
            currency: "EUR".into(),
            client_id: "client-42".into(),
            provider_id: 11,
            cash_in: true,
        });
        let write = |nonce: &str, decision: RecordedDecision, validation_id: Option<i64>| {
            let record = ValidationRecord {
                fingerprint: fingerprint.clone(),
                decision,
                expires_ms: now_ms() + 60_000,
                validation_id: validation_id.map(ValidationId::from),
                repeats_awaiting: Vec::new(),
            };
            store
                .inner
                .tree
                .insert(keys::validation(nonce).key, encode(&record))
                .unwrap();
        };
        let read = |nonce: &str| store.validated_payment_now(nonce);

        write("allowed", RecordedDecision::Allow, None);
        let allowed = read("allowed").unwrap().unwrap();
        assert_eq!(allowed.decision, ValidatedDecision::Allowed);
        assert!(allowed.client_is("client-42"));
        assert_eq!(read("never").unwrap(), None);

        // Postponed, its record gone; or recorded before the link was kept.
        write("purged", RecordedDecision::Postponed, Some(9));
        write("older", RecordedDecision::Postponed, None);
        for nonce in ["purged", "older"] {
            let unknown = read(nonce).unwrap().unwrap();
            assert_eq!(
                unknown.decision,
                ValidatedDecision::PostponedUnknown,
                "{nonce}"
            );
        }
        // Its postponed record does not decode: an error, not "unknown".
        store
            .inner
            .tree
            .insert(keys::by_id(keys::POSTPONED_PREFIX, 9.into()), &b"{"[..])
            .unwrap();
        assert!(matches!(read("purged"), Err(StoreError::Corrupt { .. })));
        store
            .inner
            .tree
            .insert(keys::validation("spoiled").key, &b"not json"[..])
            .unwrap();
        assert!(matches!(read("spoiled"), Err(StoreError::Corrupt { .. })));
    }
}
