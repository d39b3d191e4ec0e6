//! `POST /billing/webhooks/stripe`: Stripe's signed events. Each event is applied once, in the
//! transaction that records its id; what it needs from Stripe (the subscription as it is now)
//! is fetched first, so events arriving out of order still leave Stripe's current state.

use axum::extract::State;
use axum::http::HeaderMap;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use postmesh_shared::db::now_unix;
use postmesh_shared::{ApiError, Success};

use crate::purchases::{self, Outcome};
use crate::stripe::{self, CheckoutSession, Subscription};
use crate::{reversals, subscriptions, AppState};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "stripe-signature";

/// The answer to Stripe.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StripeEventReceived)]
pub struct Received {
    /// True when this event id was applied before: nothing changed.
    pub duplicate: bool,
}

#[derive(Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: EventData,
}

#[derive(Deserialize)]
struct EventData {
    object: Value,
}

/// An event, parsed, with what it needs from Stripe already fetched.
enum Change {
    Purchase(CheckoutSession, Outcome),
    SubscriptionCheckout(CheckoutSession, Option<Subscription>),
    Subscription(Subscription),
    /// Cents of a payment given back to its buyer.
    Reversal(String, reversals::GivenBack),
    Nothing,
}

fn parse<T: serde::de::DeserializeOwned>(object: Value) -> Result<T, ApiError> {
    serde_json::from_value(object)
        .map_err(|e| ApiError::BadRequest(format!("unexpected event object: {e}")))
}

pub(crate) async fn receive(
    State(state): State<AppState>, headers: HeaderMap, body: Bytes,
) -> Result<Success<Received>, ApiError> {
    let secret = state
        .webhook_secret
        .as_deref()
        .ok_or_else(|| ApiError::Unavailable("Stripe webhooks are not configured".into()))?;
    let signature = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::BadRequest("the Stripe-Signature header is missing".into()))?;
    stripe::verify_signature(signature, &body, secret, now_unix())
        .map_err(|e| ApiError::BadRequest(format!("invalid signature: {e}")))?;
    let event: Event = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("invalid event: {e}")))?;
    if seen(&state, &event.id).await? {
        return Ok(Success::new(Received { duplicate: true }));
    }
    let change = prepare(&state, event.kind.as_str(), event.data.object).await?;
    let mut tx = state.db.begin().await?;
    // A concurrent delivery of the same event waits on this row and then finds it taken.
    let fresh = sqlx::query(
        "INSERT INTO stripe_events (id, type, received_at) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING",
    )
    .bind(&event.id)
    .bind(&event.kind)
    .bind(now_unix())
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !fresh {
        return Ok(Success::new(Received { duplicate: true }));
    }
    match change {
        Change::Purchase(session, outcome) => purchases::apply(&mut tx, &session, outcome).await?,
        Change::SubscriptionCheckout(session, sub) => {
            subscriptions::apply_checkout(&mut tx, &session, sub.as_ref()).await?
        }
        Change::Subscription(sub) => subscriptions::record(&mut tx, &sub, None).await?,
        Change::Reversal(intent, given) => reversals::record(&mut tx, &intent, given).await?,
        Change::Nothing => tracing::debug!(event = %event.id, kind = %event.kind, "event ignored"),
    }
    tx.commit().await?;
    Ok(Success::new(Received { duplicate: false }))
}

/// Whether event `id` was applied before (a redelivery needs nothing fetched).
async fn seen(state: &AppState, id: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM stripe_events WHERE id = $1)")
        .bind(id)
        .fetch_one(&state.db)
        .await
}

/// Reads what `kind` means for us, fetching the subscription it concerns as it is now. Stripe
/// being down is a 503, so Stripe delivers the event again later.
async fn prepare(state: &AppState, kind: &str, object: Value) -> Result<Change, ApiError> {
    let fetch = |id: String| async move {
        let payments = state.payments()?;
        Ok::<_, ApiError>(payments.stripe.subscription(&id).await?)
    };
    Ok(match kind {
        "checkout.session.completed"
        | "checkout.session.async_payment_succeeded"
        | "checkout.session.async_payment_failed"
        | "checkout.session.expired" => {
            let session: CheckoutSession = parse(object)?;
            if session.mode == "subscription" {
                let sub = match (&session.subscription, kind) {
                    (Some(id), "checkout.session.completed") => Some(fetch(id.clone()).await?),
                    _ => None,
                };
                Change::SubscriptionCheckout(session, sub)
            } else {
                let outcome = match kind {
                    "checkout.session.async_payment_failed" => Some(Outcome::Failed),
                    "checkout.session.expired" => Some(Outcome::Expired),
                    _ => Outcome::of_session(&session),
                };
                match outcome {
                    Some(outcome) => Change::Purchase(session, outcome),
                    None => Change::Nothing,
                }
            }
        }
        // Deletion is final, so the event's own object is the truth.
        "customer.subscription.deleted" => Change::Subscription(parse(object)?),
        "customer.subscription.created" | "customer.subscription.updated" => {
            let id = object["id"].as_str().unwrap_or_default().to_owned();
            Change::Subscription(fetch(id).await?)
        }
        "invoice.paid" => {
            // The subscription is on the invoice before API version 2025-03-31, under
            // `parent.subscription_details` since.
            let id = object["subscription"]
                .as_str()
                .or(object["parent"]["subscription_details"]["subscription"].as_str());
            match id {
                Some(id) => Change::Subscription(fetch(id.to_owned()).await?),
                None => Change::Nothing,
            }
        }
        // Money given back: a refund's running total, a dispute's amount.
        "charge.refunded" => {
            let charge: reversals::Charge = parse(object)?;
            match charge.payment_intent {
                Some(intent) => Change::Reversal(
                    intent,
                    reversals::GivenBack::Refunded(charge.amount_refunded),
                ),
                None => Change::Nothing,
            }
        }
        // A chargeback takes its money when it is opened (an inquiry takes none until it
        // becomes one: funds withdrawn); a dispute won gives it back.
        "charge.dispute.created"
        | "charge.dispute.funds_withdrawn"
        | "charge.dispute.funds_reinstated"
        | "charge.dispute.closed" => {
            let dispute: reversals::Dispute = parse(object)?;
            let given = match kind {
                "charge.dispute.created" if dispute.is_inquiry() => None,
                "charge.dispute.created" | "charge.dispute.funds_withdrawn" => {
                    Some(reversals::GivenBack::Disputed(dispute.amount))
                }
                "charge.dispute.closed" if dispute.status != "won" => None,
                _ => Some(reversals::GivenBack::DisputeWon),
            };
            match (dispute.payment_intent, given) {
                (Some(intent), Some(given)) => Change::Reversal(intent, given),
                _ => Change::Nothing,
            }
        }
        _ => Change::Nothing,
    })
}
