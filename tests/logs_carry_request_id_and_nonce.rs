//! Every log line of a request, the handler's own included, is inside a span that carries
//! the request id and the nonce.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::sync::{Arc, Mutex};
use support::*;
use tracing::{
    Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{Layer, layer::Context, prelude::*, registry::LookupSpan};

/// Fields of the `request` span, gathered as they are recorded.
#[derive(Default, Debug, Clone)]
struct RequestFields {
    request_id: Option<String>,
    nonce: Option<String>,
    reference_id: Option<String>,
}

impl Visit for RequestFields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}").trim_matches('"').to_owned();
        match field.name() {
            "request_id" => self.request_id = Some(text),
            "nonce" => self.nonce = Some(text),
            "reference_id" => self.reference_id = Some(text),
            _ => {}
        }
    }
}

/// For each event, the request span's fields as seen from that event.
#[derive(Clone, Default)]
struct Capture {
    events: Arc<Mutex<Vec<(String, RequestFields)>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        if span.name() == "request" {
            let mut fields = RequestFields::default();
            attrs.record(&mut fields);
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        if let Some(fields) = span.extensions_mut().get_mut::<RequestFields>() {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(fields) = span.extensions().get::<RequestFields>() {
                self.events
                    .lock()
                    .unwrap()
                    .push((event.metadata().target().to_owned(), fields.clone()));
            }
        }
    }
}

#[tokio::test]
async fn the_handlers_log_lines_carry_the_request_id_and_nonce() {
    let capture = Capture::default();
    tracing_subscriber::registry().with(capture.clone()).init();
    let server = TestServer::start().await;
    let request = post(
        CALLBACK_PATH,
        &[
            ("Content-Type", "application/json"),
            ("X-Request-Id", "req-77"),
        ],
        CALLBACK.as_bytes(),
    );
    let body = with(CALLBACK, "/clientId", Some(serde_json::json!("fail")));
    let body = with(&body, "/nonce", Some(serde_json::json!("nonce-cb-2")));
    let failing = post(
        CALLBACK_PATH,
        &[
            ("Content-Type", "application/json"),
            ("X-Request-Id", "req-78"),
        ],
        body.as_bytes(),
    );
    assert_eq!(server.send(&request).await.status, 200);
    assert_eq!(server.send(&failing).await.status, 503);

    let events = capture.events.lock().unwrap().clone();
    let of = |id: &str| {
        events
            .iter()
            .filter(|(_, f)| f.request_id.as_deref() == Some(id))
            .cloned()
            .collect::<Vec<_>>()
    };
    let failed = of("req-78");
    assert!(
        failed
            .iter()
            .any(|(target, f)| target.starts_with("payhook")
                && f.nonce.as_deref() == Some("nonce-cb-2")),
        "the handler failure is logged inside the request span with its nonce: {failed:?}"
    );
    assert!(
        failed.iter().any(|(_, f)| f.reference_id.as_deref()
            == Some("0b7e5a52-2f59-4c1e-9d0c-3f1a2b3c4d5e")),
        "and with the transaction's reference id: {failed:?}"
    );
    assert!(
        !of("req-77").is_empty(),
        "the answered request is logged: {events:?}"
    );
    assert!(
        of("req-77")
            .iter()
            .all(|(_, f)| f.nonce.as_deref() == Some("nonce-cb-1"))
    );
}
