//! Runs: a contact's way through one version of a workflow. Started and ended by events
//! (in the event's transaction), advanced by a timer pass that leases due runs with
//! `FOR UPDATE SKIP LOCKED` (each write checks the pass still holds the lease). A send
//! step's task id is derived from the run, the step and its failed tries, so a step redone
//! after a crash finds its task and never sends twice, and a try that failed (no task
//! stored) is retried under a fresh id and charge key.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sqlx::types::Json;
use sqlx::PgConnection;
use uuid::Uuid;

use postmesh_shared::db::{now_unix, DB_SECOND};
use postmesh_shared::extract::Caller;
use postmesh_shared::proto::Role;
use postmesh_shared::{AccountId, ApiError, ApiKeyId, TaskId, WorkspaceId};

use super::definition::{all_hold, Step, Workflow, WorkflowBody, MAX_WAIT_SECS};
use super::event::EventView;
use crate::audience::contacts::{self, Contact};
use crate::sending::request::{HeaderText, SendBody, To, ToItem};
use crate::AppState;

pub use postmesh_contracts::answers::sender::{RunStatus, RunView};

/// Runs one pass advances at most.
const BATCH: i64 = 50;
/// Seconds a pass holds a run it works on: a replica that dies holding one delays it this
/// long. A step outliving it may be taken up twice; its send is still made once (the task
/// id is the step's, and a task is stored once).
const LEASE_SECS: i64 = 10;
/// Tries of a send step that fails for a passing reason, before the run fails.
const MAX_ATTEMPTS: i32 = 8;
/// Passes that took a run up and ended without a word (the process working it stopped)
/// before the run fails: one whose handling brings its process down is not taken up forever.
pub const MAX_CLAIMS: i32 = 5;

const VIEW: &str = "id, workflow_id, status, pc AS step, started_at, ended_at, exit_reason";

/// The runs event `event_id` started.
pub async fn of_event(
    conn: &mut PgConnection, workspace: WorkspaceId, event_id: &str,
) -> Result<Vec<RunView>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {VIEW} FROM workflow_runs WHERE workspace_id = $1 AND event_id = $2 ORDER BY id"
    ))
    .bind(workspace)
    .bind(event_id)
    .fetch_all(conn)
    .await
}

/// Version `version` of workflow `id`, compiled.
pub async fn definition(
    conn: &mut PgConnection, id: Uuid, version: i32,
) -> Result<Workflow, ApiError> {
    let Json(body): Json<WorkflowBody> = sqlx::query_scalar(
        "SELECT definition FROM workflow_versions WHERE workflow_id = $1 AND version = $2",
    )
    .bind(id)
    .bind(version)
    .fetch_one(conn)
    .await?;
    Workflow::parse(&body).map_err(|e| ApiError::Internal(format!("stored workflow: {e}")))
}

/// Ends the contact's active runs of workflows that `event_name` exits, when an exit rule's
/// conditions hold: a test key's event only test runs, a live key's only live ones.
pub async fn exit_for(
    tx: &mut PgConnection, caller: &Caller, event_name: &str, contact: &Contact,
    properties: &Map<String, Value>,
) -> Result<(), ApiError> {
    let active: Vec<(Uuid, Uuid, i32)> = sqlx::query_as(
        "SELECT r.id, r.workflow_id, r.version FROM workflow_runs r
         JOIN workflow_versions v ON v.workflow_id = r.workflow_id AND v.version = r.version
         WHERE r.workspace_id = $1 AND r.contact_id = $2 AND r.status = 'active'
           AND $3 = ANY (v.exit_events) AND r.test_mode = $4
         ORDER BY r.id FOR UPDATE OF r",
    )
    .bind(caller.workspace)
    .bind(contact.id)
    .bind(event_name)
    .bind(caller.test)
    .fetch_all(&mut *tx)
    .await?;
    for (run, workflow, version) in active {
        let def = definition(tx, workflow, version).await?;
        let exits = def.exits.iter().any(|rule| {
            rule.event_name == event_name && all_hold(&rule.conditions, contact, properties)
        });
        if exits {
            end(
                tx,
                run,
                RunStatus::Exited,
                Some(&format!("exit event {event_name}")),
            )
            .await?;
        }
    }
    Ok(())
}

/// Marks run `id` ended with `status` and `reason`.
async fn end(
    conn: &mut PgConnection, id: Uuid, status: RunStatus, reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE workflow_runs SET status = $2, exit_reason = $3, ended_at = $4, next_at = NULL,
                                  lease_until = NULL
         WHERE id = $1 AND status = 'active'",
    )
    .bind(id)
    .bind(status)
    .bind(reason)
    .bind(now_unix())
    .execute(conn)
    .await?;
    Ok(())
}

/// The workflows `event_name` triggers, with their versions, locked against a delete (in
/// id order) until the transaction ends.
pub async fn triggered(
    tx: &mut PgConnection, caller: &Caller, event_name: &str,
) -> Result<Vec<(Uuid, i32)>, ApiError> {
    Ok(sqlx::query_as(
        "SELECT id, version FROM workflows
         WHERE workspace_id = $1 AND trigger_event = $2 AND deleted_at IS NULL ORDER BY id
         FOR SHARE",
    )
    .bind(caller.workspace)
    .bind(event_name)
    .fetch_all(tx)
    .await?)
}

/// Starts a run of each `triggered` workflow for `contact` (whose conditions hold), unless
/// the workflow allows no reentry and the contact has an active run of it.
pub async fn start_for(
    tx: &mut PgConnection, caller: &Caller, triggered: Vec<(Uuid, i32)>, event: &EventView,
    contact: &Contact, properties: &Map<String, Value>,
) -> Result<Vec<RunView>, ApiError> {
    let mut started = Vec::new();
    for (workflow, version) in triggered {
        let def = definition(tx, workflow, version).await?;
        if !all_hold(&def.trigger.conditions, contact, properties) {
            continue;
        }
        let now = now_unix();
        let run: Option<RunView> = sqlx::query_as(&format!(
            "INSERT INTO workflow_runs (id, workspace_id, workflow_id, version, contact_id,
                                        event_id, single, status, pc, next_at, started_at,
                                        account_id, billing_key, caller_email, test_mode)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', 0, $8, $8, $9, $10, $11, $12)
             ON CONFLICT DO NOTHING RETURNING {VIEW}"
        ))
        .bind(Uuid::now_v7())
        .bind(caller.workspace)
        .bind(workflow)
        .bind(version)
        .bind(contact.id)
        .bind(&event.event_id)
        .bind(!def.reentry)
        .bind(now)
        .bind(caller.account)
        .bind(caller.key)
        .bind(&caller.email)
        .bind(caller.test)
        .fetch_optional(&mut *tx)
        .await?;
        started.extend(run);
    }
    metrics::counter!("postmesh_workflow_runs_started_total").increment(started.len() as u64);
    Ok(started)
}

/// A leased run.
#[derive(sqlx::FromRow)]
struct Due {
    id: Uuid,
    workspace_id: WorkspaceId,
    workflow_id: Uuid,
    version: i32,
    contact_id: Uuid,
    event_id: String,
    pc: i32,
    attempts: i32,
    account_id: AccountId,
    billing_key: ApiKeyId,
    caller_email: String,
    /// Started by a test key's event: its sends are a test key's.
    test_mode: bool,
}

/// Leases up to [`BATCH`] due runs and advances each (renewing its lease first); true
/// when more may be due.
pub async fn advance_due(state: &AppState) -> Result<bool, ApiError> {
    let token = Uuid::now_v7();
    let due: Vec<Due> = sqlx::query_as(&format!(
        "WITH due AS MATERIALIZED (
             SELECT id FROM workflow_runs
             WHERE status = 'active' AND next_at <= {DB_SECOND}
               AND (lease_until IS NULL OR lease_until < {DB_SECOND})
             ORDER BY next_at LIMIT $2 FOR UPDATE SKIP LOCKED)
         UPDATE workflow_runs r SET lease_until = {DB_SECOND} + $1, lease_token = $3
         FROM due WHERE r.id = due.id
         RETURNING r.id, r.workspace_id, r.workflow_id, r.version, r.contact_id, r.event_id,
                   r.pc, r.attempts, r.account_id, r.billing_key, r.caller_email, r.test_mode",
    ))
    .bind(LEASE_SECS)
    .bind(BATCH)
    .bind(token)
    .fetch_all(&state.db)
    .await?;
    for run in &due {
        let lease = Lease { run: run.id, token };
        // The batch is worked one run after another: each gets its full lease, and counts
        // as taken up (a pass that ends records it, setting the count back).
        let claims: Option<i32> = sqlx::query_scalar(&format!(
            "UPDATE workflow_runs SET lease_until = {DB_SECOND} + $3, claims = claims + 1
             WHERE id = $1 AND lease_token = $2 AND status = 'active'
             RETURNING claims",
        ))
        .bind(run.id)
        .bind(token)
        .bind(LEASE_SECS)
        .fetch_optional(&state.db)
        .await?;
        let Some(claims) = claims else {
            continue;
        };
        if claims > MAX_CLAIMS {
            tracing::error!(run = %run.id, claims, "workflow run taken up too often without an end; failed");
            let reason = format!(
                "step {}: taken up {} times without finishing (its handling stopped the \
                 process working it)",
                run.pc,
                claims - 1
            );
            lease.end(state, RunStatus::Failed, Some(&reason)).await?;
            continue;
        }
        if let Err(e) = advance(state, run, &lease).await {
            if let Err(e2) = failed_try(state, run, &lease, &e).await {
                tracing::warn!(run = %run.id, error = %e2, "could not record a failed try");
            }
        }
    }
    Ok(due.len() as i64 == BATCH)
}

/// Records a step that failed for a passing reason: retried with backoff (under a new try,
/// so a new task id and charge key), until the run has failed [`MAX_ATTEMPTS`] times in a
/// row and fails.
async fn failed_try(
    state: &AppState, run: &Due, lease: &Lease, e: &ApiError,
) -> Result<(), ApiError> {
    if run.attempts + 1 >= MAX_ATTEMPTS {
        tracing::warn!(run = %run.id, error = %e, "workflow run failed");
        let reason = format!("step {}: {e}", run.pc);
        return lease.end(state, RunStatus::Failed, Some(&reason)).await;
    }
    tracing::warn!(run = %run.id, error = %e, "workflow run step failed; retried later");
    let retry = 5 * (1 << run.attempts.clamp(0, 6));
    sqlx::query(&format!(
        "UPDATE workflow_runs SET next_at = {DB_SECOND} + $3, lease_until = NULL,
             attempts = attempts + 1, claims = 0
         WHERE id = $1 AND lease_token = $2 AND status = 'active'",
    ))
    .bind(lease.run)
    .bind(lease.token)
    .bind(retry)
    .execute(&state.db)
    .await?;
    Ok(())
}

/// A run as one pass holds it: every write checks the pass still does.
struct Lease {
    run: Uuid,
    token: Uuid,
}

impl Lease {
    /// Records that the run is at step `pc` (sleeping until `until`, else still leased);
    /// false when it is no longer active or no longer this pass's.
    async fn moved(
        &self, state: &AppState, pc: usize, until: Option<Wake>,
    ) -> Result<bool, ApiError> {
        let (after, at) = match until {
            None => (None, None),
            Some(Wake::After(secs)) => (Some(secs), None),
            Some(Wake::At(at)) => (None, Some(at)),
        };
        // A wait counts from the database clock to the second after it ends, so a pass
        // that sees the run due on [`DB_SECOND`] never ends it early.
        let done = sqlx::query(
            "UPDATE workflow_runs
             SET pc = $3, attempts = 0, claims = 0,
                 next_at = COALESCE(ceil(extract(epoch FROM clock_timestamp()) + $4::bigint)::bigint,
                                    $5, next_at),
                 lease_until = CASE WHEN $4 IS NULL AND $5 IS NULL THEN lease_until END
             WHERE id = $1 AND lease_token = $2 AND status = 'active'",
        )
        .bind(self.run)
        .bind(self.token)
        .bind(pc as i32)
        .bind(after)
        .bind(at)
        .execute(&state.db)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Ends the run with `status` and `reason`, if this pass still holds it.
    async fn end(
        &self, state: &AppState, status: RunStatus, reason: Option<&str>,
    ) -> Result<(), ApiError> {
        sqlx::query(
            "UPDATE workflow_runs SET status = $3, exit_reason = $4, ended_at = $5,
                                      next_at = NULL, lease_until = NULL
             WHERE id = $1 AND lease_token = $2 AND status = 'active'",
        )
        .bind(self.run)
        .bind(self.token)
        .bind(status)
        .bind(reason)
        .bind(now_unix())
        .execute(&state.db)
        .await?;
        Ok(())
    }
}

/// When a sleeping run may go on.
enum Wake {
    /// This many seconds from now, on the database clock.
    After(i64),
    /// At this Unix second.
    At(i64),
}

/// What one step did.
enum Next {
    /// Go on at this step.
    Go(usize),
    /// Stop until the wake-up, then go on at this step.
    Sleep(usize, Wake),
    /// The run failed; it goes no further.
    Stop,
}

/// Walks `run` from its step until it waits, ends or fails.
async fn advance(state: &AppState, run: &Due, lease: &Lease) -> Result<(), ApiError> {
    let mut conn = state.db.acquire().await?;
    let def = definition(&mut conn, run.workflow_id, run.version).await?;
    let props: Option<Json<Map<String, Value>>> = sqlx::query_scalar(
        "SELECT properties FROM workflow_events WHERE workspace_id = $1 AND event_id = $2",
    )
    .bind(run.workspace_id)
    .bind(&run.event_id)
    .fetch_optional(&mut *conn)
    .await?;
    let props = props.map(|Json(p)| p).unwrap_or_default();
    let contact = contacts::find_by_id(&mut conn, run.workspace_id, run.contact_id).await?;
    drop(conn);
    let Some(contact) = contact else {
        return lease
            .end(state, RunStatus::Failed, Some("the contact was deleted"))
            .await;
    };
    let mut pc = usize::try_from(run.pc).unwrap_or(usize::MAX);
    loop {
        let Some(step) = def.steps.get(pc) else {
            if lease.moved(state, pc, None).await? {
                lease.end(state, RunStatus::Completed, None).await?;
            }
            return Ok(());
        };
        let next = match step {
            Step::Jump(to) => Next::Go(*to),
            Step::Branch {
                conditions,
                otherwise,
            } => match all_hold(conditions, &contact, &props) {
                true => Next::Go(pc + 1),
                false => Next::Go(*otherwise),
            },
            Step::Wait(secs) if *secs <= 0 => Next::Go(pc + 1),
            Step::Wait(secs) => Next::Sleep(pc + 1, Wake::After(*secs)),
            // A time already past on this replica's clock still waits for the database's.
            Step::WaitUntil(prop) => match wake_time(props.get(prop), now_unix()) {
                Some(at) => Next::Sleep(pc + 1, Wake::At(at)),
                None => Next::Go(pc + 1),
            },
            Step::Send {
                template_key,
                email_type,
                topic,
            } => {
                let Some(to) = &contact.email else {
                    let why = format!("step {pc}: the contact has no email address to send to");
                    lease.end(state, RunStatus::Failed, Some(&why)).await?;
                    return Ok(());
                };
                let body = SendBody {
                    to: Some(To::Many(vec![ToItem::Recipient {
                        email: to.clone(),
                        external_id: contact.external_id.clone(),
                    }])),
                    template_key: Some(template_key.as_str().into()),
                    email_type: Some(email_type.as_str().into()),
                    topic: topic.clone().map(HeaderText::from),
                    variables: Some(props.clone()),
                    ..SendBody::default()
                };
                match send(state, run, lease, pc, body).await {
                    Ok(()) => Next::Go(pc + 1),
                    // Passing: retried under a fresh try (failed_try).
                    Err(
                        e @ (ApiError::Unavailable(_)
                        | ApiError::BadGateway(_)
                        | ApiError::Internal(_)),
                    ) => return Err(e),
                    Err(e) => {
                        lease
                            .end(state, RunStatus::Failed, Some(&format!("step {pc}: {e}")))
                            .await?;
                        Next::Stop
                    }
                }
            }
        };
        match next {
            Next::Go(to) => {
                // Sends are recorded step by step; a run ended or taken over goes no further.
                if matches!(step, Step::Send { .. }) && !lease.moved(state, to, None).await? {
                    return Ok(());
                }
                pc = to;
            }
            Next::Sleep(to, at) => {
                lease.moved(state, to, Some(at)).await?;
                return Ok(());
            }
            Next::Stop => return Ok(()),
        }
    }
}

/// A time in an event property (RFC 3339 text or Unix seconds), rounded up to the whole
/// second, at most [`MAX_WAIT_SECS`] from `now`.
fn wake_time(v: Option<&Value>, now: i64) -> Option<i64> {
    let at = match v? {
        Value::String(s) => {
            let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .ok()?;
            Some(t.unix_timestamp() + i64::from(t.nanosecond() > 0))
        }
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.is_finite())
            .map(|f| f.ceil() as i64),
        _ => None,
    }?;
    Some(at.min(now + MAX_WAIT_SECS))
}

/// The task id of step `pc` of run `run` at failed try `tries`: the same every time the
/// step is taken up after a crash, a new one after a try that stored nothing.
fn task_id(run: Uuid, pc: usize, tries: i32) -> TaskId {
    let digest = Sha256::new()
        .chain_update(run.as_bytes())
        .chain_update((pc as u64).to_be_bytes())
        .chain_update(tries.to_be_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    TaskId::from(Uuid::new_v8(bytes))
}

/// Sends step `pc` of `run` once: a task already made by an earlier try is the send. A
/// run ended meanwhile (an exit event, a deleted workflow) sends nothing; one whose end
/// commits while its send is in flight still sends that one.
async fn send(
    state: &AppState, run: &Due, lease: &Lease, pc: usize, body: SendBody,
) -> Result<(), ApiError> {
    let tries: Vec<Uuid> = (0..=run.attempts)
        .map(|t| task_id(run.id, pc, t).as_uuid())
        .collect();
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM tasks WHERE id = ANY ($1)")
        .bind(&tries)
        .fetch_optional(&state.db)
        .await?;
    if exists.is_some() {
        return Ok(());
    }
    let live: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM workflow_runs r JOIN workflows w ON w.id = r.workflow_id
         WHERE r.id = $1 AND r.lease_token = $2 AND r.status = 'active' AND w.deleted_at IS NULL",
    )
    .bind(lease.run)
    .bind(lease.token)
    .fetch_optional(&state.db)
    .await?;
    if live.is_none() {
        return Ok(());
    }
    let caller = Caller {
        account: run.account_id,
        workspace: run.workspace_id,
        key: run.billing_key,
        role: Role::Member,
        email: run.caller_email.clone(),
        test: run.test_mode,
    };
    let id = task_id(run.id, pc, run.attempts);
    crate::sending::send::submit(state, &caller, body, id, None, None).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_step_keeps_its_task_id() {
        let run = Uuid::now_v7();
        assert_eq!(task_id(run, 3, 0), task_id(run, 3, 0));
        assert_ne!(task_id(run, 3, 0), task_id(run, 4, 0));
        assert_ne!(task_id(run, 3, 0), task_id(run, 3, 1));
        assert_ne!(task_id(run, 3, 0), task_id(Uuid::now_v7(), 3, 0));
    }

    #[test]
    fn wait_until_is_capped() {
        let now = 1_000;
        assert_eq!(wake_time(Some(&json!(5_000)), now), Some(5_000));
        // A fraction of a second waits for the whole second: never early.
        assert_eq!(wake_time(Some(&json!(5_000.7)), now), Some(5_001));
        assert_eq!(
            wake_time(Some(&json!("1970-01-01T01:00:00.25Z")), now),
            Some(3_601)
        );
        assert_eq!(
            wake_time(Some(&json!(i64::MAX)), now),
            Some(now + MAX_WAIT_SECS)
        );
        assert_eq!(
            wake_time(Some(&json!("1970-01-01T01:00:00Z")), now),
            Some(3_600)
        );
        assert_eq!(wake_time(Some(&json!(true)), now), None);
        assert_eq!(wake_time(None, now), None);
    }
}
