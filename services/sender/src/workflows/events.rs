//! `POST /events` and `GET /events/{eventId}`: workflow events, stored once per event id
//! and workspace (forever), with the runs they start or end decided in the same
//! transaction, and published on the EVENTS stream (`{ns}.events.<event_name>`) through the
//! outbox.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use prost::Message as _;
use serde::Serialize;
use serde_json::{Map, Value};
use sqlx::types::Json;
use sqlx::PgConnection;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, JsonBody};
use postmesh_shared::jetstream::outbox;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::WorkflowEvent;
use postmesh_shared::{ApiError, EmailAddress, Namespace, Success, WorkspaceId};

use super::event::{parse_time, EventView};
use super::runs::{self, RunView};
use crate::audience::contacts::{self, Contact};
use crate::AppState;

pub use postmesh_contracts::answers::sender::Accepted;

/// The largest `properties`, serialized.
pub const MAX_PROPERTIES_BYTES: usize = 64 * 1024;
/// Longest event id and name, in characters.
const MAX_ID_LEN: usize = 200;

/// An event as checked at the edge.
struct NewEvent {
    event_id: String,
    event_name: String,
    occurred_at: String,
    occurred_unix: i64,
    external_contact_id: Option<String>,
    email: Option<EmailAddress>,
    properties: Map<String, Value>,
    extra: Map<String, Value>,
}

fn text_field(obj: &Map<String, Value>, key: &str) -> Result<String, ApiError> {
    let raw = obj
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::BadRequest(format!("{key} is required (a string)")))?;
    let len = raw.chars().count();
    if !(1..=MAX_ID_LEN).contains(&len) || raw.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(format!(
            "{key} must be 1-{MAX_ID_LEN} characters on one line"
        )));
    }
    Ok(raw.to_owned())
}

impl NewEvent {
    fn parse(body: Value) -> Result<Self, ApiError> {
        let Value::Object(mut obj) = body else {
            return Err(ApiError::BadRequest(
                "the event must be a JSON object".into(),
            ));
        };
        let event_id = text_field(&obj, "event_id")?;
        // Trimmed, as workflows' trigger and exit names are.
        let event_name = text_field(&obj, "event_name")?.trim().to_owned();
        if event_name.is_empty() {
            return Err(ApiError::BadRequest("event_name must not be blank".into()));
        }
        let raw_time = obj
            .get("occurred_at")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::BadRequest("occurred_at is required (RFC 3339)".into()))?;
        let (occurred_at, occurred_unix) = parse_time(raw_time).ok_or_else(|| {
            ApiError::BadRequest(
                "occurred_at must be an RFC 3339 time with an offset (2026-01-02T03:04:05Z)".into(),
            )
        })?;
        let contact = obj
            .get("contact")
            .and_then(Value::as_object)
            .ok_or_else(|| ApiError::BadRequest("contact is required (an object)".into()))?;
        let external_contact_id = match contact.get("external_contact_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => {
                Some(contacts::name("external_contact_id", s).map_err(ApiError::BadRequest)?)
            }
            Some(_) => {
                return Err(ApiError::BadRequest(
                    "external_contact_id must be a string".into(),
                ))
            }
        };
        let email = match contact.get("email") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(EmailAddress::parse(s.trim()).ok_or_else(|| {
                ApiError::BadRequest(format!("contact email {s:?} is not an email address"))
            })?),
            Some(_) => {
                return Err(ApiError::BadRequest(
                    "contact email must be a string".into(),
                ))
            }
        };
        if external_contact_id.is_none() && email.is_none() {
            return Err(ApiError::BadRequest(
                "contact needs external_contact_id or email".into(),
            ));
        }
        let properties = match obj.get("properties") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return Err(ApiError::BadRequest("properties must be an object".into())),
        };
        if Value::Object(properties.clone()).to_string().len() > MAX_PROPERTIES_BYTES {
            return Err(ApiError::PayloadTooLarge(format!(
                "properties are larger than {} KiB",
                MAX_PROPERTIES_BYTES / 1024
            )));
        }
        for key in [
            "event_id",
            "event_name",
            "occurred_at",
            "contact",
            "properties",
        ] {
            obj.remove(key);
        }
        Ok(Self {
            event_id,
            event_name,
            occurred_at,
            occurred_unix,
            external_contact_id,
            email,
            properties,
            extra: obj,
        })
    }
}

const EVENT_COLUMNS: &str = "event_id, event_name, occurred_at, received_at, contact, properties";

async fn stored(
    conn: &mut PgConnection, workspace: WorkspaceId, event_id: &str,
) -> Result<Option<EventView>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {EVENT_COLUMNS} FROM workflow_events WHERE workspace_id = $1 AND event_id = $2"
    ))
    .bind(workspace)
    .bind(event_id)
    .fetch_optional(conn)
    .await
}

/// The contact an event names: by external id first, then by email; created when neither
/// finds one (by its external id alone if no email is given).
async fn contact_of(
    conn: &mut PgConnection, workspace: WorkspaceId, ev: &NewEvent,
) -> Result<Contact, ApiError> {
    let input = contacts::ContactInput {
        email: ev.email.clone(),
        external_id: ev.external_contact_id.clone(),
        ..Default::default()
    };
    let creation = contacts::Creation::ExternalIdEnough;
    if let Some(external) = &ev.external_contact_id {
        if let Some(c) = contacts::find_by_external_id(conn, workspace, external).await? {
            if c.email.is_some() || ev.email.is_none() {
                return Ok(c);
            }
            // Known by its external id alone until now: the event gives it its email, unless
            // another contact has that email (the event still counts, for this one).
            return match contacts::upsert_as(conn, workspace, &input, creation).await {
                Ok((given, _)) => Ok(given),
                Err(contacts::ContactError::Conflict(_)) => Ok(c),
                Err(e) => Err(e.into()),
            };
        }
    }
    if let Some(email) = &ev.email {
        if let Some(c) = contacts::find_by_email(conn, workspace, email).await? {
            return Ok(c);
        }
    }
    Ok(contacts::upsert_as(conn, workspace, &input, creation)
        .await?
        .0)
}

/// `{ns}.events.<event_name>`, the name made a single subject token.
fn subject(ns: &Namespace, event_name: &str) -> String {
    let token: String = event_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "{}.{token}",
        Stream::Events.subject(ns).trim_end_matches(".>")
    )
}

/// Whom an event names, as stored with it (its `contact` column).
#[derive(Serialize)]
struct Named<'a> {
    external_contact_id: Option<&'a str>,
    email: Option<&'a str>,
}

/// `POST /events`: 201 for a new event with the runs it started, 200 `duplicate: true`
/// for an event id seen before (nothing runs again).
pub(crate) async fn report(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<Value>,
) -> Result<(StatusCode, Success<Accepted>), ApiError> {
    let ev = NewEvent::parse(body)?;
    let duplicate = |event| {
        (
            StatusCode::OK,
            Success::new(Accepted {
                duplicate: true,
                event,
                runs: None,
            }),
        )
    };
    let mut conn = state.db.acquire().await?;
    if let Some(event) = stored(&mut conn, caller.workspace, &ev.event_id).await? {
        return Ok(duplicate(event));
    }
    // Outside the event's transaction: a contact made by a concurrent request shows as a
    // unique violation, which the upsert answers by reading it (an aborted transaction
    // could not).
    let contact = contact_of(&mut conn, caller.workspace, &ev).await?;
    drop(conn);
    let mut tx = state.db.begin().await?;
    let named = Named {
        external_contact_id: ev.external_contact_id.as_deref(),
        email: ev.email.as_ref().map(|e| e.as_str()),
    };
    let inserted: Option<EventView> = sqlx::query_as(&format!(
        "INSERT INTO workflow_events (workspace_id, event_id, event_name, occurred_at,
                                      occurred_unix, received_at, contact_id, contact,
                                      properties, extra)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT DO NOTHING RETURNING {EVENT_COLUMNS}"
    ))
    .bind(caller.workspace)
    .bind(&ev.event_id)
    .bind(&ev.event_name)
    .bind(&ev.occurred_at)
    .bind(ev.occurred_unix)
    .bind(now_unix())
    .bind(contact.id)
    .bind(Json(&named))
    .bind(Json(&ev.properties))
    .bind(Json(&ev.extra))
    .fetch_optional(&mut *tx)
    .await?;
    let Some(event) = inserted else {
        // Another request stored it first.
        drop(tx);
        let mut conn = state.db.acquire().await?;
        let event = stored(&mut conn, caller.workspace, &ev.event_id)
            .await?
            .ok_or_else(|| ApiError::Internal("duplicate event not found".into()))?;
        return Ok(duplicate(event));
    };
    // The workflows it triggers locked before the runs it ends, as a delete locks them.
    let triggered = runs::triggered(&mut tx, &caller, &event.event_name).await?;
    runs::exit_for(
        &mut tx,
        &caller,
        &event.event_name,
        &contact,
        &ev.properties,
    )
    .await?;
    let started = runs::start_for(
        &mut tx,
        &caller,
        triggered,
        &event,
        &contact,
        &ev.properties,
    )
    .await?;
    let published = WorkflowEvent {
        workspace_id: caller.workspace.to_string(),
        event_id: event.event_id.clone(),
        event_name: event.event_name.clone(),
        occurred_at: event.occurred_at.clone(),
        contact_id: contact.id.to_string(),
        properties: serde_json::to_string(&ev.properties)
            .map_err(|e| ApiError::internal("event properties", e))?,
    };
    let message = outbox::OutboxMessage {
        id: Uuid::now_v7(),
        subject: subject(&state.ns, &event.event_name),
        payload: published.encode_to_vec().into(),
    };
    outbox::enqueue(&mut tx, &message).await?;
    tx.commit().await?;
    crate::sending::send::publish_soon(&state);
    if !started.is_empty() {
        super::wake::wake(&state);
    }
    metrics::counter!("postmesh_workflow_events_total").increment(1);
    Ok((
        StatusCode::CREATED,
        Success::new(Accepted {
            duplicate: false,
            event,
            runs: Some(started),
        }),
    ))
}

/// The answer of `GET /events/{eventId}`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WorkflowEventShown)]
pub struct Shown {
    event: EventView,
    runs: Vec<RunView>,
}

/// `GET /events/{eventId}`: the event and the runs it started.
pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller, Path(event_id): Path<String>,
) -> Result<Success<Shown>, ApiError> {
    let mut conn = state.db.acquire().await?;
    let event = stored(&mut conn, caller.workspace, &event_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("event not found".into()))?;
    let runs = runs::of_event(&mut conn, caller.workspace, &event_id).await?;
    Ok(Success::new(Shown { event, runs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_need_an_offset() {
        assert_eq!(
            parse_time("2026-01-02T04:04:05+01:00"),
            Some(("2026-01-02T03:04:05Z".into(), 1_767_323_045))
        );
        assert!(parse_time("2026-01-02T03:04:05").is_none());
        assert!(parse_time("2026-01-02").is_none());
        assert!(parse_time("yesterday").is_none());
    }
}
