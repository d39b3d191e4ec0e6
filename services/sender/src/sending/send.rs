//! `POST /send-email` and `DELETE /send-email/{taskId}`: a send is parsed, checked (from
//! address, template, variables, plan quota), priced per recipient and charged as a held
//! charge keyed by its task id; the task, its recipients and its jobs commit in one
//! transaction, then the charge is confirmed and the jobs are published. A scheduled task is
//! held until the scheduler releases it, and can be cancelled (and refunded) until then.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_shared::clients::billing::HOLD;
use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath, IdempotencyKey, JsonBody};
use postmesh_shared::proto::ChargeRequest;
use postmesh_shared::{cpu, ApiError, EmailAddress, Success, TaskId};
use sqlx::{Postgres, Transaction};

use crate::model::sandbox::Outcome;
use crate::model::Recipient;
use crate::sending::keyed::Keyed;
use crate::sending::raw_mime::RawMessage;
use crate::sending::render::{add_utm, fill};
use crate::sending::request::{Content, Rejected, SendBody, SendRequest, Target};
use crate::sending::sendable;
use crate::sending::settle::{self, Action};
use crate::sending::tasks::{self, Idempotency, NewTask, TaskMessage, TaskStatus};
use crate::{
    audience::audiences, audience::contacts, sending::campaigns, sending::events,
    sending::governance, sending::templates, sending::usage, AppState,
};

pub use postmesh_contracts::answers::sender::{RecipientCounts, RejectedRecipient, SendAnswer};

impl From<Rejected> for RejectedRecipient {
    fn from(r: Rejected) -> Self {
        Self {
            email: r.email,
            reason: r.reason,
        }
    }
}

/// The message every recipient of the send gets, and the template version it came from.
async fn compose(
    state: &AppState, caller: &Caller, req: &SendRequest, from: &EmailAddress,
) -> Result<(TaskMessage, Option<(String, i32)>), ApiError> {
    let (subject, html, text, template) = match &req.content {
        Content::Inline {
            subject,
            html,
            text,
        } => (subject.clone(), html.clone(), text.clone(), None),
        Content::Template {
            key,
            version,
            subject,
        } => {
            let t = templates::find(&state.db, caller.workspace, key, *version)
                .await?
                .ok_or_else(|| {
                    ApiError::BadRequest(match version {
                        Some(v) => format!("template {key:?} has no version {v}"),
                        None => format!("no template {key:?}"),
                    })
                })?;
            let subject = subject.clone().unwrap_or(t.subject);
            (subject, t.html, t.text, Some((t.key, t.version)))
        }
    };
    let vars = &req.variables;
    let mut subject = fill(&subject, vars, false)?;
    if subject.trim().is_empty() || subject.chars().any(|c| c.is_control()) {
        return Err(ApiError::BadRequest(
            "the subject is empty or not a single line once filled".into(),
        ));
    }
    // A large body is filled and its links tagged on the CPU pool.
    let (owned_vars, utm) = (vars.clone(), req.utm.clone());
    let html = cpu::run_sized(html.len(), move || {
        let html = fill(&html, &owned_vars, true)?;
        Ok::<_, ApiError>(if utm.is_empty() {
            html
        } else {
            add_utm(&html, &utm)
        })
    })
    .await?;
    let text = fill(&text, vars, false)?;
    let (track_opens, track_clicks) = match (req.track_opens, req.track_clicks) {
        (Some(opens), Some(clicks)) => (opens, clicks),
        (opens, clicks) => {
            let d =
                crate::sending::tracking::defaults(&state.db, caller.workspace.as_uuid()).await?;
            (opens.unwrap_or(d.opens), clicks.unwrap_or(d.clicks))
        }
    };
    if req.test_send {
        subject = format!("[Test] {subject}");
    }
    // A test send goes to the caller alone: no copies.
    let strings = |list: &[EmailAddress]| {
        list.iter()
            .filter(|_| !req.test_send)
            .map(|a| a.to_string())
            .collect()
    };
    Ok((
        TaskMessage {
            from_email: from.to_string(),
            from_name: req.from_name.clone(),
            reply_to: req.reply_to.as_ref().map(|a| a.to_string()),
            cc: strings(&req.cc),
            bcc: strings(&req.bcc),
            subject,
            html,
            text,
            message_id: req.message_id.clone(),
            in_reply_to: req.in_reply_to.clone(),
            references: req.references.clone(),
            test: req.test_send,
            envelope_from: None,
            track_opens,
            track_clicks,
            tracking_base: None,
            tracking_domain: None,
        },
        template,
    ))
}

/// `POST /send-email`. With an `Idempotency-Key` header, a repeat of a stored send gets the
/// answer the first got and sends and charges nothing more; the same key with another body
/// is a 409. A send that failed stored nothing, so its key can be retried.
pub(crate) async fn send(
    State(state): State<AppState>, caller: Caller, key: Option<IdempotencyKey>,
    JsonBody(body): JsonBody<SendBody>,
) -> Result<Success<SendAnswer>, ApiError> {
    let keyed = key.map(|key| Keyed::new(key, &body));
    once(&state, &caller, body, keyed, None)
        .await
        .map(Success::new)
}

/// Submits a send (of `raw`, when it is a raw message) as a new task, unless one is stored
/// under `keyed`: then that one's answer.
pub(crate) async fn once(
    state: &AppState, caller: &Caller, body: SendBody, keyed: Option<Keyed>,
    raw: Option<&RawMessage>,
) -> Result<SendAnswer, ApiError> {
    if let Some(keyed) = &keyed {
        if let Some(answer) = keyed.stored(state, caller).await? {
            return Ok(answer);
        }
    }
    match submit(state, caller, body, TaskId::new(), keyed.as_ref(), raw).await {
        Ok(answer) => Ok(answer),
        // A twin with the same key may have committed first (this one's charge is already
        // refunded): its answer is this one's.
        Err(e) => match &keyed {
            Some(keyed) => match keyed.stored(state, caller).await {
                Ok(Some(answer)) => Ok(answer),
                _ => Err(e),
            },
            None => Err(e),
        },
    }
}

/// Checks, prices, charges and stores a send as task `id` (a workflow step names its own,
/// so a retried step finds the task it made), under `keyed` when it has an
/// `Idempotency-Key` (a dry run stores nothing, so its key binds nothing).
pub(crate) async fn submit(
    state: &AppState, caller: &Caller, body: SendBody, id: TaskId, keyed: Option<&Keyed>,
    raw: Option<&RawMessage>,
) -> Result<SendAnswer, ApiError> {
    let now = now_unix();
    let mut body = body;
    // A campaign's defaults are read only for a send that targets it alone.
    crate::sending::request::one_target(&body)?;
    if let Some(key) = &body.campaign_key {
        let key = key.clone();
        campaigns::fill_defaults(&state.db, caller.workspace, &key, &mut body).await?;
    }
    let req = SendRequest::parse(body, now)?;
    let from = req
        .from_email
        .clone()
        .unwrap_or_else(|| (*state.default_from).clone());
    let checked = sendable::check(state, caller, &from, raw.is_some()).await?;
    let (mut message, template) = match raw {
        Some(raw) => {
            if raw.envelope_from != from {
                sendable::check(state, caller, &raw.envelope_from, true).await?;
            }
            // A raw message has no per-send switches: the workspace's defaults track it.
            let mut message = raw.task_message();
            let d =
                crate::sending::tracking::defaults(&state.db, caller.workspace.as_uuid()).await?;
            (message.track_opens, message.track_clicks) = (d.opens, d.clicks);
            (message, None)
        }
        None => compose(state, caller, &req, &from).await?,
    };
    // Tracked through the from-domain's own verified tracking host, when it has one.
    (message.tracking_base, message.tracking_domain) = sendable::tracking_base(&checked).unzip();
    let (campaign_key, mut recipients, mut rejected) = recipients_of(state, caller, &req).await?;
    sandbox_rules(state, &message, &mut recipients, &mut rejected)?;
    // A test send goes to the caller alone, whatever the rules.
    let recipients = if req.test_send {
        recipients
    } else {
        let mut conn = state.db.acquire().await?;
        let (recipients, filtered) =
            governance::suppressions(&mut conn, caller.workspace, &req, recipients).await?;
        rejected.extend(filtered);
        for copies in [&mut message.cc, &mut message.bcc] {
            rejected.extend(governance::copies(&mut conn, caller.workspace, &req, copies).await?);
        }
        recipients
    };
    let quota = usage::Quota::of(state, caller).await?;
    // Caps are counted under the addresses' locks, in the transaction that stores the send.
    let mut tx = state.db.begin().await?;
    let (recipients, capped) = governance::caps(
        &mut tx,
        caller.workspace,
        &req,
        recipients,
        now,
        !req.dry_run,
    )
    .await?;
    rejected.extend(capped);
    // Billing is per recipient, and a copy (cc, bcc) is a recipient of each message; a
    // sandbox address's message goes nowhere and costs nothing.
    let paid = recipients
        .iter()
        .filter(|r| !state.sandbox.holds(r.email.as_str()))
        .count();
    let cost = (paid * (1 + message.cc.len() + message.bcc.len())) as i64;
    // A test key's send is priced (its answer's `cost`) and charges nothing.
    let charged = if caller.test { 0 } else { cost };
    let mut task = NewTask {
        id,
        status: match req.scheduled_at {
            Some(_) => TaskStatus::Scheduled,
            None => TaskStatus::Queued,
        },
        caller,
        req: &req,
        message: &message,
        recipients: &recipients,
        rejected: &rejected,
        template: template.as_ref().map(|(k, v)| (k.as_str(), *v)),
        campaign_key: campaign_key.as_deref(),
        cost: charged,
        now,
        idempotency: None,
        mime: raw.map(|r| r.mime.as_slice()),
    };
    let answer = |task_id| SendAnswer {
        task_id,
        status: task.status,
        scheduled_at: req.scheduled_at,
        recipients: RecipientCounts {
            accepted: recipients.len(),
            rejected: rejected.iter().cloned().map(Into::into).collect(),
        },
        cost,
        dry_run: req.dry_run,
        test_send: req.test_send,
        template_key: template.as_ref().map(|t| t.0.clone()),
        template_version: template.as_ref().map(|t| t.1),
        campaign_key: campaign_key.clone(),
    };
    let charge = charge_of(&task, &from);
    if req.dry_run {
        quota.check(&mut tx, recipients.len() as i64).await?;
        drop(tx);
        if charged > 0 {
            state.billing.covers(charge).await?;
        }
        return Ok(answer(None));
    }
    let accepted = answer(Some(task.id));
    task.idempotency = keyed.map(|k| Idempotency {
        key: k.key.as_str(),
        digest: &k.digest,
        answer: serde_json::to_value(&accepted).unwrap_or_default(),
    });
    accept(state, &quota, tx, &task, charge).await?;
    Ok(accepted)
}

/// The sandbox's rules at acceptance: an address on its domain that asks for no outcome is
/// a 400, as is one among the copies (a copy rides on another recipient's message); a
/// `suppressed@` recipient is left out as suppressed.
fn sandbox_rules(
    state: &AppState, message: &TaskMessage, recipients: &mut Vec<Recipient>,
    rejected: &mut Vec<Rejected>,
) -> Result<(), ApiError> {
    for copy in message.cc.iter().chain(&message.bcc) {
        if state.sandbox.outcome(copy)?.is_some() {
            return Err(ApiError::BadRequest(format!(
                "{copy} is a sandbox address: it may be a recipient, not a cc or bcc copy"
            )));
        }
    }
    let mut kept = Vec::with_capacity(recipients.len());
    for r in recipients.drain(..) {
        match state.sandbox.outcome(r.email.as_str())? {
            Some(Outcome::Suppressed) => rejected.push(Rejected {
                email: r.email.to_string(),
                reason: "suppressed:sandbox".into(),
            }),
            _ => kept.push(r),
        }
    }
    *recipients = kept;
    Ok(())
}

/// Who the send goes to: the recipients of its `to`, its audience's contacts or its
/// campaign's frozen audience (with the campaign's key), and those left out; for a test
/// send the caller alone. An audience send with a `campaignName` makes that campaign and
/// freezes its audience.
async fn recipients_of(
    state: &AppState, caller: &Caller, req: &SendRequest,
) -> Result<(Option<String>, Vec<Recipient>, Vec<Rejected>), ApiError> {
    if req.test_send {
        let own = EmailAddress::parse(&caller.email).ok_or_else(|| {
            ApiError::BadRequest("testSend needs an account with an email address".into())
        })?;
        let own = Recipient {
            email: own,
            external_id: None,
        };
        return Ok((None, vec![own], Vec::new()));
    }
    let max = state.audience_max;
    match &req.target {
        Target::To => {
            let mut recipients = req.recipients.clone();
            contacts::fill_external_ids(&state.db, caller.workspace, &mut recipients).await?;
            Ok((None, recipients, req.rejected.clone()))
        }
        Target::Audience { raw, .. } if req.campaign_name.is_some() && !req.dry_run => {
            let name = req.campaign_name.as_deref().unwrap_or_default();
            let key = campaigns::create_for_send(
                &state.db,
                caller.workspace,
                name,
                raw,
                req.email_type,
                req.topic.as_deref(),
            )
            .await?;
            let recipients =
                campaigns::recipients(&state.db, caller.workspace, &key, max, true).await?;
            Ok((Some(key), recipients, Vec::new()))
        }
        Target::Audience { audience, .. } => {
            let mut conn = state.db.acquire().await?;
            let found = audiences::resolve(&mut conn, caller.workspace, audience, max).await?;
            Ok((
                None,
                found.into_iter().map(|(_, r)| r).collect(),
                Vec::new(),
            ))
        }
        Target::Campaign(key) => {
            let recipients =
                campaigns::recipients(&state.db, caller.workspace, key, max, !req.dry_run).await?;
            Ok((Some(key.clone()), recipients, Vec::new()))
        }
    }
}

/// The held charge of `task`, keyed by its id, with what the consumption log shows.
fn charge_of(task: &NewTask<'_>, from: &EmailAddress) -> ChargeRequest {
    let recipients = task.recipients;
    ChargeRequest {
        target_email: (recipients.len() == 1).then(|| recipients[0].email.to_string()),
        from_email: Some(from.to_string()),
        subject: Some(task.message.subject.clone()),
        send_mode: Some(task.req.email_type.as_str().to_owned()),
        recipient_count: Some(recipients.len() as i64),
        task_id: Some(task.id.to_string()),
        // Held until the send is committed and settled (see `settle`).
        hold_secs: HOLD.as_secs() as i64,
        ..task.caller.charge(task.cost, task.id.to_string())
    }
}

/// Takes the charge, commits the task in `tx` (refunding the charge when that fails),
/// settles the charge, and publishes a queued task's jobs. A send every recipient of which
/// was filtered out is stored, for its status, and charges nothing.
async fn accept(
    state: &AppState, quota: &usage::Quota, tx: Transaction<'_, Postgres>, task: &NewTask<'_>,
    charge: ChargeRequest,
) -> Result<(), ApiError> {
    let charged = task.cost > 0;
    if charged {
        state.billing.charge(charge).await?;
    }
    if let Err(e) = store(tx, &state.events, quota, task).await {
        // A task of this id stored meanwhile (a workflow step taken up twice: its id is the
        // step's) owns the charge under that id: it is not ours to give back. Unsure, the
        // hold runs out and billing gives it back by itself.
        if charged && !tasks::stored(&state.db, task.id).await.unwrap_or(true) {
            let key = task.caller.key.to_string();
            state
                .billing
                .refund(&key, &task.id.to_string(), "send not queued")
                .await;
        }
        return Err(e);
    }
    if charged {
        settle::now(state, task.id, Action::Confirm).await;
    }
    if task.status == TaskStatus::Queued {
        publish_soon(state);
    }
    metrics::counter!("postmesh_send_recipients_accepted_total")
        .increment(task.recipients.len() as u64);
    Ok(())
}

/// Commits the task with its jobs, within the plan's quota.
async fn store(
    mut tx: Transaction<'_, Postgres>, outlet: &events::Outlet, quota: &usage::Quota,
    task: &NewTask<'_>,
) -> Result<(), ApiError> {
    quota.check(&mut tx, task.recipients.len() as i64).await?;
    tasks::insert(&mut tx, outlet, task).await.map_err(|e| {
        if postmesh_shared::db::is_unique_violation(&e) && task.idempotency.is_some() {
            // A twin under the same key committed first; `send` answers with its task.
            ApiError::Conflict("a send with this Idempotency-Key was stored meanwhile".into())
        } else {
            e.into()
        }
    })?;
    if task.cost > 0 {
        settle::owe(
            &mut tx,
            &charge(task.caller, task.id, Action::Confirm, task.cost),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The charge of `task` as a settlement owes it.
fn charge(caller: &Caller, task: TaskId, action: Action, cost: i64) -> settle::Charge {
    settle::Charge {
        task_id: task,
        action,
        api_key_id: caller.key.as_uuid(),
        account_id: caller.account.to_string(),
        caller_email: caller.email.clone(),
        cost,
    }
}

/// Publishes the outbox's waiting jobs in the background (the relay's next tick would
/// too; this saves its delay).
pub fn publish_soon(state: &AppState) {
    let outbox = state.outbox.clone();
    state.tracker.spawn(async move {
        loop {
            match outbox.relay_once().await {
                Ok(true) => continue,
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "publishing jobs failed; the relay retries");
                    return;
                }
            }
        }
    });
}

/// The answer to a cancel.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SendCancelled)]
pub struct Cancelled {
    pub task_id: TaskId,
    pub status: TaskStatus,
    /// Credits given back.
    pub refunded: i64,
}

pub(crate) async fn cancel(
    State(state): State<AppState>, caller: Caller, IdPath(task_id): IdPath<TaskId>,
) -> Result<Success<Cancelled>, ApiError> {
    // The row lock orders this against a scheduler releasing the task at this moment; the
    // refund is owed in the same transaction.
    let mut tx = state.db.begin().await?;
    let cancelled: Option<i64> = sqlx::query_scalar(
        "UPDATE tasks SET status = 'cancelled', cancelled_at = $3
         WHERE id = $1 AND api_key_id = $2 AND status = 'scheduled' RETURNING cost",
    )
    .bind(task_id)
    .bind(caller.key)
    .bind(now_unix())
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(cost) = cancelled {
        let (kind, detail) = (events::Kind::Cancelled, events::Detail::Empty {});
        tasks::withdraw(
            &mut tx,
            &state.events,
            caller.workspace,
            task_id,
            kind,
            detail,
        )
        .await?;
        if cost > 0 {
            settle::owe(&mut tx, &charge(&caller, task_id, Action::Refund, cost)).await?;
        }
    }
    tx.commit().await?;
    let Some(cost) = cancelled else {
        let status: Option<TaskStatus> =
            sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1 AND api_key_id = $2")
                .bind(task_id)
                .bind(caller.key)
                .fetch_optional(&state.db)
                .await?;
        return Err(match status {
            None => ApiError::NotFound(format!("no task {task_id}")),
            Some(s) => ApiError::Conflict(format!(
                "task {task_id} is {}; only a scheduled task can be cancelled",
                s.as_str()
            )),
        });
    };
    if cost > 0 {
        settle::now(&state, task_id, Action::Refund).await;
    }
    Ok(Success::new(Cancelled {
        task_id,
        status: TaskStatus::Cancelled,
        refunded: cost,
    }))
}
