//! The handle of a started service: where it listens, and a graceful stop that drains
//! in-flight work.

use std::net::SocketAddr;

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
}

impl Running {
    /// Wraps the pieces of a started service.
    pub fn new(
        admin_addr: SocketAddr,
        http_addr: Option<SocketAddr>,
        shutdown: CancellationToken,
        tracker: TaskTracker,
    ) -> Self {
        Self {
            admin_addr,
            http_addr,
            shutdown,
            tracker,
        }
    }

    /// Stops taking new work and waits until the work in progress is finished.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
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
