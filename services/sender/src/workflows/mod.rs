//! Workflows: `POST/GET /workflows`, `GET/PATCH/DELETE /workflows/{id}`. A workflow is
//! active once created; a change makes a new version (runs keep the one they started on);
//! a delete ends its active runs. Events (`events`) start and end runs (`runs`).

pub mod definition;
pub mod event;
pub mod events;
pub mod runs;
pub mod wake;

use std::borrow::Cow;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use sqlx::types::Json;
use sqlx::PgConnection;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{KnownFormat, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

use postmesh_contracts::routes::sender as api;
use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath, JsonBody, PageQuery, QueryParams};
use postmesh_shared::{ApiError, Routes, Success, WorkspaceId};

use crate::sending::templates;
use crate::{AppState, Quotas};
use definition::{Workflow, WorkflowBody};

/// The routes of workflows and the events that drive them.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        // Any JSON object, checked field by field.
        .at(api::EVENT_REPORT, events::report)
        .at(api::EVENT, events::show)
        .at(api::WORKFLOWS, list)
        .at(api::WORKFLOW_CREATE, create)
        .takes::<Workflow>()
        .at(api::WORKFLOW, read)
        .at(api::WORKFLOW_UPDATE, change)
        .takes::<Workflow>()
        .at(api::WORKFLOW_DELETE, remove)
}

/// A workflow as the API shows it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowView {
    id: Uuid,
    version: i32,
    #[serde(flatten)]
    definition: WorkflowBody,
    active_runs: i64,
    created_at: i64,
    updated_at: i64,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    version: i32,
    definition: Json<WorkflowBody>,
    active_runs: i64,
    created_at: i64,
    updated_at: i64,
}

/// The body's fields and the view's own in one object: `allOf` with [`WorkflowBody`], which
/// refuses unknown fields, would refuse the view's own.
impl PartialSchema for WorkflowView {
    fn schema() -> RefOr<Schema> {
        let RefOr::T(Schema::Object(body)) = WorkflowBody::schema() else {
            unreachable!("a struct's derived schema is an object")
        };
        let uuid = ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)));
        let own = [
            ("id", uuid.into()),
            ("version", i32::schema()),
            ("activeRuns", i64::schema()),
            ("createdAt", i64::schema()),
            ("updatedAt", i64::schema()),
        ];
        own.into_iter()
            .fold(
                ObjectBuilder::from(body)
                    .additional_properties(None::<AdditionalProperties<Schema>>)
                    .description(Some("A workflow as the API shows it.")),
                |view, (name, schema)| view.property(name, schema).required(name),
            )
            .into()
    }
}

impl ToSchema for WorkflowView {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("WorkflowView")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <WorkflowBody as ToSchema>::schemas(schemas);
    }
}

impl From<Row> for WorkflowView {
    fn from(r: Row) -> Self {
        Self {
            id: r.id,
            version: r.version,
            definition: r.definition.0,
            active_runs: r.active_runs,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

const SELECT: &str = "SELECT w.id, w.version, v.definition, w.created_at, w.updated_at,
        (SELECT count(*) FROM workflow_runs r WHERE r.workflow_id = w.id AND r.status = 'active')
            AS active_runs
     FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.version
     WHERE w.workspace_id = $1 AND w.deleted_at IS NULL";

async fn one(
    conn: &mut PgConnection, workspace: WorkspaceId, id: Uuid,
) -> Result<WorkflowView, ApiError> {
    let row: Option<Row> = sqlx::query_as(&format!("{SELECT} AND w.id = $2"))
        .bind(workspace)
        .bind(id)
        .fetch_optional(conn)
        .await?;
    row.map(Into::into)
        .ok_or_else(|| ApiError::NotFound("workflow not found".into()))
}

/// Checks `body`, and that its templates exist.
async fn checked(
    state: &AppState, workspace: WorkspaceId, body: &WorkflowBody,
) -> Result<Workflow, ApiError> {
    let workflow = Workflow::parse(body).map_err(ApiError::BadRequest)?;
    for key in workflow.templates() {
        if templates::find(&state.db, workspace, key, None)
            .await?
            .is_none()
        {
            return Err(ApiError::BadRequest(format!("no template {key:?}")));
        }
    }
    Ok(workflow)
}

async fn save_version(
    conn: &mut PgConnection, id: Uuid, version: i32, body: &WorkflowBody, exits: &[String],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO workflow_versions (workflow_id, version, definition, created_at, exit_events)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(version)
    .bind(Json(body))
    .bind(now_unix())
    .bind(exits)
    .execute(conn)
    .await?;
    Ok(())
}

/// One workflow.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WorkflowOne)]
pub struct One {
    workflow: WorkflowView,
}

/// `POST /workflows`: 201 with the workflow, active at once.
pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<WorkflowBody>,
) -> Result<(StatusCode, Success<One>), ApiError> {
    let workflow = checked(&state, caller.workspace, &body).await?;
    let id = Uuid::now_v7();
    let now = now_unix();
    let exits = workflow.exit_names();
    let mut tx = state.db.begin().await?;
    let quota = state.quotas.workflows;
    Quotas::hold(
        &mut tx,
        ("workflows", "deleted_at IS NULL"),
        caller.workspace,
        quota,
        "WORKFLOWS_PER_WORKSPACE",
    )
    .await?;
    sqlx::query(
        "INSERT INTO workflows (id, workspace_id, name, version, trigger_event,
                                created_at, updated_at)
         VALUES ($1, $2, $3, 1, $4, $5, $5)",
    )
    .bind(id)
    .bind(caller.workspace)
    .bind(&workflow.name)
    .bind(&workflow.trigger.event_name)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    save_version(&mut tx, id, 1, &body, &exits).await?;
    let workflow = one(&mut tx, caller.workspace, id).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Success::new(One { workflow })))
}

/// The workspace's workflows: a page, oldest first.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WorkflowList)]
pub struct List {
    workflows: Vec<WorkflowView>,
    limit: i64,
    offset: i64,
}

/// `GET /workflows`.
pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<List>, ApiError> {
    let page = q.page(DEFAULT_PAGE)?;
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "{SELECT} ORDER BY w.created_at, w.id LIMIT $2 OFFSET $3"
    ))
    .bind(caller.workspace)
    .bind(page.limit)
    .bind(page.offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(List {
        workflows: rows.into_iter().map(Into::into).collect(),
        limit: page.limit,
        offset: page.offset,
    }))
}

/// A page of workflows when no limit is given.
const DEFAULT_PAGE: i64 = 50;

/// `GET /workflows/{id}`.
pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<One>, ApiError> {
    let mut conn = state.db.acquire().await?;
    let workflow = one(&mut conn, caller.workspace, id).await?;
    Ok(Success::new(One { workflow }))
}

/// Versions a workflow keeps at most (each up to 256 KiB, kept while runs may use it), as a
/// template does.
pub const MAX_VERSIONS: i64 = crate::sending::templates::MAX_VERSIONS;

/// `PATCH /workflows/{id}` with a whole workflow: a new version, for new runs only.
pub(crate) async fn change(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    JsonBody(body): JsonBody<WorkflowBody>,
) -> Result<Success<One>, ApiError> {
    let workflow = checked(&state, caller.workspace, &body).await?;
    let exits = workflow.exit_names();
    let mut tx = state.db.begin().await?;
    let version: Option<i32> = sqlx::query_scalar(
        "UPDATE workflows SET version = version + 1, name = $3, trigger_event = $4,
                              updated_at = $5
         WHERE workspace_id = $1 AND id = $2 AND deleted_at IS NULL RETURNING version",
    )
    .bind(caller.workspace)
    .bind(id)
    .bind(&workflow.name)
    .bind(&workflow.trigger.event_name)
    .bind(now_unix())
    .fetch_optional(&mut *tx)
    .await?;
    let version = version.ok_or_else(|| ApiError::NotFound("workflow not found".into()))?;
    if i64::from(version) > MAX_VERSIONS {
        return Err(ApiError::Forbidden(format!(
            "the workflow holds {MAX_VERSIONS} versions, the most a workflow keeps; create \
             another"
        )));
    }
    save_version(&mut tx, id, version, &body, &exits).await?;
    let workflow = one(&mut tx, caller.workspace, id).await?;
    tx.commit().await?;
    Ok(Success::new(One { workflow }))
}

/// What a delete did.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WorkflowDeleted)]
pub struct Deleted {
    deleted: bool,
    ended_runs: u64,
}

/// `DELETE /workflows/{id}`: it starts no more runs, and its active runs end.
pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Deleted>, ApiError> {
    let mut tx = state.db.begin().await?;
    let now = now_unix();
    let gone = sqlx::query(
        "UPDATE workflows SET deleted_at = $3 WHERE workspace_id = $1 AND id = $2 AND deleted_at IS NULL",
    )
    .bind(caller.workspace)
    .bind(id)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if gone.rows_affected() == 0 {
        return Err(ApiError::NotFound("workflow not found".into()));
    }
    let ended = sqlx::query(
        // Rows locked in id order, as an exit event locks them: the two never deadlock.
        "WITH ending AS MATERIALIZED (
             SELECT id FROM workflow_runs WHERE workflow_id = $1 AND status = 'active'
             ORDER BY id FOR UPDATE)
         UPDATE workflow_runs r SET status = 'exited', exit_reason = 'workflow deleted',
                                    ended_at = $2, next_at = NULL, lease_until = NULL
         FROM ending WHERE r.id = ending.id",
    )
    .bind(id)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Success::new(Deleted {
        deleted: true,
        ended_runs: ended.rows_affected(),
    }))
}
