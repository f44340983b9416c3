//! What one request's handling learns about it, noted as it goes: the task-local [`Note`]
//! that the ingress, the endpoints and exactly-once delivery fill in, and that the app hands
//! to the [`super::Inspector`] with the answer.
//!
//! Every request has one (its endpoint and outcome label `/metrics`' latency histogram);
//! what is copied from the request — identifiers, headers, body — is noted only while the
//! inspector records. Outside a request [`with`] does nothing.
//! The tasks a request spawns (its detached delivery, its handler) carry it with
//! [`current`] and [`scope`].

use bytes::Bytes;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// What became of a request, as far as the request itself tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A callback whose handler acknowledged it; booked.
    Booked,
    /// A callback whose handler acknowledged it, but held it instead of booking it.
    Held,
    /// A callback acknowledged before: answered 200 without the handler.
    Duplicate,
    /// A validation allowed (or a providers validation answered).
    Allowed,
    /// A validation denied.
    Denied,
    /// A validation postponed (Awaitable): decided later.
    Postponed,
    /// A repeated validation answered from its record.
    Replayed,
}

impl Outcome {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Booked => "booked",
            Self::Held => "held",
            Self::Duplicate => "duplicate",
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Postponed => "postponed",
            Self::Replayed => "replayed",
        }
    }
}

/// How the request's signature went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SignatureNote {
    /// Verified with the public key (its id, when the key has one).
    Verified(Option<String>),
    /// The same (signature, body) verified before: a retry.
    VerifiedBefore,
    /// Missing, malformed or forged: why.
    Refused(String),
}

/// One request's note. Only the inspector reads it.
#[derive(Default)]
pub(crate) struct Note {
    /// The inspector records this request: its identifiers, headers and body are kept.
    /// Otherwise only what `/metrics` needs is noted (endpoint and outcome).
    pub(crate) recording: bool,
    pub(crate) endpoint: Option<&'static str>,
    pub(crate) nonce: Option<String>,
    pub(crate) client: Option<String>,
    pub(crate) reference_id: Option<uuid::Uuid>,
    pub(crate) transaction_status: Option<i32>,
    pub(crate) validation_id: Option<i64>,
    pub(crate) outcome: Option<Outcome>,
    /// Admitted: its caller's credentials, address and signature passed. One that was not
    /// could have been sent by anyone who reaches the endpoint.
    pub(crate) admitted: bool,
    pub(crate) signature: Option<SignatureNote>,
    /// The request's headers, one `name: value` line each, the values of all but the
    /// harmless ones redacted ([`super::kept_headers`]).
    pub(crate) headers: Option<String>,
    pub(crate) body: Option<Bytes>,
}

// Headers and bodies carry credentials and payment data: never in `Debug` output.
impl std::fmt::Debug for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Note")
            .field("endpoint", &self.endpoint)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

/// A note shared by the tasks of one request.
pub(crate) type SharedNote = Arc<Mutex<Note>>;

tokio::task_local! {
    static CURRENT: Option<SharedNote>;
}

/// A new, empty note; `recording` when the inspector keeps the request.
pub(crate) fn new(recording: bool) -> SharedNote {
    Arc::new(Mutex::new(Note {
        recording,
        ..Note::default()
    }))
}

/// The note of the request this task works for, if it has one.
pub(crate) fn current() -> Option<SharedNote> {
    CURRENT.try_with(Clone::clone).ok().flatten()
}

/// Runs `future` with `note` as its note ([`with`] writes to it there); without one, simply
/// runs it.
///
/// A plain wrapper, not an `async fn`, so that `future` is held once (see
/// [`crate::trace_context::TraceContext::scope`]).
pub(crate) fn scope<F: Future>(
    note: Option<SharedNote>,
    future: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(note, future)
}

/// Notes something about the current request; nothing outside a request.
pub(crate) fn with(write: impl FnOnce(&mut Note)) {
    let _ = CURRENT.try_with(|note| {
        if let Some(note) = note {
            write(
                &mut note
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
    });
}

/// Notes what only the inspector keeps (identifiers, headers, body, signature details):
/// nothing is copied when it does not record.
pub(crate) fn kept(write: impl FnOnce(&mut Note)) {
    with(|note| {
        if note.recording {
            write(note);
        }
    });
}
