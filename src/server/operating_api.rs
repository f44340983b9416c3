//! The operating API of a running service, under `/payhook/admin/`: what `payhook
//! validations …` and `payhook reconcile` call with `--admin-url` (sled lets only the running
//! service open its store).
//!
//! | request | answer |
//! |---|---|
//! | `GET /payhook/admin/validations[?state=pending\|queued\|delivered\|conflict]` | 200, the postponed validations (JSON array) |
//! | `POST /payhook/admin/validations/{id}` `{"success": bool, "description": "…"}` | 200 `recorded` or `unchanged`; 409 when decided differently; 404 `no postponed validation with id N` |
//! | `POST /payhook/admin/reconcile` `{"referenceIds": ["…"]}` | 200, one outcome per id |
//! | `GET /payhook/admin/callbacks/failing` | 200, the (nonce, status) pairs whose handler failed and that are not booked yet, most recent first (JSON array: nonce, status, failures, first/last failure in ms, last reason, reference id, client, amount, currency) |
//!
//! Off unless `admin.token` is set. Every call needs `Authorization: Bearer <token>`
//! (compared in constant time; 401 otherwise) from an address in `admin.allow_ips` (403).

use crate::model::ValidationId;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body::Body;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use std::sync::Arc;
use std::time::Duration;

use super::ResponseBody;
use super::exactly_once::ExactlyOnce;
use super::ingress::Ingress;
use super::problem::Problem;
use super::reconcile::Reconciled;
use super::route::ADMIN_PREFIX;
use super::settings::AdminConfig;
use crate::auth::{Cidr, Expected};
use crate::gateway::GatewayClient;
use crate::model::ErrorBody;
use crate::postponed::{Awaitable, Decision, PostponedState, ResolveError, Resolved};

/// Who may call the operating API.
pub(super) struct AdminAccess {
    token: Expected,
    allow: Vec<Cidr>,
}

impl AdminAccess {
    /// `None` when no token is configured: the API is off.
    pub(super) fn from_config(config: &AdminConfig) -> Option<Self> {
        let token = config.token.as_ref()?;
        Some(Self {
            token: Expected::new(token.expose().as_bytes()),
            allow: config
                .allow_ips
                .iter()
                .filter_map(|text| text.parse().ok())
                .collect(),
        })
    }

    fn check(&self, client: Option<std::net::IpAddr>, headers: &HeaderMap) -> Result<(), Problem> {
        if !client.is_some_and(|ip| self.allow.iter().any(|net| net.contains(ip))) {
            return Err(Problem::AddressRefused);
        }
        let presented = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(token) if self.token.matches(token.as_bytes()) => Ok(()),
            Some(_) => Err(Problem::Unauthorized {
                message: "invalid credentials".into(),
                basic: false,
            }),
            None => Err(Problem::Unauthorized {
                message: "missing credentials".into(),
                basic: false,
            }),
        }
    }
}

/// A decision sent to `POST /payhook/admin/validations/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminDecision {
    /// Whether the client may make the transaction.
    pub success: bool,
    /// The explanation sent with the result.
    #[serde(default)]
    pub description: String,
}

/// The body of `POST /payhook/admin/reconcile`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminReconcile {
    /// The transactions to recover.
    pub reference_ids: Vec<Uuid>,
}

/// One outcome of `POST /payhook/admin/reconcile`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminReconciled {
    /// The transaction.
    pub reference_id: Uuid,
    /// `booked`, `already_booked`, `not_final` or `error`.
    pub outcome: String,
    /// The transaction's status code, when it was read.
    pub status: Option<i32>,
    /// Why it failed, for `error`.
    pub message: Option<String>,
}

fn json<T: Serialize>(value: &T) -> Response<ResponseBody> {
    let mut response = Response::new(http_body_util::Full::new(Bytes::from(
        serde_json::to_vec(value).unwrap_or_default(),
    )));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// The operating API with what it operates on: the Awaitable validations, the store's
/// records and the reconcile of exactly-once delivery, and the gateway. Built by the app's
/// builder when `admin.token` is set.
pub(super) struct OperatingApi {
    access: AdminAccess,
    ingress: Arc<Ingress>,
    exactly_once: ExactlyOnce,
    awaitable: Option<Arc<Awaitable>>,
    gateway: Option<GatewayClient>,
    retry_after: Duration,
}

impl OperatingApi {
    pub(super) fn new(
        access: AdminAccess,
        ingress: Arc<Ingress>,
        exactly_once: ExactlyOnce,
        awaitable: Option<Arc<Awaitable>>,
        gateway: Option<GatewayClient>,
        retry_after: Duration,
    ) -> Self {
        Self {
            access,
            ingress,
            exactly_once,
            awaitable,
            gateway,
            retry_after,
        }
    }

    /// Answers a call of the operating API.
    pub(super) async fn answer<B>(
        &self,
        request: Request<B>,
    ) -> Result<Response<ResponseBody>, Problem>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.access
            .check(self.ingress.client_ip(&request), request.headers())?;
        let (parts, body) = request.into_parts();
        let rest = parts
            .uri
            .path()
            .trim_start_matches(ADMIN_PREFIX)
            .trim_end_matches('/');
        let segments: Vec<&str> = rest.split('/').collect();
        match (&parts.method, segments.as_slice()) {
            (&Method::GET, ["validations"]) => {
                let state = match parts.uri.query().and_then(|q| q.strip_prefix("state=")) {
                    None => None,
                    Some("pending") => Some(PostponedState::Pending),
                    Some("queued") => Some(PostponedState::Queued),
                    Some("delivered") => Some(PostponedState::Delivered),
                    Some("conflict") => Some(PostponedState::Conflict),
                    Some(other) => {
                        return Err(Problem::BadRequest(format!(
                            "state `{other}`: use pending, queued, delivered or conflict"
                        )));
                    }
                };
                let resolver = self
                    .awaitable
                    .as_ref()
                    .map(|a| a.resolver())
                    .ok_or(Problem::NotFound)?;
                let list = resolver
                    .list(state)
                    .await
                    .map_err(|e| self.admin_store_failed(&e))?;
                Ok(json(&list))
            }
            (&Method::POST, ["validations", id]) => {
                let id: ValidationId = id
                    .parse()
                    .map_err(|_| Problem::BadRequest(format!("`{id}` is not a validation id")))?;
                let bytes = self.ingress.read_body(&parts, body).await?;
                let decision: AdminDecision = super::request::parse_json(&bytes)?;
                let resolver = self
                    .awaitable
                    .as_ref()
                    .map(|a| a.resolver())
                    .ok_or(Problem::NotFound)?;
                match resolver
                    .resolve(
                        id,
                        Decision::allow_if(decision.success, decision.description),
                    )
                    .await
                {
                    Ok(Resolved::Recorded) => Ok(json(&ErrorBody::new("recorded"))),
                    Ok(Resolved::Unchanged) => Ok(json(&ErrorBody::new("unchanged"))),
                    Err(error @ ResolveError::Conflict { .. }) => {
                        Err(Problem::Conflict(error.to_string()))
                    }
                    Err(error @ ResolveError::Unknown(_)) => {
                        Err(Problem::Unknown(error.to_string()))
                    }
                    Err(ResolveError::Store(error)) => Err(self.admin_store_failed(&error)),
                }
            }
            (&Method::GET, ["callbacks", "failing"]) => {
                let store = self.exactly_once.store().ok_or(Problem::NotFound)?;
                let failing = store
                    .failing_callbacks()
                    .await
                    .map_err(|e| self.admin_store_failed(&e))?;
                Ok(json(&failing))
            }
            (&Method::POST, ["reconcile"]) => {
                let bytes = self.ingress.read_body(&parts, body).await?;
                let request: AdminReconcile = super::request::parse_json(&bytes)?;
                let gateway = self.gateway.as_ref().ok_or_else(|| {
                    Problem::Conflict("reconcile needs a complete [gateway] section".into())
                })?;
                let outcomes = self
                    .exactly_once
                    .reconcile_all(gateway, &request.reference_ids)
                    .await
                    .into_iter()
                    .map(|(reference_id, outcome)| {
                        let (outcome, status, message) = match outcome {
                            Ok(Reconciled::Booked(s)) => ("booked", Some(s.code()), None),
                            Ok(Reconciled::AlreadyBooked(s)) => {
                                ("already_booked", Some(s.code()), None)
                            }
                            Ok(Reconciled::NotFinal(s)) => ("not_final", Some(s.code()), None),
                            Err(error) => (
                                "error",
                                None,
                                Some(crate::report::InLine(&error).to_string()),
                            ),
                        };
                        AdminReconciled {
                            reference_id,
                            outcome: outcome.into(),
                            status,
                            message,
                        }
                    })
                    .collect::<Vec<_>>();
                Ok(json(&outcomes))
            }
            (_, ["callbacks", "failing"]) => Err(Problem::MethodNotAllowed { allow: "GET" }),
            (_, ["validations"] | ["validations", _] | ["reconcile"]) => {
                Err(Problem::MethodNotAllowed { allow: "GET, POST" })
            }
            _ => Err(Problem::NotFound),
        }
    }

    fn admin_store_failed(&self, error: &crate::store::StoreError) -> Problem {
        tracing::error!(error = %crate::report::InLine(error), "admin: store failed");
        Problem::StoreFailed {
            retry_after: self.retry_after,
        }
    }
}
