//! The `payhook` binary: help, version, and `check-config`.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Output};

fn payhook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(args)
        .env_remove("PAYHOOK_CONFIG")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_lists_the_commands() {
    let output = payhook(&["--help"]);
    assert!(output.status.success());
    assert!(
        stdout(&output).contains("check-config"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn version_prints_the_crate_version() {
    let output = payhook(&["--version"]);
    assert!(output.status.success());
    assert_eq!(
        stdout(&output).trim(),
        format!("payhook {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn check_config_accepts_a_valid_file_and_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(
        &file,
        "[server]\nbody_limit = 65536\n[gateway]\nusername = \"shop\"\npassword = \"hunter2\"\n",
    )
    .unwrap();
    let output = payhook(&["check-config", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    assert!(
        printed.contains(": ok") && printed.contains("65536"),
        "{printed}"
    );
    assert!(
        !printed.contains("hunter2"),
        "the password leaked: {printed}"
    );
}

#[test]
fn check_config_names_the_bad_key_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(&file, "[paths]\ncallback = \"no-slash\"\n").unwrap();
    let output = payhook(&["check-config", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("paths.callback"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn check_config_reports_a_missing_file() {
    let output = payhook(&["check-config", "/nonexistent/payhook.toml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("cannot read /nonexistent/payhook.toml"),
        "{}",
        stderr(&output)
    );
}
