//! Direct delivery: the fan-outs' first try of each new attempt, made before the attempt is
//! written. The source's message (INBOUND, DELIVERY) is acknowledged only once the attempts
//! are written, so until then it is what a crash leaves behind: the fan-out runs again and
//! tries what it finds unwritten, under the same `webhook-id` (an attempt's id is derived
//! from its subject and target). Each attempt is written once, with the outcome of its
//! first try; one without an answer after [`HAND_OFF_AFTER`] is written leased and records
//! the answer when it comes, as the worker's claims do; one whose target has no slot to
//! spare is written pending and queued on WEBHOOK, where every retry goes. So a delivery
//! costs one row write, where the worker's path costs an insert, a job, a read, a claim and
//! an outcome (docs/decisions.md, "Inbox webhooks").

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::queue::{RecordRow, Verdict, DB_NOW_MS};
use postmesh_shared::Namespace;

use crate::attempt::{target_of, AttemptRow, Status};
use crate::delivery::worker::{
    health, outcome, queue, ready, record, Answer, Content, Delivery, Ready, Slots, Written,
};
use crate::{AppState, DeliveryConfig};

/// How long a first try waits for its answer before its attempt is written without one.
const HAND_OFF_AFTER: Duration = Duration::from_secs(1);
/// How long a fan-out's first tries may go on starting: what a target has not started by
/// then is left to the worker, so a batch is written (and its source's message acked)
/// within about this plus [`HAND_OFF_AFTER`] however slow its targets.
const TRY_FOR: Duration = Duration::from_secs(2);
/// An attempt left queued is due for the scheduler this long after it is written, unless
/// its job came first (the column's default, migration 0007).
const LOST_AFTER_SECS: i64 = 300;
/// Pauses between tries to record a late answer while the database does not take it.
const RECORD_RETRIES: [u64; 4] = [0, 100, 500, 2000];

/// The direct tries of the fan-outs: what they need.
pub struct Direct {
    pub state: AppState,
    pub js: jetstream::Context,
    pub ns: Namespace,
    pub(crate) slots: Arc<Slots>,
    pub config: DeliveryConfig,
    pub tracker: TaskTracker,
}

/// The id of the attempt of `subject` (a received message or an event) for `target`: the
/// same in every run of the fan-out, so a delivery tried again after a crash keeps its
/// `webhook-id`.
pub fn attempt_id(subject: Uuid, target: Uuid) -> Uuid {
    let digest = Sha256::new()
        .chain_update(b"postmesh attempt\0")
        .chain_update(subject.as_bytes())
        .chain_update(target.as_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Uuid::new_v8(bytes)
}

/// A new attempt and how its first try went.
pub(crate) struct Tried {
    id: Uuid,
    workspace: Uuid,
    endpoint: Option<Uuid>,
    webhook: Option<Uuid>,
    subject: Uuid,
    how: How,
}

/// How a first try went.
enum How {
    /// Answered: what the answer means.
    Answered(Verdict),
    /// Posted, the answer not in yet: the attempt records it when it comes.
    Waiting(JoinHandle<Answer>),
    /// Not tried (no slot to spare, or it cannot be made): the worker takes it.
    Queued,
}

impl Direct {
    /// Tries each new attempt in `rows` (their targets read with them) once, carrying
    /// `content(row)`, unless this is not the `first` run of their fan-out (all are then
    /// left to the worker): each target's tries at most its slots at a time, the rest of a
    /// target's queued once it frees none (it is stalled or slow) or [`TRY_FOR`] has passed.
    pub(crate) async fn try_all(
        &self, rows: Vec<AttemptRow>, first: bool, content: impl Fn(&AttemptRow) -> Option<Content>,
    ) -> Vec<Tried> {
        let mut readied: HashMap<Uuid, Option<Arc<Ready>>> = HashMap::new();
        let mut lanes: HashMap<Uuid, Vec<(usize, Delivery)>> = HashMap::new();
        let mut tried = Vec::with_capacity(rows.len());
        for (index, row) in rows.into_iter().enumerate() {
            let target = target_of(&row);
            let ready = readied
                .entry(target)
                .or_insert_with(|| {
                    ready(&row, &self.state.secrets, self.config.max_body_bytes)
                        .map(Arc::new)
                        .ok()
                })
                .clone();
            if let (true, Some(ready), Some(content)) = (first, ready, content(&row)) {
                let delivery = Delivery {
                    ready,
                    content,
                    target,
                    attempt: row.id,
                };
                lanes.entry(target).or_default().push((index, delivery));
            }
            tried.push(Tried {
                id: row.id,
                workspace: row.workspace_id,
                endpoint: row.endpoint_id,
                webhook: row.webhook_id,
                subject: row.message_id,
                how: How::Queued,
            });
        }
        let until = Instant::now() + TRY_FOR;
        let lanes = lanes.into_values().map(|lane| self.lane(lane, until));
        for (index, how) in futures::future::join_all(lanes).await.into_iter().flatten() {
            tried[index].how = how;
        }
        tried
    }

    /// One target's tries, in order, as many at once as it has slots, started until `until`.
    async fn lane(&self, lane: Vec<(usize, Delivery)>, until: Instant) -> Vec<(usize, How)> {
        let stalled = AtomicBool::new(false);
        futures::stream::iter(lane)
            .map(|(index, delivery)| {
                let stalled = &stalled;
                async move { (index, self.try_one(&delivery, stalled, until).await) }
            })
            .buffer_unordered(self.slots.per_target())
            .collect()
            .await
    }

    /// Posts `delivery` once a slot of its target is free (before `until`), and waits
    /// [`HAND_OFF_AFTER`] for the answer.
    async fn try_one(&self, delivery: &Delivery, stalled: &AtomicBool, until: Instant) -> How {
        if stalled.load(Ordering::Relaxed) || Instant::now() >= until {
            return How::Queued;
        }
        let Ok(slot) = tokio::time::timeout_at(until, self.slots.take(delivery.target)).await
        else {
            return How::Queued;
        };
        let Some(slot) = slot else {
            stalled.store(true, Ordering::Relaxed);
            return How::Queued;
        };
        // A body that cannot be made is the worker's to fail.
        let Ok(body) = delivery.body().await else {
            return How::Queued;
        };
        let post = delivery.post(&self.state.sender, body);
        let mut post = Box::pin(async move {
            let answer = post.await;
            drop(slot);
            answer
        });
        tokio::select! {
            answer = &mut post => How::Answered(self.verdict(answer)),
            () = tokio::time::sleep(HAND_OFF_AFTER) => How::Waiting(self.tracker.spawn(post)),
        }
    }

    /// What a first try's answer means.
    fn verdict(&self, answer: Answer) -> Verdict {
        first_verdict(&self.config.retry_schedule, answer)
    }

    /// Writes `tried` (attempts of `origin`) in `tx` with the health their answers show of
    /// their targets, those still waiting leased by `lease`; answers the ids written (an
    /// attempt another run wrote first is left as that run wrote it).
    pub(crate) async fn write(
        &self, tx: &mut PgConnection, origin: &str, tried: &[Tried], lease: Uuid,
    ) -> Result<HashSet<Uuid>, sqlx::Error> {
        let now = now_unix();
        // A waiting attempt's lease outlasts its POST; should its answer never be recorded
        // (the process died), the scheduler takes it once the lease is over.
        let lease_for = self.config.timeout + 2 * HAND_OFF_AFTER;
        let lease_ms = i64::try_from(lease_for.as_millis()).unwrap_or(i64::MAX / 2);
        let lease_over = now + i64::try_from(lease_for.as_secs()).unwrap_or(i64::MAX / 4) + 1;
        let n = tried.len();
        let (mut ids, mut workspaces, mut endpoints, mut webhooks, mut subjects) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut statuses, mut counts, mut codes, mut errors, mut next_at, mut requeue_at) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut leased, mut answered) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for t in tried {
            ids.push(t.id);
            workspaces.push(t.workspace);
            endpoints.push(t.endpoint);
            webhooks.push(t.webhook);
            subjects.push(t.subject);
            let written = match &t.how {
                How::Answered(verdict) => Written::of(verdict, now),
                // Due now, as the worker shows an attempt it holds or is about to take.
                How::Waiting(_) | How::Queued => Written {
                    status: Status::Pending,
                    code: None,
                    error: None,
                    next_at: Some(now),
                },
            };
            statuses.push(written.status);
            counts.push(i32::from(!matches!(t.how, How::Queued)));
            codes.push(written.code);
            errors.push(written.error);
            requeue_at.push(match &t.how {
                How::Answered(_) => written.next_at.unwrap_or(now + LOST_AFTER_SECS),
                How::Waiting(_) => lease_over,
                How::Queued => now + LOST_AFTER_SECS,
            });
            next_at.push(written.next_at);
            leased.push(matches!(t.how, How::Waiting(_)));
            answered.push(matches!(t.how, How::Answered(_)));
        }
        let made: Vec<Uuid> = sqlx::query_scalar(&format!(
            "WITH u AS (
                 SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::uuid[],
                                      $6::text[], $7::int[], $8::int[], $9::text[],
                                      $10::bigint[], $11::bigint[], $12::bool[], $13::bool[])
                     AS u(id, workspace_id, endpoint_id, webhook_id, message_id, status,
                          attempt_count, code, error, next_at, requeue_at, leased, answered)
             ), made AS (
                 INSERT INTO attempts (id, workspace_id, endpoint_id, webhook_id, message_id,
                     origin, status, attempt_count, last_status_code, last_error,
                     next_attempt_at, requeue_at, created_at, updated_at, lease_owner,
                     leased_until_ms)
                 SELECT id, workspace_id, endpoint_id, webhook_id, message_id, $14, status,
                     attempt_count, code, error, next_at, requeue_at, $15, $15,
                     CASE WHEN leased THEN $16::uuid END,
                     CASE WHEN leased THEN {DB_NOW_MS} + $17 ELSE 0 END
                 FROM u
                 ON CONFLICT DO NOTHING
                 RETURNING id
             ), done AS (
                 SELECT u.endpoint_id, u.webhook_id, u.workspace_id, u.status, u.code
                 FROM u JOIN made USING (id) WHERE u.answered
             ){HEALTH}
             SELECT id FROM made",
            HEALTH = health(15, 18)
        ))
        .bind(&ids)
        .bind(&workspaces)
        .bind(&endpoints)
        .bind(&webhooks)
        .bind(&subjects)
        .bind(&statuses)
        .bind(&counts)
        .bind(&codes)
        .bind(&errors)
        .bind(&next_at)
        .bind(&requeue_at)
        .bind(&leased)
        .bind(&answered)
        .bind(origin)
        .bind(now)
        .bind(lease)
        .bind(lease_ms)
        .bind(i64::try_from(self.config.disable_after.as_secs()).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
        Ok(made.into_iter().collect())
    }

    /// After the transaction that wrote `tried` under `lease` committed (`written`: the ids
    /// it wrote): queues the attempts left to the worker, `pending` (earlier runs' unfinished
    /// attempts, with their subjects) with them, and lets each attempt still waiting record
    /// its answer when it comes. Had the transaction failed, its error comes back: the
    /// source's message comes again and tries anew, and the answers still to come are dropped.
    pub(crate) async fn finish(
        &self, tried: Vec<Tried>, written: Result<HashSet<Uuid>, sqlx::Error>, lease: Uuid,
        mut pending: Vec<(Uuid, Uuid)>,
    ) -> Result<(), String> {
        let made = written.map_err(|e| e.to_string())?;
        for t in tried.into_iter().filter(|t| made.contains(&t.id)) {
            match t.how {
                How::Queued => pending.push((t.id, t.subject)),
                How::Waiting(answer) => self.record_late(t.id, lease, answer),
                How::Answered(_) => {}
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        queue_jobs(&self.js, &self.ns, pending).await
    }

    /// Records attempt `id`'s answer under `lease` when it comes.
    fn record_late(&self, id: Uuid, lease: Uuid, answer: JoinHandle<Answer>) {
        let (db, schedule) = (self.state.db.clone(), self.config.retry_schedule.clone());
        let disable_after = self.config.disable_after;
        let tried_at = postmesh_shared::db::now_unix();
        self.tracker.spawn(async move {
            // A POST that panicked leaves the attempt to its lease's end.
            let Ok(answer) = answer.await else { return };
            let row = RecordRow {
                item: id,
                lease,
                verdict: first_verdict(&schedule, answer),
                tried_at,
            };
            for pause in RECORD_RETRIES {
                tokio::time::sleep(Duration::from_millis(pause)).await;
                match record(&db, vec![row.clone()], disable_after).await {
                    Ok(_) => return,
                    Err(e) => tracing::warn!(error = %e, attempt = %id, "recording a late answer"),
                }
            }
            tracing::error!(
                attempt = %id,
                "a late answer was not recorded: the attempt is tried again once its lease ends"
            );
        });
    }
}

/// What the answer to an attempt's first try means under the retry `schedule`, as the
/// worker judges its first attempt.
fn first_verdict(schedule: &[Duration], answer: Answer) -> Verdict {
    let backoff = schedule.first().copied().unwrap_or_default();
    Verdict::of(outcome(answer), schedule.is_empty(), backoff)
}

/// Queues one job per subject (message or event) of its pending `(attempt, subject)`s, the
/// same again if the source redelivers it.
pub async fn queue_jobs(
    js: &jetstream::Context, ns: &Namespace, pending: Vec<(Uuid, Uuid)>,
) -> Result<(), String> {
    let mut jobs: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    for (attempt, subject) in pending {
        jobs.entry(subject).or_default().push(attempt);
    }
    let publishes = jobs.iter().map(|(subject, attempts)| async move {
        queue(js, ns, attempts, &format!("{subject}:fanout")).await
    });
    futures::future::try_join_all(publishes)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}
