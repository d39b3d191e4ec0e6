//! The SMTP submission service (RFC 6409): any SMTP client signs in with the email of its
//! account and an API key, and its messages are sent as it wrote them. It is an edge with no
//! database of its own: logins, envelope checks and messages go through the gateway's HTTP
//! API (`/smtp-auth`, `/smtp-envelope`, `/send-raw`), so keys are verified, billed and
//! limited in one place; Redis counts failed logins across replicas.

pub mod api;
pub mod limits;
pub mod reply;
pub mod session;
pub mod settings;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use postmesh_shared::telemetry::{self, ReadyCheck};
use postmesh_shared::{Common, Running, Service};

use crate::settings::*;

/// This service.
pub const SERVICE: Service = Service::SmtpSubmission;

/// The largest `SMTP_MAX_MESSAGE_BYTES`: what `/send-raw` takes.
pub const MAX_MESSAGE_BYTES: usize = 28 * 1024 * 1024;

/// The certificate chain and key of TLS (PEM files).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The service's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// The submission listener (`SMTP_LISTEN`).
    pub listen: SocketAddr,
    /// The implicit-TLS listener (`SMTP_TLS_LISTEN`), if any.
    pub tls_listen: Option<SocketAddr>,
    /// `SMTP_TLS_CERT` and `SMTP_TLS_KEY`; without them no TLS is offered.
    pub tls: Option<TlsFiles>,
    /// `SMTP_ALLOW_PLAINTEXT_AUTH=1`: `AUTH` before `STARTTLS`.
    pub allow_plaintext_auth: bool,
    /// `SMTP_MAX_MESSAGE_BYTES`.
    pub max_message_bytes: usize,
    /// The gateway's HTTP API (`SMTP_API_URL`).
    pub api_url: String,
    /// The name the server greets with (`SMTP_HOSTNAME`).
    pub hostname: String,
    /// `SMTP_MAX_CONNECTIONS_PER_IP`.
    pub max_connections_per_ip: usize,
    /// `SMTP_MAX_CONNECTIONS`.
    pub max_connections: usize,
    /// `SMTP_IDLE_TIMEOUT_SECS`.
    pub idle_timeout: Duration,
    /// `SMTP_MAX_COMMANDS`.
    pub max_commands: usize,
    /// `SMTP_MESSAGE_MEMORY_BYTES`.
    pub message_memory: usize,
    /// `SMTP_AUTH_FAILURES` within `SMTP_AUTH_FAILURE_WINDOW_SECS`.
    pub auth_failures: u32,
    pub auth_failure_window: Duration,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let tls = match (SMTP_TLS_CERT.opt(), SMTP_TLS_KEY.opt()) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.into(),
                key: key.into(),
            }),
            (None, None) => None,
            _ => anyhow::bail!("SMTP_TLS_CERT and SMTP_TLS_KEY are set together or not at all"),
        };
        let config = Self {
            common: Common::from_env(SERVICE)?,
            listen: SMTP_LISTEN.parse()?,
            tls_listen: SMTP_TLS_LISTEN
                .opt()
                .map(|a| a.parse())
                .transpose()
                .context("invalid SMTP_TLS_LISTEN")?,
            tls,
            allow_plaintext_auth: SMTP_ALLOW_PLAINTEXT_AUTH.flag(),
            max_message_bytes: SMTP_MAX_MESSAGE_BYTES.parse()?,
            api_url: SMTP_API_URL.string().trim_end_matches('/').to_owned(),
            hostname: SMTP_HOSTNAME.string(),
            max_connections_per_ip: SMTP_MAX_CONNECTIONS_PER_IP.parse()?,
            max_connections: SMTP_MAX_CONNECTIONS.parse()?,
            idle_timeout: SMTP_IDLE_TIMEOUT_SECS.secs()?,
            max_commands: SMTP_MAX_COMMANDS.parse()?,
            message_memory: SMTP_MESSAGE_MEMORY_BYTES.parse()?,
            auth_failures: SMTP_AUTH_FAILURES.parse()?,
            auth_failure_window: SMTP_AUTH_FAILURE_WINDOW_SECS.secs()?,
        };
        if config.max_message_bytes > MAX_MESSAGE_BYTES {
            anyhow::bail!("SMTP_MAX_MESSAGE_BYTES is at most {MAX_MESSAGE_BYTES}");
        }
        if config.tls_listen.is_some() && config.tls.is_none() {
            anyhow::bail!("SMTP_TLS_LISTEN needs SMTP_TLS_CERT and SMTP_TLS_KEY");
        }
        Ok(config)
    }

    /// The settings as environment variables (to run the service as a child process).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.common.to_env();
        env.push((SMTP_LISTEN.name, self.listen.to_string()));
        if let Some(addr) = self.tls_listen {
            env.push((SMTP_TLS_LISTEN.name, addr.to_string()));
        }
        if let Some(tls) = &self.tls {
            env.push((SMTP_TLS_CERT.name, tls.cert.display().to_string()));
            env.push((SMTP_TLS_KEY.name, tls.key.display().to_string()));
        }
        let flag = if self.allow_plaintext_auth { "1" } else { "0" };
        env.push((SMTP_ALLOW_PLAINTEXT_AUTH.name, flag.into()));
        env.push((
            SMTP_MAX_MESSAGE_BYTES.name,
            self.max_message_bytes.to_string(),
        ));
        env.push((SMTP_API_URL.name, self.api_url.clone()));
        env.push((SMTP_HOSTNAME.name, self.hostname.clone()));
        env.push((
            SMTP_MAX_CONNECTIONS_PER_IP.name,
            self.max_connections_per_ip.to_string(),
        ));
        env.push((SMTP_MAX_CONNECTIONS.name, self.max_connections.to_string()));
        env.push((
            SMTP_IDLE_TIMEOUT_SECS.name,
            postmesh_shared::config::secs(self.idle_timeout),
        ));
        env.push((SMTP_MAX_COMMANDS.name, self.max_commands.to_string()));
        env.push((
            SMTP_MESSAGE_MEMORY_BYTES.name,
            self.message_memory.to_string(),
        ));
        env.push((SMTP_AUTH_FAILURES.name, self.auth_failures.to_string()));
        env.push((
            SMTP_AUTH_FAILURE_WINDOW_SECS.name,
            postmesh_shared::config::secs(self.auth_failure_window),
        ));
        env
    }
}

/// Where a started service listens.
#[derive(Clone, Copy, Debug)]
pub struct Listening {
    /// The submission listener (STARTTLS).
    pub smtp: SocketAddr,
    /// The implicit-TLS listener, if any.
    pub smtps: Option<SocketAddr>,
}

/// What every connection shares.
pub(crate) struct Shared {
    pub config: Config,
    pub api: api::Api,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub logins: limits::FailedLogins,
    pub connections: limits::Connections,
    /// What the messages in hand may hold (`SMTP_MESSAGE_MEMORY_BYTES`).
    pub memory: session::data::Budget,
    pub shutdown: CancellationToken,
}

/// Starts the service (see [`serve`]).
pub async fn start(config: Config) -> anyhow::Result<Running> {
    Ok(serve(config).await?.0)
}

/// Starts the listeners and the admin server (ready while Redis answers); answers where
/// it listens.
pub async fn serve(config: Config) -> anyhow::Result<(Running, Listening)> {
    telemetry::init(SERVICE.name(), config.common.otlp_endpoint.as_deref());
    let tls = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let redis =
        redis::aio::ConnectionManager::new(redis::Client::open(config.common.redis_url.as_str())?)
            .await
            .context("connecting Redis")?;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let shared = Arc::new(Shared {
        api: api::Api::new(&config.api_url, config.common.upstream_timeout)?,
        tls,
        logins: limits::FailedLogins::new(
            redis.clone(),
            &config.common.namespace,
            config.auth_failures,
            config.auth_failure_window,
        ),
        connections: limits::Connections::new(
            config.max_connections_per_ip,
            config.max_connections,
        ),
        memory: session::data::Budget::new(config.message_memory),
        shutdown: shutdown.clone(),
        config,
    });
    let smtp = accept(
        &shared,
        &tracker,
        TcpListener::bind(shared.config.listen).await?,
        false,
    )?;
    let smtps = match shared.config.tls_listen {
        Some(addr) => Some(accept(
            &shared,
            &tracker,
            TcpListener::bind(addr).await?,
            true,
        )?),
        None => None,
    };
    let ready: ReadyCheck = Arc::new(move || {
        let mut redis = redis.clone();
        Box::pin(async move {
            redis::cmd("PING")
                .query_async::<String>(&mut redis)
                .await
                .is_ok()
        })
    });
    let common = &shared.config.common;
    let admin = telemetry::serve_admin(common.admin_addr, ready, shutdown.clone()).await?;
    tracing::info!(service = SERVICE.name(), admin = %admin, smtp = %smtp, smtps = ?smtps, "started");
    let running = Running::new(admin, None, shutdown, tracker, common.drain_timeout);
    Ok((running, Listening { smtp, smtps }))
}

/// Takes connections on `listener` until shutdown, each a session of its own (in TLS from
/// the start when `implicit_tls`); answers the bound address.
fn accept(
    shared: &Arc<Shared>, tracker: &TaskTracker, listener: TcpListener, implicit_tls: bool,
) -> anyhow::Result<SocketAddr> {
    let bound = listener.local_addr()?;
    let (shared, sessions) = (shared.clone(), tracker.clone());
    tracker.spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = shared.shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an SMTP connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let shared = shared.clone();
            sessions.spawn(session::run(shared, stream, peer, implicit_tls));
        }
    });
    Ok(bound)
}
