//! Settling charges with billing, durably: the confirm of a send's held charge, the refund
//! of a cancelled send and the part refund of a scheduled send that left recipients off at
//! its release are rows written in the transaction that owes them, tried at once and
//! retried by a sweep until billing answers. A confirm that comes after the hold
//! ran out (billing gave the credits back) charges the send again, under its own key, since
//! its messages are on their way; so a refund, whole or part, waits for the confirm and
//! gives back the charge that stands.

use sqlx::{PgConnection, Postgres, Transaction};

use postmesh_shared::db::now_unix;
use postmesh_shared::proto::{ChargeRequest, ConfirmRequest, RefundRequest};
use postmesh_shared::{nats, ApiError, TaskId};

use crate::AppState;

/// Settlements one sweep takes at most.
pub const BATCH: i64 = 50;
/// The longest pause between two tries of a settlement.
const MAX_PAUSE_SECS: i64 = 300;

/// What is owed to billing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum Action {
    /// Make the send's held charge final.
    Confirm,
    /// Give the cancelled send's charge back.
    Refund,
    /// Give back the part of the charge of recipients left off at the send's release.
    RefundPart,
}

/// The charge a settlement is about.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Charge {
    pub task_id: TaskId,
    pub action: Action,
    pub api_key_id: uuid::Uuid,
    pub account_id: String,
    pub caller_email: String,
    pub cost: i64,
}

/// Records that `charge.action` is owed, in the caller's transaction.
pub async fn owe(tx: &mut PgConnection, charge: &Charge) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO settlements (task_id, action, api_key_id, account_id, caller_email, cost, next_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
    )
    .bind(charge.task_id)
    .bind(charge.action)
    .bind(charge.api_key_id)
    .bind(&charge.account_id)
    .bind(&charge.caller_email)
    .bind(charge.cost)
    .bind(now_unix())
    .execute(tx)
    .await
    .map(drop)
}

/// Records, in the caller's transaction, that the whole charge `task`'s confirm holds is
/// owed back (a scheduled send left with no recipient at its release); false when the
/// task has no charge.
pub async fn owe_refund_of(tx: &mut PgConnection, task: TaskId) -> Result<bool, sqlx::Error> {
    sqlx::query(
        "INSERT INTO settlements (task_id, action, api_key_id, account_id, caller_email, cost, next_at)
         SELECT task_id, 'refund', api_key_id, account_id, caller_email, cost, $2
         FROM settlements WHERE task_id = $1 AND action = 'confirm'
         ON CONFLICT DO NOTHING",
    )
    .bind(task)
    .bind(now_unix())
    .execute(tx)
    .await
    .map(|done| done.rows_affected() == 1)
}

/// Records, in the caller's transaction, that `task`'s charge beyond `kept_cost` is owed
/// back (recipients and copies left off at its release); false when the send was not
/// charged.
pub async fn owe_part_of(
    tx: &mut PgConnection, task: TaskId, kept_cost: i64,
) -> Result<bool, sqlx::Error> {
    sqlx::query(
        "INSERT INTO settlements (task_id, action, api_key_id, account_id, caller_email, cost, next_at)
         SELECT task_id, 'refund_part', api_key_id, account_id, caller_email, cost - $2, $3
         FROM settlements WHERE task_id = $1 AND action = 'confirm' AND cost > $2
         ON CONFLICT DO NOTHING",
    )
    .bind(task)
    .bind(kept_cost)
    .bind(now_unix())
    .execute(tx)
    .await
    .map(|done| done.rows_affected() == 1)
}

/// The key of `task`'s charge that stands once its confirm is settled: the send's own, or
/// `{task}:late` when its hold had run out (and, unpaid, no charge at all); an error while
/// the confirm is not settled, so a refund waits for it and is taken from the charge that
/// stands.
async fn standing_charge(state: &AppState, task: TaskId) -> Result<String, ApiError> {
    let confirm: Option<(Option<i64>, Option<String>)> = sqlx::query_as(
        "SELECT done_at, outcome FROM settlements WHERE task_id = $1 AND action = 'confirm'",
    )
    .bind(task)
    .fetch_optional(&state.db)
    .await?;
    match confirm {
        Some((Some(_), Some(outcome))) if outcome != CONFIRMED => Ok(late_key(&task.to_string())),
        Some((Some(_), _)) => Ok(task.to_string()),
        _ => Err(ApiError::Unavailable(
            "the send's charge is not confirmed yet".into(),
        )),
    }
}

/// The key of the charge a confirm makes after the hold of the send keyed `task` ran out.
fn late_key(task: &str) -> String {
    format!("{task}:late")
}

/// The outcome of a confirm that billing took.
const CONFIRMED: &str = "confirmed";

/// Asks billing; the outcome to record, or the error that makes it a retry.
async fn attempt(state: &AppState, c: &Charge) -> Result<String, ApiError> {
    let (key, task) = (c.api_key_id.to_string(), c.task_id.to_string());
    match c.action {
        Action::Refund | Action::RefundPart => {
            // Both wait for the confirm: refunded before it, the charge would be made again
            // by a confirm that finds it given back.
            let charge = standing_charge(state, c.task_id).await?;
            let (reason, credits) = if c.action == Action::Refund {
                ("scheduled send cancelled or left with no recipient", 0)
            } else {
                ("recipients left off at a scheduled send's release", c.cost)
            };
            let reply = nats::call(
                &state.nats,
                &state.ns,
                &RefundRequest {
                    api_key_id: key,
                    charge_idempotency_key: charge,
                    reason: reason.into(),
                    credits,
                },
            )
            .await?;
            Ok(if reply.refunded {
                "refunded"
            } else {
                "nothing to refund"
            }
            .into())
        }
        Action::Confirm => {
            let reply = nats::call(
                &state.nats,
                &state.ns,
                &ConfirmRequest {
                    api_key_id: key.clone(),
                    charge_idempotency_key: task.clone(),
                },
            )
            .await?;
            if reply.confirmed {
                return Ok(CONFIRMED.into());
            }
            // The hold ran out and billing gave the credits back: charge again.
            let late = nats::call(
                &state.nats,
                &state.ns,
                &ChargeRequest {
                    api_key_id: key,
                    account_id: c.account_id.clone(),
                    caller_email: c.caller_email.clone(),
                    cost: c.cost,
                    idempotency_key: late_key(&task),
                    task_id: Some(task),
                    ..Default::default()
                },
            )
            .await;
            match late {
                Ok(_) => Ok("charged after the hold ran out".into()),
                Err(ApiError::PaymentRequired(e)) => {
                    tracing::error!(task = %c.task_id, error = %e, "a send's hold ran out and the balance no longer covers it");
                    Ok(format!("unpaid: {e}"))
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// Tries the settlement rows `tx` holds locked, recording each outcome or its next try.
async fn settle(
    state: &AppState, tx: &mut Transaction<'_, Postgres>, due: Vec<(Charge, i32)>,
) -> Result<(), sqlx::Error> {
    for (charge, attempts) in due {
        let (done, outcome, next) = match attempt(state, &charge).await {
            Ok(outcome) => (Some(now_unix()), outcome, 0),
            Err(e) => {
                tracing::warn!(task = %charge.task_id, action = ?charge.action, error = %e, "billing settlement failed; will retry");
                let pause = 2i64
                    .saturating_pow(attempts.clamp(0, 16) as u32)
                    .min(MAX_PAUSE_SECS);
                (None, e.to_string(), now_unix() + pause)
            }
        };
        sqlx::query(
            "UPDATE settlements SET attempts = attempts + 1, done_at = $3, outcome = $4,
                                    next_at = GREATEST(next_at, $5)
             WHERE task_id = $1 AND action = $2",
        )
        .bind(charge.task_id)
        .bind(charge.action)
        .bind(done)
        .bind(outcome)
        .bind(next)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

const SELECT: &str = "SELECT task_id, action, api_key_id, account_id, caller_email, cost, attempts
                      FROM settlements";

#[derive(sqlx::FromRow)]
struct Row {
    #[sqlx(flatten)]
    charge: Charge,
    attempts: i32,
}

/// Settles what `task` owes now, unless a sweep is on it; a failure is left to the sweep.
pub async fn now(state: &AppState, task: TaskId, action: Action) {
    let settled = async {
        let mut tx = state.db.begin().await?;
        let due: Vec<Row> = sqlx::query_as(&format!(
            "{SELECT} WHERE task_id = $1 AND action = $2 AND done_at IS NULL FOR UPDATE SKIP LOCKED"
        ))
        .bind(task)
        .bind(action)
        .fetch_all(&mut *tx)
        .await?;
        settle(
            state,
            &mut tx,
            due.into_iter().map(|r| (r.charge, r.attempts)).collect(),
        )
        .await?;
        tx.commit().await
    };
    if let Err(e) = settled.await {
        tracing::warn!(%task, ?action, error = %e, "settlement left to the sweep");
    }
}

/// Settles up to [`BATCH`] due settlements (each row locked, so sweeps of other replicas
/// skip it); answers how many it took.
pub async fn sweep(state: &AppState) -> Result<u64, ApiError> {
    let mut tx = state.db.begin().await?;
    let due: Vec<Row> = sqlx::query_as(&format!(
        "{SELECT} WHERE done_at IS NULL AND next_at <= $1 ORDER BY next_at LIMIT $2 FOR UPDATE SKIP LOCKED"
    ))
    .bind(now_unix())
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    let taken = due.len() as u64;
    settle(
        state,
        &mut tx,
        due.into_iter().map(|r| (r.charge, r.attempts)).collect(),
    )
    .await?;
    tx.commit().await?;
    Ok(taken)
}
