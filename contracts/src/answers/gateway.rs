//! Answers of the gateway's own routes: the account, its keys and the CLI's device login.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What a key does: `live` sends and charges; `test` validates, prices, stores and shows
/// everything but hands nothing to a transport and charges nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = ApiKeyMode))]
#[cfg_attr(
    feature = "sqlx",
    derive(sqlx::Type),
    sqlx(type_name = "text", rename_all = "lowercase")
)]
#[serde(rename_all = "lowercase")]
pub enum KeyMode {
    #[default]
    Live,
    Test,
}

impl KeyMode {
    /// The mode as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Test => "test",
        }
    }
}

/// A key as its owner sees it (never its text).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = ApiKey))]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    /// The key's id (`DELETE /api-keys/{id}`).
    pub id: Uuid,
    /// What its owner called it.
    pub name: String,
    /// The key's visible start: `pm_<prefix>_…` (`pm_test_<prefix>_…` for a test key).
    pub prefix: String,
    /// `live` or `test`.
    #[serde(default)]
    pub mode: KeyMode,
    /// Whether this is the account's primary key, whose balance every key draws on.
    pub primary: bool,
    /// When it was made (Unix seconds).
    pub created_at: i64,
}

/// The answer of `GET /account`: whom the calling key belongs to.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub email: String,
    pub account_id: String,
    pub key: KeyInfo,
}

/// The answer of `POST /cli/auth/init`.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = CliAuthInitiated))]
#[serde(rename_all = "camelCase")]
pub struct Initiated {
    pub device_token: String,
    /// Seconds the request lives.
    pub expires_in: u64,
    /// Seconds to wait between polls.
    pub interval: u64,
    pub user_code: String,
    pub verification_url: String,
}

status! {
    /// Where a device login stands, as a poll answers it.
    CliPollStatus PollStatus {
        /// Not yet approved or denied (202).
        Pending => "pending",
        /// Polled faster than the interval (429).
        SlowDown => "slow_down",
        /// Denied in the web app (410).
        Denied => "denied",
        /// Approved: the answer carries the new key, this once (200).
        Approved => "approved",
        /// Gone or never started (410).
        Expired => "expired",
        /// The device token is malformed (400).
        Invalid => "invalid",
        /// The gateway could not answer (5xx).
        Error => "error",
    }
}

/// A poll's answer (spec §7: `{success, status, apiKey, email, error}`).
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = CliPollAnswer))]
#[serde(rename_all = "camelCase")]
pub struct PollAnswer {
    pub success: bool,
    pub status: PollStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
