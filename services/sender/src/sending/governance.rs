//! Who a send may reach, decided before it is priced: suppressions and topic
//! subscriptions, then frequency caps and topic exclusions. A recipient filtered out is
//! neither charged nor sent; it is rejected with its reason. A cc or bcc address is
//! checked against the same suppressions (not caps: a copy is not a send to its address)
//! and left off every copy when it is suppressed.
//!
//! Suppressions: a bounce or a complaint blocks every email type, and so does a manual
//! entry without a topic; an unsubscribe (or a manual entry) of a topic blocks `marketing`
//! and `lifecycle` mail of that topic, and one without a topic blocks all of it;
//! `transactional` mail ignores unsubscribes. A contact unsubscribed from the send's topic
//! is treated as an unsubscribe of it.

use sqlx::PgConnection;

use postmesh_shared::{email, WorkspaceId};

use crate::model::Recipient;
use crate::sending::request::{EmailType, Rejected, SendRequest};

const DAY: i64 = 24 * 3600;

/// Splits `recipients` into those `req` may reach and those rejected, reason by reason.
fn split(
    recipients: Vec<Recipient>, reasons: Vec<Option<String>>,
) -> (Vec<Recipient>, Vec<Rejected>) {
    let mut kept = Vec::with_capacity(recipients.len());
    let mut rejected = Vec::new();
    for (recipient, reason) in recipients.into_iter().zip(reasons) {
        match reason {
            None => kept.push(recipient),
            Some(reason) => rejected.push(Rejected {
                email: recipient.email.to_string(),
                reason,
            }),
        }
    }
    (kept, rejected)
}

fn keys(recipients: &[Recipient]) -> Vec<String> {
    recipients.iter().map(|r| r.email.key()).collect()
}

/// Leaves out suppressed and unsubscribed recipients.
pub async fn suppressions(
    conn: &mut PgConnection, workspace: WorkspaceId, req: &SendRequest, recipients: Vec<Recipient>,
) -> Result<(Vec<Recipient>, Vec<Rejected>), sqlx::Error> {
    if recipients.is_empty() {
        return Ok((recipients, Vec::new()));
    }
    let reasons = suppressed(
        conn,
        workspace,
        req.email_type,
        req.topic.as_deref(),
        keys(&recipients),
    )
    .await?;
    Ok(split(recipients, reasons))
}

/// Leaves out the suppressed and unsubscribed addresses of `copies` (a message's cc or bcc),
/// by the rules of its recipients; answers them with their reasons.
pub async fn copies(
    conn: &mut PgConnection, workspace: WorkspaceId, req: &SendRequest, copies: &mut Vec<String>,
) -> Result<Vec<Rejected>, sqlx::Error> {
    if copies.is_empty() {
        return Ok(Vec::new());
    }
    let keys = copies.iter().map(|c| email::key(c)).collect();
    let reasons = suppressed(conn, workspace, req.email_type, req.topic.as_deref(), keys).await?;
    let mut rejected = Vec::new();
    let mut reasons = reasons.into_iter();
    copies.retain(|email| match reasons.next().flatten() {
        None => true,
        Some(reason) => {
            rejected.push(Rejected {
                email: email.clone(),
                reason,
            });
            false
        }
    });
    Ok(rejected)
}

/// Why each address of `keys` (made by [`email::key`]) may not get mail of `email_type`
/// and `topic`, if it may not.
pub async fn suppressed(
    conn: &mut PgConnection, workspace: WorkspaceId, email_type: EmailType, topic: Option<&str>,
    keys: Vec<String>,
) -> Result<Vec<Option<String>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(
             (SELECT CASE WHEN s.reason = 'unsubscribed' THEN 'unsubscribed'
                          ELSE 'suppressed:' || s.reason END
                     || CASE WHEN s.topic <> '' THEN ':' || s.topic ELSE '' END
              FROM suppressions s
              WHERE s.workspace_id = $1 AND s.email_key = u.key
                AND (s.reason IN ('bounce', 'complaint') OR (s.reason = 'manual' AND s.topic = '')
                     OR ($2 AND (s.topic = '' OR s.topic = $3)))
              ORDER BY s.reason IN ('bounce', 'complaint') DESC, s.topic LIMIT 1),
             (SELECT 'unsubscribed:' || $3 FROM contacts c
              WHERE $2 AND c.workspace_id = $1 AND c.email_key = u.key
                AND c.topics ->> $3 = 'unsubscribed'))
         FROM UNNEST($4::text[]) WITH ORDINALITY AS u(key, i) ORDER BY u.i",
    )
    .bind(workspace)
    .bind(email_type != EmailType::Transactional)
    .bind(topic)
    .bind(keys)
    .fetch_all(conn)
    .await
}

/// Leaves out recipients over the send's frequency cap or within its topic exclusion, as of
/// `now`. With `lock` (a send being accepted, in its transaction) the recipients' addresses
/// are locked first, so a concurrent capped send waits for this one's commit and counts it.
pub async fn caps(
    conn: &mut PgConnection, workspace: WorkspaceId, req: &SendRequest, recipients: Vec<Recipient>,
    now: i64, lock: bool,
) -> Result<(Vec<Recipient>, Vec<Rejected>), sqlx::Error> {
    if recipients.is_empty() || (req.frequency_cap.is_none() && req.topic_exclusion_days.is_none())
    {
        return Ok((recipients, Vec::new()));
    }
    let keys = keys(&recipients);
    if lock {
        // Sorted, so two sends lock shared addresses in the same order (no deadlock).
        let mut sorted = keys.clone();
        sorted.sort();
        sqlx::query(
            "INSERT INTO address_gates (workspace_id, email_key)
             SELECT $1, k FROM UNNEST($2::text[]) AS k
             ON CONFLICT (workspace_id, email_key) DO UPDATE SET email_key = EXCLUDED.email_key",
        )
        .bind(workspace)
        .bind(&sorted)
        .execute(&mut *conn)
        .await?;
    }
    let (cap_days, cap_max) = req.frequency_cap.unwrap_or((0, i64::MAX));
    let exclusion_days = req.topic_exclusion_days.unwrap_or(0);
    let counts: Vec<(i64, bool)> = sqlx::query_as(
        "SELECT
             (SELECT count(*) FROM sends_to s
              WHERE $3 > 0 AND s.workspace_id = $1 AND s.email_key = u.key
                AND s.email_type = $2 AND s.sent_at > $6 - $3),
             EXISTS (SELECT 1 FROM sends_to s
              WHERE $5 > 0 AND s.workspace_id = $1 AND s.email_key = u.key
                AND s.topic = $4 AND s.sent_at > $6 - $5)
         FROM UNNEST($7::text[]) WITH ORDINALITY AS u(key, i) ORDER BY u.i",
    )
    .bind(workspace)
    .bind(req.email_type)
    .bind(cap_days * DAY)
    .bind(&req.topic)
    .bind(exclusion_days * DAY)
    .bind(now)
    .bind(&keys)
    .fetch_all(&mut *conn)
    .await?;
    let reasons = counts
        .into_iter()
        .map(|(sent, recent)| {
            if sent + 1 > cap_max {
                Some("frequency_cap".to_owned())
            } else if recent {
                Some("topic_exclusion".to_owned())
            } else {
                None
            }
        })
        .collect();
    Ok(split(recipients, reasons))
}

/// Counts the accepted `recipients` of task `task` for later caps and exclusions.
pub async fn record(
    conn: &mut PgConnection, workspace: WorkspaceId, task: uuid::Uuid, req: &SendRequest,
    recipients: &[Recipient], now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sends_to (workspace_id, email_key, email_type, topic, task_id, sent_at)
         SELECT $1, k, $2, $3, $4, $5 FROM UNNEST($6::text[]) AS k",
    )
    .bind(workspace)
    .bind(req.email_type)
    .bind(&req.topic)
    .bind(task)
    .bind(now)
    .bind(keys(recipients))
    .execute(conn)
    .await
    .map(drop)
}
