//! Verification codes: `POST /send-code` and `POST /verify-code`. A code is 6 random
//! digits, valid 5 minutes, with 5 wrong attempts allowed; sends to one recipient are
//! limited (429 with `Retry-After`); both calls are charged. The email travels the real
//! path: outbox → SEND stream → sender. Login codes (`/login/code`) use the same store and
//! limits under their own scope, uncharged. Policy: docs/decisions.md, "Verification codes".

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
use email::Purpose;
use store::{Check, Code, CodeStore, Limit, LOGIN_SCOPE};

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

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = SendCodeRequest)]
struct SendCodeBody {
    #[schema(format = Email)]
    email: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = VerifyCodeRequest)]
struct VerifyCodeBody {
    #[schema(format = Email)]
    email: String,
    code: String,
}

/// Parses an address from a request body; 400 when it is not one.
pub(crate) fn parse_email(raw: &str) -> Result<EmailAddress, ApiError> {
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
    if caller.test {
        return Err(ApiError::Forbidden(
            "a test key delivers and charges nothing: /send-code needs a live key".into(),
        ));
    }
    let mut store = CodeStore::new(&state, caller.account.to_string(), &email);
    limit(&mut store).await?;
    let issued = charged_issue(&state, &caller, &email, &mut store).await;
    if issued.is_err() {
        store.lift_limit().await;
    }
    issued?;
    Ok(Success::message("verification code sent"))
}

/// Counts a code to the recipient of `store`; 429 within the cooldown or over the hourly cap.
async fn limit(store: &mut CodeStore<'_>) -> Result<(), ApiError> {
    match store.limit().await? {
        Limit::Allowed => Ok(()),
        Limit::Cooldown(retry_after) => Err(ApiError::TooManyRequests {
            message: "a code was just sent to this address; try again later".into(),
            retry_after,
        }),
        Limit::HourlyCap(retry_after) => Err(ApiError::TooManyRequests {
            message: "too many codes sent to this address this hour".into(),
            retry_after,
        }),
    }
}

/// Charges (held), issues the code, and confirms the charge; a failure refunds it.
async fn charged_issue(
    state: &AppState, caller: &Caller, email: &EmailAddress, store: &mut CodeStore<'_>,
) -> Result<(), ApiError> {
    let job = JobId::new();
    let charge = state
        .billing
        .hold(code_charge(caller, format!("send-code:{job}"), email))
        .await?;
    match issue(state, Some(caller), email, store, job).await {
        Ok(()) => {
            charge.confirm().await;
            Ok(())
        }
        Err((e, why)) => {
            charge.refund(why).await;
            Err(e)
        }
    }
}

/// Stages the code, queues its email as job `job`, and activates the code; a failed step
/// leaves the previous code in place and says what failed.
async fn issue(
    state: &AppState, caller: Option<&Caller>, email: &EmailAddress, store: &mut CodeStore<'_>,
    job: JobId,
) -> Result<(), (ApiError, &'static str)> {
    let code = Code::random();
    let purpose = match caller {
        Some(_) => Purpose::Verification,
        None => Purpose::Login,
    };
    store
        .stage(job, &code)
        .await
        .map_err(|e| (e, "code could not be stored"))?;
    let workspace = caller.map(|c| c.workspace);
    if let Err(e) = email::queue(state, workspace, email, &code, job, purpose).await {
        store.discard(job).await;
        return Err((e, "code email could not be queued"));
    }
    store
        .promote(job)
        .await
        .map_err(|e| (e, "code could not be activated"))?;
    metrics::counter!("postmesh_codes_sent_total").increment(1);
    Ok(())
}

/// Emails a login code to `email`, within the per-address cooldown and hourly cap.
pub(crate) async fn send_login_code(
    state: &AppState, email: &EmailAddress,
) -> Result<(), ApiError> {
    let mut store = CodeStore::new(state, LOGIN_SCOPE.into(), email);
    limit(&mut store).await?;
    if let Err((e, _)) = issue(state, None, email, &mut store, JobId::new()).await {
        store.lift_limit().await;
        return Err(e);
    }
    Ok(())
}

/// Checks a login code: `Ok` once it matches (and is used up); 404 without a code, 400 for
/// a wrong one.
pub(crate) async fn check_login_code(
    state: &AppState, email: &EmailAddress, code: &str,
) -> Result<(), ApiError> {
    let code = Code::parse(code.trim())
        .ok_or_else(|| ApiError::BadRequest("code must be 6 digits".into()))?;
    // Wrong codes count per address across all its codes: a new code is no new guesses.
    // Each try takes its place in the count before the code is compared, and gives it back
    // unless it was wrong, so tries made at once get no more guesses than one after another.
    let wrong = state.ns.redis_key(&format!("login:wrong:{}", email.key()));
    let mut redis = state.redis.clone();
    let unavailable = |e| ApiError::redis("login limit unavailable", e);
    let (count, ttl): (u64, i64) = redis::pipe()
        .incr(&wrong, 1)
        .cmd("EXPIRE")
        .arg(&wrong)
        .arg(3600)
        .arg("NX")
        .ignore()
        .ttl(&wrong)
        .query_async(&mut redis)
        .await
        .map_err(unavailable)?;
    if count > WRONG_LOGIN_CODES_PER_HOUR {
        return Err(ApiError::TooManyRequests {
            message: "too many wrong codes for this address this hour".into(),
            retry_after: u64::try_from(ttl).unwrap_or(3600).max(1),
        });
    }
    let check = CodeStore::new(state, LOGIN_SCOPE.into(), email)
        .check(&code)
        .await;
    if !matches!(check, Ok(Check::Mismatch | Check::Voided)) {
        let _: () = redis::cmd("DECR")
            .arg(&wrong)
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
    }
    let check = check?;
    metrics::counter!("postmesh_login_codes_verified_total", "outcome" => check.name())
        .increment(1);
    outcome(check)
}

/// Wrong login codes an address may enter in an hour, across all its codes; then 429
/// until the hour ends, for the right code too.
const WRONG_LOGIN_CODES_PER_HOUR: u64 = 5;

/// The answer to a checked code.
fn outcome(check: Check) -> Result<(), ApiError> {
    match check {
        Check::Match => Ok(()),
        Check::Missing => Err(ApiError::NotFound("code not found or expired".into())),
        Check::Voided => Err(ApiError::BadRequest(
            "code mismatch; too many wrong attempts, the code is void".into(),
        )),
        Check::Mismatch => Err(ApiError::BadRequest("code mismatch".into())),
    }
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
    let mut store = CodeStore::new(&state, caller.account.to_string(), &email);
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
    outcome(check)?;
    Ok(Success::message("code verified"))
}
