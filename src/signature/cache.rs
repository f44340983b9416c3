//! Remembering signatures that verified, so that a retry skips the public-key operation.
//!
//! The aggregator retries a callback with the same bytes and the same signature. A retry
//! whose (signature, body) pair matches one that verified before is accepted without the
//! RSA or ECDSA operation; any changed byte of either is verified afresh.
//!
//! ## The pair's digest
//!
//! A pair is remembered by a 16-byte tag: ChaCha20-Poly1305's tag over the signature's
//! length, the signature and the body as associated data (nothing encrypted), under a key
//! drawn at random when the process starts and a nonce fixed for its life. With the nonce
//! fixed, the tag is Poly1305 under one secret key: a keyed hash under which two different
//! inputs of up to L bytes share a tag with probability at most 8⌈L/16⌉/2¹⁰⁶ (below 2⁻⁸⁷ at
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
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// Pairs remembered; the oldest is forgotten first. 16k × 16 bytes, twice, ≈ 0.5 MiB.
const CAPACITY: usize = 16 * 1024;

/// The tag of a (signature, body) pair: see the module docs.
pub(crate) type Digest = [u8; 16];

/// A bounded set of tags of (signature, body) pairs that verified.
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

/// The tags, and their order of arrival for forgetting the oldest.
#[derive(Debug, Default)]
struct Remembered {
    set: HashSet<Digest>,
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
    pub(crate) fn digest(&self, signature: &[u8], body: &[u8]) -> Option<Digest> {
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
    pub(crate) fn contains(&self, digest: &Digest) -> bool {
        self.lock().set.contains(digest)
    }

    /// Remembers a pair that verified.
    pub(crate) fn insert(&self, digest: Digest) {
        let mut remembered = self.lock();
        if remembered.set.insert(digest) {
            remembered.order.push_back(digest);
            if remembered.order.len() > CAPACITY
                && let Some(oldest) = remembered.order.pop_front()
            {
                remembered.set.remove(&oldest);
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
    fn the_cache_is_bounded_and_forgets_the_oldest() {
        let cache = VerifiedCache::default();
        for i in 0..(CAPACITY + 10) as u64 {
            cache.insert(tag(&cache, &i.to_be_bytes(), b""));
        }
        assert_eq!(cache.lock().set.len(), CAPACITY);
        assert!(!cache.contains(&tag(&cache, &0u64.to_be_bytes(), b"")));
        assert!(cache.contains(&tag(&cache, &((CAPACITY + 9) as u64).to_be_bytes(), b"")));
    }
}
