//! The transactional outbox: a message is written to the service's `outbox` table in the
//! same transaction as the change it announces, so it exists exactly when that change does.
//! It is published only once that transaction has committed: at once by the caller
//! ([`Outbox::publish_now`]), or by the relay ([`Outbox::relay_once`]) when that failed or
//! the process died first. Publishing uses `Nats-Msg-Id` = the row id, so a message published
//! twice (published, then a crash before it was marked) is dropped by JetStream. Policy:
//! docs/decisions.md, "Outbox".

use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::db::now_unix;
use crate::error::ApiError;
use crate::nats::{current_request_id, outgoing_headers, REQUEST_ID};

/// Rows one relay pass publishes at most.
pub const RELAY_BATCH: usize = 100;
/// How long published rows are kept (for inspection) before the relay deletes them.
const KEEP_PUBLISHED: Duration = Duration::from_secs(24 * 3600);

/// A message to publish once the transaction that writes it commits.
pub struct OutboxMessage {
    /// Its `Nats-Msg-Id`: the same message written twice is published once.
    pub id: Uuid,
    pub subject: String,
    pub payload: Bytes,
}

/// Writes `msg` in the caller's transaction, with the trace context of the work in progress.
pub async fn enqueue(tx: &mut PgConnection, msg: &OutboxMessage) -> Result<(), sqlx::Error> {
    enqueue_many(tx, &msg.subject, &[(msg.id, msg.payload.to_vec())]).await
}

/// Writes many messages on one `subject` in the caller's transaction, in one statement
/// (`(id, payload)` pairs, published in this order), with the trace context of the work in
/// progress.
pub async fn enqueue_many(
    tx: &mut PgConnection, subject: &str, messages: &[(Uuid, Vec<u8>)],
) -> Result<(), sqlx::Error> {
    if messages.is_empty() {
        return Ok(());
    }
    let traceparent = outgoing_headers().get("traceparent").map(|v| v.to_string());
    let (ids, payloads): (Vec<Uuid>, Vec<Vec<u8>>) = messages.iter().cloned().unzip();
    sqlx::query(
        "INSERT INTO outbox (id, subject, payload, traceparent, request_id, created_at)
         SELECT m.id, $3, m.payload, $4, $5, $6
         FROM UNNEST($1::uuid[], $2::bytea[]) WITH ORDINALITY AS m(id, payload, n)
         ORDER BY m.n",
    )
    .bind(&ids)
    .bind(&payloads)
    .bind(subject)
    .bind(traceparent)
    .bind(current_request_id())
    .bind(now_unix())
    .execute(tx)
    .await
    .map(drop)
}

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    subject: String,
    payload: Vec<u8>,
    traceparent: Option<String>,
    request_id: Option<String>,
}

/// Publishes a service's outbox.
#[derive(Clone)]
pub struct Outbox {
    db: PgPool,
    js: jetstream::Context,
}

impl Outbox {
    /// The outbox in `db`, published through `js`.
    pub fn new(db: PgPool, js: jetstream::Context) -> Self {
        Self { db, js }
    }

    /// Publishes the committed message `id` now, unless it is published already. The row
    /// lock makes a relay working on it at the same moment wait, or this wait for it.
    pub async fn publish_now(&self, id: Uuid) -> Result<(), ApiError> {
        let mut tx = self.db.begin().await?;
        let row: Option<Row> = sqlx::query_as(
            "SELECT id, subject, payload, traceparent, request_id FROM outbox
             WHERE id = $1 AND published_at IS NULL FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = row {
            // Roll back before answering: a dropped transaction keeps the row locked until
            // its connection is next used, and a relay would skip the row meanwhile.
            if let Err(e) = self.publish(row).await {
                tx.rollback().await?;
                return Err(e);
            }
            mark_published(&mut tx, &[id]).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Takes back a message that was not published: true when it never will be, false when
    /// it already was (or is being published right now, in which case this waits for it).
    pub async fn withdraw(&self, id: Uuid) -> Result<bool, sqlx::Error> {
        let deleted = sqlx::query("DELETE FROM outbox WHERE id = $1 AND published_at IS NULL")
            .bind(id)
            .execute(&self.db)
            .await?;
        Ok(deleted.rows_affected() == 1)
    }

    /// Publishes up to [`RELAY_BATCH`] waiting messages, oldest first, and deletes long
    /// published ones; true when more may be waiting. Relays of several replicas take
    /// different rows (`SKIP LOCKED`). A message whose publish failed stays waiting for the
    /// next pass, unless it never can be published (larger than NATS carries): that one is
    /// logged and dropped, so it cannot hold up every later message.
    pub async fn relay_once(&self) -> Result<bool, ApiError> {
        let mut tx = self.db.begin().await?;
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, subject, payload, traceparent, request_id FROM outbox
             WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(RELAY_BATCH as i64)
        .fetch_all(&mut *tx)
        .await?;
        let full = rows.len() == RELAY_BATCH;
        // Every message of the batch is sent before any acknowledgement is awaited, so a
        // batch costs about one round trip; a message counts as published once JetStream
        // has acknowledged it.
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let acks = futures::future::join_all(rows.into_iter().map(|row| self.publish(row))).await;
        let mut published = Vec::with_capacity(ids.len());
        let (mut refused, mut failed) = (Vec::new(), None);
        for (id, ack) in ids.into_iter().zip(acks) {
            match ack {
                Ok(()) => published.push(id),
                Err(ApiError::PayloadTooLarge(why)) => {
                    tracing::error!(%id, %why, "an outbox message NATS can never carry is dropped");
                    refused.push(id);
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        mark_published(&mut tx, &published).await?;
        if !refused.is_empty() {
            metrics::counter!("postmesh_outbox_refused_total").increment(refused.len() as u64);
            sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
                .bind(&refused)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if !published.is_empty() {
            metrics::counter!("postmesh_outbox_relayed_total").increment(published.len() as u64);
        }
        sqlx::query(
            "DELETE FROM outbox WHERE id IN (
                 SELECT id FROM outbox WHERE published_at < $1 LIMIT $2)",
        )
        .bind(now_unix() - KEEP_PUBLISHED.as_secs() as i64)
        .bind(RELAY_BATCH as i64 * 10)
        .execute(&self.db)
        .await?;
        match failed {
            Some(e) => Err(e),
            None => Ok(full),
        }
    }

    /// Publishes one row with its id as `Nats-Msg-Id` and its recorded trace context.
    async fn publish(&self, row: Row) -> Result<(), ApiError> {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(tp) = &row.traceparent {
            headers.insert("traceparent", tp.as_str());
        }
        if let Some(id) = &row.request_id {
            headers.insert(REQUEST_ID, id.as_str());
        }
        super::publish_with(
            &self.js,
            row.subject,
            headers,
            &row.id.to_string(),
            row.payload.into(),
        )
        .await
    }
}

async fn mark_published(tx: &mut PgConnection, ids: &[Uuid]) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("UPDATE outbox SET published_at = $2 WHERE id = ANY($1)")
        .bind(ids)
        .bind(now_unix())
        .execute(tx)
        .await
        .map(drop)
}
