//! The sender's router with its own Postgres and NATS behind it (no gateway, billing or
//! domain service): templates, task ids checked at the edge, another workspace's data
//! invisible.

use reqwest::StatusCode;
use serde_json::json;

use postmesh_shared::error::ErrorBody;
use postmesh_shared::jetstream::outbox::Outbox;
use postmesh_shared::proto::Role;
use postmesh_shared::{EmailAddress, Success};
use postmesh_tests::{caller, ServiceDb, TestClient};
use sender::templates::{Template, TemplateList};

/// The sender's database and its router, called by two fresh callers of different
/// workspaces.
async fn sender_router() -> (ServiceDb, TestClient, TestClient) {
    let store = ServiceDb::create(sender::SERVICE, &sender::MIGRATIONS).await;
    let nats = async_nats::connect(&store.common.nats_url)
        .await
        .expect("NATS");
    let state = sender::AppState::new(
        store.pool.clone(),
        nats.clone(),
        store.common.namespace.clone(),
        tokio_util::task::TaskTracker::new(),
        Outbox::new(store.pool.clone(), async_nats::jetstream::new(nats)),
        EmailAddress::parse("no-reply@postmesh.localhost").unwrap(),
    );
    let router = sender::router(state);
    let client = |role| TestClient::router(router.clone(), Some(caller(role)));
    (store, client(Role::Member), client(Role::Member))
}

#[tokio::test]
async fn templates_are_versioned_per_workspace() {
    let (_store, mine, theirs) = sender_router().await;
    let body = json!({"key": "welcome", "subject": "Hi {{name}}", "text": "v1"});
    let v1: Success<Template> = mine.post("/templates", &body, StatusCode::OK).await;
    assert_eq!((v1.body.key.as_str(), v1.body.version), ("welcome", 1));
    let body = json!({"key": "welcome", "subject": "Hi {{name}}", "text": "v2"});
    let v2: Success<Template> = mine.post("/templates", &body, StatusCode::OK).await;
    assert_eq!(v2.body.version, 2);
    let pinned: Success<Template> = mine
        .get("/templates/welcome?version=1", StatusCode::OK)
        .await;
    assert_eq!(pinned.body.text, "v1");
    let list: Success<TemplateList> = mine.get("/templates", StatusCode::OK).await;
    let versions: Vec<_> = list.body.templates.iter().map(|t| t.version).collect();
    assert_eq!(versions, [2]);
    // Another workspace sees none of them.
    let list: Success<TemplateList> = theirs.get("/templates", StatusCode::OK).await;
    assert!(list.body.templates.is_empty());
    let _: ErrorBody = theirs
        .get("/templates/welcome", StatusCode::NOT_FOUND)
        .await;
    let bad = json!({"key": "bad key!", "subject": "s", "text": "t"});
    let e: ErrorBody = mine.post("/templates", &bad, StatusCode::BAD_REQUEST).await;
    assert!(!e.success);
}

#[tokio::test]
async fn task_ids_are_checked_at_the_edge() {
    let (_store, mine, _) = sender_router().await;
    let e: ErrorBody = mine
        .get("/email-status/nope", StatusCode::BAD_REQUEST)
        .await;
    assert!(e.error.contains("\"nope\""), "{}", e.error);
    let unknown = uuid::Uuid::now_v7();
    let _: ErrorBody = mine
        .get(&format!("/email-status/{unknown}"), StatusCode::NOT_FOUND)
        .await;
    let cancel = format!("/send-email/{unknown}");
    let _: ErrorBody = mine.delete(&cancel, StatusCode::NOT_FOUND).await;
    let _: ErrorBody = mine
        .delete("/send-email/nope", StatusCode::BAD_REQUEST)
        .await;
}
