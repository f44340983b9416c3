//! A client of the aggregator's own endpoints (spec 4.1): login, token refresh, the result
//! of a postponed validation, and the lookup of a transaction by its reference id.
//!
//! [`GatewayClient`] keeps the merchant's session fresh by itself (see `token.rs`): it logs
//! in on first use, refreshes `refresh_margin` before `accessTokenExpiryUtc` (at most half
//! the token's granted lifetime before it), logs in again
//! when the refresh token has expired too, and on a 401 refreshes once and retries once.
//! Concurrent callers share one login or refresh. Every HTTP exchange is bounded by
//! `gateway.timeout`; a call may make several (a renewal of the session — a refresh, then a
//! login if the refresh is refused — and, after a 401, a renewal and the call again), and
//! waits meanwhile for a renewal another caller has in progress. TLS is rustls on the ring provider with the webpki roots; plain HTTP is
//! accepted on loopback hosts only (see [`GatewayConfig`]).
//!
//! The password and the tokens are [`Secret`]s: they appear in no log line and no `Debug`.
//! A password changed at the aggregator is given to the running client with
//! [`GatewayClient::replace_credentials`] (the service's SIGHUP, or the operating API's
//! `credentials/read-again`, does it from its configuration): the next login sends it.
//!
//! Every call sends a W3C `traceparent`: a child of the [`TraceContext`] it runs in (the
//! request it serves), else the first span of a new trace ([`crate::trace_context`]).
//!
//! ```no_run
//! use payhook::gateway::GatewayClient;
//! use payhook::model::PostponedValidationResult;
//!
//! # async fn run(config: payhook::Config) -> Result<(), payhook::gateway::GatewayError> {
//! let gateway = GatewayClient::new(&config.gateway)?;
//! gateway
//!     .post_validation_result(&PostponedValidationResult {
//!         validation_id: 42.into(),
//!         success: true,
//!         description: "documents checked".into(),
//!     })
//!     .await?;
//! let record = gateway.transaction("0b7e5a52-2f59-4c1e-9d0c-000000000001".parse().unwrap()).await?;
//! println!("{} is {:?}", record.transaction_reference_id, record.transaction_status);
//! # Ok(()) }
//! ```

mod observed;
mod settings;
mod token;
mod transport;

use crate::model::ValidationId;
use crate::trace_context::{self, TraceContext};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use serde::{Serialize, de::DeserializeOwned};
use std::{sync::Arc, time::Duration};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::Secret;
use crate::current::Current;
use crate::model::{
    LoginRequest, LoginSession, PostponedValidationResult, RefreshRequest, TransactionRecord,
};
use observed::Call;
pub(crate) use observed::GatewayMetrics;
pub use settings::GatewayConfig;
pub(crate) use settings::check_remote_url;
#[cfg(feature = "sim")]
pub(crate) use settings::parse_http_url;
pub use token::SessionState;
use token::Sessions;
pub(crate) use transport::{HttpClient, direct_client};

/// The largest answer read from the aggregator.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// The error beneath a gateway error: shared, because one failed session renewal answers
/// every caller that waited for it.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// Why a call to the aggregator failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// A setting the client needs is missing or unusable.
    #[error("gateway not configured: {0}")]
    NotConfigured(String),
    /// Login or refresh was refused: answered with a 4xx other than 408 and 429 (the
    /// aggregator's message, the password or refresh token sent replaced by `***`).
    #[error("login refused by {url}: {message}")]
    BadCredentials {
        /// The endpoint called.
        url: String,
        /// The aggregator's `message`.
        message: String,
    },
    /// The aggregator could not be reached.
    #[error("cannot reach {url}")]
    Network {
        /// The endpoint called.
        url: String,
        /// What went wrong.
        #[source]
        source: Cause,
    },
    /// No complete answer within `gateway.timeout`.
    #[error("{url} did not answer within {timeout:?}")]
    Timeout {
        /// The endpoint called.
        url: String,
        /// The bound.
        timeout: Duration,
    },
    /// The aggregator answered with an error status.
    #[error("{url} answered {status}: {message}")]
    Status {
        /// The endpoint called.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The aggregator's `message` (or the start of the body).
        message: String,
        /// How long the aggregator asked to wait before calling again (`Retry-After` of a
        /// 429 or a 503, in seconds or as an HTTP date; at most [`MAX_RETRY_AFTER`]).
        retry_after: Option<Duration>,
    },
    /// The answer was not the expected JSON.
    #[error("{url} answered with an unreadable body")]
    Decode {
        /// The endpoint called.
        url: String,
        /// What is wrong.
        #[source]
        source: Cause,
    },
    /// A different result was already received for this validation (403, spec 3.2).
    #[error("validation {validation_id}: a different result was already received: {message}")]
    Conflict {
        /// The validation.
        validation_id: ValidationId,
        /// The aggregator's `message`.
        message: String,
    },
}

impl GatewayError {
    /// `true` when the same call may succeed later (network, timeout, 5xx, 408, 429, 401).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Network { .. } | Self::Timeout { .. } => true,
            Self::Status { status, .. } => *status >= 500 || [401, 408, 429].contains(status),
            Self::NotConfigured(_)
            | Self::BadCredentials { .. }
            | Self::Decode { .. }
            | Self::Conflict { .. } => false,
        }
    }

    /// How long the aggregator asked to wait before calling again (`Retry-After` of a 429
    /// or a 503), when it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status the aggregator answered, when it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            Self::Conflict { .. } => Some(403),
            _ => None,
        }
    }
}

/// The aggregator's endpoints, with the session kept fresh. Cheap to clone: clones share the
/// connection pool and the session.
#[derive(Clone)]
pub struct GatewayClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// The HTTP client, built again when the TLS files change
    /// ([`GatewayClient::read_tls_files_again`]).
    transport: Current<Transport>,
    /// `[gateway]` as the transport was built from (no user nor password): its proxy, for
    /// building it again.
    transport_config: GatewayConfig,
    auth_url: String,
    gateway_url: String,
    /// The merchant's user and password as given last
    /// ([`GatewayClient::replace_credentials`]).
    login: Current<Login>,
    timeout: Duration,
    auth_header: HeaderName,
    auth_scheme: String,
    sessions: Sessions,
    /// Each call's time and errors.
    metrics: GatewayMetrics,
}

impl std::fmt::Debug for GatewayClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayClient")
            .field("auth_url", &self.inner.auth_url)
            .field("gateway_url", &self.inner.gateway_url)
            .field("username", &self.held_login().username)
            .finish_non_exhaustive()
    }
}

/// An HTTP client and the TLS files it was built with.
pub(crate) struct Transport {
    http: HttpClient,
    /// The digest of the TLS files it was built with ([`transport::gateway_client`]).
    tls_files: [u8; 32],
    /// The digest of the transport's it replaces, when built to replace one.
    replaces: [u8; 32],
}

/// The merchant's user and password, one version of them.
pub(super) struct Login {
    username: String,
    password: Secret,
    /// Counts the replacements: a refusal of one version pauses no login with the next.
    pub(super) version: u64,
}

impl Login {
    /// The version after this one, with `username` and `password`.
    fn next(&self, username: String, password: Secret) -> Self {
        Self {
            username,
            password,
            version: self.version.wrapping_add(1),
        }
    }
}

/// The longest `Retry-After` taken: a longer one (an hour and more, or a date far ahead) is
/// taken as an hour, so that a misconfigured proxy cannot hold results back for days.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// One exchange's outcome: the status and the (bounded) body.
struct Answer {
    url: String,
    status: StatusCode,
    body: Bytes,
    /// `Retry-After` of a 429 or a 503 (see [`retry_after`]).
    retry_after: Option<Duration>,
    /// The access token the request carried: never part of a message made of the answer.
    token: Option<Secret>,
}

/// The most of an answer's message kept (the outbox's last error, a conflict's message).
const MESSAGE_CHARS: usize = 200;

/// The aggregator's error body (spec, section 7): `{"message": "..."}`.
#[derive(serde::Deserialize)]
struct Message {
    message: String,
}

impl Answer {
    /// Whether the body is the aggregator's error body, `{"message": "..."}`, as every error
    /// of its own is (spec, section 7); a proxy's or a framework's refusal is not.
    fn is_aggregators_error(&self) -> bool {
        serde_json::from_slice::<Message>(&self.body).is_ok()
    }

    fn json<T: DeserializeOwned>(&self) -> Result<T, GatewayError> {
        serde_json::from_slice(&self.body).map_err(|e| GatewayError::Decode {
            url: self.url.clone(),
            source: Arc::new(e),
        })
    }

    /// The aggregator's `message`, or the start of the body when it sent no JSON message; at
    /// most [`MESSAGE_CHARS`] characters, without the access token the request carried.
    fn message(&self) -> String {
        self.message_without(&[])
    }

    /// [`Self::message`], each of `secrets` in it replaced by `***` before it is cut short
    /// (so that no part of one is left): an answer that echoes the request — an error page
    /// of a proxy — would otherwise keep a password or token in the outbox's last error, the
    /// logs and the inspector.
    fn message_without(&self, secrets: &[&str]) -> String {
        let token = self.token.as_ref().map(Secret::expose);
        let secrets: Vec<&str> = secrets.iter().copied().chain(token).collect();
        serde_json::from_slice::<Message>(&self.body).map_or_else(
            |_| {
                let text = String::from_utf8_lossy(&self.body);
                let text = text.trim();
                if text.is_empty() {
                    self.status
                        .canonical_reason()
                        .unwrap_or("no message")
                        .to_owned()
                } else {
                    crate::secret::redacted(text, &secrets, MESSAGE_CHARS)
                }
            },
            |m| crate::secret::redacted(&m.message, &secrets, MESSAGE_CHARS),
        )
    }

    fn error(&self) -> GatewayError {
        GatewayError::Status {
            url: self.url.clone(),
            status: self.status.as_u16(),
            message: self.message(),
            retry_after: self.retry_after,
        }
    }
}

/// Builds a [`GatewayClient`]; every setting not set keeps the default of
/// [`GatewayConfig`], and [`GatewayClientBuilder::build`] checks them once.
///
/// ```
/// use std::time::Duration;
///
/// let gateway = payhook::gateway::GatewayClient::builder()
///     .auth_url("https://auth.aggregator.example")
///     .gateway_url("https://gateway.aggregator.example")
///     .credentials("shop", "secret")
///     .timeout(Duration::from_secs(5)) // default 10 s
///     .build()?;
/// # let _ = gateway;
/// # Ok::<(), payhook::gateway::GatewayError>(())
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct GatewayClientBuilder {
    config: GatewayConfig,
}

impl GatewayClientBuilder {
    /// `{auth_url}`: login and refresh. Required.
    pub fn auth_url(mut self, url: impl Into<String>) -> Self {
        self.config.auth_url = Some(url.into());
        self
    }

    /// `{gateway_url}`: postponed results and lookups. Required.
    pub fn gateway_url(mut self, url: impl Into<String>) -> Self {
        self.config.gateway_url = Some(url.into());
        self
    }

    /// The merchant user and password. Required.
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        self.config.username = Some(username.into());
        self.config.password = Some(password.into());
        self
    }

    /// Bound on every call. Default 10 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// How long before its expiry the access token is refreshed. Default 60 s.
    pub fn refresh_margin(mut self, margin: Duration) -> Self {
        self.config.refresh_margin = margin;
        self
    }

    /// The header and scheme that carry the token. Default `Authorization`, `Bearer`.
    pub fn auth_header(mut self, header: impl Into<String>, scheme: impl Into<String>) -> Self {
        self.config.auth_header = header.into();
        self.config.auth_scheme = scheme.into();
        self
    }

    /// Checks the settings and builds the client.
    ///
    /// # Errors
    ///
    /// [`GatewayError::NotConfigured`] when a URL, the user name or the password is missing,
    /// or a setting is unusable.
    pub fn build(self) -> Result<GatewayClient, GatewayError> {
        GatewayClient::new(&self.config)
    }
}

impl GatewayClient {
    /// A builder, starting from the defaults.
    pub fn builder() -> GatewayClientBuilder {
        GatewayClientBuilder::default()
    }

    /// A client of the aggregator named by `config` (the `[gateway]` section).
    ///
    /// # Errors
    ///
    /// [`GatewayError::NotConfigured`] when a URL, the user name or the password is missing,
    /// or a setting is unusable.
    pub fn new(config: &GatewayConfig) -> Result<Self, GatewayError> {
        let missing = |key: &str| GatewayError::NotConfigured(format!("gateway.{key} is not set"));
        let base = |url: &Option<String>, key: &str| {
            let url = url.as_deref().ok_or_else(|| missing(key))?;
            check_remote_url(url)
                .map_err(|why| GatewayError::NotConfigured(format!("gateway.{key}: {why}")))?;
            Ok::<_, GatewayError>(url.trim_end_matches('/').to_owned())
        };
        if config.timeout.is_zero() {
            return Err(GatewayError::NotConfigured(
                "gateway.timeout must be longer than zero".into(),
            ));
        }
        let (http, tls_files) = transport::gateway_client(config).map_err(unusable)?;
        let transport = Transport {
            http,
            tls_files,
            replaces: tls_files,
        };
        let auth_header = HeaderName::from_bytes(config.auth_header.as_bytes()).map_err(|_| {
            GatewayError::NotConfigured(format!("`{}` is not a header name", config.auth_header))
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                transport: Current::new(transport),
                transport_config: GatewayConfig {
                    username: None,
                    password: None,
                    ..config.clone()
                },
                auth_url: base(&config.auth_url, "auth_url")?,
                gateway_url: base(&config.gateway_url, "gateway_url")?,
                login: Current::new(Login {
                    username: config.username.clone().ok_or_else(|| missing("username"))?,
                    password: config.password.clone().ok_or_else(|| missing("password"))?,
                    version: 0,
                }),
                timeout: config.timeout,
                auth_header,
                auth_scheme: config.auth_scheme.clone(),
                sessions: Sessions::new(config.refresh_margin),
                metrics: GatewayMetrics::default(),
            }),
        })
    }

    /// Replaces the merchant's user name and password — changed at the aggregator — in this
    /// client and its clones: the next login sends them, at once even where logins are
    /// paused after the aggregator refused the ones before. The session held goes on until it
    /// must be renewed (whether the tokens issued before still serve is the aggregator's
    /// to say: a token it refuses renews the session). Returns whether they differ from
    /// those held; the same ones change nothing.
    ///
    /// ```
    /// # fn run(gateway: &payhook::gateway::GatewayClient) {
    /// let password = payhook::Secret::new("the-new-password");
    /// if gateway.replace_credentials("shop", password) {
    ///     // The next login uses them.
    /// }
    /// # }
    /// ```
    pub fn replace_credentials(
        &self,
        username: impl Into<String>,
        password: impl Into<Secret>,
    ) -> bool {
        let (username, password) = (username.into(), password.into());
        self.inner.login.replace_with(|login| {
            (login.username != username || login.password != password)
                .then(|| login.next(username, password))
        })
    }

    /// A new version of the credentials as they are: a pause after the renewals of the old
    /// one ends (its failure may have been the TLS files'; the aggregator's login endpoint,
    /// or an mTLS front, may refuse a certificate with a 400).
    fn new_login_version(&self) {
        self.inner
            .login
            .replace_with(|login| Some(login.next(login.username.clone(), login.password.clone())));
    }

    /// Reads the TLS files again — `config`'s `ca_file`, `client_cert_file` and
    /// `client_key_file`; nothing else of it — and, when they changed (their paths or
    /// contents: a client certificate renewed in place, say), makes the next connections with
    /// them, in this client and its clones — at once even where renewals of the session are
    /// paused after failures. Calls under way finish on their connections. Returns whether
    /// they changed (and were taken: of two readings at once, the later one to finish finds
    /// the files the other took).
    ///
    /// # Errors
    ///
    /// [`GatewayError::NotConfigured`] naming the file that cannot be read or used: the
    /// client goes on with the files it had.
    pub fn read_tls_files_again(&self, config: &GatewayConfig) -> Result<bool, GatewayError> {
        Ok(self
            .transport_read_again(config)?
            .is_some_and(|transport| self.replace_transport(transport)))
    }

    /// A transport built with `config`'s TLS files, when they differ from the client's.
    pub(crate) fn transport_read_again(
        &self,
        config: &GatewayConfig,
    ) -> Result<Option<Transport>, GatewayError> {
        let config = GatewayConfig {
            ca_file: config.ca_file.clone(),
            client_cert_file: config.client_cert_file.clone(),
            client_key_file: config.client_key_file.clone(),
            ..self.inner.transport_config.clone()
        };
        // Built whatever the files say, from one reading of each, then compared.
        let (http, tls_files) = transport::gateway_client(&config).map_err(unusable)?;
        let replaces = self.inner.transport.hold().tls_files;
        Ok((tls_files != replaces).then_some(Transport {
            http,
            tls_files,
            replaces,
        }))
    }

    /// From the next call on, `transport`, unless the transport it was built to replace was
    /// replaced meanwhile; returns whether it was taken.
    pub(crate) fn replace_transport(&self, transport: Transport) -> bool {
        let taken = self
            .inner
            .transport
            .replace_with(|current| (current.tls_files == transport.replaces).then_some(transport));
        if taken {
            self.new_login_version();
        }
        taken
    }

    /// The user and password as given last.
    pub(super) fn held_login(&self) -> Arc<Login> {
        self.inner.login.now()
    }

    /// Where the client's session with the aggregator stands (for the inspector's health
    /// panel); never waits.
    pub fn session_state(&self) -> SessionState {
        self.inner.sessions.state()
    }

    /// `POST {auth_url}/api/v1/login` with the configured credentials. The session is not
    /// kept: the client's own calls log in by themselves when they need to.
    ///
    /// # Errors
    ///
    /// [`GatewayError::BadCredentials`] when the aggregator refuses the credentials; the
    /// other variants for network, status and body problems.
    pub async fn login(&self) -> Result<LoginSession, GatewayError> {
        self.login_as(&self.held_login()).await
    }

    /// [`GatewayClient::login`] as `login`.
    pub(super) async fn login_as(&self, login: &Login) -> Result<LoginSession, GatewayError> {
        let request = LoginRequest {
            username: login.username.clone(),
            password: login.password.clone(),
        };
        let url = format!("{}/api/v1/login", self.inner.auth_url);
        let secrets = [login.password.expose()];
        self.observed(Call::Login, self.session_call(&url, &request, &secrets))
            .await
    }

    /// `POST {auth_url}/api/v1/refresh-token`.
    ///
    /// # Errors
    ///
    /// As [`GatewayClient::login`].
    pub async fn refresh(&self, refresh_token: &Secret) -> Result<LoginSession, GatewayError> {
        let request = RefreshRequest {
            refresh_token: refresh_token.clone(),
        };
        let url = format!("{}/api/v1/refresh-token", self.inner.auth_url);
        let secrets = [refresh_token.expose()];
        self.observed(Call::Refresh, self.session_call(&url, &request, &secrets))
            .await
    }

    /// `POST {gateway_url}/api/v1/transactions/validation`: the result of a postponed
    /// validation, received when the aggregator answers 200 (spec 4.1; another 2xx is a
    /// [`GatewayError::Status`], tried again). Sending the same result again is harmless
    /// (the aggregator answers 200).
    ///
    /// # Errors
    ///
    /// [`GatewayError::Conflict`] on a 403 with the aggregator's error body (a different
    /// result was received before: final); a 403 without one (`{"message": …}`, spec section
    /// 7) is a [`GatewayError::Status`], tried again like any refusal; the other variants as
    /// for every call ([`GatewayError::is_transient`] tells whether to
    /// try again).
    pub async fn post_validation_result(
        &self,
        result: &PostponedValidationResult,
    ) -> Result<(), GatewayError> {
        let url = format!("{}/api/v1/transactions/validation", self.inner.gateway_url);
        let body = to_json(result);
        self.observed(Call::ValidationResult, async {
            let answer = self.authorized(Method::POST, &url, Some(body)).await?;
            match answer.status {
                StatusCode::OK => Ok(()),
                // The spec's answer for a result received is 200. Another 2xx (a 202 or a
                // 204 of a proxy or a gateway in between) does not say the aggregator has
                // it: taken for delivered, the result would never be posted again.
                status if status.is_success() => Err(GatewayError::Status {
                    url: url.clone(),
                    status: status.as_u16(),
                    message: "not the 200 the aggregator answers for a result received; \
                              posted again"
                        .to_owned(),
                    retry_after: None,
                }),
                // The aggregator's own 403 says it holds a different result. One without its
                // error body — a role the merchant's user lacks, a firewall, a proxy — is no
                // answer about the result: taken for final, the result would never be
                // delivered; as any other refusal, it is tried again.
                StatusCode::FORBIDDEN if answer.is_aggregators_error() => {
                    Err(GatewayError::Conflict {
                        validation_id: result.validation_id,
                        message: answer.message(),
                    })
                }
                _ => Err(answer.error()),
            }
        })
        .await
    }

    /// `GET {gateway_url}/api/v1/transactions/{reference_id}`: the transaction record (2.6).
    ///
    /// # Errors
    ///
    /// [`GatewayError::Status`] with 404 (or whatever the aggregator answers) for an unknown
    /// reference id; the other variants as for every call.
    pub async fn transaction(&self, reference_id: Uuid) -> Result<TransactionRecord, GatewayError> {
        let url = format!(
            "{}/api/v1/transactions/{reference_id}",
            self.inner.gateway_url
        );
        self.observed(Call::Transaction, async {
            let answer = self.authorized(Method::GET, &url, None).await?;
            if answer.status.is_success() {
                answer.json()
            } else {
                Err(answer.error())
            }
        })
        .await
    }

    /// The client's calls measured so far (shared by its clones), for `/metrics`.
    pub(crate) fn metrics(&self) -> &GatewayMetrics {
        &self.inner.metrics
    }

    /// Runs `work`, one `call`, and measures it.
    async fn observed<T>(
        &self,
        call: Call,
        work: impl std::future::Future<Output = Result<T, GatewayError>>,
    ) -> Result<T, GatewayError> {
        let started = std::time::Instant::now();
        let outcome = work.await;
        self.inner
            .metrics
            .observe(call, started.elapsed(), outcome.as_ref().err());
        outcome
    }

    /// A login or refresh exchange, whose request carries `secrets`: refusals are
    /// [`GatewayError::BadCredentials`] — every 4xx but 408 and 429, which ask to try again
    /// (the spec does not say which status refuses a refresh token: a refresh refused as 404
    /// or 422 must still lead to a new login, not to failing until the token expires).
    async fn session_call<T: Serialize>(
        &self,
        url: &str,
        request: &T,
        secrets: &[&str],
    ) -> Result<LoginSession, GatewayError> {
        let answer = self
            .exchange(Method::POST, url, Some(to_json(request)), None)
            .await?;
        let status = answer.status;
        if status.is_success() {
            return answer.json();
        }
        let message = answer.message_without(secrets);
        let again = [StatusCode::REQUEST_TIMEOUT, StatusCode::TOO_MANY_REQUESTS];
        if status.is_client_error() && !again.contains(&status) {
            return Err(GatewayError::BadCredentials {
                url: url.to_owned(),
                message,
            });
        }
        Err(GatewayError::Status {
            url: answer.url,
            status: status.as_u16(),
            message,
            retry_after: answer.retry_after,
        })
    }

    /// A call with the access token; on a 401 the session is renewed once and the call
    /// retried once.
    async fn authorized(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
    ) -> Result<Answer, GatewayError> {
        let sessions = &self.inner.sessions;
        let token = sessions.access_token(self).await?;
        let answer = self
            .exchange(method.clone(), url, body.clone(), Some(&token))
            .await?;
        if answer.status != StatusCode::UNAUTHORIZED {
            return Ok(answer);
        }
        tracing::info!(url, "access token refused; renewing the session once");
        sessions.reject(&token).await;
        let token = sessions.access_token(self).await?;
        self.exchange(method, url, body, Some(&token)).await
    }

    /// One HTTP exchange, bounded by the timeout; the body is read up to [`MAX_ANSWER`].
    async fn exchange(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
        token: Option<&Secret>,
    ) -> Result<Answer, GatewayError> {
        let network = |source: Box<dyn std::error::Error + Send + Sync>| GatewayError::Network {
            url: url.to_owned(),
            source: Arc::from(source),
        };
        // A child of the request this call serves, else the first span of a new trace; with
        // an OpenTelemetry layer, the exported span of this call.
        let span = tracing::info_span!("gateway call", method = %method, url = %url);
        let trace = TraceContext::current().map_or_else(TraceContext::new_trace, |c| c.child());
        #[cfg(feature = "otel")]
        let trace = crate::trace_context::adopt(&span, None, trace);
        let mut request = Request::builder()
            .method(method)
            .uri(url)
            .header(header::ACCEPT, "application/json")
            .header(trace_context::HEADER, trace.header_value());
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(token) = token {
            let value = if self.inner.auth_scheme.is_empty() {
                token.expose().to_owned()
            } else {
                format!("{} {}", self.inner.auth_scheme, token.expose())
            };
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| network("the access token is not a valid header value".into()))?;
            value.set_sensitive(true);
            request = request.header(self.inner.auth_header.clone(), value);
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| network(e.into()))?;
        let transport = self.inner.transport.now();
        let call = async {
            let response = transport
                .http
                .request(request)
                .await
                .map_err(|e| network(e.into()))?;
            let status = response.status();
            let retry_after = retry_after(status, response.headers(), Utc::now());
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| network(format!("reading the answer: {e}").into()))?
                .to_bytes();
            Ok(Answer {
                url: url.to_owned(),
                status,
                body,
                retry_after,
                token: token.cloned(),
            })
        };
        let answer = tokio::time::timeout(self.inner.timeout, call)
            .instrument(span)
            .await
            .map_err(|_| GatewayError::Timeout {
                url: url.to_owned(),
                timeout: self.inner.timeout,
            })??;
        tracing::debug!(url, status = answer.status.as_u16(), "gateway answered");
        Ok(answer)
    }
}

/// The wait a 429 or a 503 asks for in `Retry-After` at `now` (RFC 9110 10.2.3: seconds, or
/// an HTTP date), at most [`MAX_RETRY_AFTER`]; `None` for another status, or a value that is
/// neither. A date already past asks for no wait.
fn retry_after(
    status: StatusCode,
    headers: &http::HeaderMap,
    now: DateTime<Utc>,
) -> Option<Duration> {
    if !matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        return None;
    }
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = DateTime::parse_from_rfc2822(value).ok()?;
            (at.with_timezone(&Utc) - now).to_std().unwrap_or_default()
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// A transport setting that cannot be used, as the client's error.
fn unusable(error: transport::TransportError) -> GatewayError {
    GatewayError::NotConfigured(error.to_string())
}

fn to_json<T: Serialize>(value: &T) -> Bytes {
    // The request types are plain structs of strings and numbers: they always serialise.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Retry-After` read as RFC 9110 writes it — seconds, or an HTTP date — for a 429 or a
    /// 503 only, at most [`MAX_RETRY_AFTER`]; anything else asks for no wait.
    #[test]
    fn retry_after_reads_seconds_and_dates_of_a_429_or_a_503() {
        let now = DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let asked = |status: StatusCode, value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(header::RETRY_AFTER, value.parse().unwrap());
            retry_after(status, &headers, now)
        };
        let secs = Duration::from_secs;
        let too_many = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(asked(too_many, "120"), Some(secs(120)));
        assert_eq!(asked(StatusCode::SERVICE_UNAVAILABLE, " 5 "), Some(secs(5)));
        assert_eq!(
            asked(too_many, "Wed, 02 Dec 2026 10:01:30 GMT"),
            Some(secs(90))
        );
        assert_eq!(
            asked(too_many, "Wed, 02 Dec 2026 09:00:00 GMT"),
            Some(Duration::ZERO),
            "a date past"
        );
        assert_eq!(asked(too_many, "86400"), Some(MAX_RETRY_AFTER));
        for garbage in ["-1", "soon", "1.5", ""] {
            assert_eq!(asked(too_many, garbage), None, "{garbage:?}");
        }
        assert_eq!(asked(StatusCode::INTERNAL_SERVER_ERROR, "120"), None);
        assert_eq!(
            retry_after(too_many, &http::HeaderMap::new(), now),
            None,
            "no header"
        );
    }
}
