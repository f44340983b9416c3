//! What the store recorded of a nonce's transaction validation, told to the handler of that
//! nonce's callback: the payment payhook's validation endpoint was asked about, and what the
//! merchant decided.
//!
//! A signed callback is the aggregator's word, but the payment it reports is not always the
//! one the merchant approved: a larger amount, another currency or client, a withdrawal where
//! a deposit was validated — or a success of a transaction the merchant denied. Money booked
//! from such a result without a person looking is money the merchant may not have. payhook
//! keeps each validation's payment for `store.retention` (it refuses a repeat of the nonce
//! for a different payment), so a callback handler can ask what was validated
//! ([`CallbackContext::validated_payment`](crate::handler::CallbackContext::validated_payment))
//! and compare ([`ValidatedPayment::differences`]). The example merchant holds such a
//! success for a person instead of booking it.
//!
//! There is no record when this service did not answer the nonce's validation (another
//! service did; the aggregator validated without the merchant), or answered it longer ago
//! than the retention: then the callback alone is what is known.

use std::fmt;

use rust_decimal::Decimal;

use super::StoreError;
use super::record::{KeptFingerprint, RecordedDecision};
use crate::logged::Logged;
use crate::model::{CallbackBody, TransactionType};
use crate::postponed::PostponedValidation;

/// The payment a nonce's transaction validation was asked about, as the store kept it, and
/// what was decided.
///
/// ```
/// use payhook::store::{Difference, ValidatedPayment};
///
/// fn unlike(validated: &ValidatedPayment, callback: &payhook::CallbackBody) -> Option<String> {
///     let differences = validated.differences(callback);
///     (!differences.is_empty()).then(|| {
///         let told: Vec<String> = differences.iter().map(Difference::to_string).collect();
///         format!("unlike its validation: {}", told.join("; "))
///     })
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ValidatedPayment {
    /// The amount validated.
    pub amount: Decimal,
    /// The currency validated, upper case.
    pub currency: String,
    /// The provider chosen.
    pub provider_id: i64,
    /// A deposit (`true`) or a withdrawal.
    pub cash_in: bool,
    /// What was decided.
    pub decision: ValidatedDecision,
    /// The payment as kept: the client spelled out, or for a long id its SHA-256
    /// ([`Self::client_id`], [`Self::client_is`]).
    kept: KeptFingerprint,
}

/// What the merchant decided on a validated payment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValidatedDecision {
    /// Allowed when asked (200).
    Allowed,
    /// Denied when asked (403).
    Denied {
        /// The merchant's message.
        message: String,
    },
    /// Postponed (Awaitable mode), and not decided yet: the aggregator has no result.
    Awaiting,
    /// Postponed, and decided later.
    Reviewed {
        /// Whether the merchant allowed it.
        allowed: bool,
    },
    /// Postponed, and what was decided later is no longer known: the postponed
    /// validation's record is gone (purged after its result was delivered, a retention
    /// ago), or, on sled, the validation was recorded by a payhook before the one that
    /// links the two.
    PostponedUnknown,
}

/// How a callback's payment differs from the one validated ([`ValidatedPayment::differences`]).
/// Shown as `amount 400.00, validated 40.00`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Difference {
    /// Another amount.
    Amount {
        /// The amount validated.
        validated: Decimal,
        /// The callback's.
        received: Decimal,
    },
    /// Another currency (compared in any case).
    Currency {
        /// The currency validated, upper case.
        validated: String,
        /// The callback's, as received.
        received: String,
    },
    /// Another client.
    Client {
        /// The client validated; `None` for a long id kept by its digest.
        validated: Option<String>,
        /// The callback's.
        received: String,
    },
    /// Another provider.
    Provider {
        /// The provider validated.
        validated: i64,
        /// The callback's.
        received: i64,
    },
    /// Money moving the other way (or a type that is neither way).
    Direction {
        /// Deposit or withdrawal, as validated.
        validated: TransactionType,
        /// The callback's type.
        received: TransactionType,
    },
}

impl ValidatedPayment {
    /// The payment of a validation record, decided `decision`; `postponed` is the record of
    /// a postponed one, when it is kept.
    pub(crate) fn of(
        nonce: &str,
        kept: &KeptFingerprint,
        decision: &RecordedDecision,
        postponed: Option<&PostponedValidation>,
    ) -> Result<Self, StoreError> {
        let amount = kept.amount().map_err(|reason| StoreError::Corrupt {
            key: nonce.to_owned(),
            reason,
        })?;
        Ok(Self {
            amount,
            currency: kept.currency().to_owned(),
            provider_id: kept.provider_id(),
            cash_in: kept.cash_in(),
            decision: match decision {
                RecordedDecision::Allow => ValidatedDecision::Allowed,
                RecordedDecision::Deny { message } => ValidatedDecision::Denied {
                    message: message.clone(),
                },
                RecordedDecision::Postponed => match postponed.map(|p| p.result.as_ref()) {
                    None => ValidatedDecision::PostponedUnknown,
                    Some(None) => ValidatedDecision::Awaiting,
                    Some(Some(result)) => ValidatedDecision::Reviewed {
                        allowed: result.success,
                    },
                },
            },
            kept: kept.clone(),
        })
    }

    /// The client validated, spelled out; `None` for a long id the store kept by its
    /// SHA-256 ([`Self::client_is`] still compares it).
    pub fn client_id(&self) -> Option<&str> {
        self.kept.client_id()
    }

    /// Whether `client_id` is the client validated.
    pub fn client_is(&self, client_id: &str) -> bool {
        self.kept.client_is(client_id)
    }

    /// Whether the merchant allowed the payment: `Some(false)` when it denied it, `None`
    /// while a postponed decision is not taken, or is no longer known.
    pub fn allowed(&self) -> Option<bool> {
        match &self.decision {
            ValidatedDecision::Allowed => Some(true),
            ValidatedDecision::Denied { .. } => Some(false),
            ValidatedDecision::Reviewed { allowed } => Some(*allowed),
            ValidatedDecision::Awaiting | ValidatedDecision::PostponedUnknown => None,
        }
    }

    /// How `callback`'s payment differs from this one: amount (`10.5` is `10.50`),
    /// currency (in any case), client, provider (when the callback names one) and
    /// direction; empty when it is the payment validated.
    pub fn differences(&self, callback: &CallbackBody) -> Vec<Difference> {
        let mut differences = Vec::new();
        if callback.amount != self.amount {
            differences.push(Difference::Amount {
                validated: self.amount,
                received: callback.amount,
            });
        }
        if !callback
            .currency
            .trim()
            .eq_ignore_ascii_case(&self.currency)
        {
            differences.push(Difference::Currency {
                validated: self.currency.clone(),
                received: callback.currency.clone(),
            });
        }
        if !self.client_is(&callback.client_id) {
            differences.push(Difference::Client {
                validated: self.client_id().map(str::to_owned),
                received: callback.client_id.clone(),
            });
        }
        if let Some(received) = callback.provider_id
            && received != self.provider_id
        {
            differences.push(Difference::Provider {
                validated: self.provider_id,
                received,
            });
        }
        let validated = TransactionType::from_cash_in(self.cash_in);
        if callback.transaction_type != validated {
            differences.push(Difference::Direction {
                validated,
                received: callback.transaction_type,
            });
        }
        differences
    }

    /// Why the success `callback` should be held for a person rather than booked: its
    /// payment is not the one validated — another amount, currency, client or direction
    /// ([`Self::differences`]; another provider that moved the same money is not a reason)
    /// — or the merchant denied it (at once, or on review of a postponed validation), or
    /// has not decided it yet (the aggregator had no result to go on). `None` when it may
    /// be booked — also when a postponed decision is no longer known — and for a callback
    /// that is not a success (a failure moves no money in).
    ///
    /// What the example merchant and `payhook new`'s service hold; the rule is the
    /// merchant's to change.
    pub fn hold_reason(&self, callback: &CallbackBody) -> Option<String> {
        if !callback.transaction_status.is_success() {
            return None;
        }
        let differences: Vec<String> = self
            .differences(callback)
            .iter()
            .filter(|difference| !matches!(difference, Difference::Provider { .. }))
            .map(ToString::to_string)
            .collect();
        if !differences.is_empty() {
            return Some(format!(
                "the success is not the payment validated: {}",
                differences.join("; ")
            ));
        }
        // The reason is escaped where it is shown (logs, listings), not here.
        match &self.decision {
            ValidatedDecision::Denied { message } => Some(format!(
                "a success of a payment the merchant denied at its validation ({message})"
            )),
            ValidatedDecision::Reviewed { allowed: false } => Some(
                "a success of a payment the merchant denied on review of its validation".to_owned(),
            ),
            ValidatedDecision::Awaiting => Some(
                "a success of a payment whose postponed validation the merchant has not \
                 decided yet"
                    .to_owned(),
            ),
            ValidatedDecision::Allowed
            | ValidatedDecision::Reviewed { allowed: true }
            | ValidatedDecision::PostponedUnknown => None,
        }
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Amount {
                validated,
                received,
            } => {
                // In the received amount's scale: `validated 40.00`, not `validated 40`.
                let mut shown = *validated;
                if shown.scale() < received.scale() {
                    shown.rescale(received.scale());
                }
                write!(f, "amount {received}, validated {shown}")
            }
            Self::Currency {
                validated,
                received,
            } => write!(f, "currency {}, validated {validated}", Logged(received)),
            Self::Client {
                validated: Some(validated),
                received,
            } => write!(
                f,
                "client {}, validated {}",
                Logged(received),
                Logged(validated)
            ),
            Self::Client {
                validated: None,
                received,
            } => write!(
                f,
                "client {}, validated another (a long id)",
                Logged(received)
            ),
            Self::Provider {
                validated,
                received,
            } => write!(f, "provider {received}, validated {validated}"),
            Self::Direction {
                validated,
                received,
            } => write!(f, "a {received}, validated a {validated}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TransactionValidationRequest;
    use crate::store::Fingerprint;

    fn validated(client_id: &str, decision: RecordedDecision) -> ValidatedPayment {
        let request: TransactionValidationRequest = serde_json::from_value(serde_json::json!({
            "merchantData": {"merchantHash": "h", "clientId": client_id, "additionalData": {}},
            "paymentData": {"nonce": "n-1", "amount": 40.0, "currency": "eur", "providerId": 11},
            "providerData": null, "validationId": 7, "cashIn": true
        }))
        .unwrap();
        let kept = KeptFingerprint::of(&Fingerprint::of(&request));
        ValidatedPayment::of("n-1", &kept, &decision, None).unwrap()
    }

    fn callback(client_id: &str, amount: &str, currency: &str, kind: i32) -> CallbackBody {
        serde_json::from_str(&format!(
            r#"{{"id":1,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-000000000001",
                "nonce":"n-1","providerId":11,"transactionType":{kind},"transactionStatus":4,
                "clientId":"{client_id}","amount":{amount},"currency":"{currency}"}}"#
        ))
        .unwrap()
    }

    #[test]
    fn the_payment_validated_has_no_difference_in_any_scale_or_case() {
        let payment = validated("client-42", RecordedDecision::Allow);
        assert_eq!(payment.amount, Decimal::new(40, 0));
        assert_eq!(payment.currency, "EUR");
        assert_eq!(payment.allowed(), Some(true));
        assert!(
            payment
                .differences(&callback("client-42", "40.00", "EUR", 1))
                .is_empty()
        );
        assert!(
            payment
                .differences(&callback("client-42", "40", "eur", 1))
                .is_empty()
        );
    }

    #[test]
    fn every_difference_is_told() {
        let payment = validated("client-42", RecordedDecision::Allow);
        let differences = payment.differences(&callback("client-7", "400.00", "USD", 2));
        let told: Vec<String> = differences.iter().map(ToString::to_string).collect();
        assert_eq!(
            told,
            [
                "amount 400.00, validated 40.00",
                "currency USD, validated EUR",
                "client client-7, validated client-42",
                "a withdrawal, validated a deposit",
            ]
        );
    }

    #[test]
    fn a_long_client_kept_by_its_digest_is_still_compared() {
        let long = "c".repeat(400);
        let payment = validated(&long, RecordedDecision::Allow);
        assert_eq!(payment.client_id(), None);
        assert!(payment.client_is(&long));
        assert!(
            payment
                .differences(&callback(&long, "40", "EUR", 1))
                .is_empty()
        );
        let other = payment.differences(&callback(&"d".repeat(400), "40", "EUR", 1));
        assert_eq!(other.len(), 1);
        assert!(
            other[0]
                .to_string()
                .contains("validated another (a long id)")
        );
    }

    #[test]
    fn a_success_is_held_for_its_payment_or_its_denial_and_nothing_else() {
        let allowed = validated("client-42", RecordedDecision::Allow);
        let held = |payment: &ValidatedPayment, body: &CallbackBody| payment.hold_reason(body);
        assert_eq!(
            held(&allowed, &callback("client-42", "40.00", "EUR", 1)),
            None
        );
        let mut other_provider = callback("client-42", "40.00", "EUR", 1);
        other_provider.provider_id = Some(12);
        assert_eq!(allowed.differences(&other_provider).len(), 1);
        assert_eq!(held(&allowed, &other_provider), None);
        assert_eq!(
            held(&allowed, &callback("client-42", "41", "EUR", 1)).as_deref(),
            Some("the success is not the payment validated: amount 41, validated 40")
        );
        let mut failure = callback("client-42", "41", "EUR", 1);
        failure.transaction_status = crate::model::TransactionStatus::Cancelled;
        assert_eq!(held(&allowed, &failure), None);
        let denied = validated(
            "client-42",
            RecordedDecision::Deny {
                message: "limit".into(),
            },
        );
        let success = callback("client-42", "40", "EUR", 1);
        assert_eq!(
            held(&denied, &success).as_deref(),
            Some("a success of a payment the merchant denied at its validation (limit)")
        );
        let mut postponed = validated("client-42", RecordedDecision::Postponed);
        assert_eq!(postponed.decision, ValidatedDecision::PostponedUnknown);
        assert_eq!(held(&postponed, &success), None);
        postponed.decision = ValidatedDecision::Reviewed { allowed: true };
        assert_eq!(held(&postponed, &success), None);
        postponed.decision = ValidatedDecision::Reviewed { allowed: false };
        assert!(
            held(&postponed, &success)
                .unwrap()
                .contains("denied on review")
        );
        postponed.decision = ValidatedDecision::Awaiting;
        assert!(
            held(&postponed, &success)
                .unwrap()
                .contains("not decided yet")
        );
    }

    #[test]
    fn what_was_decided_is_told() {
        let denied = validated(
            "client-42",
            RecordedDecision::Deny {
                message: "limit".into(),
            },
        );
        assert_eq!(denied.allowed(), Some(false));
        let postponed = validated("client-42", RecordedDecision::Postponed);
        assert_eq!(postponed.allowed(), None);
    }
}
