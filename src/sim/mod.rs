//! Local webhook testing: a simulated aggregator that runs offline.
//!
//! * [`MockGateway`] — the aggregator's own endpoints (login, refresh with real JWTs,
//!   postponed validation results, transaction lookup) on loopback, for a merchant's gateway
//!   client and its whole flow; [`MockControl`] reaches one running in another process.
//! * [`Payment`] and [`set`] — the aggregator's three requests, built from typed values or a
//!   JSON file with overrides, amounts written exactly.
//! * [`Trigger`] — sends them to a merchant's endpoints, signed by a [`Signer`] as the
//!   aggregator signs, and reports each [`Exchange`].
//! * [`deliver_callback`] — callback delivery as spec 6 describes it: recipients chosen from
//!   callback settings (2.5), up to `maxAttempts` attempts on a [`Schedule`] (real or
//!   virtual time) until the first 2xx, the outcome recorded on the mock gateway.
//! * [`inject`] — fault injection: duplicates, concurrency, tampering, a wrong key,
//!   reordered results, slow bodies, dropped connections, reused nonces; each with a
//!   [`Verdict`] on whether the merchant answered as a correct receiver does.
//! * [`scenario`] — scripted end-to-end flows in TOML, with expectations and a story.
//! * [`example_merchant`] — the merchant the demo and the shipped scenarios run against: a
//!   ledger booked exactly once, limits, and a review of postponed validations.
//!
//! The `payhook mock-gateway` and `payhook trigger` commands are thin layers over this module.

mod delivery;
pub mod example_merchant;
mod faults;
mod jwt;
mod mock_gateway;
mod request;
pub mod scenario;
mod trigger;

pub use delivery::{Attempt, Delivery, Report, Schedule, deliver, deliver_callback, recipients};
pub use faults::{Fault, Verdict, inject};
pub use mock_gateway::{
    DEFAULT_PASSWORD, DEFAULT_USERNAME, MockControl, MockCounters, MockGateway, MockGatewayConfig,
    ValidationPosts,
};
pub use request::{Payment, RequestKind, set, to_text};
pub use trigger::{Exchange, Signer, Trigger};

/// Why the simulator could not do what was asked: what it was doing, with the error beneath
/// (when there is one) as the [`source`](std::error::Error::source).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// Starting a server or opening its state failed.
    #[error("{context}")]
    Setup {
        /// What failed.
        context: String,
        /// The error beneath.
        #[source]
        source: Option<crate::gateway::Cause>,
    },
    /// A request could not be built or signed, or a scenario or setting is not valid.
    #[error("{context}")]
    Request {
        /// What is wrong.
        context: String,
        /// The error beneath.
        #[source]
        source: Option<crate::gateway::Cause>,
    },
    /// The mock gateway could not be reached or answered strangely.
    #[error("mock gateway: {context}")]
    Gateway {
        /// What went wrong.
        context: String,
        /// The error beneath.
        #[source]
        source: Option<crate::gateway::Cause>,
    },
    /// A call to the gateway failed.
    #[error(transparent)]
    Client(#[from] crate::gateway::GatewayError),
}

impl SimError {
    pub(crate) fn setup(context: impl Into<String>) -> Self {
        Self::Setup {
            context: context.into(),
            source: None,
        }
    }

    pub(crate) fn request(context: impl Into<String>) -> Self {
        Self::Request {
            context: context.into(),
            source: None,
        }
    }

    pub(crate) fn gateway(context: impl Into<String>) -> Self {
        Self::Gateway {
            context: context.into(),
            source: None,
        }
    }

    /// This error, caused by `cause`.
    pub(crate) fn because(
        mut self,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let cause = Some(std::sync::Arc::from(cause.into()));
        match &mut self {
            Self::Setup { source, .. }
            | Self::Request { source, .. }
            | Self::Gateway { source, .. } => *source = cause,
            Self::Client(_) => {}
        }
        self
    }
}
