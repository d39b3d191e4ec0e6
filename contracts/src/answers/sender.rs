//! Answers of the sender: a send, its progress, and a reported workflow event.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::TaskId;

status! {
    /// Where a send task stands as stored.
    SendTaskStatus TaskStatus {
        /// Held until `scheduled_at`.
        Scheduled => "scheduled",
        /// Its jobs are queued (or delivered).
        Queued => "queued",
        /// Cancelled before release, and refunded.
        Cancelled => "cancelled",
        /// Its release failed every try; refunded.
        Failed => "failed",
    }
}

status! {
    /// What happened to one delivery.
    EmailStatusEventKind EventKind {
        /// Accepted for delivery (at the send, or when its schedule released it).
        Queued => "queued",
        /// Accepted to be sent at its `scheduledAt`.
        Scheduled => "scheduled",
        Sent => "sent",
        Delivered => "delivered",
        Bounced => "bounced",
        Complained => "complained",
        Rejected => "rejected",
        Delayed => "delayed",
        Unsubscribed => "unsubscribed",
        /// Our side gave up on the message for good.
        Failed => "failed",
        /// Its scheduled send was cancelled.
        Cancelled => "cancelled",
        /// Its open-tracking pixel was fetched.
        Opened => "opened",
        /// One of its tracked links was followed.
        Clicked => "clicked",
    }
}

status! {
    /// A task's overall progress in `/email-status`.
    EmailStatusProgress Progress {
        /// Held until its `scheduledAt`.
        Scheduled => "scheduled",
        /// Cancelled before it was released.
        Cancelled => "cancelled",
        /// Nothing finished yet.
        Queued => "queued",
        /// Some recipients finished, some not yet.
        Sending => "sending",
        /// Every recipient delivered to the provider.
        Sent => "sent",
        /// None delivered.
        Failed => "failed",
        /// Some delivered, some failed.
        PartiallyFailed => "partially_failed",
    }
}

status! {
    /// One recipient's state in `/email-status`.
    EmailStatusRecipientState RecipientState {
        /// Not handed to the provider yet.
        Queued => "queued",
        Sent => "sent",
        Failed => "failed",
    }
}

status! {
    /// Where a workflow run stands.
    WorkflowRunStatus RunStatus {
        /// Waiting for or running its next step.
        Active => "active",
        /// Ran every step.
        Completed => "completed",
        /// Left by an exit event.
        Exited => "exited",
        /// Stopped by an error.
        Failed => "failed",
    }
}

impl Progress {
    /// Whether the task will change no more (every recipient finished, or cancelled).
    pub fn is_finished(self) -> bool {
        !matches!(self, Self::Scheduled | Self::Queued | Self::Sending)
    }
}

/// A send's tag: a name and a value, each 1-50 of `A-Za-z0-9_-`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = EmailTag))]
pub struct Tag {
    #[cfg_attr(feature = "utoipa", schema(pattern = "^[A-Za-z0-9_-]{1,50}$"))]
    pub name: String,
    #[cfg_attr(feature = "utoipa", schema(pattern = "^[A-Za-z0-9_-]{1,50}$"))]
    pub value: String,
}

/// Recipients in a send answer.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SendRecipientCounts))]
pub struct RecipientCounts {
    pub accepted: usize,
    pub rejected: Vec<RejectedRecipient>,
}

/// A recipient left out, with the reason.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SendRejectedRecipient))]
pub struct RejectedRecipient {
    pub email: String,
    pub reason: String,
}

/// The answer to a send.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = SendOutcome))]
#[serde(rename_all = "camelCase")]
pub struct SendAnswer {
    /// The task; none for a dry run, which stores nothing.
    pub task_id: Option<TaskId>,
    /// `queued` or `scheduled` (for a dry run: what the send would be).
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<i64>,
    pub recipients: RecipientCounts,
    /// Credits charged (for a dry run: that would be charged).
    pub cost: i64,
    pub dry_run: bool,
    pub test_send: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_version: Option<i32>,
    /// The campaign the send went to (made by it, with `campaignName` and an audience).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campaign_key: Option<String>,
}

/// What `/smtp-envelope` says of an SMTP envelope.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnvelopeCheck {
    /// Whether the workspace may send from `mailFrom` (true when none was given).
    pub sendable: bool,
    /// Why it may not; empty when it may.
    pub reason: String,
    /// The recipients no message may go to, with why (`suppressed:bounce`, …).
    pub rejected: Vec<RejectedRecipient>,
}

/// One event as `/email-status` shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = EmailStatusEvent))]
#[serde(rename_all = "camelCase")]
pub struct DeliveryEvent {
    pub kind: EventKind,
    pub occurred_at: i64,
    #[cfg_attr(feature = "utoipa", schema(value_type = Value))]
    pub detail: Value,
}

/// One recipient's state.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = EmailStatusRecipient))]
#[serde(rename_all = "camelCase")]
pub struct RecipientStatus {
    pub email: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    pub status: RecipientState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_message_id: Option<String>,
    /// What happened to it since (`sent`, `delivered`, `bounced`, ...), oldest first.
    #[serde(default)]
    pub events: Vec<DeliveryEvent>,
}

/// The answer of `GET /email-status/{taskId}`.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = EmailStatus))]
#[serde(rename_all = "camelCase")]
pub struct TaskProgress {
    pub task_id: TaskId,
    pub status: Progress,
    /// Made with a test key: its messages reached no transport and nothing was charged.
    #[serde(default)]
    pub test: bool,
    /// The send's tags and metadata, as given.
    #[serde(default)]
    pub tags: Vec<Tag>,
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    pub total: i64,
    pub queued: i64,
    pub sent: i64,
    pub failed: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<i64>,
    pub recipients: Vec<RecipientStatus>,
    /// Recipients the send left out, with why (`suppressed:bounce`, `frequency_cap`, ...);
    /// paged with the same `limit` and `offset`.
    pub rejected: Vec<RejectedRecipient>,
}

/// A workflow event as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = WorkflowEvent))]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[serde(rename_all = "camelCase")]
pub struct WorkflowEvent {
    pub event_id: String,
    pub event_name: String,
    pub occurred_at: String,
    pub received_at: i64,
    #[cfg_attr(feature = "utoipa", schema(value_type = Value))]
    pub contact: Value,
    #[cfg_attr(feature = "utoipa", schema(value_type = Object))]
    #[cfg_attr(feature = "sqlx", sqlx(json))]
    pub properties: Map<String, Value>,
}

/// A workflow run as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = WorkflowRun))]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub id: Uuid,
    pub workflow_id: Uuid,
    pub status: RunStatus,
    /// The step it is at (an index into the compiled steps).
    pub step: i32,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub exit_reason: Option<String>,
}

/// The answer of `POST /events`.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = WorkflowEventAccepted))]
pub struct Accepted {
    /// Whether the event id was seen before (nothing runs again).
    pub duplicate: bool,
    pub event: WorkflowEvent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<RunView>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_queued_sending_and_scheduled_tasks_are_unfinished() {
        let progress = |s: &str| -> Progress { serde_json::from_value(s.into()).unwrap() };
        for status in ["queued", "sending", "scheduled"] {
            assert!(!progress(status).is_finished(), "{status}");
        }
        for status in ["sent", "failed", "partially_failed", "cancelled"] {
            assert!(progress(status).is_finished(), "{status}");
            assert_eq!(progress(status).as_str(), status);
        }
    }
}
