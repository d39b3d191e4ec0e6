//! Request extractors that answer bad input with the spec's `{success:false, error}` body.

use axum::extract::rejection::QueryRejection;
use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::ids::{AccountId, ApiKeyId, WorkspaceId};
use crate::proto::{AuthContext, ChargeRequest, Role};

/// A JSON body; a malformed or mistyped body is a 400, as is one holding a NUL character
/// (`\u0000`: PostgreSQL stores none in text or jsonb); an oversized one is a 413.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send + 'static> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(ApiError::BadRequest(
                "invalid body: Expected request with `Content-Type: application/json`".into(),
            ));
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => {
                    ApiError::PayloadTooLarge("request body too large".into())
                }
                _ => ApiError::BadRequest(format!("invalid body: {}", e.body_text())),
            })?;
        // A large body is read on the CPU pool, off the worker other requests share.
        crate::cpu::run_sized(bytes.len(), move || {
            if holds_nul(&bytes) {
                return Err(ApiError::BadRequest(
                    "invalid body: text must not hold NUL characters (\\u0000)".into(),
                ));
            }
            axum::Json::<T>::from_bytes(&bytes)
                .map(|axum::Json(v)| Self(v))
                .map_err(|e| ApiError::BadRequest(format!("invalid body: {}", e.body_text())))
        })
        .await
    }
}

/// Whether the content type is JSON: `application/json` or `application/…+json`.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|subtype| subtype.ends_with("+json"))
}

/// Whether a JSON text escapes a NUL (`\u0000`) in one of its strings: the escape's
/// backslash must not itself be escaped (`\\u0000` is a backslash and `u0000`).
pub fn holds_nul(json: &[u8]) -> bool {
    json.windows(6).enumerate().any(|(at, window)| {
        window == b"\\u0000"
            && json[..at].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 0
    })
}

/// The largest page of a list.
pub const MAX_PAGE: i64 = 500;

/// `limit` (1-500) and `offset` (0 or more) of a list's page.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
pub struct PageQuery {
    /// Items on the page (1-500; each list has its default).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// Items skipped before the page.
    #[param(minimum = 0)]
    pub offset: Option<i64>,
}

/// A page of a list: at most `limit` items after the first `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Page {
    pub limit: i64,
    pub offset: i64,
}

impl Page {
    /// The page a list's own `limit` and `offset` parameters ask for (a list with filters
    /// of its own keeps them beside these), `default` items without a limit.
    pub fn of(limit: Option<i64>, offset: Option<i64>, default: i64) -> Result<Self, ApiError> {
        Self::within(limit, offset, default, MAX_PAGE)
    }

    /// [`Page::of`] for a list that allows up to `max` items a page.
    pub fn within(
        limit: Option<i64>, offset: Option<i64>, default: i64, max: i64,
    ) -> Result<Self, ApiError> {
        let limit = limit.unwrap_or(default);
        let offset = offset.unwrap_or(0);
        if !(1..=max).contains(&limit) || offset < 0 {
            return Err(ApiError::BadRequest(format!(
                "limit must be 1-{max} and offset 0 or more"
            )));
        }
        Ok(Self { limit, offset })
    }
}

impl PageQuery {
    /// The page asked for, `default` items when no limit is given; 400 out of bounds.
    pub fn page(&self, default: i64) -> Result<Page, ApiError> {
        Page::of(self.limit, self.offset, default)
    }
}

/// Query parameters; malformed ones are a 400.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // No text column holds a NUL: refused here rather than a 500 from the database.
        if parts.uri.query().is_some_and(|q| {
            q.as_bytes()
                .windows(3)
                .any(|w| w[0] == b'%' && w[1] == b'0' && w[2] == b'0')
        }) {
            return Err(ApiError::BadRequest(
                "invalid query: a parameter holds a NUL character".into(),
            ));
        }
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Self(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::BadRequest(format!("invalid query: {}", e.body_text()))
            })
    }
}

/// The path's one parameter (`{id}`, `{task_id}`) parsed as `T`, a typed id or a uuid; a
/// malformed one is a 400 that names it.
pub struct IdPath<T>(pub T);

impl<S: Send + Sync, T: FromStr + Send> FromRequestParts<S> for IdPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))?;
        id_in_path(&raw).map(Self)
    }
}

/// The path's two parameters (`{id}/…/{attemptId}`) parsed as `A` and `B`, as [`IdPath`]
/// parses one; a malformed one is a 400 that names it.
pub struct IdPairPath<A, B>(pub A, pub B);

impl<S: Send + Sync, A: FromStr + Send, B: FromStr + Send> FromRequestParts<S>
    for IdPairPath<A, B>
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path((a, b)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))?;
        Ok(Self(id_in_path(&a)?, id_in_path(&b)?))
    }
}

/// One id of the path, or the 400 that names it.
fn id_in_path<T: FromStr>(raw: &str) -> Result<T, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::BadRequest(format!("{raw:?} in the path is not a valid id")))
}

/// The workspace an RPC request names in its `workspace_id` field; a malformed one is a 400.
pub fn rpc_workspace(raw: &str) -> Result<WorkspaceId, ApiError> {
    WorkspaceId::parse(raw).ok_or_else(|| ApiError::BadRequest("invalid workspace_id".into()))
}

/// The caller as established by the gateway, parsed once. Missing or malformed context is
/// a 500, as the spec says: only the gateway sets it.
#[derive(Clone, Debug)]
pub struct Caller {
    pub account: AccountId,
    pub workspace: WorkspaceId,
    /// The key whose balance pays: the account's primary key, whichever key called.
    pub key: ApiKeyId,
    pub role: Role,
    /// The account's email address.
    pub email: String,
    /// A test key called: its sends are stored and shown, never delivered or charged.
    pub test: bool,
}

impl Caller {
    /// Parses the context the gateway attached; `None` when an id is not a uuid or the
    /// role is unknown.
    pub fn parse(auth: &AuthContext) -> Option<Self> {
        Some(Self {
            account: AccountId::parse(&auth.account_id)?,
            workspace: WorkspaceId::parse(&auth.workspace_id)?,
            key: ApiKeyId::parse(&auth.api_key_id)?,
            role: Role::try_from(auth.role)
                .ok()
                .filter(|r| *r != Role::Unspecified)?,
            email: auth.email.clone(),
            test: auth.test,
        })
    }

    /// Whether the caller is an operator of the platform.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// A charge of `cost` credits to the caller's key under `idempotency_key`; the other
    /// fields are the caller's to set.
    pub fn charge(&self, cost: i64, idempotency_key: String) -> ChargeRequest {
        ChargeRequest {
            api_key_id: self.key.to_string(),
            account_id: self.account.to_string(),
            caller_email: self.email.clone(),
            cost,
            idempotency_key,
            ..Default::default()
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<AuthContext>()
            .and_then(Self::parse)
            .ok_or_else(|| ApiError::Internal("authentication context missing".into()))
    }
}

/// The `idempotency-key` header of spec §4.3 rule 1: 16-100 letters, digits, `_` or `-`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The header that carries the key.
    pub const HEADER: &'static str = "idempotency-key";

    /// What a key must match, as a regular expression (what [`IdempotencyKey::parse`] checks).
    pub const PATTERN: &'static str = "^[A-Za-z0-9_-]{16,100}$";

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

/// An optional `idempotency-key` header: absent is `None`, malformed a 400.
impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, ApiError> {
        match parts.headers.get(Self::HEADER) {
            None => Ok(None),
            Some(raw) => Self::parse(raw.to_str().unwrap_or_default()).map(Some),
        }
    }
}

/// Declares a request's text field taken as given (`#[serde(transparent)]`) before the route
/// checks it, with the schema of what the check takes beside it: `text_input! { /// doc
/// pub struct Name as "Component" = schema_expr; }`. It derefs to `str` and converts from
/// `&str` and `String`; add `#[derive(Debug)]` unless it must not print its text.
#[macro_export]
macro_rules! text_input {
    ($(#[$attr:meta])* $vis:vis struct $name:ident as $component:literal = $schema:expr;) => {
        $(#[$attr])*
        #[derive(Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
        #[serde(transparent)]
        $vis struct $name(String);

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                Self(text.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                Self(text)
            }
        }

        impl From<$name> for String {
            fn from(text: $name) -> Self {
                text.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
                ($schema).into()
            }
        }

        impl utoipa::ToSchema for $name {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed($component)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escaped_nul_is_found_and_an_escaped_backslash_is_not_one() {
        assert!(holds_nul(br#"{"a": "x\u0000y"}"#));
        assert!(holds_nul(br#"{"\u0000": 1}"#));
        assert!(holds_nul(br#"["\\\u0000"]"#));
        assert!(!holds_nul(br#"{"a": "x\\u0000y"}"#));
        assert!(!holds_nul(br#"{"a": "\u0001"}"#));
    }

    #[test]
    fn json_content_types_are_json_and_its_suffix() {
        let headers = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, v.parse().unwrap());
            h
        };
        assert!(json_content_type(&headers("application/json")));
        assert!(json_content_type(&headers(
            "Application/JSON; charset=utf-8"
        )));
        assert!(json_content_type(&headers("application/merge-patch+json")));
        assert!(!json_content_type(&headers("text/plain")));
        assert!(!json_content_type(&headers("application/jsonx")));
        assert!(!json_content_type(&HeaderMap::new()));
    }

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

    #[tokio::test]
    async fn both_ids_of_a_pair_path_are_parsed() {
        use axum::body::Body;
        use tower::ServiceExt;
        let app = axum::Router::new().route(
            "/a/{x}/b/{y}",
            axum::routing::get(|IdPairPath(x, y): IdPairPath<uuid::Uuid, u32>| async move {
                format!("{x} {y}")
            }),
        );
        let get = |path: &str| {
            let req = axum::http::Request::get(path).body(Body::empty()).unwrap();
            let app = app.clone();
            async move {
                let res = app.oneshot(req).await.unwrap();
                let status = res.status();
                let body = axum::body::to_bytes(res.into_body(), 1 << 16)
                    .await
                    .unwrap();
                (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
            }
        };
        let id = uuid::Uuid::nil();
        assert_eq!(get(&format!("/a/{id}/b/7")).await, (200, format!("{id} 7")));
        for (path, named) in [
            ("/a/nope/b/7".to_owned(), "nope"),
            (format!("/a/{id}/b/x1"), "x1"),
        ] {
            let (status, body) = get(&path).await;
            assert_eq!(status, 400, "{path}: {body}");
            assert!(
                body.contains(&format!("\\\"{named}\\\" in the path is not a valid id")),
                "{body}"
            );
        }
    }
}
