//! A value many calls read and one replaces whole while they run ([`Current`]): the
//! credentials read again without a restart — the signature keys, the gateway's login and
//! its TLS files, the operating API's access. A call takes the value as it is and keeps it
//! for as long as it needs it; a replacement is what the next call takes.

use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

/// A value replaced whole while it is read (see the module docs).
pub(crate) struct Current<T>(RwLock<Arc<T>>);

impl<T> Current<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(RwLock::new(Arc::new(value)))
    }

    /// The value as it is now, the caller's to keep.
    pub(crate) fn now(&self) -> Arc<T> {
        Arc::clone(&self.hold())
    }

    /// The value as it is now, which no replacement takes over until the guard is dropped:
    /// for a check that must not end under a value already replaced. Short, and never held
    /// across an await.
    pub(crate) fn hold(&self) -> RwLockReadGuard<'_, Arc<T>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// From now on, `value`.
    pub(crate) fn replace(&self, value: T) {
        self.replace_with(|_| Some(value));
    }

    /// From now on, what `next` makes of the value, when it makes one (no reader sees the
    /// value between); returns whether it did.
    pub(crate) fn replace_with(&self, next: impl FnOnce(&T) -> Option<T>) -> bool {
        let mut current = self.0.write().unwrap_or_else(PoisonError::into_inner);
        match next(&current) {
            Some(value) => {
                *current = Arc::new(value);
                true
            }
            None => false,
        }
    }
}
