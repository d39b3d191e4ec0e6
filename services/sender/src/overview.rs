//! `GET /operations-overview?since=`: a workspace's activity at a glance. Each count is asked
//! of the service that owns it (inbound-ingest: unread threads; domain: outbound domains;
//! the sender: sends, campaigns, events, runs) at once, within one deadline; a service that
//! does not answer in time leaves its counts `null` and is named in `unavailable`.

use std::time::Duration;

use axum::extract::{RawQuery, State};
use serde::Serialize;

use postmesh_shared::extract::Caller;
use postmesh_shared::nats;
use postmesh_shared::proto::{OverviewReply, OverviewRequest};
use postmesh_shared::{ApiError, Service, Success, WorkspaceId};

use crate::AppState;

/// How long the owning services have to answer, together.
pub const DEADLINE: Duration = Duration::from_millis(1500);

/// The overview's counts; `None` for those of a service that did not answer.
#[derive(Serialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = OperationsOverviewStats)]
pub struct Stats {
    unread_threads: Option<i64>,
    sends_since: Option<i64>,
    active_campaigns: Option<i64>,
    outbound_domains: Option<i64>,
    events_since: Option<i64>,
    active_runs: Option<i64>,
    /// Of the messages sent since, the share a person opened and clicked (machines' opens
    /// and clicks left out); null when none was sent.
    open_rate: Option<f64>,
    click_rate: Option<f64>,
    /// The services whose counts are missing.
    unavailable: Vec<&'static str>,
}

/// The answer.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = OperationsOverview)]
pub struct Overview {
    stats: Stats,
}

/// `since` from the query: a non-negative whole number of Unix seconds, required.
fn parse_since(query: Option<&str>) -> Result<i64, ApiError> {
    let bad = || ApiError::BadRequest("since must be a non-negative integer (Unix seconds)".into());
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.unwrap_or_default()).map_err(|_| bad())?;
    let mut found = pairs.iter().filter(|(k, _)| k == "since");
    let (Some((_, raw)), None) = (found.next(), found.next()) else {
        return Err(bad());
    };
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    raw.parse().map_err(|_| bad())
}

/// The sender's own counts: sends since, campaigns first sent since (active), events since
/// and runs active now; and the open and click rates of the messages sent since.
async fn own(
    state: &AppState, workspace: WorkspaceId, since: i64,
) -> Result<([i64; 4], (Option<f64>, Option<f64>)), sqlx::Error> {
    let row: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tasks WHERE workspace_id = $1 AND created_at >= $2),
                (SELECT count(*) FROM campaigns WHERE workspace_id = $1 AND frozen_at >= $2),
                (SELECT count(*) FROM workflow_events WHERE workspace_id = $1 AND received_at >= $2),
                (SELECT count(*) FROM workflow_runs WHERE workspace_id = $1 AND status = 'active')",
    )
    .bind(workspace)
    .bind(since)
    .fetch_one(&state.db)
    .await?;
    let rates = crate::sending::stats::rates(&state.db, workspace, since).await?;
    Ok(([row.0, row.1, row.2, row.3], rates))
}

/// Asks `service` for its counts within the deadline.
async fn ask(state: &AppState, service: Service, req: &OverviewRequest) -> Option<OverviewReply> {
    let call = nats::call_on(&state.nats, &state.ns, service, req);
    match tokio::time::timeout(DEADLINE, call).await {
        Ok(Ok(reply)) => Some(reply),
        Ok(Err(e)) => {
            tracing::warn!(%service, error = %e, "overview: no counts");
            None
        }
        Err(_) => {
            tracing::warn!(%service, "overview: no answer in time");
            None
        }
    }
}

/// `GET /operations-overview?since=`.
pub(crate) async fn overview(
    State(state): State<AppState>, caller: Caller, RawQuery(query): RawQuery,
) -> Result<Success<Overview>, ApiError> {
    let since = parse_since(query.as_deref())?;
    let req = OverviewRequest {
        workspace_id: caller.workspace.to_string(),
        since,
    };
    let own = async { tokio::time::timeout(DEADLINE, own(&state, caller.workspace, since)).await };
    let (inbound, domain, own) = tokio::join!(
        ask(&state, Service::InboundIngest, &req),
        ask(&state, Service::Domain, &req),
        own,
    );
    let mut stats = Stats::default();
    match inbound {
        Some(r) => stats.unread_threads = Some(r.unread_threads),
        None => stats.unavailable.push(Service::InboundIngest.name()),
    }
    match domain {
        Some(r) => stats.outbound_domains = Some(r.outbound_domains),
        None => stats.unavailable.push(Service::Domain.name()),
    }
    match own {
        Ok(Ok(([sends, campaigns, events, runs], (open_rate, click_rate)))) => {
            stats.sends_since = Some(sends);
            stats.active_campaigns = Some(campaigns);
            stats.events_since = Some(events);
            stats.active_runs = Some(runs);
            stats.open_rate = open_rate;
            stats.click_rate = click_rate;
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "overview: own counts failed");
            stats.unavailable.push(Service::Sender.name());
        }
        Err(_) => stats.unavailable.push(Service::Sender.name()),
    }
    Ok(Success::new(Overview { stats }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_non_negative_integer() {
        assert_eq!(parse_since(Some("since=0")).unwrap(), 0);
        assert_eq!(
            parse_since(Some("since=1700000000")).unwrap(),
            1_700_000_000
        );
        for bad in [
            None,
            Some(""),
            Some("since="),
            Some("since=-1"),
            Some("since=1.5"),
            Some("since=abc"),
            Some("since=1&since=2"),
            Some("since=99999999999999999999"),
        ] {
            assert!(parse_since(bad).is_err(), "{bad:?}");
        }
    }
}
