//! The service's credentials, read again while it runs ([`Credentials`]): the aggregator's
//! signature keys rotated, the merchant's password at the aggregator changed or its client
//! certificate renewed, an operator added, one who left taken out, a token replaced, a
//! viewer named — on SIGHUP
//! ([`Credentials::read_again_on_hangup`]), when the operating API is asked (`POST
//! /payhook/admin/credentials/read-again`, `payhook credentials read-again`: the same
//! reading, [`Credentials::read_again_now`], of what [`Credentials::read_from`] gave; `POST
//! /payhook/admin/credentials/check`, [`Credentials::check_now`], says what it would change
//! and takes nothing) or when
//! the merchant's service says ([`Credentials::read_again`]), without a restart, which would
//! cut the deliveries in flight and, without `admin.session_secret`, end every inspector
//! session.
//!
//! What is read again: `signature.keys` and `signature.algorithm` (the keys' default), where
//! the service verifies signatures — every key file is read again, a file replaced under the
//! same path being a rotation too; `gateway.username`, `gateway.password` and the gateway's
//! TLS files (`gateway.ca_file`, `client_cert_file`, `client_key_file`, read again too),
//! where the service calls the aggregator; and what
//! [`AdminAccess`](super::admin_access::AdminAccess) reads, where the operating API is
//! served: `admin.token`, `admin.operators`, `admin.viewers`, `admin.session_secret`,
//! `admin.allow_ips` and `admin.allow_plain_http`; and the validation endpoints' `[auth]`
//! (their method, shared secret, Basic user and password, allow-list: a leaked secret
//! replaced without a restart). Every other setting stays as the service started with it,
//! and one that differs is named in a warning (it takes a restart).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::admin_access::{AdminAccess, CurrentAccess};
use super::ingress::Ingress;
use super::metrics::Metrics;
use super::operators;
use super::settings::AdminConfig;
use crate::Secret;
use crate::auth::Guard;
use crate::config::{Config, ConfigError};
use crate::gateway::{GatewayClient, GatewayConfig};
use crate::logged::Logged;
use crate::signature::{SignatureConfig, Verifier};

/// The credentials of a running [`App`](crate::App) — the aggregator's signature keys, the
/// merchant's user and password at the aggregator and the TLS files of its connections, the
/// operating API's tokens — which a configuration read again replaces: got from
/// [`App::credentials`](crate::App::credentials) before the app is served. Clones share them.
///
/// A call is judged by the credentials as read when it is checked (its signature once its
/// body has arrived); one checked before goes on. Once they are replaced:
///
/// - **signature keys**: a signature is verified by the keys now listed, and nothing
///   verified before counts as verified — a retry signed by a key taken out is refused (401)
///   even where its very bytes were accepted before. To rotate without refusing the
///   aggregator's retries of callbacks it signed with the old key (they carry their first
///   signature), list the new key beside the old and take the old out once those retries are
///   over (about 3 days with payhook's simulator; the aggregator's own schedule decides).
/// - **the aggregator's login**: the next login sends the new user and password, at once
///   even where logins are paused after the aggregator refused the old ones (see
///   [`GatewayClient::replace_credentials`]); the next connections to the aggregator present
///   the client certificate and trust the CA as their files now say
///   ([`GatewayClient::read_tls_files_again`]).
/// - **operating API**: a token no longer configured is refused (401) — an operator taken
///   out, a token replaced — and so is every inspector session of it; an operator made a
///   viewer may change nothing from their next call on, in their open sessions too. The
///   sessions of a credential that stays go on, the sessions ended by logging out stay
///   ended, and the wrong guesses counted per address stay counted — unless the key
///   sessions are signed under changes: a new `admin.session_secret`, or, without one, the first operator added where
///   only `admin.token` was (its sessions were signed under a key derived from it, which its
///   bearers could derive) or the last one taken out; every session ends then.
/// - **validation endpoints** (`[auth]`): a request checked from now on must carry the new
///   shared secret or Basic credentials and come from the new allow-list; the old secret
///   is refused (401).
///
/// ```no_run
/// # async fn run(app: payhook::App) {
/// // `kill -HUP <pid>` after editing the file named by PAYHOOK_CONFIG, or replacing a key
/// // or certificate file it names.
/// tokio::spawn(app.credentials().read_again_on_hangup(payhook::Config::from_env));
/// # }
/// ```
#[derive(Clone)]
pub struct Credentials {
    /// The operating API's access, when the API is served.
    admin: Option<Arc<CurrentAccess>>,
    /// Where signatures are verified with the keys as read last (when keys are configured).
    ingress: Arc<Ingress>,
    /// The aggregator's client, when the service calls it.
    gateway: Option<GatewayClient>,
    /// The configuration as the service runs it: started with, the credentials as read last.
    running: Arc<Mutex<Config>>,
    /// Where the configuration is read again from, when the service said
    /// ([`Credentials::read_from`]).
    source: Arc<Mutex<Option<Source>>>,
    /// Where the readings are counted.
    metrics: Arc<Metrics>,
}

/// What reads the service's configuration again (say, [`Config::from_env`]).
type Source = Box<dyn FnMut() -> Result<Config, ConfigError> + Send>;

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

/// Why a configuration read again was not taken: every credential stays as it was, the
/// signature keys, the gateway's login and TLS files and the operating API's alike.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsRefused {
    /// The configuration is not one the service would start with.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A signature key cannot be read (its file), is no key, or does not fit its algorithm;
    /// the error names its `signature.keys` entry.
    #[error(transparent)]
    SignatureKey(#[from] crate::signature::Error),
    /// It lists no signature key where the service verifies signatures: callbacks would no
    /// longer be verified, which takes a restart (and `callback.allow_unsigned`).
    #[error(
        "signature: no signature.keys: callbacks would go unverified, which takes a restart; \
         to rotate keys, list the new one beside the old, then take the old one out"
    )]
    WouldStopVerifying,
    /// It sets no `gateway.username` or `gateway.password` where the service calls the
    /// aggregator: its calls would have none to log in with.
    #[error(
        "gateway: no gateway.username or gateway.password: the service calls the aggregator \
         and would have none to log in with"
    )]
    WouldLoseGatewayLogin,
    /// A TLS file of the gateway's cannot be read or used — or, where the service calls no
    /// aggregator (yet), a setting of its complete `[gateway]`: the restart that takes it
    /// would fail; the error names the setting.
    #[error(transparent)]
    GatewayTls(crate::gateway::GatewayError),
    /// It asks a validation endpoint for the aggregator's signature (`method =
    /// "signature"` in `[auth]`) where the service verifies none (it started without
    /// `signature.keys`): taken, the endpoint would check nothing; that takes a restart.
    #[error(
        "auth: method = \"signature\" where the service verifies no signature (it started \
         without signature.keys): that takes a restart"
    )]
    AuthWithoutSignatures,
    /// It sets no token, shared or an operator's: that would turn the operating API off,
    /// which takes a restart (its routes are served or not from the start).
    #[error(
        "admin: no admin.token nor admin.operators: the operating API would be off, which \
         takes a restart; to keep every operator out meanwhile, leave one operator whose \
         token nobody holds"
    )]
    WouldTurnOff,
    /// Nothing was read: the service gave no configuration to read again
    /// ([`Credentials::read_from`], or [`Credentials::read_again_on_hangup`], which gives
    /// one).
    #[error(
        "the service reads no configuration again: it gave none to read \
         (Credentials::read_from or read_again_on_hangup)"
    )]
    NoSource,
    /// Reading the configuration again panicked (the service's loader), or was cut short by
    /// the runtime shutting down: nothing was taken.
    #[error("reading the configuration again panicked or was cut short")]
    Unfinished,
}

/// What a configuration read again changed of the credentials (names only, never a token),
/// and the settings it changed that take a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CredentialsChange {
    /// The signature keys now verifying, each by its id (`#2 without an id` otherwise), when
    /// they changed — a key added, taken out, replaced in its file, or given another
    /// algorithm; `None` when they did not (or signatures are not verified).
    pub signature_keys: Option<Vec<String>>,
    /// `gateway.username` or `gateway.password` changed: the next login sends them.
    pub gateway_login: bool,
    /// The gateway's TLS files changed (`gateway.ca_file`, `client_cert_file`,
    /// `client_key_file`: their paths or contents): the next connections use them.
    pub gateway_tls: bool,
    /// Operators who have a token now and had none.
    pub added: Vec<String>,
    /// Operators who had a token and have none now: their calls and sessions are refused.
    pub removed: Vec<String>,
    /// Operators whose token was replaced: the old one and its sessions are refused.
    pub new_token: Vec<String>,
    /// Operators who may look and not change now, and could change before.
    pub made_viewers: Vec<String>,
    /// Viewers who may change now (still operators).
    pub no_longer_viewers: Vec<String>,
    /// `admin.token` was set, replaced or taken out.
    pub shared_token: bool,
    /// `admin.session_secret` was set, replaced or taken out: the sessions signed under it
    /// end.
    pub session_secret: bool,
    /// `admin.allow_ips` or `admin.allow_plain_http` changed.
    pub network: bool,
    /// `[auth]` changed — the validation endpoints' method, shared secret, Basic user or
    /// password, or allow-list: a request checked from now on is judged by it.
    pub validation_auth: bool,
    /// The other settings that differ from those the service runs with, by section (or
    /// key): not taken, they take a restart.
    pub need_a_restart: Vec<&'static str>,
}

/// Whether a configuration read again is taken, or only checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    Take,
    Check,
}

/// What a configuration read again is taken for: what the running app reads again.
struct Taken<'a> {
    /// The operating API is served: its credentials are read again.
    admin: bool,
    /// The verifier of the keys read again, when they changed.
    keys: Option<&'a Verifier>,
    /// Signatures are verified: the keys are read again.
    verifies: bool,
    /// The service calls the aggregator: its user, password and TLS files are read again.
    gateway: bool,
    /// The gateway's user and password changed.
    gateway_login: bool,
    /// The gateway's TLS files changed.
    gateway_tls: bool,
    /// `[auth]` changed (and is taken).
    auth: bool,
}

impl CredentialsChange {
    fn between(before: &Config, after: &Config, taken: &Taken<'_>) -> Self {
        let mut change = Self {
            signature_keys: taken.keys.map(key_names),
            gateway_login: taken.gateway_login,
            gateway_tls: taken.gateway_tls,
            validation_auth: taken.auth,
            need_a_restart: need_a_restart(before, after, taken),
            ..Self::default()
        };
        if taken.admin {
            change.admin_between(&before.admin, &after.admin);
        }
        change
    }

    /// The operating API's credentials that changed from `was` to `is`.
    fn admin_between(&mut self, was: &AdminConfig, is: &AdminConfig) {
        let names = |config: &AdminConfig, pick: &dyn Fn(&str) -> bool| -> Vec<String> {
            config
                .operators
                .keys()
                .filter(|name| pick(name))
                .cloned()
                .collect()
        };
        let viewer = |config: &AdminConfig, name: &str| config.viewers.iter().any(|v| v == name);
        self.added = names(is, &|name| !was.operators.contains_key(name));
        self.removed = names(was, &|name| !is.operators.contains_key(name));
        self.new_token = names(is, &|name| {
            was.operators
                .get(name)
                .is_some_and(|entry| !operators::same_digest(entry, &is.operators[name]))
        });
        self.made_viewers = names(is, &|name| viewer(is, name) && !viewer(was, name));
        self.no_longer_viewers = names(is, &|name| !viewer(is, name) && viewer(was, name));
        self.shared_token = was.token != is.token;
        self.session_secret = was.session_secret != is.session_secret;
        self.network = was.allow_ips != is.allow_ips || was.allow_plain_http != is.allow_plain_http;
    }

    /// Whether the credentials changed at all.
    pub fn is_empty(&self) -> bool {
        self.said().is_empty()
    }

    /// What changed, a part each (`operators added: bob`); the settings that take a restart
    /// are not among them.
    fn said(&self) -> Vec<String> {
        let mut parts = Vec::new();
        let keys = self.signature_keys.as_ref();
        for (what, names) in [
            ("signature keys now", keys),
            ("operators added", Some(&self.added)),
            ("taken out", Some(&self.removed)),
            ("with a new token", Some(&self.new_token)),
            ("made viewers", Some(&self.made_viewers)),
            ("no longer viewers", Some(&self.no_longer_viewers)),
        ] {
            if let Some(names) = names.filter(|names| !names.is_empty()) {
                let names: Vec<String> = names.iter().map(|n| Logged(n).to_string()).collect();
                parts.push(format!("{what}: {}", names.join(", ")));
            }
        }
        for (what, changed) in [
            (
                "gateway.username or gateway.password changed",
                self.gateway_login,
            ),
            ("the gateway's TLS files changed", self.gateway_tls),
            (
                "auth (the validation endpoints' credentials) changed",
                self.validation_auth,
            ),
            ("admin.token changed", self.shared_token),
            ("admin.session_secret changed", self.session_secret),
            (
                "admin.allow_ips or admin.allow_plain_http changed",
                self.network,
            ),
        ] {
            if changed {
                parts.push(what.to_owned());
            }
        }
        parts
    }
}

impl fmt::Display for CredentialsChange {
    /// `signature keys now: k2, k1; operators added: bob; taken out: alice` — or
    /// `no change`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = self.said();
        if parts.is_empty() {
            return f.write_str("no change");
        }
        f.write_str(&parts.join("; "))
    }
}

/// The keys of `verifier`, each by its id, `#n without an id` otherwise.
fn key_names(verifier: &Verifier) -> Vec<String> {
    verifier.named_keys().map(|(name, _, _)| name).collect()
}

/// The settings of `after` that differ from `before`'s and are not `taken`.
fn need_a_restart(before: &Config, after: &Config, taken: &Taken<'_>) -> Vec<&'static str> {
    let (was, is) = (&before.signature, &after.signature);
    let signature: &[(&'static str, bool)] = if taken.verifies {
        &[
            ("signature.header", was.header != is.header),
            ("signature.encoding", was.encoding != is.encoding),
            ("signature.prefix", was.prefix != is.prefix),
        ]
    } else {
        &[("signature", was != is)]
    };
    let admin: &[(&'static str, bool)] = if taken.admin {
        &[(
            "admin.inspector_recent",
            before.admin.inspector_recent != after.admin.inspector_recent,
        )]
    } else {
        &[("admin", before.admin != after.admin)]
    };
    // The gateway's other settings, where its user, password and TLS files are taken.
    let gateway = |config: &Config| GatewayConfig {
        username: None,
        password: None,
        ca_file: None,
        client_cert_file: None,
        client_key_file: None,
        ..config.gateway.clone()
    };
    let gateway_differs = if taken.gateway {
        gateway(before) != gateway(after)
    } else {
        before.gateway != after.gateway
    };
    let others = [
        ("server", before.server != after.server),
        ("paths", before.paths != after.paths),
        ("callback", before.callback != after.callback),
        ("store", before.store != after.store),
        ("gateway", gateway_differs),
        ("validation", before.validation != after.validation),
    ];
    others
        .iter()
        .chain(signature)
        .chain(admin)
        .filter_map(|(what, differs)| differs.then_some(*what))
        .collect()
}

impl Credentials {
    pub(super) fn new(
        admin: Option<Arc<CurrentAccess>>,
        ingress: Arc<Ingress>,
        gateway: Option<GatewayClient>,
        running: Config,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            admin,
            ingress,
            gateway,
            running: Arc::new(Mutex::new(running)),
            source: Arc::default(),
            metrics,
        }
    }

    /// The aggregator's client whose login and TLS files are replaced, when the service
    /// calls it.
    pub(super) fn gateway(&self) -> Option<&GatewayClient> {
        self.gateway.as_ref()
    }

    /// From now on, the configuration is read again from `load` (say, [`Config::from_env`])
    /// when asked: by [`Credentials::read_again_now`] — which the operating API's `POST
    /// /payhook/admin/credentials/read-again` and `payhook credentials read-again` call — and
    /// on SIGHUP where [`Credentials::read_again_on_hangup`] listens (it calls this itself).
    /// Replaces what an earlier call gave. Kept as long as the app: a `load` that holds the
    /// app (or its credentials) keeps it for ever.
    pub fn read_from<F>(&self, load: F)
    where
        F: FnMut() -> Result<Config, ConfigError> + Send + 'static,
    {
        *self.source.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(load));
    }

    /// Reads the configuration again from what [`Credentials::read_from`] gave, off the
    /// runtime's threads, and takes its credentials ([`Credentials::read_again`]). Logged
    /// at info level with what changed; one refused, at error level. One reading at a time,
    /// from loading to taking: a second asked meanwhile waits for the first (and for a `load`
    /// that never returns, for ever), so that the configuration loaded last is the one taken.
    ///
    /// # Errors
    ///
    /// [`CredentialsRefused::NoSource`] when none was given; [`CredentialsRefused::Config`]
    /// when it cannot be read; [`CredentialsRefused::Unfinished`] when the reading panicked
    /// or the runtime is shutting down; any other refusal of [`Credentials::read_again`].
    /// Nothing is taken then: every credential stays as it was.
    pub async fn read_again_now(&self) -> Result<CredentialsChange, CredentialsRefused> {
        let read = self.load_and(Reading::Take).await;
        if let Err(error) = &read {
            tracing::error!(
                error = %crate::report::InLine(error),
                "credentials: the configuration read again was not taken: the credentials \
                 stay as they were"
            );
        }
        read
    }

    /// [`Credentials::read_again_now`] taking nothing: what it would change, or why it would
    /// be refused ([`Credentials::check`] of what [`Credentials::read_from`] gave). Logged at
    /// info level.
    ///
    /// # Errors
    ///
    /// As [`Credentials::read_again_now`]: what a reading now would be refused for.
    pub async fn check_now(&self) -> Result<CredentialsChange, CredentialsRefused> {
        let checked = self.load_and(Reading::Check).await;
        if let Err(error) = &checked {
            tracing::info!(
                error = %crate::report::InLine(error),
                "credentials: checked: the configuration would not be taken"
            );
        }
        checked
    }

    /// Loads the configuration from the source, off the runtime's threads, and takes or
    /// checks it, holding the source throughout. A reading to take is counted on
    /// `/metrics` — taken, or refused (a configuration that cannot be loaded included) —
    /// unless no source was given: nothing was read then.
    async fn load_and(&self, reading: Reading) -> Result<CredentialsChange, CredentialsRefused> {
        let credentials = self.clone();
        // Off the runtime's threads: a file on a slow disk holds none.
        let read = tokio::task::spawn_blocking(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut source = credentials
                    .source
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let load = source.as_mut().ok_or(CredentialsRefused::NoSource)?;
                let config = load().inspect_err(|_| credentials.count_refused(reading))?;
                // Still held: a reading that loaded later takes its configuration later.
                credentials.take(&config, reading)
            }))
        })
        .await;
        match read {
            Ok(Ok(read)) => read,
            // Panicked, or cancelled: the runtime is shutting down.
            Ok(Err(_)) | Err(_) => {
                self.count_refused(reading);
                Err(CredentialsRefused::Unfinished)
            }
        }
    }

    /// Counts a reading to take that was refused before [`Credentials::take`] could count
    /// it: its configuration could not be loaded, or the reading did not finish.
    fn count_refused(&self, reading: Reading) {
        if reading == Reading::Take {
            self.metrics.credentials_read(false);
        }
    }

    /// Takes the credentials of `config`: from the next call on, signatures are verified by
    /// `signature.keys` (read again, files included, with `signature.algorithm`) where the
    /// service verifies signatures; where the service calls the aggregator, the next login
    /// sends `gateway.username` and `gateway.password` and the next connections are made with
    /// `gateway.ca_file`, `client_cert_file` and `client_key_file` (read again too); and the
    /// operating API lets in whom `admin.token`, `admin.operators`, `admin.viewers`,
    /// `admin.session_secret`, `admin.allow_ips` and `admin.allow_plain_http` name where it
    /// is served. Logged at info level with what changed (key ids and names, never a
    /// secret); a setting besides those that differs from the service's is named in a
    /// warning, and not taken. Reads the key and TLS files: a short blocking call.
    ///
    /// # Errors
    ///
    /// [`CredentialsRefused`] when `config` is not one the service would start with (it is
    /// checked as at start, every key and TLS file read), would stop verifying signatures,
    /// would leave the gateway without a login or would turn the operating API off: nothing
    /// is taken then, every credential stays as it was.
    pub fn read_again(&self, config: &Config) -> Result<CredentialsChange, CredentialsRefused> {
        self.take(config, Reading::Take)
    }

    /// What [`Credentials::read_again`] would change with `config`, and the settings that
    /// would wait for a restart — every check made, every key and TLS file read — taking
    /// nothing: a rotation tried before it is made. Reads the key and TLS files: a short
    /// blocking call.
    ///
    /// # Errors
    ///
    /// What [`Credentials::read_again`] would refuse `config` for.
    pub fn check(&self, config: &Config) -> Result<CredentialsChange, CredentialsRefused> {
        self.take(config, Reading::Check)
    }

    /// [`Credentials::read_again`], counted on `/metrics` while the configuration the service
    /// runs is held (two readings at once are counted in the order they were taken); or, to
    /// [`Reading::Check`], everything but the taking, uncounted.
    fn take(
        &self,
        config: &Config,
        reading: Reading,
    ) -> Result<CredentialsChange, CredentialsRefused> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = self.take_into(&mut running, config, reading);
        if reading == Reading::Take {
            self.metrics.credentials_read(taken.is_ok());
        }
        taken
    }

    /// The validation endpoints' checks of `is` (`[auth]`), where it differs from `was`;
    /// refused where one would ask for a signature the service does not verify.
    fn auth_read_again(
        &self,
        was: &crate::config::AuthConfig,
        is: &crate::config::AuthConfig,
    ) -> Result<Option<(Guard, Guard)>, CredentialsRefused> {
        if was == is {
            return Ok(None);
        }
        let guard = |config, key| Guard::from_config(config, key).map_err(ConfigError::from);
        let providers = guard(&is.providers_validation, "auth.providers_validation")?;
        let validation = guard(&is.transaction_validation, "auth.transaction_validation")?;
        let signed = providers.needs_signature() || validation.needs_signature();
        if signed && !self.ingress.verifies_signatures() {
            return Err(CredentialsRefused::AuthWithoutSignatures);
        }
        Ok(Some((providers, validation)))
    }

    /// [`Credentials::take`] with `running`, the configuration the service runs, held.
    fn take_into(
        &self,
        running: &mut Config,
        config: &Config,
        reading: Reading,
    ) -> Result<CredentialsChange, CredentialsRefused> {
        config.validate()?;
        config.admin.check_as_served()?;
        // Everything is checked before anything is taken.
        let keys = self.keys_read_again(&running.signature, &config.signature)?;
        let access = self.admin_read_again(&config.admin)?;
        let login = self.gateway_read_again(&running.gateway, &config.gateway)?;
        let guards = self.auth_read_again(&running.auth, &config.auth)?;
        let transport = match &self.gateway {
            Some(gateway) => gateway
                .transport_read_again(&config.gateway)
                .map_err(CredentialsRefused::GatewayTls)?,
            None => None,
        };
        let taken = Taken {
            admin: access.is_some(),
            keys: keys.as_ref(),
            verifies: self.ingress.verifies_signatures(),
            gateway: self.gateway.is_some(),
            gateway_login: login.is_some(),
            gateway_tls: transport.is_some(),
            auth: guards.is_some(),
        };
        let change = CredentialsChange::between(running, config, &taken);
        if reading == Reading::Check {
            tracing::info!(%change, "credentials: checked, nothing taken");
            return Ok(change);
        }
        if let Some(access) = &access {
            access.warn_of_channel(&running.server.trusted_proxies);
        }
        if let Some(guards) = guards {
            self.ingress.replace_guards(guards);
            running.auth = config.auth.clone();
        }
        if let Some(keys) = keys {
            // Signatures verified only when keys were configured at start.
            if self.ingress.replace_verifier(keys).is_ok() {
                running.signature.keys = config.signature.keys.clone();
                running.signature.algorithm = config.signature.algorithm;
            }
        }
        if let Some(gateway) = &self.gateway {
            if let Some((username, password)) = login {
                gateway.replace_credentials(username.clone(), password.clone());
                running.gateway.username = Some(username);
                running.gateway.password = Some(password);
            }
            if let Some(transport) = transport {
                gateway.replace_transport(transport);
                running.gateway.ca_file.clone_from(&config.gateway.ca_file);
                running
                    .gateway
                    .client_cert_file
                    .clone_from(&config.gateway.client_cert_file);
                running
                    .gateway
                    .client_key_file
                    .clone_from(&config.gateway.client_key_file);
            }
        }
        if let (Some(access), Some(current)) = (access, &self.admin) {
            current.replace(access);
            running.admin = AdminConfig {
                inspector_recent: running.admin.inspector_recent,
                ..config.admin.clone()
            };
        }
        tracing::info!(%change, "credentials: read again");
        if !change.need_a_restart.is_empty() {
            tracing::warn!(
                differ = %change.need_a_restart.join(", "),
                "credentials: settings besides the credentials differ from those the service \
                 runs with; they are not taken until it restarts"
            );
        }
        Ok(change)
    }

    /// The verifier of `config`'s keys under the running signature settings (`running`:
    /// header, encoding, prefix), when signatures are verified and the keys changed. The
    /// keys are read wherever listed: a service started without them is not to be told
    /// their files are fine when its restart would fail on them.
    fn keys_read_again(
        &self,
        running: &SignatureConfig,
        config: &SignatureConfig,
    ) -> Result<Option<Verifier>, CredentialsRefused> {
        let current = self.ingress.verifier();
        if config.keys.is_empty() {
            return match current {
                Some(_) => Err(CredentialsRefused::WouldStopVerifying),
                None => Ok(None),
            };
        }
        let verifier = Verifier::from_config(&SignatureConfig {
            keys: config.keys.clone(),
            algorithm: config.algorithm,
            ..running.clone()
        })?;
        Ok(current
            .filter(|current| !verifier.keys().eq(current.verifier.keys()))
            .map(|_| verifier))
    }

    /// The user and password of `config` at the aggregator, when the service calls it and
    /// they differ from `running`'s. A service that calls none is not to be told a complete
    /// `[gateway]` is fine when its restart would fail on it: that one is checked.
    fn gateway_read_again(
        &self,
        running: &GatewayConfig,
        config: &GatewayConfig,
    ) -> Result<Option<(String, Secret)>, CredentialsRefused> {
        if self.gateway.is_none() {
            if config.is_complete() {
                GatewayClient::new(config).map_err(CredentialsRefused::GatewayTls)?;
            }
            return Ok(None);
        }
        let (Some(username), Some(password)) = (&config.username, &config.password) else {
            return Err(CredentialsRefused::WouldLoseGatewayLogin);
        };
        let same = running.username.as_ref() == Some(username)
            && running.password.as_ref() == Some(password);
        Ok((!same).then(|| (username.clone(), password.clone())))
    }

    /// The operating API's access as `config` says, when the API is served.
    fn admin_read_again(
        &self,
        config: &AdminConfig,
    ) -> Result<Option<AdminAccess>, CredentialsRefused> {
        let Some(current) = &self.admin else {
            return Ok(None);
        };
        current
            .now()
            .read_again(config)
            .map(Some)
            .ok_or(CredentialsRefused::WouldTurnOff)
    }

    /// Reads the credentials again from `load` (say, [`Config::from_env`]) each time the
    /// process gets SIGHUP, for as long as it runs: spawn the future it returns. `load` is
    /// also what the operating API's `POST /payhook/admin/credentials/read-again` reads
    /// ([`Credentials::read_from`]). SIGHUP is listened for from this call on, within the
    /// Tokio runtime — call it before the service says it is ready: until then SIGHUP ends
    /// the process, as it does any that does not listen for it. The configuration and the
    /// key files are read off the runtime's threads ([`Credentials::read_again_now`]). One
    /// that cannot be read or is refused is logged at error level, and the credentials stay
    /// as they were. Where SIGHUP cannot be listened for (not Unix), says so, and the future
    /// waits for ever (the operating API still reads `load`).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn read_again_on_hangup<F>(self, load: F) -> impl Future<Output = ()> + Send + 'static
    where
        F: FnMut() -> Result<Config, ConfigError> + Send + 'static,
    {
        self.read_from(load);
        #[cfg(unix)]
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        async move {
            #[cfg(unix)]
            {
                let mut hangups = match hangups {
                    Ok(hangups) => hangups,
                    Err(error) => {
                        tracing::error!(%error, "credentials: cannot listen for SIGHUP: the credentials are read again only when the operating API asks");
                        return std::future::pending().await;
                    }
                };
                while hangups.recv().await.is_some() {
                    tracing::info!("credentials: SIGHUP received: reading the configuration again");
                    // Refusals are logged by the reading.
                    let _ = self.read_again_now().await;
                }
            }
            #[cfg(not(unix))]
            {
                let _ = &self;
                tracing::warn!(
                    "credentials: no SIGHUP on this system: the credentials are read again \
                     only when the operating API asks (or by Credentials::read_again_now)"
                );
                std::future::pending().await
            }
        }
    }
}
