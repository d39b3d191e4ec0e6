//! The credit ledger: every balance change is an append-only entry with a unique
//! idempotency key, and the balance moves in the same statement, conditionally, so
//! concurrent charges never overdraw and a retried charge never charges twice.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use postmesh_shared::db::{self, now_unix};
use postmesh_shared::proto::{
    ChargeReply, ChargeRequest, ConfirmReply, ConfirmRequest, GrantReply, GrantRequest,
    RefundReply, RefundRequest,
};
use postmesh_shared::{ApiError, ApiKeyId, TaskId};

pub use postmesh_contracts::answers::billing::EntryKind;

/// The idempotency key of a ledger entry (unique per API key): 1-200 chars.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerKey(String);

impl LedgerKey {
    /// Parses a key sent by a caller.
    pub fn parse(raw: &str) -> Result<Self, LedgerError> {
        if raw.is_empty() || raw.chars().count() > 200 {
            return Err(LedgerError::Invalid(
                "idempotency key must be 1-200 chars".into(),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a ledger operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("insufficient balance")]
    InsufficientBalance,
    #[error("this charge was cancelled; retry with a new idempotency key")]
    Voided,
    #[error("idempotency key already used for another ledger entry")]
    KeyTaken,
    #[error("refund did not settle")]
    Unsettled,
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::InsufficientBalance => ApiError::PaymentRequired(e.to_string()),
            LedgerError::Voided | LedgerError::KeyTaken => ApiError::Conflict(e.to_string()),
            LedgerError::Invalid(m) => ApiError::BadRequest(m),
            LedgerError::Unsettled => ApiError::internal("ledger update failed", e),
            LedgerError::Db(e) => e.into(),
        }
    }
}

fn parse_key_id(raw: &str) -> Result<ApiKeyId, LedgerError> {
    ApiKeyId::parse(raw).ok_or_else(|| LedgerError::Invalid("invalid api_key_id".into()))
}

/// Takes `req.cost` credits, once per `(api_key_id, idempotency_key)`.
pub async fn charge(db: &PgPool, req: &ChargeRequest) -> Result<ChargeReply, LedgerError> {
    let key_id = parse_key_id(&req.api_key_id)?;
    let idem = LedgerKey::parse(&req.idempotency_key)?;
    let task_id = match req.task_id.as_deref() {
        None => None,
        Some(raw) => {
            Some(TaskId::parse(raw).ok_or_else(|| LedgerError::Invalid("invalid task_id".into()))?)
        }
    };
    if req.cost <= 0 {
        return Err(LedgerError::Invalid("cost must be positive".into()));
    }
    if req.hold_secs < 0 {
        return Err(LedgerError::Invalid(
            "hold_secs must not be negative".into(),
        ));
    }
    if req.dry_run {
        let balance: Option<i64> =
            sqlx::query_scalar("SELECT balance FROM balances WHERE api_key_id = $1")
                .bind(key_id)
                .fetch_optional(db)
                .await?;
        return match balance {
            Some(balance) if balance >= req.cost => Ok(ChargeReply {
                balance,
                duplicate: false,
                entry_id: String::new(),
            }),
            _ => Err(LedgerError::InsufficientBalance),
        };
    }
    let entry_id = Uuid::now_v7();
    // One statement: the balance only moves if the entry is new and the balance covers it.
    // A concurrent duplicate fails on the unique key and rolls the whole statement back.
    let charged: Result<Option<i64>, sqlx::Error> = sqlx::query_scalar(
        "WITH upd AS (
             UPDATE balances SET balance = balance - $3, updated_at = $4
             WHERE api_key_id = $1 AND balance >= $3
               AND NOT EXISTS (SELECT 1 FROM ledger WHERE api_key_id = $1 AND idempotency_key = $2)
             RETURNING balance)
         INSERT INTO ledger (id, api_key_id, idempotency_key, kind, delta, created_at, caller_email,
                             target_email, from_email, subject, send_mode, recipient_count, task_id,
                             hold_until)
         SELECT $5, $1, $2, 'charge', -$3, $4, $6, $7, $8, $9, $10, $11, $12,
                CASE WHEN $13 > 0 THEN $4 + $13 END
         FROM upd
         RETURNING (SELECT balance FROM upd)",
    )
    .bind(key_id)
    .bind(idem.as_str())
    .bind(req.cost)
    .bind(now_unix())
    .bind(entry_id)
    .bind(&req.caller_email)
    .bind(&req.target_email)
    .bind(&req.from_email)
    .bind(&req.subject)
    .bind(&req.send_mode)
    .bind(req.recipient_count)
    .bind(task_id.map(|t| t.to_string()))
    .bind(req.hold_secs)
    .fetch_optional(db)
    .await;
    match charged {
        Ok(Some(balance)) => Ok(ChargeReply {
            balance,
            duplicate: false,
            entry_id: entry_id.to_string(),
        }),
        Ok(None) => earlier_charge(db, key_id, &idem).await,
        Err(e) if db::is_unique_violation(&e) => earlier_charge(db, key_id, &idem).await,
        Err(e) => Err(e.into()),
    }
}

/// After a charge that moved nothing: the earlier charge with that key, a cancelled charge,
/// or no money.
async fn earlier_charge(
    db: &PgPool, key_id: ApiKeyId, idem: &LedgerKey,
) -> Result<ChargeReply, LedgerError> {
    let (entry, kind, balance): (Option<Uuid>, Option<EntryKind>, Option<i64>) = sqlx::query_as(
        "SELECT e.id, e.kind, (SELECT balance FROM balances WHERE api_key_id = $1)
         FROM (SELECT 1) AS one
         LEFT JOIN ledger e ON e.api_key_id = $1 AND e.idempotency_key = $2",
    )
    .bind(key_id)
    .bind(idem.as_str())
    .fetch_one(db)
    .await?;
    match (entry, kind) {
        (Some(id), Some(EntryKind::Charge)) => Ok(ChargeReply {
            balance: balance.unwrap_or(0),
            duplicate: true,
            entry_id: id.to_string(),
        }),
        (Some(_), Some(EntryKind::Void)) => Err(LedgerError::Voided),
        (Some(_), _) => Err(LedgerError::KeyTaken),
        (None, _) => Err(LedgerError::InsufficientBalance),
    }
}

/// Gives back the charge made with `charge_idempotency_key`, at most once: the whole of it
/// (less a part given back before), or with `credits` set only that many. When there is no
/// such charge yet, a whole refund voids the key instead, so a charge still in flight (its
/// caller timed out and gave up) fails rather than taking credits nobody will give back.
pub async fn refund(db: &PgPool, req: &RefundRequest) -> Result<RefundReply, LedgerError> {
    let key_id = parse_key_id(&req.api_key_id)?;
    let idem = LedgerKey::parse(&req.charge_idempotency_key)?;
    if req.credits < 0 {
        return Err(LedgerError::Invalid("credits must not be negative".into()));
    }
    if req.credits > 0 {
        return refund_part(db, key_id, &idem, req.credits, &req.reason).await;
    }
    // A charge may commit between the two statements below; the void then conflicts with it
    // and the next round refunds it. Two rounds always settle it; the third is a safeguard.
    for _ in 0..3 {
        let mut tx = db.begin().await?;
        let refunded = refund_charge(&mut tx, key_id, &idem).await?;
        tx.commit().await?;
        if let Some(balance) = refunded {
            tracing::info!(api_key_id = %key_id, reason = %req.reason, "charge refunded");
            return Ok(RefundReply {
                balance,
                refunded: true,
            });
        }
        let voided = sqlx::query(
            "INSERT INTO ledger (id, api_key_id, idempotency_key, kind, delta, created_at, caller_email)
             VALUES ($1, $2, $3, 'void', 0, $4, '')
             ON CONFLICT DO NOTHING",
        )
        .bind(Uuid::now_v7())
        .bind(key_id)
        .bind(idem.as_str())
        .bind(now_unix())
        .execute(db)
        .await?;
        let settled = voided.rows_affected() == 1 || !charge_unrefunded(db, key_id, &idem).await?;
        if settled {
            if voided.rows_affected() == 1 {
                tracing::info!(api_key_id = %key_id, reason = %req.reason, "charge voided before it happened");
            }
            return Ok(RefundReply {
                balance: current_balance(db, key_id).await?,
                refunded: false,
            });
        }
    }
    Err(LedgerError::Unsettled)
}

/// The idempotency key of the part refund of the charge keyed `charge`.
const PART_PREFIX: &str = "refund-part:";

/// What a refund's ledger row copies from its charge's, for the consumption log.
const COPIED: &str =
    "caller_email, target_email, from_email, subject, send_mode, recipient_count, task_id";

/// The statement that writes the refund row `select` makes (columns `id, api_key_id,
/// idempotency_key, kind, delta, created_at`, [`COPIED`], then `extra`) unless it exists,
/// and credits its delta to key `$1` at time `$at`: the new balance, none when nothing was
/// written.
fn refund_statement(extra: &str, select: &str, at: u8) -> String {
    format!(
        "WITH ins AS (
             INSERT INTO ledger (id, api_key_id, idempotency_key, kind, delta, created_at, {COPIED}{extra})
             {select}
             ON CONFLICT DO NOTHING
             RETURNING delta)
         UPDATE balances SET balance = balance + (SELECT delta FROM ins), updated_at = ${at}
         WHERE api_key_id = $1 AND EXISTS (SELECT 1 FROM ins)
         RETURNING balance"
    )
}

/// Locks the charge with key `idem` for the caller's transaction, so its refunds, whole and
/// part, are written one after the other; its id and cost.
async fn lock_charge(
    tx: &mut PgConnection, key_id: ApiKeyId, idem: &LedgerKey,
) -> Result<Option<(Uuid, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, -delta FROM ledger
         WHERE api_key_id = $1 AND idempotency_key = $2 AND kind = 'charge' FOR UPDATE",
    )
    .bind(key_id)
    .bind(idem.as_str())
    .fetch_optional(tx)
    .await
}

/// Gives back `credits` of the charge with key `idem`, once per charge (a repeat moves
/// nothing); not when there is no such charge or it was refunded whole. Such a part is a
/// `refund` entry without `refund_of`: the charge stays confirmable, and a whole refund
/// later gives back only the rest.
async fn refund_part(
    db: &PgPool, key_id: ApiKeyId, idem: &LedgerKey, credits: i64, reason: &str,
) -> Result<RefundReply, LedgerError> {
    let mut tx = db.begin().await?;
    let Some((charge, cost)) = lock_charge(&mut tx, key_id, idem).await? else {
        drop(tx);
        return Ok(RefundReply {
            balance: current_balance(db, key_id).await?,
            refunded: false,
        });
    };
    if credits > cost {
        return Err(LedgerError::Invalid(format!(
            "credits ({credits}) exceed the charge ({cost})"
        )));
    }
    let balance: Option<i64> = sqlx::query_scalar(&refund_statement(
        "",
        &format!(
            "SELECT $3, api_key_id, '{PART_PREFIX}' || idempotency_key, 'refund', $4, $5, {COPIED}
             FROM ledger c
             WHERE c.id = $2 AND NOT EXISTS (SELECT 1 FROM ledger r WHERE r.refund_of = c.id)"
        ),
        5,
    ))
    .bind(key_id)
    .bind(charge)
    .bind(Uuid::now_v7())
    .bind(credits)
    .bind(now_unix())
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    if balance.is_some() {
        tracing::info!(api_key_id = %key_id, credits, %reason, "part of a charge refunded");
    }
    Ok(RefundReply {
        refunded: balance.is_some(),
        balance: match balance {
            Some(balance) => balance,
            None => current_balance(db, key_id).await?,
        },
    })
}

/// Refunds the charge with key `idem` if it exists and is not refunded yet, less a part
/// given back before; the new balance. Takes the charge's lock first, so a part refund
/// committed meanwhile is seen.
async fn refund_charge(
    tx: &mut PgConnection, key_id: ApiKeyId, idem: &LedgerKey,
) -> Result<Option<i64>, LedgerError> {
    if lock_charge(&mut *tx, key_id, idem).await?.is_none() {
        return Ok(None);
    }
    Ok(sqlx::query_scalar(&refund_statement(
        ", refund_of",
        &format!(
            "SELECT $3, api_key_id, 'refund:' || idempotency_key, 'refund',
                    -delta - COALESCE((SELECT p.delta FROM ledger p
                                       WHERE p.api_key_id = c.api_key_id
                                         AND p.idempotency_key = '{PART_PREFIX}' || c.idempotency_key), 0),
                    $4, {COPIED}, id
             FROM ledger c WHERE api_key_id = $1 AND idempotency_key = $2 AND kind = 'charge'"
        ),
        4,
    ))
    .bind(key_id)
    .bind(idem.as_str())
    .bind(Uuid::now_v7())
    .bind(now_unix())
    .fetch_optional(tx)
    .await?)
}

/// Whether a charge with key `idem` exists and has no refund.
async fn charge_unrefunded(
    db: &PgPool, key_id: ApiKeyId, idem: &LedgerKey,
) -> Result<bool, LedgerError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM ledger c
                        WHERE c.api_key_id = $1 AND c.idempotency_key = $2 AND c.kind = 'charge'
                          AND NOT EXISTS (SELECT 1 FROM ledger r WHERE r.refund_of = c.id))",
    )
    .bind(key_id)
    .bind(idem.as_str())
    .fetch_one(db)
    .await?)
}

/// Makes the held charge with `charge_idempotency_key` final. Confirming again, or a charge
/// that was never held, is confirmed too; a charge whose hold ran out is not.
pub async fn confirm(db: &PgPool, req: &ConfirmRequest) -> Result<ConfirmReply, LedgerError> {
    let key_id = parse_key_id(&req.api_key_id)?;
    let idem = LedgerKey::parse(&req.charge_idempotency_key)?;
    // The row lock orders this against `release_expired_holds`: whichever comes second sees
    // the other's `hold_until`.
    let confirmed: Option<Uuid> = sqlx::query_scalar(
        "UPDATE ledger SET hold_until = NULL
         WHERE api_key_id = $1 AND idempotency_key = $2 AND kind = 'charge'
           AND (hold_until IS NULL OR hold_until > 0)
           AND NOT EXISTS (SELECT 1 FROM ledger r WHERE r.refund_of = ledger.id)
         RETURNING id",
    )
    .bind(key_id)
    .bind(idem.as_str())
    .fetch_optional(db)
    .await?;
    Ok(ConfirmReply {
        confirmed: confirmed.is_some(),
    })
}

/// Expired holds released by one call of [`release_expired_holds`] at most.
pub const HOLD_BATCH: usize = 100;

/// Refunds held charges whose hold ran out, at most [`HOLD_BATCH`]; how many holds it
/// released. Replicas running this at once take different rows.
pub async fn release_expired_holds(db: &PgPool) -> Result<usize, LedgerError> {
    let mut tx = db.begin().await?;
    let expired: Vec<(ApiKeyId, String)> = sqlx::query_as(
        "UPDATE ledger SET hold_until = -1
         WHERE id IN (SELECT id FROM ledger WHERE hold_until > 0 AND hold_until < $1
                      ORDER BY hold_until LIMIT $2 FOR UPDATE SKIP LOCKED)
         RETURNING api_key_id, idempotency_key",
    )
    .bind(now_unix())
    .bind(HOLD_BATCH as i64)
    .fetch_all(&mut *tx)
    .await?;
    for (key_id, idem) in &expired {
        if refund_charge(&mut tx, *key_id, &LedgerKey(idem.clone()))
            .await?
            .is_some()
        {
            tracing::info!(api_key_id = %key_id, charge = %idem, "held charge expired; refunded");
        }
    }
    tx.commit().await?;
    Ok(expired.len())
}

/// Adds credits, once per `(api_key_id, idempotency_key)`; creates the balance if needed.
pub async fn grant(db: &mut PgConnection, req: &GrantRequest) -> Result<GrantReply, LedgerError> {
    let key_id = parse_key_id(&req.api_key_id)?;
    let account_id = Uuid::parse_str(&req.account_id)
        .map_err(|_| LedgerError::Invalid("invalid account_id".into()))?;
    let idem = LedgerKey::parse(&req.idempotency_key)?;
    if req.credits < 0 {
        return Err(LedgerError::Invalid("credits must not be negative".into()));
    }
    let balance: Option<i64> = sqlx::query_scalar(
        "WITH ins AS (
             INSERT INTO ledger (id, api_key_id, idempotency_key, kind, delta, created_at, caller_email)
             VALUES ($3, $1, $4, 'grant', $5, $6, $7)
             ON CONFLICT DO NOTHING
             RETURNING delta)
         INSERT INTO balances (api_key_id, account_id, balance, updated_at)
         SELECT $1, $2, delta, $6 FROM ins
         ON CONFLICT (api_key_id)
             DO UPDATE SET balance = balances.balance + EXCLUDED.balance, updated_at = EXCLUDED.updated_at
         RETURNING balance",
    )
    .bind(key_id)
    .bind(account_id)
    .bind(Uuid::now_v7())
    .bind(idem.as_str())
    .bind(req.credits)
    .bind(now_unix())
    .bind(&req.email)
    .fetch_optional(&mut *db)
    .await?;
    Ok(match balance {
        Some(balance) => GrantReply {
            balance,
            duplicate: false,
        },
        None => GrantReply {
            balance: current_balance(&mut *db, key_id).await?,
            duplicate: true,
        },
    })
}

/// The key's balance; a key that never had credits has 0.
pub async fn current_balance(
    db: impl sqlx::PgExecutor<'_>, key_id: ApiKeyId,
) -> Result<i64, sqlx::Error> {
    let balance: Option<i64> =
        sqlx::query_scalar("SELECT balance FROM balances WHERE api_key_id = $1")
            .bind(key_id)
            .fetch_optional(db)
            .await?;
    Ok(balance.unwrap_or(0))
}

/// Adds `nano` nano-USD to the key's usage balance, once per `(key, idempotency_key)`.
pub async fn grant_usage(
    db: &mut PgConnection, key: ApiKeyId, idempotency_key: &str, nano: i64,
) -> Result<(), LedgerError> {
    if nano <= 0 {
        return Err(LedgerError::Invalid("usage grants must be positive".into()));
    }
    sqlx::query(
        "WITH ins AS (
             INSERT INTO usage_ledger (id, api_key_id, idempotency_key, delta_nano, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT DO NOTHING
             RETURNING delta_nano)
         INSERT INTO usage_balances (api_key_id, balance_nano, updated_at)
         SELECT $2, delta_nano, $5 FROM ins
         ON CONFLICT (api_key_id) DO UPDATE
             SET balance_nano = usage_balances.balance_nano + EXCLUDED.balance_nano,
                 updated_at = EXCLUDED.updated_at",
    )
    .bind(Uuid::now_v7())
    .bind(key)
    .bind(idempotency_key)
    .bind(nano)
    .bind(now_unix())
    .execute(&mut *db)
    .await?;
    Ok(())
}

/// Nano-USD per USD cent.
pub const NANO_PER_CENT: i64 = 10_000_000;

/// Takes back up to `credits` of `key`'s balance, once per `idempotency_key`: as many as are
/// left, never below zero (a reversal of a payment, logged as `reversal`); negative
/// `credits` give them back (a dispute won). Answers what it took, negative for what it gave
/// (0 for a repeat).
pub async fn reverse(
    db: &mut PgConnection, key: ApiKeyId, idempotency_key: &str, credits: i64, email: &str,
) -> Result<i64, sqlx::Error> {
    let taken: Option<i64> = sqlx::query_scalar(
        "WITH held AS (SELECT CASE WHEN $4 < 0 THEN $4 ELSE LEAST($4, balance) END AS take
                       FROM balances WHERE api_key_id = $1 FOR UPDATE),
              ins AS (
                 INSERT INTO ledger (id, api_key_id, idempotency_key, kind, delta, created_at,
                                     caller_email)
                 SELECT $2, $1, $3, 'reversal', -take, $5, $6 FROM held WHERE take <> 0
                 ON CONFLICT DO NOTHING
                 RETURNING delta)
         UPDATE balances b SET balance = b.balance + ins.delta, updated_at = $5 FROM ins
         WHERE b.api_key_id = $1 RETURNING -ins.delta",
    )
    .bind(key)
    .bind(Uuid::now_v7())
    .bind(idempotency_key)
    .bind(credits)
    .bind(now_unix())
    .bind(email)
    .fetch_optional(&mut *db)
    .await?;
    Ok(taken.unwrap_or(0))
}

/// [`reverse`] for a usage balance, in nano-USD.
pub async fn reverse_usage(
    db: &mut PgConnection, key: ApiKeyId, idempotency_key: &str, nano: i64,
) -> Result<i64, sqlx::Error> {
    let taken: Option<i64> = sqlx::query_scalar(
        "WITH held AS (SELECT CASE WHEN $4 < 0 THEN $4 ELSE LEAST($4, balance_nano) END
                              AS take
                       FROM usage_balances WHERE api_key_id = $1 FOR UPDATE),
              ins AS (
                 INSERT INTO usage_ledger (id, api_key_id, idempotency_key, delta_nano, created_at)
                 SELECT $2, $1, $3, -take, $5 FROM held WHERE take <> 0
                 ON CONFLICT DO NOTHING
                 RETURNING delta_nano)
         UPDATE usage_balances b SET balance_nano = b.balance_nano + ins.delta_nano,
             updated_at = $5
         FROM ins WHERE b.api_key_id = $1 RETURNING -ins.delta_nano",
    )
    .bind(key)
    .bind(Uuid::now_v7())
    .bind(idempotency_key)
    .bind(nano)
    .bind(now_unix())
    .fetch_optional(&mut *db)
    .await?;
    Ok(taken.unwrap_or(0))
}

/// The key's usage balance in nano-USD, and what its usage took since `since` (Unix seconds).
pub async fn usage_position(
    db: &PgPool, key: ApiKeyId, since: i64,
) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT COALESCE((SELECT balance_nano FROM usage_balances WHERE api_key_id = $1), 0),
                COALESCE((SELECT -SUM(delta_nano) FROM usage_ledger
                          WHERE api_key_id = $1 AND delta_nano < 0 AND created_at >= $2
                            AND idempotency_key NOT LIKE 'reversal:%'), 0)::bigint",
    )
    .bind(key)
    .bind(since)
    .fetch_one(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_database_is_503_and_a_spent_balance_402() {
        let status = |e: LedgerError| ApiError::from(e).status();
        let lost = LedgerError::Db(sqlx::Error::PoolTimedOut);
        assert_eq!(status(lost), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        let spent = LedgerError::InsufficientBalance;
        assert_eq!(status(spent), axum::http::StatusCode::PAYMENT_REQUIRED);
    }

    #[test]
    fn keys_are_counted_in_characters() {
        // `/deduct` takes 100 characters and stores them as `deduct:<key>`.
        let accented = format!("deduct:{}", "é".repeat(100));
        assert!(accented.len() > 200 && LedgerKey::parse(&accented).is_ok());
        assert!(LedgerKey::parse(&"é".repeat(200)).is_ok());
        assert!(LedgerKey::parse(&"é".repeat(201)).is_err());
        assert!(LedgerKey::parse("").is_err());
    }
}
