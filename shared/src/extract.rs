//! Request extractors that answer bad input with the spec's `{success:false, error}` body.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::ids::{ApiKeyId, WorkspaceId};
use crate::proto::AuthContext;

/// A JSON body; a malformed or mistyped body is a 400, an oversized one a 413.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Self(v)),
            Err(JsonRejection::BytesRejection(e))
                if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(ApiError::PayloadTooLarge("request body too large".into()))
            }
            Err(e) => Err(ApiError::BadRequest(format!(
                "invalid body: {}",
                e.body_text()
            ))),
        }
    }
}

/// Query parameters; malformed ones are a 400.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Self(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::BadRequest(format!("invalid query: {}", e.body_text()))
            })
    }
}

/// The caller as established by the gateway. Missing context is a 500, as the spec says.
pub struct Caller {
    pub auth: AuthContext,
    /// The calling API key, parsed.
    pub key: ApiKeyId,
    /// The key's workspace, parsed.
    pub workspace: WorkspaceId,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<AuthContext>()
            .and_then(|auth| {
                Some(Self {
                    key: ApiKeyId::parse(&auth.api_key_id)?,
                    workspace: WorkspaceId::parse(&auth.workspace_id)?,
                    auth: auth.clone(),
                })
            })
            .ok_or_else(|| ApiError::Internal("authentication context missing".into()))
    }
}
