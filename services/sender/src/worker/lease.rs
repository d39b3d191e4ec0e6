//! Stage 1, claim: each claim of a job takes a lease on its `deliveries` row, on the
//! database's clock, and renews it with its heartbeats; a live lease of another claim means
//! wait, a finished job means nothing to do.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::DeliveryId;

use super::batch::Keyed;
use super::{Delivery, DeliveryStatus, Job, Worker};

/// The database's clock in milliseconds: leases are set and compared on one clock, whatever
/// the clocks of the sender hosts say.
pub(super) const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// How a job stands when a claim reaches it.
pub(super) enum Claim {
    /// This claim holds the lease and delivers; its attempt number.
    Deliver(i32),
    /// Sent or failed before: nothing to do.
    Finished(DeliveryStatus),
    /// Another claim holds a live lease for about this long.
    Held(Duration),
}

/// Milliseconds a lease lasts: as long as JetStream's ack deadline.
pub(super) fn lease_ms(ack_wait: Duration) -> i64 {
    i64::try_from(ack_wait.as_millis()).unwrap_or(i64::MAX / 2)
}

/// A claim to write: the job, what it delivers, and the claim's lease token.
pub(super) struct ClaimRow {
    delivery_id: DeliveryId,
    kind: &'static str,
    /// Recipients, one per line.
    recipients: String,
    subject: String,
    lease: Uuid,
    workspace: Option<Uuid>,
    task: Option<Uuid>,
}

impl Keyed for ClaimRow {
    type Key = DeliveryId;
    fn key(&self) -> DeliveryId {
        self.delivery_id
    }
}

/// Writes a batch of claims (distinct jobs): each inserts its job, or takes over a
/// `sending` row whose lease ran out; a live lease or a finished job leaves the row alone.
/// Answers each claim's attempt number when it took the lease.
pub(super) async fn claim_batch(
    db: &PgPool,
    lease_ms: i64,
    rows: Vec<ClaimRow>,
) -> Result<Vec<Option<i32>>, sqlx::Error> {
    let column = |f: fn(&ClaimRow) -> String| rows.iter().map(f).collect::<Vec<_>>();
    let taken: Vec<(Uuid, i32)> = sqlx::query_as(&format!(
        "INSERT INTO deliveries (delivery_id, kind, recipients, subject, status, created_at, updated_at,
                                 lease_owner, leased_until_ms, workspace_id, task_id)
         SELECT u.delivery_id, u.kind, string_to_array(u.recipients, E'\\n'), u.subject, 'sending',
                $8, $8, u.lease, {DB_NOW_MS} + $9, u.workspace_id, u.task_id
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::uuid[], $6::uuid[],
                     $7::uuid[]) AS u(delivery_id, kind, recipients, subject, lease, workspace_id, task_id)
         ON CONFLICT (delivery_id) DO UPDATE
             SET attempts = deliveries.attempts + 1, updated_at = $8,
                 lease_owner = EXCLUDED.lease_owner, leased_until_ms = {DB_NOW_MS} + $9
             WHERE deliveries.status = 'sending' AND deliveries.leased_until_ms <= {DB_NOW_MS}
         RETURNING delivery_id, attempts"
    ))
    .bind(rows.iter().map(|r| r.delivery_id.as_uuid()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.kind).collect::<Vec<_>>())
    .bind(column(|r| r.recipients.clone()))
    .bind(column(|r| r.subject.clone()))
    .bind(rows.iter().map(|r| r.lease).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.workspace).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.task).collect::<Vec<_>>())
    .bind(now_unix())
    .bind(lease_ms)
    .fetch_all(db)
    .await?;
    let taken: HashMap<Uuid, i32> = taken.into_iter().collect();
    Ok(rows
        .iter()
        .map(|r| taken.get(&r.delivery_id.as_uuid()).copied())
        .collect())
}

/// Records the job's message `delivery` (with `subject`) and takes its lease under
/// `lease`, unless it is finished or another claim holds a live lease.
pub(super) async fn claim(
    worker: &Worker,
    job: &Job,
    delivery: &Delivery,
    subject: &str,
    lease: Uuid,
) -> Result<Claim, String> {
    let row = ClaimRow {
        delivery_id: delivery.id,
        kind: job.send.kind().name(),
        recipients: delivery.to.join("\n"),
        subject: subject.to_owned(),
        lease,
        workspace: job.workspace.map(|w| w.as_uuid()),
        task: job.task.map(|t| t.as_uuid()),
    };
    if let Some(attempt) = worker.claims.call(row).await? {
        return Ok(Claim::Deliver(attempt));
    }
    let (status, left_ms): (DeliveryStatus, i64) = sqlx::query_as(&format!(
        "SELECT status, leased_until_ms - {DB_NOW_MS} FROM deliveries WHERE delivery_id = $1"
    ))
    .bind(delivery.id)
    .fetch_one(&worker.db)
    .await
    .map_err(|e| e.to_string())?;
    Ok(match status {
        DeliveryStatus::Sending => {
            Claim::Held(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)))
        }
        finished => Claim::Finished(finished),
    })
}

/// Extends the leases `lease` holds on the messages `ids`.
async fn renew(worker: &Worker, ids: &[DeliveryId], lease: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE deliveries SET leased_until_ms = {DB_NOW_MS} + $3
         WHERE delivery_id = ANY($1) AND lease_owner = $2 AND status = 'sending'"
    ))
    .bind(ids.iter().map(|id| id.as_uuid()).collect::<Vec<_>>())
    .bind(lease)
    .bind(lease_ms(worker.config.ack_wait))
    .execute(&worker.db)
    .await
    .map(drop)
}

/// Runs `work` while telling JetStream the job is in progress every half `ack_wait`, so a
/// slow job is not redelivered to another worker while this one is still on it, and
/// renewing the leases of its messages `ids` in the database, which covers heartbeats to NATS that fail while
/// the worker goes on. If the worker dies, both stop and the job is redelivered after
/// `ack_wait`.
pub(super) async fn with_heartbeat<T>(
    worker: &Worker,
    msg: &jetstream::Message,
    ids: &[DeliveryId],
    lease: Uuid,
    work: impl Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let period = (worker.config.ack_wait / 2).max(Duration::from_millis(100));
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = beat.tick() => {
                // The lease first, each call bounded: a stuck NATS connection must not
                // hold up the lease renewal that covers for it.
                let bound = period / 2;
                match tokio::time::timeout(bound, renew(worker, ids, lease)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not renew the job's leases"),
                    Err(_) => tracing::warn!("renewing the job's leases timed out"),
                }
                match tokio::time::timeout(bound, msg.ack_with(AckKind::Progress)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not extend the job's ack deadline"),
                    Err(_) => tracing::warn!("extending the job's ack deadline timed out"),
                }
            }
        }
    }
}
