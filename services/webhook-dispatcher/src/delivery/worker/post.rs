//! The signed POST to a receiver and what its answer says.

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{StatusCode, Url};

use postmesh_shared::db::now_unix;
use postmesh_shared::outside::read_capped;

use crate::content::payload;
use crate::target::Reach;
use crate::DeliveryConfig;

/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Bytes of a receiver's answer kept in `lastError`.
const ERROR_BODY_BYTES: usize = 200;
/// How much of a receiver's error answer is read at most.
const ERROR_READ_BYTES: usize = 4096;

/// Makes signed POSTs: one HTTP client whose lookups go through [`Reach`], no redirects and
/// no proxy.
#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
    reach: Reach,
}

/// A receiver's answer, or why none came.
#[derive(Debug)]
pub struct Answer {
    pub status: Option<StatusCode>,
    /// The failure in words; `None` for a 2xx.
    pub error: Option<String>,
    /// A 429 or 503's `Retry-After`.
    pub retry_after: Option<Duration>,
}

impl Sender {
    /// A sender that waits `config.timeout` for each answer.
    pub fn new(reach: Reach, config: &DeliveryConfig) -> anyhow::Result<Self> {
        postmesh_shared::tls::install_provider();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(reach.clone())
            // A proxy would look receivers' hosts up itself, past `Reach`.
            .no_proxy()
            .user_agent("Postmesh-Webhooks/1")
            .build()?;
        Ok(Self { client, reach })
    }

    /// POSTs `body` to `url`, signed with `keys` under `id`.
    #[tracing::instrument(name = "webhook.post", skip_all, fields(webhook_id = id))]
    pub async fn post(&self, url: &Url, id: &str, keys: &[&[u8]], body: Vec<u8>) -> Answer {
        let refused = |error: String| Answer {
            status: None,
            error: Some(error),
            retry_after: None,
        };
        if let Err(e) = self.reach.admit_literal(url) {
            return refused(e);
        }
        let timestamp = now_unix();
        let signature = payload::sign(keys, id, timestamp, &body);
        let sent = self
            .client
            .post(url.clone())
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let res = match sent {
            Ok(res) => res,
            Err(e) => return refused(chain(&e)),
        };
        let status = res.status();
        if status.is_success() {
            return Answer {
                status: Some(status),
                error: None,
                retry_after: None,
            };
        }
        let retry_after = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        )
        .then(|| retry_after(res.headers()))
        .flatten();
        // Read no further than this, whatever the receiver streams: the rest is dropped.
        let read = read_capped(res, ERROR_READ_BYTES).await;
        let text = read.map(|(body, _)| String::from_utf8_lossy(&body).into_owned());
        let (excerpt, _) =
            postmesh_shared::text::cut_at(text.unwrap_or_default(), ERROR_BODY_BYTES);
        Answer {
            status: Some(status),
            // Postgres text takes no NUL.
            error: Some(format!(
                "HTTP {}: {}",
                status.as_u16(),
                excerpt.trim().replace('\0', "")
            )),
            retry_after,
        }
    }
}

/// An error with its causes, which say why a connection failed (a refused address, a
/// timeout).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After` in seconds (the HTTP-date form is not used by webhook receivers we know).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy named by the environment is not used: it would look the receiver's host up
    /// itself, past [`Reach`]. (nextest runs each test in a process of its own.)
    #[tokio::test]
    async fn the_environments_proxy_is_never_asked() {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = format!("http://{}", proxy.local_addr().unwrap());
        for name in ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "HTTP_PROXY"] {
            std::env::set_var(name, &at);
        }
        // No name server answers: the receiver's host is never found.
        let reach = Reach::new(&["127.0.0.1:9".parse().unwrap()], false).unwrap();
        let config = DeliveryConfig {
            timeout: Duration::from_secs(2),
            ..DeliveryConfig::default()
        };
        let sender = Sender::new(reach, &config).unwrap();
        let url = Url::parse("https://internal.invalid/hook").unwrap();
        let answer = sender.post(&url, "msg_1", &[b"key"], b"{}".to_vec()).await;
        assert!(answer.error.is_some(), "{answer:?}");
        // Any connection to the proxy was made before the answer came.
        let asked = tokio::time::timeout(Duration::from_millis(100), proxy.accept()).await;
        assert!(asked.is_err(), "the proxy was asked");
    }
}
