//! A target's deliveries as a resource — an inbox endpoint's or a workspace webhook's, one
//! set of handlers for both: its attempts (paged, by status), one retried by hand,
//! everything it takes since a time replayed (by type for a webhook), a signed sample sent at
//! once; the scheduler that queues attempts when they are due (a retry, a busy target's
//! turn, a lost job); and the retention sweep (`WEBHOOK_RETENTION_DAYS`).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::{is_unique_violation, now_unix};
use postmesh_shared::extract::{
    Caller, IdPairPath, IdPath, JsonBody, Page, PageQuery, QueryParams,
};
use postmesh_shared::proto::{DeliveryEvent, InboundAttachment, InboundMessageReply};
use postmesh_shared::{ApiError, Runtime, Success};

use crate::attempt::owner::Owner;
use crate::attempt::Status;
use crate::content::payload::{self, Event, Shape};
use crate::delivery::worker::{now_rfc3339, queue, queue_each};
use crate::AppState;

/// How often the scheduler queues the attempts that are due.
const SCHEDULE_EVERY: Duration = Duration::from_secs(1);
/// Attempts of one replay job.
const REPLAY_JOB: usize = 50;
/// Attempts one scheduler pass queues at most.
const SCHEDULE_BATCH: i64 = 1000;
/// How often the retention sweep runs.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Rows of each table one retention statement deletes at most.
const PRUNE_BATCH: i64 = 10_000;
/// Attempts of one target one scheduler pass queues at most: a target's backlog drains at
/// up to this many a second once it answers again, and a stalled one's is handed round no
/// faster.
const SCHEDULE_PER_TARGET: usize = 100;

/// The owner a route's handlers serve: each handler here is generic over it.
pub trait Owned: Send + Sync + 'static {
    const OWNER: Owner;
}

/// Inbox endpoints' routes.
pub struct Endpoints;
impl Owned for Endpoints {
    const OWNER: Owner = Owner::Endpoint;
}

/// Workspace webhooks' routes.
pub struct Webhooks;
impl Owned for Webhooks {
    const OWNER: Owner = Owner::Webhook;
}

/// One attempt as the API shows it.
#[derive(Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptView {
    pub id: Uuid,
    /// The received message, or for an `email.*` event the event's id.
    pub message_id: Uuid,
    /// What it delivers: `inbound.received` or an `email.*` type.
    #[serde(rename = "type")]
    pub event_type: String,
    pub status: Status,
    pub attempt_count: i32,
    pub last_status_code: Option<i32>,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<i64>,
    pub created_at: i64,
}

/// `GET /inbox/webhook/endpoints/{id}/attempts` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AttemptList {
    pub attempts: Vec<AttemptView>,
}

/// `POST .../attempts/{attemptId}/retry` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = AttemptRetried)]
pub struct Retried {
    pub attempt: AttemptView,
}

/// `POST .../replay` answer: how many deliveries were queued.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = WebhookReplayQueued)]
pub struct Replayed {
    pub queued: usize,
    /// Whether more than `WEBHOOK_REPLAY_MAX` matched: the oldest were queued; replay from
    /// a later `since` for the rest.
    pub truncated: bool,
}

/// `POST .../test` answer: what the receiver said.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookTestResult)]
pub struct Tested {
    /// The receiver's status code; none when no answer came.
    pub status_code: Option<u16>,
    pub delivered: bool,
    pub error: Option<String>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    status: Option<Status>,
}

/// 404 unless `id` is an `owner` of the caller's workspace; whether it is active.
async fn require(db: &PgPool, owner: Owner, caller: &Caller, id: Uuid) -> Result<bool, ApiError> {
    let (table, _) = owner.table();
    let active: Option<bool> = sqlx::query_scalar(&format!(
        "SELECT active FROM {table} WHERE id = $1 AND workspace_id = $2"
    ))
    .bind(id)
    .bind(caller.workspace)
    .fetch_optional(db)
    .await?;
    active.ok_or_else(|| owner.not_found())
}

/// 409 unless `id`, an `owner` of the caller's workspace, is active: a disabled target gets
/// no new attempts, which could only fail.
async fn require_active(
    db: &PgPool, owner: Owner, caller: &Caller, id: Uuid,
) -> Result<(), ApiError> {
    match require(db, owner, caller, id).await? {
        true => Ok(()),
        false => Err(ApiError::Conflict(
            "the target is disabled: enable it (active: true) to send to it again".into(),
        )),
    }
}

/// The columns of [`AttemptView`], of attempts `a` left-joined with their events `ev`.
const COLUMNS: &str = "a.id, a.message_id,
    COALESCE(ev.type, 'inbound.received') AS event_type, a.status, a.attempt_count,
    a.last_status_code, a.last_error, a.next_attempt_at, a.created_at";

pub(crate) async fn list<O: Owned>(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    QueryParams(q): QueryParams<ListQuery>, QueryParams(page): QueryParams<PageQuery>,
) -> Result<Success<AttemptList>, ApiError> {
    let Page { limit, offset } = page.page(50)?;
    require(&state.db, O::OWNER, &caller, id).await?;
    let (_, column) = O::OWNER.table();
    let attempts = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM attempts a LEFT JOIN events ev ON ev.id = a.message_id
         WHERE a.{column} = $1 AND ($2::text IS NULL OR a.status = $2::text)
         ORDER BY a.created_at DESC, a.id DESC LIMIT $3 OFFSET $4"
    ))
    .bind(id)
    .bind(q.status)
    .bind(limit)
    .bind(offset)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(AttemptList { attempts }))
}

fn jetstream(state: &AppState) -> Result<async_nats::jetstream::Context, ApiError> {
    let client = state
        .nats
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the delivery queue is not reachable".into()))?;
    Ok(async_nats::jetstream::new(client.clone()))
}

/// Sends attempt `attemptId` again now, whatever it came to; 202. A try in flight loses its
/// lease: a failure it records later would end the attempt the retry was asked of (a success
/// still counts).
pub(crate) async fn retry<O: Owned>(
    State(state): State<AppState>, caller: Caller,
    IdPairPath(owner, attempt): IdPairPath<Uuid, Uuid>,
) -> Result<(StatusCode, Success<Retried>), ApiError> {
    require_active(&state.db, O::OWNER, &caller, owner).await?;
    let js = jetstream(&state)?;
    let (_, column) = O::OWNER.table();
    let view: AttemptView = sqlx::query_as(&format!(
        "WITH a AS (
             UPDATE attempts SET status = 'pending', next_attempt_at = $3, updated_at = $3,
                 requeue_at = DEFAULT, lease_owner = NULL, leased_until_ms = 0
             WHERE id = $1 AND {column} = $2 RETURNING *
         )
         SELECT {COLUMNS} FROM a LEFT JOIN events ev ON ev.id = a.message_id"
    ))
    .bind(attempt)
    .bind(owner)
    .bind(now_unix())
    .fetch_optional(&state.db)
    .await
    .map_err(|e| match is_unique_violation(&e) {
        true => ApiError::Conflict("a replay of this message to this target is waiting".into()),
        false => e.into(),
    })?
    .ok_or_else(|| ApiError::NotFound("no such attempt".into()))?;
    // Each retry a job of its own, however soon after the last one.
    let turn = postmesh_shared::db::now_micros();
    queue_each(&js, &state.ns, &[(view.id, turn)], "retry").await?;
    Ok((
        StatusCode::ACCEPTED,
        Success::new(Retried { attempt: view }),
    ))
}

/// `POST .../replay` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = WebhookReplayRequest)]
pub(crate) struct Since {
    /// Unix seconds.
    since: i64,
    /// Only these event types (each known); none: every type the target takes.
    types: Option<Vec<crate::routes::webhooks::EventTypeName>>,
}

/// What an endpoint's replay sends: every message its address received since `$2`.
const ENDPOINT_REPLAY: &str = "
    SELECT e.workspace_id, e.id AS endpoint_id, NULL::uuid AS webhook_id, r.message_id,
           r.received_at AS at
    FROM endpoints e JOIN received r ON r.address_id = e.address_id
    WHERE e.id = $1 AND r.received_at >= $2
      AND ($4::text[] IS NULL OR 'inbound.received' = ANY($4))";

/// What a webhook's replay sends: every event of its workspace since `$2` of a type it
/// takes (and `$4` names, when given), received messages included.
const WEBHOOK_REPLAY: &str = "
    SELECT w.workspace_id, NULL::uuid AS endpoint_id, w.id AS webhook_id, ev.id AS message_id,
           ev.occurred_at AS at
    FROM webhooks w JOIN events ev ON ev.workspace_id = w.workspace_id
    WHERE w.id = $1 AND ev.occurred_at >= $2
      AND (w.events = '{}' OR ev.type = ANY(w.events))
      AND ($4::text[] IS NULL OR ev.type = ANY($4))
    UNION ALL
    SELECT w.workspace_id, NULL, w.id, r.message_id, r.received_at
    FROM webhooks w JOIN received r ON r.workspace_id = w.workspace_id
    WHERE w.id = $1 AND r.received_at >= $2
      AND (w.events = '{}' OR 'inbound.received' = ANY(w.events))
      AND ($4::text[] IS NULL OR 'inbound.received' = ANY($4))";

/// Queues a new delivery to the target of everything it takes since `since` (of `types`,
/// when given), oldest first and `WEBHOOK_REPLAY_MAX` at most (`truncated` then), but none
/// of a message a replay to it already has waiting; 202 with how many.
pub(crate) async fn replay<O: Owned>(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    JsonBody(body): JsonBody<Since>,
) -> Result<(StatusCode, Success<Replayed>), ApiError> {
    let types = body
        .types
        .map(crate::routes::webhooks::event_types)
        .transpose()?;
    require_active(&state.db, O::OWNER, &caller, id).await?;
    let js = jetstream(&state)?;
    let now = now_unix();
    let what = match O::OWNER {
        Owner::Endpoint => ENDPOINT_REPLAY,
        Owner::Webhook => WEBHOOK_REPLAY,
    };
    let max = i64::try_from(state.replay_max).unwrap_or(i64::MAX);
    // One over the cap is picked, to tell a cut replay; the cap's worth is written.
    let mut tx = state.db.begin().await?;
    let (picked, queued): (i64, Vec<Uuid>) = sqlx::query_as(&format!(
        "WITH picked AS (
             SELECT * FROM ({what}) AS t ORDER BY t.at, t.message_id LIMIT $5 + 1
         ), written AS (
             INSERT INTO attempts (id, workspace_id, endpoint_id, webhook_id, message_id, origin,
                                   status, next_attempt_at, created_at, updated_at)
             SELECT gen_random_uuid(), p.workspace_id, p.endpoint_id, p.webhook_id,
                    p.message_id, 'replay', 'pending', $3, $3, $3
             FROM (SELECT * FROM picked ORDER BY at, message_id LIMIT $5) AS p
             ON CONFLICT (message_id, (COALESCE(endpoint_id, webhook_id)))
                 WHERE origin = 'replay' AND status = 'pending' DO NOTHING
             RETURNING id
         )
         SELECT (SELECT count(*) FROM picked),
                COALESCE((SELECT array_agg(id) FROM written), '{{}}')"
    ))
    .bind(id)
    .bind(body.since)
    .bind(now)
    .bind(types)
    .bind(max)
    .fetch_one(&mut *tx)
    .await?;
    let truncated = picked > max;
    tx.commit().await?;
    // Jobs of up to REPLAY_JOB attempts; a publish that fails leaves them to the scheduler.
    for chunk in queued.chunks(REPLAY_JOB) {
        let msg_id = format!("{}:replay", chunk[0]);
        if let Err(e) = queue(&js, &state.ns, chunk, &msg_id).await {
            tracing::warn!(error = %e, "replay queued in the database only; the scheduler sends it");
        }
    }
    Ok((
        StatusCode::ACCEPTED,
        Success::new(Replayed {
            queued: queued.len(),
            truncated,
        }),
    ))
}

/// The message a test delivery carries.
fn sample(address_id: Uuid) -> InboundMessageReply {
    InboundMessageReply {
        found: true,
        email_id: "sample@postmesh.test".into(),
        address_id: address_id.to_string(),
        address: "sample@postmesh.test".into(),
        thread_id: Uuid::nil().to_string(),
        from_address: "sender@example.com".into(),
        from_name: "Postmesh test".into(),
        to: vec!["sample@postmesh.test".into()],
        subject: "A test delivery from Postmesh".into(),
        received_at: now_unix(),
        text: Some("This is a test delivery of your inbox webhook.".into()),
        attachments: vec![InboundAttachment {
            filename: "sample.txt".into(),
            content_type: "text/plain".into(),
            size: 12,
        }],
        spf: "pass".into(),
        dkim: "pass".into(),
        dmarc: "pass".into(),
        ..Default::default()
    }
}

/// A sample delivery event: a message sent to `sample@postmesh.test`.
fn sample_event(kind: &str) -> DeliveryEvent {
    DeliveryEvent {
        event_id: Uuid::nil().to_string(),
        task_id: Uuid::nil().to_string(),
        delivery_id: Uuid::nil().to_string(),
        email: "sample@postmesh.test".into(),
        kind: kind.trim_start_matches("email.").into(),
        occurred_at: now_unix(),
        detail: "{}".into(),
        sequence: 1,
        from_address: "sender@example.com".into(),
        from_name: "Postmesh test".into(),
        subject: "A test delivery from Postmesh".into(),
        email_type: "transactional".into(),
        message_id: "<sample@postmesh.test>".into(),
        ..Default::default()
    }
}

/// The sample body a test delivery to target `id` carries: an endpoint's in its shape, a
/// webhook's of the first type it takes (`email.sent` when it takes all).
async fn sample_body(
    state: &AppState, owner: Owner, id: Uuid, shape: Shape,
) -> Result<Vec<u8>, ApiError> {
    let inbound_only = |types: &[String]| {
        !types.is_empty() && types.iter().all(|t| t == payload::INBOUND_RECEIVED)
    };
    let types: Vec<String> = match owner {
        Owner::Endpoint => Vec::new(),
        Owner::Webhook => {
            sqlx::query_scalar("SELECT events FROM webhooks WHERE id = $1")
                .bind(id)
                .fetch_one(&state.db)
                .await?
        }
    };
    let encoded = match owner {
        Owner::Webhook if inbound_only(&types) => {
            let shape = Shape {
                max_body_bytes: usize::MAX,
                ..shape
            };
            serde_json::to_vec(&Event::received(
                &sample(Uuid::nil()),
                Uuid::nil().to_string(),
                shape,
                now_rfc3339(),
            ))
        }
        Owner::Endpoint => {
            let address_id: Uuid =
                sqlx::query_scalar("SELECT address_id FROM endpoints WHERE id = $1")
                    .bind(id)
                    .fetch_one(&state.db)
                    .await?;
            let sample = sample(address_id);
            let shape = Shape {
                max_body_bytes: usize::MAX,
                ..shape
            };
            serde_json::to_vec(&Event::received(
                &sample,
                Uuid::nil().to_string(),
                shape,
                now_rfc3339(),
            ))
        }
        Owner::Webhook => {
            let kind = types
                .into_iter()
                .find(|t| t.starts_with("email."))
                .unwrap_or_else(|| "email.sent".into());
            let sample = sample_event(&kind);
            let data = crate::delivery::events::data(&sample);
            serde_json::to_vec(&payload::Envelope::new(&kind, now_rfc3339(), &data))
        }
    };
    encoded.map_err(|e| ApiError::internal("encoding", e))
}

/// Sends a signed sample payload to the target now and answers what the receiver said.
pub(crate) async fn test<O: Owned>(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Tested>, ApiError> {
    require(&state.db, O::OWNER, &caller, id).await?;
    let target = crate::delivery::worker::ready_target(&state, O::OWNER, id).await?;
    let body = sample_body(&state, O::OWNER, id, target.shape).await?;
    let keys: Vec<&[u8]> = target.keys.iter().map(Vec::as_slice).collect();
    let webhook_id = payload::webhook_id(Uuid::now_v7());
    let answer = state
        .sender
        .post(&target.url, &webhook_id, &keys, body)
        .await;
    Ok(Success::new(Tested {
        status_code: answer.status.map(|s| s.as_u16()),
        delivered: answer.error.is_none(),
        error: answer.error,
    }))
}

/// Every `SCHEDULE_EVERY`, queues the attempts that are [`due`], at most
/// `SCHEDULE_PER_TARGET` of each target per pass, so a target with a large backlog takes its
/// turn without crowding out the others.
pub fn schedule(rt: &Runtime) {
    let (db, js, ns) = (rt.db.clone(), rt.js.clone(), rt.common.namespace.clone());
    rt.every("webhook scheduler", SCHEDULE_EVERY, move || {
        let (db, js, ns) = (db.clone(), js.clone(), ns.clone());
        async move {
            let due = due(&db, SCHEDULE_PER_TARGET, SCHEDULE_BATCH)
                .await
                .map_err(|e| e.to_string())?;
            if !due.is_empty() {
                tracing::debug!(count = due.len(), "queueing due webhook attempts");
                // A publish that fails leaves them to a later pass (their default time).
                queue_each(&js, &ns, &due, "due")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<bool, String>(false)
        }
    });
}

/// Every `PRUNE_EVERY`, deletes what is older than `days` ([`prune`]), in batches of
/// `PRUNE_BATCH` rows a table until a batch comes back short. Zero keeps everything.
pub fn prune_periodically(rt: &Runtime, days: u32) {
    if days == 0 {
        return;
    }
    let db = rt.db.clone();
    rt.every("webhook retention sweep", PRUNE_EVERY, move || {
        let db = db.clone();
        async move {
            let cutoff = now_unix() - i64::from(days) * 86_400;
            let pruned = prune(&db, cutoff, PRUNE_BATCH).await?;
            Ok::<bool, sqlx::Error>(pruned.full(PRUNE_BATCH))
        }
    });
}

/// Rows one [`prune`] pass deleted, by table.
#[derive(Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct Pruned {
    pub attempts: i64,
    pub events: i64,
    pub received: i64,
}

impl Pruned {
    /// Whether a table gave a whole batch (more may be left).
    fn full(&self, batch: i64) -> bool {
        self.attempts >= batch || self.events >= batch || self.received >= batch
    }
}

/// Deletes up to `batch` rows of each table from before `cutoff` (Unix seconds): finished
/// attempts created then (their listing), and stored events and received messages of then
/// (what a replay reaches) that no pending attempt still carries.
pub async fn prune(db: &PgPool, cutoff: i64, batch: i64) -> Result<Pruned, sqlx::Error> {
    sqlx::query_as(
        "WITH old_attempts AS (
             DELETE FROM attempts WHERE id IN (
                 SELECT id FROM attempts
                 WHERE status IN ('succeeded', 'failed') AND created_at < $1 LIMIT $2)
             RETURNING 1
         ), old_events AS (
             DELETE FROM events WHERE id IN (
                 SELECT ev.id FROM events ev
                 WHERE ev.occurred_at < $1 AND NOT EXISTS (
                     SELECT 1 FROM attempts a WHERE a.message_id = ev.id AND a.status = 'pending')
                 LIMIT $2)
             RETURNING 1
         ), old_received AS (
             DELETE FROM received WHERE message_id IN (
                 SELECT r.message_id FROM received r
                 WHERE r.received_at < $1 AND NOT EXISTS (
                     SELECT 1 FROM attempts a
                     WHERE a.message_id = r.message_id AND a.status = 'pending')
                 LIMIT $2)
             RETURNING 1
         )
         SELECT (SELECT count(*) FROM old_attempts) AS attempts,
                (SELECT count(*) FROM old_events) AS events,
                (SELECT count(*) FROM old_received) AS received",
    )
    .bind(cutoff)
    .bind(batch)
    .fetch_one(db)
    .await
}

/// Takes the pending, unleased attempts whose `requeue_at` has passed (a retry's time came,
/// a busy target's pause ended, or a job was lost), the earliest first, at most
/// `per_target` of each target and `limit` in all, and gives each its column's default
/// `requeue_at` again (if still pending five minutes on, its job was lost); answers each
/// one's id and the `requeue_at` it was taken at, which names its job ([`queue_each`]).
/// Replicas may take at once: the update re-checks each row, so each is taken once.
pub async fn due(
    db: &PgPool, per_target: usize, limit: i64,
) -> Result<Vec<(Uuid, i64)>, sqlx::Error> {
    // `<`: seconds are whole, so a retry due at second t waits until t + 1 has begun and
    // never comes early.
    sqlx::query_as(&format!(
        "UPDATE attempts a SET requeue_at = DEFAULT
         FROM (
             SELECT id, requeue_at FROM (
                 SELECT id, requeue_at, row_number() OVER (
                     PARTITION BY COALESCE(endpoint_id, webhook_id, workspace_id)
                     ORDER BY requeue_at, id) AS nth
                 FROM attempts
                 WHERE status = 'pending' AND requeue_at < {second} AND leased_until_ms < {now_ms}
             ) d
             WHERE nth <= $1 ORDER BY requeue_at LIMIT $2
         ) due
         WHERE a.id = due.id AND a.status = 'pending' AND a.requeue_at < {second}
         RETURNING a.id, due.requeue_at",
        now_ms = postmesh_shared::queue::DB_NOW_MS,
        second = postmesh_shared::db::DB_SECOND,
    ))
    .bind(i64::try_from(per_target).unwrap_or(i64::MAX))
    .bind(limit)
    .fetch_all(db)
    .await
}
