//! Callbacks whose handler keeps failing, recorded durably per (nonce, status) for operators.
//!
//! A callback whose handler fails (an error, `RetryLater`, a timeout, a panic, effects that
//! abort) is answered 503 and the aggregator retries it — up to 17 times, then never again.
//! Without a record, such a callback is invisible until the retries stop and the booking is
//! lost. So every failure is counted here, with its reason and the payment's identifiers;
//! the record of a (nonce, status) goes away in the batch that finally books it, or with the
//! retention. Operators read the records through the operating API
//! (`GET /payhook/admin/callbacks/failing`), `/metrics` and an error-level log line per
//! failure, and book what the aggregator gave up on with `payhook reconcile --ref`.
//!
//! Key `f\0` nonce; value: JSON of [`FailureRecord`] (every failing status of the nonce).
//!
//! How many pairs are failing is what `/metrics` reports on every scrape; an incident can
//! leave hundreds of thousands of them for the retention period, so the embedded store
//! does not count them per scrape: it counts them once at open and then keeps the [`Count`]
//! as each durable batch and each purge changes the records.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::StoreError;
use super::keys;
use super::record::{decode, encode};
use super::staging::{Overlay, Staging};
use crate::model::TransactionStatus;

/// One failed delivery, as the server reports it to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackFailure {
    /// The callback's nonce.
    pub nonce: crate::model::Nonce,
    /// The status whose handler failed.
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

/// A (nonce, status) whose handler failed and which is not booked yet.
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
pub(crate) fn pairs(bytes: &[u8]) -> Result<usize, serde_json::Error> {
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

/// Counts the failing pairs in `tree`, once, when the store opens. A record that does not
/// decode is reported and counted as none: the count must not stop the store from opening.
pub(crate) fn count_at_open(tree: &sled::Tree) -> Result<usize, StoreError> {
    let mut count = 0;
    for entry in tree.scan_prefix(keys::FAILING_PREFIX) {
        let (key, bytes) = entry?;
        match pairs(&bytes) {
            Ok(pairs) => count += pairs,
            Err(error) => tracing::error!(
                nonce = %crate::logged::Logged(&keys::describe(&key[keys::FAILING_PREFIX.len()..])),
                %error,
                "a failing callback's record does not decode; it is not counted"
            ),
        }
    }
    Ok(count)
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
    let reason = truncate(&failure.reason, REASON_BYTES);
    match record.failing.iter_mut().find(|f| f.status == status) {
        Some(entry) => {
            entry.failures = entry.failures.saturating_add(1);
            entry.last_failed = failure.at;
            entry.last_reason = reason;
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
    staging.put_record(&key, Some(encode(&record)));
    Ok(true)
}

/// Forgets the failures of (`nonce`, `status`): it is booked in this batch.
pub(crate) fn booked(
    staging: &mut Staging<'_>,
    nonce: &str,
    status: i32,
) -> Result<(), StoreError> {
    let key = keys::failing(nonce);
    let Some(bytes) = staging.get_record(&key)? else {
        return Ok(());
    };
    let mut record: FailureRecord = decode(nonce, &bytes)?;
    record.failing.retain(|f| f.status != status);
    let value = (!record.failing.is_empty()).then(|| encode(&record));
    staging.put_record(&key, value);
    Ok(())
}

pub(crate) fn truncate(text: &str, bytes: usize) -> String {
    if text.len() <= bytes {
        return text.to_owned();
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
}
