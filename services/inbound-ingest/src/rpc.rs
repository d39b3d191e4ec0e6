//! The inbound service's typed RPCs: `address` (is this a live inbox of the workspace?) and
//! its answer to billing's `usage` (mailboxes).

use postmesh_shared::nats::ServiceHost;
use postmesh_shared::proto::{InboxAddressReply, InboxAddressRequest, UsageReply, UsageRequest};
use postmesh_shared::{AddressId, ApiError, WorkspaceId};

use crate::{addresses, AppState};

/// Adds the inbound service's RPCs to `host`.
pub fn register(host: ServiceHost, state: AppState) -> ServiceHost {
    host.rpc(state.clone(), address).method(state, usage)
}

fn workspace(raw: &str) -> Result<WorkspaceId, ApiError> {
    WorkspaceId::parse(raw).ok_or_else(|| ApiError::BadRequest("invalid workspace_id".into()))
}

/// The workspace's live address `address_id`, if it is one (a malformed id is none).
async fn address(state: AppState, req: InboxAddressRequest) -> Result<InboxAddressReply, ApiError> {
    let workspace = workspace(&req.workspace_id)?;
    let Some(id) = AddressId::parse(&req.address_id) else {
        return Ok(InboxAddressReply::default());
    };
    Ok(match addresses::owned(&state.db, workspace, id).await? {
        Some(address) => InboxAddressReply {
            found: true,
            address,
        },
        None => InboxAddressReply::default(),
    })
}

/// The live inbox addresses of a workspace; other counts belong to other services.
async fn usage(state: AppState, req: UsageRequest) -> Result<UsageReply, ApiError> {
    Ok(UsageReply {
        mailboxes: addresses::count(&state.db, workspace(&req.workspace_id)?).await?,
        ..UsageReply::default()
    })
}
