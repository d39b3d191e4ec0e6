//! The scheduler: releases scheduled tasks once due. Each pass takes due tasks with
//! `FOR UPDATE SKIP LOCKED`, so replicas split them and a task is released once; a release
//! writes the task's jobs to the outbox in the same transaction that marks it queued.
//! Suppressions are checked again at release: a recipient suppressed or unsubscribed since
//! the send was accepted is left off (rejected with its reason, a `rejected` event), and a
//! task left with no recipient gets its charge back.

use serde_json::json;
use sqlx::PgConnection;

use postmesh_shared::db::now_unix;
use postmesh_shared::{email, ApiError, DeliveryId, TaskId, WorkspaceId};

use crate::events::{self, Kind};
use crate::request::EmailType;
use crate::settle::{self, Action};
use crate::{governance, tasks, AppState};

/// Tasks one pass releases at most.
const BATCH: i64 = 20;

#[derive(sqlx::FromRow)]
struct Due {
    id: TaskId,
    workspace_id: WorkspaceId,
    email_type: EmailType,
    topic: Option<String>,
}

/// Releases up to [`BATCH`] due tasks; true when more may be due.
pub async fn release_due(state: &AppState) -> Result<bool, ApiError> {
    let mut tx = state.db.begin().await?;
    let due: Vec<Due> = sqlx::query_as(
        "SELECT id, workspace_id, email_type, topic FROM tasks
         WHERE status = 'scheduled' AND scheduled_at <= $1
         ORDER BY scheduled_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(now_unix())
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    let mut refunds = Vec::new();
    for task in &due {
        let rows: Vec<(DeliveryId, String)> = sqlx::query_as(
            "SELECT delivery_id, email FROM task_recipients WHERE task_id = $1 ORDER BY idx",
        )
        .bind(task.id)
        .fetch_all(&mut *tx)
        .await?;
        let rows = leave_off_suppressed(&mut tx, state, task, rows).await?;
        if rows.is_empty() && settle::owe_refund_of(&mut tx, task.id).await? {
            refunds.push(task.id);
        }
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
    for task in refunds {
        settle::now(state, task, Action::Refund).await;
    }
    if !due.is_empty() {
        tracing::info!(tasks = due.len(), "scheduled tasks released");
        crate::send::publish_soon(state);
    }
    Ok(due.len() as i64 == BATCH)
}

/// The recipients of `task` still allowed its mail; the others are taken off the task and
/// recorded as rejected with their reasons.
async fn leave_off_suppressed(
    tx: &mut PgConnection, state: &AppState, task: &Due, rows: Vec<(DeliveryId, String)>,
) -> Result<Vec<(DeliveryId, String)>, sqlx::Error> {
    let keys = rows
        .iter()
        .map(|(_, address)| email::key(address))
        .collect();
    let reasons = governance::suppressed(
        tx,
        task.workspace_id,
        task.email_type,
        task.topic.as_deref(),
        keys,
    )
    .await?;
    let (mut kept, mut left_off) = (Vec::with_capacity(rows.len()), Vec::new());
    for (row, reason) in rows.into_iter().zip(reasons) {
        match reason {
            None => kept.push(row),
            Some(reason) => left_off.push((row, reason)),
        }
    }
    if left_off.is_empty() {
        return Ok(kept);
    }
    let deliveries: Vec<uuid::Uuid> = left_off.iter().map(|((d, _), _)| d.as_uuid()).collect();
    let addresses: Vec<&str> = left_off.iter().map(|((_, a), _)| a.as_str()).collect();
    let address_keys: Vec<String> = addresses.iter().map(|a| email::key(a)).collect();
    let reasons: Vec<&str> = left_off.iter().map(|(_, r)| r.as_str()).collect();
    sqlx::query(
        "WITH gone AS (
             DELETE FROM task_recipients WHERE task_id = $1 AND delivery_id = ANY($2)
         ), unfinished AS (
             DELETE FROM unfinished_deliveries WHERE delivery_id = ANY($2)
         ), counted AS (
             DELETE FROM sends_to WHERE task_id = $1 AND email_key = ANY($5)
         ), rejected AS (
             INSERT INTO task_rejections (task_id, idx, email, reason)
             SELECT $1, (SELECT COALESCE(max(idx) + 1, 0) FROM task_rejections WHERE task_id = $1)
                        + n - 1, e, r
             FROM UNNEST($3::text[], $4::text[]) WITH ORDINALITY AS x(e, r, n)
         )
         UPDATE tasks SET recipient_count = recipient_count - cardinality($2::uuid[])
         WHERE id = $1",
    )
    .bind(task.id)
    .bind(&deliveries)
    .bind(&addresses)
    .bind(&reasons)
    .bind(&address_keys)
    .execute(&mut *tx)
    .await?;
    let now = now_unix();
    let rejected: Vec<events::NewEvent> = left_off
        .into_iter()
        .map(|((delivery, address), reason)| events::NewEvent {
            workspace: task.workspace_id.as_uuid(),
            task: Some(task.id.as_uuid()),
            delivery: Some(delivery.as_uuid()),
            email: address,
            kind: Kind::Rejected,
            detail: json!({ "reason": reason }),
            occurred_at: now,
            source_key: format!("rejected:{delivery}"),
        })
        .collect();
    tracing::info!(task = %task.id, left_off = rejected.len(), "recipients suppressed since the send was accepted left off at release");
    events::record(tx, &state.events, &rejected).await?;
    Ok(kept)
}
