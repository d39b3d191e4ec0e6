//! Verification codes: `POST /send-code` and `POST /verify-code`.
//!
//! A code is 6 random digits, valid 5 minutes, kept in Redis only as an HMAC under a server
//! secret. Each code allows 5 wrong attempts, then it is void; a used code is deleted. Sends
//! to one recipient are limited by a cooldown and an hourly cap (429 with `Retry-After`).
//! The email travels the real path: a SEND job on JetStream, delivered by the sender.

use axum::extract::State;
use axum::Json;
use hmac::{Hmac, Mac};
use rand::Rng;
use redis::aio::ConnectionManager;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Sha256;
use uuid::Uuid;

use postmesh_shared::extract::{Caller, JsonBody};
use postmesh_shared::proto::{
    AuthContext, ChargeReply, ChargeRequest, ConfirmReply, ConfirmRequest, RefundReply,
    RefundRequest, SendJob,
};
use postmesh_shared::{jetstream, nats, ApiError, EmailAddress};

use crate::AppState;

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

#[derive(Deserialize)]
pub struct SendCodeBody {
    email: String,
}

#[derive(Deserialize)]
pub struct VerifyCodeBody {
    email: String,
    code: String,
}

/// A 6-digit code as typed by a user.
struct Code(String);

impl Code {
    fn parse(raw: &str) -> Option<Self> {
        (raw.len() == 6 && raw.bytes().all(|b| b.is_ascii_digit())).then(|| Self(raw.to_owned()))
    }

    fn random() -> Self {
        Self(format!(
            "{:06}",
            rand::thread_rng().gen_range(0..1_000_000u32)
        ))
    }

    /// HMAC-SHA256 of the code, bound to the account and recipient.
    fn digest(&self, secret: &str, account: &str, email: &EmailAddress) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
        for part in [account, &recipient_id(email), &self.0] {
            mac.update(part.as_bytes());
            mac.update(b"\0");
        }
        hex::encode(mac.finalize().into_bytes())
    }
}

/// The recipient as codes and limits know it: case-insensitive, as mailboxes are in practice.
fn recipient_id(email: &EmailAddress) -> String {
    email.as_str().to_lowercase()
}

fn parse_email(raw: &str) -> Result<EmailAddress, ApiError> {
    EmailAddress::parse(raw).ok_or_else(|| ApiError::BadRequest("invalid email address".into()))
}

/// Rate limit: `{0, 0}` allowed (and counted), `{1, ttl}` cooling down, `{2, ttl}` hourly cap.
const LIMIT_SCRIPT: &str = r"
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then return {1, ttl} end
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
if n >= tonumber(ARGV[2]) then return {2, math.max(redis.call('TTL', KEYS[2]), 1)} end
redis.call('SET', KEYS[1], '1', 'EX', ARGV[1])
if redis.call('INCR', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], 3600) end
return {0, 0}
";

/// Undoes one counted send (the send failed later on).
const UNLIMIT_SCRIPT: &str = r"
redis.call('DEL', KEYS[1])
if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then redis.call('DECR', KEYS[2]) end
return 0
";

/// Checks a code: 0 missing, 1 match (code deleted), 2 mismatch, 3 mismatch that voided it.
const VERIFY_SCRIPT: &str = r"
local h = redis.call('HGET', KEYS[1], 'h')
if not h then return 0 end
if h == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
local a = redis.call('HINCRBY', KEYS[1], 'a', 1)
if a >= tonumber(ARGV[2]) then redis.call('DEL', KEYS[1]) return 3 end
return 2
";

struct Keys {
    code: String,
    cooldown: String,
    hourly: String,
}

impl Keys {
    fn new(state: &AppState, auth: &AuthContext, email: &EmailAddress) -> Self {
        // One hash tag for all keys of a (account, recipient): the scripts and the pending-code
        // RENAME touch several of them, which Redis Cluster allows only within one slot.
        let tag = format!("{{{}:{}}}", auth.account_id, recipient_id(email));
        let k = |kind: &str| state.ns.redis_key(&format!("code:{kind}:{tag}"));
        Self {
            code: k("hash"),
            cooldown: k("cooldown"),
            hourly: k("hourly"),
        }
    }
}

fn redis_err(e: redis::RedisError) -> ApiError {
    ApiError::internal("code store unavailable", e)
}

/// Seconds a code charge is held: unless confirmed once its work is done, billing refunds
/// it, so a gateway that dies halfway through a request costs the customer nothing.
const CHARGE_HOLD_SECS: i64 = 60;

/// Takes one credit under `key`, held until [`confirm`]. When billing's answer is lost
/// (timeout, bad reply) the charge may still commit later, so the key is refunded or voided
/// before failing.
async fn charge(
    state: &AppState,
    auth: &AuthContext,
    key: &str,
    target: &EmailAddress,
) -> Result<(), ApiError> {
    let req = ChargeRequest {
        api_key_id: auth.api_key_id.clone(),
        account_id: auth.account_id.clone(),
        caller_email: auth.email.clone(),
        cost: 1,
        idempotency_key: key.to_owned(),
        target_email: Some(target.as_str().to_owned()),
        hold_secs: CHARGE_HOLD_SECS,
        ..Default::default()
    };
    let res: Result<ChargeReply, _> =
        nats::call(&state.nats, &state.ns, "billing", "charge", &req).await;
    match res {
        Ok(_) => Ok(()),
        Err(e) if e.status().is_server_error() => {
            refund(state, auth, key, "charge outcome unknown").await;
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Makes a held charge final: the work it pays for is done or safely queued.
async fn confirm(state: &AppState, auth: &AuthContext, key: &str) {
    let req = ConfirmRequest {
        api_key_id: auth.api_key_id.clone(),
        charge_idempotency_key: key.to_owned(),
    };
    settle::<_, ConfirmReply>(state, "confirm", key, req).await;
}

/// Gives a charge back (or voids it if it has not happened yet).
async fn refund(state: &AppState, auth: &AuthContext, key: &str, reason: &str) {
    let req = RefundRequest {
        api_key_id: auth.api_key_id.clone(),
        charge_idempotency_key: key.to_owned(),
        reason: reason.to_owned(),
    };
    settle::<_, RefundReply>(state, "refund", key, req).await;
}

/// Attempts after the first one fails, spaced by doubling delays from one second.
const SETTLE_RETRIES: u32 = 5;

/// Calls the idempotent billing RPC `method` about the charge `key`. The first attempt is
/// awaited; if it fails, retries go on in the background.
async fn settle<Req, Resp>(state: &AppState, method: &'static str, key: &str, req: Req)
where
    Req: prost::Message + Clone + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    let attempt = move |state: AppState, req: Req, key: String| async move {
        let res: Result<Resp, _> =
            nats::call(&state.nats, &state.ns, "billing", method, &req).await;
        res.map_err(|e| tracing::warn!(error = %e, charge = %key, method, "billing call failed"))
    };
    if attempt(state.clone(), req.clone(), key.to_owned())
        .await
        .is_ok()
    {
        return;
    }
    let (state, key) = (state.clone(), key.to_owned());
    let retries = async move {
        for n in 0..SETTLE_RETRIES {
            tokio::time::sleep(std::time::Duration::from_secs(1 << n)).await;
            if attempt(state.clone(), req.clone(), key.clone())
                .await
                .is_ok()
            {
                return;
            }
        }
        tracing::error!(charge = %key, method, "billing call abandoned after retries");
    };
    tokio::spawn(tracing::Instrument::in_current_span(retries));
}

/// `POST /send-code`.
pub async fn send_code(
    State(state): State<AppState>,
    Caller(auth): Caller,
    JsonBody(body): JsonBody<SendCodeBody>,
) -> Result<Json<Value>, ApiError> {
    let email = parse_email(&body.email)?;
    let cfg = &state.codes;
    let keys = Keys::new(&state, &auth, &email);
    let mut redis = state.redis.clone();
    let (outcome, wait): (i64, u64) = redis::Script::new(LIMIT_SCRIPT)
        .key(&keys.cooldown)
        .key(&keys.hourly)
        .arg(cfg.cooldown_secs)
        .arg(cfg.hourly_cap)
        .invoke_async(&mut redis)
        .await
        .map_err(redis_err)?;
    match outcome {
        0 => {}
        1 => {
            return Err(ApiError::TooManyRequests {
                message: "a code was just sent to this address; try again later".into(),
                retry_after: wait,
            })
        }
        _ => {
            return Err(ApiError::TooManyRequests {
                message: "too many codes sent to this address this hour".into(),
                retry_after: wait,
            })
        }
    }
    let result = issue(&state, &auth, &email, &keys, &mut redis).await;
    if result.is_err() {
        let undo: Result<i64, _> = redis::Script::new(UNLIMIT_SCRIPT)
            .key(&keys.cooldown)
            .key(&keys.hourly)
            .invoke_async(&mut redis)
            .await;
        if let Err(e) = undo {
            tracing::warn!(error = %e, "could not lift the send-code limit after a failure");
        }
    }
    result?;
    Ok(Json(
        json!({ "success": true, "message": "verification code sent" }),
    ))
}

/// Charges, stores the code hash and queues the email; refunds when queuing fails.
async fn issue(
    state: &AppState,
    auth: &AuthContext,
    email: &EmailAddress,
    keys: &Keys,
    redis: &mut ConnectionManager,
) -> Result<(), ApiError> {
    let cfg = &state.codes;
    let job_id = Uuid::now_v7().to_string();
    let charge_key = format!("send-code:{job_id}");
    charge(state, auth, &charge_key, email).await?;
    let code = Code::random();
    // The new code waits under its own key until its email is queued, so a failed resend
    // leaves the previous code working.
    let pending = format!("{}:pending:{job_id}", keys.code);
    let stored: Result<(), _> = redis::pipe()
        .atomic()
        .hset(
            &pending,
            "h",
            code.digest(&cfg.secret, &auth.account_id, email),
        )
        .hset(&pending, "a", 0)
        .expire(&pending, cfg.ttl_secs as i64)
        .ignore()
        .query_async(redis)
        .await;
    if let Err(e) = stored {
        refund(state, auth, &charge_key, "code could not be stored").await;
        return Err(redis_err(e));
    }
    let minutes = cfg.ttl_secs / 60;
    let job = SendJob {
        id: job_id.clone(),
        account_id: auth.account_id.clone(),
        api_key_id: auth.api_key_id.clone(),
        from_email: cfg.from_email.clone(),
        from_name: String::new(),
        to: vec![email.as_str().to_owned()],
        subject: "Your verification code".into(),
        text: format!(
            "Your verification code is {}.\r\n\r\nIt expires in {minutes} minutes. If you did not ask for it, ignore this email.\r\n",
            code.0
        ),
        html: String::new(),
        kind: "verification".into(),
    };
    let subject = jetstream::send_subject(&state.ns);
    let payload = prost::Message::encode_to_vec(&job).into();
    if let Err(e) = jetstream::publish(&state.js, subject, &job_id, payload).await {
        let _: Result<(), _> = redis::cmd("DEL").arg(&pending).query_async(redis).await;
        refund(state, auth, &charge_key, "code email could not be queued").await;
        return Err(e);
    }
    // Replaces the previous code (and its attempt count) in one step.
    let promoted: Result<(), _> = redis::cmd("RENAME")
        .arg(&pending)
        .arg(&keys.code)
        .query_async(redis)
        .await;
    if let Err(e) = promoted {
        refund(state, auth, &charge_key, "code could not be activated").await;
        return Err(redis_err(e));
    }
    confirm(state, auth, &charge_key).await;
    metrics::counter!("postmesh_codes_sent_total").increment(1);
    Ok(())
}

/// `POST /verify-code`. The check is charged; a missing or expired code is refunded.
pub async fn verify_code(
    State(state): State<AppState>,
    Caller(auth): Caller,
    JsonBody(body): JsonBody<VerifyCodeBody>,
) -> Result<Json<Value>, ApiError> {
    let email = parse_email(&body.email)?;
    let code = Code::parse(&body.code)
        .ok_or_else(|| ApiError::BadRequest("code must be 6 digits".into()))?;
    let cfg = &state.codes;
    let keys = Keys::new(&state, &auth, &email);
    let charge_key = format!("verify-code:{}", Uuid::now_v7());
    charge(&state, &auth, &charge_key, &email).await?;
    let mut redis = state.redis.clone();
    let outcome: Result<i64, _> = redis::Script::new(VERIFY_SCRIPT)
        .key(&keys.code)
        .arg(code.digest(&cfg.secret, &auth.account_id, &email))
        .arg(cfg.max_attempts)
        .invoke_async(&mut redis)
        .await;
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            refund(&state, &auth, &charge_key, "code store unavailable").await;
            return Err(redis_err(e));
        }
    };
    metrics::counter!("postmesh_codes_verified_total", "outcome" => outcome.to_string())
        .increment(1);
    if outcome != 0 {
        confirm(&state, &auth, &charge_key).await;
    }
    match outcome {
        1 => Ok(Json(json!({ "success": true, "message": "code verified" }))),
        0 => {
            refund(&state, &auth, &charge_key, "no code to check").await;
            Err(ApiError::NotFound("code not found or expired".into()))
        }
        3 => Err(ApiError::BadRequest(
            "code mismatch; too many wrong attempts, the code is void".into(),
        )),
        _ => Err(ApiError::BadRequest("code mismatch".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_six_digits() {
        for _ in 0..100 {
            let c = Code::random();
            assert!(Code::parse(&c.0).is_some(), "{}", c.0);
        }
        for bad in ["", "12345", "1234567", "12a456", " 23456", "１２３４５６"] {
            assert!(Code::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn digest_binds_code_account_and_recipient() {
        let a = EmailAddress::parse("a@example.com").unwrap();
        let b = EmailAddress::parse("b@example.com").unwrap();
        let c = Code("123456".into());
        let d = c.digest("s", "acct", &a);
        assert_eq!(d, c.digest("s", "acct", &a));
        assert!(!d.contains("123456"));
        assert_ne!(d, c.digest("s", "acct", &b));
        let upper = EmailAddress::parse("A@Example.com").unwrap();
        assert_eq!(d, c.digest("s", "acct", &upper));
        assert_ne!(d, c.digest("s", "other", &a));
        assert_ne!(d, c.digest("t", "acct", &a));
        assert_ne!(d, Code("123457".into()).digest("s", "acct", &a));
    }
}
