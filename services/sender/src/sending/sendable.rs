//! Whether a workspace may send from an address: the domain service's `sendable` RPC, asked
//! at every send (and at an SMTP relay's MAIL FROM), which also names the from-domain's
//! verified tracking host (asked again when a scheduled send is released).

use postmesh_shared::extract::Caller;
use postmesh_shared::proto::{SendableReply, SendableRequest};
use postmesh_shared::{nats, ApiError, EmailAddress, WorkspaceId};
use uuid::Uuid;

use crate::AppState;

/// Why the domain service says this workspace may not send from `from`, if it may not.
pub(crate) async fn refusal(
    state: &AppState, caller: &Caller, from: &EmailAddress,
) -> Result<Option<String>, ApiError> {
    let reply = sendable(state, caller.workspace, from).await?;
    Ok((!reply.sendable).then_some(reply.reason))
}

/// What the domain service says of `workspace` sending from `from`.
pub(crate) async fn sendable(
    state: &AppState, workspace: WorkspaceId, from: &EmailAddress,
) -> Result<SendableReply, ApiError> {
    nats::call(
        &state.nats,
        &state.ns,
        &SendableRequest {
            workspace_id: workspace.to_string(),
            from_address: from.to_string(),
            outbound: state.needs_outbound,
        },
    )
    .await
}

/// 400 unless this workspace may send from `from` (403 for a raw message's addresses: a
/// relay answers it as a policy refusal); what the domain service said when it may.
pub(crate) async fn check(
    state: &AppState, caller: &Caller, from: &EmailAddress, raw: bool,
) -> Result<SendableReply, ApiError> {
    let reply = sendable(state, caller.workspace, from).await?;
    if reply.sendable {
        return Ok(reply);
    }
    let reason = reply.reason;
    let what = if raw { "sender" } else { "fromEmail" };
    let message = format!("{what} {from} cannot be used: {reason}");
    Err(if raw {
        ApiError::Forbidden(message)
    } else {
        ApiError::BadRequest(message)
    })
}

/// The base tracked links of mail from `from` point at — its domain's verified tracking
/// host (`https://track.<domain>`) — and the domain their tokens are bound to, if the domain
/// service named them.
pub(crate) fn tracking_base(reply: &SendableReply) -> Option<(String, Uuid)> {
    let domain = Uuid::parse_str(&reply.tracking_domain_id).ok()?;
    Some(reply.tracking_host.as_str())
        .filter(|host| !host.is_empty())
        .map(|host| (format!("https://{host}"), domain))
}
