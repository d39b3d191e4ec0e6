//! Open and click tracking's public paths, answered on any host that reaches the gateway
//! (`PUBLIC_BASE_URL`, `TRACKING_BASE_URL`, a verified `track.<domain>`): `GET /t/o/{token}`
//! a 1×1 GIF, `GET /t/c/{token}` a `302` to the signed destination; a tampered, unknown or
//! unsigned token is a 404, never a redirect, and so is a token asked on a host it was not
//! made for, or on a customer's host for a domain that no longer holds it ([`Tokens`]): one
//! workspace's links never redirect on another's domain. No
//! database is read or written: the token's signature is checked and the hit published to
//! the TRACKING stream, acknowledged before the answer (503 when it cannot be), for the
//! sender to record; hits arriving together share a message ([`Hits`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, Response, StatusCode};
use prost::Message as _;
use uuid::Uuid;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::db::now_unix;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{TrackingHit, TrackingHits};
use postmesh_shared::tracking::{
    canonical_host, host_name, Binding, Claims, HitKind, TrackingKey, MAX_USER_AGENT,
};
use postmesh_shared::tracking_hosts::VerifiedHosts;
use postmesh_shared::{ApiError, Routes};

use crate::sessions::client_ip;
use crate::{AppState, Config};

/// A transparent 1×1 GIF.
const PIXEL: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3b,
];

/// The tracking routes.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::TRACK_OPEN, open)
        .at(api::TRACK_CLICK, click)
}

/// `addr` with its host part cut: IPv4 (also as `::ffff:a.b.c.d`) to its /24, IPv6 to its
/// /48.
pub fn truncated(addr: IpAddr) -> String {
    match addr.to_canonical() {
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

/// Checks tokens by the host they are asked on.
#[derive(Clone)]
pub struct Tokens {
    key: TrackingKey,
    /// The shared hosts, `PUBLIC_BASE_URL`'s and `TRACKING_BASE_URL`'s, canonical.
    shared: Vec<String>,
    /// The customers' verified hosts and the domain holding each.
    hosts: VerifiedHosts,
}

impl Tokens {
    /// The checker the settings make, customers' hosts from `hosts`; none without
    /// `TRACKING_SECRET`.
    pub fn from_config(config: &Config, hosts: VerifiedHosts) -> Option<Self> {
        let secret = config.tracking_secret.as_deref()?;
        Some(Self::new(
            secret,
            [&config.public_base_url, &config.tracking_base_url],
            hosts,
        ))
    }

    /// Tokens signed with `secret`, the hosts of `shared_bases` the shared ones.
    fn new<'a>(
        secret: &str, shared_bases: impl IntoIterator<Item = &'a String>, hosts: VerifiedHosts,
    ) -> Self {
        let key = TrackingKey::new(secret);
        let shared = shared_bases
            .into_iter()
            .filter_map(|url| url.split_once("://"))
            .filter_map(|(_, rest)| rest.split(['/', '?', '#']).next())
            .filter(|host| !host.is_empty())
            .map(canonical_host)
            .collect();
        Self { key, shared, hosts }
    }

    /// What `token` says as a `kind` hit asked on `host`: on a shared host (or none named),
    /// a token made for the shared hosts; on a customer's verified host, a token bound to it
    /// and to the domain holding it now; on any other, none.
    fn verify(&self, token: &str, kind: HitKind, host: Option<&str>) -> Option<Claims> {
        let Some(host) = host
            .map(host_name)
            .filter(|host| !self.shared.iter().any(|s| s.eq_ignore_ascii_case(host)))
        else {
            return self.key.verify(token, kind, None);
        };
        let domain = self.hosts.domain(host)?;
        self.key.verify(token, kind, Some(Binding { host, domain }))
    }
}

/// The host `req` was sent to: its URI's authority (HTTP/2), else its `Host`.
fn host_of(req: &Parts) -> Option<&str> {
    req.uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers.get(header::HOST).and_then(|v| v.to_str().ok()))
}

/// What the path's token says as a `kind` hit on the host `req` came to, or the 404 of
/// one that is not ours there (one that is not even valid percent-encoding among them).
fn claims(
    state: &AppState, token: Result<Path<String>, PathRejection>, kind: HitKind, req: &Parts,
) -> Result<Claims, ApiError> {
    token
        .ok()
        .zip(state.tracking.as_ref())
        .and_then(|(Path(token), tokens)| tokens.verify(&token, kind, host_of(req)))
        .ok_or_else(|| ApiError::NotFound("no such tracking link".into()))
}

/// Hits in one TRACKING message at most.
const PER_MESSAGE: usize = 200;
/// Messages being published at once: one, so the next carries every hit that arrived
/// meanwhile (the bench: 22,650 redirects/s with one, 17,829 with four).
const PUBLISHERS: usize = 1;
/// Hits waiting for a publisher at most (more wait for room).
const QUEUE: usize = 4096;

/// A hit waiting to be published, and who waits for its acknowledgement.
type Waiting = (TrackingHit, oneshot::Sender<Result<(), String>>);

/// Publishes hits to the TRACKING stream as a group commit: the hits that arrive while
/// [`PUBLISHERS`] messages are in flight go together in the next one (up to
/// [`PER_MESSAGE`]), and each waits for its own message's acknowledgement, for `deadline`
/// at most; a hit whose wait has ended by then is left out of the next message.
#[derive(Clone)]
pub struct Hits {
    queue: mpsc::Sender<Waiting>,
    deadline: Duration,
}

impl Hits {
    /// Starts the publishers, which end when the last sender of hits is dropped; a hit not
    /// stored within `deadline` (`UPSTREAM_TIMEOUT_SECS`) is a 503.
    pub fn start(
        js: async_nats::jetstream::Context, ns: &postmesh_shared::Namespace, deadline: Duration,
    ) -> Self {
        let (queue, taken) = mpsc::channel::<Waiting>(QUEUE);
        let taken = Arc::new(tokio::sync::Mutex::new(taken));
        let subject = Stream::Tracking.subject(ns);
        for _ in 0..PUBLISHERS {
            let (taken, js, subject) = (taken.clone(), js.clone(), subject.clone());
            tokio::spawn(async move {
                loop {
                    let batch = {
                        let mut taken = taken.lock().await;
                        let Some(first) = taken.recv().await else {
                            return;
                        };
                        let (mut batch, mut next) = (Vec::new(), Some(first));
                        while let Some(waiting) = next {
                            // Answered already (a 503 past its deadline): not published.
                            if !waiting.1.is_closed() {
                                batch.push(waiting);
                            }
                            next = (batch.len() < PER_MESSAGE)
                                .then(|| taken.try_recv().ok())
                                .flatten();
                        }
                        batch
                    };
                    if batch.is_empty() {
                        continue;
                    }
                    let (hits, waiting): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                    let payload = Bytes::from(TrackingHits { hits }.encode_to_vec());
                    // No `Nats-Msg-Id`: a batch is never published twice (a failed one is
                    // answered 503), so the stream's duplicate window would only hold ids.
                    let published = async {
                        js.publish(subject.clone(), payload).await?.await?;
                        anyhow::Ok(())
                    }
                    .await
                    .map_err(|e| e.to_string());
                    for waiter in waiting {
                        let _ = waiter.send(published.clone());
                    }
                }
            });
        }
        Self { queue, deadline }
    }

    /// Publishes `hit`; once JetStream has stored it, or the 503 saying it could not (in
    /// time).
    pub async fn publish(&self, hit: TrackingHit) -> Result<(), ApiError> {
        let unavailable =
            |why: String| ApiError::Unavailable(format!("could not record the hit: {why}"));
        let (done, stored) = oneshot::channel();
        let stored = async {
            let gone = || unavailable("shutting down".into());
            self.queue.send((hit, done)).await.map_err(|_| gone())?;
            stored.await.map_err(|_| gone())?.map_err(unavailable)
        };
        tokio::time::timeout(self.deadline, stored)
            .await
            .unwrap_or_else(|_| Err(unavailable("not stored in time".into())))
    }
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
    state.hits.publish(hit).await
}

/// `GET /t/o/{token}`: the pixel.
async fn open(
    State(state): State<AppState>, token: Result<Path<String>, PathRejection>, req: Parts,
) -> Result<Response<Body>, ApiError> {
    let claims = claims(&state, token, HitKind::Open, &req)?;
    publish(&state, claims, &req).await?;
    let mut res = Response::new(Body::from(PIXEL));
    let headers = res.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("image/gif"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// `GET /t/c/{token}`: a `302` to the signed destination.
async fn click(
    State(state): State<AppState>, token: Result<Path<String>, PathRejection>, req: Parts,
) -> Result<Response<Body>, ApiError> {
    let claims = claims(&state, token, HitKind::Click, &req)?;
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
    use async_nats::jetstream::kv::Operation;

    use super::*;

    #[test]
    fn addresses_keep_their_network_only() {
        assert_eq!(truncated("203.0.113.77".parse().unwrap()), "203.0.113.0");
        assert_eq!(
            truncated("2001:db8:85a3:8d3:1319:8a2e:370:7348".parse().unwrap()),
            "2001:db8:85a3::"
        );
        // A dual-stack listener's IPv4 client, Apple's proxy among them.
        assert_eq!(truncated("::ffff:17.58.1.2".parse().unwrap()), "17.58.1.0");
    }

    #[test]
    fn tokens_are_checked_for_the_host_they_are_asked_on() {
        let bases = [
            "http://127.0.0.1:8080".to_owned(),
            "https://T.Postmesh.example/".to_owned(),
            String::new(),
        ];
        let hosts = VerifiedHosts::default();
        let (domain, later) = (Uuid::now_v7(), Uuid::now_v7());
        hosts.apply("track.a.example".into(), Operation::Put, domain.as_bytes());
        let tokens = Tokens::new("k", &bases, hosts.clone());
        let key = TrackingKey::new("k");
        let d = Uuid::now_v7();
        let shared = key.click(d, "https://x.com", None).unwrap();
        let bound_to = |host, domain| {
            let bound = Some(Binding { host, domain });
            key.click(d, "https://x.com", bound).unwrap()
        };
        let bound = bound_to("track.a.example", domain);
        let ok = |token: &str, host| tokens.verify(token, HitKind::Click, host).is_some();
        for host in [None, Some("127.0.0.1:8080"), Some("t.postmesh.EXAMPLE")] {
            assert!(ok(&shared, host), "{host:?}");
            assert!(!ok(&bound, host), "{host:?}");
        }
        assert!(ok(&bound, Some("Track.A.example:443")));
        assert!(!ok(&shared, Some("track.a.example")));
        assert!(!ok(&bound, Some("track.b.example")));
        assert!(!ok(
            &bound_to("track.b.example", domain),
            Some("track.b.example")
        ));
        // Removed, then added again by another domain: the old tokens are refused there.
        hosts.apply("track.a.example".into(), Operation::Delete, &[]);
        assert!(!ok(&bound, Some("track.a.example")));
        hosts.apply("track.a.example".into(), Operation::Put, later.as_bytes());
        assert!(!ok(&bound, Some("track.a.example")));
        assert!(ok(
            &bound_to("track.a.example", later),
            Some("track.a.example")
        ));
    }
}
