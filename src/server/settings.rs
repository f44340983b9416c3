//! The server's sections: `[server]` (listening, limits, timeouts), `[callback]` (how
//! callbacks are accepted) and `[admin]` (the operating API), each with the checks that
//! concern it alone. `[paths]` lives with the routes.

use serde::{Deserialize, Serialize};
use std::{net::SocketAddr, time::Duration};

use crate::Secret;
use crate::auth::Cidr;
use crate::setting::InvalidSetting;

/// `[server]`: listening, limits and timeouts.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Largest accepted request body, in bytes.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub body_limit: usize,
    /// Time a client has to send its request headers (HTTP/1) before it is disconnected.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub header_read_timeout: Duration,
    /// Time a client has to send its whole body once the headers are in (408 after it).
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub request_timeout: Duration,
    /// Time a handler has to decide (then 503, with `Retry-After` for callbacks).
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub handler_timeout: Duration,
    /// On shutdown, time in-flight requests have to finish before connections are dropped.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub shutdown_grace: Duration,
    /// Connections served at once. When all are taken, the least active connection whose
    /// handler is not running (idle, sending slowly, or in one phase for longer than
    /// `min_body_rate_grace`) is closed for a new one; when none is, a new one waits in the
    /// listen backlog. Keeps file descriptors for the
    /// store and the aggregator however many connections clients open (keep it below the
    /// process' open-files limit).
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub max_connections: usize,
    /// Connections one client address (an IPv6 client: its /64) may hold at once (0: no
    /// limit); over it, that
    /// address's least active connection is closed for the new one, or the new one is
    /// closed when all of them are working. Behind a reverse proxy every connection comes
    /// from the proxy: raise it or set 0 there.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub max_connections_per_address: usize,
    /// A connection with no request in progress for this long is closed, HTTP/2 included
    /// (however it answers PINGs).
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub idle_timeout: Duration,
    /// Bytes of request bodies held while they arrive, all connections and HTTP/2 streams
    /// together (default 64 MiB; at least `body_limit`). Every connection may hold a body of
    /// up to `body_limit` while it keeps the minimum rate: this bounds what bodies sent
    /// quickly and then held back can take, however many connections and streams carry
    /// them. One client (an address, an IPv6 client's /64) may hold a quarter of it, and at
    /// least one body of `body_limit`. A body that would pass either takes the memory of the
    /// bodies arriving for longer than `min_body_rate_grace`, the oldest first (the client's
    /// own first when its quarter is what is short), which are answered 408; when those
    /// cannot make room, it is answered 503 with `Retry-After`. Behind a reverse proxy, list
    /// it in `trusted_proxies` (the client is then the one it forwards for): otherwise every
    /// request is the proxy's, and all of them share that quarter.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub body_memory_limit: usize,
    /// Slowest request body accepted, in bytes per second averaged since the headers
    /// arrived, once `min_body_rate_grace` has passed; a slower one is answered 408 and its
    /// connection closed (0: no minimum, only `request_timeout`).
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub min_body_rate: u64,
    /// How long a body may arrive slower than `min_body_rate` at first. Also how long one
    /// phase of a connection (its head, a body, idleness) keeps its place when the server is
    /// full and a new connection comes, and how long a body keeps its part of
    /// `body_memory_limit` when another needs it, however well either keeps the rate.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub min_body_rate_grace: Duration,
    /// Longest nonce and client id accepted, in characters (Unicode code points, as the
    /// OpenAPI document's `maxLength` counts them), and transaction validation's currency
    /// (its nonce's record keeps it); a longer one is refused with 400.
    /// Identifiers are kept in memory, in the store for the retention period and in logs:
    /// without a bound, a client could fill all three. The default fits every real
    /// identifier (a GUID is 36 characters).
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub max_identifier_chars: usize,
    /// Networks that may read `/metrics` (CIDR); empty: no `/metrics` route.
    pub metrics_allow_ips: Vec<String>,
    /// Reverse proxies (CIDR) whose `X-Forwarded-For` is believed: for a request from one of
    /// them, the client is the right-most address of the header that is not a trusted proxy.
    /// Empty (the default): the header is ignored and the socket's peer is the client — but
    /// the operating API refuses a call that carries it (or `Forwarded`, `X-Real-IP`) from a
    /// peer not listed here: a proxy on this machine left out would make every caller look
    /// local.
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
            body_memory_limit: 64 * 1024 * 1024,
            min_body_rate: 240,
            min_body_rate_grace: Duration::from_secs(5),
            max_identifier_chars: 256,
            metrics_allow_ips: vec!["127.0.0.1/32".into(), "::1/128".into()],
            trusted_proxies: Vec::new(),
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
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub allow_unsigned: bool,
    /// `Retry-After` sent with a 503 answer to a callback.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
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

impl ServerConfig {
    /// Checks values that have the right type but are not acceptable.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        if self.max_connections == 0 {
            return Err(InvalidSetting::new(
                "server.max_connections",
                "must be at least 1",
            ));
        }
        if !(16..=4096).contains(&self.max_identifier_chars) {
            return Err(InvalidSetting::new(
                "server.max_identifier_chars",
                "must be between 16 and 4096 characters",
            ));
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.body_limit) {
            return Err(InvalidSetting::new(
                "server.body_limit",
                "must be between 1024 bytes and 64 MiB",
            ));
        }
        if self.body_memory_limit < self.body_limit {
            return Err(InvalidSetting::new(
                "server.body_memory_limit",
                "must be at least server.body_limit",
            ));
        }
        crate::setting::longer_than_zero(&[
            ("server.header_read_timeout", self.header_read_timeout),
            ("server.request_timeout", self.request_timeout),
            ("server.handler_timeout", self.handler_timeout),
            ("server.idle_timeout", self.idle_timeout),
        ])?;
        // With no grace, a body's first bytes would be due when its head arrives (every body
        // not sent in the head's packets refused 408), and a full server would shed any
        // connection mid-request for a newcomer (the grace is its patience too).
        crate::setting::longer_than_zero(&[(
            "server.min_body_rate_grace",
            self.min_body_rate_grace,
        )])?;
        let networks = [
            ("server.metrics_allow_ips", &self.metrics_allow_ips),
            ("server.trusted_proxies", &self.trusted_proxies),
        ];
        for (key, list) in networks {
            for text in list {
                if let Err(error) = text.parse::<Cidr>() {
                    return Err(InvalidSetting::new(key, error.to_string()));
                }
            }
        }
        Ok(())
    }
}

impl CallbackConfig {
    /// Checks values that have the right type but are not acceptable.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        if self.retry_after < Duration::from_secs(1) {
            return Err(InvalidSetting::new(
                "callback.retry_after",
                "must be at least 1s (Retry-After counts whole seconds)",
            ));
        }
        Ok(())
    }
}

/// `[admin]`: the operating API under `/payhook/admin/` — postponed validations and
/// reconcile, for `payhook … --admin-url` against a running service. Off unless `token` or
/// `operators` is set; then callers need `Authorization: Bearer <token>` (the shared token or
/// an operator's own), an address in `allow_ips`, and to be on this machine or behind a
/// trusted proxy that speaks HTTPS to them (unless `allow_plain_http`).
///
/// ```toml
/// [admin]
/// # Each operator's own token, kept by its SHA-256 (`payhook operator-token alice` makes
/// # one): what alice resolves or decides is kept with her name.
/// operators = { alice = "sha256:2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90" }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The bearer token (at least 16 characters); redacted in `Debug`. Unset: no admin API.
    #[serde(
        serialize_with = "crate::setting::redacted",
        skip_serializing_if = "Option::is_none"
    )]
    pub token: Option<Secret>,
    /// Operators with tokens of their own, by name (1–64 characters): each value is
    /// `sha256:` and the hex SHA-256 of that operator's token, never the token itself
    /// (`payhook operator-token NAME` makes a token and its entry). A call with one is that
    /// operator's: the held results they resolve and the postponed validations they decide
    /// are kept and logged with their name, whatever name a request gives. Beside `token`
    /// (whose bearers name themselves) or instead of it. See [`crate::server::OperatorToken`].
    pub operators: std::collections::BTreeMap<String, String>,
    /// Operators of `operators` who may look and not change: the API's listings and the
    /// inspector's page (without its buttons that act), but no decision, retry, booking or
    /// resolution (403, logged) — for support staff who answer merchants' questions.
    pub viewers: Vec<String>,
    /// The key the inspector's sessions are signed under (at least 32 characters; redacted
    /// in `Debug`): set the same in every instance behind one load balancer, so that a
    /// session holds at whichever it picks. Whoever holds it can sign anyone's session: it
    /// is the service's own secret, never an operator's. Unset, sessions are signed under a
    /// key derived from `token` when no operator has a token of their own (`operators`);
    /// otherwise under a random key of the process — they then end when it restarts and
    /// hold at this instance alone (said at start-up). A new secret ends every session.
    #[serde(
        serialize_with = "crate::setting::redacted",
        skip_serializing_if = "Option::is_none"
    )]
    pub session_secret: Option<Secret>,
    /// Networks that may call it (CIDR). Default: loopback only.
    pub allow_ips: Vec<String>,
    /// Accept the token, and the inspector's login and session, over plain HTTP from
    /// another machine. Off by default: a call that comes neither from this machine nor
    /// through a trusted proxy (`server.trusted_proxies`) that says the browser or the
    /// command came over HTTPS is refused 403, since its token crossed a network in the
    /// clear and is anyone's who watches it. Said at start-up when on.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub allow_plain_http: bool,
    /// How many recent requests to the endpoints the inspector keeps (see
    /// [`crate::inspector`]); 0 turns recording off. Default 500.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub inspector_recent: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            token: None,
            operators: std::collections::BTreeMap::new(),
            viewers: Vec::new(),
            session_secret: None,
            allow_ips: vec!["127.0.0.1/32".into(), "::1/128".into()],
            allow_plain_http: false,
            inspector_recent: 500,
        }
    }
}

impl AdminConfig {
    /// Whether the operating API is served: a token, shared or an operator's, is set.
    pub fn is_on(&self) -> bool {
        self.token.is_some() || !self.operators.is_empty()
    }

    /// What a service checks of these settings at start-up beyond
    /// [`Config::validate`](crate::Config::validate): `token` must not be an operator's
    /// token, and beside operators `session_secret` must be neither `token` nor an
    /// operator's. (A configuration the command line calls the operating API with may hold
    /// an operator's token as `token`: it is the token it calls with, so this is not part
    /// of every configuration's check.) `payhook check-config` runs it.
    ///
    /// ```
    /// use payhook::config::AdminConfig;
    /// use payhook::server::OperatorToken;
    ///
    /// let token = "phop_alice-token-for-the-example-0123456789";
    /// let mut admin = AdminConfig::default();
    /// admin.operators = [("alice".to_owned(), OperatorToken::digest_of(token))].into();
    /// assert!(admin.check_as_served().is_ok());
    /// admin.session_secret = Some(token.into());
    /// let error = admin.check_as_served().unwrap_err().to_string();
    /// assert!(error.contains("admin.session_secret") && !error.contains(token));
    /// ```
    pub fn check_as_served(&self) -> Result<(), crate::config::ConfigError> {
        super::operators::check_tokens_apart(self)
    }

    /// Checks values that have the right type but are not acceptable.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        if let Some(token) = &self.token {
            crate::setting::long_enough("admin.token", token, 16)?;
        }
        if let Some(secret) = &self.session_secret {
            crate::setting::long_enough("admin.session_secret", secret, 32)?;
        }
        super::operators::check(&self.operators)?;
        super::operators::check_viewers(&self.operators, &self.viewers)?;
        for text in &self.allow_ips {
            if let Err(error) = text.parse::<Cidr>() {
                return Err(InvalidSetting {
                    key: "admin.allow_ips".into(),
                    reason: error.to_string(),
                });
            }
        }
        Ok(())
    }
}
