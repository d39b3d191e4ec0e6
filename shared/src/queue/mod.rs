//! The queue worker every consuming service plugs its stages into: a durable JetStream
//! consumer with prefetch; per job, its items (messages, webhook calls) each claimed under
//! a lease on the database clock, renewed with heartbeats; the service's work; the outcome
//! recorded; claims and outcomes written in batches; the job acknowledged as its most
//! pressing item says — a retry as NAK-with-delay (or, with [`Timers::Database`], acked
//! while the service's table holds the retry), a live lease elsewhere as a wait, a
//! permanent failure parked; graceful drain on shutdown. Policy: docs/decisions.md,
//! "Delivery (sender)".
//!
//! A service implements [`Stages`] (decode, items, prepare, admit, work, and the SQL of its claims,
//! standing, renewals and outcomes) and calls [`spawn`].

mod lease;
mod stages;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, AckKind};
use futures::{FutureExt, StreamExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::batch::Batcher;
use crate::dead_letters::{panic_message, DeadLetters, PANICKED};
use crate::jetstream::Stream;
use crate::runtime::Runtime;
use crate::telemetry;

pub use lease::{lease_ms, DB_NOW_MS};
pub use stages::{
    retry_delay, Admission, ClaimRow, Failure, Outcome, RecordRow, StageError, Stages, Standing,
    Verdict,
};

/// Settings of a queue worker.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// The durable consumer's name (also the `queue` label of its metrics and spans).
    pub name: &'static str,
    /// How long JetStream waits for an ack before redelivering a job; leases last as long.
    pub ack_wait: Duration,
    /// Attempts (claims that reached the work) before an item fails for good.
    pub max_deliver: i64,
    /// Delay before the first retry; doubles with each attempt.
    pub retry_base: Duration,
    /// Items worked on at once.
    pub concurrency: usize,
    /// Items claimed and not yet finished at most: claims run ahead of the work, so a free
    /// work slot never waits for the database.
    pub claim_ahead: usize,
    /// Where an item waits for its retry.
    pub timers: Timers,
}

/// Where an item that failed for now waits until it is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timers {
    /// In JetStream: its job is handed back with a delayed NAK (and counts toward the
    /// consumer's `max_ack_pending` while it waits).
    Redelivery,
    /// In the stage's own table: the recorded retry says when the item is due, and the
    /// service queues it again then, so its job is acknowledged and holds nothing in the
    /// consumer (one failing destination cannot fill it).
    Database,
}

/// The longest pause before a job is tried again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(15 * 60);

/// Waits for another worker's lease, in units of `ack_wait`, before handing a job back.
const LEASE_WAITS: u32 = 5;

/// Pauses between attempts to record an outcome while the database does not answer.
const RECORD_RETRIES: [u64; 4] = [0, 100, 500, 2000];
/// How often an outcome is written again while the database is unavailable.
const RECORD_RETRY_EVERY: Duration = Duration::from_secs(2);

/// A running queue worker: the service's stages and the kit's equipment.
struct Worker<S: Stages> {
    stages: Arc<S>,
    config: QueueConfig,
    /// Cancelled when the worker stops: a job waiting on a lease hands itself back.
    shutdown: CancellationToken,
    claims: Batcher<ClaimRow<S::ClaimData>, Option<i32>, StageError>,
    records: Batcher<RecordRow, bool, StageError>,
    /// Items claimed and not yet finished, at most `claim_ahead`; each item gives its own
    /// back when it finishes, so a slow item holds one, not its whole job's.
    claimed: Arc<Semaphore>,
    /// Items in the work stage, at most `concurrency`.
    working: Semaphore,
    /// Where jobs that cannot be handled are kept aside.
    letters: DeadLetters,
}

/// Consumes `stream` with `stages` until the runtime shuts down; jobs in progress finish
/// first (the runtime's tracker waits for them).
pub async fn spawn<S: Stages>(
    rt: &Runtime, stream: Stream, config: QueueConfig, stages: S,
) -> anyhow::Result<()> {
    let (ns, replicas) = (&rt.common.namespace, rt.common.stream_replicas);
    let js_stream = stream.ensure(&rt.js, ns, replicas).await?;
    // Jobs this process holds at once, each in a handler (kept alive by its heartbeats
    // while it waits for its turn); it pulls another only when one is done.
    let held = 2 * config.concurrency.max(1);
    // Created, or updated to these settings (a changed ack wait takes effect on restart).
    let consumer = js_stream
        .create_consumer(pull::Config {
            durable_name: Some(config.name.into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            // Unlimited: attempts are counted in the database (docs/decisions.md).
            max_deliver: -1,
            // Jobs handed out and not yet acknowledged, every replica's: each process
            // holds at most `held` and its pull's batch.
            max_ack_pending: crate::jetstream::ack_pending_for(held + config.concurrency),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating the {} consumer: {e}", config.name))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(config.concurrency)
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("pulling from {}: {e}", stream.name(&rt.common.namespace)))?;
    let stages = Arc::new(stages);
    let lease_ms = lease_ms(config.ack_wait);
    let worker = Arc::new(Worker {
        claims: Batcher::spawn(&rt.tracker, {
            let stages = stages.clone();
            move |rows| {
                let stages = stages.clone();
                async move { stages.claim(rows, lease_ms).await }
            }
        }),
        records: Batcher::spawn(&rt.tracker, {
            let stages = stages.clone();
            move |rows| {
                let stages = stages.clone();
                async move { stages.record(rows).await }
            }
        }),
        stages,
        claimed: Arc::new(Semaphore::new(config.claim_ahead.max(1))),
        working: Semaphore::new(config.concurrency.max(1)),
        letters: rt.dead_letters(),
        config,
        shutdown: rt.shutdown.clone(),
    });
    let (jobs, shutdown) = (rt.tracker.clone(), rt.shutdown.clone());
    let holding = Arc::new(Semaphore::new(held));
    rt.tracker.spawn(async move {
        loop {
            let room = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = holding.clone().acquire_owned() => r.expect("semaphore is never closed"),
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
                        drop(room);
                    });
                }
                Some(Err(e)) => {
                    let queue = worker.config.name;
                    tracing::warn!(error = %e, queue, "queue pull failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                None => break,
            }
        }
    });
    Ok(())
}

/// The job's retry after a stage step failed; a statement the database refused is a
/// defect and logged as an error.
fn retry_after(e: &StageError) -> Outcome {
    if matches!(e, StageError::Refused(_)) {
        tracing::error!(error = %e, "a queue statement was refused");
    }
    Outcome::Retry(e.to_string(), None)
}

impl<S: Stages> Worker<S> {
    /// Handles one message of the stream, start to ack.
    async fn handle(self: Arc<Self>, msg: jetstream::Message) {
        let span = tracing::info_span!(
            "queue.job",
            queue = self.config.name,
            job = tracing::field::Empty
        );
        telemetry::link_nats(&span, [msg.headers.as_ref()]);
        async {
            let job = match self.stages.decode(&msg.payload) {
                Ok(job) => Arc::new(job),
                Err(e) => {
                    let fate = self.letters.dead(&msg, &e.to_string(), 1).await;
                    DeadLetters::settle(&msg, fate).await;
                    return;
                }
            };
            if let Some(id) = msg.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")) {
                tracing::Span::current().record("job", id.as_str());
            }
            // A panic costs this job, never the worker: it counts toward a dead letter.
            let outcome = std::panic::AssertUnwindSafe(self.run(&msg, &job))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Outcome::Panicked(panic_message(&*panic)));
            self.acknowledge(&msg, outcome).await;
        }
        .instrument(span)
        .await
    }

    /// Runs the job's items, each under its claim, all under one lease token and one
    /// heartbeat; waits (with in-progress acks) while other claims hold live leases on some
    /// of them, within bounds.
    async fn run(self: &Arc<Self>, msg: &jetstream::Message, job: &Arc<S::Job>) -> Outcome {
        // A token of this claim: a redelivery to this same process is another claimant.
        let lease = Uuid::now_v7();
        let ids: Arc<[Uuid]> = self.stages.items(job).into();
        let mut pending: Vec<usize> = (0..ids.len()).collect();
        let mut finished = Vec::with_capacity(pending.len());
        let mut waited = Duration::ZERO;
        loop {
            let work = self
                .clone()
                .process(job.clone(), ids.clone(), pending, lease);
            let outcomes = self.with_heartbeat(msg, &ids, lease, work).await;
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

    /// Runs `work` while telling JetStream the job is in progress every half `ack_wait`, so
    /// a slow job is not redelivered to another worker while this one is still on it, and
    /// renewing the leases of its items `ids` in the database, which covers heartbeats to
    /// NATS that fail while the worker goes on. If the worker dies, both stop and the job is
    /// redelivered after `ack_wait`.
    async fn with_heartbeat<T>(
        &self, msg: &jetstream::Message, ids: &[Uuid], lease: Uuid, work: impl Future<Output = T>,
    ) -> T {
        let renew = || {
            self.stages
                .renew(ids, lease, lease_ms(self.config.ack_wait))
        };
        lease::with_heartbeat(msg, self.config.ack_wait, renew, work).await
    }

    /// Runs the items at `indices` of the job, each on its own task; answers each one's
    /// outcome.
    async fn process(
        self: Arc<Self>, job: Arc<S::Job>, ids: Arc<[Uuid]>, indices: Vec<usize>, lease: Uuid,
    ) -> Vec<(usize, Outcome)> {
        let stopped = || indices.iter().map(|&i| (i, Outcome::Stopped)).collect();
        let count = u32::try_from(indices.len().min(self.config.claim_ahead.max(1))).unwrap_or(1);
        let mut claimed = tokio::select! {
            _ = self.shutdown.cancelled() => return stopped(),
            p = self.claimed.clone().acquire_many_owned(count) => p.expect("semaphore is never closed"),
        };
        let shared = match self.stages.prepare(&job).await {
            Ok(shared) => Arc::new(shared),
            Err(e) => {
                let outcome = retry_after(&e);
                return indices.iter().map(|&i| (i, outcome.clone())).collect();
            }
        };
        let mut running = tokio::task::JoinSet::new();
        for &i in &indices {
            let (worker, job, shared, id) = (self.clone(), job.clone(), shared.clone(), ids[i]);
            // An item past `claim_ahead` (a job larger than that) runs without one.
            let permit = claimed.split(1);
            let work = async move {
                let outcome = worker.item(&job, &shared, i, id, lease).await;
                drop(permit);
                (i, outcome)
            };
            // Each item's logs stay in the job's span (and its trace).
            running.spawn(work.instrument(tracing::Span::current()));
        }
        let mut outcomes = Vec::with_capacity(indices.len());
        drop(claimed);
        let mut panicked = None;
        while let Some(done) = running.join_next().await {
            match done {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) if e.is_panic() => panicked = Some(panic_message(&*e.into_panic())),
                Err(e) => tracing::error!(error = %e, "an item's task failed"),
            }
        }
        // A task that panicked outside its work counts toward the job's dead letter.
        let reason = panicked.unwrap_or_else(|| "an item's task was cancelled".to_owned());
        for &i in &indices {
            if !outcomes.iter().any(|(j, _)| *j == i) {
                outcomes.push((i, Outcome::Panicked(reason.clone())));
            }
        }
        outcomes
    }

    /// claim → work → record, for the job's item at `index`.
    async fn item(
        &self, job: &S::Job, shared: &S::Shared, index: usize, id: Uuid, lease: Uuid,
    ) -> Outcome {
        match self.stages.admit(job, shared, index).await {
            Admission::Now => {}
            Admission::Elsewhere => return Outcome::Done,
            Admission::Later(reason) => return Outcome::NotNow(reason),
        }
        let row = ClaimRow {
            item: id,
            lease,
            data: self.stages.claim_data(job, shared, index),
        };
        let attempt = match self.claims.call(row).await {
            Ok(Some(attempt)) => i64::from(attempt),
            Ok(None) => match self.stages.standing(id).await {
                Ok(Standing::Finished) => {
                    tracing::debug!(%id, "item already handled");
                    return Outcome::Done;
                }
                Ok(Standing::Held(left)) => {
                    return Outcome::Leased(left.max(Duration::from_millis(100)))
                }
                Err(e) => return retry_after(&e),
            },
            Err(e) => return retry_after(&e),
        };
        let tried_at;
        let result = {
            let _slot = self
                .working
                .acquire()
                .await
                .expect("semaphore is never closed");
            tried_at = crate::db::now_unix();
            // A panicking piece of work is a failure of this try, retried and counted.
            std::panic::AssertUnwindSafe(self.stages.work(job, shared, index))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(Failure::Transient(panic_message(&*panic))))
        };
        let backoff = self
            .stages
            .retry_delay(attempt)
            .unwrap_or_else(|| retry_delay(self.config.retry_base, attempt));
        let verdict = Verdict::of(result, attempt >= self.config.max_deliver, backoff);
        let outcome = self.record(id, lease, verdict, tried_at).await;
        let result = match &outcome {
            Outcome::Done => "done",
            Outcome::Park(reason) => {
                tracing::error!(%id, %reason, "failed for good");
                "failed"
            }
            Outcome::Retry(reason, _) => {
                tracing::warn!(%id, %reason, attempt, "failed; will retry");
                "retry"
            }
            Outcome::Leased(_) | Outcome::Superseded | Outcome::Stopped | Outcome::NotNow(_) => {
                "elsewhere"
            }
            Outcome::Panicked(_) => "panicked",
        };
        let labels = [("queue", self.config.name), ("result", result)];
        metrics::counter!("postmesh_queue_items_total", &labels).increment(1);
        outcome
    }

    /// Records `verdict` for the item and releases its lease. The work is done (or given up
    /// on), so a database error never turns done work into a retry that would do it again:
    /// a refused write is retried briefly, an unavailable database (a failover) every
    /// [`RECORD_RETRY_EVERY`] until it answers or the service stops, the job's heartbeat
    /// keeping its lease and message meanwhile.
    async fn record(&self, item: Uuid, lease: Uuid, verdict: Verdict, tried_at: i64) -> Outcome {
        let outcome = match &verdict {
            Verdict::Done(_) => Outcome::Done,
            Verdict::Failed(e) => Outcome::Park(e.clone()),
            Verdict::Retry(e, after) => Outcome::Retry(e.clone(), Some(*after)),
        };
        let done = matches!(verdict, Verdict::Done(_));
        let row = RecordRow {
            item,
            lease,
            verdict,
            tried_at,
        };
        let mut recorded = Err(StageError::Unavailable(String::new()));
        let pauses = RECORD_RETRIES.map(Duration::from_millis);
        for (tries, pause) in pauses
            .into_iter()
            .chain(std::iter::repeat(RECORD_RETRY_EVERY))
            .enumerate()
        {
            let given_up = tries >= RECORD_RETRIES.len()
                && !matches!(recorded, Err(StageError::Unavailable(_)));
            if given_up || self.shutdown.is_cancelled() {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = self.shutdown.cancelled() => break,
            }
            recorded = self.records.call(row.clone()).await;
            if recorded.is_ok() {
                break;
            }
        }
        match recorded {
            Ok(false) if !done => Outcome::Superseded,
            Ok(_) => outcome,
            Err(e) => {
                tracing::error!(error = %e, ?row.verdict, "could not record the outcome");
                outcome
            }
        }
    }

    /// Acknowledges the job as `outcome` says.
    async fn acknowledge(&self, msg: &jetstream::Message, outcome: Outcome) {
        let _ = match outcome {
            Outcome::Panicked(reason) => {
                let fate = self
                    .letters
                    .failed(msg, &reason, self.config.retry_base)
                    .await;
                DeadLetters::settle(msg, fate).await;
                Ok(())
            }
            // Work that panicked on every try: kept aside, with the payload that made it.
            Outcome::Park(reason) if reason.starts_with(PANICKED) => {
                let tries = i32::try_from(self.config.max_deliver).unwrap_or(i32::MAX);
                let fate = self.letters.dead(msg, &reason, tries).await;
                DeadLetters::settle(msg, fate).await;
                Ok(())
            }
            // Not waited for: a lost ack redelivers a job whose items are recorded as
            // finished, and their claims acknowledge it without doing them again.
            Outcome::Done => msg.ack().await,
            Outcome::Leased(wait) => {
                tracing::info!(?wait, "an item's lease is still held; handing the job back");
                msg.ack_with(AckKind::Nak(Some(wait))).await
            }
            Outcome::Stopped => msg.ack_with(AckKind::Nak(None)).await,
            Outcome::Superseded => {
                tracing::warn!("another claim took an item over; leaving the job to it");
                Ok(())
            }
            Outcome::Park(reason) => {
                tracing::error!(%reason, "every item of the job failed for good; parked");
                msg.ack_with(AckKind::Term).await
            }
            Outcome::Retry(reason, Some(after)) if self.config.timers == Timers::Database => {
                tracing::warn!(%reason, ?after, "an item will be tried again from the database");
                msg.ack().await
            }
            Outcome::Retry(reason, after) => {
                let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
                let delay = after.unwrap_or_else(|| retry_delay(self.config.retry_base, delivered));
                tracing::warn!(%reason, delivered, ?delay, "job will be retried");
                msg.ack_with(AckKind::Nak(Some(delay))).await
            }
            Outcome::NotNow(reason) => {
                let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
                let delay = retry_delay(self.config.retry_base, delivered);
                tracing::debug!(%reason, delivered, ?delay, "job handed back for later");
                msg.ack_with(AckKind::Nak(Some(delay))).await
            }
        };
    }
}

#[cfg(test)]
mod tests;
