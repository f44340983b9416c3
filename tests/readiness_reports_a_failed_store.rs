//! `/readyz` tells an orchestrator to replace an instance whose store has failed: once a
//! batch could not be made durable, every request gets 503 until a restart, so the instance
//! must not be reported ready.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use payhook::store::SledStore;
use support::{CALLBACK, CALLBACK_PATH, TestServer, request, test_config};

#[tokio::test]
async fn readyz_answers_503_with_a_message_once_the_store_has_failed() {
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.store.path = data.path().join("store");
    let store = SledStore::open(&config.store, &[]).unwrap();
    let mut server = TestServer::start_on(config, data, store.clone()).await;
    let addr = server.addr;

    let ready = support::exchange(addr, &request("GET", "/readyz", &[], None)).await;
    assert_eq!(ready.status, 200, "a healthy store is ready");

    store.mark_failed_for_tests();

    let ready = support::exchange(addr, &request("GET", "/readyz", &[], None)).await;
    assert_eq!(ready.status, 503);
    let message = ready.message();
    assert!(message.contains("store has failed"), "{message}");
    assert!(message.contains("restart"), "{message}");
    let head = support::exchange(addr, &request("HEAD", "/readyz", &[], None)).await;
    assert_eq!(head.status, 503, "HEAD answers like GET");
    // Liveness is not readiness: the process itself is fine, it only must not get traffic.
    let health = support::exchange(addr, &request("GET", "/healthz", &[], None)).await;
    assert_eq!(health.status, 200);
    // And the endpoints keep refusing work, as before.
    let callback = support::exchange(
        addr,
        &support::post(
            CALLBACK_PATH,
            &[("Content-Type", "application/json")],
            CALLBACK.as_bytes(),
        ),
    )
    .await;
    assert_eq!(callback.status, 503);

    server.shut_down();
    server.stopped().await;
}
