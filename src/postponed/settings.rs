//! `[validation]`: Awaitable (postponed) transaction validation and the delivery of its
//! results.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::setting::InvalidSetting;

/// What a validation whose deadline passed is resolved as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadlineOutcome {
    /// `success: false` (the default).
    Deny,
    /// `success: true`.
    Allow,
}

/// `[validation]`: Awaitable (postponed) transaction validation and the delivery of results.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValidationConfig {
    /// The endpoint is declared Awaitable at the aggregator: a handler may postpone, and
    /// every decision is also posted to `{gateway_url}/api/v1/transactions/validation`.
    /// Needs a complete `[gateway]` section.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub awaitable: bool,
    /// In Awaitable mode, serve the transaction validation endpoint with no authentication
    /// method and no `allow_ips` all the same. Off by default: that endpoint's decisions are
    /// posted to the aggregator, so an open one lets anyone who reaches it have a decision
    /// posted under a `validationId` they guess — an approval for another client's
    /// withdrawal. Set it only where something in front of payhook (a gateway, a private
    /// network) admits the aggregator alone.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub allow_unauthenticated: bool,
    /// In Awaitable mode, a handler still deciding after this long is answered 200
    /// (postponed) by payhook, and its eventual decision is posted as the result.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub time_budget: Duration,
    /// A postponed validation still undecided this long after it arrived is resolved with
    /// `deadline_outcome`. Unset: no deadline.
    #[serde(
        deserialize_with = "crate::setting::optional_duration",
        serialize_with = "crate::setting::optional_duration_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub deadline: Option<Duration>,
    /// The result a passed deadline resolves to — and also a validation whose handler,
    /// past its time budget, then gave no decision (it failed, panicked or overran the
    /// handler timeout): nothing else would decide it. So `allow` here approves those too.
    pub deadline_outcome: DeadlineOutcome,
    /// The description sent with that result.
    pub deadline_description: String,
    /// Waits between attempts to post a result; the last one repeats until a 200 or a 403.
    /// Each wait is jittered by up to ±20%.
    #[serde(
        deserialize_with = "crate::setting::durations",
        serialize_with = "crate::setting::durations_text"
    )]
    pub retry_schedule: Vec<Duration>,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            awaitable: false,
            allow_unauthenticated: false,
            time_budget: Duration::from_secs(5),
            deadline: None,
            deadline_outcome: DeadlineOutcome::Deny,
            deadline_description: "validation timed out".to_owned(),
            retry_schedule: [1, 2, 5, 15, 60, 300].map(Duration::from_secs).to_vec(),
        }
    }
}

/// The longest wait `validation.retry_schedule` may list: a result waits no longer than
/// this between two attempts.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

impl ValidationConfig {
    /// Checks values that have the right type but are not acceptable. How the section fits
    /// `[gateway]` and `[server]` is checked by [`crate::config::Config::validate`].
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        crate::setting::longer_than_zero(&[
            ("validation.time_budget", self.time_budget),
            (
                "validation.deadline",
                self.deadline.unwrap_or(Duration::MAX),
            ),
        ])?;
        if self.retry_schedule.is_empty()
            || self
                .retry_schedule
                .iter()
                .any(|wait| wait.is_zero() || *wait > MAX_RETRY_WAIT)
        {
            return Err(InvalidSetting::new(
                "validation.retry_schedule",
                "must list at least one wait, each longer than zero and at most a day",
            ));
        }
        Ok(())
    }
}
