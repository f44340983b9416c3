//! Every non-2xx answer of the server, and the one table that gives each its status code.
//!
//! | problem | status | message on the wire |
//! |---|---|---|
//! | [`Problem::NotFound`] | 404 | `no endpoint at this path` |
//! | [`Problem::MethodNotAllowed`] | 405 + `Allow` | `method not allowed; use POST` |
//! | [`Problem::UnsupportedMediaType`] | 415 | `content type must be application/json` |
//! | [`Problem::PayloadTooLarge`] | 413 | `request body exceeds N bytes` |
//! | [`Problem::EmptyBody`] | 400 | `request body is empty` |
//! | [`Problem::BadRequest`] | 400 | what is wrong, naming the field, line and column |
//! | [`Problem::BodyTimeout`] | 408 | `request body not received in time` |
//! | [`Problem::BodyTooSlow`] | 408 | `request body arrives too slowly: …` (below `server.min_body_rate` after its grace) |
//! | [`Problem::BodyShed`] | 408 | `request body still arriving after Ns while other requests needed the memory it held` (it gave its part of `server.body_memory_limit` up to another body) |
//! | [`Problem::BodiesInFlight`] | 503 + `Retry-After` | `too many request bodies arriving at once; retry later` (past `server.body_memory_limit`) |
//! | [`Problem::Unauthorized`] | 401 (+ `WWW-Authenticate` for Basic) | `missing signature: …`, `malformed signature: …`, `invalid signature: …`, `missing credentials`, `invalid credentials` |
//! | [`Problem::AddressRefused`] | 403 | `address not allowed` |
//! | [`Problem::Denied`] | 403 | the merchant's message |
//! | [`Problem::RetryLater`] | 503 + `Retry-After` | the merchant's reason |
//! | [`Problem::HandlerFailed`] on a validation | 500 | `internal error` |
//! | [`Problem::HandlerFailed`] on a callback | 503 + `Retry-After` | `temporarily unable to process the callback` |
//! | [`Problem::HandlerTimedOut`] | 503 (+ `Retry-After` on a callback) | `request not processed in time` |
//! | [`Problem::NotAwaitable`] | 500 | `validation cannot be postponed: this endpoint is not Awaitable` |
//! | [`Problem::NotReady`] | 503 | `shutting down` |
//! | [`Problem::StoreBroken`] (`/readyz` only) | 503 | `the store has failed: a write could not be made durable; restart the service` |
//! | [`Problem::InFlight`] | 503 + `Retry-After` | `another delivery of this nonce is being processed; retry later` |
//! | [`Problem::StoreFailed`] | 503 + `Retry-After` | `temporarily unable to record the result` |
//! | [`Problem::NonceReused`] | 403 | `nonce already used for a different payment` |
//! | [`Problem::ValidationIdReused`] (Awaitable mode) | 403 | `validationId already used for a different payment` |
//! | [`Problem::TooManyRepeats`] (Awaitable mode) | 409 | `this nonce's validation was asked about under more than 100 new validation ids; no result can be posted for validation N` |
//! | [`Problem::RepeatUnlinked`] (Awaitable mode) | 409 | `this nonce's validation was postponed, and no record holds its decision any more (past the store's retention); no result can be posted for validation N` |
//! | [`Problem::BeyondRetention`] | 409 | `callback older than the store's retention: …` (its transaction last changed before what the records can vouch for; the handler is not run) |
//! | [`Problem::Unknown`] (operating API only) | 404 | what is not there, e.g. `no postponed validation with id 42` |
//! | [`Problem::Conflict`] (operating API only) | 409 | what conflicts, e.g. a validation decided differently |
//! | [`Problem::HostRefused`] (operating API; `/metrics` from this machine) | 403 | `over plain HTTP the operating API is called by an address or localhost, not by the name N` (`/metrics` for it) |
//! | [`Problem::ForwardedByStranger`] (operating API, `/metrics`, and validation endpoints with `allow_ips`) | 403 | `the call was forwarded by a proxy that is not in server.trusted_proxies: …` |
//! | [`Problem::TooManyGuesses`] (operating API only) | 429 + `Retry-After` | `too many wrong tokens from this address; try again in Ns` (its credentials are refused, the right token included, until then) |
//! | [`Problem::InTheClear`] (operating API only) | 403 | `the operating API takes its token over HTTPS (through a trusted proxy that says so) or from this machine only; admin.allow_plain_http = true accepts it over plain HTTP` |
//!
//! Client errors carry a short message; internal errors a bare one. Details (handler errors,
//! panics) are logged where they happen and never reach the wire.
//!
//! A request whose head is not HTTP never becomes a [`Problem`]: hyper refuses it before
//! the service is called — 400 (a malformed request line or header, a `Content-Length` that
//! is no number) or 431 (more than 100 headers, or a head over 64 KiB, a long URI included)
//! — with an empty body, and closes the connection. hyper has no hook to answer
//! these otherwise; nothing of such a request is recorded.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use std::time::Duration;

use super::route::Endpoint;
use crate::model::ErrorBody;
use crate::postponed::record::MAX_REPEATS;

/// Longest message sent on the wire; parser messages that quote input are cut here.
const MAX_MESSAGE_CHARS: usize = 300;

/// A request that does not end in a 2xx answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    NotFound,
    MethodNotAllowed {
        allow: &'static str,
    },
    UnsupportedMediaType,
    PayloadTooLarge {
        limit: usize,
    },
    EmptyBody,
    BadRequest(String),
    BodyTimeout,
    /// The body arrived slower than `server.min_body_rate` after its grace period.
    BodyTooSlow {
        received: u64,
        min_rate: u64,
    },
    /// The body had been arriving for longer than `patience` (`server.min_body_rate_grace`)
    /// when another needed the body memory it held.
    BodyShed {
        patience: Duration,
    },
    /// The bodies arriving at once hold `server.body_memory_limit` bytes already.
    BodiesInFlight {
        retry_after: Duration,
    },
    Unauthorized {
        message: String,
        basic: bool,
    },
    AddressRefused,
    Denied(String),
    RetryLater {
        reason: String,
        retry_after: Duration,
    },
    HandlerFailed {
        endpoint: Endpoint,
        retry_after: Duration,
    },
    HandlerTimedOut {
        endpoint: Endpoint,
        retry_after: Duration,
    },
    NotAwaitable,
    NotReady,
    /// The store failed for good (see [`crate::store::Store::failed`]): `/readyz` says so,
    /// so that an orchestrator replaces the instance.
    StoreBroken,
    InFlight {
        retry_after: Duration,
    },
    StoreFailed {
        retry_after: Duration,
    },
    NonceReused,
    /// In Awaitable mode, a transaction validation whose `validationId` the store holds for
    /// another nonce: the aggregator never reuses an id, so one of the two is not the
    /// aggregator's, and answered "postponed", the aggregator would wait for a result that
    /// is the other payment's.
    ValidationIdReused,
    /// In Awaitable mode, a validation allowed or postponed before, asked about again under
    /// a new `validationId` after [`MAX_REPEATS`] others: nothing would post a result for
    /// the id, and answered 200, the aggregator would wait for one that never comes.
    TooManyRepeats {
        validation_id: i64,
    },
    /// In Awaitable mode, a validation postponed before, asked about again under a new
    /// `validationId` when no record holds its decision any more (the postponed validation
    /// went with its retention, or an older payhook kept no link to it): nothing would post
    /// a result for the id.
    RepeatUnlinked {
        validation_id: i64,
    },
    /// A callback whose transaction last changed (`updatedUtc`, else `createdUtc`) longer
    /// ago than the store keeps records: it may have been booked and its record purged, so
    /// its handler is not run (see `ExactlyOnce::deliver_claimed`).
    BeyondRetention {
        changed: chrono::DateTime<chrono::Utc>,
    },
    /// A resource of the operating API that does not exist: the message names it.
    Unknown(String),
    Conflict(String),
    /// A call of the operating API that came over plain HTTP from another machine: its
    /// token, or the inspector's session, crossed a network in the clear (see
    /// `admin.allow_plain_http`).
    InTheClear,
    /// A call of the operating API (or `/metrics`, or a validation endpoint with
    /// `allow_ips`) that carries a proxy's forwarding headers from a peer that is not a
    /// trusted proxy: a proxy left out of `server.trusted_proxies` makes every caller look
    /// like the proxy (on this machine, like this machine).
    ForwardedByStranger,
    /// A call of the operating API presenting a token from an address that presented too
    /// many wrong ones (see `server::guesses`): refused without comparing it.
    TooManyGuesses {
        retry_after: Duration,
    },
    /// A call of the operating API over plain HTTP, or of `/metrics` from this machine, that
    /// names the service by a name other than `localhost` (which a web page may have
    /// pointed at this machine), or by a `Host` that cannot be read.
    HostRefused {
        /// What was called: `the operating API`, `/metrics`.
        called: &'static str,
        /// The name it was called by.
        host: String,
    },
}

impl Problem {
    /// The status code: the table above.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::NotFound | Self::Unknown(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::EmptyBody | Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::BodyTimeout | Self::BodyTooSlow { .. } | Self::BodyShed { .. } => {
                StatusCode::REQUEST_TIMEOUT
            }
            Self::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Self::AddressRefused
            | Self::Denied(_)
            | Self::NonceReused
            | Self::ValidationIdReused
            | Self::InTheClear
            | Self::ForwardedByStranger
            | Self::HostRefused { .. } => StatusCode::FORBIDDEN,
            Self::InFlight { .. } | Self::StoreFailed { .. } | Self::BodiesInFlight { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::RetryLater { .. }
            | Self::HandlerTimedOut { .. }
            | Self::NotReady
            | Self::StoreBroken => StatusCode::SERVICE_UNAVAILABLE,
            Self::HandlerFailed {
                endpoint: Endpoint::Callback,
                ..
            } => StatusCode::SERVICE_UNAVAILABLE,
            Self::HandlerFailed { .. } | Self::NotAwaitable => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Conflict(_)
            | Self::BeyondRetention { .. }
            | Self::TooManyRepeats { .. }
            | Self::RepeatUnlinked { .. } => StatusCode::CONFLICT,
            Self::TooManyGuesses { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// Whether this problem can be the answer of `endpoint` (404 and the readiness probe's
    /// 503 belong to no endpoint).
    fn applies_to(&self, endpoint: Endpoint) -> bool {
        use Endpoint::{Callback, ProvidersValidation, TransactionValidation};
        match self {
            Self::NotFound
            | Self::NotReady
            | Self::StoreBroken
            | Self::Unknown(_)
            | Self::Conflict(_)
            | Self::InTheClear
            | Self::ForwardedByStranger
            | Self::TooManyGuesses { .. }
            | Self::HostRefused { .. } => false,
            Self::MethodNotAllowed { .. }
            | Self::UnsupportedMediaType
            | Self::PayloadTooLarge { .. }
            | Self::EmptyBody
            | Self::BadRequest(_)
            | Self::BodyTimeout
            | Self::BodyTooSlow { .. }
            | Self::BodyShed { .. }
            | Self::BodiesInFlight { .. }
            | Self::Unauthorized { .. } => true,
            Self::HandlerFailed { endpoint: e, .. } | Self::HandlerTimedOut { endpoint: e, .. } => {
                *e == endpoint
            }
            Self::AddressRefused => endpoint != Callback,
            Self::Denied(_)
            | Self::NotAwaitable
            | Self::NonceReused
            | Self::ValidationIdReused
            | Self::TooManyRepeats { .. }
            | Self::RepeatUnlinked { .. } => endpoint == TransactionValidation,
            Self::RetryLater { .. } | Self::BeyondRetention { .. } => endpoint == Callback,
            Self::InFlight { .. } | Self::StoreFailed { .. } => endpoint != ProvidersValidation,
        }
    }

    /// One problem of each kind that `endpoint` can answer.
    fn samples(endpoint: Endpoint) -> Vec<Self> {
        let retry_after = Duration::from_secs(1);
        [
            Self::NotFound,
            Self::MethodNotAllowed { allow: "POST" },
            Self::UnsupportedMediaType,
            Self::PayloadTooLarge { limit: 1 },
            Self::EmptyBody,
            Self::BadRequest(String::new()),
            Self::BodyTimeout,
            Self::BodyTooSlow {
                received: 0,
                min_rate: 1,
            },
            Self::BodyShed {
                patience: retry_after,
            },
            Self::BodiesInFlight { retry_after },
            Self::Unauthorized {
                message: String::new(),
                basic: false,
            },
            Self::AddressRefused,
            Self::Denied(String::new()),
            Self::RetryLater {
                reason: String::new(),
                retry_after,
            },
            Self::HandlerFailed {
                endpoint,
                retry_after,
            },
            Self::HandlerTimedOut {
                endpoint,
                retry_after,
            },
            Self::NotAwaitable,
            Self::NotReady,
            Self::InFlight { retry_after },
            Self::StoreFailed { retry_after },
            Self::NonceReused,
            Self::ValidationIdReused,
            Self::TooManyRepeats { validation_id: 1 },
            Self::RepeatUnlinked { validation_id: 1 },
            Self::BeyondRetention {
                changed: chrono::DateTime::UNIX_EPOCH,
            },
        ]
        .into_iter()
        .filter(|problem| problem.applies_to(endpoint))
        .collect()
    }

    /// The message of the `{"message": ...}` body.
    pub(crate) fn message(&self) -> String {
        let message = match self {
            Self::NotFound => "no endpoint at this path".to_owned(),
            Self::MethodNotAllowed { allow } => format!("method not allowed; use {allow}"),
            Self::UnsupportedMediaType => "content type must be application/json".to_owned(),
            Self::PayloadTooLarge { limit } => format!("request body exceeds {limit} bytes"),
            Self::EmptyBody => "request body is empty".to_owned(),
            Self::BadRequest(message)
            | Self::Conflict(message)
            | Self::Unknown(message)
            | Self::Denied(message)
            | Self::Unauthorized { message, .. } => message.clone(),
            Self::AddressRefused => "address not allowed".to_owned(),
            Self::HostRefused { called, host } => format!(
                "over plain HTTP {called} is called by an address or localhost, not by the name {}",
                crate::Logged(host)
            ),
            Self::ForwardedByStranger => "the call was forwarded by a proxy that is not in \
                server.trusted_proxies: every caller it forwards would look like the proxy's \
                address; list the proxy there, or call the service directly"
                .to_owned(),
            Self::TooManyGuesses { retry_after } => format!(
                "too many wrong tokens from this address; try again in {}s",
                seconds_up(*retry_after)
            ),
            Self::InTheClear => "the operating API takes its token over HTTPS (through a trusted \
                proxy that says so) or from this machine only; admin.allow_plain_http = true \
                accepts it over plain HTTP"
                .to_owned(),
            Self::BodyTimeout => "request body not received in time".to_owned(),
            Self::BodyTooSlow { received, min_rate } => format!(
                "request body arrives too slowly: {received} bytes so far, below {min_rate} bytes/s"
            ),
            Self::BodyShed { patience } => format!(
                "request body still arriving after {}s while other requests needed the memory it held",
                patience.as_secs_f64()
            ),
            Self::BodiesInFlight { .. } => {
                "too many request bodies arriving at once; retry later".to_owned()
            }
            Self::RetryLater { reason, .. } => reason.clone(),
            Self::HandlerFailed {
                endpoint: Endpoint::Callback,
                ..
            } => "temporarily unable to process the callback".to_owned(),
            Self::HandlerFailed { .. } => "internal error".to_owned(),
            Self::HandlerTimedOut { .. } => "request not processed in time".to_owned(),
            Self::NotAwaitable => {
                "validation cannot be postponed: this endpoint is not Awaitable".to_owned()
            }
            Self::NotReady => "shutting down".to_owned(),
            Self::StoreBroken => {
                "the store has failed: a write could not be made durable; restart the service"
                    .to_owned()
            }
            Self::InFlight { .. } => {
                "another delivery of this nonce is being processed; retry later".to_owned()
            }
            Self::StoreFailed { .. } => "temporarily unable to record the result".to_owned(),
            Self::NonceReused => "nonce already used for a different payment".to_owned(),
            Self::ValidationIdReused => {
                "validationId already used for a different payment".to_owned()
            }
            Self::TooManyRepeats { validation_id } => format!(
                "this nonce's validation was asked about under more than {MAX_REPEATS} new \
                 validation ids; no result can be posted for validation {validation_id}"
            ),
            Self::RepeatUnlinked { validation_id } => format!(
                "this nonce's validation was postponed, and no record holds its decision any \
                 more (past the store's retention); no result can be posted for validation \
                 {validation_id}"
            ),
            Self::BeyondRetention { changed } => format!(
                "callback older than the store's retention: its transaction last changed at \
                 {}, so payhook cannot tell whether it was booked; not processed (check the \
                 ledger, book it by hand if needed)",
                changed.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        };
        crate::logged::cut_chars(&message, MAX_MESSAGE_CHARS).into_owned()
    }

    /// When the caller should try again, for the answers that invite a retry.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RetryLater { retry_after, .. }
            | Self::InFlight { retry_after }
            | Self::StoreFailed { retry_after }
            | Self::BodiesInFlight { retry_after }
            | Self::TooManyGuesses { retry_after } => Some(*retry_after),
            Self::HandlerFailed {
                endpoint: Endpoint::Callback,
                retry_after,
            }
            | Self::HandlerTimedOut {
                endpoint: Endpoint::Callback,
                retry_after,
            } => Some(*retry_after),
            _ => None,
        }
    }

    /// The whole HTTP answer.
    pub(crate) fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = json_response(self.status(), &ErrorBody::new(self.message()));
        let headers = response.headers_mut();
        if let Self::MethodNotAllowed { allow } = self {
            headers.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if let Self::Unauthorized { basic: true, .. } = self {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"payhook\""),
            );
        }
        self.set_retry_after(headers);
        response
    }

    /// Sets `Retry-After` in `headers` for the answers that invite a retry (whole seconds,
    /// at least one).
    pub(crate) fn set_retry_after(&self, headers: &mut http::HeaderMap) {
        if let Some(after) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds_up(after)));
        }
    }
}

/// `wait` in whole seconds, rounded up, at least one: a caller that waits as long is not
/// early.
fn seconds_up(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// A JSON answer with `status` and `body`.
pub(crate) fn json_response(
    status: StatusCode,
    body: &impl serde::Serialize,
) -> Response<Full<Bytes>> {
    // Serializing our own response types cannot fail; an empty object is the safe fallback.
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The status codes each endpoint can answer, 200 included, by endpoint name
/// (`providers_validation`, `transaction_validation`, `callback`). The OpenAPI document
/// (`payhook openapi`) lists the same; a test holds them together.
pub fn status_codes() -> Vec<(&'static str, std::collections::BTreeSet<u16>)> {
    [
        Endpoint::ProvidersValidation,
        Endpoint::TransactionValidation,
        Endpoint::Callback,
    ]
    .into_iter()
    .map(|endpoint| {
        let mut codes: std::collections::BTreeSet<u16> = Problem::samples(endpoint)
            .iter()
            .map(|p| p.status().as_u16())
            .collect();
        codes.insert(200);
        (endpoint.name(), codes)
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_failures_invite_a_retry_and_validation_failures_do_not() {
        let retry_after = Duration::from_secs(30);
        let callback = Problem::HandlerFailed {
            endpoint: Endpoint::Callback,
            retry_after,
        }
        .into_response();
        assert_eq!(callback.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(callback.headers()[header::RETRY_AFTER], "30");
        let validation = Problem::HandlerFailed {
            endpoint: Endpoint::TransactionValidation,
            retry_after,
        }
        .into_response();
        assert_eq!(validation.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(validation.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn long_messages_are_cut() {
        let message = Problem::BadRequest("x".repeat(10_000)).message();
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS + 1);
    }
}
