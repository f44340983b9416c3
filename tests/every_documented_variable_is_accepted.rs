//! Every `PAYHOOK_*` variable the README documents works: set to a valid value, the
//! configuration loader accepts it (none "names no setting"), and the commands that read the
//! configuration start with it exported — including the simulator's `PAYHOOK_MOCK_PASSWORD`.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeSet;
use std::process::Command;

/// Every variable named in the README: `PAYHOOK_…` tokens, with `<ENDPOINT>` spelled out for
/// both endpoints, and the shorthand of a table cell (`PAYHOOK_GATEWAY_AUTH_HEADER`,
/// `_AUTH_SCHEME`) completed from the full name before it.
fn documented_variables() -> BTreeSet<String> {
    let readme = include_str!("../README.md");
    let mut names = BTreeSet::new();
    for line in readme.lines() {
        let mut last_full: Option<String> = None;
        for token in line.split('`').skip(1).step_by(2) {
            let token = token.split(['=', ' ']).next().unwrap_or_default();
            let name = if token.starts_with("PAYHOOK_") {
                token.to_owned()
            } else if token.starts_with('_')
                && token[1..]
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
            {
                // `_AUTH_SCHEME` after `PAYHOOK_GATEWAY_AUTH_HEADER`: replace as many parts.
                let Some(full) = &last_full else { continue };
                let parts: Vec<&str> = full.split('_').collect();
                let replaced = token[1..].split('_').count();
                format!("{}{token}", parts[..parts.len() - replaced].join("_"))
            } else {
                continue;
            };
            let valid = name.len() > "PAYHOOK_".len()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c == '<' || c == '>');
            if !valid || name.ends_with('_') {
                continue;
            }
            last_full = Some(name.clone());
            for endpoint in ["PROVIDERS_VALIDATION", "TRANSACTION_VALIDATION"] {
                names.insert(name.replace("<ENDPOINT>", endpoint));
            }
        }
    }
    names
}

/// A valid value for `name`, each valid on its own and all together.
fn valid_value(name: &str, dir: &std::path::Path) -> String {
    let suffix = |s: &str| name.ends_with(s);
    let key = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/signatures/ed25519/public.pem");
    match name {
        "PAYHOOK_CONFIG" => dir.join("payhook.toml").display().to_string(),
        "PAYHOOK_SERVER_LISTEN" => "127.0.0.1:0".into(),
        "PAYHOOK_SERVER_MAX_IDENTIFIER_CHARS" => "512".into(),
        "PAYHOOK_SIGNATURE_ALGORITHM" => "ed25519".into(),
        "PAYHOOK_SIGNATURE_ENCODING" => "base64url".into(),
        "PAYHOOK_SIGNATURE_PREFIX" => "sig=".into(),
        // Not a shared secret's header (its value is shown).
        "PAYHOOK_SIGNATURE_HEADER" => "X-Test-Signature".into(),
        "PAYHOOK_SIGNATURE_KEYS" => format!("[{{id = \"k1\", file = \"{}\"}}]", key.display()),
        "PAYHOOK_STORE_PATH" => dir.join("data").display().to_string(),
        // Nothing here connects: the commands below do not open the store.
        "PAYHOOK_STORE_URL" => "postgres://payhook@127.0.0.1:1/payments".into(),
        "PAYHOOK_STORE_SCHEMA" => "payhook_test".into(),
        "PAYHOOK_STORE_POOL_SIZE" => "4".into(),
        "PAYHOOK_VALIDATION_AWAITABLE" => "false".into(),
        "PAYHOOK_VALIDATION_ALLOW_UNAUTHENTICATED" => "true".into(),
        "PAYHOOK_VALIDATION_DEADLINE_OUTCOME" => "allow".into(),
        "PAYHOOK_VALIDATION_DEADLINE" => "30m".into(),
        "PAYHOOK_VALIDATION_RETRY_SCHEDULE" => r#"["1s", "10s"]"#.into(),
        "PAYHOOK_GATEWAY_AUTH_SCHEME" => "Token".into(),
        "PAYHOOK_GATEWAY_PROXY" => "http://proxy.example:3128".into(),
        "PAYHOOK_GATEWAY_NO_PROXY" => "internal.example, .corp".into(),
        "PAYHOOK_ADMIN_TOKEN" => "admin-token-0123456789".into(),
        "PAYHOOK_ADMIN_INSPECTOR_RECENT" => "2000".into(),
        // At least the body limit (1 MiB by default).
        "PAYHOOK_SERVER_BODY_MEMORY_LIMIT" => "8388608".into(),
        "PAYHOOK_CALLBACK_ALLOW_UNSIGNED" => "true".into(),
        "PAYHOOK_ADMIN_ALLOW_PLAIN_HTTP" => "false".into(),
        "PAYHOOK_MOCK_PASSWORD" => "mock-password-1".into(),
        // Set by `payhook scenario` for its --bookings-command; the loader ignores it.
        "PAYHOOK_MOCK_NONCE" => "sim-0123456789ab".into(),
        // The tools' own: the loader leaves them alone.
        "PAYHOOK_TEST_DATABASE_URL" | "PAYHOOK_BENCH_DATABASE_URL" => "not-a-setting".into(),
        _ if suffix("_URL") => "https://aggregator.example".into(),
        // A credential is taken only with a method that asks for one.
        _ if suffix("_METHOD") => "shared_secret".into(),
        _ if suffix("_HEADER") => "X-Test-Header".into(),
        _ if suffix("_ALLOW_IPS") || suffix("_PROXIES") => r#"["10.0.0.0/8"]"#.into(),
        _ if suffix("_LIMIT") => "65536".into(),
        _ if suffix("_CONNECTIONS") || suffix("_PER_ADDRESS") => "64".into(),
        _ if suffix("_RATE") => "100".into(),
        _ if suffix("_BYTES") => "1048576".into(),
        _ if suffix("_TIMEOUT")
            || suffix("_GRACE")
            || suffix("_AFTER")
            || suffix("_RETENTION")
            || suffix("_INTERVAL")
            || suffix("_EVERY")
            || suffix("_MARGIN")
            || suffix("_BUDGET") =>
        {
            "5s".into()
        }
        // An operator's entry is their token's SHA-256; the sessions' secret has a minimum.
        "PAYHOOK_ADMIN_OPERATORS" => format!(r#"{{alice = "sha256:{}"}}"#, "ab".repeat(32)),
        "PAYHOOK_ADMIN_SESSION_SECRET" => "a-secret-of-at-least-32-characters".into(),
        // A viewer is one of the operators (see `companions`).
        "PAYHOOK_ADMIN_VIEWERS" => r#"["alice"]"#.into(),
        // Read when a gateway client is built (`check-config` builds one): see
        // `gateway_files`.
        "PAYHOOK_GATEWAY_CA_FILE" => dir.join("ca.pem").display().to_string(),
        "PAYHOOK_GATEWAY_CLIENT_CERT_FILE" => dir.join("client.pem").display().to_string(),
        "PAYHOOK_GATEWAY_CLIENT_KEY_FILE" => dir.join("client-key.pem").display().to_string(),
        _ if name.starts_with("PAYHOOK_PATHS_") => format!("/test/{}", name.to_lowercase()),
        _ if suffix("_ALLOW_SHORT_SECRET") => "false".into(),
        // A validation endpoint's secret and password have at least 16 characters.
        _ if suffix("_PASSWORD") || suffix("_SECRET") => "some-text-0123456789".into(),
        _ if suffix("_USERNAME") || suffix("_DESCRIPTION") => "some-text".into(),
        _ => panic!("the test has no valid value for {name}: add one"),
    }
}

/// The files the gateway's variables name, in `dir`: a CA certificate, and a client
/// certificate with its key.
fn gateway_files(dir: &std::path::Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let client_key = rcgen::KeyPair::generate().unwrap();
    let client = rcgen::CertificateParams::new(vec!["merchant.example".to_owned()])
        .unwrap()
        .signed_by(&client_key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("client.pem"), client.pem()).unwrap();
    let key_file = dir.join("client-key.pem");
    std::fs::write(&key_file, client_key.serialize_pem()).unwrap();
    // Readable by its owner alone, as a private key should be (otherwise the commands warn).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

/// The variables a variable needs beside it to be valid alone: an endpoint's method and
/// its credential go together, and a viewer must be an operator.
fn companions(name: &str, dir: &std::path::Path) -> Vec<(String, String)> {
    if name == "PAYHOOK_ADMIN_VIEWERS" {
        let operators = "PAYHOOK_ADMIN_OPERATORS";
        return vec![(operators.to_owned(), valid_value(operators, dir))];
    }
    let Some(endpoint) = ["PROVIDERS_VALIDATION", "TRANSACTION_VALIDATION"]
        .into_iter()
        .find(|e| name.starts_with(&format!("PAYHOOK_AUTH_{e}_")))
    else {
        return Vec::new();
    };
    ["METHOD", "SECRET"]
        .into_iter()
        .map(|key| format!("PAYHOOK_AUTH_{endpoint}_{key}"))
        .filter(|companion| companion != name)
        .map(|companion| {
            let value = valid_value(&companion, dir);
            (companion, value)
        })
        .collect()
}

#[test]
fn the_readme_documents_the_variables_this_test_expects() {
    let names = documented_variables();
    for expected in [
        "PAYHOOK_SERVER_LISTEN",
        "PAYHOOK_AUTH_TRANSACTION_VALIDATION_PASSWORD",
        "PAYHOOK_GATEWAY_AUTH_SCHEME",
        "PAYHOOK_VALIDATION_DEADLINE_DESCRIPTION",
        "PAYHOOK_MOCK_PASSWORD",
        "PAYHOOK_CONFIG",
    ] {
        assert!(names.contains(expected), "{expected} in {names:#?}");
    }
    assert!(names.len() > 40, "{names:#?}");
}

#[test]
fn each_documented_variable_is_accepted_by_the_configuration_loader() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("payhook.toml"), "[server]\n").unwrap();
    let names = documented_variables();
    for name in &names {
        let value = valid_value(name, dir.path());
        let file = (name == "PAYHOOK_CONFIG").then(|| std::path::PathBuf::from(&value));
        let mut variables = vec![(name.clone(), value.clone())];
        variables.extend(companions(name, dir.path()));
        if let Err(error) = payhook::Config::load(file.as_deref(), variables) {
            panic!("{name}={value}: {error}");
        }
    }
    let all: Vec<(String, String)> = names
        .iter()
        .map(|name| (name.clone(), valid_value(name, dir.path())))
        .collect();
    let config = payhook::Config::load(Some(&dir.path().join("payhook.toml")), all)
        .unwrap_or_else(|e| panic!("all at once: {e}"));
    assert_eq!(
        config.gateway.auth_scheme, "Token",
        "the variables took effect"
    );
}

#[test]
fn the_commands_start_with_every_documented_variable_exported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(&file, "[server]\n").unwrap();
    gateway_files(dir.path());
    let env: Vec<(String, String)> = documented_variables()
        .into_iter()
        .map(|name| {
            let value = valid_value(&name, dir.path());
            (name, value)
        })
        .collect();
    let payhook = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_payhook"))
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let check = payhook(&["check-config", file.to_str().unwrap()]);
    assert!(check.is_empty(), "check-config: {check}");
    // `scenario` and `trigger` load the configuration before they do anything else; with
    // nothing to reach they then fail for that reason, not for a variable.
    let scenario = payhook(&[
        "scenario",
        "no-such-scenario.toml",
        "--to",
        "http://127.0.0.1:1",
        "--gateway",
        "http://127.0.0.1:1",
    ]);
    assert!(
        !scenario.contains("names no setting"),
        "scenario: {scenario}"
    );
    assert!(
        scenario.contains("no-such-scenario.toml"),
        "scenario: {scenario}"
    );
    let trigger = payhook(&[
        "trigger",
        "providers-validation",
        "--to",
        "http://127.0.0.1:1",
    ]);
    assert!(!trigger.contains("names no setting"), "trigger: {trigger}");
}
