//! Outcomes of messages in `deliveries`, written only as the claim's standing allows.

use std::collections::HashSet;

use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::queue::{RecordRow, Verdict};

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

/// The row a verdict writes: status, last error and the provider's message id.
fn columns(verdict: &Verdict) -> (&'static str, Option<&str>, Option<&str>) {
    match verdict {
        Verdict::Done(provider_id) => ("sent", None, Some(provider_id)),
        Verdict::Failed(e) => ("failed", Some(e), None),
        Verdict::Retry(e, _) => ("sending", Some(e), None),
    }
}

/// Writes a batch of outcomes (distinct messages); answers for each whether it was
/// written. `sent` always stands (the message went out). A failure or a retry is written
/// only while its claim still holds the message; otherwise it belongs to another claim. A
/// final outcome takes the message off the quota's unfinished deliveries.
pub(super) async fn record_batch(
    db: &PgPool, rows: Vec<RecordRow>,
) -> Result<Vec<bool>, sqlx::Error> {
    let columns: Vec<_> = rows.iter().map(|r| columns(&r.verdict)).collect();
    let written: Vec<Uuid> = sqlx::query_scalar(
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
         RETURNING d.delivery_id",
    )
    .bind(rows.iter().map(|r| r.item).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.0).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.1).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.lease).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.2).collect::<Vec<_>>())
    .bind(now_unix())
    .fetch_all(db)
    .await?;
    let written: HashSet<Uuid> = written.into_iter().collect();
    Ok(rows.iter().map(|r| written.contains(&r.item)).collect())
}
