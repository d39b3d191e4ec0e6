//! Typed success answers: `{success: true, ...fields of T}`.

use std::borrow::Cow;

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

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

/// `{success: true}` joined with `T`'s fields (`allOf`), named `T`'s name + `Answer`.
impl<T: ToSchema> PartialSchema for Success<T> {
    fn schema() -> RefOr<Schema> {
        let success = ObjectBuilder::new()
            .property("success", ObjectBuilder::new().schema_type(Type::Boolean))
            .required("success");
        AllOfBuilder::new()
            .item(success)
            .item(Ref::from_schema_name(T::name()))
            .into()
    }
}

impl<T: ToSchema> ToSchema for Success<T> {
    fn name() -> Cow<'static, str> {
        Cow::Owned(format!("{}Answer", T::name()))
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((T::name().into_owned(), T::schema()));
        T::schemas(schemas);
    }
}

impl<T: Serialize> IntoResponse for Success<T> {
    fn into_response(self) -> Response {
        Json(self).into_response()
    }
}

/// A human-readable confirmation: `{success: true, message}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
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
