//! The transaction record of the lookup endpoint (spec 2.6) and callback settings (spec 2.5).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{TransactionStatus, TransactionType, amount, null_as_default, timestamp};

/// Most delivery attempts the spec allows per callback URL (spec 2.5, 8).
pub const MAX_CALLBACK_ATTEMPTS: u32 = 17;

/// Response of `GET {gateway_url}/api/v1/transactions/{transactionReferenceId}` (spec 2.6).
///
/// The identifying and money fields are required; every descriptive field is optional, so a
/// record from a newer or sparser aggregator still reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionRecord {
    /// Transaction identifier at the aggregator.
    #[serde(deserialize_with = "super::integer::integer")]
    pub id: i64,
    /// Reference id of the transaction.
    pub transaction_reference_id: Uuid,
    /// Payment system identifier.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub provider_id: Option<i64>,
    /// Payment system name.
    #[serde(default)]
    pub provider_name: Option<String>,
    /// Payment type used with the provider.
    #[serde(default)]
    pub provider_pay_type: Option<String>,
    /// Merchant identifier.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub merchant_id: Option<i64>,
    /// Merchant name.
    #[serde(default)]
    pub merchant_name: Option<String>,
    /// Client identifier in the merchant's system.
    #[serde(default)]
    pub merchant_client_id: Option<String>,
    /// Additional client data from the merchant's system, as sent.
    #[serde(default)]
    pub account_data: Value,
    /// The merchant's nonce.
    pub nonce: super::Nonce,
    /// Transaction id set by the payment system.
    #[serde(default)]
    pub provider_transaction_id: Option<String>,
    /// Amount deposited or withdrawn, exact.
    #[serde(with = "amount::exact")]
    pub amount: Decimal,
    /// ISO 4217 currency code.
    pub currency: String,
    /// Amount of delivered money.
    #[serde(default, with = "amount::exact_opt")]
    pub destination_amount: Option<Decimal>,
    /// Delivered currency.
    #[serde(default)]
    pub destination_currency: Option<String>,
    /// Creation time in the aggregator's database.
    #[serde(default, with = "timestamp::utc_opt")]
    pub created_utc: Option<DateTime<Utc>>,
    /// Last update time.
    #[serde(default, with = "timestamp::utc_opt")]
    pub updated_utc: Option<DateTime<Utc>>,
    /// Deposit or withdrawal.
    pub transaction_type: TransactionType,
    /// Status code (spec 3.1).
    pub transaction_status: TransactionStatus,
    /// Comment on the status.
    #[serde(default)]
    pub transaction_status_message: Option<String>,
    /// Message for the merchant's client, private.
    #[serde(default)]
    pub transaction_internal_message: Option<String>,
    /// Delivery status of the callback.
    #[serde(default)]
    pub callback_delivery_status: Option<String>,
    /// Reason of failure, if failed.
    #[serde(default)]
    pub error_message: Option<String>,
    /// Whether callback sending was canceled.
    #[serde(default, deserialize_with = "null_as_default")]
    pub is_callback_sending_canceled: bool,
    /// Payment method type identifier.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub payment_method_type: Option<i64>,
    /// Wallet address, account number or other identifier of the payment method.
    #[serde(default)]
    pub payment_method_value: Option<String>,
    /// Payment type identifier.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub pay_type_id: Option<i64>,
    /// Applied fee configuration.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub applied_fee_id: Option<i64>,
    /// Type of the applied fee.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub applied_fee_type: Option<i64>,
    /// Fixed fee amount applied, exact.
    #[serde(default, with = "amount::exact_opt")]
    pub applied_fee_amount: Option<Decimal>,
    /// Percentage or value used to calculate the fee, exact.
    #[serde(default, with = "amount::exact_opt")]
    pub applied_fee_value: Option<Decimal>,
    /// Fee currency.
    #[serde(default)]
    pub applied_fee_currency: Option<String>,
    /// Which party pays the fee.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub applied_fee_payer: Option<i64>,
    /// IP address the payment request came from.
    #[serde(default)]
    pub payment_ip_address: Option<String>,
    /// User agent of the client application.
    #[serde(default)]
    pub user_agent: Option<String>,
}

impl TransactionRecord {
    /// The callback (2.7) this record stands for: what the aggregator would have sent. Used
    /// to book a lost callback from the lookup (spec 6.7).
    pub fn to_callback(&self) -> super::CallbackBody {
        super::CallbackBody {
            id: self.id,
            transaction_reference_id: self.transaction_reference_id,
            nonce: self.nonce.clone(),
            provider_id: self.provider_id,
            provider_transaction_id: self.provider_transaction_id.clone(),
            transaction_type: self.transaction_type,
            transaction_status: self.transaction_status,
            transaction_status_message: self.transaction_status_message.clone(),
            transaction_internal_message: self.transaction_internal_message.clone(),
            client_id: self.merchant_client_id.clone().unwrap_or_default(),
            additional_data: self.account_data.clone(),
            amount: self.amount,
            currency: self.currency.clone(),
            destination_amount: self.destination_amount,
            destination_currency: self.destination_currency.clone(),
            created_utc: self.created_utc,
            updated_utc: self.updated_utc,
        }
    }
}

/// One callback URL of a merchant (spec 2.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallbackSettings {
    /// Payment system whose results trigger this URL.
    pub collab_id: i64,
    /// Merchant endpoint receiving the callback.
    pub callback_url: String,
    /// Maximum delivery attempts, at most [`MAX_CALLBACK_ATTEMPTS`].
    pub max_attempts: u32,
    /// Whether the URL is currently triggered.
    pub is_enabled: bool,
    /// Whether a signature of the body is sent in a header.
    pub add_signature: bool,
    /// Deposit, withdrawal, or `None` for both.
    #[serde(default)]
    pub transaction_type_id: Option<TransactionType>,
}

impl CallbackSettings {
    /// Whether a result of `transaction_type` from collaborator `collab_id` goes to this URL
    /// (spec 6.2: enabled, same collaborator, type null or equal).
    ///
    /// ```
    /// use payhook::model::{CallbackSettings, TransactionType};
    ///
    /// let settings = CallbackSettings {
    ///     collab_id: 3,
    ///     callback_url: "https://shop.example/payhook/callback".into(),
    ///     max_attempts: 17,
    ///     is_enabled: true,
    ///     add_signature: true,
    ///     transaction_type_id: None,
    /// };
    /// assert!(settings.receives(3, TransactionType::Withdrawal));
    /// assert!(!settings.receives(4, TransactionType::Deposit));
    /// ```
    pub fn receives(&self, collab_id: i64, transaction_type: TransactionType) -> bool {
        self.is_enabled
            && self.collab_id == collab_id
            && self
                .transaction_type_id
                .is_none_or(|t| t == transaction_type)
    }

    /// `max_attempts` within the spec's limit of 17 and at least 1.
    pub fn has_valid_attempts(&self) -> bool {
        (1..=MAX_CALLBACK_ATTEMPTS).contains(&self.max_attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::round_trip;

    const FULL_RECORD: &str = r#"{
        "id": 1001, "transactionReferenceId": "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
        "providerId": 11, "providerName": "Card", "providerPayType": "card",
        "merchantId": 7, "merchantName": "Shop", "merchantClientId": "client-42",
        "accountData": {"iban": "DE00"}, "nonce": "n-1", "providerTransactionId": "pt-9",
        "amount": 10.50, "currency": "EUR", "destinationAmount": 11.37, "destinationCurrency": "USD",
        "createdUtc": "2026-01-02T03:04:05Z", "updatedUtc": "2026-01-02T03:05:00.500Z",
        "transactionType": 1, "transactionStatus": 4, "transactionStatusMessage": "ok",
        "transactionInternalMessage": "thanks", "callbackDeliveryStatus": "Delivered",
        "errorMessage": null, "isCallbackSendingCanceled": false,
        "paymentMethodType": 2, "paymentMethodValue": "4111********1111", "payTypeId": 5,
        "appliedFeeId": 3, "appliedFeeType": 1, "appliedFeeAmount": 0.30, "appliedFeeValue": 2.5,
        "appliedFeeCurrency": "EUR", "appliedFeePayer": 1,
        "paymentIpAddress": "203.0.113.9", "userAgent": "Mozilla/5.0"
    }"#;

    #[test]
    fn transaction_record_round_trips_with_every_field() {
        let record: TransactionRecord = round_trip(FULL_RECORD);
        assert_eq!(record.transaction_status, TransactionStatus::Success);
        assert_eq!(
            record.applied_fee_amount.map(|d| d.to_string()),
            Some("0.30".to_owned())
        );
        assert_eq!(
            record.destination_amount.map(|d| d.to_string()),
            Some("11.37".to_owned())
        );
    }

    #[test]
    fn a_sparse_record_with_nulls_reads() {
        let record: TransactionRecord = serde_json::from_str(
            r#"{"id":1,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e","nonce":"n","amount":1,
                "currency":"EUR","transactionType":2,"transactionStatus":-4,"destinationAmount":null,
                "isCallbackSendingCanceled":null,"createdUtc":null}"#,
        )
        .unwrap();
        assert_eq!(record.destination_amount, None);
        assert!(!record.is_callback_sending_canceled);
        assert_eq!(record.transaction_status, TransactionStatus::NetworkError);
    }

    /// A lookup's integers read as a callback's do (`integer`): a sender whose JSON writer
    /// passes integers through floating point writes `1001.0` or `1.1e1`; a reconcile must
    /// not fail on them. A fractional id is still refused.
    #[test]
    fn a_record_reads_integers_in_any_whole_number_form() {
        let record: TransactionRecord = serde_json::from_str(
            r#"{"id":1001.0,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e","nonce":"n",
                "amount":1,"currency":"EUR","transactionType":1,"transactionStatus":4.0,
                "providerId":1.1e1,"merchantId":7.00,"paymentMethodType":null,"payTypeId":5E0,
                "appliedFeeId":3.0,"appliedFeeType":1,"appliedFeePayer":2.0}"#,
        )
        .unwrap();
        assert_eq!(record.id, 1001);
        assert_eq!(record.provider_id, Some(11));
        assert_eq!(record.merchant_id, Some(7));
        assert_eq!(record.payment_method_type, None);
        assert_eq!(record.pay_type_id, Some(5));
        assert_eq!(
            (
                record.applied_fee_id,
                record.applied_fee_type,
                record.applied_fee_payer
            ),
            (Some(3), Some(1), Some(2))
        );
        assert_eq!(record.transaction_status, TransactionStatus::Success);
        let fractional = serde_json::from_str::<TransactionRecord>(
            r#"{"id":1001.5,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e","nonce":"n",
                "amount":1,"currency":"EUR","transactionType":1,"transactionStatus":4}"#,
        )
        .unwrap_err();
        assert!(fractional.to_string().contains("integer"), "{fractional}");
    }

    #[test]
    fn callback_settings_round_trip_and_select_recipients() {
        let settings: CallbackSettings = round_trip(
            r#"{"collabId":3,"callbackUrl":"https://shop.example/cb","maxAttempts":17,"isEnabled":true,
                "addSignature":true,"transactionTypeId":1}"#,
        );
        assert!(settings.has_valid_attempts());
        assert!(settings.receives(3, TransactionType::Deposit));
        assert!(!settings.receives(3, TransactionType::Withdrawal));
        let disabled = CallbackSettings {
            is_enabled: false,
            ..settings.clone()
        };
        assert!(!disabled.receives(3, TransactionType::Deposit));
        assert!(
            !CallbackSettings {
                max_attempts: 18,
                ..settings
            }
            .has_valid_attempts()
        );
    }
}
