//! A tried attempt's outcome written: its row, its target's health, or its deferral.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::queue::{Failure, RecordRow, Verdict};

use super::Answer;
use crate::attempt::{Status, UNFINISHED};

/// What a receiver's answer means for the attempt. The detail of a success, and the start
/// of a failure's text, carry the status code (`HTTP 500: ...`) for the record.
pub(crate) fn outcome(answer: Answer) -> Result<String, Failure> {
    match (answer.status, answer.error) {
        (Some(status), None) => Ok(format!("HTTP {}", status.as_u16())),
        (Some(StatusCode::GONE), Some(e)) => Err(Failure::Permanent(e)),
        (_, Some(e)) => match answer.retry_after {
            Some(after) => Err(Failure::Later(e, after)),
            None => Err(Failure::Transient(e)),
        },
        (None, None) => Err(Failure::Transient("no answer".into())),
    }
}

/// The status code a recorded detail or error starts with (`HTTP 503: ...`).
fn status_code(text: &str) -> Option<i32> {
    text.strip_prefix("HTTP ")?.get(..3)?.parse().ok()
}

/// What an outcome writes to its attempt's row.
pub(crate) struct Written {
    pub status: Status,
    pub code: Option<i32>,
    /// The failure, for anything but a success.
    pub error: Option<String>,
    /// When a retry is due (Unix seconds).
    pub next_at: Option<i64>,
}

impl Written {
    /// The columns of `verdict`, reached at `now`.
    pub(crate) fn of(verdict: &Verdict, now: i64) -> Self {
        let (status, text, next_at) = match verdict {
            Verdict::Done(detail) => (Status::Succeeded, detail, None),
            Verdict::Failed(e) => (Status::Failed, e, None),
            Verdict::Retry(e, after) => (
                Status::Pending,
                e,
                Some(now + i64::try_from(after.as_secs()).unwrap_or(i64::MAX / 2)),
            ),
        };
        Self {
            status,
            code: status_code(text),
            error: (status != Status::Succeeded).then(|| text.clone()),
            next_at,
        }
    }
}

/// Writes a batch of outcomes (distinct attempts) and their targets' health ([`health`]).
/// Answers whether each outcome was written: a success always is, a failure or retry only
/// while its claim holds the attempt.
pub(crate) async fn record(
    db: &PgPool, rows: Vec<RecordRow>, disable_after: Duration,
) -> Result<Vec<bool>, sqlx::Error> {
    let now = now_unix();
    let mut ids = Vec::with_capacity(rows.len());
    let mut statuses = Vec::with_capacity(rows.len());
    let mut errors: Vec<Option<String>> = Vec::with_capacity(rows.len());
    let mut codes: Vec<Option<i32>> = Vec::with_capacity(rows.len());
    let mut next_at: Vec<Option<i64>> = Vec::with_capacity(rows.len());
    for row in &rows {
        ids.push(row.item);
        let written = Written::of(&row.verdict, now);
        statuses.push(written.status);
        codes.push(written.code);
        errors.push(written.error);
        next_at.push(written.next_at);
    }
    let leases: Vec<Uuid> = rows.iter().map(|r| r.lease).collect();
    let written: Vec<Uuid> = sqlx::query_scalar(&format!(
        "WITH u AS (
             SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::int[],
                                  $6::bigint[])
                 AS u(id, status, error, lease, code, next_at)
         ), done AS (
             UPDATE attempts a SET status = u.status, last_error = u.error,
                 last_status_code = COALESCE(u.code, a.last_status_code),
                 next_attempt_at = u.next_at, requeue_at = COALESCE(u.next_at, a.requeue_at),
                 updated_at = $7, lease_owner = NULL,
                 leased_until_ms = 0
             FROM u
             WHERE a.id = u.id
               AND CASE WHEN u.status = 'succeeded' THEN a.status <> 'succeeded'
                        ELSE a.status = 'pending' AND a.lease_owner = u.lease END
             RETURNING a.id, a.endpoint_id, a.webhook_id, a.workspace_id, u.status, u.code
         ){HEALTH}
         SELECT id FROM done",
        HEALTH = health(7, 8)
    ))
    .bind(&ids)
    .bind(&statuses)
    .bind(&errors)
    .bind(&leases)
    .bind(&codes)
    .bind(&next_at)
    .bind(now)
    .bind(i64::try_from(disable_after.as_secs()).unwrap_or(i64::MAX))
    .fetch_all(db)
    .await?;
    let written: HashSet<Uuid> = written.into_iter().collect();
    Ok(rows.iter().map(|r| written.contains(&r.item)).collect())
}

/// The statements that write targets' health after the outcomes of a CTE `done` (columns
/// `endpoint_id, webhook_id, workspace_id, status, code`), with the time now and
/// `WEBHOOK_DISABLE_AFTER_SECS` as parameters `now` and `disable_after`: a target's row is
/// written only when that changes it. A success clears `failing_since`; a failure sets it,
/// and disables the target when it is older than `disable_after`; a 410 disables it at once.
pub(crate) fn health(now: u8, disable_after: u8) -> String {
    let seen = |name: &str, table: &str, matching: &str| {
        format!(
            "{name} AS (
             UPDATE {table} t
             SET failing_since = CASE WHEN h.ok THEN NULL ELSE COALESCE(t.failing_since, ${now}) END,
                 active = t.active AND (h.ok OR NOT (h.gone
                     OR ${now} - COALESCE(t.failing_since, ${now}) >= ${disable_after}))
             FROM health h WHERE {matching} AND (NOT h.ok OR t.failing_since IS NOT NULL)
         )"
        )
    };
    format!(
        ", health AS (
             SELECT endpoint_id, webhook_id, workspace_id, bool_or(status = 'succeeded') AS ok,
                 bool_or(COALESCE(code, 0) = 410) AS gone
             FROM done GROUP BY endpoint_id, webhook_id, workspace_id
         ), {}, {}, {}",
        seen(
            "webhooks_seen",
            "webhooks",
            "h.webhook_id IS NOT NULL AND t.id = h.webhook_id"
        ),
        seen(
            "endpoints_seen",
            "endpoints",
            "h.endpoint_id IS NOT NULL AND t.id = h.endpoint_id"
        ),
        seen(
            "defaults_seen",
            "default_webhooks",
            "h.endpoint_id IS NULL AND h.webhook_id IS NULL AND t.workspace_id = h.workspace_id"
        ),
    )
}

/// Leaves pending attempt `id` to the scheduler, due `pause` from now or at its retry's
/// time, whichever is later.
pub(super) async fn defer(db: &PgPool, id: Uuid, pause: Duration) -> Result<(), sqlx::Error> {
    let pause = i64::try_from(pause.as_secs()).unwrap_or(i64::MAX / 2);
    sqlx::query(&format!(
        "UPDATE attempts SET requeue_at = GREATEST($2, COALESCE(next_attempt_at, 0))
         WHERE id = $1 AND {UNFINISHED}"
    ))
    .bind(id)
    .bind(now_unix() + pause)
    .execute(db)
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use reqwest::StatusCode;

    use super::super::Answer;
    use super::*;

    #[test]
    fn answers_become_outcomes() {
        let answer = |status: Option<u16>, error: Option<&str>, after: Option<u64>| Answer {
            status: status.map(|s| StatusCode::from_u16(s).unwrap()),
            error: error.map(str::to_owned),
            retry_after: after.map(Duration::from_secs),
        };
        assert_eq!(outcome(answer(Some(204), None, None)).unwrap(), "HTTP 204");
        assert!(matches!(
            outcome(answer(Some(410), Some("HTTP 410: gone"), None)),
            Err(Failure::Permanent(_))
        ));
        assert!(matches!(
            outcome(answer(Some(429), Some("HTTP 429: slow"), Some(7))),
            Err(Failure::Later(_, d)) if d == Duration::from_secs(7)
        ));
        assert!(matches!(
            outcome(answer(None, Some("connect refused"), None)),
            Err(Failure::Transient(_))
        ));
        assert_eq!(status_code("HTTP 503: busy"), Some(503));
        assert_eq!(status_code("connect refused"), None);
    }
}
