//! `whoami`: whom the API key belongs to (`GET /account`).

use postmesh_contracts::answers::gateway::Account;
use postmesh_contracts::routes::gateway;

use super::Context;
use crate::api::Call;

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
