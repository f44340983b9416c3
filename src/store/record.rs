//! The records the store keeps, and how they are encoded (JSON: small, readable in a dump).

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::keys::{SPELLED_OUT_BYTES, sha256_hex};
use crate::model::{TransactionValidationRequest, ValidationId};

/// The payment a validation nonce was first used for. A repeat must match it exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Amount, normalised (`10.50` and `10.5` are the same amount).
    pub amount: String,
    /// ISO currency, upper case.
    pub currency: String,
    /// The merchant's client.
    pub client_id: String,
    /// The chosen provider.
    pub provider_id: i64,
    /// Deposit (`true`) or withdrawal.
    pub cash_in: bool,
}

impl Fingerprint {
    /// The fingerprint of a validation request.
    pub fn of(request: &TransactionValidationRequest) -> Self {
        let payment = &request.payment_data;
        Self {
            amount: normalise(payment.amount),
            currency: payment.currency.trim().to_ascii_uppercase(),
            client_id: request.merchant_data.client_id.clone(),
            provider_id: payment.provider_id,
            cash_in: request.cash_in,
        }
    }
}

/// A [`Fingerprint`] as a validation record keeps it: a client id longer than
/// [`SPELLED_OUT_BYTES`] by its SHA-256, so that a record's size does not grow with what a
/// sender chose to send. Records written before kept every client id spelled out
/// (`client_id`); both forms compare with a request's fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeptFingerprint {
    amount: String,
    currency: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_id: Option<String>,
    /// The SHA-256 of a long client id, lower-case hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_id_sha256: Option<String>,
    provider_id: i64,
    cash_in: bool,
}

impl KeptFingerprint {
    pub(crate) fn of(fingerprint: &Fingerprint) -> Self {
        let long = fingerprint.client_id.len() > SPELLED_OUT_BYTES;
        Self {
            amount: fingerprint.amount.clone(),
            currency: fingerprint.currency.clone(),
            client_id: (!long).then(|| fingerprint.client_id.clone()),
            client_id_sha256: long.then(|| sha256_hex(&fingerprint.client_id)),
            provider_id: fingerprint.provider_id,
            cash_in: fingerprint.cash_in,
        }
    }

    /// Whether `fingerprint` is the payment this one was kept for.
    pub(crate) fn matches(&self, fingerprint: &Fingerprint) -> bool {
        self.client_is(&fingerprint.client_id)
            && self.amount == fingerprint.amount
            && self.currency == fingerprint.currency
            && self.provider_id == fingerprint.provider_id
            && self.cash_in == fingerprint.cash_in
    }

    /// Whether `client_id` is the client this payment was kept for.
    pub(crate) fn client_is(&self, client_id: &str) -> bool {
        match (&self.client_id, &self.client_id_sha256) {
            (Some(kept), _) => kept == client_id,
            (None, Some(digest)) => {
                client_id.len() > SPELLED_OUT_BYTES && *digest == sha256_hex(client_id)
            }
            (None, None) => false,
        }
    }

    /// The client as kept: spelled out, or `None` for a long one kept by its digest.
    pub(crate) fn client_id(&self) -> Option<&str> {
        self.client_id.as_deref()
    }

    /// The amount as kept (normalised), read back.
    pub(crate) fn amount(&self) -> Result<Decimal, String> {
        self.amount
            .parse()
            .map_err(|e| format!("amount `{}`: {e}", self.amount))
    }

    /// The currency as kept (upper case).
    pub(crate) fn currency(&self) -> &str {
        &self.currency
    }

    /// The provider as kept.
    pub(crate) fn provider_id(&self) -> i64 {
        self.provider_id
    }

    /// Deposit (`true`) or withdrawal, as kept.
    pub(crate) fn cash_in(&self) -> bool {
        self.cash_in
    }
}

fn normalise(amount: Decimal) -> String {
    amount.normalize().to_string()
}

/// A decision worth replaying to a repeated validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum RecordedDecision {
    /// 200.
    Allow,
    /// 403 with the message.
    Deny {
        /// The merchant's message.
        message: String,
    },
    /// 200: decided later (Awaitable mode); the result goes to the aggregator separately.
    Postponed,
}

/// An operating API session ended by logging out ([`super::Store::end_session`]), kept until
/// its life would have ended anyway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EndedSession {
    pub(crate) expires_ms: u64,
}

/// A callback nonce's durable record: `Done` for each acknowledged status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CallbackRecord {
    /// Acknowledged statuses, oldest first; the last is the current one.
    pub(crate) done: Vec<i32>,
    /// Deliveries that reached the handler until the last acknowledgement.
    pub(crate) attempts: u32,
    /// When the record expires (retention), ms since the Unix epoch.
    pub(crate) expires_ms: u64,
}

/// A validation nonce's durable record: its payment and the decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ValidationRecord {
    pub(crate) fingerprint: KeptFingerprint,
    pub(crate) decision: RecordedDecision,
    pub(crate) expires_ms: u64,
    /// In Awaitable mode, the postponed validation that holds the decision: a repeat under
    /// a new validation id is recorded as its repeat. Absent outside Awaitable mode, and in
    /// records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) validation_id: Option<ValidationId>,
    /// The repeats of `validation_id` that still awaited their results when it was purged
    /// (sled purges an original once its own result is delivered), and of any validation
    /// it named before (an approval recorded afresh names the new one): the record is kept
    /// while one of them does. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) repeats_awaiting: Vec<ValidationId>,
}

pub(crate) fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Our own records always serialise; an empty value would be caught as corrupt on read.
    serde_json::to_vec(record).unwrap_or_default()
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    key: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    decode_named(bytes, || key.to_owned())
}

/// [`decode`], for scans over many records: the record's name is built only if it does not
/// decode.
pub(crate) fn decode_named<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    name: impl FnOnce() -> String,
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: name(),
        reason: e.to_string(),
    })
}
