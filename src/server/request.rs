//! Reading a request: its id, its content type, its body within limits, its JSON.

use bytes::Bytes;
use http::{HeaderMap, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
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
///
/// One client (an address; an IPv6 client's /64; behind a trusted proxy, the forwarded
/// client) may hold a quarter of it at most ([`CLIENT_SHARE`]), and at least one body of the
/// limit: without that, one client's connections held back after sending most of their
/// bodies took all of it, and every other request was answered 503 for as long as they
/// held on. The aggregator's callbacks, a few KiB each, are far from a quarter.
#[derive(Debug)]
pub(crate) struct BodyMemory {
    limit: usize,
    held: AtomicUsize,
    /// The most one client may hold.
    per_client: usize,
    /// What each client holds (only clients that hold something).
    clients: Mutex<HashMap<Option<IpAddr>, usize>>,
    /// The `Retry-After` of a request refused for want of it.
    retry_after: Duration,
}

/// The part of the body memory one client may hold at most (see [`BodyMemory`]).
const CLIENT_SHARE: usize = 4;

impl BodyMemory {
    /// A memory of `limit` bytes; one client may hold a quarter of it, and at least
    /// `body_limit`.
    pub(crate) fn new(limit: usize, body_limit: usize, retry_after: Duration) -> Self {
        Self {
            limit,
            held: AtomicUsize::new(0),
            per_client: (limit / CLIENT_SHARE).max(body_limit).min(limit),
            clients: Mutex::default(),
            retry_after,
        }
    }

    /// Takes `bytes` more for `taken`, or refuses them when they would pass the limit or
    /// the client's share.
    fn take(&self, taken: &mut Taken<'_>, bytes: usize) -> Result<(), Problem> {
        let refused = Problem::BodiesInFlight {
            retry_after: self.retry_after,
        };
        {
            let mut clients = self.clients();
            let held = clients.get(&taken.client).copied().unwrap_or(0);
            match held
                .checked_add(bytes)
                .filter(|more| *more <= self.per_client)
            {
                Some(more) => clients.insert(taken.client, more),
                None => return Err(refused),
            };
        }
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            let Some(more) = held.checked_add(bytes).filter(|more| *more <= self.limit) else {
                self.give_back_of_client(taken.client, bytes);
                return Err(refused);
            };
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

    /// Gives `bytes` back: of the memory and of `client`'s share.
    fn give_back(&self, client: Option<IpAddr>, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        self.give_back_of_client(client, bytes);
    }

    fn give_back_of_client(&self, client: Option<IpAddr>, bytes: usize) {
        let mut clients = self.clients();
        if let Some(held) = clients.get_mut(&client) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                clients.remove(&client);
            }
        }
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<Option<IpAddr>, usize>> {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `total` bytes for `taken` from now on: takes what it holds fewer (refused past
    /// the limit), gives back what it holds more.
    fn hold(&self, taken: &mut Taken<'_>, total: usize) -> Result<(), Problem> {
        if total == taken.bytes {
            // Most frames: the buffer did not grow, and the clients' map is left unlocked.
            Ok(())
        } else if total > taken.bytes {
            self.take(taken, total - taken.bytes)
        } else {
            self.give_back(taken.client, taken.bytes - total);
            taken.bytes = total;
            Ok(())
        }
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
    /// The client whose share it is.
    client: Option<IpAddr>,
    bytes: usize,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.memory.give_back(self.client, self.bytes);
        }
    }
}

/// Reads the whole body: refused before reading when `Content-Length` is over the limit, cut
/// off while streaming when the bytes exceed it, and answered 408 when it does not arrive in
/// time or arrives too slowly. While it arrives its bytes are held of `memory`, as
/// `client`'s; one that would pass that or the client's share is answered 503
/// (`Retry-After`).
pub(crate) async fn read_body<B>(
    headers: &HeaderMap,
    body: B,
    limits: BodyLimits,
    (memory, client): (&BodyMemory, Option<IpAddr>),
) -> Result<Bytes, Problem>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limit = limits.limit;
    let declared = declared_length(headers);
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(Problem::PayloadTooLarge { limit });
    }
    let start = Instant::now();
    let deadline = start + limits.timeout;
    let mut body = std::pin::pin!(Limited::new(body, limit));
    let mut arriving = Arriving {
        first: Bytes::new(),
        joined: Vec::new(),
        // At most the limit: a longer declared body was refused above.
        expected: declared.and_then(|length| usize::try_from(length).ok()),
        taken: Taken {
            memory,
            client,
            bytes: 0,
        },
        limit,
    };
    let mut received: u64 = 0;
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
                    received += data.len() as u64;
                    arriving.push(data)?;
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
    Ok(arriving.into_bytes())
}

/// A body's bytes as they arrive. The first frame is kept as it came: a body that arrives in
/// one frame is not copied. From the second on, the frames are copied into one buffer and
/// dropped: a frame is a slice of the connection's read buffer, and a body kept as many small
/// frames — one byte per TCP segment, at the minimum rate — would keep a buffer of some KiB
/// alive for each byte (hyper starts a new one when the last is still shared). The memory
/// holds what this keeps: the first frame's bytes, then the buffer's capacity, which grows
/// by doubling up to the body's declared length (`Content-Length`), or else the body limit.
struct Arriving<'a> {
    first: Bytes,
    joined: Vec<u8>,
    /// The body's declared length, when it has one.
    expected: Option<usize>,
    taken: Taken<'a>,
    limit: usize,
}

impl Arriving<'_> {
    fn push(&mut self, data: Bytes) -> Result<(), Problem> {
        let memory = self.taken.memory;
        if self.first.is_empty() && self.joined.is_empty() {
            memory.hold(&mut self.taken, data.len())?;
            self.first = data;
            return Ok(());
        }
        let needed = self.first.len() + self.joined.len() + data.len();
        if needed > self.joined.capacity() {
            let ceiling = self.expected.unwrap_or(self.limit).max(needed);
            let capacity = (2 * self.joined.capacity()).clamp(needed, ceiling);
            // The first frame's bytes are part of it: they are copied in and dropped at once.
            memory.hold(&mut self.taken, capacity)?;
            self.joined.reserve_exact(capacity - self.joined.len());
        }
        if !self.first.is_empty() {
            self.joined.extend_from_slice(&self.first);
            self.first = Bytes::new();
        }
        self.joined.extend_from_slice(&data);
        memory.hold(&mut self.taken, self.joined.capacity())
    }

    fn into_bytes(self) -> Bytes {
        if self.joined.is_empty() {
            self.first
        } else {
            self.joined.into()
        }
    }
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

    use std::future::Future;
    use std::task::Poll;

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

    /// A body limit of `limit` bytes, ten seconds to arrive, no minimum rate.
    fn plain_limits(limit: usize) -> BodyLimits {
        BodyLimits {
            limit,
            timeout: Duration::from_secs(10),
            min_rate: 0,
            grace: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn bodies_hold_their_bytes_of_the_memory_while_they_arrive_and_no_more() {
        let limits = plain_limits(1024);
        let memory = BodyMemory::new(1000, 1000, Duration::from_secs(7));
        let body = || Chunks(vec![Bytes::from(vec![b' '; 400]); 2].into());
        let read = read_body(&HeaderMap::new(), body(), limits, (&memory, None)).await;
        assert_eq!(read.unwrap().len(), 800);
        assert_eq!(memory.held(), 0, "a body read gives its bytes back");
        // Another body holds 300 bytes meanwhile: 800 more do not fit.
        let mut other = Taken {
            memory: &memory,
            client: None,
            bytes: 0,
        };
        memory.take(&mut other, 300).unwrap();
        let refused = read_body(&HeaderMap::new(), body(), limits, (&memory, None)).await;
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

    #[tokio::test]
    async fn a_body_of_many_small_frames_keeps_none_of_the_buffers_they_are_cut_from() {
        // As hyper gives a body sent one byte per segment: each frame a slice of a read
        // buffer of 8 KiB.
        let buffers: Vec<Bytes> = (0..100u8)
            .map(|i| Bytes::from(vec![b'a' + i % 26; 8192]))
            .collect();
        let frames = buffers.iter().map(|buffer| buffer.slice(0..1)).collect();
        let limits = plain_limits(1024);
        let memory = BodyMemory::new(1024, 1024, Duration::from_secs(1));
        let headers = HeaderMap::new();
        let mut read = std::pin::pin!(read_body(
            &headers,
            Stalling(frames),
            limits,
            (&memory, None)
        ));
        // Every frame taken, and the rest of the body still to come.
        let poll = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
        assert!(poll.is_pending());
        let mut buffers = buffers;
        assert!(
            buffers.iter_mut().all(|buffer| buffer.is_unique()),
            "a body arriving keeps no read buffer alive"
        );
        // The buffer it copies into, which grows by doubling: 128 bytes for 100.
        assert_eq!(memory.held(), 128, "it holds the buffer it keeps");
    }

    #[tokio::test]
    async fn a_declared_length_bounds_the_buffer_a_body_grows_into() {
        // Three frames of 300: copied into a buffer that doubles, it would take the whole
        // body limit (1,024) of a memory of 950; its Content-Length holds it to 900.
        let body = || Chunks(vec![Bytes::from(vec![b' '; 300]); 3].into());
        let memory = BodyMemory::new(950, 950, Duration::from_secs(1));
        let mut declared = HeaderMap::new();
        declared.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(900));
        let read = read_body(&declared, body(), plain_limits(1024), (&memory, None)).await;
        assert_eq!(read.unwrap().len(), 900);
        let none = HeaderMap::new();
        let undeclared = read_body(&none, body(), plain_limits(1024), (&memory, None)).await;
        assert!(matches!(undeclared, Err(Problem::BodiesInFlight { .. })));
        assert_eq!(memory.held(), 0);
    }

    /// A body of `frames`, one each, and then nothing more for ever.
    struct Stalling(std::collections::VecDeque<Bytes>);

    impl Body for Stalling {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            match self.0.pop_front() {
                Some(frame) => Poll::Ready(Some(Ok(http_body::Frame::data(frame)))),
                None => Poll::Pending,
            }
        }
    }

    #[tokio::test]
    async fn one_client_holds_a_quarter_of_the_memory_at_most() {
        let limits = plain_limits(1000);
        let memory = BodyMemory::new(4000, 1000, Duration::from_secs(1));
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let headers = HeaderMap::new();
        let held_back = || Stalling(vec![Bytes::from(vec![b' '; 600])].into());
        // Client a's first body holds 600 of its 1,000, and stalls.
        let mut first =
            std::pin::pin!(read_body(&headers, held_back(), limits, (&memory, Some(a))));
        let poll = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
        assert!(poll.is_pending());
        // Its second does not fit its share, though the memory has 3,400 left; b's does.
        let second = read_body(&headers, held_back(), limits, (&memory, Some(a))).await;
        assert!(
            matches!(second, Err(Problem::BodiesInFlight { .. })),
            "{second:?}"
        );
        let whole = || Chunks(vec![Bytes::from(vec![b' '; 600])].into());
        let other = read_body(&headers, whole(), limits, (&memory, Some(b))).await;
        assert_eq!(other.unwrap().len(), 600);
        assert_eq!(memory.held(), 600);
        assert_eq!(
            memory.clients().len(),
            1,
            "a client that holds nothing is forgotten"
        );
    }

    #[tokio::test]
    async fn a_body_holds_the_memory_of_the_buffer_it_is_copied_into() {
        let limits = plain_limits(1000);
        // Three frames of 300: the buffer grows to 600, then to the limit (1,000), which a
        // memory of 999 cannot hold though the body's 900 bytes would fit.
        let frames = || Chunks(vec![Bytes::from(vec![b' '; 300]); 3].into());
        let memory = BodyMemory::new(1000, 1000, Duration::from_secs(1));
        let read = read_body(&HeaderMap::new(), frames(), limits, (&memory, None)).await;
        assert_eq!(read.unwrap().len(), 900);
        let memory = BodyMemory::new(999, 999, Duration::from_secs(1));
        let refused = read_body(&HeaderMap::new(), frames(), limits, (&memory, None)).await;
        assert!(matches!(refused, Err(Problem::BodiesInFlight { .. })));
        assert_eq!(memory.held(), 0);
    }
}
