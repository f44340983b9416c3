//! Reading a request: its id, its content type, its body within limits, its JSON.

use bytes::Bytes;
use http::{HeaderMap, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

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
///
/// **The bodies arriving longest give way.** The shares alone let four clients take it all,
/// a quarter each, and hold it until their request timeout while keeping the minimum rate
/// (a body sent quickly keeps the average for long); every other body was then answered
/// 503. So when a body's bytes do not fit, the bodies that have been arriving for longer
/// than `patience` (`server.min_body_rate_grace`) give their memory up to it, the oldest
/// first — of the same client when its share is what is short, of any client when the
/// memory is — as the least active connection gives its place up when the server is full
/// (`connection.rs`). Each is told at once and answered 408 ([`Problem::BodyShed`]), and
/// what it held counts as given back from that moment (its buffer is freed as soon as its
/// task runs). None gives way unless together they make room: a body that cannot fit is
/// answered 503 with `Retry-After` as before, and takes nothing from anyone. A genuine
/// callback arrives within milliseconds; to keep the memory full, an attacker now has to
/// send it all again within every `patience`.
#[derive(Debug)]
pub(crate) struct BodyMemory {
    limit: usize,
    /// The most one client may hold.
    per_client: usize,
    /// How long a body arrives before it gives way to others when the memory is short.
    patience: Duration,
    /// The `Retry-After` of a request refused for want of it.
    retry_after: Duration,
    ledger: Mutex<Ledger>,
}

/// The part of the body memory one client may hold at most (see [`BodyMemory`]).
const CLIENT_SHARE: usize = 4;

/// Who holds what of the [`BodyMemory`].
#[derive(Debug, Default)]
struct Ledger {
    /// All bodies together.
    held: usize,
    /// The clients with a body in the ledger: what each holds, and its bodies.
    clients: HashMap<Option<IpAddr>, Client>,
    /// The bodies that hold something, the longest arriving first.
    bodies: BTreeMap<BodyKey, Holder>,
    /// The last body's number.
    numbered: u64,
}

/// A body in the [`Ledger`]: when it began to arrive, and a number to tell bodies that
/// began at the same instant apart.
type BodyKey = (Instant, u64);

/// What one body holds, and how it is told to give it up.
#[derive(Debug)]
struct Holder {
    client: Option<IpAddr>,
    bytes: usize,
    shed: Arc<GiveWay>,
}

/// What one client holds, and its bodies, the longest arriving first: so that a client
/// short of its share finds its own among its own, not among everyone's.
#[derive(Debug, Default)]
struct Client {
    held: usize,
    bodies: BTreeSet<BodyKey>,
}

/// A body's word that it gave way: a flag its reader checks as it reads, and a signal that
/// wakes it while it waits for its next bytes.
#[derive(Debug, Default)]
struct GiveWay {
    given: AtomicBool,
    signal: Notify,
}

impl GiveWay {
    fn tell(&self) {
        self.given.store(true, Ordering::Release);
        self.signal.notify_one();
    }

    fn given(&self) -> bool {
        self.given.load(Ordering::Acquire)
    }
}

impl Ledger {
    /// What `client` holds.
    fn held_by(&self, client: Option<IpAddr>) -> usize {
        self.clients.get(&client).map_or(0, |held| held.held)
    }

    /// Enters the body `key` with what it holds.
    fn insert(&mut self, key: BodyKey, holder: Holder) {
        self.held += holder.bytes;
        let client = self.clients.entry(holder.client).or_default();
        client.held += holder.bytes;
        client.bodies.insert(key);
        self.bodies.insert(key, holder);
    }

    /// Adds `bytes` to `key`'s holding: to the memory and to its client's share.
    fn grow(&mut self, key: &BodyKey, bytes: usize) {
        let Some(holder) = self.bodies.get_mut(key) else {
            return;
        };
        holder.bytes += bytes;
        self.held += bytes;
        if let Some(client) = self.clients.get_mut(&holder.client) {
            client.held += bytes;
        }
    }

    /// Takes `bytes` off `key`'s holding (all it holds, when more): of the memory and of its
    /// client's share.
    fn release(&mut self, key: &BodyKey, bytes: usize) {
        let Some(holder) = self.bodies.get_mut(key) else {
            return;
        };
        let bytes = bytes.min(holder.bytes);
        holder.bytes -= bytes;
        self.held -= bytes;
        if let Some(client) = self.clients.get_mut(&holder.client) {
            client.held = client.held.saturating_sub(bytes);
        }
    }

    /// Forgets `key`, giving back all it holds (and its client, when it was the client's
    /// last body); its holder, when it was there.
    fn remove(&mut self, key: &BodyKey) -> Option<Holder> {
        self.release(key, usize::MAX);
        let holder = self.bodies.remove(key)?;
        if let Some(client) = self.clients.get_mut(&holder.client) {
            client.bodies.remove(key);
            if client.bodies.is_empty() {
                self.clients.remove(&holder.client);
            }
        }
        Some(holder)
    }

    /// The bodies that would give way, oldest first, for `needed` bytes more of `client`
    /// (whose own body is `own`): those that began by `before`, of `client` while its
    /// share is short, then of anyone while the memory is. `None` when they would not make
    /// room.
    fn to_give_way(
        &self,
        (client, own): (Option<IpAddr>, Option<&BodyKey>),
        needed: usize,
        (limit, per_client): (usize, usize),
        before: Instant,
    ) -> Option<Vec<BodyKey>> {
        let mut share = per_client.saturating_sub(self.held_by(client));
        let mut free = limit.saturating_sub(self.held);
        let mut giving = Vec::new();
        let patient = |(began, _): &&BodyKey| *began <= before;
        let not_own = |key: &&BodyKey| Some(*key) != own;
        if share < needed {
            let bodies = self.clients.get(&client).map(|client| &client.bodies);
            for key in bodies
                .into_iter()
                .flatten()
                .take_while(patient)
                .filter(not_own)
            {
                let bytes = self.bodies.get(key).map_or(0, |holder| holder.bytes);
                giving.push(*key);
                share += bytes;
                free += bytes;
                if share >= needed {
                    break;
                }
            }
            if share < needed {
                return None;
            }
        }
        // The client's bodies giving way already are its oldest, up to the last of them.
        let own_given = giving.last().copied();
        let given = |key: &BodyKey, holder: &Holder| {
            holder.client == client && own_given.is_some_and(|last| *key <= last)
        };
        for (key, holder) in self
            .bodies
            .iter()
            .take_while(|(key, _)| patient(key))
            .filter(|(key, _)| not_own(key))
        {
            if free >= needed {
                break;
            }
            if !given(key, holder) {
                giving.push(*key);
                free += holder.bytes;
            }
        }
        (free >= needed).then_some(giving)
    }
}

impl BodyMemory {
    /// A memory of `limit` bytes; one client may hold a quarter of it, and at least
    /// `body_limit`; a body arriving for longer than `patience` gives way to others.
    pub(crate) fn new(
        limit: usize,
        body_limit: usize,
        patience: Duration,
        retry_after: Duration,
    ) -> Self {
        Self {
            limit,
            per_client: (limit / CLIENT_SHARE).max(body_limit).min(limit),
            patience,
            retry_after,
            ledger: Mutex::default(),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `bytes` more for `taken`: refused when they would pass the limit or the
    /// client's share and the bodies arriving longest cannot make room; those make room when
    /// they can. [`Problem::BodyShed`] when `taken` itself gave way meanwhile.
    fn take(&self, taken: &mut Taken<'_>, bytes: usize) -> Result<(), Problem> {
        let mut ledger = self.ledger();
        // Told under this lock when it gave way.
        taken.still_held()?;
        let held = ledger.held_by(taken.client);
        let fits = held.saturating_add(bytes) <= self.per_client
            && ledger.held.saturating_add(bytes) <= self.limit;
        if !fits {
            let giving = Instant::now()
                .checked_sub(self.patience)
                .and_then(|before| {
                    ledger.to_give_way(
                        (taken.client, taken.place.as_ref().map(|(key, _)| key)),
                        bytes,
                        (self.limit, self.per_client),
                        before,
                    )
                })
                .ok_or(Problem::BodiesInFlight {
                    retry_after: self.retry_after,
                })?;
            for key in giving {
                if let Some(holder) = ledger.remove(&key) {
                    holder.shed.tell();
                }
            }
        }
        match &taken.place {
            Some((key, _)) => ledger.grow(key, bytes),
            None => {
                ledger.numbered += 1;
                let key = (taken.began, ledger.numbered);
                let shed = Arc::new(GiveWay::default());
                let holder = Holder {
                    client: taken.client,
                    bytes,
                    shed: Arc::clone(&shed),
                };
                ledger.insert(key, holder);
                taken.place = Some((key, shed));
            }
        }
        taken.bytes += bytes;
        Ok(())
    }

    /// Holds `total` bytes for `taken` from now on: takes what it holds fewer (refused past
    /// the limit), gives back what it holds more.
    fn hold(&self, taken: &mut Taken<'_>, total: usize) -> Result<(), Problem> {
        if total == taken.bytes {
            // Most frames: the buffer did not grow, and the ledger is left unlocked.
            taken.still_held()
        } else if total > taken.bytes {
            self.take(taken, total - taken.bytes)
        } else {
            if let Some((key, _)) = &taken.place {
                self.ledger().release(key, taken.bytes - total);
            }
            taken.bytes = total;
            Ok(())
        }
    }

    /// The bytes held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.ledger().held
    }
}

/// What one body holds of the [`BodyMemory`]; given back when it is read, refused, dropped
/// or gives way.
struct Taken<'a> {
    memory: &'a BodyMemory,
    /// The client whose share it is.
    client: Option<IpAddr>,
    /// When the body began to arrive.
    began: Instant,
    /// Its place in the ledger and how it is told to give way, from the first byte it holds.
    place: Option<(BodyKey, Arc<GiveWay>)>,
    /// What it holds as far as it knows: the ledger's holding is this or, once it gave way,
    /// nothing.
    bytes: usize,
}

impl Taken<'_> {
    fn new(memory: &BodyMemory, client: Option<IpAddr>, began: Instant) -> Taken<'_> {
        Taken {
            memory,
            client,
            began,
            place: None,
            bytes: 0,
        }
    }

    /// Completes when the body is told to give way (never before it holds something).
    async fn given_way(&self) {
        match &self.place {
            Some((_, shed)) => shed.signal.notified().await,
            None => std::future::pending().await,
        }
    }

    /// [`Problem::BodyShed`] once the body gave way: its bytes are no longer counted, so it
    /// may not go on as if they were, even when the rest of it is already there.
    fn still_held(&self) -> Result<(), Problem> {
        match &self.place {
            Some((_, shed)) if shed.given() => Err(Problem::BodyShed {
                patience: self.memory.patience,
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some((key, _)) = &self.place {
            self.memory.ledger().remove(key);
        }
    }
}

/// Reads the whole body: refused before reading when `Content-Length` is over the limit, cut
/// off while streaming when the bytes exceed it, and answered 408 when it does not arrive in
/// time or arrives too slowly. While it arrives its bytes are held of `memory`, as
/// `client`'s; one that would pass that or the client's share is answered 503
/// (`Retry-After`) unless bodies arriving for longer make room, and one that gives way to
/// another is answered 408 ([`BodyMemory`]).
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
        taken: Taken::new(memory, client, start),
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
        // The body first: a body whose frames are there (most arrive in one) is read without
        // waiting on its signal to give way, which costs a registration each time.
        let next = tokio::select! {
            biased;
            next = tokio::time::timeout_at(due.into(), body.frame()) => next,
            () = arriving.taken.given_way() => {
                return Err(Problem::BodyShed {
                    patience: memory.patience,
                });
            }
        };
        let frame = match next {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                arriving.taken.still_held()?;
                break;
            }
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

/// A body's bytes as they arrive. A first frame that is the whole declared body
/// (`Content-Length`) is kept as it came: a body that arrives in one frame is not copied,
/// and goes on to its handler at once. Any other frame is copied into one buffer and
/// dropped: a frame is a slice of the connection's read buffer, and a body kept as many small
/// frames — one byte per TCP segment, at the minimum rate — would keep a buffer of some KiB
/// alive for each byte (hyper starts a new one when the last is still shared); so would a
/// first frame of one byte on each of an HTTP/2 connection's streams, each a slice of a
/// buffer of its own. The memory holds what this keeps: the first frame's bytes, or the
/// buffer's capacity, which grows by doubling up to the body's declared length, or else the
/// body limit.
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
        if self.first.is_empty() && self.joined.is_empty() && self.expected == Some(data.len()) {
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

    /// A patience no body in these tests outlasts: none gives way.
    const PATIENT: Duration = Duration::from_secs(600);

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
        let memory = BodyMemory::new(1000, 1000, PATIENT, Duration::from_secs(7));
        let body = || Chunks(vec![Bytes::from(vec![b' '; 400]); 2].into());
        let read = read_body(&HeaderMap::new(), body(), limits, (&memory, None)).await;
        assert_eq!(read.unwrap().len(), 800);
        assert_eq!(memory.held(), 0, "a body read gives its bytes back");
        // Another body holds 300 bytes meanwhile: 800 more do not fit.
        let mut other = Taken::new(&memory, None, Instant::now());
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
        let memory = BodyMemory::new(1024, 1024, PATIENT, Duration::from_secs(1));
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
    async fn a_body_stalled_after_its_first_frame_keeps_no_buffer_it_was_cut_from() {
        // As h2 gives a stream's first DATA frame of one byte: a slice of a read buffer of
        // its own, while the rest of the declared body never comes.
        let buffer = Bytes::from(vec![b'{'; 16 * 1024]);
        let limits = plain_limits(1024);
        let memory = BodyMemory::new(1024, 1024, PATIENT, Duration::from_secs(1));
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_LENGTH, "100".parse().unwrap());
        {
            let mut read = std::pin::pin!(read_body(
                &headers,
                Stalling(vec![buffer.slice(0..1)].into()),
                limits,
                (&memory, None)
            ));
            let poll = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
            assert!(poll.is_pending());
            assert!(
                buffer.is_unique(),
                "the stalled body keeps no read buffer alive"
            );
            assert_eq!(memory.held(), 1, "it holds the byte it copied");
        }
        // A body that arrives whole in its first frame is kept as it came.
        headers.insert(http::header::CONTENT_LENGTH, "10".parse().unwrap());
        let whole = buffer.slice(0..10);
        let read = read_body(
            &headers,
            Chunks(vec![whole.clone()].into()),
            plain_limits(1024),
            (&memory, None),
        )
        .await
        .unwrap();
        assert_eq!(read.as_ptr(), whole.as_ptr(), "not copied");
    }

    #[tokio::test]
    async fn a_declared_length_bounds_the_buffer_a_body_grows_into() {
        // Three frames of 300: copied into a buffer that doubles, it would take the whole
        // body limit (1,024) of a memory of 950; its Content-Length holds it to 900.
        let body = || Chunks(vec![Bytes::from(vec![b' '; 300]); 3].into());
        let memory = BodyMemory::new(950, 950, PATIENT, Duration::from_secs(1));
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
        let memory = BodyMemory::new(4000, 1000, PATIENT, Duration::from_secs(1));
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
        let ledger = memory.ledger();
        assert_eq!(
            (ledger.clients.len(), ledger.bodies.len()),
            (1, 1),
            "a client or a body that holds nothing is forgotten"
        );
    }

    #[tokio::test]
    async fn a_body_holds_the_memory_of_the_buffer_it_is_copied_into() {
        let limits = plain_limits(1000);
        // Three frames of 300: the buffer grows to 600, then to the limit (1,000), which a
        // memory of 999 cannot hold though the body's 900 bytes would fit.
        let frames = || Chunks(vec![Bytes::from(vec![b' '; 300]); 3].into());
        let memory = BodyMemory::new(1000, 1000, PATIENT, Duration::from_secs(1));
        let read = read_body(&HeaderMap::new(), frames(), limits, (&memory, None)).await;
        assert_eq!(read.unwrap().len(), 900);
        let memory = BodyMemory::new(999, 999, PATIENT, Duration::from_secs(1));
        let refused = read_body(&HeaderMap::new(), frames(), limits, (&memory, None)).await;
        assert!(matches!(refused, Err(Problem::BodiesInFlight { .. })));
        assert_eq!(memory.held(), 0);
    }

    /// Polls `read` once: it must still be waiting for the rest of its body.
    async fn still_arriving<F: Future>(read: std::pin::Pin<&mut F>) {
        let mut read = read;
        let poll = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
        assert!(poll.is_pending(), "the body was answered");
    }

    #[tokio::test]
    async fn the_body_arriving_longest_gives_its_memory_up_to_one_that_does_not_fit() {
        // No patience: every body arriving gives way when another needs its memory.
        let memory = BodyMemory::new(2000, 1000, Duration::ZERO, Duration::from_secs(1));
        let limits = plain_limits(1000);
        let headers = HeaderMap::new();
        let client = |last: u8| Some(IpAddr::from([192, 0, 2, last]));
        let held_back = || Stalling(vec![Bytes::from(vec![b' '; 1000])].into());
        let mut oldest = std::pin::pin!(read_body(
            &headers,
            held_back(),
            limits,
            (&memory, client(1))
        ));
        still_arriving(oldest.as_mut()).await;
        let mut younger = Box::pin(read_body(
            &headers,
            held_back(),
            limits,
            (&memory, client(2)),
        ));
        still_arriving(younger.as_mut()).await;
        assert_eq!(memory.held(), 2000);

        let whole = Chunks(vec![Bytes::from(vec![b' '; 600])].into());
        let read = read_body(&headers, whole, limits, (&memory, client(3))).await;
        assert_eq!(read.unwrap().len(), 600, "the new body was not given room");
        assert_eq!(memory.held(), 1000, "only the oldest gave its memory up");
        assert_eq!(
            oldest.await.unwrap_err(),
            Problem::BodyShed {
                patience: Duration::ZERO
            }
        );
        still_arriving(younger.as_mut()).await;
        drop(younger);
        let ledger = memory.ledger();
        assert_eq!(
            (ledger.held, ledger.clients.len(), ledger.bodies.len()),
            (0, 0, 0)
        );
    }

    #[tokio::test]
    async fn a_client_short_of_its_share_takes_it_from_its_own_bodies_not_from_others() {
        let memory = BodyMemory::new(4000, 1000, Duration::ZERO, Duration::from_secs(1));
        let limits = plain_limits(1000);
        let headers = HeaderMap::new();
        let (a, b) = (
            Some(IpAddr::from([192, 0, 2, 1])),
            Some(IpAddr::from([192, 0, 2, 2])),
        );
        let held_back = || Stalling(vec![Bytes::from(vec![b' '; 600])].into());
        let mut others = std::pin::pin!(read_body(&headers, held_back(), limits, (&memory, b)));
        still_arriving(others.as_mut()).await;
        let mut own = std::pin::pin!(read_body(&headers, held_back(), limits, (&memory, a)));
        still_arriving(own.as_mut()).await;
        // a's second body does not fit a's share (1,000): a's first gives way, though b's
        // began earlier.
        let mut second = std::pin::pin!(read_body(&headers, held_back(), limits, (&memory, a)));
        still_arriving(second.as_mut()).await;
        assert!(matches!(own.await, Err(Problem::BodyShed { .. })));
        still_arriving(others.as_mut()).await;
        assert_eq!(memory.held(), 1200);
    }

    #[test]
    fn a_body_that_gave_way_goes_on_no_further_even_without_growing() {
        let memory = BodyMemory::new(1000, 1000, Duration::ZERO, Duration::from_secs(1));
        let mut gone = Taken::new(&memory, None, Instant::now());
        memory.hold(&mut gone, 1000).unwrap();
        let mut newcomer = Taken::new(&memory, Some(IpAddr::from([192, 0, 2, 1])), Instant::now());
        memory.hold(&mut newcomer, 500).unwrap();
        // Its whole declared length already held, the rest of its bytes would grow nothing.
        assert_eq!(
            memory.hold(&mut gone, 1000),
            Err(Problem::BodyShed {
                patience: Duration::ZERO
            })
        );
        assert!(gone.still_held().is_err());
        drop(gone);
        assert_eq!(
            memory.held(),
            500,
            "the body that gave way gives nothing back twice"
        );
    }

    #[test]
    fn each_client_knows_its_own_bodies_and_is_forgotten_with_its_last() {
        let start = Instant::now();
        let (a, b) = (
            Some(IpAddr::from([192, 0, 2, 1])),
            Some(IpAddr::from([192, 0, 2, 2])),
        );
        let mut ledger = Ledger::default();
        let holder = |client, bytes| Holder {
            client,
            bytes,
            shed: Arc::default(),
        };
        let keys: Vec<BodyKey> = (0..3).map(|n| (start, n)).collect();
        ledger.insert(keys[0], holder(a, 100));
        ledger.insert(keys[1], holder(b, 200));
        ledger.insert(keys[2], holder(a, 300));
        ledger.grow(&keys[2], 50);
        ledger.release(&keys[0], 40);
        let own = |ledger: &Ledger, client| {
            ledger.clients.get(&client).map(|client| {
                (
                    client.held,
                    client.bodies.iter().copied().collect::<Vec<_>>(),
                )
            })
        };
        assert_eq!(own(&ledger, a), Some((410, vec![keys[0], keys[2]])));
        assert_eq!(own(&ledger, b), Some((200, vec![keys[1]])));
        assert_eq!(ledger.held, 610);
        // A body that holds nothing yet is still the client's until it is removed.
        ledger.release(&keys[1], 200);
        assert_eq!(own(&ledger, b), Some((0, vec![keys[1]])));
        assert_eq!(ledger.remove(&keys[1]).map(|h| h.bytes), Some(0));
        assert_eq!(own(&ledger, b), None, "forgotten with its last body");
        ledger.remove(&keys[2]);
        assert_eq!(own(&ledger, a), Some((60, vec![keys[0]])));
        ledger.remove(&keys[0]);
        assert!(ledger.remove(&keys[0]).is_none(), "removed once");
        assert_eq!(
            (ledger.held, ledger.clients.len(), ledger.bodies.len()),
            (0, 0, 0)
        );
    }

    #[test]
    fn bodies_give_way_only_when_together_they_make_room_and_never_before_their_patience() {
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let (a, b) = (
            Some(IpAddr::from([192, 0, 2, 1])),
            Some(IpAddr::from([192, 0, 2, 2])),
        );
        let mut ledger = Ledger::default();
        for (number, (began, client, bytes)) in [
            (at(0), a, 300),
            (at(1), b, 300),
            (at(2), b, 300),
            (at(3), a, 100),
        ]
        .into_iter()
        .enumerate()
        {
            let key = (began, number as u64);
            ledger.insert(
                key,
                Holder {
                    client,
                    bytes,
                    shed: Arc::default(),
                },
            );
        }
        let key = |seconds: u64| (at(seconds), seconds);
        let limits = (1000, 1000);
        // 500 for a third client, the memory full: the two oldest make room, the first
        // three (all that began by 2 s) would be more than needed.
        let c = Some(IpAddr::from([192, 0, 2, 3]));
        assert_eq!(
            ledger.to_give_way((c, None), 500, limits, at(2)),
            Some(vec![key(0), key(1)])
        );
        // Those that began by 1 s hold 600: not room for 700, and none gives way.
        assert_eq!(ledger.to_give_way((c, None), 700, limits, at(1)), None);
        // A body never gives way to itself: b's body of 1 s growing by 400 takes a's of 0 s
        // and b's own of 2 s.
        assert_eq!(
            ledger.to_give_way((b, Some(&key(1))), 400, limits, at(3)),
            Some(vec![key(0), key(2)])
        );
        // Both short (a holds 400 of 500, the memory 1,000 of 1,000): a's own bodies first
        // (0 s, 3 s: its share then has room), then the oldest of others' (b's of 1 s).
        assert_eq!(
            ledger.to_give_way((a, None), 500, (1000, 500), at(3)),
            Some(vec![key(0), key(3), key(1)])
        );
        // Its share short (a holds 400 of 500) and the memory not, a takes from its own
        // bodies alone: of 0 s and of 3 s, though b's began before the second.
        assert_eq!(
            ledger.to_give_way((a, None), 500, (2000, 500), at(3)),
            Some(vec![key(0), key(3)])
        );
    }
}
