//! The `payhook` command line: a thin layer over the library.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use payhook::Config;

/// payhook: host and test the endpoints a payment aggregator calls.
#[derive(Debug, Parser)]
#[command(name = "payhook", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load a configuration file (plus PAYHOOK_* environment variables), validate it, and
    /// print the effective settings with secrets redacted.
    CheckConfig {
        /// The TOML configuration file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
    }
}

#[allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "the CLI's output"
)]
fn check_config(file: &std::path::Path) -> ExitCode {
    match Config::load(Some(file), std::env::vars()) {
        Ok(config) => {
            println!("{}: ok\n{config:#?}", file.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}
