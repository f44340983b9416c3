//! A service that cannot start says what failed (the address, the file), why, and what to
//! do — as a message and its causes, never as a `Debug` dump (`Os { code: 98, kind: ... }`).
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use support::run_example_to_exit;

/// Checks the shape every start-up error must have, and returns stderr.
fn failed_start(output: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "the start failed: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for debug in ["Os {", "kind:", "code:", "Error {", "Read {"] {
        assert!(!stderr.contains(debug), "no Debug text ({debug}): {stderr}");
    }
    stderr
}

#[test]
fn the_example_merchant_names_an_address_in_use_and_how_to_choose_another() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let output = run_example_to_exit(
        &[
            ("PAYHOOK_SERVER_LISTEN", address.clone()),
            ("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".to_owned()),
            (
                "PAYHOOK_STORE_PATH",
                dir.path().join("data").display().to_string(),
            ),
        ],
        &[],
    );
    let stderr = failed_start(&output);
    assert!(
        stderr.contains(&format!("cannot listen on {address}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("PAYHOOK_SERVER_LISTEN"),
        "the fix: {stderr}"
    );
}

#[test]
fn the_example_merchant_names_a_missing_configuration_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml").display().to_string();
    let output = run_example_to_exit(&[("PAYHOOK_CONFIG", missing.clone())], &[]);
    let stderr = failed_start(&output);
    assert!(
        stderr.contains(&format!("cannot read {missing}")),
        "{stderr}"
    );
    assert!(stderr.contains("PAYHOOK_CONFIG"), "the fix: {stderr}");
}

#[test]
fn the_example_merchant_names_a_store_held_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut config = payhook::Config::default();
    config.store.path = data.clone();
    let _held = payhook::store::SledStore::open(&config.store, &[]).unwrap();
    let output = run_example_to_exit(
        &[
            ("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".to_owned()),
            ("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".to_owned()),
            ("PAYHOOK_STORE_PATH", data.display().to_string()),
        ],
        &[],
    );
    let stderr = failed_start(&output);
    assert!(
        stderr.contains(&format!("{} is in use", data.display())),
        "{stderr}"
    );
    assert!(stderr.contains("PAYHOOK_STORE_PATH"), "the fix: {stderr}");
}

#[test]
fn a_bad_merchant_setting_is_named_with_its_value() {
    let output = run_example_to_exit(&[("MERCHANT_MAX_AMOUNT", "lots".to_owned())], &[]);
    let stderr = failed_start(&output);
    assert!(stderr.contains("MERCHANT_MAX_AMOUNT=`lots`"), "{stderr}");
}
