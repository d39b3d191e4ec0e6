//! `GET /email-status/{taskId}`: a task's progress — counts of its recipients queued, sent
//! and failed, and each recipient's state, paged with `limit`/`offset`.

use axum::extract::State;
use serde::Deserialize;

use postmesh_shared::extract::{Caller, IdPath, QueryParams};
use postmesh_shared::{ApiError, Success, TaskId};

use serde_json::Value;
use sqlx::types::Json;
use uuid::Uuid;

use crate::sending::events::Kind;
use crate::sending::send::RejectedRecipient;
use crate::sending::tags::{Metadata, Tag};
use crate::sending::tasks::TaskStatus;
use crate::AppState;

pub use postmesh_contracts::answers::sender::{
    DeliveryEvent, Progress, RecipientState, RecipientStatus, TaskProgress,
};

/// Recipients listed per page by default, and at most.
const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

/// `?limit=&offset=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct Page {
    /// Recipients on the page (1-1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Recipients skipped before the page.
    #[param(minimum = 0)]
    pub offset: Option<i64>,
}

/// One recipient's row, with the delivery whose events it shows.
#[derive(sqlx::FromRow)]
struct RecipientRow {
    email: String,
    external_id: Option<String>,
    status: RecipientState,
    error: Option<String>,
    provider_message_id: Option<String>,
    delivery_id: Uuid,
}

impl From<RecipientRow> for RecipientStatus {
    fn from(r: RecipientRow) -> Self {
        Self {
            email: r.email,
            external_id: r.external_id,
            status: r.status,
            error: r.error,
            provider_message_id: r.provider_message_id,
            events: Vec::new(),
        }
    }
}

/// The overall status from the task's state and its recipients' counts.
fn overall(task: TaskStatus, queued: i64, sent: i64, failed: i64) -> Progress {
    match task {
        TaskStatus::Scheduled => Progress::Scheduled,
        TaskStatus::Cancelled => Progress::Cancelled,
        TaskStatus::Failed => Progress::Failed,
        TaskStatus::Queued if queued > 0 && sent + failed == 0 => Progress::Queued,
        TaskStatus::Queued if queued > 0 => Progress::Sending,
        TaskStatus::Queued if failed == 0 => Progress::Sent,
        TaskStatus::Queued if sent == 0 => Progress::Failed,
        TaskStatus::Queued => Progress::PartiallyFailed,
    }
}

pub(crate) async fn status(
    State(state): State<AppState>, caller: Caller, IdPath(task_id): IdPath<TaskId>,
    QueryParams(page): QueryParams<Page>,
) -> Result<Success<TaskProgress>, ApiError> {
    let postmesh_shared::extract::Page { limit, offset } =
        postmesh_shared::extract::Page::within(page.limit, page.offset, DEFAULT_LIMIT, MAX_LIMIT)?;
    type TaskRow = (
        TaskStatus,
        Option<i64>,
        i32,
        bool,
        Json<Vec<Tag>>,
        Json<Metadata>,
        bool,
    );
    let task: Option<TaskRow> = sqlx::query_as(
        "SELECT status, scheduled_at, recipient_count, test_mode, tags, metadata, log_purged
         FROM tasks WHERE id = $1 AND api_key_id = $2",
    )
    .bind(task_id)
    .bind(caller.key)
    .fetch_optional(&state.db)
    .await?;
    let (task_status, scheduled_at, total, test, Json(tags), Json(metadata), purged) =
        task.ok_or_else(|| ApiError::NotFound(format!("no task {task_id}")))?;
    if purged {
        return Err(ApiError::NotFound(format!(
            "task {task_id} is past the log's retention: its deliveries are purged"
        )));
    }
    let (sent, failed): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE d.status = 'sent'), count(*) FILTER (WHERE d.status = 'failed')
         FROM task_recipients r JOIN deliveries d ON d.delivery_id = r.delivery_id
         WHERE r.task_id = $1",
    )
    .bind(task_id)
    .fetch_one(&state.db)
    .await?;
    let rows = sqlx::query_as::<_, RecipientRow>(
        "SELECT r.email, r.external_id,
                CASE WHEN d.status IN ('sent', 'failed') THEN d.status ELSE 'queued' END AS status,
                CASE WHEN d.status <> 'sent' THEN d.last_error END AS error,
                d.provider_message_id, r.delivery_id
         FROM task_recipients r LEFT JOIN deliveries d ON d.delivery_id = r.delivery_id
         WHERE r.task_id = $1 ORDER BY r.idx LIMIT $2 OFFSET $3",
    )
    .bind(task_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(&state.db)
    .await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.delivery_id).collect();
    let mut recipients: Vec<RecipientStatus> =
        rows.into_iter().map(RecipientStatus::from).collect();
    let events: Vec<(Uuid, DeliveryEvent)> = sqlx::query_as::<_, (Uuid, Kind, i64, Json<Value>)>(
        // Within a second, the message's own events before what its reader did with it.
        "SELECT delivery_id, kind, occurred_at, detail FROM delivery_events
         WHERE delivery_id = ANY($1) ORDER BY occurred_at, kind IN ('opened', 'clicked'), id",
    )
    .bind(&ids)
    .fetch_all(&state.db)
    .await?
    .into_iter()
    .map(|(id, kind, occurred_at, detail)| {
        (
            id,
            DeliveryEvent {
                kind,
                occurred_at,
                detail: detail.0,
            },
        )
    })
    .collect();
    let at: std::collections::HashMap<Uuid, usize> =
        ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    for (id, event) in events {
        if let Some(&i) = at.get(&id) {
            recipients[i].events.push(event);
        }
    }
    let rejected = sqlx::query_as::<_, (String, String)>(
        "SELECT email, reason FROM task_rejections WHERE task_id = $1
         ORDER BY idx LIMIT $2 OFFSET $3",
    )
    .bind(task_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(&state.db)
    .await?
    .into_iter()
    .map(|(email, reason)| RejectedRecipient { email, reason })
    .collect();
    let total = i64::from(total);
    let queued = total - sent - failed;
    Ok(Success::new(TaskProgress {
        task_id,
        status: overall(task_status, queued, sent, failed),
        test,
        tags,
        metadata,
        total,
        queued,
        sent,
        failed,
        scheduled_at,
        recipients,
        rejected,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overall_status_follows_the_counts() {
        assert_eq!(overall(TaskStatus::Scheduled, 3, 0, 0), Progress::Scheduled);
        assert_eq!(overall(TaskStatus::Cancelled, 3, 0, 0), Progress::Cancelled);
        assert_eq!(overall(TaskStatus::Queued, 3, 0, 0), Progress::Queued);
        assert_eq!(overall(TaskStatus::Queued, 2, 1, 0), Progress::Sending);
        assert_eq!(overall(TaskStatus::Queued, 0, 3, 0), Progress::Sent);
        assert_eq!(overall(TaskStatus::Queued, 0, 0, 3), Progress::Failed);
        assert_eq!(
            overall(TaskStatus::Queued, 0, 2, 1),
            Progress::PartiallyFailed
        );
    }
}
