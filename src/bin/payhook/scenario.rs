//! `payhook scenario FILE...`: run scenario files against a running merchant and a running
//! mock gateway (`payhook mock-gateway`).

use clap::Args;
use payhook::Config;
use payhook::HandlerError;
use payhook::sim::scenario::{Observed, Observer, Reconciler, Reconciliation, Scenario, Target};
use std::{path::PathBuf, sync::Arc, time::Duration};

use crate::Failure;
use crate::trigger::SigningArgs;

/// `payhook scenario FILE... --to URL --gateway URL`
#[derive(Debug, Clone, Args)]
pub(crate) struct ScenarioArgs {
    /// Scenario files (TOML); see `scenarios/` for the shipped ones.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The merchant's base URL; the endpoints' default paths are appended.
    #[arg(long)]
    to: String,
    /// The mock gateway's URL (the merchant's `[gateway]` must point at it too).
    #[arg(long)]
    gateway: String,
    /// The merchant user of the mock gateway.
    #[arg(long, default_value = payhook::sim::DEFAULT_USERNAME)]
    gateway_username: String,
    /// Its password (or PAYHOOK_MOCK_PASSWORD).
    #[arg(
        long,
        env = "PAYHOOK_MOCK_PASSWORD",
        default_value = payhook::sim::DEFAULT_PASSWORD,
        hide_env_values = true
    )]
    gateway_password: String,
    #[command(flatten)]
    signing: SigningArgs,
    /// The merchant's reconcile for `reconcile` steps, run with `sh -c`; `{reference_id}` is
    /// replaced, e.g. `cargo run --example merchant -- reconcile --ref {reference_id}`; it
    /// prints what `payhook::admin` prints: `booked now`, `already acknowledged`, or `not
    /// final` (the transaction is still in progress).
    #[arg(long)]
    reconcile_command: Option<String>,
    /// How long to wait for a posted validation result.
    #[arg(long, default_value = "30s", value_parser = payhook::config::parse_duration)]
    await_timeout: Duration,
    /// How `bookings` and `moved` expectations read the merchant's books: a command run
    /// with `sh -c` that prints how many results of the transaction are booked and then,
    /// for `moved`, how it moved the client's balance, signed (`1 -40.00`; `{nonce}` is
    /// replaced, and the nonce is also in PAYHOOK_MOCK_NONCE), e.g. `psql -AtF ' ' -c
    /// "SELECT count(*), coalesce(sum(moved), 0) FROM ledger WHERE nonce =
    /// '$PAYHOOK_MOCK_NONCE'"`. Without it they cannot be checked.
    #[arg(long)]
    bookings_command: Option<String>,
    /// Exit 0 although some expectations could not be checked (`bookings` or `moved`
    /// without --bookings-command); otherwise that run exits 3.
    #[arg(long)]
    allow_unchecked: bool,
    /// Exit 0 from a run without --key (every request unsigned); otherwise that run exits 3:
    /// it passes exactly the merchant that does not check signatures.
    #[arg(long)]
    allow_unsigned: bool,
    /// How long --reconcile-command and --bookings-command may run before they are stopped
    /// (the step then fails, or its books are said not read): a command that hangs would
    /// hang the run, and a merchant's CI with it.
    #[arg(long, default_value = "10m", value_parser = payhook::config::parse_duration)]
    command_timeout: Duration,
}

impl ScenarioArgs {
    /// The configuration file given with --config, if any.
    pub(crate) fn config_file(&self) -> Option<&std::path::Path> {
        self.signing.config_file()
    }
}

pub(crate) fn run(args: ScenarioArgs, config: &Config) -> Result<(), Failure> {
    let scenarios = args
        .files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file)
                .map_err(|e| Failure::msg(format!("{}: {e}", file.display())))?;
            Ok(Scenario::parse(&text, &file.display().to_string())?)
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let gateway = payhook::config::GatewayConfig {
            auth_url: Some(args.gateway.clone()),
            gateway_url: Some(args.gateway.clone()),
            username: Some(args.gateway_username.clone()),
            password: Some(args.gateway_password.clone().into()),
            ..Default::default()
        };
        let target = Target {
            base_url: args.to.clone(),
            paths: config.paths.clone(),
            trigger: args.signing.trigger(config)?,
            gateway,
            await_timeout: args.await_timeout,
            reconciler: (args.reconcile_command.clone())
                .map(|command| command_reconciler(command, args.command_timeout)),
            observer: (args.bookings_command.clone())
                .map(|command| command_observer(command, args.command_timeout)),
        };
        let unsigned = target.trigger.signer().is_none();
        if unsigned {
            eprintln!(
                "payhook scenario: no --key, so every request goes out unsigned: this run \
                 says nothing of the merchant's signature checks (a merchant that checks \
                 them refuses every callback; `payhook trigger --fault tamper-body` tries them)"
            );
        }
        let (mut failed, mut unchecked) = (0, 0);
        for scenario in &scenarios {
            let report = payhook::sim::scenario::run(scenario, &target).await?;
            println!("{}", report.render());
            if !report.passed() {
                failed += 1;
            }
            unchecked += report.unchecked();
        }
        if failed > 0 {
            return Err(Failure(
                format!("{failed} of {} scenario(s) failed", scenarios.len()),
                1,
            ));
        }
        if unchecked > 0 && !args.allow_unchecked {
            // Not a pass: a receiver that books every copy of a callback meets every
            // other expectation of the shipped scenarios.
            return Err(Failure(
                format!(
                    "no expectation failed, but {unchecked} could not be checked (see \
                     \"not checked\" above): give --bookings-command to read the merchant's \
                     books, or --allow-unchecked to accept the run without them"
                ),
                3,
            ));
        }
        if unsigned && !args.allow_unsigned {
            // Not a pass: unsigned, the run passes exactly the merchant that books forged
            // callbacks.
            return Err(Failure(
                "no expectation failed, but every request went out unsigned (no --key): a \
                 merchant that does not check signatures passes such a run; give --key (the \
                 key the merchant's [signature] verifies), or --allow-unsigned to accept the \
                 run without it"
                    .into(),
                3,
            ));
        }
        if unchecked > 0 {
            println!(
                "all {} scenario(s) passed, {unchecked} expectation(s) not checked \
                 (--allow-unchecked)",
                scenarios.len()
            );
        } else {
            println!("all {} scenario(s) passed", scenarios.len());
        }
        Ok(())
    })
}

/// What the merchant's books hold for a nonce, as `command` prints it on the last line of
/// its output: the count of the transaction's results booked, then, optionally, how it moved
/// the client's balance, signed (`1 -40.00`). A command that fails, or prints no count,
/// checks nothing (the expectation is said not checked, with why); one that prints no amount
/// checks no `moved`.
fn command_observer(command: String, within: Duration) -> Observer {
    Arc::new(move |nonce: String| {
        let command = command.clone();
        Box::pin(async move {
            // Written into a shell command only when it needs no quoting (the simulator's
            // nonces do not); PAYHOOK_MOCK_NONCE carries any nonce.
            let plain = nonce
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
            if command.contains("{nonce}") && !plain {
                return Some(unobserved(format!(
                    "the nonce {nonce:?} is not written into a shell command: use \
                     $PAYHOOK_MOCK_NONCE in --bookings-command"
                )));
            }
            let line = command.replace("{nonce}", &nonce);
            let output = match shell(line, Some(("PAYHOOK_MOCK_NONCE", nonce)), within).await {
                Ok(output) => output,
                Err(error) => return Some(unobserved(format!("the bookings command: {error}"))),
            };
            let stdout = String::from_utf8_lossy(&output.stdout);
            let printed = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty());
            match printed.and_then(count_and_moved) {
                Some((count, moved)) if output.status.success() => Some(Observed {
                    summary: match moved {
                        Some(moved) => format!(
                            "{count} result(s) booked, the balance moved by {moved} (the bookings command)"
                        ),
                        None => format!("{count} result(s) booked (the bookings command)"),
                    },
                    bookings: Some(count),
                    moved,
                }),
                _ => Some(unobserved(format!(
                    "the bookings command did not print a count, and perhaps an amount ({}): {}",
                    output.status,
                    printed_by(&output)
                ))),
            }
        })
    })
}

/// A bookings command's line: a count, then perhaps a signed amount (`1`, `1 -40.00`);
/// `None` for anything else.
fn count_and_moved(line: &str) -> Option<(u32, Option<rust_decimal::Decimal>)> {
    let mut words = line.split_whitespace();
    let count = words.next()?.parse().ok()?;
    let moved = match words.next() {
        Some(amount) => Some(amount.parse().ok()?),
        None => None,
    };
    words.next().is_none().then_some((count, moved))
}

/// Runs `line` with `sh -c`, with `env` set; stopped (the shell killed) when it has not
/// ended `within`.
async fn shell(
    line: String,
    env: Option<(&'static str, String)>,
    within: Duration,
) -> Result<std::process::Output, String> {
    let mut command = tokio::process::Command::new("sh");
    command.arg("-c").arg(&line).kill_on_drop(true);
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    match tokio::time::timeout(within, command.output()).await {
        Ok(output) => output.map_err(|error| error.to_string()),
        Err(_) => Err(format!(
            "it did not end within {} (--command-timeout), and was stopped",
            payhook::config::format_duration(within)
        )),
    }
}

/// What a command printed, its output then its errors, each trimmed.
fn printed_by(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    )
}

/// What the books are said to hold when they could not be read: nothing to check against.
fn unobserved(why: String) -> Observed {
    Observed {
        summary: why,
        bookings: None,
        moved: None,
    }
}

/// A reconcile that runs the merchant's command and reads its report line.
fn command_reconciler(command: String, within: Duration) -> Reconciler {
    Arc::new(move |reference_id| {
        let command = command.replace("{reference_id}", &reference_id.to_string());
        Box::pin(async move {
            let output = shell(command, None, within)
                .await
                .map_err(|why| HandlerError::msg(format!("the reconcile command: {why}")))?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            // What it printed counts only when it ended well: a command that printed
            // "booked now" and then failed (its commit, say) booked nothing for sure.
            if !output.status.success() {
                return Err(HandlerError::msg(format!(
                    "the reconcile command failed ({}): {}",
                    output.status,
                    printed_by(&output)
                )));
            }
            if stdout.contains("booked now") {
                Ok(Reconciliation::BookedNow)
            } else if stdout.contains("already acknowledged") {
                Ok(Reconciliation::AlreadyBooked)
            } else if stdout.contains("not final") {
                Ok(Reconciliation::InProgress)
            } else {
                Err(HandlerError::msg(format!(
                    "the reconcile command said: {}",
                    printed_by(&output)
                )))
            }
        })
    })
}
