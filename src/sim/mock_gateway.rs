//! A local aggregator: the endpoints of spec 4.1 with the spec's semantics, for testing a
//! merchant's client and its whole flow offline.
//!
//! | endpoint | behaviour |
//! |---|---|
//! | `POST /api/v1/login` | the configured credentials → a session of real HS256 JWTs (2.1); else 401 |
//! | `POST /api/v1/refresh-token` | a valid, unused, unexpired refresh token → a new session; else 401 |
//! | `POST /api/v1/transactions/validation` | bearer token required; first result 200, the same again 200, a different one 403 |
//! | `GET /api/v1/transactions/{referenceId}` | bearer token required; the 2.6 record, 404 for an unknown id, 400 for a non-GUID |
//! | `PUT /sim/v1/transactions/{referenceId}` | (simulator) create or replace a transaction record |
//! | `GET /sim/v1/validations/{validationId}` | (simulator) the result posted for a validation, 404 while none |
//! | `GET /sim/v1/validations/{validationId}/refused` | (simulator) the results refused with 403 for a validation, in order |
//! | `GET /sim/v1/validations/{validationId}/posts` | (simulator) how many results were posted for a validation: answered 200, refused 403 |
//! | `GET /sim/v1/counters` | (simulator) logins, refreshes, refused tokens, conflicting results |
//!
//! Every error body is `{"message": "..."}`. State is kept in memory, or in a sled directory
//! when one is given, so that a restart keeps it.

use crate::model::ValidationId;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::{
    collections::{BTreeMap, HashSet},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle, task::JoinSet};
use uuid::Uuid;

use super::SimError;
use super::jwt::{Claims, Issuer, Use};
use crate::Secret;
use crate::auth::Expected;
use crate::config::GatewayConfig;
use crate::model::{LoginRequest, PostponedValidationResult, RefreshRequest, TransactionRecord};

/// Largest request body the mock reads.
const BODY_LIMIT: usize = 1024 * 1024;

/// The merchant user a mock gateway accepts unless told otherwise.
pub const DEFAULT_USERNAME: &str = "merchant";
/// Its password unless told otherwise (a local test tool's, not a secret).
pub const DEFAULT_PASSWORD: &str = "merchant-password";

/// How a mock gateway runs.
#[derive(Debug, Clone)]
pub struct MockGatewayConfig {
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// The merchant user it accepts.
    pub username: String,
    /// Its password.
    pub password: Secret,
    /// Lifetime of access tokens (short ones exercise the client's refresh).
    pub access_lifetime: Duration,
    /// Lifetime of refresh tokens.
    pub refresh_lifetime: Duration,
    /// Keep the state in this sled directory (kept across restarts); `None`: in memory.
    pub state: Option<PathBuf>,
}

impl Default for MockGatewayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            username: DEFAULT_USERNAME.into(),
            password: Secret::new(DEFAULT_PASSWORD),
            access_lifetime: Duration::from_secs(15 * 60),
            refresh_lifetime: Duration::from_secs(24 * 3600),
            state: None,
        }
    }
}

/// What the mock gateway holds: persisted as one JSON document when a state directory is set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// The secret tokens are signed with (random per state).
    secret: Vec<u8>,
    transactions: BTreeMap<Uuid, TransactionRecord>,
    results: BTreeMap<i64, PostponedValidationResult>,
    /// Results refused with 403 (a different one was held), by validation, in order.
    #[serde(default)]
    refused: BTreeMap<i64, Vec<PostponedValidationResult>>,
    /// Results answered 200 (recorded, or the one recorded again), by validation.
    #[serde(default)]
    accepted: BTreeMap<i64, u32>,
    /// Refresh tokens already used (by `jti`): a refresh token works once.
    used_refresh: HashSet<String>,
    counters: MockCounters,
}

/// The results posted for one validation, as the mock answered them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ValidationPosts {
    /// Answered 200: recorded, or the one recorded again.
    pub accepted: u32,
    /// Refused with 403: a different result was recorded before.
    pub refused: u32,
}

/// What the mock gateway has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MockCounters {
    /// Successful logins.
    pub logins: u32,
    /// Successful refreshes.
    pub refreshes: u32,
    /// Calls refused for a missing, invalid or expired token.
    pub unauthorized: u32,
    /// Postponed results refused with 403 (a different one was recorded).
    pub conflicts: u32,
    /// Postponed results answered 200 (recorded, or the one recorded again).
    pub results: u32,
}

struct Shared {
    config: MockGatewayConfig,
    /// The password, compared in constant time.
    password: Expected,
    issuer: Issuer,
    state: Mutex<State>,
    store: Option<sled::Db>,
}

/// A running mock gateway; stops when dropped ([`MockGateway::stop`] waits until its state
/// directory is released, e.g. to start it again).
pub struct MockGateway {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for MockGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockGateway")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MockGateway {
    /// Binds and starts serving.
    ///
    /// # Errors
    ///
    /// [`SimError`] when the address cannot be bound or the state directory opened.
    pub async fn start(config: MockGatewayConfig) -> Result<Self, SimError> {
        let store = match &config.state {
            Some(path) => Some(
                crate::store::open_locked(&sled::Config::new().path(path))
                    .map_err(|e| SimError::setup(format!("state {}", path.display())).because(e))?,
            ),
            None => None,
        };
        let mut state: State = match store.as_ref().map(|db| db.get("state")) {
            Some(Ok(Some(bytes))) => serde_json::from_slice(&bytes)
                .map_err(|e| SimError::setup("state is unreadable").because(e))?,
            Some(Err(e)) => return Err(SimError::setup("state").because(e)),
            _ => State::default(),
        };
        if state.secret.is_empty() {
            state.secret = random_secret()?;
        }
        let listener = TcpListener::bind(config.listen).await.map_err(|e| {
            SimError::setup(format!("cannot listen on {}", config.listen)).because(e)
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| SimError::setup("the listener has no address").because(e))?;
        let shared = Arc::new(Shared {
            password: Expected::new(config.password.expose().as_bytes()),
            issuer: Issuer::new(&state.secret),
            config,
            state: Mutex::new(state),
            store,
        });
        shared.save();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept(listener, Arc::clone(&shared), stopped));
        tracing::info!(%addr, "mock gateway listening");
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            task,
        })
    }

    /// Stops serving, closes every connection, and returns once the state is saved and its
    /// directory released.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL, both `{auth_url}` and `{gateway_url}`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `[gateway]` section for a merchant to use this mock.
    pub fn gateway_config(&self) -> GatewayConfig {
        GatewayConfig {
            auth_url: Some(self.url()),
            gateway_url: Some(self.url()),
            username: Some(self.shared.config.username.clone()),
            password: Some(self.shared.config.password.clone()),
            ..GatewayConfig::default()
        }
    }

    /// Creates or replaces a transaction record.
    pub fn put_transaction(&self, record: TransactionRecord) {
        self.shared.update(|state| {
            state
                .transactions
                .insert(record.transaction_reference_id, record);
        });
    }

    /// A transaction record.
    pub fn transaction(&self, reference_id: Uuid) -> Option<TransactionRecord> {
        self.shared
            .read(|state| state.transactions.get(&reference_id).cloned())
    }

    /// The result posted for a validation.
    pub fn validation_result(
        &self,
        validation_id: ValidationId,
    ) -> Option<PostponedValidationResult> {
        self.shared
            .read(|state| state.results.get(&validation_id.get()).cloned())
    }

    /// What it has seen.
    pub fn counters(&self) -> MockCounters {
        self.shared.read(|state| state.counters)
    }
}

impl Drop for MockGateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Shared {
    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner));
        self.save();
        out
    }

    /// Writes the state to the state directory, if any.
    fn save(&self) {
        let Some(db) = &self.store else {
            return;
        };
        let json = self.read(|state| serde_json::to_vec(state).unwrap_or_default());
        if let Err(error) = db.insert("state", json).and_then(|_| db.flush()) {
            tracing::error!(%error, "mock gateway: saving the state failed");
        }
    }

    fn now_ms() -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    /// A new session (spec 2.1) of signed tokens.
    fn session(&self) -> serde_json::Value {
        let now = Self::now_ms();
        let lifetime = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let claims = |token_use, life| Claims {
            sub: self.config.username.clone(),
            iat: now / 1000,
            exp: super::jwt::expiry_seconds(now.saturating_add(life)),
            exp_ms: now.saturating_add(life),
            token_use,
            jti: Uuid::new_v4().to_string(),
        };
        let access = claims(Use::Access, lifetime(self.config.access_lifetime));
        let refresh = claims(Use::Refresh, lifetime(self.config.refresh_lifetime));
        let time = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(ms)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        json!({
            "username": self.config.username,
            "accessToken": self.issuer.issue(&access),
            "refreshToken": self.issuer.issue(&refresh),
            "accessTokenExpiryUtc": time(access.exp_ms),
            "refreshTokenExpiryUtc": time(refresh.exp_ms),
            "roles": ["merchant"],
        })
    }

    /// Whether the request carries a valid access token (counted when not).
    fn authorized(&self, request: &Request<Incoming>) -> bool {
        let token = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let valid = self
            .issuer
            .check(token, Use::Access, Self::now_ms())
            .is_ok();
        if !valid {
            self.update(|state| state.counters.unauthorized += 1);
        }
        valid
    }
}

fn random_secret() -> Result<Vec<u8>, SimError> {
    let mut secret = vec![0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
        .map_err(|_| SimError::setup("no randomness for the token secret"))?;
    Ok(secret)
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    // Connections end with the accept loop: a stopped mock drops them all.
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stop => {
                connections.shutdown().await;
                return;
            }
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, std::convert::Infallible>(handle(&shared, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

fn answer(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    answer_bytes(status, body.to_string().into_bytes())
}

/// An answer serialised straight from a typed value, so that exact amounts stay exact.
fn answer_typed<T: Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    answer_bytes(status, serde_json::to_vec(value).unwrap_or_default())
}

fn answer_bytes(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn message(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    answer(status, &json!({ "message": text }))
}

async fn handle(shared: &Shared, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let needs_token = path.starts_with("/api/v1/transactions");
    if needs_token && !shared.authorized(&request) {
        return message(
            StatusCode::UNAUTHORIZED,
            "missing, invalid or expired access token",
        );
    }
    let body = match Limited::new(request.into_body(), BODY_LIMIT)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => return message(StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::POST, ["api", "v1", "login"]) => login(shared, &body),
        (&Method::POST, ["api", "v1", "refresh-token"]) => refresh(shared, &body),
        (&Method::POST, ["api", "v1", "transactions", "validation"]) => {
            validation_result(shared, &body)
        }
        (&Method::GET, ["api", "v1", "transactions", id]) => match id.parse::<Uuid>() {
            Ok(id) => match shared.read(|s| s.transactions.get(&id).cloned()) {
                Some(record) => answer_typed(StatusCode::OK, &record),
                None => message(StatusCode::NOT_FOUND, "transaction not found"),
            },
            Err(_) => message(
                StatusCode::BAD_REQUEST,
                "transactionReferenceId is not a GUID",
            ),
        },
        (&Method::PUT, ["sim", "v1", "transactions", _]) => {
            match serde_json::from_slice::<TransactionRecord>(&body) {
                Ok(record) => {
                    shared.update(|s| {
                        s.transactions
                            .insert(record.transaction_reference_id, record);
                    });
                    message(StatusCode::OK, "stored")
                }
                Err(e) => message(
                    StatusCode::BAD_REQUEST,
                    &format!("not a transaction record: {e}"),
                ),
            }
        }
        (&Method::GET, ["sim", "v1", "counters"]) => {
            answer_typed(StatusCode::OK, &shared.read(|s| s.counters))
        }
        (&Method::GET, ["sim", "v1", "validations", id, "posts"]) => {
            let posts =
                id.parse::<ValidationId>()
                    .ok()
                    .map_or_else(ValidationPosts::default, |id| {
                        shared.read(|s| ValidationPosts {
                            accepted: s.accepted.get(&id.get()).copied().unwrap_or(0),
                            refused: s
                                .refused
                                .get(&id.get())
                                .map_or(0, |r| u32::try_from(r.len()).unwrap_or(u32::MAX)),
                        })
                    });
            answer_typed(StatusCode::OK, &posts)
        }
        (&Method::GET, ["sim", "v1", "validations", id, "refused"]) => {
            let refused = id.parse::<ValidationId>().ok().map_or_else(Vec::new, |id| {
                shared.read(|s| s.refused.get(&id.get()).cloned().unwrap_or_default())
            });
            answer_typed(StatusCode::OK, &refused)
        }
        (&Method::GET, ["sim", "v1", "validations", id]) => {
            match id
                .parse::<ValidationId>()
                .ok()
                .and_then(|id| shared.read(|s| s.results.get(&id.get()).cloned()))
            {
                Some(result) => answer_typed(StatusCode::OK, &result),
                None => message(
                    StatusCode::NOT_FOUND,
                    "no result posted for this validation",
                ),
            }
        }
        (_, ["api" | "sim", ..]) => message(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        _ => message(StatusCode::NOT_FOUND, "no endpoint at this path"),
    }
}

fn login(shared: &Shared, body: &[u8]) -> Response<Full<Bytes>> {
    let Ok(request) = serde_json::from_slice::<LoginRequest>(body) else {
        return message(
            StatusCode::BAD_REQUEST,
            "username and password are required",
        );
    };
    if request.username != shared.config.username
        || !shared
            .password
            .matches(request.password.expose().as_bytes())
    {
        return message(StatusCode::UNAUTHORIZED, "invalid username or password");
    }
    shared.update(|s| s.counters.logins += 1);
    answer(StatusCode::OK, &shared.session())
}

fn refresh(shared: &Shared, body: &[u8]) -> Response<Full<Bytes>> {
    let Ok(request) = serde_json::from_slice::<RefreshRequest>(body) else {
        return message(StatusCode::BAD_REQUEST, "refreshToken is required");
    };
    let checked = shared.issuer.check(
        request.refresh_token.expose(),
        Use::Refresh,
        Shared::now_ms(),
    );
    let fresh = match checked {
        Ok(claims) => shared.update(|s| s.used_refresh.insert(claims.jti)),
        Err(_) => false,
    };
    if !fresh {
        return message(
            StatusCode::UNAUTHORIZED,
            "refresh token expired, used or invalid",
        );
    }
    shared.update(|s| s.counters.refreshes += 1);
    answer(StatusCode::OK, &shared.session())
}

fn validation_result(shared: &Shared, body: &[u8]) -> Response<Full<Bytes>> {
    let Ok(result) = serde_json::from_slice::<PostponedValidationResult>(body) else {
        return message(
            StatusCode::BAD_REQUEST,
            "validationId (number) and success (boolean) are required",
        );
    };
    let conflict = shared.update(|s| match s.results.get(&result.validation_id.get()) {
        Some(recorded) if recorded.success != result.success => {
            s.counters.conflicts += 1;
            s.refused
                .entry(result.validation_id.get())
                .or_default()
                .push(result.clone());
            true
        }
        Some(_) => {
            s.counters.results += 1;
            *s.accepted.entry(result.validation_id.get()).or_default() += 1;
            false
        }
        None => {
            s.results.insert(result.validation_id.get(), result.clone());
            s.counters.results += 1;
            *s.accepted.entry(result.validation_id.get()).or_default() += 1;
            false
        }
    });
    if conflict {
        message(
            StatusCode::FORBIDDEN,
            "a result with a different status was already received",
        )
    } else {
        message(StatusCode::OK, "result received")
    }
}

/// The simulator's calls to a running mock gateway (its `/sim/v1` endpoints), for a trigger
/// in another process than the mock.
pub struct MockControl {
    base: String,
    http: crate::gateway::HttpClient,
}

impl std::fmt::Debug for MockControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockControl")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl MockControl {
    /// Control of the mock gateway at `base_url` (e.g. `http://127.0.0.1:9090`).
    ///
    /// # Errors
    ///
    /// [`SimError::Setup`] when the HTTP client cannot be built.
    pub fn new(base_url: &str) -> Result<Self, SimError> {
        Ok(Self {
            base: base_url.trim_end_matches('/').to_owned(),
            http: crate::gateway::direct_client()
                .map_err(|e| SimError::setup("cannot build the HTTP client").because(e))?,
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), SimError> {
        let url = format!("{}{path}", self.base);
        let request = Request::builder()
            .method(method)
            .uri(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| SimError::request("cannot build the request").because(e))?;
        let call = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let body = Limited::new(response.into_body(), BODY_LIMIT)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .map_err(|_| SimError::gateway(format!("{url}: no answer within 10s")))?
            .map_err(|e| SimError::gateway(url.clone()).because(e))
    }

    /// The result posted for validation `id`, if any.
    ///
    /// # Errors
    ///
    /// [`SimError::Gateway`] when the mock cannot be reached or answers strangely.
    pub async fn validation_result(
        &self,
        id: ValidationId,
    ) -> Result<Option<PostponedValidationResult>, SimError> {
        let (status, body) = self
            .call(Method::GET, &format!("/sim/v1/validations/{id}"), None)
            .await?;
        match status {
            StatusCode::OK => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| SimError::gateway("unreadable result").because(e)),
            StatusCode::NOT_FOUND => Ok(None),
            other => Err(SimError::gateway(format!("mock gateway answered {other}"))),
        }
    }

    /// The results of validation `id` the mock refused with 403 because it held a different
    /// one, in the order they arrived.
    ///
    /// # Errors
    ///
    /// [`SimError::Gateway`] when the mock cannot be reached or answers strangely.
    pub async fn refused_results(
        &self,
        id: ValidationId,
    ) -> Result<Vec<PostponedValidationResult>, SimError> {
        let path = format!("/sim/v1/validations/{id}/refused");
        let (status, body) = self.call(Method::GET, &path, None).await?;
        if !status.is_success() {
            return Err(SimError::gateway(format!("mock gateway answered {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| SimError::gateway("refused").because(e))
    }

    /// How many results were posted for validation `id`, accepted and refused.
    ///
    /// # Errors
    ///
    /// [`SimError::Gateway`] when the mock cannot be reached or answers strangely.
    pub async fn validation_posts(&self, id: ValidationId) -> Result<ValidationPosts, SimError> {
        let path = format!("/sim/v1/validations/{id}/posts");
        let (status, body) = self.call(Method::GET, &path, None).await?;
        if !status.is_success() {
            return Err(SimError::gateway(format!("mock gateway answered {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| SimError::gateway("posts").because(e))
    }

    /// Waits (polling) up to `timeout` for the result of validation `id`.
    ///
    /// # Errors
    ///
    /// As [`MockControl::validation_result`].
    pub async fn await_validation_result(
        &self,
        id: ValidationId,
        timeout: Duration,
    ) -> Result<Option<PostponedValidationResult>, SimError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(result) = self.validation_result(id).await? {
                return Ok(Some(result));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the mock has counted.
    ///
    /// # Errors
    ///
    /// [`SimError::Gateway`] when the mock cannot be reached or answers strangely.
    pub async fn counters(&self) -> Result<MockCounters, SimError> {
        let (status, body) = self.call(Method::GET, "/sim/v1/counters", None).await?;
        if !status.is_success() {
            return Err(SimError::gateway(format!("mock gateway answered {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| SimError::gateway("counters").because(e))
    }

    /// Creates or replaces a transaction record on the mock.
    ///
    /// # Errors
    ///
    /// [`SimError::Gateway`] when the mock cannot be reached or refuses it.
    pub async fn put_transaction(&self, record: &TransactionRecord) -> Result<(), SimError> {
        let body = serde_json::to_vec(record)
            .map_err(|e| SimError::request("cannot encode the record").because(e))?;
        let path = format!("/sim/v1/transactions/{}", record.transaction_reference_id);
        let (status, body) = self.call(Method::PUT, &path, Some(body)).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(SimError::gateway(format!(
                "mock gateway refused the record ({status}): {}",
                String::from_utf8_lossy(&body)
            )))
        }
    }
}
