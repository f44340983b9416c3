//! Providers (payment systems), currencies and payment types (spec 2.2).
//!
//! A provider comes in two shapes. In the providers validation *request* the aggregator sends
//! [`ProviderCandidate`]s, whose `currencies` and `payTypes` element shape the spec does not
//! show, so they are kept as JSON values and read on demand. In the *response* the merchant
//! sends [`Provider`]s with fully typed [`Currency`] and [`PaymentType`] objects.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::null_as_default;

/// A provider as the aggregator sends it in a providers validation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCandidate {
    /// Unique provider identifier.
    #[serde(deserialize_with = "super::integer::integer")]
    pub id: i64,
    /// Provider name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// Collaborator associated with the provider.
    #[serde(default, deserialize_with = "super::integer::or_zero")]
    pub collab_id: i64,
    /// Supported currencies, as sent (element shape not fixed by the spec).
    #[serde(default, deserialize_with = "null_as_default")]
    pub currencies: Vec<Value>,
    /// Supported payment types, as sent (element shape not fixed by the spec).
    #[serde(default, deserialize_with = "null_as_default")]
    pub pay_types: Vec<Value>,
    /// Tags of the provider (`fiat`, `crypto`, the merchant's own). Not in the request table
    /// of interface 0.3.2; read when the aggregator sends it, empty otherwise. Read loosely,
    /// as the lists whose shape the spec does not show: a list of names, or of objects
    /// naming one (`name`, else `code`); any other element is passed over, and a field of
    /// another shape is no tags — never a refusal of the whole request.
    #[serde(
        default,
        deserialize_with = "loose_tags",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tags: Vec<String>,
}

/// Reads a candidate's `tags` (see [`ProviderCandidate::tags`]).
fn loose_tags<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    fn name_of(element: Value) -> Option<String> {
        match element {
            Value::String(name) => Some(name),
            Value::Object(mut fields) => {
                ["name", "code"]
                    .into_iter()
                    .find_map(|field| match fields.remove(field) {
                        Some(Value::String(name)) => Some(name),
                        _ => None,
                    })
            }
            _ => None,
        }
    }
    Ok(match Value::deserialize(deserializer)? {
        Value::Array(elements) => elements.into_iter().filter_map(name_of).collect(),
        Value::String(name) => vec![name],
        _ => Vec::new(),
    })
}

/// The fewest JSON values a providers validation's candidates may hold together, whatever
/// `server.body_limit` (see [`candidates_within`]).
pub(crate) const MIN_CANDIDATE_VALUES: usize = 100_000;

/// How many bytes of `server.body_limit` allow one JSON value among the candidates.
pub(crate) const BODY_BYTES_PER_CANDIDATE_VALUE: usize = 10;

/// The most JSON values the candidates of a body of at most `body_limit` bytes may hold
/// together: one for each [`BODY_BYTES_PER_CANDIDATE_VALUE`] bytes, at least
/// [`MIN_CANDIDATE_VALUES`] (104,857 with the default limit of 1 MiB).
pub(crate) fn max_candidate_values(body_limit: usize) -> usize {
    (body_limit / BODY_BYTES_PER_CANDIDATE_VALUE).max(MIN_CANDIDATE_VALUES)
}

/// Whether `candidates` hold at most `limit` JSON values together: one for each candidate,
/// each of its tags, and each value in its `currencies` and `payTypes`, nested ones
/// included (a payment type of seven fields is eight). Parsed, a body's values take 16–32
/// times their bytes (`[0,0,0,…]`) and are kept while the handler runs, beyond what the
/// body memory counts: bounded by the body's limit, they hold a few times that at most.
/// Stops counting at the limit.
pub(crate) fn candidates_within(candidates: &[ProviderCandidate], limit: usize) -> bool {
    let mut left = limit;
    candidates.iter().all(|candidate| {
        let own = 1 + candidate.tags.len();
        left.checked_sub(own).is_some_and(|rest| {
            left = rest;
            candidate
                .currencies
                .iter()
                .chain(&candidate.pay_types)
                .all(|value| super::object::spend(value, &mut left))
        })
    })
}

impl ProviderCandidate {
    /// The candidate in the response shape: elements of `currencies` and `payTypes` that read
    /// as the response's objects are kept typed; a currency sent as a bare string becomes a
    /// currency with that code and id 0; elements of any other shape are dropped.
    ///
    /// ```
    /// use payhook::model::ProviderCandidate;
    ///
    /// let candidate: ProviderCandidate = serde_json::from_str(
    ///     r#"{"id":7,"name":"Card","collabId":3,"currencies":["EUR",{"id":2,"code":"USD"}],"payTypes":[]}"#,
    /// )?;
    /// let provider = candidate.to_provider();
    /// assert!(provider.supports_currency("eur") && provider.supports_currency("USD"));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn to_provider(&self) -> Provider {
        Provider {
            id: self.id,
            name: self.name.clone(),
            collab_id: self.collab_id,
            currencies: self
                .currencies
                .iter()
                .filter_map(Currency::from_loose)
                .collect(),
            pay_types: self
                .pay_types
                .iter()
                .filter_map(|v| PaymentType::deserialize(v).ok())
                .collect(),
        }
    }
}

/// A provider as the merchant returns it in a providers validation response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provider {
    /// Unique provider identifier.
    pub id: i64,
    /// Provider name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// Collaborator or merchant associated with the provider.
    #[serde(default, deserialize_with = "null_as_default")]
    pub collab_id: i64,
    /// Supported currencies.
    #[serde(default, deserialize_with = "null_as_default")]
    pub currencies: Vec<Currency>,
    /// Supported payment types.
    #[serde(default, deserialize_with = "null_as_default")]
    pub pay_types: Vec<PaymentType>,
}

impl Provider {
    /// `true` when the provider lists the ISO currency `code` (case-insensitive).
    pub fn supports_currency(&self, code: &str) -> bool {
        self.currencies
            .iter()
            .any(|c| c.code.eq_ignore_ascii_case(code))
    }

    /// The payment type whose `code` or `name` is `pay_type` (case-insensitive), if any.
    pub fn pay_type(&self, pay_type: &str) -> Option<&PaymentType> {
        self.pay_types.iter().find(|t| {
            t.code.eq_ignore_ascii_case(pay_type) || t.name.eq_ignore_ascii_case(pay_type)
        })
    }

    /// `true` when at least one payment type supports the direction and has it enabled.
    pub fn enabled_for(&self, cash_in: bool) -> bool {
        self.pay_types.iter().any(|t| t.enabled_for(cash_in))
    }
}

/// A currency object: `{ "id": 1, "code": "EUR" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Currency {
    /// Currency identifier at the aggregator.
    #[serde(default, deserialize_with = "super::integer::whole_or_zero")]
    pub id: i64,
    /// ISO 4217 code.
    pub code: String,
}

impl Currency {
    /// Reads a currency sent either as an object or as a bare ISO code.
    fn from_loose(value: &Value) -> Option<Self> {
        match value {
            Value::String(code) => Some(Self {
                id: 0,
                code: code.clone(),
            }),
            other => Self::deserialize(other).ok(),
        }
    }
}

/// A payment type object (spec 2.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentType {
    /// Unique payment type identifier.
    #[serde(deserialize_with = "super::integer::whole")]
    pub id: i64,
    /// Internal code of the payment type.
    #[serde(default, deserialize_with = "null_as_default")]
    pub code: String,
    /// Display name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// The type can be used for deposits.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cash_in: bool,
    /// The type can be used for withdrawals.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cash_out: bool,
    /// Deposits are currently enabled for this type.
    #[serde(default, deserialize_with = "null_as_default")]
    pub is_cash_in_enabled: bool,
    /// Withdrawals are currently enabled for this type.
    #[serde(default, deserialize_with = "null_as_default")]
    pub is_cash_out_enabled: bool,
}

impl PaymentType {
    /// `true` when the type supports the direction *and* has it enabled right now.
    pub fn enabled_for(&self, cash_in: bool) -> bool {
        if cash_in {
            self.cash_in && self.is_cash_in_enabled
        } else {
            self.cash_out && self.is_cash_out_enabled
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::round_trip;

    const CARD: &str = r#"{"id":11,"name":"Card","collabId":3,
        "currencies":[{"id":1,"code":"EUR"},{"id":2,"code":"USD"}],
        "payTypes":[{"id":5,"code":"card","name":"Bank card","cashIn":true,"cashOut":true,
                     "isCashInEnabled":true,"isCashOutEnabled":false}]}"#;

    /// A candidate's currencies and payment types are kept as JSON values, which hold an
    /// id written `1.0` as a float: read as its integer, as the request's integer fields
    /// are. It was
    /// dropped, and the provider filtered out for lacking the currency: a client offered no
    /// providers, without a word.
    #[test]
    fn a_candidate_s_ids_written_as_whole_floats_are_read_as_integers() {
        let candidate: ProviderCandidate = serde_json::from_str(
            r#"{"id":11,"name":"Card","collabId":3,
                "currencies":[{"id":1.0,"code":"EUR"},{"id":2e0,"code":"USD"},{"id":null,"code":"GBP"}],
                "payTypes":[{"id":5.0,"code":"card","name":"Bank card","cashIn":true,"cashOut":true,
                             "isCashInEnabled":true,"isCashOutEnabled":true}]}"#,
        )
        .unwrap();
        let provider = candidate.to_provider();
        let ids: Vec<i64> = provider.currencies.iter().map(|c| c.id).collect();
        assert_eq!(ids, [1, 2, 0]);
        assert_eq!(provider.pay_type("card").map(|t| t.id), Some(5));
        // Not whole, or past where floats are exact: not an id.
        for id in ["1.5", "9007199254740993.0", "\"5\""] {
            let value: Value =
                serde_json::from_str(&format!(r#"{{"id":{id},"code":"card"}}"#)).unwrap();
            assert!(PaymentType::deserialize(&value).is_err(), "{id}");
        }
        assert_eq!(
            serde_json::from_str::<Provider>(CARD.replace(":5,", ":5.0,").as_str())
                .unwrap()
                .pay_types[0]
                .id,
            5
        );
    }

    #[test]
    fn response_provider_round_trips() {
        let provider: Provider = round_trip(CARD);
        assert!(provider.supports_currency("usd"));
        assert!(provider.enabled_for(true));
        assert!(
            !provider.enabled_for(false),
            "cash-out is supported but disabled"
        );
        assert_eq!(provider.pay_type("Bank card").map(|t| t.id), Some(5));
    }

    #[test]
    fn candidate_round_trips_and_converts_to_the_response_shape() {
        let candidate: ProviderCandidate = round_trip(CARD);
        let provider = candidate.to_provider();
        assert_eq!(provider, serde_json::from_str::<Provider>(CARD).unwrap());
    }

    #[test]
    fn candidate_elements_of_unknown_shape_are_kept_and_tolerated() {
        let candidate: ProviderCandidate = round_trip(
            r#"{"id":1,"name":"Crypto","collabId":9,"currencies":["BTC",42],"payTypes":["wallet"]}"#,
        );
        let provider = candidate.to_provider();
        assert_eq!(
            provider.currencies,
            [Currency {
                id: 0,
                code: "BTC".into()
            }]
        );
        assert!(provider.pay_types.is_empty());
    }

    /// `tags` is not in the spec's table: a shape other than a list of names is read as
    /// well as it can be, never refused (a refusal would leave the client no provider).
    #[test]
    fn tags_of_any_shape_are_read_loosely() {
        let tags = |field: &str| {
            let text = format!(r#"{{"id":1,"currencies":[],"payTypes":[]{field}}}"#);
            serde_json::from_str::<ProviderCandidate>(&text)
                .map(|candidate| candidate.tags)
                .unwrap()
        };
        assert_eq!(tags(r#","tags":["fiat","eu"]"#), ["fiat", "eu"]);
        assert_eq!(
            tags(r#","tags":[{"id":1,"name":"fiat"},{"id":2,"code":"eu"},{"id":3},7]"#),
            ["fiat", "eu"]
        );
        assert_eq!(tags(r#","tags":"crypto""#), ["crypto"]);
        for nothing in [
            "",
            r#","tags":null"#,
            r#","tags":{"fiat":true}"#,
            r#","tags":3"#,
        ] {
            assert!(tags(nothing).is_empty(), "{nothing}");
        }
    }

    #[test]
    fn currency_round_trips() {
        let currency: Currency = round_trip(r#"{"id":1,"code":"EUR"}"#);
        assert_eq!(currency.code, "EUR");
    }

    #[test]
    fn payment_type_round_trips() {
        let pay_type: PaymentType = round_trip(
            r#"{"id":5,"code":"sepa","name":"SEPA","cashIn":false,"cashOut":true,"isCashInEnabled":false,"isCashOutEnabled":true}"#,
        );
        assert!(pay_type.enabled_for(false) && !pay_type.enabled_for(true));
    }
}
