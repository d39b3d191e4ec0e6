//! Delivery transports: `file` writes each message as `{job_id}.eml` (the local default),
//! `smtp` hands it to any relay through lettre.

use std::path::PathBuf;

use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use postmesh_shared::JobId;

/// A failed delivery: permanent ones are not retried.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("permanent delivery failure: {0}")]
    Permanent(String),
    #[error("temporary delivery failure: {0}")]
    Transient(String),
}

/// Where messages go.
pub enum Transport {
    File { dir: PathBuf },
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
}

impl Transport {
    /// Builds the transport named by `kind` (`file` or `smtp`).
    pub async fn new(kind: &str, outbox_dir: PathBuf, smtp_url: &str) -> anyhow::Result<Self> {
        match kind {
            "file" => {
                tokio::fs::create_dir_all(&outbox_dir).await?;
                Ok(Self::File { dir: outbox_dir })
            }
            "smtp" => Ok(Self::Smtp(
                AsyncSmtpTransport::<Tokio1Executor>::from_url(smtp_url)?.build(),
            )),
            other => anyhow::bail!("unknown SEND_TRANSPORT {other:?} (use file or smtp)"),
        }
    }

    /// Delivers `message`. Delivering the same job again replaces, never duplicates, its file.
    pub async fn deliver(&self, job_id: JobId, message: Message) -> Result<(), TransportError> {
        match self {
            Self::File { dir } => {
                let tmp = dir.join(format!(".{job_id}.tmp"));
                let path = dir.join(format!("{job_id}.eml"));
                let io = |e: std::io::Error| TransportError::Transient(e.to_string());
                tokio::fs::write(&tmp, message.formatted())
                    .await
                    .map_err(io)?;
                tokio::fs::rename(&tmp, &path).await.map_err(io)
            }
            Self::Smtp(smtp) => smtp.send(message).await.map(|_| ()).map_err(|e| {
                if e.is_permanent() {
                    TransportError::Permanent(e.to_string())
                } else {
                    TransportError::Transient(e.to_string())
                }
            }),
        }
    }
}
