//! The services' own tables, as tests reach them: each read (and the few writes a test
//! needs to stage a situation) named for what it means. Tests touch another service's
//! tables only through these, so a schema change is fixed in one place.

use sqlx::PgPool;
use uuid::Uuid;

/// One number from `sql` (a `count(*)` or the like) with `key` bound as `$1` when given.
async fn scalar(db: &PgPool, sql: &str, key: Option<Uuid>) -> i64 {
    let query = sqlx::query_scalar(sql);
    let query = match key {
        Some(key) => query.bind(key),
        None => query,
    };
    query.fetch_one(db).await.expect(sql)
}

/// The kit's own tables, in any service's database.
pub mod kit {
    use super::*;

    /// Outbox messages not yet published.
    pub async fn unpublished(db: &PgPool) -> i64 {
        scalar(
            db,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
            None,
        )
        .await
    }
}

/// Billing's ledger and balances.
pub mod billing {
    use super::*;

    /// Charges of key `key_id` held and neither confirmed nor released.
    pub async fn open_holds(db: &PgPool, key_id: Uuid) -> i64 {
        scalar(
            db,
            "SELECT count(*) FROM ledger WHERE api_key_id = $1 AND hold_until IS NOT NULL",
            Some(key_id),
        )
        .await
    }

    /// Held charges whose hold is still running: what the hold sweep may yet give back.
    pub async fn running_holds(db: &PgPool) -> i64 {
        scalar(db, "SELECT count(*) FROM ledger WHERE hold_until > 0", None).await
    }

    /// Ledger entries of `kind` (`charge`, `refund`, `void`, ...) for a key.
    pub async fn ledger_rows(db: &PgPool, key_id: Uuid, kind: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM ledger WHERE api_key_id = $1 AND kind = $2")
            .bind(key_id)
            .bind(kind)
            .fetch_one(db)
            .await
            .expect("ledger rows")
    }

    /// Locks a key's balance row in `tx`, so charges against it wait until `tx` ends.
    pub async fn lock_balance(tx: &mut sqlx::PgConnection, key_id: Uuid) {
        sqlx::query("SELECT balance FROM balances WHERE api_key_id = $1 FOR UPDATE")
            .bind(key_id)
            .execute(tx)
            .await
            .expect("balance row locked");
    }

    /// Charges still running against balances (statements of another connection).
    pub async fn charges_running(db: &PgPool) -> i64 {
        scalar(
            db,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND state = 'active' AND query LIKE '%balance = balance -%'",
            None,
        )
        .await
    }

    /// Writes `n` one-credit charges of a key straight into the ledger, to `target`.
    pub async fn insert_charges(db: &PgPool, key_id: Uuid, n: i32, target: &str) {
        sqlx::query(
            "INSERT INTO ledger (id, api_key_id, idempotency_key, kind, delta, created_at,
                                 caller_email, target_email)
             SELECT gen_random_uuid(), $1, 'bulk:' || n, 'charge', -1, 1700000000 + n,
                    'me@example.com', $2
             FROM generate_series(1, $3) AS n",
        )
        .bind(key_id)
        .bind(target)
        .bind(n)
        .execute(db)
        .await
        .expect("charges written");
    }
}

/// The gateway's accounts and keys.
pub mod gateway {
    use super::*;

    /// Revokes a key in the database alone (caches keep it until they expire).
    pub async fn revoke_key(db: &PgPool, key_id: Uuid) {
        sqlx::query("UPDATE api_keys SET revoked_at = 1 WHERE id = $1")
            .bind(key_id)
            .execute(db)
            .await
            .expect("key revoked");
    }

    /// The workspace of a key.
    pub async fn workspace_of(db: &PgPool, key_id: Uuid) -> Uuid {
        sqlx::query_scalar("SELECT workspace_id FROM api_keys WHERE id = $1")
            .bind(key_id)
            .fetch_one(db)
            .await
            .expect("key row")
    }
}

/// The domain service's saved settings.
pub mod domain {
    use super::*;

    /// A pending domain `name` of `workspace`, as a submission leaves it.
    pub async fn insert_pending(db: &PgPool, id: Uuid, workspace: Uuid, name: &str) {
        sqlx::query(
            "INSERT INTO domains (id, workspace_id, name, verification_token, created_at)
             VALUES ($1, $2, $3, 'token', 0)",
        )
        .bind(id)
        .bind(workspace)
        .bind(name)
        .execute(db)
        .await
        .expect("domain row");
    }

    /// A domain `name` of `workspace` with ownership and inbound MX verified, as the review
    /// and `verify-inbound` leave it.
    pub async fn insert_inbound_verified(db: &PgPool, workspace: Uuid, name: &str) {
        sqlx::query(
            "INSERT INTO domains (id, workspace_id, name, verification_token, ownership,
                 inbound_status, created_at)
             VALUES ($1, $2, $3, 'token', 'verified', 'verified', 0)",
        )
        .bind(Uuid::now_v7())
        .bind(workspace)
        .bind(name)
        .execute(db)
        .await
        .expect("domain row");
    }

    /// Makes the domain `name` older by `secs`, and its ownership verified with `proven`.
    pub async fn age(db: &PgPool, name: &str, secs: i64, proven: bool) {
        sqlx::query(
            "UPDATE domains SET created_at = created_at - $2,
                 ownership = CASE WHEN $3 THEN 'verified' ELSE ownership END
             WHERE name = $1",
        )
        .bind(name)
        .bind(secs)
        .bind(proven)
        .execute(db)
        .await
        .expect("domain aged");
    }

    /// Marks the domain `name`'s tracking host verified, last checked at `checked_at`, as
    /// `verify-tracking` leaves it.
    pub async fn tracking_verified(db: &PgPool, name: &str, checked_at: i64) {
        sqlx::query(
            "UPDATE domains SET tracking_status = 'verified', tracking_checked_at = $2
             WHERE name = $1",
        )
        .bind(name)
        .bind(checked_at)
        .execute(db)
        .await
        .expect("tracking set");
    }

    /// The domain `name`'s tracking status.
    pub async fn tracking_status(db: &PgPool, name: &str) -> String {
        sqlx::query_scalar("SELECT tracking_status FROM domains WHERE name = $1")
            .bind(name)
            .fetch_one(db)
            .await
            .expect("a domain")
    }

    /// The saved DNS provider token, as stored.
    pub async fn sealed_dns_token(db: &PgPool) -> Vec<u8> {
        sqlx::query_scalar("SELECT sealed_token FROM dns_providers")
            .fetch_one(db)
            .await
            .expect("a saved token")
    }
}

/// The sender's tasks, deliveries and settlements.
pub mod sender {
    use super::*;

    /// `count` contacts of `workspace` (`c<i>@bench.example`); contact `i` has the tag
    /// `first-<size>` for each of `sizes` above `i`.
    pub async fn insert_contacts(
        db: &PgPool, workspace: uuid::Uuid, count: usize, sizes: &[usize],
    ) {
        let sizes: Vec<i64> = sizes.iter().map(|s| *s as i64).collect();
        sqlx::query(
            "INSERT INTO contacts (id, workspace_id, email, email_key, tags, created_at, updated_at)
             SELECT gen_random_uuid(), $1, 'c' || i || '@bench.example', 'c' || i || '@bench.example',
                    ARRAY(SELECT 'first-' || s FROM unnest($3::bigint[]) AS s WHERE i < s), 0, 0
             FROM generate_series(0, $2 - 1) AS i",
        )
        .bind(workspace)
        .bind(count as i64)
        .bind(&sizes)
        .execute(db)
        .await
        .expect("contacts");
    }

    /// Rows the sender stores for sends: `(tasks, outbox messages, deliveries)`.
    pub async fn stored_rows(db: &PgPool) -> (i64, i64, i64) {
        (
            scalar(db, "SELECT count(*) FROM tasks", None).await,
            scalar(db, "SELECT count(*) FROM outbox", None).await,
            scalar(db, "SELECT count(*) FROM deliveries", None).await,
        )
    }

    /// Every delivery's status and attempts.
    pub async fn deliveries(db: &PgPool) -> Vec<(String, i32)> {
        sqlx::query_as("SELECT status, attempts FROM deliveries")
            .fetch_all(db)
            .await
            .expect("deliveries")
    }

    /// Status, attempts and last error of the delivery to `to`, if there is one.
    pub async fn delivery_to(db: &PgPool, to: &str) -> Option<(String, i32, Option<String>)> {
        sqlx::query_as(
            "SELECT status, attempts, last_error FROM deliveries WHERE $1 = ANY(recipients)",
        )
        .bind(to)
        .fetch_optional(db)
        .await
        .expect("deliveries")
    }

    /// The provider's id of the message to `to`, once the transport gave it one.
    pub async fn provider_id_to(db: &PgPool, to: &str) -> Option<String> {
        sqlx::query_scalar(
            "SELECT provider_message_id FROM deliveries
             WHERE $1 = ANY(recipients) AND provider_message_id IS NOT NULL",
        )
        .bind(to)
        .fetch_optional(db)
        .await
        .expect("deliveries")
    }

    /// Settlements with billing not yet done, whatever their action: while there are
    /// none, no balance changes on the sender's account.
    pub async fn unsettled(db: &PgPool) -> i64 {
        scalar(
            db,
            "SELECT count(*) FROM settlements WHERE done_at IS NULL",
            None,
        )
        .await
    }

    /// Refunds owed to billing and not yet settled.
    pub async fn owed_refunds(db: &PgPool) -> i64 {
        scalar(
            db,
            "SELECT count(*) FROM settlements WHERE action = 'refund' AND done_at IS NULL",
            None,
        )
        .await
    }

    /// The labels stored with the only task: `(email_type, topic, source_app,
    /// business_goal, recipient_reason)`.
    pub async fn task_labels(
        db: &PgPool,
    ) -> (
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) {
        sqlx::query_as(
            "SELECT email_type, topic, source_app, business_goal, recipient_reason FROM tasks",
        )
        .fetch_one(db)
        .await
        .expect("one task")
    }

    /// The attempts of each delivery of a task, fewest first.
    pub async fn delivery_attempts(db: &PgPool, task: Uuid) -> Vec<i32> {
        sqlx::query_scalar("SELECT attempts FROM deliveries WHERE task_id = $1 ORDER BY attempts")
            .bind(task)
            .fetch_all(db)
            .await
            .expect("deliveries")
    }

    /// Records a delivery as being sent by another worker whose lease runs `ms` more.
    pub async fn lease_elsewhere(
        db: &PgPool, delivery: Uuid, to: &[String], subject: &str, ms: i64,
    ) {
        sqlx::query(
            "INSERT INTO deliveries (delivery_id, kind, recipients, subject, status, created_at,
                                     updated_at, lease_owner, leased_until_ms)
             VALUES ($1, 'verification', $2, $3, 'sending', 0, 0, $4,
                     (extract(epoch from clock_timestamp()) * 1000)::bigint + $5)",
        )
        .bind(delivery)
        .bind(to)
        .bind(subject)
        .bind(Uuid::now_v7())
        .bind(ms)
        .execute(db)
        .await
        .expect("delivery leased");
    }

    /// Records a delivery as sent by its other worker, which lets go of its lease.
    pub async fn finish_elsewhere(db: &PgPool, delivery: Uuid) {
        sqlx::query(
            "UPDATE deliveries SET status = 'sent', lease_owner = NULL WHERE delivery_id = $1",
        )
        .bind(delivery)
        .execute(db)
        .await
        .expect("delivery finished");
    }

    /// A delivery's status and the lease that holds it, if any.
    pub async fn delivery_state(db: &PgPool, delivery: Uuid) -> (String, Option<Uuid>) {
        sqlx::query_as("SELECT status, lease_owner FROM deliveries WHERE delivery_id = $1")
            .bind(delivery)
            .fetch_one(db)
            .await
            .expect("delivery row")
    }
}

/// The inbound service's stored mail.
pub mod inbound {
    use super::*;

    /// A live inbox `address` of `workspace`, as `POST /inbox/addresses` leaves it.
    /// Its id.
    pub async fn insert_address(db: &PgPool, workspace: Uuid, address: &str) -> Uuid {
        let id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO addresses (id, workspace_id, address, created_at)
             VALUES ($1, $2, $3, 0)",
        )
        .bind(id)
        .bind(workspace)
        .bind(address)
        .execute(db)
        .await
        .expect("address row");
        id
    }

    /// Stored copies of messages, with their raw forms (each copy has one).
    pub async fn messages(db: &PgPool) -> i64 {
        let (copies, raws): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM message_raw)",
        )
        .fetch_one(db)
        .await
        .expect("counts");
        assert_eq!(copies, raws, "each stored copy has its raw form");
        copies
    }
}

/// The webhook dispatcher's endpoints.
pub mod dispatcher {
    use super::*;

    /// The rotated-out secret of endpoint `id`, as stored, and until when it signs.
    pub async fn previous_secret(db: &PgPool, id: Uuid) -> (Option<Vec<u8>>, Option<i64>) {
        sqlx::query_as(
            "SELECT previous_secret_sealed, previous_secret_until FROM endpoints WHERE id = $1",
        )
        .bind(id)
        .fetch_one(db)
        .await
        .expect("an endpoint")
    }

    /// Leases attempt `id` to another try for `ms`, as one in flight holds it.
    pub async fn lease_attempt(db: &PgPool, id: Uuid, ms: i64) {
        sqlx::query(
            "UPDATE attempts SET lease_owner = gen_random_uuid(),
                 leased_until_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint + $2
             WHERE id = $1",
        )
        .bind(id)
        .bind(ms)
        .execute(db)
        .await
        .expect("an attempt");
    }

    /// Since when endpoint `id`'s deliveries have all failed, if they have.
    pub async fn failing_since(db: &PgPool, id: Uuid) -> Option<i64> {
        sqlx::query_scalar("SELECT failing_since FROM endpoints WHERE id = $1")
            .bind(id)
            .fetch_one(db)
            .await
            .expect("an endpoint")
    }

    /// The signing secret of endpoint `id`, as stored.
    pub async fn sealed_secret(db: &PgPool, id: Uuid) -> Vec<u8> {
        sqlx::query_scalar("SELECT secret_sealed FROM endpoints WHERE id = $1")
            .bind(id)
            .fetch_one(db)
            .await
            .expect("an endpoint")
    }

    /// Every delivery attempt's id.
    pub async fn attempt_ids(db: &PgPool) -> Vec<Uuid> {
        sqlx::query_scalar("SELECT id FROM attempts ORDER BY id")
            .fetch_all(db)
            .await
            .expect("attempts")
    }

    /// The ids of the delivery attempts of `workspace`.
    pub async fn attempt_ids_of(db: &PgPool, workspace: Uuid) -> Vec<Uuid> {
        sqlx::query_scalar("SELECT id FROM attempts WHERE workspace_id = $1 ORDER BY id")
            .bind(workspace)
            .fetch_all(db)
            .await
            .expect("attempts")
    }
}
