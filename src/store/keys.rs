//! The layout of the store's one sled tree. Everything payhook writes for one request is
//! in one tree, so that one `sled::Batch` makes it atomic.
//!
//! | prefix | key | value |
//! |---|---|---|
//! | `c\0` | identifier of the nonce | callback record (JSON) |
//! | `v\0` | identifier of the nonce | validation record (JSON) |
//! | `x\0` | expiry ms (8 bytes BE) · batch id (8 bytes) | the batch's records: `tag · length · identifier`… (the expiry index, one key per batch) |
//! | `p\0` | validation id (8 bytes BE) | postponed validation (JSON) |
//! | `w\0` | validation id | deadline ms (8 bytes BE) or empty: the validation awaits a decision |
//! | `o\0` | validation id | next attempt ms (8 bytes BE): the result awaits delivery (the outbox) |
//! | `f\0` | identifier of the nonce | its statuses whose handler failed and are not booked yet (JSON, see `failing.rs`) |
//! | `l\0` | a failure ms (8 bytes BE) · identifier of the nonce | empty: the failing records by the time each of their pairs last failed, latest last |
//! | `h\0` | status (4 bytes BE) · identifier of the nonce | a result the merchant held instead of booking, waiting for a person (JSON, see `held.rs`) |
//! | `r\0` | the same | a held result a person resolved (moved from `h\0`) |
//! | `e\0` | an operating API session's login time and id (`issued.id`) | its end ms (JSON): it was ended by logging out; indexed in `x\0` at that end (tag `e`) |
//! | `m\0seal` | — | the seal of the last commit: store id, commit number, time (see `watermark.rs`) |
//! | `m\0vouched` | — | the retention the records were written with, and its last growth (see `horizon.rs`) |
//! | `m\0clock-step` | — | a step of the clock a sweep or a commit caught: its lead, since when, and the latest expiry held then (see `horizon.rs`, `PurgeClock`) |
//! | `t` name `\0` | the merchant's key | the merchant's value (declared effect trees) |
//!
//! A nonce's **identifier** in a key is the nonce itself up to [`SPELLED_OUT_BYTES`]; a
//! longer one is `0xFF` and its SHA-256 (no UTF-8 text begins with `0xFF`, so the two never
//! meet). What the store and sled's in-memory index keep per record then stays small
//! whatever length a sender chose: sled holds a tree's keys, and the bounds of its nodes,
//! in memory. Stores written before long nonces were digested kept them spelled out; a
//! [`RecordKey`] names that older key too, read when the new one is absent and removed when
//! the record is next written.

use crate::model::ValidationId;

/// The length of every record prefix below.
const PREFIX_BYTES: usize = 2;
pub(crate) const CALLBACK_PREFIX: &[u8] = b"c\0";
pub(crate) const VALIDATION_PREFIX: &[u8] = b"v\0";
pub(crate) const EXPIRY_PREFIX: &[u8] = b"x\0";
pub(crate) const POSTPONED_PREFIX: &[u8] = b"p\0";
pub(crate) const WAITING_PREFIX: &[u8] = b"w\0";
pub(crate) const OUTBOX_PREFIX: &[u8] = b"o\0";
pub(crate) const FAILING_PREFIX: &[u8] = b"f\0";
pub(crate) const TAG_FAILING: u8 = b'f';
pub(crate) const FAILING_BY_TIME_PREFIX: &[u8] = b"l\0";
pub(crate) const HELD_PREFIX: &[u8] = b"h\0";
pub(crate) const RESOLVED_PREFIX: &[u8] = b"r\0";
/// Operating API sessions ended by logging out, by their login time and id.
pub(crate) const SESSION_PREFIX: &[u8] = b"e\0";
/// The seal of the last commit, checked against the watermark at open.
pub(crate) const SEAL: &[u8] = b"m\0seal";
/// The retention the records were written with, and its last growth
/// (`horizon::Vouched`, JSON).
pub(crate) const VOUCHED: &[u8] = b"m\0vouched";
/// A step of the clock a sweep or a commit caught (`horizon::Step`, JSON).
pub(crate) const CLOCK_STEP: &[u8] = b"m\0clock-step";
pub(crate) const TAG_CALLBACK: u8 = b'c';
pub(crate) const TAG_VALIDATION: u8 = b'v';
pub(crate) const TAG_POSTPONED: u8 = b'p';
pub(crate) const TAG_SESSION: u8 = b'e';

/// The key of validation `id` under `prefix` (one of the three postponed prefixes).
pub(crate) fn by_id(prefix: &[u8], id: ValidationId) -> Vec<u8> {
    [prefix, &id.get().to_be_bytes()].concat()
}

/// The validation id of a key made by [`by_id`].
pub(crate) fn id_of(key: &[u8]) -> Option<ValidationId> {
    Some(ValidationId::from(i64::from_be_bytes(
        key.get(2..10)?.try_into().ok()?,
    )))
}

/// The millisecond time an index entry's value begins with (8 bytes big-endian: a
/// deadline, a next attempt); a shorter value reads as 0.
pub(crate) fn millis_of(value: &[u8]) -> u64 {
    millis_at(value, 0).unwrap_or(0)
}

/// The second millisecond time of an outbox entry's value, when it holds one: when its
/// result was decided. Entries written before it was kept have none.
pub(crate) fn decided_of(value: &[u8]) -> Option<u64> {
    millis_at(value, 8)
}

/// An outbox entry's value: when its result is next attempted, and when it was decided.
pub(crate) fn outbox_entry(next_attempt: u64, decided: Option<u64>) -> Vec<u8> {
    let mut value = next_attempt.to_be_bytes().to_vec();
    if let Some(decided) = decided {
        value.extend_from_slice(&decided.to_be_bytes());
    }
    value
}

fn millis_at(value: &[u8], at: usize) -> Option<u64> {
    let bytes = value.get(at..at.checked_add(8)?)?;
    bytes.try_into().ok().map(u64::from_be_bytes)
}

/// Nonces up to this many bytes are spelled out in their records' keys; longer ones are
/// digested (see the module docs). A UUID is 36.
pub(crate) const SPELLED_OUT_BYTES: usize = 64;
/// The first byte of a digested identifier.
const DIGESTED: u8 = 0xFF;

/// A nonce's identifier in keys and in the expiry index: the nonce, or `0xFF` and its
/// SHA-256 when it is longer than [`SPELLED_OUT_BYTES`].
pub(crate) fn identifier(nonce: &str) -> Vec<u8> {
    prefixed_identifier(&[], nonce)
}

/// `prefix` and the identifier of `nonce`, in one allocation (a record's key is built on
/// every callback's path).
fn prefixed_identifier(prefix: &[u8], nonce: &str) -> Vec<u8> {
    if nonce.len() <= SPELLED_OUT_BYTES {
        return [prefix, nonce.as_bytes()].concat();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, nonce.as_bytes());
    [prefix, &[DIGESTED], digest.as_ref()].concat()
}

/// The SHA-256 of `text`, lower-case hex.
pub(crate) fn sha256_hex(text: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An identifier as error messages name it: the nonce, or `sha256:` and the digest's hex.
pub(crate) fn describe(identifier: &[u8]) -> String {
    match identifier.split_first() {
        Some((&DIGESTED, digest)) => format!("sha256:{}", hex(digest)),
        _ => String::from_utf8_lossy(identifier).into_owned(),
    }
}

/// Where the record of one nonce is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordKey {
    /// The key, with the nonce's [`identifier`].
    pub(crate) key: Vec<u8>,
    /// For a long nonce, the key a store written before long nonces were digested kept
    /// its record under: read when `key` is absent, removed when the record is written.
    pub(crate) spelled_out: Option<Vec<u8>>,
}

impl RecordKey {
    /// Reads the record through `get`: under `key`, else where an older store kept it.
    pub(crate) fn read<T, E>(
        &self,
        get: impl Fn(&[u8]) -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        Ok(self.find(get)?.map(|(_, found)| found))
    }

    /// [`RecordKey::read`], with the key the record was found under.
    pub(crate) fn find<T, E>(
        &self,
        get: impl Fn(&[u8]) -> Result<Option<T>, E>,
    ) -> Result<Option<(&[u8], T)>, E> {
        if let Some(found) = get(&self.key)? {
            return Ok(Some((&self.key, found)));
        }
        match &self.spelled_out {
            Some(older) => Ok(get(older)?.map(|found| (older.as_slice(), found))),
            None => Ok(None),
        }
    }

    /// The nonce's [`identifier`]: the key without its prefix, as the expiry index lists it.
    pub(crate) fn identifier(&self) -> &[u8] {
        identifier_in(&self.key)
    }

    pub(crate) fn new(prefix: &[u8], nonce: &str) -> Self {
        debug_assert_eq!(prefix.len(), PREFIX_BYTES);
        Self {
            key: prefixed_identifier(prefix, nonce),
            spelled_out: (nonce.len() > SPELLED_OUT_BYTES)
                .then(|| [prefix, nonce.as_bytes()].concat()),
        }
    }
}

pub(crate) fn callback(nonce: &str) -> RecordKey {
    RecordKey::new(CALLBACK_PREFIX, nonce)
}

pub(crate) fn failing(nonce: &str) -> RecordKey {
    RecordKey::new(FAILING_PREFIX, nonce)
}

pub(crate) fn validation(nonce: &str) -> RecordKey {
    RecordKey::new(VALIDATION_PREFIX, nonce)
}

/// The key of an ended operating API session (see [`SESSION_PREFIX`]).
pub(crate) fn ended_session(session: &str) -> RecordKey {
    RecordKey::new(SESSION_PREFIX, session)
}

/// The key that lists a failing record at a time one of its pairs last failed: `failed_ms`,
/// then the nonce's `identifier` (as the record's key holds it).
pub(crate) fn failing_by_time(failed_ms: u64, identifier: &[u8]) -> Vec<u8> {
    [FAILING_BY_TIME_PREFIX, &failed_ms.to_be_bytes(), identifier].concat()
}

/// Where the `l` keys of failures at `before_ms` and later begin (the end of those of
/// every failure before it); `None`: the end of them all.
pub(crate) fn failing_by_time_end(before_ms: Option<u64>) -> Vec<u8> {
    match before_ms.and_then(|time| time.checked_add(1)) {
        Some(end) => failing_by_time(end, &[]),
        None => [
            &FAILING_BY_TIME_PREFIX[..1],
            &[FAILING_BY_TIME_PREFIX[1] + 1],
        ]
        .concat(),
    }
}

/// The failure ms and the identifier of a key made by [`failing_by_time`].
pub(crate) fn of_failing_by_time(key: &[u8]) -> Option<(u64, &[u8])> {
    let time = key.get(PREFIX_BYTES..PREFIX_BYTES + 8)?;
    Some((
        u64::from_be_bytes(time.try_into().ok()?),
        key.get(PREFIX_BYTES + 8..)?,
    ))
}

/// The identifier in a record's key: the key without its prefix.
pub(crate) fn identifier_in(key: &[u8]) -> &[u8] {
    key.get(PREFIX_BYTES..).unwrap_or_default()
}

/// Where the record an expiry index entry lists (`tag`, `identifier`) is kept, `None` for a
/// postponed validation (its id is not a record key). An entry written before long nonces
/// were digested holds the nonce itself: the record is under it, or under the digested key
/// a later write moved it to (a write that moves a record need not index it again).
pub(crate) fn indexed_record(tag: u8, identifier: &[u8]) -> Option<RecordKey> {
    let prefix = match tag {
        TAG_CALLBACK => CALLBACK_PREFIX,
        TAG_FAILING => FAILING_PREFIX,
        TAG_VALIDATION => VALIDATION_PREFIX,
        TAG_SESSION => SESSION_PREFIX,
        _ => return None,
    };
    Some(match std::str::from_utf8(identifier) {
        Ok(nonce) if nonce.len() > SPELLED_OUT_BYTES => RecordKey::new(prefix, nonce),
        _ => RecordKey {
            key: [prefix, identifier].concat(),
            spelled_out: None,
        },
    })
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

/// When the records of the expiry index key `key` expire (`None`: not such a key).
pub(crate) fn expires_of(key: &[u8]) -> Option<u64> {
    let bytes = key.strip_prefix(EXPIRY_PREFIX)?.get(..8)?;
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// The first index key after every entry expiring at or before `now_ms`.
pub(crate) fn expiry_upper(now_ms: u64) -> Vec<u8> {
    [EXPIRY_PREFIX, &now_ms.saturating_add(1).to_be_bytes()].concat()
}

/// The value of an expiry index key, built record by record: the records of the batch, as
/// `tag · length · identifier` (a postponed validation's identifier is its id, in decimal).
/// A commit adds each record's identifier as it stages it, so no identifier is built or
/// copied apart from the value.
#[derive(Debug, Default)]
pub(crate) struct IndexValue(Vec<u8>);

impl IndexValue {
    /// Room for about `records` records with spelled-out nonces.
    pub(crate) fn with_capacity(records: usize) -> Self {
        Self(Vec::with_capacity(records.saturating_mul(48)))
    }

    pub(crate) fn push(&mut self, tag: u8, identifier: &[u8]) {
        self.0.push(tag);
        self.0.extend_from_slice(
            &u32::try_from(identifier.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        self.0.extend_from_slice(identifier);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value to store under the batch's [`expiry`] key.
    pub(crate) fn into_value(self) -> Vec<u8> {
        self.0
    }
}

/// The value of an expiry index key listing `entries` (see [`IndexValue`]).
pub(crate) fn encode_index(entries: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut value = IndexValue::with_capacity(entries.len());
    for (tag, identifier) in entries {
        value.push(*tag, identifier);
    }
    value.into_value()
}

/// The records listed by an expiry index value (a damaged tail is ignored).
pub(crate) fn decode_index(mut value: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut entries = Vec::new();
    while let Some((&tag, rest)) = value.split_first() {
        let Some(length) = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
        else {
            break;
        };
        let Some(identifier) = rest.get(4..4 + length as usize) else {
            break;
        };
        entries.push((tag, identifier.to_vec()));
        value = &rest[4 + length as usize..];
    }
    entries
}

/// Prefix of a merchant tree's keys.
pub(crate) fn merchant_prefix(tree: &str) -> Vec<u8> {
    [b"t", tree.as_bytes(), b"\0"].concat()
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
            (TAG_CALLBACK, identifier("n-1")),
            (TAG_VALIDATION, identifier(&"nönce".repeat(40))),
        ];
        assert_eq!(decode_index(&encode_index(&entries)), entries);
        assert_eq!(
            decode_index(&encode_index(&entries)[..10]),
            [(TAG_CALLBACK, b"n-1".to_vec())]
        );
    }

    #[test]
    fn a_record_keys_identifier_is_the_nonces_as_the_index_lists_it() {
        for nonce in ["n-1", &"n".repeat(SPELLED_OUT_BYTES), &"nönce".repeat(40)] {
            assert_eq!(callback(nonce).identifier(), identifier(nonce), "{nonce}");
            assert_eq!(validation(nonce).identifier(), identifier(nonce), "{nonce}");
            assert_eq!(failing(nonce).identifier(), identifier(nonce), "{nonce}");
        }
        let mut built = IndexValue::default();
        built.push(TAG_CALLBACK, callback("n-1").identifier());
        built.push(TAG_VALIDATION, validation(&"nönce".repeat(40)).identifier());
        assert_eq!(
            decode_index(&built.into_value()),
            [
                (TAG_CALLBACK, identifier("n-1")),
                (TAG_VALIDATION, identifier(&"nönce".repeat(40)))
            ]
        );
    }

    #[test]
    fn prefixes_do_not_collide() {
        assert!(!merchant_prefix("x").starts_with(EXPIRY_PREFIX));
        assert!(!callback("n").key.starts_with(VALIDATION_PREFIX));
    }

    #[test]
    fn long_nonces_are_digested_and_short_ones_spelled_out() {
        let short = "0b9e4a52-3c57-4a8e-9d7e-2f1c5b6a7d80";
        assert_eq!(
            callback(short),
            RecordKey {
                key: [CALLBACK_PREFIX, short.as_bytes()].concat(),
                spelled_out: None,
            }
        );
        let at_limit = "n".repeat(SPELLED_OUT_BYTES);
        assert_eq!(identifier(&at_limit), at_limit.as_bytes());
        let long = "n".repeat(4096);
        let key = validation(&long);
        assert_eq!(key.key.len(), VALIDATION_PREFIX.len() + 33);
        assert_eq!(key.key[VALIDATION_PREFIX.len()], DIGESTED);
        assert_eq!(
            key.spelled_out,
            Some([VALIDATION_PREFIX, long.as_bytes()].concat())
        );
        // Distinct long nonces, distinct keys; the same one, the same key.
        assert_ne!(validation(&format!("{long}x")).key, key.key);
        assert_eq!(validation(&long), key);
        // An index entry names the key in either form; the spelled-out one, both keys.
        assert_eq!(
            indexed_record(TAG_VALIDATION, &identifier(&long)),
            Some(RecordKey {
                key: key.key.clone(),
                spelled_out: None
            })
        );
        assert_eq!(indexed_record(TAG_VALIDATION, long.as_bytes()), Some(key));
        assert_eq!(indexed_record(TAG_POSTPONED, b"42"), None);
    }
}
