//! The layout of the store's one sled tree. Everything payhook writes for one request is
//! in one tree, so that one `sled::Batch` makes it atomic.
//!
//! | prefix | key | value |
//! |---|---|---|
//! | `c\0` | nonce | callback record (JSON) |
//! | `v\0` | nonce | validation record (JSON) |
//! | `x\0` | expiry ms (8 bytes BE) · batch id (8 bytes) | the batch's records: `tag · length · nonce`… (the expiry index, one key per batch) |
//! | `p\0` | validation id (8 bytes BE) | postponed validation (JSON) |
//! | `w\0` | validation id | deadline ms (8 bytes BE) or empty: the validation awaits a decision |
//! | `o\0` | validation id | next attempt ms (8 bytes BE): the result awaits delivery (the outbox) |
//! | `f\0` | nonce | its statuses whose handler failed and are not booked yet (JSON, see `failing.rs`) |
//! | `m\0seal` | — | the seal of the last commit: store id, commit number, time (see `watermark.rs`) |
//! | `t` name `\0` | the merchant's key | the merchant's value (declared effect trees) |

pub(crate) const CALLBACK_PREFIX: &[u8] = b"c\0";
pub(crate) const VALIDATION_PREFIX: &[u8] = b"v\0";
pub(crate) const EXPIRY_PREFIX: &[u8] = b"x\0";
pub(crate) const POSTPONED_PREFIX: &[u8] = b"p\0";
pub(crate) const WAITING_PREFIX: &[u8] = b"w\0";
pub(crate) const OUTBOX_PREFIX: &[u8] = b"o\0";
pub(crate) const FAILING_PREFIX: &[u8] = b"f\0";
pub(crate) const TAG_FAILING: u8 = b'f';
/// The seal of the last commit, checked against the watermark at open.
pub(crate) const SEAL: &[u8] = b"m\0seal";
pub(crate) const TAG_CALLBACK: u8 = b'c';
pub(crate) const TAG_VALIDATION: u8 = b'v';
pub(crate) const TAG_POSTPONED: u8 = b'p';

/// The key of validation `id` under `prefix` (one of the three postponed prefixes).
pub(crate) fn by_id(prefix: &[u8], id: i64) -> Vec<u8> {
    [prefix, &id.to_be_bytes()].concat()
}

/// The validation id of a key made by [`by_id`].
pub(crate) fn id_of(key: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(key.get(2..10)?.try_into().ok()?))
}

/// A millisecond time stored as a value: 8 bytes big-endian; anything else reads as 0.
pub(crate) fn millis_of(value: &[u8]) -> u64 {
    value.try_into().map_or(0, u64::from_be_bytes)
}

pub(crate) fn callback(nonce: &str) -> Vec<u8> {
    [CALLBACK_PREFIX, nonce.as_bytes()].concat()
}

pub(crate) fn failing(nonce: &str) -> Vec<u8> {
    [FAILING_PREFIX, nonce.as_bytes()].concat()
}

pub(crate) fn validation(nonce: &str) -> Vec<u8> {
    [VALIDATION_PREFIX, nonce.as_bytes()].concat()
}

/// The expiry index key of one batch: when its records expire, and which batch it was.
pub(crate) fn expiry(expires_ms: u64, batch: u64) -> Vec<u8> {
    [
        EXPIRY_PREFIX,
        &expires_ms.to_be_bytes(),
        &batch.to_be_bytes(),
    ]
    .concat()
}

/// The first index key after every entry expiring at or before `now_ms`.
pub(crate) fn expiry_upper(now_ms: u64) -> Vec<u8> {
    [EXPIRY_PREFIX, &now_ms.saturating_add(1).to_be_bytes()].concat()
}

/// The value of an expiry index key: the records of the batch, as `tag · length · nonce`.
pub(crate) fn encode_index(entries: &[(u8, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (tag, nonce) in entries {
        out.push(*tag);
        out.extend_from_slice(&u32::try_from(nonce.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(nonce.as_bytes());
    }
    out
}

/// The records listed by an expiry index value (a damaged tail is ignored).
pub(crate) fn decode_index(mut value: &[u8]) -> Vec<(u8, String)> {
    let mut entries = Vec::new();
    while let Some((&tag, rest)) = value.split_first() {
        let Some(length) = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
        else {
            break;
        };
        let Some(nonce) = rest.get(4..4 + length as usize) else {
            break;
        };
        entries.push((tag, String::from_utf8_lossy(nonce).into_owned()));
        value = &rest[4 + length as usize..];
    }
    entries
}

/// Prefix of a merchant tree's keys.
pub(crate) fn merchant_prefix(tree: &str) -> Vec<u8> {
    [b"t", tree.as_bytes(), b"\0"].concat()
}

pub(crate) fn merchant(tree: &str, key: &[u8]) -> Vec<u8> {
    [merchant_prefix(tree).as_slice(), key].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_keys_sort_by_time_and_index_values_read_back() {
        let early = expiry(1_000, u64::MAX);
        let late = expiry(2_000, 0);
        assert!(early < late && late < expiry_upper(2_000) && expiry_upper(1_999) <= late);
        let entries = vec![
            (TAG_CALLBACK, "n-1".to_owned()),
            (TAG_VALIDATION, "nönce".to_owned()),
        ];
        assert_eq!(decode_index(&encode_index(&entries)), entries);
        assert_eq!(
            decode_index(&encode_index(&entries)[..10]),
            [(TAG_CALLBACK, "n-1".to_owned())]
        );
    }

    #[test]
    fn prefixes_do_not_collide() {
        assert!(!merchant("x", b"").starts_with(EXPIRY_PREFIX));
        assert!(!callback("n").starts_with(VALIDATION_PREFIX));
    }
}
