//! Workspace webhooks as a resource: a URL that gets the workspace's delivery events (and
//! `inbound.received`, so one endpoint can take everything), filtered by type; at most 20 per
//! workspace, a URL once per workspace, the URL rules and signing secrets of inbox endpoints.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use uuid::Uuid;

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{Caller, IdPath, JsonBody};
use postmesh_shared::{ApiError, Success};

use crate::attempt::owner::Owner;
use crate::content::payload::INBOUND_RECEIVED;
use crate::routes::endpoints::Deleted;
use crate::secret::{GivenSecret, SigningSecret};
use crate::target::WebhookUrl;
use crate::AppState;

/// Webhooks a workspace may have.
pub const MAX_PER_WORKSPACE: i64 = 20;

/// Every event type a webhook can take, with what it means.
pub const EVENT_TYPES: [(&str, &str); 14] = [
    (
        "email.queued",
        "The send was accepted and the message queued for delivery.",
    ),
    (
        "email.scheduled",
        "The send was accepted to go out at its scheduledAt.",
    ),
    (
        "email.sent",
        "The message was handed to the mail transport.",
    ),
    (
        "email.delivered",
        "The recipient's mail server accepted the message.",
    ),
    (
        "email.bounced",
        "The recipient's mail server refused the message; reason and bounceType say why.",
    ),
    (
        "email.complained",
        "The recipient reported the message as spam.",
    ),
    (
        "email.rejected",
        "The mail provider refused to send the message; reason says why.",
    ),
    (
        "email.delayed",
        "Delivery is delayed and the provider keeps trying.",
    ),
    (
        "email.failed",
        "Postmesh gave up on the message for good; reason says why.",
    ),
    (
        "email.unsubscribed",
        "The recipient unsubscribed, by one-click link or at the provider.",
    ),
    (
        "email.cancelled",
        "The scheduled send was cancelled before it went out.",
    ),
    (
        "email.opened",
        "The message's tracking pixel was fetched; machine says whether a proxy or scanner did.",
    ),
    (
        "email.clicked",
        "A tracked link of the message was followed; url, first and machine say more.",
    ),
    (
        INBOUND_RECEIVED,
        "An inbox address of the workspace received a message.",
    ),
];

/// A webhook as the API shows it. `events` empty: every type.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookView {
    pub id: Uuid,
    pub url: String,
    pub events: Vec<String>,
    /// False once deliveries disabled it (a 410, or failing for WEBHOOK_DISABLE_AFTER_SECS).
    pub active: bool,
    pub created_at: i64,
}

/// The columns of [`WebhookView`].
const COLUMNS: &str = "id, url, events, active, created_at";

/// `POST /webhooks` answer: the secret, this once.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookCreated)]
pub struct Created {
    pub webhook: WebhookView,
    pub signing_secret: String,
}

/// One webhook in an answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookPage {
    pub webhook: WebhookView,
}

/// `GET /webhooks` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// One event type, listed.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = WebhookEventType)]
pub struct EventType {
    #[serde(rename = "type")]
    pub name: String,
    pub description: String,
}

/// `GET /webhooks/event-types` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookEventTypes)]
pub struct EventTypes {
    pub event_types: Vec<EventType>,
}

/// The event types [`event_types`] takes.
fn event_type_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(EVENT_TYPES.map(|(name, _)| name)))
}

postmesh_shared::text_input! {
    /// An event type as a body names it, before [`event_types`] checks it; its schema is the
    /// list of [`EVENT_TYPES`] the check takes (repeats allowed: [`event_types`] keeps each once).
    #[derive(Debug)]
    pub struct EventTypeName as "EventTypeName" = event_type_schema();
}

/// Event types as given: each known, each once (in the given order); 400 otherwise.
pub fn event_types(given: Vec<EventTypeName>) -> Result<Vec<String>, ApiError> {
    let mut types: Vec<String> = Vec::with_capacity(given.len());
    for EventTypeName(name) in given {
        if !EVENT_TYPES.iter().any(|(known, _)| *known == name) {
            return Err(ApiError::BadRequest(format!(
                "{name:?} is not an event type (GET /webhooks/event-types lists them)"
            )));
        }
        if !types.contains(&name) {
            types.push(name);
        }
    }
    Ok(types)
}

/// `POST /webhooks` body. `events` empty or left out: every type.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = WebhookCreateRequest)]
pub(crate) struct NewWebhook {
    url: WebhookUrl,
    #[serde(default)]
    events: Vec<EventTypeName>,
    #[serde(default = "yes")]
    active: bool,
    signing_secret: Option<GivenSecret>,
}

fn yes() -> bool {
    true
}

pub(crate) async fn types() -> Success<EventTypes> {
    Success::new(EventTypes {
        event_types: EVENT_TYPES
            .iter()
            .map(|(name, description)| EventType {
                name: (*name).into(),
                description: (*description).into(),
            })
            .collect(),
    })
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewWebhook>,
) -> Result<(StatusCode, Success<Created>), ApiError> {
    let secret = match &body.signing_secret {
        Some(raw) => SigningSecret::parse(raw).map_err(ApiError::BadRequest)?,
        None => SigningSecret::generate(),
    };
    let events = event_types(body.events)?;
    let target = state.reach.check(&body.url).await?;
    let id = Uuid::now_v7();
    let mut tx = state.db.begin().await?;
    // A workspace's webhooks are added one at a time, so the limit holds under races.
    db::take_turns(&mut tx, Turns::Workspace, caller.workspace).await?;
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM webhooks WHERE workspace_id = $1")
        .bind(caller.workspace)
        .fetch_one(&mut *tx)
        .await?;
    if held >= MAX_PER_WORKSPACE {
        return Err(ApiError::Conflict(format!(
            "a workspace has at most {MAX_PER_WORKSPACE} webhooks"
        )));
    }
    let inserted = sqlx::query_as(&format!(
        "INSERT INTO webhooks (id, workspace_id, url, events, active, secret_sealed, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(caller.workspace)
    .bind(target.url.as_str())
    .bind(&events)
    .bind(body.active)
    .bind(state.secrets.seal(id.as_bytes(), secret.key()))
    .bind(now_unix())
    .fetch_one(&mut *tx)
    .await;
    let webhook = match inserted {
        Ok(webhook) => webhook,
        Err(e) if db::is_unique_violation(&e) => return Err(url_taken(&target.url)),
        Err(e) => return Err(e.into()),
    };
    tx.commit().await?;
    let created = Created {
        webhook,
        signing_secret: secret.reveal(),
    };
    Ok((StatusCode::CREATED, Success::new(created)))
}

fn url_taken(url: impl std::fmt::Display) -> ApiError {
    ApiError::Conflict(format!("{url} is already a webhook of this workspace"))
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<WebhookList>, ApiError> {
    let webhooks = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM webhooks WHERE workspace_id = $1 ORDER BY created_at, id"
    ))
    .bind(caller.workspace)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(WebhookList { webhooks }))
}

pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<WebhookPage>, ApiError> {
    let webhook = Owner::Webhook.find(&state.db, COLUMNS, &caller, id).await?;
    Ok(Success::new(WebhookPage { webhook }))
}

/// `PATCH /webhooks/{id}` body: what to change.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = WebhookChanges)]
pub(crate) struct Changes {
    url: Option<WebhookUrl>,
    events: Option<Vec<EventTypeName>>,
    active: Option<bool>,
}

/// Changes a webhook's URL (checked again), types or state; enabling it again clears its
/// failure record.
pub(crate) async fn update(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
    JsonBody(changes): JsonBody<Changes>,
) -> Result<Success<WebhookPage>, ApiError> {
    let events = changes.events.map(event_types).transpose()?;
    let current: WebhookView = Owner::Webhook.find(&state.db, COLUMNS, &caller, id).await?;
    let url = state
        .reach
        .changed(changes.url.as_deref(), current.url)
        .await?;
    let updated = sqlx::query_as(&format!(
        "UPDATE webhooks SET url = $3, events = $4, active = $5,
             failing_since = CASE WHEN ($5 AND NOT active) OR url <> $3 THEN NULL
                 ELSE failing_since END
         WHERE id = $1 AND workspace_id = $2 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(caller.workspace)
    .bind(&url)
    .bind(events.unwrap_or(current.events))
    .bind(changes.active.unwrap_or(current.active))
    .fetch_optional(&state.db)
    .await;
    match updated {
        Ok(Some(webhook)) => Ok(Success::new(WebhookPage { webhook })),
        Ok(None) => Err(ApiError::NotFound("no such webhook".into())),
        Err(e) if db::is_unique_violation(&e) => Err(url_taken(&url)),
        Err(e) => Err(e.into()),
    }
}

/// Deletes a webhook and its deliveries.
pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Deleted>, ApiError> {
    Owner::Webhook.remove(&state.db, &caller, id).await?;
    Ok(Success::new(Deleted { deleted: true }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_are_known_and_kept_once() {
        let given = |v: &[&str]| {
            v.iter()
                .map(|s| EventTypeName::from(*s))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            event_types(given(&["email.sent", "email.delivered", "email.sent"])).unwrap(),
            ["email.sent", "email.delivered"]
        );
        assert!(event_types(given(&["email.viewed"])).is_err());
        assert!(event_types(given(&[])).unwrap().is_empty());
        assert_eq!(EVENT_TYPES.len(), 14);
    }
}
