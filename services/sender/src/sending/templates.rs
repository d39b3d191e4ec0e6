//! Templates of a workspace: `POST /templates` stores a key's next version, `GET` lists the
//! latest versions or reads one, `DELETE` retires every version. A send pins the version
//! it used and stores the rendered message, so later changes touch no accepted send.

use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder};
use utoipa::openapi::{RefOr, Schema};
use utoipa::PartialSchema;

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{Caller, JsonBody, PageQuery, QueryParams};
use postmesh_shared::{ApiError, Success, WorkspaceId};

use crate::model::schema::{self, component};
use crate::{model, AppState, Quotas};

/// Longest template key.
/// Largest template body (HTML or text), in bytes.
const MAX_BODY_BYTES: usize = 512 * 1024;
/// Versions one template key keeps at most.
pub const MAX_VERSIONS: i64 = 100;
/// A page of templates when no limit is given.
const DEFAULT_PAGE: i64 = 50;

/// A stored template version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    pub key: String,
    pub version: i32,
    pub subject: String,
    pub html: String,
    pub text: String,
    pub created_at: i64,
}

/// `POST /templates` body.
#[derive(Debug, Deserialize)]
pub struct NewTemplate {
    pub key: Option<String>,
    pub subject: Option<String>,
    pub html: Option<String>,
    pub text: Option<String>,
}

/// What `create` takes: a key, a subject on one line, and html, text or both.
impl PartialSchema for NewTemplate {
    fn schema() -> RefOr<Schema> {
        let body = || {
            // A limit in bytes, which `maxLength` (characters) cannot state: described only.
            schema::or_null(ObjectBuilder::new())
                .description(Some("At most 512 KiB of UTF-8 (bytes, not characters)."))
        };
        let given = |field: &str| {
            ObjectBuilder::new()
                .property(field, schema::not_blank())
                .required(field)
        };
        AllOfBuilder::new()
            .description(Some(
                "`POST /templates` body: a key, a subject, and html, text or both.",
            ))
            .item(
                ObjectBuilder::new()
                    .property("key", model::key_schema())
                    .required("key")
                    .property("subject", schema::not_blank_line())
                    .required("subject")
                    .property("html", body())
                    .property("text", body()),
            )
            .item(AnyOfBuilder::new().item(given("html")).item(given("text")))
            .into()
    }
}

component!(NewTemplate as "NewTemplate");

/// A template key ([`model::parse_key`]); a malformed one is a 400.
fn parse_key(raw: &str) -> Result<String, ApiError> {
    model::parse_key("template", raw).map_err(ApiError::BadRequest)
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewTemplate>,
) -> Result<Success<Template>, ApiError> {
    let key = parse_key(body.key.as_deref().unwrap_or(""))?;
    let subject = body.subject.unwrap_or_default();
    if subject.trim().is_empty() || subject.chars().any(|c| c.is_control()) {
        return Err(ApiError::BadRequest(
            "subject is required, on a single line".into(),
        ));
    }
    let (html, text) = (body.html.unwrap_or_default(), body.text.unwrap_or_default());
    if html.trim().is_empty() && text.trim().is_empty() {
        return Err(ApiError::BadRequest("give html, text or both".into()));
    }
    if html.len() > MAX_BODY_BYTES || text.len() > MAX_BODY_BYTES {
        return Err(ApiError::BadRequest(format!(
            "html and text must be at most {} KiB each",
            MAX_BODY_BYTES / 1024
        )));
    }
    // A workspace's template writes take turns: the quotas are counted, then kept.
    let mut tx = state.db.begin().await?;
    db::take_turns(&mut tx, Turns::Workspace, caller.workspace).await?;
    let (keys, versions, live): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT key) FILTER (WHERE deleted_at IS NULL),
                count(*) FILTER (WHERE key = $2),
                count(*) FILTER (WHERE key = $2 AND deleted_at IS NULL)
         FROM templates WHERE workspace_id = $1",
    )
    .bind(caller.workspace)
    .bind(&key)
    .fetch_one(&mut *tx)
    .await?;
    // A key new or deleted before is one more live template: the quota is asked.
    if live == 0 {
        let quota = state.quotas.templates;
        Quotas::check(keys, quota, "templates", "TEMPLATES_PER_WORKSPACE")?;
    }
    if versions >= MAX_VERSIONS {
        return Err(ApiError::Forbidden(format!(
            "template {key:?} holds {versions} versions, the most a template keeps ({MAX_VERSIONS}); use another key"
        )));
    }
    let stored = sqlx::query_as::<_, Template>(
        "INSERT INTO templates (workspace_id, key, version, subject, html, text, created_at)
         SELECT $1, $2, COALESCE(MAX(version), 0) + 1, $3, $4, $5, $6
         FROM templates WHERE workspace_id = $1 AND key = $2
         RETURNING key, version, subject, html, text, created_at",
    )
    .bind(caller.workspace)
    .bind(&key)
    .bind(&subject)
    .bind(&html)
    .bind(&text)
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Success::new(stored))
}

/// `GET /templates` answer: the latest version of each key, a page by key.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TemplateList {
    pub templates: Vec<Template>,
    pub limit: i64,
    pub offset: i64,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<TemplateList>, ApiError> {
    let page = q.page(DEFAULT_PAGE)?;
    let templates = sqlx::query_as::<_, Template>(
        "SELECT DISTINCT ON (key) key, version, subject, html, text, created_at
         FROM templates WHERE workspace_id = $1 AND deleted_at IS NULL
         ORDER BY key, version DESC LIMIT $2 OFFSET $3",
    )
    .bind(caller.workspace)
    .bind(page.limit)
    .bind(page.offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(TemplateList {
        templates,
        limit: page.limit,
        offset: page.offset,
    }))
}

/// `?version=` of `GET /templates/{key}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct VersionQuery {
    pub version: Option<i32>,
}

/// The template `key` of `workspace`: `version`, or the latest; `None` when there is none.
pub async fn find(
    db: &sqlx::PgPool, workspace: WorkspaceId, key: &str, version: Option<i32>,
) -> Result<Option<Template>, sqlx::Error> {
    sqlx::query_as::<_, Template>(
        "SELECT key, version, subject, html, text, created_at FROM templates
         WHERE workspace_id = $1 AND key = $2 AND deleted_at IS NULL
           AND ($3::integer IS NULL OR version = $3)
         ORDER BY version DESC LIMIT 1",
    )
    .bind(workspace)
    .bind(key)
    .bind(version)
    .fetch_optional(db)
    .await
}

pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, Path(key): Path<String>,
    QueryParams(q): QueryParams<VersionQuery>,
) -> Result<Success<Template>, ApiError> {
    let key = parse_key(&key)?;
    find(&state.db, caller.workspace, &key, q.version)
        .await?
        .map(Success::new)
        .ok_or_else(|| ApiError::NotFound(format!("no template {key:?}")))
}

/// `DELETE /templates/{key}` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = TemplateDeleted)]
pub struct Deleted {
    pub key: String,
    pub deleted: bool,
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, Path(key): Path<String>,
) -> Result<Success<Deleted>, ApiError> {
    let key = parse_key(&key)?;
    let done = sqlx::query(
        "UPDATE templates SET deleted_at = $3
         WHERE workspace_id = $1 AND key = $2 AND deleted_at IS NULL",
    )
    .bind(caller.workspace)
    .bind(&key)
    .bind(now_unix())
    .execute(&state.db)
    .await?;
    if done.rows_affected() == 0 {
        return Err(ApiError::NotFound(format!("no template {key:?}")));
    }
    Ok(Success::new(Deleted { key, deleted: true }))
}
