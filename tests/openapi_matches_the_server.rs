//! The OpenAPI document (`payhook openapi`) and the server agree: every route, status code and
//! field the server has is in the document, and the document has nothing the server lacks.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use bytes::Bytes;
use http_body_util::Full;
use payhook::model::{
    CallbackBody, ErrorBody, Provider, ProvidersValidationRequest, ProvidersValidationResponse,
    TransactionValidationRequest,
};
use payhook::{App, Config};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use support::*;

fn doc() -> Value {
    serde_json::from_str(payhook::server::OPENAPI).unwrap()
}

/// `schema`, with a `$ref` followed and a nullable `anyOf` unwrapped.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.rsplit('/').next().unwrap();
        return resolve(doc, &doc["components"]["schemas"][name]);
    }
    if let Some(options) = schema["anyOf"].as_array() {
        let inner = options.iter().find(|o| o["type"] != "null").unwrap();
        return resolve(doc, inner);
    }
    schema
}

/// Compares the fields of `value` (a model serialised) with `schema`, both ways, recursively;
/// returns the differences as `path: why`.
fn differences(doc: &Value, schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let schema = resolve(doc, schema);
    let mut out = Vec::new();
    match value {
        Value::Object(fields) => {
            let Some(properties) = schema["properties"].as_object() else {
                // A free-form object (additionalData, providerData): anything goes.
                return out;
            };
            let served: BTreeSet<&String> = fields.keys().collect();
            let documented: BTreeSet<&String> = properties.keys().collect();
            for field in served.difference(&documented) {
                out.push(format!("{path}.{field}: served but not documented"));
            }
            for field in documented.difference(&served) {
                out.push(format!("{path}.{field}: documented but not served"));
            }
            for (field, inner) in fields {
                if let Some(property) = properties.get(field) {
                    out.extend(differences(
                        doc,
                        property,
                        inner,
                        &format!("{path}.{field}"),
                    ));
                }
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first() {
                out.extend(differences(
                    doc,
                    &schema["items"],
                    first,
                    &format!("{path}[]"),
                ));
            }
        }
        _ => {}
    }
    out
}

fn schema(doc: &Value, name: &str) -> Value {
    doc["components"]["schemas"][name].clone()
}

#[test]
fn the_document_is_openapi_3_1_with_the_servers_routes() {
    let doc = doc();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = Config::default().paths;
    let documented: BTreeSet<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    let served: BTreeSet<String> = [
        paths.providers_validation,
        paths.transaction_validation,
        paths.callback,
        "/healthz".into(),
        "/readyz".into(),
        "/metrics".into(),
    ]
    .into();
    assert_eq!(documented, served);
}

#[tokio::test]
async fn every_documented_operation_is_answered_by_the_server() {
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("store");
    let merchant = TestMerchant::default();
    let app = App::builder(config)
        .providers_validator(merchant.clone())
        .transaction_validator(merchant.clone())
        .callback_receiver(merchant)
        .build()
        .unwrap();
    let doc = doc();
    for (path, operations) in doc["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            let request = http::Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(path)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let status = app.handle(request).await.status().as_u16();
            assert!(
                status != 404 && status != 405,
                "{method} {path}: the server answered {status}"
            );
        }
    }
}

#[test]
fn each_endpoint_documents_exactly_the_status_codes_it_can_answer() {
    let doc = doc();
    let paths = Config::default().paths;
    for (endpoint, codes) in payhook::server::status_codes() {
        let path = match endpoint {
            "providers_validation" => &paths.providers_validation,
            "transaction_validation" => &paths.transaction_validation,
            _ => &paths.callback,
        };
        let documented: BTreeSet<u16> = doc["paths"][path]["post"]["responses"]
            .as_object()
            .unwrap()
            .keys()
            .map(|code| code.parse().unwrap())
            .collect();
        assert_eq!(documented, codes, "{endpoint}");
    }
}

#[test]
fn request_and_response_schemas_have_exactly_the_models_fields() {
    let doc = doc();
    // Every field set: the spec's full examples, with the optional provider tags.
    let providers = with(
        PROVIDERS_VALIDATION,
        "/providers/0/tags",
        Some(json!(["fiat"])),
    );
    let cases: Vec<(&str, Value)> = vec![
        (
            "ProvidersValidationRequest",
            serde_json::to_value(serde_json::from_str::<ProvidersValidationRequest>(&providers).unwrap())
                .unwrap(),
        ),
        (
            "TransactionValidationRequest",
            serde_json::to_value(
                serde_json::from_str::<TransactionValidationRequest>(TRANSACTION_VALIDATION).unwrap(),
            )
            .unwrap(),
        ),
        (
            "CallbackBody",
            serde_json::to_value(serde_json::from_str::<CallbackBody>(CALLBACK).unwrap()).unwrap(),
        ),
        (
            "ProvidersValidationResponse",
            serde_json::to_value(ProvidersValidationResponse {
                providers: vec![
                    serde_json::from_value::<Provider>(json!({
                        "id": 11, "name": "Card", "collabId": 3, "currencies": [{"id": 1, "code": "EUR"}],
                        "payTypes": [{"id": 5, "code": "card", "name": "Bank card", "cashIn": true,
                                      "cashOut": false, "isCashInEnabled": true, "isCashOutEnabled": false}]
                    }))
                    .unwrap(),
                ],
                message: "1 available".into(),
            })
            .unwrap(),
        ),
        ("ErrorBody", serde_json::to_value(ErrorBody::new("no")).unwrap()),
    ];
    for (name, value) in &cases {
        let found = differences(&doc, &schema(&doc, name), value, name);
        assert!(found.is_empty(), "{found:#?}");
    }
    // The comparison sees a nested difference either way.
    let mut changed = doc.clone();
    let payment = &mut changed["components"]["schemas"]["ValidationPaymentData"]["properties"];
    payment.as_object_mut().unwrap().remove("providerId");
    payment["fee"] = json!({"type": "number"});
    let found = differences(
        &changed,
        &schema(&changed, "TransactionValidationRequest"),
        &cases[1].1,
        "T",
    );
    assert_eq!(
        found,
        [
            "T.paymentData.providerId: served but not documented",
            "T.paymentData.fee: documented but not served"
        ]
    );
}

#[test]
fn the_documents_examples_are_requests_the_server_reads() {
    let doc = doc();
    let example = |path: &str| {
        doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["example"]
            .to_string()
    };
    let paths = Config::default().paths;
    serde_json::from_str::<ProvidersValidationRequest>(&example(&paths.providers_validation))
        .unwrap();
    serde_json::from_str::<TransactionValidationRequest>(&example(&paths.transaction_validation))
        .unwrap();
    serde_json::from_str::<CallbackBody>(&example(&paths.callback)).unwrap();
}

/// The document's examples, sent as they are (the callback signed), are answered 200 — an
/// example is what a merchant's QA sends first. The callback's carried a date that aged past
/// the default retention in a month: answered 409, its handler not run.
#[tokio::test]
async fn the_documents_examples_are_answered_200() {
    use payhook::signature::Algorithm;
    let doc = doc();
    let example = |path: &str| {
        doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["example"]
            .to_string()
    };
    let paths = Config::default().paths;
    let mut config = signed_config(&["rsa2048"]);
    config.validation.allow_unauthenticated = true;
    let server = TestServer::start_with(config).await;
    for path in [&paths.providers_validation, &paths.transaction_validation] {
        let answer = server.post_json(path, &example(path)).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.message());
    }
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let answer = server
        .send(&signed_post(&signer, &example(&paths.callback)))
        .await;
    assert_eq!(
        (answer.status, answer.message()),
        (200, "callback accepted".to_owned())
    );
}

/// The keys of the object `value`.
fn keys(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}

/// Every `maxLength` in `value`.
fn max_lengths(value: &Value, found: &mut Vec<u64>) {
    match value {
        Value::Object(object) => {
            if let Some(max) = object.get("maxLength").and_then(Value::as_u64) {
                found.push(max);
            }
            object.values().for_each(|v| max_lengths(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| max_lengths(v, found)),
        _ => {}
    }
}

/// `payhook openapi` renders the document from the merchant's configuration, and what it
/// says is what a server of that configuration answers: its examples, sent to its paths
/// with the credentials its security requirements name (in the headers its schemes name),
/// are answered 200, and without them 401.
#[tokio::test]
async fn a_document_rendered_from_a_configuration_is_what_that_server_answers() {
    use base64::Engine;
    use payhook::config::AuthMethod;
    use payhook::signature::{Algorithm, Encoding};

    let mut config = signed_config(&["rsa2048"]);
    config.paths.providers_validation = "/shop/aggregator/providers".into();
    config.paths.transaction_validation = "/shop/aggregator/transactions".into();
    config.paths.callback = "/shop/aggregator/results".into();
    config.signature.header = "X-Aggregator-Signature".into();
    config.server.max_identifier_chars = 64;
    // Ignored beside keys: every callback must still be signed.
    config.callback.allow_unsigned = true;
    // No one may read metrics: the route is gone.
    config.server.metrics_allow_ips = Vec::new();
    let providers = &mut config.auth.providers_validation;
    providers.method = AuthMethod::Basic;
    providers.username = Some("aggregator".into());
    providers.password = Some("basic-password-1".into());
    let transactions = &mut config.auth.transaction_validation;
    transactions.method = AuthMethod::SharedSecret;
    // Read trimmed by the server, and so named.
    transactions.header = " X-Shop-Key ".into();
    transactions.secret = Some("shared-secret-0123456789".into());
    let doc = payhook::server::openapi(&config);

    assert_eq!(
        keys(&doc["paths"]),
        BTreeSet::from([
            "/shop/aggregator/providers",
            "/shop/aggregator/transactions",
            "/shop/aggregator/results",
            "/healthz",
            "/readyz",
        ])
    );
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["sharedSecretTransaction"]["name"], "X-Shop-Key");
    assert_eq!(
        keys(schemes),
        BTreeSet::from(["aggregatorSignature", "basic", "sharedSecretTransaction"]),
        "only the schemes in use"
    );
    let security = |path: &str| doc["paths"][path]["post"]["security"].clone();
    assert_eq!(
        security("/shop/aggregator/providers"),
        json!([{"basic": []}])
    );
    assert_eq!(
        security("/shop/aggregator/transactions"),
        json!([{"sharedSecretTransaction": []}])
    );
    assert_eq!(
        security("/shop/aggregator/results"),
        json!([{"aggregatorSignature": []}]),
        "signed: with keys, callback.allow_unsigned is ignored"
    );
    let mut lengths = Vec::new();
    max_lengths(&doc, &mut lengths);
    assert_eq!(lengths.len(), 6, "{lengths:?}");
    assert!(lengths.iter().all(|max| *max == 64), "{lengths:?}");
    let description = doc["info"]["description"].as_str().unwrap();
    assert!(
        description.contains("at most 64 characters") && description.contains("1048576 bytes"),
        "{description}"
    );

    // The server of that configuration, asked as the document says.
    let server = TestServer::start_with(config).await;
    let example = |path: &str| {
        doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["example"]
            .to_string()
    };
    let ask = |path: &str, header: Option<(&str, &str)>| {
        let mut headers = vec![("Content-Type", "application/json")];
        headers.extend(header);
        post(path, &headers, example(path).as_bytes())
    };
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("aggregator:basic-password-1")
    );
    let secret_header = schemes["sharedSecretTransaction"]["name"].as_str().unwrap();
    let signature_header = schemes["aggregatorSignature"]["name"].as_str().unwrap();
    assert_eq!(schemes["basic"]["scheme"], "basic");
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let callback = example("/shop/aggregator/results");
    let signature = signer
        .header_value(callback.as_bytes(), Encoding::Base64, None)
        .unwrap();
    let asked = [
        (
            "/shop/aggregator/providers",
            ("Authorization", basic.as_str()),
        ),
        (
            "/shop/aggregator/transactions",
            (secret_header, "shared-secret-0123456789"),
        ),
        (
            "/shop/aggregator/results",
            (signature_header, signature.as_str()),
        ),
    ];
    for (path, credential) in asked {
        let answer = server.send(&ask(path, Some(credential))).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.message());
        let refused = server.send(&ask(path, None)).await;
        assert_eq!(refused.status, 401, "{path} without credentials");
        // The challenge header where the document names it (Basic), and nowhere else.
        let unauthorized = &doc["paths"][path]["post"]["responses"]["401"];
        assert_eq!(
            refused.header("WWW-Authenticate").is_some(),
            unauthorized["headers"]["WWW-Authenticate"].is_object(),
            "{path}: {unauthorized}"
        );
    }
    let said = |path: &str| doc["paths"][path]["post"]["responses"]["401"]["description"].clone();
    assert_eq!(
        said("/shop/aggregator/transactions"),
        "Missing or wrong secret in X-Shop-Key."
    );
    assert_eq!(
        said("/shop/aggregator/providers"),
        "Missing or wrong HTTP Basic credentials."
    );
    let metrics = server.send(&request("GET", "/metrics", &[], None)).await;
    assert_eq!(metrics.status, 404, "a route the document leaves out");
}

/// Without settings of its own, the rendered document is the shipped one but where the
/// shipped one leaves the choice to the configuration: its validation endpoints are open
/// (payhook's default method is none), so they answer no 401 and only the signature's
/// scheme is left, and its description names the configured algorithm and encoding.
#[test]
fn the_default_configuration_renders_the_shipped_document_with_its_choices_made() {
    let mut rendered = payhook::server::openapi(&Config::default());
    let mut shipped = doc();
    assert_ne!(
        rendered["info"]["description"],
        shipped["info"]["description"]
    );
    let paths = Config::default().paths;
    for path in [&paths.providers_validation, &paths.transaction_validation] {
        assert_eq!(rendered["paths"][path]["post"]["security"], json!([{}]));
        rendered["paths"][path]["post"]["security"] = Value::Null;
        shipped["paths"][path]["post"]["security"] = Value::Null;
        assert!(rendered["paths"][path]["post"]["responses"]["401"].is_null());
        let shipped_responses = shipped["paths"][path]["post"]["responses"]
            .as_object_mut()
            .unwrap();
        assert!(shipped_responses.remove("401").is_some());
    }
    assert_eq!(
        rendered["paths"][&paths.callback]["post"]["responses"]["401"],
        shipped["paths"][&paths.callback]["post"]["responses"]["401"],
        "signed callbacks are refused as the shipped document says"
    );
    let schemes = rendered["components"]["securitySchemes"].clone();
    assert_eq!(
        schemes.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["aggregatorSignature"]
    );
    assert_eq!(schemes["aggregatorSignature"]["name"], "X-Signature");
    assert!(
        schemes["aggregatorSignature"]["description"]
            .as_str()
            .unwrap()
            .contains("rsa-pkcs1-sha256 (unless a key names its own), base64"),
        "{schemes}"
    );
    for doc in [&mut rendered, &mut shipped] {
        doc["info"]["description"] = Value::Null;
        doc["components"]["securitySchemes"] = Value::Null;
    }
    assert_eq!(rendered, shipped);
}

/// A service that takes callbacks unsigned (`callback.allow_unsigned`, no key) refuses none
/// as unauthorized, and its document says so: no security requirement, no 401.
#[test]
fn a_document_of_unsigned_callbacks_documents_no_401_for_them() {
    let mut config = Config::default();
    config.callback.allow_unsigned = true;
    let doc = payhook::server::openapi(&config);
    let callback = &doc["paths"][&config.paths.callback]["post"];
    assert_eq!(callback["security"], json!([{}]));
    assert!(callback["responses"]["401"].is_null(), "{callback}");
    assert!(callback["responses"]["200"].is_object());
}
