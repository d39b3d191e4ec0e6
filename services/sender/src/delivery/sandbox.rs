//! What a sandbox address's message does once it is recorded `sent` (it never reached a
//! transport; `crate::model::sandbox` says which addresses are the sandbox's): `delivered@`
//! is delivered, `bounced@` bounces hard (and is suppressed), `complained@` is delivered
//! and complained of (and suppressed), `delayed@` is delayed and then delivered.

use sqlx::PgConnection;
use uuid::Uuid;

use postmesh_shared::{EmailAddress, WorkspaceId};

use crate::audience::suppressions::{self, Reason};
use crate::model::sandbox::{Outcome, Sandbox};
use crate::sending::events::{Detail, Kind, NewEvent};

/// The events that follow `sent` for a message of `outcome`, with the suppression it makes.
fn afterwards(outcome: Outcome, email: &str) -> (Vec<(Kind, Detail)>, Option<Reason>) {
    let delivered = (Kind::Delivered, Detail::Provider(None));
    match outcome {
        Outcome::Delivered | Outcome::Suppressed => (vec![delivered], None),
        Outcome::Bounced => (
            vec![(
                Kind::Bounced,
                Detail::Bounce {
                    reason: "sandbox: permanent bounce (general)".into(),
                    bounce_type: Some("Permanent".into()),
                    bounce_sub_type: Some("General".into()),
                    recipients: vec![email.to_owned()],
                },
            )],
            Some(Reason::Bounce),
        ),
        Outcome::Complained => (
            vec![
                delivered,
                (
                    Kind::Complained,
                    Detail::Complaint {
                        reason: "sandbox: complaint (abuse)".into(),
                        feedback_type: Some("abuse".into()),
                        recipients: vec![email.to_owned()],
                    },
                ),
            ],
            Some(Reason::Complaint),
        ),
        Outcome::Delayed => (
            vec![(Kind::Delayed, Detail::Provider(None)), delivered],
            None,
        ),
    }
}

/// A message whose `sent` was just recorded.
pub struct Sent<'a> {
    pub delivery: Uuid,
    pub workspace: Uuid,
    pub task: Option<Uuid>,
    pub email: &'a str,
    pub provider_id: &'a str,
}

/// The events (after `sent`) of each sandbox message among `sent`, its suppressions written
/// in `tx`; other messages make none.
pub async fn follow(
    tx: &mut PgConnection, sent: &[Sent<'_>], now: i64,
) -> Result<Vec<NewEvent>, sqlx::Error> {
    let mut events = Vec::new();
    for s in sent {
        let Some(outcome) = Sandbox::recorded(s.provider_id) else {
            continue;
        };
        let (kinds, suppress) = afterwards(outcome, s.email);
        if let (Some(reason), Some(email)) = (suppress, EmailAddress::parse(s.email)) {
            suppressions::add(
                &mut *tx,
                WorkspaceId::from(s.workspace),
                &email,
                reason,
                None,
            )
            .await?;
        }
        for (i, (kind, detail)) in kinds.into_iter().enumerate() {
            events.push(NewEvent {
                workspace: s.workspace,
                task: s.task,
                delivery: Some(s.delivery),
                email: s.email.to_owned(),
                kind,
                detail,
                occurred_at: now,
                source_key: format!("sandbox:{i}:{}", s.delivery),
            });
        }
    }
    Ok(events)
}
