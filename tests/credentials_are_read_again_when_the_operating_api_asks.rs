//! A running service reads its configuration again when its operating API is asked (`POST
//! /payhook/admin/credentials/read-again`, `payhook credentials read-again`), from what it
//! gave to read (`Credentials::read_from`, as `read_again_on_hangup` does) — SIGHUP's reading
//! without a signal, for a platform that sends none or a reloader that calls a URL — and
//! answers what changed, or why nothing was taken; `credentials/check` (`payhook credentials
//! check`) says so taking nothing. A viewer may not ask either.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::sync::{Arc, Mutex};

use payhook::server::{AdminCredentialsRead, OperatorToken};
use payhook::signature::{Algorithm, SigningKey};
use support::*;

const SHARED: &str = "admin-token-0123456789";
const CAROL: &str = "phop_carol-token-for-tests-0123456789";
const READ_AGAIN: &str = "/payhook/admin/credentials/read-again";

/// A service verifying the fixture key `rsa2048`, with an operating API (the shared token,
/// and carol, a viewer), whose configuration read again is what the returned cell holds.
async fn service() -> (TestServer, Arc<Mutex<payhook::Config>>) {
    let mut config = signed_config(&["rsa2048"]);
    config.admin.token = Some(SHARED.into());
    config.admin.operators = [("carol".to_owned(), OperatorToken::digest_of(CAROL))].into();
    config.admin.viewers = vec!["carol".to_owned()];
    let server = TestServer::start_with(config.clone()).await;
    let file = Arc::new(Mutex::new(server.as_run(&config)));
    let read = Arc::clone(&file);
    server
        .app
        .credentials()
        .read_from(move || Ok(read.lock().unwrap().clone()));
    (server, file)
}

/// `config` with the fixture keys `keys` (by their names as ids).
fn with_keys(config: &payhook::Config, keys: &[&str]) -> payhook::Config {
    let mut next = config.clone();
    next.signature.keys = signed_config(keys).signature.keys;
    next
}

/// The configuration the service reads next lists the fixture keys `keys`.
fn rotate(file: &Mutex<payhook::Config>, keys: &[&str]) {
    let mut next = file.lock().unwrap();
    *next = with_keys(&next, keys);
}

fn rsa(key: &str) -> SigningKey {
    fixture_signer(key, Algorithm::RsaPkcs1Sha256)
}

/// `payhook credentials what --admin-url URL…` with the shared token, off the runtime (the
/// services answer meanwhile).
async fn credentials_command(what: &str, urls: &[&str]) -> std::process::Output {
    let mut args = vec!["credentials".to_owned(), what.to_owned()];
    for url in urls {
        args.extend(["--admin-url".to_owned(), (*url).to_owned()]);
    }
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
            .args(args)
            .env_clear()
            .env("PAYHOOK_ADMIN_TOKEN", SHARED)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

async fn callback_status(server: &TestServer, key: &str, nonce: &str) -> u16 {
    let request = signed_callback(&rsa(key), nonce, 4, "1", "c");
    server.send(&request).await.status
}

#[tokio::test]
async fn the_configuration_is_read_again_when_asked_and_the_answer_says_what_changed() {
    let (server, file) = service().await;
    assert_eq!(callback_status(&server, "rsa3072", "n-1").await, 401);

    {
        let mut next = file.lock().unwrap();
        *next = with_keys(&next, &["rsa3072", "rsa2048"]);
        next.server.max_connections += 1;
    }
    let answer = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    let read: AdminCredentialsRead = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(
        read,
        AdminCredentialsRead {
            message: "signature keys now: rsa3072, rsa2048".into(),
            need_a_restart: vec!["server".into()],
        }
    );
    assert_eq!(callback_status(&server, "rsa3072", "n-2").await, 200);

    // Asked again with nothing changed: nothing changes.
    let answer = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    let read: AdminCredentialsRead = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(read.message, "no change");
}

/// A validation endpoint's shared secret that leaked is replaced without a restart: from
/// the reading on, the old one is refused (401) and the new one let in. A method the
/// service cannot check — the aggregator's signature where it verifies none — is refused,
/// and changes nothing.
#[tokio::test]
async fn a_leaked_validation_secret_is_replaced_without_a_restart() {
    use payhook::config::{AuthMethod, EndpointAuthConfig};
    let (server, file) = service().await;
    let secret_auth = |secret: &str| EndpointAuthConfig {
        method: AuthMethod::SharedSecret,
        secret: Some(secret.into()),
        ..EndpointAuthConfig::default()
    };
    let validation = |secret: &'static str| {
        post(
            VALIDATION_PATH,
            &[("Content-Type", "application/json"), ("X-Api-Key", secret)],
            TRANSACTION_VALIDATION.as_bytes(),
        )
    };
    const LEAKED: &str = "leaked-secret-0123456789";
    const NEW: &str = "the-new-secret-0123456789";
    file.lock().unwrap().auth.transaction_validation = secret_auth(LEAKED);
    let read = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    let read: AdminCredentialsRead = serde_json::from_slice(&read.body).unwrap();
    assert_eq!(
        read.message,
        "auth (the validation endpoints' credentials) changed"
    );
    assert!(read.need_a_restart.is_empty(), "{read:?}");
    assert_eq!(server.send(&validation(LEAKED)).await.status, 200);

    file.lock().unwrap().auth.transaction_validation = secret_auth(NEW);
    let read = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(read.status, 200, "{}", read.message());
    let refused = server.send(&validation(LEAKED)).await;
    assert_eq!(
        (refused.status, refused.message().as_str()),
        (401, "invalid credentials")
    );
    assert_eq!(server.send(&validation(NEW)).await.status, 200);

    // The aggregator's signature, on a service that verifies signatures: taken.
    file.lock().unwrap().auth.transaction_validation = EndpointAuthConfig {
        method: AuthMethod::Signature,
        ..EndpointAuthConfig::default()
    };
    let read = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(read.status, 200, "{}", read.message());
    assert_eq!(
        server.send(&validation(NEW)).await.status,
        401,
        "a signature now"
    );

    // On a service started without keys (unsigned callbacks allowed), that method would
    // check nothing: refused, and the secret asked for stays.
    let mut unsigned = support::test_config();
    unsigned.admin.token = Some(SHARED.into());
    unsigned.auth.transaction_validation = secret_auth(NEW);
    let unsigned_server = TestServer::start_with(unsigned.clone()).await;
    let mut next = unsigned_server.as_run(&unsigned);
    next.signature.keys = signed_config(&["rsa2048"]).signature.keys;
    next.auth.transaction_validation = EndpointAuthConfig {
        method: AuthMethod::Signature,
        ..EndpointAuthConfig::default()
    };
    unsigned_server
        .app
        .credentials()
        .read_from(move || Ok(next.clone()));
    let refused = unsigned_server
        .admin("POST", READ_AGAIN, Some(SHARED), None)
        .await;
    assert_eq!(refused.status, 409);
    assert!(
        refused
            .message()
            .contains("auth: method = \"signature\" where the service verifies no signature"),
        "{}",
        refused.message()
    );
    assert_eq!(
        unsigned_server.send(&validation(NEW)).await.status,
        200,
        "the secret still asked for"
    );
    assert_eq!(unsigned_server.send(&validation(LEAKED)).await.status, 401);
}

/// A configuration refused — here, one listing no key — is answered 409 with why, and
/// changes nothing; so is one that cannot be read, and one whose reading panics. The next
/// reading that can be taken is.
#[tokio::test]
async fn a_configuration_refused_or_unreadable_is_answered_409_and_changes_nothing() {
    let (server, file) = service().await;
    let started = file.lock().unwrap().clone();
    file.lock().unwrap().signature.keys.clear();
    let refused = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(refused.status, 409);
    assert!(
        refused.message().starts_with(
            "not taken, every credential stays as it was: signature: no signature.keys"
        ),
        "{}",
        refused.message()
    );
    assert_eq!(callback_status(&server, "rsa2048", "n-1").await, 200);
    server
        .assert_metrics(&[
            "payhook_credentials_readings_total{outcome=\"refused\"} 1",
            "payhook_credentials_last_reading_refused 1",
        ])
        .await;

    let credentials = server.app.credentials();
    credentials.read_from(|| {
        Err(payhook::config::ConfigError::Invalid {
            key: "server.listen".into(),
            reason: "not an address".into(),
        })
    });
    let unreadable = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(
        (unreadable.status, unreadable.message()),
        (
            409,
            "not taken, every credential stays as it was: server.listen: not an address".into()
        )
    );
    credentials.read_from(|| panic!("the merchant's loader failed"));
    let panicked = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(panicked.status, 409);
    assert!(
        panicked.message().contains("panicked or was cut short"),
        "{}",
        panicked.message()
    );

    let next = with_keys(&started, &["rsa3072"]);
    credentials.read_from(move || Ok(next.clone()));
    let taken = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(taken.status, 200, "{}", taken.message());
    assert_eq!(callback_status(&server, "rsa3072", "n-2").await, 200);
    assert_eq!(callback_status(&server, "rsa2048", "n-3").await, 401);
    // The loader's panic and failure counted too; the last reading was taken.
    server
        .assert_metrics(&[
            "payhook_credentials_readings_total{outcome=\"taken\"} 1",
            "payhook_credentials_readings_total{outcome=\"refused\"} 3",
            "payhook_credentials_last_reading_refused 0",
        ])
        .await;
}

/// What `read_again_on_hangup` is given is what the operating API reads too, and who asked
/// is logged before the reading.
#[tokio::test]
async fn what_sighup_reads_is_what_the_operating_api_reads() {
    let logs = captured_logs(tracing::Level::INFO);
    let mut config = signed_config(&["rsa2048"]);
    config.admin.token = Some(SHARED.into());
    let server = TestServer::start_with(config.clone()).await;
    let next = with_keys(&server.as_run(&config), &["rsa3072"]);
    tokio::spawn(
        server
            .app
            .credentials()
            .read_again_on_hangup(move || Ok(next.clone())),
    );
    let answer = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    assert_eq!(callback_status(&server, "rsa3072", "n-1").await, 200);
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines().any(|l| l.contains("INFO")
            && l.contains("admin: reading the configuration again, as asked")
            && l.contains("with the shared token")),
        "{text}"
    );
}

/// A rotation tried before it is made: `credentials/check` (`payhook credentials check`)
/// reads the configuration, says what it would change or why it would be refused, and takes
/// nothing, nor counts as a reading.
#[tokio::test]
async fn a_check_says_what_a_reading_would_change_and_takes_nothing() {
    let (server, file) = service().await;
    let started = file.lock().unwrap().clone();
    *file.lock().unwrap() = with_keys(&started, &["rsa3072"]);
    let answer = server
        .admin(
            "POST",
            "/payhook/admin/credentials/check",
            Some(SHARED),
            None,
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    let read: AdminCredentialsRead = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(read.message, "signature keys now: rsa3072");
    assert_eq!(callback_status(&server, "rsa3072", "n-1").await, 401);
    assert_eq!(callback_status(&server, "rsa2048", "n-2").await, 200);

    let url = format!("http://{}", server.addr);
    let output = credentials_command("check", &[&url]).await;
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).trim()
        ),
        (Some(0), "would take: signature keys now: rsa3072"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    file.lock().unwrap().signature.keys.clear();
    let output = credentials_command("check", &[&url]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("409") && stderr.contains("would not be taken"),
        "{stderr}"
    );
    let refused = server
        .admin(
            "POST",
            "/payhook/admin/credentials/check",
            Some(SHARED),
            None,
        )
        .await;
    assert_eq!(refused.status, 409);
    assert!(
        refused.message().starts_with(
            "would not be taken, every credential stays as it was: signature: no signature.keys"
        ),
        "{}",
        refused.message()
    );
    assert_eq!(callback_status(&server, "rsa2048", "n-3").await, 200);
    server
        .assert_metrics(&[
            "payhook_credentials_readings_total{outcome=\"taken\"} 0",
            "payhook_credentials_readings_total{outcome=\"refused\"} 0",
            "payhook_credentials_last_reading_refused 0",
        ])
        .await;
}

/// A service that gave nothing to read says so; a viewer may not ask; only POST reads.
#[tokio::test]
async fn without_a_source_a_viewer_or_a_post_nothing_is_read() {
    let mut config = signed_config(&["rsa2048"]);
    config.admin.token = Some(SHARED.into());
    let server = TestServer::start_with(config).await;
    let none = server.admin("POST", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(none.status, 409);
    assert!(
        none.message().contains("it gave none to read"),
        "{}",
        none.message()
    );
    let get = server.admin("GET", READ_AGAIN, Some(SHARED), None).await;
    assert_eq!(get.status, 405);

    let (server, _file) = service().await;
    let viewer = server.admin("POST", READ_AGAIN, Some(CAROL), None).await;
    assert_eq!(viewer.status, 403, "{}", viewer.message());
    let viewer = server
        .admin(
            "POST",
            "/payhook/admin/credentials/check",
            Some(CAROL),
            None,
        )
        .await;
    assert_eq!(viewer.status, 403, "{}", viewer.message());
    assert!(viewer.message().contains("may look, not change"));
    let anonymous = server.admin("POST", READ_AGAIN, None, None).await;
    assert_eq!(anonymous.status, 401);
}

/// `payhook credentials read-again --admin-url` prints what changed, and exits 2 saying why
/// when nothing was taken.
#[tokio::test]
async fn the_command_line_asks_the_running_service_and_prints_the_answer() {
    let (server, file) = service().await;
    let url = format!("http://{}", server.addr);
    rotate(&file, &["rsa3072"]);
    let output = credentials_command("read-again", &[&url]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        (output.status.code(), stdout.trim()),
        (Some(0), "read again: signature keys now: rsa3072"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    file.lock().unwrap().signature.keys.clear();
    let output = credentials_command("read-again", &[&url]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("409")
            && stderr.contains("not taken")
            && stderr.contains("no signature.keys"),
        "{stderr}"
    );
    assert_eq!(callback_status(&server, "rsa3072", "n-1").await, 200);
}

/// Behind a load balancer each instance reads its own configuration: `--admin-url` repeated
/// asks every one, whatever the others answer, names each on its line, and exits 2 naming
/// those that took nothing.
#[tokio::test]
async fn the_command_line_asks_every_instance_it_is_given() {
    let (taking, file) = service().await;
    rotate(&file, &["rsa3072"]);
    let mut config = signed_config(&["rsa2048"]);
    config.admin.token = Some(SHARED.into());
    let sourceless = TestServer::start_with(config).await;
    let urls = [
        format!("http://{}", sourceless.addr),
        format!("http://{}", taking.addr),
    ];
    let output = credentials_command("read-again", &[&urls[0], &urls[1]]).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.trim(),
        format!("{}: read again: signature keys now: rsa3072", urls[1])
    );
    assert!(
        stderr.contains(&format!("{}: ", urls[0]))
            && stderr.contains("it gave none to read")
            && stderr.contains(&format!(
                "nothing was taken by 1 of 2 instances: {}",
                urls[0]
            )),
        "{stderr}"
    );
    assert_eq!(callback_status(&taking, "rsa3072", "n-1").await, 200);
}

/// An address the command refuses (plain http to another machine: the token would cross the
/// network in the clear) is found before any instance is asked: none is left half-read.
#[tokio::test]
async fn an_address_refused_leaves_every_instance_unasked() {
    let (server, file) = service().await;
    rotate(&file, &["rsa3072"]);
    let here = format!("http://{}", server.addr);
    let output = credentials_command("read-again", &[&here, "http://10.0.0.2:8080"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("10.0.0.2"), "{stderr}");
    assert!(output.stdout.is_empty());
    assert_eq!(callback_status(&server, "rsa3072", "n-1").await, 401);
}
