//! The example merchant never turns unsigned callbacks on by itself: without the
//! aggregator's key it refuses to start unless `callback.allow_unsigned` is set explicitly,
//! so a merchant who copies it and forgets the key cannot run an open receiver.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use support::*;

fn data_env(dir: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".to_owned()),
        ("PAYHOOK_STORE_PATH", dir.join("data").display().to_string()),
    ]
}

async fn unsigned_callback(address: std::net::SocketAddr) -> u16 {
    exchange(
        address,
        &post(
            CALLBACK_PATH,
            &[("Content-Type", "application/json")],
            CALLBACK.as_bytes(),
        ),
    )
    .await
    .status
}

#[test]
fn without_a_key_or_the_opt_in_it_refuses_to_start_and_says_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let output = run_example_to_exit(&data_env(dir.path()), &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("without a signature check"), "{stderr}");
    assert!(stderr.contains("PAYHOOK_SIGNATURE_KEYS"), "{stderr}");
    assert!(
        stderr.contains("PAYHOOK_CALLBACK_ALLOW_UNSIGNED=true"),
        "{stderr}"
    );
}

#[tokio::test]
async fn with_the_explicit_opt_in_it_accepts_unsigned_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = data_env(dir.path());
    env.push(("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".to_owned()));
    let (_merchant, address) = spawn_example(&env);
    assert_eq!(unsigned_callback(address).await, 200);
}

#[tokio::test]
async fn with_a_key_an_unsigned_callback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = data_env(dir.path());
    env.extend(ed25519_example_env());
    let (_merchant, address) = spawn_example(&env);
    assert_eq!(unsigned_callback(address).await, 401);
}

/// A placeholder for the key (an Ed25519 key of 32 zero bytes, a point of small order)
/// would accept signatures anyone can make: the merchant refuses to start, naming the key.
#[test]
fn a_placeholder_key_that_would_accept_forgeries_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("placeholder.pem");
    std::fs::write(
        &key,
        "-----BEGIN PUBLIC KEY-----\n\
         MCowBQYDK2VwAyEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\
         -----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let mut env = data_env(dir.path());
    env.push(("PAYHOOK_SIGNATURE_ALGORITHM", "ed25519".to_owned()));
    env.push((
        "PAYHOOK_SIGNATURE_KEYS",
        format!("[{{id = \"placeholder\", file = \"{}\"}}]", key.display()),
    ));
    let output = run_example_to_exit(&env, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("signature.keys[0]") && stderr.contains("placeholder"),
        "{stderr}"
    );
    assert!(stderr.contains("accepts forged signatures"), "{stderr}");
}
