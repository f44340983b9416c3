//! Identifiers from the wire are bounded and cannot forge log lines: a blank nonce is refused
//! (every blank nonce would share one deduplication record, so the second transaction would
//! be answered "already processed" and never booked), a nonce or client id longer than
//! `server.max_identifier_chars` is refused before it reaches memory, the store or the logs,
//! and control characters in logged values are escaped.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use std::sync::{Arc, Mutex, OnceLock};
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
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .init();
        logs
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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

#[tokio::test]
async fn control_characters_from_the_wire_cannot_forge_a_log_line() {
    let logs = logs();
    let server = TestServer::start().await;
    let forged = "\n2026-01-01T00:00:00.000000Z  INFO payhook: FORGED\r\u{1b}[2K\0";
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
            !line.contains(['\r', '\u{1b}', '\0']),
            "raw control: {line:?}"
        );
        assert!(line.len() <= 4096, "a log line of {} bytes", line.len());
    }
}
