//! The handle of a started service: where it listens, and a graceful stop that drains
//! in-flight work.

use std::net::SocketAddr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A running service.
pub struct Running {
    /// The admin server (`/healthz`, `/readyz`, `/metrics`).
    pub admin_addr: SocketAddr,
    /// The public HTTP listener, for services that have one (the gateway).
    pub http_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    drain_timeout: Duration,
}

impl Running {
    /// Wraps the pieces of a started service; a stop waits up to `drain_timeout`.
    pub fn new(
        admin_addr: SocketAddr, http_addr: Option<SocketAddr>, shutdown: CancellationToken,
        tracker: TaskTracker, drain_timeout: Duration,
    ) -> Self {
        Self {
            admin_addr,
            http_addr,
            shutdown,
            tracker,
            drain_timeout,
        }
    }

    /// Stops taking new work and waits until the work in progress is finished, at most the
    /// drain timeout (what is still running then is dropped unacknowledged, so it is redone).
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(self.drain_timeout, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?self.drain_timeout,
                "work still in progress at the end of the drain; stopping anyway"
            );
        }
    }

    /// Runs until Ctrl-C or SIGTERM, then stops gracefully.
    pub async fn until_signal(self) -> anyhow::Result<()> {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        self.stop().await;
        crate::telemetry::shutdown();
        Ok(())
    }
}
