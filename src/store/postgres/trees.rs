//! A callback's effects inside PostgreSQL's transaction: the merchant's declared trees as
//! rows of `{schema}.trees`, and the merchant's own SQL.
//!
//! Tree effects are synchronous closures ([`EffectTx`]); they run on a blocking thread that
//! drives the transaction's queries, so the same handler serves sled and PostgreSQL. A read
//! locks its key for the rest of the transaction first (`pg_advisory_xact_lock`, then a new
//! statement reads the value committed by whoever held the lock before), so two concurrent
//! read-modify-writes of one key never both read the old value.

use std::cell::RefCell;

use sqlx::{PgConnection, Postgres, Row, Transaction};

use super::super::StoreError;
use super::super::effects::{EffectTx, Effects, Staged, Tree, check_declared};

/// An open transaction, moved to the blocking thread and back.
type Tx = Transaction<'static, Postgres>;

/// The trees of a transaction, as a tree effect sees them.
struct Trees {
    tx: RefCell<Tx>,
    runtime: tokio::runtime::Handle,
    schema: String,
    declared: Vec<String>,
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
        let lock =
            "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || encode($2, 'hex'), 7))";
        let read = format!(
            "SELECT value FROM {}.trees WHERE tree = $1 AND key = $2",
            self.schema
        );
        let (name, key) = (tree.name().to_owned(), key.to_vec());
        self.run(move |conn| {
            Box::pin(async move {
                sqlx::query(lock)
                    .bind(&name)
                    .bind(&key)
                    .execute(&mut *conn)
                    .await?;
                let row = sqlx::query(&read)
                    .bind(&name)
                    .bind(&key)
                    .fetch_optional(&mut *conn)
                    .await?;
                row.map(|r| r.try_get::<Vec<u8>, _>(0)).transpose()
            })
        })
    }

    fn insert(&self, tree: &Tree, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        check_declared(&self.declared, tree.name())?;
        let write = format!(
            "INSERT INTO {}.trees (tree, key, value) VALUES ($1, $2, $3) \
             ON CONFLICT (tree, key) DO UPDATE SET value = EXCLUDED.value",
            self.schema
        );
        let (name, key, value) = (tree.name().to_owned(), key.to_vec(), value.to_vec());
        self.run(move |conn| {
            Box::pin(async move {
                sqlx::query(&write)
                    .bind(name)
                    .bind(key)
                    .bind(value)
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
            })
        })
    }

    fn remove(&self, tree: &Tree, key: &[u8]) -> Result<(), StoreError> {
        check_declared(&self.declared, tree.name())?;
        let delete = format!(
            "DELETE FROM {}.trees WHERE tree = $1 AND key = $2",
            self.schema
        );
        let (name, key) = (tree.name().to_owned(), key.to_vec());
        self.run(move |conn| {
            Box::pin(async move {
                sqlx::query(&delete)
                    .bind(name)
                    .bind(key)
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
            })
        })
    }
}

/// Runs `effects` in order inside `tx`, and hands the transaction back with the outcome.
/// A tree effect that panics fails the callback ([`StoreError::Aborted`]); its transaction
/// is then rolled back (dropped), and `None` is returned in its place.
pub(super) async fn apply(
    mut tx: Tx,
    effects: &Effects,
    schema: &str,
    declared: &[String],
) -> (Option<Tx>, Result<(), StoreError>) {
    let staged = effects.staged();
    let mut index = 0;
    while index < staged.len() {
        match &staged[index] {
            Staged::Sql(effect) => {
                if let Err(error) = effect(&mut tx).await {
                    return (Some(tx), Err(merchant_fault(error)));
                }
                index += 1;
            }
            Staged::Trees(_) => {
                // The run of tree effects from here, on one blocking thread.
                let run: Vec<Staged> = staged[index..]
                    .iter()
                    .take_while(|s| matches!(s, Staged::Trees(_)))
                    .cloned()
                    .collect();
                index += run.len();
                let trees = (schema.to_owned(), declared.to_vec());
                let runtime = tokio::runtime::Handle::current();
                let joined = tokio::task::spawn_blocking(move || {
                    let trees = Trees {
                        tx: RefCell::new(tx),
                        runtime,
                        schema: trees.0,
                        declared: trees.1,
                    };
                    let outcome = run.iter().try_for_each(|effect| match effect {
                        Staged::Trees(effect) => effect(&trees),
                        Staged::Sql(_) => Ok(()),
                    });
                    (trees.tx.into_inner(), outcome)
                })
                .await;
                match joined {
                    Ok((back, Ok(()))) => tx = back,
                    Ok((back, Err(error))) => return (Some(back), Err(error)),
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
    (Some(tx), Ok(()))
}

/// An error of the merchant's SQL that the database refused as such (a constraint, a type,
/// a missing table) is the effect's failure, not the store's: the callback is answered 503
/// as failing and recorded for operators, like an effect that aborts. A lost connection, a
/// database shutting down or out of resources stays a store failure, and a deadlock stays
/// retryable.
fn merchant_fault(error: StoreError) -> StoreError {
    let StoreError::Backend {
        source: Some(source),
        ..
    } = &error
    else {
        return error;
    };
    let source: &(dyn std::error::Error + 'static) = source.as_ref();
    let Some(database) = source
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
    else {
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
