//! UTC times read the way the aggregator writes them.
//!
//! The aggregator is a .NET service: its `DateTime`s come with or without `Z`, sometimes with
//! an offset, and with 0 to 7 fractional digits. All of them are read here into
//! [`DateTime<Utc>`]: a time without an offset is taken as UTC (the spec's fields are all
//! "DateTime (UTC)"), a time with an offset is converted. Times are written back as RFC 3339
//! with `Z`.

use chrono::{DateTime, Datelike, NaiveDateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serializer, de};
use std::borrow::Cow;

/// Why a piece of text is not a time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a date-time (expected RFC 3339, e.g. 2026-01-02T03:04:05Z)")]
pub struct TimestampError(String);

/// Parses a date-time leniently into UTC.
///
/// # Errors
///
/// [`TimestampError`] when the text is not a date-time in any of the accepted forms.
///
/// # Examples
///
/// ```
/// use payhook::model::parse_utc;
///
/// let with_offset = parse_utc("2026-01-02T06:04:05+03:00")?;
/// let without = parse_utc("2026-01-02T03:04:05")?;
/// assert_eq!(with_offset, without);
/// # Ok::<(), payhook::model::TimestampError>(())
/// ```
pub fn parse_utc(text: &str) -> Result<DateTime<Utc>, TimestampError> {
    let time = DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .ok()
        .or_else(|| naive_utc(text));
    // Only the years RFC 3339 can write (0000 to 9999, in UTC): a time payhook reads, it
    // must be able to write and read again (the naive forms would take `-0026`).
    time.filter(|time| (0..=9999).contains(&time.year()))
        .ok_or_else(|| TimestampError(text.chars().take(40).collect()))
}

/// A time without an offset, taken as UTC: `2026-01-02T03:04:05.1234567` (the aggregator's
/// usual form) or `2026-01-02 03:04:05`.
fn naive_utc(text: &str) -> Option<DateTime<Utc>> {
    const FORMS: [&str; 2] = ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"];
    let naive = if text.contains(char::is_whitespace) {
        FORMS
            .iter()
            .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
    } else {
        // chrono's prepared items for the first form (a format string is parsed anew on
        // every call). They would also allow whitespace between the fields and after them,
        // which the forms do not: text with whitespace goes through the forms.
        text.parse::<NaiveDateTime>().ok()
    };
    naive.map(|naive| naive.and_utc())
}

/// Formats a time as RFC 3339 with `Z`, with as many fractional digits as it needs.
pub fn format_utc(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// `#[serde(with = "timestamp::utc")]` for a required time.
pub(crate) mod utc {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        time: &DateTime<Utc>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_utc(time))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<DateTime<Utc>, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        parse_utc(&text).map_err(de::Error::custom)
    }
}

/// `#[serde(with = "timestamp::utc_opt")]` for a nullable time (`null` and absence are `None`).
pub(crate) mod utc_opt {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        time: &Option<DateTime<Utc>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match time {
            Some(time) => serializer.serialize_str(&format_utc(time)),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        match Option::<Cow<str>>::deserialize(deserializer)? {
            Some(text) => parse_utc(&text).map(Some).map_err(de::Error::custom),
            None => Ok(None),
        }
    }
}

// Times as the stores keep them: milliseconds since the Unix epoch.

/// A transaction's last change, as a callback or a record of the aggregator gives it:
/// `updated`, else `created`, each left out when it is no real time — before the year 2000,
/// as a sender's unset date writes it (.NET's `DateTime.MinValue`, the Unix epoch). Taken
/// for a real time, such a date would put every callback of the transaction beyond any
/// retention, refused for ever.
pub(crate) fn last_change(
    updated: Option<DateTime<Utc>>,
    created: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    real(updated).or(real(created))
}

/// `time`, unless it is no real time (before the year 2000: see [`last_change`]).
pub(crate) fn real(time: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    time.filter(|time| time.year() >= 2000)
}

/// Milliseconds since the Unix epoch, now (0 for a clock set before 1970, as
/// [`ms_from_time`] gives). Straight from the system clock: on every callback's path,
/// three times, where `Utc::now` would compute a calendar date each time only to be turned
/// back into milliseconds.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// Milliseconds since the Unix epoch (how the store keeps times) as a UTC time; beyond
/// chrono's range it is `DateTime::<Utc>::MAX_UTC`.
pub(crate) fn time_from_ms(ms: u64) -> DateTime<Utc> {
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A UTC time as milliseconds since the Unix epoch (how the store keeps times); a time
/// before the epoch is 0.
pub(crate) fn ms_from_time(time: DateTime<Utc>) -> u64 {
    u64::try_from(time.timestamp_millis()).unwrap_or(0)
}

/// Serde for a time kept as an integer of milliseconds since the Unix epoch — the records'
/// JSON form since their first release. Unlike `chrono::serde::ts_milliseconds`, it writes
/// the unsigned integer the records always held and reads any of them, clamping one beyond
/// chrono's range (e.g. a deadline saturated by an unbounded duration) instead of refusing
/// the record. `#[serde(with = "crate::model::timestamp::epoch_ms")]`.
pub(crate) mod epoch_ms {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        time: &DateTime<Utc>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(super::ms_from_time(*time))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<DateTime<Utc>, D::Error> {
        u64::deserialize(deserializer).map(super::time_from_ms)
    }

    /// The same for an optional time (`null` when absent).
    pub(crate) mod option {
        use chrono::{DateTime, Utc};
        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            time: &Option<DateTime<Utc>>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match time {
                Some(time) => serializer.serialize_some(&super::super::ms_from_time(*time)),
                None => serializer.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            Ok(Option::<u64>::deserialize(deserializer)?.map(super::super::time_from_ms))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Timelike};

    fn utc(text: &str) -> DateTime<Utc> {
        parse_utc(text).unwrap()
    }

    #[test]
    fn zulu_times_are_read() {
        assert_eq!(
            utc("2026-01-02T03:04:05Z"),
            Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap()
        );
    }

    #[test]
    fn seven_fractional_digits_as_dotnet_writes_them_are_kept() {
        let time = utc("2026-01-02T03:04:05.1234567Z");
        assert_eq!(time.nanosecond(), 123_456_700);
    }

    #[test]
    fn a_time_without_offset_is_taken_as_utc() {
        assert_eq!(utc("2026-01-02T03:04:05"), utc("2026-01-02T03:04:05Z"));
        assert_eq!(
            utc("2026-01-02T03:04:05.5"),
            utc("2026-01-02T03:04:05.500Z")
        );
    }

    #[test]
    fn an_offset_is_converted_to_utc() {
        assert_eq!(
            utc("2026-01-02T06:04:05+03:00"),
            utc("2026-01-02T03:04:05Z")
        );
    }

    #[test]
    fn times_are_written_as_rfc3339_with_z() {
        assert_eq!(
            format_utc(&utc("2026-01-02T06:04:05+03:00")),
            "2026-01-02T03:04:05Z"
        );
        assert_eq!(
            format_utc(&utc("2026-01-02T03:04:05.1234567")),
            "2026-01-02T03:04:05.123456700Z"
        );
    }

    #[test]
    fn garbage_is_a_clear_error() {
        for text in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-01-02",
            // Whitespace the accepted forms do not have.
            "2026-01-02T03:04:05 ",
            "2026-01-02T03 :04:05",
            "2026 -01-02T03:04:05.5",
        ] {
            let error = parse_utc(text).unwrap_err();
            assert!(error.to_string().contains("is not a date-time"), "{text}");
        }
    }
}
