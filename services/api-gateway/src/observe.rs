//! The outermost layer of every request: a request id (taken from `x-request-id` when sane,
//! else generated, and echoed back), a span joined to the caller's `traceparent`, and
//! request metrics.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Response};
use axum::middleware::Next;
use tracing::Instrument;
use uuid::Uuid;

use postmesh_shared::nats::{with_request_id, REQUEST_ID};
use postmesh_shared::telemetry;

/// A caller-supplied request id is kept if it is 1-128 visible ASCII characters.
fn sane(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Tags, traces and measures one request.
pub async fn observe(mut req: Request, next: Next) -> Response<Body> {
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| sane(v))
        .map(str::to_owned)
        .unwrap_or_else(|| Uuid::now_v7().to_string());
    let id_header = HeaderValue::from_str(&id).ok();
    if let Some(v) = &id_header {
        req.headers_mut().insert(REQUEST_ID, v.clone());
    }
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().clone();
    let span = tracing::info_span!("http.request", %method, route = %route, request_id = %id);
    telemetry::link_http(&span, req.headers());
    let started = Instant::now();
    let mut res = with_request_id(id.clone(), next.run(req).instrument(span.clone())).await;
    let status = res.status().as_u16();
    let elapsed = started.elapsed();
    span.in_scope(|| {
        tracing::info!(
            status,
            elapsed_ms = elapsed.as_secs_f64() * 1000.0,
            "request done"
        );
    });
    let labels = [
        ("route", route),
        ("method", method.to_string()),
        ("status", status.to_string()),
    ];
    metrics::counter!("postmesh_http_requests_total", &labels).increment(1);
    metrics::histogram!("postmesh_http_request_seconds", &labels[..2])
        .record(elapsed.as_secs_f64());
    if let Some(v) = id_header {
        res.headers_mut().insert(REQUEST_ID, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::sane;

    #[test]
    fn request_ids_must_be_short_visible_ascii() {
        assert!(sane("abc-123"));
        assert!(!sane(""));
        assert!(!sane("has space"));
        assert!(!sane(&"x".repeat(129)));
    }
}
