//! The store a service's configuration names: sled in `store.path`, or PostgreSQL when
//! `store.url` is set.

use std::sync::Arc;

#[cfg(feature = "postgres")]
use super::PgStore;
use super::{KeyValue, SledStore, Store, StoreConfig, StoreError, Tree};

/// The configured store, with reads of the merchant's trees on either backend. Cheap to
/// clone.
///
/// ```
/// use payhook::store::{ConfiguredStore, StoreConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), payhook::store::StoreError> {
/// # let dir = tempfile::tempdir().map_err(|e| payhook::store::StoreError::abort(e.to_string()))?;
/// # let config = StoreConfig { path: dir.path().join("data"), ..StoreConfig::default() };
/// // sled in store.path, or PostgreSQL when store.url is set.
/// let store = ConfiguredStore::open(&config, &["ledger"]).await?;
/// let ledger = store.tree("ledger")?;
/// assert_eq!(store.get(&ledger, b"client-42").await?, None);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ConfiguredStore {
    /// The embedded default.
    Sled(SledStore),
    /// The shared store.
    #[cfg(feature = "postgres")]
    Postgres(PgStore),
}

impl ConfiguredStore {
    /// Opens the store `config` names, declaring the merchant's `trees`.
    ///
    /// # Errors
    ///
    /// As [`SledStore::open`] or `PgStore::open` (feature `postgres`).
    pub async fn open(config: &StoreConfig, trees: &[&str]) -> Result<Self, StoreError> {
        #[cfg(feature = "postgres")]
        if config.is_postgres() {
            return Ok(Self::Postgres(PgStore::open(config, trees).await?));
        }
        if config.is_postgres() {
            return Err(StoreError::Unsupported(
                "store.url names PostgreSQL, which needs payhook's `postgres` feature".into(),
            ));
        }
        Ok(Self::Sled(SledStore::open(config, trees)?))
    }

    /// Opens the store `config` names only where a service has written one, for a command
    /// that reads what the service holds (`payhook reconcile`, `validations`, `callbacks`
    /// without `--admin-url`): a `store.path` or `store.schema` that names nothing would
    /// otherwise open a new, empty store, in which every booked result reads as missing —
    /// and a result booked by hand on that word is booked twice.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when sled has no store at `store.path`, or the database has
    /// no payhook tables in `store.schema`; otherwise as [`ConfiguredStore::open`].
    pub async fn open_existing(config: &StoreConfig, trees: &[&str]) -> Result<Self, StoreError> {
        #[cfg(feature = "postgres")]
        if config.is_postgres() {
            PgStore::require_existing(config).await?;
            return Ok(Self::Postgres(
                PgStore::open_for_operator(config, trees).await?,
            ));
        }
        if config.is_postgres() {
            return Self::open(config, trees).await;
        }
        super::sled_store::require_existing(config)?;
        Ok(Self::Sled(SledStore::open_for_operator(config, trees)?))
    }

    /// The store behind the seam, for [`AppBuilder::shared_store`](crate::AppBuilder::shared_store).
    pub fn shared(&self) -> Arc<dyn Store> {
        match self {
            Self::Sled(store) => Arc::new(store.clone()),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => Arc::new(store.clone()),
        }
    }

    /// The handle of a tree declared at open.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] when `name` was not declared.
    pub fn tree(&self, name: &str) -> Result<Tree, StoreError> {
        match self {
            Self::Sled(store) => store.tree(name),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.tree(name),
        }
    }

    /// The value of `key` in one of the merchant's trees.
    ///
    /// # Errors
    ///
    /// As the backend's `get`.
    pub async fn get(&self, tree: &Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Self::Sled(store) => store.get(tree, key),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.get(tree, key).await,
        }
    }

    /// Every `(key, value)` of one of the merchant's trees, in key order.
    ///
    /// # Errors
    ///
    /// As the backend's `entries`.
    pub async fn entries(&self, tree: &Tree) -> Result<Vec<KeyValue>, StoreError> {
        match self {
            Self::Sled(store) => store.entries(tree),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.entries(tree).await,
        }
    }

    /// Number of callback and validation records held.
    ///
    /// # Errors
    ///
    /// When the backend fails.
    pub async fn record_count(&self) -> Result<usize, StoreError> {
        match self {
            Self::Sled(store) => Ok(store.record_count()),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.record_count().await,
        }
    }
}
