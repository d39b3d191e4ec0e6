//! Threads: each stored copy joins the thread of a message it answers (`In-Reply-To`,
//! `References`) in the same inbox, else the inbox's thread of the same base subject active
//! in the last 7 days, else a new one. Listing, reading, marking read, and the raw message.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use postmesh_shared::extract::{Caller, IdPath, Page, PageQuery, QueryParams};
use postmesh_shared::text::cut_at;
use postmesh_shared::{cpu, AddressId, ApiError, InboundMessageId, Success, ThreadId, WorkspaceId};

use crate::addresses;
use crate::mime::{Attachment, Content, Parsed, INLINE_BODY_BYTES};
use crate::AppState;

/// How long a thread takes in messages by subject alone.
const SUBJECT_WINDOW_SECS: i64 = 7 * 86_400;

/// The thread a new copy in `address` joins, created when there is none; its counters are
/// updated for the copy. Runs under the inbox's lock (see `ingest`).
pub(crate) async fn assign(
    tx: &mut PgConnection, address: AddressId, workspace: WorkspaceId, parsed: &Parsed, now: i64,
) -> Result<ThreadId, sqlx::Error> {
    let ancestors = parsed.ancestors();
    let mut found: Option<Uuid> = None;
    if !ancestors.is_empty() {
        found = sqlx::query_scalar(
            "SELECT thread_id FROM messages WHERE address_id = $1 AND message_id = ANY($2)
             ORDER BY received_at DESC LIMIT 1",
        )
        .bind(address)
        .bind(&ancestors)
        .fetch_optional(&mut *tx)
        .await?;
    }
    let key = parsed.subject_key();
    if found.is_none() && !key.is_empty() {
        found = sqlx::query_scalar(
            "SELECT id FROM threads WHERE address_id = $1 AND subject_key = $2
               AND last_message_at >= $3
             ORDER BY last_message_at DESC LIMIT 1",
        )
        .bind(address)
        .bind(&key)
        .bind(now - SUBJECT_WINDOW_SECS)
        .fetch_optional(&mut *tx)
        .await?;
    }
    match found {
        Some(id) => {
            sqlx::query(
                "UPDATE threads SET message_count = message_count + 1,
                     last_message_at = GREATEST(last_message_at, $2),
                     activity = nextval('thread_activity')
                 WHERE id = $1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            Ok(id.into())
        }
        None => {
            let id = ThreadId::new();
            sqlx::query(
                "INSERT INTO threads (id, address_id, workspace_id, subject, subject_key,
                     message_count, last_message_at, activity, created_at)
                 VALUES ($1, $2, $3, $4, $5, 1, $6, nextval('thread_activity'), $6)",
            )
            .bind(id)
            .bind(address)
            .bind(workspace)
            .bind(&parsed.content.subject)
            .bind(&key)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            Ok(id)
        }
    }
}

/// A thread as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = Thread)]
#[serde(rename_all = "camelCase")]
pub struct ThreadView {
    pub id: ThreadId,
    pub address_id: AddressId,
    pub subject: String,
    pub message_count: i32,
    pub unread: bool,
    pub last_message_at: i64,
}

/// The columns of [`ThreadView`], from `threads t`.
const THREAD_COLUMNS: &str =
    "t.id, t.address_id, t.subject, t.message_count, t.unread, t.last_message_at";

/// `GET /inbox/threads` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadList {
    pub threads: Vec<ThreadView>,
    /// The workspace's unread threads, all addresses.
    pub unread_threads: i64,
}

/// One stored message as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = ThreadMessage)]
#[serde(rename_all = "camelCase")]
pub struct MessageView {
    pub id: InboundMessageId,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub content: Content,
    pub received_at: i64,
    #[sqlx(json)]
    pub attachments: Vec<Attachment>,
    pub authentication: Value,
    /// Whether a body is only in the raw message (read from it before answering).
    #[serde(skip)]
    pub bodies_in_raw: bool,
    /// Whether a body was cut to 1 MiB (the whole message: `GET /inbox/messages/{id}/raw`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[sqlx(default)]
    pub truncated: bool,
}

/// `GET /inbox/threads/{id}` answer: the thread and a page of its messages, oldest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ThreadPage {
    pub thread: ThreadView,
    pub messages: Vec<MessageView>,
    /// The thread's messages in all.
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

/// Messages on a page of a thread when no limit is given.
const THREAD_PAGE: i64 = 100;

/// `POST /inbox/threads/{id}/read` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ThreadRead)]
pub struct Read {
    pub thread: ThreadView,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    #[param(value_type = Option<String>, format = Uuid)]
    address_id: Option<AddressId>,
    unread: Option<String>,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<ListQuery>,
    QueryParams(page): QueryParams<PageQuery>,
) -> Result<Success<ThreadList>, ApiError> {
    let Page { limit, offset } = page.page(50)?;
    if let Some(address) = q.address_id {
        if addresses::owned(&state.db, caller.workspace, address)
            .await?
            .is_none()
        {
            return Err(addresses::not_found());
        }
    }
    let unread = matches!(q.unread.as_deref(), Some("1" | "true"));
    let threads = sqlx::query_as(&format!(
        "SELECT {THREAD_COLUMNS} FROM threads t
         JOIN addresses a ON a.id = t.address_id AND a.deleted_at IS NULL
         WHERE t.workspace_id = $1 AND ($2::uuid IS NULL OR t.address_id = $2)
           AND (NOT $3 OR t.unread)
         ORDER BY t.activity DESC LIMIT $4 OFFSET $5"
    ))
    .bind(caller.workspace)
    .bind(q.address_id)
    .bind(unread)
    .bind(limit)
    .bind(offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(ThreadList {
        threads,
        unread_threads: unread_count(&state.db, caller.workspace).await?,
    }))
}

/// The caller's thread `id` (of a live address), or 404.
async fn owned_thread(db: &PgPool, caller: &Caller, id: ThreadId) -> Result<ThreadView, ApiError> {
    sqlx::query_as(&format!(
        "SELECT {THREAD_COLUMNS} FROM threads t
         JOIN addresses a ON a.id = t.address_id AND a.deleted_at IS NULL
         WHERE t.id = $1 AND t.workspace_id = $2"
    ))
    .bind(id)
    .bind(caller.workspace)
    .fetch_optional(db)
    .await?
    .ok_or_else(|| ApiError::NotFound("no such thread".into()))
}

pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<ThreadId>,
    QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<ThreadPage>, ApiError> {
    // Any outside sender can grow a thread: it is read a page at a time.
    let page = q.page(THREAD_PAGE)?;
    let thread = owned_thread(&state.db, &caller, id).await?;
    let mut messages: Vec<MessageView> = sqlx::query_as(
        "SELECT id, COALESCE(from_header, envelope_from) AS from, to_header AS to,
             cc_header AS cc, subject, text_body AS text, html_body AS html, message_id,
             in_reply_to, received_at, attachments, authentication, bodies_in_raw
         FROM messages WHERE thread_id = $1 ORDER BY received_at, id LIMIT $2 OFFSET $3",
    )
    .bind(id)
    .bind(page.limit)
    .bind(page.offset)
    .fetch_all(&state.db)
    .await?;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE thread_id = $1")
        .bind(id)
        .fetch_one(&state.db)
        .await?;
    // A message too large for its bodies to be stored apart: read from its raw copy on the
    // CPU pool, each body cut to what a stored one holds, so a page of them stays bounded.
    for m in messages.iter_mut().filter(|m| m.bodies_in_raw) {
        let raw = raw_of(&state.db, m.id).await?;
        let whole = cpu::run_sized(raw.len(), move || Parsed::whole(&raw).content).await;
        let mut cut = |body: Option<String>| {
            body.map(|b| {
                let (b, was_cut) = cut_at(b, INLINE_BODY_BYTES);
                m.truncated |= was_cut;
                b
            })
        };
        (m.content.text, m.content.html) = (cut(whole.text), cut(whole.html));
    }
    Ok(Success::new(ThreadPage {
        thread,
        messages,
        total,
        limit: page.limit,
        offset: page.offset,
    }))
}

pub(crate) async fn read(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<ThreadId>,
) -> Result<Success<Read>, ApiError> {
    owned_thread(&state.db, &caller, id).await?;
    sqlx::query("UPDATE threads SET read_count = message_count WHERE id = $1")
        .bind(id)
        .execute(&state.db)
        .await?;
    let thread = owned_thread(&state.db, &caller, id).await?;
    Ok(Success::new(Read { thread }))
}

/// The workspace's unread threads, counted from the partial index `threads_unread` (a
/// deleted address's threads are marked read when it is deleted).
pub async fn unread_count(db: &PgPool, workspace: WorkspaceId) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM threads WHERE workspace_id = $1 AND unread")
        .bind(workspace)
        .fetch_one(db)
        .await
}

/// The raw message of copy `id`.
pub(crate) async fn raw_of(db: &PgPool, id: InboundMessageId) -> Result<Vec<u8>, sqlx::Error> {
    sqlx::query_scalar("SELECT raw FROM message_raw WHERE message_id = $1")
        .bind(id)
        .fetch_one(db)
        .await
}

pub(crate) async fn raw(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<InboundMessageId>,
) -> Result<Response, ApiError> {
    let raw: Vec<u8> = sqlx::query_scalar(
        "SELECT r.raw FROM message_raw r
         JOIN messages m ON m.id = r.message_id
         JOIN addresses a ON a.id = m.address_id AND a.deleted_at IS NULL
         WHERE r.message_id = $1 AND m.workspace_id = $2",
    )
    .bind(id)
    .bind(caller.workspace)
    .fetch_optional(&state.db)
    .await?
    .ok_or_else(|| ApiError::NotFound("no such message".into()))?;
    Ok(([(header::CONTENT_TYPE, "message/rfc822")], raw).into_response())
}
