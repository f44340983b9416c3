//! The inspector over HTTP (`/payhook/admin/…`): each request to an endpoint is recorded
//! with what was answered and why, a follower is answered as soon as the next one arrives,
//! the page lets in only a holder of the token (and its session only from its own page),
//! and a queued result can be retried now. The page in a real browser is
//! `inspector_page_works_in_a_real_browser.rs`.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::inspector::{DeliveryDetail, DeliveryList};
use payhook::signature::Algorithm;
use std::time::Duration;
use support::gateway::FakeGateway;
use support::*;

const TOKEN: &str = "admin-token-0123456789";

fn config(gateway: &FakeGateway) -> payhook::Config {
    let mut config = signed_config(&["rsa2048"]);
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.admin.token = Some(TOKEN.into());
    config
}

async fn admin(server: &TestServer, method: &str, path: &str, body: Option<&str>) -> RawResponse {
    let bearer = format!("Bearer {TOKEN}");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", bearer.as_str()),
    ];
    server
        .send(&request(method, path, &headers, body.map(str::as_bytes)))
        .await
}

async fn deliveries(server: &TestServer, query: &str) -> DeliveryList {
    let answer = admin(
        server,
        "GET",
        &format!("/payhook/admin/deliveries?{query}"),
        None,
    )
    .await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    serde_json::from_slice(&answer.body).unwrap()
}

/// Delivery `seq` with its request, whose answer must not hold `secret` anywhere.
async fn detail_without(server: &TestServer, seq: u64, secret: &str) -> DeliveryDetail {
    let path = format!("/payhook/admin/deliveries/{seq}");
    let answer = admin(server, "GET", &path, None).await;
    assert_eq!(answer.status, 200, "{}", answer.message());
    let text = String::from_utf8_lossy(&answer.body);
    assert!(!text.contains(secret), "a secret was kept: {text}");
    serde_json::from_slice(&answer.body).unwrap()
}

#[tokio::test]
async fn each_delivery_is_recorded_with_its_answer_its_signature_and_its_attempt() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);

    let first = signed_callback(&signer, "n-booked", 4, "10.50", "client-42");
    assert_eq!(server.send(&first).await.status, 200);
    assert_eq!(server.send(&first).await.status, 200);
    let failing = signed_callback(&signer, "n-failing", 4, "3", "fail");
    assert_eq!(server.send(&failing).await.status, 503);
    // A forged signature (bytes put before a genuine one, not zeros: another integer), with
    // a credential header that must never be shown.
    let forged = String::from_utf8(signed_callback(&signer, "n-forged", 4, "1", "client-42"))
        .unwrap()
        .replace(
            "X-Signature: ",
            "Authorization: Bearer leaked-secret-77\r\nX-Signature: QUFB",
        );
    assert_eq!(server.send(forged.as_bytes()).await.status, 401);

    let list = deliveries(&server, "").await;
    assert_eq!(list.last, 4);
    let seen: Vec<_> = list
        .deliveries
        .iter()
        .map(|d| {
            (
                d.nonce.as_deref().unwrap_or("-"),
                d.outcome.as_str(),
                d.status,
                d.attempt,
                d.duplicate,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("n-booked", "booked", 200, 1, false),
            ("n-booked", "duplicate", 200, 2, true),
            ("n-failing", "failed", 503, 1, false),
            // Refused before the body was read as JSON: no nonce is known.
            ("-", "refused", 401, 1, false),
        ]
    );
    let [booked, duplicate, failed, refused] = &list.deliveries[..] else {
        panic!("four deliveries")
    };
    assert_eq!(booked.signature, "verified (key rsa2048)");
    assert_eq!(duplicate.signature, "verified before (a retry)");
    assert!(
        refused.signature.starts_with("refused: "),
        "{}",
        refused.signature
    );
    assert_eq!(booked.endpoint, "callback");
    assert_eq!(booked.client.as_deref(), Some("client-42"));
    assert_eq!(booked.transaction_status, Some(4));
    assert_eq!(booked.message.as_deref(), Some("callback accepted"));
    assert_eq!(
        duplicate.message.as_deref(),
        Some("callback already processed")
    );
    assert!(failed.message.is_some());
    assert_eq!(booked.trace_id.len(), 32);

    let only_failed = deliveries(&server, "outcome=failed").await;
    assert_eq!(only_failed.deliveries.len(), 1);
    assert_eq!(
        only_failed.deliveries[0].nonce.as_deref(),
        Some("n-failing")
    );
    assert_eq!(
        deliveries(&server, "nonce=booked").await.deliveries.len(),
        2
    );
    assert_eq!(deliveries(&server, "after=3").await.deliveries.len(), 1);

    let detail = detail_without(&server, refused.seq, "leaked-secret-77").await;
    assert!(
        detail
            .headers
            .contains(&("authorization".into(), "[redacted]".into()))
    );
    assert!(detail.body.contains("\"n-forged\""));
    assert!(detail.answer.contains("message"));

    let gone = admin(&server, "GET", "/payhook/admin/deliveries/999", None).await;
    assert_eq!(
        (gone.status, gone.message()),
        (404, "no recent delivery #999".into())
    );
    let not_a_number = admin(&server, "GET", "/payhook/admin/deliveries/abc", None).await;
    assert_eq!(
        (not_a_number.status, not_a_number.message()),
        (400, "`abc` is not a delivery's number".into())
    );
    let not_a_window = admin(
        &server,
        "GET",
        "/payhook/admin/deliveries?oldest=maybe",
        None,
    )
    .await;
    assert_eq!(
        (not_a_window.status, not_a_window.message()),
        (400, "`oldest` must be true or false".into())
    );
    // Any `after` is a number of the future: nothing yet, and the last number given.
    let beyond = deliveries(&server, &format!("after={}", u64::MAX)).await;
    assert_eq!(
        (beyond.last, beyond.deliveries.len(), beyond.missed),
        (4, 0, None)
    );
    for query in ["after=x", "limit=-1", "wait=soon"] {
        let bad = admin(
            &server,
            "GET",
            &format!("/payhook/admin/deliveries?{query}"),
            None,
        )
        .await;
        assert_eq!(bad.status, 400, "{query}");
        assert!(bad.message().contains("must be a whole number"), "{query}");
    }
    // The page's panels answer a bearer of the token too (a script, curl).
    let panel = admin(&server, "GET", "/payhook/admin/inspector/health", None).await;
    assert_eq!(panel.status, 200);
    assert_eq!(
        panel.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let nowhere = admin(&server, "GET", "/payhook/admin/inspector/nothing", None).await;
    assert_eq!(nowhere.status, 404);
    let changed = admin(
        &server,
        "POST",
        "/payhook/admin/inspector/health",
        Some("{}"),
    )
    .await;
    assert_eq!(changed.status, 405);
    // Operating the service is not recorded as a delivery.
    assert_eq!(deliveries(&server, "").await.last, 4);
}

/// Anyone who reaches the callback endpoint can send forged callbacks; a flood of them
/// takes a fifth of the inspector's list, and every delivery the aggregator signed stays in
/// it, so that "did the callback arrive?" is still answered during one.
#[tokio::test]
async fn forged_callbacks_take_a_fifth_of_the_list_and_leave_the_signed_ones_in_it() {
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway);
    config.admin.inspector_recent = 10;
    let server = TestServer::start_with(config).await;
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    for nonce in ["n-1", "n-2", "n-3"] {
        let genuine = signed_callback(&signer, nonce, 4, "10.50", "client-42");
        assert_eq!(server.send(&genuine).await.status, 200);
    }
    for i in 0..30 {
        let forged = String::from_utf8(signed_callback(
            &signer,
            &format!("f-{i}"),
            4,
            "1",
            "client-42",
        ))
        .unwrap()
        .replace("X-Signature: ", "X-Signature: QUFB");
        assert_eq!(server.send(forged.as_bytes()).await.status, 401);
    }
    let list = deliveries(&server, "").await;
    let seen: Vec<_> = list
        .deliveries
        .iter()
        .map(|d| (d.seq, d.nonce.as_deref().unwrap_or("-"), d.status))
        .collect();
    assert_eq!(
        seen,
        [
            (1, "n-1", 200),
            (2, "n-2", 200),
            (3, "n-3", 200),
            (32, "-", 401),
            (33, "-", 401)
        ]
    );
}

#[tokio::test]
async fn a_follower_is_answered_as_soon_as_the_next_delivery_is_recorded() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let addr = server.addr;
    let bearer = format!("Bearer {TOKEN}");
    let follow = tokio::spawn(async move {
        let request = request(
            "GET",
            "/payhook/admin/deliveries?after=0&wait=30",
            &[("authorization", bearer.as_str())],
            None,
        );
        exchange(addr, &request).await
    });
    // The follower waits: nothing was delivered yet.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!follow.is_finished());
    let callback = signed_callback(&signer, "n-followed", 4, "2", "client-42");
    assert_eq!(server.send(&callback).await.status, 200);
    let answer = tokio::time::timeout(Duration::from_secs(20), follow)
        .await
        .expect("answered well before its 30 s wait ran out")
        .unwrap();
    let list: DeliveryList = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(list.deliveries.len(), 1);
    assert_eq!(list.deliveries[0].nonce.as_deref(), Some("n-followed"));
}

#[tokio::test]
async fn the_page_needs_the_token_and_its_session_acts_only_as_the_page() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let page = |headers: &[(&str, &str)], query: &str| {
        request(
            "GET",
            &format!("/payhook/admin/inspector{query}"),
            headers,
            None,
        )
    };

    let asked = server.send(&page(&[], "")).await;
    assert_eq!(asked.status, 401);
    assert_eq!(
        asked.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(String::from_utf8_lossy(&asked.body).contains("name=token"));
    let wrong_form = server
        .send(&post(
            "/payhook/admin/inspector/login",
            &[("content-type", "application/x-www-form-urlencoded")],
            b"token=not-the-token-000000",
        ))
        .await;
    assert_eq!(wrong_form.status, 401);
    assert!(wrong_form.header("set-cookie").is_none());
    let again = String::from_utf8_lossy(&wrong_form.body);
    assert!(again.contains("invalid token"), "{again}");
    // Answered at …/inspector/login, the form posts to the login's own address again.
    assert!(
        again.contains("action=/payhook/admin/inspector/login "),
        "{again}"
    );
    // So does the form shown at …/inspector/ (a relative action would post to
    // …/inspector/inspector/login, and the token typed would be lost).
    let slashed = server.send(&page(&[], "/")).await;
    assert_eq!(slashed.status, 401);
    assert!(
        String::from_utf8_lossy(&slashed.body).contains("action=/payhook/admin/inspector/login "),
        "{}",
        String::from_utf8_lossy(&slashed.body)
    );

    let login = server
        .send(&post(
            "/payhook/admin/inspector/login",
            &[("content-type", "application/x-www-form-urlencoded")],
            format!("token={TOKEN}").as_bytes(),
        ))
        .await;
    assert_eq!(login.status, 303);
    assert_eq!(login.header("location"), Some("/payhook/admin/inspector"));
    let cookie = login.header("set-cookie").unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(TOKEN),
        "the cookie must not be the token: {cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();

    let shown = server.send(&page(&[("cookie", &session)], "")).await;
    assert_eq!(shown.status, 200);
    let html = String::from_utf8_lossy(&shown.body);
    for panel in [
        "Deliveries",
        "Failing callbacks",
        "Postponed validations",
        "Outbox",
    ] {
        assert!(html.contains(panel), "{panel} in the page");
    }
    // Only the page's own scripts and style run (by their hashes): markup that got past the
    // escaping would run no script. Nothing of it is cached, sniffed or sent as a Referer.
    let policy = shown.header("content-security-policy").unwrap().to_owned();
    assert!(
        !policy.contains("unsafe-inline")
            && policy.matches("'sha256-").count() == 3
            && policy.contains("base-uri 'none'")
            && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    let listed = server
        .send(&request(
            "GET",
            "/payhook/admin/deliveries",
            &[("cookie", &session)],
            None,
        ))
        .await;
    assert_eq!(listed.status, 200);
    for answer in [&shown, &listed] {
        assert_eq!(answer.header("cache-control"), Some("no-store"));
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(answer.header("referrer-policy"), Some("no-referrer"));
    }
    assert!(cookie.contains("Max-Age=43200"), "{cookie}");
    // A session is the signature of its generation (0 until more sessions were ended than
    // are kept), its login time, a random id and whose it is (the shared token, by its
    // SHA-256), under a key PBKDF2 derives from the token: another time, id or holder is
    // no session, and one signed longer ago than its life is over.
    let mut derived = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        std::num::NonZeroU32::new(100_000).unwrap(),
        b"payhook inspector session key",
        TOKEN.as_bytes(),
        &mut derived,
    );
    let signed = |issued: u64| {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &derived);
        let id = "00112233445566778899aabbccddeeff";
        let holder = ring::digest::digest(&ring::digest::SHA256, TOKEN.as_bytes());
        let holder: String = holder.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        let tag = ring::hmac::sign(
            &key,
            format!("payhook inspector session 0 {issued} {id} shared {holder}").as_bytes(),
        );
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("payhook_admin={issued}.{id}..{hex}")
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(
        server
            .send(&page(&[("cookie", &signed(now - 60))], ""))
            .await
            .status,
        200,
        "the test signs sessions as the server does"
    );
    let value = session.strip_prefix("payhook_admin=").unwrap();
    let [issued, id, who, tag] = value.split('.').collect::<Vec<_>>()[..] else {
        panic!("a session is its time, its id, whose it is and their tag: {value}");
    };
    assert_eq!(id.len(), 32, "{value}");
    assert_eq!(
        who, "",
        "the shared token's session names no operator: {value}"
    );
    let other_time = format!(
        "payhook_admin={}.{id}.{who}.{tag}",
        issued.parse::<u64>().unwrap() - 1
    );
    let other_id = format!("payhook_admin={issued}.{}.{who}.{tag}", "0".repeat(32));
    // An operator's name put into the shared token's session: no such operator here, and
    // its tag would not hold for one.
    let other_holder = format!("payhook_admin={issued}.{id}.YWxpY2U.{tag}");
    for refused in [
        "payhook_admin=00112233".to_owned(),
        format!("payhook_admin={issued}.{id}.{who}.not-hex"),
        format!("payhook_admin={issued}.{id}.{tag}"),
        format!("payhook_admin={issued}.{tag}"),
        format!("payhook_admin={value}.00"),
        other_time,
        other_id,
        other_holder,
        signed(now - 13 * 3600),
        signed(now + 3600),
    ] {
        let answer = server.send(&page(&[("cookie", &refused)], "")).await;
        assert_eq!(answer.status, 401, "{refused}");
    }

    // A postponed validation, decided with the session: only with the page's header.
    let id = server.postpone_validation().await;
    let panel = server
        .send(&request(
            "GET",
            "/payhook/admin/inspector/postponed",
            &[("cookie", &session)],
            None,
        ))
        .await;
    assert!(String::from_utf8_lossy(&panel.body).contains("Approve"));
    let decision = r#"{"success": true, "description": "looked at it"}"#;
    let path = &format!("/payhook/admin/validations/{id}");
    let cross_site = server
        .send(&post(
            path,
            &[("cookie", &session), ("content-type", "application/json")],
            decision.as_bytes(),
        ))
        .await;
    assert_eq!(cross_site.status, 403);
    assert!(
        cross_site.message().contains("x-payhook-inspector"),
        "{}",
        cross_site.message()
    );
    let from_page = server
        .as_the_page(&session, "POST", path, Some(decision))
        .await;
    assert_eq!(
        (from_page.status, from_page.message()),
        (200, "recorded".into())
    );
}

/// Postpones a validation and approves it through the operating API; its id.
async fn approved(server: &TestServer) -> i64 {
    let id = server.postpone_validation().await;
    let decided = admin(
        server,
        "POST",
        &format!("/payhook/admin/validations/{id}"),
        Some(r#"{"success": true, "description": "ok"}"#),
    )
    .await;
    assert_eq!(decided.status, 200);
    id
}

/// The validations in `state` once `ready` holds for the list (polled).
async fn listed_once(
    server: &TestServer,
    state: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let path = format!("/payhook/admin/validations?state={state}");
    loop {
        let list = admin(server, "GET", &path, None).await.json();
        if ready(&list) {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks for the result of validation `id` to be sent now: the answer.
async fn retry(server: &TestServer, id: &str) -> RawResponse {
    let path = format!("/payhook/admin/outbox/{id}/retry");
    admin(server, "POST", &path, None).await
}

#[tokio::test]
async fn retry_now_makes_a_queued_result_due_at_once() {
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway);
    // After a failed attempt the next one would wait an hour.
    config.validation.retry_schedule = vec![Duration::from_secs(3600)];
    let server = TestServer::start_with(config).await;
    gateway.with(|state| state.fail_next.push_back(500));
    let id = approved(&server).await;
    gateway
        .until("the first attempt failed", |s| s.attempted.len() == 1)
        .await;
    // The failure is recorded: the result waits for its next attempt, an hour away.
    let queued = listed_once(&server, "queued", |list| {
        list[0]["result"]["delivery"]["attempts"] == 1
    })
    .await;
    assert_eq!(queued.as_array().unwrap().len(), 1);

    let retried = retry(&server, &id.to_string()).await;
    assert_eq!((retried.status, retried.message()), (200, "due now".into()));
    gateway
        .until("the result delivered", |s| s.results.contains_key(&id))
        .await;

    let again = retry(&server, &id.to_string()).await;
    assert_eq!(again.status, 409, "delivered: nothing to retry");
    let not_an_id = retry(&server, "x").await;
    assert_eq!(
        (not_an_id.status, not_an_id.message()),
        (400, "`x` is not a validation id".into())
    );
    let unknown = admin(&server, "POST", "/payhook/admin/outbox/5/retry", None).await;
    assert_eq!(
        (unknown.status, unknown.message()),
        (404, "no postponed validation with id 5".into())
    );
    let method = admin(
        &server,
        "GET",
        &format!("/payhook/admin/outbox/{id}/retry"),
        None,
    )
    .await;
    assert_eq!(method.status, 405);
    assert_eq!(method.header("allow"), Some("POST"));
    // Reconcile is a POST only: the answer says so, not "GET, POST".
    let method = admin(&server, "GET", "/payhook/admin/reconcile", None).await;
    assert_eq!((method.status, method.header("allow")), (405, Some("POST")));
}

/// Runs the real `payhook` binary off the runtime (the server must keep answering).
async fn payhook(args: &[&str]) -> std::process::Output {
    payhook_with_token(args, TOKEN).await
}

async fn payhook_with_token(args: &[&str], token: &'static str) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_payhook"))
            .args(args)
            .env_clear()
            .env("PAYHOOK_ADMIN_TOKEN", token)
            .env("RUST_LOG", "error")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn payhook_tail_prints_what_is_kept_then_each_delivery_as_it_happens() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let callback = |nonce: &str, client: &str| signed_callback(&signer, nonce, 4, "5", client);
    assert_eq!(
        server.send(&callback("n-tail-1", "client-42")).await.status,
        200
    );
    assert_eq!(server.send(&callback("n-tail-2", "fail")).await.status, 503);

    let url = format!("http://{}", server.addr);
    let following = tokio::spawn({
        let url = url.clone();
        async move { payhook(&["tail", "--admin-url", &url, "--recent", "--count", "3"]).await }
    });
    // The third arrives while tail follows: it waits for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.send(&callback("n-tail-3", "client-42")).await.status,
        200
    );
    let output = tokio::time::timeout(Duration::from_secs(30), following)
        .await
        .expect("tail stopped after three deliveries")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (line, (nonce, outcome)) in lines.iter().zip([
        ("n-tail-1", "booked"),
        ("n-tail-2", "failed"),
        ("n-tail-3", "booked"),
    ]) {
        assert!(line.contains(nonce) && line.contains(outcome), "{line}");
        assert!(
            line.contains("callback") && line.contains("signature verified"),
            "{line}"
        );
    }

    let json = payhook(&[
        "tail",
        "--admin-url",
        &url,
        "--recent",
        "--outcome",
        "failed",
        "--json",
        "--count",
        "1",
    ])
    .await;
    let line = String::from_utf8_lossy(&json.stdout);
    let entry: payhook::inspector::DeliveryEntry = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(
        (entry.nonce.as_deref(), entry.status),
        (Some("n-tail-2"), 503)
    );

    let refused =
        payhook_with_token(&["tail", "--admin-url", &url], "wrong-token-0000000000").await;
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// An operating API that answers `GET …/deliveries` from `script`, in turn (then as the
/// last answer did): (status, body).
async fn scripted_deliveries(script: Vec<(u16, serde_json::Value)>) -> payhook::admin::AdminClient {
    let script = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(
        script,
    )));
    let addr = serve_http(move |_request| {
        let script = std::sync::Arc::clone(&script);
        async move {
            let (status, body) = {
                let mut script = script.lock().unwrap();
                if script.len() > 1 {
                    script.pop_front().unwrap()
                } else {
                    script[0].clone()
                }
            };
            hyper::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(
                    body.to_string(),
                )))
                .unwrap()
        }
    })
    .await;
    payhook::admin::AdminClient::new(&format!("http://{addr}"), "token-0123456789abcdef".into())
        .unwrap()
}

/// A list of deliveries as the operating API answers it, from the process `instance`.
fn listed(instance: &str, last: u64, seqs: &[u64]) -> serde_json::Value {
    let deliveries: Vec<_> = seqs
        .iter()
        .map(|seq| {
            serde_json::json!({
                "seq": seq, "at": "2026-11-29T12:00:00Z", "endpoint": "callback",
                "requestId": format!("r-{seq}"), "traceId": "t", "nonce": format!("n-{seq}"),
                "client": null, "referenceId": null, "transactionStatus": 4,
                "validationId": null, "outcome": "booked", "status": 200, "message": null,
                "latencyMs": 1.0, "signature": "verified", "attempt": 1, "duplicate": false
            })
        })
        .collect();
    serde_json::json!({"last": last, "instance": instance, "deliveries": deliveries})
}

/// `payhook tail --json` follows a restart behind a proxy: the proxy's 503 meanwhile is
/// waited out (it ended tail), and what tail says of it is JSON too (plain lines among the
/// JSON broke whatever read it); the new process's deliveries follow.
#[tokio::test]
async fn payhook_tail_waits_out_a_restart_and_keeps_its_json_json() {
    let client = scripted_deliveries(vec![
        (200, listed("a", 5, &[])),
        (200, listed("a", 6, &[6])),
        (503, serde_json::json!({"message": "upstream restarting"})),
        (200, listed("b", 1, &[])),
        (200, listed("b", 1, &[1])),
    ])
    .await;
    let options = payhook::admin::TailOptions {
        filter: Default::default(),
        json: true,
        recent: false,
        count: Some(2),
    };
    let mut out = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        payhook::admin::tail(&client, &options, &mut out),
    )
    .await
    .expect("tail stopped after two deliveries")
    .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let said: Vec<String> = lines
        .iter()
        .map(|line| match line.get("event") {
            Some(event) => event.as_str().unwrap().to_owned(),
            None => line["nonce"].as_str().unwrap().to_owned(),
        })
        .collect();
    assert_eq!(said, ["n-6", "waiting", "restarted", "n-1"]);
    assert!(
        lines[1]["message"]
            .as_str()
            .unwrap()
            .contains("upstream restarting"),
        "{lines:?}"
    );
}

/// Two instances answering one address in turn (a load balancer) end `payhook tail`, saying
/// so: every answer looked like a restart, and it asked again at once, for ever.
#[tokio::test]
async fn payhook_tail_ends_when_two_instances_answer_in_turn() {
    let client = scripted_deliveries(vec![
        (200, listed("a", 3, &[])),
        (200, listed("b", 5, &[])),
        (200, listed("a", 3, &[])),
    ])
    .await;
    let options = payhook::admin::TailOptions {
        filter: Default::default(),
        json: false,
        recent: false,
        count: None,
    };
    let mut out = Vec::new();
    let ended = tokio::time::timeout(
        Duration::from_secs(30),
        payhook::admin::tail(&client, &options, &mut out),
    )
    .await
    .expect("tail ended");
    let error = ended.unwrap_err().to_string();
    assert!(error.contains("more than one instance answers"), "{error}");
}

/// `payhook tail --recent` shows every delivery the service keeps, oldest first, however
/// many more than one answer holds (it showed the newest 100 and skipped the rest).
#[tokio::test]
async fn payhook_tail_shows_every_kept_delivery_in_order() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    const SENT: usize = 150;
    for n in 0..SENT {
        let nonce = format!("n-many-{n:03}");
        let callback = signed_callback(&signer, &nonce, 4, "5", "client-42");
        assert_eq!(server.send(&callback).await.status, 200);
    }
    let url = format!("http://{}", server.addr);
    let count = SENT.to_string();
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        payhook(&["tail", "--admin-url", &url, "--recent", "--count", &count]),
    )
    .await
    .expect("every kept delivery printed, then tail stopped");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), SENT, "{stdout}");
    for (n, line) in lines.iter().enumerate() {
        assert!(line.contains(&format!("n-many-{n:03}")), "line {n}: {line}");
    }
}

/// A shared secret's header is the merchant's to name, so the inspector keeps the values of
/// the headers it knows to be harmless and no other: the secret is never shown, whether it
/// was right or wrong. What a request can make the inspector keep is bounded too: its
/// headers' bytes, and its identifiers to the longest the service accepts.
#[tokio::test]
async fn a_secret_under_a_header_of_the_merchant_s_naming_is_never_kept() {
    use payhook::config::{AuthMethod, EndpointAuthConfig};
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway);
    config.validation.awaitable = false;
    config.auth.transaction_validation = EndpointAuthConfig {
        method: AuthMethod::SharedSecret,
        header: "X-Aggregator-Token".into(),
        secret: Some("merchant-named-secret-5150".into()),
        ..Default::default()
    };
    let max_chars = config.server.max_identifier_chars;
    let server = TestServer::start_with(config).await;
    let long_nonce = "n".repeat(50_000);
    let long_body = with(
        TRANSACTION_VALIDATION,
        "/paymentData/nonce",
        Some(long_nonce.into()),
    );
    let filler = "f".repeat(3_000);
    let mut headers = vec![
        ("Content-Type".to_owned(), "application/json".to_owned()),
        (
            "X-Aggregator-Token".to_owned(),
            "merchant-named-secret-5150".to_owned(),
        ),
    ];
    // 48 KB of headers: well over what is kept, within what a head may take (64 KiB).
    headers.extend((0..16).map(|i| (format!("x-filler-{i}"), filler.clone())));
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    for (body, status) in [(TRANSACTION_VALIDATION.to_owned(), 200), (long_body, 400)] {
        let answer = server
            .send(&post(VALIDATION_PATH, &headers, body.as_bytes()))
            .await;
        assert_eq!(answer.status, status, "{}", answer.message());
    }
    let wrong = post(
        VALIDATION_PATH,
        &[
            ("Content-Type", "application/json"),
            ("X-Aggregator-Token", "merchant-named-secret-5151"),
        ],
        TRANSACTION_VALIDATION.as_bytes(),
    );
    assert_eq!(server.send(&wrong).await.status, 401);

    let list = deliveries(&server, "").await;
    assert_eq!(list.deliveries.len(), 3);
    for seq in 1..=3 {
        let detail = detail_without(&server, seq, "merchant-named-secret").await;
        assert!(
            detail
                .headers
                .contains(&("x-aggregator-token".into(), "[redacted]".into())),
            "{:?}",
            detail.headers
        );
        assert!(
            detail
                .headers
                .contains(&("content-type".into(), "application/json".into()))
        );
        let kept: usize = detail
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 3)
            .sum();
        assert!(
            kept <= payhook::inspector::HEADERS_KEPT + 1024,
            "{kept} bytes of headers kept"
        );
    }
    let refused = &list.deliveries[1];
    assert_eq!(refused.status, 400);
    let nonce = refused.nonce.as_deref().unwrap();
    assert_eq!(nonce, format!("{}…", "n".repeat(max_chars)));
}

/// The session cookie a login with `headers` sets (its whole `Set-Cookie`).
async fn logged_in(server: &TestServer, headers: &[(&str, &str)]) -> String {
    let mut headers = headers.to_vec();
    headers.push(("content-type", "application/x-www-form-urlencoded"));
    let login = server
        .send(&post(
            "/payhook/admin/inspector/login",
            &headers,
            format!("token={TOKEN}").as_bytes(),
        ))
        .await;
    assert_eq!(
        login.status,
        303,
        "{}",
        String::from_utf8_lossy(&login.body)
    );
    login.header("set-cookie").unwrap().to_owned()
}

#[tokio::test]
async fn the_token_is_never_taken_from_the_address_and_logging_out_ends_the_session() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let page = |cookie: &str| {
        request(
            "GET",
            "/payhook/admin/inspector",
            &[("cookie", cookie)],
            None,
        )
    };

    // The right token in the query opens nothing: it would stay in logs and the history.
    let in_query = server
        .send(&request(
            "GET",
            &format!("/payhook/admin/inspector?token={TOKEN}"),
            &[],
            None,
        ))
        .await;
    assert_eq!(in_query.status, 401);
    assert!(in_query.header("set-cookie").is_none());
    let asked = String::from_utf8_lossy(&in_query.body);
    assert!(
        asked.contains("a token in the address is not taken"),
        "{asked}"
    );
    assert!(!asked.contains(TOKEN), "{asked}");
    // The form the page shows posts to the login's address, and a fragment fills it.
    assert!(
        asked.contains("action=/payhook/admin/inspector/login "),
        "{asked}"
    );
    assert!(asked.contains("location.hash"), "{asked}");

    // Over plain HTTP the cookie is not `Secure` (the browser would drop it), whatever the
    // client says of itself; behind a trusted proxy that was reached over HTTPS, it is.
    let plain = logged_in(&server, &[]).await;
    assert!(!plain.contains("Secure"), "{plain}");
    let claimed = logged_in(&server, &[("x-forwarded-proto", "https")]).await;
    assert!(!claimed.contains("Secure"), "{claimed}");
    let mut behind_proxy = config(&gateway);
    behind_proxy.server.trusted_proxies = vec!["127.0.0.1/32".into()];
    let proxied = TestServer::start_with(behind_proxy).await;
    let via = |proto| [("x-forwarded-for", "::1"), ("x-forwarded-proto", proto)];
    let secure = logged_in(&proxied, &via("https")).await;
    assert!(secure.contains("; Secure"), "{secure}");
    let not_secure = logged_in(&proxied, &via("http")).await;
    assert!(!not_secure.contains("Secure"), "{not_secure}");
    let session = plain.split(';').next().unwrap().to_owned();
    assert_eq!(server.send(&page(&session)).await.status, 200);

    // Logging out: only from the page (its header), then the cookie is removed, and the
    // session is refused even to whoever kept a copy of it.
    let logout = |headers: Vec<(&'static str, String)>| {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post("/payhook/admin/inspector/logout", &headers, b"")
    };
    let cross_site = server
        .send(&logout(vec![("cookie", session.clone())]))
        .await;
    assert_eq!(cross_site.status, 403);
    assert_eq!(server.send(&page(&session)).await.status, 200);
    let other = logged_in(&server, &[]).await;
    let other = other.split(';').next().unwrap().to_owned();
    let out = server
        .send(&logout(vec![
            ("cookie", session.clone()),
            ("x-payhook-inspector", "1".into()),
        ]))
        .await;
    assert_eq!((out.status, out.message()), (200, "logged out".into()));
    let bearer = format!("Bearer {TOKEN}");
    let without_session = server.send(&logout(vec![("authorization", bearer)])).await;
    assert_eq!(without_session.status, 200);
    assert!(
        without_session.message().starts_with("no session to end"),
        "{}",
        without_session.message()
    );
    let removed = out.header("set-cookie").unwrap();
    assert!(
        removed.starts_with("payhook_admin=;") && removed.contains("Max-Age=0"),
        "{removed}"
    );
    assert_eq!(server.send(&page(&session)).await.status, 401);
    let panel = server
        .send(&request(
            "GET",
            "/payhook/admin/inspector/health",
            &[("cookie", &session)],
            None,
        ))
        .await;
    assert_eq!(panel.status, 401);
    // Another login's session is its own: it goes on.
    assert_eq!(server.send(&page(&other)).await.status, 200);
}

/// A session ended by logging out stays ended where the instance's memory of it does not
/// reach, since the store keeps it: at the service restarted on its sled store, and at
/// another instance on a shared PostgreSQL store (its sessions signed with the same token).
/// Before, a copy of the cookie was good there until its twelve hours were over. A session
/// nobody ended goes on at both.
#[tokio::test]
async fn a_logged_out_session_stays_ended_after_a_restart_and_at_another_instance() {
    let gateway = FakeGateway::start().await;
    let (on_sled, store, _data) = sled_store_of(&gateway);
    let mut first =
        TestServer::start_on(on_sled.clone(), tempfile::tempdir().unwrap(), store).await;
    let ended = session_in(&logged_in(&first, &[]).await);
    let kept = session_in(&logged_in(&first, &[]).await);
    log_out(&first, &ended).await;
    assert_eq!(inspector_page(&first, &ended).await, 401);
    // A logout let in by a bearer token that also carries a session's cookie ends that
    // session, in the store too (before, in this instance's memory alone).
    let beside_a_token = session_in(&logged_in(&first, &[]).await);
    let bearer = format!("Bearer {TOKEN}");
    let out = first
        .send(&post(
            "/payhook/admin/inspector/logout",
            &[("authorization", &bearer), ("cookie", &beside_a_token)],
            b"",
        ))
        .await;
    assert_eq!((out.status, out.message()), (200, "logged out".into()));
    assert_eq!(inspector_page(&first, &beside_a_token).await, 401);
    first.shut_down();
    first.stopped().await;
    drop(first);
    // The service started again: its store opened again from its files, nothing of the
    // first one's memory.
    let store = once_let_go(
        || payhook::store::SledStore::open(&on_sled.store, &[]),
        "in use",
    )
    .await;
    let restarted = TestServer::start_on(on_sled, tempfile::tempdir().unwrap(), store).await;
    assert_eq!(
        inspector_page(&restarted, &ended).await,
        401,
        "after a restart"
    );
    assert_eq!(
        inspector_page(&restarted, &beside_a_token).await,
        401,
        "ended beside a token, after a restart"
    );
    assert_eq!(inspector_page(&restarted, &kept).await, 200);

    let test = "a_logged_out_session_stays_ended_after_a_restart_and_at_another_instance";
    let Some(db) = support::postgres::database(test).await else {
        return;
    };
    let mut on_postgres = config(&gateway);
    on_postgres.store = db.store_config(Duration::from_secs(3600));
    let instance = || async {
        let store = payhook::store::PgStore::open(&on_postgres.store, &[])
            .await
            .unwrap();
        TestServer::start_on(on_postgres.clone(), tempfile::tempdir().unwrap(), store).await
    };
    let one = instance().await;
    let another = instance().await;
    let ended = session_in(&logged_in(&one, &[]).await);
    let kept = session_in(&logged_in(&one, &[]).await);
    assert_eq!(inspector_page(&another, &ended).await, 200);
    log_out(&one, &ended).await;
    assert_eq!(
        inspector_page(&another, &ended).await,
        401,
        "at another instance"
    );
    assert_eq!(inspector_page(&another, &kept).await, 200);
    drop((one, another));
    db.drop_schema().await;
}

/// A store that cannot keep a logout: the logout is refused (503) and the session stays
/// good at this instance too, so that the logout can be asked again — ended in this
/// instance's memory alone, it would have been refused as no session from then on, and
/// taken by the other instances and after a restart. Meanwhile the session may still look
/// (this instance's memory of ended sessions holds; the page shows the store's failure).
#[tokio::test]
async fn a_logout_the_store_cannot_keep_is_refused_and_can_be_asked_again() {
    let gateway = FakeGateway::start().await;
    let (on_sled, store, _data) = sled_store_of(&gateway);
    let server = TestServer::start_on(on_sled, tempfile::tempdir().unwrap(), store.clone()).await;
    let session = session_in(&logged_in(&server, &[]).await);
    store.mark_failed_for_tests();
    let logout = || {
        post(
            "/payhook/admin/inspector/logout",
            &[("cookie", &session), ("x-payhook-inspector", "1")],
            b"",
        )
    };
    for attempt in 0..2 {
        let refused = server.send(&logout()).await;
        assert_eq!(
            refused.status,
            503,
            "attempt {attempt}: {}",
            refused.message()
        );
        assert_eq!(
            inspector_page(&server, &session).await,
            200,
            "attempt {attempt}"
        );
    }
}

/// PostgreSQL gone (its connections killed, new ones refused): whether a session was ended
/// at another instance cannot be told, so the session may look (said in the log) and is
/// refused a change — its logout too (503, the session still good), which can be asked
/// again once the database is back, and then holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_gone_a_session_may_look_and_is_refused_a_change() {
    let test = "with_the_database_gone_a_session_may_look_and_is_refused_a_change";
    let Some(db) = support::postgres::database(test).await else {
        return;
    };
    // A role of the test's own, whose connections can be killed and refused.
    let (role, url) = db.own_role().await;
    let as_admin = |sql: String| {
        let db = &db;
        async move {
            let mut conn = db.connect().await;
            sqlx::raw_sql(&sql).execute(&mut conn).await.unwrap();
        }
    };
    let gateway = FakeGateway::start().await;
    let mut on_postgres = config(&gateway);
    on_postgres.store = payhook::store::StoreConfig {
        url: Some(url.as_str().into()),
        pool_size: 4,
        connect_timeout: Duration::from_secs(1),
        ..db.store_config(Duration::from_secs(3600))
    };
    let store = payhook::store::PgStore::open(&on_postgres.store, &[])
        .await
        .unwrap();
    let server = TestServer::start_on(on_postgres, tempfile::tempdir().unwrap(), store).await;
    let session = session_in(&logged_in(&server, &[]).await);
    assert_eq!(inspector_page(&server, &session).await, 200);

    as_admin(format!("ALTER ROLE {role} NOLOGIN")).await;
    as_admin(format!(
        // Each waited for (up to 10 s): a connection not yet gone could serve the logout.
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = '{role}'"
    ))
    .await;
    assert_eq!(
        inspector_page(&server, &session).await,
        200,
        "the session looks while the database is gone"
    );
    let logout = post(
        "/payhook/admin/inspector/logout",
        &[("cookie", &session), ("x-payhook-inspector", "1")],
        b"",
    );
    let refused = server.send(&logout).await;
    assert_eq!(refused.status, 503, "{}", refused.message());
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    assert_eq!(inspector_page(&server, &session).await, 200);

    as_admin(format!("ALTER ROLE {role} LOGIN")).await;
    log_out(&server, &session).await;
    assert_eq!(inspector_page(&server, &session).await, 401);
    drop(server);
    db.drop_schema().await;
    as_admin(format!("DROP ROLE {role}")).await;
}

/// [`config`] with a sled store in a directory of its own, opened by the test (to open it
/// again, or fail it); the directory goes when the test ends.
fn sled_store_of(
    gateway: &FakeGateway,
) -> (
    payhook::Config,
    payhook::store::SledStore,
    tempfile::TempDir,
) {
    let data = tempfile::tempdir().unwrap();
    let mut on_sled = config(gateway);
    on_sled.store.path = data.path().join("store");
    let store = payhook::store::SledStore::open(&on_sled.store, &[]).unwrap();
    (on_sled, store, data)
}

/// The session a login's `set-cookie` holds, as a browser sends it back.
fn session_in(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_owned()
}

/// The status of the inspector's page asked with `session`.
async fn inspector_page(server: &TestServer, session: &str) -> u16 {
    server
        .send(&request(
            "GET",
            "/payhook/admin/inspector",
            &[("cookie", session)],
            None,
        ))
        .await
        .status
}

/// Logs `session` out from the page.
async fn log_out(server: &TestServer, session: &str) {
    let out = server
        .send(&post(
            "/payhook/admin/inspector/logout",
            &[("cookie", session), ("x-payhook-inspector", "1")],
            b"",
        ))
        .await;
    assert_eq!((out.status, out.message()), (200, "logged out".into()));
}

/// A result the aggregator refused (403) is final for the outbox; an operator who finds the
/// refusal was not the aggregator's (a firewall, a missing role) sends it again.
#[tokio::test]
async fn a_refused_result_is_sent_again_when_an_operator_asks() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    gateway.with(|state| state.fail_next.push_back(403));
    let id = approved(&server).await;
    let not_empty = |list: &serde_json::Value| list.as_array().is_some_and(|l| !l.is_empty());
    let refused = listed_once(&server, "conflict", not_empty).await;
    assert_eq!(refused[0]["validation_id"], id);
    // The page offers to send it again.
    let panel = admin(&server, "GET", "/payhook/admin/inspector/outbox", None).await;
    let html = String::from_utf8_lossy(&panel.body);
    assert!(html.contains("Send again"), "{html}");

    let retried = retry(&server, &id.to_string()).await;
    assert_eq!((retried.status, retried.message()), (200, "due now".into()));
    gateway
        .until("the result delivered", |s| s.results.contains_key(&id))
        .await;
    assert_eq!(
        gateway.with(|s| s.results[&id].clone()),
        (true, "ok".into())
    );
    let delivered = listed_once(&server, "delivered", not_empty).await;
    assert_eq!(delivered[0]["result"]["delivery"]["attempts"], 2);
}

/// What a service without a part cannot do is a 409 that names the part: no recording, no
/// deliveries to list; no gateway, nothing to reconcile against.
#[tokio::test]
async fn an_operation_whose_part_is_off_is_409_naming_it() {
    let mut config = test_config();
    config.admin.token = Some(TOKEN.into());
    config.admin.inspector_recent = 0;
    let server = TestServer::start_with(config).await;
    for path in ["/payhook/admin/deliveries", "/payhook/admin/deliveries/1"] {
        let answer = admin(&server, "GET", path, None).await;
        assert_eq!(
            (answer.status, answer.message()),
            (
                409,
                "the inspector does not record (admin.inspector_recent = 0)".into()
            ),
            "{path}"
        );
    }
    let body = r#"{"referenceIds": ["0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e"]}"#;
    let answer = admin(&server, "POST", "/payhook/admin/reconcile", Some(body)).await;
    assert_eq!(
        (answer.status, answer.message()),
        (409, "reconcile needs a complete [gateway] section".into())
    );
}

/// Whatever a sender writes in a field the inspector shows — a nonce, a client id, a
/// currency, a body, a header — is shown as text on every panel, never as markup: the
/// page runs a script of its own, and one value left unescaped would run a sender's script
/// in the operator's session, which can approve validations.
#[tokio::test]
async fn what_senders_write_is_shown_as_text_on_every_panel() {
    const HOSTILE: &str = r#"<img src=x onerror=alert(1)>'"&"#;
    let gateway = FakeGateway::start().await;
    let mut unsigned = test_config();
    unsigned.gateway = gateway.config();
    unsigned.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    unsigned.validation.allow_unauthenticated = true;
    unsigned.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(unsigned).await;
    let hostile = || Some(serde_json::json!(HOSTILE));
    let set = |body: &str, fields: &[(&str, Option<serde_json::Value>)]| {
        fields
            .iter()
            .fold(body.to_owned(), |body, (pointer, value)| {
                with(&body, pointer, value.clone())
            })
    };
    // A callback whose handler fails (listed as failing), one refused for its body (a
    // negative amount), and a postponed validation (on the postponed panel).
    let failing = set(
        CALLBACK,
        &[
            ("/nonce", hostile()),
            ("/currency", hostile()),
            ("/clientId", Some(serde_json::json!("fail"))),
        ],
    );
    let request_id = [("x-request-id", HOSTILE)];
    let answer = server
        .send(&post(
            CALLBACK_PATH,
            &[("content-type", "application/json"), request_id[0]],
            failing.as_bytes(),
        ))
        .await;
    assert_eq!(answer.status, 503, "{}", answer.message());
    let refused = set(
        CALLBACK,
        &[
            ("/nonce", Some(serde_json::json!("n-refused"))),
            ("/clientId", hostile()),
            ("/amount", Some(serde_json::json!(-1))),
        ],
    );
    assert_eq!(server.post_json(CALLBACK_PATH, &refused).await.status, 400);
    let postponed = set(
        TRANSACTION_VALIDATION,
        &[
            ("/paymentData/nonce", hostile()),
            (
                "/merchantData/clientId",
                Some(serde_json::json!("postpone")),
            ),
        ],
    );
    let answer = server.post_json(VALIDATION_PATH, &postponed).await;
    assert_eq!(answer.status, 200, "{}", answer.message());

    let mut panels = ["deliveries", "failing", "postponed", "outbox", "health"]
        .map(|panel| format!("/payhook/admin/inspector/{panel}"))
        .to_vec();
    for entry in deliveries(&server, "").await.deliveries {
        panels.push(format!("/payhook/admin/inspector/delivery/{}", entry.seq));
    }
    assert_eq!(panels.len(), 8, "three deliveries recorded");
    // In a body, the quote is JSON's too (`\"`): the markup's part is enough to find.
    let escaped = "&lt;img src=x onerror=alert(1)&gt;";
    let mut shown = Vec::new();
    for panel in &panels {
        let answer = admin(&server, "GET", panel, None).await;
        assert_eq!(answer.status, 200, "{panel}");
        let text = String::from_utf8_lossy(&answer.body);
        assert!(!text.contains("<img"), "{panel}: {text}");
        assert!(!text.contains(HOSTILE), "{panel}: {text}");
        if text.contains(escaped) {
            shown.push(panel.rsplit("inspector/").next().unwrap().to_owned());
        }
    }
    // Shown, as text: on the deliveries, failing and postponed panels, and in each
    // delivery's request.
    assert_eq!(
        shown,
        [
            "deliveries",
            "failing",
            "postponed",
            "delivery/1",
            "delivery/2",
            "delivery/3"
        ]
    );
}

/// No other site's page may call the operating API from the operator's browser: no
/// cross-origin answer is ever allowed (a preflight gets no `Access-Control-Allow-*`), so
/// a change, which needs the inspector's header, cannot be sent from elsewhere.
#[tokio::test]
async fn no_other_origin_is_allowed_to_call_the_operating_api() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    for path in [
        "/payhook/admin/validations/7",
        "/payhook/admin/inspector/login",
        "/payhook/admin/outbox/7/retry",
    ] {
        let preflight = server
            .send(&request(
                "OPTIONS",
                path,
                &[
                    ("origin", "https://evil.example"),
                    ("access-control-request-method", "POST"),
                    ("access-control-request-headers", "x-payhook-inspector"),
                ],
                None,
            ))
            .await;
        assert!(
            preflight
                .headers
                .iter()
                .all(|(name, _)| !name.to_ascii_lowercase().starts_with("access-control-")),
            "{path}: {:?}",
            preflight.headers
        );
        assert!(preflight.status >= 400, "{path}: {}", preflight.status);
    }
}

/// Where the aggregator signs callbacks in `Authorization` and the validations come with
/// Basic credentials in that same header, the inspector shows the callback's signature but
/// never the validation's credentials: the signature header is shown only on an endpoint
/// that verifies signatures.
#[tokio::test]
async fn basic_credentials_in_the_signature_header_are_not_kept() {
    use base64::Engine as _;
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway);
    config.signature.header = "Authorization".into();
    config.signature.prefix = "Signature ".into();
    config.auth.transaction_validation = payhook::config::EndpointAuthConfig {
        method: payhook::config::AuthMethod::Basic,
        username: Some("aggregator".into()),
        password: Some("basic-password-4242".into()),
        ..Default::default()
    };
    let server = TestServer::start_with(config).await;
    let credentials =
        base64::engine::general_purpose::STANDARD.encode("aggregator:basic-password-4242");
    let basic = format!("Basic {credentials}");
    let validation = post(
        VALIDATION_PATH,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", basic.as_str()),
        ],
        TRANSACTION_VALIDATION.as_bytes(),
    );
    assert_eq!(server.send(&validation).await.status, 200);
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let signature = signer
        .header_value(
            CALLBACK.as_bytes(),
            payhook::signature::Encoding::Base64,
            Some("Signature "),
        )
        .unwrap();
    let callback = post(
        CALLBACK_PATH,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", signature.as_str()),
        ],
        CALLBACK.as_bytes(),
    );
    assert_eq!(server.send(&callback).await.status, 200);

    let detail = detail_without(&server, 1, &credentials).await;
    assert!(
        detail
            .headers
            .contains(&("authorization".into(), "[redacted]".into())),
        "{:?}",
        detail.headers
    );
    let detail = detail_without(&server, 2, &credentials).await;
    assert!(
        detail
            .headers
            .contains(&("authorization".into(), signature.clone())),
        "the callback's signature is shown: {:?}",
        detail.headers
    );
}
