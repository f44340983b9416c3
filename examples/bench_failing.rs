//! What an incident's failing callbacks cost the operators' reads, on both backends: the
//! inspector's latest 100 (read every second while the page is open), a page of the
//! operating API's listing from the top, from the middle and at the end, every page in turn,
//! the whole list at once, the count `/metrics` reports on every scrape, and for sled the
//! store's reopen (which counts the pairs and checks their keys by time).
//!
//! Run it in release mode (about a minute and a half; `-- 300000` for another number of pairs):
//!
//! ```text
//! cargo run --release --example bench_failing
//! ```
//!
//! The failing pairs are 100,000 by default, ten a millisecond, one nonce in twenty with a
//! second status that failed earlier (so that some records are listed at two times).
//! PostgreSQL is the one of `PAYHOOK_BENCH_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in a schema of its own, dropped afterwards,
//! filled by copying the sled store (`payhook store copy-from-sled`); without a reachable
//! server it is skipped, and the program says so. Each figure is the median of five reads.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark prints and may panic"
)]

use std::time::{Duration, Instant};

use chrono::Utc;
use payhook::config::StoreConfig;
use payhook::model::TransactionStatus;
use payhook::store::{CallbackFailure, DedupStore, FailingCursor, PgStore, SledStore, Store};

/// Reads per figure; the median is printed.
const READS: usize = 5;
/// A page of the operating API.
const PAGE: usize = 1_000;

#[tokio::main]
async fn main() {
    let pairs: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |n| n.parse().expect("the number of failing pairs"));
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        path: dir.path().join("store"),
        ..StoreConfig::default()
    };
    let started = Instant::now();
    let store = SledStore::open(&config, &[]).unwrap();
    fill(&store, pairs).await;
    println!(
        "{pairs} failing pairs written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    measure("sled", &store, pairs).await;
    drop(store);
    let reopened = median(|| async {
        let started = Instant::now();
        let store = SledStore::open(&config, &[]).unwrap();
        let took = started.elapsed();
        assert_eq!(store.failing_count().await.unwrap(), pairs);
        took
    })
    .await;
    line("sled", "reopened, counted and checked", reopened);

    let url = std::env::var("PAYHOOK_BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("bench_failing_{}", std::process::id());
    let pg_config = StoreConfig {
        url: Some(url.as_str().into()),
        schema: schema.clone(),
        ..StoreConfig::default()
    };
    let opened = tokio::time::timeout(Duration::from_secs(5), PgStore::open(&pg_config, &[])).await;
    let Ok(Ok(pg)) = opened else {
        println!(
            "PostgreSQL SKIPPED: no PostgreSQL answers at {url} (set PAYHOOK_BENCH_DATABASE_URL)"
        );
        return;
    };
    let started = Instant::now();
    pg.import_sled(&config).await.unwrap();
    println!(
        "PostgreSQL: copied from sled in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    measure("PostgreSQL", &pg, pairs).await;
    drop(pg);
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// Records `pairs` failing pairs, ten a millisecond going back from now; every twentieth
/// nonce's Pending failed a minute before its Success.
async fn fill(store: &SledStore, pairs: usize) {
    let now = Utc::now();
    let mut written = 0;
    let mut i: i64 = 0;
    while written < pairs {
        let at = now - chrono::Duration::milliseconds(i / 10);
        let nonce = format!("incident-{i:08}");
        let mut statuses = vec![(TransactionStatus::Success, at)];
        if i % 20 == 0 && written + 1 < pairs {
            statuses.push((
                TransactionStatus::Pending,
                at - chrono::Duration::minutes(1),
            ));
        }
        for (status, at) in statuses {
            store
                .record_callback_failure(CallbackFailure {
                    nonce: nonce.as_str().into(),
                    status,
                    reason: "handler failed: ledger unavailable".into(),
                    transaction_reference_id: uuid::Uuid::new_v4(),
                    client_id: "client-42".into(),
                    amount: rust_decimal::Decimal::new(1050, 2),
                    currency: "EUR".into(),
                    at,
                })
                .await
                .unwrap();
            written += 1;
        }
        i += 1;
    }
    while store.failing_count().await.unwrap() < pairs {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints each read's median time on `store`, which holds `pairs` failing pairs.
async fn measure(name: &str, store: &dyn Store, pairs: usize) {
    let latest = median(|| async { timed(|| store.failing_latest(100)).await.0 }).await;
    line(name, "the latest 100", latest);
    let first = median(|| async { timed(|| store.failing_page(None, PAGE)).await.0 }).await;
    line(name, &format!("the first page of {PAGE}"), first);

    // Every page in turn, keeping the cursors of the middle one and of the last.
    let started = Instant::now();
    let (mut after, mut listed, mut cursors) = (None, 0, Vec::new());
    loop {
        let page = store.failing_page(after.clone(), PAGE).await.unwrap();
        listed += page.failing.len();
        cursors.push(after);
        after = page.next;
        if after.is_none() {
            break;
        }
    }
    let walked = started.elapsed();
    assert_eq!(listed, pairs, "every pair listed once");
    let middle: Option<FailingCursor> = cursors[cursors.len() / 2].clone();
    let last: Option<FailingCursor> = cursors[cursors.len() - 1].clone();
    let middle =
        median(|| async { timed(|| store.failing_page(middle.clone(), PAGE)).await.0 }).await;
    line(name, &format!("a page of {PAGE} from the middle"), middle);
    let last = median(|| async { timed(|| store.failing_page(last.clone(), PAGE)).await.0 }).await;
    line(name, "the last page", last);
    line(
        name,
        &format!("every page in turn ({})", cursors.len()),
        walked,
    );
    let all = median(|| async {
        let (took, all) = timed(|| store.failing_callbacks()).await;
        assert_eq!(all.len(), pairs);
        took
    })
    .await;
    line(name, "all at once", all);
    let count = median(|| async { timed(|| store.failing_count()).await.0 }).await;
    line(name, "the count", count);
}

/// How long `read` takes, from the call (the embedded store reads before it returns its
/// future) to the answer, and the answer.
async fn timed<T, F>(read: impl FnOnce() -> F) -> (Duration, T)
where
    F: std::future::Future<Output = Result<T, payhook::store::StoreError>>,
{
    let started = Instant::now();
    let value = read().await.unwrap();
    (started.elapsed(), value)
}

/// The median of [`READS`] runs of `run`.
async fn median<F: std::future::Future<Output = Duration>>(run: impl Fn() -> F) -> Duration {
    let mut took = Vec::with_capacity(READS);
    for _ in 0..READS {
        took.push(run().await);
    }
    took.sort();
    took[READS / 2]
}

/// One figure: the backend, what was read, how long it took.
fn line(backend: &str, read: &str, took: Duration) {
    println!(
        "{backend:<11} {read:<34} {:>10.3} ms",
        took.as_secs_f64() * 1000.0
    );
}
