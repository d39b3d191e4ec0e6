//! An attempt as stored: its row read with its target, what counts as unfinished, and whose
//! deliveries a route is about (`owner`). Below the delivery stages and the routes.

pub mod owner;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sqlx::types::Json;
use uuid::Uuid;

use crate::content::quotes::BodyFormat;

/// Where an attempt stands.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[schema(as = WebhookAttemptStatus)]
pub enum Status {
    /// Waiting for its first try, a retry, or its target's turn.
    Pending,
    /// The target answered 2xx.
    Succeeded,
    /// Every try failed, or it could never be made.
    Failed,
}

/// An attempt still `pending`, written so that a lookup by id never turns into a scan of the
/// `attempts_due` index (the scheduler's: every pending attempt), whatever the statistics.
pub const UNFINISHED: &str = "status NOT IN ('succeeded', 'failed')";

/// An attempt whose time has come (`next_attempt_at`, give or take two seconds of clocks
/// between replicas): a job that comes for it earlier — a redelivery, a repeat — takes
/// nothing, so a retry is never made before its schedule or a `Retry-After` says.
pub const DUE: &str = "COALESCE(next_attempt_at, 0)
    <= floor(extract(epoch FROM statement_timestamp()))::bigint + 2";

/// Where an attempt goes and how, and what it carries, read with it.
#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRow {
    pub id: Uuid,
    pub workspace_id: Uuid,
    pub endpoint_id: Option<Uuid>,
    pub webhook_id: Option<Uuid>,
    pub message_id: Uuid,
    /// The delivery event's type and data, for an attempt of one.
    pub event_type: Option<String>,
    pub event_data: Option<Json<Box<RawValue>>>,
    pub url: Option<String>,
    pub active: Option<bool>,
    pub body_format: Option<BodyFormat>,
    pub strip_quotes: Option<bool>,
    pub secret_sealed: Option<Vec<u8>>,
    pub previous_secret_sealed: Option<Vec<u8>>,
    pub previous_secret_until: Option<i64>,
}

/// Reads attempts `ids` with their targets (an endpoint, a webhook, or the workspace's
/// default webhook) and, for an event's attempt, the event.
pub(crate) const ATTEMPTS_WITH_TARGETS: &str = "
    SELECT a.id, a.workspace_id, a.endpoint_id, a.webhook_id, a.message_id,
        ev.type AS event_type, ev.data AS event_data,
        COALESCE(e.url, w.url, d.url) AS url, COALESCE(e.active, w.active, d.active) AS active,
        COALESCE(e.body_format, d.body_format) AS body_format,
        COALESCE(e.strip_quotes, d.strip_quotes) AS strip_quotes,
        COALESCE(e.secret_sealed, w.secret_sealed, d.secret_sealed) AS secret_sealed,
        COALESCE(e.previous_secret_sealed, w.previous_secret_sealed, d.previous_secret_sealed)
            AS previous_secret_sealed,
        COALESCE(e.previous_secret_until, w.previous_secret_until, d.previous_secret_until)
            AS previous_secret_until
    FROM attempts a
    LEFT JOIN endpoints e ON e.id = a.endpoint_id
    LEFT JOIN webhooks w ON w.id = a.webhook_id
    LEFT JOIN default_webhooks d ON a.endpoint_id IS NULL AND a.webhook_id IS NULL
        AND d.workspace_id = a.workspace_id
    LEFT JOIN events ev ON ev.id = a.message_id
    WHERE a.id = ANY($1)";

/// Its endpoint or webhook, or for the default webhook its workspace.
pub(crate) fn target_of(row: &AttemptRow) -> Uuid {
    row.endpoint_id
        .or(row.webhook_id)
        .unwrap_or(row.workspace_id)
}
