//! Every input the fuzz targets (`fuzz/`) found to break a parser, kept with the answer it
//! must get now. The inputs are in `tests/fixtures/fuzz/`, named for the target that found
//! them.
#![allow(clippy::unwrap_used, reason = "tests")]

use payhook::model::{CallbackBody, format_utc, parse_amount, parse_utc};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/fuzz")
            .join(name),
    )
    .unwrap()
}

/// `amount_and_time`: the naive forms took a negative year (`-0026-01-02T03:04:05.1`),
/// which payhook then wrote as RFC 3339 could not read again. A time is read only in the
/// years RFC 3339 writes, 0000 to 9999 (in UTC).
#[test]
fn a_negative_year_is_not_a_time() {
    let text = String::from_utf8(fixture("amount_and_time-negative-year.txt")).unwrap();
    assert!(parse_utc(&text).is_err(), "{text}");
    for refused in [
        "-0001-12-31T23:00:00",
        "0000-01-01T00:30:00+01:00",
        "+10000-01-01T00:00:00Z",
    ] {
        assert!(parse_utc(refused).is_err(), "{refused}");
    }
    for edge in ["0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999"] {
        let time = parse_utc(edge).unwrap();
        assert_eq!(parse_utc(&format_utc(&time)).unwrap(), time, "{edge}");
    }
}

/// `request_models`: a callback whose `createdUtc` had a negative year was read, and its
/// JSON could not be read back. It is a 400 now (the field is named).
#[test]
fn a_callback_with_a_negative_year_is_refused_naming_the_field() {
    let error =
        serde_json::from_slice::<CallbackBody>(&fixture("request_models-negative-year.json"))
            .unwrap_err()
            .to_string();
    assert!(error.contains("is not a date-time"), "{error}");
}

/// `amount_and_time`: `0e-1` read as zero at scale 1 and was written `0.0`, but `0.0` read
/// back at scale 0: a zero lost the scale every other amount keeps.
#[test]
fn a_zero_amount_keeps_its_scale_both_ways() {
    let text = String::from_utf8(fixture("amount_and_time-zero-scale.txt")).unwrap();
    let amount = parse_amount(&text).unwrap();
    let again = parse_amount(&amount.to_string()).unwrap();
    assert_eq!((amount, amount.scale()), (again, again.scale()), "{text}");
    for (text, written) in [
        ("0.0", "0.0"),
        ("0.00", "0.00"),
        ("-0.0", "0.0"),
        ("0", "0"),
    ] {
        let amount = parse_amount(text).unwrap();
        assert_eq!(amount.abs().to_string(), written, "{text}");
    }
}

/// `request_models`: a number in a field kept as sent (here a provider candidate's
/// `payTypes`, a 122-digit integer) was parsed by serde_json's fast float reader, which is
/// not always correctly rounded, so the value payhook wrote back read as another number.
/// serde_json's `float_roundtrip` reads every float exactly as the nearest double.
#[test]
fn a_number_kept_as_sent_reads_back_as_the_same_number() {
    use payhook::model::ProvidersValidationRequest;
    let request: ProvidersValidationRequest =
        serde_json::from_slice(&fixture("request_models-float-round-trip.json")).unwrap();
    let again: ProvidersValidationRequest =
        serde_json::from_slice(&serde_json::to_vec(&request).unwrap()).unwrap();
    assert_eq!(request, again);
}
