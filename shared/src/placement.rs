//! Declaring JetStream streams and buckets on a cluster that cannot place them yet: a
//! service's start tries again for a while rather than exit.

use std::time::Duration;

/// How long a start waits for JetStream to place what it declares: a cluster that has just
/// formed, or has lost a node, answers "no suitable peers" until it knows enough of them.
const PLACEMENT_WAIT: Duration = Duration::from_secs(60);

/// Runs `declare` (a stream's or bucket's creation) until it succeeds, again after a pause
/// while JetStream cannot place it yet ([`placement_pending`]), for at most [`PLACEMENT_WAIT`].
pub async fn until_placed<T, E, F, Fut>(what: &str, mut declare: F) -> anyhow::Result<T>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + PLACEMENT_WAIT;
    let mut pause = Duration::from_millis(200);
    loop {
        match declare().await {
            Ok(made) => return Ok(made),
            Err(e) if placement_pending(&e) && tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(what, error = %e, "JetStream cannot place it yet; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(anyhow::anyhow!("creating {what}: {e}")),
        }
    }
}

/// Whether `err`, or an error it wraps, is a stream creation the cluster may accept shortly:
/// no peers to place it on yet, no meta leader, or no answer in time.
fn placement_pending(err: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind as Kind};
    use async_nats::jetstream::ErrorCode;
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(e) = e.downcast_ref::<CreateStreamError>() {
            return match e.kind() {
                Kind::TimedOut | Kind::JetStreamUnavailable => true,
                Kind::JetStream(e) => [
                    ErrorCode::CLUSTER_NO_PEERS,
                    ErrorCode::CLUSTER_NOT_AVAILABLE,
                    ErrorCode::CLUSTER_INCOMPLETE,
                ]
                .contains(&e.error_code()),
                _ => false,
            };
        }
        cause = e.source();
    }
    false
}
