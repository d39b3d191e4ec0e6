//! Outcomes of messages in `deliveries`, written only as the claim's standing allows.

use std::collections::HashSet;

use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::now_unix;

use crate::delivery::sandbox;
use crate::sending::events::{self, Detail, Kind, NewEvent, Outlet};
use postmesh_shared::queue::{RecordRow, Verdict};

/// A message whose outcome was written.
#[derive(sqlx::FromRow)]
struct Written {
    delivery_id: Uuid,
    status: DeliveryStatus,
    /// A send's (none for a verification code email).
    workspace_id: Option<Uuid>,
    task_id: Option<Uuid>,
    email: Option<String>,
    provider_message_id: Option<String>,
    last_error: Option<String>,
}

/// Where a message stands in `deliveries`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub(crate) enum DeliveryStatus {
    /// Claimed; being delivered or waiting for a retry.
    Sending,
    Sent,
    /// Parked for good, with its reason.
    Failed,
}

impl DeliveryStatus {
    /// Its name in SQL.
    fn as_str(self) -> &'static str {
        match self {
            Self::Sending => "sending",
            Self::Sent => "sent",
            Self::Failed => "failed",
        }
    }
}

/// The row a verdict writes: status, last error and the provider's message id.
fn columns(verdict: &Verdict) -> (DeliveryStatus, Option<&str>, Option<&str>) {
    match verdict {
        Verdict::Done(provider_id) => (DeliveryStatus::Sent, None, Some(provider_id)),
        Verdict::Failed(e) => (DeliveryStatus::Failed, Some(e), None),
        Verdict::Retry(e, _) => (DeliveryStatus::Sending, Some(e), None),
    }
}

/// Writes a batch of outcomes (distinct messages); answers for each whether it was
/// written. `sent` always stands (the message went out). A failure or a retry is written
/// only while its claim still holds the message; otherwise it belongs to another claim. A
/// final outcome takes the message off the quota's unfinished deliveries. A send's message
/// that went out is a `sent` delivery event, one given up on a `failed` one, in the same
/// transaction.
pub(super) async fn record_batch(
    db: &PgPool, outlet: &Outlet, rows: Vec<RecordRow>,
) -> Result<Vec<bool>, sqlx::Error> {
    let columns: Vec<_> = rows.iter().map(|r| columns(&r.verdict)).collect();
    let now = now_unix();
    let mut tx = db.begin().await?;
    let written: Vec<Written> = sqlx::query_as(
        "WITH u AS (
             SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::text[])
                 AS u(delivery_id, status, error, lease, provider)
         ), finished AS (
             DELETE FROM unfinished_deliveries f USING u
             WHERE f.delivery_id = u.delivery_id AND u.status <> 'sending'
         )
         UPDATE deliveries d
         SET status = u.status, last_error = u.error, updated_at = $6, lease_owner = NULL,
             leased_until_ms = 0, provider_message_id = COALESCE(u.provider, d.provider_message_id)
         FROM u
         WHERE d.delivery_id = u.delivery_id
           AND CASE WHEN u.status = 'sent' THEN d.status <> 'sent'
                    ELSE d.status = 'sending' AND d.lease_owner = u.lease END
         RETURNING d.delivery_id, d.status, d.workspace_id, d.task_id, d.recipients[1] AS email,
             d.provider_message_id, d.last_error",
    )
    .bind(rows.iter().map(|r| r.item).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.0.as_str()).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.1).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.lease).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.2).collect::<Vec<_>>())
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    // A final outcome is an event: `sent` as of its try's start (so no open or click of
    // the message comes before it), or `failed` with its reason.
    let tried_at: std::collections::HashMap<Uuid, i64> =
        rows.iter().map(|r| (r.item, r.tried_at)).collect();
    let finals: Vec<NewEvent> = written
        .iter()
        .filter_map(|w| {
            let (kind, detail, at) = match w.status {
                DeliveryStatus::Sent => (
                    Kind::Sent,
                    Detail::Sent {
                        provider_message_id: w.provider_message_id.clone(),
                    },
                    tried_at.get(&w.delivery_id).copied().unwrap_or(now),
                ),
                DeliveryStatus::Failed => (
                    Kind::Failed,
                    Detail::Reason {
                        reason: w.last_error.clone(),
                    },
                    now,
                ),
                DeliveryStatus::Sending => return None,
            };
            Some(NewEvent {
                workspace: w.workspace_id?,
                task: w.task_id,
                delivery: Some(w.delivery_id),
                email: w.email.clone().unwrap_or_default(),
                kind,
                detail,
                occurred_at: at,
                source_key: format!("{}:{}", kind.as_str(), w.delivery_id),
            })
        })
        .collect();
    // A sandbox message's events follow its `sent` at once.
    let sent: Vec<sandbox::Sent> = written
        .iter()
        .filter(|w| w.status == DeliveryStatus::Sent)
        .filter_map(|w| {
            Some(sandbox::Sent {
                delivery: w.delivery_id,
                workspace: w.workspace_id?,
                task: w.task_id,
                email: w.email.as_deref()?,
                provider_id: w.provider_message_id.as_deref()?,
            })
        })
        .collect();
    let mut finals = finals;
    finals.extend(sandbox::follow(&mut tx, &sent, now).await?);
    events::record(&mut tx, outlet, &finals).await?;
    tx.commit().await?;
    let written: HashSet<Uuid> = written.into_iter().map(|w| w.delivery_id).collect();
    Ok(rows.iter().map(|r| written.contains(&r.item)).collect())
}
