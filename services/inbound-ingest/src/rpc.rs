//! The inbound service's answer to billing's `usage`: the mailboxes a workspace holds.

use postmesh_shared::proto::{UsageReply, UsageRequest};
use postmesh_shared::{ApiError, WorkspaceId};

use crate::{addresses, AppState};

/// The live inbox addresses of a workspace; other counts belong to other services.
pub async fn usage(state: AppState, req: UsageRequest) -> Result<UsageReply, ApiError> {
    let workspace = WorkspaceId::parse(&req.workspace_id)
        .ok_or_else(|| ApiError::BadRequest("invalid workspace_id".into()))?;
    Ok(UsageReply {
        mailboxes: addresses::count(&state.db, workspace).await?,
        ..UsageReply::default()
    })
}
