//! The delivery worker: the SEND queue on the kit's queue worker (`postmesh_shared::queue`),
//! with the sender's stages — decode a job, prepare what its messages share (a task, read
//! once and cached), claim each message's `deliveries` row (`lease`), build its MIME
//! (`message`) and hand it to the transport, record the outcome (`record`). Policy:
//! docs/decisions.md, "Delivery (sender)".

mod cache;
mod lease;
mod message;
mod raw_html;
mod record;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::{send_job, CodeEmail, JobKind, SendJob};
use postmesh_shared::queue::{
    self, ClaimRow, Failure, QueueConfig, RecordRow, StageError, Stages, Standing, Timers,
};
use postmesh_shared::{DeliveryId, JobId, Runtime, TaskId, WorkspaceId};

use postmesh_shared::db::now_unix;

use crate::delivery::transport::{Outgoing, Transport, TransportError};
use crate::delivery::unsubscribe::Unsubscribe;
use crate::model::sandbox::Sandbox;
use crate::sending::events::Outlet;
use crate::sending::request::EmailType;
use crate::sending::tasks::{self, LoadedTask};
use crate::sending::tracking::links::Instrument;
use crate::sending::tracking::Tracker;
use postmesh_shared::tracking::Binding;

/// Retry and concurrency settings of the worker.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// How long JetStream waits for an ack before redelivering a job.
    pub ack_wait: Duration,
    /// Delivery attempts (claims that reached the transport) before a message is parked as
    /// failed.
    pub max_deliver: i64,
    /// Delay before the first retry; doubles with each attempt.
    pub retry_base: Duration,
    /// Messages delivered at once by one worker.
    pub concurrency: usize,
}

/// A SEND job, parsed: one code email, or a slice of a task's recipients.
pub(crate) struct Job {
    kind: JobKind,
    workspace: Option<WorkspaceId>,
    body: Body,
}

/// What a job delivers.
enum Body {
    /// A verification code: one message, under the job's own id.
    Code { id: DeliveryId, email: CodeEmail },
    /// Each recipient of a task is one message, built from the stored task.
    Slice {
        task: TaskId,
        recipients: Vec<(DeliveryId, String)>,
    },
}

/// What a job's messages share: the subject (recorded with each claim) and, for a task's
/// job, the task (`None` when it is gone: the messages fail).
pub(crate) struct Letter {
    subject: String,
    task: Option<Arc<LoadedTask>>,
}

/// The sender's stages.
struct Delivery {
    db: PgPool,
    transport: Transport,
    /// Where delivery events go; its domain is that of the Message-IDs made here.
    outlet: Outlet,
    /// Tasks recently delivered, so a task's jobs do not each read it again.
    tasks: cache::TaskCache,
    /// Signs the one-click unsubscribe links of marketing and lifecycle mail.
    unsubscribe: Option<Unsubscribe>,
    /// Tracks opens and clicks of the messages whose sends asked.
    tracker: Option<Tracker>,
    /// Addresses whose messages never reach the transport.
    sandbox: Sandbox,
}

/// What the worker delivers with: the transport, where events go, the unsubscribe signer
/// and the sandbox.
pub struct Equipment {
    pub transport: Transport,
    pub outlet: Outlet,
    pub unsubscribe: Option<Unsubscribe>,
    pub tracker: Option<Tracker>,
    pub sandbox: Sandbox,
}

impl Delivery {
    /// `html` of `task`'s message `delivery` with its tracked links and, where `pixel`, its
    /// pixel, when the send asked for either and tracking is configured.
    async fn track(
        &self, task: &LoadedTask, delivery: Uuid, html: &str, pixel: bool,
    ) -> Option<String> {
        let tracker = self.tracker.clone()?;
        let m = &task.message;
        let (opens, clicks) = (m.track_opens && pixel, m.track_clicks);
        if !(opens || clicks) || html.is_empty() {
            return None;
        }
        // The unsubscribe page's address, which links never go through tracking to.
        let prefix = self
            .unsubscribe
            .as_ref()
            .map(|u| u.url("").trim_end_matches("?token=").to_owned());
        let html = html.to_owned();
        let bound = m.tracking_binding().map(|b| (b.host.to_owned(), b.domain));
        Some(
            postmesh_shared::cpu::run_sized(html.len(), move || {
                Instrument {
                    tracker: &tracker,
                    bound: bound.as_ref().map(|(host, domain)| Binding {
                        host,
                        domain: *domain,
                    }),
                    delivery,
                    opens,
                    clicks,
                    unsubscribe_prefix: prefix.as_deref(),
                }
                .apply(&html)
            })
            .await,
        )
    }

    /// A raw message's `mime` with its HTML parts tracked as [`Self::track`] tracks a built
    /// message's; as it is when nothing is tracked.
    async fn track_raw<'m>(
        &self, task: &Arc<LoadedTask>, delivery: Uuid, mime: &'m [u8],
    ) -> Cow<'m, [u8]> {
        let m = &task.message;
        if self.tracker.is_none() || !(m.track_opens || m.track_clicks) {
            return Cow::Borrowed(mime);
        }
        let whole = task.clone();
        let parts = postmesh_shared::cpu::run_sized(mime.len(), move || {
            raw_html::html_parts(whole.mime.as_deref().unwrap_or_default())
        })
        .await;
        let mut tracked = Vec::with_capacity(parts.len());
        // One pixel a message: in its first HTML part.
        for (i, part) in parts.into_iter().enumerate() {
            if let Some(html) = self.track(task, delivery, &part.html, i == 0).await {
                tracked.push((part, html));
            }
        }
        if tracked.is_empty() {
            return Cow::Borrowed(mime);
        }
        Cow::Owned(raw_html::replaced(mime, &tracked))
    }

    /// The unsubscribe link of `task`'s message `delivery` to `to`: none for transactional
    /// mail.
    fn unsubscribe_link(&self, task: &LoadedTask, to: &str, delivery: Uuid) -> Option<String> {
        let signer = self.unsubscribe.as_ref()?;
        if task.email_type == EmailType::Transactional {
            return None;
        }
        let token = signer.token(
            task.workspace_id,
            to,
            task.topic.as_deref(),
            Some(delivery),
            now_unix(),
        );
        Some(signer.url(&token))
    }
}

/// Consumes the SEND stream until the runtime shuts down; jobs in progress finish first.
pub async fn spawn(rt: &Runtime, with: Equipment, config: WorkerConfig) -> anyhow::Result<()> {
    let stages = Delivery {
        db: rt.db.clone(),
        transport: with.transport,
        outlet: with.outlet,
        tasks: cache::TaskCache::default(),
        unsubscribe: with.unsubscribe,
        tracker: with.tracker,
        sandbox: with.sandbox,
    };
    let config = QueueConfig {
        name: "sender",
        ack_wait: config.ack_wait,
        max_deliver: config.max_deliver,
        retry_base: config.retry_base,
        concurrency: config.concurrency,
        // The next job's claims are written while the current one's messages go out.
        claim_ahead: 2 * config.concurrency.max(tasks::RECIPIENTS_PER_JOB),
        timers: Timers::Redelivery,
    };
    queue::spawn(rt, Stream::Send, config, stages).await
}

impl Job {
    /// Each message's delivery id and address, in order.
    fn messages(&self) -> Vec<(DeliveryId, &str)> {
        (0..self.len()).map(|i| self.message(i)).collect()
    }

    /// How many messages the job delivers.
    fn len(&self) -> usize {
        match &self.body {
            Body::Code { .. } => 1,
            Body::Slice { recipients, .. } => recipients.len(),
        }
    }

    /// The delivery id and address of the message at `index`.
    fn message(&self, index: usize) -> (DeliveryId, &str) {
        match &self.body {
            Body::Code { id, email } => (*id, email.to.as_str()),
            Body::Slice { recipients, .. } => {
                let (id, to) = &recipients[index];
                (*id, to.as_str())
            }
        }
    }

    fn task(&self) -> Option<TaskId> {
        match &self.body {
            Body::Code { .. } => None,
            Body::Slice { task, .. } => Some(*task),
        }
    }
}

impl Stages for Delivery {
    type Job = Job;
    type Shared = Letter;
    type ClaimData = lease::Claim;

    fn decode(&self, payload: &[u8]) -> Result<Job, StageError> {
        decode(payload).map_err(StageError::Undecodable)
    }

    fn items(&self, job: &Job) -> Vec<Uuid> {
        job.messages().iter().map(|(id, _)| id.as_uuid()).collect()
    }

    async fn prepare(&self, job: &Job) -> Result<Letter, StageError> {
        let task_id = match &job.body {
            Body::Code { email, .. } => {
                return Ok(Letter {
                    subject: email.subject.clone(),
                    task: None,
                })
            }
            Body::Slice { task, .. } => *task,
        };
        let task = match self.tasks.get(task_id) {
            Some(task) => Some(task),
            None => tasks::load(&self.db, task_id)
                .await?
                .map(|t| self.tasks.insert(task_id, t)),
        };
        Ok(Letter {
            subject: task
                .as_ref()
                .map(|t| t.message.subject.clone())
                .unwrap_or_default(),
            task,
        })
    }

    fn claim_data(&self, job: &Job, letter: &Letter, index: usize) -> lease::Claim {
        lease::Claim {
            kind: job.kind.name(),
            recipient: job.message(index).1.to_owned(),
            subject: letter.subject.clone(),
            workspace: job.workspace.map(|w| w.as_uuid()),
            task: job.task().map(|t| t.as_uuid()),
        }
    }

    async fn claim(
        &self, rows: Vec<ClaimRow<lease::Claim>>, lease_ms: i64,
    ) -> Result<Vec<Option<i32>>, StageError> {
        Ok(lease::claim_batch(&self.db, lease_ms, rows).await?)
    }

    async fn standing(&self, item: Uuid) -> Result<Standing, StageError> {
        Ok(lease::standing(&self.db, item).await?)
    }

    async fn work(&self, job: &Job, letter: &Letter, index: usize) -> Result<String, Failure> {
        let (id, to) = job.message(index);
        // A sandbox address's message goes nowhere; its outcome is in its provider id.
        match self.sandbox.outcome(to) {
            Ok(Some(outcome)) => return Ok(Sandbox::provider_id(outcome, id.as_uuid())),
            Ok(None) => {}
            Err(e) => return Err(Failure::Permanent(e.to_string())),
        }
        // A test key's message goes nowhere either: it is delivered at once.
        if letter.task.as_ref().is_some_and(|t| t.test) {
            return Ok(Sandbox::test_provider_id(id.as_uuid()));
        }
        let message_id = format!("<{id}@{}>", self.outlet.message_id_domain);
        let message = match (&job.body, &letter.task) {
            (Body::Code { email, .. }, _) => {
                message::build(&message::Draft::of_code(email, message_id)).map(Outgoing::from)
            }
            (Body::Slice { .. }, Some(task)) => {
                let link = self.unsubscribe_link(task, to, id.as_uuid());
                match &task.mime {
                    Some(mime) => {
                        let mime = self.track_raw(task, id.as_uuid(), mime).await;
                        message::raw(task, &mime, to, link.as_deref())
                    }
                    None => {
                        let mut draft = message::Draft::of_task(task, to, message_id, link);
                        if let Some(html) = self.track(task, id.as_uuid(), &draft.html, true).await
                        {
                            draft.html = html.into();
                        }
                        message::build(&draft).map(Outgoing::from)
                    }
                }
            }
            (Body::Slice { task, .. }, None) => {
                return Err(Failure::Permanent(format!("task {task} no longer exists")))
            }
        }
        .map_err(Failure::Permanent)?;
        self.transport
            .deliver(id, message)
            .await
            .map_err(|e| match e {
                TransportError::Permanent(e) => Failure::Permanent(e),
                TransportError::Transient(e) => Failure::Transient(e),
            })
    }

    async fn record(&self, rows: Vec<RecordRow>) -> Result<Vec<bool>, StageError> {
        Ok(record::record_batch(&self.db, &self.outlet, rows).await?)
    }

    async fn renew(&self, items: &[Uuid], lease: Uuid, lease_ms: i64) -> Result<(), StageError> {
        Ok(lease::renew(&self.db, items, lease, lease_ms).await?)
    }
}

/// Parses a SEND message; a job that can never be delivered is the error.
fn decode(payload: &[u8]) -> Result<Job, String> {
    let send = SendJob::decode(payload).map_err(|e| format!("undecodable: {e}"))?;
    let id = JobId::parse(&send.id).ok_or("job id is not a uuid")?;
    let kind = send.kind();
    let body = match send.body.ok_or("the job has no body")? {
        send_job::Body::Code(email) => Body::Code {
            id: DeliveryId::from(id.as_uuid()),
            email,
        },
        send_job::Body::Slice(slice) => Body::Slice {
            task: TaskId::parse(&slice.task_id).ok_or("task id is not a uuid")?,
            recipients: slice
                .recipients
                .into_iter()
                .map(|r| {
                    let id =
                        DeliveryId::parse(&r.delivery_id).ok_or("a delivery id is not a uuid")?;
                    Ok((id, r.email))
                })
                .collect::<Result<_, String>>()?,
        },
    };
    Ok(Job {
        kind,
        workspace: WorkspaceId::parse(&send.workspace_id),
        body,
    })
}

#[cfg(test)]
mod tests {
    use postmesh_shared::proto::{SliceRecipient, TaskSlice};

    use super::*;

    fn code_job(id: &str) -> SendJob {
        SendJob {
            id: id.into(),
            body: Some(send_job::Body::Code(CodeEmail {
                to: "a@example.com".into(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn a_code_email_is_one_message_under_the_job_id() {
        assert!(decode(&code_job("nope").encode_to_vec()).is_err());
        assert!(decode(b"\xff\xff").is_err());
        let bodiless = SendJob {
            id: JobId::new().to_string(),
            ..Default::default()
        };
        assert!(decode(&bodiless.encode_to_vec()).is_err());
        let id = JobId::new();
        let job = decode(&code_job(&id.to_string()).encode_to_vec()).unwrap();
        let messages = job.messages();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].0.as_uuid(), id.as_uuid());
        assert_eq!(messages[0].1, "a@example.com");
    }

    #[test]
    fn a_slice_of_recipients_is_one_message_each() {
        let (a, b) = (DeliveryId::new(), DeliveryId::new());
        let recipient = |id: DeliveryId, email: &str| SliceRecipient {
            delivery_id: id.to_string(),
            email: email.into(),
        };
        let slice = |recipients| SendJob {
            id: JobId::new().to_string(),
            body: Some(send_job::Body::Slice(TaskSlice {
                task_id: TaskId::new().to_string(),
                recipients,
            })),
            ..Default::default()
        };
        let job = slice(vec![
            recipient(a, "a@example.com"),
            recipient(b, "b@example.com"),
        ]);
        let job = decode(&job.encode_to_vec()).unwrap();
        assert_eq!(job.messages(), [(a, "a@example.com"), (b, "b@example.com")]);
        let bad = slice(vec![SliceRecipient {
            delivery_id: "nope".into(),
            email: "a@example.com".into(),
        }]);
        assert!(decode(&bad.encode_to_vec()).is_err());
    }
}
