//! `POST /smtp-auth`: checks an SMTP username against the calling key — it must be the
//! email bound to the key's account. Answers use the spec's `{authenticated, username,
//! error}` body, errors included.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use postmesh_shared::extract::Caller;
use postmesh_shared::EmailAddress;

/// The answer, for success and failure alike.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SmtpAuth {
    pub authenticated: bool,
    pub username: String,
    pub error: String,
}

/// The request: the SMTP username to check.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = SmtpAuthBody)]
pub(crate) struct Body {
    /// The email address bound to the API key.
    #[schema(format = Email, required = true, nullable = false)]
    username: Option<String>,
}

fn answer(status: StatusCode, username: String, error: &str) -> Response {
    let body = SmtpAuth {
        authenticated: status == StatusCode::OK,
        username,
        error: error.to_owned(),
    };
    (status, Json(body)).into_response()
}

pub(crate) async fn check(caller: Caller, body: Bytes) -> Response {
    let username = serde_json::from_slice::<Body>(&body)
        .ok()
        .and_then(|b| b.username)
        .unwrap_or_default();
    let Some(address) = EmailAddress::parse(&username) else {
        return answer(
            StatusCode::BAD_REQUEST,
            username,
            "username must be the email address bound to the API key",
        );
    };
    if address.as_str().eq_ignore_ascii_case(caller.email.trim()) {
        answer(StatusCode::OK, address.to_string(), "")
    } else {
        answer(
            StatusCode::FORBIDDEN,
            address.to_string(),
            "invalid credentials: the username is not bound to this API key",
        )
    }
}
