//! How the gateway client reaches the aggregator: TLS on rustls (ring), trusting the web's
//! roots plus the private CA of `gateway.ca_file`, presenting the client certificate of
//! `gateway.client_cert_file` when the aggregator asks for one (mutual TLS), and going
//! through an HTTP proxy — `gateway.proxy`, or `HTTPS_PROXY` / `ALL_PROXY` from the
//! environment — for `https://` destinations not excluded by `NO_PROXY` (`gateway.no_proxy`).
//! A proxied connection is a `CONNECT` tunnel: the proxy sees the host and port, never the
//! traffic. `http://` destinations, which payhook allows on loopback only, always go direct.

use std::error::Error as StdError;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;

use super::GatewayConfig;
use crate::Secret;

/// An HTTP/1.1 client for `https://` and (loopback) `http://`.
pub(crate) type HttpClient = Client<HttpsConnector<Route>, Full<Bytes>>;

/// Why the transport could not be set up: the file or setting, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {reason}")]
pub(crate) struct TransportError {
    setting: String,
    reason: String,
}

impl TransportError {
    fn new(setting: &str, reason: impl std::fmt::Display) -> Self {
        Self {
            setting: setting.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// A client that talks straight to its destinations, trusting the web's roots: for the
/// simulator and the operating API's client, which talk to services on loopback.
pub(crate) fn direct_client() -> Result<HttpClient, TransportError> {
    let tls = tls_config(None, None)?;
    Ok(client(tls, Matcher::builder().build()))
}

/// The client of `[gateway]` — its CA, client certificate and proxy — with the SHA-256
/// digest of its TLS files' paths and contents ([`TlsFile`]), each file read once: whether
/// files read again changed, a file replaced under its path included (a certificate
/// renewed).
pub(crate) fn gateway_client(
    config: &GatewayConfig,
) -> Result<(HttpClient, [u8; 32]), TransportError> {
    let ca = config
        .ca_file
        .as_deref()
        .map(|path| TlsFile::read(path, "gateway.ca_file"))
        .transpose()?;
    let identity = match (&config.client_cert_file, &config.client_key_file) {
        (Some(cert), Some(key)) => {
            crate::secret::warn_if_readable_by_others(key, "the gateway's client key");
            Some((
                TlsFile::read(cert, "gateway.client_cert_file")?,
                TlsFile::read(key, "gateway.client_key_file")?,
            ))
        }
        (None, None) => None,
        _ => {
            return Err(TransportError::new(
                "gateway.client_cert_file",
                "give both client_cert_file and client_key_file, or neither",
            ));
        }
    };
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    for file in [
        ca.as_ref(),
        identity.as_ref().map(|(cert, _)| cert),
        identity.as_ref().map(|(_, key)| key),
    ] {
        match file {
            Some(file) => file.digest_into(&mut digest),
            None => digest.update(&[0]),
        }
    }
    let mut files = [0; 32];
    files.copy_from_slice(digest.finish().as_ref());
    let tls = tls_config(
        ca.as_ref(),
        identity.as_ref().map(|(cert, key)| (cert, key)),
    )?;
    Ok((client(tls, proxy_matcher(config)?), files))
}

/// A TLS file of `[gateway]` as read, with its path for the errors.
struct TlsFile<'a> {
    path: &'a Path,
    setting: &'static str,
    bytes: Vec<u8>,
}

impl<'a> TlsFile<'a> {
    fn read(path: &'a Path, setting: &'static str) -> Result<Self, TransportError> {
        // Whoever replaced the CA could read and forge the aggregator's answers; the client
        // certificate and key, present themselves as the merchant's.
        crate::secret::check_trusted_file(path, setting)
            .map_err(|why| TransportError::new(setting, format!("{} {why}", path.display())))?;
        let bytes = std::fs::read(path)
            .map_err(|e| TransportError::new(setting, format!("{}: {e}", path.display())))?;
        Ok(Self {
            path,
            setting,
            bytes,
        })
    }

    /// Adds the file to `digest`: a tag, then its path and its contents, each after its
    /// length.
    fn digest_into(&self, digest: &mut ring::digest::Context) {
        digest.update(&[1]);
        for part in [self.path.as_os_str().as_encoded_bytes(), &self.bytes] {
            digest.update(&(part.len() as u64).to_be_bytes());
            digest.update(part);
        }
    }

    /// Every PEM certificate in the file; at least one.
    fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, TransportError> {
        let certificates = CertificateDer::pem_slice_iter(&self.bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error(e))?;
        if certificates.is_empty() {
            return Err(self.error("no PEM certificate in it"));
        }
        Ok(certificates)
    }

    fn error(&self, reason: impl std::fmt::Display) -> TransportError {
        TransportError::new(self.setting, format!("{}: {reason}", self.path.display()))
    }
}

fn client(tls: rustls::ClientConfig, proxy: Matcher) -> HttpClient {
    let mut direct = HttpConnector::new();
    direct.enforce_http(false);
    let route = Route {
        direct,
        proxy: Arc::new(proxy),
    };
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(route);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https)
}

/// Which proxy `https://` calls go through: `gateway.proxy` when set, else the
/// environment's `HTTPS_PROXY` (or `ALL_PROXY`), each an HTTP CONNECT proxy; the hosts
/// reached without it are `gateway.no_proxy` when set, else the environment's `NO_PROXY`
/// (either, whichever of the two named the proxy).
fn proxy_matcher(config: &GatewayConfig) -> Result<Matcher, TransportError> {
    proxy_matcher_in(config, |name| std::env::var(name).ok())
}

/// [`proxy_matcher`] with the environment's variables read by `env`.
fn proxy_matcher_in(
    config: &GatewayConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Matcher, TransportError> {
    // As curl reads them: the upper-case name first, then the lower-case one.
    let variable = |upper: &str| env(upper).or_else(|| env(&upper.to_ascii_lowercase()));
    let no_proxy = config
        .no_proxy
        .clone()
        .or_else(|| variable("NO_PROXY"))
        .unwrap_or_default();
    let Some(proxy) = config
        .proxy
        .as_ref()
        .map(Secret::expose)
        .filter(|p| !p.trim().is_empty())
    else {
        // Under CGI, HTTP_PROXY may come from a request's `Proxy:` header (httpoxy): no
        // proxy of the environment is believed there, as hyper-util's own reading does.
        if env("REQUEST_METHOD").is_some() {
            return Ok(Matcher::builder().build());
        }
        let matcher = Matcher::builder()
            .http(variable("HTTP_PROXY").unwrap_or_default())
            .https(variable("HTTPS_PROXY").unwrap_or_default())
            .all(variable("ALL_PROXY").unwrap_or_default())
            .no(no_proxy)
            .build();
        // Which variable named the proxy of `https://` calls, as the matcher reads them.
        let named = if variable("HTTPS_PROXY").is_some_and(|p| !p.trim().is_empty()) {
            "HTTPS_PROXY"
        } else {
            "ALL_PROXY"
        };
        check_connect_proxies(config, &matcher, named)?;
        return Ok(matcher);
    };
    let uri: Uri = proxy.parse().map_err(|_| {
        TransportError::new(
            "gateway.proxy",
            "is not a URL; give the proxy as http://host:port (the value is not shown: it may hold credentials)",
        )
    })?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(not_a_connect_proxy("gateway.proxy"));
    }
    Ok(Matcher::builder().https(proxy).no(no_proxy).build())
}

/// Refuses a proxy of the environment (`named`: `HTTPS_PROXY`, `ALL_PROXY`) that the
/// aggregator's addresses would go through and that is not an HTTP CONNECT proxy —
/// `https://`, `socks5://` — the only kind the gateway's calls go through: each call would
/// otherwise fail. An address `NO_PROXY` exempts is reached directly, whatever the proxy.
fn check_connect_proxies(
    config: &GatewayConfig,
    matcher: &Matcher,
    named: &str,
) -> Result<(), TransportError> {
    let addresses = [&config.auth_url, &config.gateway_url];
    for address in addresses.into_iter().flatten() {
        let Ok(uri) = address.parse::<Uri>() else {
            continue;
        };
        if let Some(proxy) = matcher.intercept(&uri)
            && proxy.uri().scheme_str() != Some("http")
        {
            return Err(not_a_connect_proxy(named));
        }
    }
    Ok(())
}

/// A proxy `setting` names that the gateway's calls cannot go through. The URL may carry the
/// proxy's credentials (`user:password@`): the error never quotes it.
fn not_a_connect_proxy(setting: &str) -> TransportError {
    TransportError::new(
        setting,
        "give the proxy as http://host:port, a CONNECT proxy (the value is not shown: it may hold credentials)",
    )
}

/// rustls with the web's roots, the certificates of `ca_file`, and a client certificate.
fn tls_config(
    ca_file: Option<&TlsFile<'_>>,
    identity: Option<(&TlsFile<'_>, &TlsFile<'_>)>,
) -> Result<rustls::ClientConfig, TransportError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(file) = ca_file {
        let (added, ignored) = roots.add_parsable_certificates(file.certificates()?);
        if added == 0 || ignored > 0 {
            return Err(file.error(format!(
                "{added} CA certificate(s) read, {ignored} unusable"
            )));
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TransportError::new("TLS", e))?
    .with_root_certificates(roots);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key_file)) => {
            let chain = cert.certificates()?;
            let key = PrivateKeyDer::from_pem_slice(&key_file.bytes)
                .map_err(|e| key_file.error(format!("no PEM private key read ({e})")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TransportError::new("gateway.client_cert_file", e))
        }
    }
}

/// Opens the TCP connection under the TLS layer: direct, or tunnelled through the proxy that
/// the matcher picks for an `https://` destination.
#[derive(Clone)]
pub(crate) struct Route {
    direct: HttpConnector,
    proxy: Arc<Matcher>,
}

type Connecting = Pin<
    Box<dyn Future<Output = Result<TokioIo<TcpStream>, Box<dyn StdError + Send + Sync>>> + Send>,
>;

impl tower_service::Service<Uri> for Route {
    type Response = TokioIo<TcpStream>;
    type Error = Box<dyn StdError + Send + Sync>;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // A new connection is opened for each call; there is nothing to wait for.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        let mut direct = self.direct.clone();
        let intercept = match destination.scheme_str() {
            Some("https") => self.proxy.intercept(&destination),
            _ => None,
        };
        match intercept {
            Some(intercept) => {
                let mut tunnel = Tunnel::new(intercept.uri().clone(), direct);
                if let Some(auth) = intercept.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move { Ok(tunnel.call(destination).await?) })
            }
            None => Box::pin(async move { Ok(direct.call(destination).await?) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxied(matcher: &Matcher, url: &str) -> bool {
        matcher.intercept(&url.parse().unwrap()).is_some()
    }

    fn environment(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn a_proxy_of_the_environment_that_is_no_connect_proxy_is_refused() {
        let config = GatewayConfig {
            auth_url: Some("https://auth.aggregator.example".into()),
            gateway_url: Some("https://aggregator.example".into()),
            ..GatewayConfig::default()
        };
        for (name, proxy) in [
            ("HTTPS_PROXY", "https://user:pw-9f2@egress:3128"),
            ("HTTPS_PROXY", "socks5://egress:1080"),
            ("ALL_PROXY", "socks5h://egress:1080"),
        ] {
            let Err(error) = proxy_matcher_in(&config, environment(&[(name, proxy)])) else {
                panic!("{name}={proxy} taken");
            };
            let text = error.to_string();
            assert!(text.contains(name) && !text.contains("pw-9f2"), "{text}");
        }
        for pairs in [
            &[("HTTPS_PROXY", "http://egress:3128")][..],
            &[("https_proxy", "egress:3128")],
            &[("ALL_PROXY", "http://egress:3128")],
            &[("HTTP_PROXY", "socks5://only-for-http:1080")],
            // The one HTTPS_PROXY names is used, not ALL_PROXY's.
            &[
                ("HTTPS_PROXY", "http://egress:3128"),
                ("ALL_PROXY", "socks5://egress:1080"),
            ],
            // The aggregator is reached directly: its proxy is no concern.
            &[
                ("ALL_PROXY", "socks5://egress:1080"),
                ("NO_PROXY", "aggregator.example"),
            ],
        ] {
            let matcher = proxy_matcher_in(&config, environment(pairs));
            assert!(matcher.is_ok(), "{pairs:?}");
        }
    }

    #[test]
    fn gateway_no_proxy_applies_to_the_proxy_of_the_environment() {
        let config = GatewayConfig {
            no_proxy: Some("aggregator.internal".into()),
            ..GatewayConfig::default()
        };
        let env = environment(&[("HTTPS_PROXY", "http://egress:3128"), ("NO_PROXY", "")]);
        let matcher = proxy_matcher_in(&config, env).unwrap();
        assert!(!proxied(
            &matcher,
            "https://aggregator.internal/api/v1/login"
        ));
        assert!(proxied(&matcher, "https://aggregator.example/api/v1/login"));
    }

    #[test]
    fn without_gateway_no_proxy_the_environment_says_which_hosts_go_direct() {
        let config = GatewayConfig {
            proxy: Some("http://egress:3128".into()),
            ..GatewayConfig::default()
        };
        let env = environment(&[("no_proxy", "aggregator.internal")]);
        let matcher = proxy_matcher_in(&config, env).unwrap();
        assert!(!proxied(&matcher, "https://aggregator.internal/"));
        assert!(proxied(&matcher, "https://aggregator.example/"));
        // gateway.no_proxy, when set, is the list (the environment's is not added to it).
        let config = GatewayConfig {
            no_proxy: Some("other.internal".into()),
            ..config
        };
        let env = environment(&[("NO_PROXY", "aggregator.internal")]);
        let matcher = proxy_matcher_in(&config, env).unwrap();
        assert!(proxied(&matcher, "https://aggregator.internal/"));
        assert!(!proxied(&matcher, "https://other.internal/"));
    }

    #[test]
    fn the_environment_proxy_is_used_unless_under_cgi() {
        let config = GatewayConfig::default();
        let env = environment(&[("ALL_PROXY", "http://egress:3128")]);
        assert!(proxied(
            &proxy_matcher_in(&config, env).unwrap(),
            "https://aggregator.example/"
        ));
        let cgi = environment(&[
            ("HTTPS_PROXY", "http://evil:3128"),
            ("REQUEST_METHOD", "GET"),
        ]);
        assert!(!proxied(
            &proxy_matcher_in(&config, cgi).unwrap(),
            "https://aggregator.example/"
        ));
    }
}
