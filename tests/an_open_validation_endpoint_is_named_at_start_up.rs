//! A validation endpoint served with no authentication method and no address allow-list
//! answers anyone who reaches it. The spec does not say how the aggregator authenticates
//! itself, so that is the default; payhook says so when the app is built, naming the
//! setting to change, and says nothing of an endpoint that has either.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::{App, Config};
use support::*;

/// What building an app of `config`, both validation endpoints served, logs at WARN.
fn warnings_of(config: Config) -> String {
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
