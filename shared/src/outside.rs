//! HTTP to outside systems (Stripe, SES, Cloudflare): one way to build a client and to
//! exchange a request, so each client keeps only its own paths, signing and error shapes.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

/// A client with the kit's TLS, `timeout` for each call, and `user_agent`.
pub fn http_client(user_agent: &str, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    crate::tls::install_provider();
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .user_agent(user_agent)
        .build()?)
}

/// An outside system's answer.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Empty when a successful answer's body could not be read.
    pub body: Bytes,
}

/// The largest answer read from Stripe, SES or Cloudflare; a longer one is an error.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Reads at most `cap` bytes of `res`'s body, and whether more was left unread (never
/// read: the connection is dropped with it).
pub async fn read_capped(
    mut res: reqwest::Response, cap: usize,
) -> Result<(Bytes, bool), reqwest::Error> {
    let mut body = BytesMut::with_capacity(cap.min(16 * 1024));
    while let Some(chunk) = res.chunk().await? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body.freeze(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), false))
}

/// Sends `req` and reads the answer (up to [`MAX_ANSWER_BYTES`]); the error is why no
/// answer came (unreachable, timed out, cut off, too long), which callers treat as
/// "unavailable, try again later".
pub async fn exchange(req: reqwest::RequestBuilder) -> Result<Reply, String> {
    let res = req.send().await.map_err(|e| e.to_string())?;
    let (status, headers) = (res.status(), res.headers().clone());
    let body = match read_capped(res, MAX_ANSWER_BYTES).await {
        Ok((body, false)) => body,
        // The work is done on their side: a 2xx is never turned into a retry.
        Ok(_) | Err(_) if status.is_success() => Bytes::new(),
        Ok(_) => return Err(format!("an answer over {MAX_ANSWER_BYTES} bytes")),
        Err(e) => return Err(e.to_string()),
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}
