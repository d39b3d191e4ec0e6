//! The message log's retention: deliveries, their events and their sends' attachments, raw
//! messages and tags older than `EMAIL_RETENTION_DAYS` are purged in batches of
//! [`BATCH`] rows a statement. A task's own row stays: frequency caps and topic exclusions
//! look back up to a year through it. Every purged table is keyed by a time-ordered
//! (v7) uuid, so "older than" is a range of its primary key or an index, never a scan.

use sqlx::PgPool;
use uuid::{NoContext, Timestamp, Uuid};

use postmesh_shared::db::now_unix;

/// Rows deleted by one statement at most.
pub const BATCH: i64 = 1000;

/// Each purged table and its time-ordered key.
const TABLES: [(&str, &str); 6] = [
    ("delivery_events", "id"),
    ("task_recipients", "delivery_id"),
    ("deliveries", "delivery_id"),
    ("task_tags", "task_id"),
    ("task_attachments", "task_id"),
    ("task_mime", "task_id"),
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

/// One pass: up to [`BATCH`] rows of each table older than `days`; whether any table had
/// more (the pass is run again at once).
pub async fn purge(db: &PgPool, days: i64) -> Result<bool, sqlx::Error> {
    let bound = first_id_at(now_unix() - days * 24 * 3600);
    let mut more = false;
    for (table, key) in TABLES {
        let deleted = sqlx::query(&format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(
                 SELECT ctid FROM {table} WHERE {key} < $1 LIMIT $2))"
        ))
        .bind(bound)
        .bind(BATCH)
        .execute(db)
        .await?
        .rows_affected();
        more |= deleted == BATCH as u64;
    }
    Ok(more)
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
