//! OTLP export: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans of the gateway and of the
//! service behind NATS reach the collector over OTLP/HTTP.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;

use postmesh_tests::Stack;

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

#[tokio::test(flavor = "multi_thread")]
async fn spans_are_exported_over_otlp_when_configured() {
    let (endpoint, seen) = fake_collector().await;
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    let stack = Stack::start().await;
    let key = stack.key(3).await;
    assert_eq!(stack.balance(&key).await, 3);
    tokio::task::spawn_blocking(postmesh_shared::telemetry::shutdown)
        .await
        .unwrap();
    let exports = seen.lock().unwrap().clone();
    assert!(!exports.is_empty(), "nothing exported");
    assert!(exports.iter().all(|(ct, _)| ct == "application/x-protobuf"));
    let all: Vec<u8> = exports.iter().flat_map(|(_, b)| b.to_vec()).collect();
    let has = |needle: &str| all.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(has("http.request"), "gateway span missing");
    assert!(has("nats.request"), "service span missing");
    stack.shutdown().await;
}
