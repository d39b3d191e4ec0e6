//! Money Stripe gave back to a buyer — a refund, a chargeback — takes back what it paid for:
//! its purchase's credits (or usage money) in proportion, as far as the key has them left.

use serde::Deserialize;
use sqlx::PgConnection;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::ApiKeyId;

use crate::catalog::PackKind;
use crate::ledger;

/// A `charge.refunded` event's charge: the running total refunded of its payment.
#[derive(Deserialize)]
pub struct Charge {
    pub payment_intent: Option<String>,
    pub amount_refunded: i64,
}

/// A `charge.dispute.*` event's dispute: what the buyer's bank took back (beyond what was
/// refunded), and where the dispute stands.
#[derive(Deserialize)]
pub struct Dispute {
    pub payment_intent: Option<String>,
    pub amount: i64,
    pub status: String,
}

impl Dispute {
    /// An inquiry (`warning_…`): the bank asks, no money has moved.
    pub fn is_inquiry(&self) -> bool {
        self.status.starts_with("warning_")
    }
}

/// Money Stripe says went back of one payment: each kind's running total, in cents.
#[derive(Debug, Clone, Copy)]
pub enum GivenBack {
    /// A `charge.refunded` charge's `amount_refunded`.
    Refunded(i64),
    /// A chargeback's `amount` (`charge.dispute.created`, `charge.dispute.funds_withdrawn`).
    Disputed(i64),
    /// The seller won the dispute (`charge.dispute.funds_reinstated`, or `closed` as `won`):
    /// its money came back, and a dispute told of later is an older state.
    DisputeWon,
}

/// Records what went back of payment `intent` (of each kind the most said so far counts, so
/// a delivery out of order takes nothing twice) and takes back what its purchase paid for
/// once the purchase is known here.
pub async fn record(
    tx: &mut PgConnection, intent: &str, given: GivenBack,
) -> Result<(), sqlx::Error> {
    let (refunded, disputed, won) = match given {
        GivenBack::Refunded(cents) => (cents.max(0), 0, false),
        GivenBack::Disputed(cents) => (0, cents.max(0), false),
        GivenBack::DisputeWon => (0, 0, true),
    };
    sqlx::query(
        "INSERT INTO stripe_reversals (payment_intent, refunded, disputed, dispute_won,
                                       updated_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (payment_intent) DO UPDATE
             SET refunded = GREATEST(stripe_reversals.refunded, EXCLUDED.refunded),
                 dispute_won = stripe_reversals.dispute_won OR EXCLUDED.dispute_won,
                 disputed = CASE WHEN stripe_reversals.dispute_won OR EXCLUDED.dispute_won
                                 THEN 0
                                 ELSE GREATEST(stripe_reversals.disputed, EXCLUDED.disputed)
                            END,
                 updated_at = EXCLUDED.updated_at",
    )
    .bind(intent)
    .bind(refunded)
    .bind(disputed)
    .bind(won)
    .bind(now_unix())
    .execute(&mut *tx)
    .await?;
    settle(tx, intent).await
}

/// A paid purchase with what was given back of its payment.
#[derive(sqlx::FromRow)]
struct Reversed {
    id: Uuid,
    api_key_id: ApiKeyId,
    email: String,
    kind: PackKind,
    credits: i64,
    amount: i64,
    /// Cents taken back before.
    reversed_amount: i64,
    /// What its reversals actually took: credits, or nano-USD of usage money.
    reversed_units: i64,
    /// Its reversals so far, each a ledger entry of its own.
    reversals: i32,
    /// Cents given back now, at most what was paid.
    given_back: i64,
}

/// Takes back from the paid purchase of payment `intent` what was given back of it beyond
/// what was taken before, in proportion to what it cost; when less is given back than
/// before (a dispute won), gives back what was taken beyond the new share.
///
/// The payment's refund and its purchase's payment are settled one after the other: each
/// holds the payment's lock until it commits, so the later one reads what the earlier wrote
/// (without it, a refund and its payment settled at once each missed the other).
pub async fn settle(tx: &mut PgConnection, intent: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('stripe payment ' || $1, 0))")
        .bind(intent)
        .execute(&mut *tx)
        .await?;
    let row: Option<Reversed> = sqlx::query_as(
        "SELECT p.id, p.api_key_id, p.email, p.kind, p.credits, p.amount, p.reversed_amount,
                p.reversed_units, p.reversals,
                LEAST(r.refunded + r.disputed, p.amount) AS given_back
         FROM purchases p JOIN stripe_reversals r ON r.payment_intent = p.payment_intent
         WHERE p.payment_intent = $1 AND p.status = 'paid'
         FOR UPDATE OF p",
    )
    .bind(intent)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(p) = row.filter(|p| p.given_back != p.reversed_amount && p.amount > 0) else {
        return Ok(());
    };
    let units = match p.kind {
        PackKind::Credits => p.credits,
        PackKind::Usage => p.amount * ledger::NANO_PER_CENT,
    };
    let share = |cents: i64| units * cents / p.amount;
    let due = if p.given_back > p.reversed_amount {
        share(p.given_back) - share(p.reversed_amount)
    } else {
        // Back only what was taken beyond the new share (what was spent was never taken).
        -(p.reversed_units - share(p.given_back)).max(0)
    };
    let key = format!("reversal:{}:#{}", p.id, p.reversals + 1);
    let taken = match p.kind {
        PackKind::Credits => ledger::reverse(tx, p.api_key_id, &key, due, &p.email).await?,
        PackKind::Usage => ledger::reverse_usage(tx, p.api_key_id, &key, due).await?,
    };
    sqlx::query(
        "UPDATE purchases SET reversed_amount = $2, reversed_units = reversed_units + $3,
                              reversals = reversals + 1
         WHERE id = $1",
    )
    .bind(p.id)
    .bind(p.given_back)
    .bind(taken)
    .execute(&mut *tx)
    .await?;
    tracing::warn!(purchase = %p.id, cents = p.given_back - p.reversed_amount, taken,
        "money of a payment went back to its buyer (or came back to us): what it bought follows, as far as it is left");
    Ok(())
}
