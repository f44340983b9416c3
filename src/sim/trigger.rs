//! Sending the aggregator's requests to a merchant's endpoints, signed as the aggregator
//! signs them.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use std::time::{Duration, Instant};

use super::SimError;
use crate::config::SignatureConfig;
use crate::gateway::{HttpClient, direct_client};
use crate::signature::{Encoding, SigningKey};

/// Largest answer read from a merchant.
const MAX_ANSWER: usize = 1024 * 1024;

/// Signs bodies as the aggregator does: a signature of the exact bytes in a header.
pub struct Signer {
    key: SigningKey,
    header: HeaderName,
    encoding: Encoding,
    prefix: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("algorithm", &self.key.algorithm())
            .field("header", &self.header)
            .field("encoding", &self.encoding)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// Signs with `key` in the header, encoding and prefix of a merchant's `[signature]`
    /// section (the merchant verifies with the public half).
    ///
    /// # Errors
    ///
    /// [`SimError::Request`] when the header name is invalid.
    pub fn new(key: SigningKey, config: &SignatureConfig) -> Result<Self, SimError> {
        let header = HeaderName::from_bytes(config.header.trim().as_bytes())
            .map_err(|_| SimError::request(format!("`{}` is not a header name", config.header)))?;
        Ok(Self {
            key,
            header,
            encoding: config.encoding,
            prefix: config.prefix.clone(),
        })
    }

    /// The same header, encoding and prefix with another key.
    #[must_use]
    pub fn with_key(&self, key: SigningKey) -> Self {
        Self {
            key,
            header: self.header.clone(),
            encoding: self.encoding,
            prefix: self.prefix.clone(),
        }
    }

    /// The algorithm it signs with.
    pub fn algorithm(&self) -> crate::signature::Algorithm {
        self.key.algorithm()
    }

    /// The header this signer writes.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The header value for `body`.
    ///
    /// # Errors
    ///
    /// [`SimError::Request`] if signing fails.
    pub fn value(&self, body: &[u8]) -> Result<String, SimError> {
        self.key
            .header_value(body, self.encoding, Some(&self.prefix))
            .map_err(|e| SimError::request("cannot sign the body").because(e))
    }
}

/// One request sent and what came back.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The request as sent: request line, headers, blank line, body.
    pub request: String,
    /// The answer's status; `None` when no answer came (see `error`).
    pub status: Option<u16>,
    /// Time from sending to the whole answer.
    pub latency: Duration,
    /// The answer's body (lossy UTF-8).
    pub body: String,
    /// Why no answer came.
    pub error: Option<String>,
}

impl Exchange {
    /// `true` for a 2xx answer.
    pub fn is_success(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }

    /// The answer's `message`, when it has one.
    pub fn message(&self) -> Option<String> {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()?
            .get("message")?
            .as_str()
            .map(str::to_owned)
    }
}

/// Sends requests to a merchant's endpoints.
pub struct Trigger {
    http: HttpClient,
    signer: Option<Signer>,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
}

impl std::fmt::Debug for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trigger")
            .field("signer", &self.signer)
            .finish_non_exhaustive()
    }
}

impl Trigger {
    /// A trigger that signs with `signer` (unsigned when `None`) and waits at most 30 s for
    /// each answer.
    ///
    /// # Errors
    ///
    /// [`SimError::Setup`] when the HTTP client cannot be built.
    pub fn new(signer: Option<Signer>) -> Result<Self, SimError> {
        Ok(Self {
            http: direct_client()
                .map_err(|e| SimError::setup("cannot build the HTTP client").because(e))?,
            signer,
            headers: Vec::new(),
            timeout: Duration::from_secs(30),
        })
    }

    /// Adds a header to every request (e.g. a shared secret the validation endpoints want).
    ///
    /// # Errors
    ///
    /// [`SimError::Request`] when it is not `Name: value`.
    ///
    /// The error never quotes the value: it is often a secret, and this runs in CI logs.
    pub fn with_header(mut self, line: &str) -> Result<Self, SimError> {
        let Some((name, value)) = line.split_once(':') else {
            return Err(SimError::request(
                "a header given is not `Name: value` (it has no `:`; its text is not shown, \
                 as it may hold a secret)",
            ));
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
            SimError::request("a header given has no valid name before its `:` (not shown)")
        })?;
        let value = HeaderValue::from_str(value.trim()).map_err(|_| {
            SimError::request(format!(
                "the value of header `{name}` is not a valid header value (a line break or \
                 another control character in it?); the value is not shown"
            ))
        })?;
        self.headers.push((name, value));
        Ok(self)
    }

    /// The headers added to every request ([`Trigger::with_header`]).
    pub(crate) fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// Bounds each exchange.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The signer, if any.
    pub fn signer(&self) -> Option<&Signer> {
        self.signer.as_ref()
    }

    /// Signs `body` (when a signer is set) and POSTs it to `url`.
    ///
    /// # Errors
    ///
    /// [`SimError::Request`] when the URL or a header is invalid or signing fails; a failed
    /// exchange is not an error but an [`Exchange`] with `error` set.
    pub async fn send(&self, url: &str, body: &[u8]) -> Result<Exchange, SimError> {
        let signature = match &self.signer {
            Some(signer) => Some((signer.header.clone(), signer.value(body)?)),
            None => None,
        };
        self.send_with(url, body, signature).await
    }

    /// POSTs `body` to `url` with `signature` as given (`None`: no signature header) — for
    /// sending tampered requests on purpose.
    ///
    /// # Errors
    ///
    /// As [`Trigger::send`].
    pub async fn send_with(
        &self,
        url: &str,
        body: &[u8],
        signature: Option<(HeaderName, String)>,
    ) -> Result<Exchange, SimError> {
        let uri = crate::gateway::parse_http_url(url).map_err(SimError::request)?;
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        if let Some((name, value)) = signature {
            let value = HeaderValue::from_str(&value)
                .map_err(|_| SimError::request("signature is not a header value"))?;
            builder = builder.header(name, value);
        }
        let request = builder
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| SimError::request("cannot build the request").because(e))?;
        let shown = describe(&request, body);
        let started = Instant::now();
        let call = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| crate::report::InLine(&e).to_string())?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        let outcome = tokio::time::timeout(self.timeout, call).await;
        let latency = started.elapsed();
        let (status, body, error) = match outcome {
            Ok(Ok((status, body))) => (
                Some(status),
                String::from_utf8_lossy(&body).into_owned(),
                None,
            ),
            Ok(Err(error)) => (None, String::new(), Some(error)),
            Err(_) => (
                None,
                String::new(),
                Some(format!("no answer within {:?}", self.timeout)),
            ),
        };
        Ok(Exchange {
            request: shown,
            status,
            latency,
            body,
            error,
        })
    }
}

/// A request as text, for printing: credentials (`Authorization`, a shared-secret header
/// given with `-H`) are redacted, as in a handler's `RequestContext`.
fn describe(request: &Request<Full<Bytes>>, body: &[u8]) -> String {
    let mut text = format!("{} {}\n", request.method(), request.uri());
    for (name, value) in request.headers() {
        let value = crate::handler::RequestContext::shown_value(name, value);
        text.push_str(&format!("{name}: {value}\n"));
    }
    text.push('\n');
    text.push_str(&String::from_utf8_lossy(body));
    text
}
