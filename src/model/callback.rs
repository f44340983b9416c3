//! The transaction result callback body (spec 2.7).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{TransactionStatus, TransactionType, amount, timestamp};

/// Body of a transaction result callback (spec 2.7).
///
/// What a merchant needs to book the result is required: ids, nonce, direction, status,
/// client, amount and currency. A callback missing one of them is refused with 400 (and the
/// aggregator retries); descriptive fields are optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallbackBody {
    /// Transaction id at the aggregator.
    #[serde(deserialize_with = "super::integer::integer")]
    pub id: i64,
    /// Reference id of the transaction; use it to look the transaction up.
    pub transaction_reference_id: Uuid,
    /// The merchant's nonce: unique per transaction.
    pub nonce: super::Nonce,
    /// Payment system identifier.
    #[serde(default, deserialize_with = "super::integer::optional")]
    pub provider_id: Option<i64>,
    /// The payment system's own transaction id.
    #[serde(default)]
    pub provider_transaction_id: Option<String>,
    /// Deposit or withdrawal.
    pub transaction_type: TransactionType,
    /// Result status: 4 or -1 to -6 (spec 6.4); others are kept as received.
    pub transaction_status: TransactionStatus,
    /// Description of the status.
    #[serde(default)]
    pub transaction_status_message: Option<String>,
    /// Message for the merchant's client, private.
    #[serde(default)]
    pub transaction_internal_message: Option<String>,
    /// The client on the merchant's side.
    pub client_id: String,
    /// Additional client or merchant data, as sent (`null` when absent).
    #[serde(default, deserialize_with = "super::object::object_or_null")]
    pub additional_data: Value,
    /// Amount deposited or withdrawn, exact.
    #[serde(with = "amount::exact")]
    pub amount: Decimal,
    /// ISO currency code.
    pub currency: String,
    /// Amount of delivered money.
    #[serde(default, with = "amount::exact_opt")]
    pub destination_amount: Option<Decimal>,
    /// Delivered currency.
    #[serde(default)]
    pub destination_currency: Option<String>,
    /// Creation time on the payment system.
    #[serde(default, with = "timestamp::utc_opt")]
    pub created_utc: Option<DateTime<Utc>>,
    /// Last update time on the payment system.
    #[serde(default, with = "timestamp::utc_opt")]
    pub updated_utc: Option<DateTime<Utc>>,
}

impl CallbackBody {
    /// `updatedUtc` when it is a real time: a date before 2000 is none — a sender's unset
    /// date (.NET's `DateTime.MinValue`, the Unix epoch), which payhook accepts and hands
    /// on. What orders the results of one transaction (`createdUtc` is the same for all):
    /// taken as a real time, an unset date makes every result look older than any other,
    /// and a late retry of a failure newer than a booked success.
    ///
    /// ```
    /// # use payhook::model::CallbackBody;
    /// let unset = r#"{"id":1,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
    ///   "nonce":"n-1","transactionType":1,"transactionStatus":4,"clientId":"c","amount":1,
    ///   "currency":"EUR","updatedUtc":"0001-01-01T00:00:00"}"#;
    /// let callback: CallbackBody = serde_json::from_str(unset)?;
    /// assert!(callback.updated_utc.is_some() && callback.updated().is_none());
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn updated(&self) -> Option<DateTime<Utc>> {
        timestamp::real(self.updated_utc)
    }
}

/// What can be read of a callback body that was refused (answered 400): each field on its
/// own, `None` where it is missing, `null` or of another type, so that an operator can find
/// the callback among the failing ones (see `server::refusal`). A body that is no JSON
/// object, or names a field twice, reads as nothing.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ReadableCallback {
    pub(crate) nonce: Option<String>,
    pub(crate) status: Option<TransactionStatus>,
    pub(crate) reference: Option<Uuid>,
    pub(crate) client_id: Option<String>,
    pub(crate) amount: Option<Decimal>,
    pub(crate) currency: Option<String>,
}

impl ReadableCallback {
    /// Reads `bytes`' fields one by one, as [`CallbackBody`] reads them.
    pub(crate) fn of(bytes: &[u8]) -> Self {
        use serde_json::value::RawValue;

        /// Each field as it came, to read on its own.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Fields<'a> {
            #[serde(borrow, default)]
            nonce: Option<&'a RawValue>,
            #[serde(borrow, default)]
            transaction_status: Option<&'a RawValue>,
            #[serde(borrow, default)]
            transaction_reference_id: Option<&'a RawValue>,
            #[serde(borrow, default)]
            client_id: Option<&'a RawValue>,
            #[serde(borrow, default)]
            amount: Option<&'a RawValue>,
            #[serde(borrow, default)]
            currency: Option<&'a RawValue>,
        }
        #[derive(Deserialize)]
        struct Amount(#[serde(with = "amount::exact")] Decimal);

        fn read<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
            raw.and_then(|raw| serde_json::from_str(raw.get()).ok())
        }
        let Ok(fields) = serde_json::from_slice::<Fields<'_>>(bytes) else {
            return Self::default();
        };
        Self {
            nonce: read(fields.nonce),
            status: read(fields.transaction_status),
            reference: read(fields.transaction_reference_id),
            client_id: read(fields.client_id),
            amount: read(fields.amount).map(|Amount(amount)| amount),
            currency: read(fields.currency),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::round_trip;

    #[test]
    fn a_refused_body_is_read_field_by_field() {
        let readable = ReadableCallback::of(
            br#"{"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e","nonce":"n-1",
                "transactionStatus":4.0,"clientId":null,"amount":"12.50","currency":7}"#,
        );
        assert_eq!(
            readable,
            ReadableCallback {
                nonce: Some("n-1".to_owned()),
                status: Some(TransactionStatus::Success),
                reference: Some("0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e".parse().unwrap()),
                client_id: None,
                amount: Some(Decimal::new(1250, 2)),
                currency: None,
            }
        );
        let unreadable = ReadableCallback::of(
            br#"{"nonce":42,"transactionStatus":4.5,"transactionReferenceId":"r-1"}"#,
        );
        assert_eq!(unreadable, ReadableCallback::default());
        for body in [&b"[1]"[..], b"not json", br#"{"nonce":"a","nonce":"b"}"#] {
            assert_eq!(ReadableCallback::of(body), ReadableCallback::default());
        }
    }

    #[test]
    fn callback_body_round_trips_with_every_field() {
        let body: CallbackBody = round_trip(
            r#"{"id":1001,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e","nonce":"n-1",
                "providerId":11,"providerTransactionId":"pt-9","transactionType":1,"transactionStatus":-2,
                "transactionStatusMessage":"declined by issuer","transactionInternalMessage":"try another card",
                "clientId":"client-42","additionalData":{"orderId":"o-1"},"amount":0.1,"currency":"EUR",
                "destinationAmount":0.11,"destinationCurrency":"USD",
                "createdUtc":"2026-01-02T03:04:05.123456700Z","updatedUtc":"2026-01-02T03:04:05Z"}"#,
        );
        assert_eq!(
            body.transaction_status,
            TransactionStatus::PaymentSystemError
        );
        assert_eq!(body.amount.to_string(), "0.1");
    }

    #[test]
    fn a_minimal_callback_reads() {
        let body: CallbackBody = serde_json::from_str(
            r#"{"id":1,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e","nonce":"n",
                "transactionType":2,"transactionStatus":4,"clientId":"c","amount":"5","currency":"EUR",
                "destinationAmount":null,"createdUtc":"2026-01-02T03:04:05.1234567",
                "updatedUtc":"2026-01-02T06:04:05+03:00"}"#,
        )
        .unwrap();
        assert_eq!(body.destination_amount, None);
        assert_eq!(
            body.created_utc
                .map(|t| timestamp::format_utc(&t))
                .as_deref(),
            Some("2026-01-02T03:04:05.123456700Z")
        );
        assert_eq!(
            body.updated_utc
                .map(|t| timestamp::format_utc(&t))
                .as_deref(),
            Some("2026-01-02T03:04:05Z")
        );
        assert_eq!(body.additional_data, Value::Null);
    }

    #[test]
    fn a_callback_without_its_nonce_is_refused_by_name() {
        let error = serde_json::from_str::<CallbackBody>(
            r#"{"id":1,"transactionReferenceId":"0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
                "transactionType":2,"transactionStatus":4,"clientId":"c","amount":5,"currency":"EUR"}"#,
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("missing field `nonce`"),
            "{error}"
        );
    }
}
