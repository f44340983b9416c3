//! W3C Trace Context: the `traceparent` header that connects the aggregator's call to the
//! merchant's own traces.
//!
//! Every request payhook answers runs in a trace context: the caller's, when it sent a valid
//! `traceparent` (payhook's request is then a child span of the caller's), else a new trace.
//! The request's span carries `trace_id` and `span_id` (and `parent_span_id` when the
//! caller sent one), so every log line of the request names its trace. The [`gateway`]
//! client sends a `traceparent` on every call, as a child of the context it runs in: a
//! transaction lookup made while answering a request belongs to that request's trace; a
//! call made outside any request (the outbox's deliveries, the session's refresh) starts a
//! trace of its own.
//!
//! The header is read as the W3C recommendation (level 1) says: version `00` is exactly
//! `00-{32 hex trace id}-{16 hex parent id}-{2 hex flags}`, lower-case hex only, neither id
//! all zeros; a later version is read by its first 55 characters when the next one is `-`
//! (or there is none); version `ff` is invalid. An invalid header is ignored (a new trace
//! starts), never refused: tracing must not cost a payment.
//!
//! [`gateway`]: crate::gateway
//!
//! ```
//! use payhook::trace_context::TraceContext;
//!
//! let incoming =
//!     TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
//! assert_eq!(incoming.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
//! let ours = incoming.child();
//! assert_eq!(ours.trace_id(), incoming.trace_id());
//! assert_ne!(ours.span_id(), incoming.span_id());
//! assert!(ours.header_value().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
//! assert_eq!(TraceContext::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), None);
//! ```

use std::cell::Cell;
use std::future::Future;

use ring::rand::{SecureRandom, SystemRandom};

/// The request header, and the header payhook's gateway client sends.
pub const HEADER: &str = "traceparent";

/// Length of a version-00 `traceparent` value.
const LENGTH: usize = 55;
/// The `sampled` trace flag.
const SAMPLED: u8 = 0x01;
/// The flags a `traceparent` of version 00 may carry: `sampled`, and trace context level
/// 2's `random` (the trace id's right part is random), kept as the trace id is. The others
/// are reserved, and a sender sets them to zero, whatever a caller set.
const DEFINED_FLAGS: u8 = SAMPLED | 0x02;

/// One span's place in a trace: the trace's id, the span's id and the trace flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

tokio::task_local! {
    static CURRENT: Option<TraceContext>;
}

impl TraceContext {
    /// Reads a `traceparent` value; `None` when it is not a valid one.
    pub fn parse(value: &str) -> Option<Self> {
        let bytes = value.as_bytes();
        if bytes.len() < LENGTH || (bytes.len() > LENGTH && bytes[LENGTH] != b'-') {
            return None;
        }
        let version = hex::<1>(&bytes[0..2])?[0];
        if version == 0xff || (version == 0 && bytes.len() != LENGTH) {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex::<16>(&bytes[3..35])?;
        let span_id = hex::<8>(&bytes[36..52])?;
        let flags = hex::<1>(&bytes[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The context of a new trace's first span (not sampled: the decision is the tracing
    /// backend's).
    pub fn new_trace() -> Self {
        Self {
            trace_id: random(),
            span_id: random(),
            flags: 0,
        }
    }

    /// A span of the same trace under this one: a new span id, the same flags.
    #[must_use]
    pub fn child(&self) -> Self {
        Self {
            span_id: random(),
            ..*self
        }
    }

    /// The context the current task runs in, set by [`Self::scope`]: payhook runs each
    /// request in its own.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(|context| *context).ok().flatten()
    }

    /// Runs `future` in this context: [`Self::current`] returns it there.
    ///
    /// A plain wrapper, not an `async fn`: an `async fn` would keep `future` twice in its
    /// own state (as its argument and inside the scope it awaits), and a request's future
    /// is large; every move of it (hyper's, a task spawn's) copies all of it.
    pub fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        Self::scope_of(Some(self), future)
    }

    /// Runs `future` in `context` when there is one, else outside any ([`Self::current`]
    /// returns `None` there).
    pub(crate) fn scope_of<F: Future>(
        context: Option<Self>,
        future: F,
    ) -> impl Future<Output = F::Output> {
        CURRENT.scope(context, future)
    }

    /// A context of the given ids and flags (e.g. an exporter's span).
    pub fn from_parts(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Self {
        Self {
            trace_id,
            span_id,
            flags,
        }
    }

    /// The trace id's 16 bytes.
    pub fn trace_id_bytes(&self) -> [u8; 16] {
        self.trace_id
    }

    /// This span's id's 8 bytes.
    pub fn span_id_bytes(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace flags (`01`: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The trace id, 32 lower-case hex digits.
    pub fn trace_id(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// This span's id, 16 lower-case hex digits.
    pub fn span_id(&self) -> String {
        to_hex(&self.span_id)
    }

    /// Whether the trace's caller sampled it.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The `traceparent` value that makes a callee's span a child of this one (version 00,
    /// reserved flags zero).
    pub fn header_value(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id(),
            self.span_id(),
            self.flags & DEFINED_FLAGS
        )
    }
}

/// `N` bytes from `2 * N` lower-case hex digits.
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    let digit = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    (digits.len() == 2 * N).then_some(out)
}

/// Lower-case hex, two digits a byte (each request formats its trace and span ids).
fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// `N` pseudo-random bytes, never all zeros (an id of zeros is invalid): splitmix64 per
/// thread, seeded from the system's randomness once, so that a request's ids cost no system
/// call. For ids that need to be unique, not secret: trace ids, request ids.
pub(crate) fn random<const N: usize>() -> [u8; N] {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(seed());
    }
    let mut bytes = [0u8; N];
    while bytes == [0u8; N] {
        for chunk in bytes.chunks_mut(8) {
            let next = STATE.with(|state| {
                let mut z = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
                state.set(z);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            });
            chunk.copy_from_slice(&next.to_le_bytes()[..chunk.len()]);
        }
    }
    bytes
}

/// A thread's first state: from the system's randomness, else from the clock and the
/// thread (tracing never stops a payment).
fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if SystemRandom::new().fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&std::thread::current().id(), &mut hasher);
    std::hash::Hasher::write_u128(
        &mut hasher,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    std::hash::Hasher::finish(&hasher)
}

/// Makes `span` a child of `caller` (when the caller sent a `traceparent`) and returns the
/// trace context the request (or the gateway's call) runs in: the exported span's ids when
/// an OpenTelemetry layer exports it (see `telemetry`, feature `otel`), else `ours`
/// unchanged.
#[cfg(feature = "otel")]
pub(crate) fn adopt(
    span: &tracing::Span,
    caller: Option<TraceContext>,
    ours: TraceContext,
) -> TraceContext {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if let Some(caller) = caller {
        let remote = SpanContext::new(
            TraceId::from_bytes(caller.trace_id_bytes()),
            SpanId::from_bytes(caller.span_id_bytes()),
            TraceFlags::new(caller.flags()),
            true,
            TraceState::default(),
        );
        let parent = opentelemetry::Context::new().with_remote_span_context(remote);
        let _ = span.set_parent(parent);
    }
    let context = span.context();
    let exported = context.span().span_context().clone();
    if exported.is_valid() {
        TraceContext::from_parts(
            exported.trace_id().to_bytes(),
            exported.span_id().to_bytes(),
            exported.trace_flags().to_u8(),
        )
    } else {
        ours
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_is_read_and_written_back_the_same() {
        let context = TraceContext::parse(VALID).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id(), "00f067aa0ba902b7");
        assert!(context.sampled());
        assert_eq!(context.header_value(), VALID);
    }

    #[test]
    fn invalid_headers_are_refused() {
        for invalid in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(invalid), None, "{invalid:?}");
        }
    }

    /// Flags the caller set that version 00 reserves are not sent on: a callee of a
    /// stricter reading would refuse the header.
    #[test]
    fn reserved_flags_are_not_sent_on() {
        let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff";
        let context = TraceContext::parse(caller).unwrap();
        assert!(context.sampled());
        assert!(context.child().header_value().ends_with("-03"));
        let unsampled = TraceContext::parse(&caller.replace("-ff", "-fc")).unwrap();
        assert!(unsampled.header_value().ends_with("-00"));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let context = TraceContext::parse(later).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"),
            None
        );
    }

    #[test]
    fn children_keep_the_trace_and_new_traces_differ() {
        let parent = TraceContext::parse(VALID).unwrap();
        let child = parent.child();
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_ne!(child.span_id(), parent.span_id());
        assert_eq!(child.sampled(), parent.sampled());
        let (one, two) = (TraceContext::new_trace(), TraceContext::new_trace());
        assert_ne!(one.trace_id(), two.trace_id());
        assert_eq!(TraceContext::parse(&one.header_value()), Some(one));
    }

    #[tokio::test]
    async fn the_current_context_is_the_scopes() {
        assert_eq!(TraceContext::current(), None);
        let context = TraceContext::parse(VALID).unwrap();
        let seen = context.scope(async { TraceContext::current() }).await;
        assert_eq!(seen, Some(context));
    }
}
