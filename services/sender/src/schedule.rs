//! The scheduler: releases scheduled tasks once due. Each pass takes due tasks with
//! `FOR UPDATE SKIP LOCKED`, so replicas split them and a task is released once; a release
//! writes the task's jobs to the outbox in the same transaction that marks it queued.

use postmesh_shared::db::now_unix;
use postmesh_shared::{ApiError, DeliveryId, TaskId, WorkspaceId};

use crate::request::EmailType;
use crate::tasks;
use crate::AppState;

/// Tasks one pass releases at most.
const BATCH: i64 = 20;

#[derive(sqlx::FromRow)]
struct Due {
    id: TaskId,
    workspace_id: WorkspaceId,
    email_type: EmailType,
}

/// Releases up to [`BATCH`] due tasks; true when more may be due.
pub async fn release_due(state: &AppState) -> Result<bool, ApiError> {
    let mut tx = state.db.begin().await?;
    let due: Vec<Due> = sqlx::query_as(
        "SELECT id, workspace_id, email_type FROM tasks
         WHERE status = 'scheduled' AND scheduled_at <= $1
         ORDER BY scheduled_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(now_unix())
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    for task in &due {
        let rows: Vec<(DeliveryId, String)> = sqlx::query_as(
            "SELECT delivery_id, email FROM task_recipients WHERE task_id = $1 ORDER BY idx",
        )
        .bind(task.id)
        .fetch_all(&mut *tx)
        .await?;
        let recipients: Vec<(DeliveryId, &str)> = rows
            .iter()
            .map(|(delivery, email)| (*delivery, email.as_str()))
            .collect();
        let jobs = tasks::Jobs {
            task: task.id,
            workspace: task.workspace_id,
            email_type: task.email_type,
        };
        jobs.enqueue(&mut tx, &state.events, &recipients).await?;
        sqlx::query("UPDATE tasks SET status = 'queued', released_at = $2 WHERE id = $1")
            .bind(task.id)
            .bind(now_unix())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    if !due.is_empty() {
        tracing::info!(tasks = due.len(), "scheduled tasks released");
        crate::send::publish_soon(state);
    }
    Ok(due.len() as i64 == BATCH)
}
