//! The requests the aggregator sends, built from a few typed values or from a JSON file with
//! `path=value` overrides — byte-exact, so that amounts are sent as written (`10.50` stays
//! `10.50`; no `f64` on the way).

use crate::model::ValidationId;
use rust_decimal::Decimal;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::SimError;
use crate::config::PathsConfig;
use crate::model::{TransactionRecord, TransactionStatus, TransactionType};

/// The three requests of the aggregator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Providers validation (spec 4.2).
    ProvidersValidation,
    /// Transaction validation (spec 4.2).
    TransactionValidation,
    /// Transaction result callback (spec 2.7).
    Callback,
}

impl RequestKind {
    /// The path of the merchant's endpoint for this request, as `paths` configures it.
    ///
    /// ```
    /// use payhook::config::PathsConfig;
    /// use payhook::sim::RequestKind;
    ///
    /// assert_eq!(RequestKind::Callback.path(&PathsConfig::default()), "/payhook/callback");
    /// ```
    pub fn path(self, paths: &PathsConfig) -> &str {
        match self {
            Self::ProvidersValidation => &paths.providers_validation,
            Self::TransactionValidation => &paths.transaction_validation,
            Self::Callback => &paths.callback,
        }
    }

    /// The path of the merchant's endpoint for this request under the default `[paths]`.
    pub fn default_path(self) -> String {
        self.path(&PathsConfig::default()).to_owned()
    }
}

/// The payment a simulated request is about. [`Default`] gives a fresh nonce, validation id
/// and reference id each time, a deposit of 10.00 EUR by `client-1` with provider 11, and a
/// success status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// Unique transaction stamp.
    pub nonce: String,
    /// Amount, sent with its scale.
    pub amount: Decimal,
    /// ISO currency.
    pub currency: String,
    /// The merchant's client.
    pub client_id: String,
    /// The chosen provider.
    pub provider_id: i64,
    /// The provider's collaborator (callback recipient selection, spec 6.2).
    pub collab_id: i64,
    /// Deposit or withdrawal.
    pub direction: TransactionType,
    /// `validationId` of a transaction validation.
    pub validation_id: ValidationId,
    /// The aggregator's transaction id.
    pub transaction_id: i64,
    /// The transaction's reference id.
    pub reference_id: Uuid,
    /// The callback's status.
    pub status: TransactionStatus,
    /// What the payment system delivered, when it is not `amount` (a conversion, a fee taken
    /// on the way): the callback's and the record's `destinationAmount`. `None`: `amount`.
    pub destination_amount: Option<Decimal>,
    /// The delivered currency, when it is not `currency`: `destinationCurrency`. `None`:
    /// `currency`.
    pub destination_currency: Option<String>,
}

impl Default for Payment {
    fn default() -> Self {
        let random = Uuid::new_v4();
        let (high, low) = random.as_u64_pair();
        Self {
            nonce: format!("sim-{}", &random.simple().to_string()[..12]),
            amount: Decimal::new(1000, 2),
            currency: "EUR".into(),
            client_id: "client-1".into(),
            provider_id: 11,
            collab_id: 3,
            direction: TransactionType::Deposit,
            // Positive and within what JavaScript-based tools keep exact (2^53).
            validation_id: ValidationId::from(i64::try_from(high >> 11).unwrap_or(1)),
            transaction_id: i64::try_from(low >> 11).unwrap_or(1),
            reference_id: Uuid::new_v4(),
            status: TransactionStatus::Success,
            destination_amount: None,
            destination_currency: None,
        }
    }
}

/// A marker that [`to_text`] turns into a bare JSON number, exactly as written.
const EXACT: &str = "\u{0}exact-number:";

/// A JSON number written exactly as `text` (which must be a JSON number).
fn exact_number(text: &str) -> Value {
    Value::String(format!("{EXACT}{text}"))
}

impl Payment {
    /// The request body of `kind` for this payment.
    pub fn body(&self, kind: RequestKind) -> Value {
        let cash_in = self.direction != TransactionType::Withdrawal;
        let merchant_data = json!({
            "merchantHash": "6f1c2b1e-8a8f-4d55-9a3e-1c2b3d4e5f60",
            "clientId": self.client_id,
            "additionalData": {},
        });
        let amount = exact_number(&self.amount.to_string());
        match kind {
            RequestKind::ProvidersValidation => json!({
                "transactionData": {
                    "merchantData": merchant_data,
                    "paymentData": {
                        "nonce": self.nonce, "amount": amount, "currency": self.currency,
                        "providerTags": [], "providerId": self.provider_id, "payType": "card",
                    },
                    "cashIn": cash_in,
                },
                "providers": [{
                    "id": self.provider_id, "name": "Simulated card", "collabId": self.collab_id,
                    "currencies": [{"id": 1, "code": self.currency}],
                    "payTypes": [{"id": 5, "code": "card", "name": "Bank card", "cashIn": true,
                                  "cashOut": true, "isCashInEnabled": true, "isCashOutEnabled": true}],
                }],
            }),
            RequestKind::TransactionValidation => json!({
                "merchantData": merchant_data,
                "paymentData": {
                    "nonce": self.nonce, "amount": amount, "currency": self.currency,
                    "providerId": self.provider_id,
                },
                "providerData": {},
                "validationId": self.validation_id,
                "cashIn": cash_in,
            }),
            RequestKind::Callback => {
                let dotnet = dotnet_time(chrono::Utc::now());
                json!({
                    "id": self.transaction_id,
                    "transactionReferenceId": self.reference_id,
                    "nonce": self.nonce,
                    "providerId": self.provider_id,
                    "providerTransactionId": format!("sim-{}", self.transaction_id),
                    "transactionType": self.direction.code(),
                    "transactionStatus": self.status.code(),
                    "transactionStatusMessage": self.status.description(),
                    "transactionInternalMessage": "",
                    "clientId": self.client_id,
                    "additionalData": {},
                    "amount": amount,
                    "currency": self.currency,
                    "destinationAmount": exact_number(&self.delivered_amount().to_string()),
                    "destinationCurrency": self.delivered_currency(),
                    "createdUtc": dotnet,
                    "updatedUtc": format!("{dotnet}Z"),
                })
            }
        }
    }
}

/// A time as the aggregator (.NET) writes it: 7 fractional digits, without `Z` (a callback
/// carries one time without it and one with it, so that a merchant's own parsing meets both
/// forms here rather than in production).
fn dotnet_time(time: chrono::DateTime<chrono::Utc>) -> String {
    format!(
        "{}.{:07}",
        time.format("%Y-%m-%dT%H:%M:%S"),
        time.timestamp_subsec_nanos() / 100
    )
}

/// Sets a callback body's `createdUtc` and `updatedUtc`, as the aggregator writes them.
pub(crate) fn set_times(
    body: &mut Value,
    created: chrono::DateTime<chrono::Utc>,
    updated: chrono::DateTime<chrono::Utc>,
) {
    if let Some(fields) = body.as_object_mut() {
        fields.insert("createdUtc".into(), Value::String(dotnet_time(created)));
        fields.insert(
            "updatedUtc".into(),
            Value::String(format!("{}Z", dotnet_time(updated))),
        );
    }
}

impl Payment {
    /// The amount the payment system delivered: `destination_amount`, or `amount`.
    pub fn delivered_amount(&self) -> Decimal {
        self.destination_amount.unwrap_or(self.amount)
    }

    /// The currency delivered: `destination_currency`, or `currency`.
    pub fn delivered_currency(&self) -> &str {
        self.destination_currency
            .as_deref()
            .unwrap_or(&self.currency)
    }

    /// The aggregator's record of this transaction (spec 2.6) once its result is in, with
    /// the given callback delivery status: `status` and its message, `errorMessage` for a
    /// failure, and the callback's `destinationAmount` and `destinationCurrency`.
    pub fn record(&self, delivery_status: &str, sending_canceled: bool) -> TransactionRecord {
        let delivered = Some(self.delivered_amount());
        self.record_as(self.status, delivered, delivery_status, sending_canceled)
    }

    /// The aggregator's record of this transaction while it is still in progress: created
    /// after its validation, no result from the payment system yet. Status 3 (pending), no
    /// callback due (`callbackDeliveryStatus` `NotSent`), no money delivered yet
    /// (`destinationAmount` `null`, which only the lookup's record may be). A merchant's
    /// recovery reading it must book nothing.
    ///
    /// ```
    /// use payhook::model::TransactionStatus;
    /// use payhook::sim::Payment;
    ///
    /// let record = Payment::default().record_in_progress();
    /// assert_eq!(record.transaction_status, TransactionStatus::Pending);
    /// assert_eq!(record.destination_amount, None);
    /// ```
    pub fn record_in_progress(&self) -> TransactionRecord {
        self.record_as(TransactionStatus::Pending, None, "NotSent", false)
    }

    fn record_as(
        &self,
        status: TransactionStatus,
        destination_amount: Option<Decimal>,
        delivery_status: &str,
        sending_canceled: bool,
    ) -> TransactionRecord {
        let now = chrono::Utc::now();
        TransactionRecord {
            id: self.transaction_id,
            transaction_reference_id: self.reference_id,
            provider_id: Some(self.provider_id),
            provider_name: Some("Simulated card".into()),
            provider_pay_type: Some("card".into()),
            merchant_id: Some(1),
            merchant_name: Some("Simulated merchant".into()),
            merchant_client_id: Some(self.client_id.clone()),
            account_data: json!({}),
            nonce: self.nonce.clone().into(),
            provider_transaction_id: Some(format!("sim-{}", self.transaction_id)),
            amount: self.amount,
            currency: self.currency.clone(),
            destination_amount,
            destination_currency: Some(self.delivered_currency().to_owned()),
            created_utc: Some(now),
            updated_utc: Some(now),
            transaction_type: self.direction,
            transaction_status: status,
            transaction_status_message: Some(status.description().into()),
            transaction_internal_message: Some(String::new()),
            callback_delivery_status: Some(delivery_status.into()),
            error_message: status.is_failure().then(|| status.description().into()),
            is_callback_sending_canceled: sending_canceled,
            payment_method_type: Some(1),
            payment_method_value: Some("4111********1111".into()),
            pay_type_id: Some(5),
            applied_fee_id: None,
            applied_fee_type: None,
            applied_fee_amount: None,
            applied_fee_value: None,
            applied_fee_currency: None,
            applied_fee_payer: None,
            payment_ip_address: Some("127.0.0.1".into()),
            user_agent: Some("payhook-sim".into()),
        }
    }
}

/// Sets `path` (dot-separated object keys and array indexes: `paymentData.amount`,
/// `providers.0.id`) in `body` to `value`, read as JSON when it is JSON (numbers exactly as
/// written; `"42"`, quoted, the string of those digits) and as a string otherwise. Missing
/// objects on the way are created.
///
/// # Errors
///
/// [`SimError::Request`] when the path runs through something that is not an object or an
/// array, or indexes past an array's end.
pub fn set(body: &mut Value, path: &str, value: &str) -> Result<(), SimError> {
    let bad = |why: &str| SimError::request(format!("--set {path}: {why}"));
    let parsed = parse_value(value);
    let mut current = body;
    let mut keys = path.split('.').peekable();
    while let Some(key) = keys.next() {
        if key.is_empty() {
            return Err(bad("empty key"));
        }
        let last = keys.peek().is_none();
        current = match current {
            Value::Object(map) => {
                if last {
                    map.insert(key.to_owned(), parsed);
                    return Ok(());
                }
                map.entry(key.to_owned())
                    .or_insert_with(|| Value::Object(Map::new()))
            }
            Value::Array(items) => {
                let index: usize = key.parse().map_err(|_| bad("an array needs an index"))?;
                let slot = items
                    .get_mut(index)
                    .ok_or_else(|| bad("index past the end of the array"))?;
                if last {
                    *slot = parsed;
                    return Ok(());
                }
                slot
            }
            _ => return Err(bad("runs through a value that is not an object or array")),
        };
    }
    Ok(())
}

/// `value` as JSON: numbers kept exactly as written, JSON literals and documents parsed,
/// anything else a string.
fn parse_value(value: &str) -> Value {
    let trimmed = value.trim();
    if trimmed.parse::<i64>().is_ok() {
        return serde_json::from_str(trimmed).unwrap_or_else(|_| Value::String(value.into()));
    }
    if serde_json::from_str::<serde_json::Number>(trimmed).is_ok() {
        return exact_number(trimmed);
    }
    match serde_json::from_str::<Value>(trimmed) {
        // A JSON string literal (`"42"`) is its text: the way to write digits as a string.
        Ok(
            parsed @ (Value::Null
            | Value::Bool(_)
            | Value::String(_)
            | Value::Array(_)
            | Value::Object(_)),
        ) => parsed,
        _ => Value::String(value.into()),
    }
}

/// The body as the bytes to send: compact JSON, exact numbers written bare.
pub fn to_text(body: &Value) -> String {
    let text = body.to_string();
    let marker = serde_json::to_string(EXACT).unwrap_or_default();
    // `"\u0000exact-number:` … `"`  →  the number's text.
    let opening = &marker[..marker.len() - 1];
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = rest.find(opening) {
        out.push_str(&rest[..start]);
        let after = &rest[start + opening.len()..];
        let Some(end) = after.find('"') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        out.push_str(&after[..end]);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_written_exactly_and_bodies_parse_as_the_spec_types() {
        let payment = Payment {
            amount: "79228162514264337593543950335".parse().unwrap(),
            ..Payment::default()
        };
        let text = to_text(&payment.body(RequestKind::TransactionValidation));
        assert!(
            text.contains(r#""amount":79228162514264337593543950335"#),
            "{text}"
        );
        let parsed: crate::model::TransactionValidationRequest =
            serde_json::from_str(&text).unwrap();
        assert_eq!(parsed.payment_data.amount, payment.amount);

        let payment = Payment {
            amount: Decimal::new(1050, 2),
            ..Payment::default()
        };
        for kind in [RequestKind::ProvidersValidation, RequestKind::Callback] {
            assert!(to_text(&payment.body(kind)).contains(":10.50,"));
        }
        let callback: crate::model::CallbackBody =
            serde_json::from_str(&to_text(&payment.body(RequestKind::Callback))).unwrap();
        assert_eq!(callback.amount.to_string(), "10.50");
        // Times as .NET writes them, 7 fractional digits, with and without `Z`: the same
        // instant either way.
        let body = payment.body(RequestKind::Callback);
        let created = body["createdUtc"].as_str().unwrap();
        assert!(!created.ends_with('Z') && created.len() == "2026-01-02T03:04:05.1234567".len());
        assert_eq!(body["updatedUtc"].as_str().unwrap(), format!("{created}Z"));
        assert!(callback.created_utc.is_some() && callback.created_utc == callback.updated_utc);
        let _: crate::model::ProvidersValidationRequest =
            serde_json::from_str(&to_text(&payment.body(RequestKind::ProvidersValidation)))
                .unwrap();
    }

    #[test]
    fn a_converted_payment_carries_what_was_delivered_and_an_unfinished_one_nothing_yet() {
        let payment = Payment {
            amount: Decimal::new(1050, 2),
            destination_amount: Some(Decimal::new(1137, 2)),
            destination_currency: Some("USD".into()),
            ..Payment::default()
        };
        let text = to_text(&payment.body(RequestKind::Callback));
        assert!(
            text.contains(r#""amount":10.50,"#)
                && text.contains(r#""destinationAmount":11.37,"destinationCurrency":"USD""#),
            "{text}"
        );
        let record = payment.record("Delivered", false);
        assert_eq!(
            (record.amount, record.currency.as_str()),
            (Decimal::new(1050, 2), "EUR")
        );
        assert_eq!(record.destination_amount, Some(Decimal::new(1137, 2)));
        assert_eq!(record.destination_currency.as_deref(), Some("USD"));

        // A failure's record says what its callback says.
        let failed = Payment {
            status: TransactionStatus::Cancelled,
            ..payment.clone()
        };
        let record = failed.record("Delivered", false);
        let callback: crate::model::CallbackBody =
            serde_json::from_str(&to_text(&failed.body(RequestKind::Callback))).unwrap();
        assert_eq!(record.destination_amount, callback.destination_amount);
        assert_eq!(record.error_message.as_deref(), Some("cancelled"));

        let pending = payment.record_in_progress();
        assert_eq!(pending.transaction_status, TransactionStatus::Pending);
        assert_eq!(
            (pending.destination_amount, pending.error_message.as_deref()),
            (None, None)
        );
        assert_eq!(pending.callback_delivery_status.as_deref(), Some("NotSent"));
        // Read back as the merchant's lookup reads it.
        let read: TransactionRecord =
            serde_json::from_value(serde_json::to_value(&pending).unwrap()).unwrap();
        assert_eq!(read.transaction_status, TransactionStatus::Pending);

        let plain = Payment::default();
        let body = plain.body(RequestKind::Callback);
        assert_eq!(body["destinationCurrency"], "EUR");
        assert!(to_text(&body).contains(r#""destinationAmount":10.00,"#));
    }

    #[test]
    fn set_overrides_nested_values_with_json_or_strings() {
        let mut body = Payment::default().body(RequestKind::ProvidersValidation);
        set(&mut body, "transactionData.paymentData.amount", "0.10").unwrap();
        set(&mut body, "transactionData.cashIn", "false").unwrap();
        set(&mut body, "providers.0.name", "Other card").unwrap();
        set(
            &mut body,
            "transactionData.merchantData.additionalData.vip",
            "{\"level\": 3}",
        )
        .unwrap();
        set(&mut body, "extra.deep.key", "7").unwrap();
        set(&mut body, "extra.digits", "\"42\"").unwrap();
        let text = to_text(&body);
        assert!(text.contains(r#""amount":0.10"#), "{text}");
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["transactionData"]["cashIn"], false);
        assert_eq!(value["providers"][0]["name"], "Other card");
        assert_eq!(
            value["transactionData"]["merchantData"]["additionalData"]["vip"]["level"],
            3
        );
        assert_eq!(value["extra"]["deep"]["key"], 7);
        assert_eq!(value["extra"]["digits"], "42");
        assert!(set(&mut body, "providers.9.id", "1").is_err());
        assert!(set(&mut body, "transactionData.cashIn.x", "1").is_err());
    }
}
