//! The `payhook` command line: a thin layer over the library.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command line prints"
)]

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::ExitCode,
};

mod demo;
mod scenario;
mod trigger;

use clap::{Args, Parser, Subcommand};
use payhook::Config;
use payhook::admin::{AdminCommand, CallbacksCommand, ValidationsCommand};
use payhook::signature::{
    Algorithm, Encoding, PublicKey, SigningKey, Verifier, generate_key_pair, parse_raw_request,
    sniff,
};
use payhook::store::{SledStore, Store};
use std::sync::Arc;

/// payhook: host and test the endpoints a payment aggregator calls.
#[derive(Debug, Parser)]
#[command(
    name = "payhook",
    version,
    about,
    long_about = None,
    after_help = "Examples:
  payhook demo                                   the whole protocol, told as a story
  payhook new shop && cd shop && cargo test      your own service, scaffolded
  payhook keygen --alg ed25519 --out sim-keys    a key pair for the simulated aggregator
  payhook trigger callback --to http://127.0.0.1:8080 --key sim-keys/private.pem --alg ed25519
  payhook validations list --pending --admin-url http://127.0.0.1:8080"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where a command finds the service's configuration.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ConfigArgs {
    /// The service's configuration file (default: the file PAYHOOK_CONFIG names, if any);
    /// PAYHOOK_* variables apply on top.
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) config: Option<PathBuf>,
}

/// How an operating command reaches the service: its store, or its operating API.
#[derive(Debug, Clone, Args)]
struct ServiceArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Work through this running service's operating API (e.g. http://127.0.0.1:8080)
    /// instead of opening its store, which a running service holds; the token is admin.token
    /// (PAYHOOK_ADMIN_TOKEN).
    #[arg(long, value_name = "URL", global = true)]
    admin_url: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load a configuration file (plus PAYHOOK_* environment variables), validate it and its
    /// signature keys, and print the effective settings with secrets redacted.
    #[command(
        after_help = "Example:\n  PAYHOOK_GATEWAY_PASSWORD=... payhook check-config payhook.toml"
    )]
    CheckConfig {
        /// The TOML configuration file.
        file: PathBuf,
    },
    /// Generate a key pair: DIR/private.pem (PKCS#8) and DIR/public.pem (SPKI).
    #[command(after_help = "Example:\n  payhook keygen --alg ed25519 --out sim-keys")]
    Keygen {
        /// Algorithm the key is for (rsa-* keys are 2048-bit RSA).
        #[arg(long, value_enum, default_value = "rsa-pkcs1-sha256")]
        alg: Algorithm,
        /// Directory to write the two files into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Overwrite existing key files.
        #[arg(long)]
        force: bool,
    },
    /// Make a token of their own for an operator of the operating API: print it, for them
    /// alone, and the entry of the service's [admin.operators] that lets it in (the token's
    /// SHA-256: the configuration never holds the token).
    #[command(after_help = "Example:\n  payhook operator-token alice")]
    OperatorToken {
        /// The operator's name, kept with what they resolve or decide (1 to 64 characters).
        name: String,
    },
    /// Sign standard input's exact bytes; print the signature header value.
    #[command(
        after_help = "Example:\n  printf '%s' '{\"nonce\":\"n-1\"}' | payhook sign --key sim-keys/private.pem --alg ed25519\n\n(`echo` would add a newline to the signed bytes.)"
    )]
    Sign {
        /// PKCS#8 private key (PEM or DER).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The signature algorithm (the aggregator's `signature.algorithm`).
        #[arg(long, value_enum, default_value = "rsa-pkcs1-sha256")]
        alg: Algorithm,
        /// How the signature is written in the header.
        #[arg(long, value_enum, default_value = "base64")]
        encoding: Encoding,
        /// Text put before the signature in the header (e.g. `sha256=`).
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Verify a signature over standard input's exact bytes; exit 0 when it verifies.
    #[command(
        after_help = "Example:\n  payhook verify --key aggregator.pem --signature \"$SIG\" < body.json"
    )]
    Verify {
        /// Public key: PEM, DER, .NET XML, JWK or JWKS (any key of a JWKS may verify; each
        /// must fit --alg).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The signature algorithm (the aggregator's `signature.algorithm`).
        #[arg(long, value_enum, default_value = "rsa-pkcs1-sha256")]
        alg: Algorithm,
        /// The signature header value.
        #[arg(long)]
        signature: String,
        /// How the signature is written in the header.
        #[arg(long, value_enum, default_value = "base64")]
        encoding: Encoding,
        /// Text before the signature in the header (e.g. `sha256=`), removed before decoding.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Find which header, prefix, encoding and algorithm a captured signed request uses.
    #[command(
        after_help = "Example:\n  payhook sniff --key aggregator.pem --request captured.http"
    )]
    Sniff {
        /// The aggregator's public key(s) in any supported format; repeat for several.
        #[arg(long, required = true, value_name = "FILE")]
        key: Vec<PathBuf>,
        /// A captured raw HTTP request (headers, blank line, body).
        #[arg(long, conflicts_with_all = ["body", "header"], value_name = "FILE")]
        request: Option<PathBuf>,
        /// The exact body bytes (with --header).
        #[arg(long, requires = "header", value_name = "FILE")]
        body: Option<PathBuf>,
        /// A header of the request, `Name: value`; repeat for several.
        #[arg(long)]
        header: Vec<String>,
    },
    /// Postponed (Awaitable) validations: list them, or decide one.
    #[command(
        after_help = "Examples:\n  payhook validations list --pending --admin-url http://127.0.0.1:8080\n  payhook validations resolve 42 --allow --description \"documents checked\" --admin-url http://127.0.0.1:8080"
    )]
    Validations {
        #[command(flatten)]
        service: ServiceArgs,
        #[command(subcommand)]
        command: ValidationsCommand,
    },
    /// Callbacks whose handler failed, or whose body was refused, and that are not booked
    /// yet; results the merchant held instead of booking, until a person resolves them.
    #[command(
        after_help = "Examples:\n  payhook callbacks failing --admin-url http://127.0.0.1:8080 --json\n  payhook callbacks held --admin-url http://127.0.0.1:8080\n  payhook callbacks resolve --nonce n-42 --status 1 --note \"refunded by hand\" --admin-url http://127.0.0.1:8080"
    )]
    Callbacks {
        #[command(flatten)]
        service: ServiceArgs,
        #[command(subcommand)]
        command: CallbacksCommand,
    },
    /// Fetch a transaction from the aggregator by its reference id and print it.
    #[command(
        after_help = "Example:\n  payhook transaction 0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e --config payhook.toml"
    )]
    Transaction {
        #[command(flatten)]
        config: ConfigArgs,
        /// The transaction's reference id (a GUID).
        reference_id: uuid::Uuid,
        /// Print the record as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Recover lost callbacks: with --admin-url the running service fetches each transaction
    /// and books its result through its handler, once; without, report which results are
    /// booked and which were lost (this binary has no handler of yours).
    #[command(
        after_help = "Example:\n  payhook reconcile --ref 0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e --admin-url http://127.0.0.1:8080"
    )]
    Reconcile {
        #[command(flatten)]
        service: ServiceArgs,
        /// A reference id to reconcile; repeat for several.
        #[arg(long = "ref", required = true, value_name = "REFERENCE_ID")]
        reference_ids: Vec<uuid::Uuid>,
    },
    /// The store: check a sled store's integrity or accept a loss an operator has dealt
    /// with; migrate a PostgreSQL schema; copy a sled store into PostgreSQL.
    #[command(
        after_help = "Examples:\n  payhook store check --data payhook-data\n  PAYHOOK_STORE_URL=postgres://payhook@db/payments payhook store migrate\n  PAYHOOK_STORE_URL=postgres://payhook@db/payments payhook store copy-from-sled --data payhook-data"
    )]
    Store {
        #[command(flatten)]
        config: ConfigArgs,
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// The credentials of a running service: have it read its configuration again and
    /// take them (signature keys, the aggregator's login and TLS files, the operating API's
    /// tokens), as on SIGHUP, and say what changed.
    #[command(
        after_help = "Examples:\n  payhook credentials check --admin-url http://127.0.0.1:8080\n  payhook credentials read-again --admin-url http://127.0.0.1:8080"
    )]
    Credentials {
        #[command(flatten)]
        config: ConfigArgs,
        #[command(subcommand)]
        command: CredentialsCommand,
    },
    /// Follow a running service's deliveries as they happen: one line each (or JSON), from
    /// its inspector (admin.token, PAYHOOK_ADMIN_TOKEN).
    #[command(
        after_help = "Examples:\n  payhook tail --admin-url http://127.0.0.1:8080\n  payhook tail --admin-url http://127.0.0.1:8080 --outcome failed --json"
    )]
    Tail {
        #[command(flatten)]
        config: ConfigArgs,
        /// The running service (e.g. http://127.0.0.1:8080).
        #[arg(long, value_name = "URL")]
        admin_url: String,
        /// One JSON object per delivery instead of a readable line.
        #[arg(long)]
        json: bool,
        /// Only deliveries whose nonce contains this.
        #[arg(long)]
        nonce: Option<String>,
        /// Only deliveries whose client id contains this.
        #[arg(long)]
        client: Option<String>,
        /// Only this outcome: booked, duplicate, allowed, denied, postponed, replayed,
        /// answered, refused, failed.
        #[arg(long)]
        outcome: Option<String>,
        /// Only this endpoint: callback, transaction_validation, providers_validation.
        #[arg(long)]
        endpoint: Option<String>,
        /// First print the recent deliveries the service keeps.
        #[arg(long)]
        recent: bool,
        /// Stop after this many deliveries.
        #[arg(long, value_name = "N")]
        count: Option<usize>,
    },
    /// The whole protocol in one command: the example merchant and a mock aggregator on
    /// loopback, the shipped scenarios run against them and told as a story.
    #[command(
        after_help = "Examples:\n  payhook demo\n  payhook demo --inspect --data demo-data\n  payhook demo --store postgres://postgres@127.0.0.1/test"
    )]
    Demo {
        /// Keep the data here (default: a temporary directory, removed afterwards).
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        /// Keep the records in this PostgreSQL database instead of sled, in a schema of the
        /// demo's own (removed afterwards unless --data is given).
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        /// After the scenarios, keep the service up and print its inspector's address
        /// (stop with Ctrl-C).
        #[arg(long)]
        inspect: bool,
    },
    /// Print the OpenAPI 3.1 document of the merchant-hosted endpoints as the service's
    /// configuration serves them: its paths, each endpoint's authentication, the signature
    /// header, the identifier and body limits.
    #[command(
        after_help = "Example:\n  payhook openapi --config payhook.toml > merchant-endpoints.json"
    )]
    Openapi {
        #[command(flatten)]
        config: ConfigArgs,
        /// Print the document as shipped (payhook's defaults), without reading any
        /// configuration.
        #[arg(long)]
        shipped: bool,
    },
    /// Scaffold a merchant service crate: handlers with working defaults, a commented
    /// payhook.toml, a scenario and an integration test that runs it.
    #[command(after_help = "Example:\n  payhook new shop && cd shop && cargo test")]
    New {
        /// The crate's name.
        name: String,
        /// Its directory (default: ./NAME).
        #[arg(long, value_name = "DIR")]
        path: Option<PathBuf>,
        /// Write into a non-empty directory.
        #[arg(long)]
        force: bool,
        /// Depend on the payhook checkout at this path instead of the published version.
        #[arg(long, conflicts_with = "payhook_version", value_name = "DIR")]
        payhook_path: Option<PathBuf>,
        /// Depend on this published payhook version (default: this binary's own).
        #[arg(long, value_name = "VERSION")]
        payhook_version: Option<String>,
        /// Where the service keeps its records: sled (one instance), or postgres (sled
        /// unless store.url is set; its test runs on PAYHOOK_TEST_DATABASE_URL when set).
        #[arg(long, value_enum, default_value = "sled")]
        store: payhook::scaffold::StoreKind,
    },
    /// Run scenario files (TOML) against a running merchant and mock gateway; exit 1 on any
    /// unmet expectation.
    #[command(
        after_help = "Example:\n  payhook scenario scenarios/deposit.toml --to http://127.0.0.1:8080 --gateway http://127.0.0.1:9090 --key sim-keys/private.pem"
    )]
    Scenario(Box<scenario::ScenarioArgs>),
    /// Send one of the aggregator's requests (signed with --key) to a merchant's endpoint and
    /// print the exchange.
    #[command(
        after_help = "Examples:\n  payhook trigger callback --to http://127.0.0.1:8080 --key sim-keys/private.pem --alg ed25519 --expect 200\n  payhook trigger callback --to http://127.0.0.1:8080 --key sim-keys/private.pem --fault duplicate --fault tamper-body"
    )]
    Trigger(Box<trigger::TriggerArgs>),
    /// Run a local aggregator (login, refresh with real JWTs, postponed results, transaction
    /// lookup) on loopback until Ctrl-C.
    #[command(
        after_help = "Example:\n  payhook mock-gateway --listen 127.0.0.1:9090 --access-lifetime 30s"
    )]
    MockGateway {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: std::net::SocketAddr,
        /// The merchant user it accepts.
        #[arg(long, default_value = payhook::sim::DEFAULT_USERNAME)]
        username: String,
        /// Its password (or PAYHOOK_MOCK_PASSWORD).
        #[arg(
            long,
            env = "PAYHOOK_MOCK_PASSWORD",
            default_value = payhook::sim::DEFAULT_PASSWORD,
            hide_env_values = true
        )]
        password: String,
        /// Lifetime of access tokens ("30s", "15m", ...).
        #[arg(long, default_value = "15m", value_parser = payhook::config::parse_duration)]
        access_lifetime: std::time::Duration,
        /// Lifetime of refresh tokens.
        #[arg(long, default_value = "1d", value_parser = payhook::config::parse_duration)]
        refresh_lifetime: std::time::Duration,
        /// Keep the state in this directory across restarts (default: in memory).
        #[arg(long, value_name = "DIR")]
        state: Option<PathBuf>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  payhook completions bash > ~/.local/share/bash-completion/completions/payhook\n  payhook completions zsh > ~/.zfunc/_payhook"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `payhook store ...`: offline commands on a stopped service's store.
#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Report whether the store still holds every commit it acknowledged, without serving
    /// (exit 0: sound; 1: it lost acknowledged writes; 2: it cannot be read or is in use).
    Check {
        /// The store's directory (default: store.path of the configuration).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// After a store lost acknowledged writes, and what could be recovered was (a backup,
    /// `payhook reconcile`, the aggregator's reports): let the service start on what the
    /// store holds. The decision is printed and appended to payhook.audit.log in the
    /// store's directory.
    AcceptLoss {
        /// The store's directory (default: store.path of the configuration).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Create or migrate payhook's tables in the PostgreSQL database of store.url, in
    /// store.schema (a service also does it when it starts).
    Migrate,
    /// Copy a stopped sled store (its records within retention, failing callbacks, held
    /// results, postponed validations and outbox, and the merchant's trees) into the PostgreSQL
    /// database of store.url. Idempotent: run it again after an interruption. Refuses
    /// while another payhook has store.schema open (no instance opens it while the copy
    /// runs); marks the sled directory MOVED-TO-POSTGRESQL, which a sled instance then
    /// refuses. A copy that finished runs again only with --again.
    CopyFromSled {
        /// The sled store's directory (default: store.path of the configuration).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Copy a store whose copy finished before: only while no instance has served from
        /// PostgreSQL since (a copy after they did adds back what their work removed).
        #[arg(long)]
        again: bool,
    },
}

/// `payhook credentials …`.
#[derive(Debug, Subcommand)]
enum CredentialsCommand {
    /// Have the service read its configuration again (what it reads on SIGHUP) through
    /// its operating API, and print what changed; exit 2, saying why, when nothing was
    /// taken.
    ReadAgain {
        /// The running service (e.g. http://127.0.0.1:8080); repeat it for each instance
        /// behind a load balancer: each reads its own configuration.
        #[arg(long, value_name = "URL", required = true)]
        admin_url: Vec<String>,
    },
    /// Have the service read its configuration and say what it would change, taking
    /// nothing: a rotation tried before it is made; exit 2, saying why, when it would not
    /// be taken.
    Check {
        /// The running service (e.g. http://127.0.0.1:8080); repeat it for each instance.
        #[arg(long, value_name = "URL", required = true)]
        admin_url: Vec<String>,
    },
}

/// What a command prints on failure: a message and its exit code.
struct Failure(String, u8);

impl Failure {
    /// A message of the command's own, exit code 2.
    fn msg(text: impl Into<String>) -> Self {
        Self(text.into(), 2)
    }

    /// `error` as a person reads it (its message, then each cause), with `code`.
    fn report(error: &(dyn std::error::Error + 'static), code: u8) -> Self {
        Self(payhook::Report::new(error).to_string(), code)
    }
}

impl<E: std::error::Error + 'static> From<E> for Failure {
    fn from(error: E) -> Self {
        Self::report(&error, 2)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.command);
    let result = match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Keygen { alg, out, force } => keygen(alg, &out, force),
        Command::OperatorToken { name } => operator_token(&name),
        Command::Sign {
            key,
            alg,
            encoding,
            prefix,
        } => sign(&key, alg, encoding, &prefix),
        Command::Verify {
            key,
            alg,
            signature,
            encoding,
            prefix,
        } => verify(&key, alg, &signature, encoding, &prefix),
        Command::Sniff {
            key,
            request,
            body,
            header,
        } => sniff_request(&key, request.as_deref(), body.as_deref(), &header),
        Command::Validations { service, command } => {
            admin(AdminCommand::Validations(command), &service)
        }
        Command::Callbacks { service, command } => {
            admin(AdminCommand::Callbacks(command), &service)
        }
        Command::Transaction {
            config,
            reference_id,
            json,
        } => admin(
            AdminCommand::Transaction { reference_id, json },
            &ServiceArgs {
                config,
                admin_url: None,
            },
        ),
        Command::Reconcile {
            service,
            reference_ids,
        } => admin(AdminCommand::Reconcile { reference_ids }, &service),
        Command::Store { config, command } => store_command(command, config.config.as_deref()),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "payhook", &mut std::io::stdout());
            Ok(())
        }
        Command::Demo {
            data,
            store,
            inspect,
        } => demo::run(data, store, inspect),
        Command::Credentials {
            config,
            command: CredentialsCommand::ReadAgain { admin_url },
        } => read_credentials_again(config.config.as_deref(), &admin_url, true),
        Command::Credentials {
            config,
            command: CredentialsCommand::Check { admin_url },
        } => read_credentials_again(config.config.as_deref(), &admin_url, false),
        Command::Tail {
            config,
            admin_url,
            json,
            nonce,
            client,
            outcome,
            endpoint,
            recent,
            count,
        } => tail(
            config.config.as_deref(),
            &admin_url,
            &payhook::admin::TailOptions {
                filter: payhook::inspector::DeliveryFilter {
                    nonce,
                    client,
                    outcome,
                    endpoint,
                },
                json,
                recent,
                count,
            },
        ),
        Command::New {
            name,
            path,
            force,
            payhook_path,
            payhook_version,
            store,
        } => scaffold(name, path, force, payhook_path, payhook_version, store),
        Command::Openapi { config, shipped } => openapi(config.config.as_deref(), shipped),
        Command::Scenario(args) => {
            load_config(args.config_file()).and_then(|config| scenario::run(*args, &config))
        }
        Command::Trigger(args) => {
            load_config(args.config_file()).and_then(|config| trigger::run(*args, &config))
        }
        Command::MockGateway {
            listen,
            username,
            password,
            access_lifetime,
            refresh_lifetime,
            state,
        } => mock_gateway(payhook::sim::MockGatewayConfig {
            listen,
            username,
            password: password.into(),
            access_lifetime,
            refresh_lifetime,
            state,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message, code)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

/// Logs go to stderr, filtered by `RUST_LOG`; by default a long-running local server
/// (`mock-gateway`) tells what it serves, and the other commands only warnings, so that the
/// library's warnings (a refused signature in `trigger`, a store problem in `demo`) are seen
/// without drowning a command's own output.
fn init_logging(command: &Command) {
    let default = match command {
        Command::MockGateway { .. } => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// A client of the running service at `url`, with the configured admin token; `what`
/// (the command or option) is named when the token is missing.
fn admin_client(
    config: &Config,
    url: &str,
    what: &str,
) -> Result<payhook::admin::AdminClient, Failure> {
    let token = config.admin.token.clone().ok_or_else(|| {
        Failure(
            format!(
                "{what} needs the service's admin token: set PAYHOOK_ADMIN_TOKEN (or admin.token in --config)"
            ),
            2,
        )
    })?;
    Ok(payhook::admin::AdminClient::new(url, token)?)
}

/// `payhook tail`: follows the service's deliveries until stopped (or `--count`).
fn tail(
    config: Option<&std::path::Path>,
    url: &str,
    options: &payhook::admin::TailOptions,
) -> Result<(), Failure> {
    let config = load_config(config)?;
    let client = admin_client(&config, url, "tail")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(payhook::admin::tail(
        &client,
        options,
        &mut std::io::stdout(),
    ))?;
    Ok(())
}

/// `payhook credentials read-again`: the running service reads its configuration again.
/// Each instance at `urls` in turn, every one asked whatever the others answered; several
/// are named on each line. Exit 2 when any took nothing (would take nothing, to check),
/// naming those.
fn read_credentials_again(
    config: Option<&std::path::Path>,
    urls: &[String],
    take: bool,
) -> Result<(), Failure> {
    let (done, not_taken_now, command) = if take {
        ("read again", "not taken", "credentials read-again")
    } else {
        ("would take", "would not be taken", "credentials check")
    };
    let config = load_config(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let named = |url: &str| {
        if urls.len() > 1 {
            format!("{url}: ")
        } else {
            String::new()
        }
    };
    // Every address checked before any instance is asked: one refused (plain http to
    // another machine) leaves none half-read.
    let clients = urls
        .iter()
        .map(|url| admin_client(&config, url, command).map(|client| (url, client)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut not_taken = Vec::new();
    for (url, client) in clients {
        let read = if take {
            runtime.block_on(client.read_credentials_again())
        } else {
            runtime.block_on(client.check_credentials())
        };
        match read {
            Ok(read) => {
                println!("{}{done}: {}", named(url), read.message);
                if !read.need_a_restart.is_empty() {
                    println!(
                        "{}{not_taken_now}, these differ from what the service runs with and \
                         take a restart: {}",
                        named(url),
                        read.need_a_restart.join(", ")
                    );
                }
            }
            Err(error) if urls.len() > 1 => {
                eprintln!("{}{}", named(url), payhook::Report::new(&error));
                not_taken.push(url.as_str());
            }
            Err(error) => return Err(error.into()),
        }
    }
    if not_taken.is_empty() {
        Ok(())
    } else {
        Err(Failure::msg(format!(
            "nothing {}taken by {} of {} instances: {}",
            if take { "was " } else { "would be " },
            not_taken.len(),
            urls.len(),
            not_taken.join(", ")
        )))
    }
}

/// Runs an operating command with the service's configuration; the store is opened only
/// by the commands that need it.
fn admin(command: AdminCommand, service: &ServiceArgs) -> Result<(), Failure> {
    let config = load_config(service.config.config.as_deref())?;
    if let Some(url) = service.admin_url.as_deref() {
        let client = admin_client(&config, url, "--admin-url")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(command.run_remote(&config, &client, &mut std::io::stdout()))?;
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store: Option<Arc<dyn Store>> = match command {
            AdminCommand::Validations(_)
            | AdminCommand::Callbacks(_)
            | AdminCommand::Reconcile { .. } => Some(open_store(&config).await?),
            _ => None,
        };
        command
            .run(&config, store, None, &mut std::io::stdout())
            .await
            .map_err(Failure::from)
    })?;
    Ok(())
}

fn scaffold(
    name: String,
    path: Option<PathBuf>,
    force: bool,
    payhook_path: Option<PathBuf>,
    payhook_version: Option<String>,
    store: payhook::scaffold::StoreKind,
) -> Result<(), Failure> {
    use payhook::scaffold::{Dependency, Options, render};
    let payhook = match (payhook_path, payhook_version) {
        (Some(path), _) => Dependency::Path(std::path::absolute(&path)?),
        (None, Some(version)) => Dependency::Version(version),
        (None, None) => default_dependency(),
    };
    let dir = path.unwrap_or_else(|| PathBuf::from(&name));
    let payhook_dependency = payhook.clone();
    let written = render(&Options {
        name: name.clone(),
        dir: dir.clone(),
        force,
        payhook,
        store,
    })?;
    println!(
        "created {name} in {} ({} files), depending on payhook {}",
        dir.display(),
        written.len(),
        match &payhook_dependency {
            payhook::scaffold::Dependency::Path(path) => format!("at {}", path.display()),
            payhook::scaffold::Dependency::Version(version) => format!("{version} (crates.io)"),
        }
    );
    println!(
        "next:
  cd {}
  cargo test     # the service and its scenario
  cargo run      # serve on 127.0.0.1:8080",
        dir.display()
    );
    Ok(())
}

/// What a scaffolded crate depends on when not told: the checkout this binary was built
/// from (`cargo install --path .`), while it is there; a binary installed from crates.io was
/// built in cargo's registry cache, which cargo empties, so it depends on its own published
/// version instead.
fn default_dependency() -> payhook::scaffold::Dependency {
    use payhook::scaffold::Dependency;
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let in_registry = source
        .components()
        .any(|part| part.as_os_str() == "registry");
    if !in_registry && source.join("Cargo.toml").exists() {
        Dependency::Path(source)
    } else {
        Dependency::Version(env!("CARGO_PKG_VERSION").to_owned())
    }
}

/// The configuration from `file`, or the file named by `PAYHOOK_CONFIG`, plus `PAYHOOK_*`.
fn load_config(file: Option<&Path>) -> Result<Config, Failure> {
    let file = file
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(payhook::config::CONFIG_FILE_VAR).map(PathBuf::from));
    Ok(Config::load(
        file.as_deref(),
        payhook::config::environment()?,
    )?)
}

async fn open_store(config: &Config) -> Result<Arc<dyn Store>, Failure> {
    let store = payhook::store::ConfiguredStore::open_existing(&config.store, &[]).await;
    store.map(|store| store.shared()).map_err(|error| {
        let path = config.store.path.display();
        if config.store.is_postgres() {
            Failure(
                format!(
                    "store in schema {}: {}",
                    config.store.schema,
                    payhook::Report::new(&error)
                ),
                2,
            )
        } else if error.to_string().contains("in use") {
            Failure(
                format!(
                    "the store at {path} is in use, probably by the running service: stop it, \
                     or give --admin-url to work through the running service"
                ),
                2,
            )
        } else {
            Failure(
                format!("store at {path}: {}", payhook::Report::new(&error)),
                2,
            )
        }
    })
}

fn store_command(command: StoreCommand, file: Option<&Path>) -> Result<(), Failure> {
    let mut store = load_config(file)?.store;
    if let StoreCommand::Check { data: Some(data) }
    | StoreCommand::AcceptLoss { data: Some(data) }
    | StoreCommand::CopyFromSled {
        data: Some(data), ..
    } = &command
    {
        store.path.clone_from(data);
    }
    let failure = |error: payhook::store::StoreError| match error {
        payhook::store::StoreError::Integrity(_) => Failure::report(&error, 1),
        other => Failure::report(&other, 2),
    };
    match command {
        StoreCommand::Check { .. } => {
            println!("{}", SledStore::check(&store).map_err(failure)?);
            if let Some(said) = SledStore::moved(&store).map_err(failure)? {
                println!(
                    "it is not served: {} says it was {said} (a sled instance refuses to open it)",
                    store.path.join(payhook::store::MOVED_FILE_NAME).display(),
                );
            }
        }
        StoreCommand::AcceptLoss { .. } => match SledStore::accept_loss(&store).map_err(failure)? {
            None => println!(
                "the store at {} is sound: nothing to accept, nothing changed",
                store.path.display()
            ),
            Some(given_up) => println!(
                "accepted, and recorded in {}: the service may start on what the store holds.\n\
                 given up: {given_up}",
                store.path.join("payhook.audit.log").display()
            ),
        },
        StoreCommand::Migrate => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let applied = runtime
                .block_on(payhook::store::PgStore::migrate(&store))
                .map_err(failure)?;
            println!(
                "schema {} is at version {}{}",
                store.schema,
                payhook::store::PgStore::schema_version(),
                if applied.is_empty() {
                    " (nothing to do)".to_owned()
                } else {
                    format!(" (applied {applied:?})")
                }
            );
        }
        StoreCommand::CopyFromSled { again, .. } => {
            if !store.is_postgres() {
                return Err(Failure(
                    "copy-from-sled needs the PostgreSQL database: set store.url (PAYHOOK_STORE_URL)"
                        .into(),
                    2,
                ));
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let imported = runtime
                .block_on(async {
                    let target = payhook::store::PgStore::open_for_copy(&store).await?;
                    if again {
                        target.import_sled_again(&store).await
                    } else {
                        target.import_sled(&store).await
                    }
                })
                .map_err(failure)?;
            println!("{imported}");
        }
    }
    Ok(())
}

fn mock_gateway(config: payhook::sim::MockGatewayConfig) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mock = payhook::sim::MockGateway::start(config).await?;
        println!("mock gateway listening on {}", mock.url());
        payhook::shutdown_signal().await;
        mock.stop().await;
        Ok(())
    })
}

/// Prints the OpenAPI document: as the configuration read from `file` (or `PAYHOOK_CONFIG`)
/// and `PAYHOOK_*` serves it, or as shipped.
fn openapi(file: Option<&Path>, shipped: bool) -> Result<(), Failure> {
    if shipped {
        println!("{}", payhook::server::OPENAPI);
    } else {
        let doc = payhook::server::openapi(&load_config(file)?);
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    }
    Ok(())
}

fn check_config(file: &Path) -> Result<(), Failure> {
    let config = Config::load(Some(file), payhook::config::environment()?)?;
    if let Err(error) = config.admin.check_as_served() {
        // An operator's shell holds their own token there, as `payhook operator-token`
        // tells them: what it is checked against is the service's environment, not this one.
        if std::env::var_os("PAYHOOK_ADMIN_TOKEN").is_none() {
            return Err(error.into());
        }
        eprintln!(
            "warning: a service would not start with this configuration and this \
             environment: {error}; PAYHOOK_ADMIN_TOKEN is set here — if it is your own \
             operator token, run this without it to check the service's settings"
        );
    }
    if !config.signature.keys.is_empty() {
        Verifier::from_config(&config.signature)?;
    } else if !config.callback.allow_unsigned {
        // Not an error here: a service may receive no callbacks. One that does refuses to
        // start, and this says so before a deployment does.
        eprintln!(
            "warning: a service that receives callbacks would not start with this \
             configuration: {}",
            payhook::server::BuildError::UnsignedCallbacks
        );
    }
    // The gateway's client as the service builds it: its CA file, client certificate and
    // proxy are read now, not at start-up.
    if config.gateway.is_complete() {
        payhook::gateway::GatewayClient::new(&config.gateway)?;
    }
    let text = format!(
        "# {}: ok; the effective settings, secrets redacted:\n{}",
        file.display(),
        config.to_toml_redacted()?
    );
    print_quietly(&text)
}

/// Prints `text` on stdout; a reader that went away (`payhook check-config | head`) ends
/// the command quietly and successfully instead of a panic.
fn print_quietly(text: &str) -> Result<(), Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
}

fn keygen(algorithm: Algorithm, out: &Path, force: bool) -> Result<(), Failure> {
    let private = out.join("private.pem");
    let public = out.join("public.pem");
    if !force && (private.exists() || public.exists()) {
        return Err(Failure(
            format!(
                "{} already holds a key pair; pass --force to replace it",
                out.display()
            ),
            2,
        ));
    }
    let pair = generate_key_pair(algorithm)?;
    std::fs::create_dir_all(out)?;
    write_private(&private, &pair.private_pem)?;
    std::fs::write(&public, &pair.public_pem)?;
    println!(
        "{algorithm} key pair written:\n  private (PKCS#8, keep secret): {}\n  public  (SPKI): {}",
        private.display(),
        public.display()
    );
    Ok(())
}

/// `payhook operator-token NAME`: a new token for the operator, and its configuration entry.
fn operator_token(name: &str) -> Result<(), Failure> {
    let made = payhook::server::OperatorToken::generate()
        .ok_or_else(|| Failure("the system gave no random bytes for a token".into(), 1))?;
    let entry = made
        .entry(name)
        .map_err(|error| Failure(format!("{error}"), 2))?;
    println!(
        "# The token, for {who} alone (PAYHOOK_ADMIN_TOKEN where they run payhook, or the \
         inspector's form); shown once, kept nowhere:\n{token}\n\
         # The entry that lets it in, for the service's [admin.operators] (its SHA-256, not \
         the token):\n{entry}",
        who = payhook::Escaped(name),
        token = made.token().expose(),
    );
    Ok(())
}

/// Writes a private key readable by its owner only: a file it replaces (`--force`) is made
/// so before the key is written, whatever its mode was.
fn write_private(path: &Path, pem: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::io::Write::write_all(&mut file, pem.as_bytes())
}

fn stdin_bytes() -> Result<Vec<u8>, Failure> {
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body)?;
    Ok(body)
}

fn sign(key: &Path, algorithm: Algorithm, encoding: Encoding, prefix: &str) -> Result<(), Failure> {
    let key = SigningKey::from_pkcs8(
        &std::fs::read(key).map_err(|e| Failure::msg(format!("{}: {e}", key.display())))?,
        algorithm,
    )?;
    println!(
        "{}",
        key.header_value(&stdin_bytes()?, encoding, Some(prefix))?
    );
    Ok(())
}

fn read_keys(path: &Path) -> Result<Vec<PublicKey>, Failure> {
    let bytes =
        std::fs::read(path).map_err(|e| Failure::msg(format!("{}: {e}", path.display())))?;
    PublicKey::parse(&bytes).map_err(|e| Failure(format!("{}: {e}", path.display()), 2))
}

fn verify(
    key: &Path,
    algorithm: Algorithm,
    signature: &str,
    encoding: Encoding,
    prefix: &str,
) -> Result<(), Failure> {
    let mut verifier = Verifier::new(payhook::signature::DEFAULT_HEADER, encoding, Some(prefix))?;
    for public in read_keys(key)? {
        verifier = verifier.with_key(public, algorithm)?;
    }
    let mut headers = http::HeaderMap::new();
    let value = http::HeaderValue::from_str(signature)
        .map_err(|_| Failure("malformed signature: not a valid header value".into(), 1))?;
    headers.insert(verifier.header().clone(), value);
    match verifier.verify(&headers, &stdin_bytes()?) {
        Ok(key_id) => {
            println!(
                "ok: {algorithm} signature verifies (key {})",
                key_id.unwrap_or("without id")
            );
            Ok(())
        }
        Err(error) => Err(Failure::report(&error, 1)),
    }
}

fn sniff_request(
    keys: &[PathBuf],
    request: Option<&Path>,
    body: Option<&Path>,
    headers: &[String],
) -> Result<(), Failure> {
    let mut public = Vec::new();
    for path in keys {
        public.extend(read_keys(path)?);
    }
    let (headers, body) = match (request, body) {
        (Some(request), _) => {
            let captured = parse_raw_request(&std::fs::read(request)?)?;
            (captured.headers, captured.body)
        }
        (None, Some(body)) => {
            let headers = headers
                .iter()
                .map(|h| {
                    h.split_once(':')
                        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Failure::msg("--header takes `Name: value`"))?;
            (headers, std::fs::read(body)?)
        }
        (None, None) => {
            return Err(Failure(
                "give --request FILE, or --body FILE with --header".into(),
                2,
            ));
        }
    };
    let found = sniff(&public, &headers, &body);
    if found.is_empty() {
        let tried = headers
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Failure(
            format!(
                "no header × prefix × encoding × algorithm verifies with the given key(s) over the {} body bytes \
                 (headers tried: {tried}); check that the key is the aggregator's and the body is byte-exact",
                body.len()
            ),
            1,
        ));
    }
    for m in &found {
        println!(
            "verifies: header {}, prefix {:?}, encoding {}, algorithm {}, key {}",
            m.header,
            m.prefix,
            m.encoding,
            m.algorithm,
            m.key_id.as_deref().unwrap_or("without id")
        );
    }
    println!("\nconfiguration:\n{}", found[0].config_snippet());
    Ok(())
}
