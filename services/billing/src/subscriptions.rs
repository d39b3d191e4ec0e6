//! Plans: `POST /billing/subscription/checkout` opens a hosted subscription checkout,
//! reconcile re-checks it, the portal manages the subscription; the subscription itself
//! follows what Stripe reports (status, period, cancel at period end; deleted means no plan).

use std::time::Duration;

use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use postmesh_contracts::answers::billing::SubscriptionStatus;
use postmesh_shared::db::now_unix;
use postmesh_shared::extract::{Caller, IdPath, JsonBody};
use postmesh_shared::{ApiError, IdempotencyKey, Success, WorkspaceId};

use crate::catalog;
use crate::checkout::{self, Claim, Opened};
use crate::stripe::{
    CheckoutSession, LineItem, Mode, NewCheckoutSession, StripeError, Subscription,
};
use crate::{AppState, Payments};

/// The statuses of a subscription that is over, bound as a text array.
fn ended() -> [&'static str; 2] {
    SubscriptionStatus::ENDED.map(SubscriptionStatus::as_str)
}

/// Where a subscription checkout stands.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum CheckoutStatus {
    Pending,
    Complete,
    Expired,
}

/// A subscription checkout (spec §2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SubscriptionCheckout {
    pub id: Uuid,
    pub status: CheckoutStatus,
}

/// The answer of the subscription reconcile.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SubscriptionCheckoutView)]
pub struct CheckoutView {
    pub checkout: SubscriptionCheckout,
}

/// The answer of the portal.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortalLink {
    pub url: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = SubscriptionCheckoutRequest)]
pub(crate) struct CheckoutBody {
    #[schema(min_length = 1, max_length = 40)]
    plan_id: String,
}

/// A workspace's plan as Stripe last reported it, with the plan's limits.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct CurrentPlan {
    pub plan_id: Option<String>,
    pub name: Option<String>,
    pub status: SubscriptionStatus,
    pub period_start: i64,
    pub period_end: i64,
    pub cancel_at_period_end: bool,
    pub mailboxes: Option<i64>,
    pub custom_domains: Option<i64>,
    pub monthly_emails: Option<i64>,
}

impl CurrentPlan {
    /// Whether the plan's limits apply (an unpaid or paused plan falls back to the free ones).
    pub fn in_force(&self) -> bool {
        self.status.limits_apply() && self.plan_id.is_some()
    }
}

/// The workspace's subscription that is not over, if any.
pub async fn current(
    db: impl sqlx::PgExecutor<'_>, workspace: WorkspaceId,
) -> Result<Option<CurrentPlan>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.plan_id, p.name, s.status, s.period_start, s.period_end, s.cancel_at_period_end,
                p.mailboxes, p.custom_domains, p.monthly_emails
         FROM subscriptions s LEFT JOIN plans p ON p.id = s.plan_id
         WHERE s.workspace_id = $1 AND s.status <> ALL($2)
         ORDER BY s.created_at DESC LIMIT 1",
    )
    .bind(workspace)
    .bind(&ended()[..])
    .fetch_optional(db)
    .await
}

pub(crate) async fn create_checkout(
    State(state): State<AppState>, caller: Caller, idem: IdempotencyKey,
    JsonBody(body): JsonBody<CheckoutBody>,
) -> Result<Success<Opened>, ApiError> {
    catalog::check_id("plan_id", &body.plan_id)?;
    let (plan, price) = catalog::plan_for_sale(&state.db, &body.plan_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no plan {:?}", body.plan_id)))?;
    let payments = state.payments()?;
    let mut tx = state.db.begin().await?;
    let id = match checkout::claim(&mut tx, caller.key, &idem, &format!("plan:{}", plan.id)).await?
    {
        Claim::Done(opened) => return Ok(Success::new(opened)),
        Claim::Resume(id) => id,
        Claim::New(id) => {
            // Checked in the claim's transaction: a rejected request leaves no checkout.
            if current(&mut *tx, caller.workspace).await?.is_some() {
                return Err(ApiError::Conflict(
                    "the workspace already has a plan".into(),
                ));
            }
            sqlx::query(
                "INSERT INTO subscription_checkouts (id, workspace_id, plan_id, status, created_at)
                 VALUES ($1, $2, $3, 'pending', $4)",
            )
            .bind(id)
            .bind(caller.workspace)
            .bind(&plan.id)
            .bind(now_unix())
            .execute(&mut *tx)
            .await?;
            id
        }
    };
    tx.commit().await?;
    let params = NewCheckoutSession {
        mode: Mode::Subscription,
        line_item: LineItem::Price(price),
        client_reference_id: id.to_string(),
        metadata: vec![("checkout_id", id.to_string())],
        subscription_metadata: vec![
            ("workspace_id", caller.workspace.to_string()),
            ("plan_id", plan.id.clone()),
        ],
        customer: customer_of(&state.db, caller.workspace).await?,
        success_url: payments
            .return_url(&format!("/billing/subscription/success?checkout_id={id}")),
        cancel_url: payments
            .return_url(&format!("/billing/subscription/cancelled?checkout_id={id}")),
    };
    // One plan checkout of a workspace opens at a time: the next one waits for this one's
    // session, so it sees it and expires it (two opening at once could both be paid).
    let mut turn = plan_turn(&state.db, caller.workspace).await?;
    // Asked again in turn: a checkout retried (its first try met Stripe down), or one that
    // waited for another, may come after the workspace got its plan.
    if current(&mut *turn, caller.workspace).await?.is_some() {
        return Err(ApiError::Conflict(
            "the workspace already has a plan".into(),
        ));
    }
    expire_others(&state.db, payments, caller.workspace, id).await?;
    let opened = checkout::open(&state.db, payments, id, caller.key, &idem, &params).await?;
    turn.commit().await?;
    Ok(Success::new(opened))
}

/// How long a plan checkout waits for its workspace's turn before it is a 409.
const TURN_WAIT: Duration = Duration::from_secs(30);
/// The pause between two asks for the turn.
const TURN_POLL: Duration = Duration::from_millis(50);

/// The transaction that holds `workspace`'s plan-checkout lock, once no other does. It is
/// asked for with `pg_try_advisory_xact_lock`, the connection given back between asks: a
/// wait in `pg_advisory_xact_lock` held one, so a dozen checkouts of one workspace at once
/// took the whole pool, and every charge waited for one in vain.
async fn plan_turn(
    db: &PgPool, workspace: WorkspaceId,
) -> Result<Transaction<'static, Postgres>, ApiError> {
    let deadline = tokio::time::Instant::now() + TURN_WAIT;
    loop {
        let mut turn = db.begin().await?;
        let taken: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('plan checkout ' || $1, 0))",
        )
        .bind(workspace.to_string())
        .fetch_one(&mut *turn)
        .await?;
        if taken {
            return Ok(turn);
        }
        drop(turn);
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::Conflict(
                "another plan checkout of this workspace is opening; try again".into(),
            ));
        }
        tokio::time::sleep(TURN_POLL).await;
    }
}

/// Expires at Stripe the workspace's other plan checkouts still open, so that only the
/// newest can be paid (two paid ones would be two subscriptions). One found paid meanwhile
/// means the plan is on its way: 409.
async fn expire_others(
    db: &PgPool, payments: &Payments, workspace: WorkspaceId, newest: Uuid,
) -> Result<(), ApiError> {
    let open: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT s.id, c.session_id FROM subscription_checkouts s JOIN checkouts c ON c.id = s.id
         WHERE s.workspace_id = $1 AND s.status = 'pending' AND s.id <> $2
           AND c.session_id IS NOT NULL",
    )
    .bind(workspace)
    .bind(newest)
    .fetch_all(db)
    .await?;
    for (id, session) in open {
        let status = match payments.stripe.expire_checkout_session(&session).await {
            Ok(expired) => expired.status,
            // Not open any more: paid, or expired already.
            Err(StripeError::Rejected { .. }) => {
                payments.stripe.checkout_session(&session).await?.status
            }
            Err(e) => return Err(e.into()),
        };
        if status.as_deref() == Some("complete") {
            return Err(ApiError::Conflict(
                "another plan checkout of this workspace was just paid".into(),
            ));
        }
        sqlx::query(
            "UPDATE subscription_checkouts SET status = $2 WHERE id = $1 AND status = 'pending'",
        )
        .bind(id)
        .bind(CheckoutStatus::Expired)
        .execute(db)
        .await?;
    }
    Ok(())
}

/// The Stripe customer of the workspace's latest subscription, ended or not.
async fn customer_of(db: &PgPool, workspace: WorkspaceId) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT customer_id FROM subscriptions WHERE workspace_id = $1
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(workspace)
    .fetch_optional(db)
    .await
}

async fn find_checkout(
    db: &PgPool, workspace: WorkspaceId, id: Uuid,
) -> Result<Option<SubscriptionCheckout>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, status FROM subscription_checkouts WHERE id = $1 AND workspace_id = $2",
    )
    .bind(id)
    .bind(workspace)
    .fetch_optional(db)
    .await
}

pub(crate) async fn reconcile(
    State(state): State<AppState>, caller: Caller, IdPath(id): IdPath<Uuid>,
) -> Result<Success<CheckoutView>, ApiError> {
    let not_found = || ApiError::NotFound("subscription checkout not found".into());
    let checkout = find_checkout(&state.db, caller.workspace, id)
        .await?
        .ok_or_else(not_found)?;
    let payments = state.payments()?;
    if checkout.status != CheckoutStatus::Pending {
        return Ok(Success::new(CheckoutView { checkout }));
    }
    let Some(session_id) = checkout::session_to_ask(&state.db, id).await? else {
        return Ok(Success::new(CheckoutView { checkout }));
    };
    let asked = async {
        let session = payments.stripe.checkout_session(&session_id).await?;
        let subscription = match (&session.subscription, session.status.as_deref()) {
            (Some(sub), Some("complete")) => Some(payments.stripe.subscription(sub).await?),
            _ => None,
        };
        Ok::<_, crate::stripe::StripeError>((session, subscription))
    };
    let (session, subscription) = match asked.await {
        Ok(asked) => asked,
        Err(e) => {
            checkout::unask(&state.db, id).await?;
            return Err(e.into());
        }
    };
    let mut tx = state.db.begin().await?;
    apply_checkout(&mut tx, &session, subscription.as_ref()).await?;
    tx.commit().await?;
    let checkout = find_checkout(&state.db, caller.workspace, id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Success::new(CheckoutView { checkout }))
}

pub(crate) async fn portal(
    State(state): State<AppState>, caller: Caller,
) -> Result<Success<PortalLink>, ApiError> {
    let customer = customer_of(&state.db, caller.workspace)
        .await?
        .ok_or_else(|| ApiError::NotFound("the workspace has no subscription".into()))?;
    let payments = state.payments()?;
    let session = payments
        .stripe
        .create_portal_session(&customer, &payments.return_url("/billing"))
        .await?;
    Ok(Success::new(PortalLink { url: session.url }))
}

/// Applies a subscription-mode checkout session inside `tx`: complete (with the subscription
/// it created) or expired; a checkout that is no longer pending stays as it is.
pub async fn apply_checkout(
    tx: &mut PgConnection, session: &CheckoutSession, subscription: Option<&Subscription>,
) -> Result<(), ApiError> {
    let Some(id) = checkout::of_session(tx, session, "checkout_id").await? else {
        return Ok(());
    };
    let status = match (session.status.as_deref(), subscription) {
        (Some("complete"), Some(_)) => CheckoutStatus::Complete,
        (Some("expired"), _) => CheckoutStatus::Expired,
        _ => return Ok(()),
    };
    let workspace: Option<WorkspaceId> = sqlx::query_scalar(
        "UPDATE subscription_checkouts SET status = $2 WHERE id = $1 AND status = 'pending'
         RETURNING workspace_id",
    )
    .bind(id)
    .bind(status)
    .fetch_optional(&mut *tx)
    .await?;
    if let (Some(workspace), Some(sub)) = (workspace, subscription) {
        record(tx, sub, Some(workspace)).await?;
    }
    Ok(())
}

/// Stores `sub` as Stripe reports it now. Its workspace comes from its metadata, else from
/// `workspace`, else from the row already stored; a subscription of no workspace is ignored.
/// An ended subscription never comes back, and a read asked before the stored one (answered
/// late) leaves it, unless it ends the subscription.
pub async fn record(
    tx: &mut PgConnection, sub: &Subscription, workspace: Option<WorkspaceId>,
) -> Result<(), ApiError> {
    let workspace = match sub
        .metadata
        .get("workspace_id")
        .and_then(|w| WorkspaceId::parse(w))
        .or(workspace)
    {
        Some(w) => Some(w),
        None => {
            sqlx::query_scalar("SELECT workspace_id FROM subscriptions WHERE id = $1")
                .bind(&sub.id)
                .fetch_optional(&mut *tx)
                .await?
        }
    };
    let Some(workspace) = workspace else {
        tracing::info!(subscription = %sub.id, "subscription of no workspace; ignored");
        return Ok(());
    };
    let plan: Option<String> = match sub.price_id() {
        Some(price) => {
            sqlx::query_scalar("SELECT id FROM plans WHERE stripe_price_id = $1")
                .bind(price)
                .fetch_optional(&mut *tx)
                .await?
        }
        None => None,
    };
    if plan.is_none() {
        tracing::warn!(subscription = %sub.id, price = ?sub.price_id(), "subscription price is in no plan");
    }
    let (start, end) = sub.period();
    let now = now_unix();
    sqlx::query(
        "INSERT INTO subscriptions (id, workspace_id, customer_id, plan_id, status, period_start,
                                    period_end, cancel_at_period_end, created_at, updated_at,
                                    asked_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $11)
         ON CONFLICT (id) DO UPDATE SET customer_id = $3, plan_id = COALESCE($4, subscriptions.plan_id),
             status = $5, period_start = $6, period_end = $7, cancel_at_period_end = $8, updated_at = $9,
             asked_at = GREATEST(subscriptions.asked_at, $11)
         WHERE subscriptions.status <> ALL($10)
           AND (subscriptions.asked_at <= $11 OR $5 = ANY($10))",
    )
    .bind(&sub.id)
    .bind(workspace)
    .bind(&sub.customer)
    .bind(plan)
    .bind(sub.status)
    .bind(start)
    .bind(end)
    .bind(sub.cancel_at_period_end)
    .bind(now)
    .bind(&ended()[..])
    .bind(sub.asked_at)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
