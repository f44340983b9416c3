//! A callback handler's own writes, applied in the same atomic write as the `Done` mark.
//!
//! The handler stages one or more closures on [`Effects`]; when it returns `Ack`, payhook
//! runs them inside the store's transaction, together with the mark that the nonce is done,
//! and flushes before answering 200. Either both the mark and the effects are durable, or
//! neither is and the aggregator's next attempt runs the handler again. A closure may run
//! more than once (a transaction retried after a conflict), so it must only read and write
//! through the [`EffectTx`] it is given.

use std::sync::{Arc, Mutex};

/// Reads and writes of named key-value trees inside the store's transaction.
pub trait EffectTx {
    /// The value of `key` in `tree`, seeing this transaction's own writes.
    ///
    /// # Errors
    ///
    /// [`EffectError`] when `tree` was not declared or the backend fails.
    fn get(&self, tree: &str, key: &[u8]) -> Result<Option<Vec<u8>>, EffectError>;

    /// Sets `key` in `tree`.
    ///
    /// # Errors
    ///
    /// [`EffectError`] when `tree` was not declared or the backend fails.
    fn insert(&self, tree: &str, key: &[u8], value: &[u8]) -> Result<(), EffectError>;

    /// Removes `key` from `tree`.
    ///
    /// # Errors
    ///
    /// [`EffectError`] when `tree` was not declared or the backend fails.
    fn remove(&self, tree: &str, key: &[u8]) -> Result<(), EffectError>;
}

/// Why effects did not apply: nothing was written, and the callback is not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EffectError {
    /// The tree was not declared with the store (`SledStore::open(.., trees)`).
    #[error("tree `{0}` was not declared to the store")]
    UnknownTree(String),
    /// The handler's closure gave up.
    #[error("{0}")]
    Aborted(String),
    /// The backend failed.
    #[error("storage: {0}")]
    Backend(String),
}

impl EffectError {
    /// An abort with a message, for a closure that finds it cannot apply.
    pub fn abort(message: impl Into<String>) -> Self {
        Self::Aborted(message.into())
    }
}

type Effect = Arc<dyn Fn(&dyn EffectTx) -> Result<(), EffectError> + Send + Sync>;

/// The effects a callback handler stages. Cheap to clone; clones share the list.
///
/// ```
/// use payhook::store::{EffectError, Effects};
///
/// let effects = Effects::default();
/// let nonce = "n-1".to_owned();
/// effects.write(move |tx| {
///     tx.insert("ledger_entries", nonce.as_bytes(), b"booked")?;
///     Ok(())
/// });
/// assert_eq!(effects.len(), 1);
/// ```
#[derive(Clone, Default)]
pub struct Effects {
    staged: Arc<Mutex<Vec<Effect>>>,
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
        F: Fn(&dyn EffectTx) -> Result<(), EffectError> + Send + Sync + 'static,
    {
        self.lock().push(Arc::new(effect));
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
    pub fn apply(&self, tx: &dyn EffectTx) -> Result<(), EffectError> {
        let staged: Vec<Effect> = self.lock().clone();
        staged.iter().try_for_each(|effect| effect(tx))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Effect>> {
        // A panic while holding this lock only interrupted a push; the list is still whole.
        self.staged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
