//! `events send`: reports one workflow event (`POST /events`, spec §4.6). The event id is the
//! idempotency key: one is made when none is given, and printed so a retry can reuse it.

use serde::Serialize;
use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use uuid::Uuid;

use postmesh_contracts::answers::sender::Accepted;
use postmesh_contracts::routes::sender::EVENT_REPORT as EVENTS;

use super::Context;
use crate::api::Call;
use crate::cli::EventArgs;

/// The `POST /events` body.
#[derive(Debug, Serialize)]
struct EventBody {
    event_id: String,
    event_name: String,
    /// ISO 8601.
    occurred_at: String,
    contact: Contact,
    #[serde(skip_serializing_if = "Option::is_none")]
    properties: Option<Map<String, Value>>,
}

/// Whom the event is about.
#[derive(Debug, Serialize)]
struct Contact {
    #[serde(skip_serializing_if = "Option::is_none")]
    external_contact_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    email: Option<String>,
}

impl EventBody {
    /// The body for `args`, happening at `now`; a new uuid as the event id when none is given.
    fn new(args: EventArgs, now: OffsetDateTime) -> anyhow::Result<Self> {
        Ok(Self {
            event_id: args.event_id.unwrap_or_else(|| Uuid::new_v4().to_string()),
            event_name: args.name,
            occurred_at: now.format(&Rfc3339)?,
            contact: Contact {
                external_contact_id: args.external_id,
                email: args.email,
            },
            properties: args.properties,
        })
    }
}

/// `postmesh events send`.
pub async fn send(ctx: &Context, args: EventArgs) -> anyhow::Result<()> {
    let body = EventBody::new(args, OffsetDateTime::now_utc())?;
    let call = Call::to(EVENTS).json(&body)?;
    let id = body.event_id;
    ctx.show(&call, |recorded: Accepted| {
        Ok(if recorded.duplicate {
            format!("Event {id} was already recorded")
        } else {
            format!("Event {id} recorded")
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_body_has_the_specs_fields() {
        let args = EventArgs {
            name: "signed_up".into(),
            email: Some("ann@example.com".into()),
            external_id: None,
            event_id: Some("evt-1".into()),
            properties: serde_json::from_str(r#"{"plan":"pro"}"#).unwrap(),
        };
        let at = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let body = serde_json::to_value(EventBody::new(args, at).unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"event_id": "evt-1", "event_name": "signed_up",
                "occurred_at": "2023-11-14T22:13:20Z", "contact": {"email": "ann@example.com"},
                "properties": {"plan": "pro"}})
        );
    }

    #[test]
    fn an_event_without_an_id_gets_a_new_one() {
        let args = EventArgs {
            name: "n".into(),
            email: None,
            external_id: Some("crm-1".into()),
            event_id: None,
            properties: None,
        };
        let body = EventBody::new(args, OffsetDateTime::UNIX_EPOCH).unwrap();
        assert!(Uuid::parse_str(&body.event_id).is_ok());
        assert_eq!(
            serde_json::to_value(&body.contact).unwrap(),
            serde_json::json!({"external_contact_id": "crm-1"})
        );
    }
}
