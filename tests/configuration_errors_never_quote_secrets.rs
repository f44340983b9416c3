//! No secret in any configuration error, ever: a TOML syntax error is told by its line and
//! column, not by quoting the line (it may hold a password); a secret of the wrong type is
//! named by its key, not its value; and a secret `PAYHOOK_*` variable is taken as it is —
//! never parsed as TOML, so never echoed in a parse error.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::process::{Command, Output};

const SECRET: &str = "s3cret-hunter2-do-not-print";

fn check_config(file: &std::path::Path, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_payhook"))
        .arg("check-config")
        .arg(file)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn all_output(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_syntax_error_on_a_password_line_names_the_line_but_does_not_quote_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(
        &file,
        format!("[gateway]\nusername = \"shop\"\npassword = \"{SECRET}\n"),
    )
    .unwrap();
    let output = check_config(&file, &[]);
    let text = all_output(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("line 3"), "the position is told: {text}");
    assert!(!text.contains(SECRET), "the password leaked: {text}");
    assert!(
        !text.contains("s3cret"),
        "part of the password leaked: {text}"
    );
}

#[test]
fn a_secret_of_the_wrong_type_is_named_by_its_key_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    for (section, key) in [
        ("[admin]", "token"),
        ("[gateway]", "password"),
        ("[auth.transaction_validation]", "secret"),
        ("[auth.providers_validation]", "password"),
    ] {
        std::fs::write(&file, format!("{section}\n{key} = 98765432123456789\n")).unwrap();
        let output = check_config(&file, &[]);
        let text = all_output(&output);
        assert_eq!(output.status.code(), Some(2), "{text}");
        assert!(text.contains(key), "the key is named: {text}");
        assert!(
            !text.contains("98765432123456789"),
            "the secret leaked: {text}"
        );
    }
}

#[test]
fn a_secret_variable_that_looks_like_toml_is_taken_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(&file, "[server]\nbody_limit = 65536\n").unwrap();
    for name in [
        "PAYHOOK_GATEWAY_PASSWORD",
        "PAYHOOK_ADMIN_TOKEN",
        "PAYHOOK_AUTH_TRANSACTION_VALIDATION_SECRET",
        "PAYHOOK_AUTH_PROVIDERS_VALIDATION_PASSWORD",
    ] {
        let value = format!("{{[{SECRET}");
        // An endpoint's credential is taken only with the method that uses it.
        let method: &[(&str, &str)] = match name {
            "PAYHOOK_AUTH_TRANSACTION_VALIDATION_SECRET" => &[(
                "PAYHOOK_AUTH_TRANSACTION_VALIDATION_METHOD",
                "shared_secret",
            )],
            "PAYHOOK_AUTH_PROVIDERS_VALIDATION_PASSWORD" => &[
                ("PAYHOOK_AUTH_PROVIDERS_VALIDATION_METHOD", "basic"),
                ("PAYHOOK_AUTH_PROVIDERS_VALIDATION_USERNAME", "aggregator"),
            ],
            _ => &[],
        };
        let mut variables = vec![(name, value.as_str())];
        variables.extend_from_slice(method);
        let output = check_config(&file, &variables);
        let text = all_output(&output);
        assert!(output.status.success(), "{name}: {text}");
        assert!(!text.contains("s3cret"), "{name} leaked: {text}");

        let config = payhook::Config::load(
            Some(&file),
            variables
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let secret = match name {
            "PAYHOOK_GATEWAY_PASSWORD" => config.gateway.password,
            "PAYHOOK_ADMIN_TOKEN" => config.admin.token,
            "PAYHOOK_AUTH_TRANSACTION_VALIDATION_SECRET" => {
                config.auth.transaction_validation.secret
            }
            _ => config.auth.providers_validation.password,
        };
        assert_eq!(
            secret.unwrap().expose(),
            value,
            "{name} is the text, byte for byte"
        );
    }
}

#[test]
fn a_refused_secret_variable_is_not_echoed_at_start_up() {
    // Too short for an admin token, and shaped like a broken TOML array.
    let output = support::run_example_to_exit(
        &[
            ("PAYHOOK_ADMIN_TOKEN", "[s3cret".to_owned()),
            ("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".to_owned()),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("admin.token"), "the key is named: {stderr}");
    assert!(!stderr.contains("s3cret"), "the token leaked: {stderr}");
}
