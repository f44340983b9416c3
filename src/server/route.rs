//! Which path is which endpoint, and which methods each accepts; `[paths]`, where the three
//! endpoints are served.

use http::Method;
use serde::{Deserialize, Serialize};

use crate::setting::InvalidSetting;

/// Where the operating API lives.
pub(crate) const ADMIN_PREFIX: &str = "/payhook/admin/";

/// Liveness: 200 while the process serves.
pub(crate) const HEALTH_PATH: &str = "/healthz";
/// Readiness: 200 while accepting work, 503 once shutdown has begun.
pub(crate) const READY_PATH: &str = "/readyz";
/// Prometheus text, for the addresses of `server.metrics_allow_ips`.
pub(crate) const METRICS_PATH: &str = "/metrics";

/// One of the three merchant-hosted endpoints of spec 4.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    ProvidersValidation,
    TransactionValidation,
    Callback,
}

impl Endpoint {
    /// Name used in logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::ProvidersValidation => "providers_validation",
            Self::TransactionValidation => "transaction_validation",
            Self::Callback => "callback",
        }
    }
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Endpoint(Endpoint),
    Health,
    Ready,
    Metrics,
    Admin,
}

impl Route {
    /// The route's label in metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Endpoint(endpoint) => endpoint.name(),
            Self::Health => "healthz",
            Self::Ready => "readyz",
            Self::Metrics => "metrics",
            Self::Admin => "admin",
        }
    }

    /// Methods the route accepts, as the `Allow` header lists them.
    pub(crate) fn allow(self) -> &'static str {
        match self {
            Self::Endpoint(_) => "POST",
            Self::Health | Self::Ready | Self::Metrics => "GET, HEAD",
            Self::Admin => "GET, POST",
        }
    }

    /// `true` when `method` is one of [`Route::allow`].
    pub(crate) fn accepts(self, method: &Method) -> bool {
        match self {
            Self::Endpoint(_) => method == Method::POST,
            Self::Health | Self::Ready | Self::Metrics => {
                method == Method::GET || method == Method::HEAD
            }
            Self::Admin => method == Method::GET || method == Method::POST,
        }
    }
}

/// The routing table, built once from the configured paths; only served endpoints are in it.
#[derive(Debug, Clone)]
pub(crate) struct Router {
    endpoints: Vec<(String, Endpoint)>,
    /// The operating API is served (a token is configured).
    admin: bool,
}

impl Router {
    pub(crate) fn new(paths: &PathsConfig, served: impl Fn(Endpoint) -> bool) -> Self {
        let all = [
            (&paths.providers_validation, Endpoint::ProvidersValidation),
            (
                &paths.transaction_validation,
                Endpoint::TransactionValidation,
            ),
            (&paths.callback, Endpoint::Callback),
        ];
        let endpoints = all
            .into_iter()
            .filter(|(_, e)| served(*e))
            .map(|(p, e)| (p.clone(), e))
            .collect();
        Self {
            endpoints,
            admin: false,
        }
    }

    /// Serves the operating API under [`ADMIN_PREFIX`] too.
    pub(crate) fn with_admin(mut self) -> Self {
        self.admin = true;
        self
    }

    /// The route for `path`; a trailing slash is tolerated.
    pub(crate) fn route(&self, path: &str) -> Option<Route> {
        let path = if path.len() > 1 {
            path.strip_suffix('/').unwrap_or(path)
        } else {
            path
        };
        match path {
            HEALTH_PATH => Some(Route::Health),
            READY_PATH => Some(Route::Ready),
            METRICS_PATH => Some(Route::Metrics),
            _ if self.admin && path.starts_with(ADMIN_PREFIX) => Some(Route::Admin),
            _ => self
                .endpoints
                .iter()
                .find(|(p, _)| p == path)
                .map(|(_, e)| Route::Endpoint(*e)),
        }
    }
}

/// Paths payhook serves itself, which the endpoint paths must not take.
const RESERVED_PATHS: [&str; 3] = [HEALTH_PATH, READY_PATH, METRICS_PATH];

/// `[paths]`: where the three endpoints are served.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PathsConfig {
    /// Providers validation endpoint.
    pub providers_validation: String,
    /// Transaction validation endpoint.
    pub transaction_validation: String,
    /// Callback endpoint.
    pub callback: String,
}

impl Default for PathsConfig {
    fn default() -> Self {
        Self {
            providers_validation: "/payhook/providers-validation".to_owned(),
            transaction_validation: "/payhook/transaction-validation".to_owned(),
            callback: "/payhook/callback".to_owned(),
        }
    }
}

impl PathsConfig {
    /// Checks values that have the right type but are not acceptable.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        let all = [
            ("paths.providers_validation", &self.providers_validation),
            ("paths.transaction_validation", &self.transaction_validation),
            ("paths.callback", &self.callback),
        ];
        for (i, (key, path)) in all.iter().enumerate() {
            let reason = if !path.starts_with('/') {
                Some("must start with `/`".to_owned())
            } else if path.contains(['?', '#', ' ']) {
                Some("must be a plain path, without query, fragment or spaces".to_owned())
            } else if RESERVED_PATHS.contains(&path.as_str()) {
                Some(format!("`{path}` is served by payhook itself"))
            } else {
                all[..i]
                    .iter()
                    .find(|(_, other)| other == path)
                    .map(|(other, _)| format!("same path as {other}"))
            };
            if let Some(reason) = reason {
                return Err(InvalidSetting {
                    key: (*key).to_owned(),
                    reason,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_paths_route_to_their_endpoints() {
        let router = Router::new(&PathsConfig::default(), |_| true);
        assert_eq!(
            router.route("/payhook/callback"),
            Some(Route::Endpoint(Endpoint::Callback))
        );
        assert_eq!(
            router.route("/payhook/callback/"),
            Some(Route::Endpoint(Endpoint::Callback))
        );
        assert_eq!(router.route("/healthz"), Some(Route::Health));
        assert_eq!(router.route("/payhook"), None);
        assert_eq!(router.route("/"), None);
    }

    #[test]
    fn endpoints_without_a_handler_are_not_routed() {
        let router = Router::new(&PathsConfig::default(), |e| e == Endpoint::Callback);
        assert_eq!(router.route("/payhook/transaction-validation"), None);
    }
}
