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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde_json::value::RawValue;
use sqlx::types::Json;
use sqlx::PgPool;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::outside::read_capped;
use postmesh_shared::proto::{InboundMessageReply, InboundMessageRequest, WebhookJob};
use postmesh_shared::queue::{
    self, Admission, ClaimRow, Failure, QueueConfig, RecordRow, Stages, Standing, Timers, Verdict,
    DB_NOW_MS,
};
use postmesh_shared::secrets::SecretBox;
use postmesh_shared::{cpu, nats, Namespace, Runtime};

use crate::attempts::Owner;
use crate::endpoints::BodyFormat;
use crate::payload::{self, Event, Shape};
use crate::target::Reach;
use crate::{AppState, DeliveryConfig};

/// How long JetStream waits for a job's ack; the heartbeat extends it while a POST runs.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);
/// An attempt still `pending`, written so that a lookup by id never turns into a scan of the
/// `attempts_due` index (the scheduler's: every pending attempt), whatever the statistics.
pub const UNFINISHED: &str = "status NOT IN ('succeeded', 'failed')";

/// How long an attempt waits for a slot of its busy target. A target that frees none in
/// that time counts as stalled.
const BUSY_WAIT: Duration = Duration::from_secs(1);
/// How long a stalled target stays so: its attempts meanwhile are deferred at once, and
/// wait this long in the database before the scheduler queues them again.
const STALLED_FOR: Duration = Duration::from_secs(5);
/// Bytes of a receiver's answer kept in `lastError`.
const ERROR_BODY_BYTES: usize = 200;
/// How much of a receiver's error answer is read at most.
const ERROR_READ_BYTES: usize = 4096;

/// Makes signed POSTs: one HTTP client whose lookups go through [`Reach`], no redirects.
#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
    reach: Reach,
}

/// A receiver's answer, or why none came.
#[derive(Debug)]
pub struct Answer {
    pub status: Option<StatusCode>,
    /// The failure in words; `None` for a 2xx.
    pub error: Option<String>,
    /// A 429 or 503's `Retry-After`.
    pub retry_after: Option<Duration>,
}

impl Sender {
    /// A sender that waits `config.timeout` for each answer.
    pub fn new(reach: Reach, config: &DeliveryConfig) -> anyhow::Result<Self> {
        postmesh_shared::tls::install_provider();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(reach.clone())
            .user_agent("Postmesh-Webhooks/1")
            .build()?;
        Ok(Self { client, reach })
    }

    /// POSTs `body` to `url`, signed with `keys` under `id`.
    #[tracing::instrument(name = "webhook.post", skip_all, fields(webhook_id = id))]
    pub async fn post(&self, url: &Url, id: &str, keys: &[&[u8]], body: Vec<u8>) -> Answer {
        let refused = |error: String| Answer {
            status: None,
            error: Some(error),
            retry_after: None,
        };
        if let Err(e) = self.reach.admit_literal(url) {
            return refused(e);
        }
        let timestamp = now_unix();
        let signature = payload::sign(keys, id, timestamp, &body);
        let sent = self
            .client
            .post(url.clone())
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let res = match sent {
            Ok(res) => res,
            Err(e) => return refused(chain(&e)),
        };
        let status = res.status();
        if status.is_success() {
            return Answer {
                status: Some(status),
                error: None,
                retry_after: None,
            };
        }
        let retry_after = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        )
        .then(|| retry_after(res.headers()))
        .flatten();
        // Read no further than this, whatever the receiver streams: the rest is dropped.
        let read = read_capped(res, ERROR_READ_BYTES).await;
        let text = read.map(|(body, _)| String::from_utf8_lossy(&body).into_owned());
        let (excerpt, _) =
            postmesh_shared::text::cut_at(text.unwrap_or_default(), ERROR_BODY_BYTES);
        Answer {
            status: Some(status),
            // Postgres text takes no NUL.
            error: Some(format!(
                "HTTP {}: {}",
                status.as_u16(),
                excerpt.trim().replace('\0', "")
            )),
            retry_after,
        }
    }
}

/// An error with its causes, which say why a connection failed (a refused address, a
/// timeout).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After` in seconds (the HTTP-date form is not used by webhook receivers we know).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Where an attempt goes and how, and what it carries, read with it.
#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRow {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub endpoint_id: Option<Uuid>,
    pub webhook_id: Option<Uuid>,
    pub message_id: Uuid,
    /// The delivery event's type and data, for an attempt of one.
    event_type: Option<String>,
    event_data: Option<Json<Box<RawValue>>>,
    url: Option<String>,
    active: Option<bool>,
    body_format: Option<BodyFormat>,
    strip_quotes: Option<bool>,
    secret_sealed: Option<Vec<u8>>,
    previous_secret_sealed: Option<Vec<u8>>,
    previous_secret_until: Option<i64>,
}

/// Reads attempts `ids` with their targets (an endpoint, a webhook, or the workspace's
/// default webhook) and, for an event's attempt, the event.
const ATTEMPTS_WITH_TARGETS: &str = "
    SELECT a.id, a.workspace_id, a.endpoint_id, a.webhook_id, a.message_id,
        ev.type AS event_type, ev.data AS event_data,
        COALESCE(e.url, w.url, d.url) AS url, COALESCE(e.active, w.active, d.active) AS active,
        COALESCE(e.body_format, d.body_format) AS body_format,
        COALESCE(e.strip_quotes, d.strip_quotes) AS strip_quotes,
        COALESCE(e.secret_sealed, w.secret_sealed, d.secret_sealed) AS secret_sealed,
        COALESCE(e.previous_secret_sealed, w.previous_secret_sealed, d.previous_secret_sealed)
            AS previous_secret_sealed,
        COALESCE(e.previous_secret_until, w.previous_secret_until, d.previous_secret_until)
            AS previous_secret_until
    FROM attempts a
    LEFT JOIN endpoints e ON e.id = a.endpoint_id
    LEFT JOIN webhooks w ON w.id = a.webhook_id
    LEFT JOIN default_webhooks d ON a.endpoint_id IS NULL AND a.webhook_id IS NULL
        AND d.workspace_id = a.workspace_id
    LEFT JOIN events ev ON ev.id = a.message_id
    WHERE a.id = ANY($1)";

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

/// Delivery slots per target, shared by the worker and the fan-outs' direct tries.
pub(crate) struct Slots {
    per_target: usize,
    targets: Mutex<HashMap<Uuid, Arc<TargetSlots>>>,
}

/// One target's slots, and until when it counts as stalled.
struct TargetSlots {
    slots: Arc<Semaphore>,
    stalled_until: Mutex<Option<Instant>>,
}

impl Slots {
    /// `per_target` slots for each target.
    pub(crate) fn new(per_target: usize) -> Self {
        Self {
            per_target: per_target.max(1),
            targets: Mutex::default(),
        }
    }

    /// Slots per target.
    pub(crate) fn per_target(&self) -> usize {
        self.per_target
    }

    /// A slot of `target`'s: at once, or within [`BUSY_WAIT`] unless the target is stalled;
    /// `None` when it has none to spare (it then counts as stalled for [`STALLED_FOR`]).
    pub(crate) async fn take(&self, target: Uuid) -> Option<OwnedSemaphorePermit> {
        let target = self.of(target);
        if let Ok(slot) = target.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        let stalled = |until: &Option<Instant>| until.is_some_and(|u| Instant::now() < u);
        if stalled(&target.stalled_until.lock().expect("stall lock")) {
            return None;
        }
        match tokio::time::timeout(BUSY_WAIT, target.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Some(slot),
            _ => {
                *target.stalled_until.lock().expect("stall lock") =
                    Some(Instant::now() + STALLED_FOR);
                None
            }
        }
    }

    /// `target`'s slots.
    fn of(&self, target: Uuid) -> Arc<TargetSlots> {
        let mut targets = self.targets.lock().expect("slots lock");
        if targets.len() > 10_000 {
            // Forget idle targets; a busy one keeps its semaphore alive through its permits.
            targets.retain(|_, t| t.slots.available_permits() < self.per_target);
        }
        targets
            .entry(target)
            .or_insert_with(|| {
                Arc::new(TargetSlots {
                    slots: Arc::new(Semaphore::new(self.per_target)),
                    stalled_until: Mutex::new(None),
                })
            })
            .clone()
    }
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
        ack_wait: ACK_WAIT,
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

/// Its endpoint or webhook, or for the default webhook its workspace.
pub(crate) fn target_of(row: &AttemptRow) -> Uuid {
    row.endpoint_id
        .or(row.webhook_id)
        .unwrap_or(row.workspace_id)
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
    async fn prepare_all(&self, ids: &[Uuid]) -> Result<Prepared, String> {
        let rows: Vec<AttemptRow> = sqlx::query_as(ATTEMPTS_WITH_TARGETS)
            .bind(ids)
            .fetch_all(&self.state.db)
            .await
            .map_err(|e| format!("database: {e}"))?;
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
                    .await?
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

    fn decode(&self, payload: &[u8]) -> Result<Vec<Uuid>, String> {
        let job = WebhookJob::decode(payload).map_err(|e| format!("undecodable: {e}"))?;
        job.attempt_ids
            .iter()
            .map(|id| Uuid::parse_str(id).map_err(|_| format!("attempt id {id:?} is not a uuid")))
            .collect()
    }

    fn items(&self, job: &Vec<Uuid>) -> Vec<Uuid> {
        job.clone()
    }

    async fn prepare(&self, job: &Vec<Uuid>) -> Result<Prepared, String> {
        self.prepare_all(job).await
    }

    /// Takes a slot of the item's target; when they stay all in use, the attempt waits in
    /// the database for the scheduler (`crate::attempts::schedule`), holding nothing here.
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
    ) -> Result<Vec<Option<i32>>, String> {
        let ids: Vec<Uuid> = rows.iter().map(|r| r.item).collect();
        let leases: Vec<Uuid> = rows.iter().map(|r| r.lease).collect();
        let taken: Vec<(Uuid, i32)> = sqlx::query_as(&format!(
            "UPDATE attempts a SET attempt_count = a.attempt_count + 1, lease_owner = u.lease,
                 leased_until_ms = {DB_NOW_MS} + $3, updated_at = $4
             FROM UNNEST($1::uuid[], $2::uuid[]) AS u(id, lease)
             WHERE a.id = u.id AND a.{UNFINISHED} AND a.leased_until_ms <= {DB_NOW_MS}
             RETURNING a.id, a.attempt_count"
        ))
        .bind(&ids)
        .bind(&leases)
        .bind(lease_ms)
        .bind(now_unix())
        .fetch_all(&self.state.db)
        .await
        .map_err(|e| e.to_string())?;
        let taken: HashMap<Uuid, i32> = taken.into_iter().collect();
        Ok(ids.iter().map(|id| taken.get(id).copied()).collect())
    }

    async fn standing(&self, item: Uuid) -> Result<Standing, String> {
        let row: Option<(String, i64)> = sqlx::query_as(&format!(
            "SELECT status, leased_until_ms - {DB_NOW_MS} FROM attempts WHERE id = $1"
        ))
        .bind(item)
        .fetch_optional(&self.state.db)
        .await
        .map_err(|e| e.to_string())?;
        Ok(match row {
            Some((status, left_ms)) if status == "pending" => {
                Standing::Held(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)))
            }
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

    async fn record(&self, rows: Vec<RecordRow>) -> Result<Vec<bool>, String> {
        record(&self.state.db, rows, self.disable_after)
            .await
            .map_err(|e| e.to_string())
    }

    async fn renew(&self, items: &[Uuid], lease: Uuid, lease_ms: i64) -> Result<(), String> {
        sqlx::query(&format!(
            "UPDATE attempts SET leased_until_ms = {DB_NOW_MS} + $3
             WHERE id = ANY($1) AND lease_owner = $2 AND {UNFINISHED}"
        ))
        .bind(items)
        .bind(lease)
        .bind(lease_ms)
        .execute(&self.state.db)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
    }

    fn retry_delay(&self, attempt: i64) -> Option<Duration> {
        let index = usize::try_from(attempt - 1).unwrap_or(0);
        self.schedule.get(index).or(self.schedule.last()).copied()
    }
}

/// What a receiver's answer means for the attempt. The detail of a success, and the start
/// of a failure's text, carry the status code (`HTTP 500: ...`) for the record.
pub(crate) fn outcome(answer: Answer) -> Result<String, Failure> {
    match (answer.status, answer.error) {
        (Some(status), None) => Ok(format!("HTTP {}", status.as_u16())),
        (Some(StatusCode::GONE), Some(e)) => Err(Failure::Permanent(e)),
        (_, Some(e)) => match answer.retry_after {
            Some(after) => Err(Failure::Later(e, after)),
            None => Err(Failure::Transient(e)),
        },
        (None, None) => Err(Failure::Transient("no answer".into())),
    }
}

/// The status code a recorded detail or error starts with (`HTTP 503: ...`).
fn status_code(text: &str) -> Option<i32> {
    text.strip_prefix("HTTP ")?.get(..3)?.parse().ok()
}

/// What an outcome writes to its attempt's row.
pub(crate) struct Written {
    pub status: &'static str,
    pub code: Option<i32>,
    /// The failure, for anything but a success.
    pub error: Option<String>,
    /// When a retry is due (Unix seconds).
    pub next_at: Option<i64>,
}

impl Written {
    /// The columns of `verdict`, reached at `now`.
    pub(crate) fn of(verdict: &Verdict, now: i64) -> Self {
        let (status, text, next_at) = match verdict {
            Verdict::Done(detail) => ("succeeded", detail, None),
            Verdict::Failed(e) => ("failed", e, None),
            Verdict::Retry(e, after) => (
                "pending",
                e,
                Some(now + i64::try_from(after.as_secs()).unwrap_or(i64::MAX / 2)),
            ),
        };
        Self {
            status,
            code: status_code(text),
            error: (status != "succeeded").then(|| text.clone()),
            next_at,
        }
    }
}

/// Writes a batch of outcomes (distinct attempts) and their targets' health ([`health`]).
/// Answers whether each outcome was written: a success always is, a failure or retry only
/// while its claim holds the attempt.
pub(crate) async fn record(
    db: &PgPool, rows: Vec<RecordRow>, disable_after: Duration,
) -> Result<Vec<bool>, sqlx::Error> {
    let now = now_unix();
    let mut ids = Vec::with_capacity(rows.len());
    let mut statuses = Vec::with_capacity(rows.len());
    let mut errors: Vec<Option<String>> = Vec::with_capacity(rows.len());
    let mut codes: Vec<Option<i32>> = Vec::with_capacity(rows.len());
    let mut next_at: Vec<Option<i64>> = Vec::with_capacity(rows.len());
    for row in &rows {
        ids.push(row.item);
        let written = Written::of(&row.verdict, now);
        statuses.push(written.status);
        codes.push(written.code);
        errors.push(written.error);
        next_at.push(written.next_at);
    }
    let leases: Vec<Uuid> = rows.iter().map(|r| r.lease).collect();
    let written: Vec<Uuid> = sqlx::query_scalar(&format!(
        "WITH u AS (
             SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::int[],
                                  $6::bigint[])
                 AS u(id, status, error, lease, code, next_at)
         ), done AS (
             UPDATE attempts a SET status = u.status, last_error = u.error,
                 last_status_code = COALESCE(u.code, a.last_status_code),
                 next_attempt_at = u.next_at, requeue_at = COALESCE(u.next_at, a.requeue_at),
                 updated_at = $7, lease_owner = NULL,
                 leased_until_ms = 0
             FROM u
             WHERE a.id = u.id
               AND CASE WHEN u.status = 'succeeded' THEN a.status <> 'succeeded'
                        ELSE a.status = 'pending' AND a.lease_owner = u.lease END
             RETURNING a.id, a.endpoint_id, a.webhook_id, a.workspace_id, u.status, u.code
         ){HEALTH}
         SELECT id FROM done",
        HEALTH = health(7, 8)
    ))
    .bind(&ids)
    .bind(&statuses)
    .bind(&errors)
    .bind(&leases)
    .bind(&codes)
    .bind(&next_at)
    .bind(now)
    .bind(i64::try_from(disable_after.as_secs()).unwrap_or(i64::MAX))
    .fetch_all(db)
    .await?;
    let written: HashSet<Uuid> = written.into_iter().collect();
    Ok(rows.iter().map(|r| written.contains(&r.item)).collect())
}

/// The statements that write targets' health after the outcomes of a CTE `done` (columns
/// `endpoint_id, webhook_id, workspace_id, status, code`), with the time now and
/// `WEBHOOK_DISABLE_AFTER_SECS` as parameters `now` and `disable_after`: a target's row is
/// written only when that changes it. A success clears `failing_since`; a failure sets it,
/// and disables the target when it is older than `disable_after`; a 410 disables it at once.
pub(crate) fn health(now: u8, disable_after: u8) -> String {
    format!(
        ", health AS (
             SELECT endpoint_id, webhook_id, workspace_id, bool_or(status = 'succeeded') AS ok,
                 bool_or(COALESCE(code, 0) = 410) AS gone
             FROM done GROUP BY endpoint_id, webhook_id, workspace_id
         ), webhooks_seen AS (
             UPDATE webhooks w
             SET failing_since = CASE WHEN h.ok THEN NULL ELSE COALESCE(w.failing_since, ${now}) END,
                 active = w.active AND (h.ok OR NOT (h.gone
                     OR ${now} - COALESCE(w.failing_since, ${now}) >= ${disable_after}))
             FROM health h WHERE h.webhook_id IS NOT NULL AND w.id = h.webhook_id
               AND (NOT h.ok OR w.failing_since IS NOT NULL)
         ), endpoints_seen AS (
             UPDATE endpoints e
             SET failing_since = CASE WHEN h.ok THEN NULL ELSE COALESCE(e.failing_since, ${now}) END,
                 active = e.active AND (h.ok OR NOT (h.gone
                     OR ${now} - COALESCE(e.failing_since, ${now}) >= ${disable_after}))
             FROM health h WHERE h.endpoint_id IS NOT NULL AND e.id = h.endpoint_id
               AND (NOT h.ok OR e.failing_since IS NOT NULL)
         ), defaults_seen AS (
             UPDATE default_webhooks d
             SET failing_since = CASE WHEN h.ok THEN NULL ELSE COALESCE(d.failing_since, ${now}) END,
                 active = d.active AND (h.ok OR NOT (h.gone
                     OR ${now} - COALESCE(d.failing_since, ${now}) >= ${disable_after}))
             FROM health h WHERE h.endpoint_id IS NULL AND h.webhook_id IS NULL
               AND d.workspace_id = h.workspace_id
               AND (NOT h.ok OR d.failing_since IS NOT NULL)
         )"
    )
}

/// Leaves pending attempt `id` to the scheduler, due `pause` from now.
async fn defer(db: &PgPool, id: Uuid, pause: Duration) -> Result<(), sqlx::Error> {
    let pause = i64::try_from(pause.as_secs()).unwrap_or(i64::MAX / 2);
    sqlx::query(&format!(
        "UPDATE attempts SET requeue_at = $2 WHERE id = $1 AND {UNFINISHED}"
    ))
    .bind(id)
    .bind(now_unix() + pause)
    .execute(db)
    .await
    .map(drop)
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

/// Publishes a job of its own for each attempt (`(id, attempt_count)`: the count makes a
/// new job of an attempt tried again).
pub async fn queue_each(
    js: &async_nats::jetstream::Context, ns: &Namespace, attempts: &[(Uuid, i32)],
) -> Result<(), postmesh_shared::ApiError> {
    let publishes = attempts
        .iter()
        .map(|(id, count)| async move { queue(js, ns, &[*id], &format!("{id}:{count}")).await });
    futures::future::try_join_all(publishes).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_outcomes() {
        let answer = |status: Option<u16>, error: Option<&str>, after: Option<u64>| Answer {
            status: status.map(|s| StatusCode::from_u16(s).unwrap()),
            error: error.map(str::to_owned),
            retry_after: after.map(Duration::from_secs),
        };
        assert_eq!(outcome(answer(Some(204), None, None)).unwrap(), "HTTP 204");
        assert!(matches!(
            outcome(answer(Some(410), Some("HTTP 410: gone"), None)),
            Err(Failure::Permanent(_))
        ));
        assert!(matches!(
            outcome(answer(Some(429), Some("HTTP 429: slow"), Some(7))),
            Err(Failure::Later(_, d)) if d == Duration::from_secs(7)
        ));
        assert!(matches!(
            outcome(answer(None, Some("connect refused"), None)),
            Err(Failure::Transient(_))
        ));
        assert_eq!(status_code("HTTP 503: busy"), Some(503));
        assert_eq!(status_code("connect refused"), None);
    }
}
