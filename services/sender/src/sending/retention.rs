//! The message log's retention: a send's deliveries, their events, and its tags,
//! attachments and raw message are purged `EMAIL_RETENTION_DAYS` after the send stopped
//! waiting ([`ENDED`]) — never while it waits for its time — at most [`TASKS`] sends a pass and
//! [`BATCH`] rows a statement. The task's own row stays, marked `log_purged`: frequency caps
//! and topic exclusions look back up to a year through it. An event recorded after its send
//! was purged (a late click) goes by its own time, its id being time-ordered (v7); so do the
//! provider notifications applied (their ids kept so that one delivered again changes
//! nothing), by when they came: by then the deliveries they named are gone.

use sqlx::PgPool;
use uuid::{NoContext, Timestamp, Uuid};

use postmesh_shared::db::now_unix;

/// Rows deleted by one statement at most.
pub const BATCH: i64 = 1000;
/// Sends purged together at most.
const TASKS: i64 = 100;
/// When a send stopped waiting: released, cancelled, or set aside as failed at its time
/// (the expression of the index `tasks_log_expiry`); none while it waits.
const ENDED: &str =
    "coalesce(released_at, cancelled_at, CASE WHEN status = 'failed' THEN scheduled_at END)";

/// What one pass deletes of the sends `$1`, `$2` rows a statement at most, in this order:
/// each statement finds its rows through `task_recipients`, deleted after them.
const OF_SENDS: [&str; 6] = [
    "DELETE FROM delivery_events WHERE ctid = ANY(ARRAY(
         SELECT e.ctid FROM task_recipients r JOIN delivery_events e ON e.delivery_id = r.delivery_id
         WHERE r.task_id = ANY($1) LIMIT $2))",
    "DELETE FROM deliveries WHERE ctid = ANY(ARRAY(
         SELECT d.ctid FROM task_recipients r JOIN deliveries d ON d.delivery_id = r.delivery_id
         WHERE r.task_id = ANY($1) LIMIT $2))",
    "DELETE FROM task_recipients WHERE ctid = ANY(ARRAY(
         SELECT ctid FROM task_recipients WHERE task_id = ANY($1) LIMIT $2))",
    "DELETE FROM task_tags WHERE ctid = ANY(ARRAY(
         SELECT ctid FROM task_tags WHERE task_id = ANY($1) LIMIT $2))",
    "DELETE FROM task_attachments WHERE ctid = ANY(ARRAY(
         SELECT ctid FROM task_attachments WHERE task_id = ANY($1) LIMIT $2))",
    "DELETE FROM task_mime WHERE ctid = ANY(ARRAY(
         SELECT ctid FROM task_mime WHERE task_id = ANY($1) LIMIT $2))",
];

/// The smallest v7 uuid made at Unix second `at`: every id made before it is less.
pub fn first_id_at(at: i64) -> Uuid {
    let at = u64::try_from(at).unwrap_or(0);
    let bytes = Uuid::new_v7(Timestamp::from_unix(NoContext, at, 0)).into_bytes();
    // The time's 48 bits, then the version, and nothing random.
    let mut low = [0u8; 16];
    low[..6].copy_from_slice(&bytes[..6]);
    low[6] = 0x70;
    low[8] = 0x80;
    Uuid::from_bytes(low)
}

/// One pass over what is older than `days`; whether there is more (the pass is run again
/// at once).
pub async fn purge(db: &PgPool, days: i64) -> Result<bool, sqlx::Error> {
    let cutoff = now_unix() - days * 24 * 3600;
    // Events whose delivery is gone already, by their own time.
    let late = sqlx::query(
        "DELETE FROM delivery_events WHERE ctid = ANY(ARRAY(
             SELECT e.ctid FROM delivery_events e WHERE e.id < $1
             AND NOT EXISTS (SELECT 1 FROM task_recipients r WHERE r.delivery_id = e.delivery_id)
             LIMIT $2))",
    )
    .bind(first_id_at(cutoff))
    .bind(BATCH)
    .execute(db)
    .await?
    .rows_affected();
    let notifications = sqlx::query(
        "DELETE FROM provider_notifications WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM provider_notifications WHERE received_at < $1 LIMIT $2))",
    )
    .bind(cutoff)
    .bind(BATCH)
    .execute(db)
    .await?
    .rows_affected();
    let late = late.max(notifications);
    let sends: Vec<Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM tasks WHERE NOT log_purged AND {ENDED} < $1 ORDER BY {ENDED} LIMIT $2"
    ))
    .bind(cutoff)
    .bind(TASKS)
    .fetch_all(db)
    .await?;
    if sends.is_empty() {
        return Ok(late == BATCH as u64);
    }
    for statement in OF_SENDS {
        let deleted = sqlx::query(statement)
            .bind(&sends)
            .bind(BATCH)
            .execute(db)
            .await?
            .rows_affected();
        if deleted == BATCH as u64 {
            // The same sends again: what the later statements find goes through these rows.
            return Ok(true);
        }
    }
    sqlx::query("UPDATE tasks SET log_purged = true WHERE id = ANY($1)")
        .bind(&sends)
        .execute(db)
        .await?;
    Ok(late == BATCH as u64 || sends.len() as i64 == TASKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_made_before_a_second_sort_below_its_first_id() {
        let now = now_unix();
        let made = Uuid::now_v7();
        assert!(made < first_id_at(now + 1));
        assert!(made >= first_id_at(now - 1));
        assert!(first_id_at(now - 86_400) < first_id_at(now));
    }
}
