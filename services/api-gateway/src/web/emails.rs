//! `/app/emails`: the message log with its filters (recipient, tag, state), newest first,
//! and `/app/emails/{deliveryId}`: one message with its events — asked of the sender over
//! NATS as the account's primary key would.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::Value;

use postmesh_shared::extract::IdPath;
use postmesh_shared::{ApiError, Service};

use super::chart::text;
use super::{layout, no_key, service_get, session_auth, when, Csrf, Unshown};
use crate::sessions::Session;
use crate::AppState;

/// The filters of the log, as its form sends them.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Filters {
    /// Only messages to this address.
    to: String,
    /// Only messages of sends with this tag, `name:value`.
    tag: String,
    /// Only messages in this state.
    status: String,
}

/// The states a message may be filtered by.
const STATES: [&str; 10] = [
    "queued",
    "scheduled",
    "sent",
    "delivered",
    "delayed",
    "bounced",
    "complained",
    "rejected",
    "failed",
    "cancelled",
];

/// What a page says when the sender does not answer.
const UNAVAILABLE: &str = "Not available right now; reload in a moment.";

/// [`UNAVAILABLE`] as the page's error.
fn unavailable() -> Markup {
    html! { p.error { (UNAVAILABLE) } }
}

/// The log's form, filled with `f`.
fn form(f: &Filters) -> Markup {
    html! {
        form method="get" action="/app/emails" {
            label for="to" { "To" }
            input #to type="text" name="to" value=(f.to);
            label for="tag" { "Tag (name:value)" }
            input #tag type="text" name="tag" value=(f.tag);
            label for="status" { "State" }
            select #status name="status" {
                option value="" { "any" }
                @for s in STATES {
                    option value=(s) selected[f.status == s] { (s) }
                }
            }
            button type="submit" { "Search" }
        }
    }
}

/// `GET /app/emails`.
pub async fn list(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
    Query(filters): Query<Filters>,
) -> Result<Response, ApiError> {
    let csrf = Csrf::of(&state, &headers);
    let Some(auth) = session_auth(&state, &session).await? else {
        return Ok(no_key(&state, &session, &csrf));
    };
    let query = serde_urlencoded::to_string(
        [
            ("to", &filters.to),
            ("tag", &filters.tag),
            ("status", &filters.status),
        ]
        .into_iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .chain([("limit", &"100".to_owned())])
        .collect::<Vec<_>>(),
    )
    .unwrap_or_default();
    let log = service_get(&state, Service::Sender, &auth, "/emails", &query).await;
    let body = html! {
        (form(&filters))
        @match log.as_ref().map(|l| l["emails"].as_array()) {
            Ok(Some(rows)) if rows.is_empty() => p #none { "No messages." },
            Ok(Some(rows)) => div.scroll { table #emails {
                thead { tr { th { "When" } th { "To" } th { "Subject" } th { "State" } th { "Opens" } th { "Clicks" } } }
                tbody { @for e in rows { tr {
                    td { (when(e["createdAt"].as_i64().unwrap_or(0))) }
                    td { a href=(format!("/app/emails/{}", text(&e["deliveryId"]))) { (text(&e["to"])) } }
                    td { (text(&e["subject"])) }
                    td.state { (text(&e["status"])) }
                    td.opens { (text(&e["opens"])) }
                    td.clicks { (text(&e["clicks"])) }
                } } }
            } },
            Err(Unshown::Refused(_, error)) => p.error role="alert" { (error) },
            Ok(None) | Err(Unshown::Unavailable) => (unavailable()),
        }
    };
    let markup = layout("Emails", Some(&session), &csrf, body);
    Ok(csrf.page(&state, StatusCode::OK, markup))
}

/// One event's row: what it says beyond its kind.
fn said(e: &Value) -> String {
    let d = &e["detail"];
    let mut parts = Vec::new();
    for key in ["url", "reason", "bounceType", "userAgent", "ip"] {
        if let Some(v) = d[key].as_str().filter(|v| !v.is_empty()) {
            parts.push(v.to_owned());
        }
    }
    if d["machine"] == true {
        parts.push("machine".into());
    }
    if d["first"] == true {
        parts.push("first".into());
    }
    parts.join(" · ")
}

/// `GET /app/emails/{deliveryId}`.
pub async fn one(
    State(state): State<AppState>, headers: HeaderMap, Extension(session): Extension<Session>,
    IdPath(delivery): IdPath<uuid::Uuid>,
) -> Result<Response, ApiError> {
    let csrf = Csrf::of(&state, &headers);
    let Some(auth) = session_auth(&state, &session).await? else {
        return Ok(no_key(&state, &session, &csrf));
    };
    let found = service_get(
        &state,
        Service::Sender,
        &auth,
        &format!("/emails/{delivery}"),
        "",
    )
    .await;
    let e = match found {
        Ok(e) => e,
        Err(unshown) => {
            let (status, said) = match unshown {
                Unshown::Refused(status, _) if status == StatusCode::NOT_FOUND => {
                    (status, html! { "No such message." })
                }
                Unshown::Refused(status, error) => (status, html! { (error) }),
                Unshown::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, html! { (UNAVAILABLE) }),
            };
            let body = html! { p.error role="alert" { (said) } p { a href="/app/emails" { "Back to the log" } } };
            let markup = layout("Email", Some(&session), &csrf, body);
            return Ok(csrf.page(&state, status, markup));
        }
    };
    let body = html! {
        p { a href="/app/emails" { "Back to the log" } }
        table #message {
            tr { th scope="row" { "To" } td { (text(&e["to"])) } }
            tr { th scope="row" { "Subject" } td { (text(&e["subject"])) } }
            tr { th scope="row" { "State" } td { (text(&e["status"])) } }
            tr { th scope="row" { "Tags" } td {
                @for t in e["tags"].as_array().into_iter().flatten() { code { (text(&t["name"])) ":" (text(&t["value"])) } " " }
            } }
            tr { th scope="row" { "Opens / clicks" } td { (text(&e["opens"])) " / " (text(&e["clicks"])) } }
        }
        h2 { "Events" }
        div.scroll { table #events {
            thead { tr { th { "When" } th { "Event" } th { "Detail" } } }
            tbody { @for ev in e["events"].as_array().into_iter().flatten() { tr {
                td { (when(ev["occurredAt"].as_i64().unwrap_or(0))) }
                td.kind { (text(&ev["kind"])) }
                td { (said(ev)) }
            } } }
        } }
    };
    let markup = layout("Email", Some(&session), &csrf, body);
    Ok(csrf.page(&state, StatusCode::OK, markup))
}
