//! Keys taken out of the configured keys while the service runs, kept to tell a signature
//! they alone verify apart from a forgery. Such a signature is still refused: it tells the
//! merchant that a rotation went too early — the aggregator still signs with the key, or
//! retries what it signed before (a retry carries its first signature) — while listing the
//! key again would let those callbacks in.
//!
//! Kept in memory, for the life of the process, the last [`KEPT`] keys taken out: a key
//! taken out across a restart is not known. A signature that verifies with none of the
//! keys listed costs a verification more per key kept.

use super::{Algorithm, PublicKey, Verifier};

/// Keys taken out that are kept, the latest first.
pub(crate) const KEPT: usize = 4;

/// The keys taken out of a verifier's, the latest first (at most [`KEPT`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct RetiredKeys(Vec<Retired>);

/// One key taken out, with its name among the keys it was taken out of.
#[derive(Debug, Clone)]
struct Retired {
    name: String,
    key: PublicKey,
    algorithm: Algorithm,
}

impl RetiredKeys {
    /// The keys taken out when `before`'s keys (with `earlier`, those taken out before it)
    /// are replaced by `now`'s: those of `before` that `now` does not list — by material
    /// and algorithm, whatever their ids — then those of `earlier` it does not list again.
    pub(crate) fn after(before: &Verifier, earlier: &RetiredKeys, now: &Verifier) -> Self {
        let listed = |key: &PublicKey, algorithm: Algorithm| {
            now.keys()
                .any(|(other, with)| with == algorithm && other.same_key(key))
        };
        let mut retired: Vec<Retired> = Vec::with_capacity(KEPT);
        let taken_out = before
            .named_keys()
            .map(|(name, key, algorithm)| Retired {
                name,
                key: key.clone(),
                algorithm,
            })
            .chain(earlier.0.iter().cloned());
        for key in taken_out {
            let known = retired
                .iter()
                .any(|r| r.algorithm == key.algorithm && r.key.same_key(&key.key));
            if !known && !listed(&key.key, key.algorithm) {
                retired.push(key);
            }
        }
        retired.truncate(KEPT);
        Self(retired)
    }

    /// The name of the key taken out that verifies `signature` over `body`, if one does.
    pub(crate) fn verifying(&self, body: &[u8], signature: &[u8]) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.key.verifies(r.algorithm, body, signature))
            .map(|r| r.name.as_str())
    }

    /// The names of the keys kept, the latest taken out first.
    #[cfg(test)]
    fn names(&self) -> Vec<&str> {
        self.0.iter().map(|r| r.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::{Encoding, SigningKey, generate_key_pair};

    const ED: Algorithm = Algorithm::Ed25519;

    fn signer() -> SigningKey {
        let pem = generate_key_pair(ED).unwrap();
        SigningKey::from_pkcs8(pem.private_pem.as_bytes(), ED).unwrap()
    }

    fn verifier(keys: &[(&SigningKey, Option<&str>)]) -> Verifier {
        keys.iter().fold(
            Verifier::new("X-Signature", Encoding::Base64, None).unwrap(),
            |verifier, (signer, id)| {
                let key = signer.public_key();
                let key = match id {
                    Some(id) => key.with_id(*id),
                    None => key,
                };
                verifier.with_key(key, ED).unwrap()
            },
        )
    }

    #[test]
    fn a_key_taken_out_is_kept_and_verifies_what_it_signed() {
        let (old, new) = (signer(), signer());
        let before = verifier(&[(&old, Some("2026-01")), (&new, Some("2026-07"))]);
        let now = verifier(&[(&new, Some("2026-07"))]);
        let retired = RetiredKeys::after(&before, &RetiredKeys::default(), &now);
        assert_eq!(retired.names(), ["2026-01"]);
        let signature = old.sign(b"body").unwrap();
        assert_eq!(retired.verifying(b"body", &signature), Some("2026-01"));
        assert_eq!(retired.verifying(b"other", &signature), None);
        let by_new = new.sign(b"body").unwrap();
        assert_eq!(retired.verifying(b"body", &by_new), None);
    }

    #[test]
    fn a_key_listed_again_under_another_id_is_not_taken_out() {
        let (old, new) = (signer(), signer());
        let before = verifier(&[(&old, Some("a")), (&new, None)]);
        let now = verifier(&[(&old, Some("renamed")), (&new, None)]);
        assert!(
            RetiredKeys::after(&before, &RetiredKeys::default(), &now)
                .names()
                .is_empty()
        );
    }

    #[test]
    fn a_key_without_an_id_is_named_by_its_place_among_the_keys_it_left() {
        let (kept, old) = (signer(), signer());
        let before = verifier(&[(&kept, None), (&old, None)]);
        let now = verifier(&[(&kept, None)]);
        let retired = RetiredKeys::after(&before, &RetiredKeys::default(), &now);
        assert_eq!(retired.names(), ["#2 without an id"]);
    }

    #[test]
    fn the_latest_keys_taken_out_are_kept_and_one_listed_again_is_forgotten() {
        let signers: Vec<SigningKey> = (0..=KEPT + 1).map(|_| signer()).collect();
        let ids: Vec<String> = (0..signers.len()).map(|i| format!("k{i}")).collect();
        // Each rotation lists the next key alone.
        let mut retired = RetiredKeys::default();
        for i in 1..signers.len() {
            let before = verifier(&[(&signers[i - 1], Some(&ids[i - 1]))]);
            let now = verifier(&[(&signers[i], Some(&ids[i]))]);
            retired = RetiredKeys::after(&before, &retired, &now);
        }
        assert_eq!(retired.names(), ["k4", "k3", "k2", "k1"]);
        let first = signers[0].sign(b"body").unwrap();
        assert_eq!(retired.verifying(b"body", &first), None, "forgotten");
        // k3 listed again: it is no longer taken out.
        let last = signers.len() - 1;
        let before = verifier(&[(&signers[last], Some(&ids[last]))]);
        let now = verifier(&[
            (&signers[last], Some(&ids[last])),
            (&signers[3], Some("k3")),
        ]);
        let retired = RetiredKeys::after(&before, &retired, &now);
        assert_eq!(retired.names(), ["k4", "k2", "k1"]);
    }
}
