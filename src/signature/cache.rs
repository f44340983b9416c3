//! Remembering signatures that verified, so that a retry skips the public-key operation.
//!
//! The aggregator retries a callback with the same bytes and the same signature. A retry
//! whose (signature, body) digest matches one that verified before is accepted without the
//! RSA or ECDSA operation; any changed byte of either changes the digest and is verified
//! afresh. The digest is SHA-256 over the signature's length, the signature and the body, so
//! no two different pairs share an input.

use ring::digest::{Context, Digest, SHA256};
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// Pairs remembered; the oldest is forgotten first. 16k × 32 bytes ≈ 1 MiB with overhead.
const CAPACITY: usize = 16 * 1024;

/// A bounded set of digests of (signature, body) pairs that verified.
#[derive(Debug, Default)]
pub(crate) struct VerifiedCache {
    inner: Mutex<Remembered>,
}

/// The digests, and their order of arrival for forgetting the oldest.
#[derive(Debug, Default)]
struct Remembered {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl VerifiedCache {
    /// The digest of a (signature, body) pair.
    pub(crate) fn digest(signature: &[u8], body: &[u8]) -> [u8; 32] {
        let mut context = Context::new(&SHA256);
        context.update(&(signature.len() as u64).to_be_bytes());
        context.update(signature);
        context.update(body);
        to_array(&context.finish())
    }

    /// `true` when the pair verified before.
    pub(crate) fn contains(&self, digest: &[u8; 32]) -> bool {
        self.lock().set.contains(digest)
    }

    /// Remembers a pair that verified.
    pub(crate) fn insert(&self, digest: [u8; 32]) {
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

fn to_array(digest: &Digest) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_of_body_or_signature_is_a_different_pair() {
        let cache = VerifiedCache::default();
        cache.insert(VerifiedCache::digest(b"sig", b"body"));
        assert!(cache.contains(&VerifiedCache::digest(b"sig", b"body")));
        assert!(!cache.contains(&VerifiedCache::digest(b"sig", b"bodY")));
        assert!(!cache.contains(&VerifiedCache::digest(b"siG", b"body")));
        assert!(
            !cache.contains(&VerifiedCache::digest(b"sigb", b"ody")),
            "the boundary is part of the digest"
        );
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_the_oldest() {
        let cache = VerifiedCache::default();
        for i in 0..(CAPACITY + 10) as u64 {
            cache.insert(VerifiedCache::digest(&i.to_be_bytes(), b""));
        }
        assert_eq!(cache.lock().set.len(), CAPACITY);
        assert!(!cache.contains(&VerifiedCache::digest(&0u64.to_be_bytes(), b"")));
        assert!(cache.contains(&VerifiedCache::digest(
            &((CAPACITY + 9) as u64).to_be_bytes(),
            b""
        )));
    }
}
