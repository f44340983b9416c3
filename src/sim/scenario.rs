//! Scripted end-to-end flows: a TOML scenario drives a merchant's endpoints as the aggregator
//! would — providers validation, transaction validation (immediate, or Awaitable with the
//! posted result awaited at the mock gateway), callback delivery with the retry schedule,
//! transaction lookup, reconcile — checks an expectation at each step, and tells the story.
//!
//! ```toml
//! name = "successful deposit"
//! description = "A client deposits 25.50 EUR; the merchant books it once."
//!
//! [payment]                 # the transaction the steps are about (fresh ids per run)
//! amount = "25.50"
//! client = "client-42"
//!
//! [[step]]
//! kind = "providers-validation"
//! expect = { status = 200 }
//!
//! [[step]]
//! kind = "transaction-validation"
//! expect = { status = 200, message = "allowed" }
//!
//! [[step]]
//! kind = "callback"
//! expect = { delivered = true }
//!
//! [[step]]
//! kind = "lookup"
//! expect = { delivery_status = "Delivered" }
//! ```
//!
//! | step `kind` | what the simulated aggregator does | expectations |
//! |---|---|---|
//! | `providers-validation` | sends the request | `status`, `message` (contained), `providers` (count) |
//! | `transaction-validation` | sends the request (`new_validation_id = true`: the same transaction under a new validation id); with `result`, waits for the merchant's posted result (where a `gateway-result` step put a result there before, for the merchant's own post of it). Answered 200, the transaction is created at the gateway in progress (status 3, `callbackDeliveryStatus` `NotSent`, no `destinationAmount`) — unless the gateway holds a denial for the validation when a `lookup` or `reconcile` step first asks — until a callback step gives its result | `status`, `message`, `result` (`allow`/`deny`), `conflicts` |
//! | `callback` | delivers with retries (or `lost = true`: records it as undelivered), `copies` more times (`concurrent` or in a row) | `status`, `message`, `delivered`, `attempts` (acknowledged by that attempt; not with `concurrent`), `bookings`, `moved` |
//! | `forged-callback` | sends the callback forged (`forgery`: `tamper-body`, `tamper-signature` or `wrong-key`), then the genuine one; a correct receiver refuses the forgery with 401 and accepts the genuine callback as new (needs the signing key); the gateway records the genuine delivery, as a callback step's | `bookings`, `moved` |
//! | `lookup` | reads the transaction from the gateway, as the merchant's lookup would (it checks the aggregator's record, not the merchant) | `found` (`false`: the gateway answers 404, as for a transaction whose validation was denied; any other lookup expectation needs a record), `delivery_status`, `canceled`, `in_progress` (the record's status is 0–3) |
//! | `reconcile` | asks the merchant to recover the transaction (its reconcile) | `booked`, `in_progress` (the merchant found the transaction unfinished and booked nothing), `bookings`, `moved` |
//! | `gateway-result` | posts a result (`success`, `description`) itself, as if one had been received before | — |
//! | `new-transaction` | starts a fresh transaction (nonce and ids) for the steps after it | — |
//!
//! Any step can change the transaction with a `payment` table (`amount`, `currency`,
//! `client`, `direction`, `provider`, `collab`, `status`, and `destination_amount` and
//! `destination_currency` for what the payment system delivered when it is not the amount
//! paid: a conversion, a fee taken on the way). An expectation a step does not
//! check (the table's last column; none for a `lost` callback) is refused when the file is
//! read, and so is a step that checks something but is given no expectation (a
//! `forged-callback` judges itself; a lost callback, `gateway-result` and `new-transaction`
//! only set up), so that a scenario cannot pass without testing what it says. `bookings` — how many
//! results of the transaction the merchant's books count — and `moved` — how the
//! transaction moved the client's balance, signed (`"-40.00"` a withdrawal debited, `"0"` a
//! failure booked without moving money) — are seen through the target's [`Observer`]; a run
//! without one (`payhook scenario` against a service from outside) says which expectations
//! it could not check, beside its verdict.

use crate::model::ValidationId;
use serde::Deserialize;
use std::{future::Future, pin::Pin, sync::Arc, time::Duration};
use uuid::Uuid;

use super::SimError;
use super::delivery::{Schedule, deliver_callback};
use super::mock_gateway::{MockControl, ValidationPosts};
use super::request::{Payment, RequestKind, to_text};
use super::trigger::{Exchange, Trigger};
use crate::config::GatewayConfig;
use crate::gateway::GatewayClient;
use crate::model::{
    CallbackSettings, PostponedValidationResult, TransactionStatus, TransactionType,
};

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Its title.
    pub name: String,
    /// What it shows.
    #[serde(default)]
    pub description: String,
    /// The transaction the steps are about.
    #[serde(default)]
    pub payment: PaymentSpec,
    /// The steps, in order.
    #[serde(rename = "step", default)]
    pub steps: Vec<Step>,
}

impl Scenario {
    /// Reads a scenario from TOML.
    ///
    /// # Errors
    ///
    /// [`SimError::Request`] naming what is wrong.
    pub fn parse(text: &str, origin: &str) -> Result<Self, SimError> {
        let scenario: Self =
            toml::from_str(text).map_err(|e| SimError::request(origin).because(e))?;
        if scenario.steps.is_empty() {
            return Err(SimError::request(format!("{origin}: no [[step]]")));
        }
        for (index, step) in scenario.steps.iter().enumerate() {
            step.check()
                .map_err(|e| SimError::request(format!("{origin}: step {}: {e}", index + 1)))?;
        }
        Ok(scenario)
    }
}

impl Expect {
    /// The expectations that are set, by their names in a scenario file.
    fn set(&self) -> Vec<&'static str> {
        [
            ("status", self.status.is_some()),
            ("message", self.message.is_some()),
            ("providers", self.providers.is_some()),
            ("result", self.result.is_some()),
            ("conflicts", self.conflicts.is_some()),
            ("delivered", self.delivered.is_some()),
            ("attempts", self.attempts.is_some()),
            ("delivery_status", self.delivery_status.is_some()),
            ("canceled", self.canceled.is_some()),
            ("found", self.found.is_some()),
            ("booked", self.booked.is_some()),
            ("in_progress", self.in_progress.is_some()),
            ("bookings", self.bookings.is_some()),
            ("moved", self.moved.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }
}

impl Step {
    /// Refuses what this step would not check or use: an expectation it never looks at
    /// would let a scenario pass without testing anything.
    fn check(&self) -> Result<(), String> {
        let (expect, checked): (Option<&Expect>, &[&str]) = match self {
            Self::ProvidersValidation { expect, .. } => {
                (Some(expect), &["status", "message", "providers"])
            }
            Self::TransactionValidation { expect, .. } => {
                (Some(expect), &["status", "message", "result", "conflicts"])
            }
            Self::Callback {
                lost: true,
                copies,
                concurrent,
                max_attempts,
                expect,
                ..
            } => {
                if *copies > 0 || *concurrent || max_attempts.is_some() {
                    return Err("a lost callback is never sent: copies, concurrent and max_attempts do not apply".into());
                }
                (Some(expect), &[])
            }
            Self::Callback {
                concurrent: true,
                max_attempts: Some(_),
                ..
            } => {
                return Err(
                    "concurrent copies are sent once each: max_attempts does not apply".into(),
                );
            }
            Self::Callback {
                concurrent: true,
                expect,
                ..
            } => (
                Some(expect),
                &["status", "message", "delivered", "bookings", "moved"],
            ),
            Self::Callback { expect, .. } => (
                Some(expect),
                &[
                    "status",
                    "message",
                    "delivered",
                    "attempts",
                    "bookings",
                    "moved",
                ],
            ),
            Self::ForgedCallback { expect, .. } => (Some(expect), &["bookings", "moved"]),
            Self::Lookup { expect } => {
                if expect.found == Some(false)
                    && (expect.delivery_status.is_some()
                        || expect.canceled.is_some()
                        || expect.in_progress.is_some())
                {
                    return Err("`found = false` expects no record: `delivery_status`, \
                                `canceled` and `in_progress` cannot be checked"
                        .into());
                }
                (
                    Some(expect),
                    &["found", "delivery_status", "canceled", "in_progress"],
                )
            }
            Self::Reconcile { expect } => {
                if expect.booked.is_some() && expect.in_progress == Some(true) {
                    return Err("a reconcile that finds the transaction in progress books \
                                nothing and finds nothing booked: `booked` and \
                                `in_progress = true` cannot both hold"
                        .into());
                }
                (
                    Some(expect),
                    &["booked", "in_progress", "bookings", "moved"],
                )
            }
            Self::GatewayResult { .. } | Self::NewTransaction {} => (None, &[]),
        };
        if let Some(moved) = expect.and_then(|e| e.moved.as_deref())
            && moved.trim().parse::<rust_decimal::Decimal>().is_err()
        {
            return Err(format!(
                "moved = {moved:?} is not a decimal amount (e.g. \"25.50\", \"-40.00\", \"0\")"
            ));
        }
        let set = expect.map(Expect::set).unwrap_or_default();
        // A step that sends something and checks nothing would pass whatever the merchant
        // answered. A forged callback has its own verdict (refused, and nothing booked), and
        // set-up steps (a lost callback, the gateway's result, a new transaction) none.
        if set.is_empty() && !checked.is_empty() && !matches!(self, Self::ForgedCallback { .. }) {
            return Err(format!(
                "this step checks nothing, and would pass whatever the answer: give it an \
                 `expect` of {}",
                checked.join(", ")
            ));
        }
        let unchecked: Vec<&str> = set
            .into_iter()
            .filter(|name| !checked.contains(name))
            .collect();
        if unchecked.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "this step does not check {}; it checks {}",
                unchecked.join(", "),
                if checked.is_empty() {
                    "nothing".to_owned()
                } else {
                    checked.join(", ")
                }
            ))
        }
    }
}

/// Deposit or withdrawal, in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Cash-in.
    Deposit,
    /// Cash-out.
    Withdrawal,
}

/// Changes to the transaction; unset fields keep their value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PaymentSpec {
    /// Amount, exactly as written (a string: `"25.50"`).
    pub amount: Option<String>,
    /// ISO currency.
    pub currency: Option<String>,
    /// The merchant's client id.
    pub client: Option<String>,
    /// Deposit or withdrawal.
    pub direction: Option<Direction>,
    /// Provider id.
    pub provider: Option<i64>,
    /// The provider's collaborator id.
    pub collab: Option<i64>,
    /// The callback's status code.
    pub status: Option<i32>,
    /// What the payment system delivered, exactly as written (`"27.61"`), when it is not
    /// the amount: the callback's and the lookup's `destinationAmount`.
    pub destination_amount: Option<String>,
    /// The currency delivered, when it is not `currency`: `destinationCurrency`.
    pub destination_currency: Option<String>,
}

impl PaymentSpec {
    fn apply(&self, payment: &mut Payment) -> Result<(), SimError> {
        if let Some(amount) = &self.amount {
            payment.amount = amount
                .parse()
                .map_err(|e| SimError::request(format!("amount `{amount}`")).because(e))?;
        }
        if let Some(currency) = &self.currency {
            payment.currency.clone_from(currency);
        }
        if let Some(client) = &self.client {
            payment.client_id.clone_from(client);
        }
        if let Some(direction) = self.direction {
            payment.direction = match direction {
                Direction::Deposit => TransactionType::Deposit,
                Direction::Withdrawal => TransactionType::Withdrawal,
            };
        }
        if let Some(provider) = self.provider {
            payment.provider_id = provider;
        }
        if let Some(collab) = self.collab {
            payment.collab_id = collab;
        }
        if let Some(status) = self.status {
            payment.status = TransactionStatus::from_code(status);
        }
        if let Some(amount) = &self.destination_amount {
            payment.destination_amount = Some(amount.parse().map_err(|e| {
                SimError::request(format!("destination_amount `{amount}`")).because(e)
            })?);
        }
        if let Some(currency) = &self.destination_currency {
            payment.destination_currency = Some(currency.clone());
        }
        Ok(())
    }
}

/// A result the merchant is expected to post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedResult {
    /// `success: true`.
    Allow,
    /// `success: false`.
    Deny,
}

/// What must hold after a step; unset fields are not checked.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Expect {
    /// The merchant's HTTP status (of the last answer).
    pub status: Option<u16>,
    /// Text the answer's message contains.
    pub message: Option<String>,
    /// Number of providers offered back.
    pub providers: Option<usize>,
    /// The result the merchant posts to the gateway (awaited, under each validation id the
    /// step asked). Without `conflicts`, no result of the merchant's for them may have been
    /// refused during the step by the time it is seen (it posted another beside it).
    pub result: Option<ExpectedResult>,
    /// Results the gateway refused with 403 during the step — watched for two seconds more
    /// once reached: a merchant posting a refused result again (a 403 is final) fails.
    pub conflicts: Option<u32>,
    /// Whether the callback reached a 2xx.
    pub delivered: Option<bool>,
    /// The attempt by which the callback reached a 2xx, at the latest (1: acknowledged at
    /// once). Delivery runs on a fast clock: without it, a merchant that fails the first 16
    /// attempts — days late on the aggregator's schedule — still has `delivered = true`.
    pub attempts: Option<u32>,
    /// The record's `callbackDeliveryStatus`.
    pub delivery_status: Option<String>,
    /// The record's `isCallbackSendingCanceled`.
    pub canceled: Option<bool>,
    /// Whether the gateway holds the transaction (a lookup answered 200; `false`: 404, as
    /// for a transaction whose validation was denied, or never answered 200).
    pub found: Option<bool>,
    /// Reconcile booked the result now (`true`) or found it booked (`false`).
    pub booked: Option<bool>,
    /// The transaction is still in progress (a status 0 to 3, no result yet): as the
    /// lookup's record says, or as the merchant's reconcile found it (booking nothing).
    /// `false`: it is not.
    pub in_progress: Option<bool>,
    /// How many results of the transaction the merchant's books count after the step (1
    /// however often one result was delivered): seen through [`Target::observer`]; a run
    /// without one says it could not check it.
    pub bookings: Option<u32>,
    /// How the transaction moved the client's balance in the merchant's books after the
    /// step, signed, as decimal text: `"25.50"` a deposit credited, `"-40.00"` a withdrawal
    /// debited, `"0"` a failure booked without moving money. Compared by value (`"40"` is
    /// `"40.00"`); seen through [`Target::observer`] ([`Observed::moved`]), and said not
    /// checked where the observer cannot tell. A count alone passes a merchant that credits
    /// a failed deposit or books a withdrawal as a deposit.
    pub moved: Option<String>,
}

/// How long a step expecting refused results watches on once it saw them: longer than a
/// merchant's first retry (payhook's outbox waits about a second), which a refused result
/// must not get.
const CONFLICT_WATCH: Duration = Duration::from_secs(2);

/// One step of a scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// Send a providers validation.
    ProvidersValidation {
        /// Changes to the transaction.
        #[serde(default)]
        payment: PaymentSpec,
        /// What must hold.
        #[serde(default)]
        expect: Expect,
    },
    /// Send a transaction validation.
    TransactionValidation {
        /// Changes to the transaction.
        #[serde(default)]
        payment: PaymentSpec,
        /// Ask again about the same transaction (nonce and payment) under a new
        /// `validationId`, as an aggregator that started its validation over would.
        #[serde(default)]
        new_validation_id: bool,
        /// What must hold.
        #[serde(default)]
        expect: Expect,
    },
    /// Deliver the transaction's callback.
    Callback {
        /// Changes to the transaction.
        #[serde(default)]
        payment: PaymentSpec,
        /// Not delivered at all: recorded at the gateway as undelivered.
        #[serde(default)]
        lost: bool,
        /// Copies sent after the delivery (duplicates).
        #[serde(default)]
        copies: u32,
        /// Send the delivery and its copies all at the same moment instead.
        #[serde(default)]
        concurrent: bool,
        /// Attempts allowed (spec 2.5), default 17.
        #[serde(default)]
        max_attempts: Option<u32>,
        /// What must hold.
        #[serde(default)]
        expect: Expect,
    },
    /// Send the transaction's callback forged, then the genuine one (as `payhook trigger
    /// --fault` does): a correct receiver refuses the forgery with 401 and accepts the
    /// genuine callback as new. Needs the aggregator's signing key.
    ForgedCallback {
        /// Changes to the transaction.
        #[serde(default)]
        payment: PaymentSpec,
        /// How the forgery is made.
        forgery: Forgery,
        /// What must hold.
        #[serde(default)]
        expect: Expect,
    },
    /// Read the transaction from the gateway.
    Lookup {
        /// What must hold.
        #[serde(default)]
        expect: Expect,
    },
    /// Have the merchant recover the transaction.
    Reconcile {
        /// What must hold.
        #[serde(default)]
        expect: Expect,
    },
    /// Post a result to the gateway before the merchant does.
    GatewayResult {
        /// The result.
        success: bool,
        /// Its description.
        #[serde(default)]
        description: String,
    },
    /// Fresh nonce and ids for the steps after this one. A struct variant, so that a key
    /// beside its `kind` is refused: a unit variant of an internally tagged enum ignores
    /// every other key, and a `payment` or `expect` written under it was dropped unseen.
    NewTransaction {},
}

/// How a `forged-callback` step forges the callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Forgery {
    /// A byte of the body changed after signing.
    TamperBody,
    /// A character of the signature changed.
    TamperSignature,
    /// Signed with a key the merchant does not know.
    WrongKey,
}

impl Forgery {
    /// Its name in a scenario file.
    fn name(self) -> &'static str {
        match self {
            Self::TamperBody => "tamper-body",
            Self::TamperSignature => "tamper-signature",
            Self::WrongKey => "wrong-key",
        }
    }

    /// The fault that sends it.
    fn fault(self) -> super::Fault {
        match self {
            Self::TamperBody => super::Fault::TamperBody,
            Self::TamperSignature => super::Fault::TamperSignature,
            Self::WrongKey => super::Fault::WrongKey,
        }
    }
}

/// The scenarios shipped with payhook (file name, TOML), as `payhook demo` runs them.
pub const SHIPPED: [(&str, &str); 14] = [
    ("deposit.toml", include_str!("../../scenarios/deposit.toml")),
    (
        "forged-callbacks.toml",
        include_str!("../../scenarios/forged-callbacks.toml"),
    ),
    (
        "withdrawal.toml",
        include_str!("../../scenarios/withdrawal.toml"),
    ),
    (
        "refused-client.toml",
        include_str!("../../scenarios/refused-client.toml"),
    ),
    (
        "postponed-approval.toml",
        include_str!("../../scenarios/postponed-approval.toml"),
    ),
    (
        "postponed-denial.toml",
        include_str!("../../scenarios/postponed-denial.toml"),
    ),
    (
        "postponed-asked-again.toml",
        include_str!("../../scenarios/postponed-asked-again.toml"),
    ),
    (
        "conflicting-result.toml",
        include_str!("../../scenarios/conflicting-result.toml"),
    ),
    (
        "failed-payments.toml",
        include_str!("../../scenarios/failed-payments.toml"),
    ),
    (
        "lost-callback.toml",
        include_str!("../../scenarios/lost-callback.toml"),
    ),
    (
        "duplicates.toml",
        include_str!("../../scenarios/duplicates.toml"),
    ),
    (
        "held-result.toml",
        include_str!("../../scenarios/held-result.toml"),
    ),
    (
        "unlike-validation.toml",
        include_str!("../../scenarios/unlike-validation.toml"),
    ),
    (
        "reconcile-in-progress.toml",
        include_str!("../../scenarios/reconcile-in-progress.toml"),
    ),
];

/// What a merchant's reconcile did with a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reconciliation {
    /// It booked the result now: its callback had been lost.
    BookedNow,
    /// The result was booked before (its callback arrived): nothing done.
    AlreadyBooked,
    /// The transaction is still in progress (no result yet): nothing to book.
    InProgress,
}

impl Reconciliation {
    /// How the story tells it.
    fn told(self) -> &'static str {
        match self {
            Self::BookedNow => "booked now",
            Self::AlreadyBooked => "already acknowledged",
            Self::InProgress => "still in progress, nothing booked",
        }
    }
}

/// Recovers a transaction through the merchant's own reconcile: what it did, or an error of
/// the merchant's code when it could not.
pub type Reconciler = Arc<
    dyn Fn(
            Uuid,
        )
            -> Pin<Box<dyn Future<Output = Result<Reconciliation, crate::HandlerError>> + Send>>
        + Send
        + Sync,
>;

/// Tells what the merchant booked for a nonce, when the runner can see its books (`None`:
/// it cannot).
pub type Observer = Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Observed>> + Send>>
        + Send
        + Sync,
>;

/// What an [`Observer`] saw of a transaction in the merchant's books.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// A line for the story (`n-1 booked 25.50 EUR …`, or that nothing is booked).
    pub summary: String,
    /// How many results of the transaction were booked (0: none), when the books count
    /// them; checked against a step's `bookings`.
    pub bookings: Option<u32>,
    /// How the transaction moved the client's balance, signed (zero when nothing is
    /// booked), when the books tell; checked against a step's `moved`.
    pub moved: Option<rust_decimal::Decimal>,
}

/// The merchant under test and the simulated aggregator around it.
pub struct Target {
    /// The merchant's base URL (`http://127.0.0.1:8080`); `paths` are appended.
    pub base_url: String,
    /// The merchant's `[paths]`: where its three endpoints are served.
    pub paths: crate::config::PathsConfig,
    /// Sends (and signs) the aggregator's requests.
    pub trigger: Trigger,
    /// The mock gateway's `[gateway]` section (its URL and the merchant's credentials).
    pub gateway: GatewayConfig,
    /// How long to wait for a posted result.
    pub await_timeout: Duration,
    /// The merchant's reconcile, for `reconcile` steps.
    pub reconciler: Option<Reconciler>,
    /// What the merchant booked: told in the story, and checked against `bookings`.
    pub observer: Option<Observer>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// One step's outcome.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// What was done, e.g. `transaction validation`.
    pub title: String,
    /// Who called whom and what came back.
    pub story: Vec<String>,
    /// Unmet expectations (empty: the step passed).
    pub problems: Vec<String>,
    /// Expectations this run could not check (`bookings` without an observer): said, and
    /// not counted as met.
    pub unchecked: Vec<String>,
}

/// A scenario's outcome.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario's name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Each step run (a step that could not run ends the scenario).
    pub steps: Vec<StepReport>,
}

impl Report {
    /// `true` when every expectation held.
    pub fn passed(&self) -> bool {
        self.steps.iter().all(|s| s.problems.is_empty())
    }

    /// The report as text.
    pub fn render(&self) -> String {
        let mut out = format!("▶ {}", self.name);
        if !self.description.is_empty() {
            out.push_str(&format!(" — {}", self.description));
        }
        out.push('\n');
        for (i, step) in self.steps.iter().enumerate() {
            let mark = if step.problems.is_empty() {
                "✓"
            } else {
                "✗"
            };
            out.push_str(&format!("  {}. {} {mark}\n", i + 1, step.title));
            for line in &step.story {
                out.push_str(&format!("       {line}\n"));
            }
            for problem in &step.problems {
                out.push_str(&format!("       ✗ {problem}\n"));
            }
            for unchecked in &step.unchecked {
                out.push_str(&format!("       ⚠ not checked: {unchecked}\n"));
            }
        }
        let verdict = if self.passed() { "passed" } else { "FAILED" };
        let unchecked = self.unchecked();
        if unchecked == 0 {
            out.push_str(&format!("  {verdict}\n"));
        } else {
            out.push_str(&format!(
                "  {verdict}, {unchecked} expectation(s) not checked\n"
            ));
        }
        out
    }

    /// How many expectations this run could not check.
    pub fn unchecked(&self) -> usize {
        self.steps.iter().map(|s| s.unchecked.len()).sum()
    }
}

fn answer(exchange: &Exchange) -> String {
    match (exchange.status, &exchange.error) {
        (Some(status), _) => format!(
            "{status} {:?} ({:.1} ms)",
            exchange.message().unwrap_or_else(|| exchange.body.clone()),
            exchange.latency.as_secs_f64() * 1000.0
        ),
        (None, error) => format!("no answer: {}", error.as_deref().unwrap_or("?")),
    }
}

/// Checks the answer-level expectations of `expect` against `exchange`.
fn check_answer(expect: &Expect, exchange: &Exchange, problems: &mut Vec<String>) {
    if let Some(status) = expect.status
        && exchange.status != Some(status)
    {
        problems.push(format!(
            "expected status {status}, got {}",
            answer(exchange)
        ));
    }
    if let Some(text) = &expect.message
        && !exchange
            .message()
            .is_some_and(|m| m.contains(text.as_str()))
    {
        problems.push(format!(
            "expected a message containing {text:?}, got {}",
            answer(exchange)
        ));
    }
}

/// Runs `scenario` against `target`.
///
/// # Errors
///
/// [`SimError`] when a step cannot be carried out at all (bad amount, unreachable gateway);
/// unmet expectations are not errors but problems in the [`Report`].
pub async fn run(scenario: &Scenario, target: &Target) -> Result<Report, SimError> {
    let mut base = Payment::default();
    scenario.payment.apply(&mut base)?;
    let mut current = base.clone();
    let mut kept = Kept::default();
    let control = MockControl::new(target.gateway.gateway_url.as_deref().unwrap_or_default())?;
    let mut report = Report {
        name: scenario.name.clone(),
        description: scenario.description.clone(),
        steps: Vec::new(),
    };
    for step in &scenario.steps {
        let step_report = run_step(step, target, &control, &mut current, &mut kept).await?;
        report.steps.push(step_report);
    }
    Ok(report)
}

fn url(target: &Target, kind: RequestKind) -> String {
    format!(
        "{}{}",
        target.base_url.trim_end_matches('/'),
        kind.path(&target.paths)
    )
}

/// What a run remembers of what it did at the gateway.
#[derive(Debug, Default)]
struct Kept {
    /// The validation ids whose result a `gateway-result` step of the scenario posted
    /// itself: that the gateway holds a result for one of them says nothing of the merchant.
    posted_here: std::collections::HashSet<ValidationId>,
    /// The transactions (by reference id) the gateway holds a record of: one created by a
    /// validation, or given its result by a callback step. It is not created again, over
    /// its result.
    recorded: std::collections::HashSet<Uuid>,
    /// The transactions (by reference id) a validation was answered 200 for, by the latest
    /// such validation's id: created at the gateway when a lookup or a reconcile first
    /// asks, unless the gateway holds a denial for that validation by then.
    validated: std::collections::HashMap<Uuid, ValidationId>,
}

async fn run_step(
    step: &Step,
    target: &Target,
    control: &MockControl,
    current: &mut Payment,
    kept: &mut Kept,
) -> Result<StepReport, SimError> {
    let mut story = Vec::new();
    let mut problems = Vec::new();
    let mut unchecked = Vec::new();
    let title = match step {
        Step::ProvidersValidation { payment, expect } => {
            payment.apply(current)?;
            let body = to_text(&current.body(RequestKind::ProvidersValidation));
            let exchange = target
                .trigger
                .send(
                    &url(target, RequestKind::ProvidersValidation),
                    body.as_bytes(),
                )
                .await?;
            story.push(format!(
                "aggregator → merchant: which providers for {} ({} {})? → {}",
                current.client_id,
                current.amount,
                current.currency,
                answer(&exchange)
            ));
            check_answer(expect, &exchange, &mut problems);
            if let Some(count) = expect.providers {
                let offered = serde_json::from_str::<serde_json::Value>(&exchange.body)
                    .ok()
                    .and_then(|v| v["providers"].as_array().map(Vec::len));
                if offered != Some(count) {
                    problems.push(format!("expected {count} provider(s), got {offered:?}"));
                }
            }
            "providers validation"
        }
        Step::TransactionValidation {
            payment,
            new_validation_id,
            expect,
        } => {
            payment.apply(current)?;
            let asked_before = new_validation_id.then_some(current.validation_id);
            if let Some(previous) = asked_before {
                current.validation_id = Payment::default().validation_id;
                story.push(format!(
                    "aggregator: asks again about nonce {} under a new validation id ({previous} before)",
                    current.nonce
                ));
            }
            // With a result the scenario posted itself held already, a `result` is the
            // merchant's only if the merchant posts one (the same: accepted) during the step.
            let own_result = expect.result.is_some()
                && expect.conflicts.is_none()
                && kept.posted_here.contains(&current.validation_id);
            // Counted for the validation asked about alone: another's result posted late
            // must not be taken for this one's.
            let before = if expect.conflicts.is_some() || own_result {
                control.validation_posts(current.validation_id).await?
            } else {
                ValidationPosts::default()
            };
            // Asked again under a new id: a result is awaited under each.
            let awaited: Vec<_> = asked_before
                .into_iter()
                .chain([current.validation_id])
                .collect();
            // A result expected with no conflict: the merchant's results refused before the
            // step, under each id, not to be counted against it.
            let mut refused_before = Vec::new();
            if expect.result.is_some() && expect.conflicts.is_none() {
                for &id in &awaited {
                    refused_before.push((id, control.validation_posts(id).await?.refused));
                }
            }
            let body = to_text(&current.body(RequestKind::TransactionValidation));
            let exchange = target
                .trigger
                .send(
                    &url(target, RequestKind::TransactionValidation),
                    body.as_bytes(),
                )
                .await?;
            story.push(format!(
                "aggregator → merchant: may {} {} {} {}? (validation {}) → {}",
                current.client_id,
                if current.direction == TransactionType::Withdrawal {
                    "withdraw"
                } else {
                    "deposit"
                },
                current.amount,
                current.currency,
                current.validation_id,
                answer(&exchange)
            ));
            check_answer(expect, &exchange, &mut problems);
            // With a conflict expected, the result the gateway holds is not the merchant's:
            // tell the merchant's refused result first, then what the gateway kept.
            if let Some(wanted) = expect.conflicts {
                // Counted once the merchant posted its result (accepted or refused): read at
                // once, `conflicts = 0` would hold before anything was posted.
                let deadline = tokio::time::Instant::now() + target.await_timeout;
                let since = |now: ValidationPosts| {
                    let refused = now.refused.saturating_sub(before.refused);
                    let posted = refused + now.accepted.saturating_sub(before.accepted);
                    (refused, posted)
                };
                let posts = || control.validation_posts(current.validation_id);
                let (mut seen, mut posted) = since(posts().await?);
                while (seen < wanted || posted == 0) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    (seen, posted) = since(posts().await?);
                }
                // Reached, watched a while longer: a merchant that posts a refused result
                // again (a 403 is final) does so after its first retry's wait, not at once.
                if posted > 0 && seen == wanted {
                    let watched = tokio::time::Instant::now() + CONFLICT_WATCH;
                    while seen == wanted && tokio::time::Instant::now() < watched {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        (seen, _) = since(posts().await?);
                    }
                }
                for refused in control.refused_results(current.validation_id).await? {
                    story.push(format!(
                        "merchant → gateway: result of validation {}: success = {} ({:?}) → 403, a different result was received before",
                        current.validation_id, refused.success, refused.description
                    ));
                }
                if posted == 0 {
                    problems.push(format!(
                        "expected {wanted} refused result(s), but no result was posted within {:?}",
                        target.await_timeout
                    ));
                } else if seen != wanted {
                    problems.push(format!("expected {wanted} refused result(s), saw {seen}"));
                }
            }
            if let Some(wanted) = expect.result {
                let teller = if expect.conflicts.is_some_and(|n| n > 0) {
                    "the gateway keeps the result it held"
                } else {
                    "merchant → gateway"
                };
                for &validation_id in &awaited {
                    awaited_result(
                        target,
                        control,
                        validation_id,
                        wanted,
                        teller,
                        &mut story,
                        &mut problems,
                    )
                    .await?;
                }
                // Without a conflict expected, no result of the merchant's is refused during
                // the step: one that posts the expected result and another after it
                // disagrees with the aggregator, whatever it holds. Looked at once the
                // result is seen (one posted later than that is not).
                for &(id, before) in &refused_before {
                    let refused = control
                        .validation_posts(id)
                        .await?
                        .refused
                        .saturating_sub(before);
                    if refused > 0 {
                        problems.push(format!(
                            "the merchant also posted {refused} result(s) for validation {id} \
                             that the gateway refused (403: a different result was received before)"
                        ));
                    }
                }
                if own_result {
                    let deadline = tokio::time::Instant::now() + target.await_timeout;
                    let posted = || control.validation_posts(current.validation_id);
                    let mut accepted = posted().await?.accepted > before.accepted;
                    while !accepted && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        accepted = posted().await?.accepted > before.accepted;
                    }
                    if !accepted {
                        problems.push(format!(
                            "the result the gateway holds is this scenario's own (gateway-result): \
                             the merchant posted none for validation {} within {:?}",
                            current.validation_id, target.await_timeout
                        ));
                    }
                }
            }
            if exchange.status == Some(200) {
                kept.validated
                    .insert(current.reference_id, current.validation_id);
            }
            "transaction validation"
        }
        Step::Callback {
            payment,
            lost,
            copies,
            concurrent,
            max_attempts,
            expect,
        } => {
            payment.apply(current)?;
            let body = to_text(&current.body(RequestKind::Callback));
            if *lost {
                control
                    .put_transaction(&current.record("Failed", true))
                    .await?;
                story.push(format!(
                    "aggregator: the {} callback of {} never reaches the merchant (recorded as Failed, sending canceled)",
                    current.status, current.nonce
                ));
            } else if *concurrent {
                concurrent_callbacks(
                    target,
                    control,
                    current,
                    &body,
                    *copies,
                    expect,
                    &mut story,
                    &mut problems,
                )
                .await?;
            } else {
                callback(
                    target,
                    control,
                    current,
                    &body,
                    *max_attempts,
                    expect,
                    &mut story,
                    &mut problems,
                )
                .await?;
                if *copies > 0 {
                    let url = url(target, RequestKind::Callback);
                    let mut answers = Vec::new();
                    for _ in 0..*copies {
                        answers.push(target.trigger.send(&url, body.as_bytes()).await?);
                    }
                    story.push(format!(
                        "aggregator → merchant: the same callback {copies} more times → {}",
                        answers.iter().map(answer).collect::<Vec<_>>().join(" | ")
                    ));
                    if let Some(bad) = answers.iter().find(|a| !a.is_success()) {
                        problems.push(format!("a copy was not acknowledged: {}", answer(bad)));
                    }
                }
            }
            kept.recorded.insert(current.reference_id);
            observe(
                target,
                &current.nonce,
                expect,
                &mut story,
                &mut problems,
                &mut unchecked,
            )
            .await;
            "callback"
        }
        Step::ForgedCallback {
            payment,
            forgery,
            expect,
        } => {
            payment.apply(current)?;
            let verdict = super::inject(
                &target.trigger,
                &url(target, RequestKind::Callback),
                RequestKind::Callback,
                current,
                forgery.fault(),
            )
            .await?;
            if let [forged, genuine] = verdict.answers.as_slice() {
                story.push(format!(
                    "aggregator → merchant: the {} callback of {} forged ({}) → {forged}",
                    current.status,
                    current.nonce,
                    forgery.name()
                ));
                story.push(format!(
                    "aggregator → merchant: the genuine callback → {genuine}"
                ));
            }
            if !verdict.correct {
                problems.push(format!("expected {}", verdict.expected));
            }
            // The genuine callback's delivery is what the gateway records.
            let delivered = verdict
                .answers
                .last()
                .is_some_and(|genuine| genuine.starts_with('2'));
            let status = if delivered { "Delivered" } else { "Failed" };
            control
                .put_transaction(&current.record(status, false))
                .await?;
            kept.recorded.insert(current.reference_id);
            observe(
                target,
                &current.nonce,
                expect,
                &mut story,
                &mut problems,
                &mut unchecked,
            )
            .await;
            "forged callback"
        }
        Step::Lookup { expect } => {
            created_by_validation(control, current, kept, &mut story).await?;
            look_up(target, current, expect, &mut story, &mut problems).await?;
            "lookup"
        }
        Step::Reconcile { expect } => {
            created_by_validation(control, current, kept, &mut story).await?;
            let reconciler = target.reconciler.as_ref().ok_or_else(|| {
                SimError::request(
                    "a reconcile step needs the merchant's reconcile (--reconcile-command, or an in-process app)",
                )
            })?;
            match reconciler(current.reference_id).await {
                Ok(done) => {
                    story.push(format!(
                        "merchant: reconcile {} → {}",
                        current.reference_id,
                        done.told()
                    ));
                    reconciled(expect, done, &mut problems);
                }
                Err(error) => problems.push(format!("reconcile failed: {error}")),
            }
            observe(
                target,
                &current.nonce,
                expect,
                &mut story,
                &mut problems,
                &mut unchecked,
            )
            .await;
            "reconcile"
        }
        Step::GatewayResult {
            success,
            description,
        } => {
            kept.posted_here.insert(current.validation_id);
            let client = GatewayClient::new(&target.gateway)?;
            client
                .post_validation_result(&PostponedValidationResult {
                    validation_id: current.validation_id,
                    success: *success,
                    description: description.clone(),
                })
                .await?;
            story.push(format!(
                "gateway: already holds a result for validation {}: success = {success}",
                current.validation_id
            ));
            "a result received before"
        }
        Step::NewTransaction {} => {
            let fresh = Payment::default();
            current.nonce = fresh.nonce;
            current.validation_id = fresh.validation_id;
            current.transaction_id = fresh.transaction_id;
            current.reference_id = fresh.reference_id;
            story.push(format!("a new transaction: nonce {}", current.nonce));
            "new transaction"
        }
    };
    Ok(StepReport {
        title: title.to_owned(),
        story,
        problems,
        unchecked,
    })
}

/// Tells what the merchant's books hold for `nonce`, when the target can see them, and
/// checks the `bookings` and `moved` wanted against them (or says it could not).
async fn observe(
    target: &Target,
    nonce: &str,
    expect: &Expect,
    story: &mut Vec<String>,
    problems: &mut Vec<String>,
    unchecked: &mut Vec<String>,
) {
    let observed = match &target.observer {
        Some(observer) => observer(nonce.to_owned()).await,
        None => None,
    };
    if let Some(observed) = &observed {
        story.push(format!("merchant's ledger: {}", observed.summary));
    }
    if let Some(wanted) = expect.moved.as_deref() {
        // Checked when the scenario was read.
        let wanted_amount = wanted.trim().parse::<rust_decimal::Decimal>().ok();
        match observed.as_ref().and_then(|o| o.moved) {
            Some(moved) if Some(moved) == wanted_amount => {}
            Some(moved) => problems.push(format!(
                "expected the transaction to move the balance by {wanted}, the merchant's books moved it by {moved}"
            )),
            None => unchecked.push(format!(
                "moved = {wanted}: this run cannot see how the merchant's books moved (an \
                 in-process observer that reports it, or a bookings command that prints the \
                 amount after the count)"
            )),
        }
    }
    let Some(wanted) = expect.bookings else {
        return;
    };
    match observed.and_then(|o| o.bookings) {
        Some(counted) if counted == wanted => {}
        Some(counted) => problems.push(format!(
            "expected {wanted} booking(s) of the transaction, the merchant's books count {counted}"
        )),
        None => unchecked.push(format!(
            "bookings = {wanted}: this run cannot see the merchant's books (an in-process \
             observer sees them, as in `payhook demo` or a test of the merchant's own)"
        )),
    }
}

/// Waits for the merchant's posted result and compares it.
async fn awaited_result(
    target: &Target,
    control: &MockControl,
    validation_id: ValidationId,
    wanted: ExpectedResult,
    teller: &str,
    story: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Result<(), SimError> {
    match control
        .await_validation_result(validation_id, target.await_timeout)
        .await?
    {
        Some(result) => {
            story.push(format!(
                "{teller}: result of validation {validation_id}: success = {} ({:?})",
                result.success, result.description
            ));
            if result.success != (wanted == ExpectedResult::Allow) {
                problems.push(format!("expected the result {wanted:?}"));
            }
        }
        None => problems.push(format!(
            "no result posted within {:?}",
            target.await_timeout
        )),
    }
    Ok(())
}

/// A transaction a validation was answered 200 for, of which the gateway holds no record
/// yet: created now, in progress until its result — unless the gateway holds a denial for
/// that validation (a postponed validation denied: no transaction). The simulator cannot
/// tell an immediate answer from a postponed one whose result is still to come: a
/// validation with no result held counts as allowed.
/// A lookup step: reads the transaction from the gateway as the merchant's lookup would,
/// and checks the record (or its absence) against `expect`.
async fn look_up(
    target: &Target,
    current: &Payment,
    expect: &Expect,
    story: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Result<(), SimError> {
    let client = GatewayClient::new(&target.gateway)?;
    let record = match client.transaction(current.reference_id).await {
        Err(crate::gateway::GatewayError::Status { status: 404, .. }) => {
            say_not_found(current.reference_id, expect, story, problems);
            return Ok(());
        }
        found => found?,
    };
    let status = record.callback_delivery_status.clone().unwrap_or_default();
    story.push(format!(
            "simulator → gateway, as the merchant's lookup would: GET transaction {} → {}, callbackDeliveryStatus {status}, canceled {}",
            current.reference_id, record.transaction_status, record.is_callback_sending_canceled
        ));
    if expect.found == Some(false) {
        problems.push(format!(
            "expected the gateway to hold no transaction {}, but it holds one",
            current.reference_id
        ));
    }
    if let Some(wanted) = &expect.delivery_status
        && *wanted != status
    {
        problems.push(format!(
            "expected callbackDeliveryStatus {wanted}, got {status}"
        ));
    }
    if let Some(wanted) = expect.canceled
        && wanted != record.is_callback_sending_canceled
    {
        problems.push(format!("expected isCallbackSendingCanceled {wanted}"));
    }
    let in_progress = record.transaction_status.in_progress();
    if let Some(wanted) = expect.in_progress
        && wanted != in_progress
    {
        problems.push(format!(
            "expected in_progress = {wanted}: the record's transactionStatus is {}",
            record.transaction_status
        ));
    }
    Ok(())
}

/// A lookup answered 404: what `expect` says of that.
fn say_not_found(
    reference_id: Uuid,
    expect: &Expect,
    story: &mut Vec<String>,
    problems: &mut Vec<String>,
) {
    story.push(format!(
        "simulator → gateway, as the merchant's lookup would: GET transaction {reference_id} → 404, the gateway holds no such transaction"
    ));
    if expect.found != Some(false) {
        problems.push(format!(
            "the gateway holds no transaction {reference_id}: none is created for a \
             validation that was denied or never answered 200 (`found = false` expects that)"
        ));
    }
}

async fn created_by_validation(
    control: &MockControl,
    current: &Payment,
    kept: &mut Kept,
    story: &mut Vec<String>,
) -> Result<(), SimError> {
    if kept.recorded.contains(&current.reference_id) {
        return Ok(());
    }
    let Some(&validation_id) = kept.validated.get(&current.reference_id) else {
        return Ok(());
    };
    let denied = control
        .validation_result(validation_id)
        .await?
        .is_some_and(|result| !result.success);
    if denied {
        return Ok(());
    }
    control
        .put_transaction(&current.record_in_progress())
        .await?;
    kept.recorded.insert(current.reference_id);
    story.push(format!(
        "aggregator: transaction {} created after validation {validation_id}: {} until its result",
        current.reference_id,
        TransactionStatus::Pending
    ));
    Ok(())
}

/// Checks a reconcile's outcome against `booked` and `in_progress`.
fn reconciled(expect: &Expect, done: Reconciliation, problems: &mut Vec<String>) {
    if let Some(wanted) = expect.booked {
        let booked = match done {
            Reconciliation::BookedNow => Some(true),
            Reconciliation::AlreadyBooked => Some(false),
            Reconciliation::InProgress => None,
        };
        if booked != Some(wanted) {
            problems.push(format!(
                "expected booked = {wanted}; the merchant's reconcile said: {}",
                done.told()
            ));
        }
    }
    if let Some(wanted) = expect.in_progress
        && wanted != (done == Reconciliation::InProgress)
    {
        problems.push(format!(
            "expected in_progress = {wanted}; the merchant's reconcile said: {}",
            done.told()
        ));
    }
}

/// Sends the callback `copies + 1` times at once, as a retrying aggregator racing itself
/// would; every copy must be acknowledged.
#[allow(clippy::too_many_arguments, reason = "one step's whole context")]
async fn concurrent_callbacks(
    target: &Target,
    control: &MockControl,
    current: &Payment,
    body: &str,
    copies: u32,
    expect: &Expect,
    story: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Result<(), SimError> {
    let url = url(target, RequestKind::Callback);
    let sends = (0..=copies).map(|_| target.trigger.send(&url, body.as_bytes()));
    let answers: Vec<Exchange> = futures_util::future::join_all(sends)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    story.push(format!(
        "aggregator → merchant: {} copies of the {} callback at once → {}",
        copies + 1,
        current.status,
        answers.iter().map(answer).collect::<Vec<_>>().join(" | ")
    ));
    let delivered = answers.iter().all(Exchange::is_success);
    let status = if delivered { "Delivered" } else { "Failed" };
    control
        .put_transaction(&current.record(status, false))
        .await?;
    if let Some(wanted) = expect.delivered
        && wanted != delivered
    {
        problems.push(format!("expected delivered = {wanted}"));
    }
    if let Some(last) = answers.last() {
        check_answer(expect, last, problems);
    }
    Ok(())
}

/// Delivers the callback with the retry schedule and checks it.
#[allow(clippy::too_many_arguments, reason = "one step's whole context")]
async fn callback(
    target: &Target,
    control: &MockControl,
    current: &Payment,
    body: &str,
    max_attempts: Option<u32>,
    expect: &Expect,
    story: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Result<(), SimError> {
    let settings = [CallbackSettings {
        collab_id: current.collab_id,
        callback_url: url(target, RequestKind::Callback),
        max_attempts: max_attempts.unwrap_or(17),
        is_enabled: true,
        add_signature: target.trigger.signer().is_some(),
        transaction_type_id: None,
    }];
    let mut attempts = Vec::new();
    let report = deliver_callback(
        &target.trigger,
        current,
        body.as_bytes(),
        &settings,
        &Schedule::default().fast(),
        Some(control),
        |_, attempt| attempts.push(attempt.clone()),
    )
    .await?;
    for attempt in &attempts {
        story.push(format!(
            "aggregator → merchant: {} callback of {} {} {} (attempt {} at +{:?}) → {}",
            current.status,
            current.client_id,
            current.amount,
            current.currency,
            attempt.number,
            attempt.at,
            answer(&attempt.exchange)
        ));
    }
    let delivered = report.deliveries.iter().all(super::Delivery::delivered);
    if let Some(wanted) = expect.delivered
        && wanted != delivered
    {
        problems.push(format!("expected delivered = {wanted}"));
    }
    if let Some(wanted) = expect.attempts {
        let took = u32::try_from(attempts.len()).unwrap_or(u32::MAX);
        if !delivered {
            problems.push(format!(
                "expected acknowledged by attempt {wanted}; not acknowledged in {took}"
            ));
        } else if took > wanted {
            problems.push(format!(
                "expected acknowledged by attempt {wanted}; acknowledged at attempt {took}"
            ));
        }
    }
    if let Some(last) = attempts.last() {
        check_answer(expect, &last.exchange, problems);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_scenario_parses() {
        for (file, text) in SHIPPED {
            let scenario = Scenario::parse(text, file).unwrap();
            assert!(!scenario.steps.is_empty(), "{file}");
        }
    }

    #[test]
    fn a_bad_scenario_is_refused_with_its_origin_and_reason() {
        // Printed as payhook prints errors: the file, then the parser's reason as its cause.
        let report = |error: SimError| crate::Report::new(&error).to_string();
        let unknown = report(
            Scenario::parse("name = \"x\"\n[[step]]\nkind = \"refund\"\n", "x.toml").unwrap_err(),
        );
        assert!(
            unknown.starts_with("x.toml") && unknown.contains("refund"),
            "{unknown}"
        );
        let typo = report(
            Scenario::parse(
                "name = \"x\"\n[[step]]\nkind = \"lookup\"\nexpect = { delivery = \"x\" }\n",
                "y.toml",
            )
            .unwrap_err(),
        );
        assert!(typo.contains("delivery"), "{typo}");
        // A new transaction takes nothing but its kind: what is written beside it is not
        // dropped unseen.
        for beside in ["payment = { status = -2 }", "expect = { moved = \"0\" }"] {
            let text = format!("name = \"x\"\n[[step]]\nkind = \"new-transaction\"\n{beside}\n");
            let refused = report(Scenario::parse(&text, "n.toml").unwrap_err());
            assert!(refused.contains("unknown field"), "{beside}: {refused}");
        }
        // Concurrent copies are sent once each: no attempt to count.
        let concurrent = report(
            Scenario::parse(
                "name = \"x\"\n[[step]]\nkind = \"callback\"\ncopies = 2\nconcurrent = true\nexpect = { attempts = 1 }\n",
                "c.toml",
            )
            .unwrap_err(),
        );
        assert!(
            concurrent.contains("does not check attempts"),
            "{concurrent}"
        );
        let empty = Scenario::parse("name = \"x\"\n", "z.toml")
            .unwrap_err()
            .to_string();
        assert!(empty.contains("no [[step]]"), "{empty}");
        let mut payment = Payment::default();
        let bad_amount = PaymentSpec {
            amount: Some("ten".into()),
            ..PaymentSpec::default()
        };
        assert!(bad_amount.apply(&mut payment).is_err());
        let bad_delivered = PaymentSpec {
            destination_amount: Some("11,37".into()),
            ..PaymentSpec::default()
        };
        let refused = report(bad_delivered.apply(&mut payment).unwrap_err());
        assert!(refused.contains("destination_amount `11,37`"), "{refused}");
    }

    #[test]
    fn a_converted_payment_is_written_in_its_callback() {
        let text = "name = \"x\"\n[payment]\namount = \"10.50\"\ndestination_amount = \"11.37\"\n\
                    destination_currency = \"USD\"\n[[step]]\nkind = \"callback\"\nexpect = { delivered = true }\n";
        let scenario = Scenario::parse(text, "c.toml").unwrap();
        let mut payment = Payment::default();
        scenario.payment.apply(&mut payment).unwrap();
        let body = to_text(&payment.body(RequestKind::Callback));
        assert!(
            body.contains(r#""amount":10.50,"#)
                && body.contains(r#""destinationAmount":11.37,"destinationCurrency":"USD""#),
            "{body}"
        );
    }

    /// `booked` and `in_progress` hold only for what the merchant's reconcile said: an
    /// unfinished transaction booked, or said booked, fails the step.
    #[test]
    fn a_reconcile_is_judged_by_what_the_merchant_said() {
        let expect = |booked: Option<bool>, in_progress: Option<bool>| Expect {
            booked,
            in_progress,
            ..Expect::default()
        };
        let unmet = |expect: &Expect, done: Reconciliation| {
            let mut problems = Vec::new();
            reconciled(expect, done, &mut problems);
            problems
        };
        use Reconciliation::{AlreadyBooked, BookedNow, InProgress};
        let early = expect(None, Some(true));
        assert!(unmet(&early, InProgress).is_empty());
        for wrong in [BookedNow, AlreadyBooked] {
            let problems = unmet(&early, wrong);
            assert_eq!(problems.len(), 1, "{wrong:?}");
            assert!(problems[0].contains(wrong.told()), "{problems:?}");
        }
        let recovered = expect(Some(true), Some(false));
        assert!(unmet(&recovered, BookedNow).is_empty());
        assert_eq!(unmet(&recovered, AlreadyBooked).len(), 1);
        // Nothing booked, and nothing found booked: neither `booked = true` nor `false`.
        assert_eq!(unmet(&recovered, InProgress).len(), 2);
        assert_eq!(unmet(&expect(Some(false), None), InProgress).len(), 1);
    }

    /// The money a step moved is checked by value, whatever its scale, and a count alone
    /// does not pass it: a receiver that credits a failed deposit, or books a withdrawal as
    /// a deposit, counts one booking all the same.
    #[tokio::test]
    async fn moved_is_compared_by_value_and_is_not_checked_without_an_amount() {
        let observed = |moved: Option<&str>| Observed {
            summary: "seen".into(),
            bookings: Some(1),
            moved: moved.map(|m| m.parse().unwrap()),
        };
        let expect = Expect {
            bookings: Some(1),
            moved: Some("-40.00".into()),
            ..Expect::default()
        };
        for (books, problems, unchecked) in [
            (Some("-40"), 0, 0),
            (Some("40.00"), 1, 0),
            (Some("0"), 1, 0),
            (None, 0, 1),
        ] {
            let seen = observed(books);
            let observer: Observer = Arc::new(move |_| {
                let seen = seen.clone();
                Box::pin(async move { Some(seen) })
            });
            let target = Target {
                base_url: String::new(),
                paths: crate::config::PathsConfig::default(),
                trigger: Trigger::new(None).unwrap(),
                gateway: GatewayConfig::default(),
                await_timeout: Duration::from_secs(1),
                reconciler: None,
                observer: Some(observer),
            };
            let (mut story, mut found, mut not_checked) = (Vec::new(), Vec::new(), Vec::new());
            observe(
                &target,
                "n-1",
                &expect,
                &mut story,
                &mut found,
                &mut not_checked,
            )
            .await;
            assert_eq!(
                (found.len(), not_checked.len()),
                (problems, unchecked),
                "{books:?}: {found:?} {not_checked:?}"
            );
        }
    }

    #[test]
    fn an_expectation_the_step_would_not_check_is_refused() {
        let refused = |step: &str, wanted: &str| {
            let text = format!("name = \"x\"\n[[step]]\n{step}\n");
            let error = Scenario::parse(&text, "s.toml").unwrap_err().to_string();
            assert!(
                error.starts_with("s.toml: step 1:") && error.contains(wanted),
                "{step}: {error}"
            );
        };
        refused(
            "kind = \"callback\"\nlost = true\nexpect = { delivered = true }",
            "does not check delivered; it checks nothing",
        );
        refused(
            "kind = \"callback\"\nlost = true\ncopies = 2",
            "a lost callback is never sent",
        );
        refused(
            "kind = \"callback\"\nconcurrent = true\ncopies = 4\nmax_attempts = 3",
            "max_attempts does not apply",
        );
        refused(
            "kind = \"callback\"\nexpect = { result = \"allow\" }",
            "does not check result",
        );
        refused(
            "kind = \"lookup\"\nexpect = { delivered = true, canceled = false }",
            "does not check delivered",
        );
        refused(
            "kind = \"providers-validation\"\nexpect = { booked = true }",
            "does not check booked",
        );
        refused(
            "kind = \"lookup\"\nexpect = { moved = \"1.00\" }",
            "does not check moved",
        );
        refused(
            "kind = \"callback\"\nexpect = { moved = \"ten\" }",
            "moved = \"ten\" is not a decimal amount",
        );
        refused(
            "kind = \"callback\"\nexpect = { in_progress = false }",
            "does not check in_progress",
        );
        refused(
            "kind = \"reconcile\"\nexpect = { booked = false, in_progress = true }",
            "cannot both hold",
        );
        refused(
            "kind = \"lookup\"\nexpect = { found = false, delivery_status = \"NotSent\" }",
            "expects no record",
        );
        refused(
            "kind = \"callback\"\nexpect = { found = true }",
            "does not check found",
        );
        // A step that sends and checks nothing would pass whatever the answer.
        for kind in [
            "callback",
            "transaction-validation",
            "providers-validation",
            "lookup",
            "reconcile",
        ] {
            refused(&format!("kind = \"{kind}\""), "this step checks nothing");
        }
        // What the step checks is accepted, and so are the steps that only set up (a lost
        // callback, a new transaction) or judge themselves (a forged callback).
        let fine = "name = \"x\"\n[[step]]\nkind = \"callback\"\ncopies = 3\nexpect = { status = 200, delivered = true }\n";
        assert!(Scenario::parse(fine, "ok.toml").is_ok());
        for set_up in [
            "kind = \"callback\"\nlost = true",
            "kind = \"new-transaction\"",
            "kind = \"forged-callback\"\nforgery = \"tamper-body\"",
        ] {
            let text = format!("name = \"x\"\n[[step]]\n{set_up}\n");
            let parsed = Scenario::parse(&text, "ok.toml");
            assert!(parsed.is_ok(), "{set_up}: {parsed:?}");
        }
    }
}
