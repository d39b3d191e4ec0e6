//! The stack's JetStream streams as the operator sees them: for a test that checks what a
//! service published, or resets a consumer.

use std::time::Duration;

use async_nats::jetstream::consumer;
use futures::StreamExt;

use postmesh_shared::jetstream::Stream;

use super::Stack;

/// The most messages [`Stack::stream_messages`] reads.
const MAX_MESSAGES: usize = 1000;

impl Stack {
    /// JetStream as the operator's NATS user (every subject).
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let client = crate::ops_nats(&self.common.nats_url)
            .await
            .expect("the operator's NATS connection");
        async_nats::jetstream::new(client)
    }

    /// The durable consumers of the namespace's `stream` as the server sees them now.
    async fn consumers(&self, stream: Stream) -> Result<Vec<consumer::Info>, String> {
        let stream = self
            .jetstream()
            .await
            .get_stream(stream.name(self.ns()))
            .await
            .map_err(|e| e.to_string())?;
        let mut all = Vec::new();
        let mut consumers = stream.consumers();
        while let Some(info) = consumers.next().await {
            let info = info.map_err(|e| e.to_string())?;
            if info.config.durable_name.is_some() {
                all.push(info);
            }
        }
        Ok(all)
    }

    /// Waits until every durable consumer of each of `streams` has handed out every message
    /// and had each acknowledged: what those messages make (a webhook's POST, a delivery) is
    /// done, so nothing more comes of what was published before — the proof that a
    /// duplicate did not come, without a quiet window.
    pub async fn handled(&self, streams: &[Stream]) {
        crate::eventually(Duration::from_secs(30), || async {
            for stream in streams {
                for info in self.consumers(*stream).await? {
                    if info.num_pending > 0 || info.num_ack_pending > 0 {
                        return Err(format!(
                            "{}: {} not handed out, {} not acknowledged",
                            info.name, info.num_pending, info.num_ack_pending
                        ));
                    }
                }
            }
            Ok::<_, String>(())
        })
        .await
    }

    /// Waits until the gateway's and the sender's outboxes have published everything and
    /// SEND's consumer has acknowledged every job: every email asked for so far has been
    /// delivered or given up, so none of them can still arrive.
    pub async fn sends_done(&self) {
        for service in [api_gateway::SERVICE, sender::SERVICE] {
            let db = self.service_db(service).await;
            crate::eventually(Duration::from_secs(30), || async {
                match crate::peek::kit::unpublished(&db).await {
                    0 => Ok(()),
                    n => Err(format!("{n} unpublished in {}", service.name())),
                }
            })
            .await;
        }
        self.handled(&[Stream::Send]).await;
    }

    /// How many messages the namespace's `stream` holds now.
    pub async fn waiting(&self, stream: Stream) -> u64 {
        let mut stream = self
            .jetstream()
            .await
            .get_stream(stream.name(self.ns()))
            .await
            .expect("the stream");
        stream
            .info()
            .await
            .expect("the stream's state")
            .state
            .messages
    }

    /// How many times the durable consumers of `stream` have handed a message out, first
    /// deliveries and redeliveries together.
    pub async fn handed_out(&self, stream: Stream) -> u64 {
        let consumers = self
            .consumers(stream)
            .await
            .expect("the stream's consumers");
        consumers
            .iter()
            .map(|c| c.delivered.consumer_sequence)
            .sum()
    }

    /// Every message now in the namespace's `stream` (at most 1,000), oldest first, read by a
    /// consumer of its own: each one's subject and payload.
    pub async fn stream_messages(&self, stream: Stream) -> Vec<(String, bytes::Bytes)> {
        let consumer = self
            .jetstream()
            .await
            .get_stream(stream.name(self.ns()))
            .await
            .expect("the stream")
            .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
            .await
            .expect("a consumer");
        let mut batch = consumer
            .fetch()
            .max_messages(MAX_MESSAGES)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .expect("a fetch");
        let mut all = Vec::new();
        while let Some(Ok(msg)) = batch.next().await {
            all.push((msg.subject.to_string(), msg.payload.clone()));
        }
        all
    }
}
