//! The inspector: what the service received on its three endpoints and what it answered,
//! for the last few hundred requests, and as it happens.
//!
//! When a payment goes wrong, the questions are: did the callback arrive, what did we
//! answer, was the signature good, is it being retried, which validations wait for us, did
//! our decision reach the aggregator? The running service answers them under its operating
//! API (`/payhook/admin/`, behind the admin token or an operator's own, loopback by
//! default; a page opened with an operator's token names them, and what it decides or
//! resolves is kept with their name):
//!
//! * `GET /payhook/admin/inspector` — a page: recent deliveries (filter by nonce, client,
//!   outcome; each one's raw request, every header value but the harmless ones redacted),
//!   failing callbacks, postponed validations with **Approve** / **Deny**, the outbox with
//!   **Retry now**, and the service's health. It updates itself; it needs no external asset
//!   and no build step.
//! * `GET /payhook/admin/deliveries?after=SEQ&wait=SECONDS` — the same deliveries as JSON
//!   ([`DeliveryList`]), answered as soon as one newer than `SEQ` is recorded (long poll):
//!   what `payhook tail` follows.
//! * `GET /payhook/admin/deliveries/{seq}` — one delivery with its request ([`DeliveryDetail`]).
//!
//! Recording is on with the operating API and keeps the last `admin.inspector_recent`
//! requests (default 500; 0 turns recording off). A request's raw body is kept up to
//! [`BODY_KEPT`] bytes, its headers up to [`HEADERS_KEPT`] (only the values of
//! [`RequestContext::SHOWN_HEADERS`] and of the signature's header: a credential may be in any
//! other, a shared secret's header being the merchant's to name, so it is never copied), its
//! identifiers up to `server.max_identifier_chars`, and all the kept requests together up to
//! [`KEPT_BYTES`]: the oldest go first, whatever a sender sends. Requests refused before
//! they were admitted (a missing or forged signature, wrong credentials, an address not
//! allowed), which anyone who reaches an endpoint can send, keep at most a fifth of the
//! list: beyond it the oldest of them goes, wherever it stands (a follower that lags is not
//! told of it as missed), so that a flood of them leaves the aggregator's deliveries in
//! the list. What it costs the callback
//! path is one lock and a few small copies per request; `bench_callbacks` measures B with
//! recording on and off.
//!
//! ```
//! use payhook::inspector::DeliveryFilter;
//!
//! let filter = DeliveryFilter::from_query("nonce=n-42&outcome=failed");
//! assert_eq!(filter.nonce.as_deref(), Some("n-42"));
//! assert_eq!(filter.outcome.as_deref(), Some("failed"));
//! assert_eq!(filter.to_query(), "nonce=n-42&outcome=failed");
//! ```

pub(crate) mod note;
pub(crate) mod page;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{HeaderMap, HeaderName};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::handler::RequestContext;
use crate::logged::{cut_bytes, cut_chars};
use note::{Note, Outcome, SignatureNote};

/// Bytes of a request's body the inspector keeps (the rest is cut, and said so).
pub const BODY_KEPT: usize = 64 * 1024;

/// Bytes of a request's headers the inspector keeps; the headers after them are counted, not
/// kept.
pub const HEADERS_KEPT: usize = 8 * 1024;
/// Bytes of one header's name or value the inspector keeps; the rest is cut, and said so.
const HEADER_PART_KEPT: usize = 1024;
/// Bytes of all the recorded requests together (bodies, headers, identifiers, answers): the
/// oldest go first when a new one would pass it, however many `admin.inspector_recent` keeps.
pub const KEPT_BYTES: usize = 32 * 1024 * 1024;
/// What a header's value is kept as when it is not shown.
const REDACTED: &str = "[redacted]";

/// The share of the recorded requests that requests refused before they were admitted
/// (a missing or forged signature, wrong credentials, an address not allowed, a body that
/// never came) may take: one in this many. Anyone who reaches an endpoint can send those,
/// and without a share of their own, a few hundred of them would push every delivery of
/// the aggregator's out of the list an operator reads.
const REFUSED_SHARE: usize = 5;

/// The recorded requests and the bytes they keep: those admitted and those refused before
/// they were admitted in two queues, each oldest first, read together in the order they
/// came ([`Recent::in_order`]).
#[derive(Default)]
struct Recent {
    admitted: VecDeque<Recorded>,
    refused: VecDeque<Recorded>,
    bytes: usize,
    /// Of `bytes`, those of `refused`.
    refused_bytes: usize,
}

impl Recent {
    /// Adds `recorded` after the oldest are let go: as many as it takes to keep at most
    /// `capacity` requests and [`KEPT_BYTES`], and — when it was refused before it was
    /// admitted — at most a [`REFUSED_SHARE`]th of both for such requests, the oldest of
    /// them let go first.
    fn push(&mut self, recorded: Recorded, capacity: usize) {
        let size = recorded.size();
        if !recorded.note.admitted {
            let (most, most_bytes) = (
                (capacity / REFUSED_SHARE).max(1),
                KEPT_BYTES / REFUSED_SHARE,
            );
            while !self.refused.is_empty()
                && (self.refused.len() >= most || self.refused_bytes + size > most_bytes)
            {
                self.let_go_of(true);
            }
        }
        while self.len() > 0 && (self.len() >= capacity || self.bytes + size > KEPT_BYTES) {
            let refused_first = match (self.admitted.front(), self.refused.front()) {
                (Some(admitted), Some(refused)) => refused.seq < admitted.seq,
                (admitted, _) => admitted.is_none(),
            };
            self.let_go_of(refused_first);
        }
        self.bytes += size;
        if recorded.note.admitted {
            self.admitted.push_back(recorded);
        } else {
            self.refused_bytes += size;
            self.refused.push_back(recorded);
        }
    }

    /// Lets the oldest of the refused ones go, or of the admitted ones.
    fn let_go_of(&mut self, refused: bool) {
        let queue = if refused {
            &mut self.refused
        } else {
            &mut self.admitted
        };
        if let Some(gone) = queue.pop_front() {
            let size = gone.size();
            self.bytes -= size;
            if refused {
                self.refused_bytes -= size;
            }
        }
    }

    fn len(&self) -> usize {
        self.admitted.len() + self.refused.len()
    }

    /// Every recorded request, oldest first.
    fn in_order(&self) -> impl Iterator<Item = &Recorded> {
        let (mut admitted, mut refused) = (
            self.admitted.iter().peekable(),
            self.refused.iter().peekable(),
        );
        std::iter::from_fn(move || match (admitted.peek(), refused.peek()) {
            (Some(a), Some(r)) if r.seq < a.seq => refused.next(),
            (Some(_), _) => admitted.next(),
            (None, _) => refused.next(),
        })
    }

    /// The oldest request kept.
    fn oldest(&self) -> Option<&Recorded> {
        self.in_order().next()
    }

    /// The number of the last delivery kept; 0 before the first.
    fn last_seq(&self) -> u64 {
        let last = |queue: &VecDeque<Recorded>| queue.back().map_or(0, |r| r.seq);
        last(&self.admitted).max(last(&self.refused))
    }
}

/// One recorded request.
struct Recorded {
    seq: u64,
    at: DateTime<Utc>,
    request_id: String,
    trace: crate::trace_context::TraceContext,
    note: Note,
    status: u16,
    answer: Bytes,
    latency: Duration,
}

impl Recorded {
    /// The bytes it keeps of what it was sent and answered.
    fn size(&self) -> usize {
        let note = &self.note;
        let text = |kept: &Option<String>| kept.as_ref().map_or(0, String::len);
        std::mem::size_of::<Self>()
            + self.request_id.len()
            + self.answer.len()
            + text(&note.nonce)
            + text(&note.client)
            + text(&note.headers)
            + note.body.as_ref().map_or(0, Bytes::len)
    }
}

/// The recent deliveries, and a way to wait for the next one. Held by the app when its
/// operating API is on.
pub(crate) struct Inspector {
    capacity: usize,
    /// Oldest first; never empty once something was recorded (capacity is at least 1), so
    /// the last one's number is the last number given.
    recent: Mutex<Recent>,
    recorded: tokio::sync::Notify,
    /// Lists waiting for the next delivery: [`Inspector::record`] wakes them only when
    /// there are some.
    waiting: std::sync::atomic::AtomicUsize,
    /// This recorder's own name, random: numbers begin again at 1 in another process.
    instance: String,
}

/// Which of the deliveries after a number a list gives when more pass than its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Window {
    /// The newest (a page showing what happened last).
    Newest,
    /// The oldest, with [`DeliveryList::more`] set and `last` the last one listed (a
    /// follower that shows every delivery in turn).
    Oldest,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// What the app knows of a request once it is answered.
pub(crate) struct Answered {
    pub(crate) request_id: String,
    pub(crate) trace: crate::trace_context::TraceContext,
    pub(crate) status: u16,
    pub(crate) answer: Bytes,
    pub(crate) latency: Duration,
}

impl Inspector {
    /// `None` when `capacity` is 0: nothing is recorded.
    pub(crate) fn new(capacity: usize) -> Option<Self> {
        (capacity > 0).then(|| Self {
            capacity,
            recent: Mutex::new(Recent::default()),
            recorded: tokio::sync::Notify::new(),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            instance: uuid::Uuid::new_v4().simple().to_string(),
        })
    }

    /// How many deliveries it keeps.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records one answered request of an endpoint.
    pub(crate) fn record(&self, note: Note, answered: Answered) {
        let mut recent = self.lock();
        let seq = recent.last_seq() + 1;
        let recorded = Recorded {
            seq,
            at: Utc::now(),
            request_id: answered.request_id,
            trace: answered.trace,
            note,
            status: answered.status,
            answer: answered.answer,
            latency: answered.latency,
        };
        recent.push(recorded, self.capacity);
        drop(recent);
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.recorded.notify_waiters();
        }
    }

    /// The deliveries after `after` that pass `filter`, oldest first, at most `limit` (which
    /// ones when more passed: `window`); waits up to `wait` for one when there is none yet.
    pub(crate) async fn list(
        &self,
        filter: &DeliveryFilter,
        after: u64,
        (limit, window): (usize, Window),
        wait: Duration,
    ) -> DeliveryList {
        if wait.is_zero() {
            return self.list_now(filter, after, limit, window);
        }
        let deadline = tokio::time::Instant::now() + wait;
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waited = Waiting(&self.waiting);
        loop {
            // Registered before looking, so that a delivery recorded in between wakes it.
            let recorded = self.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            let list = self.list_now(filter, after, limit, window);
            if !list.deliveries.is_empty() {
                return list;
            }
            if tokio::time::timeout_at(deadline, recorded).await.is_err() {
                return self.list_now(filter, after, limit, window);
            }
        }
    }

    fn list_now(
        &self,
        filter: &DeliveryFilter,
        after: u64,
        limit: usize,
        window: Window,
    ) -> DeliveryList {
        let recent = self.lock();
        let mut last = recent.last_seq();
        let oldest = recent.oldest().map_or(last + 1, |r| r.seq);
        // `after` is the caller's: any number, `u64::MAX` included.
        let missed = (after > 0 && after.saturating_add(1) < oldest).then(|| oldest - after - 1);
        let mut attempts = Attempts::default();
        let mut deliveries: Vec<DeliveryEntry> = recent
            .in_order()
            .map(|r| (r, attempts.count(r)))
            .filter(|(r, _)| r.seq > after)
            .map(|(r, attempt)| entry(r, attempt))
            .filter(|e| filter.matches(e))
            .collect();
        let more = deliveries.len() > limit;
        if more {
            match window {
                Window::Newest => drop(deliveries.drain(..deliveries.len() - limit)),
                Window::Oldest => {
                    deliveries.truncate(limit);
                    last = deliveries.last().map_or(last, |d| d.seq);
                }
            }
        }
        DeliveryList {
            last,
            missed,
            more: more && window == Window::Oldest,
            instance: self.instance.clone(),
            deliveries,
        }
    }

    /// One delivery with its request, while it is among the recent ones.
    pub(crate) fn detail(&self, seq: u64) -> Option<DeliveryDetail> {
        let recent = self.lock();
        let mut attempts = Attempts::default();
        let (recorded, attempt) = recent
            .in_order()
            .take_while(|r| r.seq <= seq)
            .map(|r| (r, attempts.count(r)))
            .last()
            .filter(|(r, _)| r.seq == seq)?;
        Some(detail(recorded, attempt))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Deliveries seen so far per (endpoint, nonce, status), counted oldest first: which
/// attempt each one is among the kept ones, in one pass.
#[derive(Default)]
struct Attempts<'a>(HashMap<(Option<&'static str>, &'a str, Option<i32>), u32>);

impl<'a> Attempts<'a> {
    fn count(&mut self, recorded: &'a Recorded) -> u32 {
        let note = &recorded.note;
        let Some(nonce) = note.nonce.as_deref() else {
            return 1;
        };
        let seen = self
            .0
            .entry((note.endpoint, nonce, note.transaction_status))
            .or_default();
        *seen += 1;
        *seen
    }
}

/// A list waiting for a delivery, counted while it waits.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Deliveries of `GET /payhook/admin/deliveries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryList {
    /// The sequence number of the last delivery recorded (whether listed or not): the
    /// `after` of the next call.
    pub last: u64,
    /// Deliveries after the `after` asked for that are no longer kept (more arrived than
    /// the inspector keeps); absent when none were missed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<u64>,
    /// Asked for the oldest (`oldest=true`): more deliveries after `last` passed than
    /// `limit` let in; ask again from `last` at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more: bool,
    /// The recording process's own name, random: another one means the service restarted
    /// and numbered its deliveries from 1 again. Empty from a service before this field.
    #[serde(default)]
    pub instance: String,
    /// The deliveries, oldest first.
    pub deliveries: Vec<DeliveryEntry>,
}

/// One request to an endpoint and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryEntry {
    /// Its number, increasing by one per recorded request since the service started.
    pub seq: u64,
    /// When it was answered (UTC).
    pub at: DateTime<Utc>,
    /// `callback`, `transaction_validation` or `providers_validation`.
    pub endpoint: String,
    /// The request id (the `X-Request-Id` answered).
    pub request_id: String,
    /// The W3C trace id it ran in.
    pub trace_id: String,
    /// The nonce, once the body parsed.
    pub nonce: Option<String>,
    /// The client id, once the body parsed.
    pub client: Option<String>,
    /// The transaction's reference id (callbacks).
    pub reference_id: Option<String>,
    /// The transaction status delivered (callbacks).
    pub transaction_status: Option<i32>,
    /// The validation id (transaction validations).
    pub validation_id: Option<i64>,
    /// `booked`, `held` (acknowledged, but held by the merchant instead of booked),
    /// `duplicate`, `allowed`, `denied`, `postponed`, `replayed`, `answered`, `refused`
    /// (4xx) or `failed` (5xx).
    pub outcome: String,
    /// The answer's HTTP status.
    pub status: u16,
    /// The answer's `message`.
    pub message: Option<String>,
    /// How long the answer took, in milliseconds.
    pub latency_ms: f64,
    /// How the signature went: `verified`, `verified (key …)`, `verified before (a
    /// retry)`, `refused: …`, or `not checked`.
    pub signature: String,
    /// Which delivery of this (endpoint, nonce, status) it is among the recent ones: 1 for
    /// the first seen.
    pub attempt: u32,
    /// Answered from an earlier record (a duplicate callback, a replayed validation).
    pub duplicate: bool,
}

/// One line, as `payhook tail` prints it:
///
/// ```text
/// 06:53:35.382  callback                n-failing   status 4  failed     503 temporarily unable to process the callback  1.5 ms  signature verified (key rsa2048)  attempt 2
/// ```
impl std::fmt::Display for DeliveryEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}  {:<22}  {}",
            self.at.format("%H:%M:%S%.3f"),
            self.endpoint,
            crate::Logged(self.nonce.as_deref().unwrap_or("-")),
        )?;
        if let Some(status) = self.transaction_status {
            write!(f, "  status {status}")?;
        }
        write!(f, "  {:<9}  {}", self.outcome, self.status)?;
        if let Some(message) = &self.message {
            write!(f, " {}", crate::Logged(message))?;
        }
        write!(
            f,
            "  {:.1} ms  signature {}  attempt {}",
            self.latency_ms, self.signature, self.attempt
        )
    }
}

/// A delivery with its request: `GET /payhook/admin/deliveries/{seq}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryDetail {
    /// The delivery.
    #[serde(flatten)]
    pub entry: DeliveryEntry,
    /// The request's headers: the values of those known to be harmless, `[redacted]` for
    /// the others.
    pub headers: Vec<(String, String)>,
    /// The request's body as received (UTF-8, invalid bytes replaced), up to [`BODY_KEPT`]
    /// bytes.
    pub body: String,
    /// The body was longer than what is kept.
    pub body_truncated: bool,
    /// The answer's body.
    pub answer: String,
}

/// Which deliveries to list: every given field must match (nonce and client as
/// substrings, outcome and endpoint exactly).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryFilter {
    /// Part of the nonce.
    pub nonce: Option<String>,
    /// Part of the client id.
    pub client: Option<String>,
    /// The outcome (see [`DeliveryEntry::outcome`]).
    pub outcome: Option<String>,
    /// The endpoint.
    pub endpoint: Option<String>,
}

impl DeliveryFilter {
    /// Reads `nonce`, `client`, `outcome` and `endpoint` from a URL query; other keys and
    /// empty values are ignored.
    pub fn from_query(query: &str) -> Self {
        let mut filter = Self::default();
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            let value = Some(value.into_owned()).filter(|v| !v.is_empty());
            match &*key {
                "nonce" => filter.nonce = value,
                "client" => filter.client = value,
                "outcome" => filter.outcome = value,
                "endpoint" => filter.endpoint = value,
                _ => {}
            }
        }
        filter
    }

    /// The filter as a URL query (without `?`).
    pub fn to_query(&self) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [
            ("nonce", &self.nonce),
            ("client", &self.client),
            ("outcome", &self.outcome),
            ("endpoint", &self.endpoint),
        ] {
            if let Some(value) = value {
                query.append_pair(key, value);
            }
        }
        query.finish()
    }

    /// Whether `entry` passes.
    pub fn matches(&self, entry: &DeliveryEntry) -> bool {
        let part = |wanted: &Option<String>, value: &Option<String>| {
            wanted
                .as_ref()
                .is_none_or(|w| value.as_ref().is_some_and(|v| v.contains(w.as_str())))
        };
        part(&self.nonce, &entry.nonce)
            && part(&self.client, &entry.client)
            && self.outcome.as_ref().is_none_or(|o| *o == entry.outcome)
            && self.endpoint.as_ref().is_none_or(|e| *e == entry.endpoint)
    }
}

fn entry(recorded: &Recorded, attempt: u32) -> DeliveryEntry {
    let note = &recorded.note;
    DeliveryEntry {
        seq: recorded.seq,
        at: recorded.at,
        endpoint: note.endpoint.unwrap_or("unknown").to_owned(),
        request_id: recorded.request_id.clone(),
        trace_id: recorded.trace.trace_id(),
        nonce: note.nonce.clone(),
        client: note.client.clone(),
        reference_id: note.reference_id.map(|id| id.to_string()),
        transaction_status: note.transaction_status,
        validation_id: note.validation_id,
        outcome: outcome(note.outcome, recorded.status).to_owned(),
        status: recorded.status,
        message: message(&recorded.answer),
        latency_ms: recorded.latency.as_secs_f64() * 1e3,
        signature: signature(note.signature.as_ref()),
        attempt,
        duplicate: matches!(note.outcome, Some(Outcome::Duplicate | Outcome::Replayed)),
    }
}

fn detail(recorded: &Recorded, attempt: u32) -> DeliveryDetail {
    let body = recorded.note.body.as_deref().unwrap_or_default();
    DeliveryDetail {
        entry: entry(recorded, attempt),
        headers: recorded
            .note
            .headers
            .as_deref()
            .map(header_pairs)
            .unwrap_or_default(),
        body: String::from_utf8_lossy(&body[..body.len().min(BODY_KEPT)]).into_owned(),
        body_truncated: body.len() > BODY_KEPT,
        answer: String::from_utf8_lossy(&recorded.answer).into_owned(),
    }
}

/// Every outcome [`outcome`] gives, for filters.
pub(crate) const OUTCOMES: [&str; 10] = [
    "booked",
    "held",
    "duplicate",
    "allowed",
    "denied",
    "postponed",
    "replayed",
    "answered",
    "refused",
    "failed",
];

/// The note's outcome, else what the status says: the outcome label of the inspector's
/// entries and of `/metrics`' latency histogram.
pub(crate) fn outcome(noted: Option<Outcome>, status: u16) -> &'static str {
    match (noted, status) {
        (_, 500..) => "failed",
        (Some(outcome), _) => outcome.name(),
        (None, 200..=299) => "answered",
        (None, _) => "refused",
    }
}

fn signature(noted: Option<&SignatureNote>) -> String {
    match noted {
        Some(SignatureNote::Verified(Some(key))) => format!("verified (key {key})"),
        Some(SignatureNote::Verified(None)) => "verified".into(),
        Some(SignatureNote::VerifiedBefore) => "verified before (a retry)".into(),
        Some(SignatureNote::Refused(why)) => format!("refused: {why}"),
        None => "not checked".into(),
    }
}

/// The `message` of a `{"message": "..."}` answer.
fn message(answer: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Message {
        message: Option<String>,
    }
    serde_json::from_slice::<Message>(answer).ok()?.message
}

/// The kept headers ([`kept_headers`]) as (name, value) pairs.
fn header_pairs(kept: &str) -> Vec<(String, String)> {
    kept.lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// What of a request's body the note keeps: a copy of it, or of its first [`BODY_KEPT`]
/// bytes and one more to say it was cut. A copy, not a share: the received bytes are a
/// slice of the connection's read buffer, which a share would keep from being reused.
pub(crate) fn kept_body(body: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&body[..body.len().min(BODY_KEPT + 1)])
}

/// A request's headers as the note keeps them: one `name: value` line each, in one string
/// (copied for the same reason as the body), at most [`HEADERS_KEPT`] bytes of them.
///
/// Only the values of [`RequestContext::SHOWN_HEADERS`] and of the signature's header
/// (`signature`) are kept, each cut at 1,024 bytes; any other value is kept as `[redacted]`,
/// since a credential may be in any header (a shared secret's header is the merchant's to
/// name). A secret is never copied, so it can be neither shown nor kept in memory.
pub(crate) fn kept_headers(headers: &HeaderMap, signature: Option<&HeaderName>) -> String {
    let mut text = String::with_capacity(512);
    let mut left_out = 0;
    for (name, value) in headers {
        if text.len() >= HEADERS_KEPT {
            left_out += 1;
            continue;
        }
        text.push_str(&cut_bytes(name.as_str(), HEADER_PART_KEPT));
        text.push_str(": ");
        let shown = RequestContext::shows(name) || signature.is_some_and(|header| header == name);
        if shown {
            // Header values are ASCII but for a rare sender's: `from_utf8` checks a word at
            // a time where `from_utf8_lossy` walks each byte (about 2,700 instructions per
            // signed callback, most of them the signature's value).
            let value = match std::str::from_utf8(value.as_bytes()) {
                Ok(value) => std::borrow::Cow::Borrowed(value),
                Err(_) => String::from_utf8_lossy(value.as_bytes()),
            };
            text.push_str(&cut_bytes(&value, HEADER_PART_KEPT));
        } else {
            text.push_str(REDACTED);
        }
        text.push('\n');
    }
    if left_out > 0 {
        text.push_str(&format!("…: {left_out} more headers, not kept\n"));
    }
    text
}

/// An identifier from a request's body as the note keeps it: at most `max_chars`
/// characters (`server.max_identifier_chars`: a longer one is refused anyway) and `…`.
pub(crate) fn kept_identifier(identifier: &str, max_chars: usize) -> String {
    cut_chars(identifier, max_chars).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn answered(status: u16, message: &str) -> Answered {
        Answered {
            request_id: "r".into(),
            trace: crate::trace_context::TraceContext::new_trace(),
            status,
            answer: Bytes::from(format!(r#"{{"message":"{message}"}}"#)),
            latency: Duration::from_millis(3),
        }
    }

    fn callback(nonce: &str, outcome: Option<Outcome>) -> Note {
        Note {
            endpoint: Some("callback"),
            nonce: Some(nonce.into()),
            transaction_status: Some(4),
            outcome,
            admitted: true,
            ..Note::default()
        }
    }

    /// A callback refused before it was admitted (a forged signature).
    fn forged(nonce: &str) -> Note {
        Note {
            admitted: false,
            signature: Some(SignatureNote::Refused("invalid signature".into())),
            ..callback(nonce, None)
        }
    }

    #[tokio::test]
    async fn refused_requests_take_a_fifth_of_the_list_and_push_no_admitted_one_out() {
        let inspector = Inspector::new(10).unwrap();
        inspector.record(callback("a", Some(Outcome::Booked)), answered(200, "ok"));
        for i in 0..50 {
            inspector.record(
                forged(&format!("f-{i}")),
                answered(401, "invalid signature"),
            );
        }
        inspector.record(callback("b", Some(Outcome::Booked)), answered(200, "ok"));
        inspector.record(forged("f-last"), answered(401, "invalid signature"));
        let all = DeliveryFilter::default();
        let list = inspector
            .list(&all, 0, (100, Window::Newest), Duration::ZERO)
            .await;
        let seen: Vec<_> = list
            .deliveries
            .iter()
            .map(|d| (d.seq, d.nonce.as_deref().unwrap_or("-"), d.status))
            .collect();
        assert_eq!(
            seen,
            [
                (1, "a", 200),
                (51, "f-49", 401),
                (52, "b", 200),
                (53, "f-last", 401)
            ]
        );
        assert_eq!(list.last, 53);
        // Admitted ones still go first when the list is full, refused ones among them.
        for i in 0..10 {
            inspector.record(
                callback(&format!("c-{i}"), Some(Outcome::Booked)),
                answered(200, "ok"),
            );
        }
        let list = inspector
            .list(&all, 0, (100, Window::Newest), Duration::ZERO)
            .await;
        assert_eq!(list.deliveries.len(), 10);
        assert!(list.deliveries.iter().all(|d| d.status == 200));
        let recent = inspector.lock();
        assert_eq!((recent.refused.len(), recent.refused_bytes), (0, 0));
        assert_eq!(
            recent.bytes,
            recent.in_order().map(Recorded::size).sum::<usize>()
        );
    }

    #[tokio::test]
    async fn large_refused_requests_take_a_fifth_of_the_bytes() {
        let inspector = Inspector::new(10_000).unwrap();
        let body = Bytes::from(vec![b'x'; BODY_KEPT]);
        let genuine = |i: usize| Note {
            body: Some(body.clone()),
            ..callback(&format!("g-{i}"), Some(Outcome::Booked))
        };
        // Admitted ones fill the bytes, then many times as much of forged ones arrive.
        let fill = KEPT_BYTES / BODY_KEPT;
        for i in 0..fill {
            inspector.record(genuine(i), answered(200, "ok"));
        }
        for i in 0..3 * fill {
            let forged = Note {
                body: Some(body.clone()),
                ..forged(&format!("f-{i}"))
            };
            inspector.record(forged, answered(401, "invalid signature"));
        }
        let recent = inspector.lock();
        assert!(recent.bytes <= KEPT_BYTES);
        assert!(recent.refused_bytes <= KEPT_BYTES / REFUSED_SHARE);
        assert!(
            recent.admitted.len() >= fill * 3 / 4,
            "{} admitted kept of {fill}",
            recent.admitted.len()
        );
        let seqs: Vec<u64> = recent.in_order().map(|r| r.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order");
        assert_eq!(recent.last_seq(), (4 * fill) as u64);
    }

    #[tokio::test]
    async fn keeps_the_last_n_counts_attempts_and_says_what_was_missed() {
        let inspector = Inspector::new(3).unwrap();
        inspector.record(callback("a", None), answered(503, "handler failed"));
        inspector.record(
            callback("a", Some(Outcome::Booked)),
            answered(200, "callback accepted"),
        );
        inspector.record(
            callback("a", Some(Outcome::Duplicate)),
            answered(200, "callback already processed"),
        );
        inspector.record(callback("b", Some(Outcome::Booked)), answered(200, "ok"));
        let all = DeliveryFilter::default();
        let list = inspector
            .list(&all, 0, (10, Window::Newest), Duration::ZERO)
            .await;
        assert_eq!(list.last, 4);
        assert_eq!(list.missed, None);
        let seen: Vec<_> = list
            .deliveries
            .iter()
            .map(|d| (d.seq, d.outcome.as_str(), d.attempt, d.duplicate))
            .collect();
        // The first delivery of `a` is gone: attempts count among the recent ones.
        assert_eq!(
            seen,
            [
                (2, "booked", 1, false),
                (3, "duplicate", 2, true),
                (4, "booked", 1, false)
            ]
        );
        assert_eq!(
            list.deliveries[1].message.as_deref(),
            Some("callback already processed")
        );
        let after_one = inspector
            .list(&all, 1, (10, Window::Newest), Duration::ZERO)
            .await;
        assert_eq!(after_one.missed, None);
        let late = Inspector::new(1).unwrap();
        for _ in 0..4 {
            late.record(callback("c", None), answered(503, "x"));
        }
        assert_eq!(
            late.list(&all, 1, (10, Window::Newest), Duration::ZERO)
                .await
                .missed,
            Some(2)
        );
        let failed = DeliveryFilter::from_query("outcome=failed");
        assert!(
            inspector
                .list(&failed, 0, (10, Window::Newest), Duration::ZERO)
                .await
                .deliveries
                .is_empty()
        );
        let only_b = DeliveryFilter::from_query("nonce=b");
        assert_eq!(
            inspector
                .list(&only_b, 0, (10, Window::Newest), Duration::ZERO)
                .await
                .deliveries
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn a_follower_gets_the_oldest_first_and_is_told_there_is_more() {
        let inspector = Inspector::new(10).unwrap();
        for n in 0..5 {
            inspector.record(
                callback(&format!("n{n}"), Some(Outcome::Booked)),
                answered(200, "ok"),
            );
        }
        let all = DeliveryFilter::default();
        let seqs = |list: &DeliveryList| list.deliveries.iter().map(|d| d.seq).collect::<Vec<_>>();
        let newest = inspector
            .list(&all, 0, (2, Window::Newest), Duration::ZERO)
            .await;
        assert_eq!(
            (seqs(&newest), newest.last, newest.more),
            (vec![4, 5], 5, false)
        );
        let mut after = 0;
        let mut followed = Vec::new();
        loop {
            let page = inspector
                .list(&all, after, (2, Window::Oldest), Duration::ZERO)
                .await;
            followed.extend(seqs(&page));
            after = page.last;
            if !page.more {
                break;
            }
        }
        assert_eq!(followed, [1, 2, 3, 4, 5]);
        assert_eq!(after, 5);
        // Another process numbers from 1 again: its name tells it apart.
        let restarted = Inspector::new(10).unwrap();
        assert_ne!(
            restarted
                .list(&all, 0, (2, Window::Oldest), Duration::ZERO)
                .await
                .instance,
            newest.instance
        );
    }

    #[test]
    fn every_outcome_given_is_one_a_filter_offers() {
        let noted = [
            None,
            Some(Outcome::Booked),
            Some(Outcome::Held),
            Some(Outcome::Duplicate),
            Some(Outcome::Allowed),
            Some(Outcome::Denied),
            Some(Outcome::Postponed),
            Some(Outcome::Replayed),
        ];
        for noted in noted {
            for status in [200, 401, 403, 503] {
                let given = outcome(noted, status);
                assert!(OUTCOMES.contains(&given), "{given}");
            }
        }
    }

    #[tokio::test]
    async fn a_waiting_list_is_answered_when_a_delivery_is_recorded() {
        let inspector = std::sync::Arc::new(Inspector::new(10).unwrap());
        let waiting = {
            let inspector = std::sync::Arc::clone(&inspector);
            tokio::spawn(async move {
                inspector
                    .list(
                        &DeliveryFilter::default(),
                        0,
                        (10, Window::Newest),
                        Duration::from_secs(3600),
                    )
                    .await
            })
        };
        // It waits before anything is recorded ...
        while inspector.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        inspector.record(callback("w", Some(Outcome::Booked)), answered(200, "ok"));
        // ... and is woken by the record, not by its hour running out.
        let list = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken by the delivery")
            .unwrap();
        assert_eq!(list.deliveries.len(), 1);
        assert_eq!(list.deliveries[0].nonce.as_deref(), Some("w"));
    }

    #[test]
    fn only_known_headers_are_kept_and_a_long_body_is_cut() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer secret-token".parse().unwrap());
        headers.insert("x-aggregator-token", "shared-secret".parse().unwrap());
        headers.insert("x-signature", "c2ln".parse().unwrap());
        headers.insert("x-sign", "c2lnMg==".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        let sign = HeaderName::from_static("x-sign");
        let kept = kept_headers(&headers, Some(&sign));
        assert!(!kept.contains("secret"), "{kept}");
        let shown = header_pairs(&kept);
        assert!(shown.contains(&("authorization".into(), REDACTED.into())));
        assert!(shown.contains(&("x-aggregator-token".into(), REDACTED.into())));
        assert!(shown.contains(&("x-signature".into(), "c2ln".into())));
        assert!(shown.contains(&("x-sign".into(), "c2lnMg==".into())));
        assert!(shown.contains(&("content-type".into(), "application/json".into())));
        // Without the verifier's header, its value is not known to be a signature.
        let kept = kept_headers(&headers, None);
        assert!(header_pairs(&kept).contains(&("x-sign".into(), REDACTED.into())));
        let long = Bytes::from(vec![b'x'; BODY_KEPT + 10]);
        let kept = kept_body(&long);
        assert_eq!(kept.len(), BODY_KEPT + 1);
        let inspector = Inspector::new(1).unwrap();
        let mut note = callback("n", None);
        note.body = Some(kept);
        note.headers = Some(kept_headers(&headers, None));
        inspector.record(note, answered(503, "x"));
        let detail = inspector.detail(1).unwrap();
        assert!(detail.body_truncated);
        assert_eq!(detail.body.len(), BODY_KEPT);
        assert!(!format!("{detail:?}").contains("secret"));
    }

    #[test]
    fn headers_are_kept_within_their_bytes() {
        let mut headers = HeaderMap::new();
        headers.insert("user-agent", "é".repeat(2000).parse().unwrap());
        for i in 0..100 {
            headers.insert(
                HeaderName::try_from(format!("x-{i:03}-{}", "n".repeat(3000))).unwrap(),
                "v".repeat(4000).parse().unwrap(),
            );
        }
        let kept = kept_headers(&headers, None);
        assert!(
            kept.len() < HEADERS_KEPT + 2 * HEADER_PART_KEPT + 64,
            "{}",
            kept.len()
        );
        let pairs = header_pairs(&kept);
        let agent = &pairs
            .iter()
            .find(|(name, _)| name == "user-agent")
            .unwrap()
            .1;
        assert!(agent.len() <= HEADER_PART_KEPT + '…'.len_utf8());
        assert!(agent.ends_with("é…"), "cut on a character's boundary");
        let (last_name, last_value) = pairs.last().unwrap();
        assert_eq!(last_name, "…");
        let left_out: usize = last_value
            .strip_suffix(" more headers, not kept")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(left_out + pairs.len() - 1, headers.len());
    }

    #[test]
    fn identifiers_are_kept_to_the_longest_accepted() {
        assert_eq!(kept_identifier("n-1", 16), "n-1");
        assert_eq!(kept_identifier(&"ü".repeat(16), 16), "ü".repeat(16));
        assert_eq!(
            kept_identifier(&"ü".repeat(17), 16),
            format!("{}…", "ü".repeat(16))
        );
    }

    #[test]
    fn the_recorded_requests_are_kept_within_their_bytes() {
        let inspector = Inspector::new(10_000).unwrap();
        let body = Bytes::from(vec![b'x'; BODY_KEPT + 1]);
        let records = 2 * KEPT_BYTES / BODY_KEPT;
        for i in 0..records {
            let mut note = callback(&format!("n-{i}"), None);
            note.body = Some(body.clone());
            inspector.record(note, answered(400, "x"));
        }
        let recent = inspector.lock();
        assert!(recent.bytes <= KEPT_BYTES, "{}", recent.bytes);
        assert_eq!(
            recent.bytes,
            recent.in_order().map(Recorded::size).sum::<usize>()
        );
        // The oldest went, the newest stay.
        assert!(recent.len() < records / 2);
        assert_eq!(recent.last_seq(), records as u64);
        drop(recent);
        // Within the bytes, the count still bounds them.
        let counted = Inspector::new(3).unwrap();
        for i in 0..5 {
            counted.record(callback(&format!("n-{i}"), None), answered(200, "ok"));
        }
        assert_eq!(counted.lock().len(), 3);
    }

    #[test]
    fn a_header_value_that_is_not_utf8_is_kept_with_replacement_characters() {
        let mut headers = HeaderMap::new();
        headers.insert("user-agent", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        headers.insert("x-request-id", "r-1".parse().unwrap());
        assert_eq!(
            kept_headers(&headers, None),
            "user-agent: caf\u{fffd}\nx-request-id: r-1\n"
        );
    }
}
