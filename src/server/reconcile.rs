//! Lost-callback recovery (spec 6.7): a transaction's record, fetched from the aggregator,
//! goes through the same callback handler and deduplication as a delivered callback, so a
//! result is booked once whichever arrives first — the real callback or the recovery.

use chrono::{DateTime, Utc};
use http::HeaderMap;
use std::time::Duration;
use tracing::Instrument;
use uuid::Uuid;

use super::exactly_once::{BookAfter, Delivered, ExactlyOnce};
use super::problem::Problem;
use crate::gateway::{GatewayClient, GatewayError};
use crate::handler::RequestContext;
use crate::model::{TransactionRecord, TransactionStatus};

/// What became of one reference id in [`App::reconcile`](super::App::reconcile).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reconciled {
    /// The result was booked now: its callback had been lost.
    Booked(TransactionStatus),
    /// The result was acknowledged now (its callback had been lost), but the handler's
    /// effects held it for a person to resolve instead of booking it
    /// ([`Booking::Held`](crate::store::Booking::Held)).
    Held {
        /// The status read and acknowledged.
        status: TransactionStatus,
        /// Why the handler held it.
        reason: String,
    },
    /// The result was acknowledged before (its callback arrived): nothing done. Booked
    /// then, as far as the store tells: a held result it keeps is [`Reconciled::AlreadyHeld`]
    /// (one held before payhook kept them, or in a store of the merchant's own that keeps
    /// none, reads as this; the merchant's records say).
    AlreadyBooked(TransactionStatus),
    /// The result was acknowledged before, but the handler's effects held it for a person
    /// to resolve: nothing done. Whether a person has, and what they said
    /// ([`DedupStore::resolve_held`](crate::store::DedupStore::resolve_held)), is in `held`.
    AlreadyHeld {
        /// The status acknowledged and held.
        status: TransactionStatus,
        /// The held result as the store keeps it.
        held: Box<crate::store::HeldCallback>,
    },
    /// The transaction is still in progress (a status the spec defines, 0 to 3): no
    /// callback is due; nothing done. A status the spec does not define is handed to the
    /// handler, as its callback would be.
    NotFinal(TransactionStatus),
}

/// Why a reference id could not be reconciled.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The lookup failed (unknown reference id, network, ...).
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// The app serves no callback endpoint: there is nothing to book with.
    #[error("the app has no callback receiver")]
    NoReceiver,
    /// The handler did not book it (it failed, or asked to retry later); reconcile again
    /// later.
    #[error("not booked: {0}")]
    NotBooked(String),
    /// Whether it was booked is not known: the store failed while the booking was recorded
    /// (a commit whose outcome is not known), or another delivery of the transaction was
    /// still being booked. Reconcile again to see: it books nothing twice; booking it by
    /// hand meanwhile could book it twice.
    #[error(
        "outcome unknown ({0}): it may have been booked; reconcile again to see (it books nothing twice), and do not book it by hand meanwhile"
    )]
    OutcomeUnknown(String),
    /// The aggregator's record is not a result that can be booked: what a callback would be
    /// refused for with 400 (a negative amount, no `merchantClientId`, a blank nonce), or an
    /// answer about another reference id.
    #[error("not a result that can be booked: {0}")]
    Implausible(String),
    /// The app keeps no deduplication records (`without_store`): booking from the lookup
    /// could book a result its callback booked already.
    #[error("reconcile needs the store's deduplication records; the app runs without a store")]
    NoStore,
    /// The transaction was created before the store's retention, less an allowance for
    /// clock skew: its result may have been booked that long ago and its deduplication
    /// record purged since, so whether its callback was booked can no longer be told. Check
    /// the merchant's own books instead.
    #[error(
        "the transaction was created {created}, beyond the store's retention: whether it was booked cannot be told; not booked again"
    )]
    BeyondRetention {
        /// The transaction's `createdUtc`.
        created: DateTime<Utc>,
    },
    /// The aggregator's record carries no `createdUtc`: when its result may have been
    /// booked, and so whether its booking's record may have been purged, cannot be told.
    /// Not booked, as for a record beyond the retention.
    #[error(
        "the transaction's record has no createdUtc: whether it was booked cannot be told; not booked"
    )]
    UnknownAge,
}

/// Allowance for the aggregator's and this machine's clocks disagreeing, at most: a tenth of
/// the retention up to a day. Wider than a delivered callback's (a tenth of the retention, at
/// most an hour): a reconcile books what the aggregator's lookup says long after the fact,
/// on an operator's request, and an operator can book by hand what it refuses. A fixed day
/// left nothing of a retention of a day or less: every reconcile was refused.
const CLOCK_SKEW: Duration = Duration::from_secs(24 * 3600);

impl ExactlyOnce {
    /// [`App::reconcile`](super::App::reconcile): each transaction in turn, logged.
    pub(super) async fn reconcile_all(
        &self,
        gateway: &GatewayClient,
        reference_ids: &[Uuid],
        max_chars: usize,
    ) -> Vec<(Uuid, Result<Reconciled, ReconcileError>)> {
        let mut outcomes = Vec::with_capacity(reference_ids.len());
        for &reference_id in reference_ids {
            let span = tracing::info_span!("reconcile", %reference_id);
            let outcome = self
                .reconcile(gateway, reference_id, max_chars)
                .instrument(span.clone())
                .await;
            span.in_scope(|| match &outcome {
                Ok(done) => tracing::info!(?done, "reconciled"),
                Err(error) => {
                    tracing::warn!(error = %crate::report::InLine(error), "not reconciled")
                }
            });
            outcomes.push((reference_id, outcome));
        }
        outcomes
    }

    /// Books the result of one transaction fetched from the aggregator through the callback
    /// handler and the same records as its callbacks.
    async fn reconcile(
        &self,
        gateway: &GatewayClient,
        reference_id: Uuid,
        max_chars: usize,
    ) -> Result<Reconciled, ReconcileError> {
        if !self.receives_callbacks() {
            return Err(ReconcileError::NoReceiver);
        }
        if self.store().is_none() {
            return Err(ReconcileError::NoStore);
        }
        let mut record = gateway.transaction(reference_id).await?;
        // The status booked when the record was read, as far as is known: none at first.
        let mut read_after = ReadAfter(None);
        for _ in 0..READINGS {
            match self
                .reconcile_record(reference_id, &record, read_after, max_chars)
                .await?
            {
                Reading::Done(reconciled) => return Ok(reconciled),
                // Read after the claim saw `booked`: what the record says now is booked
                // after it, whatever it is — unless yet another status is booked meanwhile.
                Reading::Overtaken(booked) => {
                    tracing::info!(
                        looked_up = record.transaction_status.code(),
                        booked = booked.code(),
                        "another status of the transaction was booked before the one looked up \
                         could be; reading the record again"
                    );
                    record = gateway.transaction(reference_id).await?;
                    read_after = ReadAfter(Some(booked));
                }
            }
        }
        Err(ReconcileError::NotBooked(format!(
            "another status of the transaction was booked at each of {READINGS} readings of its \
             record while it was reconciled; reconcile it again"
        )))
    }

    /// Books the result `record` says, fetched from the aggregator through the callback
    /// handler and the same records as its callbacks — after `read_after` (see
    /// [`ReadAfter`]).
    async fn reconcile_record(
        &self,
        reference_id: Uuid,
        record: &TransactionRecord,
        read_after: ReadAfter,
        max_chars: usize,
    ) -> Result<Reading, ReconcileError> {
        let Some(store) = self.store() else {
            return Err(ReconcileError::NoStore);
        };
        if record.transaction_reference_id != reference_id {
            return Err(ReconcileError::Implausible(format!(
                "the lookup of {reference_id} answered with transaction {}",
                record.transaction_reference_id
            )));
        }
        let status = record.transaction_status;
        if status.in_progress() {
            return Ok(Reading::Done(Reconciled::NotFinal(status)));
        }
        // What is booked is told so, whatever the record lacks; what is not is booked only
        // when its record proves it never was (see `untellable`) and it can be booked.
        let booking = match (
            untellable(record, store.reach()),
            bookable(record, max_chars),
        ) {
            (None, Ok(callback)) => Ok(callback),
            (Some(untold), _) => Err(untold),
            (None, Err(why)) => Err(ReconcileError::Implausible(why)),
        };
        let callback = match booking {
            Ok(callback) => callback,
            Err(refused) => {
                let booked = store.callback_acknowledged(&record.nonce, status).await;
                return match booked {
                    Ok(true) => already(store.as_ref(), &record.nonce, status)
                        .await
                        .map(Reading::Done),
                    _ => Err(refused),
                };
            }
        };
        let request = RequestContext {
            request_id: format!("reconcile-{reference_id}"),
            peer: None,
            received_at: Utc::now(),
            headers: HeaderMap::new(),
        };
        let done = match self.deliver_after(callback, request, read_after).await {
            Ok(Ok(Delivered::Booked)) => Reconciled::Booked(status),
            Ok(Ok(Delivered::Held(reason))) => Reconciled::Held { status, reason },
            Ok(Ok(Delivered::Duplicate)) => already(store.as_ref(), &record.nonce, status).await?,
            Ok(Err(Overtaken(booked))) => return Ok(Reading::Overtaken(booked)),
            Err(problem @ (Problem::StoreFailed { .. } | Problem::InFlight { .. })) => {
                return Err(ReconcileError::OutcomeUnknown(problem.message()));
            }
            Err(problem) => return Err(ReconcileError::NotBooked(problem.message())),
        };
        Ok(Reading::Done(done))
    }
}

/// What a result acknowledged before is: held (resolved or not), when the store keeps it
/// so, or else booked — as far as a store that keeps no held results can tell.
///
/// # Errors
///
/// [`ReconcileError::OutcomeUnknown`] when the store could not say whether it is held: told
/// booked, a quarantined payment would be taken for one in the books.
async fn already(
    store: &dyn crate::store::Store,
    nonce: &crate::model::Nonce,
    status: TransactionStatus,
) -> Result<Reconciled, ReconcileError> {
    match store.held_callback(nonce, status).await {
        Ok(Some(held)) => Ok(Reconciled::AlreadyHeld {
            status,
            held: Box::new(held),
        }),
        Ok(None) => Ok(Reconciled::AlreadyBooked(status)),
        Err(error) => Err(ReconcileError::OutcomeUnknown(format!(
            "acknowledged before ({status}), but whether the merchant held it could not be read: {}",
            crate::report::InLine(&error)
        ))),
    }
}

/// How many times a reconcile reads a transaction's record while other statuses of it are
/// booked before the one read can be, before it gives up (nothing booked).
const READINGS: usize = 3;

/// What one reading of the aggregator's record came to.
enum Reading {
    Done(Reconciled),
    /// Another status was booked before the one read could be: see [`ReadAfter`].
    Overtaken(TransactionStatus),
}

/// The status booked (as far as the reconcile knows) when the aggregator's record was read:
/// the record's status is booked only after it. A lookup that read −4 just before the
/// aggregator moved the transaction to 4 and its callback booked 4 found 4 booked when it
/// claimed the nonce; booked then, −4 reached the handler after 4 — a booked success read as
/// reversed. The claim is given back instead (counting no attempt), and the record read
/// again (no call to the aggregator is made while a claim is held: a claim on a shared store
/// is taken over once it is held for the handler timeout and a margin).
#[derive(Debug, Clone, Copy)]
struct ReadAfter(Option<TransactionStatus>);

/// Another status, booked before the one read could be.
struct Overtaken(TransactionStatus);

impl BookAfter for ReadAfter {
    type Refused = Overtaken;

    fn book_after(&self, previous: TransactionStatus) -> Result<(), Overtaken> {
        if self.0 == Some(previous) {
            Ok(())
        } else {
            Err(Overtaken(previous))
        }
    }
}

/// The callback `record` stands for, to book; or why it cannot be booked: no client to book
/// it to (`merchantClientId` missing or blank), or what its callback would be refused for
/// (400) before any handler (see `ingress::admissible`: a blank nonce, an identifier that
/// cannot be kept, a negative amount).
pub(crate) fn bookable(
    record: &TransactionRecord,
    max_chars: usize,
) -> Result<crate::model::CallbackBody, String> {
    if record
        .merchant_client_id
        .as_deref()
        .is_none_or(super::ingress::is_blank)
    {
        return Err("the record names no merchantClientId to book the result to".to_owned());
    }
    let callback = record.to_callback();
    super::ingress::admissible(&callback, max_chars).map_err(|refused| refused.message())?;
    Ok(callback)
}

/// Why whether `record`'s result was booked cannot be told from a store of `retention`: a
/// callback's record is kept for the retention after it was acknowledged, which is after
/// the transaction was created — the one time the lookup gives that is known to come no
/// later than the booking (`updatedUtc` may: the aggregator's record changes after the
/// result was booked, as its callbacks' delivery is recorded, and a record booked a month
/// ago and touched yesterday would read as recent once the booking's record was purged).
/// Beyond that horizon (less a tenth of it, at most [`CLOCK_SKEW`]), or without a creation
/// time, a missing record proves nothing. `None` within it.
pub(crate) fn untellable(
    record: &TransactionRecord,
    retention: Duration,
) -> Option<ReconcileError> {
    let created = crate::model::timestamp::real(record.created_utc);
    if created.is_none() {
        return Some(ReconcileError::UnknownAge);
    }
    let horizon = retention.saturating_sub(CLOCK_SKEW.min(retention / 10));
    super::exactly_once::beyond_horizon(created, horizon)
        .map(|created| ReconcileError::BeyondRetention { created })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn created_ago(ago: chrono::TimeDelta) -> TransactionRecord {
        let created = (chrono::Utc::now() - ago).format("%Y-%m-%dT%H:%M:%SZ");
        serde_json::from_str(&format!(
            r#"{{"id":1,"transactionReferenceId":"6f0b2a3e-31c2-4f4e-9d3c-1c7e3d5f2a10",
                "nonce":"n-1","amount":1,"currency":"EUR","transactionType":1,"transactionStatus":4,"createdUtc":"{created}"}}"#
        ))
        .unwrap()
    }

    /// The allowance for clocks is at most a tenth of the retention: with a retention of a
    /// day or less a fixed day left no horizon, and every reconcile was refused.
    #[test]
    fn a_short_retention_still_tells_a_recent_change() {
        let hour = Duration::from_secs(3600);
        let recent = created_ago(chrono::TimeDelta::minutes(1));
        assert!(untellable(&recent, hour).is_none());
        assert!(untellable(&recent, 24 * hour).is_none());
        let old = created_ago(chrono::TimeDelta::minutes(58));
        assert!(matches!(
            untellable(&old, hour),
            Some(ReconcileError::BeyondRetention { .. })
        ));
        // A month's retention keeps its day of allowance.
        let month = 30 * 24 * hour;
        assert!(untellable(&created_ago(chrono::TimeDelta::days(28)), month).is_none());
        assert!(
            untellable(
                &created_ago(chrono::TimeDelta::days(29) + chrono::TimeDelta::hours(1)),
                month
            )
            .is_some()
        );
    }
}
