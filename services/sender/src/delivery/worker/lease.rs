//! Claims of messages: each claim takes a lease on the message's `deliveries` row, on the
//! database's clock, and renews it with its heartbeats; a live lease of another claim means
//! wait, a finished message means nothing to do.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::queue::{ClaimRow, Standing, DB_NOW_MS};

use super::record::DeliveryStatus;

/// What a claim writes about its message, besides the lease.
pub(super) struct Claim {
    pub kind: &'static str,
    pub recipient: String,
    pub subject: String,
    pub workspace: Option<Uuid>,
    pub task: Option<Uuid>,
}

/// Writes a batch of claims (distinct messages): each inserts its message, or takes over a
/// `sending` row whose lease ran out; a live lease or a finished message leaves the row
/// alone. Answers each claim's attempt number when it took the lease.
pub(super) async fn claim_batch(
    db: &PgPool, lease_ms: i64, rows: Vec<ClaimRow<Claim>>,
) -> Result<Vec<Option<i32>>, sqlx::Error> {
    let taken: Vec<(Uuid, i32)> = sqlx::query_as(&format!(
        "INSERT INTO deliveries (delivery_id, kind, recipients, subject, status, created_at,
                                 updated_at, lease_owner, leased_until_ms, workspace_id, task_id)
         SELECT u.delivery_id, u.kind, ARRAY[u.recipient], u.subject, 'sending',
                $8, $8, u.lease, {DB_NOW_MS} + $9, u.workspace_id, u.task_id
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::uuid[], $6::uuid[],
                     $7::uuid[])
              AS u(delivery_id, kind, recipient, subject, lease, workspace_id, task_id)
         ON CONFLICT (delivery_id) DO UPDATE
             SET attempts = deliveries.attempts + 1, updated_at = $8,
                 lease_owner = EXCLUDED.lease_owner, leased_until_ms = {DB_NOW_MS} + $9
             WHERE deliveries.status = 'sending' AND deliveries.leased_until_ms <= {DB_NOW_MS}
         RETURNING delivery_id, attempts"
    ))
    .bind(rows.iter().map(|r| r.item).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.data.kind).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.data.recipient.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|r| r.data.subject.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|r| r.lease).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.data.workspace).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.data.task).collect::<Vec<_>>())
    .bind(now_unix())
    .bind(lease_ms)
    .fetch_all(db)
    .await?;
    let taken: HashMap<Uuid, i32> = taken.into_iter().collect();
    Ok(rows.iter().map(|r| taken.get(&r.item).copied()).collect())
}

/// Where a message stands that a claim did not take: finished, or leased elsewhere.
pub(super) async fn standing(db: &PgPool, delivery: Uuid) -> Result<Standing, sqlx::Error> {
    let (status, left_ms): (DeliveryStatus, i64) = sqlx::query_as(&format!(
        "SELECT status, leased_until_ms - {DB_NOW_MS} FROM deliveries WHERE delivery_id = $1"
    ))
    .bind(delivery)
    .fetch_one(db)
    .await?;
    Ok(match status {
        DeliveryStatus::Sending => {
            Standing::Held(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)))
        }
        DeliveryStatus::Sent | DeliveryStatus::Failed => Standing::Finished,
    })
}

/// Extends the leases `lease` holds on the messages `ids` to `lease_ms` from now.
pub(super) async fn renew(
    db: &PgPool, ids: &[Uuid], lease: Uuid, lease_ms: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE deliveries SET leased_until_ms = {DB_NOW_MS} + $3
         WHERE delivery_id = ANY($1) AND lease_owner = $2 AND status = 'sending'"
    ))
    .bind(ids)
    .bind(lease)
    .bind(lease_ms)
    .execute(db)
    .await
    .map(drop)
}
