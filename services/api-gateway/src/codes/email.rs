//! The code email: a SEND job written to the gateway's outbox in its own transaction, then
//! published. Policy: docs/decisions.md, "Verification codes" and "Outbox".

use prost::Message as _;

use postmesh_shared::jetstream::outbox::{self, OutboxMessage};
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{send_job, CodeEmail, JobKind, SendJob};
use postmesh_shared::{ApiError, EmailAddress, JobId, WorkspaceId};

use super::store::Code;
use super::CodeConfig;
use crate::AppState;

/// What a code is for: it decides the email's words.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Purpose {
    /// `/send-code`: a code a customer's user proves an address with.
    Verification,
    /// `/login/code`: signing in to Postmesh itself.
    Login,
}

/// The email that carries `code` to `to`, for `workspace` (none: Postmesh's own mail).
fn job(
    config: &CodeConfig, workspace: Option<WorkspaceId>, to: &EmailAddress, code: &Code, id: JobId,
    purpose: Purpose,
) -> SendJob {
    let minutes = config.ttl_secs / 60;
    let (subject, what) = match purpose {
        Purpose::Verification => ("Your verification code", "verification code"),
        Purpose::Login => ("Your Postmesh login code", "Postmesh login code"),
    };
    SendJob {
        id: id.to_string(),
        workspace_id: workspace.map(|w| w.to_string()).unwrap_or_default(),
        kind: JobKind::Verification.into(),
        body: Some(send_job::Body::Code(CodeEmail {
            from_email: config.from_email.clone(),
            to: to.as_str().to_owned(),
            subject: subject.into(),
            text: format!(
                "Your {what} is {}.\r\n\r\nIt expires in {minutes} minutes. If you did not ask for it, ignore this email.\r\n",
                code.as_str()
            ),
        })),
    }
}

/// Queues the code email as job `id`. An error means it will never be sent: it was
/// committed but could not be published, and was withdrawn before the relay took it.
pub(super) async fn queue(
    state: &AppState, workspace: Option<WorkspaceId>, to: &EmailAddress, code: &Code, id: JobId,
    purpose: Purpose,
) -> Result<(), ApiError> {
    let message = OutboxMessage {
        id: id.as_uuid(),
        subject: Stream::Send.subject(&state.ns),
        payload: job(&state.config.codes, workspace, to, code, id, purpose)
            .encode_to_vec()
            .into(),
    };
    let mut tx = state.db.begin().await?;
    outbox::enqueue(&mut tx, &message).await?;
    tx.commit().await?;
    let Err(e) = state.outbox.publish_now(message.id).await else {
        return Ok(());
    };
    match state.outbox.withdraw(message.id).await {
        Ok(true) => Err(e),
        Ok(false) => Ok(()),
        Err(w) => {
            // Committed and not withdrawn: the relay publishes it once it can.
            tracing::warn!(error = %e, withdraw = %w, "code email left to the outbox relay");
            Ok(())
        }
    }
}
