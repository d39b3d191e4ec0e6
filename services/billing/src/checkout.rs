//! Hosted checkouts, top-up or plan: one row per `(API key, idempotency-key)` holding the
//! request it stands for, and the Stripe Checkout Session opened for it exactly once
//! (policy in `docs/decisions.md`, "Checkouts").

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::{ApiError, ApiKeyId, IdempotencyKey};

use crate::stripe::{CheckoutSession, NewCheckoutSession};
use crate::Payments;

/// Seconds one request holds the right to open a checkout's session; longer than a Stripe call.
pub const OPENING_LEASE_SECS: i64 = 30;
/// Seconds a checkout whose session was never opened can still be opened with its key: a
/// day, as long as Stripe keeps an idempotency key and a Checkout Session lives.
pub const UNOPENED_SECS: i64 = 24 * 3600;
/// Checkouts one call of [`expire_unopened`] expires at most.
pub const EXPIRE_BATCH: u64 = 100;

/// What an idempotency key stands for when a checkout request arrives.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// A new checkout, inserted in the caller's transaction; this request opens its session.
    New(Uuid),
    /// An earlier request with this key failed before its session was recorded; this request
    /// now opens it.
    Resume(Uuid),
    /// The session exists: the first answer, again.
    Done(Opened),
}

/// The answer of both checkout endpoints: the checkout and its hosted payment page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = CheckoutOpened)]
pub struct Opened {
    pub id: Uuid,
    pub url: String,
}

/// Claims `idem` of `key` for `request` (a canonical text of the body) inside `tx`. The same
/// key with another request, or while another request with it is opening the session, is 409.
pub async fn claim(
    tx: &mut PgConnection, key: ApiKeyId, idem: &IdempotencyKey, request: &str,
) -> Result<Claim, ApiError> {
    let now = now_unix();
    let id = Uuid::now_v7();
    // A concurrent insert of the same key waits here until the other transaction ends.
    let inserted = sqlx::query(
        "INSERT INTO checkouts (id, api_key_id, idempotency_key, request, creating_until, created_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (api_key_id, idempotency_key) DO NOTHING",
    )
    .bind(id)
    .bind(key)
    .bind(idem.as_str())
    .bind(request)
    .bind(now + OPENING_LEASE_SECS)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(Claim::New(id));
    }
    let (id, earlier, url, creating_until, expired_at): (
        Uuid,
        String,
        Option<String>,
        Option<i64>,
        Option<i64>,
    ) = sqlx::query_as(
        "SELECT id, request, url, creating_until, expired_at FROM checkouts
             WHERE api_key_id = $1 AND idempotency_key = $2 FOR UPDATE",
    )
    .bind(key)
    .bind(idem.as_str())
    .fetch_one(&mut *tx)
    .await?;
    if earlier != request {
        return Err(ApiError::Conflict(
            "this idempotency-key was used for a different request".into(),
        ));
    }
    if let Some(url) = url {
        return Ok(Claim::Done(Opened { id, url }));
    }
    if expired_at.is_some() {
        return Err(ApiError::Conflict(
            "this checkout expired before its payment page was opened; use a new idempotency-key"
                .into(),
        ));
    }
    if creating_until.is_some_and(|until| until > now) {
        return Err(ApiError::Conflict(
            "a request with this idempotency-key is in progress".into(),
        ));
    }
    sqlx::query("UPDATE checkouts SET creating_until = $2 WHERE id = $1")
        .bind(id)
        .bind(now + OPENING_LEASE_SECS)
        .execute(&mut *tx)
        .await?;
    Ok(Claim::Resume(id))
}

/// Opens the Stripe Checkout Session of checkout `id` and records it. Stripe sees our key
/// namespaced by the API key, so two callers' keys never collide there. On failure the lease
/// is given up, so a retry with the same key opens it.
pub async fn open(
    db: &PgPool, payments: &Payments, id: Uuid, key: ApiKeyId, idem: &IdempotencyKey,
    params: &NewCheckoutSession,
) -> Result<Opened, ApiError> {
    let stripe_key = format!("{key}:{}", idem.as_str());
    let session = match payments
        .stripe
        .create_checkout_session(params, &stripe_key)
        .await
    {
        Ok(session) => session,
        Err(e) => {
            sqlx::query("UPDATE checkouts SET creating_until = 0 WHERE id = $1 AND url IS NULL")
                .bind(id)
                .execute(db)
                .await?;
            return Err(e.into());
        }
    };
    let url = session
        .url
        .ok_or_else(|| ApiError::BadGateway("the payment processor sent no checkout URL".into()))?;
    sqlx::query(
        "UPDATE checkouts SET session_id = $2, url = $3, creating_until = NULL WHERE id = $1",
    )
    .bind(id)
    .bind(&session.id)
    .bind(&url)
    .execute(db)
    .await?;
    Ok(Opened { id, url })
}

/// The checkout `session` was opened for: its `client_reference_id`, else
/// `metadata[metadata_key]`. A checkout with no session recorded (the answer that carried it
/// was lost) gets it now; a session that is not its checkout's, or of no checkout, is `None`.
pub async fn of_session(
    tx: &mut PgConnection, session: &CheckoutSession, metadata_key: &str,
) -> Result<Option<Uuid>, sqlx::Error> {
    let reference = session
        .client_reference_id
        .as_deref()
        .or(session.metadata.get(metadata_key).map(String::as_str));
    let Some(id) = reference.and_then(|r| Uuid::parse_str(r).ok()) else {
        tracing::info!(session = %session.id, "checkout session of no checkout of ours; ignored");
        return Ok(None);
    };
    let recorded: Option<Option<String>> = sqlx::query_scalar(
        "UPDATE checkouts SET session_id = COALESCE(session_id, $2)
         WHERE id = $1 RETURNING session_id",
    )
    .bind(id)
    .bind(&session.id)
    .fetch_optional(&mut *tx)
    .await?;
    if recorded.flatten().as_deref() == Some(session.id.as_str()) {
        Ok(Some(id))
    } else {
        tracing::warn!(session = %session.id, checkout = %id, "session does not belong to the checkout; ignored");
        Ok(None)
    }
}

/// Expires checkouts, top-ups and plan checkouts, whose session was never opened within
/// [`UNOPENED_SECS`] (and that no request is opening), at most [`EXPIRE_BATCH`]; how many.
/// Replicas running this at once take different rows.
pub async fn expire_unopened(db: &PgPool) -> Result<u64, sqlx::Error> {
    let now = now_unix();
    let expired: Vec<Uuid> = sqlx::query_scalar(
        "WITH stale AS (
             UPDATE checkouts SET expired_at = $1, creating_until = NULL
             WHERE id IN (SELECT id FROM checkouts
                          WHERE url IS NULL AND expired_at IS NULL AND created_at < $1 - $2
                            AND COALESCE(creating_until, 0) < $1
                          ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)
             RETURNING id
         ), top_ups AS (
             UPDATE purchases SET status = 'expired'
             WHERE id IN (SELECT id FROM stale) AND status = 'pending'
         ), plans AS (
             UPDATE subscription_checkouts SET status = 'expired'
             WHERE id IN (SELECT id FROM stale) AND status = 'pending'
         )
         SELECT id FROM stale",
    )
    .bind(now)
    .bind(UNOPENED_SECS)
    .bind(EXPIRE_BATCH as i64)
    .fetch_all(db)
    .await?;
    if !expired.is_empty() {
        tracing::info!(count = expired.len(), "checkouts never opened expired");
    }
    Ok(expired.len() as u64)
}

/// Seconds between two reconciles of a checkout that ask Stripe; one sooner answers what is
/// stored.
pub const RECONCILE_EVERY_SECS: i64 = 5;

/// The session of checkout `id` for a reconcile to ask Stripe about, unless it has none or
/// one was asked about within [`RECONCILE_EVERY_SECS`] (all replicas together): a client
/// looping reconciles must not spend the platform's Stripe rate limit, which every other
/// customer's checkouts and webhooks share.
pub async fn session_to_ask(db: &PgPool, id: Uuid) -> Result<Option<String>, sqlx::Error> {
    let now = now_unix();
    sqlx::query_scalar(
        "UPDATE checkouts SET asked_at = $2
         WHERE id = $1 AND session_id IS NOT NULL
           AND (asked_at IS NULL OR asked_at <= $2 - $3)
         RETURNING session_id",
    )
    .bind(id)
    .bind(now)
    .bind(RECONCILE_EVERY_SECS)
    .fetch_optional(db)
    .await
}

/// Lets the next reconcile of checkout `id` ask Stripe at once: this one's asking failed.
pub async fn unask(db: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE checkouts SET asked_at = NULL WHERE id = $1")
        .bind(id)
        .execute(db)
        .await
        .map(drop)
}
