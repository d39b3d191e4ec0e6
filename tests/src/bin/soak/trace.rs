//! Where a message the soak found missing got to: its rows in the services' tables, its
//! places in the JetStream stream it travels on, and that stream's durable consumers, so
//! that a loss can be told from a late delivery and pinned to one hop.

use std::collections::{HashMap, HashSet};

use prost::Message as _;
use uuid::Uuid;

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{send_job, InboundReceived, SendJob};

use super::Report;

/// A received message's outbox row, as the soak traces a lost one.
#[derive(sqlx::FromRow)]
struct InboundTrace {
    id: Uuid,
    message_id: String,
    seq: Option<i64>,
    created: Option<i64>,
    published: Option<i64>,
}

/// A stored send's message to one recipient, with its delivery row, as the soak traces one
/// that never arrived.
#[derive(sqlx::FromRow)]
struct SendTrace {
    task: Uuid,
    task_status: String,
    created: i64,
    released: Option<i64>,
    delivery: Uuid,
    email: String,
    status: Option<String>,
    attempts: Option<i32>,
    last_error: Option<String>,
    leased_until_ms: Option<i64>,
    updated: Option<i64>,
}

/// A SEND job's outbox row.
#[derive(sqlx::FromRow)]
struct JobRow {
    id: Uuid,
    seq: i64,
    created_at: i64,
    published_at: Option<i64>,
    payload: Vec<u8>,
}

/// The delivery ids a SEND job's payload carries.
fn deliveries_of(payload: &[u8]) -> Vec<Uuid> {
    match SendJob::decode(payload).ok().and_then(|j| j.body) {
        Some(send_job::Body::Slice(slice)) => slice
            .recipients
            .iter()
            .filter_map(|r| r.delivery_id.parse().ok())
            .collect(),
        Some(send_job::Body::Code(_)) | None => Vec::new(),
    }
}

/// The message id an INBOUND event's payload carries.
fn message_of(payload: &[u8]) -> Vec<Uuid> {
    InboundReceived::decode(payload)
        .ok()
        .and_then(|e| e.message_id.parse().ok())
        .into_iter()
        .collect()
}

impl Report<'_> {
    /// Prints where each of the `missing` messages (by Message-ID) got to on its way to the
    /// receivers: its outbox row, its place in INBOUND, the dispatcher's record of it, and
    /// the INBOUND consumer's state.
    pub(super) async fn trace_inbound(&self, missing: &[&str]) {
        let ingest = self.stack.service_db(inbound_ingest::SERVICE).await;
        let rows: Vec<InboundTrace> = sqlx::query_as(
            "SELECT m.id, m.message_id, o.seq, o.created_at AS created,
                     o.published_at AS published
                 FROM messages m LEFT JOIN outbox o ON o.id = m.id
                 WHERE m.message_id = ANY($1)",
        )
        .bind(missing)
        .fetch_all(&ingest)
        .await
        .expect("the missing messages' outbox rows");
        let dispatcher = self.stack.service_db(webhook_dispatcher::SERVICE).await;
        let ids: HashSet<Uuid> = rows.iter().map(|r| r.id).collect();
        let in_stream = self.sequences(Stream::Inbound, &ids, message_of).await;
        for InboundTrace {
            id,
            message_id,
            seq,
            created,
            published,
        } in &rows
        {
            let (received, attempts): (bool, Vec<String>) = (
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM received WHERE message_id = $1)")
                    .bind(id)
                    .fetch_one(&dispatcher)
                    .await
                    .expect("received"),
                sqlx::query_scalar("SELECT status FROM attempts WHERE message_id = $1")
                    .bind(id)
                    .fetch_all(&dispatcher)
                    .await
                    .expect("attempts"),
            );
            eprintln!(
                "soak: inbound: missing {message_id} ({id}): outbox seq {seq:?} created {created:?} published {published:?}; INBOUND sequences {:?}; dispatcher received {received}, attempts {attempts:?}",
                in_stream.get(id)
            );
        }
        self.consumers(Stream::Inbound).await;
    }

    /// Prints where the stored sends to each of the `missing` addresses got to: the task,
    /// the outbox row of the SEND job that carries the message, the job's places in SEND, the
    /// message's delivery row and events, and the SEND consumer's state.
    pub(super) async fn trace_sends(&self, missing: &[&str]) {
        let db = self.stack.sender_db().await;
        let rows: Vec<SendTrace> = sqlx::query_as(
            "SELECT t.id AS task, t.status AS task_status, t.created_at AS created,
                    t.released_at AS released, r.delivery_id AS delivery, r.email,
                    d.status, d.attempts, d.last_error, d.leased_until_ms,
                    d.updated_at AS updated
                 FROM task_recipients r JOIN tasks t ON t.id = r.task_id
                 LEFT JOIN deliveries d ON d.delivery_id = r.delivery_id
                 WHERE lower(r.email) = ANY($1)",
        )
        .bind(missing)
        .fetch_all(&db)
        .await
        .expect("the missing sends' rows");
        let subject = Stream::Send.subject(self.stack.ns());
        let jobs: Vec<JobRow> = sqlx::query_as(
            "SELECT id, seq, created_at, published_at, payload FROM outbox WHERE subject = $1",
        )
        .bind(&subject)
        .fetch_all(&db)
        .await
        .expect("the SEND outbox rows");
        let deliveries: HashSet<Uuid> = rows.iter().map(|r| r.delivery).collect();
        let in_stream = self
            .sequences(Stream::Send, &deliveries, deliveries_of)
            .await;
        for r in &rows {
            let job = jobs
                .iter()
                .find(|j| deliveries_of(&j.payload).contains(&r.delivery))
                .map(|j| {
                    format!(
                        "job {} outbox seq {} created {} published {:?}",
                        j.id, j.seq, j.created_at, j.published_at
                    )
                })
                .unwrap_or_else(|| "no outbox row".to_owned());
            let events: Vec<String> = sqlx::query_scalar(
                "SELECT kind FROM delivery_events WHERE delivery_id = $1 ORDER BY occurred_at",
            )
            .bind(r.delivery)
            .fetch_all(&db)
            .await
            .expect("delivery events");
            eprintln!(
                "soak: sends: missing {} (delivery {}): task {} {} created {} released {:?}; {job}; SEND sequences {:?}; delivery row status {:?} attempts {:?} last error {:?} leased until {:?} updated {:?}; events {events:?}",
                r.email,
                r.delivery,
                r.task,
                r.task_status,
                r.created,
                r.released,
                in_stream.get(&r.delivery),
                r.status,
                r.attempts,
                r.last_error,
                r.leased_until_ms,
                r.updated
            );
        }
        self.consumers(Stream::Send).await;
    }

    /// Prints the state of `stream`'s durable consumers.
    async fn consumers(&self, stream: Stream) {
        let js = self.stack.jetstream().await;
        let name = stream.name(self.stack.ns());
        let Ok(stream) = js.get_stream(&name).await else {
            eprintln!("soak: {name} cannot be read");
            return;
        };
        let mut consumers = stream.consumers();
        while let Some(Ok(info)) = futures::StreamExt::next(&mut consumers).await {
            if info.config.durable_name.is_none() {
                continue;
            }
            eprintln!(
                "soak: {name}: consumer {}: delivered stream seq {}, ack floor {}, {} pending, {} unacknowledged, {} redelivered",
                info.name,
                info.delivered.stream_sequence,
                info.ack_floor.stream_sequence,
                info.num_pending,
                info.num_ack_pending,
                info.num_redelivered
            );
        }
    }

    /// The sequences of `stream` whose messages carry any of `ids` (read from a payload by
    /// `carried`), each message read by its sequence (a work queue has no room for a second
    /// consumer, and reading takes nothing from the stream).
    async fn sequences(
        &self, stream: Stream, ids: &HashSet<Uuid>, carried: fn(&[u8]) -> Vec<Uuid>,
    ) -> HashMap<Uuid, Vec<u64>> {
        let js = self.stack.jetstream().await;
        let name = stream.name(self.stack.ns());
        let mut found: HashMap<Uuid, Vec<u64>> = HashMap::new();
        let Ok(mut stream) = js.get_stream(&name).await else {
            eprintln!("soak: {name} cannot be read");
            return found;
        };
        let Ok(state) = stream.info().await.map(|i| i.state.clone()) else {
            eprintln!("soak: {name} cannot be read");
            return found;
        };
        eprintln!(
            "soak: {name}: {} messages, sequences {} to {}",
            state.messages, state.first_sequence, state.last_sequence
        );
        // A message gone from the stream (acknowledged off a work queue) is not found.
        for seq in state.first_sequence..=state.last_sequence {
            let Ok(msg) = stream.get_raw_message(seq).await else {
                continue;
            };
            for id in carried(&msg.payload)
                .into_iter()
                .filter(|i| ids.contains(i))
            {
                found.entry(id).or_default().push(seq);
            }
        }
        found
    }
}
