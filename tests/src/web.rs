//! A signed-in browser, in tests: the session and CSRF cookies a real browser would keep,
//! sent by hand, redirects not followed, so each step's answer can be checked.

use reqwest::header::{HeaderMap, COOKIE, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde::Serialize;

use crate::{Answer, Stack};

/// A web-app user of a stack's gateway.
pub struct WebUser {
    pub base: String,
    pub email: String,
    /// The `pm_session` cookie's value (empty: signed out).
    pub session: String,
    /// The `pm_csrf` cookie's value, once a page set it.
    pub csrf: String,
    http: reqwest::Client,
}

/// The value `name` gets in the answer's `Set-Cookie` headers, if any.
pub fn set_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
}

/// The whole `Set-Cookie` header of cookie `name`.
pub fn set_cookie_header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(str::to_owned)
}

impl WebUser {
    /// A signed-out browser of `base`.
    pub fn new(base: &str, email: &str) -> Self {
        postmesh_shared::tls::install_provider();
        Self {
            base: base.to_owned(),
            email: email.to_owned(),
            session: String::new(),
            csrf: String::new(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
        }
    }

    /// Signs `email` in through the JSON API (`/login/code`, the emailed code,
    /// `/verify-code-login`); `sent_before` is how many login emails it already got.
    pub async fn login(stack: &Stack, email: &str, sent_before: usize) -> Self {
        let mut user = Self::new(&stack.base, email);
        let asked = user
            .json(
                Method::POST,
                "/login/code",
                &serde_json::json!({ "email": email }),
            )
            .await;
        assert_eq!(asked.status, StatusCode::OK, "{asked:?}");
        let code = stack.code_sent_to(email, sent_before + 1).await;
        let signed = user
            .json(
                Method::POST,
                "/verify-code-login",
                &serde_json::json!({ "email": email, "code": code }),
            )
            .await;
        assert_eq!(signed.status, StatusCode::OK, "{signed:?}");
        user.session = set_cookie(&signed.headers, "pm_session").expect("session cookie");
        user
    }

    fn cookies(&self) -> String {
        format!("pm_session={}; pm_csrf={}", self.session, self.csrf)
    }

    /// Keeps the cookies the answer sets.
    fn keep(&mut self, headers: &HeaderMap) {
        if let Some(csrf) = set_cookie(headers, "pm_csrf") {
            self.csrf = csrf;
        }
        if let Some(session) = set_cookie(headers, "pm_session") {
            self.session = session;
        }
    }

    /// A JSON request with the session cookie.
    pub async fn json(&mut self, method: Method, path: &str, body: &impl Serialize) -> Answer {
        let res = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header(COOKIE, self.cookies())
            .json(body)
            .send()
            .await
            .expect("the gateway answers");
        self.answer(res).await
    }

    async fn answer(&mut self, res: reqwest::Response) -> Answer {
        let (status, headers) = (res.status(), res.headers().clone());
        self.keep(&headers);
        Answer {
            status,
            headers,
            body: res.bytes().await.expect("body").to_vec(),
        }
    }

    /// `GET path` as a browser would.
    pub async fn page(&mut self, path: &str) -> Answer {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .header(COOKIE, self.cookies())
            .send()
            .await
            .expect("the gateway answers");
        self.answer(res).await
    }

    /// Submits a form to `path` with `fields` and the CSRF token `csrf`.
    pub async fn form_with_csrf(
        &mut self, path: &str, csrf: &str, fields: &[(&str, &str)],
    ) -> Answer {
        let mut all = vec![("csrf", csrf)];
        all.extend_from_slice(fields);
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .header(COOKIE, self.cookies())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(&all).expect("form"))
            .send()
            .await
            .expect("the gateway answers");
        self.answer(res).await
    }

    /// Submits a form to `path` with `fields`, as the page's form would (its CSRF token).
    pub async fn form(&mut self, path: &str, fields: &[(&str, &str)]) -> Answer {
        let csrf = self.csrf.clone();
        self.form_with_csrf(path, &csrf, fields).await
    }
}

/// The answer's body as text.
pub fn text(answer: &Answer) -> String {
    String::from_utf8_lossy(&answer.body).into_owned()
}
