//! The batch being built by the committer, as the record modules (failing callbacks,
//! postponed validations, the watermark's lock) read and write it: an overlay of pending
//! writes over the records tree. Below the committer and the record modules, so that both
//! depend on it and not on each other.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::StoreError;
use super::keys::RecordKey;

/// Locks `mutex`; a panic of another holder does not poison the store's state.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Locks `mutex` if it is free (`None` if another holds it); like [`lock`], a panic of an
/// earlier holder does not poison the store's state.
pub(crate) fn try_lock<T>(mutex: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

pub(crate) type Overlay = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

pub(crate) fn read(
    tree: &sled::Tree,
    overlay: &Overlay,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    match overlay.get(key) {
        Some(value) => Ok(value.clone()),
        None => Ok(tree.get(key)?.map(|v| v.to_vec())),
    }
}

/// The record at `key`, or where a store written before long nonces were digested kept it.
pub(crate) fn read_record(
    tree: &sled::Tree,
    overlay: &Overlay,
    key: &RecordKey,
) -> Result<Option<Vec<u8>>, StoreError> {
    key.read(|k| read(tree, overlay, k))
}

/// Writes a record under `key` (`None` removes it), and removes it from where an older
/// store kept it.
pub(crate) fn write_record(overlay: &mut Overlay, key: &RecordKey, value: Option<Vec<u8>>) {
    if let Some(older) = &key.spelled_out {
        overlay.insert(older.clone(), None);
    }
    overlay.insert(key.key.clone(), value);
}

/// The batch being built, as the record modules read and write it: reads see the batch's
/// earlier writes.
pub(crate) struct Staging<'a> {
    tree: &'a sled::Tree,
    overlay: &'a mut Overlay,
}

impl<'a> Staging<'a> {
    /// The batch `overlay` over the records of `tree`.
    pub(crate) fn new(tree: &'a sled::Tree, overlay: &'a mut Overlay) -> Self {
        Self { tree, overlay }
    }

    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        read(self.tree, self.overlay, key)
    }

    /// The record of one nonce (see [`RecordKey`]).
    pub(crate) fn get_record(&self, key: &RecordKey) -> Result<Option<Vec<u8>>, StoreError> {
        read_record(self.tree, self.overlay, key)
    }

    /// Writes `value` under `key` in the batch; `None` removes the key.
    pub(crate) fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.overlay.insert(key, value);
    }

    /// Writes the record of one nonce (see [`RecordKey`]); `None` removes it.
    pub(crate) fn put_record(&mut self, key: &RecordKey, value: Option<Vec<u8>>) {
        write_record(self.overlay, key, value);
    }
}
