//! A callback whose handler keeps failing is visible while the aggregator's retries are
//! still coming: counted per (nonce, status) with its reason in the store, listed by the
//! operating API, counted in `/metrics`, and forgotten once it is finally booked.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::config::StoreConfig;
use payhook::model::TransactionStatus;
use payhook::store::{CallbackFailure, DedupStore, SledStore, Store};
use serde_json::{Value, json};
use support::*;

const TOKEN: &str = "admin-token-0123456789";

async fn failing(server: &TestServer) -> Vec<Value> {
    failing_at(server, "/payhook/admin/callbacks/failing").await
}

async fn failing_at(server: &TestServer, path: &str) -> Vec<Value> {
    let response = admin_get(server, path).await;
    assert_eq!(response.status, 200, "{}", response.message());
    response.json().as_array().unwrap().clone()
}

async fn admin_get(server: &TestServer, path: &str) -> RawResponse {
    server
        .send(&request(
            "GET",
            path,
            &[("Authorization", &format!("Bearer {TOKEN}"))],
            None,
        ))
        .await
}

async fn deliver(server: &TestServer, nonce: &str, client: &str) -> u16 {
    let body = with(CALLBACK, "/nonce", Some(json!(nonce)));
    let body = with(&body, "/clientId", Some(json!(client)));
    server
        .send(&post(
            CALLBACK_PATH,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ))
        .await
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_callbacks_are_listed_counted_and_forgotten_once_booked() {
    let mut config = test_config();
    config.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(config).await;

    assert_eq!(deliver(&server, "f-1", "fail").await, 503);
    assert_eq!(deliver(&server, "f-1", "fail").await, 503);
    assert_eq!(deliver(&server, "r-1", "retry").await, 503);
    assert_eq!(deliver(&server, "ok-1", "client-42").await, 200);

    let listed = failing(&server).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let of = |nonce: &str| {
        listed
            .iter()
            .find(|f| f["nonce"] == nonce)
            .unwrap_or_else(|| panic!("{nonce} not listed: {listed:?}"))
            .clone()
    };
    let f1 = of("f-1");
    assert_eq!(f1["failures"], 2);
    let fixture: Value = serde_json::from_str(CALLBACK).unwrap();
    assert_eq!(f1["status"], fixture["transactionStatus"]);
    assert_eq!(
        f1["transactionReferenceId"],
        "0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e"
    );
    assert_eq!(f1["clientId"], "fail");
    assert!(f1["lastReason"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(
        !f1.to_string().contains("secret-detail"),
        "the handler's own error stays in the logs: {f1}"
    );
    assert!(
        of("r-1")["lastReason"]
            .as_str()
            .unwrap()
            .contains("ledger is being migrated")
    );
    // `limit`: only the latest.
    let latest = failing_at(&server, "/payhook/admin/callbacks/failing?limit=1").await;
    assert_eq!(latest.len(), 1, "{latest:?}");
    let last_failed = |f: &Value| f["lastFailedMs"].as_i64().unwrap();
    assert_eq!(
        last_failed(&latest[0]),
        listed.iter().map(last_failed).max().unwrap()
    );
    let refused = admin_get(&server, "/payhook/admin/callbacks/failing?limit=many").await;
    assert_eq!(refused.status, 400);
    assert!(refused.message().contains("limit"), "{}", refused.message());
    server
        .assert_metrics(&[
            "payhook_callbacks_failing 2",
            "payhook_callback_failures_total 3",
        ])
        .await;

    // The aggregator's next attempt finds the handler well again: booked, and forgotten.
    assert_eq!(deliver(&server, "f-1", "client-42").await, 200);
    let listed = failing(&server).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["nonce"], "r-1");
    server
        .assert_metrics(&["payhook_callbacks_failing 1"])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_durable_and_expire_with_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        path: dir.path().join("store"),
        retention: std::time::Duration::from_secs(60),
        ..StoreConfig::default()
    };
    let failure = |reason: &str| CallbackFailure {
        nonce: "n-1".into(),
        status: TransactionStatus::Success,
        reason: reason.into(),
        transaction_reference_id: uuid::Uuid::nil(),
        client_id: "client".into(),
        amount: rust_decimal::Decimal::new(1050, 2),
        currency: "EUR".into(),
        at: chrono::DateTime::from_timestamp_millis(1_000).unwrap(),
    };
    {
        let store = SledStore::open(&config, &[]).unwrap();
        store
            .record_callback_failure(failure("first"))
            .await
            .unwrap();
        store
            .record_callback_failure(failure(&"x".repeat(10_000)))
            .await
            .unwrap();
    }
    let store = SledStore::open(&config, &[]).unwrap();
    let listed = store.failing_callbacks().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].failures, 2);
    assert_eq!(listed[0].amount, "10.50");
    assert!(listed[0].last_reason.len() < 1_024, "reasons are bounded");
    let after_retention = chrono::Utc::now() + chrono::TimeDelta::seconds(61);
    assert_eq!(store.purge_expired(after_retention).await.unwrap(), 1);
    assert!(store.failing_callbacks().await.unwrap().is_empty());
}

/// A failure recorded before a restart is forgotten when the callback is booked after it:
/// the store looks for a record to forget only when it may hold one, and one kept from
/// before the restart counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_recorded_before_a_restart_is_forgotten_once_booked_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        path: dir.path().join("store"),
        ..StoreConfig::default()
    };
    let nonce = payhook::model::Nonce::from("n-1");
    {
        let store = SledStore::open(&config, &[]).unwrap();
        store
            .record_callback_failure(CallbackFailure {
                nonce: nonce.as_str().into(),
                status: TransactionStatus::Success,
                reason: "the ledger was down".into(),
                transaction_reference_id: uuid::Uuid::nil(),
                client_id: "client".into(),
                amount: rust_decimal::Decimal::new(1050, 2),
                currency: "EUR".into(),
                at: chrono::Utc::now(),
            })
            .await
            .unwrap();
        // A callback of another nonce, booked first: nothing of n-1's is touched.
        book(&store, &payhook::model::Nonce::from("n-2")).await;
        assert_eq!(store.failing_callbacks().await.unwrap().len(), 1);
    }
    let store = SledStore::open(&config, &[]).unwrap();
    assert_eq!(store.failing_callbacks().await.unwrap().len(), 1);
    book(&store, &nonce).await;
    assert!(
        store.failing_callbacks().await.unwrap().is_empty(),
        "the booked callback is still listed as failing"
    );
}

/// A booking that fails (here an effect aborts it) ends a shared store's claim with its
/// transaction, before the delivery records the failure: another delivery may book the pair
/// meanwhile, unseen by the record's check (its transaction still open). The failure is
/// then forgotten once that booking has had a handler's time, not counted as failing until
/// the retention sweep. The race is made certain by holding the failing count's table
/// locked, which the record's insert waits on after its check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_recorded_beside_a_booking_after_a_failed_one_is_forgotten() {
    let Some(db) = support::postgres::database("failure_beside_a_booking").await else {
        return;
    };
    let mut config = test_config();
    config.store = db.store_config(std::time::Duration::from_secs(3600));
    config.server.handler_timeout = std::time::Duration::from_secs(1);
    let store = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let other = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let server = TestServer::start_on(config, tempfile::tempdir().unwrap(), store).await;
    let locked = db.lock("callback_failures_count", "ACCESS EXCLUSIVE").await;
    let nonce = payhook::model::Nonce::from("n-beside");
    let beside = async {
        // The failed delivery's record waits on the lock, its check done.
        let waiting = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%{}.callback_failures %'",
            db.schema
        );
        db.until_counted(&waiting, "the failure's record waiting", || false)
            .await;
        book(&other, &nonce).await;
        locked.release().await;
    };
    let (status, ()) = tokio::join!(deliver(&server, "n-beside", "abort"), beside);
    assert_eq!(status, 503, "the aborted booking is not acknowledged");
    assert!(
        other.failing_callbacks().await.unwrap().is_empty(),
        "a booked pair is never listed"
    );
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while other.failing_count().await.unwrap() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the booked pair's failure is still counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    db.drop_schema().await;
}

/// Claims `nonce` and books it with no effects.
async fn book(store: &dyn Store, nonce: &payhook::model::Nonce) {
    let begin = store
        .begin_callback(
            nonce,
            TransactionStatus::Success,
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    let payhook::store::CallbackBegin::Claimed { claim, .. } = begin else {
        panic!("{nonce:?} was not claimed: {begin:?}");
    };
    store
        .finish_callback(
            nonce,
            claim,
            TransactionStatus::Success,
            payhook::store::Effects::default(),
        )
        .await
        .unwrap();
}

/// Runs the real `payhook` binary with only `env`; returns its exit code and stdout.
async fn payhook(args: &[&str], env: &[(&str, String)]) -> (i32, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_payhook"));
    command.args(args).env_clear().env("RUST_LOG", "error");
    for (name, value) in env {
        command.env(name, value);
    }
    // Off the runtime: the server under test keeps answering meanwhile.
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_lists_failing_callbacks_of_a_running_and_a_stopped_service() {
    let mut config = test_config();
    config.admin.token = Some(TOKEN.into());
    let server = TestServer::start_with(config).await;
    assert_eq!(deliver(&server, "f-cli-1", "fail").await, 503);
    assert_eq!(deliver(&server, "f-cli-1", "fail").await, 503);
    assert_eq!(deliver(&server, "f-cli\u{1b}[2J", "fail").await, 503);

    let url = format!("http://{}", server.addr);
    let (code, out) = payhook(
        &["callbacks", "failing", "--admin-url", &url],
        &[("PAYHOOK_ADMIN_TOKEN", TOKEN.to_owned())],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("f-cli-1 "))
        .unwrap_or_else(|| panic!("f-cli-1 not listed:\n{out}"));
    assert!(line.contains(" 2 "), "two failures: {line}");
    assert!(
        line.contains("0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e"),
        "{line}"
    );
    assert!(
        !out.contains('\u{1b}') && out.contains("f-cli\\u{1b}[2J"),
        "a nonce from the wire is printed escaped:\n{out}"
    );
    // Only the one that failed last.
    let (code, latest) = payhook(
        &[
            "callbacks",
            "failing",
            "--latest",
            "1",
            "--json",
            "--admin-url",
            &url,
        ],
        &[("PAYHOOK_ADMIN_TOKEN", TOKEN.to_owned())],
    )
    .await;
    assert_eq!(code, 0, "{latest}");
    let latest: Vec<Value> = serde_json::from_str(&latest).unwrap();
    assert_eq!(latest.len(), 1, "{latest:?}");
    let last_failed = |f: &Value| f["lastFailedMs"].as_i64().unwrap();
    let all = failing(&server).await;
    assert_eq!(
        last_failed(&latest[0]),
        all.iter().map(last_failed).max().unwrap()
    );

    // The wrong token is refused with the service's message, not a listing.
    let (code, _) = payhook(
        &["callbacks", "failing", "--admin-url", &url],
        &[("PAYHOOK_ADMIN_TOKEN", "not-the-token-0123456789".to_owned())],
    )
    .await;
    assert_ne!(code, 0);

    // Offline, on the stopped service's store: the same list.
    let mut server = server;
    server.shut_down();
    server.stopped().await;
    let data = std::mem::replace(&mut server.data, tempfile::tempdir().unwrap());
    drop(server);
    let store_path = data.path().join("store");
    let (code, offline) = payhook(
        &["callbacks", "failing"],
        &[("PAYHOOK_STORE_PATH", store_path.display().to_string())],
    )
    .await;
    assert_eq!(code, 0, "{offline}");
    assert_eq!(
        offline.lines().filter(|l| l.starts_with("f-cli")).count(),
        2,
        "{offline}"
    );
    drop(data);
}

/// An incident can leave more failing pairs than one answer should carry: the operating API
/// lists them a page at a time (1,000 without `limit`, at most 1,000 with it) and names the
/// next page in a `Link` header until the last; following the links lists each pair once,
/// in order. `payhook callbacks failing` reads every page, and `--latest N` as many as it
/// takes. An `after` that is not a cursor is refused with 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_s_failing_callbacks_are_listed_a_page_at_a_time() {
    const PAIRS: usize = 1_005;
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.admin.token = Some(TOKEN.into());
    config.store.path = data.path().join("store");
    let store = SledStore::open(&config.store, &[]).unwrap();
    let at = chrono::Utc::now();
    for i in 0..PAIRS {
        store
            .record_callback_failure(CallbackFailure {
                nonce: format!("n-{i:04}").into(),
                status: TransactionStatus::Success,
                reason: "handler failed".into(),
                transaction_reference_id: uuid::Uuid::nil(),
                client_id: "client".into(),
                amount: rust_decimal::Decimal::new(1050, 2),
                currency: "EUR".into(),
                // Ten a millisecond: pages end within a moment as well as between two.
                at: at - chrono::Duration::milliseconds(i64::try_from(i / 10).unwrap()),
            })
            .await
            .unwrap();
    }
    while store.failing_count().await.unwrap() < PAIRS {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let server = TestServer::start_on(config, data, store).await;
    let nonces = |page: &[Value]| {
        page.iter()
            .map(|f| f["nonce"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let expected: Vec<String> = (0..PAIRS).map(|i| format!("n-{i:04}")).collect();

    // Without `limit`: 1,000, then the rest through the link.
    let mut path = "/payhook/admin/callbacks/failing".to_owned();
    let mut listed = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let response = admin_get(&server, &path).await;
        assert_eq!(response.status, 200, "{}", response.message());
        let page = response.json().as_array().unwrap().clone();
        sizes.push(page.len());
        listed.extend(nonces(&page));
        let Some(link) = response.header("link") else {
            break;
        };
        assert!(link.ends_with(r#">; rel="next""#), "{link}");
        path = link[1..link.find('>').unwrap()].to_owned();
        assert!(
            path.starts_with("/payhook/admin/callbacks/failing?"),
            "{path}"
        );
    }
    assert_eq!(sizes, [1_000, 5]);
    assert_eq!(listed, expected);

    // A page of 7 at a time, a larger `limit` taken as 1,000.
    let mut path = "/payhook/admin/callbacks/failing?limit=7".to_owned();
    let mut listed = Vec::new();
    while let Some(next) = {
        let response = admin_get(&server, &path).await;
        let page = response.json().as_array().unwrap().clone();
        assert!(page.len() <= 7);
        listed.extend(nonces(&page));
        response
            .header("link")
            .map(|l| l[1..l.find('>').unwrap()].to_owned())
    } {
        path = next;
    }
    assert_eq!(listed, expected);
    let large = failing_at(&server, "/payhook/admin/callbacks/failing?limit=5000").await;
    assert_eq!(large.len(), 1_000);
    // A `limit` of 0 is taken as 1: a page of one, and the next linked.
    let least = admin_get(&server, "/payhook/admin/callbacks/failing?limit=0").await;
    assert_eq!(least.status, 200);
    assert_eq!(nonces(least.json().as_array().unwrap()), expected[..1]);
    let link = least.header("link").unwrap();
    assert!(
        link.starts_with("</payhook/admin/callbacks/failing?limit=1&after="),
        "{link}"
    );

    // Not base64; no time; a status that is not a number; a nonce with U+0000; a time
    // before any a store holds.
    for after in [
        "garbage",
        "bm90OmE",
        "MTcwMDAwMDAwMDAwMDAwMDpub3Q6bi0x",
        "MTcwMDAwMDAwMC4wMDAwMDAwMDA6NDphAGI",
        "LTMwMDAwMDAwMDAwMC4wMDAwMDAwMDA6NDpuLTE",
    ] {
        let refused = admin_get(
            &server,
            &format!("/payhook/admin/callbacks/failing?after={after}"),
        )
        .await;
        assert_eq!(refused.status, 400, "{after}");
        assert!(refused.message().contains("after"), "{}", refused.message());
    }

    // The command line reads every page, or as many as `--latest` takes.
    let url = format!("http://{}", server.addr);
    let token = [("PAYHOOK_ADMIN_TOKEN", TOKEN.to_owned())];
    let (code, out) = payhook(
        &["callbacks", "failing", "--json", "--admin-url", &url],
        &token,
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let all: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(nonces(&all), expected);
    let (code, out) = payhook(
        &[
            "callbacks",
            "failing",
            "--latest",
            "1002",
            "--json",
            "--admin-url",
            &url,
        ],
        &token,
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let latest: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(nonces(&latest), expected[..1_002]);
}

/// The admin client lists every failing pair once even when the listing moves under it: a
/// pair not yet read that fails again while the pages are read moves above them, and the
/// client reads the top again after the last page. Against a scripted service whose pages
/// hold two pairs each and where `n-b` fails again right after the first page is served.
/// A next link the client cannot follow is an error, not the end of the listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_client_lists_a_pair_that_fails_again_while_it_pages_once() {
    use payhook::store::{FailingCallback, FailingCursor};
    use std::sync::{Arc, Mutex};

    let now = chrono::Utc::now();
    let pair = |nonce: &str, seconds_ago: i64| FailingCallback {
        nonce: nonce.into(),
        status: 4,
        failures: 1,
        first_failed: now - chrono::Duration::seconds(seconds_ago),
        last_failed: now - chrono::Duration::seconds(seconds_ago),
        last_reason: "handler failed".into(),
        transaction_reference_id: uuid::Uuid::nil().to_string(),
        client_id: "client".into(),
        amount: "10.50".into(),
        currency: "EUR".into(),
    };
    // The service's pairs, in the listing's order, and how many pages it served.
    let listing = Arc::new(Mutex::new((
        vec![
            pair("n-e", 10),
            pair("n-d", 20),
            pair("n-c", 30),
            pair("n-b", 40),
            pair("n-a", 50),
        ],
        0,
    )));
    let served = listing.clone();
    let addr = serve_http(move |request| {
        let served = served.clone();
        async move {
            let query = request.uri().query().unwrap_or_default().to_owned();
            let after = query
                .split('&')
                .find_map(|p| p.strip_prefix("after="))
                .map(|token| token.parse::<FailingCursor>().unwrap());
            let mut state = served.lock().unwrap();
            let (pairs, pages) = &mut *state;
            let rest: Vec<FailingCallback> = pairs
                .iter()
                .filter(|p| after.as_ref().is_none_or(|c| c.precedes(p)))
                .cloned()
                .collect();
            let page: Vec<FailingCallback> = rest.iter().take(2).cloned().collect();
            let mut response = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(
                serde_json::to_vec(&page).unwrap(),
            )));
            if rest.len() > 2 {
                let next = FailingCursor::after(&page[1]);
                response.headers_mut().insert(
                    "link",
                    format!(
                        "</payhook/admin/callbacks/failing?limit=2&after={next}>; rel=\"next\""
                    )
                    .parse()
                    .unwrap(),
                );
            }
            *pages += 1;
            if *pages == 1 {
                // n-b, not read yet, fails again: it moves to the top, above the page read.
                let moved = pairs.remove(3);
                pairs.insert(
                    0,
                    FailingCallback {
                        failures: 2,
                        last_failed: now,
                        ..moved
                    },
                );
            }
            response
        }
    })
    .await;
    let client = payhook::admin::AdminClient::new(&format!("http://{addr}"), TOKEN.into()).unwrap();
    let listed = client.failing_callbacks().await.unwrap();
    let nonces: Vec<(&str, u32)> = listed
        .iter()
        .map(|f| (f.nonce.as_str(), f.failures))
        .collect();
    assert_eq!(
        nonces,
        [("n-b", 2), ("n-e", 1), ("n-d", 1), ("n-c", 1), ("n-a", 1)]
    );
    assert!(listing.lock().unwrap().1 > 2, "the top was read again");

    // A next link without a cursor the client reads.
    let addr = serve_http(|_| async {
        let mut response =
            hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from("[]")));
        response.headers_mut().insert(
            "link",
            "</payhook/admin/callbacks/failing?after=garbage>; rel=\"next\""
                .parse()
                .unwrap(),
        );
        response
    })
    .await;
    let client = payhook::admin::AdminClient::new(&format!("http://{addr}"), TOKEN.into()).unwrap();
    let refused = client.failing_callbacks().await.unwrap_err().to_string();
    assert!(refused.contains("no cursor"), "{refused}");
}

/// The line logged for each delivery not booked says why: a handler that failed is an
/// error; one that asked to be called again later is a warning, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_says_why_a_callback_was_not_booked() {
    let logs = captured_logs(tracing::Level::WARN);
    let server = TestServer::start().await;
    assert_eq!(deliver(&server, "why-failed", "fail").await, 503);
    assert_eq!(deliver(&server, "why-retry", "retry").await, 503);
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let line_of = |nonce: &str| {
        text.lines()
            .find(|line| line.contains("callback not booked") && line.contains(nonce))
            .unwrap_or_else(|| panic!("no line for {nonce} in:\n{text}"))
            .to_owned()
    };
    let failed = line_of("why-failed");
    assert!(
        failed.contains("ERROR") && failed.contains("its handler failed"),
        "{failed}"
    );
    let retry = line_of("why-retry");
    assert!(
        retry.contains("WARN")
            && retry.contains("its handler asked to be called again later")
            && retry.contains("ledger is being migrated"),
        "{retry}"
    );
}

/// Books each callback with an effect on PostgreSQL; the first delivery's effect waits,
/// holding its booking open, until the test lets it go on to COMMIT.
struct HeldOpen {
    reached: tokio::sync::mpsc::UnboundedSender<()>,
    go: std::sync::Arc<tokio::sync::Notify>,
    held_once: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl payhook::handler::CallbackReceiver for HeldOpen {
    async fn receive_callback(
        &self,
        _callback: payhook::model::CallbackBody,
        ctx: payhook::handler::CallbackContext,
    ) -> Result<payhook::handler::CallbackDecision, payhook::HandlerError> {
        let hold = !self
            .held_once
            .swap(true, std::sync::atomic::Ordering::SeqCst);
        let (reached, go) = (self.reached.clone(), std::sync::Arc::clone(&self.go));
        ctx.effects.postgres(move |conn| {
            let (reached, go) = (reached.clone(), std::sync::Arc::clone(&go));
            Box::pin(async move {
                sqlx::query("SELECT 1").execute(&mut *conn).await?;
                if hold {
                    let _ = reached.send(());
                    go.notified().await;
                }
                Ok(())
            })
        });
        Ok(payhook::handler::CallbackDecision::Ack)
    }
}

/// On PostgreSQL, a delivery that waits a whole handler timeout for its pair's booking in
/// flight gives up (503) and records the pair as failing, beside that booking, whose mark
/// it cannot see before the commit. Once the booking commits, the failure goes: neither
/// listed nor counted (an alert on the count would otherwise fire for a booked callback
/// until the retention sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_gave_up_waiting_for_a_booking_leaves_no_failure_once_it_commits() {
    use std::sync::Arc;
    use std::time::Duration;
    let Some(db) = support::postgres::database("gave_up_waiting").await else {
        return;
    };
    let mut config = test_config();
    config.store = db.store_config(Duration::from_secs(3600));
    config.server.handler_timeout = Duration::from_secs(1);
    let store = payhook::store::PgStore::open(&config.store, &[])
        .await
        .unwrap();
    let (reached_tx, mut reached) = tokio::sync::mpsc::unbounded_channel();
    let go = Arc::new(tokio::sync::Notify::new());
    let app = payhook::App::builder(config)
        .shared_store(Arc::new(store.clone()))
        .callback_receiver(HeldOpen {
            reached: reached_tx,
            go: Arc::clone(&go),
            held_once: Arc::default(),
        })
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payhook::serve(listener, app, std::future::pending()));
    let request = post(
        CALLBACK_PATH,
        &[("Content-Type", "application/json")],
        CALLBACK.as_bytes(),
    );
    let first = tokio::spawn({
        let request = request.clone();
        async move { exchange(addr, &request).await }
    });
    tokio::time::timeout(DEADLINE, reached.recv())
        .await
        .unwrap()
        .unwrap();
    // The aggregator's retry meets the booking in flight for a whole handler timeout.
    let second = exchange(addr, &request).await;
    assert_eq!(second.status, 503, "{}", second.message());
    assert_eq!(
        store.failing_count().await.unwrap(),
        1,
        "recorded as failing"
    );
    go.notify_one();
    let first = tokio::time::timeout(DEADLINE, first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.status, 200, "{}", first.message());
    // Looked at again once the booking has had a handler's time: gone.
    let limit = tokio::time::Instant::now() + DEADLINE;
    while store.failing_count().await.unwrap() > 0 {
        assert!(
            tokio::time::Instant::now() < limit,
            "the booked pair is still counted as failing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.failing_callbacks().await.unwrap().is_empty());
    db.drop_schema().await;
}
