//! The operating API of a running service, under `/payhook/admin/`: what `payhook
//! validations …` and `payhook reconcile` call with `--admin-url` (sled lets only the running
//! service open its store).
//!
//! | request | answer |
//! |---|---|
//! | `GET /payhook/admin/validations?state=…&limit=N&after=ID` | 200, a page of the postponed validations (JSON array), by id: those in `state` (`pending`, `queued`, `delivered` or `conflict`; every state without it), at most `N` (default and most 500; 0 is taken as 1) whose id follows `ID` (from the lowest without it); while more follow, a `Link: <…&after=…>; rel="next"` header names the next page (400 for an unknown state or an `after` that is not an id) |
//! | `POST /payhook/admin/validations/{id}` `{"success": bool, "description": "…", "nonce": "…", "by": "…"}` | 200 `recorded` or `unchanged`; 409 when decided differently, or when `nonce` (optional: the nonce of the validation the decision was taken on, as the inspector sends it) is not this validation's; 404 `no postponed validation with id N`. Kept with who decided (`decided_by` in the listing): the operator whose own token the call came with, else `by` (optional, the shared token's bearer's word; 403 when it names an operator of `[admin.operators]`, whose own token is how a change is kept as theirs) |
//! | `POST /payhook/admin/reconcile` `{"referenceIds": ["…"]}` | 200, one outcome per id; 409 `reconcile needs a complete [gateway] section` when the service has no gateway to look transactions up |
//! | `GET /payhook/admin/inspector` | the inspector's page (HTML; see [`crate::inspector`]); without a session, 401 and the form asking for the token (a `token` in the query is refused: typed, or from a `#token=…` fragment, which the browser never sends) |
//! | `POST /payhook/admin/inspector/login` (form: `token=…`) | 303 to the page with the session cookie; 401 and the form again for a wrong token; 429 and the form saying when to try again for an address out of guesses; 403 when the browser says another site's page posted it (`Sec-Fetch-Site`) |
//! | `POST /payhook/admin/inspector/logout` | 200 `logged out` (or `no session to end…` for a request that held none): the session is ended (refused from now on, even to a copy of its cookie; the store keeps it ended, for every instance on it and after a restart) and its cookie removed |
//! | `GET /payhook/admin/deliveries?after=SEQ&wait=S&limit=N&oldest=BOOL&nonce=…&client=…&outcome=…&endpoint=…` | 200, the recent deliveries after `SEQ` that match ([`crate::inspector::DeliveryList`]), at most `N` (100; at most 1,000): the newest, or with `oldest=true` the oldest, `more` saying others follow `last`; waiting up to `S` seconds (at most 30) for one; 409 `the inspector does not record (admin.inspector_recent = 0)` when recording is off |
//! | `GET /payhook/admin/deliveries/{seq}` | 200, one delivery with its request, every header value but the harmless ones redacted ([`crate::inspector::DeliveryDetail`]); 404 once it is no longer kept; 409 as above when recording is off |
//! | `POST /payhook/admin/outbox/{id}/retry` | 200 `due now`: the queued result's next attempt is made now, and a result the aggregator refused (403) is queued again, due now; 409 when it is undecided or delivered; 404 for an unknown id |
//! | `GET /payhook/admin/callbacks/held?limit=N` | 200, the results acknowledged but held by the merchant's effects and not resolved yet, latest first: at most `N` (default and most 1,000; 0 is taken as 1) (JSON array: nonce, status, reason, when held in ms, reference id, client, amount, currency); `payhook_callbacks_held_unresolved` on `/metrics` counts them all; 409 for a store that keeps no held results |
//! | `POST /payhook/admin/callbacks/held/resolve` `{"nonce": "…", "status": N, "note": "…", "by": "…"}` | 200, the held result as kept now: resolved, with the time, the note (a person put the merchant's books right, and says how: the note is needed, 400 without) and who (`resolvedBy` in the answer): the operator whose own token the call came with, else `by` (optional: the shared token serves every operator, so it is their word; 403 when it names an operator of `[admin.operators]`), no longer listed nor counted; its mark stays, so the aggregator's retries are still duplicates; logged at warn level with the caller's address; 404 `no held result of nonce … waits` when it is not held or was resolved already; 409 for a store of the merchant's own that keeps no held results |
//! | `POST /payhook/admin/credentials/read-again` | 200 [`AdminCredentialsRead`]: the service's configuration was read again from what it gave ([`Credentials::read_from`], as `read_again_on_hangup` does: SIGHUP's reading, without a signal) and its credentials taken, in this instance — what changed (names only), and the settings besides that differ and take a restart; 409 `not taken, every credential stays as it was: …` with why (the configuration cannot be read or is refused, or the service gave none to read) |
//! | `POST /payhook/admin/credentials/check` | the same reading, taking nothing: 200 [`AdminCredentialsRead`], what it would change; 409 `would not be taken, every credential stays as it was: …` with why — a rotation tried before it is made |
//! | `GET /payhook/admin/callbacks/failing?limit=N&after=CURSOR` | 200, a page of the (nonce, status) pairs whose handler failed, or whose body was refused (400), and that are not booked yet, most recent first: at most `N` (default and most 1,000; 0 is taken as 1) after `CURSOR` (from the latest without it) (JSON array: nonce, status, failures, first/last failure in ms, last reason, reference id, client, amount, currency); while more follow, a `Link: <…&after=…>; rel="next"` header names the next page (400 for an `after` that is not such a cursor) |
//!
//! Off unless `admin.token` or `[admin.operators]` is set. Every call needs
//! `Authorization: Bearer <token>` — the shared token, or an operator's own (see
//! [`super::operators`]: what that call changes is kept and logged with the operator's name)
//! (compared in constant time; 401 otherwise; 429 [`Problem::TooManyGuesses`] with
//! `Retry-After`, without comparing it, from an address that presented too many wrong
//! tokens, see [`super::guesses`]) from an address in `admin.allow_ips` (403),
//! without a proxy's forwarding headers unless its peer is a trusted proxy (403
//! [`Problem::ForwardedByStranger`]: a proxy on this machine left out of
//! `server.trusted_proxies` would make every caller look local), and from this machine or through a trusted proxy that says it came over HTTPS (403
//! [`Problem::InTheClear`] otherwise, before its credentials are read, unless
//! `admin.allow_plain_http`: a token that crossed a network in the clear is anyone's who
//! watches it, and payhook serves plain HTTP itself). Over plain HTTP, a call names the
//! service by an address or `localhost` (403 [`Problem::HostRefused`] otherwise): a web
//! page can point a name of its own at this machine and have the operator's browser call
//! the API as that page's site.
//! A browser on the inspector's page holds instead a session cookie (`HttpOnly`,
//! `SameSite=Strict`, and `Secure` behind a trusted proxy that says the browser came over
//! HTTPS; the login's time, a random id, whose it is (the operator's name, none for the
//! shared token) and their HMAC — beside that token's SHA-256, so that a new token ends its
//! sessions — under a key derived from `admin.session_secret`, else the shared token where
//! no operator has a token of their own (PBKDF2-HMAC-SHA256, 100,000 iterations), else
//! random to the process; not the token;
//! good for 12 hours, and for no other token), and its changes must
//! carry the `X-Payhook-Inspector` header (403 otherwise), which a cross-site form cannot
//! send. An operator named in `admin.viewers` may read and not change: any call but a safe
//! method's (GET) is refused 403 and logged at warn level, the inspector's login and logout
//! aside. Every other change asked is logged at info level once answered, with the method,
//! the path, whose token and the status.

use crate::model::ValidationId;
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body::Body;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::ResponseBody;
use super::admin_access::{
    AdminAccess, CurrentAccess, SESSION_COOKIE, SESSION_LIFETIME_SECS, StoredSession,
};
use super::credentials::Credentials;
use super::exactly_once::ExactlyOnce;
use super::ingress::Ingress;
use super::metrics::Metrics;
use super::operators::Caller;
use super::problem::Problem;
use super::reconcile::{ReconcileError, Reconciled};
use super::route::ADMIN_PREFIX;
use crate::gateway::GatewayClient;
use crate::inspector::page::{self, Health};
use crate::inspector::{DeliveryFilter, Inspector};
use crate::model::ErrorBody;
use crate::postponed::{Awaitable, Decision, PostponedState, ResolveError, Resolved};

/// A decision sent to `POST /payhook/admin/validations/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminDecision {
    /// Whether the client may make the transaction.
    pub success: bool,
    /// The explanation sent with the result.
    #[serde(default)]
    pub description: String,
    /// The nonce of the validation the decision was taken on (the inspector sends the one
    /// it showed beside the button): when given, a validation of another nonce under the id
    /// is refused (409) and nothing is recorded — a page redrawn under the pointer moves
    /// another validation's row where the operator clicked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// Who decided, as they name themselves (optional; cut after 128 bytes): kept with the
    /// decision (`decided_by`) and logged. Read only from a bearer of the shared token: an
    /// operator's own token (`[admin.operators]`) names them, whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// The body of `POST /payhook/admin/callbacks/held/resolve`: the held result a person
/// resolved in the merchant's books, and what they did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminHeldPair {
    /// The callback's nonce.
    pub nonce: String,
    /// The status code held.
    pub status: i32,
    /// What was done in the merchant's books (needed: kept with the result, and read by
    /// whoever reconciles the transaction later).
    #[serde(default)]
    pub note: String,
    /// Who resolved it, as they name themselves (optional; cut after 128 bytes): kept with
    /// the result and logged. Read only from a bearer of the shared token, whose name is
    /// their word: an operator's own token (`[admin.operators]`) names them, whatever this
    /// says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
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
    /// `booked`, `held` (acknowledged, but held by the merchant for a person to resolve),
    /// `already_booked` (acknowledged before, and not kept held), `already_held`
    /// (acknowledged before and held by the merchant, not resolved yet),
    /// `already_resolved` (held, and resolved by a person since), `not_final`, `unknown`
    /// (it may have been booked: reconcile again to see) or `error`.
    pub outcome: String,
    /// The transaction's status code, when it was read.
    pub status: Option<i32>,
    /// Why it was held (`held`, `already_held`; and for `already_resolved`, when and how it
    /// was resolved), or why it failed (`unknown` and `error`).
    pub message: Option<String>,
}

/// The answer of `POST /payhook/admin/credentials/read-again`: what the configuration read
/// again changed — or, of `POST /payhook/admin/credentials/check`, what it would change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminCredentialsRead {
    /// What changed (or would), as logged (`signature keys now: 2026-07, 2026-01; operators
    /// added: bob`), or `no change` (names only, never a secret).
    pub message: String,
    /// The other settings that differ from those the service runs with, by section or key:
    /// not taken, they take a restart.
    pub need_a_restart: Vec<String>,
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
/// builder when `admin.token` or `[admin.operators]` is set.
pub(super) struct OperatingApi {
    access: Arc<CurrentAccess>,
    ingress: Arc<Ingress>,
    exactly_once: ExactlyOnce,
    awaitable: Option<Arc<Awaitable>>,
    /// The credentials, read again when asked, with the aggregator's client (when the
    /// service calls it) whose login and TLS files they replace.
    credentials: Credentials,
    retry_after: Duration,
    observed: Observed,
    /// When a session was last let look without the store's word on it (ms since the
    /// epoch; 0: never): said at most once a minute.
    unchecked_said_ms: std::sync::atomic::AtomicU64,
}

/// What the inspector shows beside the store: the recent deliveries and the counters.
pub(super) struct Observed {
    /// `None` when recording is off (`admin.inspector_recent = 0`).
    pub(super) inspector: Option<Arc<Inspector>>,
    pub(super) metrics: Arc<Metrics>,
}

/// The longest a `GET deliveries?wait=…` waits.
const LONGEST_WAIT: Duration = Duration::from_secs(30);

impl OperatingApi {
    pub(super) fn new(
        access: Arc<CurrentAccess>,
        ingress: Arc<Ingress>,
        exactly_once: ExactlyOnce,
        awaitable: Option<Arc<Awaitable>>,
        credentials: Credentials,
        retry_after: Duration,
        observed: Observed,
    ) -> Self {
        Self {
            access,
            ingress,
            exactly_once,
            awaitable,
            credentials,
            retry_after,
            observed,
            unchecked_said_ms: std::sync::atomic::AtomicU64::new(0),
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
        let client = self.ingress.client_ip(&request);
        // Read once: a configuration read again meanwhile judges the next call.
        let access = self.access.now();
        access.check_address(client)?;
        if self.ingress.forwarded_by_stranger(&request) {
            return Err(Problem::ForwardedByStranger);
        }
        let https = self.ingress.forwarded_https(&request);
        access.check_channel(self.ingress.came_from_this_machine(&request, client), https)?;
        if !https {
            check_host(&request, "the operating API")?;
        }
        let (parts, body) = request.into_parts();
        let rest = parts
            .uri
            .path()
            .trim_start_matches(ADMIN_PREFIX)
            .trim_end_matches('/');
        let segments: Vec<&str> = rest.split('/').collect();
        match (&parts.method, segments.as_slice()) {
            // The page's way in: a browser without a session gets the login form.
            (&Method::GET, ["inspector"]) => {
                return Ok(match self.admitted(&access, &parts, client).await {
                    Ok((caller, _)) => self.inspector_page(&caller).await,
                    // Told apart from a wrong token: the right one is refused too, for now.
                    Err(problem @ Problem::TooManyGuesses { .. }) => locked_out(&problem),
                    Err(_) => login_asked(parts.uri.query()),
                });
            }
            (&Method::POST, ["inspector", "login"]) => {
                refuse_cross_site(&parts)?;
                let bytes = self
                    .ingress
                    .read_body(&parts, body, self.ingress.client_of_parts(&parts))
                    .await?;
                return login(&access, &bytes, https, client);
            }
            (&Method::POST, ["inspector", "logout"]) => {
                let (_, session) = self.admitted(&access, &parts, client).await?;
                // Let in by a bearer token, the request may still hold a session cookie,
                // which `end_session` below ends: the store keeps that one ended too.
                let session = session.or_else(|| access.held_session(&parts.headers));
                if let (Some(session), Some(store)) = (&session, self.exactly_once.store()) {
                    // Kept by the store first: every instance on it refuses the session,
                    // and so does this one after a restart. Not kept, the session stays
                    // good here too, for the logout to be asked again.
                    store
                        .end_session(&session.name, session.until)
                        .await
                        .map_err(|e| self.admin_store_failed(&e))?;
                }
                let ended = access.end_session(&parts.headers);
                let mut response = json(&ErrorBody::new(if ended.is_some() {
                    "logged out"
                } else {
                    "no session to end: the cookie holds none"
                }));
                set_session_cookie(&mut response, "", 0, https);
                return Ok(response);
            }
            _ => {}
        }
        let (caller, _) = self.admitted(&access, &parts, client).await?;
        if !parts.method.is_safe() && !caller.may_change() {
            tracing::warn!(
                method = %parts.method,
                path = %crate::logged::Logged(parts.uri.path()),
                by = %self.channel(&parts, &caller),
                "admin: a change asked by a viewer was refused"
            );
            return Err(Problem::Denied(format!(
                "{} may look, not change (admin.viewers)",
                crate::logged::Logged(caller.operator().unwrap_or_default())
            )));
        }
        let answered = self
            .route(&parts, body, &segments, (&access, &caller))
            .await;
        if !parts.method.is_safe() {
            // Every change asked of the operating API, with whose credentials and how it was
            // answered: the trail of what people did to the merchant's money (a decision, a
            // retry, a booking, a resolution).
            let status = answered
                .as_ref()
                .map_or_else(Problem::status, Response::status);
            tracing::info!(
                method = %parts.method,
                path = %crate::logged::Logged(parts.uri.path()),
                by = %self.channel(&parts, &caller),
                status = status.as_u16(),
                "admin: a change was asked"
            );
        }
        answered
    }

    /// Answers an authenticated call of `caller` (who may change what it asks to) at
    /// `segments`, the path under the prefix, under `access`, the operating API's
    /// credentials as the call was checked against them.
    async fn route<B>(
        &self,
        parts: &http::request::Parts,
        body: B,
        segments: &[&str],
        (access, caller): (&AdminAccess, &Caller),
    ) -> Result<Response<ResponseBody>, Problem>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if segments.first() == Some(&"inspector") {
            return self.inspector_fragment(parts, &segments[1..]).await;
        }
        match (&parts.method, segments) {
            (&Method::GET, ["deliveries"]) => {
                let inspector = self.inspector()?;
                let query = parts.uri.query().unwrap_or_default();
                let (after, window, wait) = list_params(query)?;
                let filter = DeliveryFilter::from_query(query);
                Ok(json(&inspector.list(&filter, after, window, wait).await))
            }
            (&Method::GET, ["deliveries", seq]) => Ok(json(&self.delivery(seq)?)),
            (&Method::POST, ["outbox", id, "retry"]) => {
                let id: ValidationId = id
                    .parse()
                    .map_err(|_| Problem::BadRequest(format!("`{id}` is not a validation id")))?;
                let resolver = self
                    .awaitable
                    .as_ref()
                    .map(|a| a.resolver())
                    .ok_or(Problem::NotFound)?;
                match resolver.retry_now(id).await {
                    Ok(true) => Ok(json(&ErrorBody::new("due now"))),
                    Ok(false) => Err(Problem::Conflict(format!(
                        "validation {id} has no result waiting for delivery"
                    ))),
                    Err(error @ ResolveError::Unknown(_)) => {
                        Err(Problem::Unknown(error.to_string()))
                    }
                    Err(ResolveError::Store(error)) => Err(self.admin_store_failed(&error)),
                    Err(error) => Err(Problem::Conflict(error.to_string())),
                }
            }
            (&Method::GET, ["validations"]) => {
                let query = parts.uri.query().unwrap_or_default();
                let state = validations_state(query)?;
                let (after, limit) = page_params(query, VALIDATIONS_PAGE_LIMIT)?;
                let resolver = self
                    .awaitable
                    .as_ref()
                    .map(|a| a.resolver())
                    .ok_or(Problem::NotFound)?;
                let page = resolver
                    .page(state, after, limit)
                    .await
                    .map_err(|e| self.admin_store_failed(&e))?;
                let state = state.map_or(String::new(), |s| format!("state={}&", s.as_str()));
                let next = page
                    .next
                    .map(|next| format!("validations?{state}limit={limit}&after={next}"));
                self.with_next(json(&page.validations), next)
            }
            (&Method::POST, ["validations", id]) => {
                let id: ValidationId = id
                    .parse()
                    .map_err(|_| Problem::BadRequest(format!("`{id}` is not a validation id")))?;
                let bytes = self
                    .ingress
                    .read_body(parts, body, self.ingress.client_of_parts(parts))
                    .await?;
                let decision: AdminDecision = super::request::parse_json(&bytes)?;
                let resolver = self
                    .awaitable
                    .as_ref()
                    .map(|a| a.resolver())
                    .ok_or(Problem::NotFound)?;
                if let Some(shown) = &decision.nonce {
                    // A validation's nonce never changes: checked once, it holds.
                    let held = resolver
                        .get(id)
                        .await
                        .map_err(|e| self.admin_store_failed(&e))?;
                    if let Some(held) = held.filter(|h| h.request.nonce().as_str() != shown) {
                        return Err(Problem::Conflict(format!(
                            "validation {id} is of nonce {}, not of the nonce shown ({}): nothing recorded",
                            crate::logged::Logged(held.request.nonce().as_str()),
                            crate::logged::Logged(shown.as_str())
                        )));
                    }
                }
                let by = access.kept_name(caller, decision.by.as_deref())?;
                match resolver
                    .resolve_by(
                        id,
                        Decision::allow_if(decision.success, decision.description),
                        by,
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
                let query = parts.uri.query().unwrap_or_default();
                let (after, limit) = page_params(query, FAILING_PAGE_LIMIT)?;
                let page = store
                    .failing_page(after, limit)
                    .await
                    .map_err(|e| self.admin_store_failed(&e))?;
                let next = page
                    .next
                    .map(|next| format!("callbacks/failing?limit={limit}&after={next}"));
                self.with_next(json(&page.failing), next)
            }
            (&Method::GET, ["callbacks", "held"]) => {
                let store = self.exactly_once.store().ok_or(Problem::NotFound)?;
                let query = parts.uri.query().unwrap_or_default();
                let (after, limit) = page_params::<String>(query, HELD_LIMIT)?;
                if after.is_some() {
                    return Err(Problem::BadRequest(
                        "held results are listed in one page, latest first: `after` is not taken"
                            .into(),
                    ));
                }
                let held = store
                    .held_callbacks(limit)
                    .await
                    .map_err(|e| self.admin_store_failed(&e))?;
                Ok(json(&held))
            }
            (&Method::POST, ["callbacks", "held", "resolve"]) => {
                let store = self.exactly_once.store().ok_or(Problem::NotFound)?;
                let bytes = self
                    .ingress
                    .read_body(parts, body, self.ingress.client_of_parts(parts))
                    .await?;
                let pair: AdminHeldPair = super::request::parse_json(&bytes)?;
                if pair.nonce.contains('\0') {
                    return Err(Problem::BadRequest(
                        "`nonce`: no nonce carries U+0000 (the endpoints refuse it), so no held \
                         result has this one"
                            .into(),
                    ));
                }
                if let Some(refused) = crate::store::held::note_refused(&pair.note) {
                    return Err(Problem::BadRequest(format!("`note`: {refused}")));
                }
                let nonce = crate::model::Nonce::from(pair.nonce);
                let status = crate::model::TransactionStatus::from_code(pair.status);
                let by = access.kept_name(caller, pair.by.as_deref())?;
                let resolved = store
                    .resolve_held(&nonce, status, &pair.note, by)
                    .await
                    .map_err(|e| self.admin_store_failed(&e))?;
                let Some(resolved) = resolved else {
                    return Err(Problem::Unknown(format!(
                        "no held result of nonce {}, status {} waits: not held, or resolved already",
                        crate::logged::Logged(nonce.as_str()),
                        pair.status
                    )));
                };
                crate::store::held::log_resolved(&resolved, &self.channel(parts, caller));
                Ok(json(&resolved))
            }
            (&Method::POST, ["credentials", what @ ("read-again" | "check")]) => {
                let take = *what == "read-again";
                // Said before: a caller gone meanwhile leaves the reading to finish, and
                // the change it makes is not left without whom it was asked by.
                tracing::info!(
                    by = %self.channel(parts, caller),
                    "admin: reading the configuration again, as asked{}",
                    if take { "" } else { ", to check it" }
                );
                let read = if take {
                    self.credentials.read_again_now().await
                } else {
                    self.credentials.check_now().await
                };
                let change = read.map_err(|error| {
                    Problem::Conflict(format!(
                        "{}, every credential stays as it was: {}",
                        if take {
                            "not taken"
                        } else {
                            "would not be taken"
                        },
                        crate::report::InLine(&error)
                    ))
                })?;
                Ok(json(&AdminCredentialsRead {
                    message: change.to_string(),
                    need_a_restart: change
                        .need_a_restart
                        .iter()
                        .map(|&what| what.to_owned())
                        .collect(),
                }))
            }
            (&Method::POST, ["reconcile"]) => {
                let bytes = self
                    .ingress
                    .read_body(parts, body, self.ingress.client_of_parts(parts))
                    .await?;
                let request: AdminReconcile = super::request::parse_json(&bytes)?;
                let gateway = self.credentials.gateway().ok_or_else(|| {
                    Problem::Conflict("reconcile needs a complete [gateway] section".into())
                })?;
                let outcomes = self
                    .exactly_once
                    .reconcile_all(
                        gateway,
                        &request.reference_ids,
                        self.ingress.server_config().max_identifier_chars,
                    )
                    .await
                    .into_iter()
                    .map(|(reference_id, outcome)| {
                        let (outcome, status, message) = match outcome {
                            Ok(Reconciled::Booked(s)) => ("booked", Some(s.code()), None),
                            Ok(Reconciled::Held { status, reason }) => {
                                ("held", Some(status.code()), Some(reason))
                            }
                            Ok(Reconciled::AlreadyBooked(s)) => {
                                ("already_booked", Some(s.code()), None)
                            }
                            Ok(Reconciled::AlreadyHeld { status, held }) => (
                                if held.unresolved() {
                                    "already_held"
                                } else {
                                    "already_resolved"
                                },
                                Some(status.code()),
                                Some(crate::store::held::told(&held)),
                            ),
                            Ok(Reconciled::NotFinal(s)) => ("not_final", Some(s.code()), None),
                            Err(error @ ReconcileError::OutcomeUnknown(_)) => (
                                "unknown",
                                None,
                                Some(crate::report::InLine(&error).to_string()),
                            ),
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
            (_, ["callbacks", "held", "resolve"]) => {
                Err(Problem::MethodNotAllowed { allow: "POST" })
            }
            (_, ["callbacks", "failing" | "held"] | ["deliveries"] | ["deliveries", _]) => {
                Err(Problem::MethodNotAllowed { allow: "GET" })
            }
            (_, ["outbox", _, "retry"]) => Err(Problem::MethodNotAllowed { allow: "POST" }),
            (_, ["validations"] | ["validations", _]) => {
                Err(Problem::MethodNotAllowed { allow: "GET, POST" })
            }
            (_, ["reconcile"] | ["credentials", "read-again" | "check"]) => {
                Err(Problem::MethodNotAllowed { allow: "POST" })
            }
            _ => Err(Problem::NotFound),
        }
    }

    /// The channel a change came through, for its log line: the operating API, from which
    /// address, with which credentials (an operator's own token, or the shared one).
    fn channel(&self, parts: &http::request::Parts, caller: &Caller) -> String {
        let client = self.ingress.client_of_parts(parts);
        let from = client.map_or_else(|| "an unknown address".into(), |ip| ip.to_string());
        let role = if caller.may_change() {
            "operator"
        } else {
            "viewer"
        };
        match caller.operator() {
            Some(name) => format!(
                "the operating API, from {from}, with the token of {role} {}",
                crate::logged::Logged(name)
            ),
            None => format!("the operating API, from {from}, with the shared token"),
        }
    }

    /// `response`, a page of a listing, with a `Link: <…>; rel="next"` header naming the
    /// next page when there is one (`next`: its route and query under the prefix). A next
    /// page that cannot be named is answered as a failure, never as the last page.
    fn with_next(
        &self,
        mut response: Response<ResponseBody>,
        next: Option<String>,
    ) -> Result<Response<ResponseBody>, Problem> {
        let Some(next) = next else {
            return Ok(response);
        };
        // Built of the route, a state's name, numbers and a cursor's URL-safe base64: nothing
        // from the request as it came, so always a valid header value.
        let link = format!("<{ADMIN_PREFIX}{next}>; rel=\"next\"");
        let Ok(value) = http::HeaderValue::from_str(&link) else {
            tracing::error!(link, "admin: the next page's link is not a header value");
            return Err(Problem::StoreFailed {
                retry_after: self.retry_after,
            });
        };
        response.headers_mut().insert(http::header::LINK, value);
        Ok(response)
    }

    /// Who the call is of ([`AdminAccess::admit`]), and the session it came with; a session
    /// the store keeps as ended — by a logout at another instance, or at this one before a
    /// restart — is refused. A store that cannot say lets a session look (this instance's
    /// own memory of ended sessions still holds, and the inspector's panels show what the
    /// store answers, which matters most in an incident) and refuses it a change (503).
    async fn admitted(
        &self,
        access: &AdminAccess,
        parts: &http::request::Parts,
        client: Option<std::net::IpAddr>,
    ) -> Result<(Caller, Option<StoredSession>), Problem> {
        let (caller, session) = access.admit(&parts.method, &parts.headers, client)?;
        let (Some(ended), Some(store)) = (&session, self.exactly_once.store()) else {
            return Ok((caller, session));
        };
        match store.session_ended(&ended.name).await {
            Ok(false) => Ok((caller, session)),
            Ok(true) => Err(Problem::Unauthorized {
                message: "the session was ended by logging out; log in again".into(),
                basic: false,
            }),
            Err(error) if parts.method.is_safe() => {
                self.say_unchecked(&error);
                Ok((caller, session))
            }
            Err(error) => Err(self.admin_store_failed(&error)),
        }
    }

    /// Says, at most once a minute, that a session was let look without the store's word on
    /// whether it was ended elsewhere.
    fn say_unchecked(&self, error: &crate::store::StoreError) {
        use std::sync::atomic::Ordering;
        let now = crate::model::timestamp::now_ms();
        let said = self.unchecked_said_ms.load(Ordering::Relaxed);
        if now.saturating_sub(said) >= 60_000
            && self
                .unchecked_said_ms
                .compare_exchange(said, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                error = %crate::report::InLine(error),
                "admin: the store could not say whether an inspector session was ended at another instance; it may look (a change is refused until the store answers); said at most once a minute"
            );
        }
    }

    /// What an operating call answers when the store did not do it: 503 to retry, but 409
    /// for what the store cannot do at all (a store of the merchant's own that keeps no
    /// held results, say) — a retry would meet the same.
    fn admin_store_failed(&self, error: &crate::store::StoreError) -> Problem {
        if let crate::store::StoreError::Unsupported(why) = error {
            return Problem::Conflict(why.clone());
        }
        tracing::error!(error = %crate::report::InLine(error), "admin: store failed");
        Problem::StoreFailed {
            retry_after: self.retry_after,
        }
    }
}

/// `after`, `limit` and `wait` of `GET deliveries`: defaults 0, 100 and no wait.
fn list_params(query: &str) -> Result<(u64, (usize, crate::inspector::Window), Duration), Problem> {
    let (mut after, mut limit, mut wait) = (0, 100, Duration::ZERO);
    let mut window = crate::inspector::Window::Newest;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| Problem::BadRequest(format!("`{key}` must be a whole number")))
        };
        match &*key {
            "after" => after = number()?,
            "limit" => {
                limit = usize::try_from(number()?)
                    .unwrap_or(usize::MAX)
                    .clamp(1, 1000)
            }
            "wait" => wait = Duration::from_secs(number()?).min(LONGEST_WAIT),
            "oldest" => {
                window = match &*value {
                    "true" => crate::inspector::Window::Oldest,
                    "false" => crate::inspector::Window::Newest,
                    _ => {
                        return Err(Problem::BadRequest("`oldest` must be true or false".into()));
                    }
                }
            }
            _ => {}
        }
    }
    Ok((after, (limit, window), wait))
}

/// The most held results `GET callbacks/held` lists, and how many without `limit`.
pub(crate) const HELD_LIMIT: usize = 1000;

/// The most failing pairs a page of `GET callbacks/failing` lists, and how many without
/// `limit`: a page stays well under a megabyte of JSON however many an incident left.
pub(super) const FAILING_PAGE_LIMIT: usize = 1000;

/// The most postponed validations a page of `GET validations` lists, and how many without
/// `limit`: a record holds its request, so a page is kept near a megabyte of JSON.
pub(crate) const VALIDATIONS_PAGE_LIMIT: usize = 500;

/// `after` and `limit` of a listing's page (`GET callbacks/failing`, `GET validations`): from
/// the listing's start, and `most` (at least 1, at most `most`).
fn page_params<C>(query: &str, most: usize) -> Result<(Option<C>, usize), Problem>
where
    C: std::str::FromStr,
    C::Err: std::fmt::Display,
{
    let (mut after, mut limit) = (None, most);
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "after" => {
                after = Some(
                    value
                        .parse()
                        .map_err(|e| Problem::BadRequest(format!("`after`: {e}")))?,
                );
            }
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .map_err(|_| Problem::BadRequest("`limit` must be a whole number".into()))?
                    .clamp(1, most);
            }
            _ => {}
        }
    }
    Ok((after, limit))
}

/// `state` of `GET validations`: `None` (every state) without it.
fn validations_state(query: &str) -> Result<Option<PostponedState>, Problem> {
    let Some((_, state)) = form_urlencoded::parse(query.as_bytes()).find(|(key, _)| key == "state")
    else {
        return Ok(None);
    };
    PostponedState::ALL
        .into_iter()
        .find(|known| known.as_str() == state)
        .map(Some)
        .ok_or_else(|| {
            Problem::BadRequest(format!(
                "state `{}`: use pending, queued, delivered or conflict",
                crate::logged::Logged(&state)
            ))
        })
}

/// Refuses a login form posted by another site's page, as the browser says
/// (`Sec-Fetch-Site`, which a page cannot set): a page the operator opens could post wrong
/// tokens to the service on this machine and spend the operator's guesses ([`Guesses`]).
/// Posted from the inspector's own page, or typed (`none`), it is let through. A browser
/// that does not say (one older than 2023, or over plain HTTP to another machine) still
/// sends `Origin` with a form's POST: one that names another site than the address the
/// request was sent to (or `null`) is refused. (With `Sec-Fetch-Site` the origin is not
/// compared: behind a proxy that rewrites `Host`, the two differ for the operator too.)
fn refuse_cross_site(parts: &http::request::Parts) -> Result<(), Problem> {
    let own_page = match parts.headers.get("sec-fetch-site") {
        Some(said) => matches!(said.as_bytes(), b"same-origin" | b"none"),
        None => origin_is_own(parts),
    };
    if own_page {
        Ok(())
    } else {
        Err(Problem::Denied(
            "a login posted from another site's page is refused; open the inspector's own page"
                .into(),
        ))
    }
}

/// Whether the request's `Origin`, when it has one, names the address it was sent to (its
/// authority, or its `Host`); `null` names none.
fn origin_is_own(parts: &http::request::Parts) -> bool {
    let Some(origin) = parts.headers.get(http::header::ORIGIN) else {
        return true;
    };
    let named = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.split_once("://"))
        .map(|(_, authority)| authority);
    let sent_to = parts
        .uri
        .authority()
        .map(http::uri::Authority::as_str)
        .or_else(|| {
            parts
                .headers
                .get(http::header::HOST)
                .and_then(|host| host.to_str().ok())
        });
    matches!((named, sent_to), (Some(named), Some(sent_to)) if named.eq_ignore_ascii_case(sent_to))
}

/// The form asking for the token, for a browser without a session. A token in the address
/// is refused, not taken: it would be kept in the browser's history and in the logs of every
/// proxy on the way (`#token=…` — a fragment, never sent — fills the form instead).
fn login_asked(query: Option<&str>) -> Response<ResponseBody> {
    let in_address = query.is_some_and(|query| {
        form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == "token")
    });
    let problem = in_address.then_some(
        "a token in the address is not taken (it would stay in the browser's history and in \
         proxies' logs): type it here, or open the page with #token=… instead of ?token=…",
    );
    html(http::StatusCode::UNAUTHORIZED, page::login(problem))
}

/// Refuses a call (of `called`) over plain HTTP that names the service by a name other than `localhost`
/// (its `Host`, or an HTTP/2 request's authority): a web page the operator visits can point
/// a name of its own at this machine (DNS rebinding) and have the browser call the API as
/// that page's site, which no cookie or allow-list of addresses tells apart. An address, or
/// `localhost`, names this machine whatever any DNS says. A request naming nothing (HTTP/1.0)
/// passes: no browser sends one. A `Host` that names nothing readable is refused.
pub(super) fn check_host<B>(request: &Request<B>, called: &'static str) -> Result<(), Problem> {
    let host = match (
        request.uri().host(),
        request.headers().get(http::header::HOST),
    ) {
        (Some(host), _) => host.to_owned(),
        (None, None) => return Ok(()),
        (None, Some(value)) => value
            .to_str()
            .ok()
            .and_then(|host| host.parse::<http::uri::Authority>().ok())
            .map(|authority| authority.host().to_owned())
            .ok_or_else(|| Problem::HostRefused {
                called,
                host: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })?,
    };
    if names_this_machine(&host) {
        Ok(())
    } else {
        Err(Problem::HostRefused { called, host })
    }
}

/// Whether `host` (without its port) names this machine whatever DNS says: an IP address
/// (an IPv6 one in brackets), `localhost` or a name under it.
fn names_this_machine(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    bare.parse::<std::net::IpAddr>().is_ok() || host == "localhost" || host.ends_with(".localhost")
}

/// Sets the inspector's session cookie to `value` for `max_age` seconds (0 removes it);
/// `Secure` when the browser reached the service over HTTPS.
fn set_session_cookie(
    response: &mut Response<ResponseBody>,
    value: &str,
    max_age: u64,
    https: bool,
) {
    let secure = if https { "; Secure" } else { "" };
    let cookie = format!(
        "{SESSION_COOKIE}={value}; Path={ADMIN_PREFIX}; Max-Age={max_age}; HttpOnly; \
         SameSite=Strict{secure}"
    );
    // Built of constants, a number and the session's digits, dots and hex alone.
    if let Ok(cookie) = http::HeaderValue::from_str(&cookie) {
        response
            .headers_mut()
            .insert(http::header::SET_COOKIE, cookie);
    }
}

/// Marks every answer of the operating API as the operator's alone: no cache keeps it (a
/// delivery's raw body, a validation's data, fetched with the token or the session), no
/// browser reads it as another type than it says, and no address of it leaves as a
/// `Referer`.
pub(super) fn kept_private(response: &mut Response<ResponseBody>) {
    let headers = response.headers_mut();
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        http::header::REFERRER_POLICY,
        http::HeaderValue::from_static("no-referrer"),
    );
}

fn html(status: http::StatusCode, text: String) -> Response<ResponseBody> {
    let mut response = Response::new(http_body_util::Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // The page runs only its own scripts, and nobody may frame it. (Not cached: no answer
    // of the operating API is, `kept_private`.)
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static(crate::inspector::page::content_security_policy()),
    );
    response
}

impl OperatingApi {
    fn inspector(&self) -> Result<&Inspector, Problem> {
        self.observed.inspector.as_deref().ok_or_else(|| {
            Problem::Conflict("the inspector does not record (admin.inspector_recent = 0)".into())
        })
    }

    /// Delivery number `seq`, while the inspector keeps it.
    fn delivery(&self, seq: &str) -> Result<crate::inspector::DeliveryDetail, Problem> {
        let inspector = self.inspector()?;
        let number = seq
            .parse()
            .map_err(|_| Problem::BadRequest(format!("`{seq}` is not a delivery's number")))?;
        inspector
            .detail(number)
            .ok_or_else(|| Problem::Unknown(format!("no recent delivery #{seq}")))
    }

    async fn inspector_page(&self, caller: &Caller) -> Response<ResponseBody> {
        let now = chrono::Utc::now();
        let page = page::page(
            caller.operator().map(|name| (name, caller.may_change())),
            &self.deliveries_fragment(&DeliveryFilter::default()).await,
            &self.failing_fragment(now).await,
            &self.held_fragment().await,
            &self.pending_fragment(now).await,
            &self.outbox_fragment(now).await,
            &page::health(&self.health().await, now),
        );
        html(http::StatusCode::OK, page)
    }

    /// A panel of the page, for its script.
    async fn inspector_fragment(
        &self,
        parts: &http::request::Parts,
        rest: &[&str],
    ) -> Result<Response<ResponseBody>, Problem> {
        if parts.method != Method::GET {
            return Err(Problem::MethodNotAllowed { allow: "GET" });
        }
        let now = chrono::Utc::now();
        let text = match rest {
            ["deliveries"] => {
                let filter = DeliveryFilter::from_query(parts.uri.query().unwrap_or_default());
                self.deliveries_fragment(&filter).await
            }
            ["failing"] => self.failing_fragment(now).await,
            ["held"] => self.held_fragment().await,
            ["postponed"] => self.pending_fragment(now).await,
            ["outbox"] => self.outbox_fragment(now).await,
            ["health"] => page::health(&self.health().await, now),
            ["delivery", seq] => page::detail(&self.delivery(seq)?),
            _ => return Err(Problem::NotFound),
        };
        let mut fragment = html(http::StatusCode::OK, text);
        // What the page writes into itself as HTML: the service's own, not a proxy's page.
        fragment.headers_mut().insert(
            page::ACTION_HEADER,
            http::HeaderValue::from_static("fragment"),
        );
        Ok(fragment)
    }

    async fn deliveries_fragment(&self, filter: &DeliveryFilter) -> String {
        match &self.observed.inspector {
            Some(inspector) => {
                let list = inspector
                    .list(
                        filter,
                        0,
                        (200, crate::inspector::Window::Newest),
                        Duration::ZERO,
                    )
                    .await;
                page::deliveries(&list, filter)
            }
            None => "<p class=empty>Recording is off (admin.inspector_recent = 0).</p>".into(),
        }
    }

    async fn failing_fragment(&self, now: chrono::DateTime<chrono::Utc>) -> String {
        let Some(store) = self.exactly_once.store() else {
            return "<p class=empty>No store: failures are not recorded.</p>".into();
        };
        let latest = store.failing_latest(page::FAILING_SHOWN).await;
        let count = store.failing_count().await;
        match (latest, count) {
            (Ok(latest), Ok(count)) => page::failing(&latest, count, now),
            (Err(error), _) | (_, Err(error)) => shown(Err(&error)),
        }
    }

    async fn held_fragment(&self) -> String {
        let Some(store) = self.exactly_once.store() else {
            return "<p class=empty>No store: held results are not kept.</p>".into();
        };
        let latest = store.held_callbacks(page::FAILING_SHOWN).await;
        let count = store.held_count().await;
        match (latest, count) {
            (Ok(latest), Ok(count)) => page::held(&latest, count),
            (Err(error), _) | (_, Err(error)) => shown(Err(&error)),
        }
    }

    /// The first [`page::WAITING_SHOWN`] validations waiting for a decision, read through
    /// the store's index: the page fetches the panel every second.
    async fn pending_fragment(&self, now: chrono::DateTime<chrono::Utc>) -> String {
        let pending = match &self.awaitable {
            Some(awaitable) => {
                awaitable
                    .resolver()
                    .page(Some(PostponedState::Pending), None, page::WAITING_SHOWN)
                    .await
            }
            None => Ok(crate::postponed::PostponedPage::default()),
        };
        shown(pending.as_ref().map(|first| page::postponed(first, now)))
    }

    /// The first [`page::WAITING_SHOWN`] results waiting for delivery, and the latest
    /// [`page::SETTLED_SHOWN`] delivered or refused: not the retention period's thousands,
    /// nor an outage's backlog, every second.
    async fn outbox_fragment(&self, now: chrono::DateTime<chrono::Utc>) -> String {
        let Some(awaitable) = &self.awaitable else {
            return page::outbox(&[], page::LeftOut::default(), now);
        };
        let resolver = awaitable.resolver();
        let listed = async {
            let queued = resolver
                .page(Some(PostponedState::Queued), None, page::WAITING_SHOWN)
                .await?;
            let settled = resolver.settled(page::SETTLED_SHOWN + 1).await?;
            Ok::<_, crate::store::StoreError>(page::outbox_records(queued, settled))
        };
        shown(
            listed
                .await
                .as_ref()
                .map(|(records, left_out)| page::outbox(records, *left_out, now)),
        )
    }

    async fn health(&self) -> Health {
        let store = self.exactly_once.store();
        let outbox_queued = match (store, &self.awaitable) {
            (Some(store), Some(_)) => Some(
                store
                    .outbox_len()
                    .await
                    .map_err(|error| crate::report::InLine(&error).to_string()),
            ),
            (None, Some(_)) => Some(Err("no store".to_owned())),
            (_, None) => None,
        };
        Health {
            store_failed: store.map(|s| s.failed()),
            gateway: self.credentials.gateway().map(GatewayClient::session_state),
            outbox_queued,
            counters: self.observed.metrics.at_a_glance(),
            kept: self.observed.inspector.as_ref().map_or(0, |i| i.capacity()),
        }
    }
}

/// Given the right token (the form's body), the session cookie and the way to the
/// page; otherwise the form again, saying why. `https`: the cookie is `Secure`. The
/// token is one of `client`'s guesses ([`Guesses`]): out of them, the form says when to
/// try again (429).
fn login(
    access: &AdminAccess,
    form: &[u8],
    https: bool,
    client: Option<IpAddr>,
) -> Result<Response<ResponseBody>, Problem> {
    let presented = form_urlencoded::parse(form)
        .find(|(key, _)| key == "token")
        .map(|(_, value)| value.into_owned());
    let Some(token) = presented else {
        return Ok(html(http::StatusCode::UNAUTHORIZED, page::login(None)));
    };
    match access.holder_of(&token, client) {
        Ok(Some(caller)) => {
            let mut response = html(http::StatusCode::SEE_OTHER, String::new());
            response.headers_mut().insert(
                http::header::LOCATION,
                http::HeaderValue::from_static("/payhook/admin/inspector"),
            );
            let session = access.new_session(&caller)?;
            set_session_cookie(&mut response, &session, SESSION_LIFETIME_SECS, https);
            Ok(response)
        }
        Ok(None) => Ok(html(
            http::StatusCode::UNAUTHORIZED,
            page::login(Some("invalid token")),
        )),
        Err(problem @ Problem::TooManyGuesses { .. }) => Ok(locked_out(&problem)),
        Err(problem) => Err(problem),
    }
}

/// The login form, answered 429 with `Retry-After` to an address that guessed too often
/// (`problem`, [`Problem::TooManyGuesses`]).
fn locked_out(problem: &Problem) -> Response<ResponseBody> {
    let mut response = html(
        http::StatusCode::TOO_MANY_REQUESTS,
        page::login(Some(&problem.message())),
    );
    problem.set_retry_after(response.headers_mut());
    response
}

/// A panel, or — when the store could not be read — why it is missing: an empty panel
/// would tell an operator that nothing waits.
fn shown(panel: Result<String, &crate::store::StoreError>) -> String {
    panel.unwrap_or_else(|error| {
        format!(
            "<p class=bad>the store could not be read: {}</p>",
            page::escape(&crate::report::InLine(error).to_string())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{names_this_machine, shown};
    use crate::store::StoreError;

    #[test]
    fn only_an_address_or_localhost_names_this_machine_whatever_dns_says() {
        for host in [
            "127.0.0.1",
            "[::1]",
            "::1",
            "10.0.0.5",
            "localhost",
            "LocalHost.",
            "admin.localhost",
        ] {
            assert!(names_this_machine(host), "{host}");
        }
        for host in [
            "evil.example",
            "localhost.evil.example",
            "payhook",
            "127.0.0.1.nip.io",
        ] {
            assert!(!names_this_machine(host), "{host}");
        }
    }

    #[test]
    fn a_panel_whose_store_could_not_be_read_says_so_instead_of_showing_nothing() {
        let error = StoreError::backend_message("sled said <no> & gave up");
        let panel = shown(Err(&error));
        assert!(
            panel.starts_with("<p class=bad>the store could not be read: "),
            "{panel}"
        );
        // The error reaches the operator, escaped: a store's message never becomes markup.
        assert!(
            panel.contains("sled said &lt;no&gt; &amp; gave up"),
            "{panel}"
        );
        assert!(!panel.contains("<no>"), "{panel}");
        assert_eq!(shown(Ok("<table></table>".to_owned())), "<table></table>");
    }
}
