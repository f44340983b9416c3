//! Remembering signed (signature, body) pairs: those that verified, so that a retry skips the
//! public-key operation, and those this process booked, so that a retry of one is answered
//! without reading the store.
//!
//! The aggregator retries a callback with the same bytes and the same signature. A retry
//! whose (signature, body) pair matches one that verified before is accepted without the
//! RSA or ECDSA operation; any changed byte of either is verified afresh.
//!
//! A pair whose callback this process booked — durably, with the store's answer in hand —
//! is also marked **booked until** its record's retention ends, counted from before the
//! booking began, on a store that allows it (`Store::process_may_remember_bookings`: sled,
//! whose only writer is this process, and which stops rather than go on without what it
//! acknowledged; not a shared database, which another instance, a failover or an operator can
//! change underneath). A retry of those exact bytes is a duplicate the store would answer
//! the same way, once free of any other delivery of its nonce: the record of a booked
//! (nonce, status) stays until its retention ends on this process's clock, and nothing moves
//! a status back to not booked. So the callback endpoint answers it as a duplicate from this
//! mark (see `server/exactly_once.rs`), and the store is read for retries of what another
//! process, or this one before a restart, booked, and of pairs the cache has forgotten (the
//! oldest go first beyond its capacity).
//!
//! ## The pair's digest
//!
//! A pair is remembered by a 16-byte tag: ChaCha20-Poly1305's tag over the signature's
//! length, the signature and the body as associated data (nothing encrypted), under a key
//! drawn at random when the process starts and a nonce fixed for its life. With the nonce
//! fixed, the tag is Poly1305 under one secret key: a keyed hash under which two different
//! inputs of up to L bytes share a tag with probability at most about 8⌈L/16⌉/2¹⁰⁶ (2⁻⁸⁷ at
//! the largest body `server.body_limit` allows by default, 1 MiB), whatever inputs an
//! attacker chooses, as long as the key stays secret. It does: tags never leave the process
//! (not logged, not answered, not stored). An attacker's only view is whether a forged pair
//! was taken for a remembered one, and with a full cache each try succeeds with probability
//! below 2⁻⁷³ — one success expected in some 3 × 10⁹ years at 100,000 tries a second. For that,
//! the tag costs a fifth of a SHA-256 digest on a CPU without SHA instructions, and every
//! request pays it once (1.3 KiB: 0.8 µs against 4.1 µs on the 2-core Intel VM of
//! 2026-11-26).
//!
//! Should the operating system give no random key, nothing is remembered and every
//! signature is verified.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use std::collections::{HashMap, VecDeque, hash_map::Entry};
use std::sync::{Arc, Mutex};

/// Pairs remembered; the oldest is forgotten first. The map's 32k buckets of 24 bytes and
/// the order's 32k slots of 16: about 1.3 MiB.
const CAPACITY: usize = 16 * 1024;

/// The tag of a (signature, body) pair: see the module docs.
type Digest = [u8; 16];

/// A request's (signature, body) pair, by its tag in the cache of the keys that verify it:
/// what it is told and marks stays in that cache, and a cache replaced with its keys
/// (`signature.keys` read again) knows nothing of it.
#[derive(Debug, Clone)]
pub(crate) struct SignedPair {
    digest: Digest,
    cache: Arc<VerifiedCache>,
}

impl SignedPair {
    /// The pair `signature` over `body` in `cache`; `None` when the cache remembers nothing.
    pub(crate) fn of(cache: &Arc<VerifiedCache>, signature: &[u8], body: &[u8]) -> Option<Self> {
        Some(Self {
            digest: cache.digest(signature, body)?,
            cache: Arc::clone(cache),
        })
    }

    /// `true` when the pair verified before.
    pub(crate) fn verified_before(&self) -> bool {
        self.cache.contains(&self.digest)
    }

    /// Remembers that the pair verified.
    pub(crate) fn remember_verified(&self) {
        self.cache.insert(self.digest);
    }

    /// `true` when this process booked the pair's callback and the booking's record is kept
    /// beyond `now_ms`.
    pub(crate) fn booked(&self, now_ms: u64) -> bool {
        self.cache.booked(&self.digest, now_ms)
    }

    /// Marks the pair booked until `until_ms`: its callback's (nonce, status) is durably
    /// booked, and its record kept at least until then.
    pub(crate) fn mark_booked(&self, until_ms: u64) {
        self.cache.mark_booked(self.digest, until_ms);
    }
}

/// A bounded map of the tags of (signature, body) pairs that verified, each with the time
/// until which it is known booked.
pub(crate) struct VerifiedCache {
    /// The process's secret key; `None` when the system gave no randomness (nothing is
    /// remembered then).
    key: Option<LessSafeKey>,
    inner: Mutex<Remembered>,
}

impl std::fmt::Debug for VerifiedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of `Debug`: with it, pairs sharing a tag could be made.
        f.debug_struct("VerifiedCache")
            .field("remembering", &self.key.is_some())
            .finish_non_exhaustive()
    }
}

/// The tags, each with the end of its booking (ms since the Unix epoch; 0 when only
/// verified), and their order of arrival for forgetting the oldest.
#[derive(Debug, Default)]
struct Remembered {
    booked_until_ms: HashMap<Digest, u64>,
    order: VecDeque<Digest>,
}

impl Default for VerifiedCache {
    /// A cache under a key drawn from the operating system's randomness.
    fn default() -> Self {
        let mut secret = [0u8; 32];
        let key = SystemRandom::new()
            .fill(&mut secret)
            .ok()
            .and_then(|()| UnboundKey::new(&CHACHA20_POLY1305, &secret).ok())
            .map(LessSafeKey::new);
        if key.is_none() {
            tracing::warn!(
                "no randomness for the signature cache's key: every retry's signature is verified again"
            );
        }
        Self {
            key,
            inner: Mutex::default(),
        }
    }
}

impl VerifiedCache {
    /// The tag of a (signature, body) pair; `None` when nothing can be remembered.
    fn digest(&self, signature: &[u8], body: &[u8]) -> Option<Digest> {
        let key = self.key.as_ref()?;
        // One buffer: the signature's length makes the boundary part of the input.
        let mut input = Vec::with_capacity(8 + signature.len() + body.len());
        input.extend_from_slice(&(signature.len() as u64).to_be_bytes());
        input.extend_from_slice(signature);
        input.extend_from_slice(body);
        // The fixed nonce is sound here only because the tag never leaves the process.
        let nonce = Nonce::assume_unique_for_key([0; 12]);
        let tag = key
            .seal_in_place_separate_tag(nonce, Aad::from(input), &mut [])
            .ok()?;
        tag.as_ref().try_into().ok()
    }

    /// `true` when the pair verified before.
    fn contains(&self, digest: &Digest) -> bool {
        self.lock().booked_until_ms.contains_key(digest)
    }

    /// Remembers a pair that verified.
    fn insert(&self, digest: Digest) {
        self.remember(digest, 0);
    }

    /// `true` when this process booked the pair's callback and the booking's record is kept
    /// beyond `now_ms`.
    fn booked(&self, digest: &Digest, now_ms: u64) -> bool {
        self.lock()
            .booked_until_ms
            .get(digest)
            .is_some_and(|until| now_ms < *until)
    }

    /// Marks a verified pair booked until `until_ms`: its callback's (nonce, status) is
    /// durably booked, and its record kept at least until then.
    fn mark_booked(&self, digest: Digest, until_ms: u64) {
        self.remember(digest, until_ms);
    }

    fn remember(&self, digest: Digest, booked_until_ms: u64) {
        let mut remembered = self.lock();
        match remembered.booked_until_ms.entry(digest) {
            Entry::Occupied(mut known) => {
                let until = known.get_mut();
                *until = (*until).max(booked_until_ms);
            }
            Entry::Vacant(new) => {
                new.insert(booked_until_ms);
                remembered.order.push_back(digest);
                if remembered.order.len() > CAPACITY
                    && let Some(oldest) = remembered.order.pop_front()
                {
                    remembered.booked_until_ms.remove(&oldest);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(cache: &VerifiedCache, signature: &[u8], body: &[u8]) -> Digest {
        cache.digest(signature, body).expect("the cache has a key")
    }

    #[test]
    fn a_changed_byte_of_body_or_signature_is_a_different_pair() {
        let cache = VerifiedCache::default();
        cache.insert(tag(&cache, b"sig", b"body"));
        assert!(cache.contains(&tag(&cache, b"sig", b"body")));
        assert!(!cache.contains(&tag(&cache, b"sig", b"bodY")));
        assert!(!cache.contains(&tag(&cache, b"siG", b"body")));
        assert!(!cache.contains(&tag(&cache, b"sig", b"body ")));
        assert!(
            !cache.contains(&tag(&cache, b"sigb", b"ody")),
            "the boundary is part of the digest"
        );
    }

    #[test]
    fn each_process_tags_a_pair_under_a_key_of_its_own() {
        let (one, other) = (VerifiedCache::default(), VerifiedCache::default());
        assert_eq!(tag(&one, b"sig", b"body"), tag(&one, b"sig", b"body"));
        assert_ne!(
            tag(&one, b"sig", b"body"),
            tag(&other, b"sig", b"body"),
            "two caches drew the same key"
        );
        assert!(!format!("{one:?}").contains("key:"), "{one:?}");
    }

    #[test]
    fn without_a_key_nothing_is_remembered() {
        let cache = VerifiedCache {
            key: None,
            inner: Mutex::default(),
        };
        assert_eq!(cache.digest(b"sig", b"body"), None);
    }

    #[test]
    fn a_pair_is_booked_only_once_marked_and_only_until_its_end() {
        let cache = VerifiedCache::default();
        let (pair, other) = (tag(&cache, b"sig", b"body"), tag(&cache, b"sig", b"other"));
        cache.insert(pair);
        assert!(!cache.booked(&pair, 1_000), "verified is not booked");
        cache.mark_booked(pair, 2_000);
        assert!(cache.contains(&pair));
        assert!(cache.booked(&pair, 1_999));
        assert!(
            !cache.booked(&pair, 2_000),
            "the booking's record may be gone from then on"
        );
        assert!(!cache.booked(&other, 1_000));
        // Verified again later (a retry after the mark was made): still booked.
        cache.insert(pair);
        assert!(cache.booked(&pair, 1_999));
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_the_oldest() {
        let cache = VerifiedCache::default();
        for i in 0..(CAPACITY + 10) as u64 {
            cache.insert(tag(&cache, &i.to_be_bytes(), b""));
        }
        assert_eq!(cache.lock().booked_until_ms.len(), CAPACITY);
        assert!(!cache.contains(&tag(&cache, &0u64.to_be_bytes(), b"")));
        assert!(cache.contains(&tag(&cache, &((CAPACITY + 9) as u64).to_be_bytes(), b"")));
    }
}
