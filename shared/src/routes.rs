//! Routes as their owners declare them: each resource module lists its paths with their
//! auth policy and handlers; its service merges the lists into its router, and the gateway
//! builds its route table from the same lists, so an endpoint is a change in one place.

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

/// Each path of a service with its policy: what the gateway needs to know of it.
pub type Manifest = Vec<(&'static str, Policy)>;

/// One path of a service: its auth policy and its handlers.
pub struct Route<S> {
    pub path: &'static str,
    pub policy: Policy,
    pub handler: MethodRouter<S>,
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
        });
        self
    }

    /// Adds every route of `other`.
    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.0.extend(other.0);
        self
    }

    /// Each path with its policy: what the gateway needs to know of a service.
    pub fn manifest(&self) -> Manifest {
        self.0.iter().map(|r| (r.path, r.policy)).collect()
    }

    /// The routes themselves.
    pub fn into_inner(self) -> Vec<Route<S>> {
        self.0
    }

    /// The service's router: these routes, 404 and 405 in the standard error body.
    pub fn into_router(self, state: S) -> Router {
        let mut router = Router::new();
        for route in self.0 {
            router = router.route(route.path, route.handler);
        }
        router
            .fallback(|| async { ApiError::NotFound(NO_SUCH_ENDPOINT.into()) })
            .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
            .with_state(state)
    }
}

/// The error text of a path no route serves.
pub const NO_SUCH_ENDPOINT: &str = "no such endpoint";
