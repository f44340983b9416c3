//! A valid request to each endpoint, built from the spec's field tables, gets the answer
//! DESIGN.md documents — and each merchant decision maps to its status code.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use support::*;

#[tokio::test]
async fn providers_validation_answers_the_providers_fit_for_currency_pay_type_and_direction() {
    let server = TestServer::start().await;
    let response = server.post_json(PROVIDERS_PATH, PROVIDERS_VALIDATION).await;
    assert_eq!(response.status, 200);
    let body = response.json();
    let ids: Vec<i64> = body["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        [11],
        "USD-only and payout-only providers are filtered out: {body}"
    );
    assert_eq!(body["message"], "1 provider(s) available");
    assert_eq!(
        body["providers"][0]["payTypes"][0]["isCashInEnabled"], true,
        "response shape of 2.2"
    );
    let calls = server.merchant.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].nonce, "nonce-pv-1");
    assert_eq!(
        calls[0].amount, "10.50",
        "the amount reaches the handler exactly"
    );
}

#[tokio::test]
async fn transaction_validation_allow_is_200() {
    let server = TestServer::start().await;
    let response = server
        .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
        .await;
    assert_eq!(response.status, 200);
    assert_eq!(server.merchant.calls()[0].amount, "250.00");
}

#[tokio::test]
async fn transaction_validation_deny_is_403_with_the_merchants_message() {
    let server = TestServer::start().await;
    let body = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!("deny")),
    );
    let response = server.post_json(VALIDATION_PATH, &body).await;
    assert_eq!(response.status, 403);
    assert_eq!(response.message(), "client is blocked");
}

#[tokio::test]
async fn postpone_on_an_endpoint_not_declared_awaitable_is_a_clear_500_never_a_silent_200() {
    let server = TestServer::start().await;
    let body = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!("postpone")),
    );
    // Nothing is recorded: the aggregator's retry gets the same clear 500 (the handler runs
    // again), never a recorded — silent — 200.
    for attempt in 1..=2 {
        let response = server.post_json(VALIDATION_PATH, &body).await;
        assert_eq!(response.status, 500, "attempt {attempt}");
        assert!(
            response.message().contains("not Awaitable"),
            "{}",
            response.message()
        );
        assert_eq!(server.merchant.calls().len(), attempt);
    }
}

#[tokio::test]
async fn callback_ack_is_200() {
    let server = TestServer::start().await;
    let response = server.post_json(CALLBACK_PATH, CALLBACK).await;
    assert_eq!(response.status, 200);
    let calls = server.merchant.calls();
    assert_eq!(
        (
            calls[0].endpoint,
            calls[0].nonce.as_str(),
            calls[0].amount.as_str()
        ),
        ("callback", "nonce-cb-1", "0.1")
    );
}

#[tokio::test]
async fn callback_retry_later_is_503_with_retry_after() {
    let server = TestServer::start().await;
    let body = with(CALLBACK, "/clientId", Some(json!("retry")));
    let response = server.post_json(CALLBACK_PATH, &body).await;
    assert_eq!(response.status, 503);
    assert_eq!(response.header("retry-after"), Some("30"));
    assert_eq!(response.message(), "ledger is being migrated");
}

#[tokio::test]
async fn a_failing_handler_gets_a_generic_message_and_never_leaks_its_detail() {
    let server = TestServer::start().await;
    for (path, fixture, pointer, status) in [
        (
            PROVIDERS_PATH,
            PROVIDERS_VALIDATION,
            "/transactionData/merchantData/clientId",
            500,
        ),
        (
            VALIDATION_PATH,
            TRANSACTION_VALIDATION,
            "/merchantData/clientId",
            500,
        ),
        (CALLBACK_PATH, CALLBACK, "/clientId", 503),
    ] {
        for client in ["fail", "panic"] {
            let mut body = with(fixture, pointer, Some(json!(client)));
            if path == VALIDATION_PATH {
                // A nonce belongs to one client: another client needs its own nonce.
                body = with(
                    &body,
                    "/paymentData/nonce",
                    Some(json!(format!("n-{client}"))),
                );
            }
            let calls_before = server.merchant.calls().len();
            let response = server.post_json(path, &body).await;
            assert_eq!(response.status, status, "{path} {client}");
            // The handler ran (the failure is its own, not an earlier refusal).
            assert_eq!(
                server.merchant.calls().len(),
                calls_before + 1,
                "{path} {client}"
            );
            let message = response.message();
            assert!(!message.contains("secret-detail"), "{path}: {message}");
            assert_eq!(
                response.header("retry-after").is_some(),
                path == CALLBACK_PATH,
                "{path}"
            );
        }
    }
}

#[tokio::test]
async fn a_handler_that_overruns_its_timeout_gets_503() {
    let mut config = test_config();
    config.server.handler_timeout = std::time::Duration::from_millis(200);
    let server = TestServer::start_with(config).await;
    let response = server
        .post_json(
            CALLBACK_PATH,
            &with(CALLBACK, "/clientId", Some(json!("slow"))),
        )
        .await;
    assert_eq!(response.status, 503);
    assert!(response.header("retry-after").is_some());
    let response = server
        .post_json(
            VALIDATION_PATH,
            &with(
                TRANSACTION_VALIDATION,
                "/merchantData/clientId",
                Some(json!("slow")),
            ),
        )
        .await;
    assert_eq!(response.status, 503);
    assert_eq!(response.message(), "request not processed in time");
}

#[tokio::test]
async fn the_context_carries_the_callers_request_id_and_address() {
    let server = TestServer::start().await;
    let request = post(
        CALLBACK_PATH,
        &[
            ("Content-Type", "application/json"),
            ("X-Request-Id", "agg-7"),
        ],
        CALLBACK.as_bytes(),
    );
    let response = server.send(&request).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("x-request-id"), Some("agg-7"));
    let seen = &server.merchant.calls()[0];
    assert_eq!(seen.request_id, "agg-7");
    assert_eq!(
        seen.peer.map(|p| p.ip().to_string()).as_deref(),
        Some("127.0.0.1")
    );
}

#[tokio::test]
async fn charset_utf8_json_is_accepted() {
    let server = TestServer::start().await;
    let request = post(
        CALLBACK_PATH,
        &[("Content-Type", "application/json; charset=utf-8")],
        CALLBACK.as_bytes(),
    );
    assert_eq!(server.send(&request).await.status, 200);
}

#[tokio::test]
async fn health_and_readiness_answer_get() {
    let server = TestServer::start().await;
    for path in ["/healthz", "/readyz"] {
        let response = server.send(&request("GET", path, &[], None)).await;
        assert_eq!(response.status, 200, "{path}");
    }
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served() {
    let server = TestServer::start().await;
    let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("http://{}{CALLBACK_PATH}", server.addr))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            CALLBACK.as_bytes(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn an_unknown_status_code_and_unknown_fields_reach_the_handler() {
    // The aggregator may add codes and fields: a callback is never refused for them.
    let server = TestServer::start().await;
    let body = with(CALLBACK, "/transactionStatus", Some(json!(99)));
    let body = with(&body, "/someFutureField", Some(json!({"nested": [1, 2]})));
    let response = server.post_json(CALLBACK_PATH, &body).await;
    assert_eq!(response.status, 200, "{}", response.message());
    let calls = server.merchant.calls();
    assert_eq!(
        (calls.len(), calls[0].endpoint, calls[0].nonce.as_str()),
        (1, "callback", "nonce-cb-1")
    );
}

/// JSON (and the OpenAPI document) counts `42.0` and `4.2e1` as the integer 42: a sender
/// whose JSON writer goes through floating point is served like one that writes `42`, and
/// a free-form field may be null.
#[tokio::test]
async fn whole_numbers_written_as_floats_are_integers_and_free_form_fields_may_be_null() {
    let server = TestServer::start().await;
    let body = with(TRANSACTION_VALIDATION, "/validationId", Some(json!(4.2e1)));
    let body = with(&body, "/paymentData/providerId", Some(json!(11.0)));
    let body = with(&body, "/providerData", Some(json!(null)));
    let response = server.post_json(VALIDATION_PATH, &body).await;
    assert_eq!(response.status, 200, "{}", response.message());

    let body = with(CALLBACK, "/transactionStatus", Some(json!(4.0)));
    let body = with(&body, "/id", Some(json!(1001.0)));
    let body = with(&body, "/additionalData", Some(json!(null)));
    let response = server.post_json(CALLBACK_PATH, &body).await;
    assert_eq!(response.status, 200, "{}", response.message());
    assert_eq!(server.merchant.calls().len(), 2);
}
