//! `send` (`POST /send-email`) and `status` (`GET /email-status/{taskId}`, optionally
//! followed until the send is finished).

use std::time::Duration;

use indicatif::ProgressBar;
use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use postmesh_contracts::answers::sender::{RejectedRecipient, SendAnswer, TaskProgress};
use postmesh_contracts::routes::sender;

use super::Context;
use crate::api::{Answer, Call};
use crate::cli::{SendArgs, StatusArgs};
use crate::output::{self, or_dash};
use crate::progress;

/// How often `status --wait` asks.
const WAIT_POLL: Duration = Duration::from_secs(1);

/// The `/send-email` body (the fields of the sender's `SendBody` the CLI sets).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SendBody {
    to: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    template_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    from_email: Option<String>,
    dry_run: bool,
}

impl From<SendArgs> for SendBody {
    fn from(args: SendArgs) -> Self {
        Self {
            to: args.to,
            subject: args.subject,
            html: args.content.html,
            text: args.content.text,
            template_key: args.content.template,
            from_email: args.from,
            dry_run: args.dry_run,
        }
    }
}

/// `n recipient(s)`.
fn recipients(n: u64) -> String {
    format!("{n} recipient{}", if n == 1 { "" } else { "s" })
}

/// Unix seconds as RFC 3339, or as the number when out of range.
fn when(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| unix.to_string())
}

fn rejected_lines(rejected: &[RejectedRecipient]) -> String {
    rejected
        .iter()
        .map(|r| format!("\nleft out {}: {}", r.email, r.reason))
        .collect()
}

/// A send's answer for a person.
fn describe_send(answer: &SendAnswer) -> String {
    let count = recipients(answer.recipients.accepted as u64);
    let mut text = match (&answer.task_id, answer.dry_run) {
        (Some(task), false) => format!(
            "Task {task}: {}, {count}, cost {}",
            answer.status.as_str(),
            output::credits(answer.cost)
        ),
        _ => format!(
            "Dry run: {count}, would cost {}; nothing was sent",
            output::credits(answer.cost)
        ),
    };
    if let Some(at) = answer.scheduled_at {
        text.push_str(&format!(" (scheduled for {})", when(at)));
    }
    text + &rejected_lines(&answer.recipients.rejected)
}

/// A task's progress for a person: a summary line, then each recipient.
fn describe_status(task: &TaskProgress) -> String {
    let mut text = format!(
        "Task {}: {} ({} sent, {} failed, {} queued of {})",
        task.task_id,
        task.status.as_str(),
        task.sent,
        task.failed,
        task.queued,
        recipients(task.total.max(0) as u64)
    );
    if let Some(at) = task.scheduled_at {
        text.push_str(&format!("; scheduled for {}", when(at)));
    }
    if !task.recipients.is_empty() {
        let rows: Vec<Vec<String>> = task
            .recipients
            .iter()
            .map(|r| {
                vec![
                    r.email.clone(),
                    r.status.as_str().to_owned(),
                    or_dash(r.error.as_deref()),
                ]
            })
            .collect();
        text.push_str("\n\n");
        text.push_str(output::table(&["EMAIL", "STATUS", "ERROR"], &rows).trim_end());
    }
    text + &rejected_lines(&task.rejected)
}

/// `postmesh send`.
pub async fn send(ctx: &Context, args: SendArgs) -> anyhow::Result<()> {
    let call = Call::to(sender::SEND_EMAIL).json(&SendBody::from(args))?;
    ctx.show(&call, |answer: SendAnswer| Ok(describe_send(&answer)))
        .await
}

/// `postmesh status`.
pub async fn status(ctx: &Context, args: StatusArgs) -> anyhow::Result<()> {
    let call = Call::to(sender::EMAIL_STATUS).id(args.task_id.as_uuid());
    if !args.wait {
        return ctx
            .show(&call, |task: TaskProgress| Ok(describe_status(&task)))
            .await;
    }
    let bar = progress::bar(0, "waiting");
    let finished = wait(ctx, &call, &bar).await;
    bar.finish_and_clear();
    let answer = finished?;
    if ctx.json {
        output::print(&answer.raw)
    } else {
        output::print(&describe_status(&answer.body))
    }
}

/// Asks for the task's progress every [`WAIT_POLL`], showing sent and failed of the total
/// on `bar`, until it is finished; its last answer.
async fn wait(
    ctx: &Context, call: &Call, bar: &ProgressBar,
) -> anyhow::Result<Answer<TaskProgress>> {
    loop {
        let answer: Answer<TaskProgress> = ctx.client.call(call).await?;
        let task = &answer.body;
        bar.set_length(task.total.max(0) as u64);
        bar.set_position((task.sent + task.failed).max(0) as u64);
        bar.set_message(task.status.as_str());
        if task.status.is_finished() {
            return Ok(answer);
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_send_body_uses_the_senders_field_names() {
        let body = SendBody {
            to: vec!["a@x.com".into()],
            subject: Some("Hi".into()),
            html: None,
            text: None,
            template_key: Some("welcome".into()),
            from_email: Some("me@x.com".into()),
            dry_run: true,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"to": ["a@x.com"], "subject": "Hi", "templateKey": "welcome",
                               "fromEmail": "me@x.com", "dryRun": true})
        );
    }

    #[test]
    fn answers_read_as_sentences() {
        let sent: SendAnswer = serde_json::from_str(
            r#"{"success":true,"taskId":"0190a000-0000-7000-8000-000000000001","status":"queued","cost":2,"dryRun":false,"testSend":false,
                "recipients":{"accepted":2,"rejected":[{"email":"c@x.com","reason":"suppressed:bounce"}]}}"#,
        )
        .unwrap();
        assert_eq!(
            describe_send(&sent),
            "Task 0190a000-0000-7000-8000-000000000001: queued, 2 recipients, cost 2 credits\nleft out c@x.com: suppressed:bounce"
        );
        let dry: SendAnswer = serde_json::from_str(
            r#"{"taskId":null,"status":"queued","cost":1,"dryRun":true,"testSend":false,"recipients":{"accepted":1,"rejected":[]}}"#,
        )
        .unwrap();
        assert_eq!(
            describe_send(&dry),
            "Dry run: 1 recipient, would cost 1 credit; nothing was sent"
        );
        let task: TaskProgress = serde_json::from_str(
            r#"{"success":true,"taskId":"0190a000-0000-7000-8000-000000000001","status":"partially_failed","total":2,"queued":0,"sent":1,"failed":1,
                "recipients":[{"email":"a@x.com","status":"sent","events":[]},
                              {"email":"b@x.com","status":"failed","error":"550 no such user","events":[]}],
                "rejected":[]}"#,
        )
        .unwrap();
        assert_eq!(
            describe_status(&task),
            "Task 0190a000-0000-7000-8000-000000000001: partially_failed (1 sent, 1 failed, 0 queued of 2 recipients)\n\n\
             EMAIL    STATUS  ERROR\n\
             a@x.com  sent    -\n\
             b@x.com  failed  550 no such user"
        );
    }
}
