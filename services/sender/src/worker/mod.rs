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
use postmesh_shared::{telemetry, DeliveryId, JobId, Runtime, TaskId, WorkspaceId};

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
    /// The SEND message's id.
    pub id: JobId,
    pub send: SendJob,
    pub workspace: Option<WorkspaceId>,
    /// For recipients of a task: the task.
    pub task: Option<TaskId>,
    /// The messages the job delivers, each on its own.
    pub deliveries: Vec<Delivery>,
}

/// One message of a job: its own `deliveries` row, lease, Message-ID and outcome.
pub(crate) struct Delivery {
    pub id: DeliveryId,
    pub to: Vec<String>,
}

/// What a job's messages share: the subject (recorded with each claim) and, for a task's
/// job, the task (`None` when it is gone: the messages fail).
struct Letter {
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

/// How handling a message (one delivery, or a whole job) ended; decides how the job is
/// acknowledged.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Delivered now, or before (a redelivery of a finished job).
    Done,
    /// Another claim holds a live lease for about this long.
    Leased(Duration),
    /// Another claim took the message over while this one worked: the job is its business.
    Superseded,
    /// A transient failure: try again later.
    Retry(String),
    /// Failed for good (recorded as `failed`).
    Park(String),
    /// Not started: the worker is stopping.
    Stopped,
}

impl Outcome {
    /// How pressing an outcome is for the job it belongs to.
    fn rank(&self) -> u8 {
        match self {
            Self::Done => 0,
            Self::Park(_) => 1,
            Self::Superseded => 2,
            Self::Stopped => 3,
            Self::Leased(_) => 4,
            Self::Retry(_) => 5,
        }
    }

    /// The outcome of a job from those of its messages: any retry retries the job (its
    /// finished messages are skipped then), a held or handed-back one hands it back, one
    /// taken over leaves it to the other claim; otherwise every message is finished, and
    /// the job is parked only when each of them failed for good.
    fn of_job(outcomes: Vec<Outcome>) -> Outcome {
        let all_parked = outcomes.iter().all(|o| matches!(o, Self::Park(_)));
        let job = outcomes
            .into_iter()
            .fold(Self::Done, |job, outcome| match (job, outcome) {
                (Self::Leased(a), Self::Leased(b)) => Self::Leased(a.max(b)),
                (job, outcome) if outcome.rank() > job.rank() => outcome,
                (job, _) => job,
            });
        match job {
            Self::Park(_) if !all_parked => Self::Done,
            job => job,
        }
    }
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
    /// Tasks recently delivered, so a task's jobs do not each read it again.
    pub tasks: cache::TaskCache,
    /// Claims of messages, written in batches.
    claims: batch::Batcher<lease::ClaimRow, Option<i32>>,
    /// Outcomes of messages, written in batches.
    records: batch::Batcher<record::RecordRow, bool>,
    /// Messages claimed and not yet finished, at most [`Worker::claim_ahead`].
    claimed: Semaphore,
    /// Messages in the transport's hands, at most `concurrency`.
    delivering: Semaphore,
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
                // Jobs handed out and not yet acknowledged. Each is in a handler at once,
                // kept alive by its heartbeats while it waits for its turn.
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
    let ack_wait = config.ack_wait;
    let worker = Arc::new(Worker {
        db: rt.db.clone(),
        transport,
        claimed: Semaphore::new(claim_ahead(&config)),
        delivering: Semaphore::new(config.concurrency.max(1)),
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
            let msg = tokio::select! {
                _ = shutdown.cancelled() => break,
                m = messages.next() => m,
            };
            match msg {
                Some(Ok(msg)) => {
                    let worker = worker.clone();
                    jobs.spawn(async move { worker.handle(msg).await });
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

/// Messages claimed ahead of delivery: the next job's claims are written while the current
/// one's messages go out, so a free delivery slot never waits for the database.
fn claim_ahead(config: &WorkerConfig) -> usize {
    2 * config.concurrency.max(tasks::RECIPIENTS_PER_JOB)
}

/// The pause before retry number `delivered`: doubling from `base`, at most 15 minutes.
/// Deliveries are not capped, so a long outage must not push the next try days away.
pub fn retry_delay(base: Duration, delivered: i64) -> Duration {
    let doublings = u32::try_from((delivered - 1).clamp(0, 16)).unwrap_or(16);
    (base * 2u32.pow(doublings)).min(MAX_RETRY_DELAY)
}

impl Worker {
    /// Handles one message of the SEND stream, start to ack.
    async fn handle(self: Arc<Self>, msg: jetstream::Message) {
        let span = tracing::info_span!("send.deliver", job_id = tracing::field::Empty);
        telemetry::link_nats(&span, msg.headers.as_ref());
        async {
            let job = match decode(&msg.payload) {
                Ok(job) => Arc::new(job),
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

    /// Runs the job's messages, each under its claim, all under one lease token and one
    /// heartbeat; waits (with in-progress acks) while other claims hold live leases on some
    /// of them, within bounds.
    async fn run(self: &Arc<Self>, msg: &jetstream::Message, job: &Arc<Job>) -> Outcome {
        // A token of this claim: a redelivery to this same process is another claimant.
        let lease = Uuid::now_v7();
        let ids: Vec<DeliveryId> = job.deliveries.iter().map(|d| d.id).collect();
        let mut pending: Vec<usize> = (0..job.deliveries.len()).collect();
        let mut finished = Vec::with_capacity(pending.len());
        let mut waited = Duration::ZERO;
        loop {
            let work = self.clone().process(job.clone(), pending, lease);
            let outcomes = lease::with_heartbeat(self, msg, &ids, lease, work).await;
            let (held, rest): (Vec<_>, Vec<_>) = outcomes
                .into_iter()
                .partition(|(_, o)| matches!(o, Outcome::Leased(_)));
            finished.extend(rest.into_iter().map(|(_, o)| o));
            let wait = held
                .iter()
                .map(|(_, o)| match o {
                    Outcome::Leased(wait) => *wait,
                    _ => Duration::ZERO,
                })
                .max();
            let Some(wait) = wait else {
                return Outcome::of_job(finished);
            };
            if waited >= self.config.ack_wait * LEASE_WAITS {
                finished.push(Outcome::Leased(wait));
                return Outcome::of_job(finished);
            }
            tracing::info!(
                ?wait,
                held = held.len(),
                "other claims hold leases; waiting"
            );
            let pause = wait.min(self.config.ack_wait / 2);
            tokio::select! {
                _ = self.shutdown.cancelled() => {
                    finished.push(Outcome::Leased(wait));
                    return Outcome::of_job(finished);
                }
                _ = tokio::time::sleep(pause) => {}
            }
            waited += pause;
            let _ = msg.ack_with(AckKind::Progress).await;
            pending = held.into_iter().map(|(i, _)| i).collect();
        }
    }

    /// The subject and task the job's messages share.
    async fn letter(&self, job: &Job) -> Result<Letter, sqlx::Error> {
        let Some(task_id) = job.task else {
            return Ok(Letter {
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
            subject: task
                .as_ref()
                .map(|t| t.message.subject.clone())
                .unwrap_or_default(),
            task,
        })
    }

    /// The MIME message of `delivery`; the error says why it can never be built.
    fn build(
        &self,
        job: &Job,
        delivery: &Delivery,
        letter: &Letter,
    ) -> Result<lettre::Message, String> {
        let message_id = format!("<{}@{}>", delivery.id, self.message_id_domain);
        let draft = match (&job.task, &letter.task) {
            (None, _) => {
                let s = &job.send;
                message::Draft {
                    message_id,
                    from_email: &s.from_email,
                    from_name: Some(s.from_name.as_str()).filter(|n| !n.is_empty()),
                    to: &delivery.to,
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
            (Some(_), Some(task)) => message::Draft::of_task(task, &delivery.to, message_id),
            (Some(task), None) => return Err(format!("task {task} no longer exists")),
        };
        message::build(&draft)
    }

    /// Runs the messages at `indices` of the job, each on its own task; answers each one's
    /// outcome.
    async fn process(
        self: Arc<Self>,
        job: Arc<Job>,
        indices: Vec<usize>,
        lease: Uuid,
    ) -> Vec<(usize, Outcome)> {
        let stopped = || indices.iter().map(|&i| (i, Outcome::Stopped)).collect();
        let count = u32::try_from(indices.len().min(claim_ahead(&self.config))).unwrap_or(1);
        let _claimed = tokio::select! {
            _ = self.shutdown.cancelled() => return stopped(),
            p = self.claimed.acquire_many(count) => p.expect("semaphore is never closed"),
        };
        let letter = match self.letter(&job).await {
            Ok(letter) => Arc::new(letter),
            Err(e) => {
                let reason = format!("database: {e}");
                return indices
                    .iter()
                    .map(|&i| (i, Outcome::Retry(reason.clone())))
                    .collect();
            }
        };
        let mut running = tokio::task::JoinSet::new();
        for &i in &indices {
            let (worker, job, letter) = (self.clone(), job.clone(), letter.clone());
            let work = async move { (i, worker.deliver(&job, i, &letter, lease).await) };
            // Each message's logs stay in the job's span (and its trace).
            running.spawn(work.instrument(tracing::Span::current()));
        }
        let mut outcomes = Vec::with_capacity(indices.len());
        while let Some(done) = running.join_next().await {
            match done {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => tracing::error!(error = %e, "a delivery task failed"),
            }
        }
        // A task that panicked leaves its message to be tried again.
        for &i in &indices {
            if !outcomes.iter().any(|(j, _)| *j == i) {
                outcomes.push((i, Outcome::Retry("delivery task failed".into())));
            }
        }
        outcomes
    }

    /// claim → build → deliver → record, for the job's message at `index`.
    async fn deliver(&self, job: &Job, index: usize, letter: &Letter, lease: Uuid) -> Outcome {
        let delivery = &job.deliveries[index];
        let claim = lease::claim(self, job, delivery, &letter.subject, lease).await;
        let attempt = match claim {
            Ok(lease::Claim::Deliver(attempt)) => i64::from(attempt),
            Ok(lease::Claim::Finished(status)) => {
                tracing::debug!(id = %delivery.id, ?status, "message already handled");
                return Outcome::Done;
            }
            Ok(lease::Claim::Held(left)) => {
                return Outcome::Leased(left.max(Duration::from_millis(100)))
            }
            Err(e) => return Outcome::Retry(format!("database: {e}")),
        };
        let delivered = {
            let _slot = self
                .delivering
                .acquire()
                .await
                .expect("semaphore is never closed");
            match self.build(job, delivery, letter) {
                Ok(message) => self.transport.deliver(delivery.id, message).await,
                Err(reason) => Err(TransportError::Permanent(reason)),
            }
        };
        let verdict = record::Verdict::of(delivered, attempt >= self.config.max_deliver);
        let outcome = record::record(self, delivery.id, lease, verdict).await;
        let result = match &outcome {
            Outcome::Done => "sent",
            Outcome::Park(reason) => {
                tracing::error!(id = %delivery.id, %reason, "delivery failed for good");
                "failed"
            }
            Outcome::Retry(reason) => {
                tracing::warn!(id = %delivery.id, %reason, attempt, "delivery failed; will retry");
                "retry"
            }
            Outcome::Leased(_) | Outcome::Superseded | Outcome::Stopped => "elsewhere",
        };
        metrics::counter!("postmesh_sender_deliveries_total", "result" => result).increment(1);
        outcome
    }

    /// Acknowledges the job as `outcome` says.
    async fn acknowledge(&self, msg: &jetstream::Message, outcome: Outcome) {
        let _ = match outcome {
            // Not waited for: a lost ack redelivers a job whose messages are recorded as
            // finished, and their claims acknowledge it without sending.
            Outcome::Done => msg.ack().await,
            Outcome::Leased(wait) => {
                tracing::info!(
                    ?wait,
                    "a message's lease is still held; handing the job back"
                );
                msg.ack_with(AckKind::Nak(Some(wait))).await
            }
            Outcome::Stopped => msg.ack_with(AckKind::Nak(None)).await,
            Outcome::Superseded => {
                tracing::warn!("another claim took a message over; leaving the job to it");
                Ok(())
            }
            Outcome::Park(reason) => {
                tracing::error!(%reason, "every message of the job failed for good; parked");
                msg.ack_with(AckKind::Term).await
            }
            Outcome::Retry(reason) => {
                let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
                let delay = retry_delay(self.config.retry_base, delivered);
                tracing::warn!(%reason, delivered, ?delay, "job will be retried");
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
    let deliveries = if send.recipient_ids.is_empty() {
        // A code email is one message under the job's own id.
        vec![Delivery {
            id: DeliveryId::from(id.as_uuid()),
            to: send.to.clone(),
        }]
    } else if send.recipient_ids.len() != send.to.len() {
        return Err("recipient ids and addresses differ in number".into());
    } else {
        send.recipient_ids
            .iter()
            .zip(&send.to)
            .map(|(rid, to)| {
                Ok(Delivery {
                    id: DeliveryId::parse(rid).ok_or("a recipient id is not a uuid")?,
                    to: vec![to.clone()],
                })
            })
            .collect::<Result<_, String>>()?
    };
    Ok(Job {
        id,
        workspace: WorkspaceId::parse(&send.workspace_id),
        task,
        send,
        deliveries,
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
        let job = decode(&job.encode_to_vec()).unwrap();
        assert_eq!(job.id, id);
        assert_eq!(job.deliveries.len(), 1);
        assert_eq!(job.deliveries[0].id.as_uuid(), id.as_uuid());
    }

    #[test]
    fn a_slice_of_recipients_is_one_message_each() {
        let (a, b) = (DeliveryId::new(), DeliveryId::new());
        let slice = SendJob {
            id: JobId::new().to_string(),
            to: vec!["a@example.com".into(), "b@example.com".into()],
            recipient_ids: vec![a.to_string(), b.to_string()],
            ..Default::default()
        };
        let job = decode(&slice.encode_to_vec()).unwrap();
        let got: Vec<_> = job
            .deliveries
            .iter()
            .map(|d| (d.id, d.to.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (a, vec!["a@example.com".to_owned()]),
                (b, vec!["b@example.com".to_owned()])
            ]
        );
        let short = SendJob {
            recipient_ids: vec![a.to_string()],
            ..slice.clone()
        };
        assert!(decode(&short.encode_to_vec()).is_err());
        let bad = SendJob {
            recipient_ids: vec![a.to_string(), "nope".into()],
            ..slice
        };
        assert!(decode(&bad.encode_to_vec()).is_err());
    }

    #[test]
    fn a_job_ends_as_its_most_pressing_message() {
        use Outcome::*;
        let ms = Duration::from_millis;
        let retry = || Retry("x".into());
        let park = || Park("x".into());
        assert_eq!(Outcome::of_job(vec![Done, Done]), Done);
        assert_eq!(Outcome::of_job(vec![Done, park()]), Done);
        assert_eq!(Outcome::of_job(vec![park(), park()]), park());
        assert_eq!(Outcome::of_job(vec![Done, retry(), Leased(ms(5))]), retry());
        assert_eq!(
            Outcome::of_job(vec![Leased(ms(1)), Done, Leased(ms(3))]),
            Leased(ms(3))
        );
        assert_eq!(Outcome::of_job(vec![Superseded, Done, park()]), Superseded);
        assert_eq!(Outcome::of_job(vec![Done, Stopped]), Stopped);
        assert_eq!(Outcome::of_job(vec![]), Done);
    }
}
