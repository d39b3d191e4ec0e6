//! The delivery worker: takes jobs from the SEND work queue, builds the MIME message,
//! delivers it, records the result, and only then acks. Failures are retried with a
//! growing NAK delay; after the last attempt the job is parked as `failed` with its reason.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::Message;
use prost::Message as _;
use sqlx::PgPool;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::proto::SendJob;
use postmesh_shared::{telemetry, Namespace};

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

struct Ctx {
    db: PgPool,
    transport: Transport,
    config: WorkerConfig,
    /// Cancelled when the worker stops: a handler waiting on a lease hands its job back.
    shutdown: CancellationToken,
}

/// Consumes the SEND stream until `shutdown`; jobs in progress finish before it returns.
pub async fn spawn(
    js: jetstream::Context,
    ns: &Namespace,
    db: PgPool,
    transport: Transport,
    config: WorkerConfig,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) -> anyhow::Result<()> {
    let stream = postmesh_shared::jetstream::send_stream(&js, ns).await?;
    let consumer = stream
        .get_or_create_consumer(
            "sender",
            pull::Config {
                durable_name: Some("sender".into()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                // Unlimited: waits on another claim's lease and database outages must not use
                // up a job; attempts are counted in `deliveries` and the job parked there.
                max_deliver: -1,
                // No more jobs held than are worked on: a buffered job cannot outlive its
                // ack deadline unattended and be delivered twice.
                max_ack_pending: config.concurrency as i64,
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
    let ctx = Arc::new(Ctx {
        db,
        transport,
        config,
        shutdown: shutdown.clone(),
    });
    let jobs = tracker.clone();
    tracker.spawn(async move {
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
                    let ctx = ctx.clone();
                    jobs.spawn(async move {
                        handle(&ctx, msg).await;
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

async fn handle(ctx: &Ctx, msg: jetstream::Message) {
    let span = tracing::info_span!("send.deliver", job_id = tracing::field::Empty);
    telemetry::link_nats(&span, msg.headers.as_ref());
    async {
        let job = match SendJob::decode(msg.payload.clone()) {
            Ok(job) => job,
            Err(e) => {
                tracing::error!(error = %e, "undecodable send job dropped from the queue");
                let _ = msg.ack_with(AckKind::Term).await;
                return;
            }
        };
        tracing::Span::current().record("job_id", job.id.as_str());
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        // A token of this claim: a redelivery to this same process is another claimant.
        let lease = Uuid::now_v7();
        let mut waited = Duration::ZERO;
        let outcome = loop {
            let work = process(ctx, &job, lease);
            match with_heartbeat(ctx, &msg, &job, lease, work).await {
                // Waiting keeps the message (in-progress acks), within bounds.
                Err(Failure::Leased(wait)) if waited < ctx.config.ack_wait * LEASE_WAITS => {
                    tracing::info!(?wait, "another worker holds the job's lease; waiting");
                    let pause = wait.min(ctx.config.ack_wait / 2);
                    tokio::select! {
                        _ = ctx.shutdown.cancelled() => break Err(Failure::Leased(wait)),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    waited += pause;
                    let _ = msg.ack_with(AckKind::Progress).await;
                }
                other => break other,
            }
        };
        match outcome {
            Ok(()) => {
                metrics::counter!("postmesh_sender_deliveries_total", "result" => "sent")
                    .increment(1);
                let _ = msg.double_ack().await;
            }
            Err(Failure::Leased(wait)) => {
                tracing::info!(?wait, "the job's lease is still held; handing the job back");
                let _ = msg.ack_with(AckKind::Nak(Some(wait))).await;
            }
            Err(Failure::Superseded) => {
                tracing::warn!("another claim took the job over; leaving the message to it");
            }
            Err(Failure::Park(reason)) => {
                metrics::counter!("postmesh_sender_deliveries_total", "result" => "failed")
                    .increment(1);
                tracing::error!(%reason, "delivery failed for good; parked");
                let _ = msg.ack_with(AckKind::Term).await;
            }
            Err(Failure::Retry(reason)) => {
                metrics::counter!("postmesh_sender_deliveries_total", "result" => "retry")
                    .increment(1);
                // Deliveries are not capped (attempts are counted in `deliveries`), so a long
                // database outage must not push the next try days away.
                let delay = (ctx.config.retry_base
                    * 2u32.saturating_pow((delivered - 1).min(16) as u32))
                .min(MAX_RETRY_DELAY);
                tracing::warn!(%reason, delivered, ?delay, "delivery failed; will retry");
                let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
            }
        }
    }
    .instrument(span)
    .await
}

/// Runs `work` while telling JetStream the job is in progress every half `ack_wait`, so a
/// slow delivery is not redelivered to another worker while this one is still on it, and
/// renewing the job's lease in the database, which covers heartbeats to NATS that fail while
/// the worker goes on. If the worker dies, both stop and the job is redelivered after
/// `ack_wait`.
async fn with_heartbeat<T>(
    ctx: &Ctx,
    msg: &jetstream::Message,
    job: &SendJob,
    lease: Uuid,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let period = (ctx.config.ack_wait / 2).max(Duration::from_millis(100));
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = beat.tick() => {
                // The lease first, each call bounded: a stuck NATS connection must not
                // hold up the lease renewal that covers for it.
                let bound = period / 2;
                match tokio::time::timeout(bound, renew_lease(ctx, job, lease)).await {
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

/// The longest pause before a job is tried again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(15 * 60);

/// Waits for another worker's lease, in units of `ack_wait`, before handing a job back.
const LEASE_WAITS: u32 = 5;

/// The database's clock in milliseconds: leases are set and compared on one clock, whatever
/// the clocks of the sender hosts say.
const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Milliseconds a lease lasts: as long as JetStream's ack deadline.
fn lease_ms(ctx: &Ctx) -> i64 {
    i64::try_from(ctx.config.ack_wait.as_millis()).unwrap_or(i64::MAX / 2)
}

async fn renew_lease(ctx: &Ctx, job: &SendJob, lease: Uuid) -> Result<(), sqlx::Error> {
    let Ok(job_id) = Uuid::parse_str(&job.id) else {
        return Ok(());
    };
    sqlx::query(&format!(
        "UPDATE deliveries SET leased_until_ms = {DB_NOW_MS} + $3
         WHERE job_id = $1 AND lease_owner = $2 AND status = 'sending'"
    ))
    .bind(job_id)
    .bind(lease)
    .bind(lease_ms(ctx))
    .execute(&ctx.db)
    .await
    .map(drop)
}

enum Failure {
    Retry(String),
    Park(String),
    /// Another worker holds the job's lease for about this long.
    Leased(Duration),
    /// Another claim took the job over while this one worked: the message is its business.
    Superseded,
}

/// How a job stands when a worker receives it.
enum Claim {
    /// This claim holds the lease and delivers; its attempt number.
    Deliver(i32),
    /// Sent or failed before: nothing to do.
    Done(String),
    /// Another claim holds a live lease for about this long.
    Held(Duration),
}

/// Records the job and takes its lease under `lease`, unless it is finished or another
/// claim holds a live lease.
async fn claim(ctx: &Ctx, job: &SendJob, job_id: Uuid, lease: Uuid) -> Result<Claim, sqlx::Error> {
    let now = now_unix();
    let taken: Option<i32> = sqlx::query_scalar(&format!(
        "INSERT INTO deliveries (job_id, kind, recipients, subject, status, created_at, updated_at,
                                 lease_owner, leased_until_ms)
         VALUES ($1, $2, $3, $4, 'sending', $5, $5, $6, {DB_NOW_MS} + $7)
         ON CONFLICT (job_id) DO UPDATE
             SET attempts = deliveries.attempts + 1, updated_at = $5,
                 lease_owner = $6, leased_until_ms = {DB_NOW_MS} + $7
             WHERE deliveries.status = 'sending' AND deliveries.leased_until_ms <= {DB_NOW_MS}
         RETURNING attempts"
    ))
    .bind(job_id)
    .bind(&job.kind)
    .bind(&job.to)
    .bind(&job.subject)
    .bind(now)
    .bind(lease)
    .bind(lease_ms(ctx))
    .fetch_optional(&ctx.db)
    .await?;
    if let Some(attempt) = taken {
        return Ok(Claim::Deliver(attempt));
    }
    let (status, left_ms): (String, i64) = sqlx::query_as(&format!(
        "SELECT status, leased_until_ms - {DB_NOW_MS} FROM deliveries WHERE job_id = $1"
    ))
    .bind(job_id)
    .fetch_one(&ctx.db)
    .await?;
    Ok(if status == "sending" {
        Claim::Held(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)))
    } else {
        Claim::Done(status)
    })
}

async fn process(ctx: &Ctx, job: &SendJob, lease: Uuid) -> Result<(), Failure> {
    let db_err = |e: sqlx::Error| Failure::Retry(format!("database: {e}"));
    let job_id =
        Uuid::parse_str(&job.id).map_err(|_| Failure::Park("job id is not a uuid".into()))?;
    let attempt = match claim(ctx, job, job_id, lease).await.map_err(db_err)? {
        Claim::Deliver(n) => i64::from(n),
        Claim::Done(status) => {
            tracing::info!(%status, "job already handled; acknowledging the redelivery");
            return Ok(());
        }
        Claim::Held(left) => {
            return Err(Failure::Leased(left.max(Duration::from_millis(100))));
        }
    };
    let outcome = match build_message(job) {
        Ok(message) => ctx.transport.deliver(&job.id, message).await,
        Err(reason) => Err(TransportError::Permanent(reason)),
    };
    let (status, error, result) = match outcome {
        Ok(()) => ("sent", None, Ok(())),
        Err(TransportError::Permanent(e)) => ("failed", Some(e.clone()), Err(Failure::Park(e))),
        Err(TransportError::Transient(e)) if attempt >= ctx.config.max_deliver => {
            ("failed", Some(e.clone()), Err(Failure::Park(e)))
        }
        Err(TransportError::Transient(e)) => ("sending", Some(e.clone()), Err(Failure::Retry(e))),
    };
    // The message is out (or given up on): record it, retrying briefly, but never turn a
    // delivered message into a retry that would send it again.
    let mut recorded = Err(sqlx::Error::PoolTimedOut);
    for pause in [0u64, 100, 500, 2000] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        recorded = sqlx::query(
            // `sent` always stands (the message went out). A failure or a retry is recorded
            // only while this claim still holds the job; otherwise it belongs to another.
            "UPDATE deliveries SET status = $2, last_error = $3, updated_at = $4,
                                   lease_owner = NULL, leased_until_ms = 0
             WHERE job_id = $1
               AND CASE WHEN $2 = 'sent' THEN status <> 'sent'
                        ELSE status = 'sending' AND lease_owner = $5 END",
        )
        .bind(job_id)
        .bind(status)
        .bind(&error)
        .bind(now_unix())
        .bind(lease)
        .execute(&ctx.db)
        .await;
        if recorded.is_ok() {
            break;
        }
    }
    match recorded {
        Ok(done) if done.rows_affected() == 0 && status != "sent" => Err(Failure::Superseded),
        Ok(_) => result,
        Err(e) => {
            tracing::error!(error = %e, %status, "could not record the delivery outcome");
            result
        }
    }
}

/// The MIME message of a job: plain text, HTML, or both as alternatives.
fn build_message(job: &SendJob) -> Result<Message, String> {
    let from: Mailbox = if job.from_name.is_empty() {
        job.from_email.parse()
    } else {
        format!("{} <{}>", job.from_name, job.from_email).parse()
    }
    .map_err(|e| format!("invalid from address: {e}"))?;
    let mut builder = Message::builder()
        .message_id(Some(format!("<{}@postmesh>", job.id)))
        .from(from)
        .subject(job.subject.as_str());
    if job.to.is_empty() {
        return Err("no recipients".into());
    }
    for to in &job.to {
        builder = builder.to(to
            .parse()
            .map_err(|e| format!("invalid recipient {to:?}: {e}"))?);
    }
    let built = match (job.text.is_empty(), job.html.is_empty()) {
        (_, true) => builder.singlepart(SinglePart::plain(job.text.clone())),
        (true, false) => builder.singlepart(SinglePart::html(job.html.clone())),
        (false, false) => builder.multipart(MultiPart::alternative_plain_html(
            job.text.clone(),
            job.html.clone(),
        )),
    };
    built.map_err(|e| format!("could not build the message: {e}"))
}
