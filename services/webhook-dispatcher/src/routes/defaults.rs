//! A workspace's default inbox webhook (spec §4.7 rule 2): one URL that gets the mail of
//! every address without an active endpoint. Same URL rules and secrets as endpoints.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_shared::db::{self, now_unix, Turns};
use postmesh_shared::extract::{Caller, JsonBody};
use postmesh_shared::{ApiError, Success};

use crate::content::quotes::BodyFormat;
use crate::routes::endpoints::ROTATION_OVERLAP_SECS;
use crate::secret::{GivenSecret, SigningSecret};
use crate::target::WebhookUrl;
use crate::AppState;

/// The default webhook as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultWebhook {
    pub url: String,
    pub body_format: BodyFormat,
    pub strip_quotes: bool,
    /// False once deliveries disabled it (a 410, or failing for WEBHOOK_DISABLE_AFTER_SECS);
    /// setting it again enables it.
    pub active: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The columns of [`DefaultWebhook`].
const COLUMNS: &str = "url, body_format, strip_quotes, active, created_at, updated_at";

/// `PUT` and `GET /inbox/webhook/default` answer; the secret on creation or rotation.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = DefaultWebhookPage)]
pub struct DefaultPage {
    pub webhook: DefaultWebhook,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret: Option<String>,
}

/// `DELETE /inbox/webhook/default` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = DefaultWebhookDeleted)]
pub struct Removed {
    pub deleted: bool,
}

/// `PUT /inbox/webhook/default` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = DefaultWebhookRequest)]
pub(crate) struct NewDefault {
    url: WebhookUrl,
    #[serde(default)]
    body_format: BodyFormat,
    #[serde(default)]
    strip_quotes: bool,
    signing_secret: Option<GivenSecret>,
    #[serde(default)]
    rotate_secret: bool,
}

/// Sets the workspace's default webhook. Its first setting answers the secret (given or
/// generated); later ones keep it, unless `signingSecret` or `rotateSecret` replaces it (the
/// old one signs beside the new for [`ROTATION_OVERLAP_SECS`]; `rotateSecret` answers it).
pub(crate) async fn put(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<NewDefault>,
) -> Result<Success<DefaultPage>, ApiError> {
    let given = match &body.signing_secret {
        Some(raw) => Some(SigningSecret::parse(raw).map_err(ApiError::BadRequest)?),
        None => None,
    };
    let target = state.reach.check(&body.url).await?;
    let owner = caller.workspace.as_uuid();
    let now = now_unix();
    let mut tx = state.db.begin().await?;
    // One setting at a time per workspace: whether it exists decides which secret is shown.
    db::take_turns(&mut tx, Turns::Workspace, caller.workspace).await?;
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM default_webhooks WHERE workspace_id = $1)",
    )
    .bind(owner)
    .fetch_one(&mut *tx)
    .await?;
    let replace = given.is_some() || body.rotate_secret;
    let secret = given.unwrap_or_else(SigningSecret::generate);
    let sealed = state.secrets.seal(owner.as_bytes(), secret.key());
    let webhook: DefaultWebhook = sqlx::query_as(&format!(
        "INSERT INTO default_webhooks (workspace_id, url, body_format, strip_quotes,
             secret_sealed, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $6)
         ON CONFLICT (workspace_id) DO UPDATE SET url = $2, body_format = $3,
             strip_quotes = $4, updated_at = $6, active = true, failing_since = NULL,
             previous_secret_sealed = CASE WHEN $7 THEN default_webhooks.secret_sealed
                 ELSE default_webhooks.previous_secret_sealed END,
             previous_secret_until = CASE WHEN $7 THEN $6 + $8
                 ELSE default_webhooks.previous_secret_until END,
             secret_sealed = CASE WHEN $7 THEN $5 ELSE default_webhooks.secret_sealed END
         RETURNING {COLUMNS}"
    ))
    .bind(owner)
    .bind(target.url.as_str())
    .bind(body.body_format)
    .bind(body.strip_quotes)
    .bind(sealed)
    .bind(now)
    .bind(replace)
    .bind(ROTATION_OVERLAP_SECS)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    let shown = !exists || body.rotate_secret;
    Ok(Success::new(DefaultPage {
        webhook,
        signing_secret: shown.then(|| secret.reveal()),
    }))
}

pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<DefaultPage>, ApiError> {
    let webhook = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM default_webhooks WHERE workspace_id = $1"
    ))
    .bind(caller.workspace)
    .fetch_optional(&state.db)
    .await?
    .ok_or_else(not_set)?;
    Ok(Success::new(DefaultPage {
        webhook,
        signing_secret: None,
    }))
}

pub(crate) async fn remove(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<Removed>, ApiError> {
    let done = sqlx::query("DELETE FROM default_webhooks WHERE workspace_id = $1")
        .bind(caller.workspace)
        .execute(&state.db)
        .await?;
    if done.rows_affected() == 0 {
        return Err(not_set());
    }
    Ok(Success::new(Removed { deleted: true }))
}

fn not_set() -> ApiError {
    ApiError::NotFound("this workspace has no default webhook".into())
}
