//! Stage 1, claim: each claim of a job takes a lease on its `deliveries` row, on the
//! database's clock, and renews it with its heartbeats; a live lease of another claim means
//! wait, a finished job means nothing to do.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::JobId;

use super::{DeliveryStatus, Job, Worker};

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
fn lease_ms(worker: &Worker) -> i64 {
    i64::try_from(worker.config.ack_wait.as_millis()).unwrap_or(i64::MAX / 2)
}

/// The stored name of a job's kind (`verification`, `transactional`, ...).
fn kind_name(job: &Job) -> String {
    job.send
        .kind()
        .as_str_name()
        .trim_start_matches("JOB_KIND_")
        .to_ascii_lowercase()
}

/// Records the job and takes its lease under `lease`, unless it is finished or another
/// claim holds a live lease.
/// `to` and `subject` are recorded with the claim.
pub(super) async fn claim(
    worker: &Worker,
    job: &Job,
    to: &[String],
    subject: &str,
    lease: Uuid,
) -> Result<Claim, sqlx::Error> {
    let now = now_unix();
    // Insert, or take over a `sending` row whose lease ran out; a live lease or a finished
    // job leaves the row alone (no row returned).
    let taken: Option<i32> = sqlx::query_scalar(&format!(
        "INSERT INTO deliveries (job_id, kind, recipients, subject, status, created_at, updated_at,
                                 lease_owner, leased_until_ms, workspace_id, task_id)
         VALUES ($1, $2, $3, $4, 'sending', $5, $5, $6, {DB_NOW_MS} + $7, $8, $9)
         ON CONFLICT (job_id) DO UPDATE
             SET attempts = deliveries.attempts + 1, updated_at = $5,
                 lease_owner = $6, leased_until_ms = {DB_NOW_MS} + $7
             WHERE deliveries.status = 'sending' AND deliveries.leased_until_ms <= {DB_NOW_MS}
         RETURNING attempts"
    ))
    .bind(job.id)
    .bind(kind_name(job))
    .bind(to)
    .bind(subject)
    .bind(now)
    .bind(lease)
    .bind(lease_ms(worker))
    .bind(job.workspace)
    .bind(job.task)
    .fetch_optional(&worker.db)
    .await?;
    if let Some(attempt) = taken {
        return Ok(Claim::Deliver(attempt));
    }
    let (status, left_ms): (DeliveryStatus, i64) = sqlx::query_as(&format!(
        "SELECT status, leased_until_ms - {DB_NOW_MS} FROM deliveries WHERE job_id = $1"
    ))
    .bind(job.id)
    .fetch_one(&worker.db)
    .await?;
    Ok(match status {
        DeliveryStatus::Sending => {
            Claim::Held(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)))
        }
        finished => Claim::Finished(finished),
    })
}

async fn renew(worker: &Worker, job_id: JobId, lease: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE deliveries SET leased_until_ms = {DB_NOW_MS} + $3
         WHERE job_id = $1 AND lease_owner = $2 AND status = 'sending'"
    ))
    .bind(job_id)
    .bind(lease)
    .bind(lease_ms(worker))
    .execute(&worker.db)
    .await
    .map(drop)
}

/// Runs `work` while telling JetStream the job is in progress every half `ack_wait`, so a
/// slow delivery is not redelivered to another worker while this one is still on it, and
/// renewing the job's lease in the database, which covers heartbeats to NATS that fail while
/// the worker goes on. If the worker dies, both stop and the job is redelivered after
/// `ack_wait`.
pub(super) async fn with_heartbeat<T>(
    worker: &Worker,
    msg: &jetstream::Message,
    job_id: JobId,
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
                match tokio::time::timeout(bound, renew(worker, job_id, lease)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not renew the job's lease"),
                    Err(_) => tracing::warn!("renewing the job's lease timed out"),
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
