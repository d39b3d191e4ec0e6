//! Inbox webhook endpoints as a resource: on an inbox address of the workspace (asked of the
//! inbound service), at most 10 per address, a URL once per address, a signing secret shown
//! once and stored sealed.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{Caller, IdPath, JsonBody, QueryParams};
use postmesh_shared::proto::InboxAddressRequest;
use postmesh_shared::{nats, AddressId, ApiError, Success};

use crate::secret::SigningSecret;
use crate::target::Target;
use crate::AppState;

/// Endpoints an address may have.
pub const MAX_PER_ADDRESS: i64 = 10;

/// How a delivery carries the message's body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum BodyFormat {
    #[default]
    Text,
    Html,
    Markdown,
}

/// An endpoint as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow)]
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
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    pub endpoint: EndpointView,
    pub signing_secret: String,
}

/// One endpoint in an answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct EndpointPage {
    pub endpoint: EndpointView,
}

/// `GET /inbox/webhook/endpoints` answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct EndpointList {
    pub endpoints: Vec<EndpointView>,
}

/// `DELETE /inbox/webhook/endpoints/{id}` answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct NewEndpoint {
    address_id: AddressId,
    url: String,
    #[serde(default = "yes")]
    active: bool,
    #[serde(default)]
    body_format: BodyFormat,
    #[serde(default)]
    strip_quotes: bool,
    signing_secret: Option<String>,
}

fn yes() -> bool {
    true
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewEndpoint>,
) -> Result<impl IntoResponse, ApiError> {
    let secret = match &body.signing_secret {
        Some(raw) => SigningSecret::parse(raw).map_err(ApiError::BadRequest)?,
        None => SigningSecret::generate(),
    };
    let target = Target::check(&body.url, state.allow_insecure)
        .await
        .map_err(ApiError::BadRequest)?;
    require_address(&state, &caller, body.address_id).await?;
    let id = Uuid::now_v7();
    let mut tx = state.db.begin().await?;
    // An address's endpoints are added one at a time, so the limit holds under races.
    db::take_turns(&mut tx, Turns::Workspace, caller.workspace).await?;
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE address_id = $1")
        .bind(body.address_id)
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
    .bind(body.address_id)
    .bind(target.url.as_str())
    .bind(body.active)
    .bind(body.body_format)
    .bind(body.strip_quotes)
    .bind(state.secrets.seal(id.as_bytes(), secret.key()))
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await;
    let endpoint = match inserted {
        Ok(endpoint) => endpoint,
        Err(e) if db::is_unique_violation(&e) => {
            return Err(ApiError::Conflict(format!(
                "{} is already an endpoint of this address",
                target.url
            )))
        }
        Err(e) => return Err(e.into()),
    };
    tx.commit().await?;
    let created = Created {
        endpoint,
        signing_secret: secret.reveal(),
    };
    Ok((StatusCode::CREATED, Success::new(created)))
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

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
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

/// The caller's endpoint `id`, or 404.
async fn owned(db: &PgPool, caller: &Caller, id: Uuid) -> Result<EndpointView, ApiError> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM endpoints WHERE id = $1 AND workspace_id = $2"
    ))
    .bind(id)
    .bind(caller.workspace)
    .fetch_optional(db)
    .await?
    .ok_or_else(|| ApiError::NotFound("no such endpoint".into()))
}

pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<EndpointPage>, ApiError> {
    let endpoint = owned(&state.db, &caller, id).await?;
    Ok(Success::new(EndpointPage { endpoint }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Changes {
    url: Option<String>,
    active: Option<bool>,
    body_format: Option<BodyFormat>,
    strip_quotes: Option<bool>,
}

pub(crate) async fn update(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    JsonBody(changes): JsonBody<Changes>,
) -> Result<Success<EndpointPage>, ApiError> {
    let current = owned(&state.db, &caller, id).await?;
    let url = match &changes.url {
        Some(raw) => Target::check(raw, state.allow_insecure)
            .await
            .map_err(ApiError::BadRequest)?
            .url
            .to_string(),
        None => current.url,
    };
    let updated = sqlx::query_as(&format!(
        "UPDATE endpoints SET url = $3, active = $4, body_format = $5, strip_quotes = $6
         WHERE id = $1 AND workspace_id = $2 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(caller.workspace)
    .bind(&url)
    .bind(changes.active.unwrap_or(current.active))
    .bind(changes.body_format.unwrap_or(current.body_format))
    .bind(changes.strip_quotes.unwrap_or(current.strip_quotes))
    .fetch_optional(&state.db)
    .await;
    match updated {
        Ok(Some(endpoint)) => Ok(Success::new(EndpointPage { endpoint })),
        Ok(None) => Err(ApiError::NotFound("no such endpoint".into())),
        Err(e) if db::is_unique_violation(&e) => Err(ApiError::Conflict(format!(
            "{url} is already an endpoint of this address"
        ))),
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Deleted>, ApiError> {
    let done = sqlx::query("DELETE FROM endpoints WHERE id = $1 AND workspace_id = $2")
        .bind(id)
        .bind(caller.workspace)
        .execute(&state.db)
        .await?;
    if done.rows_affected() == 0 {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    Ok(Success::new(Deleted { deleted: true }))
}
