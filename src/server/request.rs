//! Reading a request: its id, its content type, its body within limits, its JSON.

use bytes::Bytes;
use http::{HeaderMap, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::problem::Problem;

/// Header carrying the request id, both ways.
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";
/// Longest caller-supplied request id that is adopted.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The caller's request id when it is short and plain, else a new UUID (version 4, its
/// random bits from the thread's id generator: no system call per request).
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| {
            (1..=MAX_REQUEST_ID_LEN).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map_or_else(
            || {
                uuid::Builder::from_random_bytes(crate::trace_context::random())
                    .into_uuid()
                    .to_string()
            },
            str::to_owned,
        )
}

/// `true` for `application/json` (or `application/*+json`), with no charset but UTF-8.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    json && parts.all(|param| match param.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    })
}

/// `Some(length)` when `Content-Length` is present and valid.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// How a request body must arrive: at most `limit` bytes, all within `timeout`, and (when
/// `min_rate` is not 0) at least `min_rate` bytes per second on average once `grace` has
/// passed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    pub(crate) limit: usize,
    pub(crate) timeout: Duration,
    pub(crate) min_rate: u64,
    pub(crate) grace: Duration,
}

/// The bytes of request bodies held while they arrive, all requests together, and how many
/// may be (`server.body_memory_limit`). Each connection and each HTTP/2 stream may hold a
/// body of up to `server.body_limit` for as long as it keeps the minimum rate: without a
/// bound over all of them, bodies sent quickly and then stalled would hold that much each.
#[derive(Debug)]
pub(crate) struct BodyMemory {
    limit: usize,
    held: AtomicUsize,
    /// The `Retry-After` of a request refused for want of it.
    retry_after: Duration,
}

impl BodyMemory {
    pub(crate) fn new(limit: usize, retry_after: Duration) -> Self {
        Self {
            limit,
            held: AtomicUsize::new(0),
            retry_after,
        }
    }

    /// Takes `bytes` more for `taken`, or refuses them when they would pass the limit.
    fn take(&self, taken: &mut Taken<'_>, bytes: usize) -> Result<(), Problem> {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            let more = held
                .checked_add(bytes)
                .filter(|more| *more <= self.limit)
                .ok_or(Problem::BodiesInFlight {
                    retry_after: self.retry_after,
                })?;
            match self
                .held
                .compare_exchange_weak(held, more, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => held = now,
            }
        }
        taken.bytes += bytes;
        Ok(())
    }

    /// The bytes held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// What one body holds of the [`BodyMemory`]; given back when it is read, refused or dropped.
struct Taken<'a> {
    memory: &'a BodyMemory,
    bytes: usize,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.memory.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Reads the whole body: refused before reading when `Content-Length` is over the limit, cut
/// off while streaming when the bytes exceed it, and answered 408 when it does not arrive in
/// time or arrives too slowly. While it arrives its bytes are held of `memory`; one that
/// would pass that is answered 503 (`Retry-After`).
pub(crate) async fn read_body<B>(
    headers: &HeaderMap,
    body: B,
    limits: BodyLimits,
    memory: &BodyMemory,
) -> Result<Bytes, Problem>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limit = limits.limit;
    if declared_length(headers).is_some_and(|length| length > limit as u64) {
        return Err(Problem::PayloadTooLarge { limit });
    }
    let start = Instant::now();
    let deadline = start + limits.timeout;
    let mut body = std::pin::pin!(Limited::new(body, limit));
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut received: u64 = 0;
    let mut taken = Taken { memory, bytes: 0 };
    loop {
        // The next bytes are due when the average would fall below the minimum rate.
        let due = match limits.min_rate {
            0 => deadline,
            rate => (start
                + limits
                    .grace
                    .max(Duration::from_millis(received.saturating_mul(1000) / rate)))
            .min(deadline),
        };
        let frame = match tokio::time::timeout_at(due.into(), body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) if due < deadline => {
                return Err(Problem::BodyTooSlow {
                    received,
                    min_rate: limits.min_rate,
                });
            }
            Err(_) => return Err(Problem::BodyTimeout),
        };
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    memory.take(&mut taken, data.len())?;
                    received += data.len() as u64;
                    chunks.push(data);
                }
            }
            Err(error) if error.is::<LengthLimitError>() => {
                return Err(Problem::PayloadTooLarge { limit });
            }
            Err(error) => {
                tracing::debug!(%error, "request body unreadable");
                return Err(Problem::BadRequest(
                    "request body could not be read".to_owned(),
                ));
            }
        }
    }
    Ok(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => chunks.concat().into(),
    })
}

/// Parses a JSON body into `T`; the error names the field, line and column.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(Problem::EmptyBody),
        // serde reads a struct from an array of its fields in order too (`[1001, "…", …]`);
        // the aggregator sends objects, and a positional body is not one of its messages.
        Some(b'{') => {}
        Some(_) => {
            return Err(Problem::BadRequest(
                "the request body must be a JSON object".to_owned(),
            ));
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match T::deserialize(&mut deserializer).and_then(|value| deserializer.end().map(|()| value)) {
        Ok(value) => Ok(value),
        // Read again, tracking the path, only to say where it went wrong: tracking it costs
        // a valid body a good part of its parsing.
        Err(error) => Err(explain::<T>(bytes).unwrap_or_else(|| described(None, &error))),
    }
}

/// Why `bytes` is not a `T`, naming the field, line and column; `None` if it is one.
fn explain<T: DeserializeOwned>(bytes: &[u8]) -> Option<Problem> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut deserializer) {
        Ok(_) => deserializer
            .end()
            .err()
            .map(|inner| described(None, &inner)),
        Err(error) => Some(described(Some(&error.path().to_string()), error.inner())),
    }
}

/// The answer to a body that is not the request: the field's path when known.
fn described(path: Option<&str>, inner: &serde_json::Error) -> Problem {
    Problem::BadRequest(match (inner.classify(), path) {
        (serde_json::error::Category::Data, Some(path)) if path != "." => {
            format!("invalid field `{path}`: {inner}")
        }
        (serde_json::error::Category::Data, _) => format!("invalid request: {inner}"),
        _ => format!("malformed JSON: {inner}"),
    })
}

/// Address of the peer, put in a request's extensions by [`serve`](super::serve). A server
/// of your own can insert it too, so that handlers see the caller's address in
/// [`RequestContext::peer`](crate::handler::RequestContext::peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with_content_type(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn json_content_types_are_recognised() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=\"UTF-8\"",
            "application/problem+json",
        ] {
            assert!(is_json(&with_content_type(ok)), "{ok}");
        }
        for refused in [
            "text/plain",
            "application/json; charset=latin1",
            "application/x-www-form-urlencoded",
            "json",
        ] {
            assert!(!is_json(&with_content_type(refused)), "{refused}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn sane_request_ids_are_adopted_and_others_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID_HEADER, HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&headers), "abc-123");
        headers.insert(REQUEST_ID_HEADER, HeaderValue::from_static("<script>"));
        assert_ne!(request_id(&headers), "<script>");
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only parsed")]
    struct Outer {
        inner: Inner,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only parsed")]
    struct Inner {
        count: u32,
    }

    #[test]
    fn parse_errors_name_the_field_and_position() {
        let Err(Problem::BadRequest(message)) =
            parse_json::<Outer>(br#"{"inner": {"count": "x"}}"#)
        else {
            panic!("expected a bad request");
        };
        assert!(
            message.contains("inner.count") && message.contains("line 1 column"),
            "{message}"
        );
        let Err(Problem::BadRequest(message)) = parse_json::<Outer>(b"{\"inner\": ") else {
            panic!()
        };
        assert!(message.starts_with("malformed JSON"), "{message}");
        let Err(Problem::BadRequest(message)) =
            parse_json::<Outer>(br#"{"inner": {"count": 1}} trailing"#)
        else {
            panic!()
        };
        assert!(message.contains("trailing"), "{message}");
        assert_eq!(
            parse_json::<Outer>(b"  \n").unwrap_err(),
            Problem::EmptyBody
        );
    }

    /// A body of `chunks`, one frame each.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
        }
    }

    #[tokio::test]
    async fn bodies_hold_their_bytes_of_the_memory_while_they_arrive_and_no_more() {
        let limits = BodyLimits {
            limit: 1024,
            timeout: Duration::from_secs(10),
            min_rate: 0,
            grace: Duration::from_secs(1),
        };
        let memory = BodyMemory::new(1000, Duration::from_secs(7));
        let body = || Chunks(vec![Bytes::from(vec![b' '; 400]); 2].into());
        let read = read_body(&HeaderMap::new(), body(), limits, &memory).await;
        assert_eq!(read.unwrap().len(), 800);
        assert_eq!(memory.held(), 0, "a body read gives its bytes back");
        // Another body holds 300 bytes meanwhile: 800 more do not fit.
        let mut other = Taken {
            memory: &memory,
            bytes: 0,
        };
        memory.take(&mut other, 300).unwrap();
        let refused = read_body(&HeaderMap::new(), body(), limits, &memory).await;
        assert_eq!(
            refused.unwrap_err(),
            Problem::BodiesInFlight {
                retry_after: Duration::from_secs(7)
            }
        );
        assert_eq!(memory.held(), 300, "a body refused gives its bytes back");
        drop(other);
        assert_eq!(memory.held(), 0);
    }
}
