//! `/metrics`: what the server did, in the OpenMetrics 1.0 text format (which Prometheus
//! reads), encoded by `prometheus-client`.
//!
//! Names and units follow Prometheus' conventions: base units (`_seconds`), `_total` for
//! counters. Every metric is here, and `tests/monitoring_examples_name_only_real_metrics.rs`
//! holds this table, the example dashboard and alerts (`examples/monitoring/`) to what the
//! server exposes. A family with labels appears once it has a sample (the gateway's
//! errors after the first error): alert on `rate(...)`, which treats absence as none.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `payhook_request_duration_seconds{endpoint, outcome}` | histogram | how long each endpoint took to answer, from the request's arrival to its answer; `outcome`: `booked`, `held`, `duplicate` (callbacks), `allowed`, `denied`, `postponed`, `replayed` (validations), `answered` (providers), `refused` (4xx), `failed` (5xx) |
//! | `payhook_answers_total{route, status}` | counter | answers by route (`callback`, `transaction_validation`, `providers_validation`, `healthz`, `readyz`, `metrics`, `admin`, `unknown`) and status code (`other` for codes payhook does not send) |
//! | `payhook_callbacks_booked_total` | counter | callbacks whose handler acknowledged and whose mark is durable (reconciled ones included) |
//! | `payhook_callbacks_held_total` | counter | callbacks acknowledged (answered 200, durably marked) whose handler's effects held the result for a person to resolve instead of booking it ([`Booking::Held`](crate::store::Booking::Held)); the store keeps each until a person resolves it (`payhook_callbacks_held_unresolved`, alert on that) |
//! | `payhook_callbacks_duplicate_total` | counter | deliveries of an acknowledged (nonce, status): answered 200 without the handler |
//! | `payhook_callback_failures_total` | counter | deliveries whose handler failed (an error, `RetryLater`, a timeout, a panic, effects that aborted): answered 503 for a retry |
//! | `payhook_store_errors_total` | counter | requests of the aggregator answered 503 because the store could not read or write their records (a database unreachable or refusing, a sled store stopped): alert on any increase — on PostgreSQL it is the sign of an outage (`payhook_store_failed` is sled's) |
//! | `payhook_callbacks_failing` | gauge | (nonce, status) pairs whose handler failed, or whose body was refused (400), and that are not booked yet: alert on it, list them with `GET /payhook/admin/callbacks/failing` or on the inspector |
//! | `payhook_callbacks_held_unresolved` | gauge | results acknowledged but held by the merchant's effects and not resolved yet: alert while it is above 0, list them with `GET /payhook/admin/callbacks/held` (`payhook callbacks held`), resolve each with `payhook callbacks resolve` once the merchant's books are put right |
//! | `payhook_validations_total{decision}` | counter | validations decided by the handler: `allow`, `deny`, `postponed` |
//! | `payhook_validations_replayed_total` | counter | repeated validations answered from the record |
//! | `payhook_nonce_reuse_refused_total` | counter | validations refused for a nonce used for a different payment (and, in Awaitable mode, for a `validationId` used for a different payment) |
//! | `payhook_signatures_verified_total` | counter | signatures checked with the public key and found valid |
//! | `payhook_signatures_reused_total` | counter | retries whose (signature, body) verified before: no public-key operation |
//! | `payhook_signatures_refused_total{reason}` | counter | signatures refused (401) by reason: `missing`, `malformed`, `invalid` (does not verify with any configured key: forged, or a rotated key), `retired_key` (verifies only with a key taken out of `signature.keys` while the service ran: the aggregator still signs with it, or retries what it signed) |
//! | `payhook_credentials_readings_total{outcome}` | counter | readings of the configuration again for its credentials ([`Credentials`](super::Credentials): SIGHUP, the operating API's `credentials/read-again`, the merchant's own call): `taken`, or `refused` (nothing taken: the configuration could not be read or was refused) |
//! | `payhook_credentials_last_reading_refused` | gauge | 1 while the latest of those readings was refused, until one is taken: the service runs with the credentials read before — a rotation asked for did not happen; the log's error-level line says why |
//! | `payhook_store_failed` | gauge | 1 once the store stopped after a write it could not make durable, or a commit that panicked (the instance answers 503 until restarted) |
//! | `payhook_store_commit_duration_seconds` | histogram | how long the store took to make a batch of writes durable: sled's group commit (a batch built, applied, flushed, `fdatasync`ed); on PostgreSQL a callback's booking (its writes and COMMIT) |
//! | `payhook_store_commit_batch_size` | histogram | writes (requests) made durable together in one commit (always 1 on PostgreSQL: a transaction per booking) |
//! | `payhook_outbox_delivered_total`, `_conflicts_total`, `_retries_total` | counter | postponed results delivered (200), refused (403), retried |
//! | `payhook_outbox_queued` | gauge | postponed results waiting for delivery |
//! | `payhook_outbox_oldest_queued_age_seconds` | gauge | how long the oldest result waiting for delivery has waited since its decision (0: none waits) |
//! | `payhook_outbox_delivery_duration_seconds` | histogram | from a result's decision to its delivery to the aggregator |
//! | `payhook_gateway_call_duration_seconds{call}` | histogram | how long calls to the aggregator took: `login`, `refresh`, `validation_result` (the outbox's posts), `transaction` (lookups, reconcile) |
//! | `payhook_gateway_errors_total{call, kind}` | counter | calls to the aggregator that failed, by `kind`: `network`, `timeout`, `status` (an unexpected answer), `decode`, `bad_credentials`, `conflict` (403 to a result: the aggregator holds another), `not_configured`, `other` |
//! | `payhook_connections_open` | gauge | connections being served (when served by [`crate::serve`]) |
//! | `payhook_connections_shed_total{reason}` | counter | connections closed to keep slots for work: `idle` (no request for `server.idle_timeout`), `least_active` (the server was full), `address_limit` (its address held `server.max_connections_per_address`), `slow_body` (a body below `server.min_body_rate`, answered 408), `body_memory` (a body arriving for longer than `server.min_body_rate_grace` gave its part of `server.body_memory_limit` up to another, answered 408) |
//! | `payhook_build_info{version}` | gauge (info) | the running payhook's version, always 1 |
//!
//! `payhook_callbacks_failing`, `payhook_callbacks_held_unresolved`, `payhook_outbox_queued` and
//! `payhook_outbox_oldest_queued_age_seconds` are read from the store on each scrape; one the
//! store does not give within 2 seconds (a database unreachable or locked) is left out of
//! that scrape, and the rest is answered: alert on `absent(...)` of them beside their value.
//!
//! Only the addresses of `server.metrics_allow_ips` (default: loopback) may read it; an empty
//! list turns the route off. A scrape carrying a proxy's forwarding headers from a peer not
//! in `server.trusted_proxies` is refused (403): through a proxy on this machine left out of
//! it, every caller would look local.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::{AtomicU64, Ordering};

/// The routes counted, in the order of [`Metrics::answers`]' rows.
const ROUTES: [&str; 8] = [
    "providers_validation",
    "transaction_validation",
    "callback",
    "healthz",
    "readyz",
    "metrics",
    "admin",
    "unknown",
];

/// The statuses the server answers with; any other is counted under the last column.
const STATUSES: [u16; 16] = [
    200, 303, 400, 401, 403, 404, 405, 408, 409, 413, 415, 500, 502, 503, 504, 0,
];

/// The server's counters: plain atomics, so that counting an answer takes no lock.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Answers by route (row) and status (column).
    answers: [[AtomicU64; STATUSES.len()]; ROUTES.len()],
    pub(crate) callbacks_booked: AtomicU64,
    /// Acknowledged, but held by the handler's effects instead of booked.
    pub(crate) callbacks_held: AtomicU64,
    pub(crate) callbacks_duplicate: AtomicU64,
    /// Deliveries whose handler failed (answered 503 for a retry).
    pub(crate) callback_failures: AtomicU64,
    /// Requests answered 503 because the store failed them.
    pub(crate) store_errors: AtomicU64,
    validations: [AtomicU64; 3],
    pub(crate) validations_replayed: AtomicU64,
    pub(crate) nonce_reuse_refused: AtomicU64,
    pub(crate) signatures_verified: AtomicU64,
    pub(crate) signatures_reused: AtomicU64,
    /// Refused signatures, by [`RefusalReason`].
    signatures_refused: [AtomicU64; RefusalReason::ALL.len()],
    connections_open: AtomicU64,
    /// Readings of the configuration again (SIGHUP, the operating API, the merchant's
    /// call): taken, refused.
    credentials_readings: [AtomicU64; 2],
    /// 1 while the latest reading was refused.
    credentials_last_refused: AtomicU64,
    /// Connections shed, by [`ShedReason`].
    connections_shed: [AtomicU64; ShedReason::ALL.len()],
    /// How long endpoints took to answer, by endpoint and outcome.
    request_seconds: Family<RequestLabels, Histogram, fn() -> Histogram>,
    /// What lives as long as the server: the histograms above and `build_info`.
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let request_seconds: Family<RequestLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let mut registry = Registry::with_prefix("payhook");
        registry.register_with_unit(
            "request_duration",
            "How long the endpoints took to answer, from the request's arrival to the answer, by endpoint and outcome (booked, held, duplicate, allowed, denied, postponed, replayed, answered, refused, failed)",
            Unit::Seconds,
            request_seconds.clone(),
        );
        registry.register(
            "build",
            "The running payhook: its version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Self {
            answers: Default::default(),
            callbacks_booked: AtomicU64::default(),
            callbacks_held: AtomicU64::default(),
            callbacks_duplicate: AtomicU64::default(),
            callback_failures: AtomicU64::default(),
            store_errors: AtomicU64::default(),
            validations: Default::default(),
            validations_replayed: AtomicU64::default(),
            nonce_reuse_refused: AtomicU64::default(),
            signatures_verified: AtomicU64::default(),
            signatures_reused: AtomicU64::default(),
            signatures_refused: Default::default(),
            connections_open: AtomicU64::default(),
            credentials_readings: Default::default(),
            credentials_last_refused: AtomicU64::default(),
            connections_shed: Default::default(),
            request_seconds,
            registry,
        }
    }
}

/// Why a connection was closed by the server to keep its slots for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShedReason {
    Idle,
    LeastActive,
    AddressLimit,
    SlowBody,
    BodyMemory,
}

impl ShedReason {
    const ALL: [Self; 5] = [
        Self::Idle,
        Self::LeastActive,
        Self::AddressLimit,
        Self::SlowBody,
        Self::BodyMemory,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::LeastActive => "least_active",
            Self::AddressLimit => "address_limit",
            Self::SlowBody => "slow_body",
            Self::BodyMemory => "body_memory",
        }
    }
}

/// A validation decision, for counting.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Decision {
    Allow = 0,
    Deny = 1,
    Postponed = 2,
}

/// The outbox's counts, when the app is Awaitable.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OutboxCounts {
    pub(crate) delivered: u64,
    pub(crate) conflicts: u64,
    pub(crate) retries: u64,
    pub(crate) queued: Option<usize>,
    /// Seconds the oldest queued result has waited since its decision.
    pub(crate) oldest_queued_seconds: Option<f64>,
}

impl Metrics {
    /// Counts one answer.
    pub(crate) fn answered(&self, route: &'static str, status: u16) {
        let row = ROUTES
            .iter()
            .position(|r| *r == route)
            .unwrap_or(ROUTES.len() - 1);
        let column = STATUSES
            .iter()
            .position(|s| *s == status)
            .unwrap_or(STATUSES.len() - 1);
        self.answers[row][column].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one handler decision on a validation.
    pub(crate) fn decided(&self, decision: Decision) {
        self.validations[decision as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_shed(&self, reason: ShedReason) {
        self.connections_shed[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection entered a server's table: counted up, not set, so that one `App` served
    /// on several listeners counts the connections of all of them.
    pub(crate) fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection left a server's table (once per [`Self::connection_opened`]).
    pub(crate) fn connection_closed(&self) {
        self.connections_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// The counters an operator looks at first, for the inspector's health panel.
    pub(crate) fn at_a_glance(&self) -> Vec<(&'static str, u64)> {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("callbacks booked", load(&self.callbacks_booked)),
            ("callbacks held", load(&self.callbacks_held)),
            ("callbacks duplicate", load(&self.callbacks_duplicate)),
            ("callback failures", load(&self.callback_failures)),
            ("store errors", load(&self.store_errors)),
            (
                "validations decided",
                self.validations.iter().map(load).sum(),
            ),
            (
                "signatures refused",
                self.signatures_refused.iter().map(load).sum(),
            ),
            ("connections open", load(&self.connections_open)),
        ]
    }

    /// Counts a refused signature by why it was refused.
    pub(crate) fn refused_signature(&self, error: &crate::signature::Error) {
        let reason = match error {
            crate::signature::Error::MissingSignature(_) => RefusalReason::Missing,
            crate::signature::Error::InvalidSignature => RefusalReason::Invalid,
            crate::signature::Error::RetiredKey(_) => RefusalReason::RetiredKey,
            _ => RefusalReason::Malformed,
        };
        self.signatures_refused[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reading of the configuration again: `taken`, or refused (nothing taken).
    pub(crate) fn credentials_read(&self, taken: bool) {
        self.credentials_readings[usize::from(!taken)].fetch_add(1, Ordering::Relaxed);
        self.credentials_last_refused
            .store(u64::from(!taken), Ordering::Relaxed);
    }

    /// Observes one answered request of an endpoint: how long it took, by outcome.
    pub(crate) fn observe_request(
        &self,
        endpoint: &'static str,
        outcome: &'static str,
        seconds: f64,
    ) {
        self.request_seconds
            .get_or_create(&RequestLabels { endpoint, outcome })
            .observe(seconds);
    }

    /// The exposition text (OpenMetrics 1.0): what was counted since start, and `scrape`'s
    /// values read now.
    pub(crate) fn render(&self, scrape: &Scrape) -> String {
        let mut now = Registry::with_prefix("payhook");
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let answers = Family::<Vec<(&'static str, String)>, Counter>::default();
        for (route, row) in ROUTES.iter().zip(&self.answers) {
            for (status, count) in STATUSES.iter().zip(row) {
                let count = load(count);
                if count == 0 {
                    continue;
                }
                let status = if *status == 0 {
                    "other".to_owned()
                } else {
                    status.to_string()
                };
                answers
                    .get_or_create(&vec![("route", (*route).to_owned()), ("status", status)])
                    .inc_by(count);
            }
        }
        now.register("answers", "Answers by route and status code", answers);
        for (name, help, value) in [
            (
                "callbacks_booked",
                "Callbacks acknowledged by the handler and durably marked",
                load(&self.callbacks_booked),
            ),
            (
                "callbacks_held",
                "Callbacks acknowledged and durably marked, whose handler held the result for a person instead of booking it",
                load(&self.callbacks_held),
            ),
            (
                "callbacks_duplicate",
                "Deliveries of an acknowledged (nonce, status), answered without the handler",
                load(&self.callbacks_duplicate),
            ),
            (
                "callback_failures",
                "Deliveries whose handler failed, answered 503 for a retry",
                load(&self.callback_failures),
            ),
            (
                "store_errors",
                "Requests answered 503 because the store could not read or write their records",
                load(&self.store_errors),
            ),
            (
                "validations_replayed",
                "Repeated validations answered from the record",
                load(&self.validations_replayed),
            ),
            (
                "nonce_reuse_refused",
                "Validations refused for a nonce used for a different payment",
                load(&self.nonce_reuse_refused),
            ),
            (
                "signatures_verified",
                "Signatures checked with the public key and found valid",
                load(&self.signatures_verified),
            ),
            (
                "signatures_reused",
                "Retries whose (signature, body) verified before: no public-key operation",
                load(&self.signatures_reused),
            ),
        ] {
            now.register(name, help, ConstCounter::new(value));
        }
        // A counter per label value, from the atomics counted in the same order.
        let labelled = |label: &'static str,
                        values: &mut dyn Iterator<Item = &'static str>,
                        counts: &[AtomicU64]| {
            let family = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
            for (value, count) in values.zip(counts) {
                family
                    .get_or_create(&vec![(label, value)])
                    .inc_by(load(count));
            }
            family
        };
        now.register(
            "signatures_refused",
            "Missing, malformed or forged (invalid) signatures, and those only a key taken \
             out verifies (retired_key), answered 401, by reason",
            labelled(
                "reason",
                &mut RefusalReason::ALL.iter().map(|r| r.label()),
                &self.signatures_refused,
            ),
        );
        now.register(
            "validations",
            "Validations decided by the handler",
            labelled(
                "decision",
                &mut ["allow", "deny", "postponed"].into_iter(),
                &self.validations,
            ),
        );
        now.register(
            "credentials_readings",
            "Readings of the configuration again for its credentials (SIGHUP, the operating \
             API, the merchant's own call), by outcome: taken, or refused with nothing taken",
            labelled(
                "outcome",
                &mut ["taken", "refused"].into_iter(),
                &self.credentials_readings,
            ),
        );
        now.register(
            "credentials_last_reading_refused",
            "1 while the latest reading of the configuration again was refused: the \
             credentials are those read before it",
            ConstGauge::new(i64::from(load(&self.credentials_last_refused) == 1)),
        );
        if let Some(outbox) = &scrape.outbox {
            now.register(
                "outbox_delivered",
                "Postponed results delivered (200)",
                ConstCounter::new(outbox.delivered),
            );
            now.register(
                "outbox_conflicts",
                "Postponed results refused (403): conflicts",
                ConstCounter::new(outbox.conflicts),
            );
            now.register(
                "outbox_retries",
                "Failed delivery attempts, scheduled again",
                ConstCounter::new(outbox.retries),
            );
            if let Some(queued) = outbox.queued {
                now.register(
                    "outbox_queued",
                    "Postponed results waiting for delivery",
                    gauge(queued),
                );
            }
            if let Some(age) = outbox.oldest_queued_seconds {
                now.register_with_unit(
                    "outbox_oldest_queued_age",
                    "How long the oldest result waiting for delivery has waited since it was decided (0: none waits)",
                    Unit::Seconds,
                    ConstGauge::new(age),
                );
            }
        }
        if let Some(failing) = scrape.failing {
            now.register(
                "callbacks_failing",
                "Callbacks (nonce, status) whose handler failed or whose body was refused, not booked yet",
                gauge(failing),
            );
        }
        if let Some(held) = scrape.held {
            now.register(
                "callbacks_held_unresolved",
                "Results acknowledged but held by the merchant's effects, not resolved yet",
                gauge(held),
            );
        }
        if let Some(failed) = scrape.store_failed {
            now.register(
                "store_failed",
                "1 when the store stopped after a write it could not make durable (restart the instance)",
                ConstGauge::new(i64::from(failed)),
            );
        }
        now.register(
            "connections_open",
            "Connections being served",
            ConstGauge::new(i64::try_from(load(&self.connections_open)).unwrap_or(i64::MAX)),
        );
        now.register(
            "connections_shed",
            "Connections closed to keep slots for work, by reason",
            labelled(
                "reason",
                &mut ShedReason::ALL.iter().map(|r| r.label()),
                &self.connections_shed,
            ),
        );
        for (name, help, unit, histogram) in &scrape.histograms {
            match unit {
                Some(unit) => now.register_with_unit(*name, *help, unit.clone(), histogram.clone()),
                None => now.register(*name, *help, histogram.clone()),
            }
        }
        if let Some(gateway) = &scrape.gateway {
            now.register_with_unit(
                "gateway_call_duration",
                "How long calls to the aggregator took, by call (login, refresh, validation_result, transaction), failed ones included",
                Unit::Seconds,
                gateway.seconds.clone(),
            );
            now.register(
                "gateway_errors",
                "Calls to the aggregator that failed, by call and kind (network, timeout, status, decode, bad_credentials, conflict, not_configured)",
                gateway.errors.clone(),
            );
        }
        let mut out = String::new();
        // Writing to a `String` cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &now);
        let _ = encode_eof(&mut out);
        out
    }
}

/// A gauge of a count.
fn gauge(count: usize) -> ConstGauge {
    ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX))
}

/// What a scrape reads from beyond the counters: the outbox, the store, and histograms kept
/// by other parts (the store's commits, the outbox's deliveries).
#[derive(Default)]
pub(crate) struct Scrape {
    pub(crate) outbox: Option<OutboxCounts>,
    pub(crate) failing: Option<usize>,
    pub(crate) held: Option<usize>,
    pub(crate) store_failed: Option<bool>,
    pub(crate) histograms: Vec<(&'static str, &'static str, Option<Unit>, Histogram)>,
    /// The gateway client's calls, when the app has one.
    pub(crate) gateway: Option<crate::gateway::GatewayMetrics>,
}

/// Why a signature was refused.
#[derive(Debug, Clone, Copy)]
enum RefusalReason {
    Missing = 0,
    Malformed = 1,
    Invalid = 2,
    /// Verified only by a key taken out of `signature.keys` while the service ran.
    RetiredKey = 3,
}

impl RefusalReason {
    const ALL: [Self; 4] = [
        Self::Missing,
        Self::Malformed,
        Self::Invalid,
        Self::RetiredKey,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::Invalid => "invalid",
            Self::RetiredKey => "retired_key",
        }
    }
}

/// The labels of `payhook_request_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    outcome: &'static str,
}

/// Bounds of the latency histograms, in seconds: 0.5 ms to 60 s, so that an answer at
/// `server.handler_timeout` (20 s by default; a gateway call's timeout, twice after a 401)
/// falls in a bucket of its own rather than `+Inf`.
pub(crate) const LATENCY_BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
    30.0, 60.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_as_prometheus_text() {
        let metrics = Metrics::default();
        metrics.answered("callback", 200);
        metrics.answered("callback", 200);
        metrics.answered("callback", 401);
        metrics.answered("admin", 303);
        metrics.decided(Decision::Deny);
        metrics.callbacks_booked.fetch_add(1, Ordering::Relaxed);
        metrics.refused_signature(&crate::signature::Error::InvalidSignature);
        metrics.observe_request("callback", "booked", 0.003);
        let text = metrics.render(&Scrape {
            outbox: Some(OutboxCounts {
                delivered: 3,
                queued: Some(2),
                oldest_queued_seconds: Some(1.5),
                ..OutboxCounts::default()
            }),
            failing: Some(1),
            held: Some(2),
            store_failed: Some(false),
            histograms: Vec::new(),
            gateway: None,
        });
        for line in [
            "payhook_callbacks_failing 1",
            "payhook_callbacks_held_unresolved 2",
            "payhook_answers_total{route=\"callback\",status=\"200\"} 2",
            "payhook_answers_total{route=\"callback\",status=\"401\"} 1",
            "payhook_validations_total{decision=\"deny\"} 1",
            "payhook_callbacks_booked_total 1",
            "payhook_outbox_delivered_total 3",
            "payhook_outbox_queued 2",
            "# TYPE payhook_outbox_queued gauge",
            "payhook_outbox_oldest_queued_age_seconds 1.5",
            "payhook_signatures_refused_total{reason=\"invalid\"} 1",
            "payhook_store_failed 0",
            "payhook_request_duration_seconds_count{endpoint=\"callback\",outcome=\"booked\"} 1",
            "payhook_request_duration_seconds_bucket{le=\"0.005\",endpoint=\"callback\",outcome=\"booked\"} 1",
            "payhook_request_duration_seconds_bucket{le=\"20.0\",endpoint=\"callback\",outcome=\"booked\"} 1",
            "payhook_answers_total{route=\"admin\",status=\"303\"} 1",
            "payhook_build_info{version=\"0.1.0\"} 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
