//! `/app/login`: email, then the code from the email, then signed in; `/app/logout`.

use axum::extract::{Query, State};
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;

use postmesh_shared::{ApiError, EmailAddress};

use super::{csrf_refusal, layout, Csrf, CsrfForm};
use crate::sessions::{self, see_other, Session};
use crate::{login, AppState};

/// Where a signed-in browser goes next: a page of the app, or the usage page.
fn next_or_home(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with("/app/") && !n.starts_with("//") && !n.contains('\\') => {
            n.to_owned()
        }
        _ => "/app/usage".to_owned(),
    }
}

/// `GET /app`: the usage page, or the login page when signed out.
pub async fn home(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(match sessions::load(&state, &headers).await? {
        Some(_) => see_other("/app/usage"),
        None => see_other("/app/login"),
    })
}

#[derive(Deserialize)]
pub struct NextQuery {
    next: Option<String>,
}

fn email_form(csrf: &Csrf, next: &str, email: &str, error: Option<&str>) -> Markup {
    html! {
        @if let Some(error) = error { p.error role="alert" { (error) } }
        form method="post" action="/app/login" {
            (csrf.field())
            input type="hidden" name="next" value=(next);
            label for="email" { "Email address" }
            input #email type="email" name="email" value=(email) required autocomplete="email";
            button type="submit" { "Email me a login code" }
        }
    }
}

fn code_form(csrf: &Csrf, next: &str, email: &str, error: Option<&str>) -> Markup {
    html! {
        @if let Some(error) = error { p.error role="alert" { (error) } }
        @else { p { "We emailed a 6-digit code to " strong { (email) } ". It works for 5 minutes." } }
        form method="post" action="/app/login/verify" {
            (csrf.field())
            input type="hidden" name="next" value=(next);
            input type="hidden" name="email" value=(email);
            label for="code" { "Login code" }
            input #code type="text" name="code" inputmode="numeric" pattern="[0-9]{6}" maxlength="6" required autocomplete="one-time-code";
            button type="submit" { "Sign in" }
        }
        form method="get" action="/app/login" {
            input type="hidden" name="next" value=(next);
            button type="submit" { "Use another address" }
        }
    }
}

/// `GET /app/login`.
pub async fn page(
    State(state): State<AppState>, headers: HeaderMap, Query(q): Query<NextQuery>,
) -> Response {
    let csrf = Csrf::of(&state, &headers);
    let next = next_or_home(q.next.as_deref());
    let body = email_form(&csrf, &next, "", None);
    csrf.page(&state, StatusCode::OK, layout("Sign in", None, &csrf, body))
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct SendForm {
    csrf: String,
    next: String,
    email: String,
}

/// `POST /app/login`: emails the code and asks for it.
pub async fn send(
    State(state): State<AppState>, parts: Parts, Form(form): Form<SendForm>,
) -> Response {
    if let Some(res) = csrf_refusal(&state, &parts.headers, &form.csrf) {
        return res;
    }
    let csrf = Csrf::of(&state, &parts.headers);
    let next = next_or_home(Some(&form.next));
    let Some(email) = EmailAddress::parse(form.email.trim()) else {
        let body = email_form(
            &csrf,
            &next,
            &form.email,
            Some("That is not an email address."),
        );
        return csrf.page(
            &state,
            StatusCode::BAD_REQUEST,
            layout("Sign in", None, &csrf, body),
        );
    };
    let ip = sessions::client_ip(&state, &parts);
    match login::send_code(&state, ip, &email).await {
        Ok(()) => {
            let body = code_form(&csrf, &next, email.as_str(), None);
            csrf.page(
                &state,
                StatusCode::OK,
                layout("Check your email", None, &csrf, body),
            )
        }
        Err(e) => {
            let (status, text) = (e.status(), e.to_string());
            let body = email_form(&csrf, &next, email.as_str(), Some(&text));
            let mut res = csrf.page(&state, status, layout("Sign in", None, &csrf, body));
            if let Some(secs) = e.retry_after() {
                res.headers_mut().insert(header::RETRY_AFTER, secs.into());
            }
            res
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct VerifyForm {
    csrf: String,
    next: String,
    email: String,
    code: String,
}

/// `POST /app/login/verify`: signs in and goes on to `next`.
pub async fn verify(
    State(state): State<AppState>, parts: Parts, Form(form): Form<VerifyForm>,
) -> Response {
    let headers = &parts.headers;
    if let Some(res) = csrf_refusal(&state, headers, &form.csrf) {
        return res;
    }
    let csrf = Csrf::of(&state, headers);
    let next = next_or_home(Some(&form.next));
    let Some(email) = EmailAddress::parse(form.email.trim()) else {
        let body = email_form(&csrf, &next, "", Some("That is not an email address."));
        return csrf.page(
            &state,
            StatusCode::BAD_REQUEST,
            layout("Sign in", None, &csrf, body),
        );
    };
    let ip = sessions::client_ip(&state, &parts);
    match login::sign_in(&state, ip, &email, &form.code).await {
        Ok(cookie) => {
            let mut res = see_other(&next);
            res.headers_mut().append(header::SET_COOKIE, cookie);
            res
        }
        Err(e @ ApiError::NotFound(_)) => {
            let text = format!("{e}. Ask for a new code.");
            let body = email_form(&csrf, &next, email.as_str(), Some(&text));
            csrf.page(&state, e.status(), layout("Sign in", None, &csrf, body))
        }
        Err(e) => {
            let body = code_form(&csrf, &next, email.as_str(), Some(&e.to_string()));
            csrf.page(
                &state,
                e.status(),
                layout("Check your email", None, &csrf, body),
            )
        }
    }
}

/// `POST /app/logout`.
pub async fn logout(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, ApiError> {
    if let Some(res) = csrf_refusal(&state, &headers, &form.csrf) {
        return Ok(res);
    }
    let cookie = sessions::end(&state, &session).await?;
    let mut res = see_other("/app/login").into_response();
    res.headers_mut().append(header::SET_COOKIE, cookie);
    Ok(res)
}
