//! Verification codes: `POST /send-code` and `POST /verify-code`. A code is 6 random
//! digits, valid 5 minutes, with 5 wrong attempts allowed; sends to one recipient are
//! limited (429 with `Retry-After`); both calls are charged. The email travels the real
//! path: outbox → SEND stream → sender. Policy: docs/decisions.md, "Verification codes".

mod email;
mod store;

use axum::extract::State;
use serde::Deserialize;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::extract::{Caller, JsonBody};
use postmesh_shared::proto::ChargeRequest;
use postmesh_shared::response::Message;
use postmesh_shared::{ApiError, EmailAddress, JobId, Routes, Success};

use crate::AppState;
use store::{Check, Code, CodeStore, Limit};

/// Settings of the verification-code flow.
#[derive(Clone, Debug)]
pub struct CodeConfig {
    /// Pepper of the stored code hashes.
    pub secret: String,
    /// Seconds a code stays valid.
    pub ttl_secs: u64,
    /// Wrong attempts after which a code is void.
    pub max_attempts: u32,
    /// Seconds between two sends to one recipient.
    pub cooldown_secs: u64,
    /// Sends to one recipient per hour.
    pub hourly_cap: u32,
    /// Sender address of code emails.
    pub from_email: String,
}

/// The routes served by the gateway itself.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::SEND_CODE, send_code)
        .at(api::VERIFY_CODE, verify_code)
}

#[derive(Deserialize)]
struct SendCodeBody {
    email: String,
}

#[derive(Deserialize)]
struct VerifyCodeBody {
    email: String,
    code: String,
}

fn parse_email(raw: &str) -> Result<EmailAddress, ApiError> {
    EmailAddress::parse(raw).ok_or_else(|| ApiError::BadRequest("invalid email address".into()))
}

/// The one-credit charge of a code call, under `key`.
fn code_charge(caller: &Caller, key: String, target: &EmailAddress) -> ChargeRequest {
    ChargeRequest {
        target_email: Some(target.as_str().to_owned()),
        ..caller.charge(1, key)
    }
}

/// `POST /send-code`.
async fn send_code(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<SendCodeBody>,
) -> Result<Success<Message>, ApiError> {
    let email = parse_email(&body.email)?;
    let mut store = CodeStore::new(&state, caller.account, &email);
    match store.limit().await? {
        Limit::Allowed => {}
        Limit::Cooldown(retry_after) => {
            return Err(ApiError::TooManyRequests {
                message: "a code was just sent to this address; try again later".into(),
                retry_after,
            })
        }
        Limit::HourlyCap(retry_after) => {
            return Err(ApiError::TooManyRequests {
                message: "too many codes sent to this address this hour".into(),
                retry_after,
            })
        }
    }
    let issued = issue(&state, &caller, &email, &mut store).await;
    if issued.is_err() {
        store.lift_limit().await;
    }
    issued?;
    Ok(Success::message("verification code sent"))
}

/// Charges (held), stages the code, queues its email, activates the code, and confirms the
/// charge; a failed step refunds the charge and leaves the previous code in place.
async fn issue(
    state: &AppState, caller: &Caller, email: &EmailAddress, store: &mut CodeStore<'_>,
) -> Result<(), ApiError> {
    let job = JobId::new();
    let charge = state
        .billing
        .hold(code_charge(caller, format!("send-code:{job}"), email))
        .await?;
    let code = Code::random();
    if let Err(e) = store.stage(job, &code).await {
        charge.refund("code could not be stored").await;
        return Err(e);
    }
    if let Err(e) = email::queue(state, caller, email, &code, job).await {
        store.discard(job).await;
        charge.refund("code email could not be queued").await;
        return Err(e);
    }
    if let Err(e) = store.promote(job).await {
        charge.refund("code could not be activated").await;
        return Err(e);
    }
    charge.confirm().await;
    metrics::counter!("postmesh_codes_sent_total").increment(1);
    Ok(())
}

/// `POST /verify-code`. The check is charged; a missing or expired code is refunded.
async fn verify_code(
    State(state): State<AppState>, caller: Caller, JsonBody(body): JsonBody<VerifyCodeBody>,
) -> Result<Success<Message>, ApiError> {
    let email = parse_email(&body.email)?;
    let code = Code::parse(&body.code)
        .ok_or_else(|| ApiError::BadRequest("code must be 6 digits".into()))?;
    let charge = state
        .billing
        .hold(code_charge(
            &caller,
            format!("verify-code:{}", uuid::Uuid::now_v7()),
            &email,
        ))
        .await?;
    let mut store = CodeStore::new(&state, caller.account, &email);
    let check = match store.check(&code).await {
        Ok(check) => check,
        Err(e) => {
            charge.refund("code store unavailable").await;
            return Err(e);
        }
    };
    metrics::counter!("postmesh_codes_verified_total", "outcome" => check.name()).increment(1);
    if let Check::Missing = check {
        charge.refund("no code to check").await;
        return Err(ApiError::NotFound("code not found or expired".into()));
    }
    charge.confirm().await;
    match check {
        Check::Match => Ok(Success::message("code verified")),
        Check::Voided => Err(ApiError::BadRequest(
            "code mismatch; too many wrong attempts, the code is void".into(),
        )),
        _ => Err(ApiError::BadRequest("code mismatch".into())),
    }
}
