//! The Awaitable domain's records: a postponed validation, the decision on it, and the
//! delivery of that decision to the aggregator, with their life cycle. The store persists
//! them (`store/postponed_records.rs`) and applies these transitions inside its atomic
//! write; nothing here knows how they are stored.
//!
//! ## Life cycle of a postponed validation (key: validationId)
//!
//! ```text
//!   handler Postpone / time budget spent ──▶ Pending ──resolve / deadline──▶ Queued ──200──▶ Delivered
//!   handler Allow/Deny in Awaitable mode ─────────────────────────────────▶ Queued ──403──▶ Conflict
//!                                                                 ▲  │ network, 5xx, 401: next attempt
//!                                                                 └──┘
//!                                              Queued ◀── an operator's "send again" ── Conflict
//! ```
//!
//! The first decision wins: resolving again with the same `success` is a no-op, with the
//! other one is refused. A delivered result is never left; a refused one (conflict) only by
//! an operator's decision ([`PostponedValidation::due_now`]). An attempt's outcome is
//! recorded only when it follows the attempts recorded so far (its count is one more): the
//! late outcome of an attempt another instance has since repeated changes nothing.
//!
//! A repeat of a validation under a new validation id (same nonce, same payment) is a
//! record of its own, linked both ways (`repeat_of`, `repeats`): it starts with the
//! original's decision, queued, or pending without a deadline; the original's decision,
//! taken by a resolve of either, is written to every repeat in the same atomic write.
//! Each has its own delivery.

use crate::model::ValidationId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

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
    pub validation_id: ValidationId,
    /// The validation request as received.
    pub request: TransactionValidationRequest,
    /// When it was received (UTC).
    #[serde(rename = "received_ms", with = "crate::model::timestamp::epoch_ms")]
    pub received: DateTime<Utc>,
    /// When it is resolved with the configured default outcome if still undecided (UTC).
    #[serde(
        rename = "deadline_ms",
        with = "crate::model::timestamp::epoch_ms::option"
    )]
    pub deadline: Option<DateTime<Utc>>,
    /// The decision, once taken.
    pub result: Option<ValidationResult>,
    /// The validation this one repeats: the aggregator asked again about the same nonce and
    /// payment under this new id. It shares that validation's decision (a resolve of either
    /// decides both) and has a delivery of its own. `None` for an original.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_of: Option<ValidationId>,
    /// The validations that repeat this one, oldest first: its decision is theirs too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<ValidationId>,
}

/// One page of postponed validations, by id (the aggregator's numbering): what
/// [`PostponedStore::postponed_page`](crate::store::PostponedStore::postponed_page) reads, so
/// that a listing of the retention period's records is never read, or sent, in one piece.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PostponedPage {
    /// The validations of this page, lowest id first.
    pub validations: Vec<PostponedValidation>,
    /// The `after` of the next page (this page's last id) while more follow; `None` when
    /// this is the last.
    pub next: Option<ValidationId>,
}

impl PostponedPage {
    /// The first `limit` of `listed` (by id, after the page's `after`), and where the next
    /// page starts when `listed` holds more: read `limit + 1` to know.
    pub(crate) fn of(listed: Vec<PostponedValidation>, limit: usize) -> Self {
        let (validations, next) =
            crate::store::first_page(listed, limit, |last| last.validation_id);
        Self { validations, next }
    }
}

/// A decision on a postponed validation and where its delivery stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationResult {
    /// Whether the client was validated.
    pub success: bool,
    /// The explanation sent with it.
    pub description: String,
    /// When the decision was taken (UTC).
    #[serde(rename = "decided_ms", with = "crate::model::timestamp::epoch_ms")]
    pub decided: DateTime<Utc>,
    /// Who decided, when a person did: through the operating API, the operator whose own
    /// token it came with (`[admin.operators]`), else the name a bearer of the shared token
    /// gave; on a stopped service's store, the command line's `--by`; or a back office's
    /// [`Resolver::resolve_by`](crate::postponed::Resolver::resolve_by). `None` for the
    /// handler's decision, a deadline's, one nobody named, and decisions recorded before
    /// payhook kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
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
        #[serde(rename = "next_attempt_ms", with = "crate::model::timestamp::epoch_ms")]
        next_attempt: DateTime<Utc>,
        /// Why the last attempt failed.
        last_error: Option<String>,
    },
    /// The aggregator answered 200.
    Delivered {
        /// Attempts it took.
        attempts: u32,
        /// When (UTC).
        #[serde(rename = "at_ms", with = "crate::model::timestamp::epoch_ms")]
        at: DateTime<Utc>,
    },
    /// The aggregator answered 403: it holds a different result. Final, unless an operator
    /// sends it again (`Resolver::retry_now`, the operating API's `outbox/{id}/retry`).
    Conflict {
        /// Attempts it took.
        attempts: u32,
        /// The aggregator's message.
        message: String,
        /// When (UTC).
        #[serde(rename = "at_ms", with = "crate::model::timestamp::epoch_ms")]
        at: DateTime<Utc>,
    },
}

impl ValidationResult {
    /// A decision taken at `now` by `by`, queued for delivery at once.
    pub(crate) fn queued(
        success: bool,
        description: String,
        by: Option<String>,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            success,
            description,
            decided: now,
            decided_by: by,
            delivery: Delivery::queued(now),
        }
    }
}

/// The description posted with an approval by the handler.
pub(crate) const ALLOWED: &str = "client allowed";

impl Delivery {
    /// A delivery due now.
    pub(crate) fn queued(now: DateTime<Utc>) -> Self {
        Self::Queued {
            attempts: 0,
            next_attempt: now,
            last_error: None,
        }
    }

    /// The attempts made so far.
    pub fn attempts(&self) -> u32 {
        match self {
            Self::Queued { attempts, .. }
            | Self::Delivered { attempts, .. }
            | Self::Conflict { attempts, .. } => *attempts,
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

impl PostponedState {
    /// Every state, in the order of a validation's life.
    pub const ALL: [Self; 4] = [Self::Pending, Self::Queued, Self::Delivered, Self::Conflict];

    /// Its name in the operating API's `state=` and the command line's listings.
    ///
    /// ```
    /// use payhook::postponed::PostponedState;
    ///
    /// assert_eq!(PostponedState::Conflict.as_str(), "conflict");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Queued => "queued",
            Self::Delivered => "delivered",
            Self::Conflict => "conflict",
        }
    }
}

impl PostponedValidation {
    /// `request`, postponed at `received`: undecided, and decided with the deadline's
    /// outcome at `deadline` (never without one); repeated by none yet.
    ///
    /// ```
    /// use payhook::postponed::{PostponedState, PostponedValidation};
    ///
    /// let request = serde_json::from_value(serde_json::json!({
    ///     "merchantData": {"merchantHash": "h", "clientId": "c"},
    ///     "paymentData": {"nonce": "n-7", "amount": 10, "currency": "EUR", "providerId": 1},
    ///     "validationId": 7, "cashIn": true
    /// }))?;
    /// let postponed = PostponedValidation::new(request, chrono::Utc::now(), None);
    /// assert_eq!((postponed.validation_id.get(), postponed.state()), (7, PostponedState::Pending));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn new(
        request: TransactionValidationRequest,
        received: DateTime<Utc>,
        deadline: Option<DateTime<Utc>>,
    ) -> Self {
        Self {
            validation_id: request.validation_id,
            request,
            received,
            deadline,
            result: None,
            repeat_of: None,
            repeats: Vec::new(),
        }
    }

    /// Where it stands.
    pub fn state(&self) -> PostponedState {
        match self.result.as_ref().map(|r| &r.delivery) {
            None => PostponedState::Pending,
            Some(Delivery::Queued { .. }) => PostponedState::Queued,
            Some(Delivery::Delivered { .. }) => PostponedState::Delivered,
            Some(Delivery::Conflict { .. }) => PostponedState::Conflict,
        }
    }

    pub(crate) fn is_final(&self) -> bool {
        matches!(
            self.state(),
            PostponedState::Delivered | PostponedState::Conflict
        )
    }

    /// What falls due next for this record, as a store indexes it.
    pub(crate) fn next_due(&self) -> NextDue {
        match self.result.as_ref().map(|r| &r.delivery) {
            None => NextDue::Deadline(self.deadline),
            Some(Delivery::Queued { next_attempt, .. }) => NextDue::Delivery(*next_attempt),
            Some(_) => NextDue::Nothing,
        }
    }
}

/// What falls due next for a postponed validation: the stores keep it in their indexes of
/// undecided validations (by deadline) and of the outbox (by next attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextDue {
    /// Undecided: its deadline, if it has one.
    Deadline(Option<DateTime<Utc>>),
    /// Decided, its result awaiting delivery: the next attempt.
    Delivery(DateTime<Utc>),
    /// Delivered or refused: nothing more.
    Nothing,
}

/// How many repeats under new validation ids one validation takes: a repeat beyond them is
/// not recorded ([`Repeat::Full`]), and, as no result would be posted for its id, refused
/// with 409 (a denial is answered 403, as recorded).
pub(crate) const MAX_REPEATS: usize = 100;

/// What recording a repeat under a new validation id did (see
/// [`PostponedStore::repeat`](crate::store::PostponedStore::repeat)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Repeat {
    /// The id is known: the aggregator asked again about the same validation.
    Known,
    /// Not recorded: the id is another nonce's validation. The aggregator never gives two
    /// payments one id, so one of the two requests is not the aggregator's; answered like a
    /// validation under a taken id ([`crate::store::StoreError::ValidationIdTaken`]).
    Taken,
    /// Recorded as a repeat of validation `of`: the new id gets its decision, queued now
    /// (`decided`) or when it is taken.
    Recorded {
        /// The validation that holds the decision.
        of: ValidationId,
        /// Whether the decision was taken already, and the result is queued.
        decided: bool,
    },
    /// Not recorded: no postponed validation holds the nonce's decision (it was decided
    /// outside Awaitable mode, before payhook kept the link, or its postponed validation
    /// went with the retention), and the decision is not an approval. A denial is answered
    /// as recorded (403, which the aggregator does not wait on); no result is posted for
    /// the id, so a decision recorded as postponed is refused with 409.
    Unlinked,
    /// Recorded afresh: no postponed validation holds the nonce's decision, which is an
    /// approval. Answered 200 as recorded, which the aggregator, in Awaitable mode, takes
    /// as a validation created to be waited on: the id is recorded as a postponed
    /// validation of its own, approved with the description an approval by the handler is
    /// posted with (`client allowed`), its result queued, and the nonce's later repeats
    /// are recorded as its repeats. The id of the validation that took the approval, asked
    /// again after its record went, is recorded so too (afresh, or as such a repeat): its
    /// result is posted again, the same, which the aggregator answers 200.
    RecordedAfresh,
    /// Not recorded: the validation that holds the nonce's decision has as many repeats as
    /// it takes (100). No result would be posted for the new id, so the service
    /// refuses it with 409 rather than answer a 200 the aggregator would wait on (a denial
    /// is answered 403, as recorded).
    Full,
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

#[cfg(test)]
impl PostponedValidation {
    /// Validation `id` (nonce `n-{id}`), received at the epoch, with no deadline and no
    /// decision: for unit tests across the crate.
    pub(crate) fn pending_for_tests(id: i64) -> Self {
        let request = serde_json::from_str(&format!(
            r#"{{"merchantData": {{"merchantHash": "h", "clientId": "c"}},
                "paymentData": {{"nonce": "n-{id}", "amount": 10, "currency": "EUR", "providerId": 1}},
                "validationId": {id}, "cashIn": true}}"#
        ))
        .expect("a valid validation request");
        Self::new(request, DateTime::<Utc>::UNIX_EPOCH, None)
    }
}

impl PostponedValidation {
    /// Takes a decision at `now`, by `by` (see [`ValidationResult::decided_by`]), queued
    /// for delivery at once: the first decision wins.
    pub(crate) fn resolve(
        &mut self,
        success: bool,
        description: String,
        by: Option<String>,
        now: DateTime<Utc>,
    ) -> Resolution {
        if let Some(result) = &self.result {
            return if result.success == success {
                Resolution::AlreadyRecorded
            } else {
                Resolution::Conflicting {
                    success: result.success,
                    description: result.description.clone(),
                }
            };
        }
        self.result = Some(ValidationResult::queued(success, description, by, now));
        Resolution::Recorded
    }

    /// `request`, received at `now` under a new validation id for a nonce whose recorded
    /// decision is an approval that no postponed validation holds any more
    /// ([`Repeat::RecordedAfresh`]): approved at `now` with the description an approval by
    /// the handler is posted with, its result queued for delivery.
    pub(crate) fn approved(request: TransactionValidationRequest, now: DateTime<Utc>) -> Self {
        let mut approved = Self::new(request, now, None);
        approved.result = Some(ValidationResult::queued(true, ALLOWED.into(), None, now));
        approved
    }

    /// The record of `request`, which repeats this validation under a new validation id,
    /// received at `now`: this validation's decision, if taken, is its too, queued for a
    /// delivery of its own; without one it waits for this one's (it has no deadline of its
    /// own). Returns `None` when this validation already has [`MAX_REPEATS`] repeats, which
    /// keeps its record bounded.
    pub(crate) fn repeated_by(
        &mut self,
        request: TransactionValidationRequest,
        now: DateTime<Utc>,
    ) -> Option<PostponedValidation> {
        if self.repeats.len() >= MAX_REPEATS {
            return None;
        }
        let validation_id = request.validation_id;
        self.repeats.push(validation_id);
        Some(PostponedValidation {
            validation_id,
            request,
            received: now,
            deadline: None,
            result: self.result.as_ref().map(|taken| {
                ValidationResult::queued(
                    taken.success,
                    taken.description.clone(),
                    taken.decided_by.clone(),
                    now,
                )
            }),
            repeat_of: Some(self.validation_id),
            repeats: Vec::new(),
        })
    }

    /// Makes the result's next attempt due at `now` (an operator's "retry now"); a result the
    /// aggregator refused as conflicting (403) is queued again, the refusal kept as its last
    /// error — the operator judged the refusal not the aggregator's (a firewall, a missing
    /// role). `true` when the record changed: it was queued or refused, not undecided or
    /// delivered.
    pub(crate) fn due_now(&mut self, now: DateTime<Utc>) -> bool {
        let Some(result) = self.result.as_mut() else {
            return false;
        };
        match &mut result.delivery {
            Delivery::Queued { next_attempt, .. } => *next_attempt = now,
            Delivery::Conflict {
                attempts, message, ..
            } => {
                let last_error = format!("refused (403): {message}; queued again by an operator");
                result.delivery = Delivery::Queued {
                    attempts: *attempts,
                    next_attempt: now,
                    last_error: Some(last_error),
                };
            }
            Delivery::Delivered { .. } => return false,
        }
        true
    }

    /// Records how a delivery attempt went: `Some(true)` when the record changed,
    /// `Some(false)` when it was final already, or the outcome is not that of the attempt
    /// after those recorded (a late attempt's outcome does not undo what followed it),
    /// `None` when there is no decision to deliver.
    pub(crate) fn record_delivery(&mut self, delivery: Delivery) -> Option<bool> {
        let result = self.result.as_mut()?;
        let Delivery::Queued { attempts: made, .. } = result.delivery else {
            return Some(false);
        };
        // Not the outcome of the attempt after those recorded: a late one, repeated since.
        if delivery.attempts() != made.saturating_add(1) {
            return Some(false);
        }
        result.delivery = delivery;
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending() -> PostponedValidation {
        PostponedValidation::pending_for_tests(7)
    }

    #[test]
    fn the_first_decision_wins_and_the_same_one_again_changes_nothing() {
        let mut record = pending();
        let now = DateTime::<Utc>::UNIX_EPOCH;
        assert_eq!(record.state(), PostponedState::Pending);
        assert_eq!(
            record.resolve(true, "ok".into(), None, now),
            Resolution::Recorded
        );
        assert_eq!(record.state(), PostponedState::Queued);
        assert_eq!(
            record.resolve(true, "again".into(), None, now),
            Resolution::AlreadyRecorded
        );
        assert_eq!(
            record.resolve(false, "no".into(), None, now),
            Resolution::Conflicting {
                success: true,
                description: "ok".into()
            }
        );
        assert_eq!(record.result.unwrap().description, "ok");
    }

    #[test]
    fn a_final_delivery_is_never_left() {
        let mut record = pending();
        let now = DateTime::<Utc>::UNIX_EPOCH;
        assert_eq!(record.record_delivery(Delivery::queued(now)), None);
        record.resolve(false, "no".into(), None, now);
        let delivered = Delivery::Delivered {
            attempts: 1,
            at: now,
        };
        assert_eq!(record.record_delivery(delivered), Some(true));
        assert_eq!(record.state(), PostponedState::Delivered);
        assert_eq!(record.record_delivery(Delivery::queued(now)), Some(false));
        assert_eq!(record.state(), PostponedState::Delivered);
        assert!(record.is_final());
        assert!(!record.due_now(now), "a delivered result is not sent again");
    }

    #[test]
    fn a_refused_result_is_queued_again_and_a_late_outcome_changes_nothing() {
        let mut record = pending();
        let now = DateTime::<Utc>::UNIX_EPOCH;
        record.resolve(true, "ok".into(), None, now);
        let refused = Delivery::Conflict {
            attempts: 1,
            message: "held".into(),
            at: now,
        };
        assert_eq!(record.record_delivery(refused.clone()), Some(true));
        assert!(record.due_now(now));
        assert_eq!(record.state(), PostponedState::Queued);
        // The outcome of attempt 1 again (another instance's, late): ignored.
        assert_eq!(record.record_delivery(refused), Some(false));
        assert_eq!(record.state(), PostponedState::Queued);
        // Attempt 2's outcome is recorded.
        let delivered = Delivery::Delivered {
            attempts: 2,
            at: now,
        };
        assert_eq!(record.record_delivery(delivered), Some(true));
        assert_eq!(record.state(), PostponedState::Delivered);
    }
}
