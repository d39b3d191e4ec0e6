//! HTTP to outside systems (Stripe, SES, Cloudflare): one way to build a client and to
//! exchange a request, so each client keeps only its own paths, signing and error shapes.

use std::time::Duration;

use bytes::Bytes;
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

/// Sends `req` and reads the answer; the error is why no answer came (unreachable, timed
/// out, cut off), which callers treat as "unavailable, try again later".
pub async fn exchange(req: reqwest::RequestBuilder) -> Result<Reply, String> {
    let res = req.send().await.map_err(|e| e.to_string())?;
    let (status, headers) = (res.status(), res.headers().clone());
    let body = match res.bytes().await {
        Ok(body) => body,
        // The work is done on their side: a 2xx is never turned into a retry.
        Err(_) if status.is_success() => Bytes::new(),
        Err(e) => return Err(e.to_string()),
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}
