//! A fake aggregator on 127.0.0.1: login, refresh-token, postponed validation results and
//! transaction lookup (spec 4.1), with counters and knobs for the tests — token lifetimes,
//! revoked tokens, scripted failures, a slow login, and stopping and restarting on the same
//! port.

use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use payhook::Secret;
use payhook::config::GatewayConfig;
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{net::TcpListener, task::JoinHandle, task::JoinSet};

pub const USERNAME: &str = "shop";
pub const PASSWORD: &str = "pa55-w0rd-secret";

/// Everything the fake aggregator knows, and the knobs.
pub struct GatewayState {
    /// Lifetime of the access tokens it issues (may be negative: already expired).
    pub access_lifetime: TimeDelta,
    /// Lifetime of the refresh tokens it issues.
    pub refresh_lifetime: TimeDelta,
    /// How long a login takes.
    pub login_delay: Duration,
    /// How long a result post takes before it is answered.
    pub post_delay: Duration,
    /// Added to the expiries it reports (not to those it keeps): an aggregator whose clock
    /// is behind this host's by as much, when negative.
    pub reported_skew: TimeDelta,
    /// Every login is refused (401), as after a password change.
    pub refuse_logins: bool,
    /// The merchant's password it accepts ([`PASSWORD`] until a test changes it).
    pub password: String,
    /// Login requests, refused ones and those given up by the client included (counted as
    /// they arrive, before [`Self::login_delay`]).
    pub login_attempts: u32,
    /// Refresh requests, refused ones included.
    pub refresh_attempts: u32,
    /// Every refresh is refused with this status (the spec does not say which).
    pub refuse_refreshes: Option<u16>,
    /// Refusals of a login or refresh quote the request's body, as some proxies' error
    /// pages do.
    pub echo_refusals: bool,
    /// Scripted failures of result posts ([`Self::fail_next`]) quote the request's
    /// `Authorization` header in a long JSON message, as some proxies' error pages do.
    pub echo_failures: bool,
    /// Scripted failures of result posts ([`Self::fail_next`]) carry no body, as a
    /// framework's or a proxy's refusal (a role the user lacks, a firewall) may not.
    pub bare_failures: bool,
    /// The `Retry-After` header of scripted failures of result posts, when set.
    pub retry_after: Option<String>,
    pub logins: u32,
    pub refreshes: u32,
    /// Calls answered 401 because of a missing, unknown or expired token.
    pub unauthorized: u32,
    access: HashMap<String, DateTime<Utc>>,
    refresh: HashMap<String, DateTime<Utc>>,
    /// Statuses to answer the next result posts with, before handling them.
    pub fail_next: VecDeque<u16>,
    /// Recorded results: validation id → (success, description).
    pub results: BTreeMap<i64, (bool, String)>,
    /// Every result post that reached the handling: (validation id, success, status answered).
    pub posts: Vec<(i64, bool, u16)>,
    /// The validation id of every result post, scripted failures included.
    pub attempted: Vec<i64>,
    /// Transaction records by reference id (spec 2.6).
    pub transactions: HashMap<String, Value>,
    /// Transaction lookups that arrived (counted once their record is read).
    pub lookups: u32,
    /// The next lookup reads its record as it arrives, then waits for this to be sent (or
    /// dropped) before answering with it: an answer on its way while the record changes.
    pub hold_next_lookup: Option<tokio::sync::oneshot::Receiver<()>>,
    /// The `traceparent` header of every request, with its method and path.
    pub traceparents: Vec<(String, Option<String>)>,
}

impl Default for GatewayState {
    fn default() -> Self {
        Self {
            access_lifetime: TimeDelta::hours(1),
            refresh_lifetime: TimeDelta::days(1),
            login_delay: Duration::ZERO,
            post_delay: Duration::ZERO,
            reported_skew: TimeDelta::zero(),
            refuse_logins: false,
            password: PASSWORD.to_owned(),
            login_attempts: 0,
            refresh_attempts: 0,
            refuse_refreshes: None,
            echo_refusals: false,
            echo_failures: false,
            bare_failures: false,
            retry_after: None,
            logins: 0,
            refreshes: 0,
            unauthorized: 0,
            access: HashMap::new(),
            refresh: HashMap::new(),
            fail_next: VecDeque::new(),
            results: BTreeMap::new(),
            posts: Vec::new(),
            attempted: Vec::new(),
            transactions: HashMap::new(),
            lookups: 0,
            hold_next_lookup: None,
            traceparents: Vec::new(),
        }
    }
}

impl GatewayState {
    /// Makes every access token issued so far invalid (their next use gets 401).
    pub fn revoke_access_tokens(&mut self) {
        self.access.clear();
    }

    fn session(&mut self) -> Value {
        let now = Utc::now();
        let access = format!("at-{}", uuid::Uuid::new_v4());
        let refresh = format!("rt-{}", uuid::Uuid::new_v4());
        let access_expiry = now + self.access_lifetime;
        let refresh_expiry = now + self.refresh_lifetime;
        self.access.insert(access.clone(), access_expiry);
        self.refresh.insert(refresh.clone(), refresh_expiry);
        json!({
            "username": USERNAME,
            "accessToken": access,
            "refreshToken": refresh,
            "accessTokenExpiryUtc": (access_expiry + self.reported_skew).to_rfc3339(),
            "refreshTokenExpiryUtc": (refresh_expiry + self.reported_skew).to_rfc3339(),
            "roles": ["merchant"],
        })
    }

    fn authorized(&mut self, request: &Request<hyper::body::Incoming>) -> bool {
        let token = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        self.access
            .get(token)
            .is_some_and(|expiry| *expiry > Utc::now())
    }
}

/// A running fake aggregator.
pub struct FakeGateway {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<GatewayState>>,
    task: Option<JoinHandle<()>>,
}

impl FakeGateway {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::default();
        let task = Self::spawn(listener, Arc::clone(&state));
        Self {
            addr,
            state,
            task: Some(task),
        }
    }

    fn spawn(listener: TcpListener, shared: Arc<Mutex<GatewayState>>) -> JoinHandle<()> {
        tokio::spawn(async move {
            // Connections die with the accept loop: a stopped gateway refuses and drops all.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&shared);
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, hyper::Error>(handle(&state, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
    }

    /// Stops listening and drops every connection: calls are refused until [`restart`].
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Listens again on the same port, with the same state.
    pub async fn restart(&mut self) {
        self.stop();
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        self.task = Some(Self::spawn(listener, Arc::clone(&self.state)));
    }

    /// A `[gateway]` section pointing at this fake, with the right credentials.
    pub fn config(&self) -> GatewayConfig {
        let url = format!("http://{}", self.addr);
        GatewayConfig {
            auth_url: Some(url.clone()),
            gateway_url: Some(url),
            username: Some(USERNAME.to_owned()),
            password: Some(Secret::new(PASSWORD)),
            timeout: Duration::from_secs(5),
            ..GatewayConfig::default()
        }
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut GatewayState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Waits (bounded) until `ready` holds.
    pub async fn until(&self, what: &str, ready: impl Fn(&GatewayState) -> bool) {
        let deadline = tokio::time::Instant::now() + super::DEADLINE;
        while !ready(&self.state.lock().unwrap()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fake gateway never saw: {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.stop();
    }
}

fn answer(status: u16, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn message(status: u16, text: &str) -> Response<Full<Bytes>> {
    answer(status, &json!({ "message": text }))
}

/// A refusal of a login or refresh: `text`, or — with [`GatewayState::echo_refusals`] — a
/// page that quotes the request's `body`.
fn refusal(state: &GatewayState, status: u16, text: &str, body: &[u8]) -> Response<Full<Bytes>> {
    if !state.echo_refusals {
        return message(status, text);
    }
    let page = format!("<html>refused: {}</html>", String::from_utf8_lossy(body));
    Response::builder()
        .status(status)
        .header("content-type", "text/html")
        .body(Full::new(Bytes::from(page)))
        .unwrap()
}

async fn handle(
    state: &Mutex<GatewayState>,
    request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let traceparent = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    state
        .lock()
        .unwrap()
        .traceparents
        .push((format!("{method} {path}"), traceparent));
    let authorized = state.lock().unwrap().authorized(&request);
    let authorization = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let Ok(body) = body else {
        return message(400, "unreadable body");
    };
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match (method.as_str(), path.as_str()) {
        ("POST", "/api/v1/login") => {
            let delay = {
                let mut state = state.lock().unwrap();
                state.login_attempts += 1;
                state.login_delay
            };
            tokio::time::sleep(delay).await;
            let mut state = state.lock().unwrap();
            if state.refuse_logins
                || json["username"] != USERNAME
                || json["password"] != state.password.as_str()
            {
                return refusal(&state, 401, "invalid username or password", &body);
            }
            state.logins += 1;
            answer(200, &state.session())
        }
        ("POST", "/api/v1/refresh-token") => {
            let mut state = state.lock().unwrap();
            state.refresh_attempts += 1;
            if let Some(status) = state.refuse_refreshes {
                return refusal(&state, status, "refresh token revoked", &body);
            }
            let token = json["refreshToken"].as_str().unwrap_or_default();
            let valid = state
                .refresh
                .remove(token)
                .is_some_and(|expiry| expiry > Utc::now());
            if !valid {
                return message(401, "refresh token expired or unknown");
            }
            state.refreshes += 1;
            answer(200, &state.session())
        }
        _ if !authorized => {
            state.lock().unwrap().unauthorized += 1;
            message(401, "unauthorized")
        }
        ("POST", "/api/v1/transactions/validation") => {
            let delay = state.lock().unwrap().post_delay;
            tokio::time::sleep(delay).await;
            let mut state = state.lock().unwrap();
            if let Some(id) = json["validationId"].as_i64() {
                state.attempted.push(id);
            }
            if let Some(status) = state.fail_next.pop_front() {
                if state.echo_failures {
                    let echo = format!(
                        "refused: Authorization: {authorization} {}",
                        "x".repeat(4_000)
                    );
                    return message(status, &echo);
                }
                if state.bare_failures {
                    return Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                }
                let mut refused = message(status, "scripted failure");
                if let Some(wait) = &state.retry_after {
                    refused
                        .headers_mut()
                        .insert("retry-after", wait.parse().unwrap());
                }
                return refused;
            }
            let (Some(id), Some(success)) =
                (json["validationId"].as_i64(), json["success"].as_bool())
            else {
                return message(400, "validationId and success are required");
            };
            let description = json["description"].as_str().unwrap_or_default().to_owned();
            let status = match state.results.get(&id) {
                Some((recorded, _)) if *recorded != success => 403,
                Some(_) => 200,
                None => {
                    state.results.insert(id, (success, description));
                    200
                }
            };
            state.posts.push((id, success, status));
            if status == 403 {
                message(403, "a result with a different status was already received")
            } else {
                message(200, "result received")
            }
        }
        ("GET", path) if path.starts_with("/api/v1/transactions/") => {
            let reference = &path["/api/v1/transactions/".len()..];
            let (record, hold) = {
                let mut state = state.lock().unwrap();
                state.lookups += 1;
                let record = state.transactions.get(reference).cloned();
                (record, state.hold_next_lookup.take())
            };
            if let Some(hold) = hold {
                let _ = hold.await;
            }
            match record {
                Some(record) => answer(200, &record),
                None => message(404, "transaction not found"),
            }
        }
        _ => message(404, "no such endpoint"),
    }
}

/// The admin token of [`lookup_traceparent`]'s server.
pub const ADMIN_TOKEN: &str = "admin-token-0123456789";

/// Reconciles one unknown transaction through the operating API (a lookup at the gateway)
/// with `traceparent` as the request's header, if any; returns the lookup's `traceparent`.
#[allow(dead_code, reason = "not every test binary follows traces")]
pub async fn lookup_traceparent(traceparent: Option<&str>) -> String {
    let gateway = FakeGateway::start().await;
    let mut config = super::test_config();
    config.gateway = gateway.config();
    config.admin.token = Some(ADMIN_TOKEN.into());
    let server = super::TestServer::start_with(config).await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", bearer.as_str()),
    ];
    if let Some(traceparent) = traceparent {
        headers.push(("traceparent", traceparent));
    }
    let reference = uuid::Uuid::new_v4();
    let body = format!(r#"{{"referenceIds": ["{reference}"]}}"#);
    let answer = server
        .send(&super::request(
            "POST",
            "/payhook/admin/reconcile",
            &headers,
            Some(body.as_bytes()),
        ))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.message());
    let lookup = format!("GET /api/v1/transactions/{reference}");
    gateway.with(|state| {
        let seen: Vec<_> = state
            .traceparents
            .iter()
            .filter(|(call, _)| *call == lookup)
            .collect();
        assert_eq!(seen.len(), 1, "{:?}", state.traceparents);
        // Every call carries one, the login included.
        assert!(
            state
                .traceparents
                .iter()
                .all(|(_, header)| header.is_some()),
            "{:?}",
            state.traceparents
        );
        seen[0].1.clone().unwrap()
    })
}
