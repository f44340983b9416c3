//! Which path is which endpoint, and which methods each accepts.

use http::Method;

use crate::config::PathsConfig;

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

    /// Serves the operating API under [`super::admin::ADMIN_PREFIX`] too.
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
            _ if self.admin && path.starts_with(super::admin::ADMIN_PREFIX) => Some(Route::Admin),
            _ => self
                .endpoints
                .iter()
                .find(|(p, _)| p == path)
                .map(|(_, e)| Route::Endpoint(*e)),
        }
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
