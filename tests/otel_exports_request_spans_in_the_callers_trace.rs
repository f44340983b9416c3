//! OpenTelemetry export (feature `otel`): with payhook's OTLP layer installed, a request with
//! a `traceparent` is exported over OTLP/HTTP as a span of the caller's trace whose parent is
//! the caller's span, and the gateway call it makes names that exported span as its parent —
//! one trace from the aggregator through payhook to the aggregator again. A fake collector
//! on 127.0.0.1 receives what is exported.
#![cfg(feature = "otel")]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::sync::{Arc, Mutex};
use support::gateway::lookup_traceparent;
use tracing_subscriber::prelude::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A collector that keeps the body of every `POST /v1/traces`.
async fn collector() -> (std::net::SocketAddr, Arc<Mutex<Vec<Bytes>>>) {
    let received: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let kept = Arc::clone(&received);
    let addr = support::serve_http(move |request: hyper::Request<hyper::body::Incoming>| {
        let kept = Arc::clone(&kept);
        async move {
            assert_eq!(request.uri().path(), "/v1/traces");
            let body = request.into_body().collect().await.unwrap().to_bytes();
            kept.lock().unwrap().push(body);
            hyper::Response::new(Full::new(Bytes::new()))
        }
    })
    .await;
    (addr, received)
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_exported_as_a_child_of_the_callers_span_and_its_gateway_call_of_it() {
    let (addr, received) = collector().await;
    let (layer, guard) =
        payhook::telemetry::otlp_layer(&format!("http://{addr}/v1/traces"), "test-shop").unwrap();
    // The whole test binary's subscriber: the server's tasks run on the runtime's threads.
    tracing_subscriber::registry().with(layer).init();

    // A reconcile with the caller's `traceparent`: payhook's request looks the transaction
    // up at the gateway.
    let sent = lookup_traceparent(Some(&format!("00-{TRACE}-{CALLER_SPAN}-01"))).await;
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts[1], TRACE, "{sent}");
    let request_span = parts[2];
    assert_ne!(request_span, CALLER_SPAN);

    guard.flush();
    let bodies = received.lock().unwrap().clone();
    assert!(!bodies.is_empty(), "nothing was exported");
    let all: Vec<u8> = bodies.concat();
    // OTLP protobuf carries ids as raw bytes: the caller's trace, the caller's span as the
    // request span's parent, and the request span the gateway was told about.
    assert!(
        contains(&all, &unhex(TRACE)),
        "the caller's trace id is exported"
    );
    assert!(
        contains(&all, &unhex(CALLER_SPAN)),
        "the caller's span is the parent"
    );
    assert!(
        contains(&all, &unhex(request_span)),
        "the span named in the gateway's traceparent ({request_span}) is the exported one"
    );
    assert!(contains(&all, b"test-shop"), "the service's name");
    assert!(contains(&all, b"request"), "the request span");
}
