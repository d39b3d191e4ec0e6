//! Top-ups: `POST /billing/checkout` opens a hosted checkout for a pack or a custom usage
//! amount; the purchase moves pending → paid | expired | failed (never back) when Stripe
//! says so, by webhook or reconcile, and paid credits the buying key exactly once.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath, JsonBody};
use postmesh_shared::proto::GrantRequest;
use postmesh_shared::{ApiError, ApiKeyId, IdempotencyKey, Success};

use crate::catalog::{self, PackKind};
use crate::checkout::{self, Claim, Opened};
use crate::ledger;
use crate::stripe::{CheckoutSession, LineItem, Mode, NewCheckoutSession};
use crate::AppState;

/// Smallest and largest custom top-up, USD cents (spec §8).
pub const CUSTOM_AMOUNT: std::ops::RangeInclusive<i64> = 500..=100_000;

/// Purchases listed by `GET /billing/purchases`.
pub const LISTED: i64 = 50;

/// Where a purchase stands.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum PurchaseStatus {
    Pending,
    Paid,
    Expired,
    Failed,
}

/// A top-up (spec §2 Purchase); times are Unix seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Purchase {
    pub id: Uuid,
    pub pack_name: String,
    pub credits: i64,
    pub amount: i64,
    pub currency: String,
    pub kind: PackKind,
    pub status: PurchaseStatus,
    pub created_at: i64,
    pub paid_at: Option<i64>,
}

/// `{purchase}` answers.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PurchaseView {
    pub purchase: Purchase,
}

/// The answer of `GET /billing/purchases`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PurchaseList {
    pub purchases: Vec<Purchase>,
}

/// The body of `POST /billing/checkout`: exactly one of the two.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = TopUpRequest)]
pub(crate) struct CheckoutBody {
    #[schema(min_length = 1, max_length = 40)]
    pack_id: Option<String>,
    #[schema(minimum = 500, maximum = 100_000)]
    amount: Option<i64>,
}

/// What a checkout request buys, parsed.
enum Order {
    Pack(String),
    Amount(i64),
}

impl CheckoutBody {
    fn parse(self) -> Result<Order, ApiError> {
        match (self.pack_id, self.amount) {
            (Some(id), None) => {
                catalog::check_id("pack_id", &id)?;
                Ok(Order::Pack(id))
            }
            (None, Some(amount)) if CUSTOM_AMOUNT.contains(&amount) => Ok(Order::Amount(amount)),
            (None, Some(_)) => Err(ApiError::BadRequest(format!(
                "amount must be {} to {} (USD cents)",
                CUSTOM_AMOUNT.start(),
                CUSTOM_AMOUNT.end()
            ))),
            _ => Err(ApiError::BadRequest(
                "send exactly one of pack_id or amount".into(),
            )),
        }
    }
}

impl Order {
    /// The canonical text an idempotency key is bound to.
    fn request(&self) -> String {
        match self {
            Self::Pack(id) => format!("pack:{id}"),
            Self::Amount(amount) => format!("amount:{amount}"),
        }
    }
}

pub(crate) async fn create(
    State(state): State<AppState>, caller: Caller, idem: IdempotencyKey,
    JsonBody(body): JsonBody<CheckoutBody>,
) -> Result<Success<Opened>, ApiError> {
    let order = body.parse()?;
    let pack = match &order {
        Order::Pack(id) => Some(
            catalog::pack(&state.db, id)
                .await?
                .ok_or_else(|| ApiError::BadRequest(format!("no pack {id:?} is on sale")))?,
        ),
        Order::Amount(_) => None,
    };
    let payments = state.payments()?;
    let mut tx = state.db.begin().await?;
    let id = match checkout::claim(&mut tx, caller.key, &idem, &order.request()).await? {
        Claim::Done(opened) => return Ok(Success::new(opened)),
        Claim::Resume(id) => id,
        Claim::New(id) => {
            let (pack_id, name, credits, amount, currency, kind) = match (&pack, &order) {
                (Some(p), _) => (
                    Some(p.id.clone()),
                    p.name.clone(),
                    p.credits,
                    p.amount,
                    p.currency.clone(),
                    p.kind,
                ),
                (None, Order::Amount(a)) => (
                    None,
                    "Usage top-up".to_owned(),
                    0,
                    *a,
                    "usd".to_owned(),
                    PackKind::Usage,
                ),
                (None, Order::Pack(_)) => unreachable!("a pack order has its pack"),
            };
            sqlx::query(
                "INSERT INTO purchases (id, api_key_id, account_id, email, pack_id, pack_name, credits,
                                        amount, currency, kind, status, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11)",
            )
            .bind(id)
            .bind(caller.key)
            .bind(caller.account)
            .bind(&caller.email)
            .bind(pack_id)
            .bind(name)
            .bind(credits)
            .bind(amount)
            .bind(currency)
            .bind(kind)
            .bind(now_unix())
            .execute(&mut *tx)
            .await?;
            id
        }
    };
    tx.commit().await?;
    let purchase = find(&state.db, caller.key, id)
        .await?
        .ok_or_else(|| ApiError::Internal("purchase vanished".into()))?;
    let params = NewCheckoutSession {
        mode: Mode::Payment,
        line_item: LineItem::Custom {
            name: purchase.pack_name.clone(),
            amount: purchase.amount,
            currency: purchase.currency.clone(),
        },
        client_reference_id: id.to_string(),
        metadata: vec![("purchase_id", id.to_string())],
        subscription_metadata: Vec::new(),
        customer: None,
        success_url: payments.return_url(&format!("/billing/checkout/success?purchase_id={id}")),
        cancel_url: payments.return_url(&format!("/billing/checkout/cancelled?purchase_id={id}")),
    };
    let opened = checkout::open(&state.db, payments, id, caller.key, &idem, &params).await?;
    Ok(Success::new(opened))
}

const COLUMNS: &str = "id, pack_name, credits, amount, currency, kind, status, created_at, paid_at";

/// The purchase `id` of `key`; another key's purchase is none.
pub async fn find(db: &PgPool, key: ApiKeyId, id: Uuid) -> Result<Option<Purchase>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM purchases WHERE id = $1 AND api_key_id = $2"
    ))
    .bind(id)
    .bind(key)
    .fetch_optional(db)
    .await
}

pub(crate) async fn list(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<PurchaseList>, ApiError> {
    let purchases = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM purchases WHERE api_key_id = $1
         ORDER BY created_at DESC, id DESC LIMIT $2"
    ))
    .bind(caller.key)
    .bind(LISTED)
    .fetch_all(&state.db)
    .await?;
    Ok(Success::new(PurchaseList { purchases }))
}

/// The purchase `id` of `key`, or 404 (another key's purchase included).
async fn owned(db: &PgPool, key: ApiKeyId, id: Uuid) -> Result<Purchase, ApiError> {
    find(db, key, id)
        .await?
        .ok_or_else(|| ApiError::NotFound("purchase not found".into()))
}

pub(crate) async fn show(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<PurchaseView>, ApiError> {
    let purchase = owned(&state.db, caller.key, id).await?;
    Ok(Success::new(PurchaseView { purchase }))
}

pub(crate) async fn reconcile(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<PurchaseView>, ApiError> {
    let purchase = owned(&state.db, caller.key, id).await?;
    let payments = state.payments()?;
    if purchase.status != PurchaseStatus::Pending {
        return Ok(Success::new(PurchaseView { purchase }));
    }
    // No session yet (its creation failed, and nothing can have been paid), or Stripe was
    // asked a moment ago.
    let Some(session_id) = checkout::session_to_ask(&state.db, id).await? else {
        return Ok(Success::new(PurchaseView { purchase }));
    };
    let session = match payments.stripe.checkout_session(&session_id).await {
        Ok(session) => session,
        Err(e) => {
            checkout::unask(&state.db, id).await?;
            return Err(e.into());
        }
    };
    if let Some(outcome) = Outcome::of_session(&session) {
        let mut tx = state.db.begin().await?;
        apply(&mut tx, &session, outcome).await?;
        tx.commit().await?;
    }
    let purchase = owned(&state.db, caller.key, id).await?;
    Ok(Success::new(PurchaseView { purchase }))
}

/// Where a session leaves its purchase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Paid,
    Expired,
    Failed,
}

impl Outcome {
    /// What a session's own state says; `None` while it is open or awaiting an async payment.
    pub fn of_session(session: &CheckoutSession) -> Option<Self> {
        if session.is_paid() {
            Some(Self::Paid)
        } else if session.is_expired() {
            Some(Self::Expired)
        } else {
            None
        }
    }

    fn status(self) -> PurchaseStatus {
        match self {
            Self::Paid => PurchaseStatus::Paid,
            Self::Expired => PurchaseStatus::Expired,
            Self::Failed => PurchaseStatus::Failed,
        }
    }
}

/// Moves the purchase of `session` out of pending, inside `tx`; paid credits the buyer in the
/// same transaction. The row lock on the pending purchase makes a webhook and a reconcile
/// racing each other apply it once: the second finds it no longer pending. A session that is
/// not one of our purchases changes nothing.
pub async fn apply(
    tx: &mut PgConnection, session: &CheckoutSession, outcome: Outcome,
) -> Result<(), ApiError> {
    let Some(id) = checkout::of_session(tx, session, "purchase_id").await? else {
        return Ok(());
    };
    let settled: Option<(ApiKeyId, Uuid, String, PackKind, i64, i64)> = sqlx::query_as(
        "UPDATE purchases SET status = $2, paid_at = CASE WHEN $2 = 'paid' THEN $3 END,
             payment_intent = CASE WHEN $2 = 'paid' THEN $6 END
         WHERE id = $1 AND status = 'pending'
           AND ($2 <> 'paid' OR (amount = $4 AND currency = $5))
         RETURNING api_key_id, account_id, email, kind, credits, amount",
    )
    .bind(id)
    .bind(outcome.status())
    .bind(now_unix())
    .bind(session.amount_total.unwrap_or(-1))
    .bind(session.currency.as_deref().unwrap_or_default())
    .bind(session.payment_intent.as_deref())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((key, account, email, kind, credits, amount)) = settled else {
        if outcome == Outcome::Paid {
            // Money taken that buys nothing (another amount or currency, or a purchase
            // already ended): an operator refunds or grants by hand.
            tracing::error!(purchase = %id, session = %session.id, amount = ?session.amount_total, currency = ?session.currency, "a paid session matches no pending purchase of its amount; nothing granted");
        }
        return Ok(());
    };
    tracing::info!(purchase = %id, status = ?outcome, "purchase settled");
    if outcome != Outcome::Paid {
        return Ok(());
    }
    let grant_key = format!("purchase:{id}");
    match kind {
        PackKind::Credits => {
            ledger::grant(
                tx,
                &GrantRequest {
                    api_key_id: key.to_string(),
                    account_id: account.to_string(),
                    email,
                    credits,
                    idempotency_key: grant_key,
                },
            )
            .await?;
        }
        PackKind::Usage => {
            ledger::grant_usage(tx, key, &grant_key, amount * ledger::NANO_PER_CENT).await?;
        }
    }
    // A refund or dispute heard of before the payment itself takes its part back now.
    if let Some(intent) = &session.payment_intent {
        crate::reversals::settle(tx, intent).await?;
    }
    Ok(())
}
