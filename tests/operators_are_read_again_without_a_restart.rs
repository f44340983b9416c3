//! Who may call the operating API is read again while the service runs
//! (`Credentials::read_again`, and on SIGHUP in the example merchant): an operator
//! taken out is refused from their next call on, sessions included; one added is let in; a
//! replaced token ends the old one; a viewer named may change nothing more. What stays, stays
//! — other operators' sessions go on. A configuration the service would not start with
//! changes nothing, and settings beyond the credentials are named, not taken.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::server::{CredentialsChange, CredentialsRefused, OperatorToken};
use support::gateway::FakeGateway;
use support::*;

const SHARED: &str = "admin-token-0123456789";
const ALICE: &str = "phop_alice-token-for-tests-0123456789";
const ALICE_AGAIN: &str = "phop_alice-new-token-for-tests-0123456789";
const BOB: &str = "phop_bob-token-for-tests-0123456789";
const CAROL: &str = "phop_carol-token-for-tests-0123456789";
const LISTING: &str = "/payhook/admin/validations";

/// An Awaitable service whose operating API lets in `operators` by their own tokens, and
/// `shared` when given.
fn config(
    gateway: &FakeGateway,
    shared: Option<&str>,
    operators: &[(&str, &str)],
) -> payhook::Config {
    let mut config = test_config();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    with_operators(&mut config, shared, operators);
    config
}

fn with_operators(config: &mut payhook::Config, shared: Option<&str>, operators: &[(&str, &str)]) {
    config.admin.token = shared.map(Into::into);
    config.admin.operators = operators
        .iter()
        .map(|(name, token)| ((*name).to_owned(), OperatorToken::digest_of(token)))
        .collect();
}

/// The status of a listing asked with `token` as a bearer.
async fn listing_with_token(server: &TestServer, token: &str) -> u16 {
    server.admin("GET", LISTING, Some(token), None).await.status
}

/// The status of a listing asked by the inspector holding `session`.
async fn listing_in_session(server: &TestServer, session: &str) -> u16 {
    server
        .as_the_page(session, "GET", LISTING, None)
        .await
        .status
}

/// The answer to an approval of validation `id` from the inspector holding `session`.
async fn decision_in_session(server: &TestServer, session: &str, id: i64) -> RawResponse {
    let path = format!("/payhook/admin/validations/{id}");
    server
        .as_the_page(session, "POST", &path, Some(r#"{"success": true}"#))
        .await
}

#[tokio::test]
async fn an_operator_taken_out_is_refused_and_one_added_let_in_from_the_next_call() {
    let logs = captured_logs(tracing::Level::INFO);
    let gateway = FakeGateway::start().await;
    let started = config(&gateway, None, &[("alice", ALICE), ("bob", BOB)]);
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let alice_session = server.inspector_session(ALICE).await;
    let bob_session = server.inspector_session(BOB).await;
    assert_eq!(listing_with_token(&server, CAROL).await, 401);

    let mut next = server.as_run(&started);
    with_operators(&mut next, None, &[("bob", BOB), ("carol", CAROL)]);
    next.admin.viewers = vec!["bob".into()];
    let change = credentials.read_again(&next).unwrap();
    let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    assert_eq!(change.added, names(&["carol"]));
    assert_eq!(change.removed, names(&["alice"]));
    assert_eq!(change.made_viewers, names(&["bob"]));
    assert!(change.new_token.is_empty() && change.need_a_restart.is_empty());
    assert_eq!(
        change.to_string(),
        "operators added: carol; taken out: alice; made viewers: bob"
    );

    // alice: her token and her session are refused.
    assert_eq!(listing_with_token(&server, ALICE).await, 401);
    assert_eq!(listing_in_session(&server, &alice_session).await, 401);
    let page = server
        .as_the_page(&alice_session, "GET", "/payhook/admin/inspector", None)
        .await;
    let page = String::from_utf8_lossy(&page.body);
    assert!(
        page.contains("name=token"),
        "alice is asked for a token again: {page}"
    );
    // carol: let in, the inspector too.
    assert_eq!(listing_with_token(&server, CAROL).await, 200);
    let carol_session = server.inspector_session(CAROL).await;
    assert_eq!(listing_in_session(&server, &carol_session).await, 200);
    // bob: still in, in the session he opened before, but a viewer from now on.
    assert_eq!(listing_in_session(&server, &bob_session).await, 200);
    let id = server.postpone_validation().await;
    let refused = decision_in_session(&server, &bob_session, id).await;
    assert_eq!(
        (refused.status, refused.message()),
        (403, "bob may look, not change (admin.viewers)".into())
    );
    let decided = decision_in_session(&server, &carol_session, id).await;
    assert_eq!(decided.status, 200, "{}", decided.message());

    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines().any(|l| l.contains("INFO")
            && l.contains("credentials: read again")
            && l.contains("operators added: carol; taken out: alice; made viewers: bob")),
        "{text}"
    );
    for token in [SHARED, ALICE, ALICE_AGAIN, BOB, CAROL] {
        assert!(!text.contains(token), "a token in the log: {text}");
    }
}

#[tokio::test]
async fn a_replaced_token_ends_the_old_one_and_its_sessions_and_no_other() {
    let gateway = FakeGateway::start().await;
    let started = config(&gateway, Some(SHARED), &[("alice", ALICE), ("bob", BOB)]);
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let alice_session = server.inspector_session(ALICE).await;
    let bob_session = server.inspector_session(BOB).await;
    let shared_session = server.inspector_session(SHARED).await;

    let mut next = server.as_run(&started);
    with_operators(
        &mut next,
        Some(SHARED),
        &[("alice", ALICE_AGAIN), ("bob", BOB)],
    );
    let change = credentials.read_again(&next).unwrap();
    assert_eq!(change.new_token, vec!["alice".to_owned()]);
    assert!(!change.shared_token && !change.session_secret && !change.network);
    assert_eq!(change.to_string(), "with a new token: alice");

    assert_eq!(listing_with_token(&server, ALICE).await, 401);
    assert_eq!(listing_in_session(&server, &alice_session).await, 401);
    assert_eq!(listing_with_token(&server, ALICE_AGAIN).await, 200);
    // The sessions of credentials that stay go on: they are signed under the same key.
    assert_eq!(listing_in_session(&server, &bob_session).await, 200);
    assert_eq!(listing_in_session(&server, &shared_session).await, 200);

    // The same again changes nothing.
    let same = credentials.read_again(&next).unwrap();
    assert!(same.is_empty(), "{same:?}");
    assert_eq!(same.to_string(), "no change");
    assert_eq!(listing_in_session(&server, &bob_session).await, 200);

    // A sessions' secret set: every session signed before ends, the tokens stay good.
    next.admin.session_secret = Some("sessions-secret-0123456789abcdef-xyz".into());
    let change = credentials.read_again(&next).unwrap();
    assert!(change.session_secret, "{change:?}");
    assert_eq!(listing_in_session(&server, &bob_session).await, 401);
    assert_eq!(listing_in_session(&server, &shared_session).await, 401);
    assert_eq!(listing_with_token(&server, BOB).await, 200);
    let bob_again = server.inspector_session(BOB).await;
    assert_eq!(listing_in_session(&server, &bob_again).await, 200);

    // The shared token taken out: its bearers are refused; the operators stay.
    next.admin.token = None;
    let change = credentials.read_again(&next).unwrap();
    assert!(change.shared_token, "{change:?}");
    assert_eq!(listing_with_token(&server, SHARED).await, 401);
    assert_eq!(listing_with_token(&server, BOB).await, 200);
}

/// The inspector's sessions of a lone shared token are signed under a key derived from it;
/// once operators have tokens of their own, under another (a bearer of the shared token
/// could otherwise sign an operator's session): the first operator read in ends the shared
/// token's sessions, and so does the last one taken out.
#[tokio::test]
async fn the_sessions_end_when_the_first_operator_comes_or_the_last_goes() {
    let gateway = FakeGateway::start().await;
    let started = config(&gateway, Some(SHARED), &[]);
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let before = server.inspector_session(SHARED).await;
    assert_eq!(listing_in_session(&server, &before).await, 200);

    let mut with_alice = server.as_run(&started);
    with_operators(&mut with_alice, Some(SHARED), &[("alice", ALICE)]);
    assert_eq!(
        credentials.read_again(&with_alice).unwrap().added,
        ["alice"]
    );
    assert_eq!(listing_in_session(&server, &before).await, 401);
    assert_eq!(listing_with_token(&server, SHARED).await, 200);
    let alices = server.inspector_session(ALICE).await;
    let shared = server.inspector_session(SHARED).await;
    assert_eq!(listing_in_session(&server, &shared).await, 200);

    let alone = server.as_run(&started);
    assert_eq!(credentials.read_again(&alone).unwrap().removed, ["alice"]);
    assert_eq!(listing_in_session(&server, &shared).await, 401);
    assert_eq!(listing_in_session(&server, &alices).await, 401);
    assert_eq!(listing_with_token(&server, SHARED).await, 200);
}

#[tokio::test]
async fn a_configuration_the_service_would_not_start_with_changes_nothing() {
    let gateway = FakeGateway::start().await;
    let started = config(&gateway, None, &[("alice", ALICE)]);
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();
    let alice_session = server.inspector_session(ALICE).await;

    let mut unknown_viewer = server.as_run(&started);
    with_operators(&mut unknown_viewer, None, &[("carol", CAROL)]);
    unknown_viewer.admin.viewers = vec!["dave".into()];
    let mut shared_is_carols = server.as_run(&started);
    with_operators(&mut shared_is_carols, Some(CAROL), &[("carol", CAROL)]);
    let mut holding_a_token = server.as_run(&started);
    holding_a_token
        .admin
        .operators
        .insert("carol".into(), CAROL.into());
    let mut turned_off = server.as_run(&started);
    with_operators(&mut turned_off, None, &[]);

    for (what, refused, says) in [
        (
            "a viewer who is no operator",
            unknown_viewer,
            "admin.viewers",
        ),
        (
            "a shared token that is an operator's",
            shared_is_carols,
            "admin.token",
        ),
        (
            "a token instead of its hash",
            holding_a_token,
            "admin.operators",
        ),
        ("no token at all", turned_off, "would be off"),
    ] {
        let error = credentials.read_again(&refused).unwrap_err();
        let text = payhook::Report::new(&error).to_string();
        assert!(text.contains(says), "{what}: {text}");
        assert!(!text.contains(CAROL), "{what}: the token is quoted: {text}");
        if what == "no token at all" {
            assert!(
                matches!(error, CredentialsRefused::WouldTurnOff),
                "{error:?}"
            );
        } else {
            assert!(
                matches!(error, CredentialsRefused::Config(_)),
                "{what}: {error:?}"
            );
        }
        // Nothing changed: alice is in, carol is not.
        assert_eq!(listing_with_token(&server, ALICE).await, 200, "{what}");
        assert_eq!(
            listing_in_session(&server, &alice_session).await,
            200,
            "{what}"
        );
        assert_eq!(listing_with_token(&server, CAROL).await, 401, "{what}");
    }
}

#[tokio::test]
async fn settings_beyond_the_credentials_are_named_and_not_taken() {
    let logs = captured_logs(tracing::Level::INFO);
    let gateway = FakeGateway::start().await;
    let started = config(&gateway, None, &[("alice", ALICE)]);
    let server = TestServer::start_with(started.clone()).await;
    let credentials = server.app.credentials();

    let mut next = server.as_run(&started);
    next.server.body_limit = started.server.body_limit / 2;
    next.admin.inspector_recent = started.admin.inspector_recent + 1;
    next.admin
        .operators
        .insert("bob".into(), OperatorToken::digest_of(BOB));
    let change = credentials.read_again(&next).unwrap();
    assert_eq!(change.added, vec!["bob".to_owned()]);
    assert_eq!(
        change.need_a_restart,
        vec!["server", "admin.inspector_recent"]
    );
    // Still so the next time: the service still runs with what it started with.
    let again = credentials.read_again(&next).unwrap();
    let mut expected = CredentialsChange::default();
    expected.need_a_restart = vec!["server", "admin.inspector_recent"];
    assert_eq!(again, expected);
    assert_eq!(listing_with_token(&server, BOB).await, 200);

    // A body over the new limit, under the one the service started with, is still taken.
    let body = " ".repeat(started.server.body_limit * 3 / 4);
    let answer = server
        .send(&post(
            "/payhook/callback",
            &[("content-type", "application/json")],
            body.as_bytes(),
        ))
        .await;
    assert_ne!(answer.status, 413, "{}", answer.message());

    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("not taken until it restarts")
            && l.contains("server, admin.inspector_recent")),
        "{text}"
    );
}

/// On SIGHUP the loader is asked again: a loader that panics and a configuration it cannot
/// read change nothing (the service goes on with what it had, still listening for SIGHUP),
/// and the next one that reads is taken.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_cannot_be_read_on_sighup_changes_nothing() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let gateway = FakeGateway::start().await;
    let started = config(&gateway, None, &[("alice", ALICE)]);
    let server = TestServer::start_with(started.clone()).await;
    let mut next = server.as_run(&started);
    with_operators(&mut next, None, &[("alice", ALICE), ("carol", CAROL)]);
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let loader = {
        let asked = std::sync::Arc::clone(&asked);
        move || match asked.fetch_add(1, Ordering::SeqCst) {
            0 => panic!("a loader's bug"),
            1 => payhook::Config::from_toml("[admin\nnot toml"),
            _ => Ok(next.clone()),
        }
    };
    tokio::spawn(server.app.credentials().read_again_on_hangup(loader));
    let asked_once = |n: usize| {
        let asked = std::sync::Arc::clone(&asked);
        async move {
            let deadline = tokio::time::Instant::now() + DEADLINE;
            while asked.load(Ordering::SeqCst) < n {
                assert!(tokio::time::Instant::now() < deadline, "not read again");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    for asked in [1, 2] {
        signal(std::process::id(), "HUP");
        asked_once(asked).await;
        assert_eq!(listing_with_token(&server, ALICE).await, 200);
        assert_eq!(listing_with_token(&server, CAROL).await, 401);
    }
    signal(std::process::id(), "HUP");
    asked_once(3).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while listing_with_token(&server, CAROL).await != 200 {
        assert!(tokio::time::Instant::now() < deadline, "carol not let in");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The example merchant reads its configuration's file again on SIGHUP: bob, added to the
/// file, is let in and alice, taken out of it, is refused — without a restart.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_merchant_reads_its_operators_again_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payhook.toml");
    let write = |operators: &[(&str, &str)]| {
        let entries: String = operators
            .iter()
            .map(|(name, token)| format!("{name} = \"{}\"\n", OperatorToken::digest_of(token)))
            .collect();
        std::fs::write(&file, format!("[admin.operators]\n{entries}")).unwrap();
    };
    write(&[("alice", ALICE)]);
    let mut env = ed25519_example_env();
    env.extend([
        ("PAYHOOK_CONFIG", file.display().to_string()),
        ("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".to_owned()),
        (
            "PAYHOOK_STORE_PATH",
            dir.path().join("store").display().to_string(),
        ),
    ]);
    let (child, address) = spawn_example(&env);
    let status = |token: &'static str| async move {
        let bearer = format!("Bearer {token}");
        exchange(
            address,
            &request(
                "GET",
                "/payhook/admin/callbacks/held",
                &[("authorization", &bearer)],
                None,
            ),
        )
        .await
        .status
    };
    assert_eq!((status(ALICE).await, status(BOB).await), (200, 401));

    write(&[("bob", BOB)]);
    signal(child.0.id(), "HUP");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while status(BOB).await != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "bob not let in within {DEADLINE:?} of SIGHUP"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status(ALICE).await, 401);

    // Again: each SIGHUP reads the file (and none ends the process).
    write(&[("bob", BOB), ("carol", CAROL)]);
    signal(child.0.id(), "HUP");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while status(CAROL).await != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "carol not let in within {DEADLINE:?} of SIGHUP"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!((status(BOB).await, status(ALICE).await), (200, 401));
}
