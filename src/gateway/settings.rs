//! `[gateway]`: where the aggregator's own endpoints are and how to log in to them.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

use crate::Secret;
use crate::setting::InvalidSetting;

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
    #[serde(
        serialize_with = "crate::setting::redacted",
        skip_serializing_if = "Option::is_none"
    )]
    pub password: Option<Secret>,
    /// Bound on every call to the aggregator: connecting, sending and reading the answer.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub timeout: Duration,
    /// How long before `accessTokenExpiryUtc` the access token is refreshed — at most half
    /// the lifetime the aggregator granted the token, so that a short-lived token is not
    /// refreshed before every call.
    #[serde(
        deserialize_with = "crate::setting::duration",
        serialize_with = "crate::setting::duration_text"
    )]
    pub refresh_margin: Duration,
    /// Header that carries the access token.
    pub auth_header: String,
    /// Scheme before the token in that header (`Bearer <token>`); empty sends the bare token.
    pub auth_scheme: String,
    /// An HTTP proxy (`http://host:port`, with `user:password@` if it asks) that `https://`
    /// calls tunnel through with `CONNECT`. Unset: `HTTPS_PROXY` (or `ALL_PROXY`) from the
    /// environment, excluding the hosts of `NO_PROXY`. A secret (it may carry credentials):
    /// redacted in `Debug` and in the printed settings.
    #[serde(
        serialize_with = "crate::setting::redacted",
        skip_serializing_if = "Option::is_none"
    )]
    pub proxy: Option<Secret>,
    /// Hosts reached without the proxy, `proxy` or the environment's (`NO_PROXY` syntax:
    /// `example.com, .internal, 10.0.0.0/8`); unset, the environment's `NO_PROXY`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_proxy: Option<String>,
    /// PEM file of CA certificates trusted besides the web's roots: an aggregator endpoint
    /// whose certificate a private CA issued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain presented when the aggregator asks for a client certificate
    /// (mutual TLS); with `client_key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file` (PKCS#8, PKCS#1 or SEC1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key_file: Option<PathBuf>,
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
            proxy: None,
            no_proxy: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
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

impl GatewayConfig {
    /// Checks values that have the right type but are not acceptable.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        let urls = [
            ("gateway.auth_url", &self.auth_url),
            ("gateway.gateway_url", &self.gateway_url),
        ];
        for (key, url) in urls {
            if let Some(url) = url
                && let Err(reason) = check_remote_url(url)
            {
                return Err(InvalidSetting {
                    key: key.to_owned(),
                    reason,
                });
            }
        }
        crate::setting::longer_than_zero(&[("gateway.timeout", self.timeout)])?;
        if http::HeaderName::from_bytes(self.auth_header.as_bytes()).is_err() {
            return Err(InvalidSetting {
                key: "gateway.auth_header".to_owned(),
                reason: format!("`{}` is not a valid header name", self.auth_header),
            });
        }
        Ok(())
    }
}

/// `url` as an absolute `http://` or `https://` URL; an error says what to fix (a
/// `localhost:8080` without its scheme is the usual slip).
pub(crate) fn parse_http_url(url: &str) -> Result<http::Uri, String> {
    let parsed = url.parse::<http::Uri>().ok();
    match parsed {
        Some(uri) if uri.scheme().is_some() && uri.host().is_some() => Ok(uri),
        _ if !url.contains("://") => Err(format!(
            "`{url}` is not a URL: it lacks the scheme; write `http://{url}` (or https://)"
        )),
        _ => Err(format!("`{url}` is not a URL")),
    }
}

/// A URL payhook sends a token or a password to (the aggregator's, the operating API's):
/// `https://`, or `http://` on a loopback host only — a secret must never cross a network in
/// the clear.
pub(crate) fn check_remote_url(url: &str) -> Result<(), String> {
    let uri = parse_http_url(url)?;
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
