//! Emails as the plan counts them: the `usage` RPC answers billing with the workspace's
//! emails sent this period, and [`Quota`] holds a send to the plan's `monthly_emails`,
//! counting what is sent and what is accepted but not yet delivered.

use sqlx::PgConnection;

use postmesh_shared::db::{take_turns, Turns};
use postmesh_shared::extract::{rpc_workspace, Caller};
use postmesh_shared::nats::{self, ServiceHost};
use postmesh_shared::proto::{EntitlementsRequest, UsageReply, UsageRequest};
use postmesh_shared::{ApiError, WorkspaceId};

use crate::AppState;

/// How long an unfinished job counts: 30 days of schedule and the SEND stream's 7 days,
/// with a margin (a job whose outcome was never recorded stops counting after it).
const IN_FLIGHT_WINDOW_SECS: i64 = 40 * 24 * 3600;

/// Adds the sender's RPCs to `host`.
pub fn register(host: ServiceHost, state: AppState) -> ServiceHost {
    host.method(state, usage)
}

/// Counts the emails of workspace `$1` sent since `$2`; a test key's and the sandbox's
/// reached no transport and count for nothing.
const SENT_SINCE: &str = "SELECT count(*) FROM deliveries
     WHERE workspace_id = $1 AND status = 'sent' AND updated_at >= $2
       AND COALESCE(provider_message_id, '') NOT LIKE ALL (ARRAY['test:%', 'sandbox:%'])";

/// Emails of `workspace` sent since `period_start`.
async fn sent_since(
    db: &mut PgConnection, workspace: WorkspaceId, period_start: i64,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(SENT_SINCE)
        .bind(workspace)
        .bind(period_start)
        .fetch_one(db)
        .await
}

/// Workflow runs started in `workspace` since `since`: the plan's executions.
pub async fn executions_since(
    conn: &mut PgConnection, workspace: WorkspaceId, since: i64,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1 AND started_at >= $2",
    )
    .bind(workspace)
    .bind(since)
    .fetch_one(conn)
    .await
}

async fn usage(state: AppState, req: UsageRequest) -> Result<UsageReply, ApiError> {
    let workspace = rpc_workspace(&req.workspace_id)?;
    let mut conn = state.db.acquire().await?;
    let emails = sent_since(&mut conn, workspace, req.period_start).await?;
    let executions = executions_since(&mut conn, workspace, req.period_start).await?;
    Ok(UsageReply {
        emails,
        executions,
        ..Default::default()
    })
}

/// The plan's email quota for one send.
pub struct Quota {
    workspace: WorkspaceId,
    /// `(monthly_emails, period_start)`, when a plan is in force.
    limit: Option<(i64, i64)>,
}

impl Quota {
    /// The caller's quota, from billing's entitlements.
    pub async fn of(state: &AppState, caller: &Caller) -> Result<Self, ApiError> {
        let ent = nats::call(
            &state.nats,
            &state.ns,
            &EntitlementsRequest {
                workspace_id: caller.workspace.to_string(),
            },
        )
        .await?;
        Ok(Self {
            workspace: caller.workspace,
            limit: ent
                .monthly_emails
                .filter(|_| ent.plan_in_force)
                .map(|q| (q, ent.period_start)),
        })
    }

    /// 402 when `more` emails would take the workspace over its quota. Inside a
    /// transaction, the workspace's lock makes concurrent sends count one after another.
    pub async fn check(&self, db: &mut PgConnection, more: i64) -> Result<(), ApiError> {
        let Some((limit, period_start)) = self.limit else {
            return Ok(());
        };
        take_turns(db, Turns::Quota, self.workspace).await?;
        // One statement, so one snapshot: a job finishing meanwhile moves from unfinished
        // to sent at once, never counted twice or not at all.
        let used: i64 = sqlx::query_scalar(&format!(
            "SELECT ({SENT_SINCE})
                  + (SELECT count(*) FROM unfinished_deliveries WHERE workspace_id = $1 AND created_at >= $3)"
        ))
        .bind(self.workspace)
        .bind(period_start)
        .bind(postmesh_shared::db::now_unix() - IN_FLIGHT_WINDOW_SECS)
        .fetch_one(&mut *db)
        .await?;
        if used + more > limit {
            return Err(ApiError::PaymentRequired(format!(
                "the plan's quota of {limit} emails this period would be exceeded ({used} used, {more} more asked)"
            )));
        }
        Ok(())
    }
}
