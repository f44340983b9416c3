//! A file whose contents decide what payhook trusts — an aggregator's key, the CA the
//! gateway's answers are checked against, the client certificate, the configuration — is
//! refused when any user on the machine may write it, at start and when read again, naming
//! the file and the fix: whoever put their own key there would have forged callbacks
//! accepted. One in a directory where others may replace it (without the sticky bit, unlike
//! `/tmp`) is warned of.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use payhook::server::CredentialsRefused;
use support::*;

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A copy of the fixture key `rsa2048` in `dir`, and a configuration verifying with it.
fn key_in(dir: &Path) -> (PathBuf, payhook::Config) {
    let file = dir.join("aggregator.pem");
    std::fs::copy(signature_fixtures().join("rsa2048/public.pem"), &file).unwrap();
    set_mode(&file, 0o644);
    let mut config = signed_config(&[]);
    config.signature.keys = vec![payhook::config::KeySource {
        id: Some("aggregator".into()),
        file: Some(file.clone()),
        ..Default::default()
    }];
    // A service that starts keeps its store here, not in the checkout (`./payhook-data`).
    config.store.path = dir.join("store");
    (file, config)
}

/// Why `config` does not build an app.
fn refused_start(config: payhook::Config) -> String {
    let merchant = TestMerchant::default();
    payhook::App::builder(config)
        .callback_receiver(merchant)
        .build()
        .err()
        .map(|error| payhook::Report::new(&error).to_string())
        .expect("the app was built")
}

#[test]
fn a_key_file_anyone_may_write_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let (file, config) = key_in(dir.path());
    set_mode(&file, 0o666);
    let error = refused_start(config);
    assert!(
        error.contains("signature.keys[0]")
            && error.contains(&format!(
                "{} can be written by any user (mode 0666): restrict it (chmod o-w",
                file.display()
            ))
            && error.contains("forged callbacks accepted"),
        "{error}"
    );
}

/// A directory where any user may replace the key (not the file itself) is warned of, not
/// refused: a Kubernetes `emptyDir` an agent writes secrets into is one, and a service that
/// is not root cannot restrict it. Not with the sticky bit (`/tmp`).
#[test]
fn a_key_file_where_anyone_may_replace_it_is_warned_of() {
    let logs = captured_logs(tracing::Level::WARN);
    let dir = tempfile::tempdir().unwrap();
    let (file, config) = key_in(dir.path());
    set_mode(dir.path(), 0o777);
    assert!(
        payhook::App::builder(config.clone())
            .callback_receiver(TestMerchant::default())
            .build()
            .is_ok()
    );
    let warned = |text: &str| {
        text.lines().any(|l| {
            l.contains("WARN")
                && l.contains(&format!("{} holds an aggregator's key", file.display()))
                && l.contains(&format!(
                    "under {}, where any user may replace it",
                    dir.path().display()
                ))
        })
    };
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(warned(&text), "{text}");
    logs.lock().unwrap().clear();
    set_mode(dir.path(), 0o1777);
    assert!(
        payhook::App::builder(config)
            .callback_receiver(TestMerchant::default())
            .build()
            .is_ok()
    );
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(!warned(&text), "{text}");
    set_mode(dir.path(), 0o700);
}

/// Made writable by anyone while the service runs: the keys read again are refused, and the
/// key as read before still verifies.
#[tokio::test]
async fn a_key_file_made_writable_by_anyone_is_refused_when_read_again() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let (file, config) = key_in(dir.path());
    let server = TestServer::start_with(config.clone()).await;
    set_mode(&file, 0o646);
    let refused = server
        .app
        .credentials()
        .read_again(&server.as_run(&config))
        .unwrap_err();
    assert!(
        matches!(refused, CredentialsRefused::SignatureKey(_)),
        "{refused:?}"
    );
    let signer = fixture_signer("rsa2048", payhook::signature::Algorithm::RsaPkcs1Sha256);
    let answer = server
        .send(&signed_callback(&signer, "n-1", 4, "1", "c"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());
}

#[test]
fn a_configuration_file_anyone_may_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let file = dir.path().join("payhook.toml");
    std::fs::write(&file, "[callback]\nallow_unsigned = true\n").unwrap();
    set_mode(&file, 0o644);
    assert!(payhook::Config::load(Some(&file), []).is_ok());
    set_mode(&file, 0o666);
    let error = payhook::Config::load(Some(&file), []).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{path} can be written by any user (mode 0666): restrict it (chmod o-w '{path}'): \
             it decides what payhook trusts (the aggregator's keys, the tokens, whether \
             callbacks must be signed)",
            path = file.display().to_string()
        )
    );
}

/// The CA the aggregator's answers are checked against, and the client certificate and key
/// presented as the merchant's.
#[test]
fn a_gateway_tls_file_anyone_may_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not read").unwrap();
    set_mode(&ca, 0o666);
    let config = payhook::config::GatewayConfig {
        auth_url: Some("http://127.0.0.1:9".into()),
        gateway_url: Some("http://127.0.0.1:9".into()),
        username: Some("merchant".into()),
        password: Some(payhook::Secret::new("password")),
        ca_file: Some(ca.clone()),
        ..Default::default()
    };
    let error = payhook::gateway::GatewayClient::new(&config).unwrap_err();
    let error = payhook::Report::new(&error).to_string();
    assert!(
        error.contains("gateway.ca_file")
            && error.contains(&format!("{} can be written by any user", ca.display())),
        "{error}"
    );
    let (cert, key) = (dir.path().join("client.pem"), dir.path().join("client.key"));
    std::fs::write(&cert, "not read").unwrap();
    std::fs::write(&key, "not read").unwrap();
    set_mode(&cert, 0o644);
    set_mode(&key, 0o606);
    let config = payhook::config::GatewayConfig {
        ca_file: None,
        client_cert_file: Some(cert),
        client_key_file: Some(key.clone()),
        ..config
    };
    let error = payhook::gateway::GatewayClient::new(&config).unwrap_err();
    let error = payhook::Report::new(&error).to_string();
    assert!(
        error.contains("gateway.client_key_file")
            && error.contains(&format!("{} can be written by any user", key.display())),
        "{error}"
    );
}
