//! A workflow event as stored and shown, and the time format of its `occurred_at`: what
//! both the event intake (`events`) and the runs it starts (`runs`) read.

use serde::Serialize;
use serde_json::{Map, Value};
use sqlx::types::Json;

/// An RFC 3339 time with its offset; normalized to UTC, and as Unix seconds.
pub fn parse_time(raw: &str) -> Option<(String, i64)> {
    let t =
        time::OffsetDateTime::parse(raw, &time::format_description::well_known::Rfc3339).ok()?;
    let utc = t.to_offset(time::UtcOffset::UTC);
    let text = utc
        .format(&time::format_description::well_known::Rfc3339)
        .ok()?;
    Some((text, utc.unix_timestamp()))
}

/// An event as the API shows it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WorkflowEvent)]
pub struct EventView {
    pub event_id: String,
    pub event_name: String,
    pub occurred_at: String,
    pub received_at: i64,
    #[schema(value_type = Value)]
    pub contact: Json<Value>,
    #[schema(value_type = Object)]
    pub properties: Json<Map<String, Value>>,
}
