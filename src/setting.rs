//! What the configuration sections share. Each section lives with the module it
//! configures (`[server]` with the server, `[signature]` with signatures, ...), and
//! [`crate::config`] assembles them, loads them (defaults < file < environment) and checks
//! the settings that involve more than one section. This module is below all of them:
//! durations written as text (`"250ms"`, `"10s"`, `"5m"`), numbers and booleans read from
//! environment strings, secrets written redacted, and [`InvalidSetting`], what a section's
//! own check returns.

use serde::{Deserialize, Deserializer, Serializer, de};
use std::{fmt, str::FromStr, time::Duration};

use crate::Secret;

/// A value of the right type that its section does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub(crate) struct InvalidSetting {
    /// The dotted key, e.g. `server.body_limit`.
    pub(crate) key: String,
    /// Why it is refused.
    pub(crate) reason: String,
}

impl InvalidSetting {
    /// `key` refused for `reason`.
    pub(crate) fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Refuses the first of `durations` (a dotted key and its value) that is zero: a timeout,
/// an interval or a budget of nothing.
pub(crate) fn longer_than_zero(durations: &[(&str, Duration)]) -> Result<(), InvalidSetting> {
    match durations.iter().find(|(_, value)| value.is_zero()) {
        Some((key, _)) => Err(InvalidSetting::new(*key, "must be longer than zero")),
        None => Ok(()),
    }
}

/// Refuses `secret`, the value of `key`, when it is shorter than `min` characters: a secret
/// that authenticates callers over the network must not be found by asking with guesses.
/// The reason names the length asked for, never the value.
pub(crate) fn long_enough(key: &str, secret: &Secret, min: usize) -> Result<(), InvalidSetting> {
    if secret.expose().chars().count() < min {
        return Err(InvalidSetting::new(
            key,
            format!("must be at least {min} characters (the value is not shown: it is a secret)"),
        ));
    }
    Ok(())
}

/// How every secret is written when a configuration is serialized; read back as a secret,
/// it is refused.
pub const REDACTED: &str = crate::secret::REDACTED;

/// Writes a secret as [`REDACTED`].
pub(crate) fn redacted<S: Serializer>(
    _: &Option<Secret>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(REDACTED)
}

/// Writes a duration the way [`parse_duration`] reads it, in the largest exact unit.
pub(crate) fn duration_text<S: Serializer>(
    value: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format_duration(*value))
}

pub(crate) fn optional_duration_text<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => duration_text(value, serializer),
        None => serializer.serialize_none(),
    }
}

pub(crate) fn durations_text<S: Serializer>(
    values: &[Duration],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(values.iter().map(|d| format_duration(*d)))
}

/// `"250ms"`, `"10s"`, `"5m"`, `"1h"`, `"30d"`: the largest unit that holds it exactly, as
/// [`parse_duration`] reads it.
///
/// ```
/// use payhook::config::format_duration;
/// assert_eq!(format_duration(std::time::Duration::from_millis(500)), "500ms");
/// assert_eq!(format_duration(std::time::Duration::from_secs(600)), "10m");
/// ```
pub fn format_duration(value: Duration) -> String {
    let millis = value.as_millis();
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    units
        .into_iter()
        .find(|(size, _)| millis != 0 && millis.is_multiple_of(*size))
        .map_or_else(
            || format!("{millis}ms"),
            |(size, unit)| format!("{}{unit}", millis / size),
        )
}

/// Reads a number or a boolean either natively (TOML) or from a string (environment).
pub(crate) fn lenient<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr + Deserialize<'de>,
    T::Err: fmt::Display,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either<T> {
        Text(String),
        Native(T),
    }
    match Either::<T>::deserialize(deserializer)? {
        Either::Native(value) => Ok(value),
        Either::Text(text) => text
            .trim()
            .parse()
            .map_err(|e| de::Error::custom(format!("`{text}`: {e}"))),
    }
}

/// Reads a duration: `"250ms"`, `"10s"`, `"5m"`, `"1h"`, or a number of seconds.
pub(crate) fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    match DurationText::deserialize(deserializer)? {
        DurationText::Seconds(seconds) => seconds_duration(seconds).map_err(de::Error::custom),
        DurationText::Text(text) => parse_duration(&text).map_err(de::Error::custom),
    }
}

/// A duration written as a bare number of seconds, held to the same bound as text.
fn seconds_duration(seconds: u64) -> Result<Duration, DurationError> {
    parse_duration(&seconds.to_string())
}

/// A duration as written: a number of seconds, or text for [`parse_duration`].
#[derive(Deserialize)]
#[serde(untagged)]
enum DurationText {
    Seconds(u64),
    Text(String),
}

/// Reads an optional duration: absent, empty or `"none"` is `None`.
pub(crate) fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    match DurationText::deserialize(deserializer)? {
        DurationText::Seconds(seconds) => seconds_duration(seconds)
            .map(Some)
            .map_err(de::Error::custom),
        DurationText::Text(text) if text.trim().is_empty() || text.trim() == "none" => Ok(None),
        DurationText::Text(text) => parse_duration(&text).map(Some).map_err(de::Error::custom),
    }
}

/// Reads a list of durations, each as [`duration`] reads one.
pub(crate) fn durations<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Duration>, D::Error> {
    #[derive(Deserialize)]
    struct One(#[serde(deserialize_with = "duration", serialize_with = "duration_text")] Duration);
    Ok(Vec::<One>::deserialize(deserializer)?
        .into_iter()
        .map(|One(d)| d)
        .collect())
}

/// Why a text is not a duration: the text, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` {reason}")]
pub struct DurationError {
    text: String,
    reason: &'static str,
}

/// Parses `"250ms"`, `"10s"`, `"5m"`, `"1h"`, `"30d"` or `"10"` (seconds), up to a hundred
/// years (`"36500d"`).
///
/// ```
/// use std::time::Duration;
///
/// assert_eq!(payhook::config::parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// let error = payhook::config::parse_duration("10 parsecs").unwrap_err();
/// assert_eq!(error.to_string(), "`10 parsecs` has an unknown unit: use ms, s, m, h or d");
/// ```
///
/// # Errors
///
/// [`DurationError`] naming the text when it is none of those forms.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let fail = |reason| DurationError {
        text: text.to_owned(),
        reason,
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| fail("is not a duration such as \"10s\""))?;
    let millis = match unit.trim() {
        "ms" => Some(number),
        "" | "s" => number.checked_mul(1000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        "d" => number.checked_mul(86_400_000),
        _ => return Err(fail("has an unknown unit: use ms, s, m, h or d")),
    };
    millis
        .filter(|millis| *millis <= LONGEST_MILLIS)
        .map(Duration::from_millis)
        .ok_or_else(|| fail("is too long: at most 36500d"))
}

/// The longest duration a setting takes: a hundred years. Every time payhook computes from
/// a setting (a deadline, an expiry, a timer) stays far inside what clocks and calendars
/// hold; a number of seconds such as `9223372036854775807` is refused, not a panic on the
/// first request that adds it to the time.
const LONGEST_MILLIS: u64 = 36_500 * 86_400_000;
