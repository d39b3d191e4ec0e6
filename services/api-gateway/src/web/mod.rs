//! The web app: server-rendered pages (maud), usable without JavaScript and on a phone.
//! Every form carries a CSRF token that must equal the `pm_csrf` cookie (double submit).
//! Policy: docs/decisions.md, "Web app".

mod device;
mod keys;
mod login;
mod usage;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use subtle::ConstantTimeEq;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::Routes;

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
}

/// The CSRF cookie's name.
pub const CSRF_COOKIE: &str = "pm_csrf";
/// Hex characters of a CSRF token.
const CSRF_LEN: usize = 64;

/// The CSRF token of a page: the browser's `pm_csrf` cookie, or a new one set with the page.
pub struct Csrf {
    token: String,
    fresh: bool,
}

impl Csrf {
    /// The request's token, or a fresh one.
    pub fn of(headers: &HeaderMap) -> Self {
        match cookie(headers, CSRF_COOKIE) {
            Some(token) if token.len() == CSRF_LEN => Self {
                token: token.to_owned(),
                fresh: false,
            },
            _ => Self {
                token: sessions::random_hex(32),
                fresh: true,
            },
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

/// `None` when the form's `csrf` field equals the `pm_csrf` cookie; otherwise the 403 page.
pub fn csrf_refusal(state: &AppState, headers: &HeaderMap, given: &str) -> Option<Response> {
    let expected = cookie(headers, CSRF_COOKIE).unwrap_or_default();
    if expected.len() == CSRF_LEN && bool::from(expected.as_bytes().ct_eq(given.as_bytes())) {
        return None;
    }
    let csrf = Csrf::of(headers);
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
";

/// A whole page: `title`, the navigation when signed in, then `body`.
pub fn layout(title: &str, session: Option<&Session>, csrf: &Csrf, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Postmesh" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                @if let Some(session) = session {
                    nav {
                        a href="/app/usage" { "Usage" }
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
