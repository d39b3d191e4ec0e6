//! The one start-up path of every service: telemetry, its database and migrations, NATS,
//! the JetStream streams, readiness checks, the admin server and a graceful drain. A
//! service's `start` boots a [`Runtime`], adds its routes, RPCs and workers, and returns
//! [`Runtime::running`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use axum::Router;
use redis::aio::ConnectionManager;
use sqlx::migrate::Migrator;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Common;
use crate::dead_letters::{self, DeadLetters};
use crate::jetstream::outbox::Outbox;
use crate::lifecycle::Running;
use crate::nats::ServiceHost;
use crate::service::Service;
use crate::telemetry::{self, ReadyCheck};
use crate::{db, jetstream as streams};

/// A service being started: its connections, and the shutdown signal and task tracker its
/// tasks run under.
pub struct Runtime {
    pub service: Service,
    pub common: Common,
    pub db: PgPool,
    pub nats: async_nats::Client,
    /// The connection claim-checked bodies travel on ([`crate::nats::connect_bulk`]).
    pub bulk: async_nats::Client,
    pub js: jetstream::Context,
    /// The bucket of verified customer tracking hosts ([`crate::tracking_hosts`]).
    pub tracking_hosts: jetstream::kv::Store,
    /// Cancelled when the service stops taking work.
    pub shutdown: CancellationToken,
    /// Work a graceful stop waits for.
    pub tracker: TaskTracker,
    ready: Vec<ReadyCheck>,
}

impl Runtime {
    /// Installs telemetry, connects the service's database and runs `migrations` (its own,
    /// plus [`db::KIT_MIGRATIONS`] when it uses the outbox), connects NATS and declares the
    /// JetStream streams.
    pub async fn boot(
        service: Service, common: &Common, migrations: &[&Migrator],
    ) -> anyhow::Result<Self> {
        telemetry::init(service.name(), common.otlp_endpoint.as_deref());
        let db = db::connect(common, service, migrations).await?;
        let nats = crate::nats::connect(common, service, common.upstream_timeout).await?;
        let bulk = crate::nats::connect_bulk(common, service).await?;
        let js = jetstream::new(nats.clone());
        streams::ensure_streams(&js, &common.namespace, common.stream_replicas).await?;
        crate::nats::ensure_bodies(&js, &common.namespace, common.stream_replicas).await?;
        let tracking_hosts =
            crate::tracking_hosts::ensure(&js, &common.namespace, common.stream_replicas).await?;
        Ok(Self {
            service,
            common: common.clone(),
            db,
            nats,
            bulk,
            js,
            tracking_hosts,
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            ready: Vec::new(),
        })
    }

    /// Connects Redis; the service is ready only while it answers.
    pub async fn redis(&mut self) -> anyhow::Result<ConnectionManager> {
        let client = redis::Client::open(self.common.redis_url.as_str())?;
        let redis = ConnectionManager::new(client).await?;
        let conn = redis.clone();
        self.ready.push(Arc::new(move || {
            let mut conn = conn.clone();
            Box::pin(async move {
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            })
        }));
        Ok(redis)
    }

    /// The service's outbox, with its relay running every `OUTBOX_POLL_SECS` (the service
    /// booted with [`db::KIT_MIGRATIONS`]).
    pub fn outbox(&self) -> Outbox {
        let outbox = Outbox::new(self.db.clone(), self.js.clone());
        let relay = outbox.clone();
        self.every("outbox relay", self.common.outbox_poll, move || {
            let relay = relay.clone();
            async move { relay.relay_once().await }
        });
        outbox
    }

    /// A host for this service's HTTP router and RPCs on NATS; a consumer's answers the
    /// dead-letter methods too.
    pub fn host(&self) -> ServiceHost {
        let host = ServiceHost::new(
            self.nats.clone(),
            self.bulk.clone(),
            self.common.namespace.clone(),
            self.service,
        );
        if Service::CONSUMERS.contains(&self.service) {
            dead_letters::serve(host, self.dead_letters())
        } else {
            host
        }
    }

    /// The service's dead letters (it booted with [`dead_letters::DEAD_LETTER_MIGRATIONS`]).
    pub fn dead_letters(&self) -> DeadLetters {
        DeadLetters::new(
            self.db.clone(),
            self.js.clone(),
            self.service,
            self.common.max_deliver,
        )
    }

    /// Starts answering the host's endpoints until shutdown.
    pub async fn serve(&self, host: ServiceHost) -> anyhow::Result<()> {
        host.start(self.shutdown.clone(), &self.tracker).await
    }

    /// Runs `pass` every `period` until shutdown; a pass that says more work is waiting
    /// (true) runs again at once. Failures are logged and retried at the next tick.
    pub fn every<F, Fut, E>(&self, what: &'static str, period: Duration, pass: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool, E>> + Send,
        E: std::fmt::Display,
    {
        self.every_from(tokio::time::Instant::now(), what, period, pass);
    }

    /// [`Runtime::every`], its first pass one period after start: a slow sweep that need
    /// not run while the service starts (and takes no connection then).
    pub fn every_later<F, Fut, E>(&self, what: &'static str, period: Duration, pass: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool, E>> + Send,
        E: std::fmt::Display,
    {
        self.every_from(tokio::time::Instant::now() + period, what, period, pass);
    }

    /// Runs `pass` every `period` from `start` until shutdown.
    fn every_from<F, Fut, E>(
        &self, start: tokio::time::Instant, what: &'static str, period: Duration, pass: F,
    ) where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool, E>> + Send,
        E: std::fmt::Display,
    {
        let shutdown = self.shutdown.clone();
        self.tracker.spawn(async move {
            let mut tick = tokio::time::interval_at(start, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                loop {
                    match pass().await {
                        Ok(true) if !shutdown.is_cancelled() => continue,
                        Ok(_) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "{what} failed");
                            break;
                        }
                    }
                }
            }
        });
    }

    /// Serves `app` on `addr` (a public listener) until shutdown; returns the bound address.
    pub async fn listen(&self, addr: SocketAddr, app: Router) -> anyhow::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let stop = self.shutdown.clone();
        // The peer address is the client IP for per-IP limits (`ConnectInfo`).
        self.tracker.spawn(crate::http_server::serve(
            listener,
            app,
            crate::http_server::Limits::default(),
            stop,
        ));
        Ok(bound)
    }

    /// Starts the admin server (ready while the database, NATS and every added check
    /// answer) and hands back the running service.
    pub async fn running(self, http_addr: Option<SocketAddr>) -> anyhow::Result<Running> {
        let (db, nats, checks) = (self.db, self.nats, Arc::new(self.ready));
        let ready: ReadyCheck = Arc::new(move || {
            let (db, nats, checks) = (db.clone(), nats.clone(), checks.clone());
            Box::pin(async move {
                if !db::ping(&db).await
                    || nats.connection_state() != async_nats::connection::State::Connected
                {
                    return false;
                }
                for check in checks.iter() {
                    if !check().await {
                        return false;
                    }
                }
                true
            })
        });
        let admin =
            telemetry::serve_admin(self.common.admin_addr, ready, self.shutdown.clone()).await?;
        tracing::info!(
            service = self.service.name(),
            admin = %admin,
            http = ?http_addr,
            namespace = self.common.namespace.as_str(),
            "started"
        );
        Ok(Running::new(
            admin,
            http_addr,
            self.shutdown,
            self.tracker,
            self.common.drain_timeout,
        ))
    }
}
