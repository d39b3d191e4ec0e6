//! The fan-out: each received message on the INBOUND stream becomes one attempt per active
//! endpoint of its address — or, when the address has none, one for the workspace's default
//! webhook (spec §4.7 rule 2) — written in one transaction (at most once per target and
//! message, whatever redeliveries), then a WEBHOOK job per pending attempt, then the ack. A
//! crash before the ack redelivers the message, which finds its attempts and queues them
//! again (JetStream drops the repeats by id).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use prost::Message as _;
use sqlx::PgPool;
use tokio::sync::Semaphore;
use tracing::Instrument;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::InboundReceived;
use postmesh_shared::{telemetry, Namespace, Runtime};

use crate::deliver::queue_jobs;

/// The durable consumer of INBOUND.
const CONSUMER: &str = "webhook-dispatcher";
/// Received messages fanned out at once.
const CONCURRENCY: usize = 32;
/// The pause before a message that could not be fanned out is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// What fanning a message out needs.
struct Fanout {
    db: PgPool,
    js: jetstream::Context,
    ns: Namespace,
}

/// A received message, parsed.
struct Received {
    message: Uuid,
    workspace: Uuid,
    address: Uuid,
    received_at: i64,
}

impl Received {
    fn decode(payload: &[u8]) -> Result<Self, String> {
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

/// Consumes INBOUND until the runtime shuts down; fan-outs in progress finish first.
pub async fn spawn(rt: &Runtime) -> anyhow::Result<()> {
    let ns = &rt.common.namespace;
    Stream::Webhook.ensure(&rt.js, ns).await?;
    let stream = Stream::Inbound.ensure(&rt.js, ns).await?;
    let consumer = stream
        .get_or_create_consumer(
            CONSUMER,
            pull::Config {
                durable_name: Some(CONSUMER.into()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 4 * CONCURRENCY as i64,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("creating the INBOUND consumer: {e}"))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(CONCURRENCY)
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("pulling from INBOUND: {e}"))?;
    let fanout = Arc::new(Fanout {
        db: rt.db.clone(),
        js: rt.js.clone(),
        ns: ns.clone(),
    });
    let (tracker, shutdown) = (rt.tracker.clone(), rt.shutdown.clone());
    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    rt.tracker.spawn(async move {
        loop {
            let msg = tokio::select! {
                _ = shutdown.cancelled() => break,
                m = messages.next() => m,
            };
            match msg {
                Some(Ok(msg)) => {
                    let slot = slots.clone().acquire_owned().await;
                    let fanout = fanout.clone();
                    tracker.spawn(async move {
                        fanout.handle(msg).await;
                        drop(slot);
                    });
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "INBOUND pull failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                None => break,
            }
        }
    });
    Ok(())
}

impl Fanout {
    async fn handle(&self, msg: jetstream::Message) {
        let span = tracing::info_span!("webhook.fanout", message = tracing::field::Empty);
        telemetry::link_nats(&span, msg.headers.as_ref());
        async {
            let received = match Received::decode(&msg.payload) {
                Ok(received) => received,
                Err(reason) => {
                    tracing::error!(%reason, "an INBOUND message that can never be fanned out");
                    let _ = msg.ack_with(AckKind::Term).await;
                    return;
                }
            };
            tracing::Span::current().record("message", received.message.to_string());
            match self.fan_out(&received).await {
                Ok(()) => {
                    let _ = msg.ack().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fan-out failed; will retry");
                    let _ = msg.ack_with(AckKind::Nak(Some(RETRY))).await;
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Writes the message's attempts (once), then queues each that is still pending.
    async fn fan_out(&self, m: &Received) -> Result<(), String> {
        let now = now_unix();
        let mut tx = self.db.begin().await.map_err(|e| e.to_string())?;
        sqlx::query(
            "INSERT INTO received (message_id, workspace_id, address_id, received_at)
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(m.message)
        .bind(m.workspace)
        .bind(m.address)
        .bind(m.received_at)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        sqlx::query(
            "WITH endpoint AS (
                 SELECT id FROM endpoints
                 WHERE address_id = $3 AND workspace_id = $2 AND active
             ), target AS (
                 SELECT id FROM endpoint
                 UNION ALL
                 SELECT NULL::uuid FROM default_webhooks
                 WHERE workspace_id = $2 AND active AND NOT EXISTS (SELECT 1 FROM endpoint)
             )
             INSERT INTO attempts (id, workspace_id, endpoint_id, message_id, origin, status,
                                   next_attempt_at, created_at, updated_at)
             SELECT gen_random_uuid(), $2, target.id, $1, 'inbound', 'pending', $4, $4, $4
             FROM target
             ON CONFLICT DO NOTHING",
        )
        .bind(m.message)
        .bind(m.workspace)
        .bind(m.address)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let pending: Vec<(Uuid, i32)> = sqlx::query_as(
            "SELECT id, attempt_count FROM attempts
             WHERE message_id = $1 AND origin = 'inbound' AND status = 'pending'",
        )
        .bind(m.message)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        queue_jobs(&self.js, &self.ns, &pending)
            .await
            .map_err(|e| e.to_string())
    }
}
