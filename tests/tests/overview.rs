//! `GET /operations-overview`: counts from inbound-ingest, domain and the sender against
//! known data, the `since` rules, and a stopped owning service named, not a 500.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_tests::mta::{ingest, message};
use postmesh_tests::{Stack, INBOUND_DOMAIN};

#[tokio::test]
async fn the_overview_counts_each_owners_data_and_names_the_missing() {
    let mut stack = Stack::start().await;
    let key = stack.key(10).await;
    let client = stack.client(&key);
    let workspace = stack.workspace_of(&key).await;

    // Two unread threads.
    let _: Value = client
        .post(
            "/inbox/addresses",
            &json!({ "address": format!("help@{INBOUND_DOMAIN}") }),
            StatusCode::CREATED,
        )
        .await;
    for subject in ["First", "Second"] {
        let raw = String::from_utf8(message(None, subject, "", "hi"))
            .unwrap()
            .replace("support@", "help@");
        ingest(&stack, raw.as_bytes(), &[&format!("help@{INBOUND_DOMAIN}")]).await;
    }
    // One domain that sends, one that does not.
    let domains = stack.service_db(postmesh_shared::Service::Domain).await;
    for (name, outbound) in [("sends.example", "verified"), ("idle.example", "pending")] {
        sqlx::query(
            "INSERT INTO domains (id, workspace_id, name, verification_token, ownership,
                                  outbound_status, created_at)
             VALUES ($1, $2, $3, 't', 'verified', $4, 0)",
        )
        .bind(uuid::Uuid::now_v7())
        .bind(workspace)
        .bind(name)
        .bind(outbound)
        .execute(&domains)
        .await
        .expect("domain row");
    }
    // Three sends, one event starting a run that waits.
    for n in 0..3 {
        let body = json!({ "to": [format!("r{n}@example.com")], "subject": "Hi", "text": "Hello" });
        let _: Value = client.post("/send-email", &body, StatusCode::OK).await;
    }
    let _: Value = client
        .post(
            "/templates",
            &json!({ "key": "t", "subject": "T", "text": "x" }),
            StatusCode::OK,
        )
        .await;
    let _: Value = client
        .post(
            "/workflows",
            &json!({ "name": "w", "trigger": { "event_name": "joined" },
                     "steps": [{ "type": "wait", "seconds": 3600 }, { "type": "send", "templateKey": "t" }] }),
            StatusCode::CREATED,
        )
        .await;
    let _: Value = client
        .post(
            "/events",
            &json!({ "event_id": "j-1", "event_name": "joined", "occurred_at": "2026-11-25T10:00:00Z",
                     "contact": { "email": "new@example.com" } }),
            StatusCode::CREATED,
        )
        .await;

    let all: Value = client
        .get("/operations-overview?since=0", StatusCode::OK)
        .await;
    assert_eq!(
        all["stats"],
        json!({ "unreadThreads": 2, "sendsSince": 3, "activeCampaigns": 0, "outboundDomains": 1,
                "eventsSince": 1, "activeRuns": 1, "openRate": 0.0, "clickRate": 0.0,
                "unavailable": [] })
    );
    // Counts "since" start at `since`; the others are as of now.
    let later = postmesh_shared::db::now_unix() + 3600;
    let none: Value = client
        .get(
            &format!("/operations-overview?since={later}"),
            StatusCode::OK,
        )
        .await;
    assert_eq!(none["stats"]["sendsSince"], 0);
    assert_eq!(none["stats"]["eventsSince"], 0);
    assert_eq!(none["stats"]["unreadThreads"], 2);
    assert_eq!(none["stats"]["activeRuns"], 1);
    assert_eq!(
        none["stats"]["openRate"],
        Value::Null,
        "no message sent since"
    );
    // Another workspace sees its own (none).
    let other: Value = stack
        .client(&stack.key(0).await)
        .get("/operations-overview?since=0", StatusCode::OK)
        .await;
    assert_eq!(other["stats"]["sendsSince"], 0);
    assert_eq!(other["stats"]["unreadThreads"], 0);

    for bad in [
        "",
        "?since=",
        "?since=-1",
        "?since=1.5",
        "?since=abc",
        "?since=1&since=2",
    ] {
        let answer = client
            .send(Method::GET, &format!("/operations-overview{bad}"), None)
            .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
    }

    // The domain service stops: its count is null and it is named; the rest still come.
    stack.stop_domain().await;
    let partial: Value = client
        .get("/operations-overview?since=0", StatusCode::OK)
        .await;
    assert_eq!(partial["stats"]["outboundDomains"], Value::Null);
    assert_eq!(partial["stats"]["unavailable"], json!(["domain"]));
    assert_eq!(partial["stats"]["unreadThreads"], 2);
    assert_eq!(partial["stats"]["sendsSince"], 3);

    // A service that hangs instead: the answer still comes, at the deadline.
    let nats = postmesh_tests::ops_nats(&stack.common.nats_url)
        .await
        .expect("nats");
    let subject = postmesh_shared::Service::Domain.rpc_subject(stack.ns(), "overview");
    let _hung = nats.subscribe(subject).await.expect("subscribe");
    nats.flush().await.expect("flush");
    let asked = std::time::Instant::now();
    let late: Value = client
        .get("/operations-overview?since=0", StatusCode::OK)
        .await;
    let took = asked.elapsed();
    assert_eq!(late["stats"]["unavailable"], json!(["domain"]));
    assert_eq!(late["stats"]["unreadThreads"], 2);
    assert!(
        took >= sender::overview::DEADLINE && took < sender::overview::DEADLINE * 3,
        "answered after {took:?}"
    );
    stack.shutdown().await;
}
