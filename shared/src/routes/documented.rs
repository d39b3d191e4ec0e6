//! What a handler's own signature tells the API's document: the JSON body it takes
//! (`JsonBody<T>`), the query it reads (`QueryParams<T>`) and the JSON it answers on success
//! (`Success<T>`), so that `Routes::at` documents a route from its handler and the two
//! cannot disagree.

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, Redirect, Response};
use axum::{Extension, Form};
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::{ObjectBuilder, Required, Type};
use utoipa::{IntoParams, ToSchema};

use super::{Bodies, BodySchema};
use crate::error::ApiError;
use crate::extract::{Caller, IdPairPath, IdPath, IdempotencyKey, JsonBody, QueryParams};
use crate::response::Success;

/// A handler argument or answer, and what it adds to its route's document (by default
/// nothing: a path id, the caller, the state, an axum `Query` — the API reads its
/// queries with `QueryParams`).
pub trait Documented {
    /// Adds what this part takes or answers to `bodies`.
    fn document(_bodies: &mut Bodies) {}
}

impl<T: ToSchema> Documented for JsonBody<T> {
    fn document(bodies: &mut Bodies) {
        bodies.request = Some(BodySchema::of::<T>());
    }
}

impl<T: IntoParams> Documented for QueryParams<T> {
    fn document(bodies: &mut Bodies) {
        let query = T::into_params(|| Some(ParameterIn::Query));
        bodies.parameters.extend(query);
    }
}

impl<T: ToSchema> Documented for Success<T> {
    fn document(bodies: &mut Bodies) {
        bodies.answer = Some(BodySchema::of::<Success<T>>());
    }
}

impl<T: Documented, E> Documented for Result<T, E> {
    fn document(bodies: &mut Bodies) {
        T::document(bodies);
    }
}

impl<T: Documented> Documented for (StatusCode, T) {
    fn document(bodies: &mut Bodies) {
        T::document(bodies);
    }
}

/// An optional part: the parameters it adds are not required.
impl<T: Documented> Documented for Option<T> {
    fn document(bodies: &mut Bodies) {
        let before = bodies.parameters.len();
        T::document(bodies);
        for parameter in &mut bodies.parameters[before..] {
            parameter.required = Required::False;
        }
    }
}

/// The `idempotency-key` header, required (`Option<IdempotencyKey>`: optional).
impl Documented for IdempotencyKey {
    fn document(bodies: &mut Bodies) {
        let key = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(IdempotencyKey::PATTERN));
        bodies.parameters.push(
            ParameterBuilder::new()
                .name(IdempotencyKey::HEADER)
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(
                    "Makes a retry answer what the first request did instead of doing it again",
                ))
                .schema(Some(key))
                .build(),
        );
    }
}

/// Parts that add nothing to a route's document.
macro_rules! undocumented {
    ($($ty:ty),* $(,)?) => { $(impl Documented for $ty {})* };
    (generic $($ty:ident),* $(,)?) => { $(impl<T> Documented for $ty<T> {})* };
}

undocumented!(
    Caller,
    RawQuery,
    Parts,
    HeaderMap,
    Bytes,
    Body,
    String,
    Response,
    Redirect,
    ApiError,
    StatusCode,
    (),
);
undocumented!(generic State, Path, Query, IdPath, Extension, Form, Html);

impl<A, B> Documented for IdPairPath<A, B> {}

/// A handler whose arguments and answer are [`Documented`]: the document of its route.
pub trait DocumentedHandler<Args> {
    /// What the route takes and answers, read from the handler's signature.
    fn bodies() -> Bodies;
}

/// Implements [`DocumentedHandler`] for handlers of each arity.
macro_rules! documented_handler {
    ($($arg:ident),*) => {
        impl<F, Fut, $($arg,)*> DocumentedHandler<($($arg,)*)> for F
        where
            F: FnOnce($($arg),*) -> Fut,
            Fut: Future,
            Fut::Output: Documented,
            $($arg: Documented,)*
        {
            fn bodies() -> Bodies {
                let mut bodies = Bodies::default();
                $($arg::document(&mut bodies);)*
                <Fut::Output>::document(&mut bodies);
                bodies
            }
        }
    };
}

documented_handler!();
documented_handler!(A1);
documented_handler!(A1, A2);
documented_handler!(A1, A2, A3);
documented_handler!(A1, A2, A3, A4);
documented_handler!(A1, A2, A3, A4, A5);
documented_handler!(A1, A2, A3, A4, A5, A6);
documented_handler!(A1, A2, A3, A4, A5, A6, A7);

#[cfg(test)]
mod tests {
    use postmesh_contracts::{HttpMethod, Policy, RouteSpec};
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::routes::Routes;

    #[derive(Deserialize, ToSchema)]
    struct Order {
        #[allow(dead_code)]
        item: String,
    }

    #[derive(Serialize, ToSchema)]
    struct Placed {
        id: u32,
    }

    #[derive(Deserialize, IntoParams)]
    struct Dry {
        #[allow(dead_code)]
        dry_run: Option<bool>,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    struct Written {
        text: String,
    }

    async fn place(
        _: State<()>, _: Caller, _: QueryParams<Dry>, JsonBody(_): JsonBody<Order>,
    ) -> Result<(StatusCode, Success<Placed>), ApiError> {
        Ok((StatusCode::CREATED, Success::new(Placed { id: 1 })))
    }

    async fn raw(_: Bytes) -> Response {
        Response::default()
    }

    const PLACE: RouteSpec = RouteSpec {
        method: HttpMethod::Post,
        path: "/orders",
        policy: Policy::Key,
        body_limit: None,
    };

    fn named(schema: &Option<BodySchema>) -> Option<&str> {
        schema.as_ref().map(|s| s.name.as_str())
    }

    #[test]
    fn a_route_is_documented_from_its_handlers_signature() {
        let routes = Routes::<()>::new().at(PLACE, place).bodies();
        let (_, bodies) = &routes[0];
        assert_eq!(named(&bodies.request), Some("Order"));
        assert_eq!(named(&bodies.answer), Some("PlacedAnswer"));
        let query: Vec<&str> = bodies.parameters.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(query, ["dry_run"]);
    }

    async fn buy(_: IdempotencyKey) -> StatusCode {
        StatusCode::OK
    }

    async fn send(_: Option<IdempotencyKey>) -> StatusCode {
        StatusCode::OK
    }

    #[test]
    fn an_idempotency_key_is_a_header_required_unless_optional() {
        for (routes, required) in [
            (Routes::<()>::new().at(PLACE, buy).bodies(), true),
            (Routes::<()>::new().at(PLACE, send).bodies(), false),
        ] {
            let parameters = serde_json::to_value(&routes[0].1.parameters).unwrap();
            assert_eq!(
                parameters,
                serde_json::json!([{
                    "name": "idempotency-key",
                    "in": "header",
                    "required": required,
                    "description": "Makes a retry answer what the first request did instead of doing it again",
                    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{16,100}$"},
                }])
            );
        }
    }

    #[test]
    fn a_handler_that_reads_its_own_body_is_documented_by_hand() {
        let bare = Routes::<()>::new().at(PLACE, raw).bodies();
        assert!(bare[0].1.request.is_none() && bare[0].1.answer.is_none());
        let routes = Routes::<()>::new()
            .at(PLACE, raw)
            .takes::<Order>()
            .answers::<Written>()
            .bodies();
        assert_eq!(named(&routes[0].1.request), Some("Order"));
        assert_eq!(named(&routes[0].1.answer), Some("Written"));
    }
}
