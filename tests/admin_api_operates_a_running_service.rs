//! The operating API of a running service (`/payhook/admin/`, on when `admin.token` is set):
//! token and address checks, postponed validations listed and decided, lost callbacks
//! reconciled — directly, and through `payhook … --admin-url` against the example merchant.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::model::TransactionRecord;
use payhook::sim::{MockGateway, MockGatewayConfig, Payment};
use serde_json::{Value, json};
use std::process::Command;
use support::gateway::FakeGateway;
use support::*;

const TOKEN: &str = "admin-token-0123456789";

fn config(gateway: &FakeGateway) -> payhook::Config {
    let mut config = test_config();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.admin.token = Some(TOKEN.into());
    config
}

#[tokio::test]
async fn the_api_is_off_without_a_token_and_guarded_with_one() {
    let gateway = FakeGateway::start().await;
    let mut off = config(&gateway);
    off.admin.token = None;
    let server = TestServer::start_with(off).await;
    assert_eq!(
        server
            .admin("GET", "/payhook/admin/validations", Some(TOKEN), None)
            .await
            .status,
        404
    );

    let server = TestServer::start_with(config(&gateway)).await;
    let missing = server
        .admin("GET", "/payhook/admin/validations", None, None)
        .await;
    assert_eq!(
        (missing.status, missing.message()),
        (401, "missing credentials".into())
    );
    let wrong = server
        .admin(
            "GET",
            "/payhook/admin/validations",
            Some("admin-token-wrong-000000"),
            None,
        )
        .await;
    assert_eq!(
        (wrong.status, wrong.message()),
        (401, "invalid credentials".into())
    );
    // The scheme's name in any case (RFC 9110); one Authorization header, not two.
    let listing =
        |headers: &[(&str, &str)]| request("GET", "/payhook/admin/validations", headers, None);
    let lower = format!("bearer {TOKEN}");
    let asked = server.send(&listing(&[("authorization", &lower)])).await;
    assert_eq!(asked.status, 200);
    let right = format!("Bearer {TOKEN}");
    let twice = server
        .send(&listing(&[
            ("authorization", &right),
            ("authorization", "Bearer admin-token-wrong-000000"),
        ]))
        .await;
    assert_eq!(
        (twice.status, twice.message()),
        (401, "more than one Authorization header".into())
    );

    let mut elsewhere = config(&gateway);
    elsewhere.admin.allow_ips = vec!["10.0.0.0/8".into()];
    let server = TestServer::start_with(elsewhere).await;
    let refused = server
        .admin("GET", "/payhook/admin/validations", Some(TOKEN), None)
        .await;
    assert_eq!(refused.status, 403);

    let mut short = config(&gateway);
    short.admin.token = Some("short".into());
    let error = payhook::App::builder(short)
        .transaction_validator(TestMerchant::default())
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("admin.token"), "{error}");
}

/// The token and the inspector's session never cross a network in the clear: a call from
/// another machine is let in only through a trusted proxy that says it came over HTTPS
/// (payhook serves plain HTTP), unless `admin.allow_plain_http` says otherwise. Refused
/// before its credentials are read: a wrong token gets the same answer.
#[tokio::test]
async fn a_call_from_another_machine_over_plain_http_is_refused() {
    let gateway = FakeGateway::start().await;
    let mut remote = config(&gateway);
    remote.admin.allow_ips = vec!["0.0.0.0/0".into(), "::/0".into()];
    // The test client connects from 127.0.0.1: the proxy, forwarding for 198.51.100.7.
    remote.server.trusted_proxies = vec!["127.0.0.1/32".into()];
    let server = TestServer::start_with(remote.clone()).await;
    let via = |proto: &'static str| {
        [
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-proto", proto),
            ("authorization", "Bearer admin-token-0123456789"),
        ]
    };
    let listing =
        |headers: &[(&str, &str)]| request("GET", "/payhook/admin/validations", headers, None);
    let in_the_clear = server.send(&listing(&via("http"))).await;
    assert_eq!(in_the_clear.status, 403);
    assert!(
        in_the_clear.message().contains("admin.allow_plain_http"),
        "{}",
        in_the_clear.message()
    );
    // A client's own `X-Forwarded-Proto: https`, to which a proxy appended the `http` it
    // saw, is not believed: the value read is the client's hop's (the left-most was taken).
    let two_lines = [
        ("x-forwarded-for", "198.51.100.7"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-proto", "http"),
        ("authorization", "Bearer admin-token-0123456789"),
    ];
    for refused in [
        server.send(&listing(&via("https, http"))).await,
        server.send(&listing(&via("https,http"))).await,
        // An empty value (a trailing comma) is no https either.
        server.send(&listing(&via("https,"))).await,
        server.send(&listing(&two_lines)).await,
    ] {
        assert_eq!(refused.status, 403);
        assert!(refused.message().contains("admin.allow_plain_http"));
    }
    // Behind two proxies that append — HTTPS to the outer one, whose address the inner one
    // (trusted) appended — the client's hop is the outer one's: https.
    let chained = [
        ("x-forwarded-for", "198.51.100.7, 127.0.0.1"),
        ("x-forwarded-proto", "https, http"),
        ("authorization", "Bearer admin-token-0123456789"),
    ];
    assert_eq!(server.send(&listing(&chained)).await.status, 200);
    assert_eq!(server.send(&listing(&via("HTTPS"))).await.status, 200);
    let wrong_token = [
        ("x-forwarded-for", "198.51.100.7"),
        ("authorization", "Bearer admin-token-wrong-000000"),
    ];
    assert_eq!(server.send(&listing(&wrong_token)).await.status, 403);
    let login = |proto: &'static str| {
        post(
            "/payhook/admin/inspector/login",
            &[
                ("x-forwarded-for", "198.51.100.7"),
                ("x-forwarded-proto", proto),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            format!("token={TOKEN}").as_bytes(),
        )
    };
    let form = server.send(&login("http")).await;
    assert_eq!(form.status, 403);
    assert!(form.header("set-cookie").is_none());
    // Over HTTPS to the proxy: let in.
    assert_eq!(server.send(&listing(&via("https"))).await.status, 200);
    assert_eq!(server.send(&login("https")).await.status, 303);
    // From this machine, through the proxy or not: nothing crossed a network.
    let local = [
        ("x-forwarded-for", "::1"),
        ("authorization", "Bearer admin-token-0123456789"),
    ];
    assert_eq!(server.send(&listing(&local)).await.status, 200);

    // The operator's explicit choice.
    remote.admin.allow_plain_http = true;
    let server = TestServer::start_with(remote).await;
    assert_eq!(server.send(&listing(&via("http"))).await.status, 200);
}

/// Wrong tokens from one address, ten at once and then one per six seconds: the eleventh is
/// answered 429 with `Retry-After`, and so is every credential from that address until its
/// allowance grows back — the right token too (were it let through, the refusals would tell
/// a right guess from a wrong one) — as a bearer or in the inspector's login form. Other
/// addresses count apart, and right tokens do not count.
#[tokio::test]
async fn guessing_the_token_is_slowed_down_per_address() {
    let gateway = FakeGateway::start().await;
    let mut config = config(&gateway);
    config.admin.allow_ips = vec!["0.0.0.0/0".into()];
    // The test client connects from 127.0.0.1: the proxy, forwarding for each caller.
    config.server.trusted_proxies = vec!["127.0.0.1/32".into()];
    let server = TestServer::start_with(config).await;
    let listing = |client: &str, token: &str| {
        let bearer = format!("Bearer {token}");
        let headers = [
            ("x-forwarded-for", client),
            ("x-forwarded-proto", "https"),
            ("authorization", bearer.as_str()),
        ];
        request("GET", "/payhook/admin/validations", &headers, None)
    };
    let login = |client: &str, token: &str| {
        let headers = [
            ("x-forwarded-for", client),
            ("x-forwarded-proto", "https"),
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        post(
            "/payhook/admin/inspector/login",
            &headers,
            format!("token={token}").as_bytes(),
        )
    };
    let (guesser, operator) = ("198.51.100.7", "198.51.100.8");
    const WRONG: &str = "admin-token-wrong-000000";
    for _ in 0..30 {
        assert_eq!(server.send(&listing(operator, TOKEN)).await.status, 200);
    }
    for guess in 0..10 {
        let wrong = if guess % 2 == 0 {
            server.send(&listing(guesser, WRONG)).await
        } else {
            server.send(&login(guesser, WRONG)).await
        };
        assert_eq!(wrong.status, 401, "guess {guess}");
    }
    for refused in [
        server.send(&listing(guesser, WRONG)).await,
        server.send(&listing(guesser, TOKEN)).await,
    ] {
        assert_eq!(refused.status, 429);
        let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=6).contains(&wait), "{wait}");
        assert_eq!(
            refused.message(),
            format!("too many wrong tokens from this address; try again in {wait}s")
        );
    }
    let form = server.send(&login(guesser, TOKEN)).await;
    assert_eq!(form.status, 429);
    assert!(form.header("retry-after").is_some());
    assert!(form.header("set-cookie").is_none());
    let page = String::from_utf8_lossy(&form.body).into_owned();
    assert!(
        page.contains("too many wrong tokens from this address"),
        "{page}"
    );
    // The page itself, asked with the right token: told to wait, not to enter a token.
    let bearer = format!("Bearer {TOKEN}");
    let inspector = request(
        "GET",
        "/payhook/admin/inspector",
        &[
            ("x-forwarded-for", guesser),
            ("x-forwarded-proto", "https"),
            ("authorization", bearer.as_str()),
        ],
        None,
    );
    let locked_out = server.send(&inspector).await;
    assert_eq!(locked_out.status, 429);
    assert!(locked_out.header("retry-after").is_some());
    let page = String::from_utf8_lossy(&locked_out.body).into_owned();
    assert!(
        page.contains("too many wrong tokens from this address"),
        "{page}"
    );
    // Without credentials nothing is guessed: the usual answer.
    let bare = request(
        "GET",
        "/payhook/admin/validations",
        &[("x-forwarded-for", guesser), ("x-forwarded-proto", "https")],
        None,
    );
    assert_eq!(server.send(&bare).await.status, 401);
    // A login another site's page posts (the browser says so) is refused before its token
    // is read: it spends no one's guesses.
    let cross_site = |token: &str| {
        let headers = [
            ("x-forwarded-for", operator),
            ("x-forwarded-proto", "https"),
            ("sec-fetch-site", "cross-site"),
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        post(
            "/payhook/admin/inspector/login",
            &headers,
            format!("token={token}").as_bytes(),
        )
    };
    for token in [WRONG; 20].into_iter().chain([TOKEN]) {
        let refused = server.send(&cross_site(token)).await;
        assert_eq!(refused.status, 403);
        assert!(refused.message().contains("another site's page"));
        assert!(refused.header("set-cookie").is_none());
    }
    // A browser that does not say Sec-Fetch-Site (over plain HTTP to another machine, or
    // an old one) names the page's origin: another site's, or `null`, is refused alike.
    let from_origin = |origin: &str, token: &str| {
        let headers = [
            ("x-forwarded-for", operator),
            ("x-forwarded-proto", "https"),
            ("origin", origin),
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        post(
            "/payhook/admin/inspector/login",
            &headers,
            format!("token={token}").as_bytes(),
        )
    };
    for origin in [
        "https://evil.example",
        "null",
        "http://127.0.0.1.evil.example",
    ] {
        for token in [WRONG; 12] {
            let refused = server.send(&from_origin(origin, token)).await;
            assert_eq!(refused.status, 403, "{origin}");
            assert!(refused.message().contains("another site's page"));
        }
    }
    // Its own origin (the address the form was sent to) is let through.
    let own = server.send(&from_origin("http://127.0.0.1", TOKEN)).await;
    assert_eq!(own.status, 303, "{}", own.message());
    // The operator, at another address, guessed nothing wrong (thirty right tokens).
    for _ in 0..9 {
        assert_eq!(server.send(&listing(operator, WRONG)).await.status, 401);
    }
    assert_eq!(server.send(&listing(operator, TOKEN)).await.status, 200);
    assert_eq!(server.send(&login(operator, TOKEN)).await.status, 303);
}

/// A proxy on the service's machine that is not in `server.trusted_proxies` (nginx in front,
/// the setting forgotten) makes every caller it forwards look like this machine, which the
/// default allow-list (loopback) lets in: the operating API would be open to anyone who has
/// the token, from anywhere. A call carrying a proxy's forwarding headers from such a peer
/// is refused, saying what to set.
#[tokio::test]
async fn a_call_forwarded_by_a_proxy_that_is_not_trusted_is_refused() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let bearer = format!("Bearer {TOKEN}");
    for forwarded in [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=203.0.113.9;proto=https"),
        ("x-real-ip", "203.0.113.9"),
    ] {
        let listing = request(
            "GET",
            "/payhook/admin/validations",
            &[("authorization", bearer.as_str()), forwarded],
            None,
        );
        let refused = server.send(&listing).await;
        assert_eq!(refused.status, 403, "{forwarded:?}");
        assert!(
            refused
                .message()
                .contains("forwarded by a proxy that is not in server.trusted_proxies"),
            "{forwarded:?}: {}",
            refused.message()
        );
    }
    let direct = request(
        "GET",
        "/payhook/admin/validations",
        &[("authorization", bearer.as_str())],
        None,
    );
    assert_eq!(server.send(&direct).await.status, 200);
    // The metrics' allow-list (loopback by default) is not served to the world either.
    let scrape = |headers: &[(&str, &str)]| request("GET", "/metrics", headers, None);
    let refused = server
        .send(&scrape(&[("x-forwarded-for", "203.0.113.9")]))
        .await;
    assert_eq!(refused.status, 403);
    assert_eq!(server.send(&scrape(&[])).await.status, 200);
}

/// A web page the operator visits can point a name of its own at 127.0.0.1 (DNS rebinding)
/// and have the browser call the API as that page's site: over plain HTTP, a call names the
/// service by an address or `localhost`, or is refused before its credentials are read.
#[tokio::test]
async fn a_call_naming_the_service_by_another_name_over_plain_http_is_refused() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let bearer = format!("Bearer {TOKEN}");
    let named = |host: &str| {
        let listing = request(
            "GET",
            "/payhook/admin/validations",
            &[("authorization", bearer.as_str())],
            None,
        );
        let listing = String::from_utf8(listing).unwrap();
        listing
            .replacen("Host: 127.0.0.1", &format!("Host: {host}"), 1)
            .into_bytes()
    };
    let rebound = server.send(&named("evil.example:8080")).await;
    assert_eq!(rebound.status, 403);
    assert!(
        rebound.message().contains("not by the name evil.example"),
        "{}",
        rebound.message()
    );
    let login = String::from_utf8(post(
        "/payhook/admin/inspector/login",
        &[("content-type", "application/x-www-form-urlencoded")],
        format!("token={TOKEN}").as_bytes(),
    ))
    .unwrap()
    .replacen("Host: 127.0.0.1", "Host: evil.example", 1);
    let guessed = server.send(login.as_bytes()).await;
    assert_eq!(guessed.status, 403);
    assert!(guessed.header("set-cookie").is_none());
    // A Host that names nothing readable is refused too, not taken as naming nothing.
    let unreadable = server.send(&named("127.0.0.1:80:80")).await;
    assert_eq!(unreadable.status, 403, "{}", unreadable.message());
    for host in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080"] {
        assert_eq!(server.send(&named(host)).await.status, 200, "{host}");
    }
    // The metrics, which the default allow-list serves to this machine, the same: a page in
    // a browser here would read the counters of the merchant's business as its own site's.
    let scrape = |host: &str| {
        String::from_utf8(request("GET", "/metrics", &[], None))
            .unwrap()
            .replacen("Host: 127.0.0.1", &format!("Host: {host}"), 1)
            .into_bytes()
    };
    let rebound = server.send(&scrape("evil.example:8080")).await;
    assert_eq!(rebound.status, 403);
    assert!(
        rebound
            .message()
            .contains("over plain HTTP /metrics is called by an address or localhost, not by the name evil.example"),
        "{}",
        rebound.message()
    );
    for host in ["localhost:9090", "127.0.0.1:9090", "[::1]:9090"] {
        assert_eq!(server.send(&scrape(host)).await.status, 200, "{host}");
    }

    // Behind a trusted proxy that speaks HTTPS, the service has the proxy's name.
    let mut proxied = config(&gateway);
    proxied.server.trusted_proxies = vec!["127.0.0.1/32".into()];
    let server = TestServer::start_with(proxied).await;
    let via_https = String::from_utf8(named("admin.shop.example"))
        .unwrap()
        .replacen(
            "\r\n\r\n",
            "\r\nx-forwarded-for: ::1\r\nx-forwarded-proto: https\r\n\r\n",
            1,
        );
    assert_eq!(server.send(via_https.as_bytes()).await.status, 200);
}

#[tokio::test]
async fn deciding_an_unknown_validation_names_the_id_it_did_not_find() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let unknown = server
        .admin(
            "POST",
            "/payhook/admin/validations/42",
            Some(TOKEN),
            Some(r#"{"success": true, "description": "reviewed"}"#),
        )
        .await;
    assert_eq!(
        (unknown.status, unknown.message()),
        (404, "no postponed validation with id 42".to_owned()),
        "as the offline command says, not `no endpoint at this path`"
    );
    // A path that is no endpoint still says so.
    let nowhere = server
        .admin("GET", "/payhook/admin/nothing", Some(TOKEN), None)
        .await;
    assert_eq!(
        (nowhere.status, nowhere.message()),
        (404, "no endpoint at this path".to_owned())
    );
}

#[tokio::test]
async fn postponed_validations_are_listed_and_decided_once() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    let id = server.postpone_validation().await;

    let pending = || {
        server.admin(
            "GET",
            "/payhook/admin/validations?state=pending",
            Some(TOKEN),
            None,
        )
    };
    let listed = pending().await;
    assert_eq!(listed.status, 200);
    let list: Value = listed.json();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["validation_id"], id);

    let path = format!("/payhook/admin/validations/{id}");
    let decide = |success: bool| json!({"success": success, "description": "reviewed"}).to_string();
    // A decision taken on a row that showed another validation (the inspector sends the
    // nonce it showed; a redraw can move another row under the pointer) is refused, and
    // nothing is recorded.
    let on_the_row_of = |nonce: &str| {
        json!({"success": true, "description": "reviewed", "nonce": nonce}).to_string()
    };
    let elsewhere = server
        .admin("POST", &path, Some(TOKEN), Some(&on_the_row_of("n-other")))
        .await;
    assert_eq!(elsewhere.status, 409, "{}", elsewhere.message());
    assert!(
        elsewhere
            .message()
            .contains("not of the nonce shown (n-other): nothing recorded"),
        "{}",
        elsewhere.message()
    );
    assert_eq!(pending().await.json().as_array().unwrap().len(), 1);
    let nonce = list[0]["request"]["paymentData"]["nonce"].as_str().unwrap();
    let first = server
        .admin("POST", &path, Some(TOKEN), Some(&on_the_row_of(nonce)))
        .await;
    assert_eq!((first.status, first.message()), (200, "recorded".into()));
    let same = server
        .admin("POST", &path, Some(TOKEN), Some(&decide(true)))
        .await;
    assert_eq!((same.status, same.message()), (200, "unchanged".into()));
    let other = server
        .admin("POST", &path, Some(TOKEN), Some(&decide(false)))
        .await;
    assert_eq!(other.status, 409);
    assert!(
        other.message().contains("decided differently"),
        "{}",
        other.message()
    );
    let unknown = server
        .admin(
            "POST",
            "/payhook/admin/validations/1",
            Some(TOKEN),
            Some(&decide(true)),
        )
        .await;
    assert_eq!(unknown.status, 404);
    let malformed = server
        .admin("POST", &path, Some(TOKEN), Some("{not json"))
        .await;
    assert_eq!(malformed.status, 400);
    assert!(
        malformed.message().contains("malformed JSON"),
        "{}",
        malformed.message()
    );
    let wrong_type = server
        .admin("POST", &path, Some(TOKEN), Some(r#"{"success": "yes"}"#))
        .await;
    assert_eq!(wrong_type.status, 400);
    assert!(
        wrong_type.message().contains("success"),
        "{}",
        wrong_type.message()
    );
    let reconcile = server
        .admin("POST", "/payhook/admin/reconcile", Some(TOKEN), Some("[]"))
        .await;
    assert_eq!(reconcile.status, 400);
    let bad = server
        .admin(
            "GET",
            "/payhook/admin/validations?state=lost",
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(bad.status, 400);
    gateway
        .until("the decided result", |s| s.results.contains_key(&id))
        .await;
}

/// Postpones validation `id` (nonce `page-{id}`): the client `postpone` waits for a decision.
async fn postpone(server: &TestServer, id: i64) {
    let body = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!("postpone")),
    );
    let body = with(
        &body,
        "/paymentData/nonce",
        Some(json!(format!("page-{id}"))),
    );
    let body = with(&body, "/validationId", Some(json!(id)));
    let answer = server.post_json(VALIDATION_PATH, &body).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

/// The ids of a page of `GET validations`, and the next page's address from its `Link`.
fn page_of(answer: &RawResponse) -> (Vec<i64>, Option<String>) {
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let ids = answer
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["validation_id"].as_i64().unwrap())
        .collect();
    let next = answer.header("link").map(|link| {
        assert!(link.ends_with(">; rel=\"next\""), "{link}");
        link.trim_start_matches('<')
            .trim_end_matches(">; rel=\"next\"")
            .to_owned()
    });
    (ids, next)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postponed_validations_are_listed_a_page_at_a_time() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(config(&gateway)).await;
    // More than the 500 a page holds at most: a listing takes two pages whatever asks.
    let ids: Vec<i64> = (1..=503).collect();
    for id in &ids {
        postpone(&server, *id).await;
    }
    let decide = json!({"success": true, "description": "reviewed"}).to_string();
    for id in [2, 4] {
        let path = format!("/payhook/admin/validations/{id}");
        let decided = server
            .admin("POST", &path, Some(TOKEN), Some(&decide))
            .await;
        assert_eq!(decided.status, 200);
    }
    let pending: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| ![2, 4].contains(id))
        .collect();

    // Two at a time, each page naming the next, the last none.
    let first = server
        .admin(
            "GET",
            "/payhook/admin/validations?state=pending&limit=2",
            Some(TOKEN),
            None,
        )
        .await;
    let (listed, mut next) = page_of(&first);
    assert_eq!(listed, [1, 3], "the decided one left out");
    assert_eq!(
        next.as_deref(),
        Some("/payhook/admin/validations?state=pending&limit=2&after=3")
    );
    let mut walked = listed;
    let mut pages = 1;
    while let Some(path) = next {
        let (listed, following) = page_of(&server.admin("GET", &path, Some(TOKEN), None).await);
        assert!(
            !listed.is_empty() && listed.len() <= 2,
            "{path}: {listed:?}"
        );
        walked.extend(listed);
        next = following;
        pages += 1;
    }
    assert_eq!(walked, pending, "every pending one, once, by id");
    assert_eq!(pages, pending.len().div_ceil(2));
    // Without a limit, 500; asked for more, 500; for none, one.
    let (whole, next) = page_of(
        &server
            .admin("GET", "/payhook/admin/validations", Some(TOKEN), None)
            .await,
    );
    assert_eq!(whole, ids[..500]);
    assert_eq!(
        next.as_deref(),
        Some("/payhook/admin/validations?limit=500&after=500")
    );
    let (more, _) = page_of(
        &server
            .admin(
                "GET",
                "/payhook/admin/validations?limit=100000",
                Some(TOKEN),
                None,
            )
            .await,
    );
    assert_eq!(more.len(), 500);
    let (one, _) = page_of(
        &server
            .admin(
                "GET",
                "/payhook/admin/validations?limit=0&state=pending",
                Some(TOKEN),
                None,
            )
            .await,
    );
    assert_eq!(one, [1]);
    let (rest, next) = page_of(
        &server
            .admin(
                "GET",
                "/payhook/admin/validations?after=500",
                Some(TOKEN),
                None,
            )
            .await,
    );
    assert_eq!((rest, next), (vec![501, 502, 503], None));
    for (query, named) in [
        ("after=x", "`after`"),
        ("limit=-1", "`limit`"),
        ("state=lost", "state `lost`"),
    ] {
        let bad = server
            .admin(
                "GET",
                &format!("/payhook/admin/validations?{query}"),
                Some(TOKEN),
                None,
            )
            .await;
        assert_eq!(bad.status, 400, "{query}");
        assert!(bad.message().contains(named), "{query}: {}", bad.message());
    }

    // The operating API's client reads every page in turn.
    let client =
        payhook::admin::AdminClient::new(&format!("http://{}", server.addr), TOKEN.into()).unwrap();
    let held = client
        .validations(Some(payhook::postponed::PostponedState::Pending))
        .await
        .unwrap();
    let held: Vec<i64> = held.iter().map(|v| v.validation_id.get()).collect();
    assert_eq!(held, pending);
    assert_eq!(client.validations(None).await.unwrap().len(), ids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_operates_the_running_example_merchant() {
    let mock = MockGateway::start(MockGatewayConfig::default())
        .await
        .unwrap();
    let payment = Payment::default();
    let record: TransactionRecord = payment.record("Failed", true);
    mock.put_transaction(record);
    let data = tempfile::tempdir().unwrap();
    let mut shared = gateway_env(&mock.gateway_config());
    shared.push(("PAYHOOK_ADMIN_TOKEN", TOKEN.to_owned()));
    let env = owned_env(&shared);
    let mut example_env = shared.clone();
    example_env.extend([
        ("PAYHOOK_SERVER_LISTEN", "127.0.0.1:0".to_owned()),
        ("PAYHOOK_STORE_PATH", data.path().display().to_string()),
        ("PAYHOOK_VALIDATION_AWAITABLE", "true".to_owned()),
        (
            "PAYHOOK_VALIDATION_ALLOW_UNAUTHENTICATED",
            "true".to_owned(),
        ),
        ("MERCHANT_REVIEW_EVERY", "1h".to_owned()),
        // No aggregator key here: unsigned callbacks only by explicit opt-in.
        ("PAYHOOK_CALLBACK_ALLOW_UNSIGNED", "true".to_owned()),
    ]);
    let (mut child, address) = spawn_example(&example_env);
    let url = format!("http://{address}");
    let body = with(
        TRANSACTION_VALIDATION,
        "/paymentData/amount",
        Some(json!(5000)),
    );
    let validation = exchange(
        address,
        &post(
            VALIDATION_PATH,
            &[("content-type", "application/json")],
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(validation.message(), "validation postponed");

    let run = |args: Vec<String>, env: Vec<(String, String)>| async move {
        let output = tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_payhook"))
                .args(args)
                .env_clear()
                .envs(env)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        (
            output.status.code().unwrap(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    };
    let args = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let (code, out) = run(
        args(&["validations", "list", "--pending", "--admin-url", &url]),
        env.clone(),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("9007199254740993") && out.contains("pending"),
        "{out}"
    );
    let (code, out) = run(
        args(&[
            "validations",
            "resolve",
            "9007199254740993",
            "--deny",
            "--description",
            "manual",
            "--admin-url",
            &url,
        ]),
        env.clone(),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("denied (recorded)"), "{out}");
    let reference = payment.reference_id.to_string();
    let (code, out) = run(
        args(&["reconcile", "--ref", &reference, "--admin-url", &url]),
        env.clone(),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("booked now"), "{out}");
    // Several at once: each asked and told in turn, one the aggregator does not know.
    let unknown = "00000000-0000-0000-0000-000000000000";
    let reconcile_both = args(&[
        "reconcile",
        "--ref",
        &reference,
        "--ref",
        unknown,
        "--admin-url",
        &url,
    ]);
    let (code, out) = run(reconcile_both.clone(), env.clone()).await;
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(&format!("{reference}: already acknowledged")),
        "{out}"
    );
    assert!(out.contains(&format!("{unknown}: NOT reconciled")), "{out}");
    // Without the token, a clear refusal.
    let env_with_token = env.clone();
    let no_token: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k != "PAYHOOK_ADMIN_TOKEN")
        .collect();
    let (code, out) = run(
        args(&["validations", "list", "--admin-url", &url]),
        no_token,
    )
    .await;
    assert_eq!(code, 2);
    assert!(out.contains("PAYHOOK_ADMIN_TOKEN"), "{out}");
    // A service that does not answer: every transaction is told, not only the first (the
    // rest were left untold), and told as unknown — not as "NOT reconciled", which invites
    // booking by hand what a service that stopped answering may have booked.
    child.kill();
    let (code, out) = run(reconcile_both, env_with_token).await;
    assert_eq!(code, 2, "{out}");
    for id in [reference.as_str(), unknown] {
        assert!(
            out.contains(&format!("{id}: outcome unknown"))
                && out.contains("run reconcile again to see"),
            "{out}"
        );
    }
}

#[test]
fn the_admin_client_sends_its_token_in_the_clear_only_to_loopback() {
    let token = || payhook::Secret::new(TOKEN);
    let refused = payhook::admin::AdminClient::new("http://203.0.113.5:8080", token()).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("plain http is allowed only on a loopback host"),
        "{refused}"
    );
    for allowed in [
        "http://127.0.0.1:8080",
        "http://localhost:8080/",
        "https://ops.example:8443",
    ] {
        assert!(
            payhook::admin::AdminClient::new(allowed, token()).is_ok(),
            "{allowed}"
        );
    }
}

/// The `payhook` binary run with `args` against the service at `url` (`--admin-url`), with
/// the token and nothing else in its environment; off the runtime.
async fn payhook_at(url: &str, args: &[&str]) -> std::process::Output {
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.extend(["--admin-url".to_owned(), url.to_owned()]);
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_payhook"))
            .args(&args)
            .env_clear()
            .env("PAYHOOK_ADMIN_TOKEN", TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Answers every request on `listener` with `status` and `body` once it has read the whole
/// request (headers and `Content-Length` bytes): a proxy in front of the service.
async fn answer_all(listener: tokio::net::TcpListener, status: u16, body: &'static str) {
    answer_each(listener, status, move |_| body.to_owned()).await;
}

/// [`answer_all`] with the body `body` makes of each request's text.
async fn answer_each(
    listener: tokio::net::TcpListener,
    status: u16,
    body: impl Fn(&str) -> String,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut read = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = socket.read(&mut buf).await.unwrap();
            read.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&read).to_ascii_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if read.len() >= end + 4 + length {
                    break;
                }
            }
            assert!(n > 0, "the request ended early");
        }
        let body = body(&String::from_utf8_lossy(&read));
        let answer = format!(
            "HTTP/1.1 {status} Whatever\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await.unwrap();
    }
}

/// A reconcile through `--admin-url` whose answer never came from the service — a proxy that
/// gave up waiting (502, 504: payhook sends neither) — is told as of unknown outcome, to be
/// run again, not as "NOT reconciled": the service may have booked it meanwhile, and an
/// operator who books by hand on that word books it twice. The service's own refusal stays
/// "NOT reconciled".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_a_proxy_gave_up_on_is_told_of_unknown_outcome() {
    let id = "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e";
    for (status, body, said) in [
        (504, "<html>gateway timeout</html>", "outcome unknown"),
        (502, "<html>bad gateway</html>", "outcome unknown"),
        (
            409,
            r#"{"message":"reconcile needs a complete [gateway] section"}"#,
            "NOT reconciled",
        ),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(answer_all(listener, status, body));
        let output = payhook_at(&url, &["reconcile", "--ref", id]).await;
        let out = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(2), "{status}: {out}");
        assert!(
            out.contains(&format!("{id}: {said}")),
            "{status}: {out}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A proxy's error page that echoes the request — its `Authorization` header with it — is
/// printed without the token, and cut short: the command line's output lands on terminals
/// and in CI logs. (It was printed whole, token and all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_echoes_the_request_is_printed_without_the_token() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(answer_each(listener, 400, |request| {
        format!(
            "<html><pre>{request}</pre>{}</html>",
            "padding ".repeat(1000)
        )
    }));
    let output = payhook_at(&url, &["callbacks", "failing"]).await;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{printed}");
    assert!(
        printed.contains("authorization: Bearer ***")
            || printed.contains("Authorization: Bearer ***"),
        "{printed}"
    );
    assert!(!printed.contains(TOKEN), "{printed}");
    assert!(printed.len() < 1_500, "{} bytes: {printed}", printed.len());
}
