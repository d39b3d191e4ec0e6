//! The message log: `GET /emails`, a workspace's messages (one row per delivery) newest
//! first, filtered by recipient, tag, state and time — each filter served by an index
//! (`docs/message-log.md` shows the plans) — and `GET /emails/{deliveryId}`, one message
//! with its send's metadata and its events in order.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{Postgres, QueryBuilder};
use uuid::Uuid;

use postmesh_shared::extract::{Caller, IdPath, Page, QueryParams};
use postmesh_shared::{ApiError, Success};

use crate::sending::events::Kind;
use crate::sending::status::DeliveryEvent;
use crate::sending::tags::{Metadata, Tag};
use crate::AppState;

/// Rows on a page by default, and at most.
const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 100;

/// `GET /emails`'s parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct LogQuery {
    /// Rows on the page (1-100, default 50).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// Rows skipped before the page.
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// Only messages to this address (without regard to case).
    pub to: Option<String>,
    /// Only messages of sends with this tag, written `name:value`.
    pub tag: Option<String>,
    /// Only messages in this state: `queued`, `scheduled`, `sent`, `delivered`, `delayed`,
    /// `bounced`, `complained`, `rejected`, `failed`, `cancelled` or `unsubscribed`.
    pub status: Option<String>,
    /// Only messages accepted at or after this Unix time.
    #[param(minimum = 0)]
    pub since: Option<i64>,
    /// Only messages accepted before this Unix time.
    #[param(minimum = 0)]
    pub until: Option<i64>,
}

/// One message of the log.
#[derive(Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = EmailLogEntry)]
pub struct Entry {
    pub delivery_id: Uuid,
    pub task_id: Uuid,
    pub to: String,
    pub subject: String,
    /// The furthest state its events reached.
    pub status: Kind,
    #[schema(value_type = Vec<Tag>)]
    pub tags: Json<Vec<Tag>>,
    /// When its send was accepted (Unix seconds).
    pub created_at: i64,
    /// Opens and clicks by people (machines' are events, not counted).
    pub opens: i32,
    pub clicks: i32,
}

/// A page of the log, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = EmailLog)]
pub struct Log {
    pub emails: Vec<Entry>,
    pub limit: i64,
    pub offset: i64,
}

/// One message with its send's metadata and its events, oldest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = EmailLogDetail)]
pub struct Detail {
    #[serde(flatten)]
    pub entry: Entry,
    pub metadata: Metadata,
    pub events: Vec<DeliveryEvent>,
}

/// A message's row with its send's metadata.
#[derive(sqlx::FromRow)]
struct WithMetadata {
    #[sqlx(flatten)]
    entry: Entry,
    metadata: Json<Metadata>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// The filters of a query, parsed.
struct Filters {
    to: Option<String>,
    tag: Option<String>,
    status: Option<Kind>,
    since: Option<i64>,
    until: Option<i64>,
}

impl Filters {
    fn parse(q: LogQuery) -> Result<Self, ApiError> {
        let tag = match q.tag.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => {
                let (name, value) = t
                    .split_once(':')
                    .ok_or_else(|| bad("tag must be written name:value"))?;
                crate::sending::tags::check_tags(Some(vec![Tag {
                    name: name.into(),
                    value: value.into(),
                }]))
                .map_err(|_| bad("tag must be name:value, each 1-50 of A-Za-z0-9_-"))?;
                Some(t.to_owned())
            }
        };
        let status = match q.status.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(
                serde_json::from_value::<Kind>(Value::String(s.to_owned()))
                    .ok()
                    .filter(|k| !matches!(k, Kind::Opened | Kind::Clicked))
                    .ok_or_else(|| bad(format!("status {s:?} is not a message state")))?,
            ),
        };
        let time = |field: &str, v: Option<i64>| match v {
            Some(n) if n < 0 => Err(bad(format!("{field} must be Unix seconds, 0 or more"))),
            other => Ok(other),
        };
        Ok(Self {
            to: q
                .to
                .map(|t| t.trim().to_lowercase())
                .filter(|t| !t.is_empty()),
            tag,
            status,
            since: time("since", q.since)?,
            until: time("until", q.until)?,
        })
    }

    /// The query of a page: from the tag's index when a tag is asked for (newest first
    /// there), else from the log's own.
    fn query(&self, workspace: Uuid, page: Page) -> QueryBuilder<'_, Postgres> {
        let mut q = QueryBuilder::new(
            "SELECT r.delivery_id, r.task_id, r.email AS to, t.subject,
                 r.status, t.tags, r.created_at, r.opens, r.clicks ",
        );
        let order = if let Some(tag) = &self.tag {
            q.push("FROM task_tags g JOIN task_recipients r ON r.task_id = g.task_id ")
                .push("JOIN tasks t ON t.id = r.task_id WHERE g.workspace_id = ")
                .push_bind(workspace)
                .push(" AND g.tag = ")
                .push_bind(tag.as_str());
            if let Some(since) = self.since {
                q.push(" AND g.created_at >= ").push_bind(since);
            }
            if let Some(until) = self.until {
                q.push(" AND g.created_at < ").push_bind(until);
            }
            " ORDER BY g.created_at DESC, r.delivery_id DESC"
        } else {
            q.push(
                "FROM task_recipients r JOIN tasks t ON t.id = r.task_id WHERE r.workspace_id = ",
            )
            .push_bind(workspace);
            " ORDER BY r.created_at DESC, r.delivery_id DESC"
        };
        if let Some(to) = &self.to {
            q.push(" AND lower(r.email) = ").push_bind(to.as_str());
        }
        if let Some(status) = self.status {
            q.push(" AND r.status = ").push_bind(status.as_str());
        }
        if let Some(since) = self.since {
            q.push(" AND r.created_at >= ").push_bind(since);
        }
        if let Some(until) = self.until {
            q.push(" AND r.created_at < ").push_bind(until);
        }
        q.push(order)
            .push(" LIMIT ")
            .push_bind(page.limit)
            .push(" OFFSET ")
            .push_bind(page.offset);
        q
    }
}

/// `GET /emails`: a page of the workspace's messages, newest first.
pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<LogQuery>,
) -> Result<Success<Log>, ApiError> {
    let page = Page::within(q.limit, q.offset, DEFAULT_LIMIT, MAX_LIMIT)?;
    let filters = Filters::parse(q)?;
    let emails = filters
        .query(caller.workspace.as_uuid(), page)
        .build_query_as::<Entry>()
        .fetch_all(&state.db)
        .await?;
    Ok(Success::new(Log {
        emails,
        limit: page.limit,
        offset: page.offset,
    }))
}

/// `GET /emails/{deliveryId}`: one message, its send's metadata and its events in order.
pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, IdPath(delivery): IdPath<Uuid>,
) -> Result<Success<Detail>, ApiError> {
    let found: Option<WithMetadata> = sqlx::query_as(
        "SELECT r.delivery_id, r.task_id, r.email AS to, t.subject,
             r.status, t.tags, r.created_at, r.opens, r.clicks, t.metadata
         FROM task_recipients r JOIN tasks t ON t.id = r.task_id
         WHERE r.delivery_id = $1 AND r.workspace_id = $2",
    )
    .bind(delivery)
    .bind(caller.workspace)
    .fetch_optional(&state.db)
    .await?;
    let WithMetadata {
        entry,
        metadata: Json(metadata),
    } = found.ok_or_else(|| ApiError::NotFound(format!("no email {delivery}")))?;
    let events = sqlx::query_as::<_, (Kind, i64, Json<Value>)>(
        // Within a second, the message's own events before what its reader did with it.
        "SELECT kind, occurred_at, detail FROM delivery_events WHERE delivery_id = $1
         ORDER BY occurred_at, kind IN ('opened', 'clicked'), sequence",
    )
    .bind(delivery)
    .fetch_all(&state.db)
    .await?
    .into_iter()
    .map(|(kind, occurred_at, Json(detail))| DeliveryEvent {
        kind,
        occurred_at,
        detail,
    })
    .collect();
    Ok(Success::new(Detail {
        entry,
        metadata,
        events,
    }))
}
