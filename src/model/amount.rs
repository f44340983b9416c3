//! Exact money on the wire.
//!
//! The aggregator writes amounts as JSON numbers (`10.50`). Reading them through `f64`, as
//! serde does by default, would turn `0.1 + 0.2` into `0.30000000000000004` and round large
//! amounts silently. Here an amount is taken from the JSON text itself (through
//! [`serde_json::value::RawValue`]) and parsed straight into a [`Decimal`]: every digit is kept,
//! and a number a `Decimal` cannot hold exactly is an error, never a rounded value. Numeric
//! strings (`"10.50"`, the same syntax as a JSON number, no spaces) are accepted too. Amounts are written back as JSON numbers with their
//! scale, so `10.50` stays `10.50`.

use std::fmt;

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use serde_json::value::RawValue;

/// Largest power of ten a [`Decimal`] can scale by (its maximum scale).
const MAX_SCALE: u32 = 28;

/// Why a piece of text is not an exact amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AmountError {
    /// The text is not a decimal number at all.
    #[error("`{0}` is not a decimal number")]
    NotANumber(String),
    /// The number has more integer digits than a 96-bit decimal holds.
    #[error("`{0}` is out of range for an exact amount")]
    OutOfRange(String),
    /// The number has more fractional digits than can be kept without rounding.
    #[error("`{0}` has more than 28 fractional digits; it cannot be kept exactly")]
    TooPrecise(String),
}

/// Parses the text of a JSON number (or of a numeric string) into an exact [`Decimal`].
///
/// Accepts an optional leading `-`, digits with an optional fraction, and an optional
/// exponent (`1.5e3`). Never rounds.
///
/// # Errors
///
/// [`AmountError`] when the text is not a number, or the number cannot be held exactly.
///
/// # Examples
///
/// ```
/// use payhook::model::parse_amount;
///
/// assert_eq!(parse_amount("10.50")?.to_string(), "10.50");
/// assert_eq!(parse_amount("1.5e2")?.to_string(), "150");
/// assert!(parse_amount("79228162514264337593543950336").is_err());
/// # Ok::<(), payhook::model::AmountError>(())
/// ```
pub fn parse_amount(text: &str) -> Result<Decimal, AmountError> {
    let not_a_number = || AmountError::NotANumber(shorten(text));
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => {
            let exponent: i64 = text[at + 1..].parse().map_err(|_| not_a_number())?;
            (&text[..at], exponent)
        }
        None => (text, 0),
    };
    let digits = mantissa.strip_prefix('-').unwrap_or(mantissa);
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    let well_formed = !int_part.is_empty()
        && int_part.bytes().all(|b| b.is_ascii_digit())
        && frac_part.bytes().all(|b| b.is_ascii_digit())
        && !(digits.contains('.') && frac_part.is_empty());
    if !well_formed {
        return Err(not_a_number());
    }
    // Tells "too many fractional digits" from "too many integer digits".
    let overflow = || {
        let fractional_digits = i64::try_from(frac_part.len()).unwrap_or(i64::MAX);
        if fractional_digits.saturating_sub(exponent) > i64::from(MAX_SCALE) {
            AmountError::TooPrecise(shorten(text))
        } else {
            AmountError::OutOfRange(shorten(text))
        }
    };
    let value = Decimal::from_str_exact(mantissa).map_err(|_| overflow())?;
    apply_exponent(value, exponent).ok_or_else(overflow)
}

/// Multiplies by `10^exponent` exactly, or gives `None` when that cannot be done.
fn apply_exponent(mut value: Decimal, exponent: i64) -> Option<Decimal> {
    if exponent >= 0 {
        let scale = value.scale();
        if value.is_zero() {
            // Zero times any power of ten is zero: no loop over a huge exponent. It keeps
            // the scale the exponent leaves it, as any amount does (`0.0` stays `0.0`: the
            // fuzz target `amount_and_time` found `0e-1` written `0.0` and read back `0`).
            let moved = u32::try_from(exponent).unwrap_or(u32::MAX);
            value.set_scale(scale.saturating_sub(moved)).ok()?;
            return Some(value);
        }
        // A non-zero value is at least 10^-scale, and a Decimal holds less than 10^29: a
        // larger exponent overflows, so the loop below runs at most 57 times.
        if exponent > i64::from(scale) + 28 {
            return None;
        }
        for _ in 0..exponent {
            value = value.checked_mul(Decimal::TEN)?;
        }
        // 1.25e2 is 125, not 125.00: the digits the exponent moved left of the point go.
        value.rescale(scale.saturating_sub(u32::try_from(exponent).ok()?));
        Some(value)
    } else {
        let scale = i64::from(value.scale()).checked_add(exponent.checked_neg()?)?;
        let scale = u32::try_from(scale).ok().filter(|s| *s <= MAX_SCALE)?;
        value.set_scale(scale).ok()?;
        Some(value)
    }
}

/// Keeps error messages short when the offending text is long.
fn shorten(text: &str) -> String {
    const LIMIT: usize = 40;
    match text.char_indices().nth(LIMIT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Reads an amount from the JSON text of a number or numeric string.
fn from_raw<E: de::Error>(raw: &RawValue) -> Result<Decimal, E> {
    let text = raw.get();
    let number = if text.starts_with('"') {
        let inner: String = serde_json::from_str(text).map_err(E::custom)?;
        // As written: the document's pattern for numeric strings has no spaces either.
        parse_amount(&inner)
    } else if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        parse_amount(text)
    } else {
        return Err(E::invalid_type(unexpected(text), &Expecting));
    };
    number.map_err(E::custom)
}

/// Names the JSON kind of `text` for an "invalid type" error.
pub(crate) fn unexpected(text: &str) -> de::Unexpected<'_> {
    match text.as_bytes().first() {
        Some(b't') => de::Unexpected::Bool(true),
        Some(b'f') => de::Unexpected::Bool(false),
        Some(b'n') => de::Unexpected::Unit,
        Some(b'[') => de::Unexpected::Seq,
        Some(b'{') => de::Unexpected::Map,
        _ => de::Unexpected::Other(text),
    }
}

struct Expecting;

impl de::Expected for Expecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a decimal amount")
    }
}

/// Writes an amount as a JSON number with its scale.
fn to_raw(value: &Decimal) -> Box<RawValue> {
    // A Decimal always displays as a valid JSON number, so this cannot fail; the fallback
    // only keeps the code free of a panic path.
    RawValue::from_string(value.to_string())
        .unwrap_or_else(|_| RawValue::from_string("0".to_owned()).unwrap_or_default())
}

/// `#[serde(with = "amount::exact")]` for a required amount.
pub(crate) mod exact {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        value: &Decimal,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        to_raw(value).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Decimal, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        from_raw(&raw)
    }
}

/// `#[serde(with = "amount::exact_opt")]` for a nullable amount (`null` and absence are `None`).
pub(crate) mod exact_opt {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<Decimal>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.as_ref().map(to_raw).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Decimal>, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        if raw.get() == "null" {
            Ok(None)
        } else {
            from_raw(&raw).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Wrapped {
        #[serde(with = "exact")]
        amount: Decimal,
        #[serde(with = "exact_opt", default, skip_serializing_if = "Option::is_none")]
        fee: Option<Decimal>,
    }

    fn read(json: &str) -> Result<Wrapped, serde_json::Error> {
        serde_json::from_str(json)
    }

    fn amount_of(json: &str) -> String {
        read(json)
            .map(|w| w.amount.to_string())
            .unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn one_tenth_is_exact_and_sums_exactly() {
        let a = read(r#"{"amount": 0.1}"#).unwrap().amount;
        let b = read(r#"{"amount": 0.2}"#).unwrap().amount;
        assert_eq!((a + b).to_string(), "0.3");
    }

    #[test]
    fn scale_is_kept_on_the_round_trip() {
        let w = read(r#"{"amount": 10.50}"#).unwrap();
        assert_eq!(w.amount.to_string(), "10.50");
        assert_eq!(serde_json::to_string(&w).unwrap(), r#"{"amount":10.50}"#);
    }

    #[test]
    fn the_largest_decimal_is_read_exactly() {
        assert_eq!(
            amount_of(r#"{"amount": 79228162514264337593543950335}"#),
            "79228162514264337593543950335"
        );
    }

    #[test]
    fn negative_amounts_are_kept() {
        assert_eq!(amount_of(r#"{"amount": -12.345}"#), "-12.345");
    }

    #[test]
    fn numeric_strings_are_accepted() {
        assert_eq!(amount_of(r#"{"amount": "99.90"}"#), "99.90");
    }

    #[test]
    fn exponents_are_applied_exactly() {
        assert_eq!(amount_of(r#"{"amount": 1.25E2}"#), "125");
        assert_eq!(amount_of(r#"{"amount": 1.255e2}"#), "125.5");
        assert_eq!(amount_of(r#"{"amount": 125e-2}"#), "1.25");
    }

    #[test]
    fn a_huge_exponent_is_answered_at_once() {
        // Zero times ten never overflows: a loop up to the exponent would spin for ages.
        assert_eq!(amount_of(r#"{"amount": 0e9223372036854775807}"#), "0");
        assert_eq!(amount_of(r#"{"amount": "0.00E9223372036854775807"}"#), "0");
        let message = amount_of(r#"{"amount": 1e9223372036854775807}"#);
        assert!(message.contains("out of range"), "{message}");
        let message = amount_of(r#"{"amount": 0.0000001e9223372036854775807}"#);
        assert!(message.contains("out of range"), "{message}");
        // The largest exponents that still fit.
        assert_eq!(
            amount_of(r#"{"amount": 7e28}"#),
            "70000000000000000000000000000"
        );
        assert_eq!(amount_of(r#"{"amount": 0.5e1}"#), "5");
    }

    #[test]
    fn an_out_of_range_number_is_a_clear_error() {
        let message = amount_of(r#"{"amount": 79228162514264337593543950336}"#);
        assert!(message.contains("out of range"), "{message}");
        let message = amount_of(r#"{"amount": 1e40}"#);
        assert!(message.contains("out of range"), "{message}");
    }

    #[test]
    fn a_number_too_precise_to_keep_is_an_error_not_a_rounding() {
        let message = amount_of(r#"{"amount": 0.12345678901234567890123456789}"#);
        assert!(message.contains("28 fractional digits"), "{message}");
    }

    #[test]
    fn wrong_types_are_errors_naming_the_expectation() {
        for json in [
            r#"{"amount": true}"#,
            r#"{"amount": null}"#,
            r#"{"amount": [1]}"#,
            r#"{"amount": "ten"}"#,
        ] {
            assert!(amount_of(json).starts_with("error:"), "{json}");
        }
        assert!(amount_of(r#"{"amount": true}"#).contains("expected a decimal amount"));
    }

    #[test]
    fn nullable_amounts_accept_null_and_absence() {
        assert_eq!(read(r#"{"amount": 1, "fee": null}"#).unwrap().fee, None);
        assert_eq!(read(r#"{"amount": 1}"#).unwrap().fee, None);
        assert_eq!(
            read(r#"{"amount": 1, "fee": 0.50}"#)
                .unwrap()
                .fee
                .map(|d| d.to_string()),
            Some("0.50".into())
        );
    }

    #[test]
    fn malformed_numeric_strings_are_refused() {
        for text in ["", "-", "1.", ".5", "1.2.3", "+1", "1e", "0x10", "1 000"] {
            assert!(parse_amount(text).is_err(), "{text:?} should be refused");
        }
    }
}
