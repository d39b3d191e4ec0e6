//! Routes as their owners declare them: each resource module lists its paths with their
//! auth policy and handlers; its service merges the lists into its router, and the gateway
//! builds its route table from the same lists, so an endpoint is a change in one place.

use axum::extract::DefaultBodyLimit;
use axum::routing::MethodRouter;
use axum::Router;

use crate::error::ApiError;

/// Who may call a route; the gateway enforces it before anything else runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Anyone.
    Public,
    /// A bearer API key (`Authorization: Bearer <key>`).
    Key,
}

/// What the gateway needs to know of one path of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declared {
    pub path: &'static str,
    pub policy: Policy,
    /// The route's own largest request body in bytes; `None`: the gateway's default.
    pub body_limit: Option<usize>,
}

/// Each path of a service with its policy and body limit.
pub type Manifest = Vec<Declared>;

/// One path of a service: its auth policy, its handlers and its body limit.
pub struct Route<S> {
    pub path: &'static str,
    pub policy: Policy,
    pub handler: MethodRouter<S>,
    /// Largest request body in bytes, when the route sets its own (see [`Routes::body_limit`]).
    pub body_limit: Option<usize>,
}

impl<S: Clone + Send + Sync + 'static> Route<S> {
    /// The handlers, with the route's own body limit applied when it has one.
    pub fn limited_handler(self) -> MethodRouter<S> {
        match self.body_limit {
            Some(limit) => self.handler.layer(DefaultBodyLimit::max(limit)),
            None => self.handler,
        }
    }
}

/// The routes a module or a service owns.
pub struct Routes<S>(Vec<Route<S>>);

impl<S> Default for Routes<S> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    /// No routes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path` with its `policy` and `handler`.
    pub fn route(mut self, path: &'static str, policy: Policy, handler: MethodRouter<S>) -> Self {
        self.0.push(Route {
            path,
            policy,
            handler,
            body_limit: None,
        });
        self
    }

    /// Lets the route added last accept request bodies up to `bytes`, instead of the
    /// gateway's default (`GATEWAY_BODY_LIMIT`); bigger bodies are 413, at the gateway and in
    /// the service's own router. Bodies too big for one NATS message travel by claim check
    /// (see [`crate::nats::CLAIM_CHECK_THRESHOLD`]).
    ///
    /// # Panics
    /// When no route was added yet.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.0
            .last_mut()
            .expect("body_limit applies to the route added before it")
            .body_limit = Some(bytes);
        self
    }

    /// Adds every route of `other`.
    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.0.extend(other.0);
        self
    }

    /// Each path with its policy and body limit: what the gateway needs to know of a service.
    pub fn manifest(&self) -> Manifest {
        self.0
            .iter()
            .map(|r| Declared {
                path: r.path,
                policy: r.policy,
                body_limit: r.body_limit,
            })
            .collect()
    }

    /// The routes themselves.
    pub fn into_inner(self) -> Vec<Route<S>> {
        self.0
    }

    /// The service's router: these routes (each with its own body limit, if any), 404 and
    /// 405 in the standard error body.
    pub fn into_router(self, state: S) -> Router {
        let mut router = Router::new();
        for route in self.0 {
            router = router.route(route.path, route.limited_handler());
        }
        router
            .fallback(|| async { ApiError::NotFound(NO_SUCH_ENDPOINT.into()) })
            .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
            .with_state(state)
    }
}

/// The error text of a path no route serves.
pub const NO_SUCH_ENDPOINT: &str = "no such endpoint";

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;
    use crate::extract::JsonBody;

    async fn size(JsonBody(v): JsonBody<serde_json::Value>) -> String {
        v.as_str().map_or(0, str::len).to_string()
    }

    fn routes() -> Routes<()> {
        Routes::new()
            .route("/small", Policy::Key, post(size))
            .route("/large", Policy::Public, post(size))
            .body_limit(4 * 1024 * 1024)
    }

    #[test]
    fn body_limit_is_declared_for_the_route_added_last() {
        assert_eq!(
            routes().manifest(),
            vec![
                Declared {
                    path: "/small",
                    policy: Policy::Key,
                    body_limit: None,
                },
                Declared {
                    path: "/large",
                    policy: Policy::Public,
                    body_limit: Some(4 * 1024 * 1024),
                },
            ]
        );
    }

    #[test]
    #[should_panic(expected = "body_limit applies to the route added before it")]
    fn body_limit_needs_a_route() {
        let _ = Routes::<()>::new().body_limit(1);
    }

    async fn post_json(router: &Router, path: &str, len: usize) -> StatusCode {
        let body = serde_json::to_vec(&"x".repeat(len)).unwrap();
        let req = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        router.clone().oneshot(req).await.unwrap().status()
    }

    #[tokio::test]
    async fn the_service_router_applies_each_route_limit() {
        let router = routes().into_router(());
        // axum's default of 2 MiB holds where the route sets no limit.
        assert_eq!(
            post_json(&router, "/small", 3 << 20).await,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(post_json(&router, "/large", 3 << 20).await, StatusCode::OK);
        assert_eq!(
            post_json(&router, "/large", 5 << 20).await,
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }
}
