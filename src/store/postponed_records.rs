//! Postponed validations and the outbox of their results, as the store keeps them: their
//! records under their validation id, the index of the undecided ones (by deadline) and of
//! the outbox (by next attempt, with each result's decision time), all written in the
//! batch that changes them. Their life cycle is the Awaitable domain's
//! (`crate::postponed::record`); this module applies it inside the store's atomic write, so
//! that a decision and the outbox entry that delivers it are durable together.

use crate::model::ValidationId;
use chrono::{DateTime, Utc};

use super::keys;
use super::record::{decode, encode};
use super::staging::Staging;
use super::{StoreError, unless_gone_or_unreadable};
use crate::model::TransactionValidationRequest;
use crate::postponed::record::{Delivery, NextDue, PostponedValidation, Repeat, Resolution};

/// A write to the postponed records, applied by the store's writer within a batch.
pub(crate) enum PostponedOp {
    /// Take a decision: first one wins.
    Resolve {
        validation_id: ValidationId,
        success: bool,
        description: String,
        /// Who decided (see `ValidationResult::decided_by`).
        by: Option<String>,
        now: DateTime<Utc>,
    },
    /// Record how a delivery attempt went.
    Deliver {
        validation_id: ValidationId,
        delivery: Delivery,
    },
    /// Make a result's next attempt due now, queueing a refused one again (an operator's
    /// decision).
    MakeDue {
        validation_id: ValidationId,
        now: DateTime<Utc>,
    },
}

fn read(
    staging: &Staging<'_>,
    id: ValidationId,
) -> Result<Option<PostponedValidation>, StoreError> {
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
    match record.next_due() {
        NextDue::Deadline(deadline) => {
            let deadline = deadline
                .map(|time| super::ms_from_time(time).to_be_bytes().to_vec())
                .unwrap_or_default();
            staging.put(waiting, Some(deadline));
            staging.put(outbox, None);
        }
        NextDue::Delivery(next_attempt) => {
            let decided = record
                .result
                .as_ref()
                .map(|r| super::ms_from_time(r.decided));
            let entry = keys::outbox_entry(super::ms_from_time(next_attempt), decided);
            staging.put(waiting, None);
            staging.put(outbox, Some(entry));
        }
        NextDue::Nothing => {
            staging.put(waiting, None);
            staging.put(outbox, None);
        }
    }
}

/// What [`create`] did.
pub(crate) enum Created {
    /// The record was written.
    New,
    /// Its id was known for the same nonce: nothing written (a replay must not reset a
    /// decision).
    Known,
    /// Its id was known for another nonce: nothing written, the first one stays (the
    /// aggregator never reuses a validation id).
    TakenByAnotherNonce,
}

/// Stores a new postponed validation, unless its id is already known (the first one stays).
pub(crate) fn create(
    staging: &mut Staging<'_>,
    record: &PostponedValidation,
) -> Result<Created, StoreError> {
    if let Some(existing) = read(staging, record.validation_id)? {
        if existing.request.nonce() != record.request.nonce() {
            tracing::warn!(
                security_event = "validation_id_reuse",
                validation_id = record.validation_id.get(),
                "a validation id arrived again with another nonce; the first is kept"
            );
            return Ok(Created::TakenByAnotherNonce);
        }
        return Ok(Created::Known);
    }
    put(staging, record);
    Ok(Created::New)
}

/// Applies `op`; what it did is returned (for a delivery, `Recorded` unless unknown).
pub(crate) fn apply(staging: &mut Staging<'_>, op: PostponedOp) -> Result<Resolution, StoreError> {
    match op {
        PostponedOp::Resolve {
            validation_id,
            success,
            description,
            by,
            now,
        } => {
            let Some(record) = read(staging, validation_id)? else {
                return Ok(Resolution::Unknown);
            };
            // A repeat is decided through the validation it repeats, whose decision is its
            // own; one whose original is gone (purged once delivered) stands alone.
            let mut record = match record.repeat_of {
                Some(original) => {
                    unless_gone_or_unreadable(read(staging, original))?.unwrap_or(record)
                }
                None => record,
            };
            let resolution = record.resolve(success, description.clone(), by.clone(), now);
            if resolution == Resolution::Recorded {
                // Every read before any write: an error leaves the batch as it was.
                let mut repeats = Vec::with_capacity(record.repeats.len());
                for id in &record.repeats {
                    if let Some(mut repeat) = unless_gone_or_unreadable(read(staging, *id))?
                        && repeat.resolve(success, description.clone(), by.clone(), now)
                            == Resolution::Recorded
                    {
                        repeats.push(repeat);
                    }
                }
                for record in std::iter::once(&record).chain(&repeats) {
                    put(staging, record);
                }
            }
            Ok(resolution)
        }
        PostponedOp::Deliver {
            validation_id,
            delivery,
        } => {
            let Some(mut record) = read(staging, validation_id)? else {
                return Ok(Resolution::Unknown);
            };
            match record.record_delivery(delivery) {
                None => Ok(Resolution::Unknown),
                Some(changed) => {
                    if changed {
                        put(staging, &record);
                    }
                    Ok(Resolution::Recorded)
                }
            }
        }
        PostponedOp::MakeDue { validation_id, now } => {
            let Some(mut record) = read(staging, validation_id)? else {
                return Ok(Resolution::Unknown);
            };
            if !record.due_now(now) {
                return Ok(Resolution::AlreadyRecorded);
            }
            put(staging, &record);
            Ok(Resolution::Recorded)
        }
    }
}

/// What a nonce's validation record says of a repeat of it.
pub(crate) struct Recorded {
    /// The postponed validation that holds the nonce's decision, when one was linked.
    pub(crate) original: Option<ValidationId>,
    /// Whether the decision is an approval.
    pub(crate) approved: bool,
}

/// Records `request`, a repeat of a recorded validation under a new validation id, as a
/// repeat of the postponed validation that holds its nonce's decision (`recorded`, read
/// from the nonce's validation record by the caller), or, when none holds it and the
/// decision is an approval, as an approved validation of its own
/// ([`Repeat::RecordedAfresh`]); what it did is returned, and the new record's id when one
/// was written.
pub(crate) fn repeat(
    staging: &mut Staging<'_>,
    recorded: &Recorded,
    request: TransactionValidationRequest,
    now: DateTime<Utc>,
) -> Result<(Repeat, Option<ValidationId>), StoreError> {
    if let Some(known) = read(staging, request.validation_id)? {
        let repeat = if known.request.nonce() == request.nonce() {
            Repeat::Known
        } else {
            Repeat::Taken
        };
        return Ok((repeat, None));
    }
    let Some(mut original) = recorded
        .original
        .map(|id| read(staging, id))
        .transpose()?
        .flatten()
        .filter(|original| original.request.nonce() == request.nonce())
    else {
        if !recorded.approved {
            return Ok((Repeat::Unlinked, None));
        }
        let approved = PostponedValidation::approved(request, now);
        put(staging, &approved);
        return Ok((Repeat::RecordedAfresh, Some(approved.validation_id)));
    };
    let Some(repeat) = original.repeated_by(request, now) else {
        return Ok((Repeat::Full, None));
    };
    put(staging, &original);
    put(staging, &repeat);
    Ok((
        Repeat::Recorded {
            of: original.validation_id,
            decided: repeat.result.is_some(),
        },
        Some(repeat.validation_id),
    ))
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
