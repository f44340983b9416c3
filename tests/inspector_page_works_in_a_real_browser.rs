//! The inspector's page in a real browser (headless Chromium over WebDriver) against a real
//! service and the fake aggregator: the token opens it, a callback and a postponed
//! validation appear without a reload, a held result is marked resolved, **Approve** is
//! clicked, the result reaches the
//! aggregator, and the page shows it delivered; logging out ends the session, and a
//! `#token=` link logs in again. A panel of buttons that act on money is not
//! rebuilt under the pointer: a click lands on the validation the operator pointed at. A
//! booking whose answer a proxy lost (504, a dropped connection, an unreadable success) is
//! told as of unknown outcome, never as booked nor as refused; an answer that is not the
//! service's fragment is shown as text, never written into the page. An Approve of a
//! validation approved elsewhere meanwhile says so.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/setup` installs them). Without
//! them the test says it was skipped, and why; under `CI` it fails instead.
//! `PAYHOOK_SCREENSHOT=path.png` keeps a screenshot of the page (the README's).
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use payhook::signature::Algorithm;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use support::gateway::FakeGateway;
use support::webdriver::Browser;
use support::*;

const TOKEN: &str = "admin-token-0123456789";

/// A browser, or `None` (said so) where there is none and `CI` is unset.
async fn browser() -> Option<Browser> {
    match Browser::start().await {
        Ok(browser) => Some(browser),
        Err(why) if std::env::var_os("CI").is_none() => {
            announce_skip("inspector_page_works_in_a_real_browser", &why);
            None
        }
        Err(why) => panic!("CI runs the browser test: {why}"),
    }
}

/// A service whose validations are Awaitable, with its operating API, and the fake
/// aggregator it delivers to.
async fn awaitable_service() -> (FakeGateway, TestServer) {
    let gateway = FakeGateway::start().await;
    let mut config = signed_config(&["rsa2048"]);
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(config).await;
    (gateway, server)
}

/// [`awaitable_service`] with an operator of their own token (`[admin.operators]`), a viewer
/// (`admin.viewers`) or not.
async fn operators_service(name: &str, token: &str, viewer: bool) -> (FakeGateway, TestServer) {
    let gateway = FakeGateway::start().await;
    let mut config = signed_config(&["rsa2048"]);
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    config.validation.allow_unauthenticated = true;
    config.admin.token = Some(TOKEN.into());
    config.admin.operators = [(
        name.to_owned(),
        payhook::server::OperatorToken::digest_of(token),
    )]
    .into();
    if viewer {
        config.admin.viewers = vec![name.to_owned()];
    }
    let server = TestServer::start_with(config).await;
    (gateway, server)
}

/// Opens the inspector of `server` in `browser`, with the token.
async fn log_in(browser: &Browser, server: &TestServer) {
    log_in_at(browser, server.addr).await;
}

/// Opens the inspector served at `addr` (the service, or a proxy in front of it).
async fn log_in_at(browser: &Browser, addr: SocketAddr) {
    log_in_with(browser, addr, TOKEN).await;
}

/// Opens the inspector served at `addr` with `token`, shared or an operator's.
async fn log_in_with(browser: &Browser, addr: SocketAddr, token: &str) {
    let page = format!("http://{addr}/payhook/admin/inspector");
    browser.goto(&page).await;
    let field = browser.wait_for("input#token").await;
    browser.type_into(&field, token).await;
    browser.wait_and_click("button#login").await;
    browser.wait_for("section#health dd#store-state").await;
}

#[tokio::test]
async fn a_postponed_validation_is_approved_on_the_page_and_shown_delivered() {
    let Some(browser) = browser().await else {
        return;
    };
    let (gateway, server) = awaitable_service().await;

    // Without a session the page asks for the token.
    log_in(&browser, &server).await;
    assert!(browser.page_text().await.contains("No delivery yet."));

    // A callback arrives: the page lists it without being reloaded.
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let callback = signed_callback(&signer, "n-seen-live", 4, "12.5", "client-42");
    assert_eq!(server.send(&callback).await.status, 200);
    let text = browser.wait_for_text("tr.delivery.booked").await;
    assert!(text.contains("n-seen-live"), "{text}");
    assert!(text.contains("verified (key rsa2048)"), "{text}");

    // A callback whose handler fails: listed as failing, with the way to book it by hand.
    let failing = signed_callback(&signer, "n-failing", 4, "3", "fail");
    assert_eq!(server.send(&failing).await.status, 503);
    let text = browser.wait_for_text("tr.failing").await;
    assert!(
        text.contains("n-failing") && text.contains("book now"),
        "{text}"
    );
    browser.wait_for("tr.delivery.failed").await;
    // Booking it by hand finds no such transaction at the aggregator: the page says so.
    browser
        .wait_and_click("tr.failing button[data-action=book]")
        .await;
    let told = browser.accept_alert().await;
    assert!(told.contains("error") && told.contains("404"), "{told}");

    // A result the merchant holds: listed until a person says it is resolved (the page asks
    // first), then gone from the panel.
    let hold = signed_callback(&signer, "n-held", 4, "7", "hold");
    assert_eq!(server.send(&hold).await.status, 200);
    let text = browser.wait_for_text("tr.unresolved").await;
    assert!(
        text.contains("n-held") && text.contains("the test merchant holds client hold"),
        "{text}"
    );
    browser
        .wait_and_click("tr.unresolved button[data-action=resolve][data-nonce='n-held']")
        .await;
    let asked = browser.answer_prompt("Dana (ops)").await;
    assert!(
        asked.contains("n-held") && asked.contains("Your name"),
        "{asked}"
    );
    let asked = browser.answer_prompt("paid back by hand").await;
    assert!(asked.contains("Nothing is booked"), "{asked}");
    browser.hover("h1").await;
    browser.wait_for_none("tr.unresolved").await;
    assert_eq!(
        server.resolution_of("n-held").await,
        (
            "paid back by hand".to_owned(),
            Some("Dana (ops)".to_owned())
        )
    );
    assert!(
        browser
            .page_text()
            .await
            .contains("No held result waits for a person.")
    );

    // A validation is postponed: it appears with Approve and Deny.
    let id = server.postpone_validation().await;
    let description = format!("input.description[data-id='{id}']");
    let typed = browser.wait_and_type(&description, "checked by hand").await;
    // The page refreshes its panels every second: what was typed is kept.
    assert_eq!(
        browser
            .property_once_rendered_again(&description, &typed, "value")
            .await,
        "checked by hand"
    );
    browser
        .wait_and_click(&format!("button[data-action=approve][data-id='{id}']"))
        .await;

    // The decision reaches the aggregator, and the page shows it delivered.
    gateway
        .until("the approved result", |s| s.results.contains_key(&id))
        .await;
    assert_eq!(
        gateway.with(|s| s.results[&id].clone()),
        (true, "checked by hand".to_owned())
    );
    // With the shared token, kept with the name given when resolving, which the header's
    // field took.
    assert_eq!(browser.property("input#by", "value").await, "Dana (ops)");
    let store = server.app.store().unwrap();
    let record = store.postponed(id.into()).await.unwrap().unwrap();
    assert_eq!(
        record.result.unwrap().decided_by.as_deref(),
        Some("Dana (ops)")
    );
    let text = browser
        .wait_for_text(&format!("tr.outbox.delivered[data-id='{id}']"))
        .await;
    assert!(text.contains("approved checked by hand"), "{text}");
    // The panel of validations is rebuilt once the pointer has left it: no longer waiting.
    browser.hover("h1").await;
    browser.wait_for_none("tr.pending").await;

    if let Some(path) = std::env::var_os("PAYHOOK_SCREENSHOT") {
        std::fs::write(path, browser.screenshot().await).unwrap();
    }

    // Logging out ends the session: the page asks for the token again. A link with the
    // token in its fragment (never sent, so in no log) logs in, and leaves no token in the
    // address.
    browser.wait_and_click("button#logout").await;
    browser.wait_for("input#token").await;
    log_in_by_link(&browser, &server).await;
    // Nor in the history: the entry the link made was rewritten before the form left.
    browser.back().await;
    let before = browser.url().await;
    assert!(!before.contains("token"), "the history kept {before}");
    browser.quit().await;
}

/// With one token shared by every operator, who denies a validation is the name typed once
/// in the page's header: remembered in the browser across sessions, and kept with the
/// decision; cleared, the decision is kept with none.
#[tokio::test]
async fn a_decision_with_the_shared_token_is_kept_with_the_name_typed_in_the_header() {
    let Some(browser) = browser().await else {
        return;
    };
    let (gateway, server) = awaitable_service().await;
    let store = server.app.store().unwrap();
    log_in(&browser, &server).await;
    browser.wait_and_type("input#by", "Erin").await;

    // Another session in the same browser: the name is still there.
    browser.wait_and_click("button#logout").await;
    browser.wait_for("input#token").await;
    log_in(&browser, &server).await;
    assert_eq!(browser.property("input#by", "value").await, "Erin");
    let denied = server.postpone_validation().await;
    browser
        .wait_and_click(&format!("button[data-action=deny][data-id='{denied}']"))
        .await;
    gateway
        .until("the denied result", |s| s.results.contains_key(&denied))
        .await;
    let record = store.postponed(denied.into()).await.unwrap().unwrap();
    let result = record.result.unwrap();
    assert!(!result.success);
    assert_eq!(result.decided_by.as_deref(), Some("Erin"));

    browser.clear("input#by").await;
    assert_eq!(browser.property("input#by", "value").await, "");
    let approved = server.postpone_another_validation("nonce-tv-2", 42).await;
    // The panel under the pointer is not rebuilt: away from it, it shows the new one.
    browser.hover("h1").await;
    browser
        .wait_and_click(&format!(
            "button[data-action=approve][data-id='{approved}']"
        ))
        .await;
    gateway
        .until("the approved result", |s| s.results.contains_key(&approved))
        .await;
    let record = store.postponed(approved.into()).await.unwrap().unwrap();
    assert_eq!(record.result.unwrap().decided_by, None);
    browser.quit().await;
}

/// Opens the inspector of `server` in `browser` with a `#token=…` link, as `payhook demo
/// --inspect` prints it: the link fills the form and leaves the address; **Open** logs in.
async fn log_in_by_link(browser: &Browser, server: &TestServer) {
    let page = format!("http://{}/payhook/admin/inspector", server.addr);
    browser.goto(&format!("{page}#token={TOKEN}")).await;
    browser.wait_for("input#token").await;
    address_cleaned(browser, &page).await;
    browser.wait_and_click("button#login").await;
    browser.wait_for("section#health dd#store-state").await;
}

/// Waits (a few seconds at most) until the browser's address is `page`: the fragment with
/// the token taken out of it (a fragment-only navigation is handled after `goto` returns).
async fn address_cleaned(browser: &Browser, page: &str) {
    let mut shown = browser.url().await;
    for _ in 0..50 {
        if shown == page {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        shown = browser.url().await;
    }
    assert_eq!(shown, page, "the token left in the address");
}

/// Another site's page can open the inspector with a token of its choosing in the
/// fragment, as often as it likes: the link fills the form, it does not send it, so no
/// guess of the operator's is spent (each one sent would be, posted by the inspector's own
/// page). After twelve such links the operator still logs in.
#[tokio::test]
async fn a_link_with_a_token_fills_the_form_and_spends_no_guess() {
    let Some(browser) = browser().await else {
        return;
    };
    let (_gateway, server) = awaitable_service().await;
    let page = format!("http://{}/payhook/admin/inspector", server.addr);
    for n in 0..12 {
        browser.goto("about:blank").await;
        browser
            .goto(&format!("{page}#token=wrong-token-{n:02}-0123456789"))
            .await;
        browser.wait_for("input#token").await;
        address_cleaned(&browser, &page).await;
    }
    // Not submitted: still the form, and no answer of a wrong token on it.
    let text = browser.page_text().await;
    assert!(!text.contains("wrong"), "{text}");
    assert!(!text.contains("too many"), "{text}");
    log_in(&browser, &server).await;
    browser.quit().await;
}

/// Three validations wait; the operator points at the second one's **Approve**. Meanwhile
/// the first is decided elsewhere (the command line, another page, a deadline): the panel,
/// rebuilt every second, would move the third one's button under the pointer. It is not
/// rebuilt while the pointer is over it, so the click approves the second one.
#[tokio::test]
async fn a_click_lands_on_the_validation_pointed_at_while_others_are_decided() {
    let Some(browser) = browser().await else {
        return;
    };
    let (gateway, server) = awaitable_service().await;
    for id in 1..=3 {
        let body = with(
            &with(
                TRANSACTION_VALIDATION,
                "/merchantData/clientId",
                Some(serde_json::json!("postpone")),
            ),
            "/validationId",
            Some(serde_json::json!(id)),
        );
        let body = with(
            &body,
            "/paymentData/nonce",
            Some(serde_json::json!(format!("n-{id}"))),
        );
        assert_eq!(server.post_json(VALIDATION_PATH, &body).await.status, 200);
    }
    log_in_by_link(&browser, &server).await;
    browser
        .hover("button[data-action=approve][data-id='2']")
        .await;
    let bearer = format!("Bearer {TOKEN}");
    let decided = server
        .send(&request(
            "POST",
            "/payhook/admin/validations/1",
            &[
                ("content-type", "application/json"),
                ("authorization", &bearer),
            ],
            Some(br#"{"success": false, "description": "decided elsewhere"}"#),
        ))
        .await;
    assert_eq!(decided.status, 200, "{}", decided.message());
    // Two of the page's refreshes.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    browser.click_where_the_pointer_is().await;
    gateway
        .until("the approved result", |s| s.results.contains_key(&2))
        .await;
    assert!(gateway.with(|s| s.results[&2].0), "approved");
    assert!(
        !gateway.with(|s| s.results.contains_key(&3)),
        "the third validation was decided by a click meant for the second"
    );
    let pending = server
        .send(&request(
            "GET",
            "/payhook/admin/validations?state=pending",
            &[("authorization", &bearer)],
            None,
        ))
        .await
        .json();
    let ids: Vec<i64> = pending
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["validation_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [3], "{pending}");
    browser.quit().await;
}

/// An operator who opened the page with a token of their own (`[admin.operators]`) is named
/// on it, is not asked who they are, and what they resolve or approve is kept with their
/// name.
#[tokio::test]
async fn an_operator_acts_on_the_page_under_their_own_name_without_being_asked() {
    let Some(browser) = browser().await else {
        return;
    };
    const DANA: &str = "phop_dana-token-for-the-browser-0123456789";
    let (gateway, server) = operators_service("Dana", DANA, false).await;
    log_in_with(&browser, server.addr, DANA).await;
    assert_eq!(browser.wait_for_text("#operator").await, "Dana");
    assert!(
        browser.find_all("input#by").await.is_empty(),
        "no name to type: the token names her"
    );

    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let hold = signed_callback(&signer, "n-held", 4, "7", "hold");
    assert_eq!(server.send(&hold).await.status, 200);
    browser
        .wait_and_click("tr.unresolved button[data-action=resolve][data-nonce='n-held']")
        .await;
    let asked = browser.answer_prompt("paid back by hand").await;
    assert!(
        asked.contains("Nothing is booked"),
        "the first question is the note, not the name: {asked}"
    );
    browser.hover("h1").await;
    browser.wait_for_none("tr.unresolved").await;
    assert_eq!(
        server.resolution_of("n-held").await,
        ("paid back by hand".to_owned(), Some("Dana".to_owned()))
    );
    let store = server.app.store().unwrap();

    let id = server.postpone_validation().await;
    browser
        .wait_and_click(&format!("button[data-action=approve][data-id='{id}']"))
        .await;
    gateway
        .until("the approved result", |s| s.results.contains_key(&id))
        .await;
    let record = store.postponed(id.into()).await.unwrap().unwrap();
    assert_eq!(record.result.unwrap().decided_by.as_deref(), Some("Dana"));
    browser.quit().await;
}

/// A viewer's page (`admin.viewers`) shows what waits, and no button that acts on it.
#[tokio::test]
async fn a_viewers_page_shows_no_button_that_acts() {
    let Some(browser) = browser().await else {
        return;
    };
    const CAROL: &str = "phop_carol-token-for-the-browser-0123456789";
    let (_gateway, server) = operators_service("Carol", CAROL, true).await;
    server.postpone_validation().await;
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let hold = signed_callback(&signer, "n-held", 4, "7", "hold");
    assert_eq!(server.send(&hold).await.status, 200);
    log_in_with(&browser, server.addr, CAROL).await;
    assert_eq!(
        browser.wait_for_text("#operator").await,
        "Carol (may look, not change)"
    );
    let pending = browser.wait_for_text("tr.pending").await;
    assert!(pending.contains("nonce-tv-1"), "{pending}");
    let held = browser.wait_for_text("tr.unresolved").await;
    assert!(held.contains("n-held"), "{held}");
    for shown in [&pending, &held] {
        for action in ["Approve", "Deny", "resolved"] {
            assert!(
                !shown.contains(action),
                "a viewer's page shows {action}: {shown}"
            );
        }
    }
    assert!(browser.page_text().await.contains("Log out"));
    browser.quit().await;
}

/// The operator types a description and points at **Approve**; meanwhile the validation is
/// approved elsewhere (the command line, another page) with a description of its own. The
/// click is answered 200 "unchanged": the page says the validation was already decided so
/// and that the aggregator gets the description recorded then — not silence, which read as
/// the operator's own approval, description and all.
#[tokio::test]
async fn an_approve_of_a_validation_approved_elsewhere_meanwhile_says_so() {
    let Some(browser) = browser().await else {
        return;
    };
    let (gateway, server) = awaitable_service().await;
    let id = server.postpone_validation().await;
    log_in(&browser, &server).await;
    let description = format!("input.description[data-id='{id}']");
    browser.wait_and_type(&description, "mine").await;
    browser
        .hover(&format!("button[data-action=approve][data-id='{id}']"))
        .await;
    let decided = server
        .send(&request(
            "POST",
            &format!("/payhook/admin/validations/{id}"),
            &[
                ("content-type", "application/json"),
                ("authorization", &format!("Bearer {TOKEN}")),
            ],
            Some(br#"{"success": true, "description": "decided elsewhere"}"#),
        ))
        .await;
    assert_eq!(decided.status, 200, "{}", decided.message());
    browser.click_where_the_pointer_is().await;
    let told = browser.accept_alert().await;
    assert!(
        told.contains(&format!("Validation {id} was already decided so"))
            && told.contains("unchanged")
            && told.contains("not the one typed here"),
        "{told}"
    );
    gateway
        .until("the approved result", |s| s.results.contains_key(&id))
        .await;
    assert_eq!(
        gateway.with(|s| s.results[&id].clone()),
        (true, "decided elsewhere".to_owned())
    );
    browser.quit().await;
}

/// Clicks a delivery's **request** and waits (at most the page's deadline) for the detail
/// box to show `expected`; what it shows then.
async fn detail_shown(browser: &Browser, expected: &str) -> String {
    browser
        .wait_and_click("tr.delivery button[data-action=detail]")
        .await;
    let started = std::time::Instant::now();
    let mut shown = String::new();
    while shown != expected && started.elapsed() < support::webdriver::PAGE_DEADLINE {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        shown = browser.wait_for_text("#detail").await;
    }
    shown
}

/// How the proxy in front of the service loses the answer to a request of the page, once the
/// service has answered it (what the service did is done).
#[derive(Clone, Copy, Debug)]
enum Lost {
    /// The proxy gave up waiting: 504, with its own page.
    GaveUp,
    /// The connection closed without an answer.
    Dropped,
    /// A 200 whose body is not the service's.
    Unreadable,
}

/// Which answers the proxy loses: those to requests whose path holds `path`.
type Losing = Arc<Mutex<Option<(&'static str, Lost)>>>;

/// A proxy on loopback in front of `service`: forwards each request, and loses the answers
/// `losing` names.
async fn lossy_proxy(service: SocketAddr, losing: Losing) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<Incoming>();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (client, losing) = (client.clone(), Arc::clone(&losing));
            let forward =
                hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                    let client = client.clone();
                    let lost = match *losing.lock().unwrap() {
                        Some((path, lost)) if request.uri().path().contains(path) => Some(lost),
                        _ => None,
                    };
                    async move {
                        let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
                        *request.uri_mut() = format!("http://{service}{target}").parse().unwrap();
                        let answer = client
                            .request(request)
                            .await
                            .map_err(std::io::Error::other)?;
                        let Some(lost) = lost else {
                            return Ok(
                                answer.map(|body| body.map_err(std::io::Error::other).boxed())
                            );
                        };
                        // The service's whole answer is in: whatever it did is done.
                        answer
                            .into_body()
                            .collect()
                            .await
                            .map_err(std::io::Error::other)?;
                        let own = |status: u16, text: &'static str| {
                            let body = Full::new(Bytes::from_static(text.as_bytes()))
                                .map_err(|never| match never {});
                            hyper::Response::builder()
                                .status(status)
                                .header("content-type", "text/html")
                                .body(BoxBody::new(body))
                                .unwrap()
                        };
                        match lost {
                            Lost::GaveUp => Ok(own(504, "<b id=injected>gateway timeout</b>")),
                            Lost::Dropped => {
                                Err(std::io::Error::other("the proxy dropped the answer"))
                            }
                            Lost::Unreadable => Ok(own(200, "<html>ok</html>")),
                        }
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), forward),
            );
        }
    });
    addr
}

/// A proxy between the page and the service loses the answer to **book now** after the
/// service booked: it gave up (504), it dropped the connection, or its 200 is not the
/// service's. Each time the page says the outcome is unknown and that pressing again books
/// nothing twice — not "booked", not a bare status, not silence — and the booking shows as
/// done once the panel is rebuilt. An answer to **request** that is not the service's
/// fragment is shown as text, not written into the page.
#[tokio::test]
async fn a_booking_whose_answer_a_proxy_lost_is_told_of_unknown_outcome() {
    let Some(browser) = browser().await else {
        return;
    };
    let (gateway, server) = awaitable_service().await;
    let losing: Losing = Arc::default();
    let proxy = lossy_proxy(server.addr, Arc::clone(&losing)).await;
    log_in_at(&browser, proxy).await;
    let signer = fixture_signer("rsa2048", Algorithm::RsaPkcs1Sha256);
    let now = chrono::Utc::now().to_rfc3339();
    for (n, (lost, why)) in [
        (Lost::GaveUp, "(504 from a proxy)"),
        (Lost::Dropped, "(no answer: "),
        (Lost::Unreadable, "(the answer could not be read)"),
    ]
    .into_iter()
    .enumerate()
    {
        let nonce = format!("n-lost-{n}");
        let reference = format!("0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5{n}");
        gateway.with(|s| {
            s.transactions.insert(
                reference.clone(),
                serde_json::json!({
                    "id": 2000 + n, "transactionReferenceId": reference, "providerId": 11,
                    "providerName": "Card", "merchantClientId": "client-42", "accountData": {},
                    "nonce": nonce, "amount": 7.5, "currency": "EUR", "transactionType": 1,
                    "transactionStatus": 4, "transactionStatusMessage": "Success",
                    "callbackDeliveryStatus": "Failed", "isCallbackSendingCanceled": true,
                    "createdUtc": now, "updatedUtc": now
                }),
            )
        });
        let body = [
            ("/nonce", nonce.as_str()),
            ("/transactionReferenceId", reference.as_str()),
            ("/clientId", "fail"),
        ]
        .into_iter()
        .fold(CALLBACK.to_owned(), |body, (at, value)| {
            with(&body, at, Some(serde_json::json!(value)))
        });
        assert_eq!(server.send(&signed_post(&signer, &body)).await.status, 503);
        let book = format!("tr.failing button[data-action=book][data-reference='{reference}']");
        *losing.lock().unwrap() = Some(("/reconcile", lost));
        browser.wait_and_click(&book).await;
        let told = browser.accept_alert().await;
        assert!(
            told.starts_with(&format!("Outcome unknown {why}"))
                && told.contains("press book now again to see (it books nothing twice)"),
            "{lost:?}: {told}"
        );
        // The service did book it: gone from the failing panel once it is rebuilt.
        browser.hover("h1").await;
        browser.wait_for_none(&book).await;
    }

    *losing.lock().unwrap() = Some(("/inspector/delivery/", Lost::GaveUp));
    assert_eq!(
        detail_shown(&browser, "Not shown: 504").await,
        "Not shown: 504"
    );
    // A 200 that is not the service's fragment (a proxy's login page): text too.
    *losing.lock().unwrap() = Some(("/inspector/delivery/", Lost::Unreadable));
    let expected = "Not shown: 200, not the service's answer";
    assert_eq!(detail_shown(&browser, expected).await, expected);
    assert!(browser.find_all("#detail b#injected").await.is_empty());
    browser.quit().await;
}
