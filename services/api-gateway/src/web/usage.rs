//! `/app/usage`: the balance, the plan and its limits, and the latest log entries, asked of
//! billing over NATS as the account's primary key would.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};
use serde_json::Value;

use postmesh_shared::proto::{AuthContext, HttpRequest, Role};
use postmesh_shared::{nats, ApiError, Service};

use super::{layout, Csrf};
use crate::sessions::Session;
use crate::{accounts, AppState};

/// Log entries the page shows.
const LATEST: usize = 10;

/// `GET path` of billing for `auth`; the answer's JSON, or `None` when it failed.
async fn billing_get(
    state: &AppState, auth: &AuthContext, path: &str, query: &str,
) -> Option<Value> {
    let req = HttpRequest {
        method: "GET".into(),
        path: path.into(),
        query: query.into(),
        auth: Some(auth.clone()),
        ..Default::default()
    };
    match nats::forward(&state.nats, &state.bulk, &state.ns, Service::Billing, &req).await {
        Ok(reply) if reply.status == 200 => serde_json::from_slice(&reply.body).ok(),
        Ok(reply) => {
            tracing::warn!(path, status = reply.status, "usage page: billing refused");
            None
        }
        Err(e) => {
            tracing::warn!(path, error = %e, "usage page: billing unavailable");
            None
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn limit_row(label: &str, v: &Value, cap: &str) -> Markup {
    html! { tr { th scope="row" { (label) } td { (text(&v["used"])) " of " (text(&v[cap])) } } }
}

fn body(balance: Option<Value>, ent: Option<Value>, logs: Option<Value>) -> Markup {
    let unavailable = html! { p.error { "Not available right now; reload in a moment." } };
    html! {
        h2 { "Balance" }
        @match &balance {
            Some(b) => p { strong #balance { (text(&b["balance"])) } " credits" },
            None => (unavailable),
        }
        h2 { "Plan" }
        @match ent.as_ref().map(|e| &e["entitlements"]) {
            Some(e) => {
                p #plan { @match e["plan"].as_object() {
                    Some(plan) => { (text(&plan["name"])) " (" (text(&plan["status"])) ")" }
                    None => "Free",
                } }
                table {
                    @if e["emails"].is_object() { (limit_row("Emails this period", &e["emails"], "quota")) }
                    (limit_row("Mailboxes", &e["mailboxes"], "limit"))
                    (limit_row("Custom domains", &e["custom_domains"], "limit"))
                }
            }
            None => (unavailable),
        }
        h2 { "Latest activity" }
        @match logs.as_ref().and_then(|l| l["logs"].as_array()) {
            Some(entries) if entries.is_empty() => p { "Nothing yet." },
            Some(entries) => div.scroll { table {
                thead { tr { th { "When" } th { "What" } th { "To" } th { "Credits" } } }
                tbody { @for e in entries.iter().take(LATEST) { tr {
                    td { (text(&e["timestamp"])) }
                    td { (text(&e["kind"])) @if let Some(s) = e["subject"].as_str() { ": " (s) } }
                    td { (text(&e["target_email"])) }
                    td { (text(&e["amount_deducted"])) }
                } } }
            } },
            None => (unavailable),
        }
    }
}

/// `GET /app/usage`.
pub async fn page(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
) -> Result<Response, ApiError> {
    let csrf = Csrf::of(&state, &headers);
    let Some(primary) = accounts::primary_key(&state, session.account).await? else {
        let body = html! { p.error role="alert" { "This account has no API key to bill to yet." } };
        let markup = layout("Usage", Some(&session), &csrf, body);
        return Ok(csrf.page(&state, StatusCode::INTERNAL_SERVER_ERROR, markup));
    };
    let auth = AuthContext {
        account_id: session.account.to_string(),
        workspace_id: session.account.to_string(),
        api_key_id: primary.to_string(),
        key_id: primary.to_string(),
        role: Role::Member as i32,
        email: session.email.clone(),
        test: false,
    };
    let limit = format!("limit={LATEST}");
    let (balance, ent, logs) = tokio::join!(
        billing_get(&state, &auth, "/balance", ""),
        billing_get(&state, &auth, "/billing/entitlements", ""),
        billing_get(&state, &auth, "/logs", &limit),
    );
    let markup = layout("Usage", Some(&session), &csrf, body(balance, ent, logs));
    Ok(csrf.page(&state, StatusCode::OK, markup))
}
