//! SMTP replies: a code, an enhanced status code (RFC 3463) and a text, and their writing.

use std::fmt;
use std::time::Duration;

use smtp_proto::Error as ProtoError;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// One reply line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    /// The enhanced status code (`5.7.8`).
    pub status: &'static str,
    pub text: String,
}

impl Reply {
    /// A reply of `code`, `status` and `text` (one line: line breaks become spaces).
    pub fn new(code: u16, status: &'static str, text: impl Into<String>) -> Self {
        let text: String = text
            .into()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(400)
            .collect();
        Self { code, status, text }
    }

    /// The reply to a command that did not parse.
    pub fn syntax(error: ProtoError) -> Reply {
        match error {
            ProtoError::UnknownCommand => Reply::new(500, "5.5.1", "command unrecognized"),
            ProtoError::InvalidSenderAddress => Reply::new(553, "5.1.7", "invalid sender address"),
            ProtoError::InvalidRecipientAddress => {
                Reply::new(553, "5.1.3", "invalid recipient address")
            }
            ProtoError::SyntaxError { syntax } => {
                Reply::new(501, "5.5.4", format!("syntax: {syntax}"))
            }
            ProtoError::InvalidParameter { param } => {
                Reply::new(501, "5.5.4", format!("invalid parameter {param}"))
            }
            ProtoError::UnsupportedParameter { param } => {
                Reply::new(504, "5.5.4", format!("unsupported parameter {param}"))
            }
            ProtoError::ResponseTooLong => Reply::new(500, "5.5.2", "line too long"),
            ProtoError::NeedsMoreData { .. } | ProtoError::InvalidResponse { .. } => {
                Reply::new(500, "5.5.2", "syntax error")
            }
        }
    }

    /// Whether the connection ends after it (421).
    pub fn closes(&self) -> bool {
        self.code == 421
    }
}

impl fmt::Display for Reply {
    /// The reply as sent, with its line end.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}\r\n", self.code, self.status, self.text)
    }
}

/// Writes `out` to `stream` within `idle` (a client that stops taking its replies is let
/// go); false when it could not.
pub async fn send<S: AsyncWrite + Unpin>(stream: &mut S, out: &[u8], idle: Duration) -> bool {
    let written = async {
        stream.write_all(out).await?;
        stream.flush().await
    };
    matches!(tokio::time::timeout(idle, written).await, Ok(Ok(())))
}

/// Adds `reply` to the replies `out` holds for the next write.
pub fn push(out: &mut Vec<u8>, reply: &Reply) {
    out.extend_from_slice(reply.to_string().as_bytes());
}

/// Answers `reply` on a connection just taken, and closes it.
pub async fn refuse(mut stream: tokio::net::TcpStream, reply: Reply) {
    let _ = stream.write_all(reply.to_string().as_bytes()).await;
    let _ = stream.shutdown().await;
}
