//! Who may call the operating API, read again while the service runs
//! ([`AdminCredentials`]): an operator added, one who left taken out, a token replaced, a
//! viewer named — on SIGHUP ([`AdminCredentials::read_again_on_hangup`]) or when the
//! merchant's service says ([`AdminCredentials::read_again`]), without a restart, which would
//! cut the deliveries in flight and, without `admin.session_secret`, end every inspector
//! session.
//!
//! What is read again is what [`AdminAccess`](super::admin_access::AdminAccess) reads:
//! `admin.token`, `admin.operators`, `admin.viewers`, `admin.session_secret`,
//! `admin.allow_ips` and `admin.allow_plain_http`. Every other setting stays as the service
//! started with it, and one that differs is named in a warning (it takes a restart).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use super::admin_access::CurrentAccess;
use super::operators;
use super::settings::AdminConfig;
use crate::config::{Config, ConfigError};
use crate::logged::Logged;

/// The operating API's credentials of a running [`App`](crate::App), which a configuration
/// read again replaces: got from [`App::admin_credentials`](crate::App::admin_credentials)
/// before the app is served. Clones share them.
///
/// A call is judged by the credentials as read when it came in. Once they are replaced, a
/// token no longer configured is refused (401) — an operator taken out, a token replaced —
/// and so is every inspector session of it; an operator made a viewer may change nothing
/// from their next call on, in their open sessions too. The sessions of a credential that
/// stays go on, and so do the sessions ended by logging out and the wrong guesses counted
/// per address — unless the key sessions are signed under changes: a new
/// `admin.session_secret`, or, without one, the first operator added where only
/// `admin.token` was (its sessions were signed under a key derived from it, which its
/// bearers could derive) or the last one taken out; every session ends then.
///
/// ```no_run
/// # async fn run(app: payhook::App) {
/// if let Some(credentials) = app.admin_credentials() {
///     // `kill -HUP <pid>` after editing the file named by PAYHOOK_CONFIG.
///     tokio::spawn(credentials.read_again_on_hangup(payhook::Config::from_env));
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct AdminCredentials {
    current: Arc<CurrentAccess>,
    /// The configuration as the service runs it: started with, the credentials as read last.
    running: Arc<Mutex<Config>>,
}

impl fmt::Debug for AdminCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminCredentials").finish_non_exhaustive()
    }
}

/// Why a configuration read again was not taken: the credentials stay as they were.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsRefused {
    /// The configuration is not one the service would start with.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// It sets no token, shared or an operator's: that would turn the operating API off,
    /// which takes a restart (its routes are served or not from the start).
    #[error(
        "admin: no admin.token nor admin.operators: the operating API would be off, which \
         takes a restart; to keep every operator out meanwhile, leave one operator whose \
         token nobody holds"
    )]
    WouldTurnOff,
}

/// What a configuration read again changed of the credentials (names only, never a token),
/// and the settings it changed that take a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialsChange {
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
    /// The other settings that differ from those the service runs with, by section (or
    /// key): not taken, they take a restart.
    pub need_a_restart: Vec<&'static str>,
}

impl CredentialsChange {
    fn between(before: &Config, after: &Config) -> Self {
        let (was, is) = (&before.admin, &after.admin);
        let names = |config: &AdminConfig, pick: &dyn Fn(&str) -> bool| -> Vec<String> {
            config
                .operators
                .keys()
                .filter(|name| pick(name))
                .cloned()
                .collect()
        };
        let viewer = |config: &AdminConfig, name: &str| config.viewers.iter().any(|v| v == name);
        Self {
            added: names(is, &|name| !was.operators.contains_key(name)),
            removed: names(was, &|name| !is.operators.contains_key(name)),
            new_token: names(is, &|name| {
                was.operators
                    .get(name)
                    .is_some_and(|entry| !operators::same_digest(entry, &is.operators[name]))
            }),
            made_viewers: names(is, &|name| viewer(is, name) && !viewer(was, name)),
            no_longer_viewers: names(is, &|name| !viewer(is, name) && viewer(was, name)),
            shared_token: was.token != is.token,
            session_secret: was.session_secret != is.session_secret,
            network: was.allow_ips != is.allow_ips || was.allow_plain_http != is.allow_plain_http,
            need_a_restart: need_a_restart(before, after),
        }
    }

    /// Whether the credentials changed at all.
    pub fn is_empty(&self) -> bool {
        self.said().is_empty()
    }

    /// What changed, a part each (`operators added: bob`); the settings that take a restart
    /// are not among them.
    fn said(&self) -> Vec<String> {
        let mut parts = Vec::new();
        for (what, names) in [
            ("operators added", &self.added),
            ("taken out", &self.removed),
            ("with a new token", &self.new_token),
            ("made viewers", &self.made_viewers),
            ("no longer viewers", &self.no_longer_viewers),
        ] {
            if !names.is_empty() {
                let names: Vec<String> = names.iter().map(|n| Logged(n).to_string()).collect();
                parts.push(format!("{what}: {}", names.join(", ")));
            }
        }
        for (what, changed) in [
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
    /// `operators added: bob; taken out: alice` — or `no change`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = self.said();
        if parts.is_empty() {
            return f.write_str("no change");
        }
        f.write_str(&parts.join("; "))
    }
}

/// The settings of `after` outside the credentials that differ from `before`'s.
fn need_a_restart(before: &Config, after: &Config) -> Vec<&'static str> {
    let differs = [
        ("server", before.server != after.server),
        ("paths", before.paths != after.paths),
        ("callback", before.callback != after.callback),
        ("signature", before.signature != after.signature),
        ("auth", before.auth != after.auth),
        ("store", before.store != after.store),
        ("gateway", before.gateway != after.gateway),
        ("validation", before.validation != after.validation),
        (
            "admin.inspector_recent",
            before.admin.inspector_recent != after.admin.inspector_recent,
        ),
    ];
    differs
        .into_iter()
        .filter_map(|(what, differs)| differs.then_some(what))
        .collect()
}

impl AdminCredentials {
    pub(super) fn new(current: Arc<CurrentAccess>, running: &Config) -> Self {
        Self {
            current,
            running: Arc::new(Mutex::new(running.clone())),
        }
    }

    /// Takes the credentials of `config` — `admin.token`, `admin.operators`,
    /// `admin.viewers`, `admin.session_secret`, `admin.allow_ips` and
    /// `admin.allow_plain_http`: from the next call on, the operating API lets in whom it
    /// names. Logged at info level with what changed (names, never a token); a setting
    /// outside the credentials that differs from the service's is named in a warning, and
    /// not taken.
    ///
    /// # Errors
    ///
    /// [`CredentialsRefused`] when `config` is not one the service would start with (it is
    /// checked as at start), or would turn the API off: the credentials stay as they were.
    pub fn read_again(&self, config: &Config) -> Result<CredentialsChange, CredentialsRefused> {
        config.validate()?;
        operators::check_shared_token(&config.admin)?;
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let access = self
            .current
            .now()
            .read_again(&config.admin)
            .ok_or(CredentialsRefused::WouldTurnOff)?;
        access.warn_of_channel(&running.server.trusted_proxies);
        let change = CredentialsChange::between(&running, config);
        self.current.replace(access);
        running.admin = AdminConfig {
            inspector_recent: running.admin.inspector_recent,
            ..config.admin.clone()
        };
        drop(running);
        tracing::info!(%change, "admin: the operating API's credentials were read again");
        if !change.need_a_restart.is_empty() {
            tracing::warn!(
                differ = %change.need_a_restart.join(", "),
                "admin: settings besides the operating API's credentials differ from those \
                 the service runs with; they are not taken until it restarts"
            );
        }
        Ok(change)
    }

    /// Reads the credentials again from `load` (say, [`Config::from_env`]) each time the
    /// process gets SIGHUP, for as long as it runs: spawn the future it returns. SIGHUP is
    /// listened for from this call on, within the Tokio runtime — call it before the service
    /// says it is ready: until then SIGHUP ends the process, as it does any that does not
    /// listen for it. A configuration that cannot be read or is refused is logged at error
    /// level, and the credentials stay as they were. Where SIGHUP cannot be listened for
    /// (not Unix), says so, and the future waits for ever.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn read_again_on_hangup<F>(self, mut load: F) -> impl Future<Output = ()> + Send + 'static
    where
        F: FnMut() -> Result<Config, ConfigError> + Send + 'static,
    {
        #[cfg(unix)]
        let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        async move {
            #[cfg(unix)]
            {
                let mut hangups = match hangups {
                    Ok(hangups) => hangups,
                    Err(error) => {
                        tracing::error!(%error, "admin: cannot listen for SIGHUP: the operating API's credentials are read at start only");
                        return std::future::pending().await;
                    }
                };
                while hangups.recv().await.is_some() {
                    tracing::info!("admin: SIGHUP received: reading the configuration again");
                    // Read off the runtime's threads: a file on a slow disk holds none.
                    let loaded = tokio::task::spawn_blocking(move || {
                        let config =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut load));
                        (load, config)
                    })
                    .await;
                    // Cancelled: the runtime is shutting down.
                    let Ok((back, config)) = loaded else { return };
                    load = back;
                    let Ok(config) = config else {
                        tracing::error!(
                            "admin: reading the configuration again panicked: the operating \
                             API's credentials stay as they were"
                        );
                        continue;
                    };
                    let read = config
                        .map_err(CredentialsRefused::from)
                        .and_then(|config| self.read_again(&config));
                    if let Err(error) = read {
                        tracing::error!(
                            error = %crate::report::InLine(&error),
                            "admin: the configuration read again was not taken: the operating \
                             API's credentials stay as they were"
                        );
                    }
                }
            }
            #[cfg(not(unix))]
            {
                let _ = (&mut load, &self);
                tracing::warn!(
                    "admin: no SIGHUP on this system: the operating API's credentials are read \
                     at start only (or by AdminCredentials::read_again)"
                );
                std::future::pending().await
            }
        }
    }
}
