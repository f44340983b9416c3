//! In-flight claims, in memory.
//!
//! A claim says "this delivery is processing this nonce". It is taken under the lock of the
//! nonce's shard, after reading the durable record, so that two deliveries never both take
//! it. It lives only in memory: if the process dies, the claim dies with it, which is what
//! a takeover after a crash would do anyway.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Claim;
use super::record::CallbackRecord;

/// Shards of the claim map; a nonce's shard is chosen by hash, so unrelated nonces rarely
/// wait for each other.
const SHARDS: usize = 16;

/// Unclaimed entries a shard keeps (their attempt counts) before it forgets the oldest: the
/// map stays bounded whatever nonces clients send that are never acknowledged. Forgetting
/// one only restarts its attempt count.
const UNCLAIMED_PER_SHARD: usize = 4096;

/// Bytes of nonces a shard keeps before it forgets the oldest unclaimed ones: the count
/// alone would let long nonces (up to `server.max_identifier_chars`) take 16 × 4096 × 16 KiB.
/// With this, the nonces of one kind of claim take at most 16 MiB.
const NONCE_BYTES_PER_SHARD: usize = 1024 * 1024;

/// What is known in memory about one nonce that is not acknowledged yet.
#[derive(Debug, Clone, Default)]
pub(crate) struct Entry {
    /// The current claim and when it was taken (a monotonic time: a step of the wall
    /// clock must not make a live claim look stale).
    pub(crate) claim: Option<(Claim, Instant)>,
    /// Deliveries of this nonce that reached the handler in this process.
    pub(crate) attempts: u32,
    /// The status code a callback's current claim is for (0 for validations).
    pub(crate) status: i32,
    /// Last change (ms since the Unix epoch), for pruning forgotten nonces.
    pub(crate) touched_ms: u64,
    /// A callback's durable record as read when the claim was taken, handed to its commit
    /// so that the commit need not read it again; `None` when the claim took over a stale
    /// one (the commit reads the record itself), for validations, and once handed over.
    pub(crate) record: Option<CallbackRecord>,
}

/// What a commit takes from the claim it writes for: see [`Claims::take_owned`].
#[derive(Debug)]
pub(crate) struct Owned {
    /// Deliveries of the nonce that reached the handler, this one included.
    pub(crate) attempts: u32,
    /// The record read when the claim was taken, if it was kept.
    pub(crate) record: Option<CallbackRecord>,
}

/// The claims of one kind (callbacks or validations).
#[derive(Debug)]
pub(crate) struct Claims {
    shards: Vec<Mutex<Shard>>,
    next: AtomicU64,
}

/// One shard's entries, and the bytes of their nonces.
#[derive(Debug, Default)]
pub(crate) struct Shard {
    entries: HashMap<String, Entry>,
    nonce_bytes: usize,
}

impl Shard {
    pub(crate) fn get(&self, nonce: &str) -> Option<&Entry> {
        self.entries.get(nonce)
    }

    /// The entry of `nonce`, created empty when there is none.
    pub(crate) fn entry(&mut self, nonce: &str) -> &mut Entry {
        if !self.entries.contains_key(nonce) {
            self.nonce_bytes += nonce.len();
        }
        self.entries.entry(nonce.to_owned()).or_default()
    }

    pub(crate) fn remove(&mut self, nonce: &str) {
        if self.entries.remove(nonce).is_some() {
            self.nonce_bytes -= nonce.len();
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        let mut removed = 0;
        self.entries.retain(|nonce, entry| {
            let kept = keep(entry);
            if !kept {
                removed += nonce.len();
            }
            kept
        });
        self.nonce_bytes -= removed;
    }

    fn over_bound(&self) -> bool {
        self.entries.len() > UNCLAIMED_PER_SHARD || self.nonce_bytes > NONCE_BYTES_PER_SHARD
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
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
    pub(crate) fn shard(&self, nonce: &str) -> MutexGuard<'_, Shard> {
        self.shards[shard_of(nonce)]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new, unique claim.
    pub(crate) fn new_claim(&self) -> Claim {
        Claim {
            id: self.next.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// `true` while `entry` is claimed, for at most `stale_after`: a claim older than that
    /// belongs to a delivery that never finished and may be taken over.
    pub(crate) fn live(entry: &Entry, stale_after: Duration) -> bool {
        entry
            .claim
            .is_some_and(|(_, since)| since.elapsed() <= stale_after)
    }

    /// `true` while `claim` owns `nonce`.
    pub(crate) fn owns(&self, nonce: &str, claim: Claim) -> bool {
        self.shard(nonce)
            .get(nonce)
            .and_then(|e| e.claim)
            .is_some_and(|(c, _)| c == claim)
    }

    /// For the commit of `claim`'s write: `None` unless `claim` still owns `nonce`; else the
    /// attempts counted and the record kept when the claim was taken (taken: a commit that
    /// fails leaves the next claim to read the record again).
    pub(crate) fn take_owned(&self, nonce: &str, claim: Claim) -> Option<Owned> {
        let mut shard = self.shard(nonce);
        let entry = shard.entries.get_mut(nonce)?;
        if entry.claim.is_none_or(|(c, _)| c != claim) {
            return None;
        }
        Some(Owned {
            attempts: entry.attempts,
            record: entry.record.take(),
        })
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
        } else if let Some(entry) = shard.entries.get_mut(nonce) {
            entry.claim = None;
            entry.record = None;
            entry.touched_ms = now_ms;
            if shard.over_bound() {
                forget_oldest_unclaimed(&mut shard);
            }
        }
    }

    /// [`Claims::end`] of a claim given up before any handler ran: its attempt is not
    /// counted.
    pub(crate) fn give_back(&self, nonce: &str, claim: Claim, now_ms: u64) {
        {
            let mut shard = self.shard(nonce);
            if let Some(entry) = shard.entries.get_mut(nonce)
                && entry.claim.is_some_and(|(c, _)| c == claim)
            {
                entry.attempts = entry.attempts.saturating_sub(1);
            }
        }
        self.end(nonce, claim, false, now_ms);
    }

    /// Forgets unclaimed nonces untouched since `before_ms` (never acknowledged, given up).
    pub(crate) fn prune(&self, before_ms: u64) {
        for shard in &self.shards {
            let mut shard = shard
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            shard.retain(|entry| entry.claim.is_some() || entry.touched_ms >= before_ms);
        }
    }
}

/// The shard of `nonce` (FNV-1a).
fn shard_of(nonce: &str) -> usize {
    let hash = nonce.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    usize::try_from(hash % SHARDS as u64).unwrap_or_default()
}

/// Forgets the oldest unclaimed entries of a full shard, down to three quarters of its
/// bounds (so that the scan is paid once per quarter of them).
fn forget_oldest_unclaimed(shard: &mut Shard) {
    let mut unclaimed: Vec<(u64, usize)> = shard
        .entries
        .iter()
        .filter(|(_, e)| e.claim.is_none())
        .map(|(nonce, e)| (e.touched_ms, nonce.len()))
        .collect();
    unclaimed.sort_unstable();
    // Forget from the oldest until both the count and the bytes are under 3/4 of the bound.
    let (mut count, mut bytes) = (shard.entries.len(), shard.nonce_bytes);
    let mut cutoff = None;
    let mut excess = 0;
    for (touched_ms, len) in &unclaimed {
        if count <= UNCLAIMED_PER_SHARD * 3 / 4 && bytes <= NONCE_BYTES_PER_SHARD * 3 / 4 {
            break;
        }
        count -= 1;
        bytes -= len;
        excess += 1;
        cutoff = Some(*touched_ms);
    }
    let Some(cutoff) = cutoff else { return };
    let mut forgotten = 0;
    shard.retain(|e| {
        let forget = e.claim.is_none() && e.touched_ms <= cutoff && forgotten < excess;
        forgotten += usize::from(forget);
        !forget
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_forgets_its_oldest_unclaimed_nonces_beyond_its_bound() {
        let claims = Claims::default();
        // Nonces of one shard, each claimed and released unacknowledged at time i.
        let mut nonces = Vec::new();
        let mut i = 0u64;
        while nonces.len() < UNCLAIMED_PER_SHARD + 1 {
            let nonce = format!("nonce-{i}");
            i += 1;
            if shard_of(&nonce) == shard_of("nonce-0") {
                nonces.push(nonce);
            }
        }
        let live = claims.new_claim();
        *claims.shard("held").entry("held") = Entry {
            claim: Some((live, Instant::now())),
            attempts: 1,
            touched_ms: 0,
            record: None,
            ..Entry::default()
        };
        for (t, nonce) in nonces.iter().enumerate() {
            let claim = claims.new_claim();
            *claims.shard(nonce).entry(nonce) = Entry {
                claim: Some((claim, Instant::now())),
                attempts: 1,
                touched_ms: 0,
                record: None,
                ..Entry::default()
            };
            claims.end(nonce, claim, false, 1_000 + t as u64);
        }
        let shard = claims.shard(&nonces[0]);
        assert!(shard.len() <= UNCLAIMED_PER_SHARD, "{}", shard.len());
        // The oldest went, the newest stayed; a claimed entry is never forgotten.
        assert!(shard.get(&nonces[0]).is_none());
        assert!(shard.get(nonces.last().unwrap()).is_some());
        drop(shard);
        assert!(claims.owns("held", live));
    }

    #[test]
    fn a_shard_of_long_nonces_is_bounded_by_their_bytes() {
        let claims = Claims::default();
        let mut i = 0u64;
        let mut kept_first = None;
        for t in 0..600u64 {
            // 4 KiB nonces of one shard: 600 of them would be 2.4 MiB.
            let nonce = loop {
                let nonce = format!("{i:0>4096}");
                i += 1;
                if shard_of(&nonce) == 0 {
                    break nonce;
                }
            };
            kept_first.get_or_insert_with(|| nonce.clone());
            let claim = claims.new_claim();
            claims.shard(&nonce).entry(&nonce).claim = Some((claim, Instant::now()));
            claims.end(&nonce, claim, false, t);
            let shard = claims.shard(&nonce);
            assert!(
                shard.nonce_bytes <= NONCE_BYTES_PER_SHARD,
                "{}",
                shard.nonce_bytes
            );
            assert_eq!(
                shard.nonce_bytes,
                shard.entries.keys().map(String::len).sum::<usize>()
            );
        }
        let first = kept_first.unwrap();
        assert!(
            claims.shard(&first).get(&first).is_none(),
            "the oldest went"
        );
    }
}
