//! Entitlements: billing owns plans and their limits; the service that owns a resource counts
//! it, answering the `usage` method. `GET /billing/entitlements` puts both together, and the
//! `entitlements` RPC gives other services a workspace's plan and limits to enforce.

use std::time::Duration;

use async_nats::Client;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use postmesh_contracts::answers::billing::SubscriptionStatus;
use postmesh_shared::extract::{rpc_workspace, Caller};
use postmesh_shared::proto::{EntitlementsReply, EntitlementsRequest, UsageReply, UsageRequest};
use postmesh_shared::{nats, ApiError, Namespace, Service, Success, WorkspaceId};

use crate::catalog::{self, FreeLimits, Plan};
use crate::subscriptions::{self, CurrentPlan};
use crate::{ledger, AppState};

/// The services that own counted resources: sender (emails, workflow executions), domain
/// (custom domains), inbound-ingest (mailboxes).
pub const USAGE_OWNERS: [Service; 3] = [Service::Sender, Service::Domain, Service::InboundIngest];

/// Asks the owning services for a workspace's counts.
#[derive(Clone)]
pub struct UsageCounter {
    pub nats: Client,
    pub ns: Namespace,
    /// How long one owner may take (`BILLING_USAGE_TIMEOUT_SECS`).
    pub timeout: Duration,
}

impl UsageCounter {
    /// The workspace's counts, summed over the owners. An owner that is not deployed, fails
    /// or is slow counts 0, and the log says so: entitlements never fail on a count.
    pub async fn count(&self, workspace: WorkspaceId, period_start: i64) -> UsageReply {
        let req = UsageRequest {
            workspace_id: workspace.to_string(),
            period_start,
        };
        let asks = USAGE_OWNERS.map(|service| {
            let req = &req;
            async move {
                let call = nats::call_on(&self.nats, &self.ns, service, req);
                match tokio::time::timeout(self.timeout, call).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(e)) => {
                        tracing::info!(%service, error = %e, "no usage counts from {service} (not deployed?); counted as 0");
                        UsageReply::default()
                    }
                    Err(_) => {
                        tracing::warn!(%service, "usage counts from {service} timed out; counted as 0");
                        UsageReply::default()
                    }
                }
            }
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .fold(UsageReply::default(), |sum, r| UsageReply {
                emails: sum.emails + r.emails,
                mailboxes: sum.mailboxes + r.mailboxes,
                custom_domains: sum.custom_domains + r.custom_domains,
                executions: sum.executions + r.executions,
            })
    }
}

/// A workspace's plan and the limits that follow from it.
pub struct Limits {
    pub plan: Option<CurrentPlan>,
    pub mailboxes: i64,
    pub custom_domains: i64,
    pub monthly_emails: Option<i64>,
    pub period: (i64, i64),
}

/// The limits of `workspace`: its plan's while the plan is in force, else `free`.
pub async fn limits(
    db: &PgPool, free: FreeLimits, workspace: WorkspaceId,
) -> Result<Limits, sqlx::Error> {
    let plan = subscriptions::current(db, workspace).await?;
    let in_force = plan.as_ref().filter(|p| p.in_force());
    let period = match in_force {
        Some(p) if p.period_end > 0 => (p.period_start, p.period_end),
        _ => calendar_month(time::OffsetDateTime::now_utc()),
    };
    Ok(Limits {
        mailboxes: in_force.and_then(|p| p.mailboxes).unwrap_or(free.mailboxes),
        custom_domains: in_force
            .and_then(|p| p.custom_domains)
            .unwrap_or(free.custom_domains),
        monthly_emails: in_force.and_then(|p| p.monthly_emails),
        period,
        plan,
    })
}

/// Start and end (Unix seconds) of the UTC calendar month holding `now`.
fn calendar_month(now: time::OffsetDateTime) -> (i64, i64) {
    let start = now
        .replace_day(1)
        .expect("day 1 exists")
        .replace_time(time::Time::MIDNIGHT);
    let (y, m) = (start.year(), start.month());
    let end = if m == time::Month::December {
        start
            .replace_year(y + 1)
            .expect("valid year")
            .replace_month(time::Month::January)
    } else {
        start.replace_month(m.next())
    }
    .expect("day 1 exists in every month");
    (start.unix_timestamp(), end.unix_timestamp())
}

/// The `entitlements` RPC.
pub async fn rpc(state: AppState, req: EntitlementsRequest) -> Result<EntitlementsReply, ApiError> {
    let workspace = rpc_workspace(&req.workspace_id)?;
    let limits = limits(&state.db, state.free, workspace).await?;
    let (plan_id, plan_status, in_force) = match &limits.plan {
        Some(p) => (
            p.plan_id.clone().unwrap_or_default(),
            p.status.as_str().to_owned(),
            p.in_force(),
        ),
        None => (String::new(), String::new(), false),
    };
    Ok(EntitlementsReply {
        plan_id,
        plan_status,
        plan_in_force: in_force,
        mailboxes: limits.mailboxes,
        custom_domains: limits.custom_domains,
        monthly_emails: limits.monthly_emails,
        period_start: limits.period.0,
        period_end: limits.period.1,
    })
}

/// The workspace's plan in the entitlements answer.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanState {
    pub id: String,
    pub name: String,
    pub status: SubscriptionStatus,
    pub period_start: i64,
    pub period_end: i64,
    pub cancel_at_period_end: bool,
}

/// A count against a quota.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Quota {
    pub used: i64,
    pub quota: i64,
}

/// A count against a limit.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Limit {
    pub used: i64,
    pub limit: i64,
}

/// Workflow executions in the period; no limit yet.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Executions {
    pub used: i64,
    pub limit: Option<i64>,
}

/// The usage-billing side: the key's usage balance and what the period took of it.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = UsageModel)]
pub struct Model {
    pub billing_enforced: bool,
    pub balance_nano: i64,
    pub period_start: i64,
    pub period_cost_nano: i64,
    pub period_charged_nano: i64,
    pub executions: Executions,
}

/// Spec §2 Entitlements.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Entitlements {
    pub plan: Option<PlanState>,
    pub emails: Option<Quota>,
    pub mailboxes: Limit,
    pub custom_domains: Limit,
    pub legacy_credits: i64,
    pub model: Model,
}

/// The answer of `GET /billing/entitlements`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EntitlementsPage {
    pub entitlements: Entitlements,
    pub plans: Vec<Plan>,
}

pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<EntitlementsPage>, ApiError> {
    let limits = limits(&state.db, state.free, caller.workspace).await?;
    let (period_start, _) = limits.period;
    let used = match &state.usage {
        Some(counter) => counter.count(caller.workspace, period_start).await,
        None => UsageReply::default(),
    };
    let (balance_nano, spent_nano) =
        ledger::usage_position(&state.db, caller.key, period_start).await?;
    let entitlements = Entitlements {
        plan: limits.plan.as_ref().map(|p| PlanState {
            id: p.plan_id.clone().unwrap_or_default(),
            name: p
                .name
                .clone()
                .or_else(|| p.plan_id.clone())
                .unwrap_or_default(),
            status: p.status,
            period_start: p.period_start,
            period_end: p.period_end,
            cancel_at_period_end: p.cancel_at_period_end,
        }),
        emails: limits.monthly_emails.map(|quota| Quota {
            used: used.emails,
            quota,
        }),
        mailboxes: Limit {
            used: used.mailboxes,
            limit: limits.mailboxes,
        },
        custom_domains: Limit {
            used: used.custom_domains,
            limit: limits.custom_domains,
        },
        legacy_credits: ledger::current_balance(&state.db, caller.key).await?,
        model: Model {
            billing_enforced: state.payments.is_some(),
            balance_nano,
            period_start,
            period_cost_nano: spent_nano,
            period_charged_nano: spent_nano,
            executions: Executions {
                used: used.executions,
                limit: None,
            },
        },
    };
    let plans = catalog::plans(&state.db).await?;
    Ok(Success::new(EntitlementsPage {
        entitlements,
        plans,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_period_is_the_utc_calendar_month() {
        let at = |s: i64| time::OffsetDateTime::from_unix_timestamp(s).unwrap();
        // 2026-11-23T10:00:00Z → November 2026.
        assert_eq!(
            calendar_month(at(1_795_428_000)),
            (1_793_491_200, 1_796_083_200)
        );
        // 2026-12-31T23:59:59Z → December 2026, ending on 2027-01-01.
        assert_eq!(
            calendar_month(at(1_798_761_599)),
            (1_796_083_200, 1_798_761_600)
        );
    }
}
