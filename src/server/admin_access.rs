//! Who may call the operating API ([`AdminAccess`]): the address, the channel, a bearer's
//! token — the shared one or an operator's own ([`super::operators`]) — and the inspector's
//! sessions, which carry whose they are and end with that credential, a logout, or their
//! twelve hours. The operating API ([`super::operating_api`]) asks it who a call is of,
//! and answers.

use http::{HeaderMap, Method};

use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::guesses::Guesses;
use super::operators::{Caller, Operators};
use super::problem::Problem;
use super::settings::AdminConfig;
use crate::auth::{Cidr, Expected};
use crate::inspector::page;
use crate::signature::Encoding;

/// Who may call the operating API.
pub(super) struct AdminAccess {
    /// `admin.token`, which every operator who holds it shares.
    token: Option<Expected>,
    /// The shared token's SHA-256 in hex, signed into its sessions: a new token ends them.
    token_digest_hex: Option<String>,
    /// `[admin.operators]`, each with a token of their own.
    operators: Operators,
    /// Signs the inspector's sessions, from [`SessionKeySource`]: derived at the first
    /// login or cookie, so that the cookie is no token, and a new secret ends every session.
    /// Kept by the access read again when it comes from the same source
    /// ([`Self::read_again`]).
    session_key: Arc<OnceLock<Option<ring::hmac::Key>>>,
    session_key_source: SessionKeySource,
    /// The sessions ended by logging out, until their life would have ended anyway.
    ended: Arc<Mutex<Ended>>,
    /// `admin.allow_plain_http`: calls over plain HTTP from other machines are let in.
    plain_http: bool,
    allow: Vec<Cidr>,
    /// The tokens presented, counted per address: too many wrong ones get 429.
    guesses: Arc<Guesses>,
}

/// Sessions ended before their time, by whose they are (an operator's name; the shared
/// token's, ""): each holder's by their login time and id, and the generation the holder's
/// sessions are signed in, which moves on (ending every session of theirs so far) once they
/// ended more than are kept one by one — so that a holder who logs out again and again ends
/// their own sessions, never another operator's. Kept in memory, by this instance; the
/// operating API also has the store keep each ended session
/// ([`crate::store::Store::end_session`]), for a restart and for the other instances on a
/// shared store, and asks it of every call that comes with a session. A generation moved
/// on is this instance's alone (a new token for its holder, or a new sessions' secret, ends
/// every session everywhere). Bounded: only a configured holder has a session.
#[derive(Default)]
struct Ended {
    holders: std::collections::HashMap<String, HolderEnded>,
}

/// One holder's ended sessions and generation (see [`Ended`]).
#[derive(Default)]
struct HolderEnded {
    sessions: std::collections::HashSet<Session>,
    generation: u64,
}

impl Ended {
    /// The generation `holder`'s sessions are signed in now.
    fn generation(&self, holder: &str) -> u64 {
        self.holders.get(holder).map_or(0, |h| h.generation)
    }

    fn has_ended(&self, holder: &str, session: &Session) -> bool {
        self.holders
            .get(holder)
            .is_some_and(|h| h.sessions.contains(session))
    }
}

/// Whose a session is, as [`Ended`] keeps it.
fn holder_key(caller: &Caller) -> &str {
    caller.operator().unwrap_or_default()
}

/// How many ended sessions are kept one by one for a holder; beyond, every session of the
/// holder so far is ended.
const ENDED_KEPT: usize = 1024;

/// The inspector's session cookie.
pub(super) const SESSION_COOKIE: &str = "payhook_admin";

/// How long an inspector session lasts from its login; the page then asks for the token
/// again. A copied cookie is the operator's power over validations for no longer than this.
pub(super) const SESSION_LIFETIME_SECS: u64 = 12 * 60 * 60;

/// What a session's HMAC signs: the generation it was signed in (see [`Ended`]), its login
/// time, its random id (hex), which tells apart two logins of the same second, and whose it
/// is ([`session_holder`]).
fn session_message(generation: u64, issued: u64, id: &str, holder: &str) -> Vec<u8> {
    format!("payhook inspector session {generation} {issued} {id} {holder}").into_bytes()
}

/// Iterations of PBKDF2 that make the sessions' key from the token.
const SESSION_KEY_ITERATIONS: u32 = 100_000;

/// The key that signs the inspector's sessions: PBKDF2-HMAC-SHA256 of the token, so that a
/// cookie read where it should not be (a proxy's log, a shared browser) costs a guess of
/// the token a hundred thousand HMACs, not one. The same in every instance of one token
/// (a session holds at whichever a load balancer picks), unlike a random key.
fn session_key(token: &crate::Secret) -> ring::hmac::Key {
    let mut key = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        std::num::NonZeroU32::new(SESSION_KEY_ITERATIONS).unwrap_or(std::num::NonZeroU32::MIN),
        b"payhook inspector session key",
        token.expose().as_bytes(),
        &mut key,
    );
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key)
}

/// A session, as its cookie names it: the login time and the random id.
type Session = (u64, String);

/// A session as the store keeps it once ended ([`crate::store::Store::end_session`]): its
/// login time and random id, which name it and are no secret (the cookie's HMAC is), and
/// when its life ends anyway.
pub(super) struct StoredSession {
    pub(super) name: String,
    pub(super) until: chrono::DateTime<chrono::Utc>,
}

impl StoredSession {
    fn of(session: &Session) -> Self {
        let (issued, id) = session;
        // A minute more: a session is taken up to a minute after its life (clocks differ).
        let until_secs = issued.saturating_add(SESSION_LIFETIME_SECS + 60);
        Self {
            name: format!("{issued}.{id}"),
            until: crate::model::timestamp::time_from_ms(until_secs.saturating_mul(1000)),
        }
    }
}

/// What the inspector's sessions are signed under.
#[derive(PartialEq)]
enum SessionKeySource {
    /// A key derived from this secret ([`session_key`]): `admin.session_secret`, else
    /// `admin.token` where no operator has a token of their own — the same in every
    /// instance that shares it.
    Derived(crate::Secret),
    /// A random key of this process: the sessions end when it stops and hold at it alone.
    Random,
}

/// Who a session is of, as its message signs it: the shared token by its hash, or an
/// operator by name (hex) and their token's hash — a new token ends its sessions.
fn session_holder(caller: &Caller, access: &AdminAccess) -> Option<String> {
    match caller {
        Caller::Shared => Some(format!("shared {}", access.token_digest_hex.as_deref()?)),
        // A viewer's session is an operator's: what they may do is read from the
        // configuration at each request, not from the cookie.
        Caller::Operator(name) | Caller::Viewer(name) => Some(format!(
            "operator {} {}",
            Encoding::Hex.encode(name.as_bytes()),
            access.operators.digest_hex(name)?
        )),
    }
}

/// Seconds since the Unix epoch, now.
fn now_secs() -> u64 {
    crate::model::timestamp::now_ms() / 1000
}

impl AdminAccess {
    /// `None` when no token is configured, shared or an operator's: the API is off.
    pub(super) fn from_config(config: &AdminConfig) -> Option<Self> {
        if !config.is_on() {
            return None;
        }
        let token = config.token.as_ref();
        // Not the shared token where operators have tokens of their own: its bearers could
        // derive the key and, with an operator's hash from the configuration, sign that
        // operator's session.
        let session_key_source = match (&config.session_secret, token) {
            (Some(secret), _) => SessionKeySource::Derived(secret.clone()),
            (None, Some(token)) if config.operators.is_empty() => {
                SessionKeySource::Derived(token.clone())
            }
            _ => SessionKeySource::Random,
        };
        Some(Self {
            token: token.map(|token| Expected::new(token.expose().as_bytes())),
            token_digest_hex: token.map(|token| super::operators::digest_hex(token.expose())),
            operators: Operators::new(&config.operators, &config.viewers),
            session_key: Arc::default(),
            session_key_source,
            ended: Arc::default(),
            allow: config
                .allow_ips
                .iter()
                .filter_map(|text| text.parse().ok())
                .collect(),
            plain_http: config.allow_plain_http,
            guesses: Arc::default(),
        })
    }

    /// The access `config` gives, read again while the service runs: what it says of who may
    /// call — tokens, operators, viewers, the sessions' secret, addresses, the channel — with
    /// what this one learned kept: the sessions ended by logging out, the wrong guesses
    /// counted per address, and the sessions' key where it comes from the same secret (or is
    /// the process's own both times), so that a session goes on unless its credential
    /// changed. `None` when `config` turns the API off (no token of any kind).
    pub(super) fn read_again(&self, config: &AdminConfig) -> Option<Self> {
        let mut access = Self::from_config(config)?;
        access.ended = Arc::clone(&self.ended);
        access.guesses = Arc::clone(&self.guesses);
        if access.session_key_source == self.session_key_source {
            access.session_key = Arc::clone(&self.session_key);
        }
        Some(access)
    }

    /// Says at start-up how the token may travel, when other machines may call the API:
    /// over plain HTTP (`admin.allow_plain_http`), or only through a trusted proxy that
    /// speaks HTTPS to them — without one (`trusted_proxies` empty), every call from them is
    /// refused.
    pub(super) fn warn_of_channel(&self, trusted_proxies: &[String]) {
        if matches!(self.session_key_source, SessionKeySource::Random) {
            tracing::info!(
                "admin: no admin.session_secret, so the inspector's sessions are signed under a \
                 key of this process (with admin.operators, never one derived from the shared \
                 token, whose bearers could sign an operator's session): they end when it \
                 restarts and hold at this instance alone; behind a load balancer, set the \
                 same admin.session_secret in every instance"
            );
        }
        if self.allow.iter().all(Cidr::is_loopback_only) {
            return;
        }
        if self.plain_http {
            tracing::warn!(
                "admin.allow_plain_http = true: the operating API's token and the inspector's \
                 session are accepted over plain HTTP from admin.allow_ips, where anyone who \
                 watches the network can take them and approve or deny validations; put a \
                 proxy that speaks HTTPS in front (server.trusted_proxies) and turn it off"
            );
        } else if trusted_proxies.is_empty() {
            tracing::warn!(
                "admin.allow_ips admits other machines, but payhook serves plain HTTP and no \
                 server.trusted_proxies is set: their calls of the operating API are refused \
                 (403) so that the token never crosses a network in the clear; reach it through \
                 a proxy that speaks HTTPS (server.trusted_proxies), or from this machine"
            );
        }
    }

    /// Refuses a call whose credentials crossed a network in the clear: one that came
    /// neither from this machine nor over HTTPS (as a trusted proxy says), unless
    /// `admin.allow_plain_http`.
    pub(super) fn check_channel(
        &self,
        came_from_this_machine: bool,
        https: bool,
    ) -> Result<(), Problem> {
        if came_from_this_machine || https || self.plain_http {
            Ok(())
        } else {
            Err(Problem::InTheClear)
        }
    }

    pub(super) fn check_address(&self, client: Option<std::net::IpAddr>) -> Result<(), Problem> {
        if client.is_some_and(|ip| self.allow.iter().any(|net| net.contains(ip))) {
            Ok(())
        } else {
            Err(Problem::AddressRefused)
        }
    }

    /// Lets in a bearer of a token, shared or an operator's, or a browser holding the
    /// inspector's session — whose changes must also carry the inspector's header, which a
    /// cross-site form cannot send — and says whose, with the session let in, if a session
    /// was: the caller asks the store whether it was ended elsewhere ([`StoredSession`]). A
    /// bearer from `client` is one of its guesses ([`Guesses`]).
    pub(super) fn admit(
        &self,
        method: &Method,
        headers: &HeaderMap,
        client: Option<IpAddr>,
    ) -> Result<(Caller, Option<StoredSession>), Problem> {
        let session = if headers.contains_key(http::header::AUTHORIZATION) {
            None
        } else {
            self.session_of(headers)
        };
        let Some((session, caller)) = session else {
            return self
                .check_bearer(headers, client)
                .map(|caller| (caller, None));
        };
        if method != Method::GET && !headers.contains_key(page::ACTION_HEADER) {
            return Err(Problem::Denied(format!(
                "a change from the inspector must carry the {} header",
                page::ACTION_HEADER
            )));
        }
        Ok((caller, Some(StoredSession::of(&session))))
    }

    /// The key sessions are signed under, made once; `None` when the system gave no random
    /// bytes for a key of the process (no session is made nor taken then).
    fn session_key(&self) -> Option<&ring::hmac::Key> {
        self.session_key
            .get_or_init(|| match &self.session_key_source {
                SessionKeySource::Derived(secret) => Some(session_key(secret)),
                SessionKeySource::Random => ring::hmac::Key::generate(
                    ring::hmac::HMAC_SHA256,
                    &ring::rand::SystemRandom::new(),
                )
                .ok(),
            })
            .as_ref()
    }

    /// The good session the request's cookies hold, as the store keeps it once ended,
    /// whatever else the request carries: what a logout ends, also when the request is let
    /// in by a bearer token beside the cookie ([`Self::admit`] then takes no session).
    pub(super) fn held_session(&self, headers: &HeaderMap) -> Option<StoredSession> {
        self.session_of(headers)
            .map(|(session, _)| StoredSession::of(&session))
    }

    /// The good session the request's cookies hold, if any, and whose it is.
    fn session_of(&self, headers: &HeaderMap) -> Option<(Session, Caller)> {
        let now = now_secs();
        headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .filter(|(name, _)| *name == SESSION_COOKIE)
            .find_map(|(_, value)| self.session_in(value, now))
    }

    /// The session cookie's value for `caller`'s login now: the time, a random id, who
    /// (empty for the shared token, else the operator's name in unpadded URL-safe base64),
    /// and in hex their HMAC (with the current generation) under the sessions' key.
    pub(super) fn new_session(&self, caller: &Caller) -> Result<String, Problem> {
        let no_session = |reason: &str| Problem::RetryLater {
            reason: reason.into(),
            retry_after: Duration::from_secs(1),
        };
        let issued = now_secs();
        let id: [u8; 16] = ring::rand::generate(&ring::rand::SystemRandom::new())
            .map(|random| random.expose())
            .map_err(|_| no_session("no random bytes for a session"))?;
        let id = Encoding::Hex.encode(&id);
        let holder = session_holder(caller, self)
            .ok_or_else(|| no_session("the login's credentials are no longer configured"))?;
        // Signed under the lock: a generation moving on meanwhile cannot end it at birth.
        // Made (once; derived, a hundred thousand HMACs) before the lock, not under it.
        let key = self
            .session_key()
            .ok_or_else(|| no_session("no random bytes for the sessions' key"))?;
        let ended = self.ended();
        let message = session_message(ended.generation(holder_key(caller)), issued, &id, &holder);
        let tag = ring::hmac::sign(key, &message);
        drop(ended);
        let who = caller.operator().map_or_else(String::new, |name| {
            Encoding::Base64UrlNoPad.encode(name.as_bytes())
        });
        Ok(format!(
            "{issued}.{id}.{who}.{}",
            Encoding::Hex.encode(tag.as_ref())
        ))
    }

    /// The session `value` names and whose it is, when the sessions' key signed it for a
    /// holder still configured with the same token (compared in constant time) within
    /// [`SESSION_LIFETIME_SECS`] before `now` (and not after it, give or take a minute) and
    /// it was not ended.
    fn session_in(&self, value: &str, now: u64) -> Option<(Session, Caller)> {
        let mut parts = value.split('.');
        let (issued, id, who, tag) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let (Ok(issued), Ok(tag)) = (issued.parse::<u64>(), Encoding::Hex.decode(tag)) else {
            return None;
        };
        let caller = if who.is_empty() {
            Caller::Shared
        } else {
            let name = Encoding::Base64UrlNoPad.decode(who).ok()?;
            self.operators.named(std::str::from_utf8(&name).ok()?)?
        };
        let holder = session_holder(&caller, self)?;
        let fresh = now.saturating_sub(issued) <= SESSION_LIFETIME_SECS && issued <= now + 60;
        let session = (issued, id.to_owned());
        let key = self.session_key()?;
        let ended = self.ended();
        let key_of = holder_key(&caller);
        let message = session_message(ended.generation(key_of), issued, id, &holder);
        let signed = ring::hmac::verify(key, &message, &tag).is_ok();
        (fresh && signed && !ended.has_ended(key_of, &session)).then_some((session, caller))
    }

    fn ended(&self) -> std::sync::MutexGuard<'_, Ended> {
        self.ended.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the session the request holds (logging out): it is refused from now on, and
    /// kept as ended until its life would have ended anyway; returned for the store to keep
    /// too. `None` when it holds none.
    pub(super) fn end_session(&self, headers: &HeaderMap) -> Option<StoredSession> {
        let (session, caller) = self.session_of(headers)?;
        let ended_session = StoredSession::of(&session);
        let now = now_secs();
        let mut ended = self.ended();
        let holder = ended
            .holders
            .entry(holder_key(&caller).to_owned())
            .or_default();
        holder
            .sessions
            .retain(|(issued, _)| now.saturating_sub(*issued) <= SESSION_LIFETIME_SECS);
        if holder.sessions.len() < ENDED_KEPT {
            holder.sessions.insert(session);
        } else {
            tracing::warn!(
                kept = ENDED_KEPT,
                operator = %crate::logged::Logged(caller.operator().unwrap_or("(the shared token)")),
                "admin: more inspector sessions of one holder ended than are kept one by one; \
                 every session of theirs so far is ended"
            );
            holder.sessions.clear();
            holder.generation += 1;
        }
        Some(ended_session)
    }

    fn check_bearer(&self, headers: &HeaderMap, client: Option<IpAddr>) -> Result<Caller, Problem> {
        let refused = |message: &str| Problem::Unauthorized {
            message: message.into(),
            basic: false,
        };
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let (value, more) = (values.next(), values.next());
        if more.is_some() {
            return Err(refused("more than one Authorization header"));
        }
        // The scheme's name is case-insensitive (RFC 9110, 11.1).
        let presented = value
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim_start_matches(' '));
        let Some(token) = presented else {
            return Err(refused("missing credentials"));
        };
        self.holder_of(token, client)?
            .ok_or_else(|| Problem::Unauthorized {
                message: "invalid credentials".into(),
                basic: false,
            })
    }

    /// Who a change `caller` asks for is kept with: the operator whose own credentials it
    /// came with; else `declared`, the name a bearer of the shared token gives — refused
    /// (403) when it is an operator's of `[admin.operators]`, whose changes are kept as
    /// their login and must not be claimed in their name with the shared token.
    pub(super) fn kept_name<'a>(
        &self,
        caller: &'a Caller,
        declared: Option<&'a str>,
    ) -> Result<Option<&'a str>, Problem> {
        if let Some(operator) = caller.operator() {
            return Ok(Some(operator));
        }
        // Kept trimmed, and read by people: ` alice `, `Alice` pass for alice.
        match declared.and_then(|name| self.operators.passed_for(name)) {
            Some(operator) => Err(Problem::Denied(format!(
                "`by`: {} is an operator with a token of their own (admin.operators): what \
                 they do is kept as their login, so the shared token cannot act in their name; \
                 call with their token, or give a name of your own",
                crate::logged::Logged(operator)
            ))),
            None => Ok(declared),
        }
    }

    /// Whose token `presented` is — an operator's, else the shared one (each compared in
    /// constant time) — as a guess by `client`: [`Problem::TooManyGuesses`], without
    /// comparing it, when `client` is out of guesses.
    pub(super) fn holder_of(
        &self,
        presented: &str,
        client: Option<IpAddr>,
    ) -> Result<Option<Caller>, Problem> {
        let guess = self
            .guesses
            .guess(client, std::time::Instant::now())
            .map_err(|retry_after| Problem::TooManyGuesses { retry_after })?;
        let holder = match self.operators.holder_of(presented) {
            Some(operator) => Some(operator),
            None => self
                .token
                .as_ref()
                .is_some_and(|token| token.matches(presented.as_bytes()))
                .then_some(Caller::Shared),
        };
        if holder.is_some() {
            guess.right();
        } else {
            guess.wrong();
        }
        Ok(holder)
    }
}

/// The operating API's access as read last: from the configuration at start, then from
/// each configuration read again ([`AdminAccess::read_again`]). A call reads it once, and is
/// judged by that one throughout.
pub(super) type CurrentAccess = crate::current::Current<AdminAccess>;

#[cfg(test)]
mod tests {
    use super::{AdminAccess, AdminConfig, Caller, Encoding, now_secs};

    /// The session's tag is an HMAC under a key PBKDF2 derives from the token, not under the
    /// token itself: a cookie read where it should not be is not one HMAC away from testing
    /// a guess of the token. A tag made under the token itself is refused.
    #[test]
    fn a_session_is_signed_under_a_key_derived_from_the_token_not_the_token() {
        let token = "admin-token-0123456789";
        let config = AdminConfig {
            token: Some(token.into()),
            ..AdminConfig::default()
        };
        let access = AdminAccess::from_config(&config).unwrap();
        let cookie = access.new_session(&Caller::Shared).unwrap();
        let now = now_secs();
        assert!(access.session_in(&cookie, now).is_some());
        let (signed, _) = cookie.rsplit_once('.').unwrap();
        let mut parts = signed.split('.');
        let (issued, id) = (parts.next().unwrap(), parts.next().unwrap());
        let holder = super::session_holder(&Caller::Shared, &access).unwrap();
        let under_the_token = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes()),
            &super::session_message(0, issued.parse().unwrap(), id, &holder),
        );
        let forged = format!(
            "{signed}.{}",
            Encoding::Hex.encode(under_the_token.as_ref())
        );
        assert_ne!(forged, cookie);
        assert!(access.session_in(&forged, now).is_none());
    }

    fn access() -> super::AdminAccess {
        let config = super::AdminConfig {
            token: Some("admin-token-0123456789".into()),
            operators: [(
                "alice".to_owned(),
                crate::server::OperatorToken::digest_of("alice-token"),
            )]
            .into(),
            session_secret: Some("sessions-secret-0123456789abcdef-xyz".into()),
            ..super::AdminConfig::default()
        };
        super::AdminAccess::from_config(&config).unwrap()
    }

    fn has_session(access: &super::AdminAccess, session: &str) -> bool {
        access.session_of(&holding(session)).is_some()
    }

    fn holding(session: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        let cookie = format!("other=1; {}={session}", super::SESSION_COOKIE);
        headers.insert(http::header::COOKIE, cookie.parse().unwrap());
        headers
    }

    #[test]
    fn logging_out_ends_that_session_only_and_more_than_are_kept_end_them_all() {
        let access = access();
        let first = access.new_session(&Caller::Shared).unwrap();
        let second = access.new_session(&Caller::Shared).unwrap();
        assert_ne!(first, second, "two logins of one second are two sessions");
        assert!(has_session(&access, &first));
        access.end_session(&holding(&first));
        assert!(!has_session(&access, &first));
        assert!(has_session(&access, &second));

        // One more ended session than are kept one by one: every session of that holder so
        // far is ended, another holder's is not, and a login after it is good.
        let alice = access.new_session(&alice()).unwrap();
        for _ in 0..super::ENDED_KEPT {
            let session = access.new_session(&Caller::Shared).unwrap();
            access.end_session(&holding(&session));
        }
        assert!(!has_session(&access, &first));
        assert!(
            !has_session(&access, &second),
            "every session so far is ended"
        );
        let after = access.new_session(&Caller::Shared).unwrap();
        assert!(has_session(&access, &after));
        assert!(
            has_session(&access, &alice),
            "another holder's session stays"
        );
        assert!(access.ended().holders[""].sessions.len() <= super::ENDED_KEPT);
    }

    /// An access of these operators (name and token), these sessions' secret and no
    /// shared token.
    fn operators(list: &[(&str, &str)], session_secret: Option<&str>) -> super::AdminAccess {
        let config = super::AdminConfig {
            operators: list
                .iter()
                .map(|(name, token)| {
                    (
                        (*name).to_owned(),
                        crate::server::OperatorToken::digest_of(token),
                    )
                })
                .collect(),
            session_secret: session_secret.map(Into::into),
            ..super::AdminConfig::default()
        };
        super::AdminAccess::from_config(&config).unwrap()
    }

    fn alice() -> Caller {
        Caller::Operator("alice".into())
    }

    /// A session is its operator's, in every instance that shares the sessions' secret,
    /// while that operator keeps that token: a new token, or the operator taken out of the
    /// configuration, ends it; another name put into the cookie breaks its signature.
    #[test]
    fn an_operators_session_is_theirs_until_their_token_changes_or_they_are_gone() {
        let secret = Some("sessions-secret-0123456789abcdef-xyz");
        let one = operators(&[("alice", "alice-token"), ("bob", "bob-token")], secret);
        let cookie = one.new_session(&alice()).unwrap();
        let now = now_secs();
        let (_, caller) = one.session_in(&cookie, now).unwrap();
        assert_eq!(caller, alice());

        let other_instance = operators(&[("bob", "bob-token"), ("alice", "alice-token")], secret);
        assert_eq!(
            other_instance.session_in(&cookie, now).map(|(_, c)| c),
            Some(alice())
        );
        let new_token = operators(&[("alice", "alice-token-2"), ("bob", "bob-token")], secret);
        assert!(new_token.session_in(&cookie, now).is_none());
        let gone = operators(&[("bob", "bob-token")], secret);
        assert!(gone.session_in(&cookie, now).is_none());
        // Made a viewer (a service started again so configured): the same session looks,
        // and changes nothing — the cookie never signs what its holder may do.
        let demoted = super::AdminAccess::from_config(&super::AdminConfig {
            viewers: vec!["alice".into()],
            ..super::AdminConfig {
                operators: [
                    (
                        "alice".to_owned(),
                        crate::server::OperatorToken::digest_of("alice-token"),
                    ),
                    (
                        "bob".to_owned(),
                        crate::server::OperatorToken::digest_of("bob-token"),
                    ),
                ]
                .into(),
                session_secret: secret.map(Into::into),
                ..super::AdminConfig::default()
            }
        })
        .unwrap();
        let (_, caller) = demoted.session_in(&cookie, now).unwrap();
        assert_eq!(caller, Caller::Viewer("alice".into()));
        assert!(!caller.may_change());
        let other_secret = operators(
            &[("alice", "alice-token"), ("bob", "bob-token")],
            Some("another-secret-0123456789abcdef-xyz"),
        );
        assert!(other_secret.session_in(&cookie, now).is_none());

        let mut parts: Vec<&str> = cookie.split('.').collect();
        let bob = Encoding::Base64UrlNoPad.encode(b"bob");
        parts[2] = &bob;
        assert!(
            one.session_in(&parts.join("."), now).is_none(),
            "bob's name, alice's tag"
        );
        parts[2] = "";
        assert!(
            one.session_in(&parts.join("."), now).is_none(),
            "no shared token here"
        );
    }

    /// With neither a sessions' secret nor a shared token, sessions are signed under a
    /// random key of the process: good at this one, at no other.
    #[test]
    fn without_a_secret_an_operators_session_holds_at_its_own_process_alone() {
        let one = operators(&[("alice", "alice-token")], None);
        let cookie = one.new_session(&alice()).unwrap();
        let now = now_secs();
        assert!(one.session_in(&cookie, now).is_some());
        let another = operators(&[("alice", "alice-token")], None);
        assert!(another.session_in(&cookie, now).is_none());
    }

    /// Where operators have tokens of their own, a bearer of the shared token cannot sign an
    /// operator's session: the sessions' key is not derived from the shared token then
    /// (its bearer knows it, and the operator's hash is in the configuration).
    #[test]
    fn a_bearer_of_the_shared_token_cannot_sign_an_operators_session() {
        let shared = "admin-token-0123456789";
        let config = super::AdminConfig {
            token: Some(shared.into()),
            operators: [(
                "alice".to_owned(),
                crate::server::OperatorToken::digest_of("alice-token"),
            )]
            .into(),
            ..super::AdminConfig::default()
        };
        let access = super::AdminAccess::from_config(&config).unwrap();
        let now = now_secs();
        let id = "00112233445566778899aabbccddeeff";
        let holder = super::session_holder(&alice(), &access).unwrap();
        let tag = ring::hmac::sign(
            &super::session_key(&shared.into()),
            &super::session_message(0, now, id, &holder),
        );
        let forged = format!(
            "{now}.{id}.{}.{}",
            Encoding::Base64UrlNoPad.encode(b"alice"),
            Encoding::Hex.encode(tag.as_ref())
        );
        assert!(access.session_in(&forged, now).is_none());
        let real = access.new_session(&alice()).unwrap();
        assert!(access.session_in(&real, now).is_some());
        let shared_session = access.new_session(&Caller::Shared).unwrap();
        assert_eq!(
            access.session_in(&shared_session, now).map(|(_, c)| c),
            Some(Caller::Shared)
        );
    }

    /// A shared token's session ends with the token, even when the sessions' secret stays.
    #[test]
    fn a_shared_session_ends_when_the_shared_token_changes() {
        let config = |token: &str| super::AdminConfig {
            token: Some(token.into()),
            session_secret: Some("sessions-secret-0123456789abcdef-xyz".into()),
            ..super::AdminConfig::default()
        };
        let before = super::AdminAccess::from_config(&config("admin-token-0123456789")).unwrap();
        let cookie = before.new_session(&Caller::Shared).unwrap();
        let now = now_secs();
        assert!(before.session_in(&cookie, now).is_some());
        let same = super::AdminAccess::from_config(&config("admin-token-0123456789")).unwrap();
        assert!(same.session_in(&cookie, now).is_some());
        let after = super::AdminAccess::from_config(&config("admin-token-9876543210")).unwrap();
        assert!(after.session_in(&cookie, now).is_none());
    }
}
