//! `POST /deduct`: takes 1 credit from the calling key, once per `idempotencyKey`.

use axum::extract::State;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use postmesh_shared::extract::Caller;
use postmesh_shared::proto::ChargeRequest;
use postmesh_shared::{ApiError, EmailAddress, Success};

use crate::AppState;

/// The answer of `POST /deduct`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Deducted {
    pub message: String,
    pub balance: i64,
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeductBody {
    #[schema(format = Email)]
    target_email: Option<String>,
    #[schema(min_length = 1, max_length = 100)]
    idempotency_key: Option<String>,
}

pub(crate) async fn deduct(
    State(state): State<AppState>, caller: Caller, body: Bytes,
) -> Result<Success<Deducted>, ApiError> {
    // The body is optional: empty means "no target, no idempotency key".
    let body: DeductBody = if body.iter().all(u8::is_ascii_whitespace) {
        DeductBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("invalid body: {e}")))?
    };
    let target = match body.target_email.as_deref() {
        None => None,
        Some(t) => Some(EmailAddress::parse(t).ok_or_else(|| {
            ApiError::BadRequest("targetEmail is not a valid email address".into())
        })?),
    };
    if caller.test {
        return Err(ApiError::Forbidden(
            "a test key charges nothing: /deduct needs a live key".into(),
        ));
    }
    let idem = match body.idempotency_key {
        Some(k) if k.is_empty() || k.chars().count() > 100 => {
            return Err(ApiError::BadRequest(
                "idempotencyKey must be 1-100 chars".into(),
            ))
        }
        // No text column holds a NUL (the API check found one answered 500).
        Some(k) if k.contains('\0') => {
            return Err(ApiError::BadRequest(
                "idempotencyKey may not hold a NUL character".into(),
            ))
        }
        Some(k) => format!("deduct:{k}"),
        None => format!("deduct:{}", uuid::Uuid::new_v4()),
    };
    let reply = crate::ledger::charge(
        &state.db,
        &ChargeRequest {
            target_email: target.map(|t| t.to_string()),
            send_mode: Some("deduct".into()),
            ..caller.charge(1, idem)
        },
    )
    .await?;
    let message = if reply.duplicate {
        "Already deducted for this idempotencyKey"
    } else {
        "Deducted 1 credit"
    };
    Ok(Success::new(Deducted {
        message: message.to_owned(),
        balance: reply.balance,
    }))
}
