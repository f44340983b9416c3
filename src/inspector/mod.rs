//! The inspector: what the service received on its three endpoints and what it answered,
//! for the last few hundred requests, and as it happens.
//!
//! When a payment goes wrong, the questions are: did the callback arrive, what did we
//! answer, was the signature good, is it being retried, which validations wait for us, did
//! our decision reach the aggregator? The running service answers them under its operating
//! API (`/payhook/admin/`, behind the admin token, loopback by default):
//!
//! * `GET /payhook/admin/inspector` — a page: recent deliveries (filter by nonce, client,
//!   outcome; each one's raw request with credential headers redacted), failing callbacks,
//!   postponed validations with **Approve** / **Deny**, the outbox with **Retry now**, and
//!   the service's health. It updates itself; it needs no external asset and no build step.
//! * `GET /payhook/admin/deliveries?after=SEQ&wait=SECONDS` — the same deliveries as JSON
//!   ([`DeliveryList`]), answered as soon as one newer than `SEQ` is recorded (long poll):
//!   what `payhook tail` follows.
//! * `GET /payhook/admin/deliveries/{seq}` — one delivery with its request ([`DeliveryDetail`]).
//!
//! Recording is on with the operating API and keeps the last `admin.inspector_recent`
//! requests (default 500; 0 turns recording off). A request's raw body is kept up to
//! [`BODY_KEPT`] bytes. What it costs the callback path is one lock and a few small copies
//! per request; `bench_callbacks` measures B with recording on and off.
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
use http::HeaderMap;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use note::{Note, Outcome, SignatureNote};

/// Bytes of a request's body the inspector keeps (the rest is cut, and said so).
pub const BODY_KEPT: usize = 64 * 1024;

/// Headers whose values are never shown: credentials.
const REDACTED: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
];

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

/// The recent deliveries, and a way to wait for the next one. Held by the app when its
/// operating API is on.
pub(crate) struct Inspector {
    capacity: usize,
    /// Oldest first; never empty once something was recorded (capacity is at least 1), so
    /// the last one's number is the last number given.
    recent: Mutex<VecDeque<Recorded>>,
    recorded: tokio::sync::Notify,
    /// Lists waiting for the next delivery: [`Inspector::record`] wakes them only when
    /// there are some.
    waiting: std::sync::atomic::AtomicUsize,
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
            recent: Mutex::new(VecDeque::with_capacity(capacity)),
            recorded: tokio::sync::Notify::new(),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// How many deliveries it keeps.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records one answered request of an endpoint.
    pub(crate) fn record(&self, note: Note, answered: Answered) {
        let mut recent = self.lock();
        let seq = last_seq(&recent) + 1;
        if recent.len() == self.capacity {
            recent.pop_front();
        }
        recent.push_back(Recorded {
            seq,
            at: Utc::now(),
            request_id: answered.request_id,
            trace: answered.trace,
            note,
            status: answered.status,
            answer: answered.answer,
            latency: answered.latency,
        });
        drop(recent);
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.recorded.notify_waiters();
        }
    }

    /// The deliveries after `after` that pass `filter`, oldest first, at most `limit` (the
    /// newest ones when more passed); waits up to `wait` for one when there is none yet.
    pub(crate) async fn list(
        &self,
        filter: &DeliveryFilter,
        after: u64,
        limit: usize,
        wait: Duration,
    ) -> DeliveryList {
        if wait.is_zero() {
            return self.list_now(filter, after, limit);
        }
        let deadline = tokio::time::Instant::now() + wait;
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waited = Waiting(&self.waiting);
        loop {
            // Registered before looking, so that a delivery recorded in between wakes it.
            let recorded = self.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            let list = self.list_now(filter, after, limit);
            if !list.deliveries.is_empty() {
                return list;
            }
            if tokio::time::timeout_at(deadline, recorded).await.is_err() {
                return self.list_now(filter, after, limit);
            }
        }
    }

    fn list_now(&self, filter: &DeliveryFilter, after: u64, limit: usize) -> DeliveryList {
        let recent = self.lock();
        let last = last_seq(&recent);
        let oldest = recent.front().map_or(last + 1, |r| r.seq);
        // `after` is the caller's: any number, `u64::MAX` included.
        let missed = (after > 0 && after.saturating_add(1) < oldest).then(|| oldest - after - 1);
        let mut attempts = Attempts::default();
        let mut deliveries: Vec<DeliveryEntry> = recent
            .iter()
            .map(|r| (r, attempts.count(r)))
            .filter(|(r, _)| r.seq > after)
            .map(|(r, attempt)| entry(r, attempt))
            .filter(|e| filter.matches(e))
            .collect();
        if deliveries.len() > limit {
            deliveries.drain(..deliveries.len() - limit);
        }
        DeliveryList {
            last,
            missed,
            deliveries,
        }
    }

    /// One delivery with its request, while it is among the recent ones.
    pub(crate) fn detail(&self, seq: u64) -> Option<DeliveryDetail> {
        let recent = self.lock();
        let mut attempts = Attempts::default();
        let (recorded, attempt) = recent
            .iter()
            .take_while(|r| r.seq <= seq)
            .map(|r| (r, attempts.count(r)))
            .last()
            .filter(|(r, _)| r.seq == seq)?;
        Some(detail(recorded, attempt))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Recorded>> {
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The number of the last delivery kept; 0 before the first.
fn last_seq(recent: &VecDeque<Recorded>) -> u64 {
    recent.back().map_or(0, |r| r.seq)
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
    /// `booked`, `duplicate`, `allowed`, `denied`, `postponed`, `replayed`, `answered`,
    /// `refused` (4xx) or `failed` (5xx).
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
    /// The request's headers, credentials redacted.
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
            .map(redacted)
            .unwrap_or_default(),
        body: String::from_utf8_lossy(&body[..body.len().min(BODY_KEPT)]).into_owned(),
        body_truncated: body.len() > BODY_KEPT,
        answer: String::from_utf8_lossy(&recorded.answer).into_owned(),
    }
}

/// Every outcome [`outcome`] gives, for filters.
pub(crate) const OUTCOMES: [&str; 9] = [
    "booked",
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

/// The kept headers ([`kept_headers`]) with credentials' values replaced.
fn redacted(kept: &str) -> Vec<(String, String)> {
    kept.lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| {
            let shown = if REDACTED.contains(&name) {
                "[redacted]"
            } else {
                value
            };
            (name.to_owned(), shown.to_owned())
        })
        .collect()
}

/// What of a request's body the note keeps: a copy of it, or of its first [`BODY_KEPT`]
/// bytes and one more to say it was cut. A copy, not a share: the received bytes are a
/// slice of the connection's read buffer, which a share would keep from being reused.
pub(crate) fn kept_body(body: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&body[..body.len().min(BODY_KEPT + 1)])
}

/// A request's headers as the note keeps them: one `name: value` line each, in one string
/// (copied for the same reason as the body).
pub(crate) fn kept_headers(headers: &HeaderMap) -> String {
    let mut text = String::with_capacity(512);
    for (name, value) in headers {
        text.push_str(name.as_str());
        text.push_str(": ");
        // Header values are ASCII but for a rare sender's: `from_utf8` checks a word at a
        // time where `from_utf8_lossy` walks each byte (about 2,700 instructions per signed
        // callback, most of them the signature's value).
        match std::str::from_utf8(value.as_bytes()) {
            Ok(value) => text.push_str(value),
            Err(_) => text.push_str(&String::from_utf8_lossy(value.as_bytes())),
        }
        text.push('\n');
    }
    text
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
            ..Note::default()
        }
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
        let list = inspector.list(&all, 0, 10, Duration::ZERO).await;
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
        let after_one = inspector.list(&all, 1, 10, Duration::ZERO).await;
        assert_eq!(after_one.missed, None);
        let late = Inspector::new(1).unwrap();
        for _ in 0..4 {
            late.record(callback("c", None), answered(503, "x"));
        }
        assert_eq!(late.list(&all, 1, 10, Duration::ZERO).await.missed, Some(2));
        let failed = DeliveryFilter::from_query("outcome=failed");
        assert!(
            inspector
                .list(&failed, 0, 10, Duration::ZERO)
                .await
                .deliveries
                .is_empty()
        );
        let only_b = DeliveryFilter::from_query("nonce=b");
        assert_eq!(
            inspector
                .list(&only_b, 0, 10, Duration::ZERO)
                .await
                .deliveries
                .len(),
            1
        );
    }

    #[test]
    fn every_outcome_given_is_one_a_filter_offers() {
        let noted = [
            None,
            Some(Outcome::Booked),
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
                    .list(&DeliveryFilter::default(), 0, 10, Duration::from_secs(3600))
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
    fn credentials_are_redacted_and_a_long_body_is_cut() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer secret-token".parse().unwrap());
        headers.insert("x-signature", "c2ln".parse().unwrap());
        let shown = redacted(&kept_headers(&headers));
        assert!(shown.contains(&("authorization".into(), "[redacted]".into())));
        assert!(shown.contains(&("x-signature".into(), "c2ln".into())));
        let long = Bytes::from(vec![b'x'; BODY_KEPT + 10]);
        let kept = kept_body(&long);
        assert_eq!(kept.len(), BODY_KEPT + 1);
        let inspector = Inspector::new(1).unwrap();
        let mut note = callback("n", None);
        note.body = Some(kept);
        note.headers = Some(kept_headers(&headers));
        inspector.record(note, answered(503, "x"));
        let detail = inspector.detail(1).unwrap();
        assert!(detail.body_truncated);
        assert_eq!(detail.body.len(), BODY_KEPT);
        assert!(!format!("{detail:?}").contains("secret-token"));
    }

    #[test]
    fn a_header_value_that_is_not_utf8_is_kept_with_replacement_characters() {
        let mut headers = HeaderMap::new();
        headers.insert("x-merchant", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        headers.insert("x-request-id", "r-1".parse().unwrap());
        assert_eq!(
            kept_headers(&headers),
            "x-merchant: caf\u{fffd}\nx-request-id: r-1\n"
        );
    }
}
