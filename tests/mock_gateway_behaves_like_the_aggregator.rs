//! The simulator's mock gateway, driven by payhook's own gateway client: real JWTs with short
//! lifetimes force the client's refresh, results follow spec 3.2, lookups return 2.6 records,
//! errors are `{"message"}` bodies, and a state directory survives a restart.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::gateway::{GatewayClient, GatewayError};
use payhook::model::{PostponedValidationResult, TransactionRecord};
use payhook::sim::{MockGateway, MockGatewayConfig};
use serde_json::json;
use std::time::Duration;

fn record(reference: &str) -> TransactionRecord {
    serde_json::from_value(json!({
        "id": 7, "transactionReferenceId": reference, "providerId": 11, "providerName": "Card",
        "merchantClientId": "client-42", "accountData": {}, "nonce": "n-7", "amount": "12.30",
        "currency": "EUR", "transactionType": 1, "transactionStatus": 4,
        "callbackDeliveryStatus": "Delivered", "isCallbackSendingCanceled": false
    }))
    .unwrap()
}

const REFERENCE: &str = "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e";

#[tokio::test]
async fn short_lived_tokens_are_refreshed_at_half_life_and_lookups_return_records() {
    let mock = MockGateway::start(MockGatewayConfig {
        access_lifetime: Duration::from_secs(2),
        ..MockGatewayConfig::default()
    })
    .await
    .unwrap();
    mock.put_transaction(record(REFERENCE));
    // The client refreshes 60 s ahead of expiry, but at most half the token's lifetime
    // ahead: a 2 s token is used for its first second, then renewed.
    let client = GatewayClient::new(&mock.gateway_config()).unwrap();
    let look_up = || async {
        let found = client
            .transaction(REFERENCE.parse().unwrap())
            .await
            .unwrap();
        assert_eq!(found, record(REFERENCE));
    };
    look_up().await;
    look_up().await;
    // Past half the token's life (a lower bound: a slow machine only makes it older).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    look_up().await;
    look_up().await;
    let counters = mock.counters();
    assert_eq!(
        (counters.logins, counters.refreshes, counters.unauthorized),
        (1, 1, 0)
    );

    let missing = client
        .transaction("00000000-0000-0000-0000-000000000000".parse().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&missing, GatewayError::Status { status: 404, message, .. } if message == "transaction not found"),
        "{missing:?}"
    );
}

#[tokio::test]
async fn a_second_different_result_is_refused_with_403_and_the_same_one_accepted() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let client = GatewayClient::new(&mock.gateway_config()).unwrap();
    let result = |success| PostponedValidationResult {
        validation_id: 42.into(),
        success,
        description: "reviewed".into(),
    };
    client.post_validation_result(&result(true)).await.unwrap();
    client.post_validation_result(&result(true)).await.unwrap();
    let refused = client
        .post_validation_result(&result(false))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            GatewayError::Conflict {
                validation_id,
                ..
            } if validation_id.get() == 42
        ),
        "{refused:?}"
    );
    assert_eq!(mock.validation_result(42.into()), Some(result(true)));
    assert_eq!(mock.counters().conflicts, 1);
    // Counted per validation too, as the simulator's `conflicts` expectation reads them.
    let control = payhook::sim::MockControl::new(&mock.url()).unwrap();
    let posts = |id: i64| control.validation_posts(id.into());
    assert_eq!(
        posts(42).await.unwrap(),
        payhook::sim::ValidationPosts {
            accepted: 2,
            refused: 1
        }
    );
    assert_eq!(
        posts(43).await.unwrap(),
        payhook::sim::ValidationPosts::default()
    );
}

#[tokio::test]
async fn wrong_credentials_missing_tokens_and_bad_ids_get_clear_errors() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let mut config = mock.gateway_config();
    config.password = Some("wrong".into());
    let error = GatewayClient::new(&config)
        .unwrap()
        .login()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, GatewayError::BadCredentials { message, .. } if message == "invalid username or password"),
        "{error:?}"
    );
    let unauthenticated = support::exchange(
        mock.addr(),
        &support::request(
            "GET",
            &format!("/api/v1/transactions/{REFERENCE}"),
            &[],
            None,
        ),
    )
    .await;
    assert_eq!(unauthenticated.status, 401);
    assert!(unauthenticated.message().contains("access token"));

    // A refresh token works once.
    let client = GatewayClient::new(&mock.gateway_config()).unwrap();
    let session = client.login().await.unwrap();
    client.refresh(&session.refresh_token).await.unwrap();
    let reused = client.refresh(&session.refresh_token).await.unwrap_err();
    assert!(
        matches!(reused, GatewayError::BadCredentials { .. }),
        "{reused:?}"
    );
}

#[tokio::test]
async fn a_state_directory_keeps_records_results_and_sessions_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = MockGatewayConfig {
        state: Some(dir.path().join("mock")),
        ..MockGatewayConfig::default()
    };
    let first = MockGateway::start(config.clone()).await.unwrap();
    first.put_transaction(record(REFERENCE));
    let client = GatewayClient::new(&first.gateway_config()).unwrap();
    let session = client.login().await.unwrap();
    client
        .post_validation_result(&PostponedValidationResult {
            validation_id: 1.into(),
            success: false,
            description: "no".into(),
        })
        .await
        .unwrap();
    first.stop().await;

    let second = MockGateway::start(config).await.unwrap();
    assert_eq!(
        second.transaction(REFERENCE.parse().unwrap()),
        Some(record(REFERENCE))
    );
    assert!(
        second
            .validation_result(1.into())
            .is_some_and(|r| !r.success)
    );
    // Tokens issued before the restart are still good: the signing secret is kept too.
    let client = GatewayClient::new(&second.gateway_config()).unwrap();
    client.refresh(&session.refresh_token).await.unwrap();
}

#[tokio::test]
async fn malformed_requests_get_400_with_a_message() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let session = GatewayClient::new(&mock.gateway_config())
        .unwrap()
        .login()
        .await
        .unwrap();
    let bearer = format!("Bearer {}", session.access_token.expose());
    let cases: [(&str, &str, Option<&[u8]>, &str); 5] = [
        (
            "POST",
            "/api/v1/login",
            Some(b"{oops"),
            "username and password",
        ),
        ("POST", "/api/v1/refresh-token", Some(b"{}"), "refreshToken"),
        (
            "POST",
            "/api/v1/transactions/validation",
            Some(br#"{"success": true}"#),
            "validationId",
        ),
        ("GET", "/api/v1/transactions/not-a-guid", None, "GUID"),
        (
            "PUT",
            "/sim/v1/transactions/x",
            Some(br#"{"id": 1}"#),
            "not a transaction record",
        ),
    ];
    for (method, path, body, says) in cases {
        let headers = [
            ("content-type", "application/json"),
            ("authorization", bearer.as_str()),
        ];
        let answer =
            support::exchange(mock.addr(), &support::request(method, path, &headers, body)).await;
        assert_eq!(answer.status, 400, "{method} {path}");
        assert!(
            answer.message().contains(says),
            "{method} {path}: {}",
            answer.message()
        );
    }
}
