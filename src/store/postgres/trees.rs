//! A callback's effects inside PostgreSQL's transaction: the merchant's declared trees as
//! rows of `{schema}.trees`, and the merchant's own SQL.
//!
//! Tree effects are synchronous closures ([`EffectTx`]); they run on a blocking thread that
//! drives the transaction's queries, so the same handler serves sled and PostgreSQL. A read
//! locks its key for the rest of the transaction first (`{schema}.locked_get`: an advisory
//! transaction lock, then a new snapshot reads the value committed by whoever held the lock
//! before), so two concurrent read-modify-writes of one key never both read the old value.
//! Writes are gathered and written together when the run of tree effects ends.

use std::cell::RefCell;
use std::collections::BTreeMap;

use sqlx::{PgConnection, Row};

use super::super::StoreError;
use super::super::effects::{EffectTx, Effects, Staged, Tree, check_declared};

/// A claim's open transaction, moved to the blocking thread and back.
type Tx = super::claim::HeldClaim;

/// The trees of a transaction, as a tree effect sees them: reads go to the database (each
/// locking its key), writes are kept here and written by the statement that writes the
/// mark; a read sees this transaction's own writes first.
struct Trees {
    tx: RefCell<Tx>,
    runtime: tokio::runtime::Handle,
    schema: String,
    declared: Vec<String>,
    /// (tree, key) → the value written, or `None` when removed.
    written: RefCell<Written>,
}

/// What the tree effects wrote, by (tree, key): the value, or `None` for a removal.
pub(super) type Written = BTreeMap<(String, Vec<u8>), Option<Vec<u8>>>;

/// [`Written`] as the arrays of the statement that writes it with the mark: the upserts
/// (trees, keys, values) and the removals (trees, keys).
pub(super) struct Writes {
    pub(super) trees: Vec<String>,
    pub(super) keys: Vec<Vec<u8>>,
    pub(super) values: Vec<Vec<u8>>,
    pub(super) removed_trees: Vec<String>,
    pub(super) removed_keys: Vec<Vec<u8>>,
}

impl From<Written> for Writes {
    fn from(written: Written) -> Self {
        let mut writes = Self {
            trees: vec![],
            keys: vec![],
            values: vec![],
            removed_trees: vec![],
            removed_keys: vec![],
        };
        for ((tree, key), value) in written {
            match value {
                Some(value) => {
                    writes.trees.push(tree);
                    writes.keys.push(key);
                    writes.values.push(value);
                }
                None => {
                    writes.removed_trees.push(tree);
                    writes.removed_keys.push(key);
                }
            }
        }
        writes
    }
}

impl Trees {
    fn run<T>(
        &self,
        query: impl for<'c> FnOnce(
            &'c mut PgConnection,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'c>,
        >,
    ) -> Result<T, StoreError> {
        let mut tx = self.tx.borrow_mut();
        Ok(self.runtime.block_on(query(&mut tx))?)
    }
}

impl EffectTx for Trees {
    fn get(&self, tree: &Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        check_declared(&self.declared, tree.name())?;
        if let Some(value) = self
            .written
            .borrow()
            .get(&(tree.name().to_owned(), key.to_vec()))
        {
            return Ok(value.clone());
        }
        let read = format!("SELECT {}.locked_get($1, $2)", self.schema);
        let (name, key) = (tree.name().to_owned(), key.to_vec());
        self.run(move |conn| {
            Box::pin(async move {
                let row = sqlx::query(&read)
                    .bind(&name)
                    .bind(&key)
                    .fetch_one(&mut *conn)
                    .await?;
                row.try_get::<Option<Vec<u8>>, _>(0)
            })
        })
    }

    fn insert(&self, tree: &Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        check_declared(&self.declared, tree.name())?;
        self.written
            .borrow_mut()
            .insert((tree.name().to_owned(), key.to_vec()), Some(value.to_vec()));
        Ok(())
    }

    fn remove(&self, tree: &Tree, key: &[u8]) -> Result<(), StoreError> {
        check_declared(&self.declared, tree.name())?;
        self.written
            .borrow_mut()
            .insert((tree.name().to_owned(), key.to_vec()), None);
        Ok(())
    }
}

/// Runs `effects` in order inside `tx`, and hands the transaction back with the outcome:
/// what the tree effects wrote, for the statement of the mark to write. An effect that
/// panics, a tree effect or an SQL one, fails the callback ([`StoreError::Aborted`]) as one
/// that aborts does, and is recorded as failing; its transaction is then rolled back
/// (dropped), and `None` is returned in its place.
pub(super) async fn apply(
    mut tx: Tx,
    effects: &Effects,
    schema: &str,
    declared: &[String],
) -> (Option<Tx>, Result<Writes, StoreError>) {
    effects.running();
    let staged = effects.staged();
    let mut written = Written::new();
    let mut index = 0;
    while index < staged.len() {
        match &staged[index] {
            Staged::Sql(effect) => {
                match CatchPanic(effect(&mut tx)).await {
                    Some(Ok(())) => {}
                    Some(Err(error)) => return (Some(tx), Err(merchant_fault(error))),
                    None => {
                        drop(tx);
                        return (
                            None,
                            Err(StoreError::abort("an effect panicked; nothing was written")),
                        );
                    }
                }
                index += 1;
                // The merchant's SQL may have ended the claim's transaction: what follows
                // would then run, and commit, on its own.
                if index < staged.len()
                    && let Err(error) = tx.check_still_its_own().await
                {
                    return (Some(tx), Err(merchant_fault(error.into())));
                }
            }
            Staged::Trees(_) => {
                // The run of tree effects from here, on one blocking thread.
                let run: Vec<Staged> = staged[index..]
                    .iter()
                    .take_while(|s| matches!(s, Staged::Trees(_)))
                    .cloned()
                    .collect();
                index += run.len();
                let trees = (
                    schema.to_owned(),
                    declared.to_vec(),
                    std::mem::take(&mut written),
                );
                let runtime = tokio::runtime::Handle::current();
                let joined = tokio::task::spawn_blocking(move || {
                    let trees = Trees {
                        tx: RefCell::new(tx),
                        runtime,
                        schema: trees.0,
                        declared: trees.1,
                        written: RefCell::new(trees.2),
                    };
                    let outcome = run.iter().try_for_each(|effect| match effect {
                        Staged::Trees(effect) => effect(&trees),
                        Staged::Sql(_) => Ok(()),
                    });
                    (trees.tx.into_inner(), trees.written.into_inner(), outcome)
                })
                .await;
                match joined {
                    Ok((back, so_far, Ok(()))) => {
                        tx = back;
                        written = so_far;
                    }
                    Ok((back, _, Err(error))) => return (Some(back), Err(error)),
                    Err(_) => {
                        return (
                            None,
                            Err(StoreError::abort("an effect panicked; nothing was written")),
                        );
                    }
                }
            }
        }
    }
    (Some(tx), Ok(written.into()))
}

/// An SQL effect's future, whose panic (while it is polled) is caught: `None` then. It
/// would otherwise unwind the whole delivery, with no failure recorded for operators.
struct CatchPanic<'c>(crate::store::effects::SqlFuture<'c>);

impl std::future::Future for CatchPanic<'_> {
    type Output = Option<Result<(), StoreError>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let future = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(outcome)) => std::task::Poll::Ready(Some(outcome)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(_) => std::task::Poll::Ready(None),
        }
    }
}

/// `error` as it is, unless it is the check that the booking's transaction is still the
/// claim's failing (see `HeldClaim::still_its_own`): then the effect's fault that ended it.
pub(super) fn when_ended_by_effect(error: StoreError) -> StoreError {
    let ended = super::sqlx_cause(&error)
        .and_then(|e| e.as_database_error())
        .is_some_and(|database| database.message().contains(super::claim::ENDED));
    if ended { merchant_fault(error) } else { error }
}

/// An error of the merchant's SQL that the database refused as such (a constraint, a type,
/// a missing table) is the effect's failure, not the store's: the callback is answered 503
/// as failing and recorded for operators, like an effect that aborts. A lost connection, a
/// database shutting down or out of resources stays a store failure, and a deadlock stays
/// retryable.
pub(super) fn merchant_fault(error: StoreError) -> StoreError {
    let Some(database) = super::sqlx_cause(&error).and_then(|e| e.as_database_error()) else {
        return error;
    };
    let code = database.code().unwrap_or_default();
    let store_side = ["08", "40", "53", "57", "58", "XX"]
        .iter()
        .any(|class| code.starts_with(class));
    if store_side {
        error
    } else {
        StoreError::abort(format!(
            "the effect's SQL failed (SQLSTATE {code}): {}",
            database.message()
        ))
    }
}
