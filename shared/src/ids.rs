//! Identifiers and keys parsed once at the edge: a value of these types is always valid.

use std::fmt;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use uuid::Uuid;

use crate::error::ApiError;

/// Declares a uuid identifier type, stored as a Postgres `uuid`.
macro_rules! uuid_id {
    ($(#[$doc:meta] $name:ident),* $(,)?) => {$(
        #[$doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type,
                 serde::Serialize, serde::Deserialize)]
        #[sqlx(transparent)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new time-ordered (v7) id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Parses the textual form; `None` when it is not a uuid.
            pub fn parse(raw: &str) -> Option<Self> {
                Uuid::parse_str(raw).ok().map(Self)
            }

            /// The id as a uuid.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                Self(id)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}

uuid_id! {
    /// An API key's id (not the secret key text).
    ApiKeyId,
    /// One message to deliver on the SEND work queue.
    JobId,
    /// A send request (`/send-email`): one task, one or more jobs.
    TaskId,
    /// The scope of API keys: plans and limits belong to a workspace.
    WorkspaceId,
}

/// The `idempotency-key` header of spec §4.3 rule 1: 16-100 letters, digits, `_` or `-`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The header that carries the key.
    pub const HEADER: &'static str = "idempotency-key";

    /// Parses a key; anything outside the rule is a 400.
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        let ok = (16..=100).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(ApiError::BadRequest(
                "idempotency-key must be 16-100 letters, digits, _ or -".into(),
            ))
        }
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The request's `idempotency-key` header; missing or malformed is a 400.
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let raw = parts
            .headers
            .get(Self::HEADER)
            .ok_or_else(|| ApiError::BadRequest("the idempotency-key header is required".into()))?;
        Self::parse(raw.to_str().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_follow_the_spec_rule() {
        for good in ["order_2026-11-23a", &"a".repeat(100), "ABCDEFGHIJ-_0123"] {
            assert_eq!(IdempotencyKey::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "short-key-15chr",
            &"a".repeat(101),
            "order 2026-11-23 x",
            "order.2026.11.23.x",
        ] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test]
    async fn the_header_is_required() {
        let req = |v: Option<&str>| {
            let mut b = axum::http::Request::builder();
            if let Some(v) = v {
                b = b.header(IdempotencyKey::HEADER, v);
            }
            b.body(()).unwrap().into_parts().0
        };
        let key =
            IdempotencyKey::from_request_parts(&mut req(Some("order_2026-11-23a")), &()).await;
        assert_eq!(key.unwrap().as_str(), "order_2026-11-23a");
        for missing in [None, Some("nope")] {
            let err = IdempotencyKey::from_request_parts(&mut req(missing), &()).await;
            assert!(matches!(err, Err(ApiError::BadRequest(_))));
        }
    }

    #[test]
    fn ids_parse_only_uuids() {
        let id = JobId::new();
        assert_eq!(JobId::parse(&id.to_string()), Some(id));
        assert_eq!(ApiKeyId::parse("not-a-uuid"), None);
    }
}
