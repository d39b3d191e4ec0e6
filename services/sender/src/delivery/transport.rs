//! Delivery transports: `file` writes each message as `{delivery_id}.eml` (the local default),
//! `smtp` hands it to any relay through lettre's pool, `ses` sends it raw through Amazon
//! SES v2 (`SendEmail`). Each answers the provider's id of the delivered message.

use std::borrow::Cow;
use std::path::PathBuf;

use lettre::address::Envelope;
use lettre::transport::smtp::PoolConfig;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use anyhow::Context as _;
use postmesh_ses::SesClient;
use postmesh_shared::config::redacted;
use postmesh_shared::DeliveryId;

use crate::Config;

/// A failed delivery: permanent ones are not retried.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("permanent delivery failure: {0}")]
    Permanent(String),
    #[error("temporary delivery failure: {0}")]
    Transient(String),
}

/// The transport `SEND_TRANSPORT` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// `.eml` files in `OUTBOX_DIR` (the local default).
    File,
    /// Any SMTP relay at `SMTP_URL`.
    Smtp,
    /// Amazon SES v2.
    Ses,
}

impl TransportKind {
    /// The setting's value (`file`, `smtp`, `ses`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Smtp => "smtp",
            Self::Ses => "ses",
        }
    }
}

impl std::str::FromStr for TransportKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "file" => Ok(Self::File),
            "smtp" => Ok(Self::Smtp),
            "ses" => Ok(Self::Ses),
            other => Err(format!(
                "unknown transport {other:?} (use file, smtp or ses)"
            )),
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where messages go.
pub enum Transport {
    File { dir: PathBuf },
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Ses(SesClient),
}

/// A message as it goes out: its envelope, its bytes and its Message-ID (the provider id
/// of transports that have none of their own).
pub struct Outgoing {
    pub envelope: Envelope,
    pub bytes: Vec<u8>,
    pub message_id: String,
}

impl From<Message> for Outgoing {
    fn from(message: Message) -> Self {
        Self {
            envelope: message.envelope().clone(),
            message_id: message
                .headers()
                .get_raw("Message-ID")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            bytes: message.formatted(),
        }
    }
}

impl Transport {
    /// Builds the transport `config.transport` names (`file`, `smtp` or `ses`).
    pub async fn new(config: &Config) -> anyhow::Result<Self> {
        match config.transport {
            TransportKind::File => {
                tokio::fs::create_dir_all(&config.outbox_dir).await?;
                Ok(Self::File {
                    dir: config.outbox_dir.clone(),
                })
            }
            // One pooled connection per job worked on at once: a smaller pool (lettre's
            // default is 10) makes jobs wait for, or open and close, connections.
            TransportKind::Smtp => Ok(Self::Smtp(
                AsyncSmtpTransport::<Tokio1Executor>::from_url(&config.smtp_url)
                    .with_context(|| format!("SMTP_URL {}", redacted(&config.smtp_url)))?
                    .pool_config(
                        PoolConfig::new().max_size(config.worker.concurrency.max(1) as u32),
                    )
                    .build(),
            )),
            TransportKind::Ses => SesClient::new(&config.ses, config.common.upstream_timeout)?
                .map(Self::Ses)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "SEND_TRANSPORT=ses needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                    )
                }),
        }
    }

    /// Delivers `message`; answers the provider's id of it. Delivering the same job again
    /// to `file` replaces, never duplicates, its file.
    pub async fn deliver(
        &self, delivery_id: DeliveryId, message: Outgoing,
    ) -> Result<String, TransportError> {
        let to: Vec<String> = message
            .envelope
            .to()
            .iter()
            .map(|a| a.to_string())
            .collect();
        match self {
            Self::File { dir } => {
                let tmp = dir.join(format!(".{delivery_id}.tmp"));
                let path = dir.join(format!("{delivery_id}.eml"));
                let io = |e: std::io::Error| TransportError::Transient(e.to_string());
                // The envelope's recipients, so a Bcc copy shows whom it went to.
                let mut eml = format!("X-Original-To: {}\r\n", to.join(", ")).into_bytes();
                eml.extend_from_slice(&message.bytes);
                tokio::fs::write(&tmp, eml).await.map_err(io)?;
                tokio::fs::rename(&tmp, &path).await.map_err(io)?;
                Ok(message.message_id)
            }
            Self::Smtp(smtp) => match smtp
                .send_raw(&message.envelope, &crlf_lines(&message.bytes))
                .await
            {
                Ok(_) => Ok(message.message_id),
                Err(e) if e.is_permanent() => Err(TransportError::Permanent(e.to_string())),
                Err(e) => Err(TransportError::Transient(e.to_string())),
            },
            Self::Ses(ses) => {
                let from = message
                    .envelope
                    .from()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                match ses.send_raw(&from, &to, &message.bytes).await {
                    Ok(id) => Ok(id),
                    Err(e) if e.is_transient() => Err(TransportError::Transient(e.to_string())),
                    Err(e) => Err(TransportError::Permanent(e.to_string())),
                }
            }
        }
    }
}

/// `bytes` with every line ended by CRLF: a bare LF gets a CR before it, a bare CR an LF
/// after it. The relay's client stuffs dots only after CRLF, so a client's `\n.\r\n`
/// would end the message early for a relay that takes a bare LF as a line end, and what
/// followed would be read as commands (SMTP smuggling). One pass.
fn crlf_lines(bytes: &[u8]) -> Cow<'_, [u8]> {
    let bare = bytes.iter().enumerate().any(|(i, &b)| match b {
        b'\n' => i == 0 || bytes[i - 1] != b'\r',
        b'\r' => bytes.get(i + 1) != Some(&b'\n'),
        _ => false,
    });
    if !bare {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 16);
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\n' if i == 0 || bytes[i - 1] != b'\r' => out.extend_from_slice(b"\r\n"),
            b'\r' if bytes.get(i + 1) != Some(&b'\n') => out.extend_from_slice(b"\r\n"),
            _ => out.push(b),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_ends_in_crlf_so_no_bare_line_end_can_end_a_message() {
        assert_eq!(&*crlf_lines(b"a\r\nb\r\n"), b"a\r\nb\r\n");
        assert!(matches!(crlf_lines(b"a\r\nb"), Cow::Borrowed(_)));
        assert_eq!(
            &*crlf_lines(b"body\n.\r\nMAIL FROM:<x@y>\r\n\rz\n"),
            b"body\r\n.\r\nMAIL FROM:<x@y>\r\n\r\nz\r\n"
        );
        assert_eq!(&*crlf_lines(b"\n\r"), b"\r\n\r\n");
        // Hostile: a megabyte of bare line ends is read once.
        let hostile = vec![b'\n'; 1 << 20];
        assert_eq!(crlf_lines(&hostile).len(), 2 << 20);
    }
}
