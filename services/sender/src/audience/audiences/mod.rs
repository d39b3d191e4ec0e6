//! Audiences: `{include: [...], exclude: [...]}` selects the workspace's contacts matching
//! any include condition and no exclude condition. A condition is `{tag}`, `{topic}`
//! (subscribed to it), `{attribute, op, value}` (`eq`, `neq`, `in`, `exists`, `gt`, `lt`),
//! `{email}` or `{audienceId}` (a saved audience). An audience is resolved in one SQL
//! statement over the contacts' indexes, never by loading the workspace's contacts.
//! Saved audiences: `POST /audiences`, `GET /audiences`, `GET/DELETE /audiences/{id}`.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, QueryBuilder};
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath, JsonBody, PageQuery, QueryParams};
use postmesh_shared::{ApiError, EmailAddress, Success, WorkspaceId};

use crate::audience::contacts::{name, Name};
use crate::model::Recipient;
use crate::{AppState, Quotas};

mod condition;

pub(crate) use condition::compared;
use condition::push_audience;
pub use condition::{Audience, AudienceBody, Condition, Op};

/// A page of audiences when no limit is given.
const DEFAULT_PAGE: i64 = 50;

/// Why an audience could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum AudienceError {
    #[error("no saved audience {0}")]
    UnknownSaved(Uuid),
    #[error("the audience has more than {0} contacts")]
    TooLarge(usize),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl From<AudienceError> for ApiError {
    fn from(e: AudienceError) -> Self {
        match e {
            AudienceError::UnknownSaved(_) => ApiError::NotFound(e.to_string()),
            AudienceError::TooLarge(_) => ApiError::BadRequest(e.to_string()),
            AudienceError::Database(e) => e.into(),
        }
    }
}

/// The saved audiences `audience` names, parsed.
async fn saved_of(
    conn: &mut PgConnection, workspace: WorkspaceId, audience: &Audience,
) -> Result<HashMap<Uuid, Audience>, AudienceError> {
    let ids = audience.saved_ids();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(Uuid, Json<AudienceBody>)> = sqlx::query_as(
        "SELECT id, definition FROM audiences WHERE workspace_id = $1 AND id = ANY($2)",
    )
    .bind(workspace)
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    let mut saved = HashMap::new();
    for (id, body) in rows {
        // Checked when it was saved; a definition that no longer parses matches nobody.
        let parsed = Audience::parse(&body.0, false).unwrap_or_default();
        saved.insert(id, parsed);
    }
    match ids.into_iter().find(|id| !saved.contains_key(id)) {
        Some(missing) => Err(AudienceError::UnknownSaved(missing)),
        None => Ok(saved),
    }
}

/// The contacts `audience` selects as `(contact id, recipient)`, oldest contact first; more
/// than `max` is an error.
pub async fn resolve(
    conn: &mut PgConnection, workspace: WorkspaceId, audience: &Audience, max: usize,
) -> Result<Vec<(Uuid, Recipient)>, AudienceError> {
    let saved = saved_of(conn, workspace, audience).await?;
    let mut q = QueryBuilder::new(
        "SELECT c.id, c.email, c.external_id FROM contacts c WHERE c.workspace_id = ",
    );
    // A contact without an email (known by its external id alone) is no one to send to.
    q.push_bind(workspace).push(" AND c.email IS NOT NULL AND ");
    push_audience(&mut q, audience, &saved);
    q.push(" ORDER BY c.id LIMIT ").push_bind(max as i64 + 1);
    let rows: Vec<(Uuid, String, Option<String>)> =
        q.build_query_as().fetch_all(&mut *conn).await?;
    if rows.len() > max {
        return Err(AudienceError::TooLarge(max));
    }
    Ok(rows
        .into_iter()
        .filter_map(|(id, email, external_id)| {
            EmailAddress::parse(&email).map(|email| (id, Recipient { email, external_id }))
        })
        .collect())
}

/// A saved audience.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SavedAudience {
    pub id: Uuid,
    pub name: String,
    pub include: Vec<Value>,
    pub exclude: Vec<Value>,
    pub created_at: i64,
}

impl From<(Uuid, String, Json<AudienceBody>, i64)> for SavedAudience {
    fn from((id, name, body, created_at): (Uuid, String, Json<AudienceBody>, i64)) -> Self {
        Self {
            id,
            name,
            include: body.0.include,
            exclude: body.0.exclude,
            created_at,
        }
    }
}

/// `POST /audiences` body. Its conditions cannot name saved audiences.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct NewAudience {
    #[schema(value_type = Name, required = true)]
    pub name: Option<Name>,
    #[serde(default)]
    #[schema(value_type = Vec<Condition>, min_items = 1, max_items = 50, required = true)]
    pub include: Vec<Value>,
    #[serde(default)]
    #[schema(value_type = Vec<Condition>, max_items = 50)]
    pub exclude: Vec<Value>,
}

/// One saved audience, answered.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = AudienceOne)]
pub struct One {
    pub audience: SavedAudience,
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewAudience>,
) -> Result<(StatusCode, Success<One>), ApiError> {
    let name = name("name", body.name.as_deref().unwrap_or("")).map_err(ApiError::BadRequest)?;
    let definition = AudienceBody {
        include: body.include,
        exclude: body.exclude,
    };
    Audience::parse(&definition, false).map_err(ApiError::BadRequest)?;
    let mut tx = state.db.begin().await?;
    let quota = state.quotas.audiences;
    Quotas::hold(
        &mut tx,
        ("audiences", "true"),
        caller.workspace,
        quota,
        "AUDIENCES_PER_WORKSPACE",
    )
    .await?;
    let row: (Uuid, String, Json<AudienceBody>, i64) = sqlx::query_as(
        "INSERT INTO audiences (id, workspace_id, name, definition, created_at)
         VALUES ($1, $2, $3, $4, $5) RETURNING id, name, definition, created_at",
    )
    .bind(Uuid::now_v7())
    .bind(caller.workspace)
    .bind(&name)
    .bind(Json(&definition))
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Success::new(One {
            audience: row.into(),
        }),
    ))
}

/// `GET /audiences` answer: a page, oldest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AudienceList {
    pub audiences: Vec<SavedAudience>,
    pub limit: i64,
    pub offset: i64,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<AudienceList>, ApiError> {
    let page = q.page(DEFAULT_PAGE)?;
    let rows: Vec<(Uuid, String, Json<AudienceBody>, i64)> = sqlx::query_as(
        "SELECT id, name, definition, created_at FROM audiences WHERE workspace_id = $1
         ORDER BY id LIMIT $2 OFFSET $3",
    )
    .bind(caller.workspace)
    .bind(page.limit)
    .bind(page.offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(AudienceList {
        audiences: rows.into_iter().map(Into::into).collect(),
        limit: page.limit,
        offset: page.offset,
    }))
}

pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<One>, ApiError> {
    let row: (Uuid, String, Json<AudienceBody>, i64) = sqlx::query_as(
        "SELECT id, name, definition, created_at FROM audiences
         WHERE workspace_id = $1 AND id = $2",
    )
    .bind(caller.workspace)
    .bind(id)
    .fetch_optional(&state.db)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no audience {id}")))?;
    Ok(Success::new(One {
        audience: row.into(),
    }))
}

/// `DELETE /audiences/{id}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = AudienceDeleted)]
pub struct Deleted {
    pub deleted: bool,
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Deleted>, ApiError> {
    let done = sqlx::query("DELETE FROM audiences WHERE workspace_id = $1 AND id = $2")
        .bind(caller.workspace)
        .bind(id)
        .execute(&state.db)
        .await?;
    if done.rows_affected() == 0 {
        return Err(ApiError::NotFound(format!("no audience {id}")));
    }
    Ok(Success::new(Deleted { deleted: true }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value, saved: bool) -> Result<Audience, String> {
        Audience::parse(&serde_json::from_value(v).unwrap(), saved)
    }

    #[test]
    fn conditions_are_checked_at_the_edge() {
        let a = parse(
            json!({"include": [{"tag": "vip"}, {"attribute": "age", "op": "gt", "value": 30}],
                   "exclude": [{"email": "A@X.com"}]}),
            true,
        )
        .unwrap();
        assert_eq!(a.include[0], Condition::Tag("vip".into()));
        assert_eq!(a.exclude[0], Condition::Email("a@x.com".into()));
        for (bad, needle) in [
            (json!({"include": []}), "at least one"),
            (json!({"include": [{"colour": "red"}]}), "needs tag"),
            (
                json!({"include": [{"tag": "a", "topic": "b"}]}),
                "unknown field",
            ),
            (
                json!({"include": [{"attribute": "a", "op": "in", "value": 3}]}),
                "array",
            ),
            (
                json!({"include": [{"attribute": "a", "op": "like", "value": 3}]}),
                "op",
            ),
            (
                json!({"include": [{"attribute": "a", "op": "gt", "value": [1]}]}),
                "number",
            ),
            (json!({"include": [{"audienceId": "nope"}]}), "not an id"),
        ] {
            let err = parse(bad.clone(), true).unwrap_err();
            assert!(err.contains(needle), "{bad} → {err}");
        }
        let nested = json!({"include": [{"audienceId": Uuid::nil().to_string()}]});
        assert!(parse(nested, false).unwrap_err().contains("another"));
    }
}
