//! The fan-outs: each message of a source stream becomes durable attempts, one per target
//! that wants it (at most once per target and message, whatever redeliveries): each new
//! one tried once directly (`crate::delivery::direct`), then all written in one statement per batch
//! with their outcomes, then one WEBHOOK job per message of the attempts left to the
//! worker, then the ack. A crash before the ack redelivers the message, which tries what
//! it finds unwritten and queues its unfinished attempts again (JetStream drops the
//! repeats by id). Two sources: INBOUND (this module: each received message to every
//! active endpoint of its address — or, when the address has none, to the workspace's
//! default webhook, spec §4.7 rule 2 — and to the workspace's webhooks taking
//! `inbound.received`) and DELIVERY (`crate::delivery::events`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, AckKind};
use futures::FutureExt;
use prost::Message as _;
use sqlx::PgPool;
use tokio::sync::Semaphore;
use tracing::Instrument;
use uuid::Uuid;

use postmesh_shared::dead_letters::{panic_message, DeadLetters};
use postmesh_shared::jetstream::{next_batch, Stream};
use postmesh_shared::proto::{InboundMessageReply, InboundReceived};
use postmesh_shared::{telemetry, Runtime};

use crate::attempt::{target_of, AttemptRow, UNFINISHED};
use crate::content::payload::INBOUND_RECEIVED;
use crate::delivery::direct::{attempt_id, Direct};
use crate::delivery::worker::{message, Content};

/// The pause before a message whose fan-out failed is tried again; doubles with each
/// failure until `MAX_DELIVER`.
const RETRY: Duration = Duration::from_secs(1);
/// Batches in flight at once.
const BATCHES: usize = 4;

/// The INBOUND fan-out: what it needs.
pub struct Inbound {
    pub direct: Arc<Direct>,
}

/// A received message, parsed.
pub struct Received {
    message: Uuid,
    workspace: Uuid,
    address: Uuid,
    received_at: i64,
}

impl Received {
    fn parse(payload: &[u8]) -> Result<Self, String> {
        let event = InboundReceived::decode(payload).map_err(|e| format!("undecodable: {e}"))?;
        let id = |raw: &str, what: &str| {
            Uuid::parse_str(raw).map_err(|_| format!("{what} {raw:?} is not a uuid"))
        };
        Ok(Self {
            message: id(&event.message_id, "message_id")?,
            workspace: id(&event.workspace_id, "workspace_id")?,
            address: id(&event.address_id, "address_id")?,
            received_at: event.received_at,
        })
    }
}

/// One source of fan-outs: how its messages parse, and how a batch of them becomes
/// attempts and jobs.
pub trait Source: Send + Sync + 'static {
    /// A parsed message.
    type Item: Send + Sync + 'static;
    /// The stream read, and the durable consumer that reads it.
    const STREAM: Stream;
    const CONSUMER: &'static str;
    /// Messages fanned out together at most.
    const BATCH: usize;

    /// Parses a message; the error says why it can never be fanned out.
    fn decode(&self, payload: &[u8]) -> Result<Self::Item, String>;

    /// Writes the attempts of a batch (once) and queues their jobs; with `first` (the
    /// batch's first hand-out) their first tries are made before.
    fn fan_out(
        &self, batch: &[&Self::Item], first: bool,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// Consumes `source`'s stream until the runtime shuts down, in batches of up to its `BATCH`
/// messages, [`BATCHES`] at once; fan-outs in progress finish first. A batch unacknowledged
/// for `ack_wait` (its dispatcher died) is handed out again.
pub async fn spawn<S: Source>(rt: &Runtime, source: S, ack_wait: Duration) -> anyhow::Result<()> {
    let (ns, replicas) = (&rt.common.namespace, rt.common.stream_replicas);
    Stream::Webhook.ensure(&rt.js, ns, replicas).await?;
    let stream = S::STREAM.ensure(&rt.js, ns, replicas).await?;
    // Created, or updated to these settings (a changed ack wait takes effect on restart).
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(S::CONSUMER.into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            // Every replica's: each process holds at most BATCHES batches and its pull's.
            max_ack_pending: postmesh_shared::jetstream::ack_pending_for(S::BATCH * (BATCHES + 1)),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating the {} consumer: {e}", S::CONSUMER))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(S::BATCH)
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("pulling for {}: {e}", S::CONSUMER))?;
    let source = Arc::new(source);
    let (tracker, shutdown) = (rt.tracker.clone(), rt.shutdown.clone());
    let slots = Arc::new(Semaphore::new(BATCHES));
    let letters = rt.dead_letters();
    rt.tracker.spawn(async move {
        loop {
            // A batch is pulled only once there is room to fan it out.
            let slot = tokio::select! {
                _ = shutdown.cancelled() => break,
                s = slots.clone().acquire_owned() => s.expect("semaphore is never closed"),
            };
            // The first message to arrive, and whatever else has arrived meanwhile.
            let Some(batch) = next_batch(&mut messages, S::BATCH, &shutdown, S::CONSUMER).await
            else {
                break;
            };
            let (source, letters) = (source.clone(), letters.clone());
            // Kept in progress from here, so a batch is not handed out again while its
            // fan-out's first tries take seconds.
            tracker.spawn(async move {
                let span = tracing::info_span!("webhook.fanout", consumer = S::CONSUMER);
                telemetry::link_nats(&span, batch.iter().map(|msg| msg.headers.as_ref()));
                let work = async {
                    handle(&*source, &letters, &batch).await;
                    drop(slot);
                }
                .instrument(span);
                kept_in_progress(&batch, ack_wait / 3, work).await;
            });
        }
    });
    Ok(())
}

/// Runs `work`, telling JetStream every `every` meanwhile that `batch` is in progress.
async fn kept_in_progress(
    batch: &[jetstream::Message], every: Duration, work: impl Future<Output = ()>,
) {
    tokio::pin!(work);
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            () = &mut work => return,
            _ = progress.tick() => {
                let beats = batch.iter().map(|msg| msg.ack_with(AckKind::Progress));
                futures::future::join_all(beats).await;
            }
        }
    }
}

/// Fans a batch of messages out and acknowledges each as it went. Only a batch that
/// JetStream hands out for the first time makes first tries: one handed out again (its
/// fan-out failed, or its process died) has its new attempts written pending for the
/// worker, whose tries are counted and bounded, so a write that keeps failing cannot
/// repeat POSTs. A message that cannot be decoded, or whose fan-out panics or fails
/// `MAX_DELIVER` times, is kept aside as a dead letter.
async fn handle<S: Source>(source: &S, letters: &DeadLetters, batch: &[jetstream::Message]) {
    let mut good = Vec::with_capacity(batch.len());
    for msg in batch {
        match source.decode(&msg.payload) {
            Ok(item) => good.push((msg, item)),
            Err(reason) => {
                let fate = letters
                    .dead(msg, &format!("undecodable: {reason}"), 1)
                    .await;
                DeadLetters::settle(msg, fate).await;
            }
        }
    }
    if good.is_empty() {
        return;
    }
    let first = good
        .iter()
        .all(|(msg, _)| msg.info().is_ok_and(|info| info.delivered == 1));
    let items: Vec<&S::Item> = good.iter().map(|(_, r)| r).collect();
    let failed = match guarded(source.fan_out(&items, first)).await {
        Ok(()) => {
            futures::future::join_all(good.iter().map(|(msg, _)| msg.ack())).await;
            return;
        }
        Err(e) => e,
    };
    if let [(msg, _)] = good.as_slice() {
        DeadLetters::settle(msg, letters.failed(msg, &failed, RETRY).await).await;
        return;
    }
    // One message may spoil its batch: each is fanned out alone, so only it fails.
    tracing::warn!(error = %failed, count = good.len(), consumer = S::CONSUMER, "fan-out failed; each message alone");
    for (msg, item) in &good {
        match guarded(source.fan_out(&[item], false)).await {
            Ok(()) => drop(msg.ack().await),
            Err(e) => DeadLetters::settle(msg, letters.failed(msg, &e, RETRY).await).await,
        }
    }
}

/// A fan-out's result, a panic in it as its error.
async fn guarded(fan_out: impl Future<Output = Result<(), String>>) -> Result<(), String> {
    std::panic::AssertUnwindSafe(fan_out)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(panic_message(&*panic)))
}

/// Earlier runs' attempts of `subjects` (of `origin`) never tried, with their subjects: a
/// crash may have come before their jobs were published. (Those waiting for a retry or a
/// late answer are the scheduler's, at their `requeue_at`.)
pub(crate) async fn unfinished(
    db: &PgPool, subjects: &[Uuid], origin: &str,
) -> Result<Vec<(Uuid, Uuid)>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT id, message_id FROM attempts
         WHERE message_id = ANY($1) AND origin = $2 AND {UNFINISHED} AND attempt_count = 0"
    ))
    .bind(subjects)
    .bind(origin)
    .fetch_all(db)
    .await
}

impl Source for Inbound {
    type Item = Received;
    const STREAM: Stream = Stream::Inbound;
    const CONSUMER: &'static str = "webhook-dispatcher";
    /// Planned and written by one statement each.
    const BATCH: usize = 64;

    fn decode(&self, payload: &[u8]) -> Result<Received, String> {
        Received::parse(payload)
    }

    /// Tries each new attempt of the messages once ([`crate::delivery::direct`]), then writes the
    /// messages and the attempts, and queues what is left to the worker, earlier runs'
    /// unfinished attempts of the messages with it.
    async fn fan_out(&self, batch: &[&Received], first: bool) -> Result<(), String> {
        // Each message once (INBOUND may bring one twice).
        let mut seen = HashSet::new();
        let batch: Vec<&Received> = batch
            .iter()
            .copied()
            .filter(|m| seen.insert(m.message))
            .collect();
        let direct = &*self.direct;
        let db = &direct.state.db;
        let ids: Vec<Uuid> = batch.iter().map(|m| m.message).collect();
        let plan = new_targets();
        let (mut rows, pending) = tokio::try_join!(
            sqlx::query_as::<_, AttemptRow>(&plan)
                .bind(&ids)
                .bind(batch.iter().map(|m| m.workspace).collect::<Vec<_>>())
                .bind(batch.iter().map(|m| m.address).collect::<Vec<_>>())
                .fetch_all(db),
            unfinished(db, &ids, "inbound"),
        )
        .map_err(|e| e.to_string())?;
        for row in &mut rows {
            row.id = attempt_id(row.message_id, target_of(row));
        }
        let messages = self.messages(&batch, &rows).await;
        let tried = direct
            .try_all(rows, first, |row| {
                let message = messages.get(&row.message_id)?.clone()?;
                Some(Content::Message(message, row.message_id))
            })
            .await;
        let lease = Uuid::now_v7();
        let written = async {
            let mut tx = db.begin().await?;
            sqlx::query(
                "INSERT INTO received (message_id, workspace_id, address_id, received_at)
                 SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::bigint[])
                 ON CONFLICT DO NOTHING",
            )
            .bind(&ids)
            .bind(batch.iter().map(|m| m.workspace).collect::<Vec<_>>())
            .bind(batch.iter().map(|m| m.address).collect::<Vec<_>>())
            .bind(batch.iter().map(|m| m.received_at).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
            let made = direct.write(&mut tx, "inbound", &tried, lease).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(made)
        }
        .await;
        direct.finish(tried, written, lease, pending).await
    }
}

impl Inbound {
    /// Asks the inbound service for each message that has new attempts, all at once;
    /// `None` for one it does not answer for (its attempts are left to the worker).
    async fn messages(
        &self, batch: &[&Received], rows: &[AttemptRow],
    ) -> HashMap<Uuid, Option<Arc<InboundMessageReply>>> {
        let wanted: HashSet<Uuid> = rows.iter().map(|r| r.message_id).collect();
        let asks = batch
            .iter()
            .filter(|m| wanted.contains(&m.message))
            .map(|m| async move {
                let state = &self.direct.state;
                let max = self.direct.config.max_body_bytes;
                let found = message(state, m.workspace, m.message, max).await;
                (m.message, found.ok().flatten().map(Arc::new))
            });
        futures::future::join_all(asks).await.into_iter().collect()
    }
}

/// The active targets of each message in `$1` (workspaces `$2`, addresses `$3`) that it has
/// no attempt for yet, as attempt rows (their ids still to be made): every endpoint of its
/// address — or, when the address has none, the workspace's default webhook (spec §4.7
/// rule 2) — and every webhook of its workspace taking `inbound.received`.
fn new_targets() -> String {
    format!(
        "WITH m AS (
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[])
                 AS m(message_id, workspace_id, address_id)
         ), endpoint AS (
             SELECT m.message_id, e.id FROM m
             JOIN endpoints e ON e.address_id = m.address_id
                 AND e.workspace_id = m.workspace_id AND e.active
         ), target AS (
             SELECT message_id, id AS endpoint_id, NULL::uuid AS webhook_id FROM endpoint
             UNION ALL
             SELECT m.message_id, NULL, NULL FROM m
             JOIN default_webhooks d ON d.workspace_id = m.workspace_id AND d.active
             WHERE NOT EXISTS (SELECT 1 FROM endpoint WHERE endpoint.message_id = m.message_id)
             UNION ALL
             SELECT m.message_id, NULL, w.id FROM m
             JOIN webhooks w ON w.workspace_id = m.workspace_id AND w.active
                 AND (w.events = '{{}}' OR '{INBOUND_RECEIVED}' = ANY(w.events))
         )
         SELECT t.message_id AS id, m.workspace_id, t.endpoint_id, t.webhook_id, t.message_id,
             NULL::text AS event_type, NULL::jsonb AS event_data,
             COALESCE(e.url, w.url, d.url) AS url,
             COALESCE(e.active, w.active, d.active) AS active,
             COALESCE(e.body_format, d.body_format) AS body_format,
             COALESCE(e.strip_quotes, d.strip_quotes) AS strip_quotes,
             COALESCE(e.secret_sealed, w.secret_sealed, d.secret_sealed) AS secret_sealed,
             COALESCE(e.previous_secret_sealed, w.previous_secret_sealed,
                      d.previous_secret_sealed) AS previous_secret_sealed,
             COALESCE(e.previous_secret_until, w.previous_secret_until,
                      d.previous_secret_until) AS previous_secret_until
         FROM target t JOIN m USING (message_id)
         LEFT JOIN endpoints e ON e.id = t.endpoint_id
         LEFT JOIN webhooks w ON w.id = t.webhook_id
         LEFT JOIN default_webhooks d ON t.endpoint_id IS NULL AND t.webhook_id IS NULL
             AND d.workspace_id = m.workspace_id
         WHERE NOT EXISTS (
             SELECT 1 FROM attempts a
             WHERE a.message_id = t.message_id AND a.origin IN ('inbound', 'event')
               AND COALESCE(a.endpoint_id, a.webhook_id, a.workspace_id)
                   = COALESCE(t.endpoint_id, t.webhook_id, m.workspace_id))"
    )
}
