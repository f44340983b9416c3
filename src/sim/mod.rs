//! Local webhook testing: a simulated aggregator that runs offline.
//!
//! * [`MockGateway`] — the aggregator's own endpoints (login, refresh with real JWTs,
//!   postponed validation results, transaction lookup) on loopback, for a merchant's gateway
//!   client and its whole flow.
//!
//! The `payhook mock-gateway` command is a thin layer over this module.

mod jwt;
mod mock_gateway;

pub use mock_gateway::{MockCounters, MockGateway, MockGatewayConfig};

/// Why the simulator could not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SimError {
    /// Starting a server or opening its state failed.
    #[error("{0}")]
    Setup(String),
}
