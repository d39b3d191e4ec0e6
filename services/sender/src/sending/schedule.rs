//! The scheduler: releases scheduled tasks once due. Each pass takes due tasks with
//! `FOR UPDATE SKIP LOCKED`, so replicas split them and a task is released once; a release
//! writes the task's jobs to the outbox in the same transaction that marks it queued.
//! Suppressions are checked again at release: a recipient suppressed or unsubscribed since
//! the send was accepted is left off (rejected with its reason, a `rejected` event), and so
//! is a cc or bcc address (off every copy, rejected with its reason); their part of the
//! charge is given back. A task left with no recipient gets its whole charge back. Each task
//! is released in a transaction of its own; one whose release fails [`RELEASE_TRIES`] times
//! is set aside as `failed` (its error kept) and refunded, never retried forever, and like a
//! cancelled one counts against no quota or cap, each recipient a `failed` event. A tracked
//! task links through the tracking host its from-domain has at release, not at acceptance;
//! a pass asks the domain service no more after an ask that failed, so a hung domain
//! service holds a pass up once, not once a task.

use sqlx::types::Json;
use sqlx::PgConnection;
use uuid::Uuid;

use postmesh_shared::db::{now_unix, DB_SECOND};
use postmesh_shared::{email, ApiError, DeliveryId, EmailAddress, TaskId, WorkspaceId};

use crate::sending::events::{self, Kind};
use crate::sending::request::EmailType;
use crate::sending::sendable;
use crate::sending::settle::{self, Action};
use crate::{sending::governance, sending::tasks, AppState};

/// Tasks one pass releases at most.
const BATCH: i64 = 20;
/// Failed releases of a task before it is set aside as failed and refunded.
pub const RELEASE_TRIES: i32 = 5;

#[derive(sqlx::FromRow)]
struct Due {
    id: TaskId,
    workspace_id: WorkspaceId,
    email_type: EmailType,
    topic: Option<String>,
}

/// Releases up to [`BATCH`] due tasks, each in its own transaction, so one that fails never
/// holds up the others (tasks that failed before go last); true when more may be due.
pub async fn release_due(state: &AppState) -> Result<bool, ApiError> {
    let due: Vec<TaskId> = sqlx::query_scalar(&format!(
        "SELECT id FROM tasks WHERE status = 'scheduled' AND scheduled_at <= {DB_SECOND}
         ORDER BY release_failures, scheduled_at LIMIT $1",
    ))
    .bind(BATCH)
    .fetch_all(&state.db)
    .await?;
    let (mut released, mut asking) = (0, true);
    for &task in &due {
        match release(state, task, &mut asking).await {
            Ok(true) => released += 1,
            Ok(false) => {}
            Err(e @ ApiError::Unavailable(_)) => return Err(e),
            Err(e) => failed_release(state, task, &e).await?,
        }
    }
    if released > 0 {
        tracing::info!(tasks = released, "scheduled tasks released");
        crate::sending::send::publish_soon(state);
    }
    Ok(due.len() as i64 == BATCH)
}

/// Counts a failed release of `task`; at [`RELEASE_TRIES`] the task is failed and its charge
/// given back.
async fn failed_release(state: &AppState, task: TaskId, e: &ApiError) -> Result<(), ApiError> {
    let mut tx = state.db.begin().await?;
    let failed: Option<(bool, WorkspaceId)> = sqlx::query_as(
        "UPDATE tasks SET release_failures = release_failures + 1, last_error = $2,
             status = CASE WHEN release_failures + 1 >= $3 THEN 'failed' ELSE status END
         WHERE id = $1 AND status = 'scheduled'
         RETURNING status = 'failed', workspace_id",
    )
    .bind(task)
    .bind(e.to_string())
    .bind(RELEASE_TRIES)
    .fetch_optional(&mut *tx)
    .await?;
    let (failed, refund) = match failed {
        Some((true, workspace)) => {
            let reason = Some("the scheduled send could not be released".to_owned());
            let detail = events::Detail::Reason { reason };
            tasks::withdraw(
                &mut tx,
                &state.events,
                workspace,
                task,
                Kind::Failed,
                detail,
            )
            .await?;
            (Some(true), settle::owe_refund_of(&mut tx, task).await?)
        }
        other => (other.map(|(failed, _)| failed), false),
    };
    tx.commit().await?;
    if failed == Some(true) {
        tracing::error!(%task, error = %e, "a scheduled task failed every release; set aside as failed");
    } else {
        tracing::warn!(%task, error = %e, "a scheduled task failed to release; tried again later");
    }
    if refund {
        settle::now(state, task, Action::Refund).await;
    }
    Ok(())
}

/// Releases `task` if it is still scheduled and no other replica holds it: its jobs to the
/// outbox and its status queued, in one transaction; false when there was nothing to do.
/// `asking`: whether the domain service is still asked for tracking hosts this pass.
async fn release(state: &AppState, task: TaskId, asking: &mut bool) -> Result<bool, ApiError> {
    let retracked = tracking_base_now(state, task, asking).await?;
    let mut tx = state.db.begin().await?;
    let Some(task): Option<Due> = sqlx::query_as(
        "SELECT id, workspace_id, email_type, topic FROM tasks
         WHERE id = $1 AND status = 'scheduled' FOR UPDATE SKIP LOCKED",
    )
    .bind(task)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(false);
    };
    let task = &task;
    let mut refund = None;
    let rows: Vec<(DeliveryId, String)> = sqlx::query_as(
        "SELECT delivery_id, email FROM task_recipients WHERE task_id = $1 ORDER BY idx",
    )
    .bind(task.id)
    .fetch_all(&mut *tx)
    .await?;
    let of = rows.len();
    let rows = leave_off_suppressed(&mut tx, state, task, rows).await?;
    if rows.is_empty() {
        if settle::owe_refund_of(&mut tx, task.id).await? {
            refund = Some(Action::Refund);
        }
    } else {
        let copies = leave_off_copies(&mut tx, task).await?;
        // Each recipient left costs its message and its copies; a sandbox address nothing.
        let paid = rows
            .iter()
            .filter(|(_, email)| !state.sandbox.holds(email))
            .count();
        let kept_cost = (paid * (1 + copies.kept)) as i64;
        let changed = rows.len() < of || copies.left_off > 0;
        if changed && settle::owe_part_of(&mut tx, task.id, kept_cost).await? {
            refund = Some(Action::RefundPart);
        }
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
    let changed = retracked.is_some();
    let (base, domain) = retracked.flatten().unzip();
    sqlx::query(
        "UPDATE tasks SET status = 'queued', released_at = $2,
             message = CASE WHEN NOT $3 THEN message
                            ELSE message - 'tracking_base' - 'tracking_domain'
                                 || jsonb_strip_nulls(jsonb_build_object(
                                        'tracking_base', $4::text, 'tracking_domain', $5::uuid))
                            END
         WHERE id = $1",
    )
    .bind(task.id)
    .bind(now_unix())
    .bind(changed)
    .bind(base)
    .bind(domain)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    if let Some(action) = refund {
        settle::now(state, task.id, action).await;
    }
    Ok(true)
}

/// The tracking base, and the domain holding it, a tracked scheduled `task`'s from-domain
/// has now, when they are not the ones stored at acceptance (a tracking host verified, lost
/// or added again since); the stored ones stand when the domain service cannot say, and
/// once it could not, `asking` turns false and it is not asked again.
async fn tracking_base_now(
    state: &AppState, task: TaskId, asking: &mut bool,
) -> Result<Option<Option<(String, Uuid)>>, ApiError> {
    let row: Option<(WorkspaceId, String, Option<String>, Option<Uuid>)> = sqlx::query_as(
        "SELECT workspace_id, message->>'from_email', message->>'tracking_base',
                (message->>'tracking_domain')::uuid FROM tasks
         WHERE id = $1 AND status = 'scheduled'
           AND (COALESCE((message->>'track_opens')::bool, false)
                OR COALESCE((message->>'track_clicks')::bool, false))",
    )
    .bind(task)
    .fetch_optional(&state.db)
    .await?;
    let Some((workspace, from, base, domain)) = row else {
        return Ok(None);
    };
    let Some(from) = EmailAddress::parse(&from) else {
        return Ok(None);
    };
    if !*asking {
        return Ok(None);
    }
    match sendable::sendable(state, workspace, &from).await {
        Ok(reply) => {
            let now = sendable::tracking_base(&reply);
            Ok((now != base.zip(domain)).then_some(now))
        }
        Err(e) => {
            tracing::warn!(%task, error = %e, "tracking hosts not asked again this pass; the stored ones stand");
            *asking = false;
            Ok(None)
        }
    }
}

/// The recipients of `task` still allowed its mail; the others are taken off the task and
/// recorded as rejected with their reasons.
async fn leave_off_suppressed(
    tx: &mut PgConnection, state: &AppState, task: &Due, rows: Vec<(DeliveryId, String)>,
) -> Result<Vec<(DeliveryId, String)>, sqlx::Error> {
    let reasons = barred(tx, task, rows.iter().map(|(_, address)| address.as_str())).await?;
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
             DELETE FROM sends_to WHERE task_id = $1 AND email_key = ANY($3)
         )
         UPDATE tasks SET recipient_count = recipient_count - cardinality($2::uuid[])
         WHERE id = $1",
    )
    .bind(task.id)
    .bind(&deliveries)
    .bind(&address_keys)
    .execute(&mut *tx)
    .await?;
    reject(tx, task.id, &addresses, &reasons).await?;
    let now = now_unix();
    let rejected: Vec<events::NewEvent> = left_off
        .into_iter()
        .map(|((delivery, address), reason)| events::NewEvent {
            workspace: task.workspace_id.as_uuid(),
            task: Some(task.id.as_uuid()),
            delivery: Some(delivery.as_uuid()),
            email: address,
            kind: Kind::Rejected,
            detail: events::Detail::Reason {
                reason: Some(reason),
            },
            occurred_at: now,
            source_key: format!("rejected:{delivery}"),
        })
        .collect();
    tracing::info!(task = %task.id, left_off = rejected.len(), "recipients suppressed since the send was accepted left off at release");
    events::record(tx, &state.events, &rejected).await?;
    Ok(kept)
}

/// Why each of `addresses` may no longer get `task`'s mail (suppressed or unsubscribed
/// since the send was accepted), if it may not.
async fn barred(
    tx: &mut PgConnection, task: &Due, addresses: impl Iterator<Item = &str>,
) -> Result<Vec<Option<String>>, sqlx::Error> {
    let keys = addresses.map(email::key).collect();
    governance::suppressed(
        tx,
        task.workspace_id,
        task.email_type,
        task.topic.as_deref(),
        keys,
    )
    .await
}

/// The copies (cc and bcc) a task still sends after [`leave_off_copies`].
struct Copies {
    kept: usize,
    left_off: usize,
}

/// Takes the cc and bcc addresses suppressed or unsubscribed since the send was accepted
/// off the task's message, and lists them in its rejections with their reasons.
async fn leave_off_copies(tx: &mut PgConnection, task: &Due) -> Result<Copies, sqlx::Error> {
    let (cc, bcc): (Vec<String>, Vec<String>) = sqlx::query_as(
        "SELECT ARRAY(SELECT jsonb_array_elements_text(message->'cc')),
                ARRAY(SELECT jsonb_array_elements_text(message->'bcc'))
         FROM tasks WHERE id = $1",
    )
    .bind(task.id)
    .fetch_one(&mut *tx)
    .await?;
    let (mut kept, mut left_off) = ([Vec::new(), Vec::new()], Vec::new());
    for (list, copies) in [cc, bcc].into_iter().enumerate() {
        if copies.is_empty() {
            continue;
        }
        let reasons = barred(tx, task, copies.iter().map(String::as_str)).await?;
        for (copy, reason) in copies.into_iter().zip(reasons) {
            match reason {
                None => kept[list].push(copy),
                Some(reason) => left_off.push((copy, reason)),
            }
        }
    }
    if !left_off.is_empty() {
        let [cc, bcc] = &kept;
        sqlx::query(
            "UPDATE tasks SET message = message || jsonb_build_object('cc', $2::jsonb, 'bcc', $3::jsonb)
             WHERE id = $1",
        )
        .bind(task.id)
        .bind(Json(cc))
        .bind(Json(bcc))
        .execute(&mut *tx)
        .await?;
        let addresses: Vec<&str> = left_off.iter().map(|(a, _)| a.as_str()).collect();
        let reasons: Vec<&str> = left_off.iter().map(|(_, r)| r.as_str()).collect();
        reject(tx, task.id, &addresses, &reasons).await?;
        tracing::info!(task = %task.id, left_off = left_off.len(), "copies suppressed since the send was accepted left off at release");
    }
    Ok(Copies {
        kept: kept[0].len() + kept[1].len(),
        left_off: left_off.len(),
    })
}

/// Adds `addresses` to the task's rejections, after those it has, with their reasons.
async fn reject(
    tx: &mut PgConnection, task: TaskId, addresses: &[&str], reasons: &[&str],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO task_rejections (task_id, idx, email, reason)
         SELECT $1, (SELECT COALESCE(max(idx) + 1, 0) FROM task_rejections WHERE task_id = $1)
                    + n - 1, e, r
         FROM UNNEST($2::text[], $3::text[]) WITH ORDINALITY AS x(e, r, n)",
    )
    .bind(task)
    .bind(addresses)
    .bind(reasons)
    .execute(tx)
    .await
    .map(drop)
}
