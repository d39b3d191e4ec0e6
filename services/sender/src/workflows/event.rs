//! A workflow event as stored and shown, and the time format of its `occurred_at`: what
//! both the event intake (`events`) and the runs it starts (`runs`) read.

pub use postmesh_contracts::answers::sender::WorkflowEvent as EventView;

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
