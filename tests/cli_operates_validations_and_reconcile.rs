//! The operating commands of the real `payhook` binary (and the example merchant's binary)
//! over a service's store and a fake aggregator: list and decide postponed validations,
//! print a transaction, and find and book lost callbacks.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use bytes::Bytes;
use http_body_util::Full;
use payhook::{App, Config};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;
use support::gateway::FakeGateway;
use support::{
    TRANSACTION_VALIDATION, TestMerchant, VALIDATION_PATH, example_binary, test_config, with,
};

const REFERENCE: &str = "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e";

fn env(gateway: &FakeGateway, store: &Path) -> Vec<(String, String)> {
    let mut env = support::gateway_env(&gateway.config());
    env.extend([
        ("PAYHOOK_STORE_PATH", store.display().to_string()),
        ("RUST_LOG", "error".to_owned()),
        // The example merchant has no aggregator key here: it must be told explicitly that
        // unsigned callbacks are acceptable, or it refuses to start.
        ("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".to_owned()),
    ]);
    support::owned_env(&env)
}

/// Runs `binary args` off the runtime (the fake gateway must keep answering meanwhile).
async fn run(binary: std::path::PathBuf, args: &[&str], env: &[(String, String)]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let env = env.to_vec();
    tokio::task::spawn_blocking(move || {
        Command::new(binary)
            .args(args)
            .env_clear()
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

async fn payhook(args: &[&str], env: &[(String, String)]) -> (i32, String, String) {
    let output = run(env!("CARGO_BIN_EXE_payhook").into(), args, env).await;
    (
        output.status.code().unwrap(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn awaitable(gateway: &FakeGateway, store: &Path) -> Config {
    let mut config = test_config();
    config.store.path = store.to_owned();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.validation.retry_schedule = vec![Duration::from_millis(20)];
    config
}

async fn validate(app: &App, client: &str, id: i64) -> u16 {
    let body = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!(client)),
    );
    let body = with(&body, "/paymentData/nonce", Some(json!(format!("n-{id}"))));
    let body = with(&body, "/validationId", Some(json!(id)));
    let request = http::Request::post(VALIDATION_PATH)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    app.handle(request).await.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validations_are_listed_and_decided_from_the_command_line_and_then_delivered() {
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let env = env(&gateway, &store);
    {
        // A service that stops before its outbox delivers anything (its first request
        // would start the worker otherwise): what it decided waits in the store.
        let app = App::builder(awaitable(&gateway, &store))
            .transaction_validator(TestMerchant::default())
            .manual_background()
            .build()
            .unwrap();
        assert_eq!(validate(&app, "postpone", 1).await, 200);
        assert_eq!(validate(&app, "postpone", 2).await, 200);
        assert_eq!(validate(&app, "client-42", 3).await, 200);
        // While the service holds the store, the command line says so.
        let (code, _, stderr) = payhook(&["validations", "list"], &env).await;
        assert_eq!(code, 2);
        assert!(stderr.contains("in use"), "{stderr}");
        assert!(
            stderr.contains("--admin-url"),
            "the way out is named: {stderr}"
        );
    }

    let (code, stdout, stderr) = payhook(&["validations", "list", "--pending"], &env).await;
    assert_eq!(code, 0, "{stderr}");
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    // The same list for scripts.
    let (code, json, stderr) = payhook(&["validations", "list", "--pending", "--json"], &env).await;
    assert_eq!(code, 0, "{stderr}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(listed.len(), 2, "{json}");
    assert_eq!(listed[0]["validation_id"], 1, "{json}");
    assert!(
        rows[0].starts_with("1 ") && rows[0].contains("pending") && rows[0].contains("n-1"),
        "{stdout}"
    );
    assert!(rows[1].starts_with("2 "), "{stdout}");

    let (code, stdout, stderr) = payhook(
        &[
            "validations",
            "resolve",
            "1",
            "--deny",
            "--description",
            "no documents",
            "--by",
            "Dana (ops)",
        ],
        &env,
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("validation 1: denied"), "{stdout}");
    let (code, _, stderr) = payhook(&["validations", "resolve", "1", "--allow"], &env).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("already decided differently"), "{stderr}");
    let (code, _, stderr) = payhook(&["validations", "resolve", "1"], &env).await;
    assert_eq!(code, 2, "--allow or --deny is required: {stderr}");

    let (_, stdout, _) = payhook(&["validations", "list"], &env).await;
    let row = |id: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap()
            .to_owned()
    };
    assert!(
        row("1").contains("queued") && row("1").contains("deny"),
        "{stdout}"
    );
    // Who decided is kept with the decision; the handler's own decision names nobody.
    assert!(row("1").ends_with("; decided by Dana (ops)"), "{stdout}");
    assert!(row("2").contains("pending"), "{stdout}");
    assert!(
        row("3").contains("queued") && row("3").contains("allow"),
        "{stdout}"
    );
    assert!(!row("3").contains("decided by"), "{stdout}");

    // The service starts again: its outbox delivers the decisions, the command line's too.
    let app = App::builder(awaitable(&gateway, &store))
        .transaction_validator(TestMerchant::default())
        .build()
        .unwrap();
    app.start_background();
    gateway
        .until("both decided results", |s| s.results.len() == 2)
        .await;
    assert_eq!(
        gateway.with(|s| s.results.get(&1).cloned()),
        Some((false, "no documents".to_owned()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_is_printed_and_a_lost_callback_is_found_then_booked_once() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.transactions.insert(
            REFERENCE.to_owned(),
            json!({
                "id": 1001, "transactionReferenceId": REFERENCE, "providerId": 11, "providerName": "Card",
                "merchantClientId": "client-42", "accountData": {}, "nonce": "nonce-lost",
                "amount": 25.50, "currency": "EUR", "transactionType": 1, "transactionStatus": 4,
                "transactionStatusMessage": "Success", "callbackDeliveryStatus": "Failed",
                "isCallbackSendingCanceled": true, "createdUtc": chrono::Utc::now().to_rfc3339(),
                "updatedUtc": chrono::Utc::now().to_rfc3339()
            }),
        )
    });
    let dir = tempfile::tempdir().unwrap();
    // The service's store: it ran before.
    drop(payhook::store::SledStore::open(&config_at(&dir.path().join("store")), &[]).unwrap());
    let env = env(&gateway, &dir.path().join("store"));

    let (code, stdout, stderr) = payhook(&["transaction", REFERENCE], &env).await;
    assert_eq!(code, 0, "{stderr}");
    for expected in ["nonce-lost", "success", "25.5 EUR", "Card (11)", "Failed"] {
        assert!(stdout.contains(expected), "{expected} in {stdout}");
    }
    let (code, _, stderr) = payhook(
        &["transaction", "00000000-0000-0000-0000-000000000000"],
        &env,
    )
    .await;
    assert_eq!(code, 2);
    assert!(
        stderr.contains("404") && stderr.contains("transaction not found"),
        "{stderr}"
    );

    // The payhook binary has no handler: it finds the lost result…
    let (code, stdout, _) = payhook(&["reconcile", "--ref", REFERENCE], &env).await;
    assert_eq!(code, 2);
    assert!(
        stdout.contains("LOST") && stdout.contains("nonce-lost"),
        "{stdout}"
    );
    // …the merchant's own binary books it, once…
    let merchant = |env: Vec<(String, String)>| async move {
        let output = run(example_binary(), &["reconcile", "--ref", REFERENCE], &env).await;
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert!(merchant(env.clone()).await.contains("booked now"));
    assert!(merchant(env.clone()).await.contains("already acknowledged"));
    // …and then it is booked.
    let (code, stdout, stderr) = payhook(&["reconcile", "--ref", REFERENCE], &env).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(": acknowledged (4 (success)): booked (unless your handler held it"),
        "{stdout}"
    );

    // A lost result whose record cannot be booked (no client to book it to): booking it by
    // hand writes no deduplication record, so it is advised only once the aggregator has
    // stopped delivering it; while it may still deliver it — to a handler that would book
    // it — the line says so instead.
    gateway.with(|s| {
        let record = s.transactions.get_mut(REFERENCE).unwrap();
        record["nonce"] = json!("nonce-unbookable");
        record.as_object_mut().unwrap().remove("merchantClientId");
        record["callbackDeliveryStatus"] = json!("Retrying");
        record["isCallbackSendingCanceled"] = json!(false);
    });
    let (code, stdout, _) = payhook(&["reconcile", "--ref", REFERENCE], &env).await;
    assert_eq!(code, 2);
    assert!(
        stdout.contains("LOST")
            && stdout.contains("cannot be booked (the record names no merchantClientId")
            && stdout.contains("may still deliver its callback (delivery status `Retrying`")
            && stdout
                .contains("book it by hand only once the aggregator has stopped delivering it")
            && !stdout.trim_end().ends_with("book it by hand"),
        "{stdout}"
    );
    gateway.with(|s| {
        let record = s.transactions.get_mut(REFERENCE).unwrap();
        record["isCallbackSendingCanceled"] = json!(true);
    });
    let (code, stdout, _) = payhook(&["reconcile", "--ref", REFERENCE], &env).await;
    assert_eq!(code, 2);
    assert!(
        stdout.contains("the aggregator canceled its callback's sending: book it by hand"),
        "{stdout}"
    );
    gateway.with(|s| {
        let record = s.transactions.get_mut(REFERENCE).unwrap();
        record["merchantClientId"] = json!("client-42");
    });

    // A lost result whose record carries no creation time may have been booked and purged
    // long ago: not reported LOST (which invites booking it again), but as one that cannot
    // be told.
    gateway.with(|s| {
        let record = s.transactions.get_mut(REFERENCE).unwrap();
        record["nonce"] = json!("nonce-untold");
        record.as_object_mut().unwrap().remove("createdUtc");
    });
    let (code, stdout, _) = payhook(&["reconcile", "--ref", REFERENCE], &env).await;
    assert_eq!(code, 2);
    assert!(
        stdout.contains("cannot tell") && !stdout.contains("LOST"),
        "{stdout}"
    );

    // A lookup that answers about another transaction tells nothing of this one: neither
    // booked nor LOST.
    gateway.with(|s| {
        let record = s.transactions.get_mut(REFERENCE).unwrap();
        record["nonce"] = json!("nonce-lost");
        record["transactionReferenceId"] = json!("0b7e5a52-2f59-4c1e-9d0c-000000000009");
    });
    let (code, stdout, _) = payhook(&["reconcile", "--ref", REFERENCE], &env).await;
    assert_eq!(code, 2);
    assert!(
        stdout.contains(
            "NOT checked: the lookup answered with transaction 0b7e5a52-2f59-4c1e-9d0c-000000000009"
        ) && !stdout.contains("booked"),
        "{stdout}"
    );
}

/// The store settings of a sled store in `path`.
fn config_at(path: &Path) -> payhook::store::StoreConfig {
    payhook::store::StoreConfig {
        path: path.to_owned(),
        ..payhook::store::StoreConfig::default()
    }
}

/// An operating command pointed at a directory that holds no store (a relative
/// `store.path` read from another directory, a missing `PAYHOOK_STORE_PATH`) is refused,
/// and creates nothing there: it used to open a new, empty store, in which `reconcile`
/// reported every booked result LOST — an invitation to book it by hand a second time —
/// and `validations list --pending` showed nothing waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operating_command_on_a_path_without_a_store_is_refused_and_creates_nothing() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.transactions.insert(
            REFERENCE.to_owned(),
            json!({
                "id": 1001, "transactionReferenceId": REFERENCE, "merchantClientId": "client-42",
                "nonce": "nonce-booked", "amount": 25.50, "currency": "EUR", "transactionType": 1,
                "transactionStatus": 4, "createdUtc": chrono::Utc::now().to_rfc3339()
            }),
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("not-the-store");
    let env = env(&gateway, &nowhere);
    for args in [
        &["reconcile", "--ref", REFERENCE][..],
        &["validations", "list", "--pending"][..],
        &["callbacks", "failing"][..],
    ] {
        let (code, stdout, stderr) = payhook(args, &env).await;
        assert_eq!(code, 2, "{args:?}: {stdout}{stderr}");
        assert!(
            stderr.contains(&format!("there is no store at {}", nowhere.display()))
                && !stdout.contains("LOST"),
            "{args:?}: {stdout}{stderr}"
        );
        assert!(!nowhere.exists(), "{args:?} created a store");
    }
    // The merchant's own binary, which books through its handlers, refuses it too.
    let output = run(example_binary(), &["reconcile", "--ref", REFERENCE], &env).await;
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(said.contains("there is no store at"), "{said}");
    assert!(!nowhere.exists(), "the merchant's binary created a store");
}

/// On PostgreSQL, an operating command pointed at a schema in which no service created its
/// tables (`store.schema` mistyped) is refused, and creates nothing: no schema, no tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operating_command_on_a_schema_without_a_store_is_refused_and_creates_nothing() {
    let Some(db) = support::postgres::database("no_store_in_schema").await else {
        return;
    };
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = env(&gateway, &dir.path().join("unused"));
    env.extend([
        ("PAYHOOK_STORE_URL".to_owned(), db.url.clone()),
        ("PAYHOOK_STORE_SCHEMA".to_owned(), db.schema.clone()),
    ]);
    let (code, stdout, stderr) = payhook(&["validations", "list", "--pending"], &env).await;
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "there is no payhook store in schema {} of store.url's database",
            db.schema
        )),
        "{stderr}"
    );
    let mut conn = db.connect().await;
    let (created,): (bool,) = sqlx::query_as("SELECT to_regnamespace($1) IS NOT NULL")
        .bind(&db.schema)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(!created, "the command created the schema");
}

/// The example's lookup of a transaction reads the aggregator alone: it opens no store, so
/// it creates none where the service never ran, and it runs beside a service that holds its
/// sled store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_transaction_lookup_opens_no_store() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.transactions.insert(
            REFERENCE.to_owned(),
            json!({
                "id": 1001, "transactionReferenceId": REFERENCE, "providerId": 11,
                "merchantClientId": "client-42", "accountData": {}, "nonce": "nonce-looked-up",
                "amount": 25.50, "currency": "EUR", "transactionType": 1, "transactionStatus": 4,
                "callbackDeliveryStatus": "Delivered", "isCallbackSendingCanceled": false,
                "createdUtc": chrono::Utc::now().to_rfc3339(),
                "updatedUtc": chrono::Utc::now().to_rfc3339()
            }),
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("never-ran");
    let output = run(
        example_binary(),
        &["transaction", REFERENCE],
        &env(&gateway, &store),
    )
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("nonce-looked-up"));
    assert!(!store.exists(), "a store was created by a lookup");

    // Beside a service that holds its store.
    let held = dir.path().join("held");
    let _service = payhook::store::SledStore::open(&config_at(&held), &[]).unwrap();
    let output = run(
        example_binary(),
        &["transaction", REFERENCE],
        &env(&gateway, &held),
    )
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
