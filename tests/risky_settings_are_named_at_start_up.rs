//! Settings that payhook takes but that put money at risk are named when the app is built,
//! with what to change; settings that do not are not.
//!
//! * A validation endpoint served with no authentication method and no address allow-list
//!   answers anyone who reaches it. The spec does not say how the aggregator authenticates
//!   itself, so that is the default.
//! * A retention shorter than the aggregator's retries of one callback may last: a late
//!   retry is refused 409 (not booked twice, but not booked).
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
    let quiet = warnings_of(guarded);
    assert!(!quiet.contains("no allow_ips"), "{quiet}");
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
