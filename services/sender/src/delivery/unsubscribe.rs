//! One-click unsubscribe (RFC 8058). `marketing` and `lifecycle` mail carries
//! `List-Unsubscribe: <{PUBLIC_BASE_URL}/unsubscribe?token=…>` and `List-Unsubscribe-Post:
//! List-Unsubscribe=One-Click`; the token is an HMAC-SHA256 (`UNSUBSCRIBE_SECRET`) over the
//! workspace, the address, the topic and an expiry `UNSUBSCRIBE_TOKEN_DAYS` ahead.
//! `GET /unsubscribe?token=` shows a confirmation page with a form; `POST /unsubscribe`
//! (token in a JSON body, a form field or the query) writes the suppression and an
//! `unsubscribed` delivery event, once however often it is posted. Both answer HTML.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use postmesh_shared::db::now_unix;
use postmesh_shared::text::escape_html;
use postmesh_shared::{EmailAddress, WorkspaceId};

use crate::audience::suppressions::{self, Reason};
use crate::sending::events::{self, Detail, Kind, NewEvent};
use crate::AppState;

/// What a token says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    #[serde(rename = "w")]
    pub workspace: Uuid,
    #[serde(rename = "e")]
    pub email: String,
    /// The topic unsubscribed from; none: every topic.
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Unix seconds after which the token is refused.
    #[serde(rename = "x")]
    pub expires: i64,
    /// The message the link came in, whose events the unsubscribe joins (tokens made
    /// before it was carried have none).
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Uuid>,
}

/// Signs and checks unsubscribe tokens and makes their links.
#[derive(Clone)]
pub struct Unsubscribe {
    secret: Vec<u8>,
    ttl_days: i64,
    base_url: String,
}

impl std::fmt::Debug for Unsubscribe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unsubscribe")
            .field("ttl_days", &self.ttl_days)
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Unsubscribe {
    /// Tokens signed with `secret`, valid `ttl_days`, linked under `base_url`.
    pub fn new(secret: &str, ttl_days: i64, base_url: &str) -> Self {
        Self {
            secret: secret.as_bytes().to_vec(),
            ttl_days,
            base_url: base_url.trim_end_matches('/').to_owned(),
        }
    }

    fn mac(&self, payload: &[u8]) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
        mac.update(payload);
        mac.finalize().into_bytes().to_vec()
    }

    /// A token for `email` of `workspace` on `topic`, made at `now` for the message
    /// `delivery`.
    pub fn token(
        &self, workspace: Uuid, email: &str, topic: Option<&str>, delivery: Option<Uuid>, now: i64,
    ) -> String {
        let claims = Claims {
            workspace,
            email: email.to_owned(),
            topic: topic.map(str::to_owned),
            expires: now + self.ttl_days * 24 * 3600,
            delivery,
        };
        let payload = serde_json::to_vec(&claims).expect("claims serialize");
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(self.mac(&payload))
        )
    }

    /// The unsubscribe link of `token`.
    pub fn url(&self, token: &str) -> String {
        format!("{}/unsubscribe?token={token}", self.base_url)
    }

    /// What `token` says, if it is ours and not expired at `now`.
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, &'static str> {
        let (payload, signature) = token.trim().split_once('.').ok_or("malformed")?;
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| "malformed")?;
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| "malformed")?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length");
        mac.update(&payload);
        mac.verify_slice(&signature)
            .map_err(|_| "not signed by us")?;
        let claims: Claims = serde_json::from_slice(&payload).map_err(|_| "malformed")?;
        if claims.expires < now {
            return Err("expired");
        }
        Ok(claims)
    }
}

/// A plain page: no scripts, no outside assets.
fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title></head>\n<body><main><h1>{title}</h1>\n{body}\n</main></body></html>\n",
        title = escape_html(title),
    );
    (status, Html(html)).into_response()
}

fn refused(why: &str) -> Response {
    page(
        StatusCode::BAD_REQUEST,
        "This unsubscribe link does not work",
        &format!(
            "<p>The link is {}. Use the unsubscribe link of a more recent email.</p>",
            escape_html(why)
        ),
    )
}

fn unavailable() -> Response {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Unsubscribing is not available",
        "<p>Please try again later.</p>",
    )
}

/// What the address is unsubscribed from, in words.
fn scope(claims: &Claims) -> String {
    match &claims.topic {
        Some(topic) => format!("emails about <strong>{}</strong>", escape_html(topic)),
        None => "marketing and lifecycle emails".into(),
    }
}

/// `?token=`, or a JSON body's `token`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = UnsubscribeToken)]
pub struct TokenQuery {
    pub token: Option<String>,
}

/// The query's token; why the query does not read as one (`?token=a&token=b`), refused
/// with the same page as a bad token.
fn query_token(
    query: Result<Query<TokenQuery>, QueryRejection>,
) -> Result<Option<String>, &'static str> {
    query.map(|Query(q)| q.token).map_err(|_| "malformed")
}

pub(crate) async fn confirm_page(
    State(state): State<AppState>, query: Result<Query<TokenQuery>, QueryRejection>,
) -> Response {
    let Some(signer) = &state.unsubscribe else {
        return unavailable();
    };
    let token = match query_token(query) {
        Ok(token) => token.unwrap_or_default(),
        Err(why) => return refused(why),
    };
    let claims = match signer.verify(&token, now_unix()) {
        Ok(claims) => claims,
        Err(why) => return refused(why),
    };
    page(
        StatusCode::OK,
        "Unsubscribe",
        &format!(
            "<p>Stop sending {} to <strong>{}</strong>?</p>\n\
             <form method=\"post\" action=\"/unsubscribe\">\
             <input type=\"hidden\" name=\"token\" value=\"{}\">\
             <button type=\"submit\">Unsubscribe</button></form>",
            scope(&claims),
            escape_html(&claims.email),
            escape_html(&token)
        ),
    )
}

/// The token of a POST: the JSON body's or the form's `token`, else the query's (RFC 8058's
/// one-click POST carries `List-Unsubscribe=One-Click` in the body and the token in the URL),
/// without white space around it.
fn posted_token(headers: &HeaderMap, body: &[u8], query: Option<String>) -> Option<String> {
    let kind = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let from_body = if kind.starts_with("application/json") {
        serde_json::from_slice::<TokenQuery>(body)
            .ok()
            .and_then(|b| b.token)
    } else if kind.starts_with("application/x-www-form-urlencoded") {
        serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
            .ok()
            .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "token").map(|p| p.1))
    } else {
        None
    };
    // Trimmed once here: the signature written as the event's key is the one verified.
    from_body
        .or(query)
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

pub(crate) async fn unsubscribe(
    State(state): State<AppState>, query: Result<Query<TokenQuery>, QueryRejection>,
    headers: HeaderMap, body: Bytes,
) -> Response {
    let Some(signer) = &state.unsubscribe else {
        return unavailable();
    };
    let query = match query_token(query) {
        Ok(token) => token,
        Err(why) => return refused(why),
    };
    let Some(token) = posted_token(&headers, &body, query) else {
        return refused("missing its token");
    };
    let claims = match signer.verify(&token, now_unix()) {
        Ok(claims) => claims,
        Err(why) => return refused(why),
    };
    let Some(email) = EmailAddress::parse(&claims.email) else {
        return refused("malformed");
    };
    let Some(signature) = token.split_once('.').map(|(_, s)| s.to_owned()) else {
        return refused("malformed");
    };
    let written = async {
        let mut tx = state.db.begin().await?;
        let workspace = WorkspaceId::from(claims.workspace);
        suppressions::add(
            &mut *tx,
            workspace,
            &email,
            Reason::Unsubscribed,
            claims.topic.as_deref(),
        )
        .await?;
        // The message the link came in, when the token names it: its task.
        let task: Option<Uuid> = match claims.delivery {
            Some(delivery) => {
                sqlx::query_scalar(
                    "SELECT r.task_id FROM task_recipients r JOIN tasks t ON t.id = r.task_id
                     WHERE r.delivery_id = $1 AND t.workspace_id = $2",
                )
                .bind(delivery)
                .bind(claims.workspace)
                .fetch_optional(&mut *tx)
                .await?
            }
            None => None,
        };
        let event = NewEvent {
            workspace: claims.workspace,
            task,
            delivery: task.and(claims.delivery),
            email: email.to_string(),
            kind: Kind::Unsubscribed,
            detail: Detail::Unsubscribed {
                reason: crate::delivery::provider::unsubscribed_from(
                    claims.topic.as_deref(),
                    "by one-click link",
                ),
                topic: claims.topic.clone(),
                source: None,
            },
            occurred_at: now_unix(),
            source_key: format!("unsubscribe:{signature}"),
        };
        events::record(&mut tx, &state.events, &[event]).await?;
        tx.commit().await
    };
    if let Err(e) = written.await {
        tracing::error!(error = %e, "recording an unsubscribe failed");
        return unavailable();
    }
    crate::sending::send::publish_soon(&state);
    page(
        StatusCode::OK,
        "You are unsubscribed",
        &format!(
            "<p><strong>{}</strong> will get no more {}.</p>",
            escape_html(&claims.email),
            scope(&claims)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_until_they_expire_and_only_with_our_secret() {
        let signer = Unsubscribe::new("secret", 60, "https://mail.example.com/");
        let ws = Uuid::now_v7();
        let delivery = Uuid::now_v7();
        let token = signer.token(ws, "ann@example.com", Some("news"), Some(delivery), 1000);
        let claims = signer.verify(&token, 1000 + 59 * 86400).unwrap();
        assert_eq!(
            (
                claims.workspace,
                claims.email.as_str(),
                claims.topic.as_deref(),
                claims.delivery
            ),
            (ws, "ann@example.com", Some("news"), Some(delivery))
        );
        assert_eq!(signer.verify(&token, 1000 + 61 * 86400), Err("expired"));
        let other = Unsubscribe::new("other", 60, "");
        assert_eq!(other.verify(&token, 1000), Err("not signed by us"));
        let (payload, sig) = token.split_once('.').unwrap();
        let forged = URL_SAFE_NO_PAD.encode(
            String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap())
                .unwrap()
                .replace("ann@", "bob@"),
        );
        assert!(signer.verify(&format!("{forged}.{sig}"), 1000).is_err());
        assert!(signer
            .url(&token)
            .starts_with("https://mail.example.com/unsubscribe?token="));
    }
}
