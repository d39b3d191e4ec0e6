//! Open and click tracking, off unless asked: a workspace's defaults (`GET/PUT /tracking`),
//! each send's `trackOpens`/`trackClicks` over them, decided once at acceptance; the HTML of
//! each tracked message given its pixel and tracked links (`links`); and the hits the
//! gateway publishes recorded as `opened` and `clicked` events (`record`).

pub mod links;
pub mod record;

use axum::extract::State;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use postmesh_contracts::routes::sender as api;
use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, JsonBody};
use postmesh_shared::tracking::TrackingKey;
use postmesh_shared::{ApiError, Routes, Success};

use crate::AppState;

/// Tracking as the worker applies it: the signing key and where links point.
#[derive(Clone, Debug)]
pub struct Tracker {
    pub key: TrackingKey,
    /// `TRACKING_BASE_URL` (else `PUBLIC_BASE_URL`), without a trailing `/`.
    pub base_url: String,
}

/// A workspace's tracking defaults.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    sqlx::FromRow,
    utoipa::ToSchema,
)]
#[schema(as = TrackingSettings)]
pub struct Defaults {
    /// Sends carry an open-tracking pixel unless they say otherwise.
    pub opens: bool,
    /// Sends' links are tracked unless they say otherwise.
    pub clicks: bool,
}

/// The `PUT /tracking` body: what to change (an absent field keeps its value).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = TrackingSettingsBody)]
pub struct Change {
    opens: Option<bool>,
    clicks: Option<bool>,
}

/// The routes of tracking defaults.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::TRACKING, read)
        .at(api::TRACKING_SET, set)
        .takes::<Change>()
}

/// The workspace's defaults (both off without a row).
pub async fn defaults(db: &sqlx::PgPool, workspace: Uuid) -> Result<Defaults, sqlx::Error> {
    Ok(
        sqlx::query_as("SELECT opens, clicks FROM tracking_settings WHERE workspace_id = $1")
            .bind(workspace)
            .fetch_optional(db)
            .await?
            .unwrap_or_default(),
    )
}

/// `GET /tracking`: the workspace's defaults.
async fn read(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<Defaults>, ApiError> {
    Ok(Success::new(
        defaults(&state.db, caller.workspace.as_uuid()).await?,
    ))
}

/// `PUT /tracking`: changes the workspace's defaults; answers them.
async fn set(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<Change>,
) -> Result<Success<Defaults>, ApiError> {
    let now = defaults(&state.db, caller.workspace.as_uuid()).await?;
    let (opens, clicks) = (
        body.opens.unwrap_or(now.opens),
        body.clicks.unwrap_or(now.clicks),
    );
    let saved: Defaults = sqlx::query_as(
        "INSERT INTO tracking_settings (workspace_id, opens, clicks, updated_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (workspace_id) DO UPDATE
             SET opens = COALESCE($5, tracking_settings.opens),
                 clicks = COALESCE($6, tracking_settings.clicks), updated_at = $4
         RETURNING opens, clicks",
    )
    .bind(caller.workspace)
    .bind(opens)
    .bind(clicks)
    .bind(now_unix())
    .bind(body.opens)
    .bind(body.clicks)
    .fetch_one(&state.db)
    .await?;
    Ok(Success::new(saved))
}
