//! A small W3C WebDriver client over reqwest, for the browser test: the handful of commands
//! it needs (session, navigate, find, type, click, read, screenshot). A crate such as
//! fantoccini would bring a second `http`, `thiserror`, `cookie` and ICU into the tree for
//! the same dozen JSON calls.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// The W3C identifier of element references in answers.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver session.
pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
}

/// An element of the current page.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Browser {
    /// Opens a session on the WebDriver server at `webdriver` with `capabilities`
    /// (`alwaysMatch`).
    pub async fn start(webdriver: &str, capabilities: Value) -> Result<Self, String> {
        let http = crate::http_client();
        let res = http
            .post(format!("{webdriver}/session"))
            .json(&json!({ "capabilities": { "alwaysMatch": capabilities } }))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = res.json().await.map_err(|e| e.to_string())?;
        let id = body["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session: {body}"))?;
        Ok(Self {
            session: format!("{webdriver}/session/{id}"),
            http,
        })
    }

    /// One command: `method` on `path` under the session; the answer's `value`.
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let res = req.send().await.expect("the WebDriver server answers");
        let status = res.status();
        let body: Value = res.json().await.expect("a WebDriver JSON answer");
        assert!(status.is_success(), "WebDriver {path}: {status} {body}");
        body["value"].clone()
    }

    /// Opens `url` and waits for it to load.
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// The current page's URL.
    pub async fn url(&self) -> String {
        let url = self.command(reqwest::Method::GET, "/url", None).await;
        url.as_str().unwrap_or_default().to_owned()
    }

    /// The current page's HTML.
    pub async fn source(&self) -> String {
        let html = self.command(reqwest::Method::GET, "/source", None).await;
        html.as_str().unwrap_or_default().to_owned()
    }

    /// The first element matching `css`, waiting up to 10 s for it to appear.
    pub async fn find(&self, css: &str) -> Element<'_> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let res = self
                .http
                .post(format!("{}/element", self.session))
                .json(&json!({ "using": "css selector", "value": css }))
                .send()
                .await
                .expect("the WebDriver server answers");
            let found = res.status().is_success();
            let body: Value = res.json().await.expect("a WebDriver JSON answer");
            if found {
                let id = body["value"][ELEMENT_KEY]
                    .as_str()
                    .unwrap_or_else(|| panic!("no element id in {body}"));
                return Element {
                    browser: self,
                    id: id.to_owned(),
                };
            }
            assert!(
                Instant::now() < deadline,
                "no element {css} on {}",
                self.url().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `script` (a function body) in the page; what it returns.
    pub async fn execute(&self, script: &str) -> Value {
        let body = json!({ "script": script, "args": [] });
        self.command(reqwest::Method::POST, "/execute/sync", Some(body))
            .await
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let png = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64 PNG"))
            .expect("valid base64")
    }

    /// Ends the session (the browser closes).
    pub async fn close(self) {
        self.command(reqwest::Method::DELETE, "", None).await;
    }
}

impl Element<'_> {
    fn path(&self, rest: &str) -> String {
        format!("/element/{}{rest}", self.id)
    }

    /// Types `text` into the element.
    pub async fn type_text(&self, text: &str) {
        let body = json!({ "text": text });
        self.browser
            .command(reqwest::Method::POST, &self.path("/value"), Some(body))
            .await;
    }

    /// Clicks the element.
    pub async fn click(&self) {
        self.browser
            .command(reqwest::Method::POST, &self.path("/click"), Some(json!({})))
            .await;
    }

    /// The element's rendered text.
    pub async fn text(&self) -> String {
        let text = self
            .browser
            .command(reqwest::Method::GET, &self.path("/text"), None)
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// The element's DOM property `name` (e.g. an input's `value`).
    pub async fn property(&self, name: &str) -> String {
        let path = self.path(&format!("/property/{name}"));
        let value = self
            .browser
            .command(reqwest::Method::GET, &path, None)
            .await;
        value.as_str().unwrap_or_default().to_owned()
    }
}
