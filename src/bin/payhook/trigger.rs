//! `payhook trigger`: send one of the aggregator's requests to a merchant's endpoint.

use clap::{Args, ValueEnum};
use payhook::Config;
use payhook::config::PathsConfig;
use payhook::model::ValidationId;
use payhook::model::{TransactionStatus, TransactionType};
use payhook::signature::{Algorithm, Encoding, SigningKey};
use payhook::sim::{Exchange, MockControl, Payment, RequestKind, Signer, Trigger};
use rust_decimal::Decimal;
use std::{path::PathBuf, time::Duration};
use uuid::Uuid;

use crate::Failure;

/// Which request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Kind {
    ProvidersValidation,
    TransactionValidation,
    Callback,
}

impl From<Kind> for RequestKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::ProvidersValidation => Self::ProvidersValidation,
            Kind::TransactionValidation => Self::TransactionValidation,
            Kind::Callback => Self::Callback,
        }
    }
}

/// A fault to inject (see `payhook::sim::Fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FaultName {
    /// The same request --copies times in a row.
    Duplicate,
    /// The same request --copies times at once.
    Concurrent,
    /// A body byte changed after signing, then the genuine request.
    TamperBody,
    /// A signature character changed, then the genuine request.
    TamperSignature,
    /// Signed with a key the merchant does not know, then the genuine request.
    WrongKey,
    /// A success, then the older failure of the same nonce delivered late (callbacks).
    Reorder,
    /// The body trickled out over --slow-for.
    SlowBody,
    /// Half the body, the connection closed, then the request again.
    DropMidRequest,
    /// The nonce again for another payment: another amount, that payment's own ids.
    ReuseNonce,
}

/// The request's contents: typed values, or a JSON file, with overrides.
#[derive(Debug, Clone, Args)]
pub(crate) struct PaymentArgs {
    /// The transaction's nonce (default: a fresh one).
    #[arg(long)]
    nonce: Option<String>,
    /// The amount, sent exactly as written (e.g. 10.50).
    #[arg(long)]
    amount: Option<Decimal>,
    /// ISO currency.
    #[arg(long)]
    currency: Option<String>,
    /// The merchant's client id.
    #[arg(long)]
    client: Option<String>,
    /// The provider id.
    #[arg(long)]
    provider: Option<i64>,
    /// The provider's collaborator id (callback recipient selection).
    #[arg(long)]
    collab: Option<i64>,
    /// A withdrawal (cash-out) instead of a deposit.
    #[arg(long)]
    withdrawal: bool,
    /// The validationId of a transaction validation (default: a fresh one).
    #[arg(long)]
    validation_id: Option<ValidationId>,
    /// The callback's transactionStatus code (4 success; -1 to -6 failures).
    #[arg(long, allow_negative_numbers = true)]
    status: Option<i32>,
    /// The transaction's reference id (default: a fresh one).
    #[arg(long)]
    reference_id: Option<Uuid>,
    /// The amount the payment system delivered, when not --amount (a conversion, a fee):
    /// the callback's and the lookup's destinationAmount.
    #[arg(long)]
    destination_amount: Option<Decimal>,
    /// The currency delivered, when not --currency: destinationCurrency.
    #[arg(long)]
    destination_currency: Option<String>,
    /// Start from this JSON body instead of the built one.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Override a field: `path=value`, path dot-separated (`paymentData.amount=0.10`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    sets: Vec<String>,
}

impl PaymentArgs {
    pub(crate) fn payment(&self) -> Payment {
        let mut payment = Payment::default();
        if let Some(nonce) = &self.nonce {
            payment.nonce.clone_from(nonce);
        }
        if let Some(amount) = self.amount {
            payment.amount = amount;
        }
        if let Some(currency) = &self.currency {
            payment.currency.clone_from(currency);
        }
        if let Some(client) = &self.client {
            payment.client_id.clone_from(client);
        }
        if let Some(provider) = self.provider {
            payment.provider_id = provider;
        }
        if let Some(collab) = self.collab {
            payment.collab_id = collab;
        }
        if self.withdrawal {
            payment.direction = TransactionType::Withdrawal;
        }
        if let Some(id) = self.validation_id {
            payment.validation_id = id;
        }
        if let Some(status) = self.status {
            payment.status = TransactionStatus::from_code(status);
        }
        if let Some(reference) = self.reference_id {
            payment.reference_id = reference;
        }
        payment.destination_amount = self.destination_amount;
        payment
            .destination_currency
            .clone_from(&self.destination_currency);
        payment
    }

    /// The body to send for `kind`, as bytes.
    pub(crate) fn body(&self, kind: RequestKind, payment: &Payment) -> Result<String, Failure> {
        let mut body = match &self.file {
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| Failure::msg(format!("{}: {e}", file.display())))?;
                let parsed = serde_json::from_str(&text)
                    .map_err(|e| Failure::msg(format!("{}: {e}", file.display())))?;
                if self.sets.is_empty() {
                    // Byte for byte: a captured body keeps its numbers (`10.50`), key order
                    // and spacing, which re-serialising would change.
                    return Ok(text);
                }
                parsed
            }
            None => payment.body(kind),
        };
        for set in &self.sets {
            let (path, value) = set
                .split_once('=')
                .ok_or_else(|| Failure::msg(format!("--set {set}: expected PATH=VALUE")))?;
            payhook::sim::set(&mut body, path, value)?;
        }
        Ok(payhook::sim::to_text(&body))
    }
}

/// How requests are signed and authenticated.
#[derive(Debug, Clone, Args)]
pub(crate) struct SigningArgs {
    /// The aggregator's private key (PKCS#8) to sign with; unsigned without it. Header,
    /// algorithm, encoding and prefix come from the `[signature]` of --config unless given.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// The signature algorithm (default: `signature.algorithm` of the configuration).
    #[arg(long, value_enum)]
    alg: Option<Algorithm>,
    /// How the signature is written in the header (default: `signature.encoding`).
    #[arg(long, value_enum)]
    encoding: Option<Encoding>,
    /// The signature header (default: `signature.header`).
    #[arg(long = "signature-header")]
    signature_header: Option<String>,
    /// Text put before the signature in the header, e.g. `sha256=` (default:
    /// `signature.prefix`).
    #[arg(long)]
    prefix: Option<String>,
    /// An extra header, `Name: value` (e.g. the validation endpoints' shared secret); repeat.
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// The merchant's configuration: its `[paths]` and `[signature]` are the defaults here.
    #[command(flatten)]
    pub(crate) config: crate::ConfigArgs,
}

impl SigningArgs {
    /// The configuration file given with --config, if any.
    pub(crate) fn config_file(&self) -> Option<&std::path::Path> {
        self.config.config.as_deref()
    }

    pub(crate) fn trigger(&self, config: &Config) -> Result<Trigger, Failure> {
        let signer = match &self.key {
            Some(path) => {
                let mut signature = config.signature.clone();
                if let Some(alg) = self.alg {
                    signature.algorithm = alg;
                }
                if let Some(encoding) = self.encoding {
                    signature.encoding = encoding;
                }
                if let Some(header) = &self.signature_header {
                    signature.header.clone_from(header);
                }
                if let Some(prefix) = &self.prefix {
                    signature.prefix.clone_from(prefix);
                }
                let pem = std::fs::read(path)
                    .map_err(|e| Failure::msg(format!("{}: {e}", path.display())))?;
                let key = SigningKey::from_pkcs8(&pem, signature.algorithm)?;
                Some(Signer::new(key, &signature)?)
            }
            None => None,
        };
        let mut trigger = Trigger::new(signer)?;
        for line in &self.headers {
            trigger = trigger.with_header(line)?;
        }
        Ok(trigger)
    }
}

/// `payhook trigger KIND --to URL ...`
#[derive(Debug, Clone, Args)]
pub(crate) struct TriggerArgs {
    /// What to send.
    kind: Kind,
    /// The merchant's endpoint; a bare `http://host:port` gets the kind's default path.
    #[arg(long, required_unless_present = "settings")]
    to: Option<String>,
    /// Callback only: deliver as the aggregator does, to every matching entry of this JSON
    /// array of callback settings (spec 2.5), with retries; instead of --to.
    #[arg(long, conflicts_with = "to")]
    settings: Option<PathBuf>,
    /// With --settings: the waits between delivery attempts, e.g. `5s,30s,5m` (the last
    /// repeats).
    #[arg(long, value_delimiter = ',', value_parser = payhook::config::parse_duration)]
    schedule: Vec<Duration>,
    /// With --settings: let the waits pass on a virtual clock, no sleeping.
    #[arg(long)]
    fast: bool,
    #[command(flatten)]
    payment: PaymentArgs,
    #[command(flatten)]
    signing: SigningArgs,
    /// Exit 1 unless the merchant answers this status (for a merchant's CI). One request's
    /// answer: --settings and --fault judge their own.
    #[arg(long, conflicts_with_all = ["settings", "fault"])]
    expect: Option<u16>,
    /// After a transaction validation is answered 200, wait for the merchant's posted result
    /// at the mock gateway (--gateway) and print it.
    #[arg(long = "await", requires = "gateway")]
    wait: bool,
    /// The mock gateway's URL: --await reads the posted result there, and a callback (sent or
    /// delivered) records the transaction and its delivery status there.
    #[arg(long)]
    gateway: Option<String>,
    /// How long --await waits.
    #[arg(long, default_value = "30s", value_parser = payhook::config::parse_duration)]
    await_timeout: Duration,
    /// Behave like a hostile or unlucky network instead of sending once; repeat for several.
    /// Each prints what the merchant answered and whether a correct receiver answers so.
    #[arg(long, value_enum, conflicts_with = "settings")]
    fault: Vec<FaultName>,
    /// Copies sent by `duplicate` and `concurrent`.
    #[arg(long, default_value_t = 3)]
    copies: u32,
    /// How long `slow-body` spreads the body over.
    #[arg(long, default_value = "5s", value_parser = payhook::config::parse_duration)]
    slow_for: Duration,
}

impl TriggerArgs {
    /// The configuration file given with --config, if any.
    pub(crate) fn config_file(&self) -> Option<&std::path::Path> {
        self.signing.config_file()
    }

    fn fault(&self, name: FaultName) -> payhook::sim::Fault {
        use payhook::sim::Fault;
        match name {
            FaultName::Duplicate => Fault::Duplicate(self.copies),
            FaultName::Concurrent => Fault::Concurrent(self.copies),
            FaultName::TamperBody => Fault::TamperBody,
            FaultName::TamperSignature => Fault::TamperSignature,
            FaultName::WrongKey => Fault::WrongKey,
            FaultName::Reorder => Fault::Reorder,
            FaultName::SlowBody => Fault::SlowBody(self.slow_for),
            FaultName::DropMidRequest => Fault::DropMidRequest,
            FaultName::ReuseNonce => Fault::ReuseNonce,
        }
    }
}

/// The endpoint URL: `to` as given, or with the kind's default path when it has none.
pub(crate) fn endpoint(to: &str, kind: RequestKind, paths: &PathsConfig) -> String {
    let trimmed = to.trim_end_matches('/');
    let has_path = trimmed
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    if has_path {
        to.to_owned()
    } else {
        format!("{trimmed}{}", kind.path(paths))
    }
}

/// Prints an exchange: the request, the status with latency, and the answer.
pub(crate) fn print_exchange(exchange: &Exchange) {
    println!("→ {}", exchange.request.replace('\n', "\n  "));
    match (exchange.status, &exchange.error) {
        (Some(status), _) => println!(
            "← {status} in {:.1} ms\n  {}",
            exchange.latency.as_secs_f64() * 1000.0,
            exchange.body
        ),
        (None, Some(error)) => println!("← no answer: {error}"),
        (None, None) => println!("← no answer"),
    }
}

pub(crate) fn run(args: TriggerArgs, config: &Config) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let kind = RequestKind::from(args.kind);
        let payment = args.payment.payment();
        let body = args.payment.body(kind, &payment)?;
        let trigger = args.signing.trigger(config)?;
        check_combination(&args, kind)?;
        if let Some(settings) = &args.settings {
            if kind != RequestKind::Callback {
                return Err(Failure("--settings delivers callbacks only".into(), 2));
            }
            return deliver(&args, settings, &trigger, &payment, &body).await;
        }
        let to = args.to.as_deref().unwrap_or_default();
        if !args.fault.is_empty() {
            return faults(
                &args,
                &trigger,
                &endpoint(to, kind, &config.paths),
                kind,
                &payment,
            )
            .await;
        }
        let exchange = trigger
            .send(&endpoint(to, kind, &config.paths), body.as_bytes())
            .await?;
        print_exchange(&exchange);
        if exchange.status.is_none() && args.expect.is_none() {
            return Err(Failure("no answer from the merchant".into(), 1));
        }
        if kind == RequestKind::Callback
            && let Some(gateway) = args.gateway.as_deref()
        {
            // The mock gateway keeps the transaction, as the aggregator would, for lookups.
            let status = if exchange.is_success() {
                "Delivered"
            } else {
                "Failed"
            };
            MockControl::new(gateway)?
                .put_transaction(&payment.record(status, false))
                .await?;
            println!(
                "recorded at {gateway}: reference id {}, {status}",
                payment.reference_id
            );
        }
        if let Some(expected) = args.expect
            && exchange.status != Some(expected)
        {
            return Err(Failure(
                format!(
                    "expected {expected}, got {}",
                    exchange
                        .status
                        .map_or_else(|| "no answer".to_owned(), |s| s.to_string())
                ),
                1,
            ));
        }
        if args.wait && exchange.status != Some(200) {
            return Err(Failure(
                "the validation was not answered 200 (postponed): there is no result to await"
                    .into(),
                1,
            ));
        }
        if args.wait {
            let gateway = args.gateway.as_deref().unwrap_or_default();
            let id = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|b| b["validationId"].as_i64())
                .map_or(payment.validation_id, ValidationId::from);
            println!("… waiting for the result of validation {id} at {gateway}");
            let control = MockControl::new(gateway)?;
            match control
                .await_validation_result(id, args.await_timeout)
                .await?
            {
                Some(result) => println!(
                    "result posted: success = {}, description = {:?}",
                    result.success, result.description
                ),
                None => {
                    return Err(Failure(
                        format!(
                            "no result for validation {id} within {:?}",
                            args.await_timeout
                        ),
                        1,
                    ));
                }
            }
        }
        Ok(())
    })
}

/// Refuses flags that would contradict each other: the mock gateway's record, the choice of
/// recipients and the injected faults are built from the payment flags, so a body from
/// `--file` or `--set` would silently differ from what they assume.
fn check_combination(args: &TriggerArgs, kind: RequestKind) -> Result<(), Failure> {
    let refuse = |message: &str| Err(Failure(message.to_owned(), 2));
    let custom_body = args.payment.file.is_some() || !args.payment.sets.is_empty();
    if args.wait && kind != RequestKind::TransactionValidation {
        return refuse(
            "--await waits for a postponed validation's result: transaction-validation only",
        );
    }
    if args.settings.is_none() && (args.fast || !args.schedule.is_empty()) {
        return refuse(
            "--schedule and --fast pace the retries of a delivery to --settings; one request to --to has none",
        );
    }
    if !args.fault.is_empty() && (args.wait || args.gateway.is_some()) {
        return refuse(
            "--fault judges its own requests and records nothing at the mock gateway; it cannot be combined with --await or --gateway",
        );
    }
    if custom_body && !args.fault.is_empty() {
        return refuse(
            "--fault builds its own bodies from the payment flags; it cannot be combined with --file or --set",
        );
    }
    if custom_body
        && kind == RequestKind::Callback
        && (args.gateway.is_some() || args.settings.is_some())
    {
        return refuse(
            "--gateway and --settings use the payment flags (--status, --amount, --collab, ...), which --file or --set would contradict; set those with the flags",
        );
    }
    Ok(())
}

/// Delivers a callback to the recipients of a settings file, printing each attempt.
async fn deliver(
    args: &TriggerArgs,
    settings: &std::path::Path,
    trigger: &Trigger,
    payment: &Payment,
    body: &str,
) -> Result<(), Failure> {
    let text = std::fs::read_to_string(settings)
        .map_err(|e| Failure::msg(format!("{}: {e}", settings.display())))?;
    let settings: Vec<payhook::model::CallbackSettings> = serde_json::from_str(&text)
        .map_err(|e| Failure::msg(format!("{}: {e}", settings.display())))?;
    let mut schedule = payhook::sim::Schedule::default();
    if !args.schedule.is_empty() {
        schedule.waits.clone_from(&args.schedule);
    }
    schedule.fast = args.fast;
    let mock = args.gateway.as_deref().map(MockControl::new).transpose()?;
    let report = payhook::sim::deliver_callback(
        trigger,
        payment,
        body.as_bytes(),
        &settings,
        &schedule,
        mock.as_ref(),
        |url, attempt| {
            let outcome = match (attempt.exchange.status, &attempt.exchange.error) {
                (Some(status), _) => format!("{status} {}", attempt.exchange.body),
                (None, error) => format!("no answer: {}", error.as_deref().unwrap_or("?")),
            };
            println!(
                "{url}: attempt {} at +{:?} → {outcome} ({:.1} ms)",
                attempt.number,
                attempt.at,
                attempt.exchange.latency.as_secs_f64() * 1000.0
            );
        },
    )
    .await?;
    if report.deliveries.is_empty() {
        return Err(Failure(
            format!(
                "no callback URL of the settings matches collab {} and {}: nothing was delivered",
                payment.collab_id, payment.direction
            ),
            1,
        ));
    }
    for delivery in &report.deliveries {
        let verdict = if delivery.delivered() {
            "delivered"
        } else {
            "GAVE UP"
        };
        println!(
            "{}: {verdict} after {} attempt(s)",
            delivery.url,
            delivery.attempts.len()
        );
    }
    println!(
        "callbackDeliveryStatus: {} (reference id {})",
        report.status(),
        payment.reference_id
    );
    if report.status() == "Failed" {
        return Err(Failure("a callback was not delivered".into(), 1));
    }
    Ok(())
}

/// Injects each fault of `args` and prints the verdicts; exit 1 if any answer was wrong.
async fn faults(
    args: &TriggerArgs,
    trigger: &Trigger,
    url: &str,
    kind: RequestKind,
    payment: &Payment,
) -> Result<(), Failure> {
    let mut wrong = 0;
    for name in &args.fault {
        // Each fault on a fresh transaction, so that they do not see each other's records.
        let fresh = Payment::default();
        let payment = Payment {
            nonce: fresh.nonce,
            validation_id: fresh.validation_id,
            transaction_id: fresh.transaction_id,
            reference_id: fresh.reference_id,
            ..payment.clone()
        };
        let verdict = payhook::sim::inject(trigger, url, kind, &payment, args.fault(*name)).await?;
        let mark = if verdict.correct { "ok" } else { "WRONG" };
        let name = name
            .to_possible_value()
            .map_or_else(|| format!("{name:?}"), |v| v.get_name().to_owned());
        println!(
            "{name}: {mark}\n  merchant answered: {}\n  a correct receiver: {}",
            verdict.answers.join(" | "),
            verdict.expected
        );
        if !verdict.correct {
            wrong += 1;
        }
    }
    if wrong > 0 {
        return Err(Failure(format!("{wrong} fault(s) answered wrongly"), 1));
    }
    Ok(())
}
