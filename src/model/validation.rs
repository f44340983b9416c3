//! The two validation exchanges (spec 2.3, 2.4, 3.2, 4.2) and the postponed result (4.1).

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Provider, ProviderCandidate, TransactionType, amount, null_as_default};

/// Merchant data (spec 2.3), sent in both validation requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MerchantData {
    /// Per-merchant constant GUID. Kept as text: compare it with your own configured value.
    pub merchant_hash: String,
    /// The merchant's identifier of its client.
    pub client_id: String,
    /// Data supplied at payment initialization, as sent (`null` when absent).
    #[serde(default, deserialize_with = "super::object::object_or_null")]
    pub additional_data: Value,
}

/// Payment data of a providers validation request (spec 2.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvidersPaymentData {
    /// Unique transaction stamp.
    pub nonce: super::Nonce,
    /// Amount to deposit or withdraw, exact.
    #[serde(with = "amount::exact")]
    pub amount: Decimal,
    /// ISO currency code.
    pub currency: String,
    /// Tag filter: empty allows all providers, otherwise a provider needs one matching tag.
    #[serde(default, deserialize_with = "null_as_default")]
    pub provider_tags: Vec<String>,
    /// Provider already chosen, if any.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub provider_id: Option<i64>,
    /// Payment type, one of the aggregator's predefined types.
    #[serde(default)]
    pub pay_type: Option<String>,
}

/// The `transactionData` of a providers validation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionData {
    /// Merchant data, unchanged from payment initialization.
    #[serde(deserialize_with = "super::object::object")]
    pub merchant_data: MerchantData,
    /// What is being paid.
    #[serde(deserialize_with = "super::object::object")]
    pub payment_data: ProvidersPaymentData,
    /// `true` for a deposit (cash-in), `false` for a withdrawal.
    pub cash_in: bool,
}

/// Body the aggregator POSTs to the providers validation URL (spec 4.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvidersValidationRequest {
    /// The transaction the providers are for.
    #[serde(deserialize_with = "super::object::object")]
    pub transaction_data: TransactionData,
    /// Candidate providers. The server refuses candidates holding more JSON values together
    /// than one for each 10 bytes of `server.body_limit` (at least 100,000): each
    /// candidate, each of its tags, and each value in its `currencies` and `payTypes`,
    /// nested ones included.
    #[serde(deserialize_with = "super::object::objects")]
    pub providers: Vec<ProviderCandidate>,
}

impl ProvidersValidationRequest {
    /// The nonce of the transaction.
    pub fn nonce(&self) -> &str {
        &self.transaction_data.payment_data.nonce
    }

    /// Deposit or withdrawal, from `cashIn`.
    pub fn transaction_type(&self) -> TransactionType {
        TransactionType::from_cash_in(self.transaction_data.cash_in)
    }
}

/// Body the merchant answers a providers validation with (spec 4.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvidersValidationResponse {
    /// Providers available for this client.
    pub providers: Vec<Provider>,
    /// Additional information.
    #[serde(default, deserialize_with = "null_as_default")]
    pub message: String,
}

/// Payment data of a transaction validation request (spec 2.4, 4.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationPaymentData {
    /// Unique transaction stamp.
    pub nonce: super::Nonce,
    /// Amount to deposit or withdraw, exact.
    #[serde(with = "amount::exact")]
    pub amount: Decimal,
    /// ISO currency code.
    pub currency: String,
    /// The provider the client chose.
    #[serde(deserialize_with = "super::integer::integer")]
    pub provider_id: i64,
}

/// Body the aggregator POSTs to the transaction validation URL (spec 4.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionValidationRequest {
    /// Merchant data, including the client data needed to identify the client.
    #[serde(deserialize_with = "super::object::object")]
    pub merchant_data: MerchantData,
    /// What is being paid.
    #[serde(deserialize_with = "super::object::object")]
    pub payment_data: ValidationPaymentData,
    /// Data the provider needs, as sent (`null` when absent).
    #[serde(default, deserialize_with = "super::object::object_or_null")]
    pub provider_data: Value,
    /// Identifies this validation operation; a postponed result refers to it.
    pub validation_id: ValidationId,
    /// `true` for a deposit (cash-in), `false` for a withdrawal.
    pub cash_in: bool,
}

impl TransactionValidationRequest {
    /// The nonce of the transaction.
    pub fn nonce(&self) -> &super::Nonce {
        &self.payment_data.nonce
    }

    /// Deposit or withdrawal, from `cashIn`.
    pub fn transaction_type(&self) -> TransactionType {
        TransactionType::from_cash_in(self.cash_in)
    }
}

/// Body of `POST {gateway_url}/api/v1/transactions/validation`: the result of a postponed
/// validation (spec 3.2, 4.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostponedValidationResult {
    /// The `validationId` of the validation request.
    pub validation_id: ValidationId,
    /// Whether the client was validated for the transaction.
    pub success: bool,
    /// Explanation of the result.
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
}

/// A validation operation's `validationId`: what a postponed validation, its decision and
/// its result are known by.
///
/// On the wire it is a JSON integer (read exactly, in any form of a whole number; see
/// [`crate::model`]).
///
/// ```
/// use payhook::model::ValidationId;
///
/// let id: ValidationId = "42".parse().unwrap();
/// assert_eq!(id, ValidationId::from(42));
/// assert_eq!(id.get(), 42);
/// assert_eq!(id.to_string(), "42");
/// assert_eq!(serde_json::to_string(&id).unwrap(), "42");
/// assert_eq!(serde_json::from_str::<ValidationId>("4.2e1").unwrap(), id);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ValidationId(i64);

impl ValidationId {
    /// The id numbered `id`.
    pub const fn new(id: i64) -> Self {
        Self(id)
    }

    /// The id as the aggregator numbers it.
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl From<i64> for ValidationId {
    fn from(id: i64) -> Self {
        Self(id)
    }
}

impl From<ValidationId> for i64 {
    fn from(id: ValidationId) -> Self {
        id.0
    }
}

impl std::fmt::Display for ValidationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for ValidationId {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Self)
    }
}

impl<'de> Deserialize<'de> for ValidationId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        super::integer::integer(deserializer).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::round_trip;

    const PROVIDERS_VALIDATION: &str = r#"{
        "transactionData": {
            "merchantData": {"merchantHash": "6f1c2b1e-8a8f-4d55-9a3e-1c2b3d4e5f60", "clientId": "client-42",
                             "additionalData": {"email": "a@example.com"}},
            "paymentData": {"nonce": "n-1", "amount": 10.50, "currency": "EUR", "providerTags": ["fiat"],
                            "providerId": null, "payType": "card"},
            "cashIn": true
        },
        "providers": [{"id": 11, "name": "Card", "collabId": 3, "currencies": [{"id": 1, "code": "EUR"}],
                       "payTypes": [{"id": 5, "code": "card", "name": "Bank card", "cashIn": true, "cashOut": false,
                                     "isCashInEnabled": true, "isCashOutEnabled": false}]}]
    }"#;

    #[test]
    fn providers_validation_request_round_trips() {
        let request: ProvidersValidationRequest = round_trip(PROVIDERS_VALIDATION);
        assert_eq!(request.nonce(), "n-1");
        assert_eq!(
            request.transaction_data.payment_data.amount.to_string(),
            "10.50"
        );
        assert_eq!(request.transaction_type(), TransactionType::Deposit);
        assert_eq!(
            request.transaction_data.merchant_data.additional_data["email"],
            "a@example.com"
        );
    }

    #[test]
    fn providers_validation_response_round_trips() {
        let response: ProvidersValidationResponse = round_trip(
            r#"{"providers":[{"id":11,"name":"Card","collabId":3,"currencies":[{"id":1,"code":"EUR"}],"payTypes":[]}],
                "message":"1 provider available"}"#,
        );
        assert_eq!(response.providers.len(), 1);
    }

    #[test]
    fn transaction_validation_request_round_trips() {
        let request: TransactionValidationRequest = round_trip(
            r#"{"merchantData":{"merchantHash":"6f1c2b1e-8a8f-4d55-9a3e-1c2b3d4e5f60","clientId":"client-42","additionalData":null},
                "paymentData":{"nonce":"n-2","amount":79228162514264337593543950335,"currency":"USD","providerId":11},
                "providerData":{"cardBin":"411111"},"validationId":9007199254740993,"cashIn":false}"#,
        );
        assert_eq!(
            request.validation_id.get(),
            9_007_199_254_740_993,
            "a long beyond f64's exact range"
        );
        assert_eq!(
            request.payment_data.amount.to_string(),
            "79228162514264337593543950335"
        );
        assert_eq!(request.transaction_type(), TransactionType::Withdrawal);
    }

    #[test]
    fn optional_parts_may_be_absent_and_unknown_fields_are_ignored() {
        let request: TransactionValidationRequest = serde_json::from_str(
            r#"{"merchantData":{"merchantHash":"h","clientId":"c","future":1},
                "paymentData":{"nonce":"n","amount":"1.00","currency":"EUR","providerId":1,"extra":[1]},
                "validationId":1,"cashIn":true,"newField":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(request.provider_data, Value::Null);
        assert_eq!(request.merchant_data.additional_data, Value::Null);
    }

    #[test]
    fn postponed_validation_result_round_trips() {
        let result: PostponedValidationResult =
            round_trip(r#"{"validationId":77,"success":false,"description":"client blocked"}"#);
        assert!(!result.success);
    }
}
