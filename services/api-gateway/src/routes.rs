//! The gateway's router, built from the route table (`table`): each path with its auth
//! policy, its body limit, served here in the gateway or forwarded to its owning service
//! over NATS as an HTTP envelope. Paths, policies and limits come from the owners' route
//! lists, so an endpoint is declared once, where it is handled.

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Response, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::{on, MethodRouter};
use axum::Router;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use postmesh_contracts::{Policy, RouteSpec};
use postmesh_shared::proto::{AuthContext, Header, HttpRequest};
use postmesh_shared::routes::{method_filter, Bodies, NO_SUCH_ENDPOINT};
use postmesh_shared::{nats, ApiError, Routes, Service};

use crate::table::{table, Entry, Target};
use crate::{
    accounts, codes, dead_letters, device, login, openapi, reference, sessions, tracking, web,
    AppState,
};

/// The routes the gateway serves itself.
fn local() -> Routes<AppState> {
    codes::routes()
        .merge(login::routes())
        .merge(accounts::routes())
        .merge(device::routes())
        .merge(web::routes())
        .merge(dead_letters::routes())
        .merge(openapi::routes())
        .merge(reference::routes())
        .merge(tracking::routes())
}

/// Each of the gateway's own routes with the JSON bodies it takes and answers, for the
/// API's document.
pub fn bodies() -> Vec<(RouteSpec, Bodies)> {
    local().bodies()
}

/// Builds the public router from the route table. A route with its own body limit gets it
/// as a route layer, over the router-wide `GATEWAY_BODY_LIMIT`.
///
/// # Panics
/// When the gateway's own handlers do not serve exactly its manifest.
pub fn router(state: AppState) -> Router {
    let local = local();
    if let Err(e) = local.check(Service::ApiGateway.routes()) {
        panic!("the gateway's routes disagree with their manifest: {e}");
    }
    let mut handlers: Vec<(RouteSpec, MethodRouter<AppState>)> = local
        .into_inner()
        .into_iter()
        .map(|r| (r.spec, r.into_handler()))
        .collect();
    for Entry { spec, target } in table() {
        let Target::Service(service) = target else {
            continue;
        };
        let to_service = on(
            method_filter(spec.method),
            move |state: State<AppState>, req: Request| {
                forward(state, service, spec.body_limit, req)
            },
        );
        let to_service = match spec.body_limit {
            Some(limit) => to_service.layer(DefaultBodyLimit::max(limit)),
            None => to_service,
        };
        handlers.push((spec, to_service));
    }
    let (mut public, mut keyed, mut mta, mut provider) =
        (Router::new(), Router::new(), Router::new(), Router::new());
    let (mut session, mut page) = (Router::new(), Router::new());
    for (spec, handler) in handlers {
        match spec.policy {
            Policy::Public => public = public.route(spec.path, handler),
            Policy::Key => keyed = keyed.route(spec.path, handler),
            Policy::InboundSecret => mta = mta.route(spec.path, handler),
            Policy::ProviderSecret => provider = provider.route(spec.path, handler),
            Policy::Session => session = session.route(spec.path, handler),
            Policy::Page => page = page.route(spec.path, handler),
        }
    }
    let session = session.route_layer(middleware::from_fn_with_state(
        state.clone(),
        sessions::require_session,
    ));
    let page = page.route_layer(middleware::from_fn_with_state(
        state.clone(),
        sessions::require_page_session,
    ));
    let keyed = keyed.route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    let mta = mta.route_layer(middleware::from_fn_with_state(
        state.clone(),
        require_inbound_secret,
    ));
    let provider = provider.route_layer(middleware::from_fn_with_state(
        state.clone(),
        require_provider_secret,
    ));
    public
        .merge(keyed)
        .merge(mta)
        .merge(provider)
        .merge(session)
        .merge(page)
        .fallback(|| async { ApiError::NotFound(NO_SUCH_ENDPOINT.into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// Admits requests carrying a valid API key within its request rate, attaching the caller's
/// `AuthContext`. An address past its failed authentications this minute is refused first
/// (429), before any key is looked up.
async fn require_key(
    State(state): State<AppState>, req: Request, next: Next,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let ip = sessions::client_ip(&state, &parts);
    state.failed_auths.check(ip)?;
    let mut req = Request::from_parts(parts, body);
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let authenticated = match token {
        Some(token) => state.keys.authenticate(token).await,
        None => Err(ApiError::Unauthorized(
            "missing API key: send Authorization: Bearer <key>".into(),
        )),
    };
    let auth = match authenticated {
        Ok(auth) => auth,
        Err(e) => {
            if matches!(e, ApiError::Unauthorized(_)) {
                state.failed_auths.failed(ip);
            }
            return Err(e);
        }
    };
    let mut redis = state.redis.clone();
    state
        .rate
        .check(&mut redis, &state.ns, &auth.key_id)
        .await?;
    state
        .rate
        .check_account(&mut redis, &state.ns, &auth.account_id)
        .await?;
    req.extensions_mut().insert(auth);
    Ok(next.run(req).await)
}

/// The header the upstream MTA proves itself with.
pub const INBOUND_SECRET_HEADER: &str = "x-service-inbound-secret";

/// Whether `given` equals `expected`, compared in constant time (digests first, so the
/// time does not depend on the lengths either).
fn same_secret(given: &[u8], expected: &str) -> bool {
    bool::from(Sha256::digest(given).ct_eq(&Sha256::digest(expected.as_bytes())))
}

/// Admits the upstream MTA: `x-service-inbound-secret` must equal `INBOUND_SECRET`; 503
/// while no secret is configured, 401 otherwise.
async fn require_inbound_secret(
    State(state): State<AppState>, req: Request, next: Next,
) -> Result<Response<Body>, ApiError> {
    let Some(expected) = &state.config.inbound_secret else {
        return Err(ApiError::Unavailable(
            "inbound mail is not configured (INBOUND_SECRET)".into(),
        ));
    };
    let given = req
        .headers()
        .get(INBOUND_SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !same_secret(given, expected) {
        return Err(ApiError::Unauthorized(format!(
            "missing or wrong {INBOUND_SECRET_HEADER}"
        )));
    }
    Ok(next.run(req).await)
}

/// The header the cloud mail provider proves itself with.
pub const PROVIDER_SECRET_HEADER: &str = "x-service-provider-secret";

/// Admits the cloud mail provider: `x-service-provider-secret` (or, with
/// `PROVIDER_SECRET_IN_QUERY=1`, the query's `token`) must equal `PROVIDER_SECRET`; 503
/// while none is configured, 401 otherwise, and for a `token` that is not allowed.
async fn require_provider_secret(
    State(state): State<AppState>, req: Request, next: Next,
) -> Result<Response<Body>, ApiError> {
    let Some(expected) = &state.config.provider_secret else {
        return Err(ApiError::Unavailable(
            "provider notifications are not configured (PROVIDER_SECRET)".into(),
        ));
    };
    let from_query = req.uri().query().and_then(|q| {
        serde_urlencoded::from_str::<Vec<(String, String)>>(q)
            .ok()?
            .into_iter()
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v)
    });
    if from_query.is_some() && !state.config.provider_secret_in_query {
        return Err(ApiError::Unauthorized(format!(
            "the provider secret goes in {PROVIDER_SECRET_HEADER}, not the query"
        )));
    }
    let given = match req.headers().get(PROVIDER_SECRET_HEADER) {
        Some(v) => v.as_bytes().to_vec(),
        None => from_query.unwrap_or_default().into_bytes(),
    };
    if !same_secret(&given, expected) {
        return Err(ApiError::Unauthorized(format!(
            "missing or wrong {PROVIDER_SECRET_HEADER}"
        )));
    }
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

/// Spends `bytes` of the caller's account's body budget (callers without an account, the
/// MTA and the provider, have none).
async fn spend_body(
    state: &crate::Gateway, auth: Option<&AuthContext>, bytes: u64,
) -> Result<(), ApiError> {
    let Some(auth) = auth else {
        return Ok(());
    };
    let mut redis = state.redis.clone();
    state
        .body_rate
        .check(&mut redis, &state.ns, &auth.account_id, bytes)
        .await
}

/// Sends the request to `service` as an envelope and relays its answer. The body may be up
/// to the route's own limit (`body_limit`), else `GATEWAY_BODY_LIMIT`; one too large for a
/// NATS message goes by claim check (`nats::forward`).
async fn forward(
    State(state): State<AppState>, service: Service, body_limit: Option<usize>, req: Request,
) -> Result<Response<Body>, ApiError> {
    let limit = body_limit.unwrap_or(state.config.body_limit);
    let (parts, body) = req.into_parts();
    // A declared length that cannot fit is refused before a byte of the body is read.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::PayloadTooLarge(format!(
            "request body over {limit} bytes"
        )));
    }
    // A large body spends its account's byte budget: before it is read when its length is
    // declared, else once it has been.
    let auth = parts.extensions.get::<AuthContext>();
    if let Some(len) = declared {
        spend_body(&state, auth, len).await?;
    }
    let body = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(format!("request body over {limit} bytes")))?;
    if declared.is_none() {
        spend_body(&state, auth, body.len() as u64).await?;
    }
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
    let reply = nats::forward(&state.nats, &state.bulk, &state.ns, service, &envelope).await?;
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
