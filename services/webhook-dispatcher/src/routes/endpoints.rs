//! Inbox webhook endpoints as a resource: on an inbox address of the workspace (asked of the
//! inbound service), at most 10 per address, a URL once per address, a signing secret shown
//! once and stored sealed.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{Caller, IdPath, JsonBody, QueryParams};
use postmesh_shared::proto::InboxAddressRequest;
use postmesh_shared::{nats, AddressId, ApiError, Success};

use crate::attempt::owner::Owner;
use crate::content::quotes::BodyFormat;
use crate::secret::{GivenSecret, SigningSecret};
use crate::target::{Target, WebhookUrl};
use crate::AppState;

/// Endpoints an address may have.
pub const MAX_PER_ADDRESS: i64 = 10;

/// An endpoint as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    pub id: Uuid,
    pub address_id: AddressId,
    pub url: String,
    pub active: bool,
    pub body_format: BodyFormat,
    pub strip_quotes: bool,
    pub created_at: i64,
}

/// The columns of [`EndpointView`].
const COLUMNS: &str = "id, address_id, url, active, body_format, strip_quotes, created_at";

/// `POST /inbox/webhook/endpoints` answer: the secret, this once.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = EndpointCreated)]
pub struct Created {
    pub endpoint: EndpointView,
    pub signing_secret: String,
}

/// One endpoint in an answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EndpointPage {
    pub endpoint: EndpointView,
}

/// `GET /inbox/webhook/endpoints` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EndpointList {
    pub endpoints: Vec<EndpointView>,
}

/// `DELETE /inbox/webhook/endpoints/{id}` and `DELETE /webhooks/{id}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = WebhookDeleted)]
pub struct Deleted {
    pub deleted: bool,
}

/// `POST /inbox/webhook/endpoints` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = EndpointCreateRequest)]
pub(crate) struct NewEndpoint {
    address_id: AddressId,
    url: WebhookUrl,
    #[serde(default = "yes")]
    active: bool,
    #[serde(default)]
    body_format: BodyFormat,
    #[serde(default)]
    strip_quotes: bool,
    signing_secret: Option<GivenSecret>,
}

fn yes() -> bool {
    true
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewEndpoint>,
) -> Result<(StatusCode, Success<Created>), ApiError> {
    let secret = match &body.signing_secret {
        Some(raw) => SigningSecret::parse(raw).map_err(ApiError::BadRequest)?,
        None => SigningSecret::generate(),
    };
    let target = state.reach.check(&body.url).await?;
    require_address(&state, &caller, body.address_id).await?;
    let settings = Settings {
        active: body.active,
        body_format: body.body_format,
        strip_quotes: body.strip_quotes,
    };
    let endpoint = insert(&state, &caller, body.address_id, &target, settings, &secret).await?;
    let created = Created {
        endpoint,
        signing_secret: secret.reveal(),
    };
    Ok((StatusCode::CREATED, Success::new(created)))
}

/// What an endpoint does with the mail it gets.
struct Settings {
    active: bool,
    body_format: BodyFormat,
    strip_quotes: bool,
}

/// Adds an endpoint of `address` at `target`, unless the address has its 10 (409) or the
/// URL already (409).
async fn insert(
    state: &AppState, caller: &Caller, address: AddressId, target: &Target, settings: Settings,
    secret: &SigningSecret,
) -> Result<EndpointView, ApiError> {
    let id = Uuid::now_v7();
    let mut tx = state.db.begin().await?;
    // An address's endpoints are added one at a time, so the limit holds under races.
    db::take_turns(&mut tx, Turns::Workspace, caller.workspace).await?;
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE address_id = $1")
        .bind(address)
        .fetch_one(&mut *tx)
        .await?;
    if held >= MAX_PER_ADDRESS {
        return Err(ApiError::Conflict(format!(
            "an address has at most {MAX_PER_ADDRESS} endpoints"
        )));
    }
    let inserted = sqlx::query_as(&format!(
        "INSERT INTO endpoints (id, workspace_id, address_id, url, active, body_format,
             strip_quotes, secret_sealed, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(caller.workspace)
    .bind(address)
    .bind(target.url.as_str())
    .bind(settings.active)
    .bind(settings.body_format)
    .bind(settings.strip_quotes)
    .bind(state.secrets.seal(id.as_bytes(), secret.key()))
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await;
    match inserted {
        Ok(endpoint) => {
            tx.commit().await?;
            Ok(endpoint)
        }
        Err(e) if db::is_unique_violation(&e) => Err(url_taken(&target.url)),
        Err(e) => Err(e.into()),
    }
}

fn url_taken(url: impl std::fmt::Display) -> ApiError {
    ApiError::Conflict(format!("{url} is already an endpoint of this address"))
}

/// 404 unless `address` is a live inbox address of the caller's workspace.
async fn require_address(
    state: &AppState, caller: &Caller, address: AddressId,
) -> Result<(), ApiError> {
    let client = state
        .nats
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the inbound service is not reachable".into()))?;
    let reply = nats::call(
        client,
        &state.ns,
        &InboxAddressRequest {
            workspace_id: caller.workspace.to_string(),
            address_id: address.to_string(),
        },
    )
    .await?;
    if reply.found {
        Ok(())
    } else {
        Err(ApiError::NotFound("no such inbox address".into()))
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    #[param(value_type = Option<String>, format = Uuid)]
    address_id: Option<AddressId>,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<ListQuery>,
) -> Result<Success<EndpointList>, ApiError> {
    let endpoints = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM endpoints
         WHERE workspace_id = $1 AND ($2::uuid IS NULL OR address_id = $2)
         ORDER BY created_at, id"
    ))
    .bind(caller.workspace)
    .bind(q.address_id)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(EndpointList { endpoints }))
}

pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<EndpointPage>, ApiError> {
    let endpoint = Owner::Endpoint
        .find(&state.db, COLUMNS, &caller, id)
        .await?;
    Ok(Success::new(EndpointPage { endpoint }))
}

/// `PATCH /inbox/webhook/endpoints/{id}` body: what to change.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = EndpointChanges)]
pub(crate) struct Changes {
    url: Option<WebhookUrl>,
    active: Option<bool>,
    body_format: Option<BodyFormat>,
    strip_quotes: Option<bool>,
}

pub(crate) async fn update(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    JsonBody(changes): JsonBody<Changes>,
) -> Result<Success<EndpointPage>, ApiError> {
    let current: EndpointView = Owner::Endpoint
        .find(&state.db, COLUMNS, &caller, id)
        .await?;
    let endpoint = apply(&state, &caller, current, &changes).await?;
    Ok(Success::new(EndpointPage { endpoint }))
}

/// `current` with `changes` made (a new URL checked again).
async fn apply(
    state: &AppState, caller: &Caller, current: EndpointView, changes: &Changes,
) -> Result<EndpointView, ApiError> {
    let url = state
        .reach
        .changed(changes.url.as_deref(), current.url)
        .await?;
    let updated = sqlx::query_as(&format!(
        "UPDATE endpoints SET url = $3, active = $4, body_format = $5, strip_quotes = $6,
             failing_since = CASE WHEN ($4 AND NOT active) OR url <> $3 THEN NULL
                 ELSE failing_since END
         WHERE id = $1 AND workspace_id = $2 RETURNING {COLUMNS}"
    ))
    .bind(current.id)
    .bind(caller.workspace)
    .bind(&url)
    .bind(changes.active.unwrap_or(current.active))
    .bind(changes.body_format.unwrap_or(current.body_format))
    .bind(changes.strip_quotes.unwrap_or(current.strip_quotes))
    .fetch_optional(&state.db)
    .await;
    match updated {
        Ok(Some(endpoint)) => Ok(endpoint),
        Ok(None) => Err(ApiError::NotFound("no such endpoint".into())),
        Err(e) if db::is_unique_violation(&e) => Err(url_taken(&url)),
        Err(e) => Err(e.into()),
    }
}

/// How long a rotated-out secret keeps signing beside the new one.
pub const ROTATION_OVERLAP_SECS: i64 = 24 * 3600;

/// `PUT /inbox/webhook/addresses/{addressId}` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = AddressSubscriptionRequest)]
pub(crate) struct Subscription {
    #[serde(flatten)]
    changes: Changes,
    signing_secret: Option<GivenSecret>,
    #[serde(default)]
    rotate_secret: bool,
}

/// `PUT /inbox/webhook/addresses/{addressId}` answer: the secret on creation or rotation.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = AddressSubscribed)]
pub struct Subscribed {
    pub subscription: EndpointView,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret: Option<String>,
}

/// The legacy PUT: creates the address's first endpoint, or updates its oldest. A given
/// `signingSecret` or `rotateSecret` replaces the secret; the old one keeps signing beside it
/// for [`ROTATION_OVERLAP_SECS`]. The secret is answered on creation and on `rotateSecret`.
pub(crate) async fn subscribe(
    State(state): State<AppState>, caller: Caller, IdPath(address): IdPath<AddressId>,
    JsonBody(body): JsonBody<Subscription>,
) -> Result<Success<Subscribed>, ApiError> {
    let given = match &body.signing_secret {
        Some(raw) => Some(SigningSecret::parse(raw).map_err(ApiError::BadRequest)?),
        None => None,
    };
    require_address(&state, &caller, address).await?;
    let oldest: Option<EndpointView> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM endpoints WHERE address_id = $1 AND workspace_id = $2
         ORDER BY created_at, id LIMIT 1"
    ))
    .bind(address)
    .bind(caller.workspace)
    .fetch_optional(&state.db)
    .await?;
    let Some(current) = oldest else {
        let raw = body.changes.url.as_deref().ok_or_else(|| {
            ApiError::BadRequest("url is required to create the address's first endpoint".into())
        })?;
        let target = state.reach.check(raw).await?;
        let settings = Settings {
            active: body.changes.active.unwrap_or(true),
            body_format: body.changes.body_format.unwrap_or_default(),
            strip_quotes: body.changes.strip_quotes.unwrap_or(false),
        };
        let secret = given.unwrap_or_else(SigningSecret::generate);
        let subscription = insert(&state, &caller, address, &target, settings, &secret).await?;
        return Ok(Success::new(Subscribed {
            subscription,
            signing_secret: Some(secret.reveal()),
        }));
    };
    let id = current.id;
    let subscription = apply(&state, &caller, current, &body.changes).await?;
    let new_secret = match (given, body.rotate_secret) {
        (Some(secret), _) => Some(secret),
        (None, true) => Some(SigningSecret::generate()),
        (None, false) => None,
    };
    let mut signing_secret = None;
    if let Some(secret) = new_secret {
        sqlx::query(
            "UPDATE endpoints SET previous_secret_sealed = secret_sealed,
                 previous_secret_until = $2, secret_sealed = $3
             WHERE id = $1",
        )
        .bind(id)
        .bind(now_unix() + ROTATION_OVERLAP_SECS)
        .bind(state.secrets.seal(id.as_bytes(), secret.key()))
        .execute(&state.db)
        .await?;
        signing_secret = body.rotate_secret.then(|| secret.reveal());
    }
    Ok(Success::new(Subscribed {
        subscription,
        signing_secret,
    }))
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Deleted>, ApiError> {
    Owner::Endpoint.remove(&state.db, &caller, id).await?;
    Ok(Success::new(Deleted { deleted: true }))
}
