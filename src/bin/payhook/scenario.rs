//! `payhook scenario FILE...`: run scenario files against a running merchant and a running
//! mock gateway (`payhook mock-gateway`).

use clap::Args;
use payhook::Config;
use payhook::HandlerError;
use payhook::sim::scenario::{Reconciler, Scenario, Target};
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
    /// replaced, e.g. `cargo run --example merchant -- reconcile --ref {reference_id}`.
    #[arg(long)]
    reconcile_command: Option<String>,
    /// How long to wait for a posted validation result.
    #[arg(long, default_value = "30s", value_parser = payhook::config::parse_duration)]
    await_timeout: Duration,
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
            reconciler: args.reconcile_command.clone().map(command_reconciler),
            observer: None,
        };
        let mut failed = 0;
        for scenario in &scenarios {
            let report = payhook::sim::scenario::run(scenario, &target).await?;
            println!("{}", report.render());
            if !report.passed() {
                failed += 1;
            }
        }
        if failed > 0 {
            return Err(Failure(
                format!("{failed} of {} scenario(s) failed", scenarios.len()),
                1,
            ));
        }
        println!("all {} scenario(s) passed", scenarios.len());
        Ok(())
    })
}

/// A reconcile that runs the merchant's command and reads its report line.
fn command_reconciler(command: String) -> Reconciler {
    Arc::new(move |reference_id| {
        let command = command.replace("{reference_id}", &reference_id.to_string());
        Box::pin(async move {
            let output = tokio::task::spawn_blocking(move || {
                std::process::Command::new("sh")
                    .arg("-c")
                    .arg(&command)
                    .output()
            })
            .await
            .map_err(HandlerError::from)?
            .map_err(HandlerError::from)?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            // What it printed counts only when it ended well: a command that printed
            // "booked now" and then failed (its commit, say) booked nothing for sure.
            if !output.status.success() {
                return Err(HandlerError::msg(format!(
                    "the reconcile command failed ({}): {}{}",
                    output.status,
                    stdout.trim(),
                    String::from_utf8_lossy(&output.stderr).trim()
                )));
            }
            if stdout.contains("booked now") {
                Ok(true)
            } else if stdout.contains("already booked") {
                Ok(false)
            } else {
                Err(HandlerError::msg(format!(
                    "the reconcile command said: {}{}",
                    stdout.trim(),
                    String::from_utf8_lossy(&output.stderr).trim()
                )))
            }
        })
    })
}
