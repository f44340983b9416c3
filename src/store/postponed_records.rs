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

use serde::{Deserialize, Serialize};

use super::StoreError;
use super::keys;
use super::record::{decode, encode};
use super::staging::Staging;
use crate::model::TransactionValidationRequest;

/// A validation decided after its answer (Awaitable mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostponedValidation {
    /// The aggregator's `validationId`.
    pub validation_id: i64,
    /// The validation request as received.
    pub request: TransactionValidationRequest,
    /// When it was received, ms since the Unix epoch.
    pub received_ms: u64,
    /// When it is resolved with the configured default outcome if still undecided.
    pub deadline_ms: Option<u64>,
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
    /// When the decision was taken, ms since the Unix epoch.
    pub decided_ms: u64,
    /// Its delivery to the aggregator.
    pub delivery: Delivery,
}

/// The delivery of a result to `{gateway_url}/api/v1/transactions/validation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Delivery {
    /// In the outbox: the next attempt is due at `next_attempt_ms`.
    Queued {
        /// Attempts made so far.
        attempts: u32,
        /// When the next attempt is due, ms since the Unix epoch.
        next_attempt_ms: u64,
        /// Why the last attempt failed.
        last_error: Option<String>,
    },
    /// The aggregator answered 200.
    Delivered {
        /// Attempts it took.
        attempts: u32,
        /// When, ms since the Unix epoch.
        at_ms: u64,
    },
    /// The aggregator answered 403: it holds a different result. Final.
    Conflict {
        /// Attempts it took.
        attempts: u32,
        /// The aggregator's message.
        message: String,
        /// When, ms since the Unix epoch.
        at_ms: u64,
    },
}

impl Delivery {
    /// A delivery due now.
    pub(crate) fn queued(now_ms: u64) -> Self {
        Self::Queued {
            attempts: 0,
            next_attempt_ms: now_ms,
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
        now_ms: u64,
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
                .deadline_ms
                .map(|ms| ms.to_be_bytes().to_vec())
                .unwrap_or_default();
            staging.put(waiting, Some(deadline));
            staging.put(outbox, None);
        }
        Some(Delivery::Queued {
            next_attempt_ms, ..
        }) => {
            staging.put(waiting, None);
            staging.put(outbox, Some(next_attempt_ms.to_be_bytes().to_vec()));
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
            now_ms,
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
                decided_ms: now_ms,
                delivery: Delivery::queued(now_ms),
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
