//! The fan-outs: each message of a source stream becomes durable attempts, one per target
//! that wants it, written in one statement per batch (at most once per target and message,
//! whatever redeliveries), then one WEBHOOK job per message of its pending attempts, then
//! the ack. A crash before the ack redelivers the message, which finds its attempts and
//! queues them again (JetStream drops the repeats by id). Two sources: INBOUND (this
//! module: each received message to every active endpoint of its address — or, when the
//! address has none, to the workspace's default webhook, spec §4.7 rule 2 — and to the
//! workspace's webhooks taking `inbound.received`) and DELIVERY (`crate::events`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, AckKind};
use futures::{FutureExt, StreamExt};
use prost::Message as _;
use sqlx::PgPool;
use tokio::sync::Semaphore;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::InboundReceived;
use postmesh_shared::{Namespace, Runtime};

use crate::deliver::{queue, UNFINISHED};
use crate::payload::INBOUND_RECEIVED;

/// Batches in flight at once.
const BATCHES: usize = 4;
/// The pause before a message that could not be fanned out is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// The INBOUND fan-out: what it needs.
pub struct Inbound {
    pub db: PgPool,
    pub js: jetstream::Context,
    pub ns: Namespace,
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

    /// Writes the attempts of a batch (once) and queues their jobs.
    fn fan_out(&self, batch: &[&Self::Item]) -> impl Future<Output = Result<(), String>> + Send;
}

/// Consumes `source`'s stream until the runtime shuts down, in batches of up to its `BATCH`
/// messages, [`BATCHES`] at once; fan-outs in progress finish first.
pub async fn spawn<S: Source>(rt: &Runtime, source: S) -> anyhow::Result<()> {
    let ns = &rt.common.namespace;
    Stream::Webhook.ensure(&rt.js, ns).await?;
    let stream = S::STREAM.ensure(&rt.js, ns).await?;
    let consumer = stream
        .get_or_create_consumer(
            S::CONSUMER,
            pull::Config {
                durable_name: Some(S::CONSUMER.into()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: (2 * S::BATCH * BATCHES) as i64,
                ..Default::default()
            },
        )
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
    rt.tracker.spawn(async move {
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                m = messages.next() => m,
            };
            let mut batch = match first {
                Some(Ok(msg)) => vec![msg],
                Some(Err(e)) => {
                    tracing::warn!(error = %e, consumer = S::CONSUMER, "pull failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                None => break,
            };
            // And whatever else has arrived meanwhile.
            while batch.len() < S::BATCH {
                match messages.next().now_or_never() {
                    Some(Some(Ok(msg))) => batch.push(msg),
                    _ => break,
                }
            }
            let slot = slots.clone().acquire_owned().await;
            let source = source.clone();
            tracker.spawn(async move {
                handle(&*source, batch).await;
                drop(slot);
            });
        }
    });
    Ok(())
}

/// Fans a batch of messages out and acknowledges each as it went.
async fn handle<S: Source>(source: &S, batch: Vec<jetstream::Message>) {
    let mut good = Vec::with_capacity(batch.len());
    for msg in batch {
        match source.decode(&msg.payload) {
            Ok(item) => good.push((msg, item)),
            Err(reason) => {
                tracing::error!(%reason, consumer = S::CONSUMER, "a message that can never be fanned out");
                let _ = msg.ack_with(AckKind::Term).await;
            }
        }
    }
    if good.is_empty() {
        return;
    }
    let items: Vec<&S::Item> = good.iter().map(|(_, r)| r).collect();
    let outcome = source.fan_out(&items).await;
    let acks = good.iter().map(|(msg, _)| async {
        match &outcome {
            Ok(()) => msg.ack().await,
            Err(_) => msg.ack_with(AckKind::Nak(Some(RETRY))).await,
        }
    });
    futures::future::join_all(acks).await;
    if let Err(e) = outcome {
        tracing::warn!(error = %e, count = good.len(), consumer = S::CONSUMER, "fan-out failed; will retry");
    }
}

/// The arbiter of the fan-outs' inserts: an attempt per subject and target, once.
pub const ONCE: &str = "(message_id, (COALESCE(endpoint_id, webhook_id, workspace_id)))
    WHERE origin IN ('inbound', 'event')";

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

impl Source for Inbound {
    type Item = Received;
    const STREAM: Stream = Stream::Inbound;
    const CONSUMER: &'static str = "webhook-dispatcher";
    /// Written by one statement.
    const BATCH: usize = 64;

    fn decode(&self, payload: &[u8]) -> Result<Received, String> {
        Received::parse(payload)
    }

    /// Writes the messages' attempts (once), then queues each message's pending ones.
    async fn fan_out(&self, batch: &[&Received]) -> Result<(), String> {
        // Each message once (INBOUND may bring one twice).
        let mut seen = HashSet::new();
        let batch: Vec<&Received> = batch
            .iter()
            .copied()
            .filter(|m| seen.insert(m.message))
            .collect();
        // One statement, so one transaction: the `received` rows, an attempt per target
        // (none again for a redelivered message), and every pending attempt of the
        // messages, new (RETURNING) or from an earlier run (the SELECT sees the table as
        // it was before the statement).
        let pending: Vec<(Uuid, Uuid)> = sqlx::query_as(&format!(
            "WITH m AS (
                 SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::bigint[])
                     AS m(message_id, workspace_id, address_id, received_at)
             ), seen AS (
                 INSERT INTO received (message_id, workspace_id, address_id, received_at)
                 SELECT message_id, workspace_id, address_id, received_at FROM m
                 ON CONFLICT DO NOTHING
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
             ), made AS (
                 INSERT INTO attempts (id, workspace_id, endpoint_id, webhook_id, message_id,
                                       origin, status, next_attempt_at, created_at, updated_at)
                 SELECT gen_random_uuid(), m.workspace_id, target.endpoint_id,
                        target.webhook_id, m.message_id, 'inbound', 'pending', $5, $5, $5
                 FROM target JOIN m USING (message_id)
                 ON CONFLICT {ONCE} DO NOTHING
                 RETURNING id, message_id
             )
             SELECT id, message_id FROM made
             UNION
             SELECT id, message_id FROM attempts
             WHERE message_id = ANY($1) AND origin = 'inbound' AND {UNFINISHED}"
        ))
        .bind(batch.iter().map(|m| m.message).collect::<Vec<_>>())
        .bind(batch.iter().map(|m| m.workspace).collect::<Vec<_>>())
        .bind(batch.iter().map(|m| m.address).collect::<Vec<_>>())
        .bind(batch.iter().map(|m| m.received_at).collect::<Vec<_>>())
        .bind(now_unix())
        .fetch_all(&self.db)
        .await
        .map_err(|e| e.to_string())?;
        queue_jobs(&self.js, &self.ns, pending).await
    }
}
