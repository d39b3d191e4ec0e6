//! The delivery worker: takes jobs from the SEND work queue and runs each through its
//! stages — claim (lease the job), build (the MIME message), deliver (the transport),
//! record (the outcome) — and only then acks, as the typed [`Outcome`] says. Policy:
//! docs/decisions.md, "Delivery (sender)".

mod batch;
mod cache;
mod lease;
mod message;
mod record;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use prost::Message as _;
use sqlx::PgPool;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::SendJob;
use postmesh_shared::{telemetry, JobId, Runtime, TaskId, WorkspaceId};

use crate::tasks::{self, LoadedTask};
use crate::transport::{Transport, TransportError};

/// Retry and concurrency settings of the worker.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// How long JetStream waits for an ack before redelivering a job.
    pub ack_wait: Duration,
    /// Delivery attempts (claims that reached the transport) before a job is parked as failed.
    pub max_deliver: i64,
    /// Delay before the first retry; doubles with each attempt.
    pub retry_base: Duration,
    /// Jobs delivered at once by one worker.
    pub concurrency: usize,
}

/// The longest pause before a job is tried again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(15 * 60);

/// Waits for another worker's lease, in units of `ack_wait`, before handing a job back.
const LEASE_WAITS: u32 = 5;

/// A job as the worker knows it: the message and its parsed ids.
pub(crate) struct Job {
    pub id: JobId,
    pub send: SendJob,
    pub workspace: Option<WorkspaceId>,
    /// For a recipient of a task: the task.
    pub task: Option<TaskId>,
}

/// What a job delivers: its recipients and subject (recorded with the claim) and, for a
/// task's job, the task (`None` when it is gone: the job fails).
struct Letter {
    to: Vec<String>,
    subject: String,
    task: Option<Arc<LoadedTask>>,
}

impl DeliveryStatus {
    /// The stored name.
    fn as_str(self) -> &'static str {
        match self {
            Self::Sending => "sending",
            Self::Sent => "sent",
            Self::Failed => "failed",
        }
    }
}

/// Where a job stands in `deliveries`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub(crate) enum DeliveryStatus {
    /// Claimed; being delivered or waiting for a retry.
    Sending,
    Sent,
    /// Parked for good, with its reason.
    Failed,
}

/// How handling a job ended; decides how the message is acknowledged.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Delivered now, or before (a redelivery of a finished job).
    Done,
    /// Another claim holds a live lease for about this long.
    Leased(Duration),
    /// Another claim took the job over while this one worked: the message is its business.
    Superseded,
    /// A transient failure: try again later.
    Retry(String),
    /// Failed for good (recorded as `failed`).
    Park(String),
}

/// The delivery stages' shared equipment.
pub(crate) struct Worker {
    pub db: PgPool,
    pub transport: Transport,
    pub config: WorkerConfig,
    /// Cancelled when the worker stops: a handler waiting on a lease hands its job back.
    pub shutdown: CancellationToken,
    /// The domain of the Message-IDs made here.
    pub message_id_domain: String,
    /// Tasks recently delivered, so a task's recipients do not each read it again.
    pub tasks: cache::TaskCache,
    /// Claims of jobs, written in batches.
    claims: batch::Batcher<lease::ClaimRow, Option<i32>>,
    /// Outcomes of jobs, written in batches.
    records: batch::Batcher<record::RecordRow, bool>,
}

/// Consumes the SEND stream until the runtime shuts down; jobs in progress finish first.
pub async fn spawn(
    rt: &Runtime,
    transport: Transport,
    config: WorkerConfig,
    message_id_domain: &str,
) -> anyhow::Result<()> {
    let stream = Stream::Send.ensure(&rt.js, &rt.common.namespace).await?;
    let consumer = stream
        .get_or_create_consumer(
            "sender",
            pull::Config {
                durable_name: Some("sender".into()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                // Unlimited: attempts are counted in `deliveries` (docs/decisions.md).
                max_deliver: -1,
                // One batch waits beside the jobs being worked on, so a free slot never
                // waits for a pull. A waiting job that outlives its ack deadline and is
                // delivered again is claimed once: the lease decides (docs/decisions.md).
                max_ack_pending: 2 * config.concurrency as i64,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("creating the sender consumer: {e}"))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(config.concurrency)
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("pulling from the SEND stream: {e}"))?;
    let limit = Arc::new(Semaphore::new(config.concurrency));
    let ack_wait = config.ack_wait;
    let worker = Arc::new(Worker {
        db: rt.db.clone(),
        transport,
        config,
        shutdown: rt.shutdown.clone(),
        message_id_domain: message_id_domain.to_owned(),
        tasks: cache::TaskCache::default(),
        claims: batch::Batcher::spawn(&rt.tracker, {
            let (db, lease_ms) = (rt.db.clone(), lease::lease_ms(ack_wait));
            move |rows| {
                let db = db.clone();
                async move { lease::claim_batch(&db, lease_ms, rows).await }
            }
        }),
        records: batch::Batcher::spawn(&rt.tracker, {
            let db = rt.db.clone();
            move |rows| {
                let db = db.clone();
                async move { record::record_batch(&db, rows).await }
            }
        }),
    });
    let (jobs, shutdown) = (rt.tracker.clone(), rt.shutdown.clone());
    rt.tracker.spawn(async move {
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                p = limit.clone().acquire_owned() => p.expect("semaphore is never closed"),
            };
            let msg = tokio::select! {
                _ = shutdown.cancelled() => break,
                m = messages.next() => m,
            };
            match msg {
                Some(Ok(msg)) => {
                    let worker = worker.clone();
                    jobs.spawn(async move {
                        worker.handle(msg).await;
                        drop(permit);
                    });
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "SEND stream pull failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                None => break,
            }
        }
    });
    Ok(())
}

/// The pause before retry number `delivered`: doubling from `base`, at most 15 minutes.
/// Deliveries are not capped, so a long outage must not push the next try days away.
pub fn retry_delay(base: Duration, delivered: i64) -> Duration {
    let doublings = u32::try_from((delivered - 1).clamp(0, 16)).unwrap_or(16);
    (base * 2u32.pow(doublings)).min(MAX_RETRY_DELAY)
}

impl Worker {
    /// Handles one message of the SEND stream, start to ack.
    async fn handle(&self, msg: jetstream::Message) {
        let span = tracing::info_span!("send.deliver", job_id = tracing::field::Empty);
        telemetry::link_nats(&span, msg.headers.as_ref());
        async {
            let job = match decode(&msg.payload) {
                Ok(job) => job,
                Err(reason) => {
                    tracing::error!(%reason, "undeliverable send job dropped from the queue");
                    let _ = msg.ack_with(AckKind::Term).await;
                    return;
                }
            };
            tracing::Span::current().record("job_id", tracing::field::display(job.id));
            let outcome = self.run(&msg, &job).await;
            self.acknowledge(&msg, outcome).await;
        }
        .instrument(span)
        .await
    }

    /// Runs the stages under one claim, waiting (with in-progress acks) while another claim
    /// holds a live lease, within bounds.
    async fn run(&self, msg: &jetstream::Message, job: &Job) -> Outcome {
        // A token of this claim: a redelivery to this same process is another claimant.
        let lease = Uuid::now_v7();
        let mut waited = Duration::ZERO;
        loop {
            let work = self.process(job, lease);
            match lease::with_heartbeat(self, msg, job.id, lease, work).await {
                Outcome::Leased(wait) if waited < self.config.ack_wait * LEASE_WAITS => {
                    tracing::info!(?wait, "another worker holds the job's lease; waiting");
                    let pause = wait.min(self.config.ack_wait / 2);
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return Outcome::Leased(wait),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    waited += pause;
                    let _ = msg.ack_with(AckKind::Progress).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// The job's recipients, subject and task (a task's job names its one recipient).
    async fn letter(&self, job: &Job) -> Result<Letter, sqlx::Error> {
        let Some(task_id) = job.task else {
            return Ok(Letter {
                to: job.send.to.clone(),
                subject: job.send.subject.clone(),
                task: None,
            });
        };
        let task = match self.tasks.get(task_id) {
            Some(task) => Some(task),
            None => tasks::load(&self.db, task_id)
                .await?
                .map(|t| self.tasks.insert(task_id, t)),
        };
        Ok(Letter {
            to: job.send.to.clone(),
            subject: task
                .as_ref()
                .map(|t| t.message.subject.clone())
                .unwrap_or_default(),
            task,
        })
    }

    /// The job's MIME message; the error says why it can never be built.
    fn build(&self, job: &Job, letter: &Letter) -> Result<lettre::Message, String> {
        let message_id = format!("<{}@{}>", job.id, self.message_id_domain);
        let draft = match (&job.task, &letter.task) {
            (None, _) => {
                let s = &job.send;
                message::Draft {
                    message_id,
                    from_email: &s.from_email,
                    from_name: Some(s.from_name.as_str()).filter(|n| !n.is_empty()),
                    to: &s.to,
                    cc: &[],
                    bcc: &[],
                    reply_to: None,
                    subject: &s.subject,
                    text: &s.text,
                    html: &s.html,
                    in_reply_to: None,
                    references: &[],
                    attachments: &[],
                    test: false,
                }
            }
            (Some(_), Some(task)) => message::Draft::of_task(task, &letter.to, message_id),
            (Some(task), None) => return Err(format!("task {task} no longer exists")),
        };
        message::build(&draft)
    }

    /// claim → build → deliver → record.
    async fn process(&self, job: &Job, lease: Uuid) -> Outcome {
        let letter = match self.letter(job).await {
            Ok(letter) => letter,
            Err(e) => return Outcome::Retry(format!("database: {e}")),
        };
        let attempt = match lease::claim(self, job, &letter.to, &letter.subject, lease).await {
            Ok(lease::Claim::Deliver(attempt)) => i64::from(attempt),
            Ok(lease::Claim::Finished(status)) => {
                tracing::info!(?status, "job already handled; acknowledging the redelivery");
                return Outcome::Done;
            }
            Ok(lease::Claim::Held(left)) => {
                return Outcome::Leased(left.max(Duration::from_millis(100)))
            }
            Err(e) => return Outcome::Retry(format!("database: {e}")),
        };
        let delivered = match self.build(job, &letter) {
            Ok(message) => self.transport.deliver(job.id, message).await,
            Err(reason) => Err(TransportError::Permanent(reason)),
        };
        let verdict = record::Verdict::of(delivered, attempt >= self.config.max_deliver);
        record::record(self, job.id, lease, verdict).await
    }

    /// Acknowledges the message as `outcome` says.
    async fn acknowledge(&self, msg: &jetstream::Message, outcome: Outcome) {
        let result = match &outcome {
            Outcome::Done => "sent",
            Outcome::Park(_) => "failed",
            Outcome::Retry(_) => "retry",
            Outcome::Leased(_) | Outcome::Superseded => "elsewhere",
        };
        metrics::counter!("postmesh_sender_deliveries_total", "result" => result).increment(1);
        let _ = match outcome {
            // Not waited for: a lost ack redelivers a job that is recorded as finished,
            // and its claim acknowledges it without sending.
            Outcome::Done => msg.ack().await,
            Outcome::Leased(wait) => {
                tracing::info!(?wait, "the job's lease is still held; handing the job back");
                msg.ack_with(AckKind::Nak(Some(wait))).await
            }
            Outcome::Superseded => {
                tracing::warn!("another claim took the job over; leaving the message to it");
                Ok(())
            }
            Outcome::Park(reason) => {
                tracing::error!(%reason, "delivery failed for good; parked");
                msg.ack_with(AckKind::Term).await
            }
            Outcome::Retry(reason) => {
                let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
                let delay = retry_delay(self.config.retry_base, delivered);
                tracing::warn!(%reason, delivered, ?delay, "delivery failed; will retry");
                msg.ack_with(AckKind::Nak(Some(delay))).await
            }
        };
    }
}

/// Parses a SEND message; a job that can never be delivered is the error.
fn decode(payload: &[u8]) -> Result<Job, String> {
    let send = SendJob::decode(payload).map_err(|e| format!("undecodable: {e}"))?;
    let id = JobId::parse(&send.id).ok_or("job id is not a uuid")?;
    let task = match send.task_id.as_str() {
        "" => None,
        raw => Some(TaskId::parse(raw).ok_or("task id is not a uuid")?),
    };
    Ok(Job {
        id,
        workspace: WorkspaceId::parse(&send.workspace_id),
        task,
        send,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_doubling_up_to_a_cap() {
        let base = Duration::from_secs(5);
        assert_eq!(retry_delay(base, 1), Duration::from_secs(5));
        assert_eq!(retry_delay(base, 2), Duration::from_secs(10));
        assert_eq!(retry_delay(base, 4), Duration::from_secs(40));
        assert_eq!(retry_delay(base, 9), MAX_RETRY_DELAY);
        assert_eq!(retry_delay(base, i64::MAX), MAX_RETRY_DELAY);
        assert_eq!(retry_delay(base, 0), base);
    }

    #[test]
    fn jobs_without_a_uuid_id_are_refused() {
        let job = SendJob {
            id: "nope".into(),
            ..Default::default()
        };
        assert!(decode(&job.encode_to_vec()).is_err());
        assert!(decode(b"\xff\xff").is_err());
        let id = JobId::new();
        let job = SendJob {
            id: id.to_string(),
            ..Default::default()
        };
        assert_eq!(decode(&job.encode_to_vec()).unwrap().id, id);
    }
}
