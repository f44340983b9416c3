//! Configuration: built-in defaults, then a TOML file, then `PAYHOOK_*` environment
//! variables, then one validation step whose errors name the bad key.
//!
//! Each section belongs to the module it configures, with its own checks: `[server]`,
//! `[callback]` and `[admin]` to [`crate::server`] (`[paths]` with its routes),
//! `[signature]` to [`crate::signature`], `[auth]` to the validation endpoints' authentication, `[store]` to
//! [`crate::store`], `[gateway]` to [`crate::gateway`], `[validation]` to
//! [`crate::postponed`]. This module assembles them into [`Config`], loads and layers them,
//! maps `PAYHOOK_*` variables to keys, and checks what involves more than one section (a
//! `signature` method needs keys; Awaitable mode needs a gateway and a time budget within
//! the handler timeout). Every type is re-exported here.
//!
//! Every key, its default and its environment variable are in the README's configuration
//! table, which a test holds equal to the keys these types accept. Durations are written
//! `"250ms"`, `"10s"`, `"5m"`, `"1h"`, `"30d"`, or as a bare number of seconds.
//! `PAYHOOK_CONFIG` names the TOML file for [`Config::from_env`]; `PAYHOOK_MOCK_*` variables
//! belong to the simulator and are ignored here. Any other `PAYHOOK_*` variable that names
//! no setting is an error (a typo must not pass silently). Loading reads the process
//! environment; it never changes it.
//!
//! ## Defaults where the aggregator's interface is silent
//!
//! The aggregator's interface (`openapi/aggregator-interface.md`) leaves gaps; payhook fills
//! each with a configurable default:
//!
//! | gap | payhook's default |
//! |---|---|
//! | what counts as a delivered callback | any 2xx; payhook answers 200 only after your handler returns `Ack` |
//! | how to ask the aggregator to retry | 503 with `Retry-After` (`callback.retry_after`, default 30 s) |
//! | payload size limit | 1 MiB (`server.body_limit`) |
//! | slow and idle clients | headers within 10 s (`server.header_read_timeout`, also between HTTP/1 requests); the body within 30 s (`server.request_timeout`) and never slower than 240 bytes/s after 5 s (`server.min_body_rate`, `server.min_body_rate_grace`), else 408; a connection with no request in progress for 60 s is closed (`server.idle_timeout`), HTTP/2 included however it answers PINGs; at most 512 connections at once (`server.max_connections`) and 128 from one address (`server.max_connections_per_address`): when full, the least active connection whose handler is not running (idle, or sending slowly) gives its place to the new one, and a new one waits only when every connection is working. the bodies arriving at once hold at most 64 MiB (`server.body_memory_limit`), a quarter of it per client, and when they are full, the bodies arriving for longer than 5 s give their memory up to a new one (408), else it is 503 with `Retry-After`. `payhook_connections_shed_total{reason}` counts the connections closed |
//! | amounts | exact `rust_decimal::Decimal` from the JSON text (numbers or numeric strings); a number that cannot be held exactly is a 400, never a rounding; written back with their scale (`10.50` stays `10.50`) |
//! | the sign of amounts | an amount is what moves, and the direction is a field of its own (`cashIn`, `transactionType`), so: a validation's amount must be above zero, a callback's must not be negative (zero is accepted: a failed payment may report that nothing moved); otherwise 400, and `reconcile` refuses such a record likewise |
//! | times | UTC; read with or without `Z` or an offset, 0–7+ fractional digits (as .NET writes); written RFC 3339 with `Z` |
//! | unknown status / type codes | kept as `Unknown(code)`, never an error |
//! | unknown fields | ignored; `null` and absence are the same for optional fields |
//! | required fields | the ones money depends on: ids, nonce, amount, currency, direction, status, client id |
//! | identifiers | a nonce must not be empty or blank (it keys deduplication: blank nonces would all share one record); nonce and client id, and a transaction validation's currency (its record keeps it), at most 256 characters (`server.max_identifier_chars`); 400 otherwise. In logs, values from the wire have control characters, line separators and bidirectional controls escaped and are cut to 128 characters |
//! | callback signature header | `X-Signature` (`signature.header`) |
//! | signature algorithm | RSA PKCS#1 v1.5 SHA-256, what .NET's `RSA.SignData` produces (`signature.algorithm`) |
//! | signature encoding | standard base64 (`signature.encoding`); padding optional when reading |
//! | callbacks without keys | refused at start-up unless `callback.allow_unsigned = true` (then each unsigned callback logs a warning); with keys, every callback must be signed |
//! | how the aggregator authenticates validation calls | `none` by default; per endpoint: signature, shared-secret header, HTTP Basic, and/or an IP allow-list (`[auth.*]`). In Awaitable mode the transaction validation endpoint's decisions are posted to the aggregator, so there an open endpoint (no method, no allow-list) is refused at start-up unless `validation.allow_unauthenticated = true` |
//! | the client's address behind a reverse proxy | the socket's peer; with `server.trusted_proxies`, the right-most `X-Forwarded-For` address that is not a trusted proxy (so a client cannot forge an allowed one); a trusted proxy that sends no header, a malformed one or one naming only trusted proxies leaves it unknown, and allow-lists refuse |
//! | postponed (Awaitable) validation | declared with `validation.awaitable = true`; see the README's "Awaitable validation" |
//! | a validated nonce asked about again under a new `validationId` | the recorded answer, without the handler; in Awaitable mode the new id is kept as a repeat of the validation the handler saw and gets its result posted too (at most 100 per validation) |
//! | access token presentation to the gateway | `Authorization: Bearer <accessToken>` (`gateway.auth_header`, `gateway.auth_scheme`) |
//! | token lifetimes | refreshed `gateway.refresh_margin` (60 s) before `accessTokenExpiryUtc`, but at most half the token's granted lifetime before it (a 30 s token is used for 15 s); a token that arrives already expired by this host's clock is used until refused; login again when the refresh token expired; one refresh and one retry on a 401 |
//! | when a postponed result counts as delivered | the aggregator's 200; a 403 with the aggregator's `{"message": …}` body is final (a conflict; a proxy or firewall that answers 403 with such a body is taken for the aggregator); another 2xx is no delivery; anything else, a bare 403 included, is retried with backoff (`validation.retry_schedule`; a 429 or a 503's `Retry-After`, up to an hour, holds back every post until it is over) |

use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
};

use crate::setting::InvalidSetting;

pub use crate::auth::{AuthConfig, AuthMethod, Cidr, CidrError, EndpointAuthConfig};
pub use crate::gateway::GatewayConfig;
pub use crate::postponed::{DeadlineOutcome, ValidationConfig};
pub use crate::server::{AdminConfig, CallbackConfig, PathsConfig, ServerConfig};
pub use crate::setting::{DurationError, REDACTED, format_duration, parse_duration};
pub use crate::signature::{KeySource, SignatureConfig};
pub use crate::store::StoreConfig;

/// Prefix of every configuration environment variable.
pub const ENV_PREFIX: &str = "PAYHOOK_";
/// Environment variable naming the configuration file.
pub const CONFIG_FILE_VAR: &str = "PAYHOOK_CONFIG";
/// Prefix of the simulator's own variables (`PAYHOOK_MOCK_PASSWORD`, the mock gateway's
/// password for `payhook mock-gateway` and `payhook scenario`). They configure the
/// aggregator the simulator plays, not a service, so the loader leaves them alone — an
/// operator who exports one for the simulator can still start a service in the same shell.
pub const SIMULATOR_ENV_PREFIX: &str = "PAYHOOK_MOCK_";
/// Prefixes of the development tools' own variables: `PAYHOOK_TEST_DATABASE_URL` (the
/// PostgreSQL of payhook's tests and of a scaffolded service's test) and
/// `PAYHOOK_BENCH_DATABASE_URL` (the benchmark's). Left alone by the loader, like the
/// simulator's: a developer who exports one can still start a service in the same shell.
pub const TOOLING_ENV_PREFIXES: [&str; 2] = ["PAYHOOK_TEST_", "PAYHOOK_BENCH_"];

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error(
        "cannot read {}; check the configuration file's path (PAYHOOK_CONFIG or the file argument)",
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
    /// The configuration file may be written by any user on the machine: it decides what is
    /// trusted — the aggregator's keys, the tokens, whether callbacks must be signed.
    #[error(
        "{} {why}: it decides what payhook trusts (the aggregator's keys, the tokens, whether \
         callbacks must be signed)",
        path.display()
    )]
    Changeable {
        /// The file.
        path: PathBuf,
        /// Who could change it, and how to stop them.
        why: String,
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

impl From<InvalidSetting> for ConfigError {
    fn from(InvalidSetting { key, reason }: InvalidSetting) -> Self {
        Self::Invalid { key, reason }
    }
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
    /// `[admin]`: the operating API of a running service (off unless a token is set, shared
    /// or an operator's).
    pub admin: AdminConfig,
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

    /// The settings `file` holds, as written: without `PAYHOOK_*` and unchecked — for a
    /// test that replaces what is production's (the store, the aggregator's keys, the
    /// endpoints' credentials, the gateway) and then checks the rest with
    /// [`Config::validate`]. A file that names a secret it leaves to the environment (a
    /// shared secret, a gateway password) reads here; [`Config::load`] would refuse it
    /// without the variable. A service loads with [`Config::load`].
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// let file = dir.path().join("payhook.toml");
    /// // The secret comes from PAYHOOK_AUTH_TRANSACTION_VALIDATION_SECRET in production.
    /// std::fs::write(&file, "[auth.transaction_validation]\nmethod = \"shared_secret\"\n")?;
    /// assert!(payhook::Config::load(Some(&file), std::iter::empty()).is_err());
    /// let mut config = payhook::Config::read_unchecked(&file)?;
    /// config.auth = payhook::config::AuthConfig::default(); // the test's own
    /// config.validate()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when the file cannot be read, is no TOML, or holds a key or a type
    /// payhook does not know.
    pub fn read_unchecked(file: &Path) -> Result<Self, ConfigError> {
        Self::from_table(read_table(file)?, &file.display().to_string())
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
        Self::load(file.as_deref(), environment()?)
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
        // Each section's own checks, in the order of the file.
        self.server.validate()?;
        self.store.validate()?;
        self.callback.validate()?;
        self.paths.validate()?;
        self.auth.validate()?;
        self.gateway.validate()?;
        self.validation.validate()?;
        self.admin.validate()?;
        // Then what involves more than one section.
        self.check_across_sections()?;
        Ok(())
    }

    /// The settings that only make sense together.
    fn check_across_sections(&self) -> Result<(), InvalidSetting> {
        let endpoints = [
            ("auth.providers_validation", &self.auth.providers_validation),
            (
                "auth.transaction_validation",
                &self.auth.transaction_validation,
            ),
        ];
        for (key, endpoint) in endpoints {
            if endpoint.method == AuthMethod::Signature && self.signature.keys.is_empty() {
                return Err(InvalidSetting::new(
                    format!("{key}.method"),
                    "\"signature\" needs the aggregator's keys in signature.keys",
                ));
            }
            if endpoint.method == AuthMethod::SharedSecret
                && endpoint
                    .header
                    .trim()
                    .eq_ignore_ascii_case(self.signature.header.trim())
            {
                // The inspector shows the signature's header, whatever its name.
                return Err(InvalidSetting::new(
                    format!("{key}.header"),
                    "is signature.header, whose value payhook shows (the inspector); carry the secret in another header",
                ));
            }
        }
        let validation = &self.validation;
        let handler_timeout = self.server.handler_timeout;
        if validation.awaitable && !self.gateway.is_complete() {
            return Err(InvalidSetting::new(
                "validation.awaitable",
                "Awaitable mode posts results to the aggregator: set gateway.auth_url, gateway.gateway_url, gateway.username and gateway.password",
            ));
        }
        if validation.awaitable
            && self.auth.transaction_validation.is_open()
            && !validation.allow_unauthenticated
        {
            return Err(InvalidSetting::new(
                "auth.transaction_validation.method",
                "is \"none\" with no allow_ips (or one that admits every address, such as 0.0.0.0/0), and \
                 Awaitable mode posts that endpoint's decisions to the aggregator: anyone who reaches it could have a decision posted under a validationId they \
                 guess. Set a method (signature, shared_secret, basic) or allow_ips, or \
                 validation.allow_unauthenticated = true to serve it open deliberately",
            ));
        }
        if validation.awaitable && validation.time_budget >= handler_timeout {
            // The budget is how long to wait before answering "postponed"; the handler may
            // run on until the handler timeout. A budget past it would never apply, and the
            // nonce's claim would outlive the time after which a repeat may take it over.
            return Err(InvalidSetting::new(
                "validation.time_budget",
                "must be shorter than server.handler_timeout",
            ));
        }
        if validation.awaitable && validation.deadline.is_some_and(|d| d <= handler_timeout) {
            // A handler that overran its budget may decide until the handler timeout: a
            // deadline before that would send the deadline's outcome and then refuse the
            // handler's own decision as a conflict.
            return Err(InvalidSetting::new(
                "validation.deadline",
                "must be longer than server.handler_timeout",
            ));
        }
        Ok(())
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
    crate::secret::check_trusted_file(path, "the configuration").map_err(|why| {
        ConfigError::Changeable {
            path: path.to_owned(),
            why,
        }
    })?;
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let table = text
        .parse::<toml::Table>()
        .map_err(|e| syntax_error(&path.display().to_string(), &text, &e))?;
    let secrets = secrets_in(&table);
    if !secrets.is_empty() {
        crate::secret::warn_if_readable_by_others(path, &secrets.join(", "));
    }
    Ok(table)
}

/// The secret keys (see [`SECRET_KEYS`]) `table` sets to a value that is not empty.
fn secrets_in(table: &toml::Table) -> Vec<String> {
    SECRET_KEYS
        .iter()
        .filter(|path| {
            secret_value(table, path).is_some_and(|v| v.as_str().is_none_or(|s| !s.is_empty()))
        })
        .map(|path| path.join("."))
        .collect()
}

/// The value at `path` in `table`, if set.
fn secret_value<'a>(table: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let mut value = None;
    let mut current = Some(table);
    for name in path {
        value = current.and_then(|t| t.get(*name));
        current = value.and_then(toml::Value::as_table);
    }
    value
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
const SECRET_KEYS: [&[&str]; 9] = [
    &["store", "url"],
    &["gateway", "password"],
    &["gateway", "proxy"],
    &["admin", "token"],
    &["admin", "session_secret"],
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
        if secret_value(table, path).is_some_and(|v| !v.is_str()) {
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

/// Whether variable `name` sets a setting: `PAYHOOK_*`, but not the configuration file's
/// name (a path, read as one), the simulator's or the tooling's.
fn read_as_setting(name: &str) -> bool {
    name.starts_with(ENV_PREFIX)
        && name != CONFIG_FILE_VAR
        && !name.starts_with(SIMULATOR_ENV_PREFIX)
        && !TOOLING_ENV_PREFIXES
            .iter()
            .any(|prefix| name.starts_with(prefix))
}

/// The process's `PAYHOOK_*` variables, for [`Config::load`]. Unlike `std::env::vars`,
/// which panics on one, a variable that is not UTF-8 does not stop the service: another
/// program's (or payhook's configuration file's name, the simulator's or the tooling's) is
/// left out, and one of the settings' is refused, by name.
///
/// ```
/// # fn main() -> Result<(), payhook::config::ConfigError> {
/// let config = payhook::Config::load(None, payhook::config::environment()?)?;
/// # let _ = config;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// [`ConfigError::Invalid`] naming a `PAYHOOK_*` variable whose value is not UTF-8.
pub fn environment() -> Result<Vec<(String, String)>, ConfigError> {
    let mut variables = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| read_as_setting(n)) else {
            continue;
        };
        let value = value.into_string().map_err(|_| ConfigError::Invalid {
            key: name.to_owned(),
            reason: "is not UTF-8".to_owned(),
        })?;
        variables.push((name.to_owned(), value));
    }
    Ok(variables)
}

/// `PAYHOOK_SERVER_BODY_LIMIT=65536` → `["server", "body_limit"]` = `"65536"`;
/// `PAYHOOK_AUTH_TRANSACTION_VALIDATION_METHOD` → `["auth", "transaction_validation", "method"]`.
fn env_overrides(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeMap<Vec<String>, toml::Value>, ConfigError> {
    let mut overrides = BTreeMap::new();
    for (name, value) in env {
        if !read_as_setting(&name) {
            continue;
        }
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
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

/// A variable's value: a TOML array or inline table when it looks like one, else a string
/// (an IPv6 socket address such as `[::]:8080` included, which only looks like an array).
fn env_value(name: &str, value: String) -> Result<toml::Value, ConfigError> {
    if !value.trim_start().starts_with(['[', '{'])
        || value.trim().parse::<std::net::SocketAddr>().is_ok()
    {
        return Ok(toml::Value::String(value));
    }
    let parsed: toml::Table = format!("v = {value}")
        .parse()
        .map_err(|e: toml::de::Error| {
            // Not quoted: a secret's variable with a typo in its name (PAYHOOK_GATEWAY_PASWORD)
            // is no secret's key, and its value would be.
            ConfigError::Parse {
                origin: name.to_owned(),
                message: format!(
                    "starts like a TOML array or inline table but is not one: {} (the value \
                     is not shown: it may be a secret)",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;
    use std::time::Duration;

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

    /// Unchecked is not unparsed: a file read for a test still names a key payhook does
    /// not know, or a value of the wrong type, and one that cannot be read.
    #[test]
    fn a_file_read_unchecked_still_names_unknown_keys_and_wrong_types() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("payhook.toml");
        for (text, named) in [
            ("[server]\nbody_limt = 5\n", "body_limt"),
            ("[server]\nbody_limit = \"big\"\n", "body_limit"),
        ] {
            std::fs::write(&file, text).unwrap();
            let error = Config::read_unchecked(&file).unwrap_err();
            assert!(error.to_string().contains(named), "{error}");
        }
        let missing = dir.path().join("missing.toml");
        let error = Config::read_unchecked(&missing).unwrap_err();
        assert!(error.to_string().contains("missing.toml"), "{error}");
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
                "[server]\nbody_limit = 65536\nbody_memory_limit = 65535",
                "server.body_memory_limit",
            ),
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
            (
                "[validation]\nretry_schedule = [\"1s\", \"25h\"]",
                "validation.retry_schedule",
            ),
            ("[store]\nretention = \"0s\"", "store.retention"),
            (
                "[store]\nstatement_timeout = \"0s\"",
                "store.statement_timeout",
            ),
            ("[store]\nconnect_timeout = 0", "store.connect_timeout"),
            (
                "[store]\nstatement_timeout = \"25d\"",
                "store.statement_timeout",
            ),
            (
                "[server]\nmin_body_rate = 0\nmin_body_rate_grace = \"0s\"",
                "server.min_body_rate_grace",
            ),
            (
                "[server]\nmin_body_rate_grace = \"0s\"",
                "server.min_body_rate_grace",
            ),
            (
                "[paths]\ncallback = \"/payhook/admin/cb\"",
                "paths.callback",
            ),
            (
                "[auth.transaction_validation]\nsecret = \"s3cr3t-0123456789\"\nallow_ips = [\"10.0.0.0/8\"]",
                "auth.transaction_validation.secret",
            ),
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
            // A secret in a header whose value payhook shows.
            (
                "[auth.providers_validation]\nmethod = \"shared_secret\"\nsecret = \"s3cr3t-0123456789\"\nheader = \"User-Agent\"",
                "auth.providers_validation.header",
            ),
            (
                "[auth.transaction_validation]\nmethod = \"shared_secret\"\nsecret = \"s3cr3t-0123456789\"\nheader = \"X-Signature\"",
                "auth.transaction_validation.header",
            ),
            (
                "[signature]\nheader = \"X-Hook-Sig\"\n[auth.transaction_validation]\nmethod = \"shared_secret\"\nsecret = \"s3cr3t-0123456789\"\nheader = \"x-hook-sig\"",
                "auth.transaction_validation.header",
            ),
            (
                concat!(
                    "[gateway]\nauth_url = \"https://a.example\"\ngateway_url = \"https://g.example\"\n",
                    "username = \"u\"\npassword = \"p\"\n",
                    "[validation]\nawaitable = true\nallow_unauthenticated = true\ntime_budget = \"20s\""
                ),
                "validation.time_budget",
            ),
            (
                concat!(
                    "[gateway]\nauth_url = \"https://a.example\"\ngateway_url = \"https://g.example\"\n",
                    "username = \"u\"\npassword = \"p\"\n",
                    "[validation]\nawaitable = true\nallow_unauthenticated = true\ndeadline = \"10s\""
                ),
                "validation.deadline",
            ),
            (
                concat!(
                    "[gateway]\nauth_url = \"https://a.example\"\ngateway_url = \"https://g.example\"\n",
                    "username = \"u\"\npassword = \"p\"\n",
                    "[validation]\nawaitable = true"
                ),
                "auth.transaction_validation.method",
            ),
        ];
        for (toml, key) in cases {
            let error = Config::from_toml(toml).unwrap_err();
            assert!(error.to_string().starts_with(key), "{toml}: {error}");
        }
    }

    #[test]
    fn an_ipv6_listen_address_is_set_from_the_environment() {
        let config = Config::load(None, env(&[("PAYHOOK_SERVER_LISTEN", "[::1]:8080")])).unwrap();
        assert_eq!(config.server.listen, "[::1]:8080".parse().unwrap());
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
                (
                    "PAYHOOK_AUTH_TRANSACTION_VALIDATION_SECRET",
                    "12345-67890-abcdef",
                ),
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
            Some("12345-67890-abcdef"),
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
            both.load().unwrap_err().to_string(),
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
        assert_eq!(
            parse_duration("36500d"),
            Ok(Duration::from_secs(36_500 * 86_400))
        );
        assert!(parse_duration("36501d").is_err());
    }

    #[test]
    fn a_duration_of_seconds_is_held_to_the_bound_of_text() {
        // Taken as it was, `Instant::now() + handler_timeout` panicked on every request.
        for toml in [
            "[server]\nhandler_timeout = 9223372036854775807",
            "[server]\nhandler_timeout = 3153600001",
            "[validation]\ndeadline = 9223372036854775807",
        ] {
            let error = Config::from_toml(toml).unwrap_err().to_string();
            assert!(error.contains("too long"), "{toml}: {error}");
        }
        let config = Config::from_toml("[server]\nhandler_timeout = 3153600000").unwrap();
        assert_eq!(
            config.server.handler_timeout,
            Duration::from_secs(3_153_600_000)
        );
        assert_eq!(
            Config::from_toml("[store]\nretention = 60")
                .unwrap()
                .store
                .retention,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_variable_that_is_not_toml_is_refused_without_its_value() {
        // A password's variable with a typo in its name is no secret's key.
        let error = Config::load(
            None,
            env(&[("PAYHOOK_GATEWAY_PASWORD", "[s3cret-with-a-bracket")]),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("PAYHOOK_GATEWAY_PASWORD"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
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
