//! The HTTP client of the Postmesh API: a call names a route of the contracts' manifests, the
//! bearer key goes only where the route's policy asks for it, and every failure is one
//! [`ApiError`] whose text is the line the user reads.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use postmesh_contracts::{HttpMethod, Policy, RouteSpec};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The longest answer the CLI reads (a whole log download included); longer is an error.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a whole answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Characters of a non-JSON error body quoted in an error line at most.
const QUOTED_BODY_MAX: usize = 200;

/// Why a call failed; its text is the user's error line (after `error: `).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No connection, or it broke before a whole answer came.
    #[error("cannot reach the Postmesh API at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// A 401 to a call that carried the API key.
    #[error("the API key was refused (401): {message}; run postmesh login")]
    KeyRefused { message: String },
    /// Any other non-2xx answer, with the server's `error` field.
    #[error("{status}: {message}")]
    Status { status: StatusCode, message: String },
    /// A route that needs a key, and no key stored or given.
    #[error("not logged in; run postmesh login or set POSTMESH_API_KEY")]
    NotLoggedIn,
    /// A 2xx answer whose body is not the JSON the route promises.
    #[error("unexpected answer from the Postmesh API ({status}): {reason}")]
    BadAnswer { status: StatusCode, reason: String },
    /// A request body that cannot be encoded as JSON.
    #[error("cannot encode the request: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Makes ring the process's rustls provider, as `shared::tls` does for the services; reqwest
/// built with `rustls-no-provider` panics when a client is built without one.
fn install_tls_provider() {
    // Err means a provider is already installed, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The API's base URL: `http` or `https`, with a host; kept without a trailing slash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl(String);

impl FromStr for BaseUrl {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        let url = Url::parse(raw.trim()).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(format!("{raw:?} is not an http:// or https:// URL"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{raw:?} must not have a query or a fragment"));
        }
        Ok(Self(url.as_str().trim_end_matches('/').to_owned()))
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One request to make: a route with its path parameter filled in, a query and a JSON body.
#[derive(Clone, Debug)]
pub struct Call {
    method: HttpMethod,
    policy: Policy,
    path: String,
    body: Option<Vec<u8>>,
}

impl Call {
    /// A call to `route` as declared (its path parameter still to fill with [`Call::id`]).
    pub fn to(route: RouteSpec) -> Self {
        Self {
            method: route.method,
            policy: route.policy,
            path: route.path.to_owned(),
            body: None,
        }
    }

    /// Fills the path's `{param}` with `id` (a uuid needs no escaping).
    pub fn id(mut self, id: Uuid) -> Self {
        if let (Some(open), Some(close)) = (self.path.find('{'), self.path.find('}')) {
            if open < close {
                self.path.replace_range(open..=close, &id.to_string());
            }
        }
        self
    }

    /// Adds `name=value` to the query string; `value` must be URL-safe (numbers, flags).
    pub fn query(mut self, name: &str, value: impl fmt::Display) -> Self {
        let sep = if self.path.contains('?') { '&' } else { '?' };
        self.path = format!("{}{sep}{name}={value}", self.path);
        self
    }

    /// Sends `body` as the JSON body.
    pub fn json(mut self, body: &impl Serialize) -> Result<Self, ApiError> {
        self.body = Some(serde_json::to_vec(body)?);
        Ok(self)
    }
}

/// An answer as the server sent it: its status and its body's text.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub raw: String,
    /// Whether the call carried the API key (a 401 then means the key was refused).
    keyed: bool,
}

/// A 2xx answer: its body parsed, and as sent (what `--json` prints).
#[derive(Debug)]
pub struct Answer<T> {
    pub status: StatusCode,
    pub body: T,
    pub raw: String,
}

/// The error body of every route (spec §7): `{success: false, error}`.
#[derive(Deserialize)]
struct ErrorBody {
    error: Option<String>,
}

impl Reply {
    /// An answer with `status` and body `raw` to a call that did (`keyed`) or did not carry
    /// the key.
    pub fn new(status: StatusCode, raw: String, keyed: bool) -> Self {
        Self { status, raw, keyed }
    }

    /// The body parsed as `T` when the status is 2xx; otherwise the error it stands for.
    pub fn into_answer<T: DeserializeOwned>(self) -> Result<Answer<T>, ApiError> {
        let raw = self.into_success()?;
        let body = serde_json::from_str(&raw.raw).map_err(|e| ApiError::BadAnswer {
            status: raw.status,
            reason: e.to_string(),
        })?;
        Ok(Answer {
            status: raw.status,
            body,
            raw: raw.raw,
        })
    }

    /// The body unparsed when the status is 2xx; otherwise the error it stands for.
    pub fn into_success(self) -> Result<Answer<()>, ApiError> {
        if self.status.is_success() {
            Ok(Answer {
                status: self.status,
                body: (),
                raw: self.raw,
            })
        } else {
            Err(self.error())
        }
    }

    /// The error a non-2xx answer stands for.
    pub fn error(&self) -> ApiError {
        let message = self.message();
        if self.status == StatusCode::UNAUTHORIZED && self.keyed {
            ApiError::KeyRefused { message }
        } else {
            ApiError::Status {
                status: self.status,
                message,
            }
        }
    }

    /// The server's `error` field; else the start of a non-JSON body; else the status's name.
    fn message(&self) -> String {
        if let Ok(ErrorBody { error: Some(error) }) = serde_json::from_str(&self.raw) {
            return error;
        }
        let text = self.raw.trim();
        if !text.is_empty() && !text.starts_with('{') {
            return crate::output::clip(text, QUOTED_BODY_MAX);
        }
        self.status
            .canonical_reason()
            .unwrap_or("no error message")
            .to_lowercase()
    }
}

/// A client of one Postmesh API, with the key to present, if any.
pub struct Client {
    http: reqwest::Client,
    base_url: BaseUrl,
    api_key: Option<String>,
}

impl Client {
    /// The API it calls.
    pub fn base_url(&self) -> &BaseUrl {
        &self.base_url
    }

    /// A client of `base_url` presenting `api_key` to the routes that need one.
    pub fn new(base_url: BaseUrl, api_key: Option<String>) -> anyhow::Result<Self> {
        install_tls_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("postmesh-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTP client: {}", root_cause(&e)))?;
        Ok(Self {
            http,
            base_url,
            api_key,
        })
    }

    /// Makes `call` and returns the answer whatever its status; only a failure to get one is
    /// an error.
    pub async fn exchange(&self, call: &Call) -> Result<Reply, ApiError> {
        let url = format!("{}{}", self.base_url, call.path);
        let mut request = self.http.request(method(call.method), url);
        let keyed = call.policy == Policy::Key;
        if keyed {
            let key = self.api_key.as_deref().ok_or(ApiError::NotLoggedIn)?;
            request = request.bearer_auth(key);
        }
        if let Some(body) = &call.body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
        }
        let unreachable = |e: reqwest::Error| ApiError::Unreachable {
            url: self.base_url.to_string(),
            reason: if e.is_timeout() {
                "no answer in time".to_owned()
            } else {
                root_cause(&e)
            },
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let mut raw = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if raw.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(ApiError::Unreachable {
                    url: self.base_url.to_string(),
                    reason: format!("an answer over {} MiB", MAX_ANSWER_BYTES >> 20),
                });
            }
            raw.extend_from_slice(&chunk);
        }
        let raw = String::from_utf8_lossy(&raw).into_owned();
        Ok(Reply::new(status, raw, keyed))
    }

    /// Makes `call` and parses its 2xx answer as `T`.
    pub async fn call<T: DeserializeOwned>(&self, call: &Call) -> Result<Answer<T>, ApiError> {
        self.exchange(call).await?.into_answer()
    }
}

fn method(method: HttpMethod) -> Method {
    match method {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Delete => Method::DELETE,
    }
}

/// The innermost cause of `e` (`Connection refused (os error 111)`), which says the most.
fn root_cause(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use postmesh_contracts::routes::{billing, domain};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that answers one request with `status` and `body`, and hands back the
    /// request's text.
    async fn answer_once(
        status: &'static str, body: &'static str,
    ) -> (BaseUrl, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base: BaseUrl = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                request.extend_from_slice(&buf[..n]);
            }
            let reply = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&request).into_owned()
        });
        (base, served)
    }

    #[tokio::test]
    async fn a_keyed_call_sends_the_bearer_key_and_parses_the_answer() {
        let (base, served) = answer_once("200 OK", r#"{"success":true,"balance":42}"#).await;
        let client = Client::new(base, Some("pm_ab_cd".into())).unwrap();
        let answer: Answer<serde_json::Value> =
            client.call(&Call::to(billing::BALANCE)).await.unwrap();
        assert_eq!(answer.body["balance"], 42);
        assert_eq!(answer.raw, r#"{"success":true,"balance":42}"#);
        let request = served.await.unwrap().to_lowercase();
        assert!(request.starts_with("get /balance http/1.1"), "{request}");
        assert!(
            request.contains("authorization: bearer pm_ab_cd"),
            "{request}"
        );
    }

    #[tokio::test]
    async fn a_401_says_the_key_was_refused_and_how_to_fix_it() {
        let (base, _served) = answer_once(
            "401 Unauthorized",
            r#"{"success":false,"error":"invalid API key"}"#,
        )
        .await;
        let client = Client::new(base, Some("pm_ab_cd".into())).unwrap();
        let err = client
            .call::<serde_json::Value>(&Call::to(billing::BALANCE))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the API key was refused (401): invalid API key; run postmesh login"
        );
    }

    #[tokio::test]
    async fn a_500_names_the_status_and_the_servers_error() {
        let (base, _served) = answer_once(
            "500 Internal Server Error",
            r#"{"success":false,"error":"log query failed"}"#,
        )
        .await;
        let client = Client::new(base, Some("k".into())).unwrap();
        let err = client
            .call::<serde_json::Value>(&Call::to(billing::LOGS))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "500 Internal Server Error: log query failed"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_reported_as_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let base: BaseUrl = format!("http://{addr}").parse().unwrap();
        let client = Client::new(base, Some("k".into())).unwrap();
        let err = client
            .call::<serde_json::Value>(&Call::to(billing::BALANCE))
            .await
            .unwrap_err();
        let line = err.to_string();
        assert!(
            line.starts_with(&format!("cannot reach the Postmesh API at http://{addr}: ")),
            "{line}"
        );
        assert!(line.to_lowercase().contains("refused"), "{line}");
    }

    #[tokio::test]
    async fn a_keyed_route_without_a_key_is_not_logged_in() {
        let base: BaseUrl = "http://127.0.0.1:9".parse().unwrap();
        let client = Client::new(base, None).unwrap();
        let err = client
            .exchange(&Call::to(billing::BALANCE))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "not logged in; run postmesh login or set POSTMESH_API_KEY"
        );
    }

    #[test]
    fn error_bodies_that_are_not_json_are_quoted_or_named_by_status() {
        let html = Reply::new(
            StatusCode::BAD_GATEWAY,
            "<html>bad gateway</html>".into(),
            true,
        );
        assert_eq!(
            html.error().to_string(),
            "502 Bad Gateway: <html>bad gateway</html>"
        );
        let empty = Reply::new(StatusCode::SERVICE_UNAVAILABLE, String::new(), false);
        assert_eq!(
            empty.error().to_string(),
            "503 Service Unavailable: service unavailable"
        );
        let public_401 = Reply::new(
            StatusCode::UNAUTHORIZED,
            r#"{"error":"no session"}"#.into(),
            false,
        );
        assert_eq!(
            public_401.error().to_string(),
            "401 Unauthorized: no session"
        );
    }

    #[test]
    fn paths_take_their_id_and_query() {
        let id = Uuid::nil();
        let call = Call::to(domain::DOMAIN_VERIFY_OWNERSHIP).id(id);
        assert_eq!(call.path, format!("/sender-domains/{id}/verify-ownership"));
        let call = Call::to(billing::LOGS).query("limit", 5).query("offset", 0);
        assert_eq!(call.path, "/logs?limit=5&offset=0");
    }

    #[test]
    fn base_urls_are_http_and_lose_their_trailing_slash() {
        assert_eq!(
            "https://api.example.com/"
                .parse::<BaseUrl>()
                .unwrap()
                .to_string(),
            "https://api.example.com"
        );
        assert!("ftp://example.com".parse::<BaseUrl>().is_err());
        assert!("localhost:8080".parse::<BaseUrl>().is_err());
    }
}
