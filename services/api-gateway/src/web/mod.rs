//! The web app: server-rendered pages (maud), usable without JavaScript and on a phone.
//! Every form carries a CSRF token: signed in, an HMAC of the session cookie; signed out,
//! the `pm_csrf` cookie's value (double submit).
//! Policy: docs/decisions.md, "Web app".

mod chart;
mod device;
mod emails;
mod keys;
mod login;
mod usage;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use hmac::{Hmac, Mac};
use maud::{html, Markup, DOCTYPE};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::error::ErrorBody;
use postmesh_shared::proto::{AuthContext, HttpRequest, Role};
use postmesh_shared::{nats, ApiError, Routes, Service};
use serde_json::Value;

use crate::sessions::{self, cookie, Session};
use crate::AppState;

/// The pages of the web app.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::APP, login::home)
        .at(api::APP_LOGIN, login::page)
        .at(api::APP_LOGIN_SEND, login::send)
        .at(api::APP_LOGIN_VERIFY, login::verify)
        .at(api::APP_LOGOUT, login::logout)
        .at(api::APP_DEVICE, device::page)
        .at(api::APP_DEVICE_DECIDE, device::decide)
        .at(api::APP_KEYS, keys::page)
        .at(api::APP_KEY_CREATE, keys::create)
        .at(api::APP_KEY_REVOKE, keys::revoke)
        .at(api::APP_USAGE, usage::page)
        .at(api::APP_EMAILS, emails::list)
        .at(api::APP_EMAIL, emails::one)
}

/// What the signed-in account's pages ask other services as: its primary key (none before
/// it has one).
pub async fn session_auth(
    state: &AppState, session: &Session,
) -> Result<Option<AuthContext>, ApiError> {
    let Some(primary) = crate::accounts::primary_key(state, session.account).await? else {
        return Ok(None);
    };
    Ok(Some(AuthContext {
        account_id: session.account.to_string(),
        workspace_id: session.account.to_string(),
        api_key_id: primary.to_string(),
        key_id: primary.to_string(),
        role: Role::Member as i32,
        email: session.email.clone(),
        test: false,
    }))
}

/// The page of an account without an API key to act as.
pub fn no_key(state: &AppState, session: &Session, csrf: &Csrf) -> Response {
    let body = html! { p.error role="alert" { "This account has no API key to bill to yet." } };
    let markup = layout("Usage", Some(session), csrf, body);
    csrf.page(state, StatusCode::INTERNAL_SERVER_ERROR, markup)
}

/// Why a page cannot show what it asked a service for.
pub enum Unshown {
    /// The service refused the request: its status and error, to show as they are.
    Refused(StatusCode, String),
    /// The service did not answer, or not as it should.
    Unavailable,
}

/// `GET path?query` of `service` as `auth`: the answer's JSON, or why there is none.
pub async fn service_get(
    state: &AppState, service: Service, auth: &AuthContext, path: &str, query: &str,
) -> Result<Value, Unshown> {
    let req = HttpRequest {
        method: "GET".into(),
        path: path.into(),
        query: query.into(),
        auth: Some(auth.clone()),
        ..Default::default()
    };
    match nats::forward(&state.nats, &state.bulk, &state.ns, service, &req).await {
        Ok(reply) if reply.status == 200 => {
            serde_json::from_slice(&reply.body).map_err(|_| Unshown::Unavailable)
        }
        Ok(reply) => {
            tracing::warn!(path, status = reply.status, %service, "web app: refused");
            let status = u16::try_from(reply.status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .filter(StatusCode::is_client_error);
            let error = serde_json::from_slice::<ErrorBody>(&reply.body).map(|b| b.error);
            match (status, error) {
                (Some(status), Ok(error)) => Err(Unshown::Refused(status, error)),
                _ => Err(Unshown::Unavailable),
            }
        }
        Err(e) => {
            tracing::warn!(path, error = %e, %service, "web app: unavailable");
            Err(Unshown::Unavailable)
        }
    }
}

/// The CSRF cookie's name.
pub const CSRF_COOKIE: &str = "pm_csrf";
/// Hex characters of a CSRF token.
const CSRF_LEN: usize = 64;

/// The CSRF token of a page. Signed in, it is bound to the session (an HMAC of the
/// session cookie under `CODE_SECRET`), so a cookie planted by another site or subdomain
/// is no valid token; signed out, the browser's `pm_csrf` cookie, or a new one. The page
/// sets the cookie when it differs from the token.
pub struct Csrf {
    token: String,
    fresh: bool,
}

impl Csrf {
    /// The request's token: its session's, else its cookie's, else a fresh one.
    pub fn of(state: &AppState, headers: &HeaderMap) -> Self {
        let cookie_token = cookie(headers, CSRF_COOKIE).filter(|t| t.len() == CSRF_LEN);
        let token = match session_token(state, headers) {
            Some(bound) => bound,
            None => match cookie_token {
                Some(token) => token.to_owned(),
                None => sessions::random_hex(32),
            },
        };
        Self {
            fresh: cookie_token != Some(token.as_str()),
            token,
        }
    }

    /// The hidden form field that carries the token.
    pub fn field(&self) -> Markup {
        html! { input type="hidden" name="csrf" value=(self.token); }
    }

    /// `markup` with `status`, never cached nor framed, setting the cookie when the token
    /// is new.
    pub fn page(&self, state: &AppState, status: StatusCode, markup: Markup) -> Response {
        let mut res = (status, Html(markup.into_string())).into_response();
        let headers = res.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; style-src 'unsafe-inline'; frame-ancestors 'none'",
            ),
        );
        if self.fresh {
            let cookie = sessions::set_cookie(state, CSRF_COOKIE, &self.token, 86400 * 7, "Strict");
            res.headers_mut().append(header::SET_COOKIE, cookie);
        }
        res
    }
}

/// The CSRF token bound to the request's session cookie, if it carries one.
fn session_token(state: &AppState, headers: &HeaderMap) -> Option<String> {
    let session = cookie(headers, sessions::session_cookie(state))?;
    let mut mac = Hmac::<Sha256>::new_from_slice(state.config.codes.secret.as_bytes()).ok()?;
    mac.update(b"csrf:");
    mac.update(session.as_bytes());
    Some(hex::encode(mac.finalize().into_bytes()))
}

/// `None` when the form's `csrf` field is the request's token (its session's when signed
/// in, else the `pm_csrf` cookie); otherwise the 403 page.
pub fn csrf_refusal(state: &AppState, headers: &HeaderMap, given: &str) -> Option<Response> {
    let expected = session_token(state, headers)
        .or_else(|| cookie(headers, CSRF_COOKIE).map(str::to_owned))
        .unwrap_or_default();
    if expected.len() == CSRF_LEN && bool::from(expected.as_bytes().ct_eq(given.as_bytes())) {
        return None;
    }
    let csrf = Csrf::of(state, headers);
    Some(csrf.page(
        state,
        StatusCode::FORBIDDEN,
        layout(
            "Form expired",
            None,
            &csrf,
            html! {
                p.error role="alert" { "This form expired or came from another site. Go back, reload the page and try again." }
            },
        ),
    ))
}

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:40rem;padding:1rem;line-height:1.5}
nav{display:flex;flex-wrap:wrap;gap:1rem;align-items:center;border-bottom:1px solid #ccc;padding-bottom:.5rem}
nav span,main{overflow-wrap:anywhere}
label{display:block;margin-top:.75rem;font-weight:600}
input[type=email],input[type=text]{width:100%;box-sizing:border-box;padding:.5rem;font-size:1rem}
button{margin-top:.75rem;padding:.5rem 1rem;font-size:1rem}
.error{color:#a00}.ok{color:#060}
.code{font-family:monospace;font-size:1.5rem;letter-spacing:.1em}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.25rem;text-align:left}
.scroll{overflow-x:auto}
svg.chart{width:100%;height:auto;border:1px solid #ddd}
.legend span{margin-right:.75rem;white-space:nowrap}
";

/// A form that carries only its CSRF token (a button: revoke, sign out).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
pub struct CsrfForm {
    csrf: String,
}

/// A page's `head`: its title and its style sheet.
pub fn head(title: &str, style: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) }
            style { (maud::PreEscaped(style)) }
        }
    }
}

/// A whole page: `title`, the navigation when signed in, then `body`.
pub fn layout(title: &str, session: Option<&Session>, csrf: &Csrf, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(&format!("{title} · Postmesh"), STYLE))
            body {
                @if let Some(session) = session {
                    nav {
                        a href="/app/usage" { "Usage" }
                        a href="/app/emails" { "Emails" }
                        a href="/app/keys" { "API keys" }
                        a href="/app/device" { "Approve a device" }
                        span { (session.email) }
                        form method="post" action="/app/logout" {
                            (csrf.field())
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// A Unix time as `YYYY-MM-DD HH:MM UTC`.
pub fn when(unix: i64) -> String {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute] UTC");
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_default()
}
