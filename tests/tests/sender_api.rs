//! The sender's router with its own Postgres and NATS behind it (no gateway, billing or
//! domain service): templates, task ids checked at the edge, another workspace's data
//! invisible.

use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_contracts::answers::sender::{DeliveryEvent, TaskProgress};
use postmesh_shared::error::ErrorBody;
use postmesh_shared::proto::Role;
use postmesh_shared::Success;
use postmesh_tests::{
    caller, lock_waiters_reach, sender_router, sender_state, ServiceDb, TestClient,
};
use sender::sending::events::Kind;
use sender::sending::log::Detail;
use sender::sending::templates::{Template, TemplateList};
use uuid::Uuid;

#[tokio::test]
async fn templates_are_versioned_per_workspace() {
    let (_store, mine, theirs) = sender_router(sender::Quotas::default()).await;
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
async fn task_and_workflow_ids_are_checked_at_the_edge() {
    let (_store, mine, _) = sender_router(sender::Quotas::default()).await;
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
    // Workflow ids alike: malformed 400 naming it, unknown 404.
    let e: ErrorBody = mine.get("/workflows/nope", StatusCode::BAD_REQUEST).await;
    assert!(e.error.contains("\"nope\""), "{}", e.error);
    let _: ErrorBody = mine
        .patch("/workflows/nope", &json!({}), StatusCode::BAD_REQUEST)
        .await;
    let _: ErrorBody = mine
        .delete("/workflows/nope", StatusCode::BAD_REQUEST)
        .await;
    let _: ErrorBody = mine
        .get(&format!("/workflows/{unknown}"), StatusCode::NOT_FOUND)
        .await;
    let _: ErrorBody = mine
        .delete(&format!("/workflows/{unknown}"), StatusCode::NOT_FOUND)
        .await;
}

/// Creates `held` of `body` at `path` (201 each), then one more: a 403 naming `quota`.
async fn fills(client: &TestClient, path: &str, body: &Value, held: usize, quota: &str) {
    for _ in 0..held {
        let _: Value = client.post(path, body, StatusCode::CREATED).await;
    }
    let over: ErrorBody = client.post(path, body, StatusCode::FORBIDDEN).await;
    assert!(over.error.contains(quota), "{}", over.error);
}

#[tokio::test]
async fn quotas_are_403_naming_their_setting_and_lists_are_paged() {
    let quotas = sender::Quotas {
        templates: 3,
        audiences: 2,
        workflows: 1,
    };
    let (_store, mine, theirs) = sender_router(quotas).await;
    let template = |key: &str| json!({"key": key, "subject": "s", "text": "t"});
    for key in ["a", "b", "c"] {
        let _: Value = mine
            .post("/templates", &template(key), StatusCode::OK)
            .await;
    }
    let over: ErrorBody = mine
        .post("/templates", &template("d"), StatusCode::FORBIDDEN)
        .await;
    assert!(
        over.error.contains("TEMPLATES_PER_WORKSPACE = 3"),
        "{}",
        over.error
    );
    // A new version of a key held is no new template; another workspace has its own quota.
    let _: Value = mine
        .post("/templates", &template("a"), StatusCode::OK)
        .await;
    // Bodies up to 512 KiB each are taken.
    let big = "x".repeat(500 * 1024);
    let full = json!({"key": "a", "subject": "s", "html": big, "text": big});
    let _: Value = mine.post("/templates", &full, StatusCode::OK).await;
    // A key deleted, another made in its place: the deleted key is no longer one to write.
    let _: Value = mine.delete("/templates/c", StatusCode::OK).await;
    let _: Value = mine
        .post("/templates", &template("e"), StatusCode::OK)
        .await;
    let _: ErrorBody = mine
        .post("/templates", &template("c"), StatusCode::FORBIDDEN)
        .await;
    let _: Value = theirs
        .post("/templates", &template("d"), StatusCode::OK)
        .await;
    // Versions per template: 100.
    for _ in 2..=sender::sending::templates::MAX_VERSIONS {
        let _: Value = mine
            .post("/templates", &template("b"), StatusCode::OK)
            .await;
    }
    let over: ErrorBody = mine
        .post("/templates", &template("b"), StatusCode::FORBIDDEN)
        .await;
    assert!(over.error.contains("100 versions"), "{}", over.error);

    let audience = json!({"name": "n", "include": [{"tag": "x"}]});
    fills(
        &mine,
        "/audiences",
        &audience,
        2,
        "AUDIENCES_PER_WORKSPACE = 2",
    )
    .await;
    let _: Value = mine
        .post("/templates", &template("a"), StatusCode::OK)
        .await;
    let workflow = json!({ "name": "w", "trigger": { "event_name": "go" },
                           "steps": [{ "type": "send", "templateKey": "a" }] });
    fills(
        &mine,
        "/workflows",
        &workflow,
        1,
        "WORKFLOWS_PER_WORKSPACE = 1",
    )
    .await;
    // A deleted workflow (kept for its runs' history) leaves its place to a new one.
    let list: Value = mine.get("/workflows", StatusCode::OK).await;
    let held = list["workflows"][0]["id"].as_str().unwrap().to_owned();
    let _: Value = mine
        .delete(&format!("/workflows/{held}"), StatusCode::OK)
        .await;
    let made: Value = mine
        .post("/workflows", &workflow, StatusCode::CREATED)
        .await;
    // Versions per workflow: 100, as per template.
    let path = format!("/workflows/{}", made["workflow"]["id"].as_str().unwrap());
    for _ in 2..=sender::workflows::MAX_VERSIONS {
        let _: Value = mine.patch(&path, &workflow, StatusCode::OK).await;
    }
    let over: ErrorBody = mine.patch(&path, &workflow, StatusCode::FORBIDDEN).await;
    assert!(over.error.contains("100 versions"), "{}", over.error);

    // Pages: templates by key, audiences oldest first.
    let page: Value = mine
        .get("/templates?limit=2&offset=1", StatusCode::OK)
        .await;
    let keys: Vec<&str> = page["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["b", "e"]);
    assert_eq!(
        (page["limit"].clone(), page["offset"].clone()),
        (json!(2), json!(1))
    );
    let page: Value = mine.get("/audiences?limit=1", StatusCode::OK).await;
    assert_eq!(page["audiences"].as_array().unwrap().len(), 1);
    let page: Value = mine.get("/workflows?offset=1", StatusCode::OK).await;
    assert_eq!(page["workflows"].as_array().unwrap().len(), 0);
    let page: Value = mine.get("/campaigns", StatusCode::OK).await;
    assert_eq!(page["limit"], json!(50));
    let lists = [
        "/templates",
        "/audiences",
        "/workflows",
        "/campaigns",
        "/contacts",
        "/suppressions",
    ];
    for list in lists {
        let _: Value = mine.get(&format!("{list}?limit=500"), StatusCode::OK).await;
        for bad in ["limit=0", "limit=501", "offset=-1", "limit=x"] {
            let _: ErrorBody = mine
                .get(&format!("{list}?{bad}"), StatusCode::BAD_REQUEST)
                .await;
        }
    }
}

#[tokio::test]
async fn to_with_a_campaign_key_is_400_before_the_campaign_is_looked_up() {
    let (_store, mine, _) = sender_router(sender::Quotas::default()).await;
    for extra in [
        json!({"to": "a@example.com"}),
        json!({"audience": {"include": []}}),
    ] {
        let mut body = json!({"campaignKey": "no-such-campaign", "subject": "s", "text": "t"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let e: ErrorBody = mine
            .post("/send-email", &body, StatusCode::BAD_REQUEST)
            .await;
        assert!(
            e.error.contains("only one of to, audience or campaignKey"),
            "{}",
            e.error
        );
    }
}

/// Within one second, a message's own events come before what its reader did with it,
/// whichever was written first: the tracking recorder may write an open before the worker
/// has written the `sent` of the same second.
#[tokio::test]
async fn a_messages_sending_is_listed_before_its_reading_within_a_second() {
    let store = ServiceDb::create(sender::SERVICE, &sender::MIGRATIONS).await;
    let who = caller(Role::Member);
    let workspace: Uuid = who.workspace_id.parse().unwrap();
    let api_key: Uuid = who.api_key_id.parse().unwrap();
    let router = sender::router(sender_state(&store).await);
    let client = TestClient::router(router, Some(who));
    let (task, delivery, at) = (Uuid::now_v7(), Uuid::now_v7(), 1_800_000_000_i64);
    // One statement: the send, its recipient, and the open written before the sent of the
    // same second (the events' sequence follows the order of the rows).
    sqlx::query(
        "WITH t AS (
             INSERT INTO tasks (id, workspace_id, api_key_id, account_id, status, message,
                                email_type, cost, recipient_count, created_at)
             VALUES ($1, $2, $4, 'account', 'queued', '{\"subject\": \"Hi\"}',
                     'transactional', 1, 1, $3)
         ), r AS (
             INSERT INTO task_recipients (task_id, idx, email, delivery_id, workspace_id,
                                          created_at, status)
             VALUES ($1, 0, 'reader@example.com', $5, $2, $3, 'sent')
         )
         INSERT INTO delivery_events (id, workspace_id, task_id, delivery_id, email, kind,
                                      occurred_at, source_key)
         SELECT gen_random_uuid(), $2, $1, $5, 'reader@example.com', k, $3, k || ':' || $5
         FROM UNNEST(ARRAY['opened', 'sent']) WITH ORDINALITY AS u(k, i) ORDER BY i",
    )
    .bind(task)
    .bind(workspace)
    .bind(at)
    .bind(api_key)
    .bind(delivery)
    .execute(&store.pool)
    .await
    .unwrap();
    let kinds = |events: &[DeliveryEvent]| events.iter().map(|e| e.kind).collect::<Vec<_>>();
    let logged: Success<Detail> = client
        .get(&format!("/emails/{delivery}"), StatusCode::OK)
        .await;
    assert_eq!(kinds(&logged.body.events), [Kind::Sent, Kind::Opened]);
    let status: Success<TaskProgress> = client
        .get(&format!("/email-status/{task}"), StatusCode::OK)
        .await;
    let events = &status.body.recipients[0].events;
    assert_eq!(kinds(events), [Kind::Sent, Kind::Opened]);
}

#[tokio::test]
async fn deleting_a_workflow_while_its_exit_event_arrives_never_deadlocks() {
    let (store, mine, _) = sender_router(sender::Quotas::default()).await;
    let body = json!({
        "name": "loop",
        "trigger": { "event_name": "ping" },
        "exit": [{ "event_name": "ping" }],
        "steps": [{ "type": "wait", "seconds": 3600 }]
    });
    let made: Value = mine.post("/workflows", &body, StatusCode::CREATED).await;
    let workflow = made["workflow"]["id"].as_str().unwrap().to_owned();
    let event = |id: &str| {
        json!({"event_id": id, "event_name": "ping", "occurred_at": "2026-12-02T10:00:00Z",
               "contact": {"email": "ann@example.com"}})
    };
    let first: Value = mine
        .post("/events", &event("e1"), StatusCode::CREATED)
        .await;
    let run: Uuid = first["runs"][0]["id"].as_str().unwrap().parse().unwrap();
    // The run held by another transaction: the event waits for it, then the delete does.
    // Released, the event ends the run and starts one, and the delete ends that one; taken
    // in opposite orders, the workflow and the run deadlock one of them (a 500).
    let mut holder = store.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM workflow_runs WHERE id = $1 FOR UPDATE")
        .bind(run)
        .execute(&mut *holder)
        .await
        .unwrap();
    let (e2, path) = (event("e2"), format!("/workflows/{workflow}"));
    let (second, (deleted, ())): (Value, (Value, ())) =
        tokio::join!(mine.post("/events", &e2, StatusCode::CREATED), async {
            lock_waiters_reach(&store.pool, 1).await;
            tokio::join!(mine.delete(&path, StatusCode::OK), async {
                lock_waiters_reach(&store.pool, 2).await;
                holder.rollback().await.unwrap();
            })
        });
    assert_eq!(second["runs"].as_array().map(Vec::len), Some(1), "{second}");
    assert_eq!(deleted["endedRuns"], json!(1), "{deleted}");
}
