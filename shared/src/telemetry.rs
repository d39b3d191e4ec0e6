//! Structured JSON logs, trace context carried across HTTP and NATS, OTLP export when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, Prometheus metrics, and the admin server
//! (`/healthz`, `/readyz`, `/metrics`) every service runs.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio_util::sync::CancellationToken;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::RUST_LOG;

static TRACER: OnceLock<SdkTracerProvider> = OnceLock::new();
static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs logging, tracing and metrics once per process; later calls are no-ops, so
/// several services can share a process (as the integration tests do).
pub fn init(service: &str, otlp_endpoint: Option<&str>) {
    crate::tls::install_provider();
    TRACER.get_or_init(|| {
        install_propagator();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service.to_owned())
            .build();
        let mut builder = SdkTracerProvider::builder().with_resource(resource);
        if let Some(endpoint) = otlp_endpoint {
            use opentelemetry_otlp::WithExportConfig;
            match opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
                .build()
            {
                Ok(exporter) => builder = builder.with_batch_exporter(exporter),
                Err(e) => eprintln!("OTLP exporter disabled: {e}"),
            }
        }
        // Without an exporter spans still get ids, so trace context propagates.
        let provider = builder.build();
        let filter = EnvFilter::try_new(RUST_LOG.string())
            .unwrap_or_else(|_| EnvFilter::new(RUST_LOG.default));
        let _ = subscriber(filter, provider.tracer(service.to_owned())).try_init();
        provider
    });
    metrics_handle();
}

/// W3C trace context (`traceparent`) as the process's propagator.
fn install_propagator() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
}

/// JSON logs filtered by `log_filter` (`RUST_LOG`), and spans exported through `tracer` at
/// info level whatever the log level, so trace context propagates even when logs are quiet.
fn subscriber(
    log_filter: EnvFilter, tracer: opentelemetry_sdk::trace::Tracer,
) -> impl tracing::Subscriber + Send + Sync + 'static {
    let logs = tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_filter(log_filter);
    let traces = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // No busy/idle time per span: it read the clock at every poll of every task.
        .with_tracked_inactivity(false)
        // No OpenTelemetry context made current at every poll: nothing reads it, trace
        // context goes through the spans (`inject_nats`, `link_nats`, `link_http`).
        .with_context_activation(false)
        // The hint is needed: without it the tracing test's spans never reached the collector.
        .with_filter(filter_fn(traced).with_max_level_hint(tracing::Level::INFO));
    tracing_subscriber::registry().with(logs).with(traces)
}

/// What reaches the trace exporter: spans from info level, events (as span events) only
/// from warn level; the info events are logs and would cost an allocation per request.
fn traced(meta: &tracing::Metadata<'_>) -> bool {
    let most = if meta.is_span() {
        tracing::Level::INFO
    } else {
        tracing::Level::WARN
    };
    *meta.level() <= most
}

/// Flushes buffered spans (call before exit).
pub fn shutdown() {
    if let Some(p) = TRACER.get() {
        let _ = p.force_flush();
    }
}

/// Bucket bounds (seconds) of every `*_seconds` histogram.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The process-wide Prometheus recorder.
pub fn metrics_handle() -> &'static PrometheusHandle {
    METRICS.get_or_init(|| {
        // Latencies as histograms, so a p99 can be taken across replicas
        // (`histogram_quantile` over `_bucket`, as k8s/observability's rules do).
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .expect("latency buckets")
            .build_recorder();
        let handle = recorder.handle();
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

struct NatsHeaders<'a>(&'a mut async_nats::HeaderMap);

impl Injector for NatsHeaders<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct NatsHeadersRef<'a>(&'a async_nats::HeaderMap);

impl Extractor for NatsHeadersRef<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

struct HttpHeadersRef<'a>(&'a http::HeaderMap);

impl Extractor for HttpHeadersRef<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Writes the current span's `traceparent` into outgoing NATS headers.
pub fn inject_nats(headers: &mut async_nats::HeaderMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut NatsHeaders(headers))
    });
}

/// Makes `span` a child of the trace named in the headers of the NATS message it handles;
/// of several messages, the first one's trace, linked to the others'.
pub fn link_nats<'a>(
    span: &tracing::Span, headers: impl IntoIterator<Item = Option<&'a async_nats::HeaderMap>>,
) {
    let mut parented = false;
    for h in headers.into_iter().flatten() {
        let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&NatsHeadersRef(h)));
        let remote = cx.span().span_context().clone();
        if !remote.is_valid() {
            continue;
        }
        if parented {
            span.add_link(remote);
        } else {
            let _ = span.set_parent(cx);
            parented = true;
        }
    }
}

/// Makes `span` a child of the trace named in incoming HTTP headers.
pub fn link_http(span: &tracing::Span, headers: &http::HeaderMap) {
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HttpHeadersRef(headers)));
    let _ = span.set_parent(cx);
}

/// A readiness probe: resolves to true when the service's dependencies answer.
pub type ReadyCheck = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// The admin server's header naming the process that answers.
pub const PROCESS_ID: &str = "x-process-id";

/// Serves `/healthz`, `/readyz` and `/metrics` on `addr` until `shutdown`; returns the bound address.
pub async fn serve_admin(
    addr: SocketAddr, ready: ReadyCheck, shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready().await {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
        .route("/metrics", get(|| async { metrics_handle().render() }))
        // Which process answers: a supervisor that picked a free port for a child can tell
        // its child from another process that took the port first.
        .layer(axum::middleware::map_response(
            |mut res: axum::response::Response| async move {
                res.headers_mut()
                    .insert(PROCESS_ID, std::process::id().into());
                res
            },
        ));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceContextExt;

    use super::*;

    /// Runs `check` under the service subscriber with logs at `log_level`, scoped to this
    /// thread: no test depends on which one initialised the process first.
    fn with_logs_at(log_level: &str, check: impl FnOnce()) {
        install_propagator();
        let tracer = SdkTracerProvider::builder()
            .build()
            .tracer("telemetry-test");
        let subscriber = subscriber(EnvFilter::new(log_level), tracer);
        tracing::subscriber::with_default(subscriber, check);
    }

    #[test]
    fn trace_context_crosses_nats_headers() {
        with_logs_at("info", assert_propagates);
    }

    #[test]
    fn trace_context_propagates_even_when_logs_are_quiet() {
        with_logs_at("error", assert_propagates);
    }

    fn assert_propagates() {
        let parent = tracing::info_span!("parent");
        let mut headers = async_nats::HeaderMap::new();
        let trace_id = parent.in_scope(|| {
            inject_nats(&mut headers);
            tracing::Span::current()
                .context()
                .span()
                .span_context()
                .trace_id()
        });
        let traceparent = headers
            .get("traceparent")
            .expect("traceparent injected")
            .to_string();
        assert!(traceparent.contains(&trace_id.to_string()), "{traceparent}");

        let child = tracing::info_span!("child");
        link_nats(&child, [Some(&headers)]);
        let child_trace = child.context().span().span_context().trace_id();
        assert_eq!(child_trace, trace_id);
        let unrelated = tracing::info_span!("unrelated");
        assert_ne!(
            unrelated.context().span().span_context().trace_id(),
            trace_id
        );
    }

    /// Keeps the spans the test subscriber exports.
    #[derive(Debug, Clone, Default)]
    struct Kept(Arc<std::sync::Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

    impl opentelemetry_sdk::trace::SpanExporter for Kept {
        async fn export(
            &self, batch: Vec<opentelemetry_sdk::trace::SpanData>,
        ) -> opentelemetry_sdk::error::OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    #[test]
    fn spans_carry_warnings_but_not_info_events() {
        let kept = Kept::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(kept.clone())
            .build();
        let subscriber = subscriber(EnvFilter::new("info"), provider.tracer("telemetry-test"));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("request").in_scope(|| {
                tracing::info!("request done");
                tracing::warn!("slow answer");
            });
        });
        let spans = kept.0.lock().unwrap();
        let [span] = &spans[..] else {
            panic!("one span exported, got {}", spans.len());
        };
        assert_eq!(span.name, "request");
        let events: Vec<&str> = span.events.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(events, ["slow answer"]);
    }
}
