//! Web sessions: a random id in the `pm_session` cookie (`__Host-pm_session` when
//! `PUBLIC_BASE_URL` is https), stored in Redis only as its SHA-256, with a 7-day sliding
//! expiry and an end 30 days after sign-in however it is used. The `Session` and `Page`
//! route policies load it.
//! Policy: docs/decisions.md, "Accounts and sessions".

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::ApiError;

use crate::AppState;

/// The session cookie's name over plain http (local runs).
pub const SESSION_COOKIE: &str = "pm_session";
/// Its name over https: the `__Host-` prefix makes browsers refuse it unless it is
/// `Secure`, for `Path=/` and set by this host alone (no subdomain can plant one).
pub const HOST_SESSION_COOKIE: &str = "__Host-pm_session";
/// Seconds a session lives after its last use.
pub const SESSION_TTL_SECS: u64 = 7 * 24 * 3600;
/// Seconds a session lives after its sign-in at most, however often it is used.
pub const SESSION_MAX_SECS: i64 = 30 * 24 * 3600;

/// The session cookie's name for this deployment.
pub fn session_cookie(state: &AppState) -> &'static str {
    if state.config.public_base_url.starts_with("https://") {
        HOST_SESSION_COOKIE
    } else {
        SESSION_COOKIE
    }
}

/// A signed-in user, as the `Session` and `Page` policies attach it to the request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Session {
    /// The signed-in account.
    pub account: Uuid,
    /// Its address, as stored.
    pub email: String,
    /// When it was signed in (Unix seconds); a session stored without one has ended.
    #[serde(default)]
    pub started_at: i64,
    /// The stored id's hash (the Redis key's last part).
    #[serde(skip)]
    pub id_hash: String,
}

/// 32 random bytes, hex: session ids, CSRF tokens, device request ids.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rngs::OsRng.fill_bytes(&mut buf);
    hex::encode(buf)
}

fn redis_err(e: redis::RedisError) -> ApiError {
    ApiError::redis("session store unavailable", e)
}

fn session_key(state: &AppState, id_hash: &str) -> String {
    state.ns.redis_key(&format!("session:{id_hash}"))
}

fn hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// Starts a session for `account`; the `Set-Cookie` value that carries it.
pub async fn start(state: &AppState, account: Uuid, email: &str) -> Result<HeaderValue, ApiError> {
    let id = random_hex(32);
    let session = Session {
        account,
        email: email.to_owned(),
        started_at: now_unix(),
        id_hash: String::new(),
    };
    let value = serde_json::to_string(&session).map_err(|e| ApiError::internal("session", e))?;
    let mut redis = state.redis.clone();
    redis::cmd("SET")
        .arg(session_key(state, &hash(&id)))
        .arg(value)
        .arg("EX")
        .arg(SESSION_TTL_SECS)
        .query_async::<()>(&mut redis)
        .await
        .map_err(redis_err)?;
    // The cookie lives as long as a session may; the store's expiry, pushed back at each
    // use, ends one left unused for 7 days.
    Ok(set_cookie(
        state,
        session_cookie(state),
        &id,
        SESSION_MAX_SECS.unsigned_abs(),
        "Lax",
    ))
}

/// The session the request's cookie names, its expiry pushed back 7 days; `None` without a
/// cookie, when the session ended or expired, or 30 days after its sign-in.
pub async fn load(state: &AppState, headers: &HeaderMap) -> Result<Option<Session>, ApiError> {
    let Some(id) = cookie(headers, session_cookie(state)) else {
        return Ok(None);
    };
    let id_hash = hash(id);
    let mut redis = state.redis.clone();
    let value: Option<String> = redis::cmd("GETEX")
        .arg(session_key(state, &id_hash))
        .arg("EX")
        .arg(SESSION_TTL_SECS)
        .query_async(&mut redis)
        .await
        .map_err(redis_err)?;
    let session = value
        .and_then(|v| serde_json::from_str::<Session>(&v).ok())
        .map(|s| Session { id_hash, ..s });
    match session {
        Some(s) if now_unix() - s.started_at >= SESSION_MAX_SECS => {
            end(state, &s).await?;
            Ok(None)
        }
        session => Ok(session),
    }
}

/// Ends `session`; the `Set-Cookie` value that clears the cookie.
pub async fn end(state: &AppState, session: &Session) -> Result<HeaderValue, ApiError> {
    let mut redis = state.redis.clone();
    redis::cmd("DEL")
        .arg(session_key(state, &session.id_hash))
        .query_async::<()>(&mut redis)
        .await
        .map_err(redis_err)?;
    Ok(set_cookie(state, session_cookie(state), "", 0, "Lax"))
}

/// A `Set-Cookie` value: `HttpOnly`, `Path=/`, `Secure` unless `PUBLIC_BASE_URL` is
/// plain `http://`.
pub fn set_cookie(
    state: &AppState, name: &str, value: &str, max_age: u64, same_site: &str,
) -> HeaderValue {
    let secure = if state.config.public_base_url.starts_with("http://") {
        ""
    } else {
        "; Secure"
    };
    let text = format!(
        "{name}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite={same_site}{secure}"
    );
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The value of cookie `name` in the request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// The `Session` policy: the request's session is attached, or 401.
pub async fn require_session(
    State(state): State<AppState>, mut req: Request, next: Next,
) -> Result<Response<Body>, ApiError> {
    let session = load(&state, req.headers())
        .await?
        .ok_or_else(|| ApiError::Unauthorized("not logged in".into()))?;
    spend(&state, &session).await?;
    req.extensions_mut().insert(session);
    Ok(next.run(req).await)
}

/// Counts a signed-in request against its account's rate, as a key's request is: a
/// session buys no more requests than the account's keys.
async fn spend(state: &AppState, session: &Session) -> Result<(), ApiError> {
    let mut redis = state.redis.clone();
    let account = session.account.to_string();
    state
        .rate
        .check_account(&mut redis, &state.ns, &account)
        .await
}

/// The `Page` policy: the request's session is attached, or the browser goes to
/// `/app/login`, coming back here (a `GET`) once signed in.
pub async fn require_page_session(
    State(state): State<AppState>, mut req: Request, next: Next,
) -> Result<Response<Body>, ApiError> {
    let Some(session) = load(&state, req.headers()).await? else {
        let back = match (
            req.method() == http::Method::GET,
            req.uri().path_and_query(),
        ) {
            (true, Some(pq)) => format!("?next={}", urlencode(pq.as_str())),
            _ => String::new(),
        };
        return Ok(see_other(&format!("/app/login{back}")));
    };
    spend(&state, &session).await?;
    req.extensions_mut().insert(session);
    Ok(next.run(req).await)
}

/// A `303 See Other` to `location`.
pub fn see_other(location: &str) -> Response<Body> {
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    res
}

/// `text` percent-encoded for a query value.
pub fn urlencode(text: &str) -> String {
    serde_urlencoded::to_string([("", text)])
        .map(|s| s.trim_start_matches('=').to_owned())
        .unwrap_or_default()
}

/// The caller's IP: the connection's peer, or with `GATEWAY_TRUST_FORWARDED_FOR` the last
/// `X-Forwarded-For` entry (the one our own proxy appended).
pub fn client_ip(state: &AppState, req: &http::request::Parts) -> Option<IpAddr> {
    if state.config.trust_forwarded_for {
        let forwarded = req
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .last()
            .and_then(|ip| ip.trim().parse().ok());
        if forwarded.is_some() {
            return forwarded;
        }
    }
    req.extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_name_among_several() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; pm_session=abc"),
        );
        headers.append(header::COOKIE, HeaderValue::from_static("pm_csrf=xyz"));
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "pm_csrf"), Some("xyz"));
        assert_eq!(cookie(&headers, "pm"), None);
        headers.insert(header::COOKIE, HeaderValue::from_static("pm_session="));
        assert_eq!(cookie(&headers, SESSION_COOKIE), None);
    }

    #[test]
    fn next_urls_are_encoded() {
        assert_eq!(
            urlencode("/app/device?request=ab&x=1"),
            "%2Fapp%2Fdevice%3Frequest%3Dab%26x%3D1"
        );
    }
}
