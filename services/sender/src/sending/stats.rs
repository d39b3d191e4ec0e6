//! `GET /email-stats?days=`: a workspace's messages per day (UTC) over the last `days` days,
//! today included — sent, delivered, bounced, complained, and opened and clicked by people
//! (machines' opens and clicks left out) — with the open and click rates of the messages
//! sent in that time. The web app's usage chart draws it.

use axum::extract::State;
use serde::{Deserialize, Serialize};

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, QueryParams};
use postmesh_shared::{ApiError, Success, WorkspaceId};

use crate::sending::events::Kind;
use crate::AppState;

/// Days shown by default, and at most.
const DEFAULT_DAYS: i64 = 30;
const MAX_DAYS: i64 = 90;
const DAY: i64 = 24 * 3600;

/// `GET /email-stats`'s parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct StatsQuery {
    /// Days to show, today included (1-90, default 30).
    #[param(minimum = 1, maximum = 90)]
    pub days: Option<i64>,
}

/// One day's counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = EmailStatsDay)]
pub struct Day {
    /// The day, `YYYY-MM-DD` (UTC).
    pub date: String,
    pub sent: i64,
    pub delivered: i64,
    pub bounced: i64,
    pub complained: i64,
    /// Opens and clicks by people.
    pub opened: i64,
    pub clicked: i64,
}

/// The answer: each day, oldest first, and the rates over them.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = EmailStats)]
pub struct Stats {
    pub days: Vec<Day>,
    /// Of the messages sent in these days, the share a person opened and clicked; null when
    /// none was sent.
    pub open_rate: Option<f64>,
    pub click_rate: Option<f64>,
}

/// `YYYY-MM-DD` of Unix day `day` (days since 1970-01-01), by the civil calendar.
pub fn date_of(day: i64) -> String {
    // Howard Hinnant's days-to-civil.
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `GET /email-stats`.
pub(crate) async fn stats(
    State(state): State<AppState>, caller: Caller, QueryParams(q): QueryParams<StatsQuery>,
) -> Result<Success<Stats>, ApiError> {
    let days = q.days.unwrap_or(DEFAULT_DAYS);
    if !(1..=MAX_DAYS).contains(&days) {
        return Err(ApiError::BadRequest(format!("days must be 1-{MAX_DAYS}")));
    }
    let today = now_unix().div_euclid(DAY);
    let first = today - days + 1;
    let rows: Vec<(i64, Kind, i64)> = sqlx::query_as(
        "SELECT occurred_at / 86400 AS day, kind, count(*) FROM delivery_events
         WHERE workspace_id = $1 AND occurred_at >= $2
           AND kind IN ('sent', 'delivered', 'bounced', 'complained', 'opened', 'clicked')
           AND (kind NOT IN ('opened', 'clicked') OR detail->>'machine' = 'false')
         GROUP BY 1, 2",
    )
    .bind(caller.workspace)
    .bind(first * DAY)
    .fetch_all(&state.db)
    .await?;
    let mut out: Vec<Day> = (first..=today)
        .map(|d| Day {
            date: date_of(d),
            ..Day::default()
        })
        .collect();
    for (day, kind, n) in rows {
        let Some(d) = usize::try_from(day - first)
            .ok()
            .and_then(|i| out.get_mut(i))
        else {
            continue;
        };
        let count = match kind {
            Kind::Sent => &mut d.sent,
            Kind::Delivered => &mut d.delivered,
            Kind::Bounced => &mut d.bounced,
            Kind::Complained => &mut d.complained,
            Kind::Opened => &mut d.opened,
            Kind::Clicked => &mut d.clicked,
            _ => continue,
        };
        *count = n;
    }
    let (open_rate, click_rate) = rates(&state.db, caller.workspace, first * DAY).await?;
    Ok(Success::new(Stats {
        days: out,
        open_rate,
        click_rate,
    }))
}

/// Of `workspace`'s messages accepted since `since` and sent, the shares a person opened and
/// clicked; none when none was sent (`/email-stats`, `/operations-overview`).
pub async fn rates(
    db: &sqlx::PgPool, workspace: WorkspaceId, since: i64,
) -> Result<(Option<f64>, Option<f64>), sqlx::Error> {
    let (sent, opened, clicked): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE opens > 0), count(*) FILTER (WHERE clicks > 0)
         FROM task_recipients WHERE workspace_id = $1 AND created_at >= $2
           AND log_rank(status) >= 1 AND status NOT IN ('failed', 'rejected', 'cancelled')",
    )
    .bind(workspace)
    .bind(since)
    .fetch_one(db)
    .await?;
    let rate = |part: i64| (sent > 0).then(|| part as f64 / sent as f64);
    Ok((rate(opened), rate(clicked)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_civil_dates() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(11_016), "2000-02-29");
        assert_eq!(date_of(20_786), "2026-11-29");
        assert_eq!(date_of(-1), "1969-12-31");
    }
}
