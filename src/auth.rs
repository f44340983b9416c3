//! Authenticating the aggregator's calls to the two validation endpoints.
//!
//! The spec does not say how the aggregator authenticates itself to merchant-hosted URLs
//! (§5), so each validation endpoint takes one of several methods
//! ([`EndpointAuthConfig`]): none, the callback signature scheme, a
//! shared-secret header, or HTTP Basic — plus, with any of them, an IP allow-list.
//! Secrets are compared in constant time: each is kept only as an HMAC tag under a random
//! per-process key, and a presented value is checked with ring's `hmac::verify`, so neither
//! the content nor the length of the secret leaks through timing. A shared secret and a
//! Basic password have at least 16 characters: the endpoints answer whoever reaches them,
//! so a short one could be found by asking with guesses.

use base64::Engine;
use http::{HeaderMap, HeaderName, header};
use ring::{hmac, rand::SystemRandom};
use serde::{Deserialize, Serialize};
use std::{fmt, net::IpAddr, str::FromStr};

use crate::Secret;
use crate::setting::{InvalidSetting, long_enough};

/// The fewest characters a validation endpoint's shared secret or Basic password has, as
/// `admin.token`: the endpoint answers whoever asks, so a short one could be found by
/// asking with guesses.
pub(crate) const MIN_SECRET_CHARS: usize = 16;

/// How a validation endpoint authenticates the aggregator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMethod {
    /// No credentials (the IP allow-list, if any, still applies). The default.
    #[default]
    None,
    /// The body is signed like a callback (`[signature]`).
    Signature,
    /// A header carries a shared secret.
    SharedSecret,
    /// HTTP Basic authentication.
    Basic,
}

/// A credential set in `config` while its method asks for none. Set without the method
/// (left at `none`), a secret looks in force — `check-config` shows it, redacted — while
/// the endpoint answers whoever calls it. (Under another method, a credential of another
/// one is left over, not a door left open: it is taken.)
fn unused_credential(config: &EndpointAuthConfig) -> Option<&'static str> {
    if config.method != AuthMethod::None {
        return None;
    }
    // An empty value is a variable exported empty: nothing set (as shared_secret reads it).
    let set = |value: Option<&str>| value.is_some_and(|v| !v.is_empty());
    [
        ("secret", set(config.secret.as_ref().map(Secret::expose))),
        ("username", set(config.username.as_deref())),
        (
            "password",
            set(config.password.as_ref().map(Secret::expose)),
        ),
    ]
    .into_iter()
    .find(|(_, set)| *set)
    .map(|(field, _)| field)
}

/// Refuses `secret`, the value of `key`, when shorter than [`MIN_SECRET_CHARS`] and the
/// endpoint does not `allow_short_secret`.
fn long_enough_unless_allowed(
    config: &EndpointAuthConfig,
    key: &str,
    secret: &Secret,
) -> Result<(), InvalidSetting> {
    if config.allow_short_secret {
        return Ok(());
    }
    long_enough(key, secret, MIN_SECRET_CHARS).map_err(|mut refused| {
        refused.reason.push_str(
            "; one the aggregator issued and you cannot lengthen is taken with \
             allow_short_secret = true",
        );
        refused
    })
}

/// Whether `config` takes a credential shorter than [`MIN_SECRET_CHARS`]: said at start.
pub(crate) fn takes_a_short_secret(config: &EndpointAuthConfig) -> bool {
    let short = |secret: Option<&Secret>| {
        secret.is_some_and(|s| s.expose().chars().count() < MIN_SECRET_CHARS)
    };
    config.allow_short_secret
        && match config.method {
            AuthMethod::SharedSecret => short(config.secret.as_ref()),
            AuthMethod::Basic => short(config.password.as_ref()),
            AuthMethod::None | AuthMethod::Signature => false,
        }
}

/// An IPv4 or IPv6 network in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`; a bare address
/// is a /32 or /128).
///
/// ```
/// use payhook::config::Cidr;
///
/// let net: Cidr = "10.1.0.0/16".parse()?;
/// assert!(net.contains("10.1.200.3".parse()?));
/// assert!(!net.contains("10.2.0.1".parse()?));
/// assert!(net.contains("::ffff:10.1.0.9".parse()?), "IPv4-mapped IPv6 peers match");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Text that is no CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an IP network (expected e.g. 10.0.0.0/8 or 2001:db8::/32)")]
pub struct CidrError(String);

impl Cidr {
    /// `true` when `address` is in this network.
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(addr)) => {
                prefix_matches(&net.octets(), &addr.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(addr)) => {
                prefix_matches(&net.octets(), &addr.octets(), self.prefix)
            }
            _ => false,
        }
    }

    /// `true` for a network of every address of its family (`0.0.0.0/0`, `::/0`): an
    /// allow-list that holds it refuses nobody of that family.
    ///
    /// ```
    /// use payhook::config::Cidr;
    ///
    /// let all: Cidr = "0.0.0.0/0".parse()?;
    /// let some: Cidr = "10.0.0.0/8".parse()?;
    /// assert!(all.is_everywhere() && !some.is_everywhere());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_everywhere(&self) -> bool {
        self.prefix == 0
    }

    /// `true` when every address of this network is a loopback address: this machine.
    ///
    /// ```
    /// use payhook::config::Cidr;
    ///
    /// let only: Cidr = "127.0.0.1/32".parse()?;
    /// let wider: Cidr = "0.0.0.0/0".parse()?;
    /// assert!(only.is_loopback_only() && !wider.is_loopback_only());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_loopback_only(&self) -> bool {
        match self.network.to_canonical() {
            IpAddr::V4(net) => net.is_loopback() && self.prefix >= 8,
            IpAddr::V6(net) => net.is_loopback() && self.prefix == 128,
        }
    }
}

fn prefix_matches(network: &[u8], address: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    let rest = prefix % 8;
    let (Some(net_head), Some(addr_head)) = (network.get(..full), address.get(..full)) else {
        return false;
    };
    net_head == addr_head
        && (rest == 0
            || match (network.get(full), address.get(full)) {
                (Some(n), Some(a)) => (n ^ a) & (0xffu8 << (8 - rest)) == 0,
                _ => false,
            })
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || CidrError(text.to_owned());
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let network: IpAddr = address.parse().map_err(|_| error())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(error)?,
            None => max,
        };
        let canonical = network.to_canonical();
        // An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) is the IPv4 network it maps:
        // its prefix counts the 96 mapping bits, which the IPv4 form does not have.
        let prefix = if canonical.is_ipv4() && network.is_ipv6() {
            prefix.checked_sub(96).ok_or_else(error)?
        } else {
            prefix
        };
        Ok(Self {
            network: canonical,
            prefix,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    /// The caller's address is not allowed: 403.
    #[error("address not allowed")]
    AddressRefused,
    /// No credentials: 401.
    #[error("missing credentials")]
    Missing,
    /// Wrong credentials: 401.
    #[error("invalid credentials")]
    Wrong,
}

/// A per-process HMAC key and the tag of the expected secret under it: compares a presented
/// secret in constant time.
pub(crate) struct Expected {
    key: hmac::Key,
    tag: hmac::Tag,
}

impl Expected {
    pub(crate) fn new(secret: &[u8]) -> Self {
        // A fixed key would do for timing safety; a random one also keeps the tag useless
        // outside this process. Without randomness, the secret's hash keys the HMAC instead.
        let key =
            hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new()).unwrap_or_else(|_| {
                hmac::Key::new(
                    hmac::HMAC_SHA256,
                    ring::digest::digest(&ring::digest::SHA256, secret).as_ref(),
                )
            });
        let tag = hmac::sign(&key, secret);
        Self { key, tag }
    }

    /// Constant-time: the presented value's HMAC is compared by ring.
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        hmac::verify(&self.key, presented, self.tag.as_ref()).is_ok()
    }
}

enum Method {
    None,
    Signature,
    SharedSecret {
        header: HeaderName,
        expected: Expected,
    },
    Basic {
        expected: Expected,
    },
}

/// The checks of one endpoint, built once from its configuration.
pub(crate) struct Guard {
    method: Method,
    allow: Vec<Cidr>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let method = match &self.method {
            Method::None => "none",
            Method::Signature => "signature",
            Method::SharedSecret { .. } => "shared_secret",
            Method::Basic { .. } => "basic",
        };
        f.debug_struct("Guard")
            .field("method", &method)
            .field("allow", &self.allow)
            .finish()
    }
}

impl Guard {
    /// Builds the checks; `key` names the config table in errors (`auth.transaction_validation`).
    pub(crate) fn from_config(
        config: &EndpointAuthConfig,
        key: &str,
    ) -> Result<Self, InvalidSetting> {
        let invalid = |field: &str, reason: String| InvalidSetting {
            key: format!("{key}{field}"),
            reason,
        };
        let allow = config
            .allow_ips
            .iter()
            .map(|text| {
                text.parse::<Cidr>()
                    .map_err(|e| invalid(".allow_ips", e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(field) = unused_credential(config) {
            return Err(invalid(
                &format!(".{field}"),
                format!(
                    "is set, but method = \"none\": the endpoint would not ask for it and \
                     would answer anyone (set method = \"shared_secret\" or \"basic\", or \
                     remove {field})"
                ),
            ));
        }
        let method = match config.method {
            AuthMethod::None => Method::None,
            AuthMethod::Signature => Method::Signature,
            AuthMethod::SharedSecret => {
                let secret = config.secret.as_ref().filter(|s| !s.is_empty());
                let secret = secret.ok_or_else(|| {
                    invalid(".secret", "required for method = \"shared_secret\"".into())
                })?;
                long_enough_unless_allowed(config, &format!("{key}.secret"), secret)?;
                if secret.expose().trim() != secret.expose() {
                    // HTTP takes the spaces around a header's value off: it would never match.
                    return Err(invalid(
                        ".secret",
                        "begins or ends with white space, which no header value carries \
                         (the value is not shown: it is a secret)"
                            .into(),
                    ));
                }
                let header = HeaderName::try_from(config.header.trim()).map_err(|_| {
                    invalid(
                        ".header",
                        format!("`{}` is not a header name", config.header),
                    )
                })?;
                if crate::handler::RequestContext::shows(&header) {
                    // Its value would be shown: by the inspector, and by a handler that logs
                    // its request context.
                    return Err(invalid(
                        ".header",
                        format!(
                            "`{header}` is a header whose value payhook shows (the inspector, a logged request context); carry the secret in another, such as X-Api-Key"
                        ),
                    ));
                }
                Method::SharedSecret {
                    header,
                    expected: Expected::new(secret.expose().as_bytes()),
                }
            }
            AuthMethod::Basic => {
                let (Some(user), Some(password)) =
                    (config.username.as_deref(), config.password.as_ref())
                else {
                    return Err(invalid(
                        "",
                        "username and password are required for method = \"basic\"".into(),
                    ));
                };
                // An empty value is most often a variable that was not set: it must not
                // let in anyone who sends it.
                if user.is_empty() || user.contains(':') {
                    return Err(invalid(
                        ".username",
                        "must be non-empty and without `:` for method = \"basic\"".into(),
                    ));
                }
                long_enough_unless_allowed(config, &format!("{key}.password"), password)?;
                let pair = format!("{user}:{}", password.expose());
                Method::Basic {
                    expected: Expected::new(pair.as_bytes()),
                }
            }
        };
        Ok(Self { method, allow })
    }

    /// `true` when the endpoint answers anyone who reaches it: no credentials asked, and no
    /// allow-list or one that admits every address of a family.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.method, Method::None)
            && (self.allow.is_empty() || self.allow.iter().any(Cidr::is_everywhere))
    }

    /// `true` when the body must carry a valid signature.
    pub(crate) fn needs_signature(&self) -> bool {
        matches!(self.method, Method::Signature)
    }

    /// `true` when a 401 should name Basic in `WWW-Authenticate`.
    pub(crate) fn is_basic(&self) -> bool {
        matches!(self.method, Method::Basic { .. })
    }

    /// `true` when callers are refused by address (`allow_ips`).
    pub(crate) fn has_allow_list(&self) -> bool {
        !self.allow.is_empty()
    }

    /// The allow-list: a caller outside it, or of unknown address, is refused.
    pub(crate) fn check_peer(&self, peer: Option<IpAddr>) -> Result<(), AuthError> {
        if self.allow.is_empty() {
            return Ok(());
        }
        match peer {
            Some(ip) if self.allow.iter().any(|net| net.contains(ip)) => Ok(()),
            _ => Err(AuthError::AddressRefused),
        }
    }

    /// The header credentials (the signature, if any, is checked with the body). A
    /// credential header sent twice is refused, as a signature header is: which of the two a
    /// proxy on the way would have read is anyone's guess.
    pub(crate) fn check_headers(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        match &self.method {
            Method::None | Method::Signature => Ok(()),
            Method::SharedSecret { header, expected } => {
                let presented = only_one(headers, header)?;
                if expected.matches(presented.as_bytes()) {
                    Ok(())
                } else {
                    Err(AuthError::Wrong)
                }
            }
            Method::Basic { expected } => {
                let value = only_one(headers, &header::AUTHORIZATION)?;
                let encoded = value
                    .to_str()
                    .ok()
                    .and_then(|v| v.split_once(' '))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
                    .map(|(_, credentials)| credentials.trim())
                    .ok_or(AuthError::Wrong)?;
                let pair = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|_| AuthError::Wrong)?;
                if expected.matches(&pair) {
                    Ok(())
                } else {
                    Err(AuthError::Wrong)
                }
            }
        }
    }
}

/// The one value of `name` among `headers`: [`AuthError::Missing`] without one,
/// [`AuthError::Wrong`] for two or more.
fn only_one<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<&'h http::HeaderValue, AuthError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next().ok_or(AuthError::Missing)?;
    if values.next().is_some() {
        return Err(AuthError::Wrong);
    }
    Ok(first)
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
    /// The shared secret (at least 16 characters); redacted in `Debug`.
    #[serde(
        serialize_with = "crate::setting::redacted",
        skip_serializing_if = "Option::is_none"
    )]
    pub secret: Option<Secret>,
    /// Basic user name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Basic password (at least 16 characters); redacted in `Debug`.
    #[serde(
        serialize_with = "crate::setting::redacted",
        skip_serializing_if = "Option::is_none"
    )]
    pub password: Option<Secret>,
    /// Networks allowed to call (CIDR); empty allows every address.
    pub allow_ips: Vec<String>,
    /// Take a `secret` or `password` shorter than 16 characters (one the aggregator issued
    /// and the merchant cannot lengthen), said in a warning at start. Off by default: the
    /// endpoint answers whoever reaches it, so a short one could be found by asking with
    /// guesses.
    #[serde(deserialize_with = "crate::setting::lenient")]
    pub allow_short_secret: bool,
}

impl EndpointAuthConfig {
    /// `true` when the endpoint would answer anyone who reaches it: method `none`, and no
    /// `allow_ips` or one that admits every address of a family (`0.0.0.0/0`, `::/0`).
    ///
    /// ```
    /// use payhook::config::{AuthMethod, EndpointAuthConfig};
    ///
    /// let mut config = EndpointAuthConfig::default();
    /// assert!(config.is_open());
    /// config.allow_ips = vec!["10.0.0.0/8".into()];
    /// assert!(!config.is_open());
    /// config.allow_ips.push("0.0.0.0/0".into());
    /// assert!(config.is_open());
    /// config.method = AuthMethod::Signature;
    /// assert!(!config.is_open());
    /// ```
    pub fn is_open(&self) -> bool {
        self.method == AuthMethod::None
            && (self.allow_ips.is_empty()
                || self
                    .allow_ips
                    .iter()
                    .any(|text| text.parse::<Cidr>().is_ok_and(|cidr| cidr.is_everywhere())))
    }
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
            allow_short_secret: false,
        }
    }
}

impl AuthConfig {
    /// Checks each endpoint's method has what it needs. Whether `signature` has keys is
    /// checked by [`crate::config::Config::validate`].
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        Guard::from_config(&self.providers_validation, "auth.providers_validation")?;
        Guard::from_config(&self.transaction_validation, "auth.transaction_validation")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;

    #[test]
    fn cidrs_match_v4_and_v6_at_any_prefix() {
        let net: Cidr = "192.168.1.128/25".parse().unwrap();
        assert!(net.contains("192.168.1.200".parse().unwrap()));
        assert!(!net.contains("192.168.1.127".parse().unwrap()));
        let v6: Cidr = "2001:db8:abcd::/48".parse().unwrap();
        assert!(v6.contains("2001:db8:abcd:12::1".parse().unwrap()));
        assert!(!v6.contains("2001:db8:abce::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let host: Cidr = "127.0.0.1".parse().unwrap();
        assert_eq!(host.to_string(), "127.0.0.1/32");
        for bad in ["10.0.0.0/33", "::/129", "10.0.0/8", "x", "10.0.0.0/"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ipv4_mapped_networks_are_their_ipv4_networks() {
        // As dual-stack logs print peers: the mapped form is the IPv4 address, not a panic.
        let host: Cidr = "::ffff:10.0.0.5".parse().unwrap();
        assert_eq!(host.to_string(), "10.0.0.5/32");
        assert!(host.contains("10.0.0.5".parse().unwrap()));
        assert!(host.contains("::ffff:10.0.0.5".parse().unwrap()));
        assert!(!host.contains("10.0.0.6".parse().unwrap()));
        let net: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains("10.200.0.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        let mapped_all: Cidr = "::ffff:0:0/96".parse().unwrap();
        assert!(mapped_all.contains("8.8.8.8".parse().unwrap()));
        assert!(!mapped_all.contains("2001:db8::1".parse().unwrap()));
        // Shorter than the mapping itself: not an IPv4 network.
        assert!("::ffff:0:0/95".parse::<Cidr>().is_err());
    }

    #[test]
    fn basic_needs_a_password_and_a_username_that_are_not_empty() {
        let basic = |username: &str, password: &str| EndpointAuthConfig {
            method: AuthMethod::Basic,
            username: Some(username.into()),
            password: Some(Secret::new(password)),
            ..EndpointAuthConfig::default()
        };
        for (config, key) in [
            (basic("aggregator", ""), "auth.test.password"),
            (basic("", "pa55word-0123456789"), "auth.test.username"),
            (
                basic("aggre:gator", "pa55word-0123456789"),
                "auth.test.username",
            ),
        ] {
            let error = Guard::from_config(&config, "auth.test").unwrap_err();
            assert_eq!(error.key, key, "{error}");
        }
        assert!(
            Guard::from_config(&basic("aggregator", "pa55word-0123456789"), "auth.test").is_ok()
        );
    }

    #[test]
    fn a_secret_or_password_that_guesses_could_find_is_refused_naming_the_key() {
        let shared = |secret: &str| EndpointAuthConfig {
            method: AuthMethod::SharedSecret,
            secret: Some(Secret::new(secret)),
            ..EndpointAuthConfig::default()
        };
        let basic = |password: &str| EndpointAuthConfig {
            method: AuthMethod::Basic,
            username: Some("aggregator".into()),
            password: Some(Secret::new(password)),
            ..EndpointAuthConfig::default()
        };
        // Fifteen characters, four of them two bytes each: counted as characters.
        let short = "s3cret-\u{e9}\u{e9}\u{e9}\u{e9}-abc";
        assert_eq!(short.chars().count(), MIN_SECRET_CHARS - 1);
        for (config, key) in [
            (shared(short), "auth.test.secret"),
            (basic(short), "auth.test.password"),
        ] {
            let error = Guard::from_config(&config, "auth.test").unwrap_err();
            assert_eq!(error.key, key, "{error}");
            assert!(error.reason.contains("at least 16 characters"), "{error}");
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
        let enough = format!("{short}d");
        assert!(Guard::from_config(&shared(&enough), "auth.test").is_ok());
        assert!(Guard::from_config(&basic(&enough), "auth.test").is_ok());
        // One the aggregator issued, taken deliberately (and said at start).
        for config in [shared(short), basic(short)] {
            let error = Guard::from_config(&config, "auth.test").unwrap_err();
            assert!(
                error.reason.contains("allow_short_secret = true"),
                "{error}"
            );
            assert!(!takes_a_short_secret(&config));
            let allowed = EndpointAuthConfig {
                allow_short_secret: true,
                ..config
            };
            assert!(Guard::from_config(&allowed, "auth.test").is_ok());
            assert!(takes_a_short_secret(&allowed));
        }
        assert!(!takes_a_short_secret(&EndpointAuthConfig {
            allow_short_secret: true,
            ..shared(&enough)
        }));
    }

    fn guard(config: EndpointAuthConfig) -> Guard {
        Guard::from_config(&config, "auth.test").unwrap()
    }

    #[test]
    fn a_shared_secret_must_match_exactly() {
        let guard = guard(EndpointAuthConfig {
            method: AuthMethod::SharedSecret,
            secret: Some(Secret::new("s3cret-0123456789")),
            ..EndpointAuthConfig::default()
        });
        let mut headers = HeaderMap::new();
        assert_eq!(guard.check_headers(&headers), Err(AuthError::Missing));
        for wrong in [
            "s3cret-012345678",
            "s3cret-0123456789 ",
            "S3CRET-0123456789",
            "",
        ] {
            headers.insert("x-api-key", wrong.parse().unwrap());
            assert_eq!(
                guard.check_headers(&headers),
                Err(AuthError::Wrong),
                "{wrong:?}"
            );
        }
        headers.insert("x-api-key", "s3cret-0123456789".parse().unwrap());
        assert_eq!(guard.check_headers(&headers), Ok(()));
        // Sent twice — the right one among them — it is refused, as a signature header is.
        headers.append("x-api-key", "guess".parse().unwrap());
        assert_eq!(guard.check_headers(&headers), Err(AuthError::Wrong));
    }

    #[test]
    fn a_shared_secret_no_header_value_can_carry_is_refused_when_read() {
        for secret in [
            " s3cret-0123456789",
            "s3cret-0123456789\t",
            "s3cret-0123456789 ",
        ] {
            let config = EndpointAuthConfig {
                method: AuthMethod::SharedSecret,
                secret: Some(Secret::new(secret)),
                ..EndpointAuthConfig::default()
            };
            let error = Guard::from_config(&config, "auth.test").unwrap_err();
            assert_eq!(error.key, "auth.test.secret", "{secret:?}");
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
    }

    #[test]
    fn basic_credentials_must_match() {
        let guard = guard(EndpointAuthConfig {
            method: AuthMethod::Basic,
            username: Some("aggregator".into()),
            password: Some(Secret::new("pa:ss-0123456789ab")),
            ..EndpointAuthConfig::default()
        });
        let mut headers = HeaderMap::new();
        let basic = |pair: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        };
        headers.insert(
            header::AUTHORIZATION,
            basic("aggregator:pa:ss-0123456789ab").parse().unwrap(),
        );
        assert_eq!(guard.check_headers(&headers), Ok(()));
        headers.insert(
            header::AUTHORIZATION,
            basic("aggregator:pa:ss-0123456789a").parse().unwrap(),
        );
        assert_eq!(guard.check_headers(&headers), Err(AuthError::Wrong));
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(guard.check_headers(&headers), Err(AuthError::Wrong));
        // The right credentials and another pair: refused.
        headers.insert(
            header::AUTHORIZATION,
            basic("aggregator:pa:ss-0123456789ab").parse().unwrap(),
        );
        headers.append(header::AUTHORIZATION, basic("x:y").parse().unwrap());
        assert_eq!(guard.check_headers(&headers), Err(AuthError::Wrong));
    }

    #[test]
    fn the_allow_list_refuses_others_and_unknown_peers() {
        let guard = guard(EndpointAuthConfig {
            allow_ips: vec!["10.0.0.0/8".into()],
            ..EndpointAuthConfig::default()
        });
        assert_eq!(guard.check_peer(Some("10.9.8.7".parse().unwrap())), Ok(()));
        assert_eq!(
            guard.check_peer(Some("11.0.0.1".parse().unwrap())),
            Err(AuthError::AddressRefused)
        );
        assert_eq!(guard.check_peer(None), Err(AuthError::AddressRefused));
    }

    #[test]
    fn incomplete_methods_are_configuration_errors_naming_the_key() {
        let error = Guard::from_config(
            &EndpointAuthConfig {
                method: AuthMethod::SharedSecret,
                ..EndpointAuthConfig::default()
            },
            "auth.providers_validation",
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("auth.providers_validation.secret"),
            "{error}"
        );
        let error = Guard::from_config(
            &EndpointAuthConfig {
                allow_ips: vec!["10/8".into()],
                ..EndpointAuthConfig::default()
            },
            "auth.x",
        )
        .unwrap_err();
        assert!(error.to_string().starts_with("auth.x.allow_ips"), "{error}");
    }

    #[test]
    fn credentials_without_a_method_are_refused_not_ignored() {
        let secret = || Some(Secret::new("s3cret-value-0123456"));
        let refused = |config: EndpointAuthConfig, key: &str| {
            let error = Guard::from_config(&config, "auth.transaction_validation").unwrap_err();
            assert_eq!(error.key, key, "{error}");
            assert!(error.reason.contains("method = \"none\""), "{error}");
            assert!(!error.to_string().contains("s3cret"), "{error}");
        };
        // A secret with the method left at its default, behind an allow-list: it would
        // look in force while anyone in 10/8 is let in without it.
        refused(
            EndpointAuthConfig {
                secret: secret(),
                allow_ips: vec!["10.0.0.0/8".into()],
                ..EndpointAuthConfig::default()
            },
            "auth.transaction_validation.secret",
        );
        refused(
            EndpointAuthConfig {
                username: Some("aggregator".into()),
                password: secret(),
                ..EndpointAuthConfig::default()
            },
            "auth.transaction_validation.username",
        );
        // Under a method that asks for a credential, one of another method is left over.
        assert!(
            Guard::from_config(
                &EndpointAuthConfig {
                    method: AuthMethod::SharedSecret,
                    secret: secret(),
                    username: Some("aggregator".into()),
                    ..EndpointAuthConfig::default()
                },
                "auth.transaction_validation",
            )
            .is_ok()
        );
    }
}
