//! What a store's commits cost, for `/metrics`: how long each took to become durable and
//! how many writes it carried. Kept by the backends (sled's group commit; PostgreSQL's
//! booking transactions, one booking each); shared with the server, which exposes them.

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Histograms of a store's commits. Cheap to clone: clones share the counts.
#[derive(Debug, Clone)]
pub struct CommitMetrics {
    seconds: Histogram,
    batch: Histogram,
}

impl Default for CommitMetrics {
    fn default() -> Self {
        Self {
            // 0.1 ms to about 2.4 s.
            seconds: Histogram::new(exponential_buckets(0.0001, 2.5, 12)),
            // 1 to 512 writes.
            batch: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
        }
    }
}

impl CommitMetrics {
    /// Counts one commit of `writes` writes that took `seconds` to become durable.
    pub(crate) fn observe(&self, seconds: f64, writes: usize) {
        self.seconds.observe(seconds);
        self.batch.observe(writes as f64);
    }

    /// The commit time (seconds) and batch size histograms.
    pub(crate) fn histograms(&self) -> (Histogram, Histogram) {
        (self.seconds.clone(), self.batch.clone())
    }
}
