//! Sender: the delivery worker behind the SEND work queue. (Send requests, templates and
//! campaigns come later; for now it delivers the jobs other services queue.)

pub mod transport;
pub mod worker;

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use postmesh_shared::config::{env_or, env_parse};
use postmesh_shared::{db, telemetry, Common, Running};

pub use worker::WorkerConfig;

/// The name of this service on NATS and in its database name.
pub const SERVICE: &str = "sender";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Sender settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// `file` (default) or `smtp`.
    pub transport: String,
    /// Where the `file` transport writes `.eml` files.
    pub outbox_dir: PathBuf,
    /// Relay for the `smtp` transport, e.g. `smtp://127.0.0.1:25` or `smtp://h:587?tls=required`.
    pub smtp_url: String,
    pub worker: WorkerConfig,
}

impl Config {
    /// Reads the settings from the environment (admin port 9092).
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            common: Common::from_env(9092)?,
            transport: env_or("SEND_TRANSPORT", "file"),
            outbox_dir: env_or("OUTBOX_DIR", "var/outbox").into(),
            smtp_url: env_or("SMTP_URL", "smtp://127.0.0.1:25"),
            worker: WorkerConfig {
                ack_wait: Duration::from_secs(env_parse("SEND_ACK_WAIT_SECS", 30)?),
                max_deliver: env_parse("SEND_MAX_DELIVER", 8)?,
                retry_base: Duration::from_secs(env_parse("SEND_RETRY_BASE_SECS", 5)?),
                concurrency: env_parse("SEND_CONCURRENCY", 16)?,
            },
        })
    }
}

/// Starts the sender: database, transport, SEND consumer, admin server.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let c = &config.common;
    telemetry::init(SERVICE, c.otlp_endpoint.as_deref());
    let db = db::connect(c, SERVICE, &MIGRATOR).await?;
    let transport = transport::Transport::new(
        &config.transport,
        config.outbox_dir.clone(),
        &config.smtp_url,
    )
    .await?;
    let nats =
        postmesh_shared::nats::connect(&c.nats_url, SERVICE, Duration::from_secs(10)).await?;
    let js = async_nats::jetstream::new(nats.clone());
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    worker::spawn(
        js,
        &c.namespace,
        db.clone(),
        transport,
        config.worker.clone(),
        shutdown.clone(),
        &tracker,
    )
    .await?;
    let ready = telemetry::ready_when_db_and_nats(db, nats);
    let admin = telemetry::serve_admin(c.admin_addr, ready, shutdown.clone()).await?;
    tracing::info!(admin = %admin, transport = %config.transport, "sender started");
    Ok(Running::new(admin, None, shutdown, tracker))
}

/// Runs the service until Ctrl-C or SIGTERM, then drains in-flight work.
pub async fn run(config: Config) -> anyhow::Result<()> {
    start(config).await?.until_signal().await
}
