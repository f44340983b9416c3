//! A result the merchant's effects hold instead of booking (`Booking::Held`: the example
//! merchant's quarantine) is acknowledged — the aggregator stops retrying, its retries are
//! duplicates — and reported as held, not booked: in the metrics, on the inspector, and by
//! a reconcile (the library call, the operating command's line and the operating API).
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::gateway::GatewayClient;
use payhook::model::TransactionStatus;
use payhook::server::Reconciled;
use payhook::sim::example_merchant as merchant;
use rust_decimal::Decimal;
use serde_json::json;
use support::gateway::FakeGateway;
use support::*;
use uuid::Uuid;

const TOKEN: &str = "admin-token-0123456789";
/// Transactions the aggregator holds, whose callbacks were lost.
const LOST: [&str; 3] = [
    "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
    "7d3c1f00-5b2a-4e8e-8f61-2a9c0e4b7d11",
    "c1a0e6d2-9f3b-4a57-b2e8-64d0f5a3c9e7",
];

/// The example merchant served on port 0, its store in a temp dir, its operating API
/// behind `TOKEN`, looking transactions up at `gateway`.
struct Example {
    addr: std::net::SocketAddr,
    app: payhook::App,
    ledger: merchant::Ledger,
    _data: tempfile::TempDir,
}

async fn start(gateway: &FakeGateway) -> Example {
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("store");
    config.gateway = gateway.config();
    config.admin.token = Some(TOKEN.into());
    let store = merchant::open_store(&config).await.unwrap();
    let ledger = merchant::Ledger::of(&store).unwrap();
    let example = merchant::Merchant {
        max_amount: Decimal::from(1000),
        review_above: None,
        provider_tags: payhook::sim::example_merchant::ProviderTags::default(),
    };
    let app = merchant::app(config, example, store).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(
        listener,
        app.clone(),
        std::future::pending(),
    ));
    Example {
        addr,
        app,
        ledger,
        _data: data,
    }
}

impl Example {
    async fn callback(&self, body: &str) -> RawResponse {
        let headers = [("Content-Type", "application/json")];
        exchange(self.addr, &post(CALLBACK_PATH, &headers, body.as_bytes())).await
    }

    /// The operating API's answer to `method` `path`.
    async fn admin_answer(&self, method: &str, path: &str, body: Option<&str>) -> RawResponse {
        let bearer = format!("Bearer {TOKEN}");
        let headers = [
            ("content-type", "application/json"),
            ("authorization", bearer.as_str()),
        ];
        exchange(
            self.addr,
            &request(method, path, &headers, body.map(str::as_bytes)),
        )
        .await
    }

    /// [`Example::admin_answer`], which must be 200.
    async fn admin(&self, method: &str, path: &str, body: Option<&str>) -> RawResponse {
        let answer = self.admin_answer(method, path, body).await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        answer
    }

    /// What the operating command's reconcile says of `reference_id`.
    async fn reconcile_line(&self, gateway: &GatewayClient, reference_id: Uuid) -> String {
        let mut out = Vec::new();
        payhook::admin::reconcile(&self.app, gateway, &[reference_id], &mut out)
            .await
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    /// What the operating API's reconcile answers of `reference_id`.
    async fn reconcile_api(&self, reference_id: &str) -> serde_json::Value {
        let body = json!({"referenceIds": [reference_id]}).to_string();
        self.admin("POST", "/payhook/admin/reconcile", Some(&body))
            .await
            .json()
    }

    /// The value of `name` (a metric without labels) on `/metrics`.
    async fn metric(&self, name: &str) -> f64 {
        let answer = exchange(self.addr, &request("GET", "/metrics", &[], None)).await;
        let text = String::from_utf8_lossy(&answer.body).into_owned();
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    }
}

/// A callback of `nonce` with transaction type `kind`: 3 is neither a deposit nor a
/// withdrawal, whose success the example does not book (which way the money went is not
/// known) but holds.
fn callback(nonce: &str, kind: i32) -> String {
    let body = with(CALLBACK, "/nonce", Some(json!(nonce)));
    with(&body, "/transactionType", Some(json!(kind)))
}

/// The aggregator's record of `reference_id`: a success of transaction type 3.
fn record(reference_id: &str, nonce: &str) -> serde_json::Value {
    let updated = chrono::Utc::now() - chrono::Duration::minutes(5);
    json!({
        "id": 1001, "transactionReferenceId": reference_id, "providerId": 11,
        "merchantClientId": "client-42", "accountData": {"orderId": "o-1"}, "nonce": nonce,
        "amount": 25.50, "currency": "EUR", "transactionType": 3, "transactionStatus": 4,
        "transactionStatusMessage": "Success", "callbackDeliveryStatus": "Failed",
        "isCallbackSendingCanceled": true,
        "createdUtc": (updated - chrono::Duration::seconds(1)).to_rfc3339(),
        "updatedUtc": updated.to_rfc3339()
    })
}

#[tokio::test]
async fn a_held_result_is_acknowledged_once_and_reported_held_not_booked() {
    let gateway = FakeGateway::start().await;
    let example = start(&gateway).await;

    let held = example.callback(&callback("n-odd", 3)).await;
    assert_eq!(
        (held.status, held.message()),
        (200, "callback accepted".into())
    );
    let retry = example.callback(&callback("n-odd", 3)).await;
    assert_eq!(
        (retry.status, retry.message()),
        (200, "callback already processed".into())
    );
    let booked = example.callback(&callback("n-deposit", 1)).await;
    assert_eq!(booked.status, 200);

    assert_eq!(example.metric("payhook_callbacks_held_total").await, 1.0);
    assert_eq!(example.metric("payhook_callbacks_booked_total").await, 1.0);
    assert_eq!(
        example.metric("payhook_callbacks_duplicate_total").await,
        1.0
    );
    let list: payhook::inspector::DeliveryList = serde_json::from_slice(
        &example
            .admin("GET", "/payhook/admin/deliveries", None)
            .await
            .body,
    )
    .unwrap();
    let seen: Vec<_> = list
        .deliveries
        .iter()
        .map(|d| {
            (
                d.nonce.as_deref().unwrap_or("-"),
                d.outcome.as_str(),
                d.status,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("n-odd", "held", 200),
            ("n-odd", "duplicate", 200),
            ("n-deposit", "booked", 200)
        ]
    );
    let quarantined = example
        .ledger
        .quarantined("n-odd", 4)
        .await
        .unwrap()
        .expect("held in the example's quarantine");
    assert!(
        quarantined.reason.contains("transaction type 3"),
        "{quarantined:?}"
    );
    assert!(
        example.ledger.entry("n-odd").await.unwrap().is_none(),
        "not booked"
    );
    assert!(example.ledger.entry("n-deposit").await.unwrap().is_some());
}

/// payhook keeps what was held, with the payment, until a person resolves it: listed by the
/// operating API and command, counted on `/metrics`, and resolved once — after which the
/// aggregator's retries are still duplicates.
#[tokio::test]
async fn a_held_result_is_listed_and_counted_until_a_person_resolves_it() {
    let gateway = FakeGateway::start().await;
    let example = start(&gateway).await;
    assert_eq!(
        example.metric("payhook_callbacks_held_unresolved").await,
        0.0
    );
    assert_eq!(example.callback(&callback("n-odd", 3)).await.status, 200);
    assert_eq!(
        example.callback(&callback("n-deposit", 1)).await.status,
        200
    );

    assert_eq!(
        example.metric("payhook_callbacks_held_unresolved").await,
        1.0
    );
    let listed = example
        .admin("GET", "/payhook/admin/callbacks/held", None)
        .await
        .json();
    let [held] = listed.as_array().unwrap().as_slice() else {
        panic!("one held result: {listed}")
    };
    assert_eq!(held["nonce"], "n-odd");
    assert_eq!(held["status"], 4);
    assert_eq!(
        held["transactionReferenceId"],
        "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e"
    );
    assert_eq!(
        (&held["clientId"], &held["amount"], &held["currency"]),
        (&json!("client-42"), &json!("0.1"), &json!("EUR")),
        "{held}"
    );
    assert!(
        held["reason"]
            .as_str()
            .unwrap()
            .contains("transaction type 3")
    );
    assert!(held["heldMs"].as_i64().unwrap() > 0);

    // The operating command, through the running service's API.
    let config = test_config();
    let client =
        payhook::admin::AdminClient::new(&format!("http://{}", example.addr), TOKEN.into())
            .unwrap();
    let mut out = Vec::new();
    let held_command = payhook::admin::CallbacksCommand::Held {
        json: false,
        latest: None,
    };
    payhook::admin::AdminCommand::Callbacks(held_command)
        .run_remote(&config, &client, &mut out)
        .await
        .unwrap();
    let table = String::from_utf8(out).unwrap();
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(rows[0].starts_with("n-odd "), "{table}");
    assert!(rows[0].contains("transaction type 3"), "{table}");

    let note = "booked by hand as an adjustment";
    let pair =
        json!({"nonce": "n-odd", "status": 4, "note": note, "by": "Alice (ops)"}).to_string();
    let other = json!({"nonce": "n-deposit", "status": 4, "note": note}).to_string();
    let path = "/payhook/admin/callbacks/held/resolve";
    let unsaid = json!({"nonce": "n-odd", "status": 4, "note": " "}).to_string();
    let refused = example.admin_answer("POST", path, Some(&unsaid)).await;
    assert_eq!(
        (refused.status, refused.message()),
        (
            400,
            "`note`: a note saying what was done in the merchant's books is needed".into()
        )
    );
    for malformed in [
        json!({"nonce": "n-odd", "status": "4", "note": note}).to_string(),
        json!({"status": 4, "note": note}).to_string(),
        json!({"nonce": "n-odd", "status": 4, "note": note, "by": 7}).to_string(),
        "{\"nonce\": \"n-odd\", ".to_owned(),
        // No held result carries U+0000 (the endpoints refuse such a nonce), and
        // PostgreSQL's text could not be asked about one: a bad request on every store.
        json!({"nonce": "n-\u{0}odd", "status": 4, "note": note}).to_string(),
    ] {
        let refused = example.admin_answer("POST", path, Some(&malformed)).await;
        assert_eq!(refused.status, 400, "{malformed}: {}", refused.message());
    }
    let refused = example.admin_answer("POST", path, Some(&other)).await;
    assert_eq!(refused.status, 404, "booked, never held");
    assert!(
        refused
            .message()
            .starts_with("no held result of nonce n-deposit"),
        "{}",
        refused.message()
    );
    let resolved = example.admin("POST", path, Some(&pair)).await.json();
    assert_eq!(resolved["nonce"], "n-odd");
    assert_eq!(resolved["reason"], held["reason"]);
    assert_eq!(resolved["resolution"], note);
    assert_eq!(resolved["resolvedBy"], "Alice (ops)");
    assert!(resolved["resolvedMs"].as_i64().unwrap() >= held["heldMs"].as_i64().unwrap());
    assert_eq!(
        example.metric("payhook_callbacks_held_unresolved").await,
        0.0
    );
    let again = example.admin_answer("POST", path, Some(&pair)).await;
    assert_eq!(again.status, 404, "resolved once");
    let mut out = Vec::new();
    let resolve = payhook::admin::CallbacksCommand::Resolve {
        nonce: "n-odd".into(),
        status: 4,
        note: note.into(),
        by: Some("Bob".into()),
    };
    let refused = payhook::admin::AdminCommand::Callbacks(resolve)
        .run_remote(&config, &client, &mut out)
        .await;
    assert!(
        matches!(
            refused,
            Err(payhook::admin::AdminError::NotHeld { status: 4, .. })
        ),
        "{refused:?}"
    );
    let listed = example
        .admin("GET", "/payhook/admin/callbacks/held", None)
        .await
        .json();
    assert_eq!(listed, json!([]));
    let retry = example.callback(&callback("n-odd", 3)).await;
    assert_eq!(retry.message(), "callback already processed");
}

#[tokio::test]
async fn a_reconciled_result_the_merchant_holds_is_told_held() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        for (i, id) in LOST.iter().enumerate() {
            s.transactions
                .insert((*id).to_owned(), record(id, &format!("n-lost-{i}")));
        }
    });
    let example = start(&gateway).await;
    let client = GatewayClient::new(&gateway.config()).unwrap();
    let first: Uuid = LOST[0].parse().unwrap();

    let outcome = example.app.reconcile(&client, &[first]).await;
    let [(id, Ok(Reconciled::Held { status, reason }))] = &outcome[..] else {
        panic!("held: {outcome:?}")
    };
    assert_eq!((*id, *status), (first, TransactionStatus::Success));
    assert!(reason.contains("transaction type 3"), "{reason}");
    // Acknowledged: the aggregator's record is not booked, nor held, twice; and it is told
    // held still, since no one has resolved it.
    let again = example.app.reconcile(&client, &[first]).await;
    assert!(
        matches!(&again[..], [(_, Ok(Reconciled::AlreadyHeld { held, .. }))]
            if held.reason == *reason && held.unresolved()),
        "{again:?}"
    );
    let late = example
        .callback(&with(
            &callback("n-lost-0", 3),
            "/transactionReferenceId",
            Some(json!(LOST[0])),
        ))
        .await;
    assert_eq!(late.message(), "callback already processed");

    // The operating command's line says so plainly, and so does the operating API.
    let second: Uuid = LOST[1].parse().unwrap();
    let line = example.reconcile_line(&client, second).await;
    assert!(
        line.starts_with(&format!("{second}: acknowledged now (")),
        "{line}"
    );
    assert!(
        line.contains("HELD by the merchant, not booked: "),
        "{line}"
    );
    assert!(line.contains("transaction type 3"), "{line}");
    let answered = example.reconcile_api(LOST[2]).await;
    assert_eq!(answered[0]["outcome"], "held", "{answered}");
    assert_eq!(answered[0]["status"], 4);
    assert!(
        answered[0]["message"]
            .as_str()
            .unwrap()
            .contains("transaction type 3"),
        "{answered}"
    );
    assert_eq!(example.metric("payhook_callbacks_held_total").await, 3.0);
    assert_eq!(example.metric("payhook_callbacks_booked_total").await, 0.0);
    assert_eq!(
        example.metric("payhook_callbacks_held_unresolved").await,
        3.0
    );

    // Reconciled again, each is told still held: by the line and by the operating API;
    // once a person resolved it, resolved, when, and what they said.
    let line = example.reconcile_line(&client, second).await;
    assert!(
        line.starts_with(&format!("{second}: already acknowledged (")),
        "{line}"
    );
    assert!(
        line.contains("HELD by the merchant, not booked: "),
        "{line}"
    );
    let answered = example.reconcile_api(LOST[2]).await;
    assert_eq!(answered[0]["outcome"], "already_held", "{answered}");
    assert!(
        answered[0]["message"]
            .as_str()
            .unwrap()
            .contains("transaction type 3"),
        "{answered}"
    );
    let pair = json!({"nonce": "n-lost-2", "status": 4, "note": "refunded to the client"});
    example
        .admin(
            "POST",
            "/payhook/admin/callbacks/held/resolve",
            Some(&pair.to_string()),
        )
        .await;
    let answered = example.reconcile_api(LOST[2]).await;
    assert_eq!(answered[0]["outcome"], "already_resolved", "{answered}");
    let told = answered[0]["message"].as_str().unwrap();
    assert!(
        told.contains("transaction type 3") && told.ends_with(": refunded to the client"),
        "{answered}"
    );
    let third: Uuid = LOST[2].parse().unwrap();
    let outcome = example.app.reconcile(&client, &[third]).await;
    let [(_, Ok(Reconciled::AlreadyHeld { held, .. }))] = &outcome[..] else {
        panic!("resolved: {outcome:?}")
    };
    assert_eq!(
        (held.unresolved(), held.resolution.as_str()),
        (false, "refunded to the client")
    );
    assert_eq!(
        example.metric("payhook_callbacks_held_unresolved").await,
        2.0
    );
}

/// The example's own operating command lists what it holds, for the person who resolves it:
/// the real binary served the held callback, was killed (nothing held is lost with it), and
/// lists it from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_lists_what_it_holds_in_quarantine() {
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".to_owned()),
        (
            "PAYHOOK_STORE_PATH",
            data.path().join("store").display().to_string(),
        ),
        ("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".to_owned()),
    ];
    let (mut example, addr) = spawn_example(&env);
    // A client id longer than a log line shows: listed whole.
    let client = format!("client-{}", "7".repeat(200));
    let odd = with(
        &callback("n-odd\u{1b}[2J", 3),
        "/clientId",
        Some(json!(client)),
    );
    let headers = [("Content-Type", "application/json")];
    let answer = exchange(addr, &post(CALLBACK_PATH, &headers, odd.as_bytes())).await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    let booked = exchange(
        addr,
        &post(CALLBACK_PATH, &headers, callback("n-deposit", 1).as_bytes()),
    )
    .await;
    assert_eq!(booked.status, 200);
    example.kill();

    let example_env = env.clone();
    let listed =
        tokio::task::spawn_blocking(move || run_example_to_exit(&example_env, &["quarantine"]))
            .await
            .unwrap();
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    // The nonce as it came, its control characters escaped: not a terminal's command.
    assert!(
        lines[0].starts_with("n-odd\\u{1b}[2J: status 4 of "),
        "{stdout}"
    );
    for said in [
        &format!("for client {client},"),
        "transaction 0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e",
        "transaction type 3 is neither a deposit nor a withdrawal",
    ] {
        assert!(lines[0].contains(said), "{said} in {stdout}");
    }
    assert_eq!(lines[1], "1 result(s) in quarantine");

    // payhook's own commands on the stopped store: listed, then resolved once with a note.
    let payhook = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_payhook"));
        command
            .env_clear()
            .env("RUST_LOG", "warn")
            // Who resolves, unless `--by` says: who ran sudo, else the user it runs as.
            .env("USER", "payhook")
            .env("SUDO_USER", "carol")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(args);
        command.output().unwrap()
    };
    let listed = payhook(&["callbacks", "held", "--json"]);
    assert!(listed.status.success(), "{listed:?}");
    let held: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(held[0]["nonce"], "n-odd\u{1b}[2J", "{held}");
    assert_eq!(held[0]["clientId"], client.as_str());
    let nonce = held[0]["nonce"].as_str().unwrap();
    let resolve = ["callbacks", "resolve", "--nonce", nonce, "--status", "4"];
    let resolved = payhook(&[&resolve[..], &["--note", "booked by hand"]].concat());
    let said = String::from_utf8_lossy(&resolved.stdout);
    assert!(resolved.status.success(), "{resolved:?}");
    assert!(
        said.starts_with("resolved: nonce n-odd\\u{1b}[2J (4 (success)), held "),
        "{said}"
    );
    assert!(
        said.contains("kept with your note (booked by hand) and your name (carol)"),
        "{said}"
    );
    let logged = String::from_utf8_lossy(&resolved.stderr);
    assert!(
        logged.contains("a held result was resolved by a person")
            && logged.contains("resolver=carol")
            && logged.contains("the command line, on the store"),
        "{logged}"
    );
    let again = payhook(&[&resolve[..], &["--note", "again"]].concat());
    assert_eq!(again.status.code(), Some(2), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("status 4 waits: not held, or resolved"),
        "{again:?}"
    );
    let listed = payhook(&["callbacks", "held"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("(none)"),
        "{listed:?}"
    );
}
