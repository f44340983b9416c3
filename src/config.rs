//! Configuration: built-in defaults, then a TOML file, then `PAYHOOK_*` environment
//! variables, then one validation step whose errors name the bad key.
//!
//! Every key, its default and its environment variable:
//!
//! | key | default | environment |
//! |---|---|---|
//! | `server.listen` | `127.0.0.1:8080` | `PAYHOOK_SERVER_LISTEN` |
//! | `server.body_limit` | `1048576` (1 MiB) | `PAYHOOK_SERVER_BODY_LIMIT` |
//! | `server.header_read_timeout` | `"10s"` | `PAYHOOK_SERVER_HEADER_READ_TIMEOUT` |
//! | `server.request_timeout` | `"30s"` (receiving the body) | `PAYHOOK_SERVER_REQUEST_TIMEOUT` |
//! | `server.handler_timeout` | `"20s"` | `PAYHOOK_SERVER_HANDLER_TIMEOUT` |
//! | `server.shutdown_grace` | `"30s"` | `PAYHOOK_SERVER_SHUTDOWN_GRACE` |
//! | `server.max_connections` | `512` | `PAYHOOK_SERVER_MAX_CONNECTIONS` |
//! | `server.max_connections_per_address` | `128` (`0`: no limit) | `PAYHOOK_SERVER_MAX_CONNECTIONS_PER_ADDRESS` |
//! | `server.idle_timeout` | `"60s"` (no request in progress) | `PAYHOOK_SERVER_IDLE_TIMEOUT` |
//! | `server.min_body_rate` | `240` (bytes/s; `0`: off) | `PAYHOOK_SERVER_MIN_BODY_RATE` |
//! | `server.min_body_rate_grace` | `"5s"` | `PAYHOOK_SERVER_MIN_BODY_RATE_GRACE` |
//! | `server.max_identifier_chars` | `256` (nonce, client id) | `PAYHOOK_SERVER_MAX_IDENTIFIER_CHARS` |
//! | `paths.providers_validation` | `/payhook/providers-validation` | `PAYHOOK_PATHS_PROVIDERS_VALIDATION` |
//! | `paths.transaction_validation` | `/payhook/transaction-validation` | `PAYHOOK_PATHS_TRANSACTION_VALIDATION` |
//! | `paths.callback` | `/payhook/callback` | `PAYHOOK_PATHS_CALLBACK` |
//! | `callback.allow_unsigned` | `false` | `PAYHOOK_CALLBACK_ALLOW_UNSIGNED` |
//! | `callback.retry_after` | `"30s"` | `PAYHOOK_CALLBACK_RETRY_AFTER` |
//! | `signature.header` | `X-Signature` | `PAYHOOK_SIGNATURE_HEADER` |
//! | `signature.algorithm` | `rsa-pkcs1-sha256` | `PAYHOOK_SIGNATURE_ALGORITHM` |
//! | `signature.encoding` | `base64` | `PAYHOOK_SIGNATURE_ENCODING` |
//! | `signature.prefix` | none | `PAYHOOK_SIGNATURE_PREFIX` |
//! | `signature.keys` | none: `[{ id = "...", file = "..." }, { value = "..." }]` | `PAYHOOK_SIGNATURE_KEYS` (a TOML array) |
//! | `auth.<endpoint>.method` | `none` (`signature`, `shared_secret`, `basic`) | `PAYHOOK_AUTH_<ENDPOINT>_METHOD` |
//! | `auth.<endpoint>.header` | `X-Api-Key` (shared secret) | `PAYHOOK_AUTH_<ENDPOINT>_HEADER` |
//! | `auth.<endpoint>.secret` | none (secret) | `PAYHOOK_AUTH_<ENDPOINT>_SECRET` |
//! | `auth.<endpoint>.username`, `.password` | none (Basic; password secret) | `PAYHOOK_AUTH_<ENDPOINT>_USERNAME`, `_PASSWORD` |
//! | `auth.<endpoint>.allow_ips` | none: everyone | `PAYHOOK_AUTH_<ENDPOINT>_ALLOW_IPS` (a TOML array) |
//! | `gateway.auth_url` | none | `PAYHOOK_GATEWAY_AUTH_URL` |
//! | `gateway.gateway_url` | none | `PAYHOOK_GATEWAY_GATEWAY_URL` |
//! | `gateway.username` | none | `PAYHOOK_GATEWAY_USERNAME` |
//! | `gateway.password` | none (secret) | `PAYHOOK_GATEWAY_PASSWORD` |
//!
//! | `store.path` | `payhook-data` | `PAYHOOK_STORE_PATH` |
//! | `store.retention` | `"30d"` | `PAYHOOK_STORE_RETENTION` |
//! | `store.sweep_interval` | `"1h"` | `PAYHOOK_STORE_SWEEP_INTERVAL` |
//! | `store.flush_every` | `"0s"` (off) | `PAYHOOK_STORE_FLUSH_EVERY` |
//! | `store.cache_bytes` | `16777216` (16 MiB) | `PAYHOOK_STORE_CACHE_BYTES` |
//!
//! `<endpoint>` is `providers_validation` or `transaction_validation`. Durations are written `"250ms"`, `"10s"`, `"5m"`, `"1h"`, or as a bare number of seconds.
//! `PAYHOOK_CONFIG` names the TOML file for [`Config::from_env`]; `PAYHOOK_MOCK_*` variables
//! belong to the simulator and are ignored here. Any other `PAYHOOK_*` variable that names
//! no setting is an error (a typo must not pass silently). Loading reads the process
//! environment; it never changes it.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use crate::Secret;
use crate::auth::AuthMethod;
use crate::signature::{self, Algorithm, Encoding, KeyError, PublicKey};

/// Prefix of every configuration environment variable.
pub const ENV_PREFIX: &str = "PAYHOOK_";
/// Environment variable naming the configuration file.
pub const CONFIG_FILE_VAR: &str = "PAYHOOK_CONFIG";
/// Prefix of the simulator's own variables (`PAYHOOK_MOCK_PASSWORD`, the mock gateway's
/// password for `payhook mock-gateway` and `payhook scenario`). They configure the
/// aggregator the simulator plays, not a service, so the loader leaves them alone — an
/// operator who exports one for the simulator can still start a service in the same shell.
pub const SIMULATOR_ENV_PREFIX: &str = "PAYHOOK_MOCK_";

/// Paths payhook serves itself, which the endpoint paths must not take.
const RESERVED_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error(
        "cannot read {}: {source}; check the configuration file's path (PAYHOOK_CONFIG or the file argument)",
        path.display()
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file or an environment variable is not valid TOML of the expected shape.
    #[error("{origin}: {message}")]
    Parse {
        /// Where the bad input came from: a file path or "environment".
        origin: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// A `PAYHOOK_*` variable that names no setting.
    #[error(
        "environment variable {0} names no setting (expected PAYHOOK_<SECTION>_<KEY>, e.g. PAYHOOK_SERVER_LISTEN)"
    )]
    UnknownVariable(String),
    /// A value of the right type that is not acceptable.
    #[error("{key}: {reason}")]
    Invalid {
        /// The dotted key, e.g. `server.body_limit`.
        key: String,
        /// Why it is refused.
        reason: String,
    },
}

/// The whole configuration of a payhook service.
///
/// Serializing it writes every secret as [`REDACTED`], so that the effective settings can be
/// shown ([`Config::to_toml_redacted`]) without showing a password.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The HTTP server.
    pub server: ServerConfig,
    /// Paths of the three merchant-hosted endpoints.
    pub paths: PathsConfig,
    /// Callback endpoint behaviour.
    pub callback: CallbackConfig,
    /// The aggregator's signature scheme and public keys.
    pub signature: SignatureConfig,
    /// How the two validation endpoints authenticate the aggregator.
    pub auth: AuthConfig,
    /// Where deduplication records are kept.
    pub store: StoreConfig,
    /// The aggregator's own endpoints (used by the gateway client).
    pub gateway: GatewayConfig,
    /// `[validation]`: Awaitable mode and the delivery of postponed results.
    pub validation: ValidationConfig,
    /// `[admin]`: the operating API of a running service (off unless a token is set).
    pub admin: AdminConfig,
}

/// `[server]`: listening, limits and timeouts.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Largest accepted request body, in bytes.
    #[serde(deserialize_with = "lenient")]
    pub body_limit: usize,
    /// Time a client has to send its request headers (HTTP/1) before it is disconnected.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub header_read_timeout: Duration,
    /// Time a client has to send its whole body once the headers are in (408 after it).
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub request_timeout: Duration,
    /// Time a handler has to decide (then 503, with `Retry-After` for callbacks).
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub handler_timeout: Duration,
    /// On shutdown, time in-flight requests have to finish before connections are dropped.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub shutdown_grace: Duration,
    /// Connections served at once. When all are taken, the least active connection whose
    /// handler is not running (idle, or sending slowly) is closed for a new one; when every
    /// one is working, a new one waits in the listen backlog. Keeps file descriptors for the
    /// store and the aggregator however many connections clients open (keep it below the
    /// process' open-files limit).
    #[serde(deserialize_with = "lenient")]
    pub max_connections: usize,
    /// Connections one client address may hold at once (0: no limit); over it, that
    /// address's least active connection is closed for the new one, or the new one is
    /// closed when all of them are working. Behind a reverse proxy every connection comes
    /// from the proxy: raise it or set 0 there.
    #[serde(deserialize_with = "lenient")]
    pub max_connections_per_address: usize,
    /// A connection with no request in progress for this long is closed, HTTP/2 included
    /// (however it answers PINGs).
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub idle_timeout: Duration,
    /// Slowest request body accepted, in bytes per second averaged since the headers
    /// arrived, once `min_body_rate_grace` has passed; a slower one is answered 408 and its
    /// connection closed (0: no minimum, only `request_timeout`).
    #[serde(deserialize_with = "lenient")]
    pub min_body_rate: u64,
    /// How long a body may arrive slower than `min_body_rate` at first.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub min_body_rate_grace: Duration,
    /// Longest nonce and client id accepted, in characters (Unicode code points, as the
    /// OpenAPI document's `maxLength` counts them); a longer one is refused with 400.
    /// Identifiers are kept in memory, in the store for the retention period and in logs:
    /// without a bound, a client could fill all three. The default fits every real
    /// identifier (a GUID is 36 characters).
    #[serde(deserialize_with = "lenient")]
    pub max_identifier_chars: usize,
    /// Networks that may read `/metrics` (CIDR); empty: no `/metrics` route.
    pub metrics_allow_ips: Vec<String>,
    /// Reverse proxies (CIDR) whose `X-Forwarded-For` is believed: for a request from one of
    /// them, the client is the right-most address of the header that is not a trusted proxy.
    /// Empty (the default): the header is ignored and the socket's peer is the client.
    pub trusted_proxies: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit: 1024 * 1024,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            handler_timeout: Duration::from_secs(20),
            shutdown_grace: Duration::from_secs(30),
            max_connections: 512,
            max_connections_per_address: 128,
            idle_timeout: Duration::from_secs(60),
            min_body_rate: 240,
            min_body_rate_grace: Duration::from_secs(5),
            max_identifier_chars: 256,
            metrics_allow_ips: vec!["127.0.0.1/32".into(), "::1/128".into()],
            trusted_proxies: Vec::new(),
        }
    }
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

/// `[callback]`: how callbacks are accepted.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallbackConfig {
    /// Accept callbacks without a signature when no key is configured. Off by default: a
    /// server with a callback receiver and no `signature.keys` refuses to start unless this
    /// is set. With keys configured, signatures are always required and this is ignored.
    #[serde(deserialize_with = "lenient")]
    pub allow_unsigned: bool,
    /// `Retry-After` sent with a 503 answer to a callback.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub retry_after: Duration,
}

impl Default for CallbackConfig {
    fn default() -> Self {
        Self {
            allow_unsigned: false,
            retry_after: Duration::from_secs(30),
        }
    }
}

/// `[store]`: the embedded sled store of deduplication records.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Data directory (created if missing). Only one process may open it at a time.
    pub path: PathBuf,
    /// How long a record is kept after its last write; longer than any retry horizon.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub retention: Duration,
    /// How often the sweeper purges expired records.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub sweep_interval: Duration,
    /// sled's background flush interval; `0` (the default): off. payhook flushes every batch
    /// before answering and every sweep that purged something, so nothing needs it; and on
    /// sled 0.34 it keeps relocating log segments of a store with many removals, writing
    /// about 1 MB/s while idle.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub flush_every: Duration,
    /// Bytes of sled's page cache (sled's own default is 1 GiB, far more than records of a
    /// retention period need).
    #[serde(deserialize_with = "lenient")]
    pub cache_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("payhook-data"),
            retention: Duration::from_secs(30 * 24 * 3600),
            sweep_interval: Duration::from_secs(3600),
            flush_every: Duration::ZERO,
            cache_bytes: 16 * 1024 * 1024,
        }
    }
}

/// `[signature]`: how the aggregator signs, and the public keys to verify with.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignatureConfig {
    /// Header carrying the signature.
    pub header: String,
    /// Algorithm of every key that does not name its own.
    pub algorithm: Algorithm,
    /// Text encoding of the signature.
    pub encoding: Encoding,
    /// Scheme prefix before the signature (e.g. `sha256=`); empty for none.
    pub prefix: String,
    /// The public keys; a signature passes when any of them verifies it (rotation).
    pub keys: Vec<KeySource>,
}

impl Default for SignatureConfig {
    fn default() -> Self {
        Self {
            header: signature::DEFAULT_HEADER.to_owned(),
            algorithm: Algorithm::default(),
            encoding: Encoding::default(),
            prefix: String::new(),
            keys: Vec::new(),
        }
    }
}

/// One entry of `signature.keys`: a file or an inline value, in any format
/// [`PublicKey::parse`] reads (PEM, DER, .NET XML, JWK, JWKS).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeySource {
    /// Id logged when this key verifies (a JWK's `kid` takes precedence).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Path of the key file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The key itself, inline (PEM, base64 DER, XML or JSON text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// This key's algorithm, when it differs from `signature.algorithm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Algorithm>,
}

impl KeySource {
    /// Reads the key(s) of this entry.
    ///
    /// # Errors
    ///
    /// The file's I/O error or the [`KeyError`] of its content, as text.
    pub fn load(&self) -> Result<Vec<PublicKey>, String> {
        let bytes = match (&self.file, &self.value) {
            (Some(path), None) => std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?,
            (None, Some(value)) => value.as_bytes().to_vec(),
            _ => return Err("give exactly one of `file` and `value`".to_owned()),
        };
        PublicKey::parse(&bytes).map_err(|e: KeyError| e.to_string())
    }

    /// `id …, file …` for error messages.
    pub fn describe(&self) -> String {
        let id = self.id.as_deref().map(|id| format!("id `{id}`"));
        let file = self.file.as_ref().map(|f| format!("file {}", f.display()));
        let parts: Vec<String> = [id, file].into_iter().flatten().collect();
        if parts.is_empty() {
            "inline key".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// `[admin]`: the operating API under `/payhook/admin/` — postponed validations and
/// reconcile, for `payhook … --admin-url` against a running service. Off unless `token` is
/// set; then callers need `Authorization: Bearer <token>` and an address in `allow_ips`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The bearer token (at least 16 characters); redacted in `Debug`. Unset: no admin API.
    #[serde(serialize_with = "redacted", skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// Networks that may call it (CIDR). Default: loopback only.
    pub allow_ips: Vec<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            token: None,
            allow_ips: vec!["127.0.0.1/32".into(), "::1/128".into()],
        }
    }
}

impl AdminConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.token.as_ref().is_some_and(|t| t.expose().len() < 16) {
            return Err(ConfigError::Invalid {
                key: "admin.token".into(),
                reason: "must be at least 16 characters".into(),
            });
        }
        for text in &self.allow_ips {
            if let Err(error) = text.parse::<crate::auth::Cidr>() {
                return Err(ConfigError::Invalid {
                    key: "admin.allow_ips".into(),
                    reason: error.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// `[auth]`: one table per validation endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `[auth.providers_validation]`.
    pub providers_validation: EndpointAuthConfig,
    /// `[auth.transaction_validation]`.
    pub transaction_validation: EndpointAuthConfig,
}

/// How one validation endpoint authenticates the aggregator.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointAuthConfig {
    /// The method.
    pub method: AuthMethod,
    /// Header carrying the shared secret.
    pub header: String,
    /// The shared secret; redacted in `Debug`.
    #[serde(serialize_with = "redacted", skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// Basic user name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Basic password; redacted in `Debug`.
    #[serde(serialize_with = "redacted", skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
    /// Networks allowed to call (CIDR); empty allows every address.
    pub allow_ips: Vec<String>,
}

impl Default for EndpointAuthConfig {
    fn default() -> Self {
        Self {
            method: AuthMethod::None,
            header: "X-Api-Key".to_owned(),
            secret: None,
            username: None,
            password: None,
            allow_ips: Vec::new(),
        }
    }
}

impl AuthConfig {
    fn validate(&self, have_keys: bool) -> Result<(), ConfigError> {
        let endpoints = [
            ("auth.providers_validation", &self.providers_validation),
            ("auth.transaction_validation", &self.transaction_validation),
        ];
        for (key, endpoint) in endpoints {
            crate::auth::Guard::from_config(endpoint, key)?;
            if endpoint.method == AuthMethod::Signature && !have_keys {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.method"),
                    reason: "\"signature\" needs the aggregator's keys in signature.keys"
                        .to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// `[gateway]`: the aggregator's login and transaction endpoints.
///
/// `https://` is required, except on a loopback host (`127.0.0.1`, `[::1]`, `localhost`),
/// where plain `http://` is allowed for local testing against a mock gateway.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Base address of login and token refresh (`{auth_url}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_url: Option<String>,
    /// Base address of the transaction endpoints (`{gateway_url}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_url: Option<String>,
    /// Merchant user name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Merchant password; redacted in `Debug`.
    #[serde(serialize_with = "redacted", skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
    /// Bound on every call to the aggregator: connecting, sending and reading the answer.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub timeout: Duration,
    /// How long before `accessTokenExpiryUtc` the access token is refreshed — at most half
    /// the lifetime the aggregator granted the token, so that a short-lived token is not
    /// refreshed before every call.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub refresh_margin: Duration,
    /// Header that carries the access token.
    pub auth_header: String,
    /// Scheme before the token in that header (`Bearer <token>`); empty sends the bare token.
    pub auth_scheme: String,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            auth_url: None,
            gateway_url: None,
            username: None,
            password: None,
            timeout: Duration::from_secs(10),
            refresh_margin: Duration::from_secs(60),
            auth_header: "Authorization".to_owned(),
            auth_scheme: "Bearer".to_owned(),
        }
    }
}

impl GatewayConfig {
    /// `true` when every setting a client needs is present.
    pub fn is_complete(&self) -> bool {
        self.auth_url.is_some()
            && self.gateway_url.is_some()
            && self.username.is_some()
            && self.password.is_some()
    }
}

/// What a validation whose deadline passed is resolved as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadlineOutcome {
    /// `success: false` (the default).
    Deny,
    /// `success: true`.
    Allow,
}

/// `[validation]`: Awaitable (postponed) transaction validation and the delivery of results.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValidationConfig {
    /// The endpoint is declared Awaitable at the aggregator: a handler may postpone, and
    /// every decision is also posted to `{gateway_url}/api/v1/transactions/validation`.
    /// Needs a complete `[gateway]` section.
    #[serde(deserialize_with = "lenient")]
    pub awaitable: bool,
    /// In Awaitable mode, a handler still deciding after this long is answered 200
    /// (postponed) by payhook, and its eventual decision is posted as the result.
    #[serde(deserialize_with = "duration", serialize_with = "duration_text")]
    pub time_budget: Duration,
    /// A postponed validation still undecided this long after it arrived is resolved with
    /// `deadline_outcome`. Unset: no deadline.
    #[serde(
        deserialize_with = "optional_duration",
        serialize_with = "optional_duration_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub deadline: Option<Duration>,
    /// The result a passed deadline resolves to.
    pub deadline_outcome: DeadlineOutcome,
    /// The description sent with that result.
    pub deadline_description: String,
    /// Waits between attempts to post a result; the last one repeats until a 200 or a 403.
    /// Each wait is jittered by up to ±20%.
    #[serde(deserialize_with = "durations", serialize_with = "durations_text")]
    pub retry_schedule: Vec<Duration>,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            awaitable: false,
            time_budget: Duration::from_secs(5),
            deadline: None,
            deadline_outcome: DeadlineOutcome::Deny,
            deadline_description: "validation timed out".to_owned(),
            retry_schedule: [1, 2, 5, 15, 60, 300].map(Duration::from_secs).to_vec(),
        }
    }
}

impl ValidationConfig {
    fn validate(&self, gateway: &GatewayConfig, server: &ServerConfig) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if self.awaitable && !gateway.is_complete() {
            return invalid(
                "validation.awaitable",
                "Awaitable mode posts results to the aggregator: set gateway.auth_url, gateway.gateway_url, gateway.username and gateway.password",
            );
        }
        if self.time_budget.is_zero() {
            return invalid("validation.time_budget", "must be longer than zero");
        }
        if self.awaitable && self.time_budget >= server.handler_timeout {
            // The budget is how long to wait before answering "postponed"; the handler may
            // run on until the handler timeout. A budget past it would never apply, and the
            // nonce's claim would outlive the time after which a repeat may take it over.
            return invalid(
                "validation.time_budget",
                "must be shorter than server.handler_timeout",
            );
        }
        if self.deadline.is_some_and(|d| d.is_zero()) {
            return invalid("validation.deadline", "must be longer than zero");
        }
        if self.awaitable && self.deadline.is_some_and(|d| d <= server.handler_timeout) {
            // A handler that overran its budget may decide until the handler timeout: a
            // deadline before that would send the deadline's outcome and then refuse the
            // handler's own decision as a conflict.
            return invalid(
                "validation.deadline",
                "must be longer than server.handler_timeout",
            );
        }
        if self.retry_schedule.is_empty() || self.retry_schedule.iter().any(Duration::is_zero) {
            return invalid(
                "validation.retry_schedule",
                "must list at least one wait, each longer than zero",
            );
        }
        Ok(())
    }
}

impl Config {
    /// Loads the configuration: defaults, then the file at `file` (if any), then the
    /// `PAYHOOK_*` variables among `env`, then [`Config::validate`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the file, variable or key that is wrong.
    ///
    /// # Examples
    ///
    /// ```
    /// use payhook::Config;
    ///
    /// let env = [("PAYHOOK_SERVER_BODY_LIMIT".to_owned(), "65536".to_owned())];
    /// let config = Config::load(None, env)?;
    /// assert_eq!(config.server.body_limit, 65536);
    /// assert_eq!(config.paths.callback, "/payhook/callback");
    /// # Ok::<(), payhook::config::ConfigError>(())
    /// ```
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => read_table(path)?,
            None => toml::Table::new(),
        };
        let origin = file.map_or_else(|| "defaults".to_owned(), |p| p.display().to_string());
        // Checked alone first, so that an error in the file is reported against the file.
        Self::from_table(table.clone(), &origin)?;
        for (path, value) in env_overrides(env)? {
            insert_at(&mut table, &path, value);
        }
        let config = Self::from_table(table, "environment")?;
        config.validate()?;
        Ok(config)
    }

    /// The effective settings as a TOML document, every secret written as [`REDACTED`] —
    /// what `payhook check-config` prints. It reads back as the same settings, secrets aside.
    ///
    /// ```
    /// let mut config = payhook::Config::default();
    /// config.gateway.password = Some("hunter2".into());
    /// let text = config.to_toml_redacted()?;
    /// assert!(text.contains("password = \"<redacted>\""), "{text}");
    /// assert!(!text.contains("hunter2"));
    /// # Ok::<(), payhook::config::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] when a value has no TOML form (a path that is not UTF-8).
    pub fn to_toml_redacted(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|error| ConfigError::Invalid {
            key: "configuration".to_owned(),
            reason: format!("cannot be written as TOML: {error}"),
        })
    }

    /// Loads from the file named by `PAYHOOK_CONFIG` (if set) and the process environment.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn from_env() -> Result<Self, ConfigError> {
        let file = std::env::var_os(CONFIG_FILE_VAR).map(PathBuf::from);
        Self::load(file.as_deref(), std::env::vars())
    }

    /// Parses a TOML document (no environment), then validates it.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the bad key.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let table = text
            .parse::<toml::Table>()
            .map_err(|e| syntax_error("TOML", text, &e))?;
        let config = Self::from_table(table, "TOML")?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values that have the right type but are not acceptable.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if self.server.max_connections == 0 {
            return invalid("server.max_connections", "must be at least 1");
        }
        if !(16..=4096).contains(&self.server.max_identifier_chars) {
            return invalid(
                "server.max_identifier_chars",
                "must be between 16 and 4096 characters",
            );
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.server.body_limit) {
            return invalid("server.body_limit", "must be between 1024 bytes and 64 MiB");
        }
        let timeouts = [
            (
                "server.header_read_timeout",
                self.server.header_read_timeout,
            ),
            ("server.request_timeout", self.server.request_timeout),
            ("server.handler_timeout", self.server.handler_timeout),
            ("server.idle_timeout", self.server.idle_timeout),
        ];
        for (key, value) in timeouts {
            if value.is_zero() {
                return invalid(key, "must be longer than zero");
            }
        }
        if self.store.retention < Duration::from_secs(1) {
            return invalid("store.retention", "must be at least 1s");
        }
        if self.store.sweep_interval.is_zero() {
            return invalid("store.sweep_interval", "must be longer than zero");
        }
        if self.callback.retry_after < Duration::from_secs(1) {
            return invalid(
                "callback.retry_after",
                "must be at least 1s (Retry-After counts whole seconds)",
            );
        }
        let networks = [
            ("server.metrics_allow_ips", &self.server.metrics_allow_ips),
            ("server.trusted_proxies", &self.server.trusted_proxies),
        ];
        for (key, list) in networks {
            for text in list {
                if let Err(error) = text.parse::<crate::auth::Cidr>() {
                    return invalid(key, &error.to_string());
                }
            }
        }
        self.paths.validate()?;
        self.auth.validate(!self.signature.keys.is_empty())?;
        self.gateway.validate()?;
        self.validation.validate(&self.gateway, &self.server)?;
        self.admin.validate()
    }
}

impl PathsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
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
                return Err(ConfigError::Invalid {
                    key: (*key).to_owned(),
                    reason,
                });
            }
        }
        Ok(())
    }
}

impl GatewayConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let urls = [
            ("gateway.auth_url", &self.auth_url),
            ("gateway.gateway_url", &self.gateway_url),
        ];
        for (key, url) in urls {
            if let Some(url) = url
                && let Err(reason) = check_remote_url(url)
            {
                return Err(ConfigError::Invalid {
                    key: key.to_owned(),
                    reason,
                });
            }
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::Invalid {
                key: "gateway.timeout".to_owned(),
                reason: "must be longer than zero".to_owned(),
            });
        }
        if http::HeaderName::from_bytes(self.auth_header.as_bytes()).is_err() {
            return Err(ConfigError::Invalid {
                key: "gateway.auth_header".to_owned(),
                reason: format!("`{}` is not a valid header name", self.auth_header),
            });
        }
        Ok(())
    }
}

/// A URL payhook sends a token or a password to (the aggregator's, the operating API's):
/// `https://`, or `http://` on a loopback host only — a secret must never cross a network in
/// the clear.
pub(crate) fn check_remote_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url.parse().map_err(|_| format!("`{url}` is not a URL"))?;
    let host = uri.host().unwrap_or_default();
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => Ok(()),
        Some("http") if ["127.0.0.1", "[::1]", "::1", "localhost"].contains(&host) => Ok(()),
        Some("http") => Err(format!(
            "`{url}`: plain http is allowed only on a loopback host; use https"
        )),
        _ => Err(format!("`{url}` is not an http(s) URL")),
    }
}

impl Config {
    fn from_table(table: toml::Table, origin: &str) -> Result<Self, ConfigError> {
        check_secrets_are_strings(&table)?;
        toml::Value::Table(table)
            .try_into()
            .map_err(|e| parse_error(origin, &e))
    }
}

fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| syntax_error(&path.display().to_string(), &text, &e))
}

/// A TOML syntax error, told by its position and what is wrong — never by quoting the
/// line, which may hold a password or a token.
fn syntax_error(origin: &str, text: &str, error: &toml::de::Error) -> ConfigError {
    let position = error.span().map_or_else(String::new, |span| {
        let before = text.get(..span.start).unwrap_or(text);
        let line = before.matches('\n').count() + 1;
        let column = before
            .rsplit_once('\n')
            .map_or(before, |(_, line)| line)
            .chars()
            .count()
            + 1;
        format!(" at line {line}, column {column}")
    });
    ConfigError::Parse {
        origin: origin.to_owned(),
        message: format!(
            "TOML syntax error{position}: {} (the line is not quoted: it may hold a secret)",
            error_message(error)
        ),
    }
}

/// The keys whose values are secrets: never quoted in an error, never read as TOML from
/// the environment (a password may well start with `[` or `{`).
const SECRET_KEYS: [&[&str]; 6] = [
    &["gateway", "password"],
    &["admin", "token"],
    &["auth", "providers_validation", "secret"],
    &["auth", "providers_validation", "password"],
    &["auth", "transaction_validation", "secret"],
    &["auth", "transaction_validation", "password"],
];

fn is_secret(path: &[String]) -> bool {
    SECRET_KEYS
        .iter()
        .any(|secret| secret.iter().copied().eq(path.iter().map(String::as_str)))
}

/// Refuses a secret that is not a string before serde could quote it in a type error
/// (`invalid type: integer `12345678`, expected a string`).
fn check_secrets_are_strings(table: &toml::Table) -> Result<(), ConfigError> {
    for path in SECRET_KEYS {
        let mut value = None;
        let mut current = Some(table);
        for name in path {
            value = current.and_then(|t| t.get(*name));
            current = value.and_then(toml::Value::as_table);
        }
        if value.is_some_and(|v| !v.is_str()) {
            return Err(ConfigError::Invalid {
                key: path.join("."),
                reason: "must be a string (the value is not shown: it is a secret)".to_owned(),
            });
        }
    }
    Ok(())
}

fn error_message(error: &toml::de::Error) -> String {
    error.message().trim().replace('\n', " ")
}

fn parse_error(origin: &str, error: &dyn fmt::Display) -> ConfigError {
    ConfigError::Parse {
        origin: origin.to_owned(),
        message: error.to_string().trim().replace('\n', " "),
    }
}

/// Sections whose keys can be set from the environment, with their sub-tables.
const SECTIONS: [(&str, &[&str]); 9] = [
    ("server", &[]),
    ("paths", &[]),
    ("callback", &[]),
    ("signature", &[]),
    ("auth", &["providers_validation", "transaction_validation"]),
    ("gateway", &[]),
    ("store", &[]),
    ("validation", &[]),
    ("admin", &[]),
];

/// `PAYHOOK_SERVER_BODY_LIMIT=65536` → `["server", "body_limit"]` = `"65536"`;
/// `PAYHOOK_AUTH_TRANSACTION_VALIDATION_METHOD` → `["auth", "transaction_validation", "method"]`.
fn env_overrides(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeMap<Vec<String>, toml::Value>, ConfigError> {
    let mut overrides = BTreeMap::new();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if name == CONFIG_FILE_VAR || name.starts_with(SIMULATOR_ENV_PREFIX) {
            continue;
        }
        let path = env_path(&rest.to_ascii_lowercase())
            .ok_or_else(|| ConfigError::UnknownVariable(name.clone()))?;
        let value = if is_secret(&path) {
            // Taken as it is: never parsed, so never quoted in a parse error.
            toml::Value::String(value)
        } else {
            env_value(&name, value)?
        };
        overrides.insert(path, value);
    }
    Ok(overrides)
}

/// The table path of a variable name (lowercase, prefix removed).
fn env_path(rest: &str) -> Option<Vec<String>> {
    let (section, tail) = rest.split_once('_')?;
    let (_, subtables) = SECTIONS.iter().find(|(name, _)| *name == section)?;
    let mut path = vec![section.to_owned()];
    let key = if subtables.is_empty() {
        tail
    } else {
        let sub = subtables
            .iter()
            .find(|sub| tail.starts_with(&format!("{sub}_")))?;
        path.push((*sub).to_owned());
        &tail[sub.len() + 1..]
    };
    (!key.is_empty()).then(|| {
        path.push(key.to_owned());
        path
    })
}

/// A variable's value: a TOML array or inline table when it looks like one, else a string.
fn env_value(name: &str, value: String) -> Result<toml::Value, ConfigError> {
    if !value.trim_start().starts_with(['[', '{']) {
        return Ok(toml::Value::String(value));
    }
    let parsed: toml::Table = format!("v = {value}")
        .parse()
        .map_err(|e: toml::de::Error| {
            // Not a secret (those are never parsed), so the value may be quoted.
            ConfigError::Parse {
                origin: name.to_owned(),
                message: format!(
                    "`{value}` is not a TOML array or inline table: {}",
                    error_message(&e)
                ),
            }
        })?;
    Ok(parsed
        .get("v")
        .cloned()
        .unwrap_or(toml::Value::String(value)))
}

/// Sets `path` (tables, then a key) in `table`, creating tables on the way.
fn insert_at(table: &mut toml::Table, path: &[String], value: toml::Value) {
    let Some((key, tables)) = path.split_last() else {
        return;
    };
    let mut current = table;
    for name in tables {
        let entry = current
            .entry(name.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(next) = entry else {
            return;
        };
        current = next;
    }
    current.insert(key.clone(), value);
}

/// How every secret is written when a configuration is serialized.
pub const REDACTED: &str = "<redacted>";

/// Writes a secret as [`REDACTED`].
fn redacted<S: Serializer>(_: &Option<Secret>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(REDACTED)
}

/// Writes a duration the way [`parse_duration`] reads it, in the largest exact unit.
fn duration_text<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format_duration(*value))
}

fn optional_duration_text<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => duration_text(value, serializer),
        None => serializer.serialize_none(),
    }
}

fn durations_text<S: Serializer>(values: &[Duration], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(values.iter().map(|d| format_duration(*d)))
}

/// `"250ms"`, `"10s"`, `"5m"`, `"1h"`, `"30d"`: the largest unit that holds it exactly.
fn format_duration(value: Duration) -> String {
    let millis = value.as_millis();
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    units
        .into_iter()
        .find(|(size, _)| millis != 0 && millis % size == 0)
        .map_or_else(
            || format!("{millis}ms"),
            |(size, unit)| format!("{}{unit}", millis / size),
        )
}

/// Reads a number or a boolean either natively (TOML) or from a string (environment).
fn lenient<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr + Deserialize<'de>,
    T::Err: fmt::Display,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either<T> {
        Text(String),
        Native(T),
    }
    match Either::<T>::deserialize(deserializer)? {
        Either::Native(value) => Ok(value),
        Either::Text(text) => text
            .trim()
            .parse()
            .map_err(|e| de::Error::custom(format!("`{text}`: {e}"))),
    }
}

/// Reads a duration: `"250ms"`, `"10s"`, `"5m"`, `"1h"`, or a number of seconds.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Seconds(u64),
        Text(String),
    }
    match Either::deserialize(deserializer)? {
        Either::Seconds(seconds) => Ok(Duration::from_secs(seconds)),
        Either::Text(text) => parse_duration(&text).map_err(de::Error::custom),
    }
}

/// Reads an optional duration: absent, empty or `"none"` is `None`.
fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Seconds(u64),
        Text(String),
    }
    match Either::deserialize(deserializer)? {
        Either::Seconds(seconds) => Ok(Some(Duration::from_secs(seconds))),
        Either::Text(text) if text.trim().is_empty() || text.trim() == "none" => Ok(None),
        Either::Text(text) => parse_duration(&text).map(Some).map_err(de::Error::custom),
    }
}

/// Reads a list of durations, each as [`duration`] reads one.
fn durations<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Duration>, D::Error> {
    #[derive(Deserialize)]
    struct One(#[serde(deserialize_with = "duration", serialize_with = "duration_text")] Duration);
    Ok(Vec::<One>::deserialize(deserializer)?
        .into_iter()
        .map(|One(d)| d)
        .collect())
}

/// Parses `"250ms"`, `"10s"`, `"5m"`, `"1h"` or `"10"` (seconds).
///
/// # Errors
///
/// A message naming the text when it is none of those forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as \"10s\""))?;
    let millis = match unit.trim() {
        "ms" => Some(number),
        "" | "s" => number.checked_mul(1000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        "d" => number.checked_mul(86_400_000),
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use ms, s, m, h or d)"
            ));
        }
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_are_those_of_the_design() {
        let config = Config::load(None, env(&[])).unwrap();
        assert_eq!(config.server.body_limit, 1_048_576);
        assert_eq!(
            config.paths.transaction_validation,
            "/payhook/transaction-validation"
        );
        assert!(!config.callback.allow_unsigned);
    }

    #[test]
    fn the_file_overrides_defaults_and_the_environment_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payhook.toml");
        std::fs::write(&path, "[server]\nbody_limit = 4096\nlisten = \"127.0.0.1:9000\"\n[callback]\nallow_unsigned = true\n")
            .unwrap();
        let config = Config::load(
            Some(&path),
            env(&[
                ("PAYHOOK_SERVER_BODY_LIMIT", "8192"),
                ("PAYHOOK_CALLBACK_RETRY_AFTER", "5s"),
                ("HOME", "/root"),
            ]),
        )
        .unwrap();
        assert_eq!(config.server.body_limit, 8192);
        assert_eq!(config.server.listen.port(), 9000);
        assert!(config.callback.allow_unsigned);
        assert_eq!(config.callback.retry_after, Duration::from_secs(5));
    }

    #[test]
    fn environment_booleans_and_numbers_are_read_from_text() {
        let config =
            Config::load(None, env(&[("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true")])).unwrap();
        assert!(config.callback.allow_unsigned);
        let error = Config::load(None, env(&[("PAYHOOK_SERVER_BODY_LIMIT", "lots")])).unwrap_err();
        assert!(error.to_string().contains("body_limit"), "{error}");
    }

    #[test]
    fn an_unknown_key_in_the_file_is_named() {
        let error = Config::from_toml("[server]\nbody_limt = 5\n").unwrap_err();
        assert!(error.to_string().contains("body_limt"), "{error}");
    }

    #[test]
    fn an_unknown_variable_is_named() {
        let error = Config::load(None, env(&[("PAYHOOK_SERVR_LISTEN", "x")])).unwrap_err();
        assert!(
            error.to_string().contains("PAYHOOK_SERVR_LISTEN"),
            "{error}"
        );
        let error = Config::load(None, env(&[("PAYHOOK_SERVER_LISTN", "x")])).unwrap_err();
        assert!(error.to_string().contains("listn"), "{error}");
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases = [
            ("[server]\nbody_limit = 10", "server.body_limit"),
            (
                "[server]\nmax_identifier_chars = 8",
                "server.max_identifier_chars",
            ),
            (
                "[server]\nmax_identifier_chars = 1048576",
                "server.max_identifier_chars",
            ),
            (
                "[server]\nhandler_timeout = \"0s\"",
                "server.handler_timeout",
            ),
            ("[paths]\ncallback = \"callback\"", "paths.callback"),
            (
                "[paths]\ncallback = \"/payhook/transaction-validation\"",
                "paths.callback",
            ),
            ("[paths]\ncallback = \"/healthz\"", "paths.callback"),
            (
                "[gateway]\ngateway_url = \"ftp://x\"",
                "gateway.gateway_url",
            ),
            ("[callback]\nretry_after = \"10ms\"", "callback.retry_after"),
            ("[store]\nretention = \"0s\"", "store.retention"),
            (
                "[auth.transaction_validation]\nmethod = \"signature\"",
                "auth.transaction_validation.method",
            ),
            (
                "[auth.providers_validation]\nmethod = \"shared_secret\"",
                "auth.providers_validation.secret",
            ),
            (
                "[auth.providers_validation]\nallow_ips = [\"10.0.0.0/33\"]",
                "auth.providers_validation.allow_ips",
            ),
            (
                concat!(
                    "[gateway]\nauth_url = \"https://a.example\"\ngateway_url = \"https://g.example\"\n",
                    "username = \"u\"\npassword = \"p\"\n",
                    "[validation]\nawaitable = true\ntime_budget = \"20s\""
                ),
                "validation.time_budget",
            ),
            (
                concat!(
                    "[gateway]\nauth_url = \"https://a.example\"\ngateway_url = \"https://g.example\"\n",
                    "username = \"u\"\npassword = \"p\"\n",
                    "[validation]\nawaitable = true\ndeadline = \"10s\""
                ),
                "validation.deadline",
            ),
        ];
        for (toml, key) in cases {
            let error = Config::from_toml(toml).unwrap_err();
            assert!(error.to_string().starts_with(key), "{toml}: {error}");
        }
    }

    #[test]
    fn nested_tables_and_lists_are_set_from_the_environment() {
        let config = Config::load(
            None,
            env(&[
                (
                    "PAYHOOK_AUTH_TRANSACTION_VALIDATION_METHOD",
                    "shared_secret",
                ),
                ("PAYHOOK_AUTH_TRANSACTION_VALIDATION_SECRET", "12345"),
                (
                    "PAYHOOK_AUTH_PROVIDERS_VALIDATION_ALLOW_IPS",
                    "[\"10.0.0.0/8\", \"::1\"]",
                ),
                (
                    "PAYHOOK_SIGNATURE_KEYS",
                    "[{id = \"k1\", file = \"/keys/k1.pem\"}]",
                ),
                ("PAYHOOK_STORE_CACHE_BYTES", "1048576"),
            ]),
        )
        .unwrap();
        let auth = &config.auth.transaction_validation;
        assert_eq!(auth.method, AuthMethod::SharedSecret);
        assert_eq!(
            auth.secret.as_ref().map(Secret::expose),
            Some("12345"),
            "a numeric secret stays text"
        );
        assert_eq!(
            config.auth.providers_validation.allow_ips,
            ["10.0.0.0/8", "::1"]
        );
        assert_eq!(config.signature.keys[0].id.as_deref(), Some("k1"));
        assert_eq!(config.store.cache_bytes, 1_048_576);
        let error =
            Config::load(None, env(&[("PAYHOOK_AUTH_REFUNDS_METHOD", "basic")])).unwrap_err();
        assert!(
            error.to_string().contains("PAYHOOK_AUTH_REFUNDS_METHOD"),
            "{error}"
        );
    }

    #[test]
    fn a_key_entry_needs_exactly_one_source() {
        let both = KeySource {
            file: Some("/k.pem".into()),
            value: Some("x".into()),
            ..KeySource::default()
        };
        assert_eq!(
            both.load().unwrap_err(),
            "give exactly one of `file` and `value`"
        );
        assert!(KeySource::default().load().is_err());
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn the_gateway_password_is_redacted_in_debug() {
        let config =
            Config::from_toml("[gateway]\nusername = \"shop\"\npassword = \"hunter2\"").unwrap();
        let debug = format!("{config:?}");
        assert!(
            debug.contains("shop") && !debug.contains("hunter2"),
            "{debug}"
        );
    }
}
