//! The example merchant as a service: [`payhook::sim::example_merchant`] (its handlers, its
//! ledger, its review of postponed validations) served on the configured address. The
//! merchant's code lives in the library so that `payhook demo` and the scenarios run the very
//! same merchant; read `src/sim/example_merchant.rs` for the three traits implemented.
//!
//! Run it (listens on 127.0.0.1:8080; `RUST_LOG=debug` for every request) with the
//! aggregator's public key — or, for a local trial without one, with unsigned callbacks
//! allowed explicitly; without either it refuses to start, so that a copy of it can never
//! run an open receiver by mistake:
//!
//! ```text
//! PAYHOOK_SIGNATURE_KEYS='[{file = "aggregator.pem"}]' cargo run --example merchant
//! PAYHOOK_CALLBACK_ALLOW_UNSIGNED=true cargo run --example merchant
//! ```
//!
//! Settings: `PAYHOOK_CONFIG=payhook.toml` and the `PAYHOOK_*` variables of the README
//! (`PAYHOOK_STORE_PATH` for the data directory, `PAYHOOK_SIGNATURE_KEYS` for the
//! aggregator's key); `MERCHANT_MAX_AMOUNT` (default 10000) is this merchant's own limit per
//! transaction; `MERCHANT_REVIEW_ABOVE` (default 1000) the amount above which an Awaitable
//! validation waits for review, and `MERCHANT_REVIEW_EVERY` (default `2s`) how often the
//! review runs: it approves every client except those whose id starts with `blocked`;
//! `MERCHANT_PROVIDER_TAGS` (e.g. `11=fiat,eu;12=crypto`) files providers under tags, which
//! a request's `providerTags` is matched against (the spec's candidates carry none of
//! their own: without it, a request that asks for tags is offered no provider). It prints
//! `listening on ADDRESS` once it serves.
//!
//! Before copying it for production, know what it leaves to you:
//!
//! - Its validation endpoints are open, as payhook's are by default: anyone who reaches
//!   them is answered. Set `auth.providers_validation` and `auth.transaction_validation`
//!   (a method, or `allow_ips`; README, "Callback signatures", on the validation
//!   endpoints). In Awaitable mode, whose decisions are posted to the aggregator, an open
//!   transaction validation endpoint is refused at start-up (and so are its operating
//!   commands, which read the same settings) unless `validation.allow_unauthenticated`.
//! - Its limit is one amount per transaction, whatever the currency, and a withdrawal is
//!   not checked against the client's balance.
//! - A result it will not book (module docs of `example_merchant`) is acknowledged into its
//!   `ledger_quarantine` tree, and payhook reports the callback held, not booked (logged at
//!   error level with the reason, counted in `payhook_callbacks_held_total`) and keeps it
//!   until a person resolves it (`payhook callbacks held`, `payhook callbacks resolve`; the
//!   shipped alert `PayhookCallbacksHeld` fires while one waits).
//!
//! With arguments it runs an operating command of [`payhook::admin`] instead, with its own
//! handlers — e.g. `cargo run --example merchant -- reconcile --ref REFERENCE_ID` books lost
//! callbacks into the ledger (with the service stopped: one process holds the store) — or
//! its own: `cargo run --example merchant -- quarantine` lists the results it acknowledged
//! but held, not booked, for a person to resolve.

use payhook::Config;
use payhook::model::parse_amount;
use payhook::sim::example_merchant::{
    Ledger, Merchant, ProviderTags, app, open_existing_store, open_store, review,
};
use rust_decimal::Decimal;

/// The example's command line: no arguments serves; an operating command runs it.
#[derive(clap::Parser)]
#[command(about = "The example merchant: serves, or runs an operating command")]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

/// The example's operating commands: payhook's, and its own.
#[derive(clap::Subcommand)]
enum Command {
    /// Lists the results acknowledged but held in quarantine, not booked (the
    /// `ledger_quarantine` tree): each is for a person to resolve in the books
    Quarantine,
    #[command(flatten)]
    Admin(payhook::admin::AdminCommand),
}

/// A `MERCHANT_*` setting of this example that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{name}=`{value}` is not valid")]
pub struct SettingError {
    name: &'static str,
    value: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// The variable `name` read with `parse`, or `default` when it is not set.
fn setting<T, E>(
    name: &'static str,
    default: T,
    parse: impl Fn(&str) -> Result<T, E>,
) -> Result<T, SettingError>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match std::env::var(name) {
        Ok(value) => parse(&value).map_err(|e| SettingError {
            name,
            source: e.into(),
            value,
        }),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // What failed (the address, the file, the key), why, and what to do — once,
            // never as a `Debug` dump.
            #[allow(clippy::print_stderr, reason = "a failed start is told on stderr")]
            {
                eprintln!("error: {}", payhook::Report::new(&*error));
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let max_amount = setting("MERCHANT_MAX_AMOUNT", Decimal::from(10_000), parse_amount)?;
    let review_above = setting("MERCHANT_REVIEW_ABOVE", Decimal::from(1_000), parse_amount)?;
    let provider_tags = setting(
        "MERCHANT_PROVIDER_TAGS",
        ProviderTags::default(),
        str::parse,
    )?;
    let review_every = setting(
        "MERCHANT_REVIEW_EVERY",
        std::time::Duration::from_secs(2),
        payhook::config::parse_duration,
    )?;
    // Callbacks move money: without the aggregator's public key (PAYHOOK_SIGNATURE_KEYS, or
    // [signature] in PAYHOOK_CONFIG) the app refuses to start, unless unsigned callbacks
    // are allowed explicitly (PAYHOOK_CALLBACK_ALLOW_UNSIGNED=true, for local trials only).
    // This example never turns that on by itself.
    let config = Config::from_env().map_err(payhook::Error::from)?;
    // Postponing is only valid on an endpoint declared Awaitable.
    let review_above = config.validation.awaitable.then_some(review_above);
    let command = match <Args as clap::Parser>::parse().command {
        None => None,
        Some(Command::Quarantine) => return quarantine(&config).await,
        Some(Command::Admin(command)) => Some(command),
    };
    if let Some(command) = command {
        let out = &mut std::io::stdout();
        // A lookup of a transaction reads the aggregator alone: no store is opened (nor
        // created), and it runs beside the service.
        if matches!(command, payhook::admin::AdminCommand::Transaction { .. }) {
            command.run(&config, None, None, out).await?;
            return Ok(());
        }
        // An operating command, run with this merchant's handlers (reconcile books through
        // its ledger); the service itself must be stopped: one process holds the store. A
        // store.path naming no store is refused, not opened empty.
        let store = open_existing_store(&config)
            .await
            .map_err(payhook::Error::from)?;
        let merchant = Merchant {
            max_amount,
            review_above,
            provider_tags: provider_tags.clone(),
        };
        let app = app(config.clone(), merchant, store).map_err(payhook::Error::from)?;
        command.run(&config, app.store(), Some(&app), out).await?;
        return Ok(());
    }
    let listener = payhook::bind(config.server.listen).await?;
    let store = open_store(&config).await.map_err(payhook::Error::from)?;
    let merchant = Merchant {
        max_amount,
        review_above,
        provider_tags,
    };
    let app = app(config, merchant, store).map_err(payhook::Error::from)?;
    // `kill -HUP <pid>` reads the credentials again from PAYHOOK_CONFIG's file, without a
    // restart: the aggregator's signature keys (a rotation), the gateway's password and TLS
    // files, the operating API's operators and tokens (`payhook credentials read-again`
    // does the same through the operating API).
    tokio::spawn(app.credentials().read_again_on_hangup(Config::from_env));
    if let Some(resolver) = app.resolver() {
        tokio::spawn(review(resolver, review_every));
    }
    let address = listener.local_addr()?;
    tracing::info!(%address, %max_amount, "example merchant ready");
    #[allow(
        clippy::print_stdout,
        reason = "the one line a supervising process reads"
    )]
    {
        println!("listening on {address}");
    }
    payhook::serve(listener, app, payhook::shutdown_signal()).await?;
    Ok(())
}

/// Prints each result in quarantine, one line each, from the store of a stopped service (on
/// PostgreSQL, of a running one too).
async fn quarantine(config: &Config) -> Result<(), Box<dyn std::error::Error>> {
    let store = open_existing_store(config)
        .await
        .map_err(payhook::Error::from)?;
    let held = Ledger::of(&store)
        .map_err(payhook::Error::from)?
        .quarantined_all()
        .await
        .map_err(payhook::Error::from)?;
    #[allow(clippy::print_stdout, reason = "the command's output")]
    {
        for (nonce, quarantined) in &held {
            println!("{}: {quarantined}", payhook::Escaped(nonce));
        }
        println!("{} result(s) in quarantine", held.len());
    }
    Ok(())
}
