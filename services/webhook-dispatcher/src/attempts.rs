//! An endpoint's deliveries as a resource: its attempts (paged, by status), one retried by
//! hand, every message since a time replayed, a signed sample sent at once; and the sweep
//! that queues again attempts whose job was lost.

use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath, JsonBody, QueryParams};
use postmesh_shared::proto::{InboundAttachment, InboundMessageReply};
use postmesh_shared::{ApiError, Runtime, Success};

use crate::deliver::{now_rfc3339, queue, queue_each};
use crate::payload::{self, Event, Shape};
use crate::AppState;

/// The most attempts one page shows.
const MAX_LIMIT: i64 = 100;
/// How often the sweep looks for attempts whose job was lost.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// How late past its time a pending, unleased attempt must be before the sweep queues it.
const OVERDUE_SECS: i64 = 120;
/// Attempts of one replay job.
const REPLAY_JOB: usize = 50;
/// Attempts one sweep pass queues at most.
const SWEEP_BATCH: i64 = 500;

/// One attempt as the API shows it.
#[derive(Debug, Serialize, Deserialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct AttemptView {
    pub id: Uuid,
    pub message_id: Uuid,
    pub status: String,
    pub attempt_count: i32,
    pub last_status_code: Option<i32>,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<i64>,
    pub created_at: i64,
}

/// `GET /inbox/webhook/endpoints/{id}/attempts` answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct AttemptList {
    pub attempts: Vec<AttemptView>,
}

/// `POST .../attempts/{attemptId}/retry` answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Retried {
    pub attempt: AttemptView,
}

/// `POST .../replay` answer: how many deliveries were queued.
#[derive(Debug, Serialize, Deserialize)]
pub struct Replayed {
    pub queued: usize,
}

/// `POST .../test` answer: what the receiver said.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tested {
    /// The receiver's status code; none when no answer came.
    pub status_code: Option<u16>,
    pub delivered: bool,
    pub error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    status: Option<String>,
    limit: Option<i64>,
    offset: Option<i64>,
}

/// 404 unless `id` is an endpoint of the caller's workspace.
async fn require_endpoint(db: &PgPool, caller: &Caller, id: Uuid) -> Result<(), ApiError> {
    let found: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM endpoints WHERE id = $1 AND workspace_id = $2)",
    )
    .bind(id)
    .bind(caller.workspace)
    .fetch_one(db)
    .await?;
    if found {
        Ok(())
    } else {
        Err(ApiError::NotFound("no such endpoint".into()))
    }
}

const COLUMNS: &str = "id, message_id, status, attempt_count, last_status_code, last_error,
    next_attempt_at, created_at";

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Success<AttemptList>, ApiError> {
    let (limit, offset) = (q.limit.unwrap_or(50), q.offset.unwrap_or(0));
    if !(1..=MAX_LIMIT).contains(&limit) || offset < 0 {
        return Err(ApiError::BadRequest(format!(
            "limit is 1 to {MAX_LIMIT} and offset 0 or more"
        )));
    }
    if let Some(status) = &q.status {
        if !matches!(status.as_str(), "pending" | "succeeded" | "failed") {
            return Err(ApiError::BadRequest(
                "status is pending, succeeded or failed".into(),
            ));
        }
    }
    require_endpoint(&state.db, &caller, id).await?;
    let attempts = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM attempts
         WHERE endpoint_id = $1 AND ($2::text IS NULL OR status = $2)
         ORDER BY created_at DESC, id DESC LIMIT $3 OFFSET $4"
    ))
    .bind(id)
    .bind(q.status)
    .bind(limit)
    .bind(offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(AttemptList { attempts }))
}

fn jetstream(state: &AppState) -> Result<async_nats::jetstream::Context, ApiError> {
    let client = state
        .nats
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the delivery queue is not reachable".into()))?;
    Ok(async_nats::jetstream::new(client.clone()))
}

/// Sends attempt `attemptId` again now, whatever it came to; 202.
pub(crate) async fn retry(
    State(state): State<AppState>, caller: Caller,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Path((endpoint, attempt)) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))?;
    let parse = |raw: &str| {
        Uuid::parse_str(raw)
            .map_err(|_| ApiError::BadRequest(format!("{raw:?} in the path is not a valid id")))
    };
    let (endpoint, attempt) = (parse(&endpoint)?, parse(&attempt)?);
    require_endpoint(&state.db, &caller, endpoint).await?;
    let js = jetstream(&state)?;
    let view: AttemptView = sqlx::query_as(&format!(
        "UPDATE attempts SET status = 'pending', next_attempt_at = $3, updated_at = $3
         WHERE id = $1 AND endpoint_id = $2 RETURNING {COLUMNS}"
    ))
    .bind(attempt)
    .bind(endpoint)
    .bind(now_unix())
    .fetch_optional(&state.db)
    .await?
    .ok_or_else(|| ApiError::NotFound("no such attempt".into()))?;
    queue_each(&js, &state.ns, &[(view.id, view.attempt_count)]).await?;
    Ok((
        StatusCode::ACCEPTED,
        Success::new(Retried { attempt: view }),
    ))
}

#[derive(Deserialize)]
pub(crate) struct Since {
    /// Unix seconds.
    since: i64,
}

/// Queues a new delivery to the endpoint of every message its address received since
/// `since`; 202 with how many.
pub(crate) async fn replay(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    JsonBody(body): JsonBody<Since>,
) -> Result<impl IntoResponse, ApiError> {
    require_endpoint(&state.db, &caller, id).await?;
    let js = jetstream(&state)?;
    let now = now_unix();
    let queued: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO attempts (id, workspace_id, endpoint_id, message_id, origin, status,
                               next_attempt_at, created_at, updated_at)
         SELECT gen_random_uuid(), e.workspace_id, e.id, r.message_id, 'replay', 'pending',
                $3, $3, $3
         FROM endpoints e JOIN received r ON r.address_id = e.address_id
         WHERE e.id = $1 AND r.received_at >= $2
         RETURNING id",
    )
    .bind(id)
    .bind(body.since)
    .bind(now)
    .fetch_all(&state.db)
    .await?;
    // Jobs of up to REPLAY_JOB attempts; a publish that fails leaves them to the sweep.
    for chunk in queued.chunks(REPLAY_JOB) {
        let msg_id = format!("{}:replay", chunk[0]);
        if let Err(e) = queue(&js, &state.ns, chunk, &msg_id).await {
            tracing::warn!(error = %e, "replay queued in the database only; the sweep sends it");
        }
    }
    Ok((
        StatusCode::ACCEPTED,
        Success::new(Replayed {
            queued: queued.len(),
        }),
    ))
}

/// The message a test delivery carries.
fn sample(address_id: Uuid) -> InboundMessageReply {
    InboundMessageReply {
        found: true,
        email_id: "sample@postmesh.test".into(),
        address_id: address_id.to_string(),
        address: "sample@postmesh.test".into(),
        thread_id: Uuid::nil().to_string(),
        from_address: "sender@example.com".into(),
        from_name: "Postmesh test".into(),
        to: vec!["sample@postmesh.test".into()],
        subject: "A test delivery from Postmesh".into(),
        received_at: now_unix(),
        text: Some("This is a test delivery of your inbox webhook.".into()),
        attachments: vec![InboundAttachment {
            filename: "sample.txt".into(),
            content_type: "text/plain".into(),
            size: 12,
        }],
        spf: "pass".into(),
        dkim: "pass".into(),
        dmarc: "pass".into(),
        ..Default::default()
    }
}

/// Sends a signed sample payload to the endpoint now and answers what the receiver said.
pub(crate) async fn test(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Tested>, ApiError> {
    require_endpoint(&state.db, &caller, id).await?;
    let target = crate::deliver::ready_endpoint(&state, id).await?;
    let address_id: Uuid = sqlx::query_scalar("SELECT address_id FROM endpoints WHERE id = $1")
        .bind(id)
        .fetch_one(&state.db)
        .await?;
    let shape = Shape {
        max_body_bytes: usize::MAX,
        ..target.shape
    };
    let sample = sample(address_id);
    let event = Event::received(&sample, Uuid::nil().to_string(), shape, now_rfc3339());
    let body = serde_json::to_vec(&event).map_err(|e| ApiError::internal("encoding", e))?;
    let keys: Vec<&[u8]> = target.keys.iter().map(Vec::as_slice).collect();
    let webhook_id = payload::webhook_id(Uuid::now_v7());
    let answer = state
        .sender
        .post(&target.url, &webhook_id, &keys, body)
        .await;
    Ok(Success::new(Tested {
        status_code: answer.status.map(|s| s.as_u16()),
        delivered: answer.error.is_none(),
        error: answer.error,
    }))
}

/// Every `SWEEP_EVERY`, queues again pending attempts that are overdue and unleased (their
/// job was lost: a publish that failed, a stream that lost it).
pub fn sweep(rt: &Runtime) {
    let (db, js, ns) = (rt.db.clone(), rt.js.clone(), rt.common.namespace.clone());
    rt.every("webhook sweep", SWEEP_EVERY, move || {
        let (db, js, ns) = (db.clone(), js.clone(), ns.clone());
        async move {
            let overdue: Vec<(Uuid, i32)> = sqlx::query_as(&format!(
                "SELECT id, attempt_count FROM attempts
                 WHERE status = 'pending' AND next_attempt_at < $1
                   AND leased_until_ms < {}
                 ORDER BY next_attempt_at LIMIT $2",
                postmesh_shared::queue::DB_NOW_MS
            ))
            .bind(now_unix() - OVERDUE_SECS)
            .bind(SWEEP_BATCH)
            .fetch_all(&db)
            .await
            .map_err(|e| e.to_string())?;
            if overdue.is_empty() {
                return Ok::<bool, String>(false);
            }
            tracing::warn!(
                count = overdue.len(),
                "queueing overdue webhook attempts again"
            );
            queue_each(&js, &ns, &overdue)
                .await
                .map_err(|e| e.to_string())?;
            // Once queued, they are not overdue again until their job had its chance.
            sqlx::query("UPDATE attempts SET next_attempt_at = $2 WHERE id = ANY($1)")
                .bind(overdue.iter().map(|(id, _)| *id).collect::<Vec<_>>())
                .bind(now_unix())
                .execute(&db)
                .await
                .map_err(|e| e.to_string())?;
            Ok(false)
        }
    });
}
