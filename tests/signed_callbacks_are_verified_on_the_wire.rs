//! Through the real server: a signed callback reaches the handler; an unsigned, malformed or
//! forged one gets 401 saying which, and never does. The validation endpoints authenticate
//! the aggregator as configured.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use base64::Engine;
use payhook::config::AuthMethod;
use payhook::config::EndpointAuthConfig;
use payhook::signature::{Algorithm, Encoding};
use support::*;

fn sign(key: &str, body: &str) -> String {
    fixture_signer(key, Algorithm::RsaPkcs1Sha256)
        .header_value(body.as_bytes(), Encoding::Base64, None)
        .unwrap()
}

fn signed_post(path: &str, body: &str, signature: &str) -> Vec<u8> {
    post(
        path,
        &[
            ("Content-Type", "application/json"),
            ("X-Signature", signature),
        ],
        body.as_bytes(),
    )
}

#[tokio::test]
async fn a_signed_callback_reaches_the_handler() {
    let server = TestServer::start_with(signed_config(&["rsa2048"])).await;
    let response = server
        .send(&signed_post(
            CALLBACK_PATH,
            CALLBACK,
            &sign("rsa2048", CALLBACK),
        ))
        .await;
    assert_eq!(response.status, 200);
    assert_eq!(server.merchant.calls().len(), 1);
}

#[tokio::test]
async fn missing_malformed_and_forged_signatures_get_401_saying_which() {
    let server = TestServer::start_with(signed_config(&["rsa2048"])).await;
    let tampered = CALLBACK.replace("\"amount\": 0.1", "\"amount\": 1000.1");
    let valid = sign("rsa2048", CALLBACK);
    // Two signature headers, whichever verifies: which one was meant is not known.
    let twice = |second: &str| {
        post(
            CALLBACK_PATH,
            &[
                ("Content-Type", "application/json"),
                ("X-Signature", &valid),
                ("X-Signature", second),
            ],
            CALLBACK.as_bytes(),
        )
    };
    let cases: [(Vec<u8>, &str); 8] = [
        (twice("AAAA"), "malformed signature"),
        (twice(&valid), "malformed signature"),
        (
            post(
                CALLBACK_PATH,
                &[("Content-Type", "application/json")],
                CALLBACK.as_bytes(),
            ),
            "missing signature",
        ),
        (
            signed_post(CALLBACK_PATH, CALLBACK, "not base64!"),
            "malformed signature",
        ),
        (
            // Far longer than any signature, within what a head may take (64 KiB).
            signed_post(CALLBACK_PATH, CALLBACK, &"A".repeat(32 * 1024)),
            "malformed signature",
        ),
        (
            signed_post(CALLBACK_PATH, CALLBACK, &sign("rsa3072", CALLBACK)),
            "invalid signature",
        ),
        (
            signed_post(CALLBACK_PATH, &tampered, &sign("rsa2048", CALLBACK)),
            "invalid signature",
        ),
        (
            signed_post(CALLBACK_PATH, CALLBACK, "AAAA"),
            "invalid signature",
        ),
    ];
    for (request, expected) in cases {
        let response = server.send(&request).await;
        assert_eq!(response.status, 401, "{expected}");
        let message = response.message();
        assert!(
            message.starts_with(expected),
            "`{message}` should start with `{expected}`"
        );
    }
    assert!(server.merchant.calls().is_empty(), "the handler never ran");
}

#[tokio::test]
async fn the_signature_is_checked_before_the_body_is_parsed() {
    let server = TestServer::start_with(signed_config(&["rsa2048"])).await;
    // Unsigned garbage: 401, not 400 — nothing of an unauthenticated body is interpreted.
    let response = server
        .send(&post(
            CALLBACK_PATH,
            &[("Content-Type", "application/json")],
            b"{not json",
        ))
        .await;
    assert_eq!(response.status, 401);
    // Garbage with a signature of other bytes: the signature is checked first, so this is
    // an invalid signature (401), never the parser's 400.
    let response = server
        .send(&signed_post(
            CALLBACK_PATH,
            "{not json",
            &sign("rsa2048", CALLBACK),
        ))
        .await;
    assert_eq!(response.status, 401);
    assert!(
        response.message().starts_with("invalid signature"),
        "{}",
        response.message()
    );
    // Signed garbage: the signature holds, so the parser's 400 comes next.
    let response = server
        .send(&signed_post(
            CALLBACK_PATH,
            "{not json",
            &sign("rsa2048", "{not json"),
        ))
        .await;
    assert_eq!(response.status, 400);
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn with_keys_configured_allow_unsigned_does_not_let_an_unsigned_callback_in() {
    let mut config = signed_config(&["rsa2048"]);
    config.callback.allow_unsigned = true;
    let server = TestServer::start_with(config).await;
    let response = server.post_json(CALLBACK_PATH, CALLBACK).await;
    assert_eq!(response.status, 401);
    assert!(
        response.message().starts_with("missing signature"),
        "{}",
        response.message()
    );
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn during_rotation_both_keys_verify() {
    let server = TestServer::start_with(signed_config(&["rsa2048", "rsa3072"])).await;
    for key in ["rsa2048", "rsa3072"] {
        let body = with(
            CALLBACK,
            "/nonce",
            Some(serde_json::json!(format!("nonce-{key}"))),
        );
        let response = server
            .send(&signed_post(CALLBACK_PATH, &body, &sign(key, &body)))
            .await;
        assert_eq!(response.status, 200, "{key}");
    }
    assert_eq!(server.merchant.calls().len(), 2);
}

#[tokio::test]
async fn other_schemes_work_end_to_end_when_configured() {
    let mut config = signed_config(&["p256"]);
    config.signature.algorithm = Algorithm::EcdsaP256Sha256Fixed;
    config.signature.encoding = Encoding::Hex;
    config.signature.prefix = "sha256=".into();
    config.signature.header = "X-Hub-Signature".into();
    let server = TestServer::start_with(config).await;
    let value = fixture_signer("p256", Algorithm::EcdsaP256Sha256Fixed)
        .header_value(CALLBACK.as_bytes(), Encoding::Hex, Some("sha256="))
        .unwrap();
    let request = post(
        CALLBACK_PATH,
        &[
            ("Content-Type", "application/json"),
            ("X-Hub-Signature", &value),
        ],
        CALLBACK.as_bytes(),
    );
    assert_eq!(server.send(&request).await.status, 200);
    let in_default_header = signed_post(CALLBACK_PATH, CALLBACK, &value);
    assert_eq!(server.send(&in_default_header).await.status, 401);
}

#[test]
fn a_key_that_does_not_fit_the_algorithm_stops_the_build_naming_it() {
    let mut config = signed_config(&["ed25519"]);
    config.signature.algorithm = Algorithm::RsaPkcs1Sha256;
    let error = payhook::App::builder(config)
        .callback_receiver(TestMerchant::default())
        .build()
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("signature.keys[0]") && message.contains("ed25519"),
        "{message}"
    );
}

#[test]
fn without_keys_the_build_refuses_unless_unsigned_callbacks_are_allowed() {
    let error = payhook::App::builder(payhook::Config::default())
        .callback_receiver(TestMerchant::default())
        .build();
    assert!(error.unwrap_err().to_string().contains("allow_unsigned"));
    assert!(
        payhook::App::builder(test_config())
            .callback_receiver(TestMerchant::default())
            .without_store()
            .build()
            .is_ok()
    );
}

fn with_validation_auth(auth: EndpointAuthConfig) -> payhook::Config {
    let mut config = signed_config(&["rsa2048"]);
    config.auth.transaction_validation = auth.clone();
    config.auth.providers_validation = auth;
    config
}

#[tokio::test]
async fn a_shared_secret_header_authenticates_the_validations() {
    let server = TestServer::start_with(with_validation_auth(EndpointAuthConfig {
        method: AuthMethod::SharedSecret,
        secret: Some("s3cret-value-0123456".into()),
        ..Default::default()
    }))
    .await;
    for (path, body) in [
        (VALIDATION_PATH, TRANSACTION_VALIDATION),
        (PROVIDERS_PATH, PROVIDERS_VALIDATION),
    ] {
        let ok = post(
            path,
            &[
                ("Content-Type", "application/json"),
                ("X-Api-Key", "s3cret-value-0123456"),
            ],
            body.as_bytes(),
        );
        assert_eq!(server.send(&ok).await.status, 200, "{path}");
        let wrong = post(
            path,
            &[
                ("Content-Type", "application/json"),
                ("X-Api-Key", "s3cret-value-012345"),
            ],
            body.as_bytes(),
        );
        let response = server.send(&wrong).await;
        assert_eq!(
            (response.status, response.message().as_str()),
            (401, "invalid credentials"),
            "{path}"
        );
        let response = server.post_json(path, body).await;
        assert_eq!(
            (response.status, response.message().as_str()),
            (401, "missing credentials"),
            "{path}"
        );
        // The secret twice, or beside a wrong one in either order: which was meant is not
        // known, so neither is taken.
        for pair in [
            ["s3cret-value-0123456", "s3cret-value-0123456"],
            ["s3cret-value-0123456", "wrong"],
            ["wrong", "s3cret-value-0123456"],
        ] {
            let twice = post(
                path,
                &[
                    ("Content-Type", "application/json"),
                    ("X-Api-Key", pair[0]),
                    ("X-Api-Key", pair[1]),
                ],
                body.as_bytes(),
            );
            let response = server.send(&twice).await;
            assert_eq!(
                (response.status, response.message().as_str()),
                (401, "invalid credentials"),
                "{path}: {pair:?}"
            );
        }
    }
    assert_eq!(server.merchant.calls().len(), 2);
}

#[tokio::test]
async fn http_basic_authenticates_the_validations() {
    let server = TestServer::start_with(with_validation_auth(EndpointAuthConfig {
        method: AuthMethod::Basic,
        username: Some("aggregator".into()),
        password: Some("pw-0123456789abcd".into()),
        ..Default::default()
    }))
    .await;
    let basic = |pair: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    };
    let good = basic("aggregator:pw-0123456789abcd");
    let ok = post(
        VALIDATION_PATH,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &good),
        ],
        TRANSACTION_VALIDATION.as_bytes(),
    );
    assert_eq!(server.send(&ok).await.status, 200);
    let bad = basic("aggregator:pW-0123456789abcd");
    let wrong = post(
        VALIDATION_PATH,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &bad),
        ],
        TRANSACTION_VALIDATION.as_bytes(),
    );
    let response = server.send(&wrong).await;
    assert_eq!(response.status, 401);
    assert_eq!(
        response.header("www-authenticate"),
        Some("Basic realm=\"payhook\"")
    );
}

#[tokio::test]
async fn the_ip_allow_list_refuses_other_addresses_with_403() {
    let allowed = TestServer::start_with(with_validation_auth(EndpointAuthConfig {
        allow_ips: vec!["127.0.0.0/8".into(), "::1/128".into()],
        ..Default::default()
    }))
    .await;
    assert_eq!(
        allowed
            .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
            .await
            .status,
        200
    );
    let refused = TestServer::start_with(with_validation_auth(EndpointAuthConfig {
        allow_ips: vec!["10.0.0.0/8".into(), "2001:db8::/32".into()],
        ..Default::default()
    }))
    .await;
    let response = refused
        .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
        .await;
    assert_eq!(
        (response.status, response.message().as_str()),
        (403, "address not allowed")
    );
    assert!(refused.merchant.calls().is_empty());
}

#[tokio::test]
async fn the_signature_scheme_can_authenticate_the_validations() {
    let server = TestServer::start_with(with_validation_auth(EndpointAuthConfig {
        method: AuthMethod::Signature,
        ..Default::default()
    }))
    .await;
    let signed = signed_post(
        VALIDATION_PATH,
        TRANSACTION_VALIDATION,
        &sign("rsa2048", TRANSACTION_VALIDATION),
    );
    assert_eq!(server.send(&signed).await.status, 200);
    let response = server
        .post_json(VALIDATION_PATH, TRANSACTION_VALIDATION)
        .await;
    assert_eq!(response.status, 401);
    assert!(response.message().starts_with("missing signature"));
}

#[tokio::test]
async fn a_retry_reuses_its_verification_but_any_changed_byte_is_verified_afresh() {
    let server = TestServer::start_with(signed_config(&["rsa2048"])).await;
    let signature = sign("rsa2048", CALLBACK);
    assert_eq!(
        server
            .send(&signed_post(CALLBACK_PATH, CALLBACK, &signature))
            .await
            .status,
        200
    );
    // The same bytes and signature again: a retry, a duplicate of the booking.
    assert_eq!(
        server
            .send(&signed_post(CALLBACK_PATH, CALLBACK, &signature))
            .await
            .status,
        200
    );
    // One changed byte of the body, with the signature that verified before.
    let tampered = CALLBACK.replace("\"amount\": 0.1", "\"amount\": 0.2");
    let response = server
        .send(&signed_post(CALLBACK_PATH, &tampered, &signature))
        .await;
    assert_eq!(response.status, 401);
    assert!(response.message().starts_with("invalid signature"));
    // One changed byte of the signature, with the body that verified before.
    let mut bytes = base64::engine::general_purpose::STANDARD
        .decode(&signature)
        .unwrap();
    bytes[10] ^= 1;
    let flipped = base64::engine::general_purpose::STANDARD.encode(bytes);
    assert_eq!(
        server
            .send(&signed_post(CALLBACK_PATH, CALLBACK, &flipped))
            .await
            .status,
        401
    );
    assert_eq!(server.merchant.calls().len(), 1);
    // One public-key verification, one reuse (the retry), two refusals (the changed bytes).
    server
        .assert_metrics(&[
            "payhook_signatures_verified_total 1",
            "payhook_signatures_reused_total 1",
            "payhook_signatures_refused_total{reason=\"invalid\"} 2",
        ])
        .await;
}
