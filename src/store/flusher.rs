//! Group commit: one thread owns flushing; request tasks wait for a flush that started
//! after their write.
//!
//! sled's `flush_async` deadlocks on 0.34 (spacejam/sled#1308) and concurrent `flush()`
//! calls do not coalesce, so flushing once per request caps a server at a few thousand
//! requests per second. Here every writer takes a ticket *after* its write; the flusher reads
//! the newest ticket, flushes, and publishes it: every writer whose ticket is at or below it
//! is durable. A batch is as large as the writes that arrived during the previous flush —
//! adaptive, with no fixed window.
//!
//! sled's `flush()` ends in `sync_file_range` on Linux, which does not empty the disk's
//! write cache (spacejam/sled#1452); each flush is therefore followed by `fdatasync` of
//! sled's data file, so that an acknowledged record survives power loss too.

use std::{
    fs::File,
    path::Path,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};
use tokio::sync::watch;

use super::StoreError;

/// Pause before retrying a failed flush.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

struct Shared {
    /// Tickets handed out; a ticket is taken after the write it covers.
    tickets: AtomicU64,
    /// `(work pending, stop requested)`, guarded for the condition variable.
    wake: Mutex<(bool, bool)>,
    cond: Condvar,
    /// The newest ticket known durable.
    flushed: watch::Sender<u64>,
}

/// The flushing thread and the tickets. Created by [`super::SledStore::open`]; the thread
/// stops (after a last flush) when this is dropped.
pub(crate) struct GroupCommit {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl GroupCommit {
    pub(crate) fn start(db: sled::Db, data_file: &Path) -> std::io::Result<Self> {
        let file = File::open(data_file)?;
        let (flushed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            tickets: AtomicU64::new(0),
            wake: Mutex::new((false, false)),
            cond: Condvar::new(),
            flushed,
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("payhook-flusher".into())
            .spawn(move || run(&thread_shared, &db, &file))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Resolves once every write made before this call is durable.
    pub(crate) async fn durable(&self) -> Result<(), StoreError> {
        let mut flushed = self.shared.flushed.subscribe();
        let ticket = self.shared.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        self.signal(|state| state.0 = true);
        flushed
            .wait_for(|done| *done >= ticket)
            .await
            .map(|_| ())
            .map_err(|_| StoreError::Backend("the flusher stopped".into()))
    }

    fn signal(&self, change: impl FnOnce(&mut (bool, bool))) {
        let mut state = self
            .shared
            .wake
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut state);
        self.shared.cond.notify_one();
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.signal(|state| state.1 = true);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the flusher thread panicked");
        }
    }
}

fn run(shared: &Shared, db: &sled::Db, file: &File) {
    let mut durable = 0u64;
    loop {
        let stop = {
            let mut state = shared
                .wake
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while !state.0 && !state.1 {
                state = shared
                    .cond
                    .wait(state)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            state.0 = false;
            state.1
        };
        let target = shared.tickets.load(Ordering::SeqCst);
        if target > durable || stop {
            match flush(db, file) {
                Ok(()) => {
                    durable = target;
                    shared.flushed.send_replace(target);
                }
                Err(error) => {
                    tracing::error!(%error, "flush failed; retrying");
                    std::thread::sleep(RETRY_PAUSE);
                    let mut state = shared
                        .wake
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    state.0 = true;
                    continue;
                }
            }
        }
        if stop {
            return;
        }
    }
}

fn flush(db: &sled::Db, file: &File) -> Result<(), StoreError> {
    db.flush()?;
    file.sync_data()
        .map_err(|e| StoreError::Backend(format!("fdatasync: {e}")))
}
