//! JetStream streams of the work queues, and publishing with de-duplication ids.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use bytes::Bytes;

use crate::config::Namespace;
use crate::error::ApiError;
use crate::nats::outgoing_headers;

/// Subject of delivery jobs.
pub fn send_subject(ns: &Namespace) -> String {
    ns.subject("send.deliver")
}

/// Creates (or finds) the SEND work-queue stream: one consumer takes each job once.
pub async fn send_stream(
    js: &jetstream::Context,
    ns: &Namespace,
) -> anyhow::Result<stream::Stream> {
    js.get_or_create_stream(stream::Config {
        name: ns.stream("SEND"),
        subjects: vec![send_subject(ns)],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        max_age: Duration::from_secs(7 * 24 * 3600),
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("creating stream {}: {e}", ns.stream("SEND")))
}

/// Publishes `payload` and waits until JetStream has stored it. `msg_id` makes a retried
/// publish a no-op inside the duplicate window.
pub async fn publish(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    payload: Bytes,
) -> Result<(), ApiError> {
    let mut headers = outgoing_headers();
    headers.insert("Nats-Msg-Id", msg_id);
    let ack = js
        .publish_with_headers(subject, headers, payload)
        .await
        .map_err(|e| ApiError::internal("could not queue the message", e))?;
    ack.await
        .map_err(|e| ApiError::internal("the message queue did not confirm", e))?;
    Ok(())
}
