//! The domain service's router with only Postgres behind it: no NATS, no gateway. Its
//! extractors answer before any handler work: a malformed id is a 400, another
//! workspace's (or no) domain a 404, an unverified one 409, the review admins' alone; and
//! the tracking sweep's writes against the same database.

use reqwest::StatusCode;
use serde_json::json;

use domain::domains::{DomainList, Ownership};
use domain::ownership::PendingList;
use postmesh_shared::error::ErrorBody;
use postmesh_shared::proto::Role;
use postmesh_shared::Success;
use postmesh_tests::{caller, peek, ServiceDb, TestClient};

/// The domain service's database and its router called by a fresh caller with `role`,
/// and that caller's workspace.
async fn domain_router(role: Role) -> (ServiceDb, TestClient, uuid::Uuid) {
    let store = ServiceDb::create(domain::SERVICE, &[&domain::MIGRATOR]).await;
    let router = domain::router(domain::AppState::new(store.pool.clone()).unwrap());
    let auth = caller(role);
    let workspace = auth.workspace_id.parse().unwrap();
    (store, TestClient::router(router, Some(auth)), workspace)
}

#[tokio::test]
async fn listing_shows_the_platform_domains_and_ids_are_checked_at_the_edge() {
    let (_store, client, _) = domain_router(Role::Member).await;
    let list: Success<DomainList> = client.get("/sender-domains", StatusCode::OK).await;
    assert_eq!(list.body.inbound_mx_host, "mx.postmesh.localhost");
    let names: Vec<_> = list
        .body
        .domains
        .iter()
        .map(|d| d.domain.as_str())
        .collect();
    assert_eq!(names, ["postmesh.localhost"]);

    let e: ErrorBody = client
        .get("/sender-domains/not-a-uuid", StatusCode::BAD_REQUEST)
        .await;
    assert!(e.error.contains("\"not-a-uuid\""), "{}", e.error);
    let unknown = format!("/sender-domains/{}", uuid::Uuid::now_v7());
    let e: ErrorBody = client.get(&unknown, StatusCode::NOT_FOUND).await;
    assert_eq!(e.error, "no such sender domain");
    for step in [
        "verify-inbound",
        "setup-outbound",
        "verify-outbound",
        "apply-dns",
    ] {
        let path = format!("{unknown}/{step}");
        let e: ErrorBody = client.act(&path, StatusCode::NOT_FOUND).await;
        assert_eq!(e.error, "no such sender domain", "{step}");
    }
}

#[tokio::test]
async fn setup_steps_of_an_unverified_domain_are_409() {
    let (store, client, workspace) = domain_router(Role::Member).await;
    // A pending domain of this caller's workspace, as a submission leaves it.
    let id = uuid::Uuid::now_v7();
    peek::domain::insert_pending(&store.pool, id, workspace, "pending.example").await;
    let shown: Success<domain::domains::DomainPage> = client
        .get(&format!("/sender-domains/{id}"), StatusCode::OK)
        .await;
    assert_eq!(shown.body.domain.ownership_status, Ownership::Pending);
    for step in ["verify-inbound", "setup-outbound", "verify-outbound"] {
        let path = format!("/sender-domains/{id}/{step}");
        let e: ErrorBody = client.act(&path, StatusCode::CONFLICT).await;
        assert!(e.error.contains("not verified"), "{step}: {}", e.error);
    }
}

#[tokio::test]
async fn the_ownership_review_is_for_admins() {
    let (_store, member, _) = domain_router(Role::Member).await;
    let e: ErrorBody = member
        .get("/admin/sender-domains", StatusCode::FORBIDDEN)
        .await;
    assert!(!e.success);
    let (_store, admin, _) = domain_router(Role::Admin).await;
    let pending: Success<PendingList> = admin.get("/admin/sender-domains", StatusCode::OK).await;
    assert!(pending.body.domains.is_empty());
    let path = format!("/admin/sender-domains/{}/approve", uuid::Uuid::now_v7());
    let _: ErrorBody = admin.act(&path, StatusCode::NOT_FOUND).await;
    let _: ErrorBody = admin
        .post(
            "/admin/sender-domains/nope/approve",
            &json!({}),
            StatusCode::BAD_REQUEST,
        )
        .await;
}

/// Four domain replicas' ownership sweeps at once over 120 pending domains: each domain is
/// checked by one of them, once.
#[tokio::test]
async fn ownership_sweeps_at_once_check_each_pending_domain_once() {
    let store = ServiceDb::create(domain::SERVICE, &[&domain::MIGRATOR]).await;
    let fake = postmesh_tests::fake_dns::FakeDns::start().await;
    fake.zone("sweep.test");
    let dns = domain::dns::Dns::new(&[fake.addr], std::time::Duration::from_secs(2)).unwrap();
    let made = sqlx::query(
        "INSERT INTO domains (id, workspace_id, name, verification_token, created_at)
         SELECT gen_random_uuid(), gen_random_uuid(), 'd' || n || '.sweep.test', 'token', 0
         FROM generate_series(1, 120) AS n",
    )
    .execute(&store.pool)
    .await
    .expect("pending domains");
    assert_eq!(made.rows_affected(), 120);
    let checked = postmesh_tests::passes_at_once(4, || async {
        domain::ownership::sweep(&store.pool, &dns, 3600)
            .await
            .map(|n| n as u64)
    })
    .await;
    assert_eq!(checked, 120, "each domain checked once");
    assert!(fake.queries() >= 120, "{} DNS queries", fake.queries());
}

/// The domain service's database with the domain `name`, its tracking host verified and
/// due for a look.
async fn tracked_domain(name: &str) -> ServiceDb {
    let store = ServiceDb::create(domain::SERVICE, &[&domain::MIGRATOR]).await;
    peek::domain::insert_inbound_verified(&store.pool, uuid::Uuid::now_v7(), name).await;
    peek::domain::tracking_verified(&store.pool, name, 0).await;
    store
}

/// The tracking sweep stores what DNS said only when nothing wrote the domain since its
/// claim: a `verify-tracking` meanwhile has the newer answer, and keeps it.
#[tokio::test]
async fn a_tracking_recheck_never_overwrites_a_newer_answer() {
    use domain::domains::{claim_due, Sweep, TrackingStatus};
    use domain::tracking::settle;

    let (store, name) = (tracked_domain("tracked.example").await, "tracked.example");
    let db = &store.pool;
    let due = claim_due(db, Sweep::Tracking, 60, 50).await.unwrap();
    assert_eq!(due.len(), 1);
    // The CNAME was gone when the sweep looked; put back and verified before it stores.
    peek::domain::tracking_verified(db, name, postmesh_shared::db::now_unix()).await;
    let stored = settle(db, &due[0], TrackingStatus::Pending).await.unwrap();
    assert!(!stored);
    assert_eq!(peek::domain::tracking_status(db, name).await, "verified");

    // Nothing in between: the sweep's answer stands.
    peek::domain::tracking_verified(db, name, 0).await;
    let due = claim_due(db, Sweep::Tracking, 60, 50).await.unwrap();
    assert!(settle(db, &due[0], TrackingStatus::Pending).await.unwrap());
    assert_eq!(peek::domain::tracking_status(db, name).await, "pending");
}

/// A tracking sweep whose DNS lookup fails changes nothing: the host stays verified (the
/// router's state asks a name server that never answers).
#[tokio::test]
async fn a_tracking_recheck_that_cannot_look_changes_nothing() {
    let (store, name) = (tracked_domain("unlooked.example").await, "unlooked.example");
    let db = &store.pool;
    let state = domain::AppState::new(store.pool.clone()).unwrap();
    let taken = domain::tracking::sweep(&state, "track.postmesh.localhost", 60)
        .await
        .unwrap();
    assert_eq!(taken, 1);
    assert_eq!(peek::domain::tracking_status(db, name).await, "verified");
}
