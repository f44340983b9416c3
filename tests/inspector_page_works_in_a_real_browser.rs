//! The inspector's page in a real browser (headless Chromium over WebDriver) against a real
//! service and the fake aggregator: the token opens it, a callback and a postponed
//! validation appear without a reload, **Approve** is clicked, the result reaches the
//! aggregator, and the page shows it delivered.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/setup` installs them). Without
//! them the test says it was skipped, and why; under `CI` it fails instead.
//! `PAYHOOK_SCREENSHOT=path.png` keeps a screenshot of the page (the README's).
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::signature::Algorithm;
use support::gateway::FakeGateway;
use support::webdriver::Browser;
use support::*;

const TOKEN: &str = "admin-token-0123456789";

#[tokio::test]
async fn a_postponed_validation_is_approved_on_the_page_and_shown_delivered() {
    let browser = match Browser::start().await {
        Ok(browser) => browser,
        Err(why) if std::env::var_os("CI").is_none() => {
            announce_skip("inspector_page_works_in_a_real_browser", &why);
            return;
        }
        Err(why) => panic!("CI runs the browser test: {why}"),
    };
    let gateway = FakeGateway::start().await;
    let mut config = signed_config(&["rsa2048"]);
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    config.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(config).await;
    let page = format!("http://{}/payhook/admin/inspector", server.addr);

    // Without a session the page asks for the token.
    browser.goto(&page).await;
    let token = browser.wait_for("input#token").await;
    browser.type_into(&token, TOKEN).await;
    browser.wait_and_click("button#login").await;
    browser.wait_for("section#health dd#store-state").await;
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
    let text = browser
        .wait_for_text(&format!("tr.outbox.delivered[data-id='{id}']"))
        .await;
    assert!(text.contains("approved checked by hand"), "{text}");
    assert!(
        browser.find_all("tr.pending").await.is_empty(),
        "no longer waiting"
    );

    if let Some(path) = std::env::var_os("PAYHOOK_SCREENSHOT") {
        std::fs::write(path, browser.screenshot().await).unwrap();
    }
    browser.quit().await;
}
