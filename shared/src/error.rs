//! The one error type of the API, mapped once to the spec's status codes and its
//! `{success:false, error}` body, and to/from the typed `RpcError` carried over NATS.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::proto::RpcError;

/// An error answered to an API caller. The variant decides the HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    PaymentRequired(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// Rate or abuse limit hit; the caller may retry after `retry_after` seconds.
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u64 },
    /// Server-side failure; the message is logged, the caller sees a generic text.
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    BadGateway(String),
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    /// Wraps an unexpected failure, logging its detail.
    pub fn internal(context: &str, err: impl std::fmt::Display) -> Self {
        tracing::error!(error = %err, "{context}");
        Self::Internal(context.to_owned())
    }

    /// Wraps a store or database that did not answer (connection lost, refused, timed
    /// out), logging its detail: 503, so the caller retries.
    pub fn unavailable(context: &str, err: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %err, "{context}");
        Self::Unavailable(format!("{context}; retry shortly"))
    }

    /// A Redis failure: 503 when the connection failed (the caller may retry), else 500.
    pub fn redis(context: &str, e: redis::RedisError) -> Self {
        let connection = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_unrecoverable_error();
        if connection {
            Self::unavailable(context, e)
        } else {
            Self::internal(context, e)
        }
    }

    /// 403 unless a workspace that holds `held` of `what` (a plural: "mailboxes") may add
    /// one more under its plan's `limit`.
    pub fn within_plan(held: i64, limit: i64, what: &str) -> Result<(), ApiError> {
        if held < limit {
            return Ok(());
        }
        Err(Self::Forbidden(format!(
            "your plan allows {limit} {what} and this workspace has {held}: see /billing/entitlements"
        )))
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::PaymentRequired(_) => StatusCode::PAYMENT_REQUIRED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Gone(_) => StatusCode::GONE,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Seconds to wait before retrying, for errors that say so.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::TooManyRequests { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The error as carried in an RPC reply.
    pub fn to_rpc(&self) -> RpcError {
        RpcError {
            status: u32::from(self.status().as_u16()),
            message: self.to_string(),
            retry_after_secs: self.retry_after().unwrap_or(0),
        }
    }

    /// Rebuilds the error from an RPC reply; unknown codes become 502 (upstream error).
    pub fn from_rpc(e: RpcError) -> Self {
        let m = e.message;
        match e.status {
            400 => Self::BadRequest(m),
            401 => Self::Unauthorized(m),
            402 => Self::PaymentRequired(m),
            403 => Self::Forbidden(m),
            404 => Self::NotFound(m),
            405 => Self::MethodNotAllowed,
            409 => Self::Conflict(m),
            410 => Self::Gone(m),
            413 => Self::PayloadTooLarge(m),
            429 => Self::TooManyRequests {
                message: m,
                retry_after: e.retry_after_secs.max(1),
            },
            500 => Self::Internal(m),
            503 => Self::Unavailable(m),
            _ => Self::BadGateway(m),
        }
    }
}

/// The body of every error answer: `{success: false, error}`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ErrorBody {
    pub success: bool,
    pub error: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = self.retry_after();
        let body = ErrorBody {
            success: false,
            error: self.to_string(),
        };
        let mut res = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        res
    }
}

/// Whether `e` means the database could not be reached or went away (pool timeout, I/O,
/// a server shutting down or not yet accepting connections: SQLSTATE classes 08 and 57P)
/// rather than that it refused the statement.
pub fn database_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

impl From<sqlx::Error> for ApiError {
    /// 503 when the database could not be reached or went away, else 500.
    fn from(e: sqlx::Error) -> Self {
        if database_unreachable(&e) {
            Self::unavailable("database unavailable", e)
        } else {
            Self::internal("database error", e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_503_and_a_bad_query_500() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let db = |e: sqlx::Error| ApiError::from(e).status();
        assert_eq!(
            db(sqlx::Error::PoolTimedOut),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            db(sqlx::Error::Io(refused())),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            db(sqlx::Error::RowNotFound),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let cache = |e: redis::RedisError| ApiError::redis("store", e).status();
        assert_eq!(cache(refused().into()), StatusCode::SERVICE_UNAVAILABLE);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(cache(reset.into()), StatusCode::SERVICE_UNAVAILABLE);
        let typed = (redis::ErrorKind::UnexpectedReturnType, "not a number");
        assert_eq!(cache(typed.into()), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn rpc_round_trip_keeps_status_and_retry_hint() {
        let e = ApiError::TooManyRequests {
            message: "slow down: 3:2".into(),
            retry_after: 42,
        };
        let wire = e.to_rpc();
        assert_eq!(
            (wire.retry_after_secs, wire.message.as_str()),
            (42, "slow down: 3:2")
        );
        match ApiError::from_rpc(wire) {
            ApiError::TooManyRequests {
                message,
                retry_after,
            } => assert_eq!((message.as_str(), retry_after), ("slow down: 3:2", 42)),
            other => panic!("unexpected {other:?}"),
        }
        let back = ApiError::from_rpc(ApiError::PaymentRequired("broke".into()).to_rpc());
        assert_eq!(back.status(), StatusCode::PAYMENT_REQUIRED);
        assert_eq!(back.to_string(), "broke");
        let unknown = ApiError::from_rpc(RpcError {
            status: 418,
            message: "x".into(),
            retry_after_secs: 0,
        });
        assert_eq!(unknown.status(), StatusCode::BAD_GATEWAY);
    }
}
