//! CLI device authorization (spec §3): `init` registers a device token, the user approves it
//! in the web app (or `approve` with a session), `poll` hands the new key over once. State
//! lives in Redis under the token's SHA-256; the key is minted by the poll that takes it, so
//! its text is never stored. Policy: docs/decisions.md, "CLI device authorization".

use std::net::IpAddr;

use axum::extract::State;
use axum::http::{request::Parts, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use postmesh_contracts::answers::gateway::{Initiated, KeyMode, PollAnswer, PollStatus};
use postmesh_contracts::routes::gateway as api;
use postmesh_shared::db::now_unix;
use postmesh_shared::extract::JsonBody;
use postmesh_shared::{ApiError, Routes, Success};

use crate::sessions::{self, Session};
use crate::{accounts, login, AppState};

/// The routes of device authorization.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::CLI_AUTH_INIT, init)
        .at(api::CLI_AUTH_POLL, poll)
        .answers::<PollAnswer>()
        .at(api::CLI_AUTH_APPROVE, approve)
}

/// Seconds a device request lives.
pub const EXPIRES_IN: u64 = 600;
/// Polls this much early still count as on time (network jitter), in milliseconds.
const POLL_SLACK_MS: u64 = 250;
/// Seconds a used device token is remembered, so it cannot start a second request.
const USED_TTL: u64 = 30 * 24 * 3600;
/// Wrong user codes typed for one request before it is void.
pub const MAX_CODE_ATTEMPTS: u32 = 5;
/// The user-code alphabet: consonants only, no look-alikes (RFC 8628 §6.1).
const USER_CODE_ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";

/// A device token as the CLI made it: 32-128 hex characters.
pub struct DeviceToken(String);

impl DeviceToken {
    /// Parses a token; `None` unless it is 32-128 ASCII hex digits.
    pub fn parse(raw: &str) -> Option<Self> {
        ((32..=128).contains(&raw.len()) && raw.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| Self(raw.to_ascii_lowercase()))
    }

    /// The SHA-256 the token is stored under.
    fn hash(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }
}

fn parse_token(raw: &str) -> Result<DeviceToken, ApiError> {
    DeviceToken::parse(raw)
        .ok_or_else(|| ApiError::BadRequest("deviceToken must be 32-128 hex characters".into()))
}

/// An 8-character user code, shown as `ABCD-EFGH`.
fn new_user_code() -> String {
    let mut rng = rand::rngs::OsRng;
    (0..8)
        .map(|_| USER_CODE_ALPHABET[rng.gen_range(0..USER_CODE_ALPHABET.len())] as char)
        .collect()
}

/// A user code as typed: case, spaces and dashes do not matter.
pub fn normalize_user_code(raw: &str) -> String {
    raw.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// `ABCDEFGH` as `ABCD-EFGH`.
pub fn display_user_code(code: &str) -> String {
    match code.len() {
        8 => format!("{}-{}", &code[..4], &code[4..]),
        _ => code.to_owned(),
    }
}

fn redis_err(e: redis::RedisError) -> ApiError {
    ApiError::redis("device store unavailable", e)
}

/// Redis keys of the device store.
fn key(state: &AppState, kind: &str, id: &str) -> String {
    state.ns.redis_key(&format!("device:{kind}:{id}"))
}

/// A pending device request, as the approval page shows it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The token's hash (the record's key).
    pub hash: String,
    /// The code the CLI shows (`ABCDEFGH`).
    pub user_code: String,
    /// When the CLI started it (Unix seconds).
    pub created_at: i64,
    /// The client IP it started from (empty: unknown).
    pub ip: String,
    /// The id its verification URL names.
    pub rid: String,
}

/// Looks a pending request up by the id in its verification URL or by its user code.
pub async fn find(state: &AppState, by: Lookup<'_>) -> Result<Option<Request>, ApiError> {
    let index = match by {
        Lookup::Request(rid) => key(state, "rid", rid),
        Lookup::UserCode(code) => key(state, "code", &normalize_user_code(code)),
    };
    let mut redis = state.redis.clone();
    let hash: Option<String> = redis::cmd("GET")
        .arg(index)
        .query_async(&mut redis)
        .await
        .map_err(redis_err)?;
    let Some(hash) = hash else {
        return Ok(None);
    };
    let fields: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(key(state, "req", &hash))
        .arg(&["state", "code", "created", "ip", "rid"])
        .query_async(&mut redis)
        .await
        .map_err(redis_err)?;
    let [Some(st), Some(code), Some(created), ip, Some(rid)] =
        <[Option<String>; 5]>::try_from(fields)
            .map_err(|_| ApiError::Internal("device record".into()))?
    else {
        return Ok(None);
    };
    Ok((st == "pending").then(|| Request {
        hash,
        user_code: code,
        created_at: created.parse().unwrap_or_default(),
        ip: ip.unwrap_or_default(),
        rid,
    }))
}

/// How the approval page names a request.
pub enum Lookup<'a> {
    /// The id in the verification URL.
    Request(&'a str),
    /// The code the CLI shows, as typed.
    UserCode(&'a str),
}

/// What deciding on a request did.
#[derive(Debug, PartialEq, Eq)]
pub enum Decided {
    /// Approved: the CLI's next poll gets a key.
    Approved,
    /// Denied: the CLI's next poll gets 410 `denied`.
    Denied,
    /// The typed user code was wrong; the request stays.
    WrongCode,
    /// The typed user code was wrong once too often; the request is void.
    Voided,
}

/// Decides pending request `hash`: 0 gone, 1 already handled, 2 wrong code, 3 voided,
/// 4 denied, 5 approved. `ARGV`: decision, `check` or `skip` (the code), typed code,
/// account, email, max attempts. An empty typed code is a wrong one.
const DECIDE_SCRIPT: &str = r"
local s = redis.call('HGET', KEYS[1], 'state')
if not s then return 0 end
if s ~= 'pending' then return 1 end
if ARGV[1] == 'deny' then redis.call('HSET', KEYS[1], 'state', 'denied') return 4 end
if ARGV[2] == 'check' and ARGV[3] ~= redis.call('HGET', KEYS[1], 'code') then
  if redis.call('HINCRBY', KEYS[1], 'attempts', 1) >= tonumber(ARGV[6]) then
    redis.call('DEL', KEYS[1])
    return 3
  end
  return 2
end
redis.call('HSET', KEYS[1], 'state', 'approved', 'account', ARGV[4], 'email', ARGV[5])
return 5
";

/// Approves (`approve`) or denies request `hash` for `session`; with `typed_code`, only if
/// it is the request's user code (an empty one is wrong; `None` is the JSON route, which
/// proves the request with the device token instead). 410 when the request is gone, 409 when already handled,
/// 500 when the account has no key to bill to.
pub async fn decide(
    state: &AppState, session: &Session, hash: &str, approve: bool, typed_code: Option<&str>,
) -> Result<Decided, ApiError> {
    if approve
        && accounts::primary_key(state, session.account)
            .await?
            .is_none()
    {
        return Err(accounts::no_key());
    }
    let mut redis = state.redis.clone();
    let outcome: i64 = redis::Script::new(DECIDE_SCRIPT)
        .key(key(state, "req", hash))
        .arg(if approve { "approve" } else { "deny" })
        .arg(if typed_code.is_some() {
            "check"
        } else {
            "skip"
        })
        .arg(typed_code.map(normalize_user_code).unwrap_or_default())
        .arg(session.account.to_string())
        .arg(&session.email)
        .arg(MAX_CODE_ATTEMPTS)
        .invoke_async(&mut redis)
        .await
        .map_err(redis_err)?;
    match outcome {
        0 => Err(gone()),
        1 => Err(ApiError::Conflict(
            "this device request was already handled".into(),
        )),
        2 => Ok(Decided::WrongCode),
        3 => Ok(Decided::Voided),
        4 => Ok(Decided::Denied),
        _ => Ok(Decided::Approved),
    }
}

fn gone() -> ApiError {
    ApiError::Gone("device authorization missing or expired".into())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = CliAuthInitRequest)]
#[serde(rename_all = "camelCase")]
struct InitBody {
    #[schema(pattern = "^[0-9A-Fa-f]{32,128}$")]
    device_token: String,
    /// What the CLI calls its machine; the new key is named for it.
    #[serde(default)]
    device_name: Option<String>,
}

/// `POST /cli/auth/init {deviceToken}`: 409 when the token was used before.
async fn init(
    State(state): State<AppState>, parts: Parts, JsonBody(body): JsonBody<InitBody>,
) -> Result<Success<Initiated>, ApiError> {
    let token = parse_token(&body.device_token)?;
    let ip: Option<IpAddr> = sessions::client_ip(&state, &parts);
    login::limit_ip(&state, "device", ip).await?;
    let name = match body.device_name.as_deref().map(str::trim) {
        Some(n) if !n.is_empty() => format!("CLI: {}", n.chars().take(80).collect::<String>()),
        _ => "CLI".to_owned(),
    };
    let hash = token.hash();
    let mut redis = state.redis.clone();
    let fresh: bool = redis::cmd("SET")
        .arg(key(&state, "used", &hash))
        .arg(1)
        .arg("NX")
        .arg("EX")
        .arg(USED_TTL)
        .query_async::<Option<String>>(&mut redis)
        .await
        .map_err(redis_err)?
        .is_some();
    if !fresh {
        return Err(ApiError::Conflict(
            "this deviceToken was already used".into(),
        ));
    }
    let mut user_code = None;
    for _ in 0..5 {
        let code = new_user_code();
        let reserved: Option<String> = redis::cmd("SET")
            .arg(key(&state, "code", &code))
            .arg(&hash)
            .arg("NX")
            .arg("EX")
            .arg(EXPIRES_IN)
            .query_async(&mut redis)
            .await
            .map_err(redis_err)?;
        if reserved.is_some() {
            user_code = Some(code);
            break;
        }
    }
    let user_code =
        user_code.ok_or_else(|| ApiError::Unavailable("no free user code; try again".into()))?;
    let rid = sessions::random_hex(16);
    let record = key(&state, "req", &hash);
    redis::pipe()
        .atomic()
        .hset_multiple(
            &record,
            &[
                ("state", "pending".to_owned()),
                ("code", user_code.clone()),
                ("rid", rid.clone()),
                ("created", now_unix().to_string()),
                ("ip", ip.map(|i| i.to_string()).unwrap_or_default()),
                ("name", name),
                ("attempts", "0".to_owned()),
            ],
        )
        .expire(&record, EXPIRES_IN as i64)
        .set_ex(key(&state, "rid", &rid), &hash, EXPIRES_IN)
        .query_async::<()>(&mut redis)
        .await
        .map_err(redis_err)?;
    Ok(Success::new(Initiated {
        device_token: body.device_token,
        expires_in: EXPIRES_IN,
        interval: state.config.device_poll_interval_secs,
        user_code: display_user_code(&user_code),
        verification_url: format!(
            "{}/app/device?request={rid}",
            state.config.public_base_url.trim_end_matches('/')
        ),
    }))
}

/// Polls request `KEYS[1]`: `{'missing'}`, `{'slow_down'}`, `{'pending'}`, `{'denied'}`
/// (record deleted) or `{'approved', account, email, name}` (now `minting`: this poll alone
/// mints the key). `ARGV[1]`: the least milliseconds between two polls.
const POLL_SCRIPT: &str = r"
local s = redis.call('HGET', KEYS[1], 'state')
if not s then return {'missing'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('HGET', KEYS[1], 'polled') or '0')
if now - last < tonumber(ARGV[1]) then return {'slow_down'} end
redis.call('HSET', KEYS[1], 'polled', now)
if s == 'denied' then redis.call('DEL', KEYS[1]) return {'denied'} end
if s == 'approved' then
  redis.call('HSET', KEYS[1], 'state', 'minting')
  local f = redis.call('HMGET', KEYS[1], 'account', 'email', 'name')
  return {'approved', f[1], f[2], f[3]}
end
return {'pending'}
";

/// Puts a `minting` record back to `approved` (its mint failed); 0 when it is gone.
const RESTORE_SCRIPT: &str = r"
if redis.call('HGET', KEYS[1], 'state') ~= 'minting' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'approved')
return 1
";

fn poll_answer(code: StatusCode, status: PollStatus, error: Option<&str>) -> Response {
    let body = PollAnswer {
        success: code.is_success(),
        status,
        api_key: None,
        email: None,
        error: error.map(str::to_owned),
    };
    (code, Json(body)).into_response()
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = DeviceTokenRequest)]
#[serde(rename_all = "camelCase")]
struct TokenBody {
    #[schema(pattern = "^[0-9A-Fa-f]{32,128}$")]
    device_token: String,
}

/// `POST /cli/auth/poll {deviceToken}`. A poll of a token no one started (or one long
/// expired) is a failed authentication of the client's address, as a wrong API key is: past
/// `AUTH_FAILURES_PER_IP_PER_MINUTE` the address is answered 429 before any lookup.
async fn poll(
    State(state): State<AppState>, parts: Parts, JsonBody(body): JsonBody<TokenBody>,
) -> Response {
    let ip = sessions::client_ip(&state, &parts);
    if let Err(e) = state.failed_auths.check(ip) {
        return e.into_response();
    }
    let Some(token) = DeviceToken::parse(&body.device_token) else {
        state.failed_auths.failed(ip);
        return poll_answer(
            StatusCode::BAD_REQUEST,
            PollStatus::Invalid,
            Some("deviceToken must be 32-128 hex characters"),
        );
    };
    match take(&state, &token.hash()).await {
        Ok(res) => {
            if res.status() == StatusCode::GONE {
                state.failed_auths.failed(ip);
            }
            res
        }
        Err(e) => poll_answer(e.status(), PollStatus::Error, Some(&e.to_string())),
    }
}

/// One poll of request `hash`.
async fn take(state: &AppState, hash: &str) -> Result<Response, ApiError> {
    let record = key(state, "req", hash);
    let mut redis = state.redis.clone();
    let interval = state.config.device_poll_interval_secs;
    let least_ms = (interval * 1000).saturating_sub(POLL_SLACK_MS);
    let found: Vec<String> = redis::Script::new(POLL_SCRIPT)
        .key(&record)
        .arg(least_ms)
        .invoke_async(&mut redis)
        .await
        .map_err(redis_err)?;
    let gone_msg = "device authorization missing or expired";
    match found.first().map(String::as_str) {
        Some("pending") => Ok(poll_answer(StatusCode::ACCEPTED, PollStatus::Pending, None)),
        Some("slow_down") => Ok(poll_answer(
            StatusCode::TOO_MANY_REQUESTS,
            PollStatus::SlowDown,
            Some(&format!(
                "polling faster than the interval; wait {interval} seconds longer between polls"
            )),
        )),
        Some("denied") => Ok(poll_answer(
            StatusCode::GONE,
            PollStatus::Denied,
            Some("the request was denied"),
        )),
        Some("approved") => {
            let [_, account, email, name] = <[String; 4]>::try_from(found)
                .map_err(|_| ApiError::Internal("device record".into()))?;
            let account =
                Uuid::parse_str(&account).map_err(|e| ApiError::internal("device account", e))?;
            match accounts::mint(state, account, &name, KeyMode::Live).await {
                Ok((api_key, _)) => {
                    // The key goes out even if the record cannot be deleted now: `minting`
                    // keeps any other poll from minting a second one until it expires.
                    let deleted: Result<(), _> =
                        redis::cmd("DEL").arg(&record).query_async(&mut redis).await;
                    if let Err(e) = deleted {
                        tracing::warn!(error = %e, "device record left to expire");
                    }
                    let body = PollAnswer {
                        success: true,
                        status: PollStatus::Approved,
                        api_key: Some(api_key),
                        email: Some(email),
                        error: None,
                    };
                    Ok((StatusCode::OK, Json(body)).into_response())
                }
                Err(e) => {
                    // Back to approved, so the next poll mints again; only if the record
                    // still exists and is this poll's (it may have expired meanwhile).
                    let restored: Result<i64, _> = redis::Script::new(RESTORE_SCRIPT)
                        .key(&record)
                        .invoke_async(&mut redis)
                        .await;
                    if let Err(r) = restored {
                        tracing::warn!(error = %r, "device record not restored after a failed mint");
                    }
                    Err(e)
                }
            }
        }
        _ => Ok(poll_answer(
            StatusCode::GONE,
            PollStatus::Expired,
            Some(gone_msg),
        )),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = CliAuthApproved)]
struct Approved {
    email: String,
}

/// `POST /cli/auth/approve {deviceToken}` with a session.
async fn approve(
    State(state): State<AppState>, Extension(session): Extension<Session>,
    JsonBody(body): JsonBody<TokenBody>,
) -> Result<Success<Approved>, ApiError> {
    let token = parse_token(&body.device_token)?;
    decide(&state, &session, &token.hash(), true, None).await?;
    Ok(Success::new(Approved {
        email: session.email,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_tokens_are_32_to_128_hex() {
        assert!(DeviceToken::parse(&"a".repeat(32)).is_some());
        assert!(DeviceToken::parse(&"F".repeat(128)).is_some());
        for bad in [
            "a".repeat(31),
            "a".repeat(129),
            format!("{}g", "a".repeat(40)),
            String::new(),
        ] {
            assert!(DeviceToken::parse(&bad).is_none(), "{bad}");
        }
        let upper = DeviceToken::parse(&"AB".repeat(20)).unwrap();
        assert_eq!(
            upper.hash(),
            DeviceToken::parse(&"ab".repeat(20)).unwrap().hash()
        );
    }

    #[test]
    fn user_codes_use_the_unambiguous_alphabet() {
        for _ in 0..200 {
            let code = new_user_code();
            assert_eq!(code.len(), 8);
            assert!(
                code.bytes().all(|b| USER_CODE_ALPHABET.contains(&b)),
                "{code}"
            );
        }
        assert_eq!(display_user_code("BCDFGHJK"), "BCDF-GHJK");
        assert_eq!(normalize_user_code(" bcdf-ghjk "), "BCDFGHJK");
    }
}
