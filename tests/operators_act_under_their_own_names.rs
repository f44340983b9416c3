//! Operators with tokens of their own (`[admin.operators]`): a call made with one is that
//! operator's, and what they do to the merchant's money — a postponed validation decided, a
//! held result resolved — is kept with their name, whatever name the request gives; the
//! shared token's bearers name themselves. The configuration holds each token by its
//! SHA-256 only; `payhook operator-token` makes a token and its entry.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::server::OperatorToken;
use serde_json::{Value, json};
use support::gateway::FakeGateway;
use support::*;

const SHARED: &str = "admin-token-0123456789";
const ALICE: &str = "phop_alice-token-for-tests-0123456789";
const BOB: &str = "phop_bob-token-for-tests-0123456789";

/// An Awaitable service whose operating API lets in alice and bob by their own tokens, and
/// `shared` when given.
fn config(gateway: &FakeGateway, shared: Option<&str>) -> payhook::Config {
    let mut config = test_config();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.admin.token = shared.map(Into::into);
    config.admin.operators = [("alice", ALICE), ("bob", BOB)]
        .into_iter()
        .map(|(name, token)| (name.to_owned(), OperatorToken::digest_of(token)))
        .collect();
    config
}

/// Why the service refuses to start with `config`.
fn refused_at_start(config: payhook::Config) -> String {
    payhook::App::builder(config)
        .transaction_validator(TestMerchant::default())
        .build()
        .unwrap_err()
        .to_string()
}

/// The decision the service keeps on validation `id`, as the API lists it.
async fn decided(server: &TestServer, token: &str, id: i64) -> Value {
    let listed = server
        .admin("GET", "/payhook/admin/validations", Some(token), None)
        .await;
    assert_eq!(listed.status, 200, "{}", listed.message());
    let list = listed.json();
    let found = list
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["validation_id"] == id)
        .unwrap_or_else(|| panic!("validation {id} in {list}"));
    found["result"].clone()
}

#[tokio::test]
async fn an_operators_own_token_lets_them_in_without_a_shared_one() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway, None)).await;
    let validations = "/payhook/admin/validations";
    for token in [ALICE, BOB] {
        let answer = server.admin("GET", validations, Some(token), None).await;
        assert_eq!(answer.status, 200, "{}", answer.message());
    }
    let refused = [
        (None, "missing credentials"),
        (Some(SHARED), "invalid credentials"),
        (
            Some(&*OperatorToken::digest_of(ALICE)),
            "invalid credentials",
        ),
        (Some(&ALICE[..ALICE.len() - 1]), "invalid credentials"),
    ];
    for (token, said) in refused {
        let answer = server.admin("GET", validations, token, None).await;
        assert_eq!(
            (answer.status, answer.message()),
            (401, said.into()),
            "{token:?}"
        );
    }
}

#[tokio::test]
async fn a_validation_an_operator_decides_is_kept_with_their_name_not_the_one_they_give() {
    let logs = captured_logs(tracing::Level::INFO);
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway, Some(SHARED))).await;
    let id = server.postpone_validation().await;
    let path = format!("/payhook/admin/validations/{id}");
    let body = json!({"success": true, "description": "documents checked", "by": "mallory"});
    let answer = server
        .admin("POST", &path, Some(ALICE), Some(&body.to_string()))
        .await;
    assert_eq!((answer.status, answer.message()), (200, "recorded".into()));
    let result = decided(&server, BOB, id).await;
    assert_eq!(result["success"], true, "{result}");
    assert_eq!(result["decided_by"], "alice", "{result}");

    // The same decision again, by bob: unchanged, and who took it first stays.
    let again = server
        .admin("POST", &path, Some(BOB), Some(&body.to_string()))
        .await;
    assert_eq!((again.status, again.message()), (200, "unchanged".into()));
    assert_eq!(decided(&server, SHARED, id).await["decided_by"], "alice");
    gateway
        .until("the decided result", |s| s.results.contains_key(&id))
        .await;

    // The log tells who asked each change, with which token, and who decided; no token
    // (of any test of this binary, which logs into the same place) is ever written.
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    // Every test of this binary logs into the same place, and others decide the same id
    // with other tokens: the line of alice's decision is the one that names her token.
    assert!(
        text.lines().any(|l| l.contains("admin: a change was asked")
            && l.contains(&path)
            && l.contains("with the token of operator alice")
            && l.contains("status=200")),
        "the change is logged with alice's token and its status: {text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("postponed validation decided") && l.contains("decider=alice")),
        "{text}"
    );
    for token in [ALICE, BOB, SHARED] {
        assert!(!text.contains(token), "a token in the log: {text}");
    }
}

#[tokio::test]
async fn a_bearer_of_the_shared_token_is_kept_by_the_name_they_give_or_none() {
    let gateway = FakeGateway::start().await;
    for (by, kept) in [
        (json!("  carol  "), json!("carol")),
        (json!("   "), Value::Null),
        (Value::Null, Value::Null),
    ] {
        let server = TestServer::start_with(config(&gateway, Some(SHARED))).await;
        let id = server.postpone_validation().await;
        let path = format!("/payhook/admin/validations/{id}");
        let mut body = json!({"success": false, "description": "no documents"});
        if !by.is_null() {
            body["by"] = by.clone();
        }
        let answer = server
            .admin("POST", &path, Some(SHARED), Some(&body.to_string()))
            .await;
        assert_eq!((answer.status, answer.message()), (200, "recorded".into()));
        let result = decided(&server, SHARED, id).await;
        assert_eq!(result["decided_by"], kept, "by {by}: {result}");
    }
    let server = TestServer::start_with(config(&gateway, Some(SHARED))).await;
    let id = server.postpone_validation().await;
    let path = format!("/payhook/admin/validations/{id}");
    let answer = server
        .admin(
            "POST",
            &path,
            Some(SHARED),
            Some(r#"{"success": true, "by": 7}"#),
        )
        .await;
    assert_eq!(answer.status, 400, "{}", answer.message());
    assert!(answer.message().contains("by"), "{}", answer.message());
}

/// A bearer of the shared token cannot give an operator's name: what alice decides or
/// resolves is kept as her login, and a change in her name with the shared token would
/// read as hers. Refused (403), nothing kept.
#[tokio::test]
async fn the_shared_token_cannot_act_in_an_operators_name() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway, Some(SHARED))).await;
    let id = server.postpone_validation().await;
    let path = format!("/payhook/admin/validations/{id}");
    let held = with(CALLBACK, "/clientId", Some(json!("hold")));
    let held = with(&held, "/nonce", Some(json!("n-held")));
    assert_eq!(server.post_json(CALLBACK_PATH, &held).await.status, 200);
    for by in ["alice", " alice ", "Alice", "al\u{200B}ice"] {
        let decision = json!({"success": true, "by": by});
        let answer = server
            .admin("POST", &path, Some(SHARED), Some(&decision.to_string()))
            .await;
        assert_eq!(answer.status, 403, "{}", answer.message());
        assert!(
            answer
                .message()
                .contains("alice is an operator with a token of their own"),
            "{}",
            answer.message()
        );
        let answer = resolve_held(&server, SHARED, by).await;
        assert_eq!(answer.status, 403, "{}", answer.message());
    }
    assert_eq!(decided(&server, SHARED, id).await, Value::Null);
    // Alice's own token, or a name of the bearer's own, is taken.
    let decision = json!({"success": true, "by": "alice"});
    let answer = server
        .admin("POST", &path, Some(ALICE), Some(&decision.to_string()))
        .await;
    assert_eq!((answer.status, answer.message()), (200, "recorded".into()));
    assert_eq!(decided(&server, SHARED, id).await["decided_by"], "alice");
    let answer = resolve_held(&server, SHARED, "carol").await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    assert_eq!(answer.json()["resolvedBy"], "carol");
}

/// Resolves the held result of `n-held` (status 4) with `token`, giving `by`.
async fn resolve_held(server: &TestServer, token: &str, by: &str) -> RawResponse {
    let resolve = json!({"nonce": "n-held", "status": 4, "note": "refunded", "by": by});
    server
        .admin(
            "POST",
            "/payhook/admin/callbacks/held/resolve",
            Some(token),
            Some(&resolve.to_string()),
        )
        .await
}

#[tokio::test]
async fn a_held_result_an_operator_resolves_is_kept_with_their_name() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway, None)).await;
    let held = with(CALLBACK, "/clientId", Some(json!("hold")));
    let held = with(&held, "/nonce", Some(json!("n-held")));
    assert_eq!(server.post_json(CALLBACK_PATH, &held).await.status, 200);

    let resolve =
        json!({"nonce": "n-held", "status": 4, "note": "refunded by hand", "by": "mallory"});
    let answer = server
        .admin(
            "POST",
            "/payhook/admin/callbacks/held/resolve",
            Some(BOB),
            Some(&resolve.to_string()),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    let resolved = answer.json();
    assert_eq!(resolved["resolvedBy"], "bob", "{resolved}");
    assert_eq!(
        server.resolution_of("n-held").await,
        ("refunded by hand".to_owned(), Some("bob".to_owned()))
    );
}

/// The inspector's login takes an operator's token; the session is theirs (the page names
/// them), and what it decides is kept with their name.
#[tokio::test]
async fn an_inspector_session_opened_with_an_operators_token_is_theirs() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway, Some(SHARED))).await;
    let session = server.inspector_session(ALICE).await;
    let html = server.inspector_page(&session).await;
    assert!(
        html.contains("<span id=operator data-name='alice'>alice</span>"),
        "the page names whose session it is"
    );

    let id = server.postpone_validation().await;
    let decide = server
        .as_the_page(
            &session,
            "POST",
            &format!("/payhook/admin/validations/{id}"),
            Some(r#"{"success": false, "description": "refused on review"}"#),
        )
        .await;
    assert_eq!(decide.status, 200, "{}", decide.message());
    assert_eq!(decided(&server, SHARED, id).await["decided_by"], "alice");

    // The shared token's session names nobody: the page asks who resolves.
    let session = server.inspector_session(SHARED).await;
    assert!(
        !server
            .inspector_page(&session)
            .await
            .contains("id=operator")
    );
}

#[tokio::test]
async fn an_operator_entry_holding_a_token_instead_of_its_hash_is_refused_at_start() {
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway, None);
    config
        .admin
        .operators
        .insert("carol".into(), "phop_carols-own-token-0123456789".into());
    let error = refused_at_start(config);
    assert!(error.contains("admin.operators.carol"), "{error}");
    assert!(error.contains("never the token"), "{error}");
    assert!(!error.contains("carols-own-token"), "{error}");
}

/// A sessions' secret shorter than 32 characters is refused at start, the value unquoted.
#[tokio::test]
async fn a_short_sessions_secret_is_refused_at_start() {
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway, None);
    config.admin.session_secret = Some("short-secret-hunter2".into());
    let error = refused_at_start(config);
    assert!(error.contains("admin.session_secret"), "{error}");
    assert!(error.contains("at least 32 characters"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
}

/// A shared token that is an operator's would make every bearer of it that operator: the
/// service refuses to start, naming the operator, not the token.
#[tokio::test]
async fn a_shared_token_that_is_an_operators_token_is_refused_at_start() {
    let gateway = FakeGateway::start().await;
    let error = refused_at_start(config(&gateway, Some(BOB)));
    assert!(error.contains("admin.token"), "{error}");
    assert!(error.contains("operator bob"), "{error}");
    assert!(!error.contains(BOB), "{error}");
}

/// A sessions' secret that is the shared token, or an operator's token, would let its
/// bearers sign an inspector session in any operator's name: refused at start, naming whose
/// it is, not quoting it.
#[tokio::test]
async fn a_session_secret_that_is_a_token_is_refused_at_start() {
    let gateway = FakeGateway::start().await;
    let shared = "admin-token-0123456789-long-enough-for-a-secret";
    for (secret, whose) in [
        (shared, "is admin.token"),
        (ALICE, "is the token of operator alice"),
    ] {
        let mut config = config(&gateway, Some(shared));
        config.admin.session_secret = Some(secret.into());
        let error = refused_at_start(config);
        assert!(error.contains("admin.session_secret"), "{error}");
        assert!(error.contains(whose), "{error}");
        assert!(!error.contains(secret), "{error}");
    }
    // Without operators, the shared token is what the sessions' key comes from anyway.
    let mut config = config(&gateway, Some(shared));
    config.admin.operators.clear();
    config.admin.session_secret = Some(shared.into());
    let data = tempfile::tempdir().unwrap();
    config.store.path = data.path().join("store");
    payhook::App::builder(config)
        .transaction_validator(TestMerchant::default())
        .build()
        .unwrap();
}

/// `payhook check-config` refuses what the service would refuse at start: a session secret
/// that is a token, or a shared token that is an operator's. Neither is quoted.
#[test]
fn check_config_refuses_tokens_the_service_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    let check_config = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
            .arg("check-config")
            .arg(&file)
            .env_clear()
            .output()
            .unwrap()
    };
    let alice = OperatorToken::digest_of(ALICE);
    for (admin, key) in [
        (
            format!("token = \"{SHARED}\"\nsession_secret = \"{ALICE}\""),
            "admin.session_secret",
        ),
        (format!("token = \"{ALICE}\""), "admin.token"),
    ] {
        let text = format!("[admin]\n{admin}\n[admin.operators]\nalice = \"{alice}\"\n");
        std::fs::write(&file, text).unwrap();
        let output = check_config();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{key}: {stderr}");
        assert!(stderr.contains(key), "{stderr}");
        assert!(stderr.contains("operator alice"), "{stderr}");
        assert!(
            !stderr.contains(ALICE) && !stderr.contains(SHARED),
            "{stderr}"
        );
    }
    // An operator's shell holds their own token as PAYHOOK_ADMIN_TOKEN, as `payhook
    // operator-token` tells them: the service's file is still checked, with a warning.
    let text = format!("[admin]\n[admin.operators]\nalice = \"{alice}\"\n");
    std::fs::write(&file, text).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
        .arg("check-config")
        .arg(&file)
        .env_clear()
        .env("PAYHOOK_ADMIN_TOKEN", ALICE)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("PAYHOOK_ADMIN_TOKEN is set here"),
        "{stderr}"
    );
    assert!(!stderr.contains(ALICE), "{stderr}");
    // Apart, the same settings are accepted.
    let text = format!("[admin]\ntoken = \"{SHARED}\"\n[admin.operators]\nalice = \"{alice}\"\n");
    std::fs::write(&file, text).unwrap();
    let output = check_config();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `payhook operator-token NAME` prints a token and the entry that lets it in: a service
/// configured with the entry takes the token as that operator's.
#[tokio::test]
async fn the_command_line_makes_a_token_and_the_entry_that_lets_it_in() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(["operator-token", "Ana María"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let [token, entry] = lines[..] else {
        panic!("a token and an entry: {text}");
    };
    assert!(token.starts_with("phop_"), "{text}");
    let parsed: toml::Table = entry.parse().unwrap();
    let digest = parsed["Ana María"].as_str().unwrap();
    assert_eq!(digest, OperatorToken::digest_of(token));
    assert!(!entry.contains(token), "{text}");

    let gateway = FakeGateway::start().await;
    let mut config = test_config();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    config.validation.allow_unauthenticated = true;
    config.admin.operators = [("Ana María".to_owned(), digest.to_owned())].into();
    let server = TestServer::start_with(config).await;
    let id = server.postpone_validation().await;
    let answer = server
        .admin(
            "POST",
            &format!("/payhook/admin/validations/{id}"),
            Some(token),
            Some(r#"{"success": true}"#),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    assert_eq!(decided(&server, token, id).await["decided_by"], "Ana María");

    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(["operator-token", " padded"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("1 to 64 characters"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// A viewer (`admin.viewers`) is an operator who may look, not change: the listings answer,
/// every change is refused 403 and nothing is recorded, and the inspector's page names
/// them as such, without its buttons that act. A session follows the configuration: the
/// same cookie may change things once the viewer is no longer one.
/// A token a person chose (not of the shape `payhook operator-token` makes) still lets its
/// operator in, and is said once at warning level: it can be found again from its unsalted
/// hash by whoever reads the configuration. A token the command made is not.
#[tokio::test]
async fn an_operator_token_chosen_by_hand_is_warned_of_once() {
    let logs = captured_logs(tracing::Level::INFO);
    const DAVE: &str = "dave chose this token himself in 2026";
    let erin = OperatorToken::generate().unwrap();
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway, None);
    config.admin.operators = [
        ("dave".to_owned(), OperatorToken::digest_of(DAVE)),
        ("erin".to_owned(), erin.digest()),
    ]
    .into();
    let server = TestServer::start_with(config).await;
    for token in [DAVE, DAVE, erin.token().expose()] {
        let answer = server
            .admin("GET", "/payhook/admin/validations", Some(token), None)
            .await;
        assert_eq!(answer.status, 200, "{}", answer.message());
    }
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let warned = |name: &str| {
        text.lines()
            .filter(|l| {
                l.contains("WARN")
                    && l.contains("was not made by `payhook operator-token`")
                    && l.contains(&format!("operator={name}"))
            })
            .count()
    };
    assert_eq!((warned("dave"), warned("erin")), (1, 0), "{text}");
}

#[tokio::test]
async fn a_viewer_may_look_and_not_change() {
    let logs = captured_logs(tracing::Level::INFO);
    let gateway = FakeGateway::start().await;
    let mut viewing = config(&gateway, None);
    viewing.admin.viewers = vec!["bob".into()];
    viewing.admin.session_secret = Some("sessions-secret-0123456789abcdef-xyz".into());
    let server = TestServer::start_with(viewing.clone()).await;
    let id = server.postpone_validation().await;
    let held = with(CALLBACK, "/clientId", Some(json!("hold")));
    assert_eq!(server.post_json(CALLBACK_PATH, &held).await.status, 200);

    for path in [
        "/payhook/admin/validations",
        "/payhook/admin/callbacks/held",
    ] {
        let answer = server.admin("GET", path, Some(BOB), None).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.message());
    }
    let changes = [
        (
            format!("/payhook/admin/validations/{id}"),
            json!({"success": true}),
        ),
        (
            "/payhook/admin/callbacks/held/resolve".to_owned(),
            json!({"nonce": "nonce-cb-1", "status": 4, "note": "refunded"}),
        ),
        (format!("/payhook/admin/outbox/{id}/retry"), json!({})),
        (
            "/payhook/admin/reconcile".to_owned(),
            json!({"referenceIds": ["0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e"]}),
        ),
    ];
    for (path, body) in &changes {
        let answer = server
            .admin("POST", path, Some(BOB), Some(&body.to_string()))
            .await;
        assert_eq!(
            (answer.status, answer.message()),
            (403, "bob may look, not change (admin.viewers)".into()),
            "{path}"
        );
    }
    assert_eq!(
        decided(&server, ALICE, id).await,
        Value::Null,
        "nothing decided"
    );
    let listed = server
        .admin("GET", "/payhook/admin/callbacks/held", Some(ALICE), None)
        .await;
    assert_eq!(listed.json().as_array().unwrap().len(), 1, "still held");

    // The inspector: named a viewer, no button that acts; a change through the session is
    // refused as well.
    let session = server.inspector_session(BOB).await;
    let html = server.inspector_page(&session).await;
    assert!(html.contains("<body class=viewer>"), "{html}");
    assert!(
        html.contains(">bob (may look, not change)</span>"),
        "{html}"
    );
    let approval = |id: i64| {
        (
            format!("/payhook/admin/validations/{id}"),
            r#"{"success": true}"#,
        )
    };
    let (path, body) = approval(id);
    let refused = server
        .as_the_page(&session, "POST", &path, Some(body))
        .await;
    assert_eq!(refused.status, 403, "{}", refused.message());
    assert_eq!(
        decided(&server, ALICE, id).await,
        Value::Null,
        "nothing decided"
    );
    // Each refusal is logged as such, never as a change asked.
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let by_bob = |l: &&str| l.contains("with the token of viewer bob");
    let refusals = text
        .lines()
        .filter(by_bob)
        .filter(|l| l.contains("a change asked by a viewer was refused"))
        .count();
    assert_eq!(refusals, changes.len() + 1, "{text}");
    assert!(
        !text
            .lines()
            .filter(by_bob)
            .any(|l| l.contains("a change was asked")),
        "{text}"
    );

    // bob is no viewer any more (a service of the same sessions' secret, configured so):
    // the same session may now decide, as bob.
    viewing.admin.viewers.clear();
    let server = TestServer::start_with(viewing).await;
    let id = server.postpone_validation().await;
    let (path, body) = approval(id);
    let decided_now = server
        .as_the_page(&session, "POST", &path, Some(body))
        .await;
    assert_eq!(decided_now.status, 200, "{}", decided_now.message());
    assert_eq!(decided(&server, ALICE, id).await["decided_by"], "bob");
}
