//! Stage 4, record: the delivery's outcome in `deliveries`, written only as the claim's
//! standing allows, and turned into the [`Outcome`] that decides the ack.

use std::time::Duration;

use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::JobId;

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

/// Pauses between attempts to record an outcome while the database does not answer.
const RECORD_RETRIES: [u64; 4] = [0, 100, 500, 2000];

/// Records `verdict` for the job and releases the lease. The message is out (or given up
/// on), so a database error is retried briefly but never turns a delivered message into a
/// retry that would send it again.
pub(super) async fn record(
    worker: &Worker,
    job_id: JobId,
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
    let mut recorded = Err(sqlx::Error::PoolTimedOut);
    for pause in RECORD_RETRIES {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        recorded = sqlx::query(
            // `sent` always stands (the message went out). A failure or a retry is recorded
            // only while this claim still holds the job; otherwise it belongs to another.
            // A final outcome takes the job off the quota's unfinished jobs.
            "WITH finished AS (
                 DELETE FROM unfinished_jobs WHERE job_id = $1 AND $2 <> 'sending'
             )
             UPDATE deliveries SET status = $2, last_error = $3, updated_at = $4,
                                   lease_owner = NULL, leased_until_ms = 0,
                                   provider_message_id = COALESCE($6, provider_message_id)
             WHERE job_id = $1
               AND CASE WHEN $2 = 'sent' THEN status <> 'sent'
                        ELSE status = 'sending' AND lease_owner = $5 END",
        )
        .bind(job_id)
        .bind(status)
        .bind(&error)
        .bind(now_unix())
        .bind(lease)
        .bind(&provider_id)
        .execute(&worker.db)
        .await;
        if recorded.is_ok() {
            break;
        }
    }
    match recorded {
        Ok(done) if done.rows_affected() == 0 && status != DeliveryStatus::Sent => {
            Outcome::Superseded
        }
        Ok(_) => outcome,
        Err(e) => {
            tracing::error!(error = %e, ?status, "could not record the delivery outcome");
            outcome
        }
    }
}
