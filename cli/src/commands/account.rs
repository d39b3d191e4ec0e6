//! `whoami`: whom the API key belongs to (`GET /account`).

use serde::Deserialize;

use postmesh_contracts::routes::gateway;

use super::Context;
use crate::api::Call;

/// The answer of `GET /account`.
#[derive(Debug, Deserialize)]
struct Account {
    email: String,
    key: KeyInfo,
}

/// The calling key as `GET /account` shows it (never its text).
#[derive(Debug, Deserialize)]
struct KeyInfo {
    name: String,
    /// The hex part of the key's visible start, `pm_<prefix>_…`.
    prefix: String,
}

/// `postmesh whoami`.
pub async fn whoami(ctx: &Context) -> anyhow::Result<()> {
    ctx.show(&Call::to(gateway::ACCOUNT), |account: Account| {
        Ok(format!(
            "{}\nkey: {} (pm_{}_…)",
            account.email, account.key.name, account.key.prefix
        ))
    })
    .await
}
