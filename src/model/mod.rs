//! Wire types of the aggregator interface 0.3.2, one per resource and message of the spec.
//!
//! Every type is camelCase on the wire and reads tolerantly: unknown fields are ignored,
//! optional fields accept both `null` and absence, and free-form objects (`additionalData`,
//! `accountData`, `providerData`) are kept as [`serde_json::Value`]. Three things are strict,
//! because money depends on them:
//!
//! * **amounts** are exact [`rust_decimal::Decimal`]s read from the JSON text, never through
//!   `f64`; a number that cannot be held exactly is an error, not a rounding ([`parse_amount`]);
//! * **times** are UTC [`chrono::DateTime`]s, read leniently the way .NET writes them
//!   ([`parse_utc`]) and written as RFC 3339 with `Z`;
//! * **messages are objects**: a nested message (`merchantData`, a provider candidate) given
//!   as a positional array, which serde's derive would read, is refused.
//!
//! | spec | types |
//! |---|---|
//! | 2.1 login session | [`LoginRequest`], [`RefreshRequest`], [`LoginSession`] |
//! | 2.2 provider | [`ProviderCandidate`] (request), [`Provider`] (response), [`Currency`], [`PaymentType`] |
//! | 2.3, 2.4 merchant and payment data | [`MerchantData`], [`ProvidersPaymentData`], [`ValidationPaymentData`] |
//! | 4.2 providers validation | [`ProvidersValidationRequest`], [`TransactionData`], [`ProvidersValidationResponse`] |
//! | 4.2 transaction validation | [`TransactionValidationRequest`] |
//! | 3.2, 4.1 postponed validation | [`PostponedValidationResult`] |
//! | 2.5 callback settings | [`CallbackSettings`] |
//! | 2.6 transaction record | [`TransactionRecord`] |
//! | 2.7 callback body | [`CallbackBody`] |
//! | 3.1 status codes | [`TransactionStatus`], [`TransactionType`] |
//! | 4 error body | [`ErrorBody`] |

mod amount;
mod auth;
mod callback;
mod integer;
mod nonce;
mod object;
mod provider;
mod status;
pub(crate) mod timestamp;
mod transaction;
mod validation;

use serde::{Deserialize, Deserializer, Serialize};

pub use amount::{AmountError, parse_amount};
pub use auth::{LoginRequest, LoginSession, RefreshRequest};
pub use callback::CallbackBody;
pub(crate) use callback::ReadableCallback;
pub use nonce::Nonce;
pub(crate) use provider::{
    BODY_BYTES_PER_CANDIDATE_VALUE, MIN_CANDIDATE_VALUES, candidates_within, max_candidate_values,
};
pub use provider::{Currency, PaymentType, Provider, ProviderCandidate};
pub use status::{TransactionStatus, TransactionType};
pub use timestamp::{TimestampError, format_utc, parse_utc};
pub use transaction::{CallbackSettings, MAX_CALLBACK_ATTEMPTS, TransactionRecord};
pub use validation::{
    MerchantData, PostponedValidationResult, ProvidersPaymentData, ProvidersValidationRequest,
    ProvidersValidationResponse, TransactionData, TransactionValidationRequest, ValidationId,
    ValidationPaymentData,
};

/// The error body of every endpoint, both directions: `{"message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for a human.
    #[serde(default)]
    pub message: String,
}

impl ErrorBody {
    /// An error body with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// Reads `null` as the type's default, for fields the aggregator may send as `null`.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
pub(crate) mod tests {
    use serde::{Serialize, de::DeserializeOwned};
    use serde_json::Value;
    use std::fmt::Debug;

    /// Reads `json` as `T`, writes it back, and checks that nothing was lost or added: the
    /// written JSON equals the literal, and reads back to an equal `T`.
    pub(crate) fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(json: &str) -> T {
        let value: T =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{json} does not read: {e}"));
        let written = serde_json::to_string(&value).expect("serializes");
        let literal: Value = serde_json::from_str(json).expect("literal is JSON");
        let rewritten: Value = serde_json::from_str(&written).expect("output is JSON");
        assert_eq!(rewritten, literal, "written JSON differs from the literal");
        let again: T = serde_json::from_str(&written).expect("output reads back");
        assert_eq!(again, value);
        value
    }

    #[test]
    fn error_body_round_trips() {
        let body: super::ErrorBody = round_trip(r#"{"message":"client not allowed"}"#);
        assert_eq!(body.message, "client not allowed");
    }
}
