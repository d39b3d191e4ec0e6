//! One owner per route: every route the gateway forwards is handled by its service's router,
//! and every route a service declares is in the gateway's table, with the same policy.

use axum::body::Body;
use tower::ServiceExt;

use api_gateway::routes::{table, Entry, Target};
use postmesh_shared::routes::{Manifest, NO_SUCH_ENDPOINT};
use postmesh_shared::Service;

/// Whether `router` has a handler for `path` under some method: anything but its own
/// "no such endpoint" 404 (a handler may answer 404 itself, or fail for want of a caller).
async fn handled(router: &axum::Router, path: &str) -> bool {
    let path = path.replace("{id}", &uuid::Uuid::now_v7().to_string());
    for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(&path)
            .body(Body::empty())
            .unwrap();
        let res = router.clone().oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        let unrouted = status == 404 && String::from_utf8_lossy(&body).contains(NO_SUCH_ENDPOINT);
        if !unrouted && status != 405 {
            return true;
        }
    }
    false
}

/// Each service with HTTP routes: its declared routes and its router. Keyed handlers stop at
/// the missing auth context; a public one that reaches for the database fails fast.
fn services() -> Vec<(Service, Manifest, axum::Router)> {
    let idle = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_millis(200))
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    vec![
        (
            Service::Billing,
            billing::routes().manifest(),
            billing::router(billing::AppState::new(idle.clone())),
        ),
        (
            Service::Domain,
            domain::routes().manifest(),
            domain::router(domain::AppState::new(idle).unwrap()),
        ),
    ]
}

#[tokio::test]
async fn gateway_routes_and_service_handlers_match_one_to_one() {
    let table = table();
    let services = services();
    for entry in &table {
        let Target::Service(service) = entry.target else {
            continue;
        };
        let (_, declared, router) = services
            .iter()
            .find(|(s, _, _)| *s == service)
            .unwrap_or_else(|| panic!("{service} forwards routes but is not checked here"));
        assert!(
            declared.contains(&(entry.path, entry.policy)),
            "{} is forwarded to {service}, which does not declare it",
            entry.path
        );
        assert!(
            handled(router, entry.path).await,
            "{} has no handler in {service}",
            entry.path
        );
    }
    for (service, declared, _) in &services {
        for &(path, policy) in declared {
            let entry = Entry {
                path,
                policy,
                target: Target::Service(*service),
            };
            assert!(
                table.contains(&entry),
                "{service} serves {path}; the gateway does not route it"
            );
        }
    }
    // Paths are unique across the table: one owner per route.
    let mut paths: Vec<&str> = table.iter().map(|e| e.path).collect();
    paths.sort_unstable();
    let before = paths.len();
    paths.dedup();
    assert_eq!(paths.len(), before, "a path has two owners");
}
