//! OpenTelemetry export (feature `otel`): payhook's spans sent over OTLP/HTTP (protobuf) to a
//! collector, each request's span a child of the caller's `traceparent`.
//!
//! Add the layer to the service's `tracing` subscriber and keep the guard for the service's
//! lifetime (dropping it sends what is still buffered):
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//!
//! let (otel, _guard) = payhook::telemetry::otlp_layer(
//!     "http://127.0.0.1:4318/v1/traces",
//!     "shop-payments",
//! )?;
//! tracing_subscriber::registry()
//!     .with(otel)
//!     .with(tracing_subscriber::fmt::layer())
//!     .init();
//! # Ok::<(), payhook::telemetry::TelemetryError>(())
//! ```
//!
//! With the layer installed, each request's span is exported in the caller's trace (or a new
//! one) and the ids payhook logs and passes to the aggregator (see [`crate::trace_context`])
//! are the exported span's: a tracing backend shows the aggregator's call, payhook's
//! request and its calls to the aggregator as one trace. Without the layer nothing changes.
//!
//! Spans are batched and sent from a thread of the exporter's own (with a one-worker runtime
//! for its HTTP client), never from a request.

use bytes::Bytes;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The exporter refused its settings (e.g. the endpoint).
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    /// Its HTTP client's runtime could not start.
    #[error("the OTLP exporter's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Sends what is still buffered and stops the exporter when dropped.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl TelemetryGuard {
    /// Sends every finished span now.
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// A `tracing` layer exporting spans to the OTLP/HTTP `endpoint` (the whole URL, e.g.
/// `http://collector:4318/v1/traces`) as `service_name`, and the guard that flushes it.
///
/// # Errors
///
/// [`TelemetryError`] when the exporter cannot be built.
pub fn otlp_layer<S>(
    endpoint: &str,
    service_name: &str,
) -> Result<
    (
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
        TelemetryGuard,
    ),
    TelemetryError,
>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OtlpHttp::new()?)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build();
    let tracer = provider.tracer("payhook");
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    Ok((layer, TelemetryGuard { provider }))
}

/// The exporter's HTTP client: hyper on a one-worker runtime of its own, because the batch
/// processor exports from a plain thread.
struct OtlpHttp {
    runtime: tokio::runtime::Runtime,
    client: crate::gateway::HttpClient,
}

impl std::fmt::Debug for OtlpHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpHttp").finish_non_exhaustive()
    }
}

impl OtlpHttp {
    fn new() -> Result<Self, TelemetryError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("payhook-otlp")
            .enable_all()
            .build()?;
        let client =
            crate::gateway::direct_client().map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        Ok(Self { runtime, client })
    }
}

type Exchange<'a> = Pin<
    Box<
        dyn Future<Output = Result<http::Response<Bytes>, opentelemetry_http::HttpError>>
            + Send
            + 'a,
    >,
>;

impl opentelemetry_http::HttpClient for OtlpHttp {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: http::Request<Bytes>,
    ) -> Exchange<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let request = http::Request::from_parts(parts, http_body_util::Full::new(body));
            let response = tokio::time::timeout(EXPORT_TIMEOUT, client.request(request))
                .await
                .map_err(|_| "the collector did not answer in time")??;
            let (parts, body) = response.into_parts();
            let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
                body,
                4 * 1024 * 1024,
            ))
            .await?
            .to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(http::Response::from_parts(parts, body))
        });
        Box::pin(async move { sent.await? })
    }
}
