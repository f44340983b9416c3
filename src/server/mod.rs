//! The HTTP side: an [`App`] that answers the aggregator's calls, and [`serve`] that runs it
//! on a socket.
//!
//! A request goes through the same steps on every endpoint, each of which can end it with
//! the answer of the status code table (in `src/server/problem.rs`, and in the README):
//!
//! 1. route on the path (404) and the method (405 with `Allow`);
//! 2. require a JSON content type (415);
//! 3. read the body: `Content-Length` over the limit is refused before reading, a body that
//!    grows over it while streaming is cut off (413), a body that does not arrive within
//!    `request_timeout`, or arrives slower than `min_body_rate` after its grace, is answered
//!    408;
//! 4. parse it into the endpoint's typed request (400 naming the field, line and column);
//! 5. run the merchant's handler on its own task, within `handler_timeout`, and turn its
//!    decision into the answer.
//!
//! Each step belongs to a component that owns its state, and a request flows through them
//! one way:
//!
//! ```text
//!   App (routing, /healthz, /readyz, /metrics)
//!    ├─▶ Ingress          (ingress.rs: client address, authentication, body limits,
//!    │                     signature over the raw body, parse, plausibility)
//!    ├─▶ ExactlyOnce      (exactly_once.rs, reconcile.rs: the store's records per nonce,
//!    │      │              waiting deliveries, reconcile of lost callbacks)
//!    │      ├─▶ postponed::Awaitable (the time budget, pending records, late decisions,
//!    │      │                         the outbox worker)
//!    │      └─▶ Runner    (runner.rs: the three handlers, timeouts, failures)
//!    └─▶ OperatingApi     (operating_api.rs: validations, failing callbacks, held results,
//!           │              reconcile, the inspector's page)
//!           └─▶ AdminAccess (admin_access.rs: who may call, the inspector's sessions;
//!                            operators.rs: operators' own tokens and viewers;
//!                            guesses.rs: wrong tokens counted per address;
//!                            credentials.rs: read again while the service runs, on SIGHUP
//!                            or when the operating API asks, with the Ingress's signature
//!                            keys and the gateway's login and TLS files)
//! ```
//!
//! The [`App`] is a plain `Service` (hyper's and tower's), so it can also be mounted inside an
//! existing hyper, tower or axum application; `examples/axum_mount.rs` shows it.
//!
//! Besides the endpoints it serves `/healthz`, `/readyz` and `/metrics` (Prometheus text, see
//! `metrics.rs`; only for `server.metrics_allow_ips`, and only when the peer address is known:
//! a server of your own inserts [`PeerAddr`]).
//!
//! ## Under load and under attack
//!
//! **Hostile clients** — `cargo run --release --example exhaustion` (about 2.5 minutes,
//! loopback only) runs the example merchant as a child process and attacks it without
//! credentials: 2,000 clients sending headers a byte a second, 1,000 sending a body ten
//! bytes a second (under a signature header of the right form that verifies nothing) and
//! 1,000 holding idle HTTP/2 connections, all from 127.0.0.1 and reconnecting whenever they
//! are closed; beside them 50 genuine signed callbacks from 127.0.0.2, then 50 from
//! 127.0.0.1; then 10,000 validations with 4,096-character nonces and client ids (the
//! largest `server.max_identifier_chars` allows); then the records' retention ends and the
//! service idles; last, four addresses hold the whole body memory with 64 bodies of 1 MiB
//! sent at once but for their last byte, and reconnect when closed, while 50 genuine
//! callbacks come one every 100 ms. Figures on 2026-11-29 (a 2-core AMD EPYC VM, release
//! build, three runs):
//!
//! | figure | measured | target |
//! |---|---|---|
//! | genuine callbacks from another address beside the attack | 50/50 answered 200, p99 9.7–14.0 ms | all 200, p99 < 1 s |
//! | genuine callbacks from the attacking address | 14–23 of 50 answered 200 (the rest closed) | — |
//! | attack connections closed by the server | 56,889–58,481 of 57,017–58,609 opened | shed |
//! | peak RSS after 10,000 validations with 4 KiB identifiers | 31.9–33.9 MiB (139–184 MiB before long identifiers were digested) | < 128 MiB |
//! | RSS after the retention and its sweeps | 33.6–37.0 MiB, from 9.6–10.2 at the start (194–207 MiB before) | the start's order of magnitude |
//! | disk writes while idle after the purges | 0 KiB/s (1,101 KiB/s before sled's background flusher was turned off) | 0 |
//! | longest log line | 597 bytes (4,473 before the example escaped and cut its own fields) | ≤ 4 KiB |
//! | genuine callbacks beside bodies holding the whole body memory | 50/50 answered 200, p99 1.8–2.3 ms; 25 held bodies gave way (408), of 89 connections; peak RSS 108–112 MiB (0 of 50 answered 200 with build 5283e90, before the bodies arriving longest gave way) | all 200 |
//!
//! **Soak** — `cargo run --release --example exhaustion -- soak 30 15`: 400 Ed25519-signed
//! callbacks a second (one in five a repeat) over 8 keep-alive connections for 30 minutes, a
//! 5-minute retention and a sweep every 20 s, then 15 minutes idle. On 2026-11-23, on a quiet
//! machine:
//!
//! | figure | measured | target |
//! |---|---|---|
//! | requests, non-2xx | 720,504, 0 | 0 non-2xx |
//! | RSS over the last ten loaded minutes | 78.6–80.9 MiB | plateaus |
//! | RSS while idle | 80.8–80.9 MiB | flat |
//! | disk writes while idle | 35–99 KiB/s for the five minutes the retention's tail is purged, then 0 | quiet |
//! | 90 sweeps of ~6,430 records | 47–93 ms each, in 26 steps; the longest hold on the writer 7.2 ms | — |
//! | worst request that overlapped a sweep | median 7.2 ms, p90 9.0 ms, max 13.3 ms | — |
//! | requests that overlapped no sweep | p99 3.8 ms, p99.9 13.9 ms, worst 111.5 ms | — |
//! | what a sweep adds | at most 9.5 ms over the others' p99 (13.3 − 3.8) | ≤ ~20 ms |
//! | the store's files | 6.5 → 252 MiB in 30 min | — |
//!
//! The store keeps growing under load although payhook's records are purged after 5 minutes:
//! part of it is the example's ledger, which keeps every entry; how much is sled's space
//! amplification is not measured yet.
//!
//! What these runs taught:
//!
//! **What a sweep costs.** The service logs each sweep at `info` ("expired records purged",
//! with the records purged, the steps, the longest step's hold on the writer, and the time
//! the final flush took). The soak reads those lines and compares the requests that
//! overlapped a sweep with all the others (the table above). A shorter run, `soak 8 1`, gives
//! the same picture: 10 loaded sweeps, each purging about 6,430 records, as many as in the
//! 30-minute soak:
//!
//! | figure | measured | target |
//! |---|---|---|
//! | a sweep of ~6,430 records | 57–98 ms in 25–26 steps; the longest hold on the writer 2.8–6.2 ms; the final flush 0.2–1.9 ms | — |
//! | worst request overlapping a sweep | 6.2–11.3 ms | — |
//! | requests overlapping no sweep | p99 4.8 ms, p99.9 27.6 ms, worst 134 ms | — |
//! | what a sweep adds | at most 6.5 ms over the p99 of the other requests (11.3 − 4.8) | ≤ ~20 ms |
//!
//! The worst seconds of the run (134, 90, 80, 72 ms) came before the first record expired, so
//! no sweep caused them. They are group commits that waited on the disk.
//!
//! **Long identifiers are kept by their digest.** A heap profile of the service
//! (`SERVICE_WRAPPER=heaptrack`, see `examples/common/server.rs`) showed where 97 MiB of
//! heap went: sled keeps a tree's keys, its records and the bounds of its nodes in memory,
//! well beyond `store.cache_bytes`, and does not give that memory back when the records are
//! removed. Each validation put its 4 KiB nonce in two keys and its 4 KiB client id in its
//! record. Now a nonce longer than 64 bytes is keyed by its SHA-256, and a validation
//! record keeps a long client id the same way, so what the store holds per record no longer
//! depends on what a sender chose to send (`tests/long_identifiers_cost_the_store_little.rs`).
//! Records that an older store kept under a long nonce are still found, and they move to the
//! new key when they are next written.
//!
//! **Bodies held back.** A body that keeps the minimum rate may take up to `server.body_limit`
//! until the request timeout, and sent quickly then held back it keeps the pace for a long
//! time (the rate is an average since the headers). One connection could so hold 1 MiB, and
//! an HTTP/2 connection one per stream (hyper allows 200 at once): tens of GiB over the
//! connection caps. Now an HTTP/2 connection has at most 32 requests open at once, and the
//! bodies arriving, all connections and streams together, hold at most
//! `server.body_memory_limit` (64 MiB by default); a request whose body would pass it is
//! answered 503 with `Retry-After`, and what a body held is given back as soon as it is
//! read, refused or its connection goes
//! (`tests/slow_and_idle_clients_cannot_starve_callbacks.rs`). One client — an address, an
//! IPv6 client's /64, the forwarded client behind a trusted proxy — holds a quarter of it at
//! most: 64 connections of one address that sent 1 MiB less a byte each and held on took it
//! all, and every other request was answered 503 until their request timeout
//! (`server/request.rs`'s tests).
//!
//! **The bodies arriving longest give way.** Four clients, a quarter each, could still take
//! all of it: 16 connections each that send 1 MiB at once and then keep the average rate
//! for their request timeout — about 2 MB/s resent every 30 s, and no genuine callback was
//! answered but 503 meanwhile. Now a body that does not fit takes the memory of those that
//! have been arriving for longer than `server.min_body_rate_grace`, the oldest first (of
//! its own client first, when its share is what is short): they are answered 408 and
//! their connection closed (an HTTP/2 stream alone ends;
//! `payhook_connections_shed_total{reason="body_memory"}` counts them). To
//! keep a callback out, an attack must now send the whole memory again within every grace:
//! 64 MiB every 5 s by default (`tests/slow_and_idle_clients_cannot_starve_callbacks.rs`).
//!
//! **Bodies sent a byte at a time.** hyper hands a body over as slices of the connection's
//! read buffer, and starts a new buffer (8 KiB) when the last is still shared. A body kept as
//! the frames it arrived in, sent one byte per segment at the minimum rate, so kept some
//! 8 KiB alive for each byte the memory counted: about 60 MiB per connection within the
//! request timeout, counted as a few KiB. Now a body's frames after its first are copied into
//! one buffer and dropped, and the memory counts that buffer's capacity (a body arriving in
//! one frame, as most do, is still not copied; `server/request.rs`'s tests).
//!
//! **A longer listen queue.** Under this flood, tokio's default listen backlog of 1,024
//! filled with the attack's reconnections. Three runs in a row then kept a genuine client's SYN
//! waiting a second for its retransmission (p99 1,029–1,031 ms). `payhook::bind` now asks
//! for 4,096, and the kernel caps that at `net.core.somaxconn`.
//!
//! glibc's per-thread arenas still keep some memory that was freed. `MALLOC_ARENA_MAX=2` in a
//! service's environment trims that further.

mod admin_access;
mod connection;
mod credentials;
mod exactly_once;
mod guesses;
mod ingress;
pub mod metrics;
mod openapi;
mod operating_api;
mod operators;
mod preface;
mod problem;
mod reconcile;
mod refusal;
mod request;
mod route;
mod runner;
mod serve;
mod settings;

pub(crate) use route::ADMIN_PREFIX;

/// How long the aggregator's deliveries of one callback may go on, as far as payhook
/// knows: the spec gives no interval between its 17 attempts; the simulator's schedule
/// (`sim::Schedule`) spreads them over about 3 days, and a day more lets `reconcile` book
/// what none of them delivered. A retention shorter than this is said at start-up.
const RETRIES_MAY_LAST: std::time::Duration = std::time::Duration::from_secs(4 * 86_400);

/// How much longer than `server.handler_timeout` a `validation.deadline` should be, beyond
/// which it is not warned about: the clocks it is measured on (this host's wall clock, which
/// NTP may step; another instance's, on a shared store) may differ by seconds.
const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a `/metrics` scrape waits for each figure it reads from the store (the outbox's
/// queue, the failing count): a store that does not answer (a database unreachable or
/// locked) leaves out that figure, not the whole scrape — Prometheus gives up on a scrape
/// after 10 seconds by default, and with it would go every counter kept in memory, the
/// store's failure among them, when an alert needs them most.
const SCRAPE_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `read`'s value, or `None` when it fails or takes longer than [`SCRAPE_READ_LIMIT`].
async fn read_for_scrape<T, E>(read: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(SCRAPE_READ_LIMIT, read)
        .await
        .ok()
        .and_then(Result::ok)
}

use bytes::Bytes;
use chrono::Utc;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Instant,
};
use tracing::{Instrument, field};

use crate::auth::Guard;
use crate::config::Config;
use crate::handler::{
    CallbackReceiver, ErasedCallback, ErasedProviders, ErasedValidation, ProvidersValidator,
    RequestContext, TransactionValidator,
};
use crate::inspector::{self, Inspector, note};
use crate::model::{
    CallbackBody, ErrorBody, ProvidersValidationRequest, ProvidersValidationResponse,
    TransactionValidationRequest,
};
use crate::signature::Verifier;
use crate::store::{SledStore, Store, StoreError};
use crate::trace_context::TraceContext;
use problem::{Problem, json_response};
use request::{REQUEST_ID_HEADER, is_json, request_id};
use route::{Endpoint, Route, Router};

pub use operating_api::{
    AdminCredentialsRead, AdminDecision, AdminHeldPair, AdminReconcile, AdminReconciled,
};
pub(crate) use operating_api::{HELD_LIMIT, VALIDATIONS_PAGE_LIMIT};
pub use problem::status_codes;
pub use reconcile::{ReconcileError, Reconciled};
pub(crate) use reconcile::{bookable, untellable};

pub use credentials::{Credentials, CredentialsChange, CredentialsRefused};
pub use openapi::{OPENAPI, openapi};
pub(crate) use operators::Operators;
pub use operators::{InvalidOperatorName, OperatorToken};
pub use request::PeerAddr;
pub use route::PathsConfig;
pub use serve::{serve, shutdown_signal};
pub use settings::{AdminConfig, CallbackConfig, ServerConfig};

/// Body type of every answer.
pub type ResponseBody = Full<Bytes>;

/// Why an [`App`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No handler was given: the app would serve nothing.
    #[error(
        "no handler: give at least one of providers_validator, transaction_validator, callback_receiver"
    )]
    NoHandlers,
    /// A signature key could not be read or does not fit its algorithm.
    #[error(transparent)]
    Signature(#[from] crate::signature::Error),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A callback receiver without signature verification and without the explicit opt-out.
    #[error(
        "callbacks would be accepted without a signature check: configure the aggregator's public key \
         (signature.keys, PAYHOOK_SIGNATURE_KEYS), or set callback.allow_unsigned = true \
         (PAYHOOK_CALLBACK_ALLOW_UNSIGNED=true) to accept unsigned callbacks deliberately"
    )]
    UnsignedCallbacks,
    /// The configuration is not valid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Awaitable mode keeps pending validations and their results durably: it needs a store.
    #[error("validation.awaitable needs a store: remove without_store()")]
    AwaitableWithoutStore,
    /// The gateway client could not be set up.
    #[error(transparent)]
    Gateway(#[from] crate::gateway::GatewayError),
}

/// The merchant's endpoints as one HTTP service. Cheap to clone: clones share the handlers.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

/// Created once by [`AppBuilder::build`]; lives as long as any clone of the [`App`].
struct Inner {
    router: Router,
    /// The merchant's handlers, run within the handler timeout.
    runner: runner::Runner,
    /// What every request to an endpoint goes through before a handler.
    ingress: Arc<ingress::Ingress>,
    /// Callbacks and validations through the store's records, each handled once.
    exactly_once: exactly_once::ExactlyOnce,
    /// Set when shutdown begins: `/readyz` turns 503 so that load balancers drain us.
    draining: AtomicBool,
    /// Awaitable mode: the decisions, the resolver and the outbox; `None` when not Awaitable.
    awaitable: Option<Arc<crate::postponed::Awaitable>>,
    /// What the server did, for `/metrics`.
    metrics: Arc<metrics::Metrics>,
    /// Who may read `/metrics`.
    metrics_allow: Vec<crate::auth::Cidr>,
    /// The operating API; `None` when it is off.
    operating_api: Option<operating_api::OperatingApi>,
    /// The signature keys, the gateway's login and the operating API's credentials, read
    /// again while the app runs.
    credentials: Credentials,
    /// The recent deliveries; `None` when the operating API or recording is off.
    inspector: Option<Arc<Inspector>>,
    /// The aggregator's client (its calls are measured for `/metrics`); `None` without a
    /// complete `[gateway]`.
    gateway: Option<crate::gateway::GatewayClient>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("router", &self.inner.router)
            .field("server", self.inner.ingress.server_config())
            .finish_non_exhaustive()
    }
}

/// Builds an [`App`]: give it the configuration and the handlers you implement.
///
/// ```
/// use payhook::{App, Config};
/// use payhook::handler::{CallbackContext, CallbackDecision, CallbackReceiver};
/// use payhook::model::CallbackBody;
///
/// struct Ledger;
/// impl CallbackReceiver for Ledger {
///     async fn receive_callback(&self, _: CallbackBody, _: CallbackContext)
///         -> Result<CallbackDecision, payhook::HandlerError> {
///         Ok(CallbackDecision::Ack)
///     }
/// }
///
/// let dir = tempfile::tempdir().unwrap();
/// let mut config = Config::default();
/// config.store.path = dir.path().join("payhook-data"); // the default is ./payhook-data
/// // Unsigned callbacks are refused unless you opt out explicitly.
/// assert!(App::builder(config.clone()).callback_receiver(Ledger).build().is_err());
/// config.callback.allow_unsigned = true;
/// let app = App::builder(config).callback_receiver(Ledger).build()?;
/// # let _ = app;
/// # Ok::<(), payhook::server::BuildError>(())
/// ```
#[must_use]
pub struct AppBuilder {
    config: Config,
    providers: Option<Arc<dyn ErasedProviders>>,
    validation: Option<Arc<dyn ErasedValidation>>,
    callbacks: Option<Arc<dyn ErasedCallback>>,
    store: StoreChoice,
    /// Start the background work (the outbox worker) with the first request.
    automatic_background: bool,
}

/// Where an app keeps its deduplication records.
enum StoreChoice {
    /// A [`SledStore`] opened at `store.path` by `build()`.
    Default,
    /// The merchant's own store (a [`SledStore`] with declared trees, or another backend).
    Given(Arc<dyn Store>),
    /// None: no deduplication.
    Without,
}

impl App {
    /// Starts building an app with `config` (paths, limits, timeouts, callback policy).
    pub fn builder(config: Config) -> AppBuilder {
        AppBuilder {
            config,
            providers: None,
            validation: None,
            callbacks: None,
            store: StoreChoice::Default,
            automatic_background: true,
        }
    }

    /// The server settings this app was built with.
    pub fn server_config(&self) -> &ServerConfig {
        self.inner.ingress.server_config()
    }

    /// Marks the app as shutting down: `/readyz` answers 503 from now on (as it does once
    /// the store has failed, see [`Store::failed`]).
    pub fn begin_shutdown(&self) {
        self.inner.draining.store(true, Ordering::Relaxed);
    }

    /// Resolves once no validation handler is still deciding after its time budget
    /// (Awaitable mode: a validation answered 200 postponed, whose decision the aggregator
    /// waits for). [`serve`](crate::serve) waits for it at shutdown, after the connections
    /// close and within `server.shutdown_grace`, so that a restart does not cut a decision
    /// off; a server of one's own awaits it before its runtime ends. Each such handler ends
    /// within `server.handler_timeout` of its start.
    ///
    /// ```
    /// # async fn stop(app: payhook::App) {
    /// app.begin_shutdown();
    /// // ... stop accepting, let in-flight requests finish ...
    /// app.late_handlers_finished().await;
    /// # }
    /// ```
    pub async fn late_handlers_finished(&self) {
        if let Some(awaitable) = self.inner.awaitable.as_ref() {
            awaitable.late_handlers_finished().await;
        }
    }

    /// The app's credentials — the aggregator's signature keys, the merchant's user and
    /// password at the aggregator and the TLS files of its connections, the operating API's
    /// tokens — to read again while it runs: a key rotated, a password changed, a client
    /// certificate renewed, an operator added or taken out, without a restart (see
    /// [`Credentials`]). Take it before [`serve`] takes the app.
    pub fn credentials(&self) -> Credentials {
        self.inner.credentials.clone()
    }

    /// Decides validations postponed by this app (Awaitable mode); `None` when
    /// `validation.awaitable` is off.
    pub fn resolver(&self) -> Option<crate::postponed::Resolver> {
        self.inner.awaitable.as_ref().map(|a| a.resolver().clone())
    }

    /// The app's own client of the aggregator (a complete `[gateway]`), which its outbox
    /// and operating API use and whose credentials [`Credentials::read_again`] replaces;
    /// `None` without one. Use it for [`App::reconcile`]: a client built apart keeps the
    /// password it was built with.
    pub fn gateway(&self) -> Option<crate::gateway::GatewayClient> {
        self.inner.gateway.clone()
    }

    /// The app's store; `None` when built `without_store`.
    pub fn store(&self) -> Option<Arc<dyn Store>> {
        self.inner.exactly_once.store().cloned()
    }

    /// The worker delivering this app's postponed results; `None` when not Awaitable.
    pub fn outbox(&self) -> Option<crate::postponed::Outbox> {
        self.inner.awaitable.as_ref().map(|a| a.outbox().clone())
    }

    /// Starts the background work of the app (the outbox worker in Awaitable mode) on the
    /// current tokio runtime, once; it stops when the last clone of the app is dropped.
    /// [`crate::serve`] calls it, and an app mounted in a server of your own calls it with
    /// its first request; call it earlier to deliver the results a previous run left in the
    /// outbox before any request arrives.
    pub fn start_background(&self) {
        if let Some(awaitable) = &self.inner.awaitable {
            awaitable.start();
        }
    }

    /// Starts the background work unless the app was built with `manual_background`:
    /// called by `serve` and with every request (a cheap check once started).
    pub(super) fn start_automatic_background(&self) {
        if let Some(awaitable) = &self.inner.awaitable {
            awaitable.start_automatically();
        }
    }

    /// Answers one request. Never fails: every problem is an HTTP answer. The first
    /// request starts the app's background work (the outbox of an Awaitable endpoint)
    /// unless it was built with [`AppBuilder::manual_background`], however the app is
    /// mounted.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.start_automatic_background();
        let started = Instant::now();
        let id = request_id(request.headers());
        let caller = request
            .headers()
            .get(crate::trace_context::HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(TraceContext::parse);
        let trace = caller.map_or_else(TraceContext::new_trace, |caller| caller.child());
        let span = tracing::info_span!(
            "request",
            request_id = %id,
            method = %request.method(),
            // Any path may come: escaped, and cut short (a 404's path is the client's).
            path = %crate::Logged(request.uri().path()),
            trace_id = field::Empty,
            span_id = field::Empty,
            parent_span_id = field::Empty,
            nonce = field::Empty,
            validation_id = field::Empty,
            reference_id = field::Empty,
        );
        // With an OpenTelemetry layer installed, the exported span's ids are the request's.
        #[cfg(feature = "otel")]
        let trace = crate::trace_context::adopt(&span, caller, trace);
        span.record("trace_id", field::display(trace.trace_id()));
        span.record("span_id", field::display(trace.span_id()));
        if let Some(caller) = caller {
            span.record("parent_span_id", field::display(caller.span_id()));
        }
        let noted = note::new(self.inner.inspector.is_some());
        let dispatched = self.dispatch(request, id.clone()).instrument(span.clone());
        let (route, mut response) = trace
            .scope(note::scope(Some(Arc::clone(&noted)), dispatched))
            .await;
        let note = std::mem::take(
            &mut *noted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if let Some(endpoint) = note.endpoint {
            let latency = started.elapsed();
            let outcome = inspector::outcome(note.outcome, response.status().as_u16());
            self.inner
                .metrics
                .observe_request(endpoint, outcome, latency.as_secs_f64());
            if let Some(inspector) = &self.inner.inspector {
                response = record(inspector, note, response, &id, &trace, latency).await;
            }
        }
        self.inner
            .metrics
            .answered(route, response.status().as_u16());
        if let Ok(value) = HeaderValue::from_str(&id) {
            response.headers_mut().insert(REQUEST_ID_HEADER, value);
        }
        let status = response.status().as_u16();
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        span.in_scope(|| match status {
            500.. => tracing::error!(status, elapsed_ms, "answered"),
            400.. => tracing::warn!(status, elapsed_ms, "answered"),
            _ => tracing::debug!(status, elapsed_ms, "answered"),
        });
        response
    }

    /// Answers a request; returns its route's name (for metrics) with the answer.
    async fn dispatch<B>(
        &self,
        request: Request<B>,
        request_id: String,
    ) -> (&'static str, Response<ResponseBody>)
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let inner = &self.inner;
        let route = match inner.router.route(request.uri().path()) {
            Some(Route::Metrics) if inner.metrics_allow.is_empty() => None,
            route => route,
        };
        let Some(route) = route else {
            return ("unknown", Problem::NotFound.into_response());
        };
        if !route.accepts(request.method()) {
            let allow = route.allow();
            return (
                route.name(),
                Problem::MethodNotAllowed { allow }.into_response(),
            );
        }
        let answer = match route {
            Route::Health => json_response(StatusCode::OK, &ErrorBody::new("ok")),
            Route::Ready if inner.draining.load(Ordering::Relaxed) => {
                Problem::NotReady.into_response()
            }
            Route::Ready
                if inner
                    .exactly_once
                    .store()
                    .is_some_and(|store| store.failed()) =>
            {
                Problem::StoreBroken.into_response()
            }
            Route::Ready => json_response(StatusCode::OK, &ErrorBody::new("ready")),
            // Refused as the operating API refuses it: a proxy on this machine left out of
            // `server.trusted_proxies` would serve the default loopback allow-list to anyone.
            Route::Metrics if inner.ingress.forwarded_by_stranger(&request) => {
                Problem::ForwardedByStranger.into_response()
            }
            // A browser on this machine (the default allow-list's) may be running a page
            // that pointed a name of its own here (DNS rebinding) and reads the counters as
            // its own site's: from this machine over plain HTTP, an address or localhost.
            Route::Metrics => {
                let client = inner.ingress.client_ip(&request);
                match self.metrics_host(&request, client) {
                    Ok(()) => Box::pin(self.metrics(client)).await,
                    Err(problem) => problem.into_response(),
                }
            }
            Route::Admin => {
                let mut answer = match &inner.operating_api {
                    Some(api) => Box::pin(api.answer(request)).await,
                    None => Err(Problem::NotFound),
                }
                .unwrap_or_else(Problem::into_response);
                operating_api::kept_private(&mut answer);
                answer
            }
            Route::Endpoint(endpoint) => self
                .endpoint(endpoint, request, request_id)
                .await
                .unwrap_or_else(Problem::into_response),
        };
        (route.name(), answer)
    }

    /// Refuses `/metrics` asked from this machine over plain HTTP by a name other than an
    /// address or `localhost` (see [`operating_api::check_host`]). A scraper elsewhere, in
    /// `server.metrics_allow_ips`, may call it by any name.
    fn metrics_host<B>(
        &self,
        request: &Request<B>,
        client: Option<std::net::IpAddr>,
    ) -> Result<(), Problem> {
        let ingress = &self.inner.ingress;
        if ingress.came_from_this_machine(request, client) && !ingress.forwarded_https(request) {
            operating_api::check_host(request, "/metrics")
        } else {
            Ok(())
        }
    }

    /// `/metrics`, for the allowed addresses only.
    async fn metrics(&self, client: Option<std::net::IpAddr>) -> Response<ResponseBody> {
        let allowed =
            client.is_some_and(|ip| self.inner.metrics_allow.iter().any(|net| net.contains(ip)));
        if !allowed {
            return Problem::AddressRefused.into_response();
        }
        let store = self.inner.exactly_once.store();
        let mut scrape = metrics::Scrape::default();
        if let (Some(outbox), Some(awaitable)) = (self.outbox(), &self.inner.awaitable) {
            let counts = outbox.counts();
            let summary = read_for_scrape(awaitable.resolver().outbox_summary()).await;
            let now = Utc::now();
            let oldest_queued_seconds = summary.map(|summary| {
                summary.oldest_decided.map_or(0.0, |decided| {
                    (now - decided).num_milliseconds().max(0) as f64 / 1e3
                })
            });
            scrape.outbox = Some(metrics::OutboxCounts {
                delivered: counts.delivered,
                conflicts: counts.conflicts,
                retries: counts.retries,
                queued: summary.map(|summary| summary.queued),
                oldest_queued_seconds,
            });
            scrape.histograms.push((
                "outbox_delivery_duration",
                "From a postponed result's decision to its delivery to the aggregator",
                Some(prometheus_client::registry::Unit::Seconds),
                outbox.delivery_seconds(),
            ));
        }
        if let Some(store) = store {
            scrape.failing = read_for_scrape(store.failing_count()).await;
            scrape.held = read_for_scrape(store.held_count()).await;
            scrape.store_failed = Some(store.failed());
            if let Some(commits) = store.commit_metrics() {
                let (seconds, batch) = commits.histograms();
                scrape.histograms.push((
                    "store_commit_duration",
                    "How long the store took to make a batch of writes durable",
                    Some(prometheus_client::registry::Unit::Seconds),
                    seconds,
                ));
                scrape.histograms.push((
                    "store_commit_batch_size",
                    "Writes (requests) made durable together in one commit",
                    None,
                    batch,
                ));
            }
        }
        scrape.gateway = self
            .inner
            .gateway
            .as_ref()
            .map(|gateway| gateway.metrics().clone());
        let text = self.inner.metrics.render(&scrape);
        let mut response = Response::new(Full::new(Bytes::from(text)));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        response
    }

    /// The steps every endpoint shares: who may call, what they sent, then the handler.
    async fn endpoint<B>(
        &self,
        endpoint: Endpoint,
        request: Request<B>,
        request_id: String,
    ) -> Result<Response<ResponseBody>, Problem>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = request.into_parts();
        let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0);
        note::with(|n| n.endpoint = Some(endpoint.name()));
        let ingress = &self.inner.ingress;
        note::kept(|n| {
            n.headers = Some(inspector::kept_headers(
                &parts.headers,
                ingress.signature_header_of(endpoint),
            ));
        });
        let client = ingress.client_of(peer, &parts.headers);
        // Everything that needs no body is checked before the body is read.
        let signature = ingress.admit(endpoint, (peer, client), &parts.headers)?;
        if !is_json(&parts.headers) {
            return Err(Problem::UnsupportedMediaType);
        }
        let bytes = ingress.read_body(&parts, body, client).await?;
        note::kept(|n| {
            n.body = Some(crate::inspector::kept_body(&bytes));
        });
        let pair = match signature {
            Some(signature) => ingress.check_signature(&bytes, &signature)?,
            None => None,
        };
        note::kept(|n| n.admitted = true);
        let ctx = RequestContext {
            request_id,
            peer,
            received_at: Utc::now(),
            headers: parts.headers,
        };
        match endpoint {
            Endpoint::ProvidersValidation => self.providers_validation(&bytes, ctx).await,
            Endpoint::TransactionValidation => self.transaction_validation(&bytes, ctx).await,
            Endpoint::Callback => self.callback(&bytes, ctx, pair).await,
        }
    }

    async fn providers_validation(
        &self,
        bytes: &[u8],
        ctx: RequestContext,
    ) -> Result<Response<ResponseBody>, Problem> {
        if !self.inner.runner.serves(Endpoint::ProvidersValidation) {
            return Err(Problem::NotFound);
        }
        let request = self
            .inner
            .ingress
            .parse::<ProvidersValidationRequest>(bytes)?;
        let decision = self.inner.runner.providers(request, ctx).await?;
        let body = ProvidersValidationResponse {
            providers: decision.providers,
            message: decision.message,
        };
        Ok(json_response(StatusCode::OK, &body))
    }

    async fn transaction_validation(
        &self,
        bytes: &[u8],
        ctx: RequestContext,
    ) -> Result<Response<ResponseBody>, Problem> {
        if !self.inner.runner.serves(Endpoint::TransactionValidation) {
            return Err(Problem::NotFound);
        }
        let request = self
            .inner
            .ingress
            .parse::<TransactionValidationRequest>(bytes)?;
        note::kept(|n| {
            n.validation_id = Some(request.validation_id.get());
        });
        self.inner.exactly_once.validate_once(request, ctx).await
    }

    /// A callback; `pair` is its verified (signature, body) pair, when pairs are remembered.
    async fn callback(
        &self,
        bytes: &[u8],
        ctx: RequestContext,
        pair: Option<crate::signature::SignedPair>,
    ) -> Result<Response<ResponseBody>, Problem> {
        if !self.inner.runner.serves(Endpoint::Callback) {
            return Err(Problem::NotFound);
        }
        let callback = match self.inner.ingress.parse::<CallbackBody>(bytes) {
            Ok(callback) => callback,
            Err(problem) => {
                let max_chars = self.inner.ingress.server_config().max_identifier_chars;
                self.inner
                    .exactly_once
                    .refused(bytes, &problem, max_chars)
                    .await;
                return Err(problem);
            }
        };
        note::kept(|n| {
            n.reference_id = Some(callback.transaction_reference_id);
            n.transaction_status = Some(callback.transaction_status.code());
        });
        if !self.inner.ingress.verifies_signatures() {
            tracing::warn!("unsigned callback accepted (callback.allow_unsigned = true)");
        }
        self.inner
            .exactly_once
            .deliver_once(callback, ctx, pair)
            .await
    }
}

/// Hands an endpoint's request to the inspector with its answer.
async fn record(
    inspector: &Inspector,
    note: note::Note,
    response: Response<ResponseBody>,
    request_id: &str,
    trace: &TraceContext,
    latency: std::time::Duration,
) -> Response<ResponseBody> {
    // The answer is a `Full` body: collecting it takes its bytes without copying them.
    let (parts, body) = response.into_parts();
    let answer = http_body_util::BodyExt::collect(body)
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    inspector.record(
        note,
        inspector::Answered {
            request_id: request_id.to_owned(),
            trace: *trace,
            status: parts.status.as_u16(),
            answer: answer.clone(),
            latency,
        },
    );
    Response::from_parts(parts, Full::new(answer))
}

impl App {
    /// Fetches each transaction from the aggregator and books its result through the
    /// callback handler — once: a result already booked (by its callback or an earlier
    /// reconcile) is not booked again, and a callback arriving later is a duplicate.
    ///
    /// ```no_run
    /// # async fn run(app: payhook::App) {
    /// let gateway = app.gateway().expect("a complete [gateway]");
    /// let id = "0b7e5a52-2f59-4c1e-9d0c-000000000001".parse().unwrap();
    /// for (reference_id, outcome) in app.reconcile(&gateway, &[id]).await {
    ///     println!("{reference_id}: {outcome:?}");
    /// }
    /// # }
    /// ```
    pub async fn reconcile(
        &self,
        gateway: &crate::gateway::GatewayClient,
        reference_ids: &[uuid::Uuid],
    ) -> Vec<(uuid::Uuid, Result<Reconciled, ReconcileError>)> {
        let max_chars = self.inner.ingress.server_config().max_identifier_chars;
        self.inner
            .exactly_once
            .reconcile_all(gateway, reference_ids, max_chars)
            .await
    }
}

impl AppBuilder {
    /// Serves the providers validation endpoint with `handler`. Default: not served (404).
    pub fn providers_validator(mut self, handler: impl ProvidersValidator) -> Self {
        self.providers = Some(Arc::new(handler));
        self
    }

    /// Serves the transaction validation endpoint with `handler`. Default: not served (404).
    pub fn transaction_validator(mut self, handler: impl TransactionValidator) -> Self {
        self.validation = Some(Arc::new(handler));
        self
    }

    /// Serves the callback endpoint with `handler`. Default: not served (404).
    pub fn callback_receiver(mut self, handler: impl CallbackReceiver) -> Self {
        self.callbacks = Some(Arc::new(handler));
        self
    }

    /// Keeps deduplication records in `store` — typically a [`SledStore`] or a
    /// `PgStore` (feature `postgres`) opened with the trees your callback effects write.
    /// Default: a [`SledStore`] opened at `store.path` by [`AppBuilder::build`]; with
    /// `store.url` set (PostgreSQL), open the store first — it connects, which `build` does
    /// not — and pass it here or to [`AppBuilder::shared_store`].
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = StoreChoice::Given(Arc::new(store));
        self
    }

    /// As [`AppBuilder::store`], for a store already shared
    /// ([`ConfiguredStore::shared`](crate::store::ConfiguredStore::shared)).
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = StoreChoice::Given(store);
        self
    }

    /// Runs without a store: **no deduplication**, every delivery reaches the handler, and
    /// effects cannot be staged. For measurements and for handlers that are idempotent on
    /// their own. Default: a store is used.
    pub fn without_store(mut self) -> Self {
        self.store = StoreChoice::Without;
        self
    }

    /// Leaves the background work (the outbox worker of Awaitable mode) to the caller, who
    /// runs [`crate::postponed::Outbox::run`] or drives [`crate::postponed::Outbox::run_once`]
    /// itself — a test that controls time, say. By default an app starts it by itself, once,
    /// when it is served ([`crate::serve`]) or answers its first request in a server of your
    /// own, so that postponed results always leave.
    pub fn manual_background(mut self) -> Self {
        self.automatic_background = false;
        self
    }

    /// Checks the configuration and the handlers, and builds the app.
    ///
    /// # Errors
    ///
    /// [`BuildError`] when no handler is given, when the configuration is invalid, or when a
    /// callback receiver would accept unsigned callbacks without `callback.allow_unsigned`.
    pub fn build(self) -> Result<App, BuildError> {
        self.config.validate()?;
        if self.providers.is_none() && self.validation.is_none() && self.callbacks.is_none() {
            return Err(BuildError::NoHandlers);
        }
        let verifier = if self.config.signature.keys.is_empty() {
            None
        } else {
            Some(Verifier::from_config(&self.config.signature)?)
        };
        if self.callbacks.is_some() {
            match (&verifier, self.config.callback.allow_unsigned) {
                (None, false) => return Err(BuildError::UnsignedCallbacks),
                (None, true) => tracing::warn!(
                    "callbacks are accepted WITHOUT signature verification (callback.allow_unsigned = true)"
                ),
                (Some(_), true) => tracing::warn!(
                    "callback.allow_unsigned is ignored: signature keys are configured, so every callback must be signed"
                ),
                (Some(_), false) => {}
            }
        }
        let providers_guard = Guard::from_config(
            &self.config.auth.providers_validation,
            "auth.providers_validation",
        )
        .map_err(crate::config::ConfigError::from)?;
        let validation_guard = Guard::from_config(
            &self.config.auth.transaction_validation,
            "auth.transaction_validation",
        )
        .map_err(crate::config::ConfigError::from)?;
        let served = |endpoint| match endpoint {
            Endpoint::ProvidersValidation => self.providers.is_some(),
            Endpoint::TransactionValidation => self.validation.is_some(),
            Endpoint::Callback => self.callbacks.is_some(),
        };
        // The spec does not say how the aggregator authenticates itself, so an endpoint
        // without a method or an allow-list is allowed, and said to be open.
        let auth = &self.config.auth;
        for (endpoint, guard, setting, endpoint_config) in [
            (
                Endpoint::ProvidersValidation,
                &providers_guard,
                "auth.providers_validation",
                &auth.providers_validation,
            ),
            (
                Endpoint::TransactionValidation,
                &validation_guard,
                "auth.transaction_validation",
                &auth.transaction_validation,
            ),
        ] {
            if served(endpoint) && crate::auth::takes_a_short_secret(endpoint_config) {
                tracing::warn!(
                    "{setting}: its credential is shorter than 16 characters and taken \
                     (allow_short_secret = true): whoever reaches the endpoint could find it \
                     by asking with guesses; keep allow_ips to the aggregator's addresses"
                );
            }
            if served(endpoint) && guard.is_open() {
                tracing::warn!(
                    "{setting}: method \"none\" and no allow_ips (or one that admits every \
                     address, such as 0.0.0.0/0), so the endpoint answers \
                     anyone who reaches it (in Awaitable mode its decisions are posted to the \
                     aggregator); set a method (signature, shared_secret, basic) or allow_ips"
                );
            }
        }
        self.config
            .admin
            .check_as_served()
            .map_err(BuildError::Config)?;
        let admin = admin_access::AdminAccess::from_config(&self.config.admin);
        if let Some(admin) = &admin {
            admin.warn_of_channel(&self.config.server.trusted_proxies);
        }
        let admin = admin.map(|access| Arc::new(admin_access::CurrentAccess::new(access)));
        let mut router = Router::new(&self.config.paths, served);
        if admin.is_some() {
            router = router.with_admin();
        }
        let gateway = if self.config.gateway.is_complete() {
            Some(crate::gateway::GatewayClient::new(&self.config.gateway)?)
        } else {
            None
        };
        let store: Option<Arc<dyn Store>> = match self.store {
            StoreChoice::Given(store) => Some(store),
            StoreChoice::Without => None,
            StoreChoice::Default if self.validation.is_none() && self.callbacks.is_none() => None,
            StoreChoice::Default if self.config.store.is_postgres() => {
                return Err(BuildError::Store(StoreError::Unsupported(
                    "store.url names PostgreSQL: open it first (`ConfiguredStore::open(&config.store, &trees).await`) \
                     and pass it to AppBuilder::store or shared_store"
                        .into(),
                )));
            }
            StoreChoice::Default => Some(Arc::new(SledStore::open(&self.config.store, &[])?)),
        };
        let retention = store.as_ref().map(|store| store.retention());
        if self.callbacks.is_some()
            && let Some(retention) = retention.filter(|r| *r < RETRIES_MAY_LAST)
        {
            tracing::warn!(
                retention_s = retention.as_secs(),
                "store.retention is shorter than the aggregator's retries of one callback may \
                 last (the spec gives no interval; payhook's simulator spreads its 17 attempts \
                 over about 3 days, and reconcile needs a day more): a retry that comes later \
                 is refused 409, not booked, and listed among the failing callbacks; keep it \
                 at 4d or more"
            );
        }
        if self.config.validation.awaitable
            && let Some(deadline) = self.config.validation.deadline
            && deadline < self.config.server.handler_timeout + DEADLINE_MARGIN
        {
            tracing::warn!(
                deadline_s = deadline.as_secs(),
                handler_timeout_s = self.config.server.handler_timeout.as_secs(),
                "validation.deadline is less than a minute longer than server.handler_timeout: \
                 a wall clock stepped by NTP, another instance's clock ahead of this one's, \
                 or another instance on the same database while this one's store is slow to \
                 record the handler's decision, can let the deadline decide a validation \
                 whose handler decided in time, and the handler's decision is then refused \
                 as a conflict; keep a minute between them"
            );
        }
        let runner = runner::Runner::new(
            self.providers,
            self.validation,
            self.callbacks,
            self.config.server.handler_timeout,
            self.config.callback.retry_after,
        );
        let awaitable = if self.config.validation.awaitable {
            let store = store.as_ref().ok_or(BuildError::AwaitableWithoutStore)?;
            // A complete [gateway] is checked by the configuration's validation.
            let gateway = match &gateway {
                Some(gateway) => gateway.clone(),
                None => crate::gateway::GatewayClient::new(&self.config.gateway)?,
            };
            let awaitable = crate::postponed::Awaitable::new(
                &self.config.validation,
                store,
                gateway,
                Arc::new(runner.clone()),
            );
            Some(Arc::new(awaitable.automatic(self.automatic_background)))
        } else {
            None
        };
        let metrics: Arc<metrics::Metrics> = Arc::default();
        let exactly_once = exactly_once::ExactlyOnce::new(
            store,
            runner.clone(),
            awaitable.clone(),
            Arc::clone(&metrics),
        );
        let networks = |list: &[String]| list.iter().filter_map(|t| t.parse().ok()).collect();
        let metrics_allow = networks(&self.config.server.metrics_allow_ips);
        let trusted_proxies = networks(&self.config.server.trusted_proxies);
        // As the service runs it, for the credentials read again to be compared with.
        let running = self.config.clone();
        let ingress = Arc::new(ingress::Ingress::new(
            self.config.server,
            verifier,
            (providers_guard, validation_guard),
            trusted_proxies,
            Arc::clone(&metrics),
            self.config.callback.retry_after,
        ));
        let credentials = Credentials::new(
            admin.clone(),
            Arc::clone(&ingress),
            gateway.clone(),
            running,
            Arc::clone(&metrics),
        );
        let inspector = admin
            .as_ref()
            .and_then(|_| Inspector::new(self.config.admin.inspector_recent))
            .map(Arc::new);
        let operating_api = admin.map(|access| {
            operating_api::OperatingApi::new(
                access,
                Arc::clone(&ingress),
                exactly_once.clone(),
                awaitable.clone(),
                credentials.clone(),
                self.config.callback.retry_after,
                operating_api::Observed {
                    inspector: inspector.clone(),
                    metrics: Arc::clone(&metrics),
                },
            )
        });
        Ok(App {
            inner: Arc::new(Inner {
                router,
                runner,
                ingress,
                exactly_once,
                draining: AtomicBool::new(false),
                awaitable,
                metrics,
                metrics_allow,
                operating_api,
                credentials,
                inspector,
                gateway,
            }),
        })
    }
}

/// The future of an [`App`] answering one request.
pub type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, Infallible>> + Send>>;

impl<B> hyper::service::Service<Request<B>> for App
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: Request<B>) -> Self::Future {
        let app = self.clone();
        Box::pin(async move { Ok(app.handle(request).await) })
    }
}

impl<B> tower_service::Service<Request<B>> for App
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        hyper::service::Service::call(self, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{CallbackContext, CallbackDecision, CallbackReceiver, HandlerError};
    use crate::model::CallbackBody;

    struct Acknowledge;

    impl CallbackReceiver for Acknowledge {
        async fn receive_callback(
            &self,
            _: CallbackBody,
            _: CallbackContext,
        ) -> Result<CallbackDecision, HandlerError> {
            Ok(CallbackDecision::Ack)
        }
    }

    /// hyper moves each request's future into its connection's slot, and every move copies
    /// the whole of it, whichever route the request takes. It was 30 KB while the rare
    /// routes' futures were inline and each context wrapper held its future twice.
    #[test]
    fn a_requests_future_stays_small() {
        let mut config = Config::default();
        config.callback.allow_unsigned = true;
        let app = App::builder(config)
            .callback_receiver(Acknowledge)
            .without_store()
            .build()
            .expect("an app without a store builds");
        let request = Request::builder()
            .uri("/payhook/callback")
            .body(Full::new(Bytes::new()))
            .expect("a valid request");
        let size = std::mem::size_of_val(&app.handle(request));
        assert!(size <= 12 * 1024, "a request's future is {size} bytes");
    }
}
