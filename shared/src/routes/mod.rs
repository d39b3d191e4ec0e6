//! Routers built from the contracts' route manifests: each resource module pairs the
//! [`RouteSpec`]s it serves with their handlers; its service merges the lists and builds its
//! router, which refuses to build when the pairs and the service's manifest disagree. The
//! gateway builds its table from the same manifests, so the two sides cannot drift apart.

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use postmesh_contracts::{HttpMethod, RouteSpec};
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;

mod documented;

pub use documented::{Documented, DocumentedHandler};

/// One declared route, the handler that serves it and the JSON bodies it documents.
pub struct Route<S> {
    pub spec: RouteSpec,
    handler: MethodRouter<S>,
    pub bodies: Bodies,
}

/// A named JSON body's schema and the named schemas it refers to, for the API's document.
#[derive(Clone)]
pub struct BodySchema {
    /// The component name of the body's own schema.
    pub name: String,
    /// The body's own schema first, then every named schema it refers to.
    pub schemas: Vec<(String, RefOr<Schema>)>,
}

impl BodySchema {
    /// `T`'s schema and those it refers to.
    pub fn of<T: ToSchema>() -> Self {
        let name = T::name().into_owned();
        let mut schemas = vec![(name.clone(), T::schema())];
        T::schemas(&mut schemas);
        Self { name, schemas }
    }
}

/// What a route takes and answers as JSON (`None`: no JSON body, or not described).
#[derive(Clone, Default)]
pub struct Bodies {
    pub request: Option<BodySchema>,
    /// Whether the request body may be left out.
    pub request_optional: bool,
    /// The successful answer's body.
    pub answer: Option<BodySchema>,
    /// The query and header parameters it reads.
    pub parameters: Vec<Parameter>,
}

impl<S: Clone + Send + Sync + 'static> Route<S> {
    /// The handler, answering only the declared method, with the route's own body limit
    /// when it has one.
    pub fn into_handler(self) -> MethodRouter<S> {
        match self.spec.body_limit {
            Some(limit) => self.handler.layer(DefaultBodyLimit::max(limit)),
            None => self.handler,
        }
    }
}

/// The method filter of a declared method.
pub fn method_filter(method: HttpMethod) -> MethodFilter {
    match method {
        HttpMethod::Get => MethodFilter::GET,
        HttpMethod::Post => MethodFilter::POST,
        HttpMethod::Put => MethodFilter::PUT,
        HttpMethod::Patch => MethodFilter::PATCH,
        HttpMethod::Delete => MethodFilter::DELETE,
    }
}

/// The routes a module or a service serves.
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

    /// Serves `spec` (its method on its path) with `handler`, documented from the handler's
    /// signature: the `JsonBody` it takes, the `QueryParams` it reads, the `Success` it
    /// answers.
    pub fn at<H, T, D>(mut self, spec: RouteSpec, handler: H) -> Self
    where
        H: Handler<T, S> + DocumentedHandler<D>,
        T: 'static,
    {
        self.0.push(Route {
            spec,
            handler: on(method_filter(spec.method), handler),
            bodies: H::bodies(),
        });
        self
    }

    /// Documents the JSON body the route added last takes, where its handler reads the body
    /// itself (in place of what its signature says).
    pub fn takes<T: ToSchema>(mut self) -> Self {
        self.last().request = Some(BodySchema::of::<T>());
        self
    }

    /// Documents the JSON body the route added last takes when one is given (it may be
    /// left out).
    pub fn takes_optional<T: ToSchema>(mut self) -> Self {
        self = self.takes::<T>();
        self.last().request_optional = true;
        self
    }

    /// Documents the query parameters the route added last reads, where its handler parses
    /// the query itself.
    pub fn query<T: IntoParams>(mut self) -> Self {
        let query = T::into_params(|| Some(ParameterIn::Query));
        self.last().parameters.extend(query);
        self
    }

    /// Documents the JSON body the route added last answers on success, where its handler
    /// builds the answer itself.
    pub fn answers<T: ToSchema>(mut self) -> Self {
        self.last().answer = Some(BodySchema::of::<T>());
        self
    }

    fn last(&mut self) -> &mut Bodies {
        &mut self.0.last_mut().expect("a route to document").bodies
    }

    /// Each route with the bodies it documents.
    pub fn bodies(&self) -> Vec<(RouteSpec, Bodies)> {
        self.0.iter().map(|r| (r.spec, r.bodies.clone())).collect()
    }

    /// Adds every route of `other`.
    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.0.extend(other.0);
        self
    }

    /// `Ok` when these routes serve exactly `manifest`, each once; otherwise what differs.
    pub fn check(&self, manifest: &[RouteSpec]) -> Result<(), String> {
        let served: Vec<RouteSpec> = self.0.iter().map(|r| r.spec).collect();
        let name = |s: &RouteSpec| format!("{} {}", s.method.as_str(), s.path);
        let mut problems = Vec::new();
        for spec in manifest {
            match served.iter().filter(|s| *s == spec).count() {
                1 => {}
                0 => problems.push(format!("{} has no handler", name(spec))),
                _ => problems.push(format!("{} is served twice", name(spec))),
            }
        }
        for spec in served.iter().filter(|s| !manifest.contains(s)) {
            problems.push(format!(
                "{} is served but not in the manifest (or differs from it)",
                name(spec)
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// The routes themselves.
    pub fn into_inner(self) -> Vec<Route<S>> {
        self.0
    }

    /// The service's router: these routes (each with its own body limit, if any), 404 and
    /// 405 in the standard error body.
    ///
    /// # Panics
    /// When the routes do not serve exactly `manifest` (a programming error, caught by each
    /// service's router test before it can ship).
    pub fn into_router(self, manifest: &[RouteSpec], state: S) -> Router {
        if let Err(e) = self.check(manifest) {
            panic!("routes disagree with their manifest: {e}");
        }
        let mut router = Router::new();
        for route in self.0 {
            router = router.route(route.spec.path, route.into_handler());
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
    use postmesh_contracts::Policy;
    use tower::ServiceExt;

    use super::*;
    use crate::extract::JsonBody;

    async fn size(JsonBody(v): JsonBody<serde_json::Value>) -> String {
        v.as_str().map_or(0, str::len).to_string()
    }

    const SMALL: RouteSpec = RouteSpec {
        method: HttpMethod::Post,
        path: "/small",
        policy: Policy::Key,
        body_limit: None,
    };
    const LARGE: RouteSpec = RouteSpec {
        method: HttpMethod::Post,
        path: "/large",
        policy: Policy::Public,
        body_limit: Some(4 * 1024 * 1024),
    };
    const MANIFEST: &[RouteSpec] = &[SMALL, LARGE];

    fn routes() -> Routes<()> {
        Routes::new().at(SMALL, size).at(LARGE, size)
    }

    #[test]
    fn routes_must_serve_their_manifest_exactly() {
        assert_eq!(routes().check(MANIFEST), Ok(()));
        let missing = Routes::<()>::new().at(SMALL, size);
        let err = missing.check(MANIFEST).unwrap_err();
        assert!(err.contains("POST /large has no handler"), "{err}");
        let other = RouteSpec {
            path: "/other",
            ..SMALL
        };
        let err = routes().at(other, size).check(MANIFEST).unwrap_err();
        assert!(err.contains("POST /other is served"), "{err}");
        let err = routes().at(SMALL, size).check(MANIFEST).unwrap_err();
        assert!(err.contains("served twice"), "{err}");
        let unlimited = RouteSpec {
            body_limit: None,
            ..LARGE
        };
        let other_limit = Routes::<()>::new().at(SMALL, size).at(unlimited, size);
        assert!(other_limit.check(MANIFEST).is_err());
    }

    #[test]
    #[should_panic(expected = "routes disagree with their manifest")]
    fn a_router_that_disagrees_does_not_build() {
        let _ = Routes::<()>::new()
            .at(SMALL, size)
            .into_router(MANIFEST, ());
    }

    async fn send(router: &Router, method: &str, path: &str, len: usize) -> StatusCode {
        let body = serde_json::to_vec(&"x".repeat(len)).unwrap();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        router.clone().oneshot(req).await.unwrap().status()
    }

    #[tokio::test]
    async fn the_service_router_applies_each_route_method_and_limit() {
        let router = routes().into_router(MANIFEST, ());
        let too_large = StatusCode::PAYLOAD_TOO_LARGE;
        // axum's default of 2 MiB holds where the route sets no limit.
        assert_eq!(send(&router, "POST", "/small", 3 << 20).await, too_large);
        assert_eq!(
            send(&router, "POST", "/large", 3 << 20).await,
            StatusCode::OK
        );
        assert_eq!(send(&router, "POST", "/large", 5 << 20).await, too_large);
        let not_allowed = StatusCode::METHOD_NOT_ALLOWED;
        assert_eq!(send(&router, "PUT", "/large", 1).await, not_allowed);
        assert_eq!(
            send(&router, "POST", "/none", 1).await,
            StatusCode::NOT_FOUND
        );
    }
}
