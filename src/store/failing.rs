//! Callbacks whose handler keeps failing, recorded durably per (nonce, status) for operators.
//!
//! A callback whose handler fails (an error, `RetryLater`, a timeout, a panic, effects that
//! abort) is answered 503 and the aggregator retries it — up to 17 times, then never again.
//! Without a record, such a callback is invisible until the retries stop and the booking is
//! lost. So every failure is counted here, with its reason and the payment's identifiers
//! (and so is a body refused with 400, under the nonce and status read from it: see
//! `server::refusal`);
//! the record of a (nonce, status) goes away in the batch that finally books it, or with the
//! retention. Operators read the records through the operating API
//! (`GET /payhook/admin/callbacks/failing`), `/metrics` and an error-level log line per
//! failure, and book what the aggregator gave up on with `payhook reconcile --ref`.
//!
//! Key `f\0` nonce; value: JSON of [`FailureRecord`] (every failing status of the nonce).
//! Key `l\0` failure ms · the nonce's identifier, empty: each record listed at each
//! millisecond one of its pairs last failed (most records have one pair, so one key), kept in
//! the same batch as the record. The pairs are read through these keys from the latest
//! down, a page at a time ([`page`]): the latest without reading the rest, and a page after
//! a [`FailingCursor`] without reading the pages before it.
//!
//! An incident can leave hundreds of thousands of failing pairs for the retention period,
//! while `/metrics` reports how many there are on every scrape and the inspector's panel
//! shows the latest every second. So the embedded store counts them once at open and then
//! keeps the [`Count`] as each batch and each purge changes the records, and reads
//! the latest, and each page of the operating API's listing, through the `l` keys.
//! `cargo run --release --example bench_failing` measures both backends; with 100,000
//! failing pairs (a release build on the 2-core AMD EPYC VM, family 25, 2026-11-28), sled
//! reads the latest 100 in 0.6 ms, a page of 1,000 in 6–12 ms wherever it starts (every page
//! in turn 1.2 s; all at once 380 ms), the count in about a microsecond, and reopens,
//! counts and checks the store in 0.56 s. PostgreSQL reads the latest 100 in 0.9 ms, a page
//! in 4–7 ms, and the count the database keeps (see `postgres::schema`) in 0.7 ms, where a
//! `count(*)` took 14 ms.

use crate::logged::cut_bytes;
use chrono::{DateTime, Datelike as _, Utc};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::StoreError;
use super::keys;
use super::record::{decode, encode};
use super::staging::{Overlay, Staging};
use crate::model::TransactionStatus;

/// One failed delivery, as the server reports it to the store. For a body refused with 400,
/// what could not be read of it is left empty: the nil reference, a zero amount, an empty
/// client id or currency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackFailure {
    /// The callback's nonce.
    pub nonce: crate::model::Nonce,
    /// The status whose handler failed (or whose body was refused).
    pub status: TransactionStatus,
    /// Why (the answer's message, or the handler's reason).
    pub reason: String,
    /// The aggregator's reference of the transaction (`payhook reconcile --ref`).
    pub transaction_reference_id: uuid::Uuid,
    /// The merchant's client.
    pub client_id: String,
    /// The amount.
    pub amount: rust_decimal::Decimal,
    /// The currency.
    pub currency: String,
    /// When it failed (UTC).
    pub at: DateTime<Utc>,
}

impl CallbackFailure {
    /// The most characters of a callback's currency a failure record keeps.
    const KEPT_CURRENCY_CHARS: usize = 64;

    /// A callback's currency as every failure record keeps it, whether its delivery failed
    /// or its body was refused: cut at 64 characters, U+0000 shown as U+FFFD. A callback is
    /// not refused for its currency (that would lose the payment's result), but what its
    /// failure record holds for the retention must not grow with what a sender chose, and
    /// both stores keep the same text.
    pub(crate) fn kept_currency(currency: &str) -> String {
        readable(&crate::logged::cut_chars(
            currency,
            Self::KEPT_CURRENCY_CHARS,
        ))
        .into_owned()
    }
}

/// Text of a failure record a person reads (its reason, client, currency): PostgreSQL's
/// `text` cannot hold U+0000, so each is kept as U+FFFD, the replacement character, where
/// refusing the record would lose the failure.
pub(crate) fn readable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\u{fffd}").into()
    } else {
        text.into()
    }
}

/// A (nonce, status) whose handler failed, or whose body was refused, and which is not
/// booked yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailingCallback {
    /// The callback's nonce.
    pub nonce: crate::model::Nonce,
    /// The status code whose handler failed.
    pub status: i32,
    /// How many deliveries failed.
    pub failures: u32,
    /// The first failure (UTC).
    #[serde(rename = "firstFailedMs", with = "super::epoch_ms")]
    pub first_failed: DateTime<Utc>,
    /// The last failure (UTC).
    #[serde(rename = "lastFailedMs", with = "super::epoch_ms")]
    pub last_failed: DateTime<Utc>,
    /// The reason of the last failure.
    pub last_reason: String,
    /// The aggregator's reference of the transaction.
    pub transaction_reference_id: String,
    /// The merchant's client.
    pub client_id: String,
    /// The amount, as received.
    pub amount: String,
    /// The currency.
    pub currency: String,
}

/// Where a page of the failing pairs ended: the last pair it listed. The next page lists
/// the pairs after it in the listing's order — the latest failure first, then by nonce and
/// status. A pair's last failure only moves forward (a failure recorded late does not move
/// it back), so a pair already listed is not listed again further down: one that fails
/// again while an operator pages moves to the top, above the pages read (the admin client
/// reads the top again after the last page for them), and one booked meanwhile is simply
/// not listed.
///
/// On the wire (the operating API's `after`) it is an opaque token:
///
/// ```
/// use payhook::store::FailingCursor;
///
/// let token = "MTcwMDAwMDAwMC4xMjMwMDAwMDA6NDpuLTE";
/// let cursor: FailingCursor = token.parse().unwrap();
/// assert_eq!(cursor.to_string(), token);
/// assert!("not a cursor".parse::<FailingCursor>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailingCursor {
    last_failed: DateTime<Utc>,
    nonce: crate::model::Nonce,
    status: i32,
}

impl FailingCursor {
    /// The position of `pair`: the next page starts after it.
    #[must_use]
    pub fn after(pair: &FailingCallback) -> Self {
        Self {
            last_failed: pair.last_failed,
            nonce: pair.nonce.clone(),
            status: pair.status,
        }
    }

    /// Whether `pair` comes after this position in the listing's order.
    #[must_use]
    pub fn precedes(&self, pair: &FailingCallback) -> bool {
        listing_order(
            (&self.last_failed, self.nonce.as_str(), self.status),
            (&pair.last_failed, pair.nonce.as_str(), pair.status),
        ) == std::cmp::Ordering::Less
    }

    /// The last failure of the pair it follows (UTC).
    #[must_use]
    pub fn last_failed(&self) -> DateTime<Utc> {
        self.last_failed
    }

    /// The nonce of the pair it follows.
    #[must_use]
    pub fn nonce(&self) -> &crate::model::Nonce {
        &self.nonce
    }

    /// The status code of the pair it follows.
    #[must_use]
    pub fn status(&self) -> i32 {
        self.status
    }
}

/// The token: URL-safe base64 of `seconds.nanoseconds:status:nonce` (the time exactly as
/// the store holds it, whatever its precision).
impl std::fmt::Display for FailingCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use base64::Engine as _;
        let text = format!(
            "{}.{:09}:{}:{}",
            self.last_failed.timestamp(),
            self.last_failed.timestamp_subsec_nanos(),
            self.status,
            self.nonce.as_str()
        );
        f.write_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text))
    }
}

/// A token that is not a cursor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not a cursor of the failing callbacks' listing (pass on the `after` of a page's `next` link)"
)]
pub struct NotACursor;

impl std::str::FromStr for FailingCursor {
    type Err = NotACursor;

    fn from_str(token: &str) -> Result<Self, NotACursor> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| NotACursor)?;
        let text = String::from_utf8(bytes).map_err(|_| NotACursor)?;
        let mut parts = text.splitn(3, ':');
        let (Some(time), Some(status), Some(nonce)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(NotACursor);
        };
        let (seconds, nanos) = time.split_once('.').ok_or(NotACursor)?;
        let last_failed = DateTime::from_timestamp(
            seconds.parse().map_err(|_| NotACursor)?,
            nanos.parse().map_err(|_| NotACursor)?,
        )
        .ok_or(NotACursor)?;
        // What no store holds: a nonce with U+0000 (refused on the wire, and PostgreSQL's
        // text cannot hold it) or a time outside PostgreSQL's (4713 BC to 294276 AD).
        if nonce.is_empty()
            || nonce.contains('\0')
            || !(-4712..=294_275).contains(&last_failed.year())
        {
            return Err(NotACursor);
        }
        Ok(Self {
            last_failed,
            status: status.parse().map_err(|_| NotACursor)?,
            nonce: nonce.into(),
        })
    }
}

/// One page of the failing pairs, in the listing's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailingPage {
    /// The pairs of this page.
    pub failing: Vec<FailingCallback>,
    /// Where the next page starts; `None` when this is the last.
    pub next: Option<FailingCursor>,
}

impl FailingPage {
    /// The first `limit` of `listed` (in the listing's order, after the cursor it was read
    /// after), and a cursor for the next page when `listed` holds more.
    pub(crate) fn of(listed: Vec<FailingCallback>, limit: usize) -> Self {
        let (failing, next) = super::first_page(listed, limit, FailingCursor::after);
        Self { failing, next }
    }
}

/// What is stored under a nonce: its failing statuses.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct FailureRecord {
    pub(crate) failing: Vec<FailingCallback>,
    pub(crate) expires_ms: u64,
}

/// How many failing (nonce, status) pairs a store holds.
#[derive(Debug, Default)]
pub(crate) struct Count(AtomicUsize);

impl Count {
    /// A count that starts at `pairs`.
    pub(crate) fn new(pairs: usize) -> Self {
        Self(AtomicUsize::new(pairs))
    }

    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Adds `added` pairs and takes `removed` away (one writer at a time changes it).
    pub(crate) fn change(&self, added: usize, removed: usize) {
        let now = self.get().saturating_add(added).saturating_sub(removed);
        self.0.store(now, Ordering::Relaxed);
    }
}

/// The failing pairs in a record's bytes, each parsed without keeping anything of it.
fn pairs(bytes: &[u8]) -> Result<usize, serde_json::Error> {
    #[derive(Deserialize)]
    struct Counted {
        failing: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Counted>(bytes).map(|counted| counted.failing.len())
}

/// The pairs a batch's writes add to the store and take away from it: the failing records
/// among `writes` against what `tree` holds now. A record that does not decode counts no
/// pairs (the count skipped it at open too).
pub(crate) fn pairs_changed(
    tree: &sled::Tree,
    writes: &Overlay,
) -> Result<(usize, usize), StoreError> {
    let (mut added, mut removed) = (0, 0);
    let failing = writes
        .range(keys::FAILING_PREFIX.to_vec()..)
        .take_while(|(key, _)| key.starts_with(keys::FAILING_PREFIX));
    for (key, value) in failing {
        added += value
            .as_deref()
            .map_or(0, |bytes| pairs(bytes).unwrap_or(0));
        removed += tree.get(key)?.map_or(0, |bytes| pairs(&bytes).unwrap_or(0));
    }
    Ok((added, removed))
}

/// Counts the failing pairs in `tree`, once, when the store opens, lists each record at
/// every time one of its pairs last failed where a build before left it unlisted (before
/// the `l` keys, or before a record was listed at each pair's time rather than at its
/// latest), and removes the `l` keys such a build left behind (written and flushed before
/// the store serves). A record that does not decode is
/// reported and counted as none: it must not stop the store from opening.
pub(crate) fn count_at_open(tree: &sled::Tree) -> Result<Counted, StoreError> {
    let mut changes = sled::Batch::default();
    let counted = count_and_list(tree, &mut changes)?;
    let unlisted = unlist_stale(tree, counted.in_place, &mut changes)?;
    if counted.listed > 0 || unlisted > 0 {
        tree.apply_batch(changes)?;
        tree.flush()?;
    }
    Ok(counted)
}

/// What [`count_at_open`] found.
pub(crate) struct Counted {
    /// Failing pairs.
    pub(crate) pairs: usize,
    /// Failing records, those that do not decode included.
    pub(crate) records: usize,
    /// Keys by time that were in place.
    in_place: usize,
    /// Keys by time added to the batch (a record's, or one a build before this one did not
    /// write: it listed a record at its latest failure only).
    listed: usize,
}

/// Counts the failing pairs, and adds to `changes` each key by time a record lacks.
fn count_and_list(tree: &sled::Tree, changes: &mut sled::Batch) -> Result<Counted, StoreError> {
    let mut counted = Counted {
        pairs: 0,
        records: 0,
        in_place: 0,
        listed: 0,
    };
    for entry in tree.scan_prefix(keys::FAILING_PREFIX) {
        let (key, bytes) = entry?;
        counted.records += 1;
        let identifier = keys::identifier_in(&key);
        let record = match serde_json::from_slice::<FailureRecord>(&bytes) {
            Ok(record) => record,
            Err(error) => {
                tracing::error!(
                    nonce = %crate::logged::Logged(&keys::describe(identifier)),
                    %error,
                    "a failing callback's record does not decode; it is not counted"
                );
                continue;
            }
        };
        counted.pairs += record.failing.len();
        for time in record.times() {
            let listed = keys::failing_by_time(time, identifier);
            if tree.contains_key(&listed)? {
                counted.in_place += 1;
            } else {
                changes.insert(listed, Vec::new());
                counted.listed += 1;
            }
        }
    }
    Ok(counted)
}

/// Adds to `changes` the removal of each key by time whose record is gone or has moved on:
/// left by a build before these keys, or before a record's every pair was listed, that ran
/// on the store after this one (a rollback, then the upgrade again). Looked for only when
/// there are more keys than the `in_place` ones of the records, as there seldom are.
/// Returns how many.
fn unlist_stale(
    tree: &sled::Tree,
    in_place: usize,
    changes: &mut sled::Batch,
) -> Result<usize, StoreError> {
    let by_time = tree.scan_prefix(keys::FAILING_BY_TIME_PREFIX);
    if by_time.keys().count() <= in_place {
        return Ok(0);
    }
    let mut unlisted = 0;
    for entry in tree.scan_prefix(keys::FAILING_BY_TIME_PREFIX) {
        let (listed_key, _) = entry?;
        // A record that does not decode is not listed either (see `count_and_list`).
        let listing = match listed_record(tree, &listed_key) {
            Err(StoreError::Corrupt { .. }) => None,
            other => other?,
        };
        if listing.is_none() {
            changes.remove(listed_key);
            unlisted += 1;
        }
    }
    Ok(unlisted)
}

/// The pairs of the failing record `listed_key` (an `l` key) lists that last failed at the
/// time the key holds; `None` when the record is gone or none of its pairs failed last then.
fn listed_record(
    tree: &sled::Tree,
    listed_key: &[u8],
) -> Result<Option<Vec<FailingCallback>>, StoreError> {
    let Some((listed, identifier)) = keys::of_failing_by_time(listed_key) else {
        return Ok(None);
    };
    let Some(bytes) = tree.get([keys::FAILING_PREFIX, identifier].concat())? else {
        return Ok(None);
    };
    let record: FailureRecord = super::record::decode_named(&bytes, || keys::describe(identifier))?;
    let pairs: Vec<_> = record
        .failing
        .into_iter()
        .filter(|pair| ms(pair.last_failed) == listed)
        .collect();
    Ok((!pairs.is_empty()).then_some(pairs))
}

/// The reason kept, at most this many bytes (a handler's message could be anything).
pub(crate) const REASON_BYTES: usize = 512;

/// Counts `failure` into the batch. Returns `false` when the status is booked already (a
/// failure of a late copy: nothing to record).
pub(crate) fn record(
    staging: &mut Staging<'_>,
    failure: &CallbackFailure,
    expires_ms: u64,
) -> Result<bool, StoreError> {
    let nonce = &failure.nonce;
    let status = failure.status.code();
    if let Some(bytes) = staging.get_record(&keys::callback(nonce))? {
        let booked: super::record::CallbackRecord = decode(nonce, &bytes)?;
        if booked.done.contains(&status) {
            return Ok(false);
        }
    }
    let key = keys::failing(nonce);
    let mut record = match staging.get_record(&key)? {
        Some(bytes) => decode::<FailureRecord>(nonce, &bytes)?,
        None => FailureRecord::default(),
    };
    let listed = record.times();
    let reason = cut_bytes(&failure.reason, REASON_BYTES).into_owned();
    match record.failing.iter_mut().find(|f| f.status == status) {
        Some(entry) => {
            entry.failures = entry.failures.saturating_add(1);
            // A failure recorded late (an instance's clock behind, two refusals racing)
            // moves neither end of the pair back.
            entry.first_failed = entry.first_failed.min(failure.at);
            if failure.at >= entry.last_failed {
                entry.last_failed = failure.at;
                entry.last_reason = reason;
            }
        }
        None => record.failing.push(FailingCallback {
            nonce: nonce.clone(),
            status,
            failures: 1,
            first_failed: failure.at,
            last_failed: failure.at,
            last_reason: reason,
            transaction_reference_id: failure.transaction_reference_id.to_string(),
            client_id: failure.client_id.clone(),
            amount: failure.amount.to_string(),
            currency: failure.currency.clone(),
        }),
    }
    record.expires_ms = expires_ms;
    relist(staging, &key, &listed, &record.times());
    staging.put_record(&key, Some(encode(&record)));
    Ok(true)
}

/// Forgets the failures of (`nonce`, `status`): it is booked in this batch. It fails only
/// before it writes anything (a read of the store that failed).
pub(crate) fn booked(
    staging: &mut Staging<'_>,
    nonce: &str,
    status: i32,
) -> Result<(), StoreError> {
    let key = keys::failing(nonce);
    let Some(bytes) = staging.get_record(&key)? else {
        return Ok(());
    };
    // The listing must never keep a callback from being booked: a record that does not
    // decode is let go (its `l` keys lead nowhere, and are passed over, then removed at the
    // next open), and said so.
    let mut record: FailureRecord = match decode(nonce, &bytes) {
        Ok(record) => record,
        Err(error) => {
            tracing::error!(
                nonce = %crate::logged::Logged(nonce),
                error = %crate::report::InLine(&error),
                "a failing callback's record did not decode; it is removed as its callback is booked"
            );
            staging.put_record(&key, None);
            return Ok(());
        }
    };
    let listed = record.times();
    record.failing.retain(|f| f.status != status);
    relist(staging, &key, &listed, &record.times());
    let value = (!record.failing.is_empty()).then(|| encode(&record));
    staging.put_record(&key, value);
    Ok(())
}

/// Moves the record at `key` from its `l` keys at the times `listed` (under either key it
/// may have been found at) to those at `times` (none: no record, no key).
fn relist(staging: &mut Staging<'_>, key: &keys::RecordKey, listed: &[u64], times: &[u64]) {
    let older = key.spelled_out.as_deref().map(keys::identifier_in);
    for &time in listed {
        for identifier in std::iter::once(key.identifier()).chain(older) {
            staging.put(keys::failing_by_time(time, identifier), None);
        }
    }
    for &time in times {
        staging.put(
            keys::failing_by_time(time, key.identifier()),
            Some(Vec::new()),
        );
    }
}

/// The failing pairs of `tree` after `after` (from the latest without it), at most `limit`,
/// in the listing's order: read through the `l` keys from the latest down, one millisecond
/// at a time (its pairs put in order by nonce and status), until one more than `limit` is
/// found. A page after a cursor starts at the cursor's millisecond: the pages before it are
/// not read. An `l` key whose record has moved on (or gone) is passed over.
pub(crate) fn page(
    tree: &sled::Tree,
    after: Option<&FailingCursor>,
    limit: usize,
) -> Result<FailingPage, StoreError> {
    let wanted = limit.saturating_add(1);
    let end = keys::failing_by_time_end(after.map(|cursor| ms(cursor.last_failed)));
    let mut found = Vec::new();
    // The pairs of the millisecond being read, and which one it is.
    let mut moment = Vec::new();
    let mut moment_ms = None;
    for entry in tree.range(keys::FAILING_BY_TIME_PREFIX.to_vec()..end).rev() {
        let (listed_key, _) = entry?;
        let Some((listed, _)) = keys::of_failing_by_time(&listed_key) else {
            continue;
        };
        if moment_ms != Some(listed) {
            take_moment(&mut found, &mut moment, after);
            if found.len() >= wanted {
                break;
            }
            moment_ms = Some(listed);
        }
        moment.extend(listed_record(tree, &listed_key)?.unwrap_or_default());
    }
    take_moment(&mut found, &mut moment, after);
    Ok(FailingPage::of(found, limit))
}

/// Moves the pairs of one millisecond to `found`, in the listing's order, those after
/// `after` only.
fn take_moment(
    found: &mut Vec<FailingCallback>,
    moment: &mut Vec<FailingCallback>,
    after: Option<&FailingCursor>,
) {
    sort_latest_first(moment);
    found.extend(
        moment
            .drain(..)
            .filter(|pair| after.is_none_or(|cursor| cursor.precedes(pair))),
    );
}

/// The order pairs are listed in: the latest failure first, then by nonce and status (both
/// backends alike, so that the first `limit` are the same whichever way they were read).
pub(crate) fn sort_latest_first(failing: &mut [FailingCallback]) {
    failing.sort_by(|a, b| {
        listing_order(
            (&a.last_failed, a.nonce.as_str(), a.status),
            (&b.last_failed, b.nonce.as_str(), b.status),
        )
    });
}

/// The listing's order of two pairs' (last failure, nonce, status).
fn listing_order(
    a: (&DateTime<Utc>, &str, i32),
    b: (&DateTime<Utc>, &str, i32),
) -> std::cmp::Ordering {
    b.0.cmp(a.0).then_with(|| a.1.cmp(b.1)).then(a.2.cmp(&b.2))
}

/// A failure's time as the `l` keys hold it: milliseconds since the epoch (0 before it).
fn ms(time: DateTime<Utc>) -> u64 {
    u64::try_from(time.timestamp_millis()).unwrap_or(0)
}

impl FailureRecord {
    /// The milliseconds its statuses last failed at, each once: where its `l` keys list it.
    pub(crate) fn times(&self) -> Vec<u64> {
        let mut times: Vec<u64> = self.failing.iter().map(|f| ms(f.last_failed)).collect();
        times.sort_unstable();
        times.dedup();
        times
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failing callback in the JSON written before its times were `DateTime<Utc>`
    /// (camelCase, `firstFailedMs`/`lastFailedMs` holding integers of milliseconds).
    const OLD_FORM: &str = r#"{"nonce":"n-1","status":4,"failures":3,"firstFailedMs":1700000000123,"lastFailedMs":1700000060456,"lastReason":"handler failed","transactionReferenceId":"00000000-0000-0000-0000-000000000000","clientId":"client","amount":"10.50","currency":"EUR"}"#;

    #[test]
    fn failing_callbacks_written_with_millisecond_fields_read_and_write_back_byte_identical() {
        let failing: FailingCallback = serde_json::from_str(OLD_FORM).unwrap();
        assert_eq!(failing.first_failed.timestamp_millis(), 1_700_000_000_123);
        assert_eq!(failing.last_failed.timestamp_millis(), 1_700_000_060_456);
        assert_eq!(serde_json::to_string(&failing).unwrap(), OLD_FORM);

        let stored = format!(r#"{{"failing":[{OLD_FORM}],"expires_ms":1702592000123}}"#);
        let record: FailureRecord = serde_json::from_str(&stored).unwrap();
        assert_eq!(record.failing, vec![failing]);
        assert_eq!(serde_json::to_string(&record).unwrap(), stored);
    }

    /// A page after a cursor begins at the cursor's millisecond: the records of the pages
    /// before it are not read (one that does not decode is met only by a page that lists
    /// it), and a record listed at two times gives each page the pairs of its time.
    #[test]
    fn a_page_after_a_cursor_reads_nothing_of_the_pages_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::Config::new()
            .path(dir.path())
            .open()
            .unwrap()
            .open_tree("t")
            .unwrap();
        let pair = |nonce: &str, status, ms: i64| {
            FailingCallback {
                last_failed: DateTime::from_timestamp_millis(ms).unwrap(),
                ..serde_json::from_str(OLD_FORM).unwrap()
            }
            .with(nonce, status)
        };
        let put = |nonce: &str, failing: Vec<FailingCallback>| {
            let record = FailureRecord {
                failing,
                expires_ms: u64::MAX,
            };
            for time in record.times() {
                tree.insert(keys::failing_by_time(time, nonce.as_bytes()), &[][..])
                    .unwrap();
            }
            tree.insert(keys::failing(nonce).key, encode(&record))
                .unwrap();
        };
        put("n-1", vec![pair("n-1", 3, 3_000), pair("n-1", 4, 1_000)]);
        put("n-2", vec![pair("n-2", 4, 2_000)]);
        put("n-3", vec![pair("n-3", 4, 4_000)]);
        tree.insert(keys::failing_by_time(5_000, b"n-bad"), &[][..])
            .unwrap();
        tree.insert(keys::failing("n-bad").key, &b"not json"[..])
            .unwrap();
        let listed = |page: &FailingPage| {
            page.failing
                .iter()
                .map(|f| (f.nonce.as_str().to_owned(), f.status))
                .collect::<Vec<_>>()
        };

        assert!(matches!(
            page(&tree, None, 2),
            Err(StoreError::Corrupt { .. })
        ));
        let after_n3 = FailingCursor::after(&pair("n-3", 4, 4_000));
        let first = page(&tree, Some(&after_n3), 2).unwrap();
        assert_eq!(listed(&first), [("n-1".into(), 3), ("n-2".into(), 4)]);
        let second = page(&tree, first.next.as_ref(), 2).unwrap();
        assert_eq!(listed(&second), [("n-1".into(), 4)]);
        assert_eq!(second.next, None);
    }

    impl FailingCallback {
        fn with(mut self, nonce: &str, status: i32) -> Self {
            self.nonce = nonce.into();
            self.status = status;
            self
        }
    }
}
