//! Accounts and their keys as signed-in users see them: sign-up on first login, the key
//! list, new keys billing to the account's primary key, revocation, and `GET /account`.
//! Policy: docs/decisions.md, "Accounts and sessions".

use axum::extract::State;
use axum::http::StatusCode;
use axum::Extension;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use postmesh_contracts::answers::gateway::KeyMode;
use postmesh_contracts::routes::gateway as api;
use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{IdPath, JsonBody, PageQuery, QueryParams};
use postmesh_shared::proto::{AuthContext, Role};
use postmesh_shared::response::Message;
use postmesh_shared::{ApiError, EmailAddress, Routes, Success};

use crate::keys;
use crate::sessions::Session;
use crate::AppState;

pub use postmesh_contracts::answers::gateway::{Account, KeyInfo};

/// The routes of keys and accounts.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::ACCOUNT, account)
        .at(api::API_KEYS, list)
        .at(api::API_KEY_CREATE, create)
        .at(api::API_KEY_REVOKE, revoke)
}

/// Longest key name, in characters.
const NAME_MAX: usize = 100;

/// The account of `email` (compared without case) and its stored address, signing it up
/// with its primary key on first sight.
pub async fn find_or_register(
    state: &AppState, email: &EmailAddress,
) -> Result<(Uuid, String), ApiError> {
    if let Some(id) = find(state, email).await? {
        return Ok(id);
    }
    keys::create_key(
        &state.db,
        &state.billing,
        email,
        Role::Member,
        0,
        "primary",
        KeyMode::Live,
    )
    .await
    .map_err(|e| ApiError::Unavailable(format!("could not sign up: {e}")))?;
    find(state, email)
        .await?
        .ok_or_else(|| ApiError::Internal("account missing after sign-up".into()))
}

/// The account stored under `email`'s key, else (a row stored as given, by an operator's
/// `create-key` before keys were stored) one the database's `lower()` matches.
async fn find(state: &AppState, email: &EmailAddress) -> Result<Option<(Uuid, String)>, ApiError> {
    Ok(sqlx::query_as(
        "SELECT id, email FROM accounts WHERE email = $1 OR lower(email) = lower($2)
         ORDER BY email = $1 DESC, created_at LIMIT 1",
    )
    .bind(email.key())
    .bind(email.as_str())
    .fetch_optional(&state.db)
    .await?)
}

/// Mints a member key named `name` in `mode` for `account`, billing to its primary key; 500
/// when the account has no primary key. The key's text and its record.
pub async fn mint(
    state: &AppState, account: Uuid, name: &str, mode: KeyMode,
) -> Result<(String, KeyInfo), ApiError> {
    let mut tx = state.db.begin().await?;
    // The account's row is locked: two keys made at once cannot both fit the quota.
    let primary: Option<Uuid> =
        sqlx::query_scalar("SELECT primary_key_id FROM accounts WHERE id = $1 FOR UPDATE")
            .bind(account)
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
    let primary = primary.ok_or_else(no_key)?;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL",
    )
    .bind(account)
    .fetch_one(&mut *tx)
    .await?;
    let quota = state.config.api_keys_per_account;
    if held >= quota {
        return Err(ApiError::Forbidden(format!(
            "the account holds {held} API keys, its quota (API_KEYS_PER_ACCOUNT = {quota}); revoke one first"
        )));
    }
    let id = Uuid::now_v7();
    let row = keys::NewRow {
        account,
        id,
        billing_key: primary,
        name,
        role: Role::Member,
        mode,
    };
    let text = keys::insert_key(&mut tx, &row).await?;
    tx.commit().await?;
    let info = KeyInfo {
        id,
        name: name.to_owned(),
        prefix: prefix_of(&text),
        mode,
        primary: false,
        created_at: now_unix(),
    };
    Ok((text, info))
}

/// The error of an account without a key to bill to.
pub fn no_key() -> ApiError {
    ApiError::Internal("the account has no API key".into())
}

/// The primary key of `account`, if it has one.
pub async fn primary_key(state: &AppState, account: Uuid) -> Result<Option<Uuid>, ApiError> {
    let primary: Option<Option<Uuid>> =
        sqlx::query_scalar("SELECT primary_key_id FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_optional(&state.db)
            .await?;
    Ok(primary.flatten())
}

/// The visible prefix of a key's text (`pm_[test_]<prefix>_<secret>`).
fn prefix_of(text: &str) -> String {
    let rest = text.strip_prefix("pm_").unwrap_or(text);
    let rest = rest.strip_prefix("test_").unwrap_or(rest);
    rest.split('_').next().unwrap_or_default().to_owned()
}

/// The account's live keys, oldest first.
pub async fn keys_of(state: &AppState, account: Uuid) -> Result<Vec<KeyInfo>, ApiError> {
    let rows: Vec<(Uuid, String, String, KeyMode, bool, i64)> = sqlx::query_as(
        "SELECT k.id, k.name, k.prefix, k.mode, k.id = a.primary_key_id, k.created_at
         FROM api_keys k JOIN accounts a ON a.id = k.account_id
         WHERE k.account_id = $1 AND k.revoked_at IS NULL ORDER BY k.created_at, k.id",
    )
    .bind(account)
    .fetch_all(&state.db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, name, prefix, mode, primary, created_at)| KeyInfo {
            id,
            name,
            prefix,
            mode,
            primary,
            created_at,
        })
        .collect())
}

/// Revokes `key` of `account`; 404 when it is not a live key of the account. This replica
/// forgets it at once, the others within `KEY_CACHE_TTL_SECS`.
pub async fn revoke_key(state: &AppState, account: Uuid, key: Uuid) -> Result<(), ApiError> {
    let prefix: Option<String> = sqlx::query_scalar(
        "UPDATE api_keys SET revoked_at = $3
         WHERE id = $1 AND account_id = $2 AND revoked_at IS NULL RETURNING prefix",
    )
    .bind(key)
    .bind(account)
    .bind(now_unix())
    .fetch_optional(&state.db)
    .await?;
    let prefix = prefix.ok_or_else(|| ApiError::NotFound("API key not found".into()))?;
    state.keys.forget(&prefix);
    Ok(())
}

/// A key name from a request: trimmed, 1-100 characters, none of them a control character
/// (a form decodes `%00` to the NUL PostgreSQL text cannot hold).
pub fn parse_name(raw: &str) -> Result<String, ApiError> {
    let name = raw.trim();
    if name.is_empty() || name.chars().count() > NAME_MAX {
        return Err(ApiError::BadRequest(format!(
            "name must be 1-{NAME_MAX} characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(
            "name must not hold control characters".into(),
        ));
    }
    Ok(name.to_owned())
}

/// `GET /account`: who the calling key belongs to.
async fn account(
    State(state): State<AppState>, Extension(auth): Extension<AuthContext>,
) -> Result<Success<Account>, ApiError> {
    let id = Uuid::parse_str(&auth.key_id).map_err(|e| ApiError::internal("key id", e))?;
    let account = Uuid::parse_str(&auth.account_id).map_err(|e| ApiError::internal("id", e))?;
    let key = keys_of(&state, account)
        .await?
        .into_iter()
        .find(|k| k.id == id)
        .ok_or_else(|| ApiError::Unauthorized("invalid API key".into()))?;
    Ok(Success::new(Account {
        email: auth.email,
        account_id: auth.account_id,
        key,
    }))
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ApiKeyList)]
struct KeyList {
    keys: Vec<KeyInfo>,
    limit: i64,
    offset: i64,
}

/// `GET /api-keys`: a page, oldest first.
async fn list(
    State(state): State<AppState>, Extension(session): Extension<Session>,
    QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<KeyList>, ApiError> {
    let page = q.page(50)?;
    let keys = keys_of(&state, session.account)
        .await?
        .into_iter()
        .skip(usize::try_from(page.offset).unwrap_or(usize::MAX))
        .take(usize::try_from(page.limit).unwrap_or(0))
        .collect();
    Ok(Success::new(KeyList {
        keys,
        limit: page.limit,
        offset: page.offset,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = ApiKeyCreateRequest)]
struct CreateBody {
    #[schema(min_length = 1)]
    name: String,
    /// `live` (the default) or `test`.
    #[serde(default)]
    mode: Option<KeyMode>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ApiKeyCreated)]
#[serde(rename_all = "camelCase")]
struct Created {
    key: KeyInfo,
    /// The key's text, shown this once.
    api_key: String,
}

/// `POST /api-keys {name, mode}`: 201 with the key's text, shown once.
async fn create(
    State(state): State<AppState>, Extension(session): Extension<Session>,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<(StatusCode, Success<Created>), ApiError> {
    let name = parse_name(&body.name)?;
    let mode = body.mode.unwrap_or_default();
    let (api_key, key) = mint(&state, session.account, &name, mode).await?;
    Ok((StatusCode::CREATED, Success::new(Created { key, api_key })))
}

/// `DELETE /api-keys/{id}`.
async fn revoke(
    State(state): State<AppState>, Extension(session): Extension<Session>, IdPath(id): IdPath<Uuid>,
) -> Result<Success<Message>, ApiError> {
    revoke_key(&state, session.account, id).await?;
    Ok(Success::message("API key revoked"))
}
