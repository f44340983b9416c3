//! Awaitable (postponed) validation end to end against a fake aggregator on loopback: the
//! answer, the Resolver (first decision wins), the outbox worker through failures, conflicts
//! made visible, and — on tokio's paused clock — the time budget and the deadline.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use payhook::handler::{RequestContext, TransactionValidator, ValidationDecision};
use payhook::model::TransactionValidationRequest;
use payhook::postponed::{Decision, Delivery, PostponedState, ResolveError, Resolved, Resolver};
use payhook::{App, Config, HandlerError};
use serde_json::json;
use std::time::Duration;
use support::gateway::FakeGateway;
use support::{TRANSACTION_VALIDATION, TestServer, VALIDATION_PATH, test_config, with};

const ID: i64 = 9_007_199_254_740_993;

fn awaitable_config(gateway: &FakeGateway) -> Config {
    let mut config = test_config();
    config.gateway = gateway.config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.validation.retry_schedule = vec![Duration::from_millis(10), Duration::from_millis(30)];
    config
}

/// Postpones validation [`ID`] (nonce `nonce`) on `server`, then allows it: its result is
/// queued for the outbox. The app's resolver.
async fn postponed_then_allowed(server: &TestServer, nonce: &str) -> Resolver {
    let body = validation("postpone", nonce, ID);
    assert_eq!(server.post_json(VALIDATION_PATH, &body).await.status, 200);
    let resolver = server.app.resolver().unwrap();
    resolver
        .resolve(ID, Decision::allow("approved"))
        .await
        .unwrap();
    resolver
}

/// [`awaitable_config`] with its store in `dir`.
fn stored_config(gateway: &FakeGateway, dir: &tempfile::TempDir) -> Config {
    let mut config = awaitable_config(gateway);
    config.store.path = dir.path().join("store");
    config
}

/// The validation request of client `client`, with its own nonce and validation id.
fn validation(client: &str, nonce: &str, id: i64) -> String {
    let body = with(
        TRANSACTION_VALIDATION,
        "/merchantData/clientId",
        Some(json!(client)),
    );
    let body = with(&body, "/paymentData/nonce", Some(json!(nonce)));
    with(&body, "/validationId", Some(json!(id)))
}

/// Runs a pass of the server's outbox and checks that it posted nothing; returns the outbox.
async fn nothing_left_to_send(server: &TestServer) -> payhook::postponed::Outbox {
    let outbox = server.app.outbox().unwrap();
    let pass = outbox.run_once().await.unwrap();
    assert_eq!(
        (pass.delivered, pass.conflicts, pass.retried),
        (0, 0, 0),
        "{pass:?}"
    );
    outbox
}

async fn state_of(server: &TestServer, id: i64, wanted: PostponedState) {
    state_in(&server.app, id, wanted).await;
}

/// Waits until validation `id` of `app` is `wanted`.
async fn state_in(app: &App, id: i64, wanted: PostponedState) {
    let resolver = app.resolver().unwrap();
    let deadline = tokio::time::Instant::now() + support::DEADLINE;
    loop {
        let record = resolver.get(id).await.unwrap();
        if record.as_ref().is_some_and(|r| r.state() == wanted) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "validation {id} never reached {wanted:?}: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_postponed_validation_is_answered_200_and_its_decision_reaches_the_gateway_once() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    let body = validation("postpone", "n-await-1", ID);
    let response = server.post_json(VALIDATION_PATH, &body).await;
    assert_eq!(
        (response.status, response.message()),
        (200, "validation postponed".into())
    );
    // A repeat gets the same answer without the handler.
    let again = server.post_json(VALIDATION_PATH, &body).await;
    assert_eq!(
        (again.status, again.message()),
        (200, "validation postponed".into())
    );
    assert_eq!(server.merchant.calls().len(), 1);

    let resolver = server.app.resolver().unwrap();
    let pending = resolver.list(Some(PostponedState::Pending)).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].validation_id, ID.into());
    assert_eq!(pending[0].request.merchant_data.client_id, "postpone");
    assert!(
        gateway.with(|s| s.posts.is_empty()),
        "nothing is sent before a decision"
    );

    let resolved = resolver
        .resolve(ID, Decision::allow("documents checked"))
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Recorded);
    state_of(&server, ID, PostponedState::Delivered).await;
    assert_eq!(
        gateway.with(|s| s.results.get(&ID).cloned()),
        Some((true, "documents checked".to_owned()))
    );

    // The same decision again changes nothing; a different one is refused before sending.
    assert_eq!(
        resolver
            .resolve(ID, Decision::allow("checked twice"))
            .await
            .unwrap(),
        Resolved::Unchanged
    );
    let refused = resolver
        .resolve(ID, Decision::deny("changed my mind"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            ResolveError::Conflict {
                recorded_success: true,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(matches!(
        resolver.resolve(12345, Decision::allow("")).await,
        Err(ResolveError::Unknown(id)) if id.get() == 12345
    ));
    // Nothing is left to send: a pass of the outbox posts nothing more.
    let outbox = nothing_left_to_send(&server).await;
    let counts = outbox.counts();
    assert_eq!((counts.delivered, counts.retries), (1, 0), "{counts:?}");
    assert_eq!(
        gateway.with(|s| s.posts.clone()),
        [(ID, true, 200)],
        "delivered exactly once"
    );
}

#[tokio::test]
async fn allow_and_deny_in_awaitable_mode_are_answered_at_once_and_posted_as_results() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    let allowed = server
        .post_json(VALIDATION_PATH, &validation("client-42", "n-a", 1))
        .await;
    assert_eq!(allowed.status, 200);
    let denied = server
        .post_json(VALIDATION_PATH, &validation("deny", "n-d", 2))
        .await;
    assert_eq!(
        (denied.status, denied.message()),
        (403, "client is blocked".into())
    );
    gateway
        .until("both results", |s| s.results.len() == 2)
        .await;
    assert_eq!(
        gateway
            .with(|s| s.results.clone())
            .into_iter()
            .collect::<Vec<_>>(),
        [
            (1, (true, "client allowed".to_owned())),
            (2, (false, "client is blocked".to_owned()))
        ]
    );
}

#[tokio::test]
async fn a_validation_asked_about_again_under_a_new_id_gets_its_result_posted_for_each_id() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    let postponed = (200, "validation postponed".to_owned());
    for id in [101, 102] {
        let response = server
            .post_json(VALIDATION_PATH, &validation("postpone", "n-again", id))
            .await;
        assert_eq!((response.status, response.message()), postponed);
    }
    assert_eq!(server.merchant.calls().len(), 1, "the handler decides once");
    let resolver = server.app.resolver().unwrap();
    let pending = resolver.list(Some(PostponedState::Pending)).await.unwrap();
    let pending: Vec<_> = pending
        .iter()
        .map(|p| (p.validation_id.get(), p.repeat_of.map(|o| o.get())))
        .collect();
    assert_eq!(pending, [(101, None), (102, Some(101))]);

    // The merchant decides the validation its handler saw: the aggregator gets the result
    // under both ids, each once.
    assert_eq!(
        resolver
            .resolve(101, Decision::allow("documents checked"))
            .await
            .unwrap(),
        Resolved::Recorded
    );
    state_of(&server, 101, PostponedState::Delivered).await;
    state_of(&server, 102, PostponedState::Delivered).await;
    let checked = (true, "documents checked".to_owned());
    assert_eq!(
        gateway
            .with(|s| s.results.clone())
            .into_iter()
            .collect::<Vec<_>>(),
        [(101, checked.clone()), (102, checked)]
    );
    // Asked again under either id: the same answer, nothing more posted.
    for id in [101, 102] {
        let response = server
            .post_json(VALIDATION_PATH, &validation("postpone", "n-again", id))
            .await;
        assert_eq!((response.status, response.message()), postponed);
    }
    nothing_left_to_send(&server).await;
    let mut posts = gateway.with(|s| s.posts.clone());
    posts.sort_unstable();
    assert_eq!(posts, [(101, true, 200), (102, true, 200)]);

    // Allowed at once, then asked about again under a new id: that id's result is posted
    // as well, without the handler.
    let calls = server.merchant.calls().len();
    for id in [201, 202] {
        let response = server
            .post_json(VALIDATION_PATH, &validation("client-42", "n-allowed", id))
            .await;
        assert_eq!(
            (response.status, response.message()),
            (200, "client allowed".into())
        );
    }
    assert_eq!(server.merchant.calls().len(), calls + 1);
    gateway
        .until("both ids' results", |s| {
            s.results.contains_key(&201) && s.results.contains_key(&202)
        })
        .await;
    assert_eq!(
        gateway.with(|s| s.results.get(&202).cloned()),
        Some((true, "client allowed".to_owned()))
    );
    // The same nonce for another payment is still refused, under any id.
    let other = with(
        &validation("client-42", "n-allowed", 203),
        "/paymentData/amount",
        Some(json!(99_999)),
    );
    assert_eq!(server.post_json(VALIDATION_PATH, &other).await.status, 403);
    assert!(resolver.get(203).await.unwrap().is_none());
}

/// A validation asked about under more new validation ids than one postponed validation
/// takes (100): each of the first hundred gets the original's result posted under its own
/// id; the next is refused with 409. It was answered 200 "postponed" with nothing stored for
/// its id, and the aggregator waited for a result that was never posted. A retry of one of
/// the hundred is still answered.
#[tokio::test]
async fn a_repeat_beyond_the_hundred_one_validation_takes_is_refused_rather_than_left_waiting() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    for id in 1000..=1100 {
        let response = server
            .post_json(VALIDATION_PATH, &validation("postpone", "n-many", id))
            .await;
        assert_eq!(
            (response.status, response.message().as_str()),
            (200, "validation postponed"),
            "validation {id}"
        );
    }
    let refused = server
        .post_json(VALIDATION_PATH, &validation("postpone", "n-many", 1101))
        .await;
    assert_eq!(
        (refused.status, refused.message().as_str()),
        (
            409,
            "this nonce's validation was asked about under more than 100 new validation ids; no result can be posted for validation 1101"
        )
    );
    assert_eq!(server.merchant.calls().len(), 1, "the handler decides once");
    let resolver = server.app.resolver().unwrap();
    assert!(resolver.get(1101).await.unwrap().is_none());
    let retried = server
        .post_json(VALIDATION_PATH, &validation("postpone", "n-many", 1100))
        .await;
    assert_eq!(
        (retried.status, retried.message().as_str()),
        (200, "validation postponed")
    );
    assert_eq!(
        resolver.get(1000).await.unwrap().unwrap().repeats.len(),
        100
    );

    // The original decided: every id answered 200 gets its result, and 1101 none.
    resolver
        .resolve(1000, Decision::allow("documents checked"))
        .await
        .unwrap();
    gateway
        .until("the hundred and one results", |s| s.results.len() == 101)
        .await;
    let ids: Vec<i64> = gateway.with(|s| s.results.keys().copied().collect());
    assert_eq!(ids, (1000..=1100).collect::<Vec<_>>());
}

/// A nonce decided while the endpoint was not Awaitable, asked about again once it is: no
/// postponed validation holds its decision, and it is answered as recorded — a retry of
/// the validation that took it (its answer lost in the restart that turned the mode on)
/// gets its 200, not a refusal; a denied one its 403. The 200, which the aggregator now
/// takes as a validation to wait on, comes with a result posted for the id: the approval
/// is recorded afresh under it. A denial, which nothing waits on, records nothing.
#[tokio::test]
async fn a_validation_decided_before_awaitable_mode_is_answered_as_recorded() {
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut immediate = stored_config(&gateway, &dir);
    immediate.validation.awaitable = false;
    let before = App::builder(immediate)
        .transaction_validator(Deliberate)
        .build()
        .unwrap();
    let allowed = (200, "client allowed".to_owned());
    let denied = (403, "refused after review".to_owned());
    assert_eq!(
        validate_nonce(&before, "allow-0", "n-allowed", 401).await,
        allowed
    );
    assert_eq!(
        validate_nonce(&before, "deny-0", "n-denied", 402).await,
        denied
    );
    drop(before);

    let after = deliberate_app(&gateway, &dir);
    assert_eq!(
        validate_nonce(&after, "allow-0", "n-allowed", 401).await,
        allowed
    );
    assert_eq!(
        validate_nonce(&after, "deny-0", "n-denied", 402).await,
        denied
    );
    assert_eq!(
        validate_nonce(&after, "deny-0", "n-denied", 404).await,
        denied
    );
    state_in(&after, 401, PostponedState::Delivered).await;
    assert_eq!(
        gateway
            .with(|s| s.results.clone())
            .into_iter()
            .collect::<Vec<_>>(),
        [(401, (true, "client allowed".to_owned()))]
    );
    let resolver = after.resolver().unwrap();
    for id in [402, 404] {
        assert!(resolver.get(id).await.unwrap().is_none(), "validation {id}");
    }
}

/// A nonce postponed before, asked about again under a new id when no record holds its
/// decision any more — its postponed validation went with the retention while the nonce's
/// record stayed (a sweep between the two reads of a repeat), or an older payhook kept no
/// link to it — is refused (409): answered "postponed", the aggregator would wait for ever
/// on a result nothing posts. Staged by removing the postponed validation's record from
/// the stopped store.
#[tokio::test]
async fn a_postponed_validation_whose_record_is_gone_is_refused_under_a_new_id() {
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = deliberate_app(&gateway, &dir);
    let postponed = (200, "validation postponed".to_owned());
    assert_eq!(
        validate_nonce(&app, "postpone", "n-gone", 601).await,
        postponed
    );
    drop(app);
    remove_postponed(&dir, 601).await;
    let app = deliberate_app(&gateway, &dir);
    let (status, message) = validate_nonce(&app, "postpone", "n-gone", 602).await;
    assert_eq!(status, 409, "{message}");
    assert!(
        message.contains("no record holds its decision any more")
            && message.contains("no result can be posted for validation 602"),
        "{message}"
    );
    // The same id again, the same answer: nothing was recorded for it.
    assert_eq!(validate_nonce(&app, "postpone", "n-gone", 602).await.0, 409);
}

/// Removes postponed validation `id`'s record from the stopped sled store in `dir`, as a
/// sweep past the retention removes it.
async fn remove_postponed(dir: &tempfile::TempDir, id: i64) {
    let db = support::once_let_go(|| sled::open(dir.path().join("store")), "lock").await;
    let tree = db.open_tree("payhook").unwrap();
    let record = [b"p\0".as_slice(), &id.to_be_bytes()].concat();
    assert!(tree.remove(record).unwrap().is_some());
    db.flush().unwrap();
}

/// A nonce approved in Awaitable mode, its result delivered and its postponed validation
/// gone with the retention while the nonce's record stayed, asked about under a new id: the
/// approval is answered 200, which the aggregator takes as a validation to wait on, so the
/// new id is recorded as approved and its result posted — the handler not run again. The
/// nonce's later repeats are that record's repeats, the validation that took the approval
/// among them: asked again, it gets the same result posted again. Staged by removing the
/// postponed validation's record from the stopped store.
#[tokio::test]
async fn an_approval_whose_record_is_gone_gets_a_result_under_a_new_id() {
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = deliberate_app(&gateway, &dir);
    let allowed = (200, "client allowed".to_owned());
    assert_eq!(
        validate_nonce(&app, "allow-0", "n-approved", 701).await,
        allowed
    );
    state_in(&app, 701, PostponedState::Delivered).await;
    drop(app);
    remove_postponed(&dir, 701).await;

    let app = deliberate_app(&gateway, &dir);
    assert_eq!(
        validate_nonce(&app, "allow-0", "n-approved", 702).await,
        allowed
    );
    state_in(&app, 702, PostponedState::Delivered).await;
    assert_eq!(
        gateway.with(|s| s.results[&702].clone()),
        (true, "client allowed".to_owned())
    );
    assert_eq!(
        validate_nonce(&app, "allow-0", "n-approved", 703).await,
        allowed
    );
    state_in(&app, 703, PostponedState::Delivered).await;
    let resolver = app.resolver().unwrap();
    let afresh = resolver.get(702).await.unwrap().unwrap();
    assert_eq!(afresh.repeats, [703.into()]);
    assert_eq!(
        resolver.get(703).await.unwrap().unwrap().repeat_of,
        Some(702.into())
    );

    assert_eq!(
        validate_nonce(&app, "allow-0", "n-approved", 701).await,
        allowed
    );
    state_in(&app, 701, PostponedState::Delivered).await;
    assert_eq!(
        resolver.get(701).await.unwrap().unwrap().repeat_of,
        Some(702.into())
    );
    let posted: Vec<(i64, bool, u16)> = gateway.with(|s| s.posts.clone());
    assert_eq!(
        posted,
        [701, 702, 703, 701].map(|id| (id, true, 200)),
        "the same result posted again is received"
    );
}

/// A validation under an id the service already holds for another nonce is refused (403),
/// before its handler runs: the aggregator never reuses an id, so one of the two is not
/// the aggregator's — a forgery sent ahead under a guessed id, on an endpoint open to
/// others. Answered "postponed", it had the aggregator wait for a result for the id, and
/// the outbox then posted the other payment's (the forger's approval for a withdrawal a
/// reviewer never saw). The first record stays as it was, and so does its delivery.
#[tokio::test]
async fn a_validation_under_an_id_held_for_another_nonce_is_refused_before_its_handler() {
    let gateway = FakeGateway::start().await;
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    postponed_then_allowed(&server, "forged-first").await;
    let calls = server.merchant.calls().len();
    let real = validation("postpone", "the-real-one", ID);
    let refused = server.post_json(VALIDATION_PATH, &real).await;
    assert_eq!(refused.status, 403, "{}", refused.message());
    assert_eq!(
        refused.message(),
        "validationId already used for a different payment"
    );
    assert_eq!(
        server.merchant.calls().len(),
        calls,
        "the handler did not run"
    );
    let kept = server
        .app
        .resolver()
        .unwrap()
        .get(ID)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.request.nonce().as_str(), "forged-first");
    // The same request again (the first's nonce) is its repeat, answered as before.
    let first = validation("postpone", "forged-first", ID);
    assert_eq!(server.post_json(VALIDATION_PATH, &first).await.status, 200);
}

#[tokio::test]
async fn a_403_from_the_gateway_ends_as_a_visible_conflict_and_is_not_retried() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| s.results.insert(ID, (false, "decided elsewhere".into())));
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    let resolver = postponed_then_allowed(&server, "n-conflict").await;
    state_of(&server, ID, PostponedState::Conflict).await;
    let record = resolver.get(ID).await.unwrap().unwrap();
    let result = record.result.unwrap();
    assert!(
        matches!(&result.delivery, Delivery::Conflict { attempts: 1, message, .. } if message.contains("different status")),
        "{result:?}"
    );
    assert_eq!(server.app.outbox().unwrap().conflicts(), 1);
    server
        .assert_metrics(&[
            "payhook_outbox_conflicts_total 1",
            "payhook_outbox_queued 0",
        ])
        .await;
    assert_eq!(
        resolver
            .list(Some(PostponedState::Conflict))
            .await
            .unwrap()
            .len(),
        1
    );
    // A 403 is final: a pass of the outbox does not post it again.
    let outbox = nothing_left_to_send(&server).await;
    assert_eq!(outbox.counts().retries, 0);
    assert_eq!(gateway.with(|s| s.posts.len()), 1, "a 403 is final");
}

/// A 403 that is not the aggregator's (no `{"message": …}` body: a role the merchant's
/// user lacks, a firewall) says nothing about the result: it is tried again, not recorded
/// as a conflict, which would leave the result undelivered for good.
#[tokio::test]
async fn a_403_without_the_aggregators_error_body_is_tried_again() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.bare_failures = true;
        s.fail_next.push_back(403);
    });
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    postponed_then_allowed(&server, "n-bare-403").await;
    state_of(&server, ID, PostponedState::Delivered).await;
    assert_eq!(
        gateway.with(|s| s.attempted.clone()),
        [ID, ID],
        "tried again"
    );
    assert_eq!(gateway.with(|s| s.posts.clone()), [(ID, true, 200)]);
    assert_eq!(server.app.outbox().unwrap().conflicts(), 0);
}

/// The aggregator answers 200 for a result received (spec 4.1): another 2xx — a 202 or a
/// 204 of a proxy or a gateway in between — does not say it has the result, and it is
/// posted again until a 200, not recorded as delivered.
#[tokio::test]
async fn a_2xx_other_than_200_is_not_taken_for_delivered() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        s.bare_failures = true;
        s.fail_next.extend([202, 204]);
    });
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    postponed_then_allowed(&server, "n-204").await;
    state_of(&server, ID, PostponedState::Delivered).await;
    assert_eq!(
        gateway.with(|s| s.attempted.clone()),
        [ID, ID, ID],
        "posted until a 200"
    );
    assert_eq!(gateway.with(|s| s.posts.clone()), [(ID, true, 200)]);
}

/// A 429 (or a 503) whose `Retry-After` asks the outbox to wait: the refused results are
/// not posted again before then, nor is any other — the aggregator would refuse them as
/// well — and the worker sleeps until the wait is over, also with more due than one read
/// of the store takes (256 on sled: the rest due at once, pass after pass, had it not).
#[tokio::test]
async fn a_retry_after_holds_every_post_back_until_it_is_over() {
    let gateway = FakeGateway::start().await;
    gateway.with(|s| {
        // The first few posted at once (8), each refused.
        s.fail_next.extend([429; 8]);
        s.retry_after = Some("120".into());
    });
    let dir = tempfile::tempdir().unwrap();
    let app = App::builder(stored_config(&gateway, &dir))
        .transaction_validator(Deliberate)
        .manual_background()
        .build()
        .unwrap();
    let (resolver, outbox) = (app.resolver().unwrap(), app.outbox().unwrap());
    for id in 1..=300 {
        assert_eq!(validate(&app, "postpone", id).await.0, 200);
        resolver
            .resolve(id, Decision::allow("approved"))
            .await
            .unwrap();
    }
    let before = chrono::Utc::now();
    let asked = chrono::TimeDelta::seconds(120);
    let refused = outbox.run_once().await.unwrap();
    assert_eq!((refused.delivered, refused.retried), (0, 8), "{refused:?}");
    let held_back = refused.held_back.expect("held back");
    assert!(
        held_back >= before + asked,
        "{held_back} for a 120 s wait from {before}"
    );
    assert_eq!(
        refused.next,
        Some(held_back),
        "the worker sleeps until the wait is over"
    );
    let Some(Delivery::Queued { next_attempt, .. }) = resolver
        .get(1)
        .await
        .unwrap()
        .unwrap()
        .result
        .map(|r| r.delivery)
    else {
        panic!("the refused result is queued again");
    };
    assert!(next_attempt >= before + asked, "{next_attempt}");

    // The pass the worker wakes for meanwhile (a result queued, its idle wait) posts
    // nothing and sleeps again until the same end.
    let waiting = outbox.run_once().await.unwrap();
    assert_eq!((waiting.delivered, waiting.retried), (0, 0), "{waiting:?}");
    assert_eq!(waiting.next, Some(held_back));
    assert_eq!(
        gateway.with(|s| s.attempted.len()),
        8,
        "nothing posted meanwhile"
    );
}

/// The next attempt waits from the end of the failed one, not its start: a post that took
/// longer than the wait (a slow aggregator, a timeout) is not tried again at once.
#[tokio::test]
async fn the_wait_before_the_next_attempt_runs_from_the_end_of_the_failed_one() {
    let gateway = FakeGateway::start().await;
    let post = Duration::from_millis(1_000);
    gateway.with(|s| {
        s.post_delay = post;
        s.fail_next.push_back(503);
    });
    let mut config = awaitable_config(&gateway);
    config.validation.retry_schedule = vec![Duration::from_secs(1)];
    let server = TestServer::start_with(config).await;
    let resolver = postponed_then_allowed(&server, "n-slow").await;
    let deadline = tokio::time::Instant::now() + support::DEADLINE;
    let (decided, next_attempt) = loop {
        let result = resolver.get(ID).await.unwrap().unwrap().result.unwrap();
        if let Delivery::Queued {
            attempts: 1,
            next_attempt,
            ..
        } = result.delivery
        {
            break (result.decided, next_attempt);
        }
        assert!(tokio::time::Instant::now() < deadline, "no failed attempt");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The post began after the decision and took `post`; the wait is 1 s less its jitter.
    let least = chrono::TimeDelta::from_std(post + Duration::from_millis(800)).unwrap();
    assert!(
        next_attempt - decided >= least,
        "next attempt {} after the decision",
        next_attempt - decided
    );
    state_of(&server, ID, PostponedState::Delivered).await;
}

#[tokio::test]
async fn the_outbox_retries_through_refused_connections_and_5xx_until_delivered() {
    let mut gateway = FakeGateway::start().await;
    let server = TestServer::start_with(awaitable_config(&gateway)).await;
    gateway.stop();
    let resolver = postponed_then_allowed(&server, "n-retry").await;
    // Wait until two attempts have failed against the closed port.
    let deadline = tokio::time::Instant::now() + support::DEADLINE;
    loop {
        let record = resolver.get(ID).await.unwrap().unwrap();
        if let Some(Delivery::Queued {
            attempts,
            last_error: Some(error),
            ..
        }) = record.result.map(|r| r.delivery)
            && attempts >= 2
        {
            assert!(error.contains("cannot reach"), "{error}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failed attempts recorded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Waiting for delivery: counted, its age since the decision shown.
    assert_eq!(server.metric("payhook_outbox_queued").await, Some(1.0));
    let age = server
        .metric("payhook_outbox_oldest_queued_age_seconds")
        .await
        .unwrap();
    assert!(age > 0.0, "{age}");
    gateway.with(|s| s.fail_next.extend([500, 503]));
    gateway.restart().await;
    state_of(&server, ID, PostponedState::Delivered).await;
    assert!(
        gateway.with(|s| s.fail_next.is_empty()),
        "both failures were answered"
    );
    assert_eq!(gateway.with(|s| s.posts.clone()), [(ID, true, 200)]);
    server
        .assert_metrics(&[
            "payhook_outbox_queued 0",
            "payhook_outbox_oldest_queued_age_seconds 0.0",
        ])
        .await;
}

#[tokio::test]
async fn awaitable_mode_needs_a_complete_gateway_section() {
    let mut config = test_config();
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    let error = App::builder(config)
        .transaction_validator(support::TestMerchant::default())
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("validation.awaitable") && error.contains("gateway.auth_url"),
        "{error}"
    );
}

// ------------------------------------------------------------ paused clock: budget, deadline

/// Decides after `client id` seconds: "allow-N" allows, "deny-N" denies, "fail-N" fails,
/// "postpone" postpones.
struct Deliberate;

impl TransactionValidator for Deliberate {
    async fn validate_transaction(
        &self,
        request: TransactionValidationRequest,
        _: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        let client = request.merchant_data.client_id.clone();
        if client == "postpone" {
            return Ok(ValidationDecision::Postpone);
        }
        let (verdict, seconds) = client.split_once('-').unwrap();
        tokio::time::sleep(Duration::from_secs(seconds.parse().unwrap())).await;
        if verdict == "fail" {
            return Err(HandlerError::msg("the risk service is down"));
        }
        Ok(if verdict == "allow" {
            ValidationDecision::Allow
        } else {
            ValidationDecision::deny("refused after review")
        })
    }
}

/// An Awaitable app (no socket: the paused clock would race real I/O) whose gateway is a
/// closed port.
fn paused_app(dir: &tempfile::TempDir, tweak: impl FnOnce(&mut Config)) -> App {
    let mut config = test_config();
    config.store.path = dir.path().join("store");
    config.validation.awaitable = true;
    // Its caller is this test, on loopback; not what the test is about.
    config.validation.allow_unauthenticated = true;
    config.gateway.auth_url = Some("http://127.0.0.1:1".into());
    config.gateway.gateway_url = Some("http://127.0.0.1:1".into());
    config.gateway.username = Some("shop".into());
    config.gateway.password = Some("pw".into());
    config.validation.time_budget = Duration::from_secs(2);
    config.server.handler_timeout = Duration::from_secs(60);
    tweak(&mut config);
    // The test drives the outbox itself, pass by pass, in paused time.
    App::builder(config)
        .transaction_validator(Deliberate)
        .manual_background()
        .build()
        .unwrap()
}

/// A transaction validation request as a server of one's own hands it to `App::handle`.
fn validation_request(client: &str, nonce: &str, id: i64) -> http::Request<Full<Bytes>> {
    http::Request::post(VALIDATION_PATH)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(validation(client, nonce, id))))
        .unwrap()
}

/// An Awaitable app deciding with [`Deliberate`], its store in `dir`.
fn deliberate_app(gateway: &FakeGateway, dir: &tempfile::TempDir) -> App {
    App::builder(stored_config(gateway, dir))
        .transaction_validator(Deliberate)
        .build()
        .unwrap()
}

async fn validate(app: &App, client: &str, id: i64) -> (u16, String) {
    validate_nonce(app, client, &format!("n-{id}"), id).await
}

/// [`validate`] with nonce `nonce`.
async fn validate_nonce(app: &App, client: &str, nonce: &str, id: i64) -> (u16, String) {
    let request = validation_request(client, nonce, id);
    let response = app.handle(request).await;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let message = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    (status, message)
}

#[tokio::test(start_paused = true)]
async fn a_handler_over_its_time_budget_is_answered_postponed_and_its_decision_posted_later() {
    let dir = tempfile::tempdir().unwrap();
    let app = paused_app(&dir, |_| {});
    let resolver = app.resolver().unwrap();

    // Within the budget: the decision is the answer, and it is queued as the result.
    assert_eq!(
        validate(&app, "allow-1", 1).await,
        (200, "client allowed".into())
    );
    assert_eq!(
        resolver.get(1).await.unwrap().unwrap().state(),
        PostponedState::Queued
    );

    // Over the budget: 200 (postponed) at once, the validation pending.
    assert_eq!(
        validate(&app, "deny-10", 2).await,
        (200, "validation postponed".into())
    );
    assert_eq!(
        resolver.get(2).await.unwrap().unwrap().state(),
        PostponedState::Pending
    );
    // When the handler decides, its decision becomes the result.
    tokio::time::sleep(Duration::from_secs(10)).await;
    tokio::task::yield_now().await;
    let record = loop {
        let record = resolver.get(2).await.unwrap().unwrap();
        if record.result.is_some() {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(record.state(), PostponedState::Queued);
    let result = record.result.unwrap();
    assert_eq!(
        (result.success, result.description.as_str()),
        (false, "refused after review")
    );

    // A handler that fails after its budget leaves no decision: nothing else would ever
    // decide, so the validation gets the deadline's outcome (a refusal by default).
    assert_eq!(
        validate(&app, "fail-10", 3).await,
        (200, "validation postponed".into())
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let record = loop {
        let record = resolver.get(3).await.unwrap().unwrap();
        if record.result.is_some() {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let result = record.result.unwrap();
    assert_eq!(
        (result.success, result.description.as_str()),
        (false, "validation timed out")
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_over_its_budget_decides_within_the_handler_timeout_counted_from_its_start() {
    // The budget (2 s) is part of the handler timeout (10 s), not added to it: a handler
    // that would allow at 11 s is stopped at 10 s, before a deadline (which must be later
    // than the handler timeout) could decide the validation while it still runs.
    let dir = tempfile::tempdir().unwrap();
    let app = paused_app(&dir, |config| {
        config.server.handler_timeout = Duration::from_secs(10);
        config.validation.deadline = Some(Duration::from_secs(11));
    });
    let resolver = app.resolver().unwrap();
    let start = tokio::time::Instant::now();
    assert_eq!(
        validate(&app, "allow-11", 4).await,
        (200, "validation postponed".into())
    );
    let record = loop {
        let record = resolver.get(4).await.unwrap().unwrap();
        if record.result.is_some() {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let decided_after = start.elapsed();
    let result = record.result.unwrap();
    assert_eq!(
        (result.success, result.description.as_str()),
        (false, "validation timed out"),
        "the handler was stopped at its timeout, not waited for until it allowed"
    );
    assert!(
        decided_after < Duration::from_secs(11),
        "decided at the handler timeout, before the deadline: {decided_after:?}"
    );
}

/// [`paused_app`] whose postponed validations have a deadline of 300 s.
fn app_with_deadline(dir: &tempfile::TempDir) -> App {
    paused_app(dir, |config| {
        config.validation.deadline = Some(Duration::from_secs(300));
    })
}

/// Asserts that validation `id` was decided by the deadline's outcome (a refusal).
async fn decided_by_the_deadline(resolver: &Resolver, id: i64) {
    let result = resolver.get(id).await.unwrap().unwrap().result.unwrap();
    assert_eq!(
        (result.success, result.description.as_str()),
        (false, "validation timed out"),
        "{id}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_undecided_validation_is_resolved_by_its_deadline_and_the_first_decision_wins() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_deadline(&dir);
    let resolver = app.resolver().unwrap();
    let outbox = app.outbox().unwrap();
    assert_eq!(
        validate(&app, "postpone", 7).await,
        (200, "validation postponed".into())
    );

    let early = outbox.run_once().await.unwrap();
    assert_eq!(early.expired, 0);
    let deadline = resolver.get(7).await.unwrap().unwrap().deadline.unwrap();
    assert_eq!(
        early.next,
        Some(deadline),
        "the worker wakes at the deadline"
    );

    tokio::time::advance(Duration::from_secs(301)).await;
    let pass = outbox.run_once().await.unwrap();
    assert_eq!(
        (pass.expired, pass.retried),
        (1, 1),
        "expired, then one failed delivery"
    );
    decided_by_the_deadline(&resolver, 7).await;
    assert!(matches!(
        resolver.resolve(7, Decision::allow("too late")).await,
        Err(ResolveError::Conflict {
            recorded_success: false,
            ..
        })
    ));
}

/// Postpones validation 20 (nonce `n-20`) on `app`, then has it asked about again under id
/// 21: a repeat of it.
async fn postponed_20_and_its_repeat_21(app: &App) {
    assert_eq!(
        validate(app, "postpone", 20).await,
        (200, "validation postponed".into())
    );
    let again = app.handle(validation_request("postpone", "n-20", 21)).await;
    assert_eq!(again.status(), 200);
    let repeat = app.resolver().unwrap().get(21).await.unwrap().unwrap();
    assert_eq!(repeat.repeat_of, Some(20.into()));
}

/// A repeat (the validation asked about again under a new id) has no deadline of its own:
/// a decision on it after the original's deadline comes too late as one on the original
/// would, since it decides both.
#[tokio::test(start_paused = true)]
async fn a_decision_on_a_repeat_after_its_originals_deadline_comes_too_late() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_deadline(&dir);
    let resolver = app.resolver().unwrap();
    postponed_20_and_its_repeat_21(&app).await;
    tokio::time::advance(Duration::from_secs(301)).await;
    let late = resolver.resolve(21, Decision::allow("checked, late")).await;
    assert!(
        matches!(
            &late,
            Err(ResolveError::Conflict {
                recorded_success: false,
                ..
            })
        ),
        "{late:?}"
    );
    for id in [20, 21] {
        decided_by_the_deadline(&resolver, id).await;
    }
}

/// A repeat whose record was damaged (a disk's fault, or a newer payhook's format read after
/// a downgrade) keeps neither its original from its deadline nor any other result from the
/// aggregator: the outbox's pass used to end at the damaged record, every pass, before any
/// post.
#[tokio::test(start_paused = true)]
async fn a_damaged_repeat_keeps_neither_its_original_from_its_deadline_nor_others_from_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_deadline(&dir);
    postponed_20_and_its_repeat_21(&app).await;
    assert_eq!(
        validate(&app, "postpone", 30).await,
        (200, "validation postponed".into())
    );
    let resolver = app.resolver().unwrap();
    resolver
        .resolve(30, Decision::allow("approved"))
        .await
        .unwrap();
    drop(resolver);
    drop(app);
    {
        // The repeat's record, no longer one: sled's own checks pass, payhook cannot read it.
        let db = support::sled_when_free(&dir.path().join("store"));
        let tree = db.open_tree("payhook").unwrap();
        let key = [&b"p\0"[..], &21i64.to_be_bytes()].concat();
        assert!(tree.get(&key).unwrap().is_some(), "the repeat's record");
        tree.insert(key, &b"{not a record"[..]).unwrap();
        db.flush().unwrap();
    }

    let app = app_with_deadline(&dir);
    let (resolver, outbox) = (app.resolver().unwrap(), app.outbox().unwrap());
    tokio::time::advance(Duration::from_secs(301)).await;
    let pass = outbox.run_once().await.unwrap();
    // The original is decided by its deadline; its result and validation 30's are posted
    // (to a closed port: each is to be tried again).
    assert_eq!((pass.expired, pass.retried), (1, 2), "{pass:?}");
    decided_by_the_deadline(&resolver, 20).await;
    for id in [20, 30] {
        let result = resolver.get(id).await.unwrap().unwrap().result.unwrap();
        assert!(
            matches!(result.delivery, Delivery::Queued { attempts: 1, .. }),
            "{id}: {:?}",
            result.delivery
        );
    }
    // An operator's decision on the damaged repeat is refused as the store's error, not
    // taken as a decision of the original.
    assert!(resolver.resolve(21, Decision::allow("late")).await.is_err());
}

/// A decision taken after the deadline, before the outbox's next pass applied it, comes too
/// late: the validation gets the deadline's outcome, and the reviewer is told so — it was
/// posted as if in time, though the merchant's cut-off had passed.
#[tokio::test(start_paused = true)]
async fn a_decision_after_the_deadline_comes_too_late_even_before_the_outbox_applied_it() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_deadline(&dir);
    let resolver = app.resolver().unwrap();
    assert_eq!(
        validate(&app, "postpone", 8).await,
        (200, "validation postponed".into())
    );
    tokio::time::advance(Duration::from_secs(301)).await;
    // No pass of the outbox since.
    let late = resolver.resolve(8, Decision::allow("checked, late")).await;
    assert!(
        matches!(
            &late,
            Err(ResolveError::Conflict {
                recorded_success: false,
                recorded_description,
                ..
            }) if recorded_description == "validation timed out"
        ),
        "{late:?}"
    );
    decided_by_the_deadline(&resolver, 8).await;
    // The deadline's own outcome asked for: unchanged, already so.
    assert_eq!(
        resolver.resolve(8, Decision::deny("no")).await.unwrap(),
        Resolved::Unchanged
    );
    // Before its deadline, a decision is taken as ever.
    assert_eq!(
        validate(&app, "postpone", 9).await,
        (200, "validation postponed".into())
    );
    assert_eq!(
        resolver
            .resolve(9, Decision::allow("in time"))
            .await
            .unwrap(),
        Resolved::Recorded
    );
}

/// Postpones, handing the validation to a reviewer that decides at once — before payhook
/// has written the postponed record.
struct FastReviewer {
    resolver: std::sync::Arc<std::sync::OnceLock<payhook::postponed::Resolver>>,
    decided: tokio::sync::mpsc::UnboundedSender<Result<Resolved, ResolveError>>,
}

impl TransactionValidator for FastReviewer {
    async fn validate_transaction(
        &self,
        request: TransactionValidationRequest,
        _: RequestContext,
    ) -> Result<ValidationDecision, HandlerError> {
        let resolver = self.resolver.get().unwrap().clone();
        let decided = self.decided.clone();
        tokio::spawn(async move {
            let outcome = resolver
                .resolve(
                    request.validation_id,
                    Decision::allow("approved by the fast lane"),
                )
                .await;
            let _ = decided.send(outcome);
        });
        // Give the reviewer the lead: it asks before the record is written.
        tokio::task::yield_now().await;
        Ok(ValidationDecision::Postpone)
    }
}

#[tokio::test]
async fn a_decision_taken_before_the_postponed_record_is_written_waits_for_it() {
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = stored_config(&gateway, &dir);
    let resolver = std::sync::Arc::new(std::sync::OnceLock::new());
    let (decided, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let app = App::builder(config)
        .transaction_validator(FastReviewer {
            resolver: std::sync::Arc::clone(&resolver),
            decided,
        })
        .build()
        .unwrap();
    resolver.set(app.resolver().unwrap().clone()).unwrap();

    assert_eq!(
        validate(&app, "client-1", 77).await,
        (200, "validation postponed".into())
    );
    let outcome = tokio::time::timeout(support::DEADLINE, outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(outcome, Ok(Resolved::Recorded)), "{outcome:?}");
    let record = app.resolver().unwrap().get(77).await.unwrap().unwrap();
    assert_eq!(record.state(), PostponedState::Queued);
    assert_eq!(
        record.result.unwrap().description,
        "approved by the fast lane"
    );
}

#[tokio::test]
async fn an_app_mounted_in_a_router_of_its_own_delivers_results_without_being_told_to() {
    // No `serve`, no `start_background`: the app answers through axum's router, and its
    // first request starts the outbox worker, so the decision still reaches the aggregator.
    use tower::ServiceExt;
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = deliberate_app(&gateway, &dir);
    let router = axum::Router::new().fallback_service(app);
    let request = http::Request::post(VALIDATION_PATH)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(validation(
            "allow-0",
            "n-mounted",
            ID,
        )))
        .unwrap();
    // The router stays alive, as a server's does (the app's worker stops with its last clone).
    let answer = router.clone().oneshot(request).await.unwrap();
    assert_eq!(answer.status(), 200);
    gateway
        .until("the decision posted by the mounted app", |s| {
            s.posts.len() == 1
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_answering_through_handle_delivers_and_lets_go_of_its_store_when_dropped() {
    // `App::handle`, the way a server of one's own calls it without `tower::Service`: its
    // first request starts the outbox worker too.
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = deliberate_app(&gateway, &dir);
    let request = validation_request("allow-0", "n-handle", ID);
    assert_eq!(app.handle(request).await.status(), 200);
    gateway
        .until("the decision posted by the app", |s| s.posts.len() == 1)
        .await;

    // Dropping the last clone of the app stops its worker, which held the store: the
    // directory can be opened again (sled lets one holder at a time).
    drop(app);
    let store_config = stored_config(&gateway, &dir).store;
    let reopened = payhook::store::SledStore::open(&store_config, &[]);
    assert!(reopened.is_ok(), "{:?}", reopened.err());
}

#[test]
fn a_worker_that_ended_with_its_runtime_is_started_again_by_the_next_request() {
    // The app's first request runs on a runtime that then shuts down, taking the outbox
    // worker with it; the next request, on another runtime, starts a new one, and both
    // decisions reach the aggregator.
    let main = tokio::runtime::Runtime::new().unwrap();
    let gateway = main.block_on(FakeGateway::start());
    let dir = tempfile::tempdir().unwrap();
    let app = deliberate_app(&gateway, &dir);
    let request = |nonce: &str, id: i64| validation_request("allow-0", nonce, id);
    let short_lived = tokio::runtime::Runtime::new().unwrap();
    let first = short_lived.block_on(app.handle(request("n-first", ID)));
    assert_eq!(first.status(), 200);
    drop(short_lived);

    main.block_on(async {
        let second = app.handle(request("n-second", ID + 1)).await;
        assert_eq!(second.status(), 200);
        gateway
            .until("both decisions posted", |s| s.results.len() == 2)
            .await;
    });
}

/// A retry of a repeat — the same new validation id, sent again while the first is being
/// written — is answered only once the repeat's record is durable: before, it was answered
/// on the record it read while the record was applied but not flushed, which a crash would
/// have lost with no result ever posted for that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_repeat_is_answered_only_once_the_repeat_is_durable() {
    use payhook::store::{HoldPoint, SledStore};
    use std::sync::atomic::{AtomicBool, Ordering};

    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = stored_config(&gateway, &dir);
    let store = SledStore::open(&config.store, &[]).unwrap();
    let server = TestServer::start_on(config, dir, store.clone()).await;
    let postponed = (200, "validation postponed".to_owned());
    let first = server
        .post_json(VALIDATION_PATH, &validation("postpone", "n-held", 201))
        .await;
    assert_eq!((first.status, first.message()), postponed);

    // The repeat's batch is applied (readable) but not flushed.
    let hold = store.hold_commits(HoldPoint::BeforeFlush);
    let repeat = validation("postpone", "n-held", 202);
    let released = AtomicBool::new(false);
    let (answer, (retry, answered_after_release)) =
        tokio::join!(server.post_json(VALIDATION_PATH, &repeat), async {
            let hold = tokio::task::spawn_blocking(move || {
                hold.wait_reached(1);
                hold
            })
            .await
            .unwrap();
            let retry = async {
                let answer = server.post_json(VALIDATION_PATH, &repeat).await;
                (answer, released.load(Ordering::SeqCst))
            };
            let release = async {
                // Time for the retry to overtake the held flush, if it can.
                tokio::time::sleep(Duration::from_millis(300)).await;
                released.store(true, Ordering::SeqCst);
                hold.release();
            };
            tokio::join!(retry, release).0
        });
    assert_eq!((answer.status, answer.message()), postponed);
    assert_eq!((retry.status, retry.message()), postponed);
    assert!(
        answered_after_release,
        "the retry was answered before the repeat's record was durable"
    );
    let resolver = server.app.resolver().unwrap();
    let repeated = resolver.get(202).await.unwrap().unwrap();
    assert_eq!(repeated.repeat_of.map(|id| id.get()), Some(201));
}

/// [`a_validation_under_an_id_held_for_another_nonce_is_refused_before_its_handler`] when the
/// other payment's validation writes the id after the check made before the handler: the
/// nonce's own repeat meets it at the store, and is refused (403) with nothing linked. It
/// was answered 200 with the nonce's recorded decision, and the aggregator, which waits for
/// a result under that id, then got the other payment's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_under_an_id_another_payment_takes_meanwhile_is_refused() {
    use payhook::store::{HoldPoint, SledStore};

    let logs = support::captured_logs(tracing::Level::INFO);
    let gateway = FakeGateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = stored_config(&gateway, &dir);
    let store = SledStore::open(&config.store, &[]).unwrap();
    let server = TestServer::start_on(config, dir, store.clone()).await;
    let first = server
        .post_json(VALIDATION_PATH, &validation("postpone", "race-first", 301))
        .await;
    assert_eq!(first.status, 200);

    // Another payment's validation under 302: its record staged, not applied, so that the
    // check before the handler does not see it.
    let hold = store.hold_commits(HoldPoint::BeforeApply);
    let other = validation("postpone", "race-other", 302);
    let repeat = validation("postpone", "race-first", 302);
    let (other, refused) = tokio::join!(server.post_json(VALIDATION_PATH, &other), async {
        let hold = tokio::task::spawn_blocking(move || {
            hold.wait_reached(1);
            hold
        })
        .await
        .unwrap();
        // The repeat past the check, its nonce's recorded decision read; then the other's
        // batch goes on, the repeat's behind it or after it.
        let (refused, ()) = tokio::join!(server.post_json(VALIDATION_PATH, &repeat), async {
            let deadline = tokio::time::Instant::now() + support::DEADLINE;
            loop {
                let said = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
                if said
                    .lines()
                    .any(|line| line.contains("race-first") && line.contains("repeated validation"))
                {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the repeat never read its nonce's decision"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            hold.release();
        });
        refused
    });
    assert_eq!(other.status, 200, "{}", other.message());
    assert_eq!(
        (refused.status, refused.message().as_str()),
        (403, "validationId already used for a different payment")
    );
    let resolver = server.app.resolver().unwrap();
    let original = resolver.get(301).await.unwrap().unwrap();
    assert!(original.repeats.is_empty(), "{:?}", original.repeats);
    let kept = resolver.get(302).await.unwrap().unwrap();
    assert_eq!(
        (kept.request.nonce().as_str(), kept.repeat_of),
        ("race-other", None)
    );
}
