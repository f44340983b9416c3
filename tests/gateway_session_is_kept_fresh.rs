//! The gateway client against a fake aggregator on loopback: lazy login, refresh ahead of
//! expiry, login again when the refresh token expired, one refresh and one retry on a 401,
//! one renewal shared by concurrent callers, typed errors, and no secret in `Debug`.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use chrono::TimeDelta;
use payhook::gateway::{GatewayClient, GatewayError};
use payhook::model::PostponedValidationResult;
use serde_json::json;
use std::time::Duration;
use support::gateway::{FakeGateway, PASSWORD};

const REFERENCE: &str = "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e";

fn record(reference: &str, nonce: &str, status: i32) -> serde_json::Value {
    json!({
        "id": 77, "transactionReferenceId": reference, "providerId": 11, "merchantClientId": "client-42",
        "accountData": {}, "nonce": nonce, "amount": 25.50, "currency": "EUR", "destinationAmount": null,
        "transactionType": 1, "transactionStatus": status, "transactionStatusMessage": "Success",
        "callbackDeliveryStatus": "Failed", "isCallbackSendingCanceled": false,
        "createdUtc": "2026-01-02T03:04:05Z", "updatedUtc": "2026-01-02T03:04:06Z"
    })
}

/// Looks the fixture transaction up; panics when that fails.
async fn look_up(client: &GatewayClient) -> payhook::model::TransactionRecord {
    client
        .transaction(REFERENCE.parse().unwrap())
        .await
        .unwrap()
}

/// Twenty lookups at the same moment, each of which must succeed.
async fn twenty_at_once(client: &GatewayClient) {
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { look_up(&client).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
}

async fn gateway_with_record() -> (FakeGateway, GatewayClient) {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.transactions
            .insert(REFERENCE.to_owned(), record(REFERENCE, "n-1", 4))
    });
    let client = GatewayClient::new(&gateway.config()).unwrap();
    (gateway, client)
}

#[tokio::test]
async fn logs_in_on_first_use_and_reuses_the_token() {
    let (gateway, client) = gateway_with_record().await;
    assert_eq!(
        gateway.with(|s| s.logins),
        0,
        "no login before the first call"
    );
    for _ in 0..3 {
        let record = look_up(&client).await;
        assert_eq!(record.nonce, "n-1");
        assert_eq!(record.amount.to_string(), "25.5");
    }
    assert_eq!(gateway.with(|s| (s.logins, s.refreshes)), (1, 0));
}

/// Tokens that live one second: with the default margin (60 s) capped at half the
/// lifetime, a token is renewed once half a second of it has passed.
const SHORT_LIFETIME: TimeDelta = TimeDelta::seconds(1);

/// Longer than half of [`SHORT_LIFETIME`]: a token received before it is due for renewal.
/// (A lower bound only: a slower machine makes the token older still, never younger.)
const PAST_HALF_LIFE: Duration = Duration::from_millis(600);

#[tokio::test]
async fn refreshes_ahead_of_the_access_token_expiry() {
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| s.access_lifetime = SHORT_LIFETIME);
    look_up(&client).await;
    tokio::time::sleep(PAST_HALF_LIFE).await;
    look_up(&client).await;
    assert_eq!(
        gateway.with(|s| (s.logins, s.refreshes, s.unauthorized)),
        (1, 1, 0),
        "renewed before use, never used expired"
    );
}

#[tokio::test]
async fn a_token_shorter_lived_than_the_margin_is_not_refreshed_before_every_call() {
    let (gateway, client) = gateway_with_record().await;
    // Tokens live 30 s; the default margin is 60 s. Capped at half the lifetime (15 s), the
    // margin leaves the token usable: calls in quick succession share it.
    gateway.with(|s| s.access_lifetime = TimeDelta::seconds(30));
    for _ in 0..5 {
        look_up(&client).await;
    }
    assert_eq!(
        gateway.with(|s| (s.logins, s.refreshes, s.unauthorized)),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn logs_in_again_when_the_refresh_token_expired_too() {
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| {
        s.access_lifetime = SHORT_LIFETIME;
        s.refresh_lifetime = TimeDelta::seconds(-1);
    });
    look_up(&client).await;
    tokio::time::sleep(PAST_HALF_LIFE).await;
    look_up(&client).await;
    assert_eq!(gateway.with(|s| (s.logins, s.refreshes)), (2, 0));
}

/// The spec does not say how a refused refresh is answered: a refresh token revoked and
/// refused with 404 or 422 — or failing with 500, as a service may answer one it cannot
/// find — leads to a new login, as a 401 does, not to failing every call until the refresh
/// token would have expired.
#[tokio::test]
async fn a_refresh_that_fails_with_any_status_logs_in_again() {
    for status in [404, 422, 500, 503] {
        let (gateway, client) = gateway_with_record().await;
        gateway.with(|s| {
            s.access_lifetime = SHORT_LIFETIME;
            s.refuse_refreshes = Some(status);
        });
        look_up(&client).await;
        tokio::time::sleep(PAST_HALF_LIFE).await;
        look_up(&client).await;
        assert_eq!(
            gateway.with(|s| (s.logins, s.refreshes)),
            (2, 0),
            "{status}"
        );
    }
}

/// A refusal that quotes the request (a proxy's error page) keeps no secret in the error,
/// which the outbox stores and the inspector shows.
#[tokio::test]
async fn a_refusal_that_echoes_the_request_keeps_no_password_or_refresh_token() {
    let (gateway, client) = gateway_with_record().await;
    let session = client.login().await.unwrap();
    gateway.with(|s| {
        s.echo_refusals = true;
        s.refuse_logins = true;
        s.refuse_refreshes = Some(401);
    });
    let refused_login = client.login().await.unwrap_err();
    let refused_refresh = client.refresh(&session.refresh_token).await.unwrap_err();
    for error in [refused_login, refused_refresh] {
        let GatewayError::BadCredentials { message, .. } = &error else {
            panic!("not a refusal: {error:?}");
        };
        assert!(
            message.contains("refused:") && message.contains("***"),
            "{message}"
        );
        for text in [message.clone(), error.to_string(), format!("{error:?}")] {
            assert!(!text.contains(PASSWORD), "{text}");
            assert!(!text.contains(session.refresh_token.expose()), "{text}");
        }
    }
    // A password with characters JSON escapes is quoted escaped: redacted all the same.
    let mut config = gateway.config();
    let odd = r#"pa"ss\word-0123"#;
    config.password = Some(payhook::Secret::new(odd));
    let error = GatewayClient::new(&config)
        .unwrap()
        .login()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("***"), "{text}");
    assert!(!text.contains("word-0123"), "{text}");
}

#[tokio::test]
async fn a_401_renews_the_session_once_and_retries_once() {
    let (gateway, client) = gateway_with_record().await;
    look_up(&client).await;
    gateway.with(|s| s.revoke_access_tokens());
    let record = look_up(&client).await;
    assert_eq!(record.nonce, "n-1");
    assert_eq!(
        gateway.with(|s| (s.logins, s.refreshes, s.unauthorized)),
        (1, 1, 1),
        "one 401, one refresh, one retry"
    );
}

/// An aggregator whose clock is behind this host's (or whose times come without their zone)
/// hands out tokens that look expired on arrival: they are used until it refuses one, not
/// renewed before every call.
#[tokio::test]
async fn a_token_that_looks_expired_on_arrival_is_used_until_refused() {
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| s.reported_skew = TimeDelta::minutes(-70));
    for _ in 0..3 {
        look_up(&client).await;
    }
    assert_eq!(
        gateway.with(|s| (s.logins, s.refreshes, s.unauthorized)),
        (1, 0, 0),
        "one login, its token used"
    );
    // Refused (expired by the aggregator's clock): renewed once, and used again.
    gateway.with(|s| s.revoke_access_tokens());
    for _ in 0..3 {
        look_up(&client).await;
    }
    assert_eq!(
        gateway.with(|s| (s.logins, s.refreshes, s.unauthorized)),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn a_second_401_is_an_error_not_a_loop() {
    let (gateway, client) = gateway_with_record().await;
    // Every token is born expired: each call gets 401.
    gateway.with(|s| s.access_lifetime = TimeDelta::seconds(-10));
    let error = client
        .transaction(REFERENCE.parse().unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.status(), Some(401), "{error}");
    assert!(error.is_transient());
    assert_eq!(
        gateway.with(|s| s.unauthorized),
        2,
        "the call and one retry"
    );
}

#[tokio::test]
async fn concurrent_callers_share_one_login() {
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| s.login_delay = Duration::from_millis(200));
    twenty_at_once(&client).await;
    assert_eq!(gateway.with(|s| (s.logins, s.refreshes)), (1, 0));
}

#[tokio::test]
async fn concurrent_callers_on_an_expiring_token_share_one_refresh() {
    let (gateway, client) = gateway_with_record().await;
    look_up(&client).await;
    gateway.with(|s| s.revoke_access_tokens());
    twenty_at_once(&client).await;
    assert_eq!(
        gateway.with(|s| s.refreshes),
        1,
        "one refresh for twenty callers"
    );
}

#[tokio::test]
async fn a_refused_login_is_not_tried_again_by_every_caller_waiting_for_it() {
    // A password changed at the aggregator while results are queued: one refused login,
    // not one per result (an account lock-out), until the client's pause (2 s) has passed.
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| {
        s.refuse_logins = true;
        s.login_delay = Duration::from_millis(200);
    });
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.transaction(REFERENCE.parse().unwrap()).await })
        })
        .collect();
    for call in calls {
        let error = call.await.unwrap().unwrap_err();
        assert!(
            matches!(error, GatewayError::BadCredentials { .. }),
            "{error:?}"
        );
    }
    assert_eq!(gateway.with(|s| s.login_attempts), 1);
    // Once the pause has passed, the next call logs in again.
    gateway.with(|s| s.refuse_logins = false);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    look_up(&client).await;
    assert_eq!(gateway.with(|s| (s.login_attempts, s.logins)), (2, 1));
}

#[tokio::test]
async fn callers_that_give_up_leave_the_login_to_finish_for_the_next_one() {
    // Handlers stopped at their timeout while the auth endpoint is slow (a login takes 2 s
    // here): their login goes on, and the next caller uses it. Abandoned with its caller,
    // each caller next in line logged in again, and no session was ever kept.
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| s.login_delay = Duration::from_secs(2));
    for _ in 0..5 {
        let call = client.transaction(REFERENCE.parse().unwrap());
        let gave_up = tokio::time::timeout(Duration::from_millis(100), call).await;
        assert!(gave_up.is_err(), "answered before the login was");
    }
    look_up(&client).await;
    assert_eq!(gateway.with(|s| (s.login_attempts, s.logins)), (1, 1));
}

#[tokio::test]
async fn a_refresh_token_the_aggregator_refused_is_not_sent_again() {
    // The refresh refused and the login after it too (the auth endpoint failing): the token
    // held serves until it expires; the next renewal logs in, without the refused refresh.
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| s.access_lifetime = SHORT_LIFETIME);
    look_up(&client).await;
    tokio::time::sleep(PAST_HALF_LIFE).await;
    gateway.with(|s| {
        s.refuse_refreshes = Some(400);
        s.refuse_logins = true;
    });
    look_up(&client).await;
    assert_eq!(
        gateway.with(|s| (s.refresh_attempts, s.login_attempts)),
        (1, 2)
    );
    gateway.with(|s| s.refuse_logins = false);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    look_up(&client).await;
    assert_eq!(
        gateway.with(|s| (s.refresh_attempts, s.login_attempts, s.logins)),
        (1, 3, 2)
    );
}

#[tokio::test]
async fn calls_go_on_with_a_good_token_while_a_renewal_ahead_of_its_expiry_is_slow() {
    // Tokens of 16 s are renewed once 8 s of them have passed; the renewal (the refresh
    // refused, then a login that takes 2 s) holds the session, and a call meanwhile uses
    // the token, good for another 8 s (more than the 5 s a token must have left to be used
    // so), instead of waiting behind it.
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| s.access_lifetime = TimeDelta::seconds(16));
    look_up(&client).await;
    tokio::time::sleep(Duration::from_millis(8_100)).await;
    gateway.with(|s| {
        s.refuse_refreshes = Some(400);
        s.login_delay = Duration::from_secs(2);
    });
    let renewing = tokio::spawn({
        let client = client.clone();
        async move { look_up(&client).await }
    });
    while client.session_state() != payhook::gateway::SessionState::Renewing {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    look_up(&client).await;
    assert_eq!(
        client.session_state(),
        payhook::gateway::SessionState::Renewing,
        "the call was answered while the renewal went on"
    );
    renewing.await.unwrap();
    assert_eq!(gateway.with(|s| (s.logins, s.unauthorized)), (2, 0));
}

#[tokio::test]
async fn a_token_due_for_renewal_is_used_until_it_expires_when_the_renewal_fails() {
    // Tokens of 4 s are renewed once 2 s of them have passed; the renewal (a login: the
    // refresh token is too close to its own expiry) is refused, and the token, good for
    // another 2 s, is used meanwhile.
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| {
        s.access_lifetime = TimeDelta::seconds(4);
        s.refresh_lifetime = TimeDelta::seconds(4);
    });
    look_up(&client).await;
    gateway.with(|s| s.refuse_logins = true);
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    look_up(&client).await;
    look_up(&client).await;
    assert_eq!(
        gateway.with(|s| (s.login_attempts, s.logins)),
        (2, 1),
        "one refused renewal; the held token served both lookups"
    );
}

#[tokio::test]
async fn wrong_credentials_are_a_clear_error_without_the_password() {
    let (gateway, _) = gateway_with_record().await;
    let mut config = gateway.config();
    config.password = Some(payhook::Secret::new("not-the-password"));
    let client = GatewayClient::new(&config).unwrap();
    let error = client.login().await.unwrap_err();
    assert!(
        matches!(&error, GatewayError::BadCredentials { message, .. } if message == "invalid username or password"),
        "{error:?}"
    );
    let client = GatewayClient::new(&gateway.config()).unwrap();
    let session = client.login().await.unwrap();
    for text in [
        format!("{client:?}"),
        format!("{session:?}"),
        format!("{:?}", gateway.config()),
    ] {
        assert!(!text.contains(PASSWORD), "{text}");
        assert!(!text.contains(session.access_token.expose()), "{text}");
    }
}

#[tokio::test]
async fn postponed_results_are_200_the_same_again_and_403_for_a_different_one() {
    let (gateway, client) = gateway_with_record().await;
    let result = |success| PostponedValidationResult {
        validation_id: 5.into(),
        success,
        description: "checked".into(),
    };
    client.post_validation_result(&result(true)).await.unwrap();
    client.post_validation_result(&result(true)).await.unwrap();
    let error = client
        .post_validation_result(&result(false))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            GatewayError::Conflict {
                validation_id,
                ..
            } if validation_id.get() == 5
        ),
        "{error:?}"
    );
    assert!(!error.is_transient());
    gateway.with(|s| s.fail_next.push_back(503));
    let error = client
        .post_validation_result(&result(true))
        .await
        .unwrap_err();
    assert_eq!(error.status(), Some(503));
    assert!(error.is_transient());
}

/// An answer to a result post that quotes the request (a proxy's error page) keeps no access
/// token in the error, which the outbox stores as the last error and the inspector shows, and
/// a long message is cut short.
#[tokio::test]
async fn an_answer_that_echoes_the_request_keeps_no_access_token() {
    let (gateway, client) = gateway_with_record().await;
    let session = client.login().await.unwrap();
    let result = PostponedValidationResult {
        validation_id: 6.into(),
        success: true,
        description: "checked".into(),
    };
    gateway.with(|s| {
        s.echo_failures = true;
        s.fail_next.extend([503, 403]);
    });
    for _ in 0..2 {
        let error = client.post_validation_result(&result).await.unwrap_err();
        let (GatewayError::Status { message, .. } | GatewayError::Conflict { message, .. }) =
            &error
        else {
            panic!("{error:?}");
        };
        assert!(
            message.starts_with("refused: Authorization: Bearer ***"),
            "{message}"
        );
        assert_eq!(message.chars().count(), 200, "{message}");
        for text in [message.clone(), error.to_string(), format!("{error:?}")] {
            assert!(!text.contains(session.access_token.expose()), "{text}");
        }
    }
}

#[tokio::test]
async fn an_unknown_reference_id_is_the_aggregators_404() {
    let (_gateway, client) = gateway_with_record().await;
    let error = client
        .transaction("00000000-0000-0000-0000-000000000000".parse().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, GatewayError::Status { status: 404, message, .. } if message == "transaction not found"),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_unreachable_or_silent_gateway_is_a_network_error_or_a_timeout() {
    let (mut gateway, _) = gateway_with_record().await;
    let config = gateway.config();
    gateway.stop();
    let error = GatewayClient::new(&config)
        .unwrap()
        .login()
        .await
        .unwrap_err();
    assert!(matches!(error, GatewayError::Network { .. }), "{error:?}");
    assert!(error.is_transient());

    // A server that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = config;
    config.auth_url = Some(format!("http://{}", silent.local_addr().unwrap()));
    config.timeout = Duration::from_millis(300);
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let error = GatewayClient::new(&config)
        .unwrap()
        .login()
        .await
        .unwrap_err();
    assert!(matches!(error, GatewayError::Timeout { .. }), "{error:?}");
    held.abort();
}

#[test]
fn plain_http_is_refused_off_loopback() {
    let load = |url: &str| {
        payhook::Config::load(
            None,
            [("PAYHOOK_GATEWAY_GATEWAY_URL".to_owned(), url.to_owned())],
        )
    };
    assert!(load("https://gateway.example.com").is_ok());
    assert!(load("http://127.0.0.1:9000").is_ok());
    assert!(load("http://localhost:9000").is_ok());
    let error = load("http://gateway.example.com").unwrap_err().to_string();
    assert!(
        error.contains("gateway.gateway_url") && error.contains("loopback"),
        "{error}"
    );
}

#[test]
fn the_builder_needs_urls_and_credentials_and_refuses_plain_http_off_loopback() {
    let missing = GatewayClient::builder()
        .auth_url("https://auth.example")
        .gateway_url("https://gateway.example")
        .build()
        .unwrap_err();
    assert!(
        missing.to_string().contains("gateway.username"),
        "{missing}"
    );
    let plain = GatewayClient::builder()
        .auth_url("http://auth.example")
        .gateway_url("https://gateway.example")
        .credentials("shop", "pw")
        .build()
        .unwrap_err();
    assert!(plain.to_string().contains("loopback"), "{plain}");
    GatewayClient::builder()
        .auth_url("http://127.0.0.1:9")
        .gateway_url("http://127.0.0.1:9")
        .credentials("shop", "pw")
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
}

#[tokio::test]
async fn new_credentials_end_the_pause_the_refused_ones_began() {
    // The password changed at the aggregator: the old one is refused and logins pause (2 s
    // and more). Given the new one, the next call logs in at once, in every clone.
    let (gateway, client) = gateway_with_record().await;
    gateway.with(|s| s.password = "the-new-password".to_owned());
    for _ in 0..2 {
        let error = client
            .transaction(REFERENCE.parse().unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(error, GatewayError::BadCredentials { .. }),
            "{error:?}"
        );
    }
    assert_eq!(gateway.with(|s| s.login_attempts), 1, "paused after one");

    let clone = client.clone();
    assert!(clone.replace_credentials(support::gateway::USERNAME, "the-new-password"));
    assert!(
        !client.replace_credentials(support::gateway::USERNAME, "the-new-password"),
        "the same ones change nothing"
    );
    look_up(&client).await;
    assert_eq!(gateway.with(|s| (s.login_attempts, s.logins)), (2, 1));
    assert!(
        !format!("{client:?}").contains("the-new-password"),
        "{client:?}"
    );
}
