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
            .map(|(p, e)| (normal(p).to_owned(), e))
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
        let path = normal(path);
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

/// `path` as the router compares it: a trailing slash is tolerated, so it is left out (but
/// of `/` itself). A configured `/hooks/callback/` serves what a request for
/// `/hooks/callback` or `/hooks/callback/` asks for.
fn normal(path: &str) -> &str {
    if path.len() > 1 {
        path.strip_suffix('/').unwrap_or(path)
    } else {
        path
    }
}

/// Whether `path` (normal) lies under the operating API, which is routed before the
/// endpoints once `admin.token` or `[admin.operators]` is set: an endpoint there would stop
/// being served then.
fn under_admin(path: &str) -> bool {
    path.starts_with(ADMIN_PREFIX) || path == normal(ADMIN_PREFIX)
}

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
            } else if RESERVED_PATHS.contains(&normal(path)) {
                Some(format!("`{path}` is served by payhook itself"))
            } else if under_admin(normal(path)) {
                Some(format!(
                    "`{path}` is under {ADMIN_PREFIX}, where the operating API is served \
                     once admin.token or admin.operators is set"
                ))
            } else {
                all[..i]
                    .iter()
                    .find(|(_, other)| normal(other) == normal(path))
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
    fn a_configured_trailing_slash_routes_both_spellings() {
        let paths = PathsConfig {
            callback: "/hooks/callback/".to_owned(),
            ..PathsConfig::default()
        };
        assert_eq!(paths.validate(), Ok(()));
        let router = Router::new(&paths, |_| true);
        for path in ["/hooks/callback", "/hooks/callback/"] {
            assert_eq!(
                router.route(path),
                Some(Route::Endpoint(Endpoint::Callback)),
                "{path}"
            );
        }
    }

    #[test]
    fn endpoint_paths_that_payhook_serves_or_that_collide_are_refused() {
        let refused = |paths: PathsConfig, key: &str, why: &str| {
            let error = paths.validate().unwrap_err();
            assert_eq!(error.key, key);
            assert!(error.reason.contains(why), "{}", error.reason);
        };
        let callback = |path: &str| PathsConfig {
            callback: path.to_owned(),
            ..PathsConfig::default()
        };
        refused(callback("/metrics/"), "paths.callback", "served by payhook");
        refused(
            callback("/payhook/admin/callback"),
            "paths.callback",
            "admin.token",
        );
        refused(callback("/payhook/admin"), "paths.callback", "admin.token");
        refused(
            callback("/payhook/transaction-validation/"),
            "paths.callback",
            "same path as paths.transaction_validation",
        );
        assert_eq!(callback("/payhook/administration").validate(), Ok(()));
    }

    #[test]
    fn endpoints_without_a_handler_are_not_routed() {
        let router = Router::new(&PathsConfig::default(), |e| e == Endpoint::Callback);
        assert_eq!(router.route("/payhook/transaction-validation"), None);
    }
}
