//! Nested messages are JSON objects, never arrays.
//!
//! serde's derived `Deserialize` reads a struct from a JSON array of its fields in order too
//! (`"merchantData": ["hash", {...}]`). The aggregator sends objects; a positional form is
//! not one of its messages, so a field holding a message reads it through [`object`] (or
//! [`objects`] for a list of them), which accepts a JSON object only. The top-level body is
//! checked before parsing by the server.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::{fmt, marker::PhantomData};

/// Reads a `T` from a JSON object; an array is refused with "expected a JSON object".
pub(crate) fn object<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_map(ObjectVisitor(PhantomData))
}

/// Reads a list of `T`, each from a JSON object.
pub(crate) fn objects<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_seq(ObjectsVisitor(PhantomData))
}

/// The most JSON values (objects, arrays, strings, numbers, … each one) a free-form object
/// may hold. A parsed value takes 32 bytes and more where the body spent two
/// (`[0,0,0,…]`), and a request's parsed fields are kept while its handler runs, beyond
/// what the body memory counts: without a bound, a body of 1 MiB on an open endpoint would
/// hold some 16–32 MiB. The aggregator's `additionalData` is a handful of fields.
pub(crate) const MAX_FREE_FORM_VALUES: usize = 10_000;

/// Reads a free-form object (`additionalData`, `providerData`): a JSON object, or `null`
/// for none (as absent is). Any other value is refused with "expected a JSON object or null":
/// the spec makes these fields objects, and a merchant's code reading them expects one. One
/// of more than [`MAX_FREE_FORM_VALUES`] values is refused too.
pub(crate) fn object_or_null<'de, D>(deserializer: D) -> Result<serde_json::Value, D::Error>
where
    D: Deserializer<'de>,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    if !(value.is_object() || value.is_null()) {
        return Err(de::Error::invalid_type(
            unexpected(&value),
            &"a JSON object or null",
        ));
    }
    if holds_more_values_than(&value, MAX_FREE_FORM_VALUES) {
        return Err(de::Error::custom(format!(
            "a free-form object of more than {MAX_FREE_FORM_VALUES} JSON values"
        )));
    }
    Ok(value)
}

/// Whether `value` holds more than `limit` values, itself included (stops counting there).
fn holds_more_values_than(value: &serde_json::Value, limit: usize) -> bool {
    let mut left = limit;
    !spend(value, &mut left)
}

/// Takes the values `value` holds, itself included, from `left`; `false` (and stops
/// counting) once they are more than was left. Recursive, with no allocation on the request
/// path: serde_json's recursion limit (128) bounds the depth of what was parsed.
pub(crate) fn spend(value: &serde_json::Value, left: &mut usize) -> bool {
    let Some(rest) = left.checked_sub(1) else {
        return false;
    };
    *left = rest;
    match value {
        serde_json::Value::Array(items) => items.iter().all(|item| spend(item, left)),
        serde_json::Value::Object(fields) => fields.values().all(|field| spend(field, left)),
        _ => true,
    }
}

/// How serde names the kind of `value` in an error.
fn unexpected(value: &serde_json::Value) -> de::Unexpected<'_> {
    match value {
        serde_json::Value::Bool(b) => de::Unexpected::Bool(*b),
        serde_json::Value::Number(_) => de::Unexpected::Other("a number"),
        serde_json::Value::String(s) => de::Unexpected::Str(s),
        serde_json::Value::Array(_) => de::Unexpected::Seq,
        serde_json::Value::Null => de::Unexpected::Unit,
        serde_json::Value::Object(_) => de::Unexpected::Map,
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map))
    }
}

/// One element of a list, read through [`object`].
struct Element<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Element<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        object(deserializer).map(Element)
    }
}

struct ObjectsVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectsVisitor<T> {
    type Value = Vec<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON array of objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        // The hint comes from the sender: a bound, not a promise.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(Element(item)) = seq.next_element::<Element<T>>()? {
            items.push(item);
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Inner {
        a: u32,
        b: String,
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Outer {
        #[serde(deserialize_with = "object")]
        one: Inner,
        #[serde(deserialize_with = "objects")]
        many: Vec<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Free {
        #[serde(default, deserialize_with = "object_or_null")]
        data: serde_json::Value,
    }

    #[test]
    fn free_form_fields_of_more_values_than_the_bound_are_refused() {
        // The object itself, its array, and the numbers in it.
        let of = |numbers: usize| {
            let list = vec!["0"; numbers].join(",");
            format!(r#"{{"data": {{"k": [{list}]}}}}"#)
        };
        let at_bound = of(MAX_FREE_FORM_VALUES - 2);
        assert!(serde_json::from_str::<Free>(&at_bound).is_ok());
        let error = serde_json::from_str::<Free>(&of(MAX_FREE_FORM_VALUES - 1)).unwrap_err();
        assert!(
            error.to_string().contains("more than 10000 JSON values"),
            "{error}"
        );
        assert!(holds_more_values_than(
            &serde_json::json!({"a": {"b": [1, 2]}}),
            4
        ));
        assert!(!holds_more_values_than(
            &serde_json::json!({"a": {"b": [1, 2]}}),
            5
        ));
    }

    #[test]
    fn free_form_fields_are_objects_or_null() {
        for (accepted, data) in [
            (r#"{"data": {"k": [1]}}"#, serde_json::json!({"k": [1]})),
            (r#"{"data": null}"#, serde_json::Value::Null),
            ("{}", serde_json::Value::Null),
        ] {
            assert_eq!(serde_json::from_str::<Free>(accepted).unwrap().data, data);
        }
        for refused in [
            r#"{"data": []}"#,
            r#"{"data": "x"}"#,
            r#"{"data": 1}"#,
            r#"{"data": true}"#,
        ] {
            let error = serde_json::from_str::<Free>(refused).unwrap_err();
            assert!(
                error.to_string().contains("a JSON object or null"),
                "{refused}: {error}"
            );
        }
    }

    #[test]
    fn objects_are_read_and_arrays_refused() {
        let outer: Outer = serde_json::from_str(
            r#"{"one": {"a": 1, "b": "x"}, "many": [{"b": "y", "a": 2, "extra": null}]}"#,
        )
        .unwrap();
        assert_eq!(
            outer.one,
            Inner {
                a: 1,
                b: "x".into()
            }
        );
        assert_eq!(
            outer.many,
            vec![Inner {
                a: 2,
                b: "y".into()
            }]
        );

        for positional in [
            r#"{"one": [1, "x"], "many": []}"#,
            r#"{"one": {"a": 1, "b": "x"}, "many": [[2, "y"]]}"#,
            r#"{"one": {"a": 1, "b": "x"}, "many": {"a": 2, "b": "y"}}"#,
        ] {
            let error = serde_json::from_str::<Outer>(positional).unwrap_err();
            assert!(error.to_string().contains("JSON"), "{positional}: {error}");
        }
    }
}
