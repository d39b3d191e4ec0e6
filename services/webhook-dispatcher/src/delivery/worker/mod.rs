//! The delivery worker: the WEBHOOK queue on the kit's queue worker. Each job is a list of
//! attempt rows: prepare reads their targets (an inbox endpoint, a workspace webhook or the
//! default webhook) and what they carry (a stored delivery event, or a received message
//! asked of the inbound service);
//! the claim takes the attempt's lease; the work renders, signs and POSTs it, each target
//! limited to `WEBHOOK_ENDPOINT_CONCURRENCY` at once (a busy target's attempt is left to the
//! scheduler, so it never holds up another's); the record writes the outcome and the
//! target's health (a 410 or `WEBHOOK_DISABLE_AFTER_SECS` of failures disables it). Retries
//! follow `WEBHOOK_RETRY_SCHEDULE`, or a receiver's `Retry-After`, and wait in the database
//! (`requeue_at`), not in the consumer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use reqwest::Url;
use serde_json::value::RawValue;
use sqlx::types::Json;
use tokio::sync::OwnedSemaphorePermit;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{InboundMessageReply, InboundMessageRequest, WebhookJob};
use postmesh_shared::queue::{
    self, Admission, ClaimRow, Failure, QueueConfig, RecordRow, StageError, Stages, Standing,
    Timers, DB_NOW_MS,
};
use postmesh_shared::secrets::SecretBox;
use postmesh_shared::{cpu, nats, Namespace, Runtime};

use crate::attempt::owner::Owner;
use crate::attempt::{target_of, AttemptRow, Status, ATTEMPTS_WITH_TARGETS, DUE, UNFINISHED};
use crate::content::payload::{self, Event, Shape};
use crate::{AppState, DeliveryConfig};

mod post;
mod record;
mod slots;

pub use post::{Answer, Sender};
use record::defer;
pub(crate) use record::{health, outcome, record, Written};
pub(crate) use slots::Slots;

/// How long a stalled target stays so: its attempts meanwhile are deferred at once, and
/// wait this long in the database before the scheduler queues them again.
const STALLED_FOR: Duration = Duration::from_secs(5);

/// A target ready to be posted to.
pub struct Ready {
    pub url: Url,
    pub shape: Shape,
    /// The signing keys in force: the current one, and a rotated-out one still signing.
    pub keys: Vec<Vec<u8>>,
}

/// What a delivery carries.
pub(crate) enum Content {
    /// A received message (`inbound.received`), shared by its targets.
    Message(Arc<InboundMessageReply>, Uuid),
    /// A delivery event: its type and data, as stored (never parsed here), shared by its
    /// targets.
    Event(Arc<(String, Box<RawValue>)>),
}

/// One attempt ready to be made.
pub struct Delivery {
    pub(crate) ready: Arc<Ready>,
    pub(crate) content: Content,
    /// Its endpoint or webhook, or for the default webhook its workspace: what slots are
    /// counted by.
    pub(crate) target: Uuid,
    /// The attempt.
    pub(crate) attempt: Uuid,
}

impl Delivery {
    /// The JSON body of this delivery, stamped now; a large message is rendered on the CPU
    /// pool, off the worker other deliveries share.
    pub(crate) async fn body(&self) -> serde_json::Result<Vec<u8>> {
        match &self.content {
            Content::Message(message, id) => {
                let (message, id, shape) = (message.clone(), *id, self.ready.shape);
                let size = [&message.text, &message.html]
                    .iter()
                    .map(|part| part.as_ref().map_or(0, String::len))
                    .sum();
                cpu::run_sized(size, move || {
                    let event = Event::received(&message, id.to_string(), shape, now_rfc3339());
                    serde_json::to_vec(&event)
                })
                .await
            }
            Content::Event(event) => {
                let (kind, data) = &**event;
                serde_json::to_vec(&payload::Envelope::new(kind, now_rfc3339(), data))
            }
        }
    }

    /// POSTs it, signed, with `sender`; owns what it needs, so it can outlive its caller.
    pub(crate) fn post(
        &self, sender: &Sender, body: Vec<u8>,
    ) -> impl std::future::Future<Output = Answer> + Send + 'static {
        let (sender, ready, id) = (sender.clone(), self.ready.clone(), self.attempt);
        async move {
            let keys: Vec<&[u8]> = ready.keys.iter().map(Vec::as_slice).collect();
            sender
                .post(&ready.url, &payload::webhook_id(id), &keys, body)
                .await
        }
    }
}

/// What a job's attempts need, by item: each delivery, or why it can never be made; and
/// each admitted item's target slot, held while it is posted.
pub struct Prepared {
    deliveries: Vec<Result<Delivery, String>>,
    slots: Vec<Mutex<Option<OwnedSemaphorePermit>>>,
}

/// The dispatcher's stages.
struct Deliveries {
    state: AppState,
    max_body_bytes: usize,
    schedule: Vec<Duration>,
    disable_after: Duration,
    slots: Arc<Slots>,
}

/// Consumes the WEBHOOK stream until the runtime shuts down, its targets' slots shared
/// with the fan-outs' direct tries.
pub(crate) async fn spawn(
    rt: &Runtime, state: AppState, config: &DeliveryConfig, slots: Arc<Slots>,
) -> anyhow::Result<()> {
    let stages = Deliveries {
        state,
        max_body_bytes: config.max_body_bytes,
        schedule: config.retry_schedule.clone(),
        disable_after: config.disable_after,
        slots,
    };
    let queue = QueueConfig {
        name: "webhook-dispatcher",
        ack_wait: config.ack_wait,
        max_deliver: i64::try_from(config.retry_schedule.len()).unwrap_or(0) + 1,
        // Only a job whose database work failed waits on this (attempts follow the schedule).
        retry_base: Duration::from_millis(500),
        concurrency: config.concurrency,
        claim_ahead: 2 * config.concurrency,
        timers: Timers::Database,
    };
    queue::spawn(rt, Stream::Webhook, queue, stages).await
}

/// The target of `row`, ready to post to, or why it cannot be.
pub(crate) fn ready(
    row: &AttemptRow, secrets: &SecretBox, max_body_bytes: usize,
) -> Result<Ready, String> {
    let (Some(url), Some(sealed)) = (&row.url, &row.secret_sealed) else {
        return Err(match (row.endpoint_id, row.webhook_id) {
            (Some(_), _) => "the endpoint was deleted".into(),
            (_, Some(_)) => "the webhook was deleted".into(),
            _ => "the workspace has no default webhook".into(),
        });
    };
    if row.active != Some(true) {
        return Err("the endpoint is disabled".into());
    }
    let owner = target_of(row);
    let open = |sealed: &[u8]| {
        secrets
            .open(owner.as_bytes(), sealed)
            .ok_or_else(|| "the signing secret cannot be opened (SECRETS_KEY changed?)".to_owned())
    };
    let mut keys = vec![open(sealed)?];
    if let (Some(previous), Some(until)) = (&row.previous_secret_sealed, row.previous_secret_until)
    {
        if until > now_unix() {
            keys.push(open(previous)?);
        }
    }
    Ok(Ready {
        url: Url::parse(url).map_err(|e| format!("url: {e}"))?,
        shape: Shape {
            format: row.body_format.unwrap_or_default(),
            strip_quotes: row.strip_quotes.unwrap_or(false),
            max_body_bytes,
        },
        keys,
    })
}

/// Endpoint or webhook `id`, ready to post to whether active or not (a test delivery).
pub async fn ready_target(
    state: &AppState, owner: Owner, id: Uuid,
) -> Result<Ready, postmesh_shared::ApiError> {
    let (table, endpoint, webhook, shape) = match owner {
        Owner::Endpoint => ("endpoints", "id", "NULL::uuid", "body_format, strip_quotes"),
        Owner::Webhook => (
            "webhooks",
            "NULL::uuid",
            "id",
            "NULL::text AS body_format, false AS strip_quotes",
        ),
    };
    let row: AttemptRow = sqlx::query_as(&format!(
        "SELECT id, workspace_id, {endpoint} AS endpoint_id,
             {webhook} AS webhook_id, id AS message_id, NULL::text AS event_type,
             NULL::jsonb AS event_data, url, true AS active, {shape}, secret_sealed,
             previous_secret_sealed, previous_secret_until
         FROM {table} WHERE id = $1"
    ))
    .bind(id)
    .fetch_one(&state.db)
    .await?;
    ready(&row, &state.secrets, usize::MAX)
        .map_err(|e| postmesh_shared::ApiError::internal("the target cannot be signed for", e))
}

/// Asks the inbound service for message `id` of `workspace`, bodies cut a little past
/// `max_body_bytes` (so a cut shows); `None` when it no longer exists.
pub async fn message(
    state: &AppState, workspace: Uuid, id: Uuid, max_body_bytes: usize,
) -> Result<Option<InboundMessageReply>, String> {
    let client = state
        .nats
        .as_ref()
        .ok_or("the inbound service is not reachable")?;
    let req = InboundMessageRequest {
        workspace_id: workspace.to_string(),
        message_id: id.to_string(),
        max_body_bytes: u32::try_from(max_body_bytes + 1).unwrap_or(u32::MAX),
    };
    let reply = nats::call(client, &state.ns, &req)
        .await
        .map_err(|e| format!("asking the inbound service: {e}"))?;
    Ok(reply.found.then_some(reply))
}

/// Now, in RFC 3339.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

impl Deliveries {
    /// Reads the job's attempts and targets, and asks for each message once.
    async fn prepare_all(&self, ids: &[Uuid]) -> Result<Prepared, StageError> {
        let rows: Vec<AttemptRow> = sqlx::query_as(ATTEMPTS_WITH_TARGETS)
            .bind(ids)
            .fetch_all(&self.state.db)
            .await?;
        let mut rows: HashMap<Uuid, AttemptRow> = rows.into_iter().map(|r| (r.id, r)).collect();
        let mut messages: HashMap<Uuid, Option<Arc<InboundMessageReply>>> = HashMap::new();
        let mut deliveries = Vec::with_capacity(ids.len());
        for id in ids {
            // An attempt deleted with its endpoint: the claim finds nothing to do.
            let Some(row) = rows.remove(id) else {
                deliveries.push(Err("the attempt no longer exists".into()));
                continue;
            };
            let ready = match ready(&row, &self.state.secrets, self.max_body_bytes) {
                Ok(ready) => Arc::new(ready),
                Err(why) => {
                    deliveries.push(Err(why));
                    continue;
                }
            };
            let (target, attempt) = (target_of(&row), row.id);
            if let (Some(kind), Some(Json(data))) = (row.event_type, row.event_data) {
                deliveries.push(Ok(Delivery {
                    ready,
                    content: Content::Event(Arc::new((kind, data))),
                    target,
                    attempt,
                }));
                continue;
            }
            let message = match messages.get(&row.message_id) {
                Some(known) => known.clone(),
                None => {
                    let asked = message(
                        &self.state,
                        row.workspace_id,
                        row.message_id,
                        self.max_body_bytes,
                    )
                    .await
                    .map_err(StageError::Unavailable)?
                    .map(Arc::new);
                    messages.insert(row.message_id, asked.clone());
                    asked
                }
            };
            deliveries.push(match message {
                Some(message) => Ok(Delivery {
                    ready,
                    content: Content::Message(message, row.message_id),
                    target,
                    attempt,
                }),
                None => Err("the message no longer exists".into()),
            });
        }
        Ok(Prepared {
            slots: ids.iter().map(|_| Mutex::new(None)).collect(),
            deliveries,
        })
    }
}

impl Stages for Deliveries {
    type Job = Vec<Uuid>;
    type Shared = Prepared;
    type ClaimData = ();

    fn decode(&self, payload: &[u8]) -> Result<Vec<Uuid>, StageError> {
        let job =
            WebhookJob::decode(payload).map_err(|e| StageError::Undecodable(e.to_string()))?;
        job.attempt_ids
            .iter()
            .map(|id| {
                Uuid::parse_str(id).map_err(|_| {
                    StageError::Undecodable(format!("attempt id {id:?} is not a uuid"))
                })
            })
            .collect()
    }

    fn items(&self, job: &Vec<Uuid>) -> Vec<Uuid> {
        job.clone()
    }

    async fn prepare(&self, job: &Vec<Uuid>) -> Result<Prepared, StageError> {
        self.prepare_all(job).await
    }

    /// Takes a slot of the item's target; when they stay all in use, the attempt waits in
    /// the database for the scheduler (`crate::routes::attempts::schedule`), holding nothing here.
    async fn admit(&self, _job: &Vec<Uuid>, shared: &Prepared, index: usize) -> Admission {
        // One that can never be made is failed by its work.
        let Ok(delivery) = &shared.deliveries[index] else {
            return Admission::Now;
        };
        if let Some(slot) = self.slots.take(delivery.target).await {
            *shared.slots[index].lock().expect("slot lock") = Some(slot);
            return Admission::Now;
        }
        let busy = "the endpoint has as many deliveries in flight as it may";
        match defer(&self.state.db, delivery.attempt, STALLED_FOR).await {
            Ok(()) => Admission::Elsewhere,
            Err(e) => Admission::Later(format!("{busy}; deferring it failed: {e}")),
        }
    }

    fn claim_data(&self, _job: &Vec<Uuid>, _shared: &Prepared, _index: usize) {}

    async fn claim(
        &self, rows: Vec<ClaimRow<()>>, lease_ms: i64,
    ) -> Result<Vec<Option<i32>>, StageError> {
        let ids: Vec<Uuid> = rows.iter().map(|r| r.item).collect();
        let leases: Vec<Uuid> = rows.iter().map(|r| r.lease).collect();
        let taken: Vec<(Uuid, i32)> = sqlx::query_as(&format!(
            "UPDATE attempts a SET attempt_count = a.attempt_count + 1, lease_owner = u.lease,
                 leased_until_ms = {DB_NOW_MS} + $3, updated_at = $4
             FROM UNNEST($1::uuid[], $2::uuid[]) AS u(id, lease)
             WHERE a.id = u.id AND a.{UNFINISHED} AND a.leased_until_ms <= {DB_NOW_MS}
               AND {DUE}
             RETURNING a.id, a.attempt_count"
        ))
        .bind(&ids)
        .bind(&leases)
        .bind(lease_ms)
        .bind(now_unix())
        .fetch_all(&self.state.db)
        .await?;
        let taken: HashMap<Uuid, i32> = taken.into_iter().collect();
        Ok(ids.iter().map(|id| taken.get(id).copied()).collect())
    }

    async fn standing(&self, item: Uuid) -> Result<Standing, StageError> {
        let row: Option<(Status, i64, bool)> = sqlx::query_as(&format!(
            "SELECT status, leased_until_ms - {DB_NOW_MS}, {DUE} FROM attempts WHERE id = $1"
        ))
        .bind(item)
        .fetch_optional(&self.state.db)
        .await?;
        Ok(match row {
            Some((Status::Pending, left_ms, due)) if left_ms > 0 || due => {
                Standing::Held(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)))
            }
            // Not due yet: an early job's (a redelivery, a repeat); the scheduler queues the
            // attempt at its time.
            _ => Standing::Finished,
        })
    }

    async fn work(
        &self, _job: &Vec<Uuid>, shared: &Prepared, index: usize,
    ) -> Result<String, Failure> {
        let delivery = shared.deliveries[index]
            .as_ref()
            .map_err(|why| Failure::Permanent(why.clone()))?;
        let _slot = shared.slots[index].lock().expect("slot lock").take();
        let body = delivery
            .body()
            .await
            .map_err(|e| Failure::Permanent(e.to_string()))?;
        outcome(delivery.post(&self.state.sender, body).await)
    }

    async fn record(&self, rows: Vec<RecordRow>) -> Result<Vec<bool>, StageError> {
        Ok(record(&self.state.db, rows, self.disable_after).await?)
    }

    async fn renew(&self, items: &[Uuid], lease: Uuid, lease_ms: i64) -> Result<(), StageError> {
        sqlx::query(&format!(
            "UPDATE attempts SET leased_until_ms = {DB_NOW_MS} + $3
             WHERE id = ANY($1) AND lease_owner = $2 AND {UNFINISHED}"
        ))
        .bind(items)
        .bind(lease)
        .bind(lease_ms)
        .execute(&self.state.db)
        .await?;
        Ok(())
    }

    fn retry_delay(&self, attempt: i64) -> Option<Duration> {
        let index = usize::try_from(attempt - 1).unwrap_or(0);
        self.schedule.get(index).or(self.schedule.last()).copied()
    }
}

/// Publishes one WEBHOOK job of `attempts` under `msg_id` (a repeat within JetStream's
/// duplicate window is dropped).
pub async fn queue(
    js: &async_nats::jetstream::Context, ns: &Namespace, attempts: &[Uuid], msg_id: &str,
) -> Result<(), postmesh_shared::ApiError> {
    let job = WebhookJob {
        attempt_ids: attempts.iter().map(Uuid::to_string).collect(),
    };
    let subject = Stream::Webhook.subject(ns);
    postmesh_shared::jetstream::publish(js, subject, msg_id, job.encode_to_vec().into()).await
}

/// Publishes a job of its own for each attempt, `(id, turn)`, under `{id}:{why}:{turn}`:
/// the turn (the `requeue_at` it was taken at, or a manual retry's time) makes a new job of
/// an attempt queued again — after a retry's delay, and after a busy target's pause, which
/// leaves its attempt count as it was, so that a job named by the count would be dropped
/// as a repeat within the duplicate window.
pub async fn queue_each(
    js: &async_nats::jetstream::Context, ns: &Namespace, attempts: &[(Uuid, i64)], why: &str,
) -> Result<(), postmesh_shared::ApiError> {
    let publishes = attempts.iter().map(|(id, turn)| async move {
        queue(js, ns, &[*id], &format!("{id}:{why}:{turn}")).await
    });
    futures::future::try_join_all(publishes).await.map(drop)
}
