//! The DNS host for apply-dns: Cloudflare's v4 API (`CLOUDFLARE_API_BASE`), authenticated
//! with the workspace's API token as a bearer, answers in Cloudflare's
//! `{success, errors, result}` envelope.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use postmesh_shared::{outside, ApiError};

/// Why a Cloudflare call failed.
#[derive(Debug, thiserror::Error)]
pub enum CloudflareError {
    /// Cloudflare could not be reached, timed out, throttled us or failed on its side.
    #[error("Cloudflare unavailable: {0}")]
    Unavailable(String),
    /// The token was refused (401/403): the caller's to fix.
    #[error("Cloudflare refused the API token: {0}")]
    Unauthorized(String),
    /// Cloudflare refused the request.
    #[error("Cloudflare refused the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    /// The record to create exists already (81058): made meanwhile, by a request that raced.
    #[error("Cloudflare holds an identical record already")]
    Exists,
}

impl From<CloudflareError> for ApiError {
    fn from(e: CloudflareError) -> Self {
        match e {
            CloudflareError::Unavailable(_) => {
                tracing::warn!(error = %e, "cloudflare unavailable");
                ApiError::Unavailable("the DNS host cannot be reached now; retry later".into())
            }
            CloudflareError::Unauthorized(_) => ApiError::BadRequest(e.to_string()),
            CloudflareError::Rejected { .. } | CloudflareError::Exists => {
                tracing::error!(error = %e, "cloudflare refused a request");
                ApiError::BadGateway(e.to_string())
            }
        }
    }
}

/// Cloudflare's error code for a record identical to one it holds.
const IDENTICAL_RECORD: i64 = 81058;

/// Cloudflare's error codes for a missing, malformed or invalid token.
const AUTH_ERROR_CODES: [i64; 5] = [6003, 6111, 9106, 9109, 10000];

/// A zone.
#[derive(Clone, Debug, Deserialize)]
pub struct Zone {
    pub id: String,
    pub name: String,
}

/// A DNS record as Cloudflare holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u16>,
    /// Whether Cloudflare answers for it with its own addresses (a proxied CNAME is no CNAME).
    #[serde(default, skip_serializing)]
    pub proxied: bool,
}

/// A record to create: `ttl` 1 is "automatic"; CNAMEs are never proxied (DKIM must resolve).
#[derive(Serialize)]
struct NewRecord<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    name: &'a str,
    content: &'a str,
    ttl: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    proxied: Option<bool>,
}

#[derive(Deserialize)]
struct Envelope<T> {
    success: bool,
    #[serde(default)]
    errors: Vec<ErrorItem>,
    result: Option<T>,
    #[serde(default)]
    result_info: Option<ResultInfo>,
}

/// Where a page of a list stands.
#[derive(Clone, Copy, Deserialize)]
struct ResultInfo {
    #[serde(default)]
    total_pages: u32,
}

/// Pages of records at one name read at most (100 a page).
const MAX_RECORD_PAGES: u32 = 10;

#[derive(Deserialize)]
struct ErrorItem {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

/// Cloudflare's API.
#[derive(Clone)]
pub struct Cloudflare {
    http: reqwest::Client,
    base: String,
}

impl Cloudflare {
    /// A client of the API at `base` (`https://api.cloudflare.com/client/v4`).
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<Self> {
        let agent = concat!("postmesh-domain/", env!("CARGO_PKG_VERSION"));
        Ok(Self {
            http: outside::http_client(agent, timeout)?,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// The zone holding `domain`: the domain itself or its closest parent the token sees.
    pub async fn find_zone(
        &self, token: &str, domain: &str,
    ) -> Result<Option<Zone>, CloudflareError> {
        let labels: Vec<&str> = domain.split('.').collect();
        for start in 0..labels.len().saturating_sub(1) {
            let candidate = labels[start..].join(".");
            let zones: Vec<Zone> = self
                .send(
                    token,
                    self.http
                        .get(format!("{}/zones", self.base))
                        .query(&[("name", candidate.as_str())]),
                )
                .await?;
            if let Some(zone) = zones.into_iter().find(|z| z.name == candidate) {
                return Ok(Some(zone));
            }
        }
        Ok(None)
    }

    /// Every record at `name` in the zone, page after page (at most [`MAX_RECORD_PAGES`]).
    pub async fn records(
        &self, token: &str, zone: &str, name: &str,
    ) -> Result<Vec<Record>, CloudflareError> {
        let mut all = Vec::new();
        for page in 1..=MAX_RECORD_PAGES {
            let page_text = page.to_string();
            let query = [("name", name), ("per_page", "100"), ("page", &page_text)];
            let url = format!("{}/zones/{zone}/dns_records", self.base);
            let (records, info): (Vec<Record>, _) = self
                .send_paged(token, self.http.get(url).query(&query))
                .await?;
            all.extend(records);
            if info.is_none_or(|i| page >= i.total_pages) {
                return Ok(all);
            }
        }
        Err(CloudflareError::Rejected {
            status: 200,
            message: format!("more than {} records at {name}", MAX_RECORD_PAGES * 100),
        })
    }

    /// Creates a record; `content` as Cloudflare wants it (TXT quoted).
    pub async fn create(
        &self, token: &str, zone: &str, record: &Record,
    ) -> Result<Record, CloudflareError> {
        let body = NewRecord {
            kind: &record.kind,
            name: &record.name,
            content: &record.content,
            ttl: 1,
            priority: record.priority,
            proxied: (record.kind == "CNAME").then_some(false),
        };
        self.send(
            token,
            self.http
                .post(format!("{}/zones/{zone}/dns_records", self.base))
                .json(&body),
        )
        .await
    }

    async fn send<T: DeserializeOwned>(
        &self, token: &str, req: reqwest::RequestBuilder,
    ) -> Result<T, CloudflareError> {
        self.send_paged(token, req).await.map(|(result, _)| result)
    }

    /// [`Self::send`], with where the page stands in its list when the answer says.
    async fn send_paged<T: DeserializeOwned>(
        &self, token: &str, req: reqwest::RequestBuilder,
    ) -> Result<(T, Option<ResultInfo>), CloudflareError> {
        let reply = outside::exchange(req.bearer_auth(token))
            .await
            .map_err(CloudflareError::Unavailable)?;
        let (status, body) = (reply.status, reply.body);
        let envelope: Option<Envelope<T>> = serde_json::from_slice(&body).ok();
        let message = envelope
            .as_ref()
            .map(|e| {
                e.errors
                    .iter()
                    .map(|i| format!("{} {}", i.code, i.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect());
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(CloudflareError::Unavailable(format!("{status}: {message}")));
        }
        let auth_code = envelope
            .as_ref()
            .is_some_and(|e| e.errors.iter().any(|i| AUTH_ERROR_CODES.contains(&i.code)));
        if status.as_u16() == 401 || status.as_u16() == 403 || auth_code {
            return Err(CloudflareError::Unauthorized(message));
        }
        let identical = envelope
            .as_ref()
            .is_some_and(|e| e.errors.iter().any(|i| i.code == IDENTICAL_RECORD));
        if identical {
            return Err(CloudflareError::Exists);
        }
        match envelope {
            Some(Envelope {
                success: true,
                result: Some(result),
                result_info,
                ..
            }) if status.is_success() => Ok((result, result_info)),
            _ => Err(CloudflareError::Rejected {
                status: status.as_u16(),
                message,
            }),
        }
    }
}
