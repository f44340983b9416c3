//! Settings that payhook takes but that put money at risk are named when the app is built,
//! with what to change; settings that do not are not.
//!
//! * A validation endpoint served with no authentication method and no address allow-list
//!   answers anyone who reaches it. The spec does not say how the aggregator authenticates
//!   itself, so that is the default — except in Awaitable mode, where the transaction
//!   validation endpoint's decisions are posted to the aggregator: there it is refused unless
//!   `validation.allow_unauthenticated` says it is served open deliberately.
//! * A retention shorter than the aggregator's retries of one callback may last: a late
//!   retry is refused 409 (not booked twice, but not booked).
//! * A file holding a secret — a configuration file with a password or a token, the
//!   gateway's client key — that users other than its owner can read.
//! * A validation deadline within a minute of the handler timeout: clocks that differ by
//!   seconds can let the deadline decide while the handler still runs.
//! * An operating API open to other machines: over plain HTTP (`admin.allow_plain_http`),
//!   its token is anyone's who watches the network; without a trusted proxy speaking HTTPS,
//!   every call from them is refused.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::{App, Config};
use support::*;

/// The binary's logs are one buffer: one test at a time clears it, builds and reads it.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What building an app of `config`, both validation endpoints served, logs at WARN.
fn warnings_of(config: Config) -> String {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let logs = captured_logs(tracing::Level::WARN);
    logs.lock().unwrap().clear();
    let merchant = TestMerchant::default();
    App::builder(config)
        .providers_validator(merchant.clone())
        .transaction_validator(merchant)
        .without_store()
        .build()
        .unwrap();
    String::from_utf8(logs.lock().unwrap().clone()).unwrap()
}

/// A credential shorter than 16 characters is refused, naming the way to take one the
/// aggregator issued; taken so, it is named at start.
#[test]
fn a_short_credential_is_refused_unless_allowed_and_then_named() {
    let mut config = test_config();
    let endpoint = &mut config.auth.transaction_validation;
    endpoint.method = payhook::config::AuthMethod::SharedSecret;
    endpoint.secret = Some("short-secret".into());
    let error = App::builder(config.clone())
        .transaction_validator(TestMerchant::default())
        .without_store()
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("auth.transaction_validation.secret: must be at least 16 characters")
            && error.contains("allow_short_secret = true")
            && !error.contains("short-secret"),
        "{error}"
    );
    config.auth.transaction_validation.allow_short_secret = true;
    let warned = warnings_of(config);
    assert!(
        warned.contains(
            "auth.transaction_validation: its credential is shorter than 16 characters and taken"
        ),
        "{warned}"
    );
    let quiet = warnings_of(test_config());
    assert!(!quiet.contains("shorter than 16"), "{quiet}");
}

#[test]
fn each_open_validation_endpoint_is_named_and_a_guarded_one_is_not() {
    let open = warnings_of(test_config());
    for setting in ["auth.providers_validation", "auth.transaction_validation"] {
        assert!(
            open.contains(&format!("{setting}: method \"none\" and no allow_ips")),
            "{open}"
        );
    }

    let mut guarded = test_config();
    guarded.auth.providers_validation.allow_ips = vec!["10.0.0.0/8".into()];
    guarded.auth.transaction_validation.method = payhook::config::AuthMethod::Signature;
    guarded.signature = signed_config(&["rsa2048"]).signature;
    let quiet = warnings_of(guarded.clone());
    assert!(!quiet.contains("no allow_ips"), "{quiet}");

    guarded.auth.providers_validation.allow_ips = vec!["0.0.0.0/0".into()];
    let wide = warnings_of(guarded);
    assert!(
        wide.contains(
            "auth.providers_validation: method \"none\" and no allow_ips (or one that admits every"
        ),
        "{wide}"
    );
}

/// What building an app that books callbacks in a sled store of `config` logs at WARN.
fn callback_warnings_of(mut config: Config) -> String {
    let data = tempfile::tempdir().unwrap();
    config.store.path = data.path().join("store");
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let logs = captured_logs(tracing::Level::WARN);
    logs.lock().unwrap().clear();
    App::builder(config)
        .callback_receiver(TestMerchant::default())
        .build()
        .unwrap();
    String::from_utf8(logs.lock().unwrap().clone()).unwrap()
}

#[test]
fn a_retention_shorter_than_the_retries_is_named_and_the_default_is_not() {
    let mut short = test_config();
    short.store.retention = std::time::Duration::from_secs(86_400);
    let warned = callback_warnings_of(short);
    assert!(
        warned.contains("store.retention is shorter than the aggregator's retries"),
        "{warned}"
    );
    let quiet = callback_warnings_of(test_config());
    assert!(!quiet.contains("store.retention"), "{quiet}");
}

/// `config` in Awaitable mode, its store in `data`.
fn awaitable(mut config: Config, data: &std::path::Path) -> Config {
    config.store.path = data.join("store");
    config.validation.awaitable = true;
    config.gateway.auth_url = Some("http://127.0.0.1:1".into());
    config.gateway.gateway_url = Some("http://127.0.0.1:1".into());
    config.gateway.username = Some("shop".into());
    config.gateway.password = Some("pw".into());
    config
}

/// Builds an app serving transaction validations of `config`.
fn build_validations(config: Config) -> Result<App, payhook::server::BuildError> {
    App::builder(config)
        .transaction_validator(TestMerchant::default())
        .manual_background()
        .build()
}

/// What building an app of `config` in Awaitable mode, its store in a temporary directory,
/// logs at WARN.
fn awaitable_warnings_of(config: Config) -> String {
    let data = tempfile::tempdir().unwrap();
    let mut config = awaitable(config, data.path());
    // Its caller would be a test on loopback; not what these tests are about.
    config.validation.allow_unauthenticated = true;
    warnings_while(|| {
        build_validations(config).unwrap();
    })
}

/// An open validation endpoint in Awaitable mode would let anyone have a decision posted to
/// the aggregator: refused, naming the setting and the ways out, unless opted into.
#[test]
fn an_open_awaitable_validation_endpoint_is_refused_unless_served_open_deliberately() {
    let data = tempfile::tempdir().unwrap();
    let open = awaitable(test_config(), data.path());
    let Err(refused) = build_validations(open.clone()) else {
        panic!("an open Awaitable validation endpoint was served");
    };
    let said = refused.to_string();
    for words in [
        "auth.transaction_validation.method",
        "Awaitable mode posts",
        "allow_ips",
        "validation.allow_unauthenticated = true",
    ] {
        assert!(said.contains(words), "{words:?} missing from: {said}");
    }
    assert!(
        !data.path().join("store").exists(),
        "refused before the store is opened"
    );
    // The configuration alone is refused too (`payhook check-config` says so).
    assert!(open.validate().is_err());

    // A list that admits every address of a family is no list.
    for everywhere in ["0.0.0.0/0", "::/0"] {
        let mut wide = open.clone();
        wide.auth.transaction_validation.allow_ips = vec!["10.0.0.0/8".into(), everywhere.into()];
        let said = build_validations(wide).err().map(|e| e.to_string());
        assert!(
            said.as_deref()
                .is_some_and(|s| s.contains("auth.transaction_validation.method")),
            "{everywhere}: {said:?}"
        );
    }

    let mut listed = open.clone();
    listed.auth.transaction_validation.allow_ips = vec!["10.0.0.0/8".into()];
    build_validations(listed).unwrap();

    let mut signed = open.clone();
    signed.auth.transaction_validation.method = payhook::config::AuthMethod::Signature;
    signed.signature = signed_config(&["rsa2048"]).signature;
    build_validations(signed).unwrap();

    // The providers validation endpoint's answers are posted nowhere: open, it is named only.
    let mut guarded = open.clone();
    guarded.auth.transaction_validation.allow_ips = vec!["10.0.0.0/8".into()];
    assert!(guarded.auth.providers_validation.is_open());
    assert!(guarded.validate().is_ok());

    let mut deliberate = open;
    deliberate.validation.allow_unauthenticated = true;
    let warned = warnings_while(|| {
        build_validations(deliberate).unwrap();
    });
    assert!(
        warned.contains("auth.transaction_validation: method \"none\" and no allow_ips"),
        "{warned}"
    );
}

#[test]
fn a_deadline_close_to_the_handler_timeout_is_named() {
    let mut close = test_config();
    close.server.handler_timeout = std::time::Duration::from_secs(20);
    close.validation.deadline = Some(std::time::Duration::from_secs(30));
    let warned = awaitable_warnings_of(close.clone());
    assert!(
        warned.contains(
            "validation.deadline is less than a minute longer than server.handler_timeout"
        ),
        "{warned}"
    );
    let mut apart = close;
    apart.validation.deadline = Some(std::time::Duration::from_secs(80));
    let quiet = awaitable_warnings_of(apart);
    assert!(!quiet.contains("validation.deadline"), "{quiet}");
}

/// What runs `read` logs at WARN.
fn warnings_while(read: impl FnOnce()) -> String {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let logs = captured_logs(tracing::Level::WARN);
    logs.lock().unwrap().clear();
    read();
    String::from_utf8(logs.lock().unwrap().clone()).unwrap()
}

/// Sets the permission bits of the file at `path`.
#[cfg(unix)]
fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[cfg(unix)]
#[test]
fn a_configuration_file_holding_a_secret_that_others_can_read_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    std::fs::write(
        &file,
        "[admin]\ntoken = \"tok-3f9a1c-5e8b2d7a0c\"\n[gateway]\npassword = \"pw-77d2\"\n",
    )
    .unwrap();
    let load = || {
        Config::load(Some(&file), []).unwrap();
    };
    chmod(&file, 0o644);
    let warned = warnings_while(load);
    assert!(
        warned.contains(
            "holds gateway.password, admin.token and can be read by users other than its owner"
        ),
        "{warned}"
    );
    assert!(
        warned.contains(&format!("chmod 600 '{}'", file.display())),
        "{warned}"
    );
    assert!(warned.contains("0644"), "{warned}");
    assert!(
        !warned.contains("tok-3f9a1c-5e8b2d7a0c") && !warned.contains("pw-77d2"),
        "{warned}"
    );

    chmod(&file, 0o600);
    let quiet = warnings_while(load);
    assert!(!quiet.contains("can be read by users"), "{quiet}");

    // A file without a secret may be read by anyone.
    std::fs::write(&file, "[server]\nbody_limit = 65536\n").unwrap();
    chmod(&file, 0o644);
    let quiet = warnings_while(load);
    assert!(!quiet.contains("can be read by users"), "{quiet}");
}

#[cfg(unix)]
#[test]
fn a_client_key_others_can_read_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["shop.example".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (
        dir.path().join("client.pem"),
        dir.path().join("client-key.pem"),
    );
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let config = payhook::gateway::GatewayConfig {
        auth_url: Some("https://aggregator.example".into()),
        gateway_url: Some("https://aggregator.example".into()),
        username: Some("shop".into()),
        password: Some("password".into()),
        client_cert_file: Some(cert_file),
        client_key_file: Some(key_file.clone()),
        ..payhook::gateway::GatewayConfig::default()
    };
    let build = || {
        payhook::gateway::GatewayClient::new(&config).unwrap();
    };
    chmod(&key_file, 0o640);
    let warned = warnings_while(build);
    assert!(
        warned.contains(&format!(
            "{} holds the gateway's client key and can be read by users other than its owner",
            key_file.display()
        )),
        "{warned}"
    );
    chmod(&key_file, 0o600);
    let quiet = warnings_while(build);
    assert!(!quiet.contains("can be read by users"), "{quiet}");
}

#[test]
fn an_operating_api_open_to_other_machines_says_how_its_token_may_travel() {
    let with_admin = |allow: &[&str], proxies: &[&str], plain: bool| {
        let mut config = test_config();
        config.admin.token = Some("admin-token-0123456789".into());
        config.admin.allow_ips = allow.iter().map(|a| (*a).to_owned()).collect();
        config.server.trusted_proxies = proxies.iter().map(|p| (*p).to_owned()).collect();
        config.admin.allow_plain_http = plain;
        warnings_of(config)
    };
    let plain = with_admin(&["10.0.0.0/8"], &["10.0.0.1/32"], true);
    assert!(plain.contains("admin.allow_plain_http = true"), "{plain}");
    let unreachable = with_admin(&["10.0.0.0/8"], &[], false);
    assert!(
        unreachable.contains("admin.allow_ips admits other machines"),
        "{unreachable}"
    );
    for quiet in [
        with_admin(&["10.0.0.0/8"], &["10.0.0.1/32"], false),
        with_admin(&["127.0.0.1/32", "::1/128"], &[], true),
    ] {
        assert!(!quiet.contains("admin."), "{quiet}");
    }
}
