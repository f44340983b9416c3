//! The merchant's user and password at the aggregator are read again while the service runs
//! (`Credentials::read_again`, on SIGHUP in the example merchant and `payhook new`'s service):
//! a password changed at the aggregator, refused until then, is sent at the next login —
//! at once, though logins were paused after the refusals. A configuration without one is
//! refused and changes nothing; the gateway's other settings wait for a restart.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::server::CredentialsRefused;
use serde_json::json;
use support::gateway::FakeGateway;
use support::*;

const TOKEN: &str = "admin-token-0123456789";
const REFERENCE: &str = "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e";
const NEW_PASSWORD: &str = "the-new-password";

/// The outcome of the operating API's reconcile of [`REFERENCE`], with its message.
async fn reconciled(server: &TestServer) -> (String, String) {
    let body = json!({"referenceIds": [REFERENCE]}).to_string();
    let answer = server
        .admin("POST", "/payhook/admin/reconcile", Some(TOKEN), Some(&body))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    let outcome = &answer.json()[0];
    let text = |key: &str| outcome[key].as_str().unwrap_or_default().to_owned();
    (text("outcome"), text("message"))
}

#[tokio::test]
async fn a_password_changed_at_the_aggregator_is_sent_at_the_next_login() {
    let logs = captured_logs(tracing::Level::INFO);
    let gateway = FakeGateway::start().await;
    // Within the store's retention: whether it was booked can be told.
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let record = json!({
        "id": 77, "transactionReferenceId": REFERENCE, "providerId": 11,
        "merchantClientId": "client-42", "accountData": {}, "nonce": "n-lost",
        "amount": 25.50, "currency": "EUR", "destinationAmount": null, "transactionType": 1,
        "transactionStatus": 4, "transactionStatusMessage": "Success",
        "callbackDeliveryStatus": "Failed", "isCallbackSendingCanceled": false,
        "createdUtc": now, "updatedUtc": now
    });
    gateway.with(|s| {
        s.transactions.insert(REFERENCE.to_owned(), record);
        s.password = NEW_PASSWORD.to_owned();
    });
    let mut started = test_config();
    started.gateway = gateway.config();
    started.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(started.clone()).await;

    // Refused, and paused: the second asks no login.
    for _ in 0..2 {
        let (outcome, message) = reconciled(&server).await;
        assert_eq!(outcome, "error", "{message}");
        assert!(
            message.contains("invalid username or password"),
            "{message}"
        );
    }
    assert_eq!(gateway.with(|s| s.login_attempts), 1);

    let mut next = server.as_run(&started);
    next.gateway.password = Some(payhook::Secret::new(NEW_PASSWORD));
    let change = server.app.credentials().read_again(&next).unwrap();
    assert!(change.gateway_login, "{change:?}");
    assert!(change.need_a_restart.is_empty(), "{change:?}");
    assert_eq!(
        change.to_string(),
        "gateway.username or gateway.password changed"
    );
    let (outcome, message) = reconciled(&server).await;
    assert_eq!(outcome, "booked", "{message}");
    assert_eq!(gateway.with(|s| (s.login_attempts, s.logins)), (2, 1));
    assert_eq!(callbacks_handled(&server, "n-lost"), 1);
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("gateway.username or gateway.password changed")
            && !text.contains(NEW_PASSWORD)
            && !text.contains(support::gateway::PASSWORD),
        "{text}"
    );

    // Nothing changed: nothing to say.
    assert!(
        server
            .app
            .credentials()
            .read_again(&next)
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn without_a_password_or_with_another_gateway_nothing_of_it_is_taken() {
    let gateway = FakeGateway::start().await;
    let mut started = test_config();
    started.gateway = gateway.config();
    started.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();

    for forget in [
        (|g: &mut payhook::config::GatewayConfig| g.password = None) as fn(&mut _),
        |g| g.username = None,
    ] {
        let mut without = server.as_run(&started);
        forget(&mut without.gateway);
        let error = credentials.read_again(&without).unwrap_err();
        assert!(
            matches!(error, CredentialsRefused::WouldLoseGatewayLogin),
            "{error:?}"
        );
    }

    // Another address with a new password: the password is taken, the address is not.
    gateway.with(|s| s.password = NEW_PASSWORD.to_owned());
    let mut elsewhere = server.as_run(&started);
    elsewhere.gateway.password = Some(payhook::Secret::new(NEW_PASSWORD));
    elsewhere.gateway.gateway_url = Some("https://gateway.example.com".into());
    let change = credentials.read_again(&elsewhere).unwrap();
    assert!(change.gateway_login);
    assert_eq!(change.need_a_restart, vec!["gateway"]);
    let (outcome, message) = reconciled(&server).await;
    assert_eq!(
        (outcome.as_str(), message.contains("404")),
        ("error", true),
        "the fake aggregator, logged in, knows no such transaction: {message}"
    );
}

/// A service that calls no aggregator takes no gateway credentials: a `[gateway]` section
/// read again waits for a restart.
#[tokio::test]
async fn a_service_without_a_gateway_takes_none() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start().await;
    let mut next = server.as_run(&test_config());
    next.gateway = gateway.config();
    let change = server.app.credentials().read_again(&next).unwrap();
    assert!(!change.gateway_login);
    assert_eq!(change.need_a_restart, vec!["gateway"]);

    // One its restart would fail on is refused now.
    next.gateway.ca_file = Some(server.data.path().join("no-such-ca.pem"));
    let error = server.app.credentials().read_again(&next).unwrap_err();
    assert!(
        matches!(error, CredentialsRefused::GatewayTls(_))
            && error.to_string().contains("gateway.ca_file"),
        "{error:?}"
    );
}

/// The gateway's TLS files are read again with the rest: a CA file replaced in place is a
/// change; one that cannot be used refuses the whole configuration — its password too.
#[tokio::test]
async fn the_gateways_tls_files_are_read_again_and_a_bad_one_refuses_all() {
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let ca = |name: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.self_signed(&key).unwrap().pem()
    };
    std::fs::write(&ca_file, ca("first")).unwrap();
    let mut started = test_config();
    started.gateway = gateway.config();
    started.gateway.ca_file = Some(ca_file.clone());
    started.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let config = server.as_run(&started);
    assert!(credentials.read_again(&config).unwrap().is_empty());

    std::fs::write(&ca_file, ca("second")).unwrap();
    let change = credentials.read_again(&config).unwrap();
    assert!(change.gateway_tls && !change.gateway_login, "{change:?}");
    assert_eq!(change.to_string(), "the gateway's TLS files changed");

    // Another path is taken too, and waits for no restart.
    let moved = dir.path().join("moved-ca.pem");
    std::fs::write(&moved, ca("moved")).unwrap();
    let mut elsewhere = config.clone();
    elsewhere.gateway.ca_file = Some(moved);
    let change = credentials.read_again(&elsewhere).unwrap();
    assert!(change.gateway_tls, "{change:?}");
    assert!(change.need_a_restart.is_empty(), "{change:?}");
    credentials.read_again(&config).unwrap();

    gateway.with(|s| s.password = NEW_PASSWORD.to_owned());
    let mut next = config.clone();
    next.gateway.password = Some(payhook::Secret::new(NEW_PASSWORD));
    std::fs::write(&ca_file, "not a certificate").unwrap();
    let error = credentials.read_again(&next).unwrap_err();
    assert!(
        matches!(error, CredentialsRefused::GatewayTls(_))
            && error.to_string().contains("gateway.ca_file"),
        "{error:?}"
    );
    let (outcome, message) = reconciled(&server).await;
    assert!(
        outcome == "error" && message.contains("invalid username or password"),
        "the old password still: {message}"
    );
    std::fs::write(&ca_file, ca("third")).unwrap();
    let change = credentials.read_again(&next).unwrap();
    assert!(change.gateway_tls && change.gateway_login, "{change:?}");
}
