//! `payhook check-config` prints the effective configuration as TOML that reads back, with
//! every secret redacted, and ends quietly when its reader goes away (`| head`).
#![allow(clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Stdio};

const SECRETS: [&str; 4] = [
    "gateway-password-s3cret",
    "admin-token-s3cret-0123456789",
    "shared-s3cret-0123456789",
    "basic-password-s3cret",
];

fn config_file(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("payhook.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[server]
body_limit = 65536
[callback]
allow_unsigned = true
[gateway]
auth_url = "https://auth.example"
gateway_url = "https://gateway.example"
username = "shop"
password = "{}"
[validation]
deadline = "30m"
retry_schedule = ["1s", "90s"]
[auth.transaction_validation]
method = "shared_secret"
secret = "{}"
[auth.providers_validation]
method = "basic"
username = "aggregator"
"#,
            SECRETS[0], SECRETS[2]
        ),
    )
    .unwrap();
    // Readable by its owner alone, as a file holding secrets should be (otherwise the
    // command warns on stderr).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    file
}

fn check_config(file: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_payhook"));
    command
        .arg("check-config")
        .arg(file)
        .env_clear()
        .env("PAYHOOK_ADMIN_TOKEN", SECRETS[1])
        .env("PAYHOOK_AUTH_PROVIDERS_VALIDATION_PASSWORD", SECRETS[3]);
    command
}

#[test]
fn the_effective_configuration_is_printed_as_toml_with_secrets_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path());
    let output = check_config(&file).output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for secret in SECRETS {
        assert!(!stdout.contains(secret), "{secret} leaked:\n{stdout}");
    }
    let table: toml::Table = stdout
        .parse()
        .unwrap_or_else(|e| panic!("not TOML ({e}):\n{stdout}"));
    assert_eq!(table["server"]["body_limit"].as_integer(), Some(65536));
    assert_eq!(table["gateway"]["password"].as_str(), Some("<redacted>"));
    assert_eq!(table["admin"]["token"].as_str(), Some("<redacted>"));
    let transaction = &table["auth"]["transaction_validation"];
    assert_eq!(transaction["secret"].as_str(), Some("<redacted>"));
    assert_eq!(
        table["auth"]["providers_validation"]["password"].as_str(),
        Some("<redacted>")
    );

    // Read back as printed, a placeholder would be a secret everyone knows: refused, naming
    // the setting.
    let as_printed = payhook::Config::from_toml(&stdout).unwrap_err().to_string();
    assert!(as_printed.contains("placeholder"), "{as_printed}");
    assert!(
        as_printed.contains("gateway.password")
            || as_printed.contains("admin.token")
            || as_printed.contains("auth."),
        "{as_printed}"
    );
    for (key, secret) in [
        ("secret", "<redacted>"),
        ("secret", "the-real-one-0123456789"),
    ] {
        let one = format!(
            "[auth.transaction_validation]\nmethod = \"shared_secret\"\nheader = \"X-Shared\"\n{key} = \"{secret}\"\n"
        );
        let read = payhook::Config::from_toml(&one);
        assert_eq!(read.is_ok(), secret != "<redacted>", "{secret}: {read:?}");
    }

    // What it prints is a configuration payhook reads back: the same settings, with the
    // secrets put back in.
    let mut reread = table.clone();
    reread["gateway"]["password"] = SECRETS[0].into();
    reread["admin"]["token"] = SECRETS[1].into();
    reread["auth"]["transaction_validation"]["secret"] = SECRETS[2].into();
    reread["auth"]["providers_validation"]["password"] = SECRETS[3].into();
    let printed = payhook::Config::from_toml(&toml::to_string(&reread).unwrap()).unwrap();
    let loaded = payhook::Config::load(
        Some(&file),
        [
            ("PAYHOOK_ADMIN_TOKEN".to_owned(), SECRETS[1].to_owned()),
            (
                "PAYHOOK_AUTH_PROVIDERS_VALIDATION_PASSWORD".to_owned(),
                SECRETS[3].to_owned(),
            ),
        ],
    )
    .unwrap();
    assert_eq!(printed, loaded);
}

#[test]
fn a_reader_that_goes_away_ends_it_quietly_and_successfully() {
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path());
    let mut child = check_config(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the reading end before the command writes: its writes meet a broken pipe.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.is_empty(), "nothing on stderr: {stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

/// A variable that is not UTF-8 panicked `std::env::vars`, and with it the command: another
/// program's is now left out, and one of payhook's is refused by name, its value unquoted.
#[cfg(unix)]
#[test]
fn a_variable_that_is_not_utf8_stops_nothing_unless_it_is_payhooks() {
    use std::os::unix::ffi::OsStrExt;

    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path());
    let not_utf8 = std::ffi::OsStr::from_bytes(b"caf\xe9-s3cret");
    // Another program's, and payhook's own that set no setting (the tooling's).
    let output = check_config(&file)
        .env("LC_SOMETHING_ELSE", not_utf8)
        .env("PAYHOOK_TEST_SOMETHING", not_utf8)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = check_config(&file)
        .env("PAYHOOK_GATEWAY_USERNAME", not_utf8)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("PAYHOOK_GATEWAY_USERNAME") && stderr.contains("not UTF-8"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// A configuration with no aggregator's key and no explicit opt-out is one a service that
/// receives callbacks refuses at start: the check says so (a service may receive none, so
/// it is still ok), rather than "ok" alone until the deployment fails.
#[test]
fn a_configuration_a_callback_receiver_would_refuse_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path());
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("allow_unsigned = true", "allow_unsigned = false");
    std::fs::write(&file, text).unwrap();
    let output = check_config(&file).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("a service that receives callbacks would not start")
            && stderr.contains("signature.keys"),
        "{stderr}"
    );
}
