//! `/app/keys`: the account's API keys; create one (its text shown once) or revoke one.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;
use uuid::Uuid;

use postmesh_contracts::answers::gateway::KeyMode;
use postmesh_shared::extract::IdPath;
use postmesh_shared::ApiError;

use super::{csrf_refusal, layout, when, Csrf, CsrfForm};
use crate::accounts::{self, KeyInfo};
use crate::sessions::Session;
use crate::AppState;

const TITLE: &str = "API keys";

/// What the page says above the list.
enum Notice<'a> {
    None,
    Created(&'a str, &'a str),
    Done(&'a str),
    Error(&'a str),
}

fn body(csrf: &Csrf, keys: &[KeyInfo], notice: Notice<'_>) -> Markup {
    html! {
        @match notice {
            Notice::Created(name, text) => {
                div.ok role="status" {
                    p { "Key " strong { (name) } " created. Copy it now: it is not shown again." }
                    label for="new-key" { "New API key" }
                    input #new-key type="text" readonly value=(text);
                }
            }
            Notice::Done(text) => { p.ok role="status" { (text) } }
            Notice::Error(text) => { p.error role="alert" { (text) } }
            Notice::None => {}
        }
        p { "Every key of your account draws on one balance: the primary key's." }
        div.scroll {
            table {
                thead { tr { th { "Name" } th { "Key" } th { "Created" } th { span { "Actions" } } } }
                tbody {
                    @for key in keys {
                        tr {
                            td { (key.name) @if key.primary { " (primary)" } }
                            td {
                                code { "pm_" @if key.mode == KeyMode::Test { "test_" } (key.prefix) "_…" }
                                @if key.mode == KeyMode::Test { " (test)" }
                            }
                            td { (when(key.created_at)) }
                            td {
                                form method="post" action={ "/app/keys/" (key.id) "/revoke" } {
                                    (csrf.field())
                                    button type="submit" aria-label={ "Revoke " (key.name) } { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Create a key" }
        form method="post" action="/app/keys" {
            (csrf.field())
            label for="name" { "Name" }
            input #name type="text" name="name" maxlength="100" required placeholder="production server";
            label for="mode" { "Mode" }
            select #mode name="mode" {
                option value="live" selected { "Live" }
                option value="test" { "Test: no delivery, no charge" }
            }
            button type="submit" { "Create key" }
        }
    }
}

async fn render(
    state: &AppState, headers: &HeaderMap, session: &Session, status: StatusCode,
    notice: Notice<'_>,
) -> Result<Response, ApiError> {
    let keys = accounts::keys_of(state, session.account).await?;
    let csrf = Csrf::of(state, headers);
    let markup = layout(TITLE, Some(session), &csrf, body(&csrf, &keys, notice));
    Ok(csrf.page(state, status, markup))
}

/// `GET /app/keys`.
pub async fn page(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
) -> Result<Response, ApiError> {
    render(&state, &headers, &session, StatusCode::OK, Notice::None).await
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct CreateForm {
    csrf: String,
    name: String,
    /// `live` when the form leaves it out.
    #[serde(default)]
    mode: Option<KeyMode>,
}

/// `POST /app/keys`.
pub async fn create(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
    Form(form): Form<CreateForm>,
) -> Result<Response, ApiError> {
    if let Some(res) = csrf_refusal(&state, &headers, &form.csrf) {
        return Ok(res);
    }
    let mode = form.mode.unwrap_or_default();
    let minted = match accounts::parse_name(&form.name) {
        Ok(name) => accounts::mint(&state, session.account, &name, mode).await,
        Err(e) => Err(e),
    };
    match minted {
        Ok((text, key)) => {
            let notice = Notice::Created(&key.name, &text);
            render(&state, &headers, &session, StatusCode::CREATED, notice).await
        }
        // A refusal the user can act on (a bad name, the quota) is shown on the page.
        Err(e) if e.status().is_client_error() => {
            let text = e.to_string();
            render(&state, &headers, &session, e.status(), Notice::Error(&text)).await
        }
        Err(e) => Err(e),
    }
}

/// `POST /app/keys/{id}/revoke`.
pub async fn revoke(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
    IdPath(id): IdPath<Uuid>, Form(form): Form<CsrfForm>,
) -> Result<Response, ApiError> {
    if let Some(res) = csrf_refusal(&state, &headers, &form.csrf) {
        return Ok(res);
    }
    match accounts::revoke_key(&state, session.account, id).await {
        Ok(()) => {
            let notice = Notice::Done("Key revoked. It stops working within a minute.");
            render(&state, &headers, &session, StatusCode::OK, notice).await
        }
        Err(e @ ApiError::NotFound(_)) => {
            let text = e.to_string();
            render(&state, &headers, &session, e.status(), Notice::Error(&text)).await
        }
        Err(e) => Err(e),
    }
}
