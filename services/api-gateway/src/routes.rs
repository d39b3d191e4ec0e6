//! The route table: each path with its auth policy, its body limit and where it is served —
//! here in the gateway, or by its owning service over NATS as an HTTP envelope. Paths,
//! policies and limits come from the owners' route lists, so an endpoint is declared once,
//! where it is handled.

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Response, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::{any, MethodRouter};
use axum::Router;

use postmesh_shared::proto::{AuthContext, Header, HttpRequest};
use postmesh_shared::routes::{Declared, Manifest, NO_SUCH_ENDPOINT};
use postmesh_shared::{nats, ApiError, Policy, Service};

use crate::{codes, AppState};

/// Where a route is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A handler in the gateway.
    Gateway,
    /// The service's own router, over NATS.
    Service(Service),
}

/// One row of the gateway's route table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub path: &'static str,
    pub policy: Policy,
    /// The route's own body limit; `None`: `GATEWAY_BODY_LIMIT`.
    pub body_limit: Option<usize>,
    pub target: Target,
}

/// The routes each service owns, as it declares them.
fn forwarded() -> Vec<(Service, Manifest)> {
    vec![
        (Service::Billing, billing::routes().manifest()),
        (Service::Domain, domain::routes().manifest()),
        (Service::Sender, sender::routes().manifest()),
    ]
}

/// The whole route table: the gateway's own routes and every service's.
pub fn table() -> Vec<Entry> {
    let entry = |d: Declared, target| Entry {
        path: d.path,
        policy: d.policy,
        body_limit: d.body_limit,
        target,
    };
    let local = codes::routes()
        .manifest()
        .into_iter()
        .map(|d| entry(d, Target::Gateway));
    let remote = forwarded().into_iter().flat_map(|(service, routes)| {
        routes
            .into_iter()
            .map(move |d| entry(d, Target::Service(service)))
    });
    local.chain(remote).collect()
}

/// Builds the public router from the route table. A route with its own body limit gets it
/// as a route layer, over the router-wide `GATEWAY_BODY_LIMIT`.
pub fn router(state: AppState) -> Router {
    let mut handlers: Vec<(&'static str, Policy, MethodRouter<AppState>)> = codes::routes()
        .into_inner()
        .into_iter()
        .map(|r| (r.path, r.policy, r.limited_handler()))
        .collect();
    for (service, routes) in forwarded() {
        for Declared {
            path,
            policy,
            body_limit,
        } in routes
        {
            let to_service = any(move |state: State<AppState>, req: Request| {
                forward(state, service, body_limit, req)
            });
            let to_service = match body_limit {
                Some(limit) => to_service.layer(DefaultBodyLimit::max(limit)),
                None => to_service,
            };
            handlers.push((path, policy, to_service));
        }
    }
    let (mut public, mut keyed) = (Router::new(), Router::new());
    for (path, policy, handler) in handlers {
        match policy {
            Policy::Public => public = public.route(path, handler),
            Policy::Key => keyed = keyed.route(path, handler),
        }
    }
    let keyed = keyed.route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    public
        .merge(keyed)
        .fallback(|| async { ApiError::NotFound(NO_SUCH_ENDPOINT.into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// Admits requests carrying a valid API key within its request rate, attaching the caller's
/// `AuthContext`.
async fn require_key(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response<Body>, ApiError> {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or_else(|| {
            ApiError::Unauthorized("missing API key: send Authorization: Bearer <key>".into())
        })?;
    let auth = state.keys.authenticate(token).await?;
    let mut redis = state.redis.clone();
    state
        .rate
        .check(&mut redis, &state.ns, &auth.api_key_id)
        .await?;
    req.extensions_mut().insert(auth);
    Ok(next.run(req).await)
}

/// Request headers a service may see. Credentials never leave the gateway.
const FORWARDED_REQUEST_HEADERS: [HeaderName; 6] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    header::USER_AGENT,
    HeaderName::from_static("idempotency-key"),
    HeaderName::from_static("x-request-id"),
    // Billing checks it against the raw body of Stripe's webhooks.
    HeaderName::from_static("stripe-signature"),
];

/// Sends the request to `service` as an envelope and relays its answer. The body may be up
/// to the route's own limit (`body_limit`), else `GATEWAY_BODY_LIMIT`; one too large for a
/// NATS message goes by claim check (`nats::forward`).
async fn forward(
    State(state): State<AppState>,
    service: Service,
    body_limit: Option<usize>,
    req: Request,
) -> Result<Response<Body>, ApiError> {
    let limit = body_limit.unwrap_or(state.body_limit);
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(format!("request body over {limit} bytes")))?;
    let headers = FORWARDED_REQUEST_HEADERS
        .iter()
        .filter_map(|name| {
            let value = parts.headers.get(name)?.to_str().ok()?;
            Some(Header {
                name: name.as_str().to_owned(),
                value: value.to_owned(),
            })
        })
        .collect();
    let envelope = HttpRequest {
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        headers,
        body,
        auth: parts.extensions.get::<AuthContext>().cloned(),
        body_key: String::new(),
    };
    let reply = nats::forward(&state.nats, &state.ns, service, &envelope).await?;
    let status = u16::try_from(reply.status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| ApiError::BadGateway(format!("{service} answered an invalid status")))?;
    let mut res = Response::new(Body::from(reply.body));
    *res.status_mut() = status;
    for h in reply.headers {
        let name = HeaderName::from_bytes(h.name.as_bytes());
        let value = HeaderValue::from_str(&h.value);
        if let (Ok(name), Ok(value)) = (name, value) {
            if name != header::CONTENT_LENGTH
                && name != header::TRANSFER_ENCODING
                && name != header::CONNECTION
            {
                res.headers_mut().append(name, value);
            }
        }
    }
    Ok(res.into_response())
}
