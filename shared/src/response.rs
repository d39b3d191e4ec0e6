//! Typed success answers: `{success: true, ...fields of T}`.

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

/// A success answer: `success: true` beside the fields of `T`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Success<T> {
    /// Always true (errors are [`crate::error::ErrorBody`]).
    pub success: bool,
    #[serde(flatten)]
    pub body: T,
}

impl<T> Success<T> {
    /// Wraps `body` in the success envelope.
    pub fn new(body: T) -> Self {
        Self {
            success: true,
            body,
        }
    }
}

impl<T: Serialize> IntoResponse for Success<T> {
    fn into_response(self) -> Response {
        Json(self).into_response()
    }
}

/// A human-readable confirmation: `{success: true, message}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Message {
    pub message: String,
}

impl Success<Message> {
    /// `{success: true, message}`.
    pub fn message(text: impl Into<String>) -> Self {
        Self::new(Message {
            message: text.into(),
        })
    }
}
