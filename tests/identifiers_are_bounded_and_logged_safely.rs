//! Identifiers from the wire are bounded and cannot forge log lines: a blank nonce is refused
//! (every blank nonce would share one deduplication record, so the second transaction would
//! be answered "already processed" and never booked), a nonce or client id longer than
//! `server.max_identifier_chars` is refused before it reaches memory, the store or the logs,
//! and control characters in logged values are escaped.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use std::sync::{Arc, Mutex};
use support::*;

/// Each endpoint with its fixture and the pointers to its nonce and client id.
const ENDPOINTS: [(&str, &str, &str, &str); 3] = [
    (
        PROVIDERS_PATH,
        PROVIDERS_VALIDATION,
        "/transactionData/paymentData/nonce",
        "/transactionData/merchantData/clientId",
    ),
    (
        VALIDATION_PATH,
        TRANSACTION_VALIDATION,
        "/paymentData/nonce",
        "/merchantData/clientId",
    ),
    (CALLBACK_PATH, CALLBACK, "/nonce", "/clientId"),
];

/// Everything logged by this test binary, as text.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    captured_logs(tracing::Level::INFO)
}

async fn send(server: &TestServer, path: &str, body: &str) -> RawResponse {
    server
        .send(&post(
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ))
        .await
}

#[tokio::test]
async fn a_blank_nonce_is_refused_on_every_endpoint() {
    logs();
    let server = TestServer::start().await;
    for (path, fixture, nonce, _) in ENDPOINTS {
        for blank in ["", "   ", "\t\n"] {
            let response = send(&server, path, &with(fixture, nonce, Some(json!(blank)))).await;
            assert_eq!(response.status, 400, "{path} {blank:?}");
            assert!(
                response.message().contains("must not be empty or blank"),
                "{path}: {}",
                response.message()
            );
        }
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn identifiers_up_to_the_limit_pass_and_longer_ones_are_refused() {
    logs();
    let server = TestServer::start().await;
    for (path, fixture, nonce, client) in ENDPOINTS {
        let longest = "n".repeat(256);
        let response = send(&server, path, &with(fixture, nonce, Some(json!(longest)))).await;
        assert_eq!(response.status, 200, "{path}: {}", response.message());
        for pointer in [nonce, client] {
            let body = with(fixture, pointer, Some(json!("x".repeat(257))));
            let response = send(&server, path, &body).await;
            assert_eq!(response.status, 400, "{path} {pointer}");
            assert!(
                response
                    .message()
                    .contains("longer than the 256 characters")
                    && response.message().contains("server.max_identifier_chars"),
                "{path}: {}",
                response.message()
            );
        }
        // A megabyte of nonce is refused the same way.
        let huge = with(fixture, nonce, Some(json!("n".repeat(1 << 20))));
        let mut config = test_config();
        config.server.body_limit = 2 << 20;
        let roomy = TestServer::start_with(config).await;
        assert_eq!(send(&roomy, path, &huge).await.status, 400, "{path}");
    }
}

/// A transaction validation's record keeps its currency (the payment a repeat must match):
/// held to the identifiers' limit, a currency cannot make each record as large as the body.
/// A providers validation keeps no currency, and a callback's is not refused for its
/// length (its refusal would lose the payment's result): a failing callback's record keeps
/// it cut.
#[tokio::test]
async fn a_validation_s_currency_is_bounded_as_its_record_keeps_it() {
    logs();
    let mut config = test_config();
    config.server.body_limit = 2 << 20;
    config.admin.token = Some("identifiers-test-token-0123456789".into());
    let server = TestServer::start_with(config).await;
    let currency = "/paymentData/currency";
    for refused in ["E".repeat(257), "E".repeat(1 << 20), "EU\u{0}R".to_owned()] {
        let body = with(TRANSACTION_VALIDATION, currency, Some(json!(refused)));
        let response = send(&server, VALIDATION_PATH, &body).await;
        assert_eq!(response.status, 400, "{}", response.message());
        assert!(
            response.message().contains("paymentData.currency"),
            "{}",
            response.message()
        );
    }
    assert!(server.merchant.calls().is_empty(), "no handler saw them");
    let longest = with(
        TRANSACTION_VALIDATION,
        currency,
        Some(json!("E".repeat(256))),
    );
    let response = send(&server, VALIDATION_PATH, &longest).await;
    assert_eq!(response.status, 200, "{}", response.message());
    let callback = with(CALLBACK, "/currency", Some(json!("E".repeat(1 << 20))));
    let response = send(&server, CALLBACK_PATH, &callback).await;
    assert_eq!(response.status, 200, "{}", response.message());
    let failing = with(&callback, "/clientId", Some(json!("fail")));
    let failing = with(&failing, "/nonce", Some(json!("n-long-currency")));
    let response = send(&server, CALLBACK_PATH, &failing).await;
    assert_eq!(response.status, 503, "{}", response.message());
    let listed = failing_listed(&server, "identifiers-test-token-0123456789").await;
    let kept = listed[0]["currency"].as_str().unwrap();
    assert_eq!(kept, format!("{}…", "E".repeat(64)), "cut, not kept whole");
}

#[tokio::test]
async fn control_characters_from_the_wire_cannot_forge_a_log_line() {
    let logs = logs();
    let server = TestServer::start().await;
    // U+0000 is refused before anything is logged (see bad_input_gets_a_defined_status_and_message).
    let forged = "\n2026-01-01T00:00:00.000000Z  INFO payhook: FORGED\r\u{1b}[2K\u{7}";
    // A validation, then the same nonce for another payment: the nonce-reuse warning names
    // the client.
    let first = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!(format!("client{forged}"))),
    );
    let first = with(
        &first,
        "/paymentData/nonce",
        Some(json!(format!("nonce{forged}"))),
    );
    assert_eq!(send(&server, VALIDATION_PATH, &first).await.status, 200);
    let reuse = with(&first, "/paymentData/amount", Some(json!(99)));
    assert_eq!(send(&server, VALIDATION_PATH, &reuse).await.status, 403);
    let callback = with(CALLBACK, "/nonce", Some(json!(format!("cb{forged}"))));
    assert_eq!(send(&server, CALLBACK_PATH, &callback).await.status, 200);

    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(text.contains("nonce already used"), "{text}");
    assert!(text.contains("\\n2026-01-01T00:00:00"), "escaped: {text}");
    for line in text.lines() {
        assert!(!line.starts_with("2026-01-01T00:00:00"), "forged: {line}");
        assert!(
            !line.contains(['\r', '\u{1b}', '\u{7}', '\0']),
            "raw control: {line:?}"
        );
        assert!(line.len() <= 4096, "a log line of {} bytes", line.len());
    }
}

/// The JSON pointer of every scalar in `value` (strings, numbers, booleans).
fn scalar_pointers(value: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                scalar_pointers(child, &format!("{at}/{key}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                scalar_pointers(child, &format!("{at}/{index}"), out);
            }
        }
        serde_json::Value::Null => {}
        _ => out.push(at.to_owned()),
    }
}

/// `body` with the scalar at `pointer` replaced by `value` (arrays too, unlike `with`).
fn planted(body: &str, pointer: &str, value: &str) -> String {
    let mut json: serde_json::Value = serde_json::from_str(body).unwrap();
    let slot = json.pointer_mut(pointer).unwrap();
    let kept = slot.as_str().unwrap_or("").to_owned();
    *slot = json!(format!("{kept}{value}"));
    json.to_string()
}

/// Every log line written since `from` is one real line: no line begins with the forged
/// timestamp, and no raw CR, ESC or NUL reached the log.
fn assert_no_forged_line(from: usize, context: &str) {
    let bytes = logs().lock().unwrap()[from..].to_vec();
    let text = String::from_utf8(bytes).unwrap();
    for line in text.lines() {
        assert!(
            !line.starts_with("2026-01-01T00:00:00"),
            "{context}: forged: {line}"
        );
        assert!(
            !line.contains(['\r', '\u{1b}', '\u{7}', '\0']),
            "{context}: raw control: {line:?}"
        );
    }
}

/// Control characters planted in every field of every request, one field at a time and all
/// at once, sent to the library's endpoints and to the example merchant (whose own logs
/// name the client, the currency and the nonce): whatever is answered, nothing in the log
/// is a line the request wrote.
#[tokio::test]
async fn control_characters_in_any_field_forge_no_log_line_in_the_library_or_the_example() {
    use payhook::sim::example_merchant as merchant;

    let logs = logs();
    // U+0000 is refused before anything is logged (see bad_input_gets_a_defined_status_and_message).
    let forged = "\n2026-01-01T00:00:00.000000Z  INFO payhook: FORGED\r\u{1b}[2K\u{7}";
    let library = TestServer::start().await;
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("example");
    let store = merchant::open_store(&config).await.unwrap();
    let shop = merchant::Merchant {
        max_amount: rust_decimal::Decimal::from(1000),
        review_above: None,
        provider_tags: merchant::ProviderTags::default(),
    };
    let app = merchant::app(config, shop, store).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let example = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));

    let mut sent = 0;
    for (path, fixture, _, _) in ENDPOINTS {
        let mut pointers = Vec::new();
        scalar_pointers(&serde_json::from_str(fixture).unwrap(), "", &mut pointers);
        let mut bodies: Vec<(String, String)> = pointers
            .iter()
            .map(|p| (p.clone(), planted(fixture, p, forged)))
            .collect();
        let all_strings = pointers.iter().fold(fixture.to_owned(), |body, p| {
            let json: serde_json::Value = serde_json::from_str(&body).unwrap();
            if json.pointer(p).is_some_and(serde_json::Value::is_string) {
                planted(&body, p, forged)
            } else {
                body
            }
        });
        bodies.push(("every string field".to_owned(), all_strings));
        for (field, body) in bodies {
            let from = logs.lock().unwrap().len();
            let answer = send(&library, path, &body).await;
            assert!(answer.status < 500, "{path} {field}: {}", answer.status);
            let answer = post_to(example, path, &body).await;
            assert!(
                answer.status < 500,
                "{path} {field} (example): {}",
                answer.status
            );
            assert_no_forged_line(from, &format!("{path} {field}"));
            sent += 1;
        }
    }
    assert!(sent > 60, "every field of the three requests: {sent}");
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("\\n2026-01-01T00:00:00"),
        "something planted was logged, escaped"
    );
}

async fn post_to(address: std::net::SocketAddr, path: &str, body: &str) -> RawResponse {
    exchange(
        address,
        &post(
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ),
    )
    .await
}
