//! # payhook
//!
//! The merchant side of a payment aggregator (interface 0.3.2): payhook hosts the three
//! endpoints the aggregator calls — **providers validation**, **transaction validation** and
//! the **transaction result callback** — so that a merchant writes only its business
//! decisions. It authenticates, parses and bounds every request, turns each decision into
//! the answer the aggregator expects, and gives every bad input a defined status code and a
//! `{"message": "..."}` body.
//!
//! The aggregator's interface is `openapi/aggregator-interface.md` in the repository (and in
//! the published crate); "spec 2.7" in these docs is its section 2.7. The endpoints payhook
//! hosts are described for tools in `openapi/merchant-endpoints.json`.
//!
//! ## Quick start
//!
//! Implement the traits of [`handler`] for the endpoints you host, build an [`App`], and
//! [`serve`] it. What a service uses is re-exported here at the root:
//!
//! ```no_run
//! use payhook::{
//!     App, CallbackBody, CallbackContext, CallbackDecision, CallbackReceiver, Config,
//!     HandlerError, ProviderFilter, ProvidersDecision, ProvidersValidationRequest,
//!     ProvidersValidator, RequestContext, TransactionValidationRequest, TransactionValidator,
//!     ValidationDecision,
//! };
//!
//! #[derive(Clone)]
//! struct Shop {
//!     ledger: payhook::store::Tree, // a tree of the merchant's own in payhook's store
//!     // The tags of the providers this shop works with ("11=fiat;12=crypto"): the
//!     // aggregator's candidates carry none, and a request may ask for some.
//!     provider_tags: payhook::handler::ProviderTags,
//! }
//!
//! impl ProvidersValidator for Shop {
//!     async fn validate_providers(&self, request: ProvidersValidationRequest, _: RequestContext)
//!         -> Result<ProvidersDecision, HandlerError> {
//!         let providers = ProviderFilter::from_request(&request)
//!             .apply_with_tags(&request.providers, |candidate| self.provider_tags.of(candidate));
//!         Ok(ProvidersDecision { providers, message: String::new() })
//!     }
//! }
//!
//! impl TransactionValidator for Shop {
//!     async fn validate_transaction(&self, request: TransactionValidationRequest, _: RequestContext)
//!         -> Result<ValidationDecision, HandlerError> {
//!         if request.merchant_data.client_id.is_empty() {
//!             return Ok(ValidationDecision::deny("unknown client"));
//!         }
//!         if !request.cash_in {
//!             // A withdrawal pays money out: allow it only against what the client holds.
//!             return Ok(ValidationDecision::deny("withdrawals are not offered"));
//!         }
//!         Ok(ValidationDecision::Allow)
//!     }
//! }
//!
//! impl CallbackReceiver for Shop {
//!     async fn receive_callback(&self, callback: CallbackBody, ctx: CallbackContext)
//!         -> Result<CallbackDecision, HandlerError> {
//!         // Recorded atomically with the mark that this (nonce, status) is done: exactly once.
//!         // Each status of a nonce is a result of its own (a success, then -2: money returned).
//!         let key = format!("{}|{}", callback.nonce, callback.transaction_status.code());
//!         let entry = format!("{} {} {}", callback.client_id, callback.amount, callback.currency);
//!         let ledger = self.ledger.clone();
//!         ctx.effects.write(move |tx| tx.insert(&ledger, key.as_bytes(), entry.as_bytes()));
//!         Ok(CallbackDecision::Ack)
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     if let Err(error) = run().await {
//!         // What failed (the address, the file, the key), why, and what to do.
//!         eprintln!("error: {}", error.report());
//!         return std::process::ExitCode::FAILURE;
//!     }
//!     std::process::ExitCode::SUCCESS
//! }
//!
//! async fn run() -> Result<(), payhook::Error> {
//!     let config = Config::from_env()?;
//!     let listener = payhook::bind(config.server.listen).await?; // an error names the address
//!     // Deduplication records and the merchant's own "ledger" tree, in one sled database.
//!     let store = payhook::SledStore::open(&config.store, &["ledger"])?;
//!     // Handles of the declared trees, taken once: a misspelt name fails here.
//!     // Your providers' tags, from your own settings ("11=fiat;12=crypto".parse()): a
//!     // request that asks for tags is offered only the providers tagged so here.
//!     let provider_tags = payhook::handler::ProviderTags::default();
//!     let shop = Shop { ledger: store.tree("ledger")?, provider_tags };
//!     let app = App::builder(config)
//!         .store(store)
//!         .providers_validator(shop.clone())
//!         .transaction_validator(shop.clone())
//!         .callback_receiver(shop)
//!         .build()?;
//!     payhook::serve(listener, app, payhook::shutdown_signal()).await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Map of the crate
//!
//! From the bottom up: a module imports those listed before it (and the small leaves
//! `Secret`, `Logged` and the shared pieces of configuration sections). The one arrow back:
//! the server takes the whole assembled [`Config`], while `config` takes the server's
//! sections from two files of the server that import nothing else of it.
//!
//! * [`model`] — wire types of every resource and message of the interface; exact money,
//!   lenient UTC times, tolerant status codes.
//! * [`signature`] — callback signatures: every real scheme verified with ring over the raw
//!   body, keys in every common format with rotation, signing, key generation, and `sniff`;
//!   its `[signature]` section. (How the validation endpoints authenticate the aggregator —
//!   signature, shared secret, HTTP Basic, IP allow-list — is a private module; its
//!   `[auth]` section is re-exported by [`config`].)
//! * [`store`] — exactly-once effects behind an async seam (`DedupStore` for claims and
//!   marks, `PostponedStore` for the Awaitable state): deduplication records per nonce in
//!   sled (durable group commit, integrity watermark) or PostgreSQL (feature `postgres`,
//!   shared by several instances), handler effects written atomically with the mark
//!   (booking the result, or holding it aside for a person: `Booking`), each validation's
//!   payment and decision read back for its callback (`ValidatedPayment`), retention;
//!   `[store]`.
//! * [`handler`] — the three traits a merchant implements, their decisions, the request
//!   context (a callback's: attempt, previous status, effects, and what its validation
//!   recorded), and provider filter helpers.
//! * [`gateway`] — a client of the aggregator's own endpoints (login, refresh, postponed
//!   results, transaction lookup) with the session kept fresh, through a proxy, a private
//!   CA and a client certificate where needed; `[gateway]`.
//! * [`postponed`] — Awaitable validation, all of it: its records and their life cycle
//!   (pending → queued → delivered or conflict; first decision wins), the decisions within
//!   the time budget and after it, the [`Resolver`], the durable outbox of results and its
//!   worker, deadlines; `[validation]`. The store persists its records (it imports them
//!   from `postponed/record.rs`, a leaf); the server's handler runner runs the handler for
//!   it.
//! * [`server`] — the [`App`] service and [`serve`] (HTTP/1.1 and HTTP/2, timeouts, graceful
//!   shutdown); `[server]`, `[paths]`, `[callback]`, `[admin]`. Inside, a request flows one
//!   way through components that own their state: the ingress (routing, limits,
//!   authentication, signature, parsing) → exactly-once delivery (the store's records per
//!   nonce; reconcile) → the Awaitable decisions of [`postponed`] → the handler runner (the
//!   three handlers, timeouts, failures); the status code table turns every refusal into an
//!   answer; the operating API sits beside the ingress, letting in the shared token or an
//!   operator's own ([`server::OperatorToken`]), whose changes are kept with their name;
//!   the credentials — the aggregator's signature keys, the merchant's password and client
//!   certificate at the aggregator, the validation endpoints' `[auth]`, the operators'
//!   tokens — are read again while the service
//!   runs ([`server::Credentials`], on SIGHUP or when the operating API asks, which can also
//!   check a configuration without taking it), and a signature only a key taken out meanwhile
//!   verifies is told apart from a forgery.
//! * [`trace_context`] — W3C `traceparent`: each request runs in the caller's trace (or a
//!   new one), its span names the trace, and the gateway client passes it on.
//!   `telemetry` (feature `otel`) exports those spans over OTLP/HTTP.
//! * [`inspector`] — what happened recently and what is happening now: each request to an
//!   endpoint noted as it is handled (a task-local note the ingress, the endpoints and
//!   exactly-once delivery fill in) and kept with its answer, the page served under the
//!   operating API, and the long-polled stream `payhook tail` follows.
//! * [`config`] — assembles the sections, loads them (defaults < file < `PAYHOOK_*`
//!   environment) and checks what involves more than one.
//! * [`admin`] — operating commands (postponed validations, failing callbacks, held results
//!   and their resolution, transaction lookup, reconcile, `tail`) for the `payhook` binary
//!   and a merchant's own binary.
//! * `sim` (feature `sim`) — local testing: a mock gateway, signed triggers, callback
//!   delivery with the real retry schedule, fault injection, scenario files, and the example
//!   merchant the demo runs.
//! * `scaffold` (feature `scaffold`) — `payhook new`: a merchant crate rendered from
//!   `templates/merchant/`.
//! * [`Secret`] — strings that redact themselves in `Debug`; the files that hold secrets or
//!   decide what is trusted are warned of when others may read them and refused when others
//!   may write them.
//! * `current` — a value replaced whole while calls read it: the credentials read again
//!   without a restart.
//! * [`Error`] — the crate-level error for applications; [`Report`] prints any error with
//!   its causes, each once.
//!
//! The `payhook` binary (`src/bin/payhook/`, feature `cli`) is a thin command line over this
//! library's public API.
//!
//! ## Features
//!
//! None is on by default: a merchant's service compiles the library alone.
//!
//! | feature | what it adds |
//! |---|---|
//! | `postgres` | `store::PgStore`: PostgreSQL shared by several instances, `Effects::postgres` (and `postgres_book`), and [`store::ConfiguredStore`] opening it when `store.url` is set |
//! | `sim` | the `sim` module: the simulated aggregator, for a merchant's tests |
//! | `keygen-rsa` | RSA keys from [`signature::generate_key_pair`] (EC and Ed25519 need nothing) |
//! | `scaffold` | the `scaffold` module behind `payhook new` |
//! | `clap` | `clap::Subcommand` for [`admin::AdminCommand`], for a merchant's own binary |
//! | `otel` | `telemetry`: the request spans exported over OTLP/HTTP to an OpenTelemetry collector |
//! | `cli` | the `payhook` binary: all of the above but `otel`, logging set-up and shell completions |

#![cfg_attr(test, allow(clippy::unwrap_used, reason = "tests unwrap freely"))]

pub mod admin;
mod auth;
pub mod config;
mod current;
mod error;
pub mod gateway;
pub mod handler;
pub mod inspector;
mod logged;
pub mod model;
pub mod postponed;
mod report;
#[cfg(feature = "scaffold")]
pub mod scaffold;
mod secret;
pub mod server;
mod setting;
pub mod signature;
#[cfg(feature = "sim")]
pub mod sim;
pub mod store;
#[cfg(feature = "otel")]
pub mod telemetry;
pub mod trace_context;

pub use config::Config;
pub use error::{Error, bind};
pub use handler::{
    CallbackContext, CallbackDecision, CallbackReceiver, HandlerError, ProviderFilter,
    ProvidersDecision, ProvidersValidator, RequestContext, TransactionValidator,
    ValidationDecision,
};
pub use logged::{Escaped, Logged};
pub use model::{CallbackBody, ProvidersValidationRequest, TransactionValidationRequest};
pub use postponed::{Decision, Resolver};
pub use report::Report;
pub use secret::Secret;
pub use server::{App, AppBuilder, serve, shutdown_signal};
pub use store::SledStore;

/// The README's code blocks, compiled as doc tests so that the quick start stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
