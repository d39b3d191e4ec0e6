//! Tasks as stored: a send's rendered message, its recipients (a SEND job for each slice of
//! them) and attachments, written in one transaction with the outbox rows of its jobs — or, for a
//! scheduled task, with none until the scheduler releases it. The worker reads them back.

use prost::Message as _;
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use postmesh_shared::extract::Caller;
use postmesh_shared::jetstream::outbox;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{send_job, SendJob, SliceRecipient, TaskSlice};
use postmesh_shared::tracking::Binding;
use postmesh_shared::{DeliveryId, JobId, TaskId, WorkspaceId};

use crate::model::Recipient;
use crate::sending::events::{self, Kind, Outlet};
use crate::sending::governance;
use crate::sending::request::{Attachment, EmailType, Rejected, SendRequest};

pub use postmesh_contracts::answers::sender::TaskStatus;

/// The rendered message of a task, the same for each of its recipients.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskMessage {
    pub from_email: String,
    pub from_name: Option<String>,
    pub reply_to: Option<String>,
    pub cc: Vec<String>,
    pub bcc: Vec<String>,
    pub subject: String,
    pub html: String,
    pub text: String,
    pub message_id: Option<String>,
    pub in_reply_to: Option<String>,
    pub references: Vec<String>,
    /// A test send (`testSend`): marked as such in the message.
    pub test: bool,
    /// A raw message's envelope sender: its MIME, stored beside the task, goes out as its
    /// client wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope_from: Option<String>,
    /// Open and click tracking, decided at acceptance (the send's, else the workspace's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub track_opens: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub track_clicks: bool,
    /// Where its tracked links point (`https://track.<domain>`), when not the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_base: Option<String>,
    /// The domain holding that tracking host, which its tokens are bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_domain: Option<Uuid>,
}

impl TaskMessage {
    /// The from-domain's own tracking host (`track.<domain>`) its links go through, and the
    /// domain holding it, if any.
    pub fn tracking_binding(&self) -> Option<Binding<'_>> {
        let base = self.tracking_base.as_deref()?;
        Some(Binding {
            host: base.strip_prefix("https://").unwrap_or(base),
            domain: self.tracking_domain?,
        })
    }
}

/// A task to store.
pub struct NewTask<'a> {
    pub id: TaskId,
    /// Queued now, or scheduled: decided once, by the send.
    pub status: TaskStatus,
    pub caller: &'a Caller,
    pub req: &'a SendRequest,
    pub message: &'a TaskMessage,
    pub recipients: &'a [Recipient],
    /// Those left out, with why: shown in the task's status.
    pub rejected: &'a [Rejected],
    pub template: Option<(&'a str, i32)>,
    /// The campaign it goes to, by key.
    pub campaign_key: Option<&'a str>,
    pub cost: i64,
    /// When the send was accepted (Unix seconds).
    pub now: i64,
    /// The `Idempotency-Key` it was made with, if any.
    pub idempotency: Option<Idempotency<'a>>,
    /// A raw message's MIME, as it goes out.
    pub mime: Option<&'a [u8]>,
}

/// A send's `Idempotency-Key`: the key, the digest of the body it is bound to, and the
/// answer a repeat gets.
pub struct Idempotency<'a> {
    pub key: &'a str,
    pub digest: &'a [u8],
    pub answer: serde_json::Value,
}

/// Stores `task` in `tx`: queued with its jobs in the outbox, or scheduled without them;
/// each recipient's message is a `queued` or `scheduled` delivery event.
pub async fn insert(
    tx: &mut PgConnection, outlet: &Outlet, task: &NewTask<'_>,
) -> Result<(), sqlx::Error> {
    let now = task.now;
    insert_task(tx, task, now).await?;
    let deliveries = insert_recipients(tx, task, now).await?;
    insert_rejections(tx, task).await?;
    if !task.req.test_send {
        governance::record(
            tx,
            task.caller.workspace,
            task.id.as_uuid(),
            task.req,
            task.recipients,
            now,
        )
        .await?;
    }
    insert_attachments(tx, task).await?;
    if let Some(mime) = task.mime {
        sqlx::query("INSERT INTO task_mime (task_id, mime) VALUES ($1, $2)")
            .bind(task.id)
            .bind(mime)
            .execute(&mut *tx)
            .await?;
    }
    let recipients: Vec<(DeliveryId, &str)> = deliveries
        .into_iter()
        .zip(task.recipients.iter().map(|r| r.email.as_str()))
        .collect();
    let jobs = Jobs {
        task: task.id,
        workspace: task.caller.workspace,
        email_type: task.req.email_type,
    };
    if task.status == TaskStatus::Queued {
        jobs.enqueue(tx, outlet, &recipients).await?;
    } else {
        jobs.record(tx, outlet, &recipients, Kind::Scheduled)
            .await?;
    }
    Ok(())
}

/// The task's row: its rendered message, labels, price and status.
async fn insert_task(
    tx: &mut PgConnection, task: &NewTask<'_>, now: i64,
) -> Result<(), sqlx::Error> {
    let req = task.req;
    sqlx::query(
        "INSERT INTO tasks (id, workspace_id, api_key_id, account_id, status, scheduled_at,
                            message, email_type, topic, source_app, business_goal,
                            recipient_reason, campaign_name, template_key, template_version,
                            test_send, cost, recipient_count, created_at, released_at,
                            campaign_key, idempotency_key, request_digest, answer, test_mode,
                            tags, metadata)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18, $19, CASE WHEN $5 = 'queued' THEN $19 END, $20, $21, $22, $23, $24, $25,
                 $26)",
    )
    .bind(task.id)
    .bind(task.caller.workspace)
    .bind(task.caller.key)
    .bind(task.caller.account.to_string())
    .bind(task.status)
    .bind(req.scheduled_at)
    .bind(Json(task.message))
    .bind(req.email_type)
    .bind(&req.topic)
    .bind(&req.source_app)
    .bind(&req.business_goal)
    .bind(&req.recipient_reason)
    .bind(&req.campaign_name)
    .bind(task.template.map(|t| t.0))
    .bind(task.template.map(|t| t.1))
    .bind(req.test_send)
    .bind(task.cost)
    .bind(task.recipients.len() as i32)
    .bind(now)
    .bind(task.campaign_key)
    .bind(task.idempotency.as_ref().map(|i| i.key))
    .bind(task.idempotency.as_ref().map(|i| i.digest))
    .bind(task.idempotency.as_ref().map(|i| Json(&i.answer)))
    .bind(task.caller.test)
    .bind(Json(&req.tags))
    .bind(Json(&req.metadata))
    .execute(&mut *tx)
    .await?;
    if !req.tags.is_empty() {
        let tags: Vec<String> = req
            .tags
            .iter()
            .map(|t| format!("{}:{}", t.name, t.value))
            .collect();
        sqlx::query(
            "INSERT INTO task_tags (workspace_id, tag, created_at, task_id)
             SELECT $1, t, $2, $3 FROM UNNEST($4::text[]) AS t",
        )
        .bind(task.caller.workspace)
        .bind(now)
        .bind(task.id)
        .bind(&tags)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// The task's recipients, each with a new delivery id, counted as unfinished for the
/// quota; their delivery ids, in order.
async fn insert_recipients(
    tx: &mut PgConnection, task: &NewTask<'_>, now: i64,
) -> Result<Vec<DeliveryId>, sqlx::Error> {
    let idx: Vec<i32> = (0..task.recipients.len() as i32).collect();
    let emails: Vec<&str> = task.recipients.iter().map(|r| r.email.as_str()).collect();
    let external: Vec<Option<&str>> = task
        .recipients
        .iter()
        .map(|r| r.external_id.as_deref())
        .collect();
    let deliveries: Vec<DeliveryId> = task.recipients.iter().map(|_| DeliveryId::new()).collect();
    sqlx::query(
        "INSERT INTO task_recipients (task_id, idx, email, external_id, delivery_id,
                                      workspace_id, created_at, status)
         SELECT $1, *, $6, $7, $8 FROM UNNEST($2::integer[], $3::text[], $4::text[], $5::uuid[])",
    )
    .bind(task.id)
    .bind(&idx)
    .bind(&emails)
    .bind(&external)
    .bind(&deliveries)
    .bind(task.caller.workspace)
    .bind(now)
    .bind(task.status.as_str())
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO unfinished_deliveries (delivery_id, workspace_id, created_at)
         SELECT d, $2, $3 FROM UNNEST($1::uuid[]) AS d",
    )
    .bind(&deliveries)
    .bind(task.caller.workspace)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(deliveries)
}

/// The recipients the send left out, with their reasons.
async fn insert_rejections(tx: &mut PgConnection, task: &NewTask<'_>) -> Result<(), sqlx::Error> {
    if task.rejected.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO task_rejections (task_id, idx, email, reason)
         SELECT $1, n - 1, e, r FROM UNNEST($2::text[], $3::text[]) WITH ORDINALITY AS x(e, r, n)",
    )
    .bind(task.id)
    .bind(
        task.rejected
            .iter()
            .map(|r| r.email.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        task.rejected
            .iter()
            .map(|r| r.reason.as_str())
            .collect::<Vec<_>>(),
    )
    .execute(tx)
    .await
    .map(drop)
}

/// The task's attachments, in order, in one statement.
async fn insert_attachments(tx: &mut PgConnection, task: &NewTask<'_>) -> Result<(), sqlx::Error> {
    let a = &task.req.attachments;
    if a.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO task_attachments (task_id, idx, filename, content_type, content)
         SELECT $1, n - 1, f, t, c
         FROM UNNEST($2::text[], $3::text[], $4::bytea[]) WITH ORDINALITY AS a(f, t, c, n)",
    )
    .bind(task.id)
    .bind(a.iter().map(|a| a.filename.as_str()).collect::<Vec<_>>())
    .bind(
        a.iter()
            .map(|a| a.content_type.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(a.iter().map(|a| a.content.as_slice()).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await
    .map(drop)
}

/// Recipients one SEND job carries at most: one queue message, outbox row and ack for
/// many recipients, each still delivered, leased and recorded on its own
/// (docs/decisions.md, "Delivery (sender)").
pub const RECIPIENTS_PER_JOB: usize = 50;

/// The SEND jobs of one task.
pub struct Jobs {
    pub task: TaskId,
    pub workspace: WorkspaceId,
    pub email_type: EmailType,
}

impl Jobs {
    /// Writes the jobs of `(delivery id, address)` pairs, in order, to the outbox: one job
    /// per [`RECIPIENTS_PER_JOB`] recipients; each message is a `queued` event.
    pub async fn enqueue(
        &self, tx: &mut PgConnection, outlet: &Outlet, recipients: &[(DeliveryId, &str)],
    ) -> Result<(), sqlx::Error> {
        self.record(tx, outlet, recipients, Kind::Queued).await?;
        let (task_id, workspace_id) = (self.task.to_string(), self.workspace.to_string());
        let messages: Vec<(Uuid, Vec<u8>)> = recipients
            .chunks(RECIPIENTS_PER_JOB)
            .map(|slice| {
                let id = JobId::new();
                let send = SendJob {
                    id: id.to_string(),
                    workspace_id: workspace_id.clone(),
                    kind: self.email_type.job_kind().into(),
                    body: Some(send_job::Body::Slice(TaskSlice {
                        task_id: task_id.clone(),
                        recipients: slice
                            .iter()
                            .map(|(delivery, email)| SliceRecipient {
                                delivery_id: delivery.to_string(),
                                email: (*email).to_owned(),
                            })
                            .collect(),
                    })),
                };
                (id.as_uuid(), send.encode_to_vec())
            })
            .collect();
        outbox::enqueue_many(tx, &Stream::Send.subject(&outlet.ns), &messages).await
    }

    /// Publishes a `kind` event for each recipient's message.
    async fn record(
        &self, tx: &mut PgConnection, outlet: &Outlet, recipients: &[(DeliveryId, &str)],
        kind: Kind,
    ) -> Result<(), sqlx::Error> {
        let recipients: Vec<(Uuid, &str)> = recipients
            .iter()
            .map(|(delivery, email)| (delivery.as_uuid(), *email))
            .collect();
        let (task, workspace) = (self.task.as_uuid(), self.workspace.as_uuid());
        events::announce(tx, outlet, task, workspace, &recipients, kind).await
    }
}

/// A task as the worker delivers it.
#[derive(Clone, Debug)]
pub struct LoadedTask {
    pub message: TaskMessage,
    pub attachments: Vec<Attachment>,
    pub workspace_id: Uuid,
    pub email_type: EmailType,
    pub topic: Option<String>,
    /// A raw message's MIME (its message has an `envelope_from`).
    pub mime: Option<Vec<u8>>,
    /// Made with a test key: no message reaches the transport.
    pub test: bool,
}

impl LoadedTask {
    /// Bytes this task holds in memory (for the worker's cache budget).
    pub fn weight(&self) -> usize {
        self.attachments
            .iter()
            .map(|a| a.content.len())
            .sum::<usize>()
            + self.message.html.len()
            + self.message.text.len()
            + self.mime.as_ref().map_or(0, Vec::len)
            + 1024
    }
}

/// The task `id` with its attachments, if it exists.
pub async fn load(db: &PgPool, id: TaskId) -> Result<Option<LoadedTask>, sqlx::Error> {
    let Some((Json(message), workspace_id, email_type, topic, test)) =
        sqlx::query_as::<_, (Json<TaskMessage>, Uuid, EmailType, Option<String>, bool)>(
            "SELECT message, workspace_id, email_type, topic, test_mode FROM tasks WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(db)
        .await?
    else {
        return Ok(None);
    };
    let attachments = sqlx::query_as::<_, (String, String, Vec<u8>)>(
        "SELECT filename, content_type, content FROM task_attachments
         WHERE task_id = $1 ORDER BY idx",
    )
    .bind(id)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|(filename, content_type, content)| Attachment {
        filename,
        content_type,
        content,
    })
    .collect();
    let mime = match message.envelope_from {
        Some(_) => {
            sqlx::query_scalar("SELECT mime FROM task_mime WHERE task_id = $1")
                .bind(id)
                .fetch_optional(db)
                .await?
        }
        None => None,
    };
    Ok(Some(LoadedTask {
        message,
        attachments,
        workspace_id,
        email_type,
        topic,
        mime,
        test,
    }))
}

/// Takes a task that will never go out (cancelled, or set aside after its releases failed)
/// off every count: its deliveries leave the quota's unfinished ones and its sends the
/// caps', and each recipient gets a final `kind` event carrying `detail`.
pub async fn withdraw(
    tx: &mut PgConnection, outlet: &Outlet, workspace: WorkspaceId, task: TaskId, kind: Kind,
    detail: events::Detail,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM unfinished_deliveries WHERE delivery_id IN
             (SELECT delivery_id FROM task_recipients WHERE task_id = $1)",
    )
    .bind(task)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM sends_to WHERE task_id = $1")
        .bind(task)
        .execute(&mut *tx)
        .await?;
    let recipients: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT delivery_id, email FROM task_recipients WHERE task_id = $1 ORDER BY idx",
    )
    .bind(task)
    .fetch_all(&mut *tx)
    .await?;
    let now = postmesh_shared::db::now_unix();
    let finals: Vec<events::NewEvent> = recipients
        .into_iter()
        .map(|(delivery, email)| events::NewEvent {
            workspace: workspace.as_uuid(),
            task: Some(task.as_uuid()),
            delivery: Some(delivery),
            email,
            kind,
            detail: detail.clone(),
            occurred_at: now,
            source_key: format!("{}:{delivery}", kind.as_str()),
        })
        .collect();
    events::record(tx, outlet, &finals).await?;
    Ok(())
}

/// Whether a task with id `task` is stored.
pub async fn stored(db: &PgPool, task: TaskId) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)")
        .bind(task)
        .fetch_one(db)
        .await
}
