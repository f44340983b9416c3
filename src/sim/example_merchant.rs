//! The example merchant: a small but complete merchant behind payhook's three endpoints. It
//! is what `payhook demo` and the shipped scenarios run against, and what
//! `examples/merchant.rs` serves; read it as a model of the three traits.
//!
//! * providers validation: offers the providers that support the request's currency, payment
//!   type and direction, and, when the request asks for provider tags, carry one of them —
//!   the candidate's own, or else the merchant's for that provider ([`ProviderTags`]: the
//!   spec's candidates carry none);
//! * transaction validation: denies amounts above [`Merchant::max_amount`], with a message; in
//!   Awaitable mode, postpones amounts above [`Merchant::review_above`], and [`review`]
//!   decides them with payhook's `Resolver` — the results go to the aggregator through the
//!   outbox. It does not look at the client's balance: a withdrawal larger than what the
//!   ledger holds for the client is allowed, and its success books the balance negative. A
//!   merchant whose clients withdraw from a balance it keeps decides on that balance here
//!   (and holds it while the withdrawal is pending), which is its own rule, not payhook's;
//! * callbacks: books each transaction result in a ledger (one [`Entry`] per nonce, a balance
//!   per client and currency, its code in any case: `eur` is `EUR`) kept in payhook's sled
//!   store, written in the same atomic write as the mark that the callback is done — so a
//!   result is booked exactly once, however often the aggregator retries and whenever the
//!   process crashes.
//!
//! **A later result of a booked transaction** (a newer `updatedUtc`) replaces its booking and
//! corrects the balance — a failure then a success, or a success then `-2` (money has to be
//! returned) — unless moving the money back is not the example's to decide (below).
//!
//! **What it cannot book, it quarantines.** Balances use checked arithmetic. These results
//! are acknowledged into the [`QUARANTINE`] tree (`nonce|status` → the result and the
//! reason) and leave the entry and the balance untouched; the effect says so
//! ([`Booking::Held`]), and payhook reports the callback held, not booked (logged at error
//! level with the reason, counted in `payhook_callbacks_held_total`, "held" on the
//! inspector and in a reconcile):
//!
//! * a status that is no final result (the aggregator sends only 4 and -1 to -6): payhook
//!   hands a handler every status it receives;
//! * a success that is not the payment validated — another amount, currency, client or
//!   direction than payhook recorded when it answered the nonce's transaction validation
//!   (the provider may differ) — or a success of a payment the merchant denied there, or
//!   whose postponed validation it has not decided yet
//!   ([`CallbackContext::hold_against_validation`]). A success whose validation is not
//!   recorded (answered elsewhere, or longer ago than `store.retention`) is booked as it
//!   comes;
//! * a result older (`updatedUtc`) than the one booked for its nonce: a retry of a failure
//!   that was delivered late, after the success that followed it, must not undo the success;
//!   nor does a failure after a booked success, or a success after a booked failure, when
//!   which is newer is not known (either `updatedUtc` missing, or the same): a late retry of
//!   the result booked before would look the same, and moving the money would undo the
//!   result that stands;
//! * a failure other than `-2` after a booked successful withdrawal: the aggregator said the
//!   money was paid out, so giving it back to the client's balance is for a person to decide
//!   (a deposit's credit is taken back: the merchant's safe side);
//! * a booking that would overflow a balance (a `Decimal` holds about 7.9 × 10²⁸), or whose
//!   sum would need more decimal places than a `Decimal` keeps (it would be rounded);
//! * a success of a transaction type that is neither a deposit nor a withdrawal (which way
//!   the money went is not known);
//! * a result whose client id or currency holds `|`, which joins them in a balance's key
//!   (two clients' balances could otherwise share one).
//!
//! Refusing it instead (503, or 400) would not make
//! it bookable: the aggregator would retry the same callback up to 17 times, each failing
//! alike, then give up — the result lost with no record of it. In quarantine it is kept
//! durably and exactly once, for a person to resolve, and every other callback of that
//! client keeps booking. (payhook itself refuses amounts that are no payment before this
//! code runs: a negative callback amount, and a validation amount that is not above zero,
//! are answered 400.)
//!
//! ```no_run
//! use payhook::sim::example_merchant::{Merchant, app, open_store};
//! use rust_decimal::Decimal;
//!
//! # async fn run(config: payhook::Config) -> Result<(), Box<dyn std::error::Error>> {
//! let store = open_store(&config).await?;
//! let merchant = Merchant {
//!     max_amount: Decimal::from(10_000),
//!     review_above: None,
//!     provider_tags: "11=fiat,eu;12=crypto".parse()?,
//! };
//! let listener = payhook::bind(config.server.listen).await?;
//! payhook::serve(listener, app(config, merchant, store)?, payhook::shutdown_signal()).await?;
//! # Ok(()) }
//! ```

use crate::handler::{
    CallbackContext, CallbackDecision, CallbackReceiver, ProviderFilter, ProvidersDecision,
    ProvidersValidator, RequestContext, TransactionValidator, ValidationDecision,
};
/// Where the example merchant's provider tags were before they moved to [`crate::handler`].
pub use crate::handler::{ProviderTags, ProviderTagsError};
use crate::model::{
    CallbackBody, ProvidersValidationRequest, TransactionStatus, TransactionType,
    TransactionValidationRequest,
};
use crate::store::{Booking, ConfiguredStore, EffectTx, StoreError, Tree};
use crate::{App, Config, Escaped, HandlerError, Logged};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// The ledger's entries in the store: nonce → [`Entry`].
pub const ENTRIES: &str = "ledger_entries";
/// The ledger's balances in the store: `client|currency` → amount.
pub const BALANCES: &str = "ledger_balances";
/// Results acknowledged but not booked, for a person to resolve: `nonce|status` →
/// [`Quarantined`] (each (nonce, status) is handed to the handler once: none replaces
/// another).
pub const QUARANTINE: &str = "ledger_quarantine";

/// The ledger: its trees, as handles of the store that declared them ([`open_store`]),
/// taken once when the app is built (a tree that does not exist fails then, not on every
/// callback), and reads of what it booked.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: ConfiguredStore,
    /// [`ENTRIES`]: nonce → [`Entry`].
    pub entries: Tree,
    /// [`BALANCES`]: `client|currency` → amount.
    pub balances: Tree,
    /// [`QUARANTINE`]: `nonce|status` → [`Quarantined`].
    pub quarantine: Tree,
}

impl Ledger {
    /// The ledger's trees in `store`.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownTree`] when the store was not opened with them ([`open_store`]).
    pub fn of(store: &ConfiguredStore) -> Result<Self, StoreError> {
        Ok(Self {
            entries: store.tree(ENTRIES)?,
            balances: store.tree(BALANCES)?,
            quarantine: store.tree(QUARANTINE)?,
            store: store.clone(),
        })
    }

    /// The entry booked for `nonce`, if any.
    ///
    /// # Errors
    ///
    /// When the store fails or the entry is not an [`Entry`].
    pub async fn entry(&self, nonce: &str) -> Result<Option<Entry>, StoreError> {
        self.read(&self.entries, nonce.as_bytes()).await
    }

    /// The balance of `client_id` in `currency` (zero when nothing was booked).
    ///
    /// # Errors
    ///
    /// When the store fails or the balance is not an amount.
    pub async fn balance(&self, client_id: &str, currency: &str) -> Result<Decimal, StoreError> {
        let key = balance_key(client_id, currency);
        Ok(self.read(&self.balances, &key).await?.unwrap_or_default())
    }

    /// The result of `nonce` under `status` that was quarantined, if any.
    ///
    /// # Errors
    ///
    /// When the store fails or the record is not a [`Quarantined`].
    pub async fn quarantined(
        &self,
        nonce: &str,
        status: i32,
    ) -> Result<Option<Quarantined>, StoreError> {
        self.read(&self.quarantine, &quarantine_key(nonce, status))
            .await
    }

    /// Every result in quarantine, in key order (nonce, then status): what a person has to
    /// resolve (`cargo run --example merchant -- quarantine` prints it).
    ///
    /// # Errors
    ///
    /// When the store fails or a record is not a [`Quarantined`].
    pub async fn quarantined_all(&self) -> Result<Vec<(String, Quarantined)>, StoreError> {
        self.store
            .entries(&self.quarantine)
            .await?
            .into_iter()
            .map(|(key, value)| {
                // `nonce|status` (`quarantine_key`): a nonce may hold `|`, a status not.
                let nonce = String::from_utf8_lossy(&key)
                    .rsplit_once('|')
                    .map(|(nonce, _status)| nonce.to_owned())
                    .ok_or_else(|| corrupt(&self.quarantine, &key, "no `nonce|status` key"))?;
                Ok((nonce, decode(&self.quarantine, &key, &value)?))
            })
            .collect()
    }

    /// Every booked entry, by nonce, and every balance, by `client|currency`.
    ///
    /// # Errors
    ///
    /// When the store fails or a record is not what the ledger wrote.
    pub async fn books(&self) -> Result<Books, StoreError> {
        let mut books = Books::default();
        for (key, value) in self.store.entries(&self.entries).await? {
            books.entries.push((
                String::from_utf8_lossy(&key).into_owned(),
                decode(&self.entries, &key, &value)?,
            ));
        }
        for (key, value) in self.store.entries(&self.balances).await? {
            books.balances.push((
                String::from_utf8_lossy(&key).into_owned(),
                decode(&self.balances, &key, &value)?,
            ));
        }
        Ok(books)
    }

    async fn read<T: for<'de> Deserialize<'de>>(
        &self,
        tree: &Tree,
        key: &[u8],
    ) -> Result<Option<T>, StoreError> {
        let Some(bytes) = self.store.get(tree, key).await? else {
            return Ok(None);
        };
        decode(tree, key, &bytes).map(Some)
    }
}

/// Everything the ledger holds: entries by nonce and balances by `client|currency`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Books {
    /// `(nonce, entry)`, in key order.
    pub entries: Vec<(String, Entry)>,
    /// `(client|currency, balance)`, in key order.
    pub balances: Vec<(String, Decimal)>,
}

impl Books {
    /// Whether every balance is the sum of its entries' effects (and no entry is without
    /// its balance): what a ledger that booked each result once holds.
    pub fn balanced(&self) -> bool {
        let mut sums: std::collections::BTreeMap<String, Decimal> = Default::default();
        for (_, entry) in &self.entries {
            let key = balance_key(&entry.client_id, &entry.currency);
            *sums
                .entry(String::from_utf8_lossy(&key).into_owned())
                .or_default() += entry.balance_effect;
        }
        let balances: std::collections::BTreeMap<String, Decimal> =
            self.balances.iter().cloned().collect();
        sums.iter()
            .all(|(key, sum)| balances.get(key).copied().unwrap_or_default() == *sum)
            && balances
                .iter()
                .all(|(key, balance)| sums.get(key).copied().unwrap_or_default() == *balance)
    }
}

fn decode<T: for<'de> Deserialize<'de>>(
    tree: &Tree,
    key: &[u8],
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|error| corrupt(tree, key, error.to_string()))
}

/// The record of `key` in `tree` is not what the ledger wrote, for `reason`.
fn corrupt(tree: &Tree, key: &[u8], reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: format!("{}/{}", tree.name(), String::from_utf8_lossy(key)),
        reason: reason.into(),
    }
}

/// A result the ledger could not hold, kept instead of booked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quarantined {
    /// Whose money.
    pub client_id: String,
    /// ISO currency.
    pub currency: String,
    /// The result's amount.
    pub amount: Decimal,
    /// Its status code.
    pub status: i32,
    /// Why it was not booked.
    pub reason: String,
    /// The aggregator's id of the transaction (what `payhook transaction` looks it up by);
    /// `None` in a record an earlier version wrote.
    #[serde(default)]
    pub transaction_reference_id: Option<uuid::Uuid>,
    /// When the result changed on the payment system (`updatedUtc`), when it said.
    #[serde(default)]
    pub updated_utc: Option<chrono::DateTime<chrono::Utc>>,
}

impl std::fmt::Display for Quarantined {
    /// One line for a person: what the result was and why it was not booked (values from
    /// the wire whole, their control characters escaped).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {} of {} {} for client {}",
            self.status,
            self.amount,
            Escaped(&self.currency),
            Escaped(&self.client_id)
        )?;
        if let Some(reference) = self.transaction_reference_id {
            write!(f, ", transaction {reference}")?;
        }
        if let Some(updated) = self.updated_utc {
            write!(f, ", changed {}", updated.to_rfc3339())?;
        }
        write!(f, ": {}", Escaped(&self.reason))
    }
}

/// One booked transaction, keyed by its nonce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Whose money.
    pub client_id: String,
    /// ISO currency.
    pub currency: String,
    /// The transaction's amount.
    pub amount: Decimal,
    /// The booked status code.
    pub status: i32,
    /// What this entry adds to the client's balance: the amount (negative for a withdrawal)
    /// when successful, zero otherwise.
    pub balance_effect: Decimal,
    /// How many results of this nonce were booked: 1, unless its status changed later.
    pub bookings: u32,
    /// When the booked result last changed on the payment system (`updatedUtc`), when it
    /// said (a result without one keeps the time of the result it replaced): an older
    /// result does not replace it.
    #[serde(default)]
    pub updated_utc: Option<chrono::DateTime<chrono::Utc>>,
}

/// The quarantine's key of `nonce`'s result under `status`.
pub fn quarantine_key(nonce: &str, status: i32) -> Vec<u8> {
    format!("{nonce}|{status}").into_bytes()
}

/// The balance key of a client in a currency: the currency's code in upper case, as
/// payhook compares a validation's (`eur` is `EUR`: one balance, not two).
pub fn balance_key(client_id: &str, currency: &str) -> Vec<u8> {
    format!("{client_id}|{}", currency.trim().to_ascii_uppercase()).into_bytes()
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

fn from_json<T: for<'de> Deserialize<'de>>(bytes: Vec<u8>) -> Result<T, StoreError> {
    serde_json::from_slice(&bytes).map_err(|e| StoreError::abort(e.to_string()))
}

/// Books `callback` in the ledger, inside the store's transaction. A new status for a known
/// nonce (a success, later a reversal) replaces the entry and corrects the balance its
/// previous booking changed; what the example must not book is quarantined (module docs).
fn book(
    tx: &dyn EffectTx,
    ledger: &Ledger,
    callback: &CallbackBody,
    unlike_its_validation: Option<&str>,
) -> Result<Booking, StoreError> {
    let status = callback.transaction_status;
    if !status.is_final() {
        let reason = format!(
            "status {} ({}) is no final result: the aggregator sends only 4 and -1 to -6",
            status.code(),
            status.description()
        );
        return quarantine(tx, ledger, callback, reason);
    }
    if let Some(reason) = unlike_its_validation {
        return quarantine(tx, ledger, callback, reason.to_owned());
    }
    // The balance key joins them with `|`: one in either would let two clients' balances
    // share a key (`a|EUR` in USD and `a` in `EUR|USD`).
    if callback.client_id.contains('|') || callback.currency.contains('|') {
        let reason = "a client id or currency with `|`, which the ledger's balance keys \
                      cannot tell apart"
            .to_owned();
        return quarantine(tx, ledger, callback, reason);
    }
    let previous: Option<Entry> = tx
        .get(&ledger.entries, callback.nonce.as_bytes())?
        .map(from_json)
        .transpose()?;
    // Only `updatedUtc` orders the results of one transaction: `createdUtc` is the same
    // for all of them. An unset date (before 2000) is no time.
    let changed = callback.updated();
    if let Some(reason) = previous
        .as_ref()
        .and_then(|previous| not_replacing(previous, status, changed))
    {
        return quarantine(tx, ledger, callback, reason);
    }
    let balance_effect = if status.is_success() {
        match callback.transaction_type {
            TransactionType::Deposit => callback.amount,
            TransactionType::Withdrawal => -callback.amount,
            // Neither cash-in nor cash-out: which way the money went is not known.
            TransactionType::Unknown(code) => {
                let reason =
                    format!("transaction type {code} is neither a deposit nor a withdrawal");
                return quarantine(tx, ledger, callback, reason);
            }
        }
    } else {
        Decimal::ZERO
    };
    // What changes on each balance: this booking's effect, less the previous booking's on
    // the balance it changed (the same one, unless a later status names another client or
    // currency).
    let key = balance_key(&callback.client_id, &callback.currency);
    let mut changes = vec![(key, balance_effect)];
    if let Some(previous) = previous.as_ref().filter(|p| !p.balance_effect.is_zero()) {
        let undone = balance_key(&previous.client_id, &previous.currency);
        match changes.iter_mut().find(|(key, _)| *key == undone) {
            Some((_, change)) => *change -= previous.balance_effect,
            None => changes.push((undone, -previous.balance_effect)),
        }
    }
    let mut balances = Vec::with_capacity(changes.len());
    for (key, change) in changes {
        let balance: Decimal = tx
            .get(&ledger.balances, &key)?
            .map(from_json)
            .transpose()?
            .unwrap_or_default();
        let Some(new_balance) = exact_sum(balance, change) else {
            let reason = format!(
                "the balance of {} ({balance}) cannot take {change} more exactly",
                String::from_utf8_lossy(&key).replace('|', " ")
            );
            return quarantine(tx, ledger, callback, reason);
        };
        balances.push((key, new_balance));
    }
    let entry = Entry {
        client_id: callback.client_id.clone(),
        currency: callback.currency.clone(),
        amount: callback.amount,
        status: status.code(),
        balance_effect,
        // A result without a time (it replaces only one of its kind) keeps the time booked
        // before: a later result is still known to be newer than it.
        updated_utc: changed.or(previous.as_ref().and_then(|p| p.updated_utc)),
        bookings: previous.map_or(0, |p| p.bookings).saturating_add(1),
    };
    for (key, new_balance) in balances {
        tx.insert(&ledger.balances, &key, &json(&new_balance))?;
    }
    tx.insert(&ledger.entries, callback.nonce.as_bytes(), &json(&entry))?;
    Ok(Booking::Booked)
}

/// Why a result with `status`, changed at `changed` (`updatedUtc`), must not replace the
/// booked `previous` (`None`: it replaces it).
fn not_replacing(
    previous: &Entry,
    status: TransactionStatus,
    changed: Option<chrono::DateTime<chrono::Utc>>,
) -> Option<String> {
    let newer = match (changed, previous.updated_utc) {
        (Some(changed), Some(booked)) if changed < booked => {
            return Some(format!(
                "older ({changed}) than the status {} booked for this transaction ({booked})",
                previous.status
            ));
        }
        (Some(changed), Some(booked)) => changed > booked,
        _ => false,
    };
    let booked_success = previous.status == TransactionStatus::Success.code();
    // Which came last is not known (a time missing, or the same): a late retry of the
    // result booked before would look the same — of the failure that preceded a success, or
    // of the success that preceded a failure (money returned) — and moving the money would
    // undo the result that stands.
    if booked_success && status.is_failure() && !newer {
        return Some(format!(
            "a failure ({}) after a booked success, not known to be newer (its updatedUtc is \
             missing or the same): which result stands is for a person to decide",
            status.description()
        ));
    }
    if !booked_success && status == TransactionStatus::Success && !newer {
        return Some(format!(
            "a success after a booked failure ({}), not known to be newer (its updatedUtc is \
             missing or the same): which result stands is for a person to decide",
            previous.status
        ));
    }
    let paid_out = booked_success && previous.balance_effect < Decimal::ZERO;
    (paid_out && status.is_failure() && status != TransactionStatus::PaymentSystemError).then(
        || {
            format!(
                "a failure ({}) after the withdrawal was booked as paid out: giving the money \
                 back is for a person to decide (only -2 says it has to be returned)",
                status.description()
            )
        },
    )
}

/// `balance + change`, unless it overflows or would be rounded (a `Decimal` keeps 28 digits:
/// a sum that needs more loses decimal places instead of failing). A sum with a zero is the
/// other operand as it is (rust_decimal returns it with its own scale: exact).
fn exact_sum(balance: Decimal, change: Decimal) -> Option<Decimal> {
    let sum = balance.checked_add(change)?;
    let exact =
        balance.is_zero() || change.is_zero() || sum.scale() >= balance.scale().max(change.scale());
    exact.then_some(sum)
}

/// Acknowledges `callback` into quarantine, unbooked, for `reason`: see the module's docs.
/// payhook reports it held, with `reason`, once it is durable.
fn quarantine(
    tx: &dyn EffectTx,
    ledger: &Ledger,
    callback: &CallbackBody,
    reason: String,
) -> Result<Booking, StoreError> {
    let quarantined = Quarantined {
        client_id: callback.client_id.clone(),
        currency: callback.currency.clone(),
        amount: callback.amount,
        status: callback.transaction_status.code(),
        reason,
        transaction_reference_id: Some(callback.transaction_reference_id),
        updated_utc: callback.updated(),
    };
    tx.insert(
        &ledger.quarantine,
        &quarantine_key(&callback.nonce, quarantined.status),
        &json(&quarantined),
    )?;
    Ok(Booking::Held {
        reason: quarantined.reason,
    })
}

/// The merchant's own business rules. Cloned into each endpoint; clones share nothing mutable.
#[derive(Debug, Clone)]
pub struct Merchant {
    /// Largest amount a client may deposit or withdraw in one transaction, whatever its
    /// currency (a merchant with several currencies keeps a limit per currency).
    pub max_amount: Decimal,
    /// In Awaitable mode, amounts above this wait for the review; `None`: never.
    pub review_above: Option<Decimal>,
    /// The tags of each provider as this merchant files them, matched against a request's
    /// `providerTags`. Without them, a request that asks for tags is offered only the
    /// candidates that carry tags of their own, which the spec's do not.
    pub provider_tags: ProviderTags,
}

/// The review of postponed validations: approves every client except `blocked*` ones.
/// Runs every `every` until the process ends, reading what waits a page at a time (a backlog
/// of thousands is never held at once).
pub async fn review(resolver: crate::postponed::Resolver, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        let mut after = None;
        loop {
            let page = match resolver
                .page(Some(crate::postponed::PostponedState::Pending), after, 500)
                .await
            {
                Ok(page) => page,
                Err(error) => {
                    tracing::error!(error = %crate::report::InLine(&error), "review: cannot list pending validations");
                    break;
                }
            };
            for validation in page.validations {
                review_one(&resolver, &validation).await;
            }
            match page.next {
                // Pages follow ids: one decided meanwhile moves no other to another page.
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
}

/// Decides one postponed validation, as [`review`] does.
async fn review_one(
    resolver: &crate::postponed::Resolver,
    validation: &crate::postponed::PostponedValidation,
) {
    let client = &validation.request.merchant_data.client_id;
    let approve = !client.starts_with("blocked");
    let description = if approve {
        format!("reviewed: {client} approved")
    } else {
        format!("reviewed: {client} is blocked")
    };
    match resolver
        .resolve(
            validation.validation_id,
            crate::postponed::Decision::allow_if(approve, description),
        )
        .await
    {
        Ok(_) => tracing::info!(
            validation_id = validation.validation_id.get(),
            approve,
            "reviewed"
        ),
        Err(error) => {
            tracing::warn!(error = %crate::report::InLine(&error), "review: not recorded")
        }
    }
}

impl ProvidersValidator for Merchant {
    async fn validate_providers(
        &self,
        request: ProvidersValidationRequest,
        ctx: RequestContext,
    ) -> Result<ProvidersDecision, HandlerError> {
        let providers = ProviderFilter::from_request(&request)
            .apply_with_tags(&request.providers, |candidate| {
                self.provider_tags.of(candidate)
            });
        tracing::info!(
            request_id = %ctx.request_id,
            client = %Logged(&request.transaction_data.merchant_data.client_id),
            offered = request.providers.len(),
            allowed = providers.len(),
            "providers validated"
        );
        let message = format!(
            "{} of {} providers available",
            providers.len(),
            request.providers.len()
        );
        Ok(ProvidersDecision { providers, message })
    }
}

impl TransactionValidator for Merchant {
    async fn validate_transaction(
        &self,
        request: TransactionValidationRequest,
        _ctx: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        let payment = &request.payment_data;
        if payment.amount > self.max_amount {
            tracing::info!(nonce = %Logged(&payment.nonce), amount = %payment.amount, "denied: above the limit");
            return Ok(ValidationDecision::deny(format!(
                "amount {} {} is above the limit of {} per transaction",
                payment.amount, payment.currency, self.max_amount
            )));
        }
        if self
            .review_above
            .is_some_and(|limit| payment.amount > limit)
        {
            tracing::info!(nonce = %Logged(&payment.nonce), amount = %payment.amount, "postponed for review");
            return Ok(ValidationDecision::Postpone);
        }
        tracing::info!(nonce = %Logged(&payment.nonce), amount = %payment.amount, "allowed");
        Ok(ValidationDecision::Allow)
    }
}

/// The merchant's bookkeeping: books each transaction result in the [`Ledger`].
#[derive(Debug, Clone)]
pub struct Bookkeeper {
    ledger: Ledger,
}

impl Bookkeeper {
    /// Books into `ledger`.
    pub fn new(ledger: Ledger) -> Self {
        Self { ledger }
    }
}

impl CallbackReceiver for Bookkeeper {
    async fn receive_callback(
        &self,
        callback: CallbackBody,
        ctx: CallbackContext,
    ) -> Result<CallbackDecision, HandlerError> {
        tracing::info!(
            nonce = %Logged(&callback.nonce),
            reference = %callback.transaction_reference_id,
            client = %Logged(&callback.client_id),
            kind = %callback.transaction_type,
            status = %callback.transaction_status,
            amount = %callback.amount,
            currency = %Logged(&callback.currency),
            attempt = ctx.attempt,
            previous_status = ?ctx.previous_status.map(|s| s.code()),
            "transaction result"
        );
        // A success that is not the payment validated, or that was denied (or not decided
        // yet) there, is held.
        let unlike = ctx.hold_against_validation(&callback).await?;
        // Booked (or held in quarantine) in the same atomic write that marks this (nonce,
        // status) as done.
        let ledger = self.ledger.clone();
        ctx.effects
            .book(move |tx| book(tx, &ledger, &callback, unlike.as_deref()));
        Ok(CallbackDecision::Ack)
    }
}

/// Opens the configured store (sled, or PostgreSQL when `store.url` is set) with the
/// ledger's trees.
///
/// # Errors
///
/// When the data directory cannot be opened (e.g. another process holds it) or the
/// database cannot be reached.
pub async fn open_store(config: &Config) -> Result<ConfiguredStore, crate::store::StoreError> {
    ConfiguredStore::open(&config.store, &[ENTRIES, BALANCES, QUARANTINE]).await
}

/// Opens the configured store as [`open_store`] does, only where the service has written
/// one: for an operating command ([`ConfiguredStore::open_existing`]).
///
/// # Errors
///
/// As [`ConfiguredStore::open_existing`].
pub async fn open_existing_store(
    config: &Config,
) -> Result<ConfiguredStore, crate::store::StoreError> {
    ConfiguredStore::open_existing(&config.store, &[ENTRIES, BALANCES, QUARANTINE]).await
}

/// The merchant's app: its rules behind payhook's three endpoints, its ledger in `store`.
///
/// # Errors
///
/// When the configuration is invalid, or `store` was not opened with the ledger's trees
/// ([`open_store`]).
pub fn app(
    config: Config,
    merchant: Merchant,
    store: ConfiguredStore,
) -> Result<App, crate::server::BuildError> {
    let bookkeeper = Bookkeeper::new(Ledger::of(&store)?);
    App::builder(config)
        .shared_store(store.shared())
        .providers_validator(merchant.clone())
        .transaction_validator(merchant)
        .callback_receiver(bookkeeper)
        .build()
}
