//! `/app/usage`: the mail of the last 30 days as a chart, the balance, the plan and its
//! limits, and the latest log entries, asked of the sender and billing over NATS as the
//! account's primary key would.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};
use serde_json::Value;

use postmesh_shared::{ApiError, Service};

use super::chart::{self, text};
use super::{layout, no_key, service_get, session_auth, Csrf};
use crate::sessions::Session;
use crate::AppState;

/// Log entries the page shows.
const LATEST: usize = 10;

fn limit_row(label: &str, v: &Value, cap: &str) -> Markup {
    html! { tr { th scope="row" { (label) } td { (text(&v["used"])) " of " (text(&v[cap])) } } }
}

fn body(
    balance: Option<Value>, ent: Option<Value>, logs: Option<Value>, stats: Option<Value>,
) -> Markup {
    let unavailable = html! { p.error { "Not available right now; reload in a moment." } };
    html! {
        h2 { "Mail, last 30 days" }
        @match &stats {
            Some(stats) => (chart::mail(stats)),
            None => (unavailable),
        }
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
    let Some(auth) = session_auth(&state, &session).await? else {
        return Ok(no_key(&state, &session, &csrf));
    };
    let limit = format!("limit={LATEST}");
    let (balance, ent, logs, stats) = tokio::join!(
        service_get(&state, Service::Billing, &auth, "/balance", ""),
        service_get(&state, Service::Billing, &auth, "/billing/entitlements", ""),
        service_get(&state, Service::Billing, &auth, "/logs", &limit),
        service_get(&state, Service::Sender, &auth, "/email-stats", "days=30"),
    );
    let markup = layout(
        "Usage",
        Some(&session),
        &csrf,
        body(balance.ok(), ent.ok(), logs.ok(), stats.ok()),
    );
    Ok(csrf.page(&state, StatusCode::OK, markup))
}
