//! `/metrics`: what the server did, as Prometheus text (exposition format 0.0.4).
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `payhook_answers_total{route, status}` | counter | answers by route (`callback`, `transaction_validation`, `providers_validation`, `healthz`, `readyz`, `metrics`, `admin`, `unknown`) and status code (`other` for codes payhook does not send) |
//! | `payhook_callbacks_booked_total` | counter | callbacks whose handler acknowledged and whose mark is durable (reconciled ones included) |
//! | `payhook_callbacks_duplicate_total` | counter | deliveries of an acknowledged (nonce, status): answered 200 without the handler |
//! | `payhook_callback_failures_total` | counter | deliveries whose handler failed (an error, `RetryLater`, a timeout, a panic, effects that aborted): answered 503 for a retry |
//! | `payhook_callbacks_failing` | gauge | (nonce, status) pairs whose handler failed and that are not booked yet: alert on it, list them with `GET /payhook/admin/callbacks/failing` |
//! | `payhook_validations_total{decision}` | counter | validations decided by the handler: `allow`, `deny`, `postponed` |
//! | `payhook_validations_replayed_total` | counter | repeated validations answered from the record |
//! | `payhook_nonce_reuse_refused_total` | counter | validations refused for a nonce used for a different payment |
//! | `payhook_signatures_verified_total` | counter | signatures checked with the public key and found valid |
//! | `payhook_signatures_reused_total` | counter | retries whose (signature, body) verified before: no public-key operation |
//! | `payhook_signatures_refused_total` | counter | missing, malformed or forged signatures (401) |
//! | `payhook_outbox_delivered_total`, `_conflicts_total`, `_retries_total` | counter | postponed results delivered (200), refused (403), retried |
//! | `payhook_outbox_queued` | gauge | postponed results waiting for delivery |
//! | `payhook_connections_open` | gauge | connections being served (when served by [`crate::serve`]) |
//! | `payhook_connections_shed_total{reason}` | counter | connections closed to keep slots for work: `idle` (no request for `server.idle_timeout`), `least_active` (the server was full), `address_limit` (its address held `server.max_connections_per_address`), `slow_body` (a body below `server.min_body_rate`, answered 408) |
//!
//! Only the addresses of `server.metrics_allow_ips` (default: loopback) may read it; an empty
//! list turns the route off.

use std::{
    fmt::Write as _,
    sync::atomic::{AtomicU64, Ordering},
};

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
const STATUSES: [u16; 15] = [
    200, 400, 401, 403, 404, 405, 408, 409, 413, 415, 500, 502, 503, 504, 0,
];

/// The server's counters: plain atomics, so that counting an answer takes no lock.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Answers by route (row) and status (column).
    answers: [[AtomicU64; STATUSES.len()]; ROUTES.len()],
    pub(crate) callbacks_booked: AtomicU64,
    pub(crate) callbacks_duplicate: AtomicU64,
    /// Deliveries whose handler failed (answered 503 for a retry).
    pub(crate) callback_failures: AtomicU64,
    validations: [AtomicU64; 3],
    pub(crate) validations_replayed: AtomicU64,
    pub(crate) nonce_reuse_refused: AtomicU64,
    pub(crate) signatures_verified: AtomicU64,
    pub(crate) signatures_reused: AtomicU64,
    pub(crate) signatures_refused: AtomicU64,
    connections_open: AtomicU64,
    /// Connections shed, by [`ShedReason`].
    connections_shed: [AtomicU64; ShedReason::ALL.len()],
}

/// Why a connection was closed by the server to keep its slots for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShedReason {
    Idle,
    LeastActive,
    AddressLimit,
    SlowBody,
}

impl ShedReason {
    const ALL: [Self; 4] = [
        Self::Idle,
        Self::LeastActive,
        Self::AddressLimit,
        Self::SlowBody,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::LeastActive => "least_active",
            Self::AddressLimit => "address_limit",
            Self::SlowBody => "slow_body",
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

    pub(crate) fn set_connections_open(&self, open: usize) {
        self.connections_open.store(open as u64, Ordering::Relaxed);
    }

    /// The counters an operator looks at first, for the inspector's health panel.
    pub(crate) fn at_a_glance(&self) -> Vec<(&'static str, u64)> {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("callbacks booked", load(&self.callbacks_booked)),
            ("callbacks duplicate", load(&self.callbacks_duplicate)),
            ("callback failures", load(&self.callback_failures)),
            (
                "validations decided",
                self.validations.iter().map(load).sum(),
            ),
            ("signatures refused", load(&self.signatures_refused)),
            ("connections open", load(&self.connections_open)),
        ]
    }

    /// The exposition text.
    pub(crate) fn render(&self, outbox: Option<OutboxCounts>, failing: Option<usize>) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            "payhook_answers_total",
            "counter",
            "Answers by route and status code.",
        );
        let mut text = String::new();
        for (route, row) in ROUTES.iter().zip(&self.answers) {
            for (status, count) in STATUSES.iter().zip(row) {
                let count = count.load(Ordering::Relaxed);
                if count == 0 {
                    continue;
                }
                let status = if *status == 0 {
                    "other".to_owned()
                } else {
                    status.to_string()
                };
                let _ = writeln!(
                    text,
                    "payhook_answers_total{{route=\"{route}\",status=\"{status}\"}} {count}"
                );
            }
        }
        out.push_str(&text);
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let single = [
            (
                "payhook_callbacks_booked_total",
                "Callbacks acknowledged by the handler and durably marked.",
                load(&self.callbacks_booked),
            ),
            (
                "payhook_callbacks_duplicate_total",
                "Deliveries of an acknowledged (nonce, status), answered without the handler.",
                load(&self.callbacks_duplicate),
            ),
            (
                "payhook_callback_failures_total",
                "Deliveries whose handler failed, answered 503 for a retry.",
                load(&self.callback_failures),
            ),
            (
                "payhook_validations_replayed_total",
                "Repeated validations answered from the record.",
                load(&self.validations_replayed),
            ),
            (
                "payhook_nonce_reuse_refused_total",
                "Validations refused for a nonce used for a different payment.",
                load(&self.nonce_reuse_refused),
            ),
            (
                "payhook_signatures_verified_total",
                "Signatures checked with the public key and found valid.",
                load(&self.signatures_verified),
            ),
            (
                "payhook_signatures_reused_total",
                "Retries whose (signature, body) verified before: no public-key operation.",
                load(&self.signatures_reused),
            ),
            (
                "payhook_signatures_refused_total",
                "Missing, malformed or forged signatures (401).",
                load(&self.signatures_refused),
            ),
        ];
        for (name, help, value) in single {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP payhook_validations_total Validations decided by the handler.\n# TYPE payhook_validations_total counter"
        );
        for (decision, counter) in ["allow", "deny", "postponed"].iter().zip(&self.validations) {
            let _ = writeln!(
                out,
                "payhook_validations_total{{decision=\"{decision}\"}} {}",
                load(counter)
            );
        }
        if let Some(outbox) = outbox {
            let counters = [
                (
                    "payhook_outbox_delivered_total",
                    "Postponed results delivered (200).",
                    outbox.delivered,
                ),
                (
                    "payhook_outbox_conflicts_total",
                    "Postponed results refused (403): conflicts.",
                    outbox.conflicts,
                ),
                (
                    "payhook_outbox_retries_total",
                    "Failed delivery attempts, scheduled again.",
                    outbox.retries,
                ),
            ];
            for (name, help, value) in counters {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
                );
            }
            if let Some(queued) = outbox.queued {
                let _ = writeln!(
                    out,
                    "# HELP payhook_outbox_queued Postponed results waiting for delivery.\n# TYPE payhook_outbox_queued gauge\npayhook_outbox_queued {queued}"
                );
            }
        }
        if let Some(failing) = failing {
            let _ = writeln!(
                out,
                "# HELP payhook_callbacks_failing Callbacks (nonce, status) whose handler failed, not booked yet.\n# TYPE payhook_callbacks_failing gauge\npayhook_callbacks_failing {failing}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP payhook_connections_open Connections being served.\n# TYPE payhook_connections_open gauge\npayhook_connections_open {}\n# HELP payhook_connections_shed_total Connections closed to keep slots for work, by reason.\n# TYPE payhook_connections_shed_total counter",
            load(&self.connections_open)
        );
        for (reason, counter) in ShedReason::ALL.iter().zip(&self.connections_shed) {
            let _ = writeln!(
                out,
                "payhook_connections_shed_total{{reason=\"{}\"}} {}",
                reason.label(),
                load(counter)
            );
        }
        out
    }
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
        metrics.decided(Decision::Deny);
        metrics.callbacks_booked.fetch_add(1, Ordering::Relaxed);
        let text = metrics.render(
            Some(OutboxCounts {
                delivered: 3,
                queued: Some(2),
                ..OutboxCounts::default()
            }),
            Some(1),
        );
        for line in [
            "payhook_callbacks_failing 1",
            "payhook_answers_total{route=\"callback\",status=\"200\"} 2",
            "payhook_answers_total{route=\"callback\",status=\"401\"} 1",
            "payhook_validations_total{decision=\"deny\"} 1",
            "payhook_callbacks_booked_total 1",
            "payhook_outbox_delivered_total 3",
            "payhook_outbox_queued 2",
            "# TYPE payhook_outbox_queued gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
