//! What the calls to the aggregator cost and how they fail, for `/metrics`: a latency
//! histogram per call and a count of errors by call and kind. Shared by the clones of a
//! [`super::GatewayClient`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use std::time::Duration;

use super::GatewayError;

/// One of the client's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Call {
    Login,
    Refresh,
    ValidationResult,
    Transaction,
}

impl Call {
    fn label(self) -> &'static str {
        match self {
            Self::Login => "login",
            Self::Refresh => "refresh",
            Self::ValidationResult => "validation_result",
            Self::Transaction => "transaction",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CallLabels {
    call: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    call: &'static str,
    kind: &'static str,
}

type Histograms = Family<CallLabels, Histogram, fn() -> Histogram>;

/// The client's calls, measured.
#[derive(Debug, Clone)]
pub(crate) struct GatewayMetrics {
    pub(crate) seconds: Histograms,
    pub(crate) errors: Family<ErrorLabels, Counter>,
}

fn call_histogram() -> Histogram {
    // 5 ms to about 40 s: a call is bounded by `gateway.timeout`.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.5, 11,
    ))
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self {
            seconds: Family::new_with_constructor(call_histogram),
            errors: Family::default(),
        }
    }
}

impl GatewayMetrics {
    pub(crate) fn observe(&self, call: Call, took: Duration, error: Option<&GatewayError>) {
        let call = call.label();
        self.seconds
            .get_or_create(&CallLabels { call })
            .observe(took.as_secs_f64());
        if let Some(error) = error {
            self.errors
                .get_or_create(&ErrorLabels {
                    call,
                    kind: kind(error),
                })
                .inc();
        }
    }
}

/// The `kind` label of an error.
fn kind(error: &GatewayError) -> &'static str {
    match error {
        GatewayError::NotConfigured(_) => "not_configured",
        GatewayError::BadCredentials { .. } => "bad_credentials",
        GatewayError::Network { .. } => "network",
        GatewayError::Timeout { .. } => "timeout",
        GatewayError::Status { .. } => "status",
        GatewayError::Decode { .. } => "decode",
        GatewayError::Conflict { .. } => "conflict",
        #[allow(
            unreachable_patterns,
            reason = "GatewayError is non_exhaustive for others"
        )]
        _ => "other",
    }
}
