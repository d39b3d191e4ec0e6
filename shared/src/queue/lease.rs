//! Leases on the database's clock and the heartbeat that keeps them (and the job's ack
//! deadline) alive while a job is worked on.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

/// The database's clock in milliseconds, for a service's lease SQL: leases are set and
/// compared on one clock, whatever the clocks of the worker hosts say.
pub const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Milliseconds a lease lasts: as long as JetStream's ack deadline.
pub fn lease_ms(ack_wait: Duration) -> i64 {
    i64::try_from(ack_wait.as_millis()).unwrap_or(i64::MAX / 2)
}

/// Runs `work`, and every half `ack_wait` renews the job's leases (`renew`) and extends
/// its ack deadline, each call bounded: a stuck NATS connection must not hold up the lease
/// renewal that covers for it.
pub(super) async fn with_heartbeat<T, R, F>(
    msg: &jetstream::Message, ack_wait: Duration, renew: R, work: impl Future<Output = T>,
) -> T
where
    R: Fn() -> F,
    F: Future<Output = Result<(), super::StageError>>,
{
    tokio::pin!(work);
    let period = (ack_wait / 2).max(Duration::from_millis(100));
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = beat.tick() => {
                let bound = period / 2;
                match tokio::time::timeout(bound, renew()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not renew the job's leases"),
                    Err(_) => tracing::warn!("renewing the job's leases timed out"),
                }
                match tokio::time::timeout(bound, msg.ack_with(AckKind::Progress)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not extend the job's ack deadline"),
                    Err(_) => tracing::warn!("extending the job's ack deadline timed out"),
                }
            }
        }
    }
}
