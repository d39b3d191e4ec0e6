//! A workspace's suppression list: `GET /suppressions` (paged, `?email=`), `POST
//! /suppressions {email, reason: manual, topic?}` and `DELETE /suppressions/{email}`
//! (`?topic=`). Unsubscribes, bounces and complaints are written by the unsubscribe page
//! and provider notifications; what each entry blocks is in [`crate::sending::governance`].

use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, JsonBody, Page, PageQuery, QueryParams};
use postmesh_shared::{email, ApiError, EmailAddress, Success, WorkspaceId};

use crate::audience::contacts::{name, Name};
use crate::AppState;

/// Entries per page by default.
const DEFAULT_LIMIT: i64 = 50;

/// Why an address is suppressed.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[schema(as = SuppressionReason)]
pub enum Reason {
    Unsubscribed,
    Bounce,
    Complaint,
    Manual,
}

/// One entry.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Suppression {
    pub email: String,
    pub reason: Reason,
    /// The topic it applies to; none: every topic.
    pub topic: Option<String>,
    pub created_at: i64,
}

/// Adds an entry (again: nothing changes); `topic` none for every topic.
pub async fn add(
    db: impl sqlx::PgExecutor<'_>, workspace: WorkspaceId, email: &EmailAddress, reason: Reason,
    topic: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO suppressions (workspace_id, email_key, email, reason, topic, created_at)
         VALUES ($1, $6, $2, $3, COALESCE($4, ''), $5) ON CONFLICT DO NOTHING",
    )
    .bind(workspace)
    .bind(email.as_str())
    .bind(reason)
    .bind(topic)
    .bind(now_unix())
    .bind(email.key())
    .execute(db)
    .await
    .map(drop)
}

/// `GET /suppressions` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    pub email: Option<String>,
}

/// `GET /suppressions` answer, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SuppressionPage {
    pub suppressions: Vec<Suppression>,
    pub limit: i64,
    pub offset: i64,
}

const COLUMNS: &str = "email, reason, NULLIF(topic, '') AS topic, created_at";

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<ListQuery>,
    QueryParams(page): QueryParams<PageQuery>,
) -> Result<Success<SuppressionPage>, ApiError> {
    let Page { limit, offset } = page.page(DEFAULT_LIMIT)?;
    let suppressions = sqlx::query_as::<_, Suppression>(&format!(
        "SELECT {COLUMNS} FROM suppressions
         WHERE workspace_id = $1 AND ($2::text IS NULL OR email_key = $2)
         ORDER BY created_at DESC, email_key, reason, topic LIMIT $3 OFFSET $4"
    ))
    .bind(caller.workspace)
    .bind(q.email.as_deref().map(email::key))
    .bind(limit)
    .bind(offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(SuppressionPage {
        suppressions,
        limit,
        offset,
    }))
}

/// `POST /suppressions` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct NewSuppression {
    #[schema(format = Email, required = true, nullable = false)]
    pub email: Option<String>,
    /// Only `manual`: the others are recorded as they happen.
    #[schema(schema_with = manual)]
    pub reason: Option<String>,
    /// The topic it applies to; none: every topic.
    pub topic: Option<Name>,
}

/// `reason`: `manual`, or null.
fn manual() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .enum_values(Some([Value::from("manual"), Value::Null]))
}

/// `POST /suppressions` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SuppressionAdded)]
pub struct Added {
    pub suppression: Suppression,
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewSuppression>,
) -> Result<Success<Added>, ApiError> {
    let raw = body.email.unwrap_or_default();
    let email = EmailAddress::parse(&raw)
        .ok_or_else(|| ApiError::BadRequest(format!("invalid email address {raw:?}")))?;
    if !matches!(body.reason.as_deref(), None | Some("manual")) {
        return Err(ApiError::BadRequest(
            "reason must be manual: unsubscribes, bounces and complaints are recorded as they \
             happen"
                .into(),
        ));
    }
    let topic = body
        .topic
        .as_deref()
        .map(|t| name("topic", t))
        .transpose()
        .map_err(ApiError::BadRequest)?;
    add(
        &state.db,
        caller.workspace,
        &email,
        Reason::Manual,
        topic.as_deref(),
    )
    .await?;
    let suppression = sqlx::query_as::<_, Suppression>(&format!(
        "SELECT {COLUMNS} FROM suppressions
         WHERE workspace_id = $1 AND email_key = $2 AND reason = 'manual'
           AND topic = COALESCE($3, '')"
    ))
    .bind(caller.workspace)
    .bind(email.key())
    .bind(&topic)
    .fetch_one(&state.db)
    .await?;
    Ok(Success::new(Added { suppression }))
}

/// `?topic=` of a delete.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct TopicQuery {
    pub topic: Option<String>,
}

/// `DELETE /suppressions/{email}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SuppressionRemoved)]
pub struct Removed {
    pub removed: u64,
}

/// Removes the address's entries: all of them, or with `?topic=` those of that topic.
pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, Path(email): Path<String>,
    QueryParams(q): QueryParams<TopicQuery>,
) -> Result<Success<Removed>, ApiError> {
    let done = sqlx::query(
        "DELETE FROM suppressions
         WHERE workspace_id = $1 AND email_key = $2 AND ($3::text IS NULL OR topic = $3)",
    )
    .bind(caller.workspace)
    .bind(email::key(&email))
    .bind(q.topic.as_deref().map(str::trim))
    .execute(&state.db)
    .await?;
    if done.rows_affected() == 0 {
        return Err(ApiError::NotFound(format!("{email} is not suppressed")));
    }
    Ok(Success::new(Removed {
        removed: done.rows_affected(),
    }))
}
