//! The merchant's session with the aggregator: one access token shared by every call.
//!
//! The session sits behind an async mutex that is held across a login or a refresh, so that
//! callers arriving meanwhile wait for that one renewal and then use its token: a burst of
//! calls on an expired token causes one refresh, not one per call. A caller arriving while
//! the token held is still good (renewed ahead of its expiry, within the margin) uses it
//! instead of waiting: a slow or silent auth endpoint holds up no call that needs none.
//!
//! | state of the session | what `access_token` does |
//! |---|---|
//! | none yet | log in |
//! | access token valid beyond the margin | use it |
//! | access token within the margin or expired, refresh token valid | refresh (log in if the refresh is refused) |
//! | both expired | log in |
//!
//! The margin is `gateway.refresh_margin`, but at most half the lifetime the aggregator
//! granted the token (measured when it arrived): a margin longer than the lifetime would
//! make every token "about to expire" the moment it arrives, and every call refresh first.
//! A token that arrives already expired by this host's clock (a clock ahead of the
//! aggregator's, or its times sent without their zone) would have the same effect: it is
//! used, with a warning, until the aggregator refuses it (401), which renews the session.
//!
//! A renewal that fails is not tried again by the callers that waited for it, nor by any
//! other for [`RENEWAL_PAUSE`]: they get its error, or the token held while it has not
//! expired (a renewal ahead of expiry failed). A pass of the outbox over hundreds of
//! queued results after a password change would otherwise send hundreds of refused logins
//! (an account lock-out at the aggregator), and against a silent auth endpoint wait
//! `gateway.timeout` once per result. When the credentials themselves are refused, the pause
//! doubles with each refusal in a row, up to [`LONGEST_REFUSAL_PAUSE`]: the outbox retries
//! its results on their own schedule, and a pause of two seconds would still let it send a
//! refused login every few seconds for as long as the password is wrong (some 1,800 an hour
//! with a few hundred results queued). A renewal that succeeds ends the pauses, and so do
//! new credentials (`GatewayClient::replace_credentials`) or new TLS files
//! (`GatewayClient::read_tls_files_again`), whatever failed: the next call
//! renews with them (a refresh first, while the refresh token held is good). A failure is
//! counted against the credentials its renewal sent, read once for it.

use chrono::{DateTime, TimeDelta, Utc};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::Instant;

use super::{GatewayClient, GatewayError, Login};
use crate::Secret;
use crate::model::LoginSession;

/// A refresh token this close to its expiry is not used: the refresh could arrive late.
const REFRESH_TOKEN_SLACK: TimeDelta = TimeDelta::seconds(5);

/// An access token this close to its expiry is not used while another caller renews the
/// session: the call waits for the renewal instead.
const USABLE_SLACK: TimeDelta = TimeDelta::seconds(5);

/// How long after a failed login or refresh every call gets its error instead of renewing.
pub(super) const RENEWAL_PAUSE: Duration = Duration::from_secs(2);

/// The longest pause after refusals of the credentials in a row.
pub(super) const LONGEST_REFUSAL_PAUSE: Duration = Duration::from_secs(5 * 60);

/// The pause after a renewal failed with `error`, the one before having been `previous`
/// (when the renewal before failed too): doubled after each refusal of the credentials in a
/// row, [`RENEWAL_PAUSE`] after any other failure.
fn pause_after(error: &GatewayError, previous: Option<Duration>) -> Duration {
    match (error, previous) {
        (GatewayError::BadCredentials { .. }, Some(previous)) => {
            (previous * 2).clamp(RENEWAL_PAUSE, LONGEST_REFUSAL_PAUSE)
        }
        _ => RENEWAL_PAUSE,
    }
}

/// Whether `expiry` is more than `margin` away from now.
fn beyond(expiry: DateTime<Utc>, margin: TimeDelta) -> bool {
    expiry
        .checked_sub_signed(margin)
        .is_some_and(|t| t > Utc::now())
}

/// Where the merchant's session with the aggregator stands
/// ([`GatewayClient::session_state`](super::GatewayClient::session_state)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// No session yet: the next call logs in.
    None,
    /// A login or refresh is in progress.
    Renewing,
    /// A session is held.
    Held {
        /// When its access token expires (UTC).
        access_expires: DateTime<Utc>,
        /// When its refresh token expires (UTC).
        refresh_expires: DateTime<Utc>,
    },
}

pub(super) struct Sessions {
    /// Shared with the task that renews it (see [`Sessions::access_token`]).
    current: Arc<Mutex<Current>>,
    /// The access token held and when it is taken to expire, readable while another caller
    /// holds `current` (a renewal, which may take the gateway's timeout twice): a token still
    /// good is used meanwhile instead of waiting behind a renewal ahead of its expiry.
    usable: std::sync::Mutex<Option<(Secret, DateTime<Utc>)>>,
    /// The configured `gateway.refresh_margin`.
    margin: TimeDelta,
}

/// The session held, if any, and the last renewal's failure, if it failed.
#[derive(Default)]
struct Current {
    held: Option<Held>,
    /// The last renewal's failure, answered to every call until its pause has passed.
    failed: Option<Failed>,
}

/// A renewal that failed.
struct Failed {
    at: Instant,
    error: GatewayError,
    /// How long no renewal is tried after it ([`pause_after`]).
    pause: Duration,
    /// The version of the user and password it was tried with: once they or the TLS files
    /// are replaced, the pause is over.
    login_version: u64,
}

/// The session in use, with the margin that applies to its access token.
struct Held {
    session: LoginSession,
    /// The configured margin, or half the token's granted lifetime when that is shorter.
    margin: TimeDelta,
    /// When its access token is taken to expire: the aggregator's expiry, or — for a token
    /// that arrived already expired by this host's clock (a clock ahead of the aggregator's,
    /// times sent without their zone) — never, until the aggregator refuses it (401, see
    /// [`Sessions::reject`]); either way, the moment of a refusal.
    expires: DateTime<Utc>,
}

impl Sessions {
    pub(super) fn new(margin: Duration) -> Self {
        Self {
            current: Arc::new(Mutex::new(Current::default())),
            usable: std::sync::Mutex::default(),
            margin: TimeDelta::from_std(margin).unwrap_or(TimeDelta::MAX),
        }
    }

    /// The token held while it is good for [`USABLE_SLACK`] more, read without waiting for
    /// `current`: one about to expire would expire on its way, and cost a 401.
    fn usable_now(&self) -> Option<Secret> {
        let usable = self.usable.lock().unwrap_or_else(|e| e.into_inner());
        let now = Utc::now();
        usable
            .as_ref()
            .filter(|(_, expires)| {
                expires
                    .checked_sub_signed(USABLE_SLACK)
                    .is_some_and(|usable_until| usable_until > now)
            })
            .map(|(token, _)| token.clone())
    }

    /// Makes `held` (its token and expiry) what [`Self::usable_now`] reads.
    fn publish(&self, held: &Held) {
        let mut usable = self.usable.lock().unwrap_or_else(|e| e.into_inner());
        *usable = Some((held.session.access_token.clone(), held.expires));
    }

    /// Where the session stands, without waiting for a login or refresh in progress.
    pub(super) fn state(&self) -> SessionState {
        match self.current.try_lock() {
            Err(_) => SessionState::Renewing,
            Ok(current) => match current.held.as_ref() {
                None => SessionState::None,
                Some(held) => SessionState::Held {
                    access_expires: held.session.access_token_expiry_utc,
                    refresh_expires: held.session.refresh_token_expiry_utc,
                },
            },
        }
    }

    /// A valid access token, renewing the session first when it is about to expire.
    ///
    /// The renewal runs as a task of its own, holding the session: a caller that gives up
    /// meanwhile (a handler stopped at its timeout, a request whose client went away) does not
    /// abandon it half-way. Abandoned, it recorded no failure to pause on, and each caller
    /// next in line logged in again: one login per call, and no session ever kept.
    pub(super) async fn access_token(
        &self,
        client: &GatewayClient,
    ) -> Result<Secret, GatewayError> {
        let current = match Arc::clone(&self.current).try_lock_owned() {
            Ok(current) => current,
            // Another caller holds the session, renewing it perhaps: a token still good
            // serves this call meanwhile; without one, the call waits for the renewal.
            Err(_) => match self.usable_now() {
                Some(token) => return Ok(token),
                None => Arc::clone(&self.current).lock_owned().await,
            },
        };
        if let Some(held) = current.held.as_ref()
            && beyond(held.expires, held.margin)
        {
            return Ok(held.session.access_token.clone());
        }
        // Renewed ahead of its expiry, a token is still good when the renewal fails: it is
        // used until it expires (or the aggregator refuses it).
        let still_good = current
            .held
            .as_ref()
            .filter(|held| beyond(held.expires, TimeDelta::zero()))
            .map(|held| held.session.access_token.clone());
        if let Some(failed) = &current.failed
            && failed.at.elapsed() < failed.pause
            && failed.login_version == client.held_login().version
        {
            return still_good.ok_or_else(|| failed.error.clone());
        }
        let renewing = client.clone();
        let renewal =
            tokio::spawn(
                async move { renewing.inner.sessions.renew_held(&renewing, current).await },
            );
        match renewal.await {
            Ok(Ok(token)) => Ok(token),
            Ok(Err(error)) => still_good.ok_or(error),
            Err(stopped) => Err(GatewayError::Network {
                url: client.inner.auth_url.clone(),
                source: Arc::new(stopped),
            }),
        }
    }

    /// Renews the session held in `current` and records how it went: the new session, or
    /// the failure that pauses renewals.
    async fn renew_held(
        &self,
        client: &GatewayClient,
        mut current: OwnedMutexGuard<Current>,
    ) -> Result<Secret, GatewayError> {
        // Read once: what a login of this renewal sends, and what its failure is held against.
        let login = client.held_login();
        let login_version = login.version;
        match self.renew(client, &mut current.held, &login).await {
            Ok(held) => {
                let token = held.session.access_token.clone();
                self.publish(&held);
                *current = Current {
                    held: Some(held),
                    failed: None,
                };
                Ok(token)
            }
            Err(error) => {
                // Refusals in a row of the same user and password, not of those before.
                let before = current
                    .failed
                    .as_ref()
                    .filter(|failed| failed.login_version == login_version);
                let pause = pause_after(&error, before.map(|f| f.pause));
                if pause > RENEWAL_PAUSE {
                    tracing::warn!(
                        pause_s = pause.as_secs(),
                        "the aggregator refused the gateway credentials again; no login is tried for a while"
                    );
                }
                current.failed = Some(Failed {
                    at: Instant::now(),
                    error: error.clone(),
                    pause,
                    login_version,
                });
                Err(error)
            }
        }
    }

    /// A new session: refreshed from `held` while its refresh token is valid, else (or when
    /// the refresh is refused, or fails otherwise) logged in.
    ///
    /// A refresh token the aggregator refused is not sent again: when the login after it
    /// fails too, the next renewal logs in.
    async fn renew(
        &self,
        client: &GatewayClient,
        held: &mut Option<Held>,
        login: &Login,
    ) -> Result<Held, GatewayError> {
        let renewed = match held.as_mut().map(|held| &mut held.session) {
            Some(session) if beyond(session.refresh_token_expiry_utc, REFRESH_TOKEN_SLACK) => {
                match client.refresh(&session.refresh_token).await {
                    Ok(renewed) => {
                        tracing::info!("gateway session refreshed");
                        renewed
                    }
                    Err(GatewayError::BadCredentials { message, .. }) => {
                        tracing::info!(message = %crate::Logged(&message), "refresh refused; logging in again");
                        session.refresh_token_expiry_utc = DateTime::<Utc>::MIN_UTC;
                        client.login_as(login).await?
                    }
                    Err(error) => {
                        // A refresh that fails otherwise (a 5xx, a timeout, an answer that
                        // does not read): the spec does not say how a revoked refresh token
                        // is refused, and a service may answer 500. Sent again at each
                        // renewal, it would fail every call until the refresh token expires;
                        // a login now costs one request more while the aggregator is down.
                        tracing::warn!(
                            error = %crate::report::InLine(&error),
                            "the session's refresh failed; logging in instead"
                        );
                        client.login_as(login).await?
                    }
                }
            }
            _ => {
                let session = client.login_as(login).await?;
                tracing::info!("logged in to the gateway");
                session
            }
        };
        let lifetime = renewed.access_token_expiry_utc - Utc::now();
        let expires = if lifetime > TimeDelta::zero() {
            renewed.access_token_expiry_utc
        } else {
            // Renewing at every call would not help: every token would arrive so.
            tracing::warn!(
                expiry = %renewed.access_token_expiry_utc,
                "the aggregator's access token arrived already expired by this host's clock \
                 (is the clock ahead, or are the aggregator's times not UTC?); it is used until \
                 the aggregator refuses it"
            );
            DateTime::<Utc>::MAX_UTC
        };
        let margin = self.margin.min(lifetime / 2).max(TimeDelta::zero());
        if margin < self.margin {
            tracing::debug!(
                lifetime_s = lifetime.num_seconds(),
                "gateway.refresh_margin is longer than half the access token's lifetime; \
                 refreshing at half its lifetime instead"
            );
        }
        Ok(Held {
            session: renewed,
            margin,
            expires,
        })
    }

    /// The aggregator refused `token` (401): the session is renewed on the next call, unless
    /// another caller renewed it already.
    pub(super) async fn reject(&self, token: &Secret) {
        // At once, before waiting for the session: no other caller takes it meanwhile.
        {
            let mut usable = self.usable.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((held, expires)) = usable.as_mut()
                && held == token
            {
                *expires = DateTime::<Utc>::MIN_UTC;
            }
        }
        let mut current = self.current.lock().await;
        if let Some(held) = current.held.as_mut()
            && held.session.access_token == *token
        {
            held.expires = DateTime::<Utc>::MIN_UTC;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_of_the_credentials_in_a_row_pause_renewals_ever_longer() {
        let refused = GatewayError::BadCredentials {
            url: "https://auth.example/api/v1/login".into(),
            message: "invalid username or password".into(),
        };
        let mut pauses = Vec::new();
        let mut previous = None;
        for _ in 0..10 {
            let pause = pause_after(&refused, previous);
            pauses.push(pause.as_secs());
            previous = Some(pause);
        }
        assert_eq!(pauses, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        // Any other failure pauses for the short while, and starts the doubling again.
        let silent = GatewayError::Timeout {
            url: "https://auth.example/api/v1/login".into(),
            timeout: Duration::from_secs(10),
        };
        assert_eq!(pause_after(&silent, previous), RENEWAL_PAUSE);
        assert_eq!(pause_after(&refused, None), RENEWAL_PAUSE);
    }
}
