//! Open and click tracking's public paths, answered on any host that reaches the gateway
//! (`PUBLIC_BASE_URL`, `TRACKING_BASE_URL`, a verified `track.<domain>`): `GET /t/o/{token}`
//! a 1×1 GIF, `GET /t/c/{token}` a `302` to the signed destination; a tampered, unknown or
//! unsigned token is a 404, never a redirect. No database is read or written: the token's
//! signature is checked and the hit published to the TRACKING stream, acknowledged before
//! the answer (503 when it cannot be), for the sender to record.

use std::net::IpAddr;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, Response, StatusCode};
use prost::Message as _;
use uuid::Uuid;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::db::now_unix;
use postmesh_shared::jetstream::{self, Stream};
use postmesh_shared::proto::TrackingHit;
use postmesh_shared::tracking::{Claims, HitKind};
use postmesh_shared::{ApiError, Routes};

use crate::sessions::client_ip;
use crate::AppState;

/// A transparent 1×1 GIF.
const PIXEL: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3b,
];
/// Bytes of a user agent kept at most.
const MAX_USER_AGENT: usize = 512;

/// The tracking routes.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::TRACK_OPEN, open)
        .at(api::TRACK_CLICK, click)
}

/// `addr` with its host part cut: IPv4 to its /24, IPv6 to its /48.
pub fn truncated(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            format!("{a}.{b}.{c}.0")
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}::", s[0], s[1], s[2])
        }
    }
}

/// What `token` says as a `kind` hit, or the 404 of one that is not ours.
fn claims(state: &AppState, token: &str, kind: HitKind) -> Result<Claims, ApiError> {
    state
        .tracking
        .as_ref()
        .and_then(|key| key.verify(token, kind))
        .ok_or_else(|| ApiError::NotFound("no such tracking link".into()))
}

/// Publishes the hit of `claims` made by `req`, before the answer; a 503 when the stream
/// cannot take it (NATS down), so no hit answered is ever lost.
async fn publish(state: &AppState, claims: Claims, req: &Parts) -> Result<(), ApiError> {
    let hit_id = Uuid::now_v7();
    let agent = req
        .headers
        .get(header::USER_AGENT)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let (agent, _) = postmesh_shared::text::cut_at(agent, MAX_USER_AGENT);
    let ip = client_ip(state, req).map(truncated).unwrap_or_default();
    let hit = TrackingHit {
        hit_id: hit_id.to_string(),
        kind: claims.kind.event().into(),
        delivery_id: claims.delivery.to_string(),
        url: claims.url.unwrap_or_default(),
        user_agent: agent,
        client_ip: ip,
        occurred_at: now_unix(),
        head: req.method == Method::HEAD,
    };
    let subject = Stream::Tracking.subject(&state.ns);
    let payload = Bytes::from(hit.encode_to_vec());
    jetstream::publish(&state.js, subject, &hit.hit_id, payload).await
}

/// `GET /t/o/{token}`: the pixel.
async fn open(
    State(state): State<AppState>, Path(token): Path<String>, req: Parts,
) -> Result<Response<Body>, ApiError> {
    let claims = claims(&state, &token, HitKind::Open)?;
    publish(&state, claims, &req).await?;
    let mut res = Response::new(Body::from(PIXEL));
    let headers = res.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("image/gif"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// `GET /t/c/{token}`: a `302` to the signed destination.
async fn click(
    State(state): State<AppState>, Path(token): Path<String>, req: Parts,
) -> Result<Response<Body>, ApiError> {
    let claims = claims(&state, &token, HitKind::Click)?;
    let location = claims
        .url
        .as_deref()
        .and_then(|u| HeaderValue::from_str(u).ok())
        .ok_or_else(|| ApiError::NotFound("no such tracking link".into()))?;
    publish(&state, claims, &req).await?;
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::FOUND;
    res.headers_mut().insert(header::LOCATION, location);
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_keep_their_network_only() {
        assert_eq!(truncated("203.0.113.77".parse().unwrap()), "203.0.113.0");
        assert_eq!(
            truncated("2001:db8:85a3:8d3:1319:8a2e:370:7348".parse().unwrap()),
            "2001:db8:85a3::"
        );
    }
}
