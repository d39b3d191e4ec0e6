//! NATS plumbing: HTTP requests carried as envelopes on `{ns}.svc.{service}.http`, and typed
//! RPCs on `{ns}.rpc.{service}.{method}`, both served with the NATS service API in a queue
//! group so replicas share the load. `traceparent` and `x-request-id` ride in NATS headers.
//! A request body too large for one NATS message travels by claim check: [`forward`] puts it
//! in the namespace's object-store bucket and the envelope carries its key; the service host
//! reads it back and deletes it once the request is handled. An answer too large goes back
//! the same way, read and deleted by [`forward`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::object_store::{self, GetErrorKind, ObjectStore};
use async_nats::service::ServiceExt;
use async_nats::{Client, HeaderMap};
use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use futures::StreamExt;
use prost::Message;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use tracing::Instrument;

use crate::config::{redacted, Common};
use crate::cpu;
use crate::error::ApiError;
use crate::proto::{rpc_reply, Header, HttpRequest, HttpResponse, RpcReply};
use crate::rpc::{Method, Rpc};
use crate::service::Service;
use crate::telemetry;
use crate::Namespace;

/// Header carrying the request id end to end.
pub const REQUEST_ID: &str = "x-request-id";

tokio::task_local! {
    static CURRENT_REQUEST_ID: String;
}

/// Runs `fut` with `id` as the request id that outgoing NATS calls carry.
pub async fn with_request_id<F: Future>(id: String, fut: F) -> F::Output {
    CURRENT_REQUEST_ID.scope(id, fut).await
}

/// The request id of the work in progress, if any.
pub fn current_request_id() -> Option<String> {
    CURRENT_REQUEST_ID.try_with(|id| id.clone()).ok()
}

/// Outgoing headers: trace context and request id of the current work.
pub fn outgoing_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    telemetry::inject_nats(&mut headers);
    if let Some(id) = current_request_id() {
        headers.insert(REQUEST_ID, id.as_str());
    }
    headers
}

/// Connects to NATS as `service`: the user named after it, with its `NATS_PASSWORD` (or the
/// development default), unless the URL carries credentials of its own; `request_timeout`
/// bounds every request/reply.
pub async fn connect(
    common: &Common, service: Service, request_timeout: Duration,
) -> anyhow::Result<Client> {
    let url = &common.nats_url;
    let mut options = async_nats::ConnectOptions::new();
    if !url.contains('@') {
        let password = common
            .nats_password
            .clone()
            .unwrap_or_else(|| format!("dev-{}", service.name()));
        options = options.user_and_password(service.name().to_owned(), password);
    }
    options
        .name(service.name())
        .request_timeout(Some(request_timeout))
        .connect(servers(url)?)
        .await
        .with_context(|| format!("connecting to NATS at {} as {service}", redacted(url)))
}

/// The servers a NATS URL names: one, or a cluster's nodes separated by commas.
pub fn servers(url: &str) -> anyhow::Result<Vec<async_nats::ServerAddr>> {
    url.split(',')
        .map(|one| {
            one.trim()
                .parse()
                .with_context(|| format!("the NATS server {}", redacted(one)))
        })
        .collect()
}

/// Connects as [`connect`] does, a second time, for claim-checked bodies: the server reads
/// each connection's input in order, so a body of megabytes stored through the connection
/// that carries requests would hold up every request sent after it. The connection does
/// its reading and writing on [`cpu`]'s runtime, as the bodies' digests do.
pub async fn connect_bulk(common: &Common, service: Service) -> anyhow::Result<Client> {
    let (common, timeout) = (common.clone(), common.upstream_timeout);
    cpu::run_async(async move { connect(&common, service, timeout).await }).await
}

/// Sends `payload` to `subject` and waits for the answer of `target`; a failed request
/// becomes the error the caller sees (no responders 503, timeout 502).
async fn request(
    client: &Client, subject: String, target: Service, payload: Bytes,
) -> Result<Bytes, ApiError> {
    use async_nats::RequestErrorKind::*;
    match client
        .request_with_headers(subject, outgoing_headers(), payload)
        .await
    {
        Ok(msg) => Ok(msg.payload),
        Err(e) => Err(match e.kind() {
            NoResponders => ApiError::Unavailable(format!("{target} is unavailable")),
            TimedOut => ApiError::BadGateway(format!("{target} did not answer in time")),
            _ => ApiError::BadGateway(format!("{target} request failed: {e}")),
        }),
    }
}

fn bad_reply(target: Service, e: impl std::fmt::Display) -> ApiError {
    ApiError::BadGateway(format!("{target} sent a bad reply: {e}"))
}

/// Calls the typed RPC of `req` and returns its reply or its typed error.
pub async fn call<R: Rpc>(client: &Client, ns: &Namespace, req: &R) -> Result<R::Reply, ApiError> {
    call_on(client, ns, R::SERVICE, req).await
}

/// Calls method `R` of `service` (for methods several services answer).
pub async fn call_on<R: Method>(
    client: &Client, ns: &Namespace, service: Service, req: &R,
) -> Result<R::Reply, ApiError> {
    let subject = service.rpc_subject(ns, R::METHOD);
    let payload = request(client, subject, service, req.encode_to_vec().into()).await?;
    let reply = RpcReply::decode(payload).map_err(|e| bad_reply(service, e))?;
    match reply.outcome {
        Some(rpc_reply::Outcome::Ok(bytes)) => {
            R::Reply::decode(bytes).map_err(|e| bad_reply(service, e))
        }
        Some(rpc_reply::Outcome::Error(e)) => Err(ApiError::from_rpc(e)),
        None => Err(bad_reply(service, "empty reply")),
    }
}

/// Request bodies larger than this travel by claim check: well under NATS's default
/// `max_payload` of 1 MiB, with room for the envelope's other fields and the headers.
pub const CLAIM_CHECK_THRESHOLD: usize = 512 * 1024;

/// How long a claim-checked body is kept when nobody deletes it (a crash between put and
/// delete).
const BODY_MAX_AGE: Duration = Duration::from_secs(3600);

/// `{ns}_BODIES`: the object-store bucket of claim-checked request bodies.
pub fn bodies_bucket(ns: &Namespace) -> String {
    ns.stream("BODIES")
}

/// Creates the namespace's bucket of request bodies with `replicas` unless it exists (every
/// service at its start, like the streams).
pub async fn ensure_bodies(
    js: &async_nats::jetstream::Context, ns: &Namespace, replicas: usize,
) -> anyhow::Result<()> {
    let bucket = bodies_bucket(ns);
    if js.get_object_store(&bucket).await.is_err() {
        let config = object_store::Config {
            bucket: bucket.clone(),
            description: Some("request bodies too large for a NATS message (claim check)".into()),
            max_age: BODY_MAX_AGE,
            num_replicas: replicas,
            ..Default::default()
        };
        let what = format!("the bucket {bucket}");
        crate::placement::until_placed(&what, || js.create_object_store(config.clone())).await?;
    }
    Ok(())
}

/// The namespace's bucket of request bodies (made by [`ensure_bodies`] at each start).
async fn bodies(client: &Client, ns: &Namespace) -> Result<ObjectStore, ApiError> {
    async_nats::jetstream::new(client.clone())
        .get_object_store(&bodies_bucket(ns))
        .await
        .map_err(|e| store_unavailable("opening the request body bucket", e))
}

fn store_unavailable(context: &str, err: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %err, "{context}");
    ApiError::Unavailable(format!("{context} failed"))
}

/// Forwards an HTTP envelope to `service` and returns the service's answer. A body over
/// [`CLAIM_CHECK_THRESHOLD`] goes by claim check: stored in [`bodies_bucket`] through
/// `bulk` (see [`connect_bulk`]), its key in `body_key`, the envelope's own body empty.
pub async fn forward(
    client: &Client, bulk: &Client, ns: &Namespace, service: Service, req: &HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let subject = service.http_subject(ns);
    let payload = if req.body.len() <= CLAIM_CHECK_THRESHOLD {
        request(client, subject, service, req.encode_to_vec().into()).await?
    } else {
        let key = put_body(bulk, ns, req.body.clone()).await?;
        let envelope = HttpRequest {
            body: Bytes::new(),
            body_key: key.clone(),
            ..req.clone()
        };
        let answer = request(client, subject, service, envelope.encode_to_vec().into()).await;
        if answer.is_err() {
            // The service may never read it; if it still does, it finds the body gone and
            // answers an error nobody waits for any more.
            delete_body(bulk, ns, &key).await;
        }
        answer?
    };
    let mut answer = HttpResponse::decode(payload).map_err(|e| bad_reply(service, e))?;
    if !answer.body_key.is_empty() {
        let key = std::mem::take(&mut answer.body_key);
        let (body, store) = claim_body(bulk, ns, &key).await?;
        answer.body = body;
        if let Err(e) = store.delete(&key).await {
            tracing::warn!(error = %e, key, "could not delete a claimed answer body");
        }
    }
    Ok(answer)
}

/// Deletes the body stored under `key`, if it is still there.
async fn delete_body(client: &Client, ns: &Namespace, key: &str) {
    let js = async_nats::jetstream::new(client.clone());
    if let Ok(store) = js.get_object_store(bodies_bucket(ns)).await {
        if let Err(e) = store.delete(key).await {
            tracing::warn!(error = %e, key, "could not delete an unclaimed request body");
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Handler = Arc<dyn Fn(Bytes) -> BoxFuture<Bytes> + Send + Sync>;

/// Decodes an `R`, runs `f` on it and encodes its reply or error as an [`RpcReply`].
fn rpc_handler<R, S, F, Fut>(state: S, f: F) -> Handler
where
    R: Method,
    S: Clone + Send + Sync + 'static,
    F: Fn(S, R) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R::Reply, ApiError>> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |payload: Bytes| {
        let (f, state) = (f.clone(), state.clone());
        Box::pin(async move {
            let outcome = match R::decode(payload) {
                Ok(req) => match f(state, req).await {
                    Ok(reply) => rpc_reply::Outcome::Ok(reply.encode_to_vec().into()),
                    Err(e) => rpc_reply::Outcome::Error(e.to_rpc()),
                },
                Err(e) => rpc_reply::Outcome::Error(
                    ApiError::BadRequest(format!("undecodable request: {e}")).to_rpc(),
                ),
            };
            RpcReply {
                outcome: Some(outcome),
            }
            .encode_to_vec()
            .into()
        })
    })
}

/// Serves one service's HTTP router and RPC methods over NATS.
pub struct ServiceHost {
    client: Client,
    bulk: Client,
    ns: Namespace,
    service: Service,
    endpoints: Vec<(String, Handler)>,
}

impl ServiceHost {
    /// A host for `service`, with no endpoints yet; claim-checked bodies travel on `bulk`
    /// (see [`connect_bulk`]).
    pub fn new(client: Client, bulk: Client, ns: Namespace, service: Service) -> Self {
        Self {
            client,
            bulk,
            ns,
            service,
            endpoints: Vec::new(),
        }
    }

    /// Serves `router` for requests the gateway forwards (claim-checked bodies included).
    pub fn http(mut self, router: Router) -> Self {
        let (bulk, ns) = (self.bulk.clone(), self.ns.clone());
        let handler: Handler = Arc::new(move |payload| {
            let (router, bulk, ns) = (router.clone(), bulk.clone(), ns.clone());
            Box::pin(async move {
                handle_http(router, &bulk, &ns, payload)
                    .await
                    .encode_to_vec()
                    .into()
            })
        });
        self.endpoints
            .push((self.service.http_subject(&self.ns), handler));
        self
    }

    /// Answers the RPC of request type `R` with `f(state, request)`.
    pub fn rpc<R, S, F, Fut>(self, state: S, f: F) -> Self
    where
        R: Rpc,
        S: Clone + Send + Sync + 'static,
        F: Fn(S, R) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R::Reply, ApiError>> + Send + 'static,
    {
        debug_assert_eq!(
            R::SERVICE,
            self.service,
            "{} served by the wrong service",
            R::METHOD
        );
        self.method(state, f)
    }

    /// Answers method `R` on this service's subject (`rpc` checks the owner first).
    pub fn method<R, S, F, Fut>(mut self, state: S, f: F) -> Self
    where
        R: Method,
        S: Clone + Send + Sync + 'static,
        F: Fn(S, R) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R::Reply, ApiError>> + Send + 'static,
    {
        self.endpoints.push((
            self.service.rpc_subject(&self.ns, R::METHOD),
            rpc_handler(state, f),
        ));
        self
    }

    /// Subscribes every endpoint and answers requests until `shutdown`; in-flight requests
    /// are tracked by `tracker` so a graceful stop waits for them.
    pub async fn start(
        self, shutdown: CancellationToken, tracker: &TaskTracker,
    ) -> anyhow::Result<()> {
        let name = self.service.name();
        let service = self
            .client
            .service_builder()
            .description(format!("postmesh {name} ({})", self.ns.as_str()))
            .queue_group(self.ns.stream(name))
            .start(name, env!("CARGO_PKG_VERSION"))
            .await
            .map_err(|e| anyhow::anyhow!("starting NATS service {name}: {e}"))?;
        let mut loops = Vec::new();
        for (subject, handler) in self.endpoints {
            let mut endpoint = service
                .endpoint(&subject)
                .await
                .map_err(|e| anyhow::anyhow!("subscribing {subject}: {e}"))?;
            let inner = tracker.clone();
            loops.push(tracker.spawn(async move {
                while let Some(req) = endpoint.next().await {
                    let handler = handler.clone();
                    inner.spawn(async move {
                        let span =
                            tracing::info_span!("nats.request", subject = %req.message.subject);
                        telemetry::link_nats(&span, [req.message.headers.as_ref()]);
                        let request_id = req
                            .message
                            .headers
                            .as_ref()
                            .and_then(|h| h.get(REQUEST_ID))
                            .map(|v| v.to_string())
                            .unwrap_or_default();
                        let payload = req.message.payload.clone();
                        let started = std::time::Instant::now();
                        let reply = with_request_id(request_id, handler(payload))
                            .instrument(span)
                            .await;
                        let labels = [("subject", req.message.subject.to_string())];
                        metrics::counter!("postmesh_nats_requests_total", &labels).increment(1);
                        metrics::histogram!("postmesh_nats_request_seconds", &labels)
                            .record(started.elapsed().as_secs_f64());
                        if let Err(e) = req.respond(Ok(reply)).await {
                            tracing::warn!(error = %e, "could not send NATS reply");
                        }
                    });
                }
            }));
        }
        // A round trip through the server (as at the stop below): once it answers, the server
        // has applied the subscriptions sent before it, so the service is not reported ready
        // while a request to it would still find no responder.
        self.client
            .request("$JS.API.INFO", Bytes::new())
            .await
            .map_err(|e| anyhow::anyhow!("NATS round trip after subscribing: {e}"))?;
        let client = self.client.clone();
        tracker.spawn(async move {
            shutdown.cancelled().await;
            let _ = service.stop().await;
            // Once every endpoint has unsubscribed, make sure the server has seen it before the
            // stop is over, so a request sent after it finds no responder at once instead of
            // waiting for a reply that never comes.
            for endpoint_loop in loops {
                let _ = endpoint_loop.await;
            }
            // A request the server itself answers (JetStream's account info, which every
            // service's NATS user may ask) is a round trip through it on this connection:
            // when its answer comes back, the server has applied the unsubscriptions sent
            // before it.
            let _ = client.request("$JS.API.INFO", Bytes::new()).await;
        });
        Ok(())
    }
}

/// Runs one forwarded request through the service's router; a claim-checked body is read
/// from the bucket (through `bulk`) first and deleted once the router has answered. An
/// answer too large for a NATS message goes back by claim check too (the gateway deletes it
/// once read).
async fn handle_http(
    router: Router, bulk: &Client, ns: &Namespace, payload: Bytes,
) -> HttpResponse {
    let response = match envelope_to_request(bulk, ns, payload).await {
        Ok((req, claim)) => {
            let response = router.oneshot(req).await.unwrap_or_else(|e| match e {});
            if let Some((store, key)) = claim {
                if let Err(e) = store.delete(&key).await {
                    tracing::warn!(error = %e, key, "could not delete a claimed request body");
                }
            }
            response
        }
        Err(e) => axum::response::IntoResponse::into_response(e),
    };
    let mut answer = response_envelope(response).await;
    if answer.body.len() > CLAIM_CHECK_THRESHOLD {
        match put_body(bulk, ns, answer.body.clone()).await {
            Ok(key) => (answer.body, answer.body_key) = (Bytes::new(), key),
            Err(e) => {
                answer = response_envelope(axum::response::IntoResponse::into_response(e)).await
            }
        }
    }
    answer
}

/// An answer of the router as an envelope, its body inline.
async fn response_envelope(response: axum::response::Response) -> HttpResponse {
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    HttpResponse {
        status: parts.status.as_u16() as u32,
        headers: parts
            .headers
            .iter()
            .filter_map(|(k, v)| {
                Some(Header {
                    name: k.as_str().to_owned(),
                    value: v.to_str().ok()?.to_owned(),
                })
            })
            .collect(),
        body,
        body_key: String::new(),
    }
}

/// Bytes per object-store message of a claim-checked body: four times the store's default,
/// so a 16 MiB body is 32 stored messages, well under NATS's 1 MB `max_payload`.
const BODY_CHUNK: usize = 512 * 1024;

/// Stores `body` in the namespace's bucket under a new key; returns the key. Runs on the
/// CPU pool's runtime: the store digests the whole body, which would hold up a worker.
async fn put_body(client: &Client, ns: &Namespace, body: Bytes) -> Result<String, ApiError> {
    let (client, ns) = (client.clone(), ns.clone());
    cpu::run_async(async move {
        let store = bodies(&client, &ns).await?;
        let key = uuid::Uuid::now_v7().simple().to_string();
        store
            .put(
                object_store::ObjectMetadata {
                    name: key.clone(),
                    chunk_size: Some(BODY_CHUNK),
                    ..Default::default()
                },
                &mut &body[..],
            )
            .await
            .map_err(|e| store_unavailable("storing a body", e))?;
        Ok(key)
    })
    .await
}

/// Reads the body `key` names from the namespace's bucket; returns it with the bucket, to
/// delete it later. A body that is gone (expired, or its request given up) is a 502. Runs
/// on the CPU pool's runtime: the store digests the whole body, which would hold up a worker.
async fn claim_body(
    client: &Client, ns: &Namespace, key: &str,
) -> Result<(Bytes, ObjectStore), ApiError> {
    let (client, ns, key) = (client.clone(), ns.clone(), key.to_owned());
    cpu::run_async(async move { read_body(&client, &ns, &key).await }).await
}

/// [`claim_body`], where it runs.
async fn read_body(
    client: &Client, ns: &Namespace, key: &str,
) -> Result<(Bytes, ObjectStore), ApiError> {
    use tokio::io::AsyncReadExt;
    let gone = || ApiError::BadGateway(format!("request body {key} is no longer stored"));
    let js = async_nats::jetstream::new(client.clone());
    let store = js.get_object_store(bodies_bucket(ns)).await.map_err(|e| {
        tracing::warn!(error = %e, key, "request body bucket not found");
        gone()
    })?;
    let mut object = store.get(key).await.map_err(|e| match e.kind() {
        GetErrorKind::NotFound => gone(),
        _ => store_unavailable("reading the request body", e),
    })?;
    let mut body = Vec::with_capacity(object.info.size);
    object
        .read_to_end(&mut body)
        .await
        .map_err(|e| store_unavailable("reading the request body", e))?;
    Ok((body.into(), store))
}

/// The envelope as a request, with the bucket and key of its claim-checked body if any.
async fn envelope_to_request(
    client: &Client, ns: &Namespace, payload: Bytes,
) -> Result<(http::Request<Body>, Option<(ObjectStore, String)>), ApiError> {
    let env = HttpRequest::decode(payload)
        .map_err(|e| ApiError::BadRequest(format!("undecodable request envelope: {e}")))?;
    let uri = if env.query.is_empty() {
        env.path
    } else {
        format!("{}?{}", env.path, env.query)
    };
    let mut builder = http::Request::builder()
        .method(env.method.as_str())
        .uri(uri);
    for h in &env.headers {
        builder = builder.header(h.name.as_str(), h.value.as_str());
    }
    let mut req = builder
        .body(Body::from(env.body))
        .map_err(|e| ApiError::BadRequest(format!("invalid request envelope: {e}")))?;
    if let Some(auth) = env.auth {
        req.extensions_mut().insert(auth);
    }
    if env.body_key.is_empty() {
        return Ok((req, None));
    }
    let (body, store) = claim_body(client, ns, &env.body_key).await?;
    *req.body_mut() = Body::from(body);
    Ok((req, Some((store, env.body_key))))
}
