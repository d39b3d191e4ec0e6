//! The one typed test client: `get::<T>(path, expected_status)` and friends, against the
//! gateway over HTTP or straight into a service's router (`oneshot`, only Postgres behind
//! it). A status other than the expected one fails the test with the answer's body.

use axum::body::Body;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tower::ServiceExt;

use postmesh_shared::proto::AuthContext;

/// Where requests go.
#[derive(Clone)]
enum Target {
    /// The gateway, with an optional bearer key.
    Http {
        base: String,
        http: reqwest::Client,
        key: Option<String>,
    },
    /// A service's router, called as the gateway would with this caller.
    Router {
        router: axum::Router,
        auth: Option<AuthContext>,
    },
}

/// A typed client of one API surface.
#[derive(Clone)]
pub struct TestClient {
    target: Target,
    /// Extra headers sent with every request.
    headers: Vec<(String, String)>,
}

impl TestClient {
    /// Calls the gateway at `base` (`http://host:port`), with `key` as bearer if given.
    pub fn http(base: &str, key: Option<&str>) -> Self {
        Self {
            target: Target::Http {
                base: base.to_owned(),
                http: crate::http_client(),
                key: key.map(str::to_owned),
            },
            headers: Vec::new(),
        }
    }

    /// Calls `router` directly, as the gateway forwards requests of `auth` (or of nobody).
    pub fn router(router: axum::Router, auth: Option<AuthContext>) -> Self {
        Self {
            target: Target::Router { router, auth },
            headers: Vec::new(),
        }
    }

    /// The same client, also sending header `name: value`.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Whether the client's own headers name the body's content type.
    fn typed(&self) -> bool {
        self.headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
    }

    /// Sends one request (a body is sent as JSON unless the client's headers give another
    /// content type); the whole answer.
    pub async fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Answer {
        match &self.target {
            Target::Http { base, http, key } => {
                let mut req = http.request(method, format!("{base}{path}"));
                if let Some(key) = key {
                    req = req.bearer_auth(key);
                }
                for (name, value) in &self.headers {
                    req = req.header(name, value);
                }
                if let Some(body) = body {
                    if !self.typed() {
                        req = req.header("content-type", "application/json");
                    }
                    req = req.body(body);
                }
                let res = req.send().await.expect("the gateway answers");
                Answer {
                    status: res.status(),
                    headers: res.headers().clone(),
                    body: res.bytes().await.expect("body").to_vec(),
                }
            }
            Target::Router { router, auth } => {
                let mut req = axum::http::Request::builder()
                    .method(method.as_str())
                    .uri(path);
                if !self.typed() {
                    req = req.header("content-type", "application/json");
                }
                for (name, value) in &self.headers {
                    req = req.header(name, value);
                }
                let mut req = req
                    .body(Body::from(body.unwrap_or_default()))
                    .expect("request");
                if let Some(auth) = auth {
                    req.extensions_mut().insert(auth.clone());
                }
                let res = router.clone().oneshot(req).await.expect("infallible");
                let status = StatusCode::from_u16(res.status().as_u16()).expect("status");
                let mut headers = HeaderMap::new();
                for (name, value) in res.headers() {
                    if let (Ok(name), Ok(value)) = (
                        HeaderName::from_bytes(name.as_str().as_bytes()),
                        HeaderValue::from_bytes(value.as_bytes()),
                    ) {
                        headers.append(name, value);
                    }
                }
                let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
                    .await
                    .expect("body");
                Answer {
                    status,
                    headers,
                    body: bytes.to_vec(),
                }
            }
        }
    }

    /// Sends `body` as JSON with `method`; the whole answer, whatever its status.
    pub async fn request(&self, method: Method, path: &str, body: &impl Serialize) -> Answer {
        let body = serde_json::to_vec(body).expect("JSON body");
        self.send(method, path, Some(body)).await
    }

    /// Sends a request, asserts its status, and parses the JSON answer as `T`.
    pub async fn call<T: DeserializeOwned>(
        &self, method: Method, path: &str, body: Option<Vec<u8>>, expected: StatusCode,
    ) -> T {
        self.send(method.clone(), path, body)
            .await
            .expect(expected, &format!("{method} {path}"))
    }

    /// `GET path`, expecting `expected`, answer parsed as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, expected: StatusCode) -> T {
        self.call(Method::GET, path, None, expected).await
    }

    /// `DELETE path`, expecting `expected`, answer parsed as `T`.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str, expected: StatusCode) -> T {
        self.call(Method::DELETE, path, None, expected).await
    }

    /// `POST path` with a JSON body, expecting `expected`, answer parsed as `T`.
    pub async fn post<T: DeserializeOwned>(
        &self, path: &str, body: &impl Serialize, expected: StatusCode,
    ) -> T {
        let body = serde_json::to_vec(body).expect("JSON body");
        self.call(Method::POST, path, Some(body), expected).await
    }

    /// `POST path` with an empty JSON object (an action that takes no input), expecting
    /// `expected`, answer parsed as `T`.
    pub async fn act<T: DeserializeOwned>(&self, path: &str, expected: StatusCode) -> T {
        self.call(Method::POST, path, Some(b"{}".to_vec()), expected)
            .await
    }

    /// `PUT path` with a JSON body, expecting `expected`, answer parsed as `T`.
    pub async fn put<T: DeserializeOwned>(
        &self, path: &str, body: &impl Serialize, expected: StatusCode,
    ) -> T {
        let body = serde_json::to_vec(body).expect("JSON body");
        self.call(Method::PUT, path, Some(body), expected).await
    }

    /// `PATCH path` with a JSON body, expecting `expected`, answer parsed as `T`.
    pub async fn patch<T: DeserializeOwned>(
        &self, path: &str, body: &impl Serialize, expected: StatusCode,
    ) -> T {
        let body = serde_json::to_vec(body).expect("JSON body");
        self.call(Method::PATCH, path, Some(body), expected).await
    }
}

/// One answer: its status, headers and body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    /// Asserts the status (`what` names the request in the failure), then parses the JSON
    /// body as `T`; either failing shows the body.
    pub fn expect<T: DeserializeOwned>(&self, expected: StatusCode, what: &str) -> T {
        let text = String::from_utf8_lossy(&self.body);
        assert_eq!(self.status, expected, "{what}: {text}");
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{what}: unexpected body ({e}): {text}"))
    }

    /// The body as `T`, whatever the status.
    pub fn json<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "unexpected body ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .expect("a text header")
    }
}

/// The seconds an answer's `Retry-After` header asks for.
pub fn retry_after(headers: &HeaderMap) -> u64 {
    headers["retry-after"]
        .to_str()
        .expect("Retry-After is text")
        .parse()
        .expect("Retry-After is seconds")
}
