//! W3C trace context: a request runs in its caller's trace (a child span of the caller's
//! `traceparent`), its log lines name that trace, and the gateway calls it makes carry the
//! same trace onwards; without a valid `traceparent` a request starts a trace of its own.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use support::gateway::lookup_traceparent;
#[allow(unused_imports, reason = "the log test's helpers")]
use support::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The fields of a version-00 `traceparent`: trace id, parent id, flags.
fn fields(traceparent: &str) -> (String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00", "{traceparent}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

#[tokio::test]
async fn a_gateway_call_made_for_a_request_continues_the_callers_trace() {
    let caller = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let sent = lookup_traceparent(Some(&caller)).await;
    let (trace, parent, flags) = fields(&sent);
    assert_eq!(trace, TRACE, "{sent}");
    assert_ne!(
        parent, CALLER_SPAN,
        "the lookup's parent is payhook's span: {sent}"
    );
    assert_ne!(parent, "0".repeat(16));
    assert_eq!(
        flags, "01",
        "the caller's sampling decision is kept: {sent}"
    );
}

#[tokio::test]
async fn without_a_valid_traceparent_a_request_starts_a_trace_of_its_own() {
    for caller in [
        None,
        Some("00-not-a-trace-01"),
        Some(&*format!("00-{}-{CALLER_SPAN}-01", "0".repeat(32))),
    ] {
        let sent = lookup_traceparent(caller).await;
        let (trace, parent, _) = fields(&sent);
        assert_ne!(trace, TRACE);
        assert_ne!(trace, "0".repeat(32), "{sent}");
        assert_ne!(parent, "0".repeat(16), "{sent}");
        assert!(
            trace
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
}

#[tokio::test]
async fn the_requests_log_lines_name_the_callers_trace() {
    let logs = captured_logs(tracing::Level::DEBUG);
    let server = TestServer::start().await;
    let caller = format!("00-{TRACE}-{CALLER_SPAN}-00");
    let body = with(CALLBACK, "/nonce", Some(serde_json::json!("traced-1")));
    let answer = server
        .send(&post(
            CALLBACK_PATH,
            &[
                ("content-type", "application/json"),
                ("traceparent", &caller),
            ],
            body.as_bytes(),
        ))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.message());
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|line| line.contains("answered") && line.contains("traced-1"))
        .unwrap_or_else(|| panic!("no answer logged: {text}"));
    assert!(line.contains(&format!("trace_id={TRACE}")), "{line}");
    assert!(
        line.contains(&format!("parent_span_id={CALLER_SPAN}")),
        "{line}"
    );
    assert!(line.contains("span_id="), "{line}");
}
