//! The worker that delivers decided results and applies deadlines.

use chrono::{DateTime, Utc};
use prometheus_client::metrics::histogram::Histogram;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::sync::Notify;

use super::clock::millis;
use super::settings::{DeadlineOutcome, ValidationConfig};
use super::{Clock, Delivery, PostponedValidation, ResolveError, Resolver};
use crate::gateway::{GatewayClient, GatewayError, MAX_RETRY_AFTER};
use crate::model::{PostponedValidationResult, ValidationId};
use crate::store::{PostponedStore, StoreError, ms_from_time, time_from_ms};

/// The longest the worker sleeps without looking at the store.
const IDLE: Duration = Duration::from_secs(30);

/// Results posted at the same time.
const PARALLEL_POSTS: usize = 8;

/// What one pass of the worker did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Results the aggregator accepted (200).
    pub delivered: usize,
    /// Results the aggregator refused (403): conflicts.
    pub conflicts: usize,
    /// Attempts that failed and are scheduled again.
    pub retried: usize,
    /// Validations resolved by their deadline.
    pub expired: usize,
    /// When the next piece of work falls due (UTC).
    pub next: Option<DateTime<Utc>>,
    /// Until when no result is posted, as the aggregator asked (`Retry-After` of a 429 or a
    /// 503): the results due meanwhile wait, deadlines still apply.
    pub held_back: Option<DateTime<Utc>>,
}

/// Delivers queued results to the aggregator and resolves validations whose deadline
/// passed. Started by [`crate::serve`] (or [`crate::App::start_background`]); one per store.
#[derive(Clone)]
pub struct Outbox {
    store: Arc<dyn PostponedStore>,
    gateway: GatewayClient,
    resolver: Resolver,
    config: ValidationConfig,
    clock: Clock,
    wake: Arc<Notify>,
    counts: Arc<Counters>,
    /// Until when (ms since the epoch) no result is posted: the latest end of a wait the
    /// aggregator asked for (`Retry-After`); 0 for none.
    held_back_ms: Arc<AtomicU64>,
}

/// What the outbox worker did since it started.
#[derive(Debug)]
struct Counters {
    delivered: AtomicU64,
    conflicts: AtomicU64,
    retries: AtomicU64,
    /// From a result's decision to its delivery (accepted by the aggregator), in seconds.
    delivery_seconds: Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            delivered: AtomicU64::default(),
            conflicts: AtomicU64::default(),
            retries: AtomicU64::default(),
            // 50 ms to about 3 hours: a first attempt, or retries an hour apart.
            delivery_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.05, 4.0, 12),
            ),
        }
    }
}

/// What an [`Outbox`] did since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    /// Results the aggregator accepted (200).
    pub delivered: u64,
    /// Results it refused (403).
    pub conflicts: u64,
    /// Failed attempts, scheduled again.
    pub retries: u64,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// A worker over `store` posting through `gateway`, woken by `wake`.
    pub fn new(
        store: Arc<dyn PostponedStore>,
        gateway: GatewayClient,
        config: ValidationConfig,
        clock: Clock,
        wake: Arc<Notify>,
    ) -> Self {
        let resolver = Resolver::new(Arc::clone(&store), clock, Arc::clone(&wake));
        Self {
            store,
            gateway,
            resolver,
            config,
            clock,
            wake,
            counts: Arc::default(),
            held_back_ms: Arc::default(),
        }
    }

    /// Until when no result is posted (the aggregator asked to wait), when that is after
    /// `now_ms`: never more than [`MAX_RETRY_AFTER`] from now, so that a wall clock set back
    /// does not stretch the wait.
    fn held_back(&self, now_ms: u64) -> Option<u64> {
        let until = self.held_back_ms.load(Ordering::Relaxed);
        (until > now_ms).then(|| until.min(now_ms.saturating_add(millis(MAX_RETRY_AFTER))))
    }

    /// The resolver whose deadline passes this outbox applies: its clones share what it
    /// knows of the validations being recorded or decided in this process.
    pub(crate) fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// Makes the worker look at the store now (a result was queued).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Results refused by the aggregator (403) since this worker started.
    pub fn conflicts(&self) -> u64 {
        self.counts.conflicts.load(Ordering::Relaxed)
    }

    /// Seconds from each delivered result's decision to its delivery, for `/metrics`.
    pub(crate) fn delivery_seconds(&self) -> Histogram {
        self.counts.delivery_seconds.clone()
    }

    /// What this worker did since it started.
    pub fn counts(&self) -> OutboxCounts {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OutboxCounts {
            delivered: load(&self.counts.delivered),
            conflicts: load(&self.counts.conflicts),
            retries: load(&self.counts.retries),
        }
    }

    /// Runs passes forever: after each, sleeps until the next piece of work falls due or a
    /// result is queued. Spawn it; it stops when its runtime does.
    pub async fn run(self) {
        loop {
            let next_ms = match self.run_once().await {
                Ok(pass) => pass.next.map(ms_from_time),
                Err(error) => {
                    tracing::error!(error = %crate::report::InLine(&error), "the outbox could not read the store; trying again");
                    Some(self.clock.now_ms().saturating_add(1000))
                }
            };
            let wait = next_ms.map_or(IDLE, |next| {
                Duration::from_millis(next.saturating_sub(self.clock.now_ms())).min(IDLE)
            });
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.wake.notified() => {}
            }
        }
    }

    /// Resolves the validations whose deadline passed, then attempts every due delivery.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot be read or written.
    pub async fn run_once(&self) -> Result<Pass, StoreError> {
        let mut pass = Pass::default();
        let deadlines = self.store.deadlines_due(self.clock.now()).await?;
        for record in deadlines.now {
            if self.expire(&record).await? {
                pass.expired += 1;
            }
        }
        // Held back: nothing posted, and what is due not even read (on PostgreSQL that read
        // leases it, keeping the instances that are not held back from posting it).
        if let Some(until) = self.held_back(self.clock.now_ms()) {
            return Ok(pass_held_back(pass, deadlines.next, until));
        }
        let due = self.store.outbox_due(self.clock.now()).await?;
        // A few at a time: one slow or hanging post does not hold up the others. Before each
        // few but the first (just leased), the leases are renewed: only what this instance
        // still holds is posted.
        for (index, chunk) in due.now.chunks(PARALLEL_POSTS).enumerate() {
            // The aggregator asked to wait (a 429 or a 503 with `Retry-After`, here or in an
            // earlier pass): nothing more is posted until then.
            if self.held_back(self.clock.now_ms()).is_some() {
                break;
            }
            let held = if index == 0 {
                None
            } else {
                let ids: Vec<ValidationId> = chunk.iter().map(|r| r.validation_id).collect();
                Some(self.store.renew_outbox_leases(&ids).await?)
            };
            let mut posts = tokio::task::JoinSet::new();
            for record in chunk.iter().filter(|r| {
                held.as_ref()
                    .is_none_or(|held| held.contains(&r.validation_id))
            }) {
                let (outbox, record) = (self.clone(), record.clone());
                posts.spawn(async move { outbox.deliver(&record).await });
            }
            // Every post of the few is awaited, whatever another's outcome: dropping the set
            // would abort posts in flight, which may have reached the aggregator, before
            // their outcome is recorded. The first failure ends the pass after them.
            let mut failed = None;
            while let Some(joined) = posts.join_next().await {
                let attempt = joined
                    .map_err(|e| StoreError::backend("a delivery task failed", e))
                    .and_then(|attempt| attempt);
                match attempt {
                    Ok(Attempt::Delivered) => pass.delivered += 1,
                    Ok(Attempt::Conflict) => pass.conflicts += 1,
                    Ok(Attempt::Retry) => pass.retried += 1,
                    Ok(Attempt::Nothing) => {}
                    Err(error) => {
                        failed.get_or_insert(error);
                    }
                }
            }
            if let Some(error) = failed {
                return Err(error);
            }
        }
        // Held back by a post of this pass: the next pass comes when the wait is over (or at
        // the next deadline), whatever is due — also more than one read takes, which would
        // otherwise be due at once, pass after pass, for the whole wait.
        if let Some(until) = self.held_back(self.clock.now_ms()) {
            return Ok(pass_held_back(pass, deadlines.next, until));
        }
        let after = self.store.outbox_due(self.clock.now()).await?;
        pass.next = match (deadlines.next, after.next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if !after.now.is_empty() {
            pass.next = Some(self.clock.now());
        }
        Ok(pass)
    }

    /// Resolves `record` with the deadline outcome; `false` if it was decided meanwhile.
    async fn expire(&self, record: &PostponedValidation) -> Result<bool, StoreError> {
        let success = self.config.deadline_outcome == DeadlineOutcome::Allow;
        let decision = super::Decision::allow_if(success, self.config.deadline_description.clone());
        match self
            .resolver
            .expire_if_past_deadline(record.validation_id, &decision)
            .await
        {
            Ok(expired) => Ok(expired),
            Err(ResolveError::Store(error)) => Err(error),
            Err(ResolveError::Conflict { .. } | ResolveError::Unknown(_)) => Ok(false),
        }
    }

    /// One delivery attempt of `record`'s result, and its outcome recorded.
    async fn deliver(&self, record: &PostponedValidation) -> Result<Attempt, StoreError> {
        let Some(result) = &record.result else {
            return Ok(Attempt::Nothing);
        };
        let Delivery::Queued { attempts, .. } = result.delivery else {
            return Ok(Attempt::Nothing);
        };
        let attempts = attempts.saturating_add(1);
        let id = record.validation_id;
        let body = PostponedValidationResult {
            validation_id: id,
            success: result.success,
            description: result.description.clone(),
        };
        let posted = self.gateway.post_validation_result(&body).await;
        // Read once the post is over: it may have taken up to the gateway's timeout (twice,
        // and a renewal, after a 401), and the next attempt waits from its end.
        let now_ms = self.clock.now_ms();
        let now = time_from_ms(now_ms);
        let (delivery, attempt) = match posted {
            Ok(()) => {
                self.counts.delivered.fetch_add(1, Ordering::Relaxed);
                let waited = (now - result.decided).to_std().unwrap_or_default();
                self.counts.delivery_seconds.observe(waited.as_secs_f64());
                tracing::info!(
                    validation_id = id.get(),
                    success = result.success,
                    attempts,
                    "validation result delivered"
                );
                (
                    Delivery::Delivered { attempts, at: now },
                    Attempt::Delivered,
                )
            }
            Err(GatewayError::Conflict { message, .. }) => {
                self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    validation_id = id.get(),
                    success = result.success,
                    message = %crate::Logged(&message),
                    "the aggregator holds a different result for this validation (403); recorded as a conflict"
                );
                let conflict = Delivery::Conflict {
                    attempts,
                    message,
                    at: now,
                };
                (conflict, Attempt::Conflict)
            }
            Err(error) => {
                self.counts.retries.fetch_add(1, Ordering::Relaxed);
                let mut wait = backoff(&self.config.retry_schedule, attempts);
                if let Some(asked) = error.retry_after() {
                    // For this result, and for every other: the aggregator is overloaded
                    // or down for a while, and a post of any result would be refused too.
                    wait = wait.max(asked);
                    let until = now_ms.saturating_add(millis(asked));
                    self.held_back_ms.fetch_max(until, Ordering::Relaxed);
                    tracing::warn!(
                        validation_id = id.get(),
                        ?asked,
                        "the aggregator asked to wait before posting again (Retry-After): no result is posted until then"
                    );
                }
                if error.is_transient() {
                    tracing::warn!(validation_id = id.get(), attempts, error = %crate::report::InLine(&error), ?wait, "delivering a validation result failed; retrying");
                } else {
                    tracing::error!(validation_id = id.get(), attempts, error = %crate::report::InLine(&error), ?wait, "delivering a validation result failed; retrying");
                }
                let retry = Delivery::Queued {
                    attempts,
                    next_attempt: time_from_ms(now_ms.saturating_add(millis(wait))),
                    last_error: Some(crate::report::InLine(&error).to_string()),
                };
                (retry, Attempt::Retry)
            }
        };
        self.store.record_delivery(id, delivery).await?;
        Ok(attempt)
    }
}

/// `pass`, held back until `until_ms`: it says so, and the next pass comes at the wait's
/// end, or at the `deadline` before it.
fn pass_held_back(mut pass: Pass, deadline: Option<DateTime<Utc>>, until_ms: u64) -> Pass {
    let until = time_from_ms(until_ms);
    pass.held_back = Some(until);
    pass.next = Some(deadline.map_or(until, |deadline| deadline.min(until)));
    pass
}

enum Attempt {
    Delivered,
    Conflict,
    Retry,
    Nothing,
}

/// The wait after failed attempt number `attempts` (1-based): the schedule's entry, the last
/// one repeating, jittered by up to ±20% so that many results do not retry in step.
fn backoff(schedule: &[Duration], attempts: u32) -> Duration {
    let index = usize::try_from(attempts.saturating_sub(1))
        .unwrap_or(usize::MAX)
        .min(schedule.len().saturating_sub(1));
    let base = schedule
        .get(index)
        .copied()
        .unwrap_or(Duration::from_secs(1));
    Duration::try_from_secs_f64(base.as_secs_f64() * (0.8 + 0.4 * unit_random())).unwrap_or(base)
}

/// A random number in [0, 1).
fn unit_random() -> f64 {
    let mut bytes = [0u8; 4];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_follows_the_schedule_with_bounded_jitter_and_repeats_the_last_wait() {
        let schedule = [1, 10, 100].map(Duration::from_secs);
        for (attempts, base) in [(1, 1), (2, 10), (3, 100), (4, 100), (50, 100)] {
            let waits: Vec<f64> = (0..20)
                .map(|_| backoff(&schedule, attempts).as_secs_f64())
                .collect();
            let base = f64::from(base);
            for wait in &waits {
                assert!(
                    (base * 0.8..=base * 1.2).contains(wait),
                    "{attempts}: {wait}"
                );
            }
            // Jittered: twenty waits are not all the same (results must not retry in step).
            assert!(
                waits.iter().any(|w| (w - waits[0]).abs() > f64::EPSILON),
                "{attempts}: {waits:?}"
            );
        }
    }
}
