//! Every bad input, on every endpoint, gets its defined status code and a `{"message"}` body,
//! and never reaches the merchant's handler.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::json;
use support::*;

/// Each endpoint with its valid fixture, the pointer to its amount and to a required field.
const ENDPOINTS: [(&str, &str, &str, &str); 3] = [
    (
        PROVIDERS_PATH,
        PROVIDERS_VALIDATION,
        "/transactionData/paymentData/amount",
        "/transactionData/paymentData/nonce",
    ),
    (
        VALIDATION_PATH,
        TRANSACTION_VALIDATION,
        "/paymentData/amount",
        "/validationId",
    ),
    (CALLBACK_PATH, CALLBACK, "/amount", "/nonce"),
];

async fn assert_refused(
    server: &TestServer,
    path: &str,
    request: &[u8],
    status: u16,
    message_part: &str,
) {
    let response = server.send(request).await;
    assert_eq!(
        response.status,
        status,
        "{path}: {:?}",
        String::from_utf8_lossy(&response.body)
    );
    let message = response.message();
    assert!(
        message.contains(message_part),
        "{path}: `{message}` should contain `{message_part}`"
    );
}

fn json_post(path: &str, body: &[u8]) -> Vec<u8> {
    post(path, &[("Content-Type", "application/json")], body)
}

#[tokio::test]
async fn an_empty_body_is_400() {
    let server = TestServer::start().await;
    for (path, ..) in ENDPOINTS {
        assert_refused(
            &server,
            path,
            &json_post(path, b""),
            400,
            "request body is empty",
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn invalid_json_is_400_with_line_and_column() {
    let server = TestServer::start().await;
    for (path, ..) in ENDPOINTS {
        assert_refused(
            &server,
            path,
            &json_post(path, b"{\"nonce\": \"n\",\n  oops}"),
            400,
            "line 2 column",
        )
        .await;
        assert_refused(
            &server,
            path,
            &json_post(path, b"{\"nonce\": "),
            400,
            "malformed JSON",
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn a_wrong_type_for_amount_is_400_naming_the_field() {
    let server = TestServer::start().await;
    for (path, fixture, amount, _) in ENDPOINTS {
        let field = amount.trim_start_matches('/').replace('/', ".");
        for bad in [json!(true), json!("ten"), json!({"value": 1}), json!(null)] {
            let body = with(fixture, amount, Some(bad.clone()));
            assert_refused(
                &server,
                path,
                &json_post(path, body.as_bytes()),
                400,
                &field,
            )
            .await;
        }
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn an_amount_that_cannot_be_held_exactly_is_400_not_rounded() {
    let server = TestServer::start().await;
    let amount = |value: &str| CALLBACK.replace("\"amount\": 0.1", &format!("\"amount\": {value}"));
    for (value, reason) in [
        ("79228162514264337593543950336", "out of range"),
        ("0.12345678901234567890123456789", "fractional digits"),
        // An exponent that would take a loop ages (10 × 0 never overflows) is answered at once.
        ("1e9223372036854775807", "out of range"),
    ] {
        let body = amount(value);
        assert_refused(
            &server,
            CALLBACK_PATH,
            &json_post(CALLBACK_PATH, body.as_bytes()),
            400,
            reason,
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
    let zero = server
        .post_json(CALLBACK_PATH, &amount("0e9223372036854775807"))
        .await;
    assert_eq!(zero.status, 200, "{}", zero.message());
}

#[tokio::test]
async fn a_missing_required_field_is_400_naming_it() {
    let server = TestServer::start().await;
    for (path, fixture, _, required) in ENDPOINTS {
        let name = required.rsplit('/').next().unwrap();
        let body = with(fixture, required, None);
        assert_refused(
            &server,
            path,
            &json_post(path, body.as_bytes()),
            400,
            &format!("missing field `{name}`"),
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_before_reading_when_content_length_says_so() {
    let server = TestServer::start().await;
    for (path, ..) in ENDPOINTS {
        // Only the headers are sent: the answer must come without the body being read.
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            2 * 1024 * 1024
        );
        assert_refused(&server, path, head.as_bytes(), 413, "exceeds 1048576 bytes").await;
    }
}

#[tokio::test]
async fn a_chunked_body_with_broken_framing_is_400_and_reaches_no_handler() {
    let server = TestServer::start().await;
    for (path, fixture, ..) in ENDPOINTS {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        // A chunk size that is no hexadecimal number, after a first good chunk.
        let (first, _) = fixture.split_at(10);
        let request = format!(
            "{head}{:x}\r\n{first}\r\nzz\r\nrest\r\n0\r\n\r\n",
            first.len()
        );
        assert_refused(
            &server,
            path,
            request.as_bytes(),
            400,
            "request body could not be read",
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn a_chunked_body_over_the_limit_is_413_while_streaming() {
    let server = TestServer::start().await;
    let chunk = vec![b' '; 64 * 1024];
    for (path, ..) in ENDPOINTS {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes();
        for _ in 0..20 {
            request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            request.extend_from_slice(&chunk);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"0\r\n\r\n");
        assert_refused(&server, path, &request, 413, "exceeds").await;
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn a_body_just_under_the_limit_is_read() {
    let server = TestServer::start().await;
    let mut body = CALLBACK.to_owned();
    body.push_str(&" ".repeat(1024 * 1024 - body.len()));
    let response = server
        .send(&json_post(CALLBACK_PATH, body.as_bytes()))
        .await;
    assert_eq!(response.status, 200);
}

#[tokio::test]
async fn a_wrong_content_type_is_415() {
    let server = TestServer::start().await;
    for (path, fixture, ..) in ENDPOINTS {
        for content_type in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json; charset=iso-8859-1",
        ] {
            let request = post(path, &[("Content-Type", content_type)], fixture.as_bytes());
            assert_refused(&server, path, &request, 415, "application/json").await;
        }
        assert_refused(
            &server,
            path,
            &post(path, &[], fixture.as_bytes()),
            415,
            "application/json",
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn a_wrong_method_is_405_with_allow() {
    let server = TestServer::start().await;
    for (path, ..) in ENDPOINTS {
        for method in ["GET", "PUT", "DELETE"] {
            let response = server.send(&request(method, path, &[], None)).await;
            assert_eq!(response.status, 405, "{method} {path}");
            assert_eq!(response.header("allow"), Some("POST"));
            assert!(response.message().contains("POST"));
        }
    }
    let response = server.send(&post("/healthz", &[], b"")).await;
    assert_eq!(
        (response.status, response.header("allow")),
        (405, Some("GET, HEAD"))
    );
}

#[tokio::test]
async fn an_unknown_path_is_404() {
    let server = TestServer::start().await;
    for path in ["/", "/payhook", "/payhook/callbacks", "/api/v1/login"] {
        let response = server.send(&json_post(path, CALLBACK.as_bytes())).await;
        assert_eq!(response.status, 404, "{path}");
        assert_eq!(response.message(), "no endpoint at this path");
    }
}

#[tokio::test]
async fn configured_paths_replace_the_defaults() {
    let mut config = test_config();
    config.paths.callback = "/hooks/payments".to_owned();
    let server = TestServer::start_with(config).await;
    assert_eq!(
        server.post_json("/hooks/payments", CALLBACK).await.status,
        200
    );
    assert_eq!(server.post_json(CALLBACK_PATH, CALLBACK).await.status, 404);
}

/// `fixture`'s top-level values as a JSON array in the order of `fields` — serde's sequence
/// form of the struct.
fn positional(fixture: &str, fields: &[&str]) -> String {
    let object: serde_json::Value = serde_json::from_str(fixture).unwrap();
    serde_json::Value::Array(fields.iter().map(|f| object[*f].clone()).collect()).to_string()
}

#[tokio::test]
async fn a_body_that_is_not_a_json_object_is_400_even_in_the_structs_field_order() {
    let server = TestServer::start().await;
    let arrays = [
        (
            CALLBACK_PATH,
            positional(
                CALLBACK,
                &[
                    "id",
                    "transactionReferenceId",
                    "nonce",
                    "providerId",
                    "providerTransactionId",
                    "transactionType",
                    "transactionStatus",
                    "transactionStatusMessage",
                    "transactionInternalMessage",
                    "clientId",
                    "additionalData",
                    "amount",
                    "currency",
                    "destinationAmount",
                    "destinationCurrency",
                    "createdUtc",
                    "updatedUtc",
                ],
            ),
        ),
        (
            VALIDATION_PATH,
            positional(
                TRANSACTION_VALIDATION,
                &[
                    "merchantData",
                    "paymentData",
                    "providerData",
                    "validationId",
                    "cashIn",
                ],
            ),
        ),
        (
            PROVIDERS_PATH,
            positional(PROVIDERS_VALIDATION, &["transactionData", "providers"]),
        ),
    ];
    for (path, body) in &arrays {
        assert_refused(
            &server,
            path,
            &json_post(path, body.as_bytes()),
            400,
            "must be a JSON object",
        )
        .await;
        for scalar in ["\"text\"", "42", "true", "null", " \n [] "] {
            assert_refused(
                &server,
                path,
                &json_post(path, scalar.as_bytes()),
                400,
                "must be a JSON object",
            )
            .await;
        }
    }
    assert!(server.merchant.calls().is_empty());
}

/// `fixture` with the object at `pointer` replaced by its values as a positional array, in
/// the order of `fields`.
fn nested_positional(fixture: &str, pointer: &str, fields: &[&str]) -> String {
    let mut object: serde_json::Value = serde_json::from_str(fixture).unwrap();
    let nested = object.pointer(pointer).unwrap().clone();
    let positional = fields.iter().map(|f| nested[*f].clone()).collect();
    *object.pointer_mut(pointer).unwrap() = serde_json::Value::Array(positional);
    object.to_string()
}

#[tokio::test]
async fn a_nested_message_given_as_an_array_is_400_naming_the_field() {
    let server = TestServer::start().await;
    let cases = [
        (
            VALIDATION_PATH,
            nested_positional(
                TRANSACTION_VALIDATION,
                "/merchantData",
                &["merchantHash", "clientId", "additionalData"],
            ),
            "merchantData",
        ),
        (
            PROVIDERS_PATH,
            nested_positional(
                PROVIDERS_VALIDATION,
                "/transactionData",
                &["merchantData", "paymentData", "cashIn"],
            ),
            "transactionData",
        ),
        (
            PROVIDERS_PATH,
            nested_positional(
                PROVIDERS_VALIDATION,
                "/providers/0",
                &["id", "name", "collabId", "currencies", "payTypes"],
            ),
            "providers",
        ),
    ];
    for (path, body, field) in &cases {
        let response = server.post_json(path, body).await;
        assert_eq!(
            response.status,
            400,
            "{path} {body}: {}",
            response.message()
        );
        assert!(
            response.message().contains(field) && response.message().contains("JSON object"),
            "{path}: {}",
            response.message()
        );
    }
    assert!(server.merchant.calls().is_empty());
}

#[tokio::test]
async fn a_validation_amount_must_be_above_zero_and_a_callback_amount_not_negative() {
    let server = TestServer::start().await;
    // Validations ask about a payment to make: the amount is what moves, `cashIn` says
    // which way, so zero and below are no payment.
    for (path, fixture, amount, _) in &ENDPOINTS[..2] {
        let field = amount.trim_start_matches('/').replace('/', ".");
        for bad in ["0", "0.00", "-0.01", "-250"] {
            let body = with(fixture, amount, Some(json!(bad)));
            assert_refused(
                &server,
                path,
                &json_post(path, body.as_bytes()),
                400,
                &format!("invalid field `{field}`"),
            )
            .await;
            let message = server
                .send(&json_post(path, body.as_bytes()))
                .await
                .message();
            assert!(message.contains("must be greater than zero"), "{message}");
        }
    }
    // A callback reports a result: never negative (`transactionType` says which way), but
    // a failed payment may report that nothing moved.
    for bad in ["-0.01", "-250"] {
        let body = with(CALLBACK, "/amount", Some(json!(bad)));
        assert_refused(
            &server,
            CALLBACK_PATH,
            &json_post(CALLBACK_PATH, body.as_bytes()),
            400,
            "invalid field `amount`",
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
    let failed_with_nothing_moved = with(CALLBACK, "/amount", Some(json!("0")));
    let failed_with_nothing_moved = with(
        &failed_with_nothing_moved,
        "/transactionStatus",
        Some(json!(-3)),
    );
    let response = server
        .post_json(CALLBACK_PATH, &failed_with_nothing_moved)
        .await;
    assert_eq!(response.status, 200, "{}", response.message());
}

/// The free-form fields the spec makes objects (`additionalData`, `providerData`): an object
/// or null, as the OpenAPI document says; anything else is 400 naming the field.
const FREE_FORM: [(&str, &str, &str); 4] = [
    (
        PROVIDERS_PATH,
        PROVIDERS_VALIDATION,
        "/transactionData/merchantData/additionalData",
    ),
    (
        VALIDATION_PATH,
        TRANSACTION_VALIDATION,
        "/merchantData/additionalData",
    ),
    (VALIDATION_PATH, TRANSACTION_VALIDATION, "/providerData"),
    (CALLBACK_PATH, CALLBACK, "/additionalData"),
];

#[tokio::test]
async fn a_free_form_field_that_is_not_an_object_is_400_naming_it() {
    let server = TestServer::start().await;
    for (path, fixture, pointer) in FREE_FORM {
        let field = pointer.rsplit('/').next().unwrap();
        for bad in [json!([]), json!("x"), json!(1), json!(false)] {
            let body = with(fixture, pointer, Some(bad.clone()));
            // The test configuration takes unsigned callbacks.
            let request = json_post(path, body.as_bytes());
            assert_refused(&server, path, &request, 400, field).await;
        }
    }
    assert!(server.merchant.calls().is_empty());
}

/// A free-form object of more JSON values than a parsed request may keep (10,000: parsed,
/// `[0,0,0,…]` takes 16–32 times the bytes it came in, held while the handler runs, beyond
/// what the body memory counts) is 400 naming the field, on every endpoint; one of 5,000
/// values is read.
#[tokio::test]
async fn a_free_form_field_of_too_many_values_is_400_naming_it() {
    let server = TestServer::start().await;
    for (path, fixture, pointer) in FREE_FORM {
        let field = pointer.rsplit('/').next().unwrap();
        let many = json!({ "k": vec![0; 20_000] });
        let body = with(fixture, pointer, Some(many));
        let request = json_post(path, body.as_bytes());
        assert_refused(&server, path, &request, 400, field).await;
        assert_refused(&server, path, &request, 400, "more than 10000 JSON values").await;
    }
    assert!(server.merchant.calls().is_empty());
    for (path, fixture, pointer) in FREE_FORM {
        let enough = json!({ "k": vec![0; 5_000] });
        let body = with(fixture, pointer, Some(enough));
        let response = server.send(&json_post(path, body.as_bytes())).await;
        assert_eq!(response.status, 200, "{path}: {}", response.message());
    }
}

/// A providers validation's candidates hold at most one JSON value for each 10 bytes of
/// `server.body_limit` together (104,857 with the default 1 MiB, at least 100,000): each
/// candidate, each of its tags, each value in its `currencies` and `payTypes`. The reason
/// is a free-form object's: in one list of `[0,0,…]`, or spread over many candidates, a
/// body would keep 16–32 times its bytes while the handler runs. Past the bound the request
/// is 400 naming `providers`; a catalogue within it is read whole, and a service that takes
/// larger bodies takes larger catalogues.
#[tokio::test]
async fn candidates_of_too_many_values_are_400_naming_them() {
    let server = TestServer::start().await;
    let limit = 1_048_576 / 10;
    let body =
        |candidates: serde_json::Value| with(PROVIDERS_VALIDATION, "/providers", Some(candidates));
    // One candidate whose list holds them; tags count as the lists do.
    let over = [
        body(json!([{"id": 1, "currencies": vec![0; limit]}])),
        body(json!([{"id": 1, "tags": vec![""; limit]}])),
    ];
    for request in &over {
        let request = json_post(PROVIDERS_PATH, request.as_bytes());
        assert_refused(&server, PROVIDERS_PATH, &request, 400, "providers").await;
        assert_refused(
            &server,
            PROVIDERS_PATH,
            &request,
            400,
            "more than 104857 JSON values",
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
    let within = body(json!([{"id": 1, "currencies": vec![0; limit - 1]}]));
    let response = server
        .send(&json_post(PROVIDERS_PATH, within.as_bytes()))
        .await;
    assert_eq!(response.status, 200, "{}", response.message());
    assert_eq!(server.merchant.calls().len(), 1, "the handler read them");
    // A service that takes bodies of 4 MiB takes four times the values.
    let mut config = test_config();
    config.server.body_limit = 4 << 20;
    let roomy = TestServer::start_with(config).await;
    let response = roomy
        .send(&json_post(PROVIDERS_PATH, over[0].as_bytes()))
        .await;
    assert_eq!(response.status, 200, "{}", response.message());
    let many = body(json!([{"id": 1, "currencies": vec![0; 4 * limit + 2]}]));
    let request = json_post(PROVIDERS_PATH, many.as_bytes());
    assert_refused(
        &roomy,
        PROVIDERS_PATH,
        &request,
        400,
        "more than 419430 JSON values",
    )
    .await;
}

/// Numbers the OpenAPI document allows but no `i64` or `Decimal` holds exactly: a fraction
/// in an integer field, and numeric strings with spaces, are 400; nothing is rounded.
#[tokio::test]
async fn an_integer_with_a_fraction_and_a_spaced_numeric_string_are_400() {
    let server = TestServer::start().await;
    for (path, fixture, pointer, bad) in [
        (
            VALIDATION_PATH,
            TRANSACTION_VALIDATION,
            "/validationId",
            json!(42.5),
        ),
        (
            VALIDATION_PATH,
            TRANSACTION_VALIDATION,
            "/paymentData/providerId",
            json!(1e30),
        ),
        (
            VALIDATION_PATH,
            TRANSACTION_VALIDATION,
            "/paymentData/amount",
            json!(" 10"),
        ),
    ] {
        let field = pointer.rsplit('/').next().unwrap();
        let body = with(fixture, pointer, Some(bad));
        assert_refused(&server, path, &json_post(path, body.as_bytes()), 400, field).await;
    }
    assert!(server.merchant.calls().is_empty());
}

/// A status or type code that is no integer, though it rounds to one through `f64`
/// (`3.9999999999999999` is 4.0 there: a success), is 400 like any fraction; nothing is
/// booked from it.
#[tokio::test]
async fn a_code_that_only_rounds_to_a_status_is_400() {
    let server = TestServer::start().await;
    for (field, from, to) in [
        (
            "transactionStatus",
            r#""transactionStatus": 4"#,
            r#""transactionStatus": 3.9999999999999999"#,
        ),
        (
            "transactionStatus",
            r#""transactionStatus": 4"#,
            r#""transactionStatus": 4.0000000000000001"#,
        ),
        (
            "transactionType",
            r#""transactionType": 1"#,
            r#""transactionType": 1.99999999999999999"#,
        ),
    ] {
        assert!(CALLBACK.contains(from));
        let body = CALLBACK.replace(from, to);
        let request = json_post(CALLBACK_PATH, body.as_bytes());
        assert_refused(&server, CALLBACK_PATH, &request, 400, field).await;
    }
    // The same code written as a whole number in another form is that code.
    let body = CALLBACK.replace(r#""transactionStatus": 4"#, r#""transactionStatus": 4.0e0"#);
    let response = server
        .send(&json_post(CALLBACK_PATH, body.as_bytes()))
        .await;
    assert_eq!(response.status, 200, "{:?}", response.message());
    assert_eq!(server.merchant.calls().len(), 1);
}

/// A field given twice — whatever the spelling of its name — is 400 on every endpoint: the
/// handler would see one value while a log, a proxy or another reader of the same signed
/// bytes could see the other.
#[tokio::test]
async fn a_field_given_twice_is_400_on_every_endpoint() {
    let server = TestServer::start().await;
    for (path, fixture, _, _) in ENDPOINTS {
        for doubled in [r#""amount": 1,"#, r#""amo\u0075nt": 1,"#] {
            let body = fixture.replacen("\"amount\"", &format!("{doubled} \"amount\""), 1);
            assert_ne!(body, fixture);
            let request = json_post(path, body.as_bytes());
            assert_refused(&server, path, &request, 400, "duplicate field `amount`").await;
        }
    }
    let body = CALLBACK.replacen(r#""nonce""#, r#""nonce": "nonce-other", "nonce""#, 1);
    let request = json_post(CALLBACK_PATH, body.as_bytes());
    assert_refused(
        &server,
        CALLBACK_PATH,
        &request,
        400,
        "duplicate field `nonce`",
    )
    .await;
    assert!(server.merchant.calls().is_empty());
}

/// Bytes that are not the JSON the spec names — a byte-order mark before it, an escaped lone
/// surrogate (no character: a reader in another language would make it U+FFFD, or refuse)
/// in a string payhook reads — are 400 on every endpoint, before the handler, with a message
/// that says what. (In a field payhook does not read, the string is skipped as the field is.)
#[tokio::test]
async fn a_byte_order_mark_or_a_lone_surrogate_is_400_on_every_endpoint() {
    let server = TestServer::start().await;
    for (path, fixture, _, _) in ENDPOINTS {
        let with_bom = [b"\xEF\xBB\xBF".as_slice(), fixture.as_bytes()].concat();
        assert_refused(
            &server,
            path,
            &json_post(path, &with_bom),
            400,
            "must be a JSON object",
        )
        .await;
        let lone = fixture.replacen("\"nonce\": \"", "\"nonce\": \"\\ud800", 1);
        assert_ne!(lone, fixture, "{path}");
        assert_refused(
            &server,
            path,
            &json_post(path, lone.as_bytes()),
            400,
            "escape at line",
        )
        .await;
    }
    assert!(server.merchant.calls().is_empty());
}

/// U+0000 in an identifier — a nonce, a client id — is refused before the handler and the
/// store on every endpoint: PostgreSQL cannot keep it in `text` (so a shared store would
/// answer 503 to every retry of such a callback until it was lost), and the aggregator
/// issues no such identifier. Elsewhere — a free-form field, a field payhook does not read —
/// it is data like any other and accepted.
#[tokio::test]
async fn a_nul_in_an_identifier_is_400_on_every_endpoint_and_elsewhere_is_accepted() {
    let server = TestServer::start().await;
    let identifiers = [
        (
            PROVIDERS_PATH,
            PROVIDERS_VALIDATION,
            "/transactionData/paymentData/nonce",
        ),
        (
            PROVIDERS_PATH,
            PROVIDERS_VALIDATION,
            "/transactionData/merchantData/clientId",
        ),
        (
            VALIDATION_PATH,
            TRANSACTION_VALIDATION,
            "/paymentData/nonce",
        ),
        (
            VALIDATION_PATH,
            TRANSACTION_VALIDATION,
            "/merchantData/clientId",
        ),
        (CALLBACK_PATH, CALLBACK, "/nonce"),
        (CALLBACK_PATH, CALLBACK, "/clientId"),
    ];
    for (path, fixture, pointer) in identifiers {
        let body = with(fixture, pointer, Some(json!("id-\u{0}-1")));
        assert!(body.contains("\\u0000"), "serde_json escapes NUL: {body}");
        let field = pointer[1..].replace('/', ".");
        assert_refused(
            &server,
            path,
            &json_post(path, body.as_bytes()),
            400,
            &field,
        )
        .await;
        let response = server.send(&json_post(path, body.as_bytes())).await;
        assert!(response.message().contains("U+0000"), "{path}");
    }
    assert!(server.merchant.calls().is_empty());

    let elsewhere =
        FREE_FORM
            .into_iter()
            .chain([(CALLBACK_PATH, CALLBACK, "/transactionStatusMessage")]);
    for (path, fixture, pointer) in elsewhere {
        let value = if pointer.ends_with("Message") {
            json!("a\u{0}b")
        } else {
            json!({"note\u{0}": "a\u{0}b"})
        };
        let body = with(fixture, pointer, Some(value));
        let response = server.send(&json_post(path, body.as_bytes())).await;
        assert_eq!(
            response.status,
            200,
            "{path} {pointer}: {:?}",
            response.message()
        );
    }
}

/// What hyper cannot parse as HTTP never reaches payhook: hyper answers it itself (400, or
/// 431 for too many headers or a head over 64 KiB) with an empty body and closes the connection, as the README's
/// table says. Nothing is booked, and the server goes on serving.
#[tokio::test]
async fn a_request_the_http_layer_cannot_parse_is_refused_by_it_and_books_nothing() {
    let server = TestServer::start().await;
    let body = CALLBACK.as_bytes();
    let valid = json_post(CALLBACK_PATH, body);
    let head_end = valid.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let with_head = |head: String| [head.as_bytes(), &valid[head_end..]].concat();
    let many_headers: String = (0..101).map(|i| format!("X-Filler-{i}: {i}\r\n")).collect();
    let long_header = format!("X-Filler: {}\r\n", "a".repeat(64 * 1024));
    let long_query = "a".repeat(64 * 1024);
    let unparsable: [(&str, Vec<u8>, u16); 6] = [
        (
            "a malformed request line",
            [
                b"POST /payhook/callback HTTP/1.1 extra\r\n".as_slice(),
                &valid[head_end + 2..],
            ]
            .concat(),
            400,
        ),
        (
            "a Content-Length that is no number",
            with_head(format!(
                "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                 Content-Type: application/json\r\nContent-Length: abc"
            )),
            400,
        ),
        (
            "a header name with a space",
            with_head(format!(
                "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: 1\r\n\
                 Content-Type: application/json\r\nContent-Length: {}",
                body.len()
            )),
            400,
        ),
        (
            "more than 100 headers",
            with_head(format!(
                "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n{many_headers}\
                 Content-Type: application/json\r\nContent-Length: {}",
                body.len()
            )),
            431,
        ),
        (
            "a head over 64 KiB",
            with_head(format!(
                "POST {CALLBACK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n{long_header}\
                 Content-Type: application/json\r\nContent-Length: {}",
                body.len()
            )),
            431,
        ),
        (
            "a URI over 64 KiB",
            with_head(format!(
                "POST {CALLBACK_PATH}?{long_query} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                 Content-Type: application/json\r\nContent-Length: {}",
                body.len()
            )),
            431,
        ),
    ];
    for (what, request, status) in unparsable {
        // `send` reads to the end: the answer comes with the connection closed.
        let answer = server.send(&request).await;
        assert_eq!(answer.status, status, "{what}");
        assert!(answer.body.is_empty(), "{what}: {:?}", answer.body);
    }
    let booked = server.send(&valid).await;
    assert_eq!(
        (booked.status, booked.message()),
        (200, "callback accepted".to_owned()),
        "the refused requests booked nothing"
    );
}
