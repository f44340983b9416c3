//! Operating a merchant's service from the command line: postponed validations, failing
//! callbacks, transaction lookup, and lost-callback recovery. The `payhook` binary uses these, and so can a
//! merchant's own binary, which has its callback handler and can therefore book what
//! [`reconcile`] recovers (see `examples/merchant.rs`).
//!
//! With the `clap` feature the commands derive `clap::Subcommand`, to be flattened into a
//! merchant's own command line:
//!
//! ```no_run
//! # #[cfg(feature = "clap")] {
//! use clap::Parser;
//! use payhook::admin::AdminCommand;
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(subcommand)]
//!     admin: Option<AdminCommand>,
//! }
//!
//! # async fn run(app: payhook::App, config: payhook::Config) -> Result<(), payhook::admin::AdminError> {
//! if let Some(command) = Args::parse().admin {
//!     command.run(&config, app.store(), Some(&app), &mut std::io::stdout()).await?;
//! }
//! # Ok(()) }
//! # }
//! ```
//!
//! sled lets one process open a store. Against a running service the commands go through
//! its operating API (`/payhook/admin/`, on when `admin.token` or `[admin.operators]` is
//! set) with an
//! [`AdminClient`] ([`AdminCommand::run_remote`]); [`AdminCommand::run`] works on the store
//! of a stopped service (a decision is then delivered by its outbox when it starts).

use crate::model::ValidationId;
use chrono::{DateTime, SecondsFormat, Utc};
use std::{fmt::Write as _, io::Write, sync::Arc};
use uuid::Uuid;

use crate::App;
use crate::config::Config;
use crate::gateway::{GatewayClient, GatewayError};
use crate::inspector::{DeliveryFilter, DeliveryList};
use crate::model::TransactionRecord;
use crate::postponed::{
    Clock, Decision, Delivery, PostponedPage, PostponedState, PostponedValidation, ResolveError,
    Resolver,
};
use crate::server::Reconciled;
use crate::store::{FailingCallback, FailingCursor, FailingPage, HeldCallback, Store, StoreError};

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The store could not be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The aggregator could not be asked.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// The decision was refused.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// Printing failed.
    #[error("cannot write the output: {0}")]
    Output(std::io::Error),
    /// Some reference ids were not reconciled, or their outcome is unknown (each is
    /// reported in the output, saying which).
    #[error(
        "{0} of the reference ids were not reconciled, or their outcome is unknown (each is told above)"
    )]
    NotReconciled(usize),
    /// The command needs what this binary does not have.
    #[error("{0}")]
    Unsupported(String),
    /// More than one instance answers the address `payhook tail` follows (a load balancer):
    /// each records its own deliveries.
    #[error(
        "more than one instance answers this address (a load balancer?): each records its own deliveries; tail one instance's own address"
    )]
    ManyInstances,
    /// What the command was given is refused (it says why), before anything was done.
    #[error("{0}")]
    Refused(String),
    /// `callbacks resolve` named a result that is not held (or was resolved already).
    #[error(
        "no held result of nonce {nonce}, status {status} waits: not held, or resolved already"
    )]
    NotHeld {
        /// The nonce named (escaped, as in logs).
        nonce: String,
        /// The status code named.
        status: i32,
    },
    /// The running service's operating API refused or failed.
    #[error("the service answered {status}: {message}")]
    Remote {
        /// The HTTP status (0: no answer).
        status: u16,
        /// Its message.
        message: String,
    },
}

impl From<std::io::Error> for AdminError {
    fn from(error: std::io::Error) -> Self {
        Self::Output(error)
    }
}

/// The operating commands.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Subcommand))]
pub enum AdminCommand {
    /// Postponed (Awaitable) validations in the store.
    #[cfg_attr(feature = "clap", command(subcommand))]
    Validations(ValidationsCommand),
    /// Callbacks whose handler failed and that are not booked yet; results held by the
    /// merchant and not resolved yet.
    #[cfg_attr(feature = "clap", command(subcommand))]
    Callbacks(CallbacksCommand),
    /// Fetch a transaction from the aggregator by its reference id and print it (spec 2.6).
    Transaction {
        /// The transaction's reference id (a GUID).
        reference_id: Uuid,
        /// Print the record as the aggregator's JSON instead of text.
        #[cfg_attr(feature = "clap", arg(long))]
        json: bool,
    },
    /// Recover lost callbacks: fetch each transaction and book its result through the
    /// callback handler, once (a result booked before is left alone). Run from the `payhook`
    /// binary, which has no handler, it reports which results are booked and which were lost.
    Reconcile {
        /// A reference id to reconcile; repeat for several.
        #[cfg_attr(feature = "clap", arg(long = "ref", required = true))]
        reference_ids: Vec<Uuid>,
    },
}

/// `validations …`
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Subcommand))]
pub enum ValidationsCommand {
    /// List postponed validations (all of them by default).
    List {
        /// Only those still waiting for a decision.
        #[cfg_attr(feature = "clap", arg(long, conflicts_with = "conflicts"))]
        pending: bool,
        /// Only those whose result the aggregator refused (it holds a different one).
        #[cfg_attr(feature = "clap", arg(long))]
        conflicts: bool,
        /// Print a JSON array instead of text.
        #[cfg_attr(feature = "clap", arg(long))]
        json: bool,
    },
    /// Decide a postponed validation; the result is posted to the aggregator by the outbox.
    #[cfg_attr(
        feature = "clap",
        command(group(clap::ArgGroup::new("decision").required(true).args(["allow", "deny"])))
    )]
    Resolve {
        /// The validation id.
        id: i64,
        /// The client may make the transaction.
        #[cfg_attr(feature = "clap", arg(long))]
        allow: bool,
        /// The client may not.
        #[cfg_attr(feature = "clap", arg(long))]
        deny: bool,
        /// The explanation sent with the result.
        #[cfg_attr(feature = "clap", arg(long, default_value = ""))]
        description: String,
        /// Who decides, kept with the decision (default: `$SUDO_USER` under sudo, else
        /// `$USER` or `$USERNAME`; `--by ''` keeps no name). Through a service whose
        /// `[admin.operators]` gave you a token of your own, the service keeps your
        /// operator's name instead.
        #[cfg_attr(feature = "clap", arg(long))]
        by: Option<String>,
    },
}

/// `callbacks …`
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Subcommand))]
pub enum CallbacksCommand {
    /// List the (nonce, status) pairs whose handler failed and that are not booked yet,
    /// most recent failure first: the aggregator is still retrying them, or gave up and
    /// they must be booked by hand (or by `reconcile`).
    Failing {
        /// Print a JSON array instead of text.
        #[cfg_attr(feature = "clap", arg(long))]
        json: bool,
        /// Only the N that failed last (an incident can leave hundreds of thousands).
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        latest: Option<usize>,
    },
    /// List the results acknowledged but held by the merchant's effects (a quarantine) and
    /// not resolved yet, latest first: the aggregator stopped retrying them, and a person
    /// puts the merchant's books right.
    Held {
        /// Print a JSON array instead of text.
        #[cfg_attr(feature = "clap", arg(long))]
        json: bool,
        /// At most N (default and most 1,000).
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        latest: Option<usize>,
    },
    /// Mark a held result resolved, once a person put the merchant's books right: it is kept
    /// with the note, and no longer listed or counted (`payhook_callbacks_held_unresolved`).
    /// Nothing is booked, and the aggregator's retries of it stay answered as acknowledged.
    Resolve {
        /// The callback's nonce.
        #[cfg_attr(feature = "clap", arg(long))]
        nonce: String,
        /// The status code held (e.g. 1, -1, -2).
        #[cfg_attr(feature = "clap", arg(long, allow_negative_numbers = true))]
        status: i32,
        /// What was done in the merchant's books: kept with the result, and told by a later
        /// reconcile of the transaction.
        #[cfg_attr(feature = "clap", arg(long))]
        note: String,
        /// Who resolves it, kept with the note (default: `$SUDO_USER` under sudo, else
        /// `$USER` or `$USERNAME`; `--by ''` keeps no name). Through a service whose
        /// `[admin.operators]` gave you a token of your own, the service keeps your
        /// operator's name instead.
        #[cfg_attr(feature = "clap", arg(long))]
        by: Option<String>,
    },
}

impl AdminCommand {
    /// Runs the command, printing to `out`. `app` is needed by `reconcile` only: it books
    /// through the app's callback handler.
    ///
    /// # Errors
    ///
    /// [`AdminError`] saying what failed; `reconcile` fails when any id was not reconciled.
    pub async fn run(
        self,
        config: &Config,
        store: Option<Arc<dyn Store>>,
        app: Option<&App>,
        out: &mut dyn Write,
    ) -> Result<(), AdminError> {
        match self {
            Self::Validations(command) => {
                let store = store.ok_or_else(|| {
                    AdminError::Unsupported("validations need the service's store".into())
                })?;
                command.run(config, store, out).await
            }
            Self::Callbacks(command) => {
                let store = store.ok_or_else(|| {
                    AdminError::Unsupported("callbacks need the service's store".into())
                })?;
                match command {
                    CallbacksCommand::Failing { json, latest } => {
                        let failing = match latest {
                            Some(limit) => store.failing_latest(limit).await?,
                            None => store.failing_callbacks().await?,
                        };
                        print(out, json, &failing, |all| describe_failing(all))
                    }
                    CallbacksCommand::Held { json, latest } => {
                        let limit = held_limit(latest);
                        let held = store.held_callbacks(limit).await?;
                        print(out, json, &held, |all| describe_held(all, limit))
                    }
                    CallbacksCommand::Resolve {
                        nonce,
                        status,
                        note,
                        by,
                    } => {
                        if let Some(refused) = crate::store::held::note_refused(&note) {
                            return Err(AdminError::Refused(format!("--note: {refused}")));
                        }
                        let code = crate::model::TransactionStatus::from_code(status);
                        let by = named_on_the_store(by, config);
                        let resolved = store
                            .resolve_held(&nonce.as_str().into(), code, &note, by.as_deref())
                            .await?;
                        let resolved = resolved.ok_or_else(|| nothing_held(&nonce, status))?;
                        crate::store::held::log_resolved(
                            &resolved,
                            "the command line, on the store",
                        );
                        writeln!(out, "{}", resolved_line(&resolved))?;
                        Ok(())
                    }
                }
            }
            Self::Transaction { reference_id, json } => {
                let gateway = GatewayClient::new(&config.gateway)?;
                let record = gateway.transaction(reference_id).await?;
                print(out, json, &record, describe_transaction)
            }
            Self::Reconcile { reference_ids } => {
                let gateway = GatewayClient::new(&config.gateway)?;
                match (app, store) {
                    (Some(app), _) => reconcile(app, &gateway, &reference_ids, out).await,
                    (None, Some(store)) => {
                        let max_chars = config.server.max_identifier_chars;
                        report(store.as_ref(), &gateway, &reference_ids, max_chars, out).await
                    }
                    (None, None) => Err(AdminError::Unsupported(
                        "reconcile needs the service's store".into(),
                    )),
                }
            }
        }
    }
}

impl ValidationsCommand {
    async fn run(
        self,
        config: &Config,
        store: Arc<dyn Store>,
        out: &mut dyn Write,
    ) -> Result<(), AdminError> {
        let resolver =
            Resolver::new(store, Clock::new(), Arc::default()).with_deadline_of(&config.validation);
        match self {
            Self::List {
                pending,
                conflicts,
                json,
            } => {
                let state = match (pending, conflicts) {
                    (true, _) => Some(PostponedState::Pending),
                    (_, true) => Some(PostponedState::Conflict),
                    _ => None,
                };
                let mut listing = ValidationsOut::new(out, json);
                let resolver = &resolver;
                each_validations_page(
                    |after| async move {
                        Ok(resolver
                            .page(state, after, crate::server::VALIDATIONS_PAGE_LIMIT)
                            .await?)
                    },
                    |page| listing.page(&page),
                )
                .await?;
                listing.finish()?;
            }
            Self::Resolve {
                id,
                allow,
                description,
                by,
                ..
            } => {
                let decision = Decision::allow_if(allow, description);
                let by = named_on_the_store(by, config);
                let outcome = resolver.resolve_by(id, decision, by.as_deref()).await?;
                let verdict = if allow { "allowed" } else { "denied" };
                writeln!(
                    out,
                    "validation {id}: {verdict} ({outcome:?}); the outbox posts it to the aggregator"
                )?;
            }
        }
        Ok(())
    }
}

/// The operating API of a running service (`/payhook/admin/`, enabled by `admin.token` or
/// `[admin.operators]`), called with a token: the shared one or an operator's own.
pub struct AdminClient {
    base: String,
    token: crate::Secret,
    http: crate::gateway::HttpClient,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl AdminClient {
    /// A client of the service at `base_url` (e.g. `http://127.0.0.1:8080`).
    ///
    /// # Errors
    ///
    /// [`AdminError::Unsupported`] when `base_url` is plain http to a host other than
    /// loopback (the bearer token would cross the network in the clear) or the HTTP client
    /// cannot be built.
    pub fn new(base_url: &str, token: crate::Secret) -> Result<Self, AdminError> {
        crate::gateway::check_remote_url(base_url).map_err(AdminError::Unsupported)?;
        Ok(Self {
            base: base_url.trim_end_matches('/').to_owned(),
            token,
            http: crate::gateway::direct_client()
                .map_err(|e| AdminError::Unsupported(e.to_string()))?,
        })
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, AdminError> {
        Ok(self.call_with_headers(method, path, body).await?.0)
    }

    /// [`AdminClient::call`], with the answer's headers.
    async fn call_with_headers<T: serde::de::DeserializeOwned>(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(T, http::HeaderMap), AdminError> {
        use http_body_util::BodyExt as _;
        let remote = |status: u16, message: String| AdminError::Remote { status, message };
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{}/payhook/admin/{path}", self.base))
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token.expose()),
            )
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.unwrap_or_default(),
            )))
            .map_err(|e| remote(0, e.to_string()))?;
        let call = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| remote(0, format!("cannot reach {}: {e}", self.base)))?;
            let status = response.status();
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| remote(0, e.to_string()))?
                .to_bytes();
            if !status.is_success() {
                let message = serde_json::from_slice::<crate::model::ErrorBody>(&body).map_or_else(
                    |_| String::from_utf8_lossy(&body).trim().to_owned(),
                    |b| b.message,
                );
                // An answer that is not the service's (a proxy's error page, a wrong
                // `--admin-url`) may echo the request: never its token on a terminal or in
                // a CI log, nor a whole page.
                let message =
                    crate::secret::redacted(&message, &[self.token.expose()], REMOTE_MESSAGE_CHARS);
                return Err(remote(status.as_u16(), message));
            }
            let value = serde_json::from_slice(&body)
                .map_err(|e| remote(status.as_u16(), e.to_string()))?;
            Ok((value, parts.headers))
        };
        tokio::time::timeout(std::time::Duration::from_secs(60), call)
            .await
            .map_err(|_| remote(0, "no answer within 60 s".into()))?
    }

    /// The service's recent deliveries after `after` that pass `filter`, waiting up to
    /// `wait` (at most 30 s) for one when there is none yet (see [`crate::inspector`]): the
    /// oldest 1,000 of them, with [`DeliveryList::more`](crate::inspector::DeliveryList::more)
    /// set when others follow.
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached.
    pub async fn deliveries(
        &self,
        after: u64,
        wait: std::time::Duration,
        filter: &DeliveryFilter,
    ) -> Result<DeliveryList, AdminError> {
        let mut path = format!(
            "deliveries?after={after}&wait={}&oldest=true&limit={FOLLOWED_PAGE}",
            wait.as_secs()
        );
        let query = filter.to_query();
        if !query.is_empty() {
            path.push('&');
            path.push_str(&query);
        }
        self.call(http::Method::GET, &path, None).await
    }

    /// The callbacks whose handler failed and that are not booked yet, most recent failure
    /// first: every page of [`AdminClient::failing_page`], read in turn (see
    /// [`AdminClient::failing_latest`]).
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached.
    pub async fn failing_callbacks(&self) -> Result<Vec<FailingCallback>, AdminError> {
        self.failing_latest(usize::MAX).await
    }

    /// The `limit` of [`AdminClient::failing_callbacks`] that failed last, read a page at a
    /// time. A pair that fails again while the pages are read moves above them: when it took
    /// more than one page, the top is read again afterwards, down to [`REREAD_MARGIN`]
    /// before where it was, and such a pair is listed once, as it is now. (One that fails
    /// again during that last read is in the next listing.)
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached, or its pages
    /// do not lead on.
    pub async fn failing_latest(&self, limit: usize) -> Result<Vec<FailingCallback>, AdminError> {
        let (failing, pages) = self.failing_walk(limit, None).await?;
        let top = match failing.first() {
            Some(first) if pages > 1 => first.last_failed - REREAD_MARGIN,
            _ => return Ok(failing),
        };
        let (again, _) = self.failing_walk(usize::MAX, Some(top)).await?;
        let mut latest = std::collections::HashMap::with_capacity(failing.len());
        for pair in failing.into_iter().chain(again) {
            latest.insert((pair.nonce.as_str().to_owned(), pair.status), pair);
        }
        let mut failing: Vec<_> = latest.into_values().collect();
        crate::store::sort_latest_first(&mut failing);
        failing.truncate(limit);
        Ok(failing)
    }

    /// Reads pages from the top: `limit` pairs, or those that failed at `down_to` or later,
    /// or all; and how many pages it took.
    async fn failing_walk(
        &self,
        limit: usize,
        down_to: Option<DateTime<Utc>>,
    ) -> Result<(Vec<FailingCallback>, usize), AdminError> {
        let (mut failing, mut pages, mut after) = (Vec::new(), 0, None);
        while failing.len() < limit {
            let page = self
                .failing_page(after.as_ref(), limit - failing.len())
                .await?;
            pages += 1;
            let read = page.failing.len();
            let before = page
                .failing
                .iter()
                .position(|f| down_to.is_some_and(|time| f.last_failed < time));
            failing.extend(page.failing.into_iter().take(before.unwrap_or(read)));
            if before.is_some() {
                break;
            }
            match page.next {
                None => break,
                Some(next) if read == 0 || after.as_ref() == Some(&next) => {
                    return Err(AdminError::Remote {
                        status: 200,
                        message: "the service's next page of failing callbacks does not move on"
                            .into(),
                    });
                }
                next => after = next,
            }
        }
        Ok((failing, pages))
    }

    /// One page of the failing callbacks: at most `limit` (the service lists at most 1,000
    /// a page) after `after`, from the latest without it, and where the next page starts.
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached.
    pub async fn failing_page(
        &self,
        after: Option<&FailingCursor>,
        limit: usize,
    ) -> Result<FailingPage, AdminError> {
        let mut path = format!("callbacks/failing?limit={}", limit.max(1));
        if let Some(cursor) = after {
            let _ = write!(path, "&after={cursor}");
        }
        let (failing, headers): (Vec<FailingCallback>, _) = self
            .call_with_headers(http::Method::GET, &path, None)
            .await?;
        Ok(FailingPage {
            failing,
            next: next_after(&headers)?,
        })
    }

    /// The `limit` results held last and not resolved yet, latest first (the service lists
    /// at most 1,000).
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached.
    pub async fn held_callbacks(&self, limit: usize) -> Result<Vec<HeldCallback>, AdminError> {
        let limit = limit.clamp(1, crate::server::HELD_LIMIT);
        self.call(
            http::Method::GET,
            &format!("callbacks/held?limit={limit}"),
            None,
        )
        .await
    }

    /// Resolves the held result of (`nonce`, `status`) with `note`, by the person `by` (as
    /// they name themselves; none when `None`): what it is now.
    ///
    /// # Errors
    ///
    /// [`AdminError::NotHeld`] when no held result of the pair waits;
    /// [`AdminError::Remote`] when the service refuses otherwise or cannot be reached.
    pub async fn resolve_held(
        &self,
        nonce: &str,
        status: i32,
        note: &str,
        by: Option<&str>,
    ) -> Result<HeldCallback, AdminError> {
        let body = serde_json::to_vec(&crate::server::AdminHeldPair {
            nonce: nonce.to_owned(),
            status,
            note: note.to_owned(),
            by: by.map(str::to_owned),
        })
        .unwrap_or_default();
        match self
            .call(http::Method::POST, "callbacks/held/resolve", Some(body))
            .await
        {
            Err(AdminError::Remote { status: 404, .. }) => Err(nothing_held(nonce, status)),
            answered => answered,
        }
    }

    /// The postponed validations (in `state`; in any when `None`), by id: every page of
    /// [`AdminClient::validations_page`], read in turn and held together (a listing of the
    /// retention period's records may be long: read it a page at a time where that
    /// matters).
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached, or its pages
    /// do not lead on.
    pub async fn validations(
        &self,
        state: Option<PostponedState>,
    ) -> Result<Vec<PostponedValidation>, AdminError> {
        let mut all = Vec::new();
        each_validations_page(
            |after| self.validations_page(state, after, crate::server::VALIDATIONS_PAGE_LIMIT),
            |page| {
                all.extend(page);
                Ok(())
            },
        )
        .await?;
        Ok(all)
    }

    /// One page of the postponed validations in `state` (in any when `None`): at most
    /// `limit` (the service lists at most 500 a page) whose id follows `after` (from the
    /// lowest without it), by id, and where the next page starts.
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached.
    pub async fn validations_page(
        &self,
        state: Option<PostponedState>,
        after: Option<ValidationId>,
        limit: usize,
    ) -> Result<PostponedPage, AdminError> {
        // `state` first: a service from before pages read the query's start as the state,
        // and refuses `state=pending&limit=…` (400) rather than answering every state.
        let mut path = String::from("validations?");
        if let Some(state) = state {
            let _ = write!(path, "state={}&", state.as_str());
        }
        let _ = write!(path, "limit={}", limit.max(1));
        if let Some(after) = after {
            let _ = write!(path, "&after={after}");
        }
        let (validations, headers) = self
            .call_with_headers(http::Method::GET, &path, None)
            .await?;
        Ok(PostponedPage {
            validations,
            next: next_after(&headers)?,
        })
    }

    /// Decides a postponed validation, by the person `by` (as they name themselves, kept
    /// by a service whose token is shared; a token of an operator's own names them
    /// instead); returns `recorded` or `unchanged`.
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] with 409 when it was decided differently, 404 when unknown.
    pub async fn resolve(
        &self,
        id: impl Into<ValidationId>,
        decision: &Decision,
        by: Option<&str>,
    ) -> Result<String, AdminError> {
        let id = id.into();
        let body = serde_json::to_vec(&crate::server::AdminDecision {
            success: decision.allows(),
            description: decision.description().to_owned(),
            nonce: None,
            by: by.map(str::to_owned),
        })
        .unwrap_or_default();
        let answer: crate::model::ErrorBody = self
            .call(http::Method::POST, &format!("validations/{id}"), Some(body))
            .await?;
        Ok(answer.message)
    }

    /// Has the service read its configuration again and take its credentials, as on
    /// SIGHUP (`POST /payhook/admin/credentials/read-again`): what changed.
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] with 409 when nothing was taken (the configuration cannot be
    /// read or is refused, or the service gave none to read: the message says which), or
    /// when the service refuses otherwise or cannot be reached.
    pub async fn read_credentials_again(
        &self,
    ) -> Result<crate::server::AdminCredentialsRead, AdminError> {
        self.call(http::Method::POST, "credentials/read-again", None)
            .await
    }

    /// Has the service read its configuration again and say what it would change, taking
    /// nothing (`POST /payhook/admin/credentials/check`): a rotation tried before it is made.
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] with 409 when it would not be taken (the message says why), or
    /// when the service refuses otherwise or cannot be reached.
    pub async fn check_credentials(
        &self,
    ) -> Result<crate::server::AdminCredentialsRead, AdminError> {
        self.call(http::Method::POST, "credentials/check", None)
            .await
    }

    /// Has the service recover the transactions (books through its handler).
    ///
    /// # Errors
    ///
    /// [`AdminError::Remote`] when the service refuses or cannot be reached.
    pub async fn reconcile(
        &self,
        reference_ids: &[Uuid],
    ) -> Result<Vec<crate::server::AdminReconciled>, AdminError> {
        let body = serde_json::to_vec(&crate::server::AdminReconcile {
            reference_ids: reference_ids.to_vec(),
        })
        .unwrap_or_default();
        self.call(http::Method::POST, "reconcile", Some(body)).await
    }
}

impl AdminCommand {
    /// Runs the command against a running service through its operating API.
    ///
    /// # Errors
    ///
    /// As [`AdminCommand::run`], and [`AdminError::Remote`] for the service's refusals.
    pub async fn run_remote(
        self,
        config: &Config,
        client: &AdminClient,
        out: &mut dyn Write,
    ) -> Result<(), AdminError> {
        match self {
            Self::Validations(ValidationsCommand::List {
                pending,
                conflicts,
                json,
            }) => {
                let state = match (pending, conflicts) {
                    (true, _) => Some(PostponedState::Pending),
                    (_, true) => Some(PostponedState::Conflict),
                    _ => None,
                };
                let mut listing = ValidationsOut::new(out, json);
                each_validations_page(
                    |after| {
                        client.validations_page(state, after, crate::server::VALIDATIONS_PAGE_LIMIT)
                    },
                    |page| listing.page(&page),
                )
                .await?;
                listing.finish()
            }
            Self::Validations(ValidationsCommand::Resolve {
                id,
                allow,
                description,
                by,
                ..
            }) => {
                let by = resolver_named(by);
                let outcome = client
                    .resolve(id, &Decision::allow_if(allow, description), by.as_deref())
                    .await?;
                let verdict = if allow { "allowed" } else { "denied" };
                writeln!(
                    out,
                    "validation {id}: {verdict} ({outcome}); the service's outbox posts it to the aggregator"
                )?;
                Ok(())
            }
            Self::Callbacks(CallbacksCommand::Failing { json, latest }) => {
                let failing = match latest {
                    Some(limit) => client.failing_latest(limit).await?,
                    None => client.failing_callbacks().await?,
                };
                print(out, json, &failing, |all| describe_failing(all))
            }
            Self::Callbacks(CallbacksCommand::Held { json, latest }) => {
                let limit = held_limit(latest);
                let held = client.held_callbacks(limit).await?;
                print(out, json, &held, |all| describe_held(all, limit))
            }
            Self::Callbacks(CallbacksCommand::Resolve {
                nonce,
                status,
                note,
                by,
            }) => {
                let by = resolver_named(by);
                let resolved = client
                    .resolve_held(&nonce, status, &note, by.as_deref())
                    .await?;
                writeln!(out, "{}", resolved_line(&resolved))?;
                Ok(())
            }
            Self::Reconcile { reference_ids } => {
                let mut failed = 0;
                // One request per transaction: each is answered within the client's bound
                // (a lookup takes up to `gateway.timeout`), and printed as it is.
                // A transaction the service could not be asked about (unreachable, or
                // refused) is reported and counted, and the rest are still asked.
                for id in &reference_ids {
                    let answered = match client.reconcile(std::slice::from_ref(id)).await {
                        Ok(answered) => answered,
                        Err(error) if outcome_unknown(&error) => {
                            failed += 1;
                            writeln!(
                                out,
                                "{id}: outcome unknown ({}): the service may have booked it; run \
                                 reconcile again to see (it books nothing twice), and do not book \
                                 it by hand meanwhile",
                                crate::report::InLine(&error)
                            )?;
                            continue;
                        }
                        Err(error) => {
                            failed += 1;
                            writeln!(
                                out,
                                "{id}: NOT reconciled: {}",
                                crate::report::InLine(&error)
                            )?;
                            continue;
                        }
                    };
                    let Some(outcome) = answered.into_iter().next() else {
                        failed += 1;
                        writeln!(out, "{id}: NOT reconciled: the service answered nothing")?;
                        continue;
                    };
                    let status = outcome
                        .status
                        .map(|s| crate::model::TransactionStatus::from_code(s).to_string())
                        .unwrap_or_default();
                    let line = match outcome.outcome.as_str() {
                        "booked" => format!("{}: booked now ({status})", outcome.reference_id),
                        "held" => held_line(
                            outcome.reference_id,
                            &status,
                            outcome.message.as_deref().unwrap_or_default(),
                        ),
                        "already_booked" => already_acknowledged(outcome.reference_id, &status),
                        "already_held" | "already_resolved" => already_held(
                            outcome.reference_id,
                            &status,
                            outcome.outcome == "already_held",
                            outcome.message.as_deref().unwrap_or_default(),
                        ),
                        "not_final" => format!(
                            "{}: not final yet ({status}); nothing to book",
                            outcome.reference_id
                        ),
                        // The service could not tell whether it booked: said as it said it.
                        "unknown" => {
                            failed += 1;
                            format!(
                                "{}: {}",
                                outcome.reference_id,
                                outcome.message.as_deref().unwrap_or("outcome unknown")
                            )
                        }
                        _ => {
                            failed += 1;
                            format!(
                                "{}: NOT reconciled: {}",
                                outcome.reference_id,
                                outcome.message.unwrap_or_default()
                            )
                        }
                    };
                    writeln!(out, "{line}")?;
                }
                if failed == 0 {
                    Ok(())
                } else {
                    Err(AdminError::NotReconciled(failed))
                }
            }
            command @ Self::Transaction { .. } => command.run(config, None, None, out).await,
        }
    }
}

/// Whether a reconcile that ended in `error` may have booked all the same: no answer (the
/// service's booking runs on beside a client that gave up waiting), a proxy's 502 or 504
/// (payhook sends neither: its read of the answer gave up), or a success whose body could
/// not be read.
fn outcome_unknown(error: &AdminError) -> bool {
    matches!(error, AdminError::Remote { status, .. }
        if matches!(status, 0 | 502 | 504 | 200..=299))
}

/// Writes `value` to `out` as pretty JSON (for scripts) or as `describe` tells it.
fn print<T: serde::Serialize + ?Sized>(
    out: &mut dyn Write,
    json: bool,
    value: &T,
    describe: impl FnOnce(&T) -> String,
) -> Result<(), AdminError> {
    if json {
        serde_json::to_writer_pretty(&mut *out, value)
            .map_err(|error| AdminError::Output(std::io::Error::other(error)))?;
        writeln!(out)?;
    } else {
        out.write_all(describe(value).as_bytes())?;
    }
    Ok(())
}

/// The line of a transaction whose result was acknowledged before the reconcile and that
/// the store does not keep as held: booked then — or held before payhook kept held results,
/// or by a store that keeps none.
fn already_acknowledged(id: Uuid, status: &str) -> String {
    format!(
        "{id}: already acknowledged ({status}): booked (unless held before held results were kept); nothing done"
    )
}

/// The line of a transaction whose result was acknowledged before the reconcile and held by
/// the merchant: waiting for a person, or resolved by one (`told`: the reason, and how it
/// was resolved).
fn already_held(id: Uuid, status: &str, waiting: bool, told: &str) -> String {
    if waiting {
        format!(
            "{id}: already acknowledged ({status}) but HELD by the merchant, not booked: {}; nothing done — put your books right, then `payhook callbacks resolve`",
            crate::Escaped(told)
        )
    } else {
        format!(
            "{id}: already acknowledged ({status}), held by the merchant, not booked: {}; nothing done",
            crate::Escaped(told)
        )
    }
}

/// The line of a reconciled transaction whose result the merchant held, not booked.
fn held_line(id: Uuid, status: &str, reason: &str) -> String {
    format!(
        "{id}: acknowledged now ({status}) but HELD by the merchant, not booked: {} — for a person to resolve",
        crate::Escaped(reason)
    )
}

/// Books lost callbacks through `app` and reports each id on `out`.
///
/// # Errors
///
/// [`AdminError::NotReconciled`] with the count of ids that failed (each reported).
pub async fn reconcile(
    app: &App,
    gateway: &GatewayClient,
    reference_ids: &[Uuid],
    out: &mut dyn Write,
) -> Result<(), AdminError> {
    let mut failed = 0;
    for (id, outcome) in app.reconcile(gateway, reference_ids).await {
        let line = match outcome {
            Ok(Reconciled::Booked(status)) => format!("{id}: booked now ({status})"),
            Ok(Reconciled::Held { status, reason }) => held_line(id, &status.to_string(), &reason),
            Ok(Reconciled::AlreadyBooked(status)) => already_acknowledged(id, &status.to_string()),
            Ok(Reconciled::AlreadyHeld { status, held }) => already_held(
                id,
                &status.to_string(),
                held.unresolved(),
                &crate::store::held::told(&held),
            ),
            Ok(Reconciled::NotFinal(status)) => {
                format!("{id}: not final yet ({status}); nothing to book")
            }
            Err(error @ crate::server::ReconcileError::OutcomeUnknown(_)) => {
                failed += 1;
                format!("{id}: {error}")
            }
            Err(error) => {
                failed += 1;
                format!("{id}: NOT reconciled: {error}")
            }
        };
        writeln!(out, "{line}")?;
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(AdminError::NotReconciled(failed))
    }
}

/// Without the callback handler: tells, per reference id, whether its result is booked in
/// `store` or was lost (and must be booked by the service's own binary, or by hand when its
/// record cannot be booked — one without `merchantClientId`, say, or whose nonce or client
/// id is longer than `max_chars` — only once the aggregator will not deliver it again, as
/// the line says), or whether that cannot be told (the transaction was created beyond the
/// retention, or its record carries no creation time). A lookup that answers about another
/// transaction is not checked.
///
/// # Errors
///
/// [`AdminError::NotReconciled`] with the count of lost or unreadable ids (each reported).
pub async fn report(
    store: &dyn Store,
    gateway: &GatewayClient,
    reference_ids: &[Uuid],
    max_chars: usize,
    out: &mut dyn Write,
) -> Result<(), AdminError> {
    let mut lost = 0;
    for &id in reference_ids {
        let line = match gateway.transaction(id).await {
            Ok(record) if record.transaction_reference_id != id => {
                lost += 1;
                format!(
                    "{id}: NOT checked: the lookup answered with transaction {}",
                    record.transaction_reference_id
                )
            }
            Ok(record) if record.transaction_status.in_progress() => format!(
                "{id}: not final yet ({}); nothing to book",
                record.transaction_status
            ),
            Ok(record) => {
                let status = record.transaction_status;
                if store.callback_acknowledged(&record.nonce, status).await? {
                    match store.held_callback(&record.nonce, status).await? {
                        Some(held) => already_held(
                            id,
                            &status.to_string(),
                            held.unresolved(),
                            &crate::store::held::told(&held),
                        ),
                        None => format!(
                            "{id}: acknowledged ({status}): booked (unless your handler held it before held results were kept: your books say)"
                        ),
                    }
                } else if let Some(untold) = crate::server::untellable(&record, store.reach()) {
                    lost += 1;
                    format!(
                        "{id}: cannot tell ({status}, nonce {}): {untold}; check your own books",
                        record.nonce
                    )
                } else if let Err(unfit) = crate::server::bookable(&record, max_chars) {
                    lost += 1;
                    unbookable(id, &record, &unfit)
                } else {
                    lost += 1;
                    format!(
                        "{id}: LOST ({status}, nonce {}): book it with your service's binary, \
                         e.g. `cargo run --example merchant -- reconcile --ref {id}`",
                        record.nonce
                    )
                }
            }
            Err(error) => {
                lost += 1;
                format!("{id}: NOT checked: {error}")
            }
        };
        writeln!(out, "{line}")?;
    }
    if lost == 0 {
        Ok(())
    } else {
        Err(AdminError::NotReconciled(lost))
    }
}

/// What to do about a lost result whose record reconcile cannot book (`unfit`: why). Booking
/// it by hand writes no deduplication record: a delivery of its callback after that would be
/// booked by the handler a second time. So booking by hand is advised only where the
/// aggregator's record says it will not deliver the callback again (its sending canceled);
/// otherwise the line says that it may, with the record's delivery status, and what to wait
/// for.
fn unbookable(id: Uuid, record: &TransactionRecord, unfit: &str) -> String {
    let status = record.transaction_status;
    let lost = format!(
        "{id}: LOST ({status}, nonce {}), and its record cannot be booked ({unfit})",
        record.nonce
    );
    if record.is_callback_sending_canceled {
        return format!("{lost}; the aggregator canceled its callback's sending: book it by hand");
    }
    let delivery = record.callback_delivery_status.as_deref().map_or_else(
        || "not given".to_owned(),
        |d| format!("`{}`", crate::Logged(d)),
    );
    format!(
        "{lost}; the aggregator may still deliver its callback (delivery status {delivery}, \
         sending not canceled), and a delivery after a booking by hand is booked again: book it \
         by hand only once the aggregator has stopped delivering it (its attempts used up, or \
         its sending canceled)"
    )
}

/// What `payhook tail` follows, and how it prints.
#[derive(Debug, Clone, Default)]
pub struct TailOptions {
    /// Which deliveries.
    pub filter: DeliveryFilter,
    /// One JSON object per line instead of a readable line.
    pub json: bool,
    /// Print the deliveries the service still keeps before following.
    pub recent: bool,
    /// Stop after this many deliveries (`None`: follow until stopped).
    pub count: Option<usize>,
}

/// Follows the service's deliveries as they happen (`payhook tail`) — one process's: each
/// instance records its own, so behind a load balancer `client` should reach one instance
/// (two answering in turn end it, saying so) — one line each, as
/// [`DeliveryEntry`](crate::inspector::DeliveryEntry)'s `Display` or JSON. It keeps
/// following through a restart of the service and says how many deliveries it could not
/// show when more arrived than the service keeps, each in a line of its own (with `--json`,
/// an object with an `event`: `waiting`, `restarted`, `missed`), so that JSON output stays
/// JSON.
///
/// # Errors
///
/// [`AdminError::Remote`] when the service refuses the call (a wrong token, an address not
/// allowed, recording off) or two instances answer in turn; a service that cannot be
/// reached, or answers 429 (too many wrong tokens from this address), 502, 503 or 504 (a
/// proxy in front while it restarts) is waited for. [`AdminError::Output`] when printing
/// fails.
pub async fn tail(
    client: &AdminClient,
    options: &TailOptions,
    out: &mut (dyn Write + Send),
) -> Result<(), AdminError> {
    const WAIT: std::time::Duration = std::time::Duration::from_secs(25);
    // `None`: from the service's next delivery on.
    let mut after = options.recent.then_some(0);
    let mut instance = Followed::default();
    let mut wait = WAIT;
    let mut printed = 0usize;
    // What was said of the last call that failed, while they keep failing.
    let mut failing: Option<String> = None;
    loop {
        // At once while nothing is followed yet, or after a failure: a restarted service
        // is seen at once, not at the end of a wait for numbers it has not reached.
        let asked = if after.is_none() || failing.is_some() {
            std::time::Duration::ZERO
        } else {
            wait
        };
        let list = match client
            .deliveries(after.unwrap_or(u64::MAX), asked, &options.filter)
            .await
        {
            Ok(list) => list,
            Err(error) => {
                if !passing(&error) {
                    return Err(error);
                }
                let said = match &error {
                    AdminError::Remote { status: 0, message } => message.clone(),
                    other => other.to_string(),
                };
                if failing.as_deref() != Some(said.as_str()) {
                    notice(out, options.json, &Notice::Waiting(&said))?;
                    failing = Some(said);
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        failing = None;
        let restarted = instance.answered(&list)?;
        let Some(followed) = after else {
            after = Some(list.last);
            continue;
        };
        // Another recording process (or, from a service that does not name its own, a
        // number below the one followed): the service restarted and numbers from 1 again.
        if restarted || list.last < followed {
            notice(out, options.json, &Notice::Restarted)?;
            after = Some(0);
            wait = std::time::Duration::ZERO;
            continue;
        }
        if let Some(missed) = list.missed {
            notice(out, options.json, &Notice::Missed(missed))?;
        }
        for delivery in &list.deliveries {
            if options.json {
                let line = serde_json::to_string(delivery)
                    .map_err(|e| AdminError::Output(std::io::Error::other(e)))?;
                writeln!(out, "{line}")?;
            } else {
                writeln!(out, "{delivery}")?;
            }
            printed += 1;
            if options.count.is_some_and(|count| printed >= count) {
                return Ok(());
            }
        }
        out.flush()?;
        after = Some(list.last);
        // More than a page arrived: the rest at once, in order.
        wait = if list.more {
            std::time::Duration::ZERO
        } else {
            WAIT
        };
    }
}

/// The recording processes `payhook tail` has heard from: the one followed, and those
/// before it — heard from again, two instances answer in turn (a load balancer), and
/// following would be a restart at every answer.
#[derive(Default)]
struct Followed {
    now: Option<String>,
    before: std::collections::HashSet<String>,
}

impl Followed {
    /// `list`'s process heard from: whether it is another than the one followed (a
    /// restart).
    fn answered(&mut self, list: &crate::inspector::DeliveryList) -> Result<bool, AdminError> {
        if list.instance.is_empty() {
            return Ok(false);
        }
        if self.before.contains(&list.instance) {
            return Err(AdminError::ManyInstances);
        }
        match self.now.replace(list.instance.clone()) {
            Some(earlier) if earlier != list.instance => {
                self.before.insert(earlier);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Whether `error` passes, to be waited out (asked again a second later): no answer, 429
/// (too many wrong tokens from this address — others', or this token's, which a 401 ends
/// once the allowance grows back), or a proxy's 502, 503 or 504 while the service restarts.
fn passing(error: &AdminError) -> bool {
    matches!(
        error,
        AdminError::Remote {
            status: 0 | 429 | 502..=504,
            ..
        }
    )
}

/// What `payhook tail` says between deliveries.
enum Notice<'a> {
    /// The service cannot be asked now (what it answered): asked again until it can.
    Waiting(&'a str),
    /// Another process answers: what the previous one recorded after the last delivery
    /// shown is not shown.
    Restarted,
    /// Deliveries no longer kept when asked for.
    Missed(u64),
}

/// Says `notice` in a line of its own: readable, or with `json` an object with an `event`.
fn notice(out: &mut (dyn Write + Send), json: bool, notice: &Notice<'_>) -> std::io::Result<()> {
    if json {
        let line = match notice {
            Notice::Waiting(message) => {
                serde_json::json!({"event": "waiting", "message": message})
            }
            Notice::Restarted => serde_json::json!({"event": "restarted"}),
            Notice::Missed(count) => serde_json::json!({"event": "missed", "count": count}),
        };
        return writeln!(out, "{line}");
    }
    match notice {
        Notice::Waiting(message) => writeln!(out, "… {message}; trying again"),
        Notice::Restarted => writeln!(
            out,
            "… the service restarted; following its new deliveries (what the previous process \
             recorded after the last one shown is not shown)"
        ),
        Notice::Missed(count) => writeln!(
            out,
            "… {count} deliveries not shown: more arrived than the service keeps \
             (admin.inspector_recent)"
        ),
    }
}

/// Deliveries a follower asks for at once: the oldest after the last it printed.
const FOLLOWED_PAGE: usize = 1000;

/// The most of a refusal's message the command line prints: the service's own are a line;
/// anything longer is another server's page.
const REMOTE_MESSAGE_CHARS: usize = 1000;

/// A transaction record (2.6) as labelled lines.
pub fn describe_transaction(record: &TransactionRecord) -> String {
    let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let number = |v: Option<i64>| v.map_or_else(|| "-".into(), |n| n.to_string());
    let rows = [
        ("reference id", record.transaction_reference_id.to_string()),
        ("id", record.id.to_string()),
        ("nonce", record.nonce.to_string()),
        ("type", record.transaction_type.to_string()),
        ("status", record.transaction_status.to_string()),
        ("status message", text(&record.transaction_status_message)),
        ("amount", format!("{} {}", record.amount, record.currency)),
        (
            "delivered",
            record.destination_amount.map_or_else(
                || "-".into(),
                |a| format!("{a} {}", text(&record.destination_currency)),
            ),
        ),
        ("client", text(&record.merchant_client_id)),
        (
            "provider",
            format!(
                "{} ({})",
                text(&record.provider_name),
                number(record.provider_id)
            ),
        ),
        ("pay type", text(&record.provider_pay_type)),
        ("provider tx id", text(&record.provider_transaction_id)),
        (
            "created",
            record
                .created_utc
                .map_or_else(|| "-".into(), |t| t.to_rfc3339()),
        ),
        (
            "updated",
            record
                .updated_utc
                .map_or_else(|| "-".into(), |t| t.to_rfc3339()),
        ),
        ("callback delivery", text(&record.callback_delivery_status)),
        (
            "callbacks canceled",
            record.is_callback_sending_canceled.to_string(),
        ),
        ("error", text(&record.error_message)),
    ];
    let mut out = String::new();
    for (label, value) in rows {
        let _ = writeln!(out, "{label:<20}{value}");
    }
    out
}

/// Reads every page of a listing of postponed validations, from the lowest id: `read` reads
/// the page after an id (from the first without one), `each` takes each page in turn.
///
/// # Errors
///
/// As `read` and `each`, and [`AdminError::Remote`] when a page names a next one that does
/// not move on (the listing would never end).
async fn each_validations_page<R, F>(
    mut read: R,
    mut each: impl FnMut(Vec<PostponedValidation>) -> Result<(), AdminError>,
) -> Result<(), AdminError>
where
    R: FnMut(Option<ValidationId>) -> F,
    F: std::future::Future<Output = Result<PostponedPage, AdminError>>,
{
    let mut after = None;
    loop {
        let page = read(after).await?;
        let read_none = page.validations.is_empty();
        each(page.validations)?;
        match page.next {
            None => return Ok(()),
            Some(next) if read_none || after.is_some_and(|after| next <= after) => {
                return Err(AdminError::Remote {
                    status: 200,
                    message: format!(
                        "the next page of validations, after {next}, does not move on"
                    ),
                });
            }
            next => after = next,
        }
    }
}

/// A listing of postponed validations written as its pages are read — the text's lines
/// under one header, or one JSON array — so that the command holds one page at a time, not
/// the retention period's records. Nothing is written before the first page is read (a
/// refused token prints no header); a failure on a later page leaves the pages before it
/// written, and the command fails.
struct ValidationsOut<'a> {
    out: &'a mut dyn Write,
    json: bool,
    opened: bool,
    listed: usize,
}

impl<'a> ValidationsOut<'a> {
    fn new(out: &'a mut dyn Write, json: bool) -> Self {
        Self {
            out,
            json,
            opened: false,
            listed: 0,
        }
    }

    /// The header, or the array's `[`, once.
    fn open(&mut self) -> Result<(), AdminError> {
        if !self.opened {
            let opening = if self.json {
                "[".to_owned()
            } else {
                validations_header()
            };
            self.out.write_all(opening.as_bytes())?;
            self.opened = true;
        }
        Ok(())
    }

    fn page(&mut self, page: &[PostponedValidation]) -> Result<(), AdminError> {
        self.open()?;
        for validation in page {
            if self.json {
                // As `serde_json::to_writer_pretty` writes an array: each element indented
                // by two (a JSON string holds no raw line break, so every one is the
                // layout's).
                let text = serde_json::to_string_pretty(validation)
                    .map_err(|error| AdminError::Output(std::io::Error::other(error)))?;
                let before = if self.listed == 0 { "\n  " } else { ",\n  " };
                write!(self.out, "{before}{}", text.replace('\n', "\n  "))?;
            } else {
                self.out.write_all(validation_line(validation).as_bytes())?;
            }
            self.listed += 1;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), AdminError> {
        self.open()?;
        let end: &[u8] = match (self.json, self.listed) {
            (true, 0) => b"]\n",
            (true, _) => b"\n]\n",
            (false, 0) => b"(none)\n",
            (false, _) => b"",
        };
        self.out.write_all(end)?;
        Ok(())
    }
}

/// The `after` of the `rel="next"` link among `headers`: where the next page starts
/// (`None`: this was the last). A next link without a cursor this client reads is an error,
/// not the end of the listing.
fn next_after<C: std::str::FromStr>(headers: &http::HeaderMap) -> Result<Option<C>, AdminError> {
    let Some(link) = headers
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find(|link| link.contains("rel=\"next\""))
    else {
        return Ok(None);
    };
    let cursor = link
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .and_then(|(target, _)| target.split_once('?'))
        .and_then(|(_, query)| {
            form_urlencoded::parse(query.as_bytes())
                .find(|(key, _)| key == "after")
                .and_then(|(_, token)| token.parse().ok())
        });
    cursor.map(Some).ok_or_else(|| AdminError::Remote {
        status: 200,
        message: format!("the next page's link has no cursor this client reads: {link}"),
    })
}

/// How far below the top of the failing callbacks, as it was when their pages began to be
/// read, [`AdminClient::failing_latest`] reads the top again after the last page: instances
/// sharing PostgreSQL time their failures by their own clocks, which may differ this much.
pub const REREAD_MARGIN: chrono::TimeDelta = chrono::TimeDelta::minutes(1);

/// Failing callbacks as a table, one line per (nonce, status); the nonce and reason are
/// shown escaped, as in logs.
pub fn describe_failing(all: &[FailingCallback]) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:>8} {:<24} {:<24} {:<16} {:>14} {:<36} {}\n",
        "nonce",
        "status",
        "failures",
        "first failed (UTC)",
        "last failed (UTC)",
        "client",
        "amount",
        "reference id",
        "last reason"
    );
    for f in all {
        let _ = writeln!(
            out,
            "{:<24} {:<10} {:>8} {:<24} {:<24} {:<16} {:>14} {:<36} {}",
            crate::logged::Logged(&f.nonce).to_string(),
            crate::model::TransactionStatus::from_code(f.status).to_string(),
            f.failures,
            utc(f.first_failed),
            utc(f.last_failed),
            crate::logged::Logged(&f.client_id).to_string(),
            format!("{} {}", f.amount, crate::logged::Logged(&f.currency)),
            f.transaction_reference_id,
            crate::logged::Logged(&f.last_reason)
        );
    }
    if all.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

/// How many held results a listing shows: `latest`, within what the service lists.
fn held_limit(latest: Option<usize>) -> usize {
    latest.map_or(crate::server::HELD_LIMIT, |n| {
        n.clamp(1, crate::server::HELD_LIMIT)
    })
}

/// Held results as a table; what came from the wire or the merchant is shown escaped, as in
/// logs. Says so when the listing may have stopped at `limit`.
pub fn describe_held(all: &[HeldCallback], limit: usize) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:<24} {:<16} {:>14} {:<36} {}\n",
        "nonce", "status", "held (UTC)", "client", "amount", "reference id", "reason"
    );
    for h in all {
        let _ = writeln!(
            out,
            "{:<24} {:<10} {:<24} {:<16} {:>14} {:<36} {}",
            crate::logged::Logged(&h.nonce).to_string(),
            crate::model::TransactionStatus::from_code(h.status).to_string(),
            utc(h.held_at),
            crate::logged::Logged(&h.client_id).to_string(),
            format!("{} {}", h.amount, crate::logged::Logged(&h.currency)),
            h.transaction_reference_id,
            crate::Escaped(&h.reason)
        );
    }
    if all.is_empty() {
        out.push_str("(none)\n");
    } else if all.len() >= limit {
        let _ = writeln!(
            out,
            "(the latest {limit}; payhook_callbacks_held_unresolved on /metrics counts them all)"
        );
    }
    out
}

/// What `callbacks resolve` says of the result it resolved.
fn resolved_line(held: &HeldCallback) -> String {
    format!(
        "resolved: nonce {} ({}), held {}: {} — kept with your note ({}){}, no longer listed; nothing booked, and the aggregator's retries stay acknowledged",
        crate::logged::Logged(&held.nonce),
        crate::model::TransactionStatus::from_code(held.status),
        utc(held.held_at),
        crate::Escaped(&held.reason),
        crate::Escaped(&held.resolution),
        held.resolved_by
            .as_deref()
            .map_or_else(String::new, |by| format!(
                " and your name ({})",
                crate::Escaped(by)
            ))
    )
}

/// Who resolves a held result: `--by` (`--by ''` for no name), else the person the command
/// runs for — the one who ran `sudo` (`$SUDO_USER`: `sudo -u payhook` sets `$USER` to the
/// service's account), else the user it runs as.
fn resolver_named(by: Option<String>) -> Option<String> {
    by.or_else(|| std::env::var("SUDO_USER").ok())
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("USERNAME").ok())
}

/// [`resolver_named`] for what a command does on the store itself, where no token vouches
/// for the name: one that passes for an operator of `[admin.operators]` (`alice`, ` Alice`)
/// is kept marked as the command line's — `alice (command line, on the store)` — not as the
/// operator's own (which the operating API keeps only from their token, and refuses from
/// the shared one).
fn named_on_the_store(by: Option<String>, config: &Config) -> Option<String> {
    const MARK: &str = " (command line, on the store)";
    let name = resolver_named(by)?;
    let operators = crate::server::Operators::new(&config.admin.operators, &config.admin.viewers);
    Some(match operators.passed_for(&name) {
        // Cut first, so that the store's bound on a name (which cuts its end) keeps the mark.
        Some(operator) => {
            let room = crate::store::held::NAME_BYTES - MARK.len() - '…'.len_utf8();
            format!("{}{MARK}", crate::logged::cut_bytes(operator, room))
        }
        None => name,
    })
}

/// `callbacks resolve` of a pair that is not held.
fn nothing_held(nonce: &str, status: i32) -> AdminError {
    AdminError::NotHeld {
        nonce: crate::logged::Logged(nonce).to_string(),
        status,
    }
}

/// A time as RFC 3339 in UTC, to the millisecond: `2026-11-23T10:15:00.123Z`.
fn utc(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Postponed validations as a table. What came from the wire (nonce, client id, currency)
/// and from the aggregator (its errors) is shown escaped and cut, as in logs: a control
/// character must not redraw what the operator's terminal shows before a decision.
pub fn describe_validations(all: &[PostponedValidation]) -> String {
    let mut out = validations_header();
    for v in all {
        out.push_str(&validation_line(v));
    }
    if all.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

/// The first line of [`describe_validations`]: the columns' names.
fn validations_header() -> String {
    format!(
        "{:<20} {:<9} {:<24} {:<16} {:>14} {:<8} {}\n",
        "validation id", "state", "nonce", "client", "amount", "decision", "delivery"
    )
}

/// Who took a decision, as a validation's line ends: `; decided by NAME` (escaped and cut,
/// as in logs), or nothing when nobody was named.
fn decided_by(result: &crate::postponed::ValidationResult) -> String {
    result.decided_by.as_deref().map_or_else(String::new, |by| {
        format!("; decided by {}", crate::logged::Logged(by))
    })
}

/// A validation's line of [`describe_validations`].
fn validation_line(v: &PostponedValidation) -> String {
    let payment = &v.request.payment_data;
    let (decision, delivery) = match &v.result {
        // A repeat under a new id is decided with the validation it repeats.
        None => (
            v.repeat_of
                .map_or_else(|| "-".to_owned(), |of| format!("as {of}")),
            "-".to_owned(),
        ),
        Some(result) => (
            if result.success { "allow" } else { "deny" }.to_owned(),
            match &result.delivery {
                Delivery::Queued {
                    attempts,
                    last_error,
                    ..
                } => format!(
                    "queued, {attempts} attempt(s){}",
                    last_error
                        .as_ref()
                        .map(|e| format!(", last: {}", crate::logged::Logged(e)))
                        .unwrap_or_default()
                ),
                Delivery::Delivered { attempts, .. } => {
                    format!("delivered after {attempts} attempt(s)")
                }
                Delivery::Conflict { message, .. } => {
                    format!("CONFLICT: {}", crate::logged::Logged(message))
                }
            } + &decided_by(result),
        ),
    };
    format!(
        "{:<20} {:<9} {:<24} {:<16} {:>14} {:<8} {}\n",
        v.validation_id,
        v.state().as_str(),
        crate::logged::Logged(payment.nonce.as_str()).to_string(),
        crate::logged::Logged(&v.request.merchant_data.client_id).to_string(),
        format!(
            "{} {}",
            payment.amount,
            crate::logged::Logged(&payment.currency)
        ),
        decision,
        delivery
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decision taken on the store itself, under a name that passes for an operator's, is
    /// kept as the command line's: no token of theirs vouched for it (the operating API
    /// refuses that name from the shared token). Other names are kept as given.
    #[test]
    fn an_operators_name_on_the_store_is_kept_as_the_command_lines() {
        let mut config = Config::default();
        let alices = crate::server::OperatorToken::digest_of("alices-token");
        config.admin.operators.insert("alice".into(), alices);
        for given in ["alice", " Alice", "alice\u{200B}"] {
            assert_eq!(
                named_on_the_store(Some(given.into()), &config).as_deref(),
                Some("alice (command line, on the store)"),
                "{given:?}"
            );
        }
        assert_eq!(
            named_on_the_store(Some("Dana (ops)".into()), &config).as_deref(),
            Some("Dana (ops)")
        );
        // The longest name an operator may have keeps the mark as the store keeps it.
        let long = "a".repeat(128);
        config.admin.operators.insert(
            long.clone(),
            crate::server::OperatorToken::digest_of("longs-token"),
        );
        let named = named_on_the_store(Some(long), &config);
        let kept = crate::store::held::person(named.as_deref()).unwrap();
        assert!(kept.ends_with("… (command line, on the store)"), "{kept}");
        assert_eq!(named.as_deref(), Some(kept.as_str()), "not cut again");
    }

    /// `payhook tail` waits out what passes — no answer, too many wrong tokens from this
    /// address, a proxy's 502 to 504 — and ends on what does not.
    #[test]
    fn tail_waits_out_what_passes_and_ends_on_a_refusal() {
        let answered = |status| AdminError::Remote {
            status,
            message: String::new(),
        };
        for status in [0, 429, 502, 503, 504] {
            assert!(passing(&answered(status)), "{status}");
        }
        for status in [400, 401, 403, 404, 409, 500] {
            assert!(!passing(&answered(status)), "{status}");
        }
    }

    #[tokio::test]
    async fn a_listing_whose_first_page_failed_writes_nothing() {
        for json in [true, false] {
            let mut out = Vec::new();
            let mut listing = ValidationsOut::new(&mut out, json);
            let walked = each_validations_page(
                |_| {
                    std::future::ready(Err(AdminError::Remote {
                        status: 401,
                        message: "refused".into(),
                    }))
                },
                |page| listing.page(&page),
            )
            .await;
            assert!(walked.is_err());
            assert!(out.is_empty(), "json: {json}: {out:?}");
        }
    }

    #[test]
    fn a_listing_written_a_page_at_a_time_reads_as_one_written_whole() {
        let all: Vec<_> = (1..=3)
            .map(PostponedValidation::pending_for_tests)
            .collect();
        for listed in [&all[..0], &all[..1], &all[..]] {
            for json in [true, false] {
                let mut paged = Vec::new();
                let mut listing = ValidationsOut::new(&mut paged, json);
                for page in listed.chunks(2) {
                    listing.page(page).unwrap();
                }
                listing.finish().unwrap();
                let mut whole = Vec::new();
                print(&mut whole, json, listed, describe_validations).unwrap();
                assert_eq!(
                    String::from_utf8(paged).unwrap(),
                    String::from_utf8(whole).unwrap(),
                    "{} of {}, json: {json}",
                    listed.len(),
                    all.len()
                );
            }
        }
    }

    #[tokio::test]
    async fn pages_that_do_not_move_on_end_the_listing_with_an_error() {
        let page = |ids: &[i64], next: Option<i64>| PostponedPage {
            validations: ids
                .iter()
                .map(|id| PostponedValidation::pending_for_tests(*id))
                .collect(),
            next: next.map(Into::into),
        };
        let walk = |pages: Vec<PostponedPage>| async move {
            let pages = std::sync::Mutex::new(pages.into_iter());
            let mut seen = Vec::new();
            let walked = each_validations_page(
                |_| std::future::ready(Ok(pages.lock().unwrap().next().unwrap())),
                |page| {
                    seen.extend(page.iter().map(|v| v.validation_id.get()));
                    Ok(())
                },
            )
            .await;
            (walked, seen)
        };
        let (walked, seen) = walk(vec![page(&[1, 2], Some(2)), page(&[3], None)]).await;
        assert!(walked.is_ok());
        assert_eq!(seen, [1, 2, 3]);
        for stuck in [
            vec![page(&[1, 2], Some(2)), page(&[1, 2], Some(2))],
            vec![page(&[1, 2], Some(2)), page(&[], Some(3))],
        ] {
            let (walked, _) = walk(stuck).await;
            let Err(AdminError::Remote { message, .. }) = walked else {
                panic!("walked on: {walked:?}");
            };
            assert!(message.contains("does not move on"), "{message}");
        }
    }

    #[test]
    fn a_pending_repeat_is_listed_as_decided_with_the_validation_it_repeats() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let mut original = PostponedValidation::pending_for_tests(7);
        let mut request = original.request.clone();
        request.validation_id = 8.into();
        let repeat = original
            .repeated_by(request, now)
            .expect("room for a repeat");
        let table = describe_validations(&[original, repeat]);
        let rows: Vec<&str> = table.lines().skip(1).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].starts_with("7 "), "{table}");
        assert!(!rows[0].contains(" as "), "{table}");
        assert!(rows[1].starts_with("8 "), "{table}");
        assert!(rows[1].contains(" as 7 "), "{table}");
    }

    /// What came from the wire is shown escaped: a control character in a nonce, client id
    /// or currency can neither add a row nor redraw the amount an operator decides on.
    #[test]
    fn wire_text_cannot_redraw_the_validations_an_operator_decides_on() {
        let mut forged = PostponedValidation::pending_for_tests(7);
        forged.request.payment_data.nonce = "n-1\r\n4242  pending  n-2".into();
        forged.request.merchant_data.client_id = "c\u{1b}[2J".into();
        forged.request.payment_data.currency = "\u{1b}[6D    5 EUR".into();
        let table = describe_validations(&[forged]);
        assert_eq!(table.lines().count(), 2, "{table}");
        assert!(!table.contains(['\u{1b}', '\r']), "{table}");
        let failing = FailingCallback {
            nonce: "n-1".into(),
            status: 4,
            failures: 1,
            first_failed: DateTime::<Utc>::UNIX_EPOCH,
            last_failed: DateTime::<Utc>::UNIX_EPOCH,
            last_reason: "handler failed".into(),
            transaction_reference_id: "r-1".into(),
            client_id: "c".into(),
            amount: "50000".into(),
            currency: "\u{1b}[6D    5 EUR".into(),
        };
        let table = describe_failing(&[failing]);
        assert!(!table.contains('\u{1b}'), "{table}");
    }
}
