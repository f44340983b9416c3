//! A callback handler's own writes, applied in the same atomic write as the `Done` mark.
//!
//! The handler stages one or more closures on [`Effects`]; when it returns `Ack`, payhook
//! runs them inside the store's transaction, together with the mark that the nonce is done,
//! and flushes before answering 200. Either both the mark and the effects are durable, or
//! neither is and the aggregator's next attempt runs the handler again. A closure may run
//! more than once (a transaction retried after a conflict), so it must only read and write
//! through the [`EffectTx`] it is given.
//!
//! The merchant's trees are declared when the store opens, and effects name them by the
//! [`Tree`] handles the store hands out ([`SledStore::tree`](super::SledStore::tree)): a
//! misspelt tree is an error at start-up, not a callback refused on every retry.

use std::sync::{Arc, Mutex};

use super::StoreError;
use super::held::Subject;
use super::keys;

/// A key-value tree of the merchant's own, declared when the store was opened. Only the
/// store makes one ([`SledStore::tree`](super::SledStore::tree)), so every `Tree` names a
/// tree that exists. Cheap to clone.
///
/// ```
/// use payhook::store::{SledStore, StoreConfig};
///
/// # let dir = tempfile::tempdir()?;
/// # let config = StoreConfig { path: dir.path().join("data"), ..StoreConfig::default() };
/// let store = SledStore::open(&config, &["ledger"])?;
/// let ledger = store.tree("ledger")?;        // checked once, at start-up
/// assert_eq!(ledger.name(), "ledger");
/// assert!(store.tree("leger").is_err());     // a typo fails here, not on every callback
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Tree {
    name: Arc<str>,
    /// The prefix of this tree's keys in the store, computed once.
    prefix: Arc<[u8]>,
}

impl Tree {
    /// Made by the store for a declared name only.
    pub(crate) fn declared(name: &str) -> Self {
        Self {
            name: Arc::from(name),
            prefix: Arc::from(keys::merchant_prefix(name)),
        }
    }

    /// The tree's name, as declared at open.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store's key of `key` in this tree.
    pub(crate) fn key(&self, key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], key].concat()
    }

    /// The prefix shared by every key of this tree in the store.
    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }
}

/// Refuses a tree `name` that is not among the `declared` ones (a handle of another store,
/// or a name asked of the store at start-up).
pub(crate) fn check_declared(declared: &[String], name: &str) -> Result<(), StoreError> {
    if declared.iter().any(|t| t == name) {
        Ok(())
    } else {
        Err(StoreError::UnknownTree {
            name: name.to_owned(),
            declared: declared.to_vec(),
        })
    }
}

/// Refuses tree names that no backend can keep: one with a NUL byte (PostgreSQL's `text`
/// cannot hold it; every read and write of it would fail, callback after callback).
pub(crate) fn check_tree_names(trees: &[&str]) -> Result<(), StoreError> {
    match trees.iter().find(|t| t.contains('\0')) {
        Some(bad) => Err(StoreError::backend_message(format!(
            "tree name {bad:?} contains a NUL byte"
        ))),
        None => Ok(()),
    }
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tree").field(&self.name).finish()
    }
}

/// Reads and writes of the merchant's trees inside the store's transaction.
pub trait EffectTx {
    /// The value of `key` in `tree`, seeing this transaction's own writes.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] when `tree` belongs to another store,
    /// [`StoreError::Backend`] when the backend fails.
    fn get(&self, tree: &Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Sets `key` in `tree`.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] when `tree` belongs to another store,
    /// [`StoreError::Backend`] when the backend fails.
    fn insert(&self, tree: &Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError>;

    /// Removes `key` from `tree`.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] when `tree` belongs to another store,
    /// [`StoreError::Backend`] when the backend fails.
    fn remove(&self, tree: &Tree, key: &[u8]) -> Result<(), StoreError>;
}

type Effect = Arc<dyn Fn(&dyn EffectTx) -> Result<(), StoreError> + Send + Sync>;

/// The future of a booking SQL effect ([`Effects::postgres_book`]).
#[cfg(feature = "postgres")]
pub type SqlBookingFuture<'c> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Booking, StoreError>> + Send + 'c>>;

/// Where one booking effect says what it made of the result, each time it runs.
#[derive(Clone)]
struct Slot {
    holds: Holds,
    index: usize,
}

impl Slot {
    fn say(&self, booking: Booking) {
        let held = match booking {
            Booking::Booked => None,
            Booking::Held { reason } => Some(reason),
        };
        if let Some(said) = lock(&self.holds).get_mut(self.index) {
            *said = held;
        }
    }
}

/// The future of a SQL effect: the merchant's own statements on the store's connection.
#[cfg(feature = "postgres")]
pub type SqlFuture<'c> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send + 'c>>;

#[cfg(feature = "postgres")]
type SqlEffect = Arc<dyn for<'c> Fn(&'c mut sqlx::PgConnection) -> SqlFuture<'c> + Send + Sync>;

/// One staged effect.
#[derive(Clone)]
pub(crate) enum Staged {
    /// Reads and writes of the merchant's trees, on any backend.
    Trees(Effect),
    /// The merchant's own SQL, in PostgreSQL's transaction.
    #[cfg(feature = "postgres")]
    Sql(SqlEffect),
}

/// The effects a callback handler stages. Cheap to clone; clones share the list.
///
/// ```
/// use payhook::store::{Effects, SledStore, StoreConfig};
///
/// # let dir = tempfile::tempdir()?;
/// # let config = StoreConfig { path: dir.path().join("data"), ..StoreConfig::default() };
/// let store = SledStore::open(&config, &["ledger_entries"])?;
/// let entries = store.tree("ledger_entries")?;
///
/// let effects = Effects::default();
/// // Keyed by (nonce, status): a later status of the nonce (a success, then -2: money
/// // returned) is a result of its own, booked beside the first, not over it.
/// let key = format!("{}|{}", "n-1", 4);
/// effects.write(move |tx| tx.insert(&entries, key.as_bytes(), b"booked"));
/// assert_eq!(effects.len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Effects {
    /// One allocation per callback, shared by the clones.
    inner: Arc<Staging>,
}

/// What [`Effects`] holds.
#[derive(Default)]
struct Staging {
    staged: Mutex<Vec<Staged>>,
    /// What each booking effect ([`Effects::book`]) made of the result in its last run:
    /// the reason it held it, or `None` when it booked it. One slot per booking effect,
    /// overwritten each time the effects run (a transaction retried after a conflict runs
    /// them all again). Made by the first booking effect (none: nothing to allocate); its
    /// own `Arc`, which the effects' closures hold (the staging itself, which holds them,
    /// would be a cycle).
    holds: std::sync::OnceLock<Holds>,
    /// Whether the store ran the effects: not when the status was booked already, by a
    /// delivery whose claim this one took over.
    ran: std::sync::atomic::AtomicBool,
    /// The payment these effects book, as the server read it from the callback: what a
    /// held result's record keeps for the person who resolves it.
    subject: std::sync::OnceLock<Subject>,
}

/// The slots of the booking effects.
type Holds = Arc<Mutex<Vec<Option<String>>>>;

/// What a booking effect ([`Effects::book`]) made of a transaction result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Booking {
    /// In the merchant's books.
    Booked,
    /// Acknowledged but kept aside for a person to resolve (a quarantine): the result is
    /// written where the merchant keeps such results, the aggregator is answered 200 and
    /// stops retrying, and payhook reports it as held, not booked — counted in
    /// `payhook_callbacks_held_total`, shown as "held" by the inspector, logged at error
    /// level with `reason` once the write is durable, and said "held" by a reconcile.
    Held {
        /// Why it could not be booked, for the person who resolves it.
        reason: String,
    },
}

impl Booking {
    /// A [`Booking::Held`] for `reason`.
    pub fn held(reason: impl Into<String>) -> Self {
        Self::Held {
            reason: reason.into(),
        }
    }
}

impl std::fmt::Debug for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Effects({} staged)", self.len())
    }
}

impl Effects {
    /// Stages `effect` to run in the transaction that marks this callback done.
    pub fn write<F>(&self, effect: F)
    where
        F: Fn(&dyn EffectTx) -> Result<(), StoreError> + Send + Sync + 'static,
    {
        self.lock().push(Staged::Trees(Arc::new(effect)));
    }

    /// Stages `effect`, which books the result or holds it ([`Booking`]), to run in the
    /// transaction that marks this callback done. Either way the callback is acknowledged
    /// (200) once what the effect wrote is durable; a held result is reported as held, not
    /// booked. What the effect returns in its last run counts: like every effect it may run
    /// more than once.
    ///
    /// ```
    /// use payhook::store::{Booking, Effects, SledStore, StoreConfig};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// # let config = StoreConfig { path: dir.path().join("data"), ..StoreConfig::default() };
    /// let store = SledStore::open(&config, &["ledger", "quarantine"])?;
    /// let (ledger, quarantine) = (store.tree("ledger")?, store.tree("quarantine")?);
    ///
    /// let effects = Effects::default();
    /// // The ledger keeps each transaction's result under its nonce; a later result of a
    /// // booked transaction is held under (nonce, status), each beside the others.
    /// let (nonce, status) = ("n-1".to_owned(), -1);
    /// effects.book(move |tx| {
    ///     if tx.get(&ledger, nonce.as_bytes())?.is_some() {
    ///         let held = format!("{nonce}|{status}");
    ///         tx.insert(&quarantine, held.as_bytes(), b"a later result")?;
    ///         return Ok(Booking::held("a later result of a booked transaction"));
    ///     }
    ///     tx.insert(&ledger, nonce.as_bytes(), b"booked")?;
    ///     Ok(Booking::Booked)
    /// });
    /// assert_eq!(effects.held(), None, "nothing has run yet");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn book<F>(&self, effect: F)
    where
        F: Fn(&dyn EffectTx) -> Result<Booking, StoreError> + Send + Sync + 'static,
    {
        let slot = self.slot();
        self.write(move |tx| {
            slot.say(effect(tx)?);
            Ok(())
        });
    }

    /// [`Effects::postgres`] for SQL that books the result or holds it, as
    /// [`Effects::book`] does for trees: what the future returns in the last run counts.
    ///
    /// ```
    /// use payhook::store::{Booking, Effects};
    ///
    /// let effects = Effects::default();
    /// let (nonce, status) = ("n-1".to_owned(), 4);
    /// effects.postgres_book(move |conn| {
    ///     let nonce = nonce.clone();
    ///     Box::pin(async move {
    ///         let known: Option<(String,)> =
    ///             sqlx::query_as("SELECT currency FROM currencies WHERE code = 'XTS'")
    ///                 .fetch_optional(&mut *conn)
    ///                 .await?;
    ///         if known.is_none() {
    ///             // Keyed by (nonce, status): each result of the transaction held apart.
    ///             sqlx::query("INSERT INTO set_aside (nonce, status) VALUES ($1, $2)")
    ///                 .bind(nonce)
    ///                 .bind(status)
    ///                 .execute(&mut *conn)
    ///                 .await?;
    ///             return Ok(Booking::held("a currency these books do not keep"));
    ///         }
    ///         Ok(Booking::Booked)
    ///     })
    /// });
    /// assert_eq!(effects.len(), 1);
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_book<F>(&self, effect: F)
    where
        F: for<'c> Fn(&'c mut sqlx::PgConnection) -> SqlBookingFuture<'c> + Send + Sync + 'static,
    {
        let slot = self.slot();
        self.postgres(move |conn| {
            let booking = effect(conn);
            let slot = slot.clone();
            Box::pin(async move {
                slot.say(booking.await?);
                Ok(())
            })
        });
    }

    /// A new slot for what one booking effect says.
    fn slot(&self) -> Slot {
        let shared = self.inner.holds.get_or_init(Holds::default);
        let mut holds = lock(shared);
        holds.push(None);
        Slot {
            holds: Arc::clone(shared),
            index: holds.len() - 1,
        }
    }

    /// Why the result was held, not booked, when a booking effect ([`Effects::book`]) held
    /// it the last time the effects ran (the first such reason); `None` when none did, or
    /// they have not run.
    pub fn held(&self) -> Option<String> {
        let holds = self.inner.holds.get()?;
        lock(holds).iter().flatten().next().cloned()
    }

    /// Stages the merchant's own SQL to run in the PostgreSQL transaction that marks this
    /// callback done: its rows commit with the mark or not at all, and 200 is sent only
    /// after COMMIT. The closure gets the transaction's connection and may run more than
    /// once (the transaction is retried after a deadlock or a serialization failure), so it
    /// must only write through that connection. On a sled store it fails the callback
    /// (answered 503): SQL needs the PostgreSQL store.
    ///
    /// The transaction is payhook's, begun before sqlx saw the connection: the closure must
    /// not end it. Neither COMMIT nor ROLLBACK, and not sqlx's `begin()` on the connection
    /// either, which there sends BEGIN, not SAVEPOINT, so that its `commit()` or
    /// `rollback()` ends the whole booking, mark included. For a part that may fail, use
    /// `SAVEPOINT name` and `ROLLBACK TO SAVEPOINT name`. A booking whose transaction an
    /// effect ended is refused at its COMMIT (503, listed among the failing callbacks),
    /// never acknowledged. The effect's own COMMIT fails (on a schema at version 6 or
    /// later), taking the mark and what it wrote with it; what it writes after its COMMIT
    /// or ROLLBACK commits on its own. `SET CONSTRAINTS ALL IMMEDIATE` fails the booking
    /// too (it fires payhook's own deferred check early): name the constraints instead.
    ///
    /// ```
    /// use payhook::store::Effects;
    ///
    /// let effects = Effects::default();
    /// // One row per (nonce, status), the table's primary key: a later status of the nonce
    /// // (a success, then -2: money returned) is a row of its own, with its own sign.
    /// let (nonce, status, cents) = ("n-1".to_owned(), 4, 1050_i64);
    /// effects.postgres(move |conn| {
    ///     let nonce = nonce.clone();
    ///     Box::pin(async move {
    ///         sqlx::query("INSERT INTO ledger (nonce, status, cents) VALUES ($1, $2, $3)")
    ///             .bind(nonce)
    ///             .bind(status)
    ///             .bind(cents)
    ///             .execute(&mut *conn)
    ///             .await?;
    ///         Ok(())
    ///     })
    /// });
    /// assert_eq!(effects.len(), 1);
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres<F>(&self, effect: F)
    where
        F: for<'c> Fn(&'c mut sqlx::PgConnection) -> SqlFuture<'c> + Send + Sync + 'static,
    {
        self.lock().push(Staged::Sql(Arc::new(effect)));
    }

    /// Says which payment these effects book (set once, by the server, before the
    /// handler runs).
    pub(crate) fn about(&self, subject: Subject) {
        let _ = self.inner.subject.set(subject);
    }

    /// The payment these effects book, when the server said it.
    pub(crate) fn subject(&self) -> Option<&Subject> {
        self.inner.subject.get()
    }

    /// Number of staged effects.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` when nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs every staged effect against `tx`, in order.
    ///
    /// # Errors
    ///
    /// The first effect's error.
    /// [`StoreError::Unsupported`] when an effect is SQL (`Effects::postgres`, feature
    /// `postgres`): that needs the PostgreSQL store.
    pub fn apply(&self, tx: &dyn EffectTx) -> Result<(), StoreError> {
        self.running();
        self.staged().iter().try_for_each(|effect| match effect {
            Staged::Trees(effect) => effect(tx),
            #[cfg(feature = "postgres")]
            Staged::Sql(_) => Err(StoreError::Unsupported(
                "the callback's effects hold SQL (Effects::postgres), but the store is sled; \
                 set store.url to use PostgreSQL"
                    .into(),
            )),
        })
    }

    /// Notes that the store runs the effects (each time it does).
    pub(crate) fn running(&self) {
        self.inner
            .ran
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the store ran the effects (with the mark that this callback is done): a
    /// store that finds the status booked already, by a delivery whose claim this one took
    /// over, drops them unrun — what they would have said (booked, held) is not this
    /// delivery's to tell, and payhook answers it as a duplicate.
    pub fn ran(&self) -> bool {
        self.inner.ran.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What is staged, in order.
    pub(crate) fn staged(&self) -> Vec<Staged> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Staged>> {
        lock(&self.inner.staged)
    }
}

/// `list`, locked. A panic while holding one of these locks only interrupted a push or a
/// write of one slot; the list is still whole.
fn lock<T>(list: &Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
    list.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A transaction that holds nothing: what the effects return is all that is looked at.
    struct Nothing;

    impl EffectTx for Nothing {
        fn get(&self, _: &Tree, _: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(None)
        }
        fn insert(&self, _: &Tree, _: &[u8], _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
        fn remove(&self, _: &Tree, _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// A transaction retried after a conflict runs the effects again: what the last run
    /// said counts, not a hold of a run that did not commit.
    #[test]
    fn the_last_run_of_the_effects_says_whether_the_result_was_held() {
        let effects = Effects::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        effects.book(move |_| {
            Ok(match counted.fetch_add(1, Ordering::SeqCst) {
                0 => Booking::held("the balance was read before another booking"),
                _ => Booking::Booked,
            })
        });
        effects.write(|_| Ok(()));
        assert_eq!(effects.held(), None, "nothing ran yet");
        effects.apply(&Nothing).unwrap();
        assert_eq!(
            effects.held().as_deref(),
            Some("the balance was read before another booking")
        );
        effects.apply(&Nothing).unwrap();
        assert_eq!(effects.held(), None, "the run that committed booked it");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    /// Of several booking effects, one that holds the result holds it, whatever the others
    /// did; its reason is told.
    #[test]
    fn one_booking_effect_that_holds_the_result_holds_it() {
        let effects = Effects::default();
        effects.book(|_| Ok(Booking::Booked));
        effects.book(|_| Ok(Booking::held("a currency the books do not keep")));
        effects.book(|_| Ok(Booking::Booked));
        effects.apply(&Nothing).unwrap();
        assert_eq!(
            effects.held().as_deref(),
            Some("a currency the books do not keep")
        );
        let clone = effects.clone();
        assert_eq!(clone.held(), effects.held(), "clones share what was said");
    }
}
