//! OTLP export: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans reach the collector over
//! OTLP/HTTP, and a received email's and a send's spans are one trace each, from the
//! gateway through NATS, the outbox and the queues to the webhook POST.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;

use prost::Message as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_shared::{AddressId, Success};
use postmesh_tests::mta::{ingest_body, key_with_inbox, message, mta};
use postmesh_tests::receiver::Receiver;
use postmesh_tests::{eventually, Stack, INBOUND_DOMAIN};
use webhook_dispatcher::routes::endpoints;

type Seen = Arc<Mutex<Vec<(String, Bytes)>>>;

/// A collector that accepts OTLP/HTTP trace exports and keeps them.
async fn fake_collector() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/v1/traces",
            post(
                |State(seen): State<Seen>, headers: HeaderMap, body: Bytes| async move {
                    let ct = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().unwrap().push((ct, body));
                    ""
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

/// The parts of an OTLP/HTTP trace export (`ExportTraceServiceRequest`) the test reads;
/// prost skips the rest.
mod otlp {
    /// `ExportTraceServiceRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Export {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }
    /// `ResourceSpans`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }
    /// `ScopeSpans`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }
    /// `Span`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
    }
}

/// A `traceparent` of a new trace; the trace id and the (caller's) span id.
fn new_trace() -> (String, [u8; 16], [u8; 8]) {
    let (trace, span): ([u8; 16], [u8; 8]) = (rand::random(), rand::random());
    let header = format!("00-{}-{}-01", hex::encode(trace), hex::encode(span));
    (header, trace, span)
}

/// Checks that `trace`'s spans in `spans` hang together (each one's parent is another of
/// them, or `caller`, the span that started the trace outside) and include each of `names`.
fn one_trace(spans: &[otlp::Span], trace: [u8; 16], caller: [u8; 8], names: &[&str]) {
    let mine: Vec<&otlp::Span> = spans.iter().filter(|s| s.trace_id == trace).collect();
    for span in &mine {
        let parent = &span.parent_span_id;
        assert!(
            parent.as_slice() == caller || mine.iter().any(|s| &s.span_id == parent),
            "{} has a parent outside the trace",
            span.name
        );
    }
    let found: Vec<&str> = mine.iter().map(|s| s.name.as_str()).collect();
    for name in names {
        assert!(found.contains(name), "{name} not in {found:?}");
    }
}

/// A webhook endpoint of `inbox` posting to `receiver`, which trusts its secret.
async fn inbox_endpoint(stack: &Stack, key: &str, inbox: AddressId, receiver: &Receiver) {
    let created: Success<endpoints::Created> = stack
        .client(key)
        .post(
            "/inbox/webhook/endpoints",
            &json!({ "addressId": inbox, "url": receiver.url("/inbound") }),
            StatusCode::CREATED,
        )
        .await;
    receiver.trust(&created.body.signing_secret);
}

/// A webhook taking every event of `key`'s workspace, posting to `receiver`.
async fn event_webhook(stack: &Stack, key: &str, receiver: &Receiver) {
    receiver.subscribe(stack, key, &[]).await;
}

/// Waits until `receiver` got a delivery.
async fn delivered(receiver: &Receiver) {
    eventually(Duration::from_secs(30), || async {
        (receiver.count() > 0)
            .then_some(())
            .ok_or(receiver.refused())
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_received_email_and_a_send_are_each_one_trace_up_to_their_webhook() {
    let (endpoint, seen) = fake_collector().await;
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    let stack = Stack::start().await;

    // A received email: gateway → inbound-ingest → outbox → INBOUND fan-out → webhook POST.
    let (key, inbox) = key_with_inbox(&stack, "traced").await;
    let inbound = Receiver::start().await;
    inbox_endpoint(&stack, &key, inbox, &inbound).await;
    let (header, received_trace, received_caller) = new_trace();
    let to = format!("traced@{INBOUND_DOMAIN}");
    let raw = message(None, "traced", "", "hello");
    let _: Value = mta(&stack)
        .with_header("traceparent", &header)
        .post(
            "/inbound-email/ingest",
            &ingest_body(&raw, &[&to]),
            StatusCode::OK,
        )
        .await;
    delivered(&inbound).await;

    // A send: gateway → sender → SEND worker → DELIVERY fan-out → webhook POST.
    let paying = stack.key(3).await;
    let events = Receiver::start().await;
    event_webhook(&stack, &paying, &events).await;
    let (header, send_trace, send_caller) = new_trace();
    let _: Value = stack
        .client(&paying)
        .with_header("traceparent", &header)
        .post(
            "/send-email",
            &json!({ "to": "ann@example.com", "subject": "s", "text": "t" }),
            StatusCode::OK,
        )
        .await;
    delivered(&events).await;

    // The services stop first: a fan-out whose POST the receiver has seen may still be open,
    // and a span is exported only once it ends.
    stack.shutdown().await;
    tokio::task::spawn_blocking(postmesh_shared::telemetry::shutdown)
        .await
        .unwrap();
    let exports = seen.lock().unwrap().clone();
    assert!(exports.iter().all(|(ct, _)| ct == "application/x-protobuf"));
    let spans: Vec<otlp::Span> = exports
        .iter()
        .map(|(_, body)| otlp::Export::decode(body.clone()).expect("an OTLP export"))
        .flat_map(|export| export.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect();
    one_trace(
        &spans,
        received_trace,
        received_caller,
        &[
            "http.request",
            "nats.request",
            "webhook.fanout",
            "webhook.post",
        ],
    );
    one_trace(
        &spans,
        send_trace,
        send_caller,
        &[
            "http.request",
            "nats.request",
            "queue.job",
            "webhook.fanout",
            "webhook.post",
        ],
    );
}
