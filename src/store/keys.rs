//! The layout of the store's one sled tree. Everything payhook writes for one request is
//! in one tree, so that one `sled::Batch` makes it atomic.
//!
//! | prefix | key | value |
//! |---|---|---|
//! | `c\0` | nonce | callback record (JSON) |
//! | `v\0` | nonce | validation record (JSON) |
//! | `x\0` | expiry ms (8 bytes BE) · tag (`c`/`v`) · nonce | empty: the expiry index |
//! | `t` name `\0` | the merchant's key | the merchant's value (declared effect trees) |

pub(crate) const CALLBACK_PREFIX: &[u8] = b"c\0";
pub(crate) const VALIDATION_PREFIX: &[u8] = b"v\0";
pub(crate) const EXPIRY_PREFIX: &[u8] = b"x\0";
pub(crate) const TAG_CALLBACK: u8 = b'c';
pub(crate) const TAG_VALIDATION: u8 = b'v';

pub(crate) fn callback(nonce: &str) -> Vec<u8> {
    [CALLBACK_PREFIX, nonce.as_bytes()].concat()
}

pub(crate) fn validation(nonce: &str) -> Vec<u8> {
    [VALIDATION_PREFIX, nonce.as_bytes()].concat()
}

pub(crate) fn expiry(expires_ms: u64, tag: u8, nonce: &str) -> Vec<u8> {
    [
        EXPIRY_PREFIX,
        &expires_ms.to_be_bytes(),
        &[tag],
        nonce.as_bytes(),
    ]
    .concat()
}

/// The first index key after every entry expiring at or before `now_ms`.
pub(crate) fn expiry_upper(now_ms: u64) -> Vec<u8> {
    [EXPIRY_PREFIX, &now_ms.saturating_add(1).to_be_bytes()].concat()
}

/// `(tag, nonce)` of an expiry index key.
pub(crate) fn parse_expiry(key: &[u8]) -> Option<(u8, String)> {
    let rest = key.strip_prefix(EXPIRY_PREFIX)?;
    let (&tag, nonce) = rest.get(8..)?.split_first()?;
    Some((tag, String::from_utf8(nonce.to_vec()).ok()?))
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
    fn expiry_keys_sort_by_time_and_parse_back() {
        let early = expiry(1_000, TAG_CALLBACK, "n-b");
        let late = expiry(2_000, TAG_VALIDATION, "n-a");
        assert!(early < late && late < expiry_upper(2_000) && expiry_upper(1_999) <= late);
        assert_eq!(
            parse_expiry(&late),
            Some((TAG_VALIDATION, "n-a".to_owned()))
        );
    }

    #[test]
    fn prefixes_do_not_collide() {
        assert!(!merchant("x", b"").starts_with(EXPIRY_PREFIX));
        assert!(!callback("n").starts_with(VALIDATION_PREFIX));
    }
}
