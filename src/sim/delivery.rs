//! Callback delivery as the aggregator does it (spec 6): every matching URL of the
//! merchant's callback settings (2.5) gets the callback, with up to `maxAttempts` attempts
//! (at most 17) on a schedule, until the first 2xx.
//!
//! The spec does not give the interval between attempts; [`Schedule::default`] backs off
//! from 5 s to a day over 16 waits. With [`Schedule::fast`] the waits pass on a virtual
//! clock: nothing sleeps, and each attempt is reported at the time it would have happened.

use std::time::Duration;

use super::SimError;
use super::trigger::{Exchange, Trigger};
use crate::model::{CallbackSettings, MAX_CALLBACK_ATTEMPTS, TransactionType};

/// The waits between delivery attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The wait before attempt `n + 2` is `waits[n]`; the last one repeats.
    pub waits: Vec<Duration>,
    /// Waits pass on a virtual clock instead of sleeping.
    pub fast: bool,
}

impl Default for Schedule {
    fn default() -> Self {
        let seconds = [
            5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14_400, 28_800, 43_200, 86_400,
            86_400,
        ];
        Self {
            waits: seconds.map(Duration::from_secs).to_vec(),
            fast: false,
        }
    }
}

impl Schedule {
    /// The same waits on a virtual clock.
    #[must_use]
    pub fn fast(mut self) -> Self {
        self.fast = true;
        self
    }

    /// The wait after failed attempt `attempt` (1-based).
    pub fn wait_after(&self, attempt: u32) -> Duration {
        let index = usize::try_from(attempt.saturating_sub(1)).unwrap_or(usize::MAX);
        self.waits
            .get(index)
            .or(self.waits.last())
            .copied()
            .unwrap_or_default()
    }
}

/// The URLs of `settings` that receive a result of `transaction_type` from collaborator
/// `collab_id` (spec 6.2), after checking every entry's `maxAttempts`.
///
/// # Errors
///
/// [`SimError::Request`] naming the first entry whose `maxAttempts` is 0 or above 17.
pub fn recipients(
    settings: &[CallbackSettings],
    collab_id: i64,
    transaction_type: TransactionType,
) -> Result<Vec<&CallbackSettings>, SimError> {
    if let Some(bad) = settings.iter().find(|s| !s.has_valid_attempts()) {
        return Err(SimError::request(format!(
            "{}: maxAttempts is {}; the aggregator allows 1 to {MAX_CALLBACK_ATTEMPTS}",
            bad.callback_url, bad.max_attempts
        )));
    }
    Ok(settings
        .iter()
        .filter(|s| s.receives(collab_id, transaction_type))
        .collect())
}

/// One delivery attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1-based.
    pub number: u32,
    /// When it was made, from the first attempt (virtual time with a fast schedule).
    pub at: Duration,
    /// What happened.
    pub exchange: Exchange,
}

/// How a delivery to one URL ended.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The URL.
    pub url: String,
    /// Every attempt made.
    pub attempts: Vec<Attempt>,
}

impl Delivery {
    /// `true` when an attempt got a 2xx.
    pub fn delivered(&self) -> bool {
        self.attempts
            .last()
            .is_some_and(|a| a.exchange.is_success())
    }
}

/// Delivers `body` to `settings.callback_url` as the aggregator does: signed only when
/// `addSignature` is set, attempts until the first 2xx or `maxAttempts`, waiting per
/// `schedule`; `progress` sees each attempt as it ends.
///
/// # Errors
///
/// [`SimError::Request`] when `addSignature` is set and the trigger has no signer, or the
/// request cannot be built.
pub async fn deliver(
    trigger: &Trigger,
    settings: &CallbackSettings,
    body: &[u8],
    schedule: &Schedule,
    mut progress: impl FnMut(&Attempt),
) -> Result<Delivery, SimError> {
    let signature = if settings.add_signature {
        let signer = trigger.signer().ok_or_else(|| {
            SimError::request(format!(
                "{} wants a signature (addSignature) but no signing key was given",
                settings.callback_url
            ))
        })?;
        Some((signer.header().clone(), signer.value(body)?))
    } else {
        None
    };
    let mut delivery = Delivery {
        url: settings.callback_url.clone(),
        attempts: Vec::new(),
    };
    let mut at = Duration::ZERO;
    let last = settings.max_attempts.min(MAX_CALLBACK_ATTEMPTS);
    for number in 1..=last {
        let exchange = trigger
            .send_with(&settings.callback_url, body, signature.clone())
            .await?;
        let attempt = Attempt {
            number,
            at,
            exchange,
        };
        progress(&attempt);
        let done = attempt.exchange.is_success();
        delivery.attempts.push(attempt);
        if done || number == last {
            break;
        }
        let wait = schedule.wait_after(number);
        if !schedule.fast {
            tokio::time::sleep(wait).await;
        }
        at += wait;
    }
    Ok(delivery)
}

/// What delivering one callback did: each recipient's delivery.
#[derive(Debug, Clone)]
pub struct Report {
    /// One per matching URL, in the settings' order.
    pub deliveries: Vec<Delivery>,
}

impl Report {
    /// The record's `callbackDeliveryStatus` for this outcome.
    pub fn status(&self) -> &'static str {
        if self.deliveries.is_empty() {
            "NoRecipients"
        } else if self.deliveries.iter().all(Delivery::delivered) {
            "Delivered"
        } else {
            "Failed"
        }
    }
}

/// The whole of spec 6 for one result: the recipients of `payment`'s callback among
/// `settings`, each delivered per `schedule`; the transaction's record on the mock gateway
/// (when given) says `Pending` meanwhile and the outcome after, with
/// `isCallbackSendingCanceled` once attempts are given up.
///
/// # Errors
///
/// [`SimError`] for invalid settings, a missing signing key, or an unreachable mock gateway.
pub async fn deliver_callback(
    trigger: &Trigger,
    payment: &super::Payment,
    body: &[u8],
    settings: &[CallbackSettings],
    schedule: &Schedule,
    mock: Option<&super::MockControl>,
    mut progress: impl FnMut(&str, &Attempt),
) -> Result<Report, SimError> {
    let targets = recipients(settings, payment.collab_id, payment.direction)?;
    if let Some(mock) = mock {
        mock.put_transaction(&payment.record("Pending", false))
            .await?;
    }
    let mut report = Report {
        deliveries: Vec::new(),
    };
    for target in targets {
        let delivery = deliver(trigger, target, body, schedule, |attempt| {
            progress(&target.callback_url, attempt);
        })
        .await?;
        report.deliveries.push(delivery);
    }
    if let Some(mock) = mock {
        let status = report.status();
        let record = payment.record(status, status != "Delivered");
        mock.put_transaction(&record).await?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(collab_id: i64, enabled: bool, kind: Option<TransactionType>) -> CallbackSettings {
        CallbackSettings {
            collab_id,
            callback_url: format!("http://127.0.0.1:1/{collab_id}/{enabled}/{kind:?}"),
            max_attempts: 3,
            is_enabled: enabled,
            add_signature: false,
            transaction_type_id: kind,
        }
    }

    #[test]
    fn recipients_are_enabled_same_collaborator_and_type_null_or_equal() {
        let settings = [
            url(3, true, None),
            url(3, true, Some(TransactionType::Deposit)),
            url(3, true, Some(TransactionType::Withdrawal)),
            url(3, false, None),
            url(4, true, None),
        ];
        let urls = |collab, kind| {
            recipients(&settings, collab, kind)
                .unwrap()
                .into_iter()
                .map(|s| &s.callback_url)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            urls(3, TransactionType::Deposit),
            [&settings[0].callback_url, &settings[1].callback_url]
        );
        assert_eq!(
            urls(3, TransactionType::Withdrawal),
            [&settings[0].callback_url, &settings[2].callback_url]
        );
        assert_eq!(
            urls(4, TransactionType::Deposit),
            [&settings[4].callback_url]
        );
        assert!(urls(5, TransactionType::Deposit).is_empty());
    }

    #[test]
    fn max_attempts_over_17_or_zero_is_refused() {
        for bad in [0, 18] {
            let mut settings = url(3, true, None);
            settings.max_attempts = bad;
            let error = recipients(&[settings], 3, TransactionType::Deposit).unwrap_err();
            assert!(error.to_string().contains("1 to 17"), "{error}");
        }
    }

    #[tokio::test]
    async fn the_last_attempt_allowed_is_not_followed_by_a_wait() {
        // 17 attempts at most, whatever maxAttempts says past it: after the 17th, no wait
        // (here a day long) before the delivery is reported.
        let mut settings = url(3, true, None);
        settings.max_attempts = 18;
        let mut waits = vec![Duration::ZERO; 16];
        waits.push(Duration::from_secs(86_400));
        let schedule = Schedule { waits, fast: false };
        let trigger = Trigger::new(None)
            .unwrap()
            .with_timeout(Duration::from_secs(2));
        let delivery = tokio::time::timeout(
            Duration::from_secs(60),
            deliver(&trigger, &settings, b"{}", &schedule, |_| {}),
        )
        .await
        .expect("reported after the 17th attempt, not a day later")
        .unwrap();
        assert_eq!(delivery.attempts.len(), 17);
        assert!(!delivery.delivered());
    }

    #[test]
    fn the_schedule_repeats_its_last_wait() {
        let schedule = Schedule {
            waits: vec![Duration::from_secs(1), Duration::from_secs(5)],
            fast: true,
        };
        assert_eq!(schedule.wait_after(1), Duration::from_secs(1));
        assert_eq!(schedule.wait_after(2), Duration::from_secs(5));
        assert_eq!(schedule.wait_after(16), Duration::from_secs(5));
        assert_eq!(Schedule::default().waits.len(), 16, "17 attempts, 16 waits");
    }
}
