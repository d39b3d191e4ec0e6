//! Sender: the delivery worker behind the SEND work queue. (Send requests, templates and
//! campaigns come later; for now it delivers the jobs other services queue.)

pub mod transport;
pub mod worker;

use std::path::PathBuf;
use std::time::Duration;

use postmesh_shared::config::{env_or, env_parse, env_secs, secs};
use postmesh_shared::{Common, Running, Runtime, Service};

pub use worker::WorkerConfig;

/// This service.
pub const SERVICE: Service = Service::Sender;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

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
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            common: Common::from_env(SERVICE)?,
            transport: env_or("SEND_TRANSPORT", "file"),
            outbox_dir: env_or("OUTBOX_DIR", "var/outbox").into(),
            smtp_url: env_or("SMTP_URL", "smtp://127.0.0.1:25"),
            worker: WorkerConfig {
                ack_wait: env_secs("SEND_ACK_WAIT_SECS", Duration::from_secs(30))?,
                max_deliver: env_parse("SEND_MAX_DELIVER", 8)?,
                retry_base: env_secs("SEND_RETRY_BASE_SECS", Duration::from_secs(5))?,
                concurrency: env_parse("SEND_CONCURRENCY", 16)?,
            },
        })
    }

    /// The environment that [`Config::from_env`] reads back as these settings.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.common.to_env();
        env.extend([
            ("SEND_TRANSPORT", self.transport.clone()),
            ("OUTBOX_DIR", self.outbox_dir.display().to_string()),
            ("SMTP_URL", self.smtp_url.clone()),
            ("SEND_ACK_WAIT_SECS", secs(self.worker.ack_wait)),
            ("SEND_MAX_DELIVER", self.worker.max_deliver.to_string()),
            ("SEND_RETRY_BASE_SECS", secs(self.worker.retry_base)),
            ("SEND_CONCURRENCY", self.worker.concurrency.to_string()),
        ]);
        env
    }
}

/// Starts the sender: its transport and the SEND consumer.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let rt = Runtime::boot(SERVICE, &config.common, &[&MIGRATOR]).await?;
    let transport = transport::Transport::new(
        &config.transport,
        config.outbox_dir.clone(),
        &config.smtp_url,
    )
    .await?;
    worker::spawn(&rt, transport, config.worker.clone()).await?;
    tracing::info!(transport = %config.transport, "sender delivering");
    rt.running(None).await
}

/// Runs the service until Ctrl-C or SIGTERM, then drains in-flight work.
pub async fn run(config: Config) -> anyhow::Result<()> {
    start(config).await?.until_signal().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_reads_back_the_same_settings() {
        let mut config = Config::from_env().unwrap();
        config.transport = "smtp".into();
        config.smtp_url = "smtp://127.0.0.1:2525".into();
        config.common.upstream_timeout = Duration::from_millis(1500);
        config.worker = WorkerConfig {
            ack_wait: Duration::from_secs(2),
            max_deliver: 5,
            retry_base: Duration::from_millis(200),
            concurrency: 8,
        };
        for (name, value) in config.to_env() {
            std::env::set_var(name, value);
        }
        let back = Config::from_env().unwrap();
        assert_eq!(format!("{back:?}"), format!("{config:?}"));
    }
}
