//! `GET /logs` and `GET /logs/download`: the consumption log of the calling key
//! (charges, and refunds as negative amounts), newest first.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sqlx::PgPool;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use uuid::Uuid;

use postmesh_shared::extract::{Caller, QueryParams};
use postmesh_shared::{ApiError, ApiKeyId, Success};

use crate::ledger::EntryKind;
use crate::AppState;
pub use postmesh_contracts::answers::billing::{LogEntry, LogPage, LOG_FIELDS};

/// Page size when none is asked for.
const DEFAULT_LIMIT: i64 = 50;
/// Largest page; larger requests are clamped to it.
const MAX_LIMIT: i64 = 100;
/// Rows in one CSV download (keeps the reply under the NATS payload limit).
pub const DOWNLOAD_MAX_ROWS: i64 = 4000;
/// Bytes of CSV after which a download stops adding rows (the csv writer may buffer 8 KiB
/// more); well under the NATS payload limit.
pub const DOWNLOAD_MAX_BYTES: usize = 896 * 1024;

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    created_at: i64,
    delta: i64,
    caller_email: String,
    target_email: Option<String>,
    from_email: Option<String>,
    subject: Option<String>,
    send_mode: Option<String>,
    recipient_count: Option<i64>,
    task_id: Option<String>,
    kind: EntryKind,
}

impl From<Row> for LogEntry {
    fn from(r: Row) -> Self {
        let timestamp = OffsetDateTime::from_unix_timestamp(r.created_at)
            .ok()
            .and_then(|t| t.format(&Rfc3339).ok())
            .unwrap_or_default();
        Self {
            log_id: r.id.to_string(),
            timestamp,
            amount_deducted: -r.delta as f64,
            caller_email: r.caller_email,
            target_email: r.target_email,
            from_email: r.from_email,
            subject: r.subject,
            send_mode: r.send_mode,
            recipient_count: r.recipient_count.map(|n| n as f64),
            task_id: r.task_id,
            kind: r.kind,
        }
    }
}

async fn page(
    db: &PgPool, key: ApiKeyId, limit: i64, offset: i64,
) -> Result<Vec<LogEntry>, ApiError> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, created_at, delta, caller_email, target_email, from_email, subject, send_mode,
                recipient_count, task_id, kind
         FROM ledger WHERE api_key_id = $1 AND kind IN ('charge', 'refund')
         ORDER BY seq DESC LIMIT $2 OFFSET $3",
    )
    .bind(key)
    .bind(limit)
    .bind(offset)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(LogEntry::from).collect())
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(crate) struct PageQuery {
    /// Entries on the page (default 50; more than 100 is taken as 100).
    #[param(minimum = 1)]
    limit: Option<i64>,
    /// Entries skipped before the page, newest first.
    #[param(minimum = 0)]
    offset: Option<i64>,
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<LogPage>, ApiError> {
    let limit = match q.limit {
        None => DEFAULT_LIMIT,
        Some(n) if n < 1 => return Err(ApiError::BadRequest("limit must be at least 1".into())),
        Some(n) => n.min(MAX_LIMIT),
    };
    let offset = match q.offset {
        None => 0,
        Some(n) if n < 0 => return Err(ApiError::BadRequest("offset must not be negative".into())),
        Some(n) => n,
    };
    let logs = page(&state.db, caller.key, limit, offset).await?;
    Ok(Success::new(LogPage {
        logs,
        limit,
        offset,
    }))
}

pub(crate) async fn download(
    State(state): State<AppState>, caller: Caller,
) -> Result<Response, ApiError> {
    let logs = page(&state.db, caller.key, DOWNLOAD_MAX_ROWS, 0).await?;
    let mut out = csv::Writer::from_writer(Vec::new());
    for entry in &logs {
        out.serialize(entry)
            .map_err(|e| ApiError::internal("csv encoding failed", e))?;
        // The reply travels over NATS (1 MiB payload): stop at a safe size, newest kept.
        if out.get_ref().len() > DOWNLOAD_MAX_BYTES {
            break;
        }
    }
    if logs.is_empty() {
        // serde writes the header with the first row; an empty log still gets one.
        out.write_record(LOG_FIELDS)
            .map_err(|e| ApiError::internal("csv encoding failed", e))?;
    }
    let body = out
        .into_inner()
        .map_err(|e| ApiError::internal("csv encoding failed", e))?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"consumption-log.csv\"",
            ),
        ],
        body,
    )
        .into_response())
}
