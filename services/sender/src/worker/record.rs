//! Stage 4, record: the delivery's outcome in `deliveries`, written only as the claim's
//! standing allows, and turned into the [`Outcome`] that decides the ack.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::batch::Keyed;

use postmesh_shared::db::now_unix;
use postmesh_shared::DeliveryId;

use super::{DeliveryStatus, Outcome, Worker};
use crate::transport::TransportError;

/// What the transport's answer means for the job.
pub(super) enum Verdict {
    /// Delivered; the provider's id of the message.
    Sent(String),
    /// Failed for good.
    Failed(String),
    /// Failed for now; the job stays `sending` and is tried again.
    Retry(String),
}

impl Verdict {
    /// The verdict on a delivery; a transient failure of the `last` attempt is final.
    pub(super) fn of(delivered: Result<String, TransportError>, last: bool) -> Self {
        match delivered {
            Ok(id) => Self::Sent(id),
            Err(TransportError::Permanent(e)) => Self::Failed(e),
            Err(TransportError::Transient(e)) if last => Self::Failed(e),
            Err(TransportError::Transient(e)) => Self::Retry(e),
        }
    }
}

/// An outcome to write.
#[derive(Clone)]
pub(super) struct RecordRow {
    delivery_id: DeliveryId,
    status: DeliveryStatus,
    error: Option<String>,
    /// The claim recording it.
    lease: Uuid,
    provider: Option<String>,
}

impl Keyed for RecordRow {
    type Key = DeliveryId;
    fn key(&self) -> DeliveryId {
        self.delivery_id
    }
}

/// Writes a batch of outcomes (distinct jobs); answers for each whether it was written.
/// `sent` always stands (the message went out). A failure or a retry is written only while
/// its claim still holds the job; otherwise the job belongs to another claim. A final
/// outcome takes the job off the quota's unfinished jobs.
pub(super) async fn record_batch(
    db: &PgPool,
    rows: Vec<RecordRow>,
) -> Result<Vec<bool>, sqlx::Error> {
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
    .bind(
        rows.iter()
            .map(|r| r.delivery_id.as_uuid())
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|r| r.status.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.error.as_deref()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.lease).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.provider.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(now_unix())
    .fetch_all(db)
    .await?;
    let written: HashSet<Uuid> = written.into_iter().collect();
    Ok(rows
        .iter()
        .map(|r| written.contains(&r.delivery_id.as_uuid()))
        .collect())
}

/// Pauses between attempts to record an outcome while the database does not answer.
const RECORD_RETRIES: [u64; 4] = [0, 100, 500, 2000];

/// Records `verdict` for the job and releases the lease. The message is out (or given up
/// on), so a database error is retried briefly but never turns a delivered message into a
/// retry that would send it again.
pub(super) async fn record(
    worker: &Worker,
    delivery_id: DeliveryId,
    lease: Uuid,
    verdict: Verdict,
) -> Outcome {
    let (status, error, provider_id, outcome) = match verdict {
        Verdict::Sent(id) => (DeliveryStatus::Sent, None, Some(id), Outcome::Done),
        Verdict::Failed(e) => (
            DeliveryStatus::Failed,
            Some(e.clone()),
            None,
            Outcome::Park(e),
        ),
        Verdict::Retry(e) => (
            DeliveryStatus::Sending,
            Some(e.clone()),
            None,
            Outcome::Retry(e),
        ),
    };
    let row = RecordRow {
        delivery_id,
        status,
        error,
        lease,
        provider: provider_id,
    };
    let mut recorded = Err(String::new());
    for pause in RECORD_RETRIES {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        recorded = worker.records.call(row.clone()).await;
        if recorded.is_ok() {
            break;
        }
    }
    match recorded {
        Ok(false) if status != DeliveryStatus::Sent => Outcome::Superseded,
        Ok(_) => outcome,
        Err(e) => {
            tracing::error!(error = %e, ?status, "could not record the delivery outcome");
            outcome
        }
    }
}
