//! A signed callback whose body payhook refuses (400) would be refused the same way on each
//! of the aggregator's attempts and never booked: it is listed among the failing callbacks
//! under its (nonce, status), with the refusal as its reason, until a delivery of that
//! (nonce, status) is booked. A body without a readable nonce and status cannot be listed,
//! and a body whose signature does not verify is never recorded.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::signature::{Algorithm, SigningKey};
use serde_json::{Value, json};
use support::*;

const TOKEN: &str = "admin-token-0123456789";

fn signer() -> SigningKey {
    fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256)
}

fn config() -> payhook::Config {
    let mut config = signed_config(&["rsa2048"]);
    config.admin.token = Some(TOKEN.into());
    config
}

async fn server() -> TestServer {
    TestServer::start_with(config()).await
}

/// [`CALLBACK`] with `nonce`, and `pointer`'s value replaced (or removed, `None`).
fn body(nonce: &str, pointer: &str, value: Option<Value>) -> String {
    with(
        &with(CALLBACK, "/nonce", Some(json!(nonce))),
        pointer,
        value,
    )
}

async fn refused(server: &TestServer, body: &str, field: &str) {
    let answer = server.send(&signed_post(&signer(), body)).await;
    assert_eq!(answer.status, 400, "{}", answer.message());
    assert!(
        answer.message().contains(field),
        "the answer names `{field}`: {}",
        answer.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_signed_callback_is_listed_until_its_nonce_and_status_are_booked() {
    listed_until_booked(&server().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_refused_signed_callback_is_listed_until_booked() {
    let test = "on_postgresql_a_refused_signed_callback_is_listed_until_booked";
    let Some(db) = support::postgres::database(test).await else {
        return;
    };
    let mut config = config();
    config.store = db.store_config(std::time::Duration::from_secs(3600));
    let store = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store).await;
    listed_until_booked(&server).await;
    db.drop_schema().await;
}

async fn listed_until_booked(server: &TestServer) {
    let null_client = body("refused-1", "/clientId", Some(Value::Null));
    for _ in 0..2 {
        refused(server, &null_client, "clientId").await;
    }
    refused(
        server,
        &body("refused-2", "/transactionReferenceId", Some(json!("T-77"))),
        "transactionReferenceId",
    )
    .await;
    assert_eq!(callbacks_handled(server, "refused-1"), 0);

    let listed = failing_listed(server, TOKEN).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let first = listed.iter().find(|f| f["nonce"] == "refused-1").unwrap();
    assert_eq!(first["status"], 4);
    assert_eq!(first["failures"], 2);
    assert_eq!(
        first["transactionReferenceId"],
        "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e"
    );
    assert_eq!(first["clientId"], "", "the refused client id is left empty");
    assert_eq!(first["currency"], "EUR");
    assert!(
        first["lastReason"]
            .as_str()
            .is_some_and(|reason| reason.contains("clientId")),
        "{first}"
    );
    let second = listed.iter().find(|f| f["nonce"] == "refused-2").unwrap();
    assert_eq!(
        second["transactionReferenceId"], "00000000-0000-0000-0000-000000000000",
        "a reference that is no GUID is left nil: {second}"
    );
    server
        .assert_metrics(&["payhook_callbacks_failing 2"])
        .await;

    // The aggregator's corrected delivery of the same (nonce, status) is booked, and the
    // refusal is forgotten with it.
    let corrected = body("refused-1", "/clientId", Some(json!("client-42")));
    let answer = server.send(&signed_post(&signer(), &corrected)).await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    assert_eq!(callbacks_handled(server, "refused-1"), 1);
    let listed = failing_listed(server, TOKEN).await;
    assert!(
        listed.iter().all(|f| f["nonce"] != "refused-1"),
        "{listed:?}"
    );
    assert_eq!(listed.len(), 1, "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_without_a_readable_nonce_and_status_or_a_verified_signature_is_not_listed() {
    let server = &server().await;
    refused(server, &body("x", "/nonce", Some(Value::Null)), "nonce").await;
    refused(
        server,
        &body("n-1", "/transactionStatus", Some(json!("success"))),
        "transactionStatus",
    )
    .await;
    let not_json = server
        .send(&signed_post(&signer(), "{\"nonce\": \"n-2\""))
        .await;
    assert_eq!(not_json.status, 400, "{}", not_json.message());

    // Signed by another key: refused before its body is read, and never recorded.
    let forged = signed_post(
        &fixture_signer("rsa3072", Algorithm::RsaPkcs1Sha256),
        &body("forged-1", "/clientId", Some(Value::Null)),
    );
    assert_eq!(server.send(&forged).await.status, 401);

    assert_eq!(failing_listed(server, TOKEN).await, Vec::<Value>::new());
    server
        .assert_metrics(&["payhook_callbacks_failing 0"])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_signatures_turned_off_a_refused_callback_is_listed_too() {
    let mut config = test_config();
    config.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(config).await;
    let answer = server
        .send(&post(
            CALLBACK_PATH,
            &[("Content-Type", "application/json")],
            body("unsigned-1", "/currency", Some(Value::Null)).as_bytes(),
        ))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.message());
    let listed = failing_listed(&server, TOKEN).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["nonce"], "unsigned-1");
    assert_eq!(listed[0]["currency"], "");
}
