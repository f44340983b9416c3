//! Postponed validations and the outbox of their results, as the store keeps them.
//!
//! ## Life cycle of a postponed validation (key: validationId)
//!
//! ```text
//!   handler Postpone / time budget spent ──▶ Pending ──resolve / deadline──▶ Queued ──200──▶ Delivered
//!   handler Allow/Deny in Awaitable mode ─────────────────────────────────▶ Queued ──403──▶ Conflict
//!                                                                 ▲  │ network, 5xx, 401: next attempt
//!                                                                 └──┘
//! ```
//!
//! The decision is written in the same atomic write as the outbox entry that delivers it, so
//! a decision taken is delivered, whatever happens to the process. The first decision wins:
//! resolving again with the same `success` is a no-op, with the other one is refused.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::keys;
use super::record::{decode, encode};
use super::staging::Staging;
use crate::model::TransactionValidationRequest;

/// The decision on a postponed validation, with the description posted with it.
///
/// ```
/// use payhook::postponed::Decision;
///
/// let decision = Decision::deny("documents missing");
/// assert!(!decision.allows());
/// assert_eq!(decision.description(), "documents missing");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The client may make the transaction (`success: true`).
    Allow {
        /// Sent to the aggregator with the result.
        description: String,
    },
    /// The client may not (`success: false`).
    Deny {
        /// Sent to the aggregator with the result.
        description: String,
    },
}

impl Decision {
    /// The client may make the transaction.
    pub fn allow(description: impl Into<String>) -> Self {
        Self::Allow {
            description: description.into(),
        }
    }

    /// The client may not.
    pub fn deny(description: impl Into<String>) -> Self {
        Self::Deny {
            description: description.into(),
        }
    }

    /// `allow` or `deny` by a condition.
    pub fn allow_if(allow: bool, description: impl Into<String>) -> Self {
        if allow {
            Self::allow(description)
        } else {
            Self::deny(description)
        }
    }

    /// Whether the client may make the transaction: the result's `success`.
    pub fn allows(&self) -> bool {
        matches!(self, Self::Allow { .. })
    }

    /// The description sent with the result.
    pub fn description(&self) -> &str {
        match self {
            Self::Allow { description } | Self::Deny { description } => description,
        }
    }
}

/// A validation decided after its answer (Awaitable mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostponedValidation {
    /// The aggregator's `validationId`.
    pub validation_id: i64,
    /// The validation request as received.
    pub request: TransactionValidationRequest,
    /// When it was received (UTC).
    #[serde(rename = "received_ms", with = "super::epoch_ms")]
    pub received: DateTime<Utc>,
    /// When it is resolved with the configured default outcome if still undecided (UTC).
    #[serde(rename = "deadline_ms", with = "super::epoch_ms::option")]
    pub deadline: Option<DateTime<Utc>>,
    /// The decision, once taken.
    pub result: Option<ValidationResult>,
}

/// A decision on a postponed validation and where its delivery stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationResult {
    /// Whether the client was validated.
    pub success: bool,
    /// The explanation sent with it.
    pub description: String,
    /// When the decision was taken (UTC).
    #[serde(rename = "decided_ms", with = "super::epoch_ms")]
    pub decided: DateTime<Utc>,
    /// Its delivery to the aggregator.
    pub delivery: Delivery,
}

/// The delivery of a result to `{gateway_url}/api/v1/transactions/validation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Delivery {
    /// In the outbox: the next attempt is due at `next_attempt`.
    Queued {
        /// Attempts made so far.
        attempts: u32,
        /// When the next attempt is due (UTC).
        #[serde(rename = "next_attempt_ms", with = "super::epoch_ms")]
        next_attempt: DateTime<Utc>,
        /// Why the last attempt failed.
        last_error: Option<String>,
    },
    /// The aggregator answered 200.
    Delivered {
        /// Attempts it took.
        attempts: u32,
        /// When (UTC).
        #[serde(rename = "at_ms", with = "super::epoch_ms")]
        at: DateTime<Utc>,
    },
    /// The aggregator answered 403: it holds a different result. Final.
    Conflict {
        /// Attempts it took.
        attempts: u32,
        /// The aggregator's message.
        message: String,
        /// When (UTC).
        #[serde(rename = "at_ms", with = "super::epoch_ms")]
        at: DateTime<Utc>,
    },
}

impl Delivery {
    /// A delivery due now.
    pub(crate) fn queued(now: DateTime<Utc>) -> Self {
        Self::Queued {
            attempts: 0,
            next_attempt: now,
            last_error: None,
        }
    }
}

/// Where a postponed validation stands, for listing and filtering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PostponedState {
    /// No decision yet.
    Pending,
    /// Decided, delivery in progress.
    Queued,
    /// Decided and delivered.
    Delivered,
    /// Decided, but the aggregator holds a different result.
    Conflict,
}

impl PostponedValidation {
    /// Where it stands.
    pub fn state(&self) -> PostponedState {
        match self.result.as_ref().map(|r| &r.delivery) {
            None => PostponedState::Pending,
            Some(Delivery::Queued { .. }) => PostponedState::Queued,
            Some(Delivery::Delivered { .. }) => PostponedState::Delivered,
            Some(Delivery::Conflict { .. }) => PostponedState::Conflict,
        }
    }

    fn is_final(&self) -> bool {
        matches!(
            self.state(),
            PostponedState::Delivered | PostponedState::Conflict
        )
    }
}

/// What a resolve did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The decision is recorded and queued for delivery.
    Recorded,
    /// The same decision was recorded before: nothing changed.
    AlreadyRecorded,
    /// A different decision was recorded before: refused, nothing changed.
    Conflicting {
        /// The recorded `success`.
        success: bool,
        /// The recorded description.
        description: String,
    },
    /// No postponed validation has this id.
    Unknown,
}

/// A write to the postponed records, applied by the store's writer within a batch.
pub(crate) enum PostponedOp {
    /// Take a decision: first one wins.
    Resolve {
        validation_id: i64,
        success: bool,
        description: String,
        now: DateTime<Utc>,
    },
    /// Record how a delivery attempt went.
    Deliver {
        validation_id: i64,
        delivery: Delivery,
    },
}

fn read(staging: &Staging<'_>, id: i64) -> Result<Option<PostponedValidation>, StoreError> {
    staging
        .get(&keys::by_id(keys::POSTPONED_PREFIX, id))?
        .map(|bytes| decode(&id.to_string(), &bytes))
        .transpose()
}

/// Writes `record` with its index entries: waiting (no decision) or outbox (queued).
pub(crate) fn put(staging: &mut Staging<'_>, record: &PostponedValidation) {
    let id = record.validation_id;
    staging.put(
        keys::by_id(keys::POSTPONED_PREFIX, id),
        Some(encode(record)),
    );
    let waiting = keys::by_id(keys::WAITING_PREFIX, id);
    let outbox = keys::by_id(keys::OUTBOX_PREFIX, id);
    match record.result.as_ref().map(|r| &r.delivery) {
        None => {
            let deadline = record
                .deadline
                .map(|time| super::ms_from_time(time).to_be_bytes().to_vec())
                .unwrap_or_default();
            staging.put(waiting, Some(deadline));
            staging.put(outbox, None);
        }
        Some(Delivery::Queued { next_attempt, .. }) => {
            let next_attempt = super::ms_from_time(*next_attempt);
            staging.put(waiting, None);
            staging.put(outbox, Some(next_attempt.to_be_bytes().to_vec()));
        }
        Some(_) => {
            staging.put(waiting, None);
            staging.put(outbox, None);
        }
    }
}

/// Stores a new postponed validation, unless its id is already known (the first one stays:
/// the aggregator never reuses a validation id, and a replay must not reset a decision).
/// Returns `true` when written.
pub(crate) fn create(
    staging: &mut Staging<'_>,
    record: &PostponedValidation,
) -> Result<bool, StoreError> {
    if let Some(existing) = read(staging, record.validation_id)? {
        if existing.request.nonce() != record.request.nonce() {
            tracing::warn!(
                security_event = "validation_id_reuse",
                validation_id = record.validation_id,
                "a validation id arrived again with another nonce; the first is kept"
            );
        }
        return Ok(false);
    }
    put(staging, record);
    Ok(true)
}

/// Applies `op`; what it did is returned (for a delivery, always `Recorded`).
pub(crate) fn apply(staging: &mut Staging<'_>, op: PostponedOp) -> Result<Resolution, StoreError> {
    match op {
        PostponedOp::Resolve {
            validation_id,
            success,
            description,
            now,
        } => {
            let Some(mut record) = read(staging, validation_id)? else {
                return Ok(Resolution::Unknown);
            };
            if let Some(result) = &record.result {
                return Ok(if result.success == success {
                    Resolution::AlreadyRecorded
                } else {
                    Resolution::Conflicting {
                        success: result.success,
                        description: result.description.clone(),
                    }
                });
            }
            record.result = Some(ValidationResult {
                success,
                description,
                decided: now,
                delivery: Delivery::queued(now),
            });
            put(staging, &record);
            Ok(Resolution::Recorded)
        }
        PostponedOp::Deliver {
            validation_id,
            delivery,
        } => {
            let Some(mut record) = read(staging, validation_id)? else {
                return Ok(Resolution::Unknown);
            };
            match record.result.as_mut() {
                // A final state is never left: a late attempt's outcome does not undo it.
                Some(result) if !matches!(result.delivery, Delivery::Queued { .. }) => {}
                Some(result) => {
                    result.delivery = delivery;
                    put(staging, &record);
                }
                None => return Ok(Resolution::Unknown),
            }
            Ok(Resolution::Recorded)
        }
    }
}

/// Whether the sweeper may remove this record at the end of its retention: only once its
/// result is delivered or refused; an undelivered one is kept (and indexed again).
pub(crate) fn purgeable(bytes: &[u8], id: &str) -> Result<bool, StoreError> {
    Ok(decode::<PostponedValidation>(id, bytes)?.is_final())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::time_from_ms;

    /// The record of a postponed validation in the JSON written before its times were
    /// `DateTime<Utc>`: `*_ms` fields holding integers of milliseconds.
    fn old_form(request: &str, result: &str) -> String {
        format!(
            r#"{{"validation_id":42,"request":{request},"received_ms":1700000000123,"deadline_ms":1700000300123,"result":{result}}}"#
        )
    }

    fn request() -> String {
        let wire: TransactionValidationRequest = serde_json::from_str(
            r#"{"merchantData":{"merchantHash":"h","clientId":"c"},
                "paymentData":{"nonce":"n-1","amount":"10.50","currency":"EUR","providerId":1},
                "validationId":42,"cashIn":true}"#,
        )
        .unwrap();
        serde_json::to_string(&wire).unwrap()
    }

    #[test]
    fn records_written_with_millisecond_fields_read_and_write_back_byte_identical() {
        let request = request();
        let results = [
            (
                r#"{"success":true,"description":"ok","decided_ms":1700000001000,"delivery":{"state":"queued","attempts":2,"next_attempt_ms":1700000005000,"last_error":"timeout"}}"#,
                Some(Delivery::Queued {
                    attempts: 2,
                    next_attempt: time_from_ms(1_700_000_005_000),
                    last_error: Some("timeout".into()),
                }),
            ),
            (
                r#"{"success":true,"description":"ok","decided_ms":1700000001000,"delivery":{"state":"delivered","attempts":3,"at_ms":1700000009999}}"#,
                Some(Delivery::Delivered {
                    attempts: 3,
                    at: time_from_ms(1_700_000_009_999),
                }),
            ),
            (
                r#"{"success":true,"description":"ok","decided_ms":1700000001000,"delivery":{"state":"conflict","attempts":1,"message":"other result","at_ms":1700000002000}}"#,
                Some(Delivery::Conflict {
                    attempts: 1,
                    message: "other result".into(),
                    at: time_from_ms(1_700_000_002_000),
                }),
            ),
            ("null", None),
        ];
        for (result, delivery) in results {
            let old = old_form(&request, result);
            // As the store reads and writes it.
            let record: PostponedValidation = decode("42", old.as_bytes()).unwrap();
            assert_eq!(encode(&record), old.as_bytes());
            assert_eq!(record.received.timestamp_millis(), 1_700_000_000_123);
            assert_eq!(
                record.deadline.map(|d| d.timestamp_millis()),
                Some(1_700_000_300_123)
            );
            if let Some(result) = &record.result {
                assert_eq!(result.decided.timestamp_millis(), 1_700_000_001_000);
            }
            assert_eq!(record.result.map(|r| r.delivery), delivery);
        }
        let no_deadline = old_form(&request, "null").replace("1700000300123", "null");
        let record: PostponedValidation = serde_json::from_str(&no_deadline).unwrap();
        assert_eq!(record.deadline, None);
        assert_eq!(serde_json::to_string(&record).unwrap(), no_deadline);
    }

    #[test]
    fn a_time_beyond_chronos_range_is_clamped_not_refused() {
        let old = old_form(&request(), "null").replace("1700000300123", &u64::MAX.to_string());
        let record: PostponedValidation = serde_json::from_str(&old).unwrap();
        assert_eq!(record.deadline, Some(DateTime::<Utc>::MAX_UTC));
    }
}
