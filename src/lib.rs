//! # payhook
//!
//! The merchant side of a payment aggregator (interface 0.3.2): payhook hosts the three
//! endpoints the aggregator calls — **providers validation**, **transaction validation** and
//! the **transaction result callback** — so that a merchant writes only its business
//! decisions. It authenticates, parses and bounds every request, turns each decision into
//! the answer the aggregator expects, and gives every bad input a defined status code and a
//! `{"message": "..."}` body.
//!
//! ## Quick start
//!
//! Implement the traits of [`handler`] for the endpoints you host, build an [`App`], and
//! [`serve`] it:
//!
//! ```no_run
//! use payhook::handler::{
//!     CallbackDecision, CallbackReceiver, ProviderFilter, ProvidersDecision, ProvidersValidator,
//!     CallbackContext, RequestContext, TransactionValidator, ValidationDecision,
//! };
//! use payhook::model::{CallbackBody, ProvidersValidationRequest, TransactionValidationRequest};
//! use payhook::{App, Config, HandlerError};
//!
//! struct Shop;
//!
//! impl ProvidersValidator for Shop {
//!     async fn validate_providers(&self, request: ProvidersValidationRequest, _: RequestContext)
//!         -> Result<ProvidersDecision, HandlerError> {
//!         let providers = ProviderFilter::from_request(&request).apply(&request.providers);
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
//!         Ok(ValidationDecision::Allow)
//!     }
//! }
//!
//! impl CallbackReceiver for Shop {
//!     async fn receive_callback(&self, callback: CallbackBody, ctx: CallbackContext)
//!         -> Result<CallbackDecision, HandlerError> {
//!         // Booked atomically with the mark that this (nonce, status) is done: exactly once.
//!         let entry = format!("{} {} {}", callback.client_id, callback.amount, callback.currency);
//!         ctx.effects.write(move |tx| tx.insert("ledger", callback.nonce.as_bytes(), entry.as_bytes()));
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
//!     let store = payhook::store::SledStore::open(&config.store, &["ledger"])?;
//!     let app = App::builder(config)
//!         .store(store)
//!         .providers_validator(Shop)
//!         .transaction_validator(Shop)
//!         .callback_receiver(Shop)
//!         .build()?;
//!     payhook::serve(listener, app, payhook::shutdown_signal()).await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Map of the crate
//!
//! * [`model`] — wire types of every resource and message of the spec; exact money, lenient
//!   UTC times, tolerant status codes.
//! * [`handler`] — the three traits a merchant implements, their decisions, the request
//!   context, and provider filter helpers.
//! * [`server`] — the [`App`] service (routing, limits, the status code table) and [`serve`]
//!   (HTTP/1.1 and HTTP/2, timeouts, graceful shutdown).
//! * [`signature`] — callback signatures: every real scheme verified with ring over the raw
//!   body, keys in every common format with rotation, signing, key generation, and `sniff`.
//! * [`auth`] — how the validation endpoints authenticate the aggregator: signature, shared
//!   secret, HTTP Basic, IP allow-list.
//! * [`store`] — exactly-once effects: deduplication records per nonce in sled, handler
//!   effects written atomically with the mark, durable group commit, retention.
//! * [`postponed`] — Awaitable validation: pending validations, the [`postponed::Resolver`]
//!   (first decision wins), the durable outbox of results and its worker, deadlines.
//! * [`gateway`] — a client of the aggregator's own endpoints (login, refresh, postponed
//!   results, transaction lookup) with the session kept fresh; [`App::reconcile`] books lost
//!   callbacks from the lookup.
//! * [`admin`] — operating commands (postponed validations, transaction lookup,
//!   reconcile) for the `payhook` binary and a merchant's own binary.
//! * [`sim`] — local testing: a mock gateway, signed triggers, callback delivery with the
//!   real retry schedule, fault injection, and scenario files.
//! * [`scaffold`] — `payhook new`: a merchant crate rendered from `templates/merchant/`.
//! * [`config`] — defaults, TOML file, `PAYHOOK_*` environment, validation.
//! * [`Secret`] — strings that redact themselves in `Debug`.
//! * [`Error`] — the crate-level error for applications.
//!
//! The `payhook` binary (`src/main.rs`) is a thin command line over this library.

#![cfg_attr(test, allow(clippy::unwrap_used, reason = "tests unwrap freely"))]

pub mod admin;
pub mod auth;
pub mod config;
mod error;
pub mod gateway;
pub mod handler;
mod logged;
pub mod model;
pub mod postponed;
pub mod scaffold;
mod secret;
pub mod server;
pub mod signature;
pub mod sim;
pub mod store;

pub use config::Config;
pub use error::{Error, Report, bind};
pub use handler::HandlerError;
pub use logged::Logged;
pub use secret::Secret;
pub use server::{App, AppBuilder, serve, shutdown_signal};

/// The README's code blocks, compiled as doc tests so that the quick start stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
