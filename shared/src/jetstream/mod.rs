//! The JetStream streams of DESIGN §3, declared in one table, publishing with
//! de-duplication ids, and the transactional [`outbox`] that feeds them.

pub mod outbox;

use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::stream::{self, RetentionPolicy};
use async_nats::jetstream::{self};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::nats::outgoing_headers;
use crate::Namespace;

/// One of the system's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Messages to deliver; sender workers take each once.
    Send,
    /// Mail received for a workspace; the webhook dispatcher fans it out.
    Inbound,
    /// Signed webhook POSTs to make; dispatcher workers take each once.
    Webhook,
    /// Workflow events; the sender triggers and exits workflows.
    Events,
    /// Delivery outcomes; sender stats and delivery webhooks read them.
    Delivery,
    /// Opens and clicks the gateway saw; the sender records each.
    Tracking,
}

/// How a stream is declared.
struct Spec {
    stream: Stream,
    name: &'static str,
    /// Subject filter below the namespace.
    subjects: &'static str,
    retention: RetentionPolicy,
}

/// The streams of DESIGN §3.
const STREAMS: [Spec; 6] = [
    Spec {
        stream: Stream::Send,
        name: "SEND",
        subjects: "send.deliver",
        retention: RetentionPolicy::WorkQueue,
    },
    Spec {
        stream: Stream::Inbound,
        name: "INBOUND",
        subjects: "inbound.received",
        retention: RetentionPolicy::Limits,
    },
    Spec {
        stream: Stream::Webhook,
        name: "WEBHOOK",
        subjects: "webhook.deliver",
        retention: RetentionPolicy::WorkQueue,
    },
    Spec {
        stream: Stream::Events,
        name: "EVENTS",
        subjects: "events.>",
        retention: RetentionPolicy::Limits,
    },
    Spec {
        stream: Stream::Delivery,
        name: "DELIVERY",
        subjects: "delivery.>",
        retention: RetentionPolicy::Limits,
    },
    Spec {
        stream: Stream::Tracking,
        name: "TRACKING",
        subjects: "tracking.hits",
        retention: RetentionPolicy::WorkQueue,
    },
];

/// How long a stream keeps a message nobody took.
const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The window in which a repeated `Nats-Msg-Id` is dropped.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The `max_ack_pending` of a durable consumer whose every process takes at most `per_process`
/// messages unacknowledged (it pulls only what it has room for): room for eight replicas.
/// A cap of one process's worth would be shared by all of them, so a second replica would
/// add no work in flight and only split it (the scale bench: two dispatchers delivered
/// webhooks at 0.3-0.45 times one's rate).
pub fn ack_pending_for(per_process: usize) -> i64 {
    const REPLICAS_ROOM: i64 = 8;
    i64::try_from(per_process).unwrap_or(i64::MAX / REPLICAS_ROOM) * REPLICAS_ROOM
}

impl Stream {
    /// Every stream.
    pub const ALL: [Stream; 6] = [
        Stream::Send,
        Stream::Inbound,
        Stream::Webhook,
        Stream::Events,
        Stream::Delivery,
        Stream::Tracking,
    ];

    fn spec(self) -> &'static Spec {
        STREAMS
            .iter()
            .find(|s| s.stream == self)
            .expect("every stream is in the table")
    }

    /// `{ns}_{NAME}`: the stream's name in JetStream.
    pub fn name(self, ns: &Namespace) -> String {
        ns.stream(self.spec().name)
    }

    /// `{ns}.{subjects}`: the subjects the stream captures (for a single-subject stream, the
    /// subject to publish on).
    pub fn subject(self, ns: &Namespace) -> String {
        ns.subject(self.spec().subjects)
    }

    /// Creates the stream with `replicas` unless it exists; returns it. An existing stream
    /// keeps its replicas, with a warning when they differ (see `docs/decisions.md`).
    pub async fn ensure(
        self, js: &jetstream::Context, ns: &Namespace, replicas: usize,
    ) -> anyhow::Result<stream::Stream> {
        let spec = self.spec();
        let name = self.name(ns);
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![self.subject(ns)],
            retention: spec.retention,
            storage: stream::StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
            max_age: MAX_AGE,
            num_replicas: replicas,
            ..Default::default()
        };
        let mut stream =
            crate::placement::until_placed(&name, || js.get_or_create_stream(config.clone()))
                .await?;
        let has = stream.info().await?.config.num_replicas;
        if has != replicas {
            tracing::warn!(stream = %name, has, wanted = replicas, "the stream keeps the replicas it has: raising them in place lost acknowledged messages when a leader died after (docs/decisions.md)");
        }
        Ok(stream)
    }
}

/// Creates every stream of the namespace that does not exist yet, each with `replicas`.
pub async fn ensure_streams(
    js: &jetstream::Context, ns: &Namespace, replicas: usize,
) -> anyhow::Result<()> {
    for stream in Stream::ALL {
        stream.ensure(js, ns, replicas).await?;
    }
    Ok(())
}

/// Publishes `payload` and waits until JetStream has stored it (503 when it cannot: NATS
/// down, or a stream not yet recovered after a restart). `msg_id` makes a retried
/// publish a no-op inside the duplicate window.
pub async fn publish(
    js: &jetstream::Context, subject: String, msg_id: &str, payload: Bytes,
) -> Result<(), ApiError> {
    publish_with(js, subject, outgoing_headers(), msg_id, payload).await
}

/// [`publish`] with the given trace headers.
async fn publish_with(
    js: &jetstream::Context, subject: String, mut headers: async_nats::HeaderMap, msg_id: &str,
    payload: Bytes,
) -> Result<(), ApiError> {
    headers.insert("Nats-Msg-Id", msg_id);
    let ack = js
        .publish_with_headers(subject, headers, payload)
        .await
        .map_err(|e| match e.kind() {
            // Never carried, however often tried.
            jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                ApiError::PayloadTooLarge(format!("the message is larger than NATS carries: {e}"))
            }
            _ => ApiError::unavailable("could not queue the message", e),
        })?;
    let ack = ack
        .await
        .map_err(|e| ApiError::unavailable("the message queue did not confirm", e))?;
    confirmed(&ack, msg_id)
}

/// What is logged when JetStream answers a publish as a duplicate of sequence 0.
pub const UNSTORED: &str = "JetStream answered a duplicate of sequence 0: not stored yet";

/// Whether `ack` confirms a stored message. A duplicate of sequence 0 does not: a clustered
/// stream's leader (nats-server 2.10) records a message id before the message is committed
/// and answers a retry of that id so, and the message is never stored if its proposal dies
/// with a leader that is killed or cut off. The publish is retried until the id is either
/// stored (a duplicate with its sequence) or forgotten (the duplicate window), and published.
fn confirmed(ack: &jetstream::publish::PublishAck, msg_id: &str) -> Result<(), ApiError> {
    if ack.duplicate && ack.sequence == 0 {
        tracing::warn!(msg_id, stream = %ack.stream, "{UNSTORED}");
        return Err(ApiError::Unavailable(
            "the message queue has not stored the message yet; retry shortly".into(),
        ));
    }
    Ok(())
}

/// The next batch `messages` hands out: the first to arrive, then whatever else has arrived
/// meanwhile, up to `max` in all; `None` once `shutdown` is cancelled or the pull ends. A
/// failed pull is logged and pulled again after a pause.
pub async fn next_batch(
    messages: &mut pull::Stream, max: usize, shutdown: &CancellationToken, consumer: &str,
) -> Option<Vec<jetstream::Message>> {
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return None,
            m = messages.next() => m?,
        };
        match first {
            Ok(msg) => {
                let mut batch = vec![msg];
                while batch.len() < max {
                    match messages.next().now_or_never() {
                        Some(Some(Ok(msg))) => batch.push(msg),
                        _ => break,
                    }
                }
                return Some(batch);
            }
            Err(e) => {
                tracing::warn!(error = %e, consumer, "pull failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_stream_once() {
        let ns = Namespace::parse("pm").unwrap();
        let names: Vec<String> = Stream::ALL.iter().map(|s| s.name(&ns)).collect();
        assert_eq!(
            names,
            [
                "pm_SEND",
                "pm_INBOUND",
                "pm_WEBHOOK",
                "pm_EVENTS",
                "pm_DELIVERY",
                "pm_TRACKING"
            ]
        );
        assert_eq!(Stream::Send.subject(&ns), "pm.send.deliver");
        assert_eq!(Stream::Events.subject(&ns), "pm.events.>");
        assert_eq!(Stream::Tracking.subject(&ns), "pm.tracking.hits");
    }

    /// A publish JetStream does not store (here: no stream takes the subject, as for a
    /// moment after a NATS restart) is 503, so the caller retries.
    #[tokio::test]
    async fn a_publish_no_stream_stores_is_503() {
        // Postmesh's NATS as its operator, who may publish anywhere (`deploy/nats.conf`).
        let nats =
            async_nats::ConnectOptions::with_user_and_password("ops".into(), "dev-ops".into())
                .connect(crate::nats::servers(&crate::config::NATS_URL.string()).unwrap())
                .await
                .expect("NATS");
        let js = jetstream::new(nats);
        let subject = format!("nostream{}.send.deliver", uuid::Uuid::now_v7().simple());
        let e = publish(&js, subject, "m1", Bytes::from_static(b"x"))
            .await
            .expect_err("nothing stores it");
        assert_eq!(e.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    }
}
