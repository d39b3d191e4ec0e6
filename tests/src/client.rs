//! The one typed test client: `get::<T>(path, expected_status)` and friends, against the
//! gateway over HTTP or straight into a service's router (`oneshot`, only Postgres behind
//! it). A status other than the expected one fails the test with the answer's body.

use axum::body::Body;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tower::ServiceExt;

use postmesh_shared::proto::AuthContext;

/// Where requests go.
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

    /// Sends one request; the status and the body's bytes.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Vec<u8>) {
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
                    req = req.header("content-type", "application/json").body(body);
                }
                let res = req.send().await.expect("the gateway answers");
                let status = res.status();
                (status, res.bytes().await.expect("body").to_vec())
            }
            Target::Router { router, auth } => {
                let mut req = axum::http::Request::builder()
                    .method(method.as_str())
                    .uri(path)
                    .header("content-type", "application/json");
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
                let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
                    .await
                    .expect("body");
                (status, bytes.to_vec())
            }
        }
    }

    /// Sends a request, asserts its status, and parses the JSON answer as `T`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        expected: StatusCode,
    ) -> T {
        let (status, bytes) = self.send(method.clone(), path, body).await;
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(status, expected, "{method} {path}: {text}");
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{method} {path}: unexpected body ({e}): {text}"))
    }

    /// `GET path`, expecting `expected`, answer parsed as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, expected: StatusCode) -> T {
        self.call(Method::GET, path, None, expected).await
    }

    /// `POST path` with a JSON body, expecting `expected`, answer parsed as `T`.
    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
        expected: StatusCode,
    ) -> T {
        let body = serde_json::to_vec(body).expect("JSON body");
        self.call(Method::POST, path, Some(body), expected).await
    }
}
