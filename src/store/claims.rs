//! In-flight claims, in memory.
//!
//! A claim says "this delivery is processing this nonce". It is taken under the lock of the
//! nonce's shard, after reading the durable record, so that two deliveries never both take
//! it. It lives only in memory: if the process dies, the claim dies with it, which is what
//! a takeover after a crash would do anyway.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::Claim;

/// Shards of the claim map; a nonce's shard is chosen by hash, so unrelated nonces rarely
/// wait for each other.
const SHARDS: usize = 16;

/// What is known in memory about one nonce that is not acknowledged yet.
#[derive(Debug, Clone, Default)]
pub(crate) struct Entry {
    /// The current claim and when it was taken (ms since the Unix epoch).
    pub(crate) claim: Option<(Claim, u64)>,
    /// Deliveries of this nonce that reached the handler in this process.
    pub(crate) attempts: u32,
    /// Last change (ms since the Unix epoch), for pruning forgotten nonces.
    pub(crate) touched_ms: u64,
}

/// The claims of one kind (callbacks or validations).
#[derive(Debug)]
pub(crate) struct Claims {
    shards: Vec<Mutex<HashMap<String, Entry>>>,
    next: AtomicU64,
}

impl Default for Claims {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            next: AtomicU64::new(1),
        }
    }
}

impl Claims {
    /// The locked shard of `nonce`.
    pub(crate) fn shard(&self, nonce: &str) -> MutexGuard<'_, HashMap<String, Entry>> {
        let hash = nonce.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let index = usize::try_from(hash % SHARDS as u64).unwrap_or_default();
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new, unique claim.
    pub(crate) fn new_claim(&self) -> Claim {
        Claim {
            id: self.next.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// `true` while `claim` owns `nonce`.
    pub(crate) fn owns(&self, nonce: &str, claim: Claim) -> bool {
        self.shard(nonce)
            .get(nonce)
            .and_then(|e| e.claim)
            .is_some_and(|(c, _)| c == claim)
    }

    /// Ends `claim` on `nonce`: forgets the nonce when it was acknowledged, else keeps its
    /// attempt count for the next delivery.
    pub(crate) fn end(&self, nonce: &str, claim: Claim, acknowledged: bool, now_ms: u64) {
        let mut shard = self.shard(nonce);
        let owned = shard
            .get(nonce)
            .and_then(|e| e.claim)
            .is_some_and(|(c, _)| c == claim);
        if !owned {
            return;
        }
        if acknowledged {
            shard.remove(nonce);
        } else if let Some(entry) = shard.get_mut(nonce) {
            entry.claim = None;
            entry.touched_ms = now_ms;
        }
    }

    /// Forgets unclaimed nonces untouched since `before_ms` (never acknowledged, given up).
    pub(crate) fn prune(&self, before_ms: u64) {
        for shard in &self.shards {
            let mut shard = shard
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            shard.retain(|_, entry| entry.claim.is_some() || entry.touched_ms >= before_ms);
        }
    }
}
