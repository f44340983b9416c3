//! The `payhook` command line tells a newcomer what to do: options exist only where they mean
//! something, every help page has an example, enumerated options list their values, and an
//! error names the fix.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Output};

fn payhook(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(args)
        .env_remove("PAYHOOK_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every subcommand's name, from the top-level help.
fn subcommands() -> Vec<String> {
    let help = text(&payhook(&["--help"]).stdout);
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn options_that_mean_nothing_to_a_command_are_refused() {
    for args in [
        &["demo", "--config", "nope.toml"][..],
        &["openapi", "--admin-url", "http://127.0.0.1:8080"],
        &[
            "keygen",
            "--alg",
            "ed25519",
            "--out",
            "x",
            "--config",
            "nope.toml",
        ],
    ] {
        let output = payhook(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            text(&output.stderr).contains("unexpected argument"),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
    // --expect judges one request's answer; with --settings or --fault it would be
    // silently ignored (a delivery judged by its own verdict, exit 1 for another reason).
    for other in [&["--settings", "s.json"][..], &["--fault", "duplicate"]] {
        let mut args = vec![
            "trigger",
            "callback",
            "--to",
            "http://127.0.0.1:1",
            "--expect",
            "401",
        ];
        if other[0] == "--settings" {
            args.retain(|a| *a != "--to" && *a != "http://127.0.0.1:1");
        }
        args.extend_from_slice(other);
        let output = payhook(&args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            text(&output.stderr).contains("cannot be used with"),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
    // Where they mean something, they are taken after the subcommand too.
    let output = payhook(&["validations", "list", "--help"]);
    let help = text(&output.stdout);
    assert!(
        help.contains("--admin-url") && help.contains("--config"),
        "{help}"
    );
}

#[test]
fn every_help_page_shows_an_example() {
    let commands = subcommands();
    assert!(commands.len() >= 15, "{commands:?}");
    for command in commands {
        let help = text(&payhook(&[&command, "--help"]).stdout);
        assert!(
            help.contains("Example"),
            "payhook {command} --help:\n{help}"
        );
    }
}

#[test]
fn enumerated_options_list_their_values_and_say_what_they_are() {
    let help = text(&payhook(&["sign", "--help"]).stdout);
    for expected in [
        "ed25519",
        "rsa-pss-sha256",
        "base64url-nopad",
        "hex",
        "How the signature is written",
        "Text put before the signature",
    ] {
        assert!(help.contains(expected), "missing {expected:?} in:\n{help}");
    }
}

#[test]
fn a_decision_names_both_choices_when_missing() {
    let output = payhook(&["validations", "resolve", "42"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--allow") && stderr.contains("--deny"),
        "{stderr}"
    );
}

#[test]
fn a_url_without_its_scheme_is_told_how_to_write_it() {
    let output = payhook(&["trigger", "callback", "--to", "localhost:8080"]);
    assert_ne!(output.status.code(), Some(0));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("http://localhost:8080"), "{stderr}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let output = payhook(&["completions", shell]);
        assert!(output.status.success(), "{shell}");
        let script = text(&output.stdout);
        assert!(
            script.contains("payhook") && script.contains("validations"),
            "{shell}: {script}"
        );
    }
}
