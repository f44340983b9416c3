//! Integers as JSON counts them.
//!
//! JSON has one number type, and JSON Schema (so the OpenAPI document) calls `742`, `742.0`
//! and `7.42e2` the same integer. serde reads only the first into an `i64`; a sender whose
//! JSON writer passes integers through floating point writes the others. Here an integer
//! field is read from the number's text, exactly (never through `f64`): any form of a whole
//! number in `i64`'s range is that integer, and a number with a fractional part, or out of
//! range, is an error. Numeric strings are not integers (unlike amounts).

use serde::{Deserialize, Deserializer, de};
use serde_json::value::RawValue;

use super::amount::{parse_amount, unexpected};

/// `#[serde(deserialize_with = "integer::integer")]` for a required integer.
pub(crate) fn integer<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let raw = Box::<RawValue>::deserialize(deserializer)?;
    from_text(raw.get())
}

/// For a nullable integer: `null` (and, with `#[serde(default)]`, absence) is `None`.
pub(crate) fn optional<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    let raw = Box::<RawValue>::deserialize(deserializer)?;
    match raw.get() {
        "null" => Ok(None),
        text => from_text(text).map(Some),
    }
}

/// For an integer whose `null` means 0 (a provider candidate's `collabId`).
pub(crate) fn or_zero<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    optional(deserializer).map(Option::unwrap_or_default)
}

/// For an integer that may be read from a `serde_json::Value` as well as from text (a
/// provider candidate's currencies and payment types are kept as values, which hold `742.0`
/// as a float, and read from them): a whole float below 2^53, where each float stands for
/// one integer only, is that integer (from 2^53 on, `…993.0` reads as `…992`: refused).
/// Through a float, a fraction finer than a float holds is lost before it is seen
/// (`1.0000000000000001` reads as 1): unlike [`integer`], not exact — for ids the spec
/// leaves free-form only. Read as a typed field from text, the number comes as an integer
/// or a float the same way.
pub(crate) fn whole<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    deserializer.deserialize_any(Whole { null: None })
}

/// [`whole`], with `null` (and, with `#[serde(default)]`, absence) taken for 0.
pub(crate) fn whole_or_zero<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    deserializer.deserialize_any(Whole { null: Some(0) })
}

/// Reads a whole number in any of serde_json's forms; `null` as `null` says.
struct Whole {
    null: Option<i64>,
}

/// 2^53: below it, a whole float stands for one integer only.
const EXACT_IN_F64: f64 = 9_007_199_254_740_992.0;

impl de::Visitor<'_> for Whole {
    type Value = i64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        de::Expected::fmt(&Expecting, f)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<i64, E> {
        Ok(value)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<i64, E> {
        i64::try_from(value)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(value), &Expecting))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<i64, E> {
        let refused = || E::invalid_value(de::Unexpected::Float(value), &Expecting);
        if value.fract() != 0.0 || value.abs() >= EXACT_IN_F64 {
            return Err(refused());
        }
        // A whole float below 2^53 prints as its digits, without exponent or fraction.
        format!("{value}").parse().map_err(|_| refused())
    }

    fn visit_unit<E: de::Error>(self) -> Result<i64, E> {
        self.null
            .ok_or_else(|| E::invalid_type(de::Unexpected::Unit, &Expecting))
    }

    fn visit_none<E: de::Error>(self) -> Result<i64, E> {
        self.visit_unit()
    }
}

struct Expecting;

impl de::Expected for Expecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an integer in the range of a 64-bit signed integer")
    }
}

pub(super) fn from_text<E: de::Error>(text: &str) -> Result<i64, E> {
    if let Ok(value) = text.parse::<i64>() {
        return Ok(value);
    }
    if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Err(E::invalid_type(unexpected(text), &Expecting));
    }
    let invalid = || E::invalid_value(de::Unexpected::Other(text), &Expecting);
    let value = parse_amount(text).map_err(|_| invalid())?;
    if !value.fract().is_zero() {
        return Err(invalid());
    }
    i64::try_from(value).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Ids {
        #[serde(deserialize_with = "integer")]
        id: i64,
        #[serde(default, deserialize_with = "optional")]
        other: Option<i64>,
    }

    fn id(text: &str) -> Result<i64, serde_json::Error> {
        serde_json::from_str::<Ids>(&format!(r#"{{"id": {text}}}"#)).map(|ids| ids.id)
    }

    #[test]
    fn whole_numbers_in_any_form_are_integers() {
        for (text, value) in [
            ("742", 742),
            ("-742.0", -742),
            ("7.42e2", 742),
            ("0.0", 0),
            ("-0", 0),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808.000", i64::MIN),
        ] {
            assert_eq!(id(text).unwrap(), value, "{text}");
        }
    }

    #[test]
    fn fractions_other_types_and_out_of_range_are_refused() {
        for text in [
            "742.5",
            "1e-3",
            "9223372036854775808",
            "-9223372036854775809.0",
            "1e30",
            r#""742""#,
            "true",
            "null",
            "[1]",
        ] {
            let error = id(text).unwrap_err().to_string();
            assert!(error.contains("an integer"), "{text}: {error}");
        }
        let ids: Ids = serde_json::from_str(r#"{"id": 1, "other": null}"#).unwrap();
        assert_eq!(ids.other, None);
        let ids: Ids = serde_json::from_str(r#"{"id": 1, "other": 2.0}"#).unwrap();
        assert_eq!(ids.other, Some(2));
    }
}
