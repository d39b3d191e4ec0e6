//! Web login: `POST /login/code` emails a login code, `POST /verify-code-login` checks it
//! and starts a session (signing an unknown address up), `POST /logout` ends it. The web
//! app's login pages use the same steps. Policy: docs/decisions.md, "Accounts and sessions".

use std::net::IpAddr;

use axum::extract::State;
use axum::http::{header, request::Parts, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::extract::JsonBody;
use postmesh_shared::response::Message;
use postmesh_shared::{ApiError, EmailAddress, Routes, Success};

use crate::codes::{check_login_code, parse_email, send_login_code};
use crate::sessions::{self, Session};
use crate::{accounts, AppState};

/// The routes of web login.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::LOGIN_CODE, login_code)
        .answers::<Success<Message>>()
        .at(api::VERIFY_CODE_LOGIN, verify_code_login)
        .answers::<Success<Message>>()
        .at(api::LOGOUT, logout)
        .answers::<Success<Message>>()
}

/// Counts a login attempt of `kind` (`code`: a login code; `device`: a CLI login) from
/// `ip`; 429 over `LOGIN_IP_HOURLY_LIMIT` of that kind an hour. IPv6 clients count by /64,
/// the block one subscriber usually holds.
pub async fn limit_ip(state: &AppState, kind: &str, ip: Option<IpAddr>) -> Result<(), ApiError> {
    let Some(ip) = ip else {
        return Ok(());
    };
    let bucket = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    };
    let key = state.ns.redis_key(&format!("login:ip:{kind}:{bucket}"));
    let mut redis = state.redis.clone();
    let (count, ttl): (u64, i64) = redis::pipe()
        .atomic()
        .incr(&key, 1)
        .cmd("EXPIRE")
        .arg(&key)
        .arg(3600)
        .arg("NX")
        .ignore()
        .ttl(&key)
        .query_async(&mut redis)
        .await
        .map_err(|e| ApiError::redis("login limit unavailable", e))?;
    if count > u64::from(state.config.login_ip_hourly_limit) {
        return Err(ApiError::TooManyRequests {
            message: "too many login attempts from this network address this hour".into(),
            retry_after: ttl.max(1) as u64,
        });
    }
    Ok(())
}

/// Emails a login code to `email` asked for from `ip`, within the per-IP and per-address
/// limits. Known and unknown addresses are treated alike.
pub async fn send_code(
    state: &AppState, ip: Option<IpAddr>, email: &EmailAddress,
) -> Result<(), ApiError> {
    limit_ip(state, "code", ip).await?;
    send_login_code(state, email).await
}

/// Checks `code` for `email` (within `LOGIN_IP_HOURLY_LIMIT` tries an hour from `ip`) and
/// starts a session, signing the address up on first login;
/// the session's `Set-Cookie` value.
pub async fn sign_in(
    state: &AppState, ip: Option<IpAddr>, email: &EmailAddress, code: &str,
) -> Result<HeaderValue, ApiError> {
    limit_ip(state, "verify", ip).await?;
    check_login_code(state, email, code).await?;
    let (account, stored) = accounts::find_or_register(state, email).await?;
    sessions::start(state, account, &stored).await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = LoginCodeRequest)]
struct CodeBody {
    #[schema(format = Email)]
    email: String,
}

/// `POST /login/code {email}`.
async fn login_code(
    State(state): State<AppState>, parts: Parts, JsonBody(body): JsonBody<CodeBody>,
) -> Result<Response, ApiError> {
    let email = parse_email(&body.email)?;
    send_code(&state, sessions::client_ip(&state, &parts), &email).await?;
    Ok(Success::message("a login code is on its way to that address").into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = LoginVerifyRequest)]
struct VerifyBody {
    #[schema(format = Email)]
    email: String,
    code: String,
}

/// `POST /verify-code-login {email, code}`: 200 and the session cookie.
async fn verify_code_login(
    State(state): State<AppState>, parts: Parts, JsonBody(body): JsonBody<VerifyBody>,
) -> Result<Response, ApiError> {
    let email = parse_email(&body.email)?;
    let ip = sessions::client_ip(&state, &parts);
    let cookie = sign_in(&state, ip, &email, &body.code).await?;
    let mut res = Success::message("logged in").into_response();
    res.headers_mut().append(header::SET_COOKIE, cookie);
    Ok(res)
}

/// `POST /logout`.
async fn logout(
    State(state): State<AppState>, Extension(session): Extension<Session>,
) -> Result<Response, ApiError> {
    let cookie = sessions::end(&state, &session).await?;
    let mut res = Success::message("logged out").into_response();
    res.headers_mut().append(header::SET_COOKIE, cookie);
    Ok(res)
}
