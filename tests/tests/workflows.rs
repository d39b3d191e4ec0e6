//! Workflow events and workflows: event validation and idempotency on the sender's router;
//! over the real stack, events published on EVENTS, runs that wait and send, exits,
//! branches, reentry, a sender killed during a wait, and executions in the entitlements.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::WorkflowEvent;
use postmesh_tests::{eventually, sender_router, SenderMode, Stack, TestClient};
use prost::Message as _;
use sender::Quotas;

fn event(id: &str, name: &str, email: &str, properties: Value) -> Value {
    json!({
        "event_id": id,
        "event_name": name,
        "occurred_at": "2026-11-25T10:00:00+01:00",
        "contact": { "email": email },
        "properties": properties,
    })
}

/// `POST /events` with [`event`]'s body, answered 201 (a new event).
async fn emit(client: &TestClient, id: &str, name: &str, email: &str, properties: Value) {
    let _: Value = client
        .post(
            "/events",
            &event(id, name, email, properties),
            StatusCode::CREATED,
        )
        .await;
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}@example.com", uuid::Uuid::new_v4().simple())
}

async fn template(client: &TestClient, key: &str, subject: &str) {
    let body = json!({ "key": key, "subject": subject, "text": "Hello from a workflow" });
    let _: Value = client.post("/templates", &body, StatusCode::OK).await;
}

/// A workflow `name` that `event` starts: a wait of `seconds`, then a send of `template`.
fn wait_then_send(name: &str, event: &str, seconds: u64, template: &str) -> Value {
    json!({ "name": name, "trigger": { "event_name": event },
            "steps": [{ "type": "wait", "seconds": seconds }, { "type": "send", "templateKey": template }] })
}

async fn workflow(client: &TestClient, body: Value) -> String {
    let made: Value = client.post("/workflows", &body, StatusCode::CREATED).await;
    made["workflow"]["id"].as_str().expect("id").to_owned()
}

/// Posts event `id` named `name` of contact `email`: it starts `expected` runs.
async fn starts(client: &TestClient, id: &str, name: &str, email: &str, expected: usize) {
    let made: Value = client
        .post(
            "/events",
            &event(id, name, email, json!({})),
            StatusCode::CREATED,
        )
        .await;
    let started = made["runs"].as_array().map(Vec::len);
    assert_eq!(started, Some(expected), "{id}: {made}");
}

/// The runs of event `id`, once `done` holds for them.
async fn runs_when(client: &TestClient, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    eventually(Duration::from_secs(30), || async {
        let shown: Value = client.get(&format!("/events/{id}"), StatusCode::OK).await;
        let runs = shown["runs"].as_array().cloned().unwrap_or_default();
        if done(&runs) {
            Ok(runs)
        } else {
            Err(format!("runs: {runs:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn events_are_checked_and_stored_once_per_id() {
    let (store, client, other) = sender_router(Quotas::default()).await;
    let email = fresh("ev");

    // Each field is checked.
    let good = event("e-1", "signed_up", &email, json!({ "plan": "pro" }));
    let mut bad = Vec::new();
    for (field, value) in [
        ("event_id", json!("")),
        ("event_id", json!("x".repeat(201))),
        ("event_name", json!(null)),
        ("occurred_at", json!("2026-11-25T10:00:00")),
        ("occurred_at", json!("yesterday")),
        ("contact", json!({})),
        ("contact", json!({ "email": "not-an-address" })),
        ("properties", json!([1, 2])),
    ] {
        let mut body = good.clone();
        body[field] = value;
        bad.push(body);
    }
    for body in bad {
        let answer = client.request(Method::POST, "/events", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
    }

    // properties up to 64 KiB serialized; one byte more is 413.
    let fill = |n: usize| json!({ "k": "x".repeat(n) });
    let at_limit = fill(64 * 1024 - r#"{"k":""}"#.len());
    assert_eq!(at_limit.to_string().len(), 64 * 1024);
    let ok: Value = client
        .post(
            "/events",
            &event("big", "signed_up", &email, at_limit),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!(ok["duplicate"], false);
    let over = fill(64 * 1024 - r#"{"k":""}"#.len() + 1);
    let answer = client
        .request(
            Method::POST,
            "/events",
            &event("bigger", "signed_up", &email, over),
        )
        .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);

    // New: 201; again: 200 duplicate, nothing new. Extra top-level fields are kept.
    let mut with_extra = good.clone();
    with_extra["source"] = json!("mobile");
    let first: Value = client
        .post("/events", &with_extra, StatusCode::CREATED)
        .await;
    assert_eq!(first["duplicate"], false);
    assert_eq!(first["event"]["eventId"], "e-1");
    assert_eq!(first["event"]["occurredAt"], "2026-11-25T09:00:00Z");
    assert_eq!(first["runs"], json!([]));
    let again: Value = client.post("/events", &good, StatusCode::OK).await;
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["event"], first["event"]);
    let db = &store.pool;
    let extra: Value =
        sqlx::query_scalar("SELECT extra FROM workflow_events WHERE event_id = 'e-1'")
            .fetch_one(db)
            .await
            .expect("stored event");
    assert_eq!(extra, json!({ "source": "mobile" }));

    // The event made the contact; shown by id, not to another workspace.
    let shown: Value = client.get("/events/e-1", StatusCode::OK).await;
    assert_eq!(shown["event"]["contact"]["email"], email.as_str());
    assert_eq!(shown["event"]["properties"], json!({ "plan": "pro" }));
    let _: Value = client.get("/events/nope", StatusCode::NOT_FOUND).await;
    let _: Value = other.get("/events/e-1", StatusCode::NOT_FOUND).await;
    let contacts: Value = client
        .get(&format!("/contacts?email={email}"), StatusCode::OK)
        .await;
    assert_eq!(
        contacts["contacts"].as_array().map(Vec::len),
        Some(1),
        "{contacts}"
    );

    // An event about a contact never seen, named by its external id alone, is never dropped:
    // it makes that contact, without an email; a later event gives it one, and the external
    // id still names that one contact.
    let mut by_id = good.clone();
    by_id["event_id"] = json!("e-2");
    by_id["contact"] = json!({ "external_contact_id": "crm-1" });
    let _: Value = client.post("/events", &by_id, StatusCode::CREATED).await;
    let made = contacts_named(&client, "crm-1").await;
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["email"], Value::Null, "{made:?}");
    let crm_email = fresh("crm");
    by_id["event_id"] = json!("e-3");
    by_id["contact"] = json!({ "external_contact_id": "crm-1", "email": crm_email });
    let _: Value = client.post("/events", &by_id, StatusCode::CREATED).await;
    by_id["event_id"] = json!("e-4");
    by_id["contact"] = json!({ "external_contact_id": "crm-1" });
    let _: Value = client.post("/events", &by_id, StatusCode::CREATED).await;
    let found = contacts_named(&client, "crm-1").await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["id"], made[0]["id"], "one contact throughout");
    assert_eq!(found[0]["email"], crm_email.as_str(), "{found:?}");
}

/// Every workflow event on the stack's EVENTS stream.
async fn published_events(stack: &Stack) -> Vec<WorkflowEvent> {
    let messages = stack.stream_messages(Stream::Events).await;
    let event = |(_, payload)| WorkflowEvent::decode(payload).expect("a WorkflowEvent");
    messages.into_iter().map(event).collect()
}

/// The contacts of the caller's workspace with external id `external`.
async fn contacts_named(client: &postmesh_tests::TestClient, external: &str) -> Vec<Value> {
    let listed: Value = client.get("/contacts?limit=500", StatusCode::OK).await;
    listed["contacts"]
        .as_array()
        .expect("contacts")
        .iter()
        .filter(|c| c["externalId"] == external)
        .cloned()
        .collect()
}

#[tokio::test]
async fn twenty_concurrent_duplicates_make_one_event_and_one_run() {
    let (store, client, _) = sender_router(Quotas::default()).await;
    template(&client, "hello", "Hello").await;
    workflow(&client, wait_then_send("hold", "joined", 3600, "hello")).await;
    let body = event("dup-1", "joined", &fresh("dup"), json!({}));
    let answers =
        futures::future::join_all((0..20).map(|_| client.request(Method::POST, "/events", &body)))
            .await;
    let created = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let duplicates = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    assert_eq!((created, duplicates), (1, 19), "{answers:?}");
    let shown: Value = client.get("/events/dup-1", StatusCode::OK).await;
    assert_eq!(shown["runs"].as_array().map(Vec::len), Some(1), "{shown}");
    let (events, runs): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM workflow_events WHERE event_id = 'dup-1'),
                (SELECT count(*) FROM workflow_runs WHERE event_id = 'dup-1')",
    )
    .fetch_one(&store.pool)
    .await
    .expect("counts");
    assert_eq!((events, runs), (1, 1));
}

/// Workflows of one key each, with contacts of their own, side by side on one stack.
#[tokio::test]
async fn workflows_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            a_run_waits_then_sends_and_an_exit_event_ends_a_waiting_run,
            branches_go_each_way_and_reentry_is_honoured,
            workflows_are_listed_changed_for_new_runs_only_and_deleted,
            conditions_on_the_contact_exit_conditions_and_a_wait_until_a_property,
            a_run_taken_up_too_often_without_an_end_fails
        ]
    );
}

async fn a_run_waits_then_sends_and_an_exit_event_ends_a_waiting_run(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    template(&client, "welcome", "Welcome on the {{plan}} plan").await;
    let id = workflow(
        &client,
        json!({
            "name": "welcome",
            "trigger": { "event_name": "signed_up" },
            "exit": [{ "event_name": "cancelled" }],
            "steps": [{ "type": "wait", "seconds": 2 },
                      { "type": "send", "templateKey": "welcome", "emailType": "lifecycle" }]
        }),
    )
    .await;
    let (ann, bo) = (fresh("ann"), fresh("bo"));
    let started: Value = client
        .post(
            "/events",
            &event("s-ann", "signed_up", &ann, json!({ "plan": "pro" })),
            StatusCode::CREATED,
        )
        .await;
    let runs = started["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["workflowId"], id.as_str());
    assert_eq!(runs[0]["status"], "active");
    // The stored event is published once on EVENTS, in protobuf.
    let published = eventually(Duration::from_secs(10), || async {
        let events = published_events(stack).await;
        match events.iter().filter(|e| e.event_id == "s-ann").count() {
            1 => Ok(events),
            n => Err(n),
        }
    })
    .await;
    let e = published.iter().find(|e| e.event_id == "s-ann").unwrap();
    assert_eq!(e.event_name, "signed_up");
    assert_eq!(e.occurred_at, "2026-11-25T09:00:00Z");
    let contacts: Value = client
        .get(&format!("/contacts?email={ann}"), StatusCode::OK)
        .await;
    assert_eq!(
        e.contact_id,
        contacts["contacts"][0]["id"].as_str().unwrap()
    );
    let properties: Value = serde_json::from_str(&e.properties).unwrap();
    assert_eq!(properties, json!({ "plan": "pro" }));
    emit(&client, "s-bo", "signed_up", &bo, json!({ "plan": "free" })).await;
    // Bo leaves before the wait is over: his run ends and sends nothing.
    emit(&client, "c-bo", "cancelled", &bo, json!({})).await;
    let bo_runs = runs_when(&client, "s-bo", |r| r[0]["status"] != "active").await;
    assert_eq!(bo_runs[0]["status"], "exited");
    assert_eq!(bo_runs[0]["exitReason"], "exit event cancelled");

    let mail = stack
        .wait_for_messages(&ann, 1, Duration::from_secs(15))
        .await;
    assert!(
        mail[0].contains("Subject: Welcome on the pro plan"),
        "{}",
        mail[0]
    );
    let ann_runs = runs_when(&client, "s-ann", |r| r[0]["status"] == "completed").await;
    assert!(ann_runs[0]["endedAt"].as_i64().is_some());
    stack.sends_done().await;
    assert!(stack.messages_to(&bo).is_empty(), "bo's run sent nothing");
    assert_eq!(stack.balance(&key).await, 9, "one send, one credit");

    // Each run is an execution of the plan.
    let ent: Value = client.get("/billing/entitlements", StatusCode::OK).await;
    assert_eq!(
        ent["entitlements"]["model"]["executions"]["used"], 2,
        "{ent}"
    );
}

/// A run taken up more than `MAX_CLAIMS` times without a pass ending (as when its handling
/// brings the sender down each time) fails, saying so, instead of being taken up forever;
/// one taken up fewer times goes on, and its count starts afresh.
async fn a_run_taken_up_too_often_without_an_end_fails(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    template(&client, "later", "Later").await;
    workflow(
        &client,
        json!({
            "name": "later",
            "trigger": { "event_name": "joined" },
            "steps": [{ "type": "wait", "seconds": 3600 },
                      { "type": "send", "templateKey": "later", "emailType": "lifecycle" }]
        }),
    )
    .await;
    let (ann, bo) = (fresh("ann"), fresh("bo"));
    for (id, email) in [("j-ann", &ann), ("j-bo", &bo)] {
        emit(&client, id, "joined", email, json!({})).await;
    }
    // Both asleep in their wait (the pass that started them wrote step 1, which would
    // otherwise overwrite what follows); then as if taken up and lost that often, and due now.
    for id in ["j-ann", "j-bo"] {
        runs_when(&client, id, |r| r.len() == 1 && r[0]["step"] == 1).await;
    }
    let db = stack.sender_db().await;
    for (id, claims) in [("j-ann", sender::workflows::runs::MAX_CLAIMS), ("j-bo", 4)] {
        let changed =
            sqlx::query("UPDATE workflow_runs SET claims = $2, next_at = 0 WHERE event_id = $1")
                .bind(id)
                .bind(claims)
                .execute(&db)
                .await
                .expect("update");
        assert_eq!(changed.rows_affected(), 1);
    }
    let failed = runs_when(&client, "j-ann", |r| r[0]["status"] != "active").await;
    assert_eq!(failed[0]["status"], "failed", "{failed:?}");
    let reason = failed[0]["exitReason"].as_str().unwrap_or_default();
    assert!(reason.contains("taken up 5 times"), "{reason}");
    let done = runs_when(&client, "j-bo", |r| r[0]["status"] != "active").await;
    assert_eq!(done[0]["status"], "completed", "{done:?}");
    stack
        .wait_for_messages(&bo, 1, Duration::from_secs(15))
        .await;
    stack.sends_done().await;
    assert!(
        stack.messages_to(&ann).is_empty(),
        "ann's failed run sent nothing"
    );
}

async fn branches_go_each_way_and_reentry_is_honoured(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    template(&client, "big", "Thanks for the big order").await;
    template(&client, "small", "Thanks for the order").await;
    workflow(
        &client,
        json!({
            "name": "orders",
            "trigger": { "event_name": "ordered" },
            "steps": [{ "type": "branch",
                        "condition": { "property": "total", "op": "gt", "value": 100 },
                        "then": [{ "type": "send", "templateKey": "big" }],
                        "else": [{ "type": "send", "templateKey": "small" }] }]
        }),
    )
    .await;
    let (ann, bo) = (fresh("ann"), fresh("bo"));
    emit(&client, "o-1", "ordered", &ann, json!({ "total": 150 })).await;
    emit(&client, "o-2", "ordered", &bo, json!({ "total": 5 })).await;
    let to_ann = stack
        .wait_for_messages(&ann, 1, Duration::from_secs(15))
        .await;
    assert!(
        to_ann[0].contains("Subject: Thanks for the big order"),
        "{}",
        to_ann[0]
    );
    let to_bo = stack
        .wait_for_messages(&bo, 1, Duration::from_secs(15))
        .await;
    assert!(
        to_bo[0].contains("Subject: Thanks for the order"),
        "{}",
        to_bo[0]
    );

    // Without reentry a contact with an active run starts no second one; with it, it does.
    let waiting = |name: &str, event_name: &str, reentry: bool| {
        json!({ "name": name, "trigger": { "event_name": event_name }, "reentry": reentry,
                "exit": [{ "event_name": "left" }],
                "steps": [{ "type": "wait", "seconds": 3600 }, { "type": "send", "templateKey": "small" }] })
    };
    workflow(&client, waiting("once", "visited", false)).await;
    workflow(&client, waiting("again", "clicked", true)).await;
    let cy = fresh("cy");
    for (id, name, expected) in [
        ("v-1", "visited", 1),
        ("v-2", "visited", 0),
        ("k-1", "clicked", 1),
        ("k-2", "clicked", 1),
    ] {
        starts(&client, id, name, &cy, expected).await;
    }

    // A test key's runs stand apart from live ones: its run keeps no live run from
    // starting, and its exit event ends no live run.
    let test = stack.client(&stack.test_key_of(&key).await);
    let dee = fresh("dee");
    for (client, id, name, expected) in [
        (&test, "t-1", "visited", 1),
        (&client, "v-3", "visited", 1),
        (&test, "t-2", "left", 0),
    ] {
        starts(client, id, name, &dee, expected).await;
    }
    let live: Value = client.get("/events/v-3", StatusCode::OK).await;
    assert_eq!(live["runs"][0]["status"], "active", "{live}");
    let tried: Value = test.get("/events/t-1", StatusCode::OK).await;
    assert_eq!(tried["runs"][0]["status"], "exited", "{tried}");
}

/// A send step that outlives its run's lease (here: storing its task takes 12 s) is taken
/// up by a second pass while the first still stores the task. The second's charge is the
/// first's (one key, the step's task id), so the second, finding the task stored when its
/// own store fails, gives nothing back: the send goes out once and is paid once.
async fn a_slow_send_step_taken_up_twice_is_paid_once(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    let subject = format!("slow {}", uuid::Uuid::new_v4().simple());
    template(&client, "slow", &subject).await;
    let db = stack.sender_db().await;
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION slow_task() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.message->>'subject' = '{subject}' THEN PERFORM pg_sleep(12); END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER slow_task BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION slow_task();"
    ))
    .execute(&db)
    .await
    .expect("the trigger");
    let steps = json!([{ "type": "send", "templateKey": "slow" }]);
    let body = json!({ "name": "slow", "trigger": { "event_name": "slowed" }, "steps": steps });
    workflow(&client, body).await;
    let to = fresh("slow");
    emit(&client, "sl-1", "slowed", &to, json!({})).await;
    let client = &client;
    eventually(Duration::from_secs(60), || async move {
        let shown: Value = client.get("/events/sl-1", StatusCode::OK).await;
        let status = shown["runs"][0]["status"].clone();
        (status == "completed").then_some(()).ok_or(status)
    })
    .await;
    stack.sends_done().await;
    assert_eq!(stack.messages_to(&to).len(), 1, "sent once");
    assert_eq!(stack.balance(&key).await, 9, "paid once");
}

/// Two sender processes: one killed during a wait and started again, then a second
/// replica beside it.
#[tokio::test]
async fn a_sender_killed_during_a_wait_and_a_second_replica_neither_send_twice_nor_early() {
    let mut stack = Stack::start_with(SenderMode::ChildProcess).await;
    let key = stack.key(10).await;
    let client = stack.client(&key);
    template(&client, "later", "A little later").await;
    workflow(&client, wait_then_send("later", "started", 3, "later")).await;
    let dee = fresh("dee");
    emit(&client, "st-1", "started", &dee, json!({})).await;
    stack.kill_sender().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    stack.start_sender().await;
    let runs = runs_when(&client, "st-1", |r| r[0]["status"] == "completed").await;
    assert_eq!(runs.len(), 1);
    stack
        .wait_for_messages(&dee, 1, Duration::from_secs(15))
        .await;
    stack.sends_done().await;
    assert_eq!(stack.messages_to(&dee).len(), 1, "sent exactly once");
    assert_eq!(stack.balance(&key).await, 9);

    // As if the sender had died after the send but before recording it: the step is
    // taken up again, finds its task, and sends nothing more.
    let db = stack.sender_db().await;
    let redone = sqlx::query(
        "UPDATE workflow_runs SET status = 'active', pc = 1, next_at = 0, ended_at = NULL,
                                  lease_until = NULL
         WHERE event_id = 'st-1'",
    )
    .execute(&db)
    .await
    .expect("rewind the run");
    assert_eq!(redone.rows_affected(), 1);
    runs_when(&client, "st-1", |r| r[0]["status"] == "completed").await;
    // Whatever the step queued by then is delivered once the queue is done.
    stack.sends_done().await;
    assert_eq!(
        stack.messages_to(&dee).len(),
        1,
        "the redone step sent nothing"
    );
    assert_eq!(stack.balance(&key).await, 9);
    two_replicas_send_each_run_and_scheduled_send_once_never_early(&stack).await;
    a_slow_send_step_taken_up_twice_is_paid_once(&stack).await;
    stack.shutdown().await;
}

/// With a second sender replica beside the first, whichever takes a run or a scheduled send
/// up: a 2 s wait that starts at any moment of a second ends 2 s or more after its event, a
/// send scheduled for a second goes no earlier, and each goes out once.
async fn two_replicas_send_each_run_and_scheduled_send_once_never_early(stack: &Stack) {
    let second = sender::start(stack.sender_config())
        .await
        .expect("a second sender");
    let key = stack.key(20).await;
    let client = stack.client(&key);
    template(&client, "two", "Two seconds later").await;
    workflow(&client, wait_then_send("two", "joined", 2, "two")).await;
    let unix = |t: SystemTime| t.duration_since(UNIX_EPOCH).expect("after 1970");
    // Six events and six scheduled sends spread over a second, so their waits start at
    // different fractions of it.
    let (mut runs, mut scheduled) = (Vec::new(), Vec::new());
    for i in 0..6 {
        let to = fresh("two");
        let at = SystemTime::now();
        emit(&client, &format!("j-{i}"), "joined", &to, json!({})).await;
        runs.push((to, at + Duration::from_secs(2)));
        let later = fresh("later");
        let due = unix(SystemTime::now()).as_secs() + 2;
        let send = json!({"to": later, "subject": "s", "text": "t", "scheduledAt": due});
        let _: Value = client.post("/send-email", &send, StatusCode::OK).await;
        scheduled.push((later, UNIX_EPOCH + Duration::from_secs(due)));
        tokio::time::sleep(Duration::from_millis(170)).await;
    }
    for (to, not_before) in runs.iter().chain(&scheduled) {
        stack
            .wait_for_messages(to, 1, Duration::from_secs(15))
            .await;
        let (written, _) = stack.written_to(to).remove(0);
        assert!(
            written >= *not_before,
            "the email to {to} was written at {:?}, before {:?}",
            unix(written),
            unix(*not_before)
        );
    }
    stack.sends_done().await;
    for (to, _) in runs.iter().chain(&scheduled) {
        assert_eq!(stack.messages_to(to).len(), 1, "one email to {to}");
    }
    second.stop().await;
}

async fn workflows_are_listed_changed_for_new_runs_only_and_deleted(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    template(&client, "one", "One").await;
    template(&client, "two", "Two").await;
    let missing = client
        .request(
            Method::POST,
            "/workflows",
            &json!({ "name": "x", "trigger": { "event_name": "e" },
                     "steps": [{ "type": "send", "templateKey": "nope" }] }),
        )
        .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    let v1 = wait_then_send("w", "go", 2, "one");
    let id = workflow(&client, v1).await;
    let (first, second, third) = (fresh("ed"), fresh("fay"), fresh("gus"));
    emit(&client, "g-1", "go", &first, json!({})).await;
    // Version 2 sends "Two" at once; the run of version 1 still waits, then sends "One".
    let v2 = json!({ "name": "w2", "trigger": { "event_name": "go" },
                     "steps": [{ "type": "send", "templateKey": "two" }] });
    let changed: Value = client
        .patch(&format!("/workflows/{id}"), &v2, StatusCode::OK)
        .await;
    assert_eq!(changed["workflow"]["version"], 2);
    assert_eq!(changed["workflow"]["name"], "w2");
    assert_eq!(changed["workflow"]["activeRuns"], 1);
    emit(&client, "g-2", "go", &second, json!({})).await;
    let to_second = stack
        .wait_for_messages(&second, 1, Duration::from_secs(15))
        .await;
    assert!(to_second[0].contains("Subject: Two"), "{}", to_second[0]);
    let to_first = stack
        .wait_for_messages(&first, 1, Duration::from_secs(15))
        .await;
    assert!(
        to_first[0].contains("Subject: One"),
        "the old run keeps version 1: {}",
        to_first[0]
    );
    let listed: Value = client.get("/workflows", StatusCode::OK).await;
    assert_eq!(listed["workflows"].as_array().map(Vec::len), Some(1));

    // A delete ends the active runs and starts no more.
    let v3 = wait_then_send("w3", "go", 3600, "one");
    let _: Value = client
        .patch(&format!("/workflows/{id}"), &v3, StatusCode::OK)
        .await;
    emit(&client, "g-3", "go", &third, json!({})).await;
    let gone: Value = client
        .delete(&format!("/workflows/{id}"), StatusCode::OK)
        .await;
    assert_eq!(gone["endedRuns"], 1);
    let shown: Value = client.get("/events/g-3", StatusCode::OK).await;
    assert_eq!(shown["runs"][0]["status"], "exited");
    assert_eq!(shown["runs"][0]["exitReason"], "workflow deleted");
    let _: Value = client
        .get(&format!("/workflows/{id}"), StatusCode::NOT_FOUND)
        .await;
    let after: Value = client
        .post(
            "/events",
            &event("g-4", "go", &fresh("hal"), json!({})),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!(after["runs"], json!([]));
}

async fn conditions_on_the_contact_exit_conditions_and_a_wait_until_a_property(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    template(&client, "vip", "Your order ships").await;
    let (vip, plain) = (fresh("vip"), fresh("plain"));
    let _: Value = client
        .post(
            "/contacts",
            &json!({ "email": vip, "tags": ["vip"] }),
            StatusCode::CREATED,
        )
        .await;
    workflow(
        &client,
        json!({
            "name": "vip orders",
            "trigger": { "event_name": "ordered", "conditions": [{ "tag": "vip" }] },
            "exit": [{ "event_name": "refunded", "conditions": [{ "property": "full", "value": true }] }],
            "steps": [{ "type": "wait", "until": "ship_at" }, { "type": "send", "templateKey": "vip" }]
        }),
    )
    .await;
    let ship_at = postmesh_shared::db::now_unix() + 3;
    let not_vip: Value = client
        .post(
            "/events",
            &event("o-p", "ordered", &plain, json!({ "ship_at": ship_at })),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!(
        not_vip["runs"],
        json!([]),
        "the trigger's condition on the contact fails"
    );
    let started: Value = client
        .post(
            "/events",
            &event("o-v", "ordered", &vip, json!({ "ship_at": ship_at })),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!(started["runs"][0]["status"], "active");
    // A partial refund does not meet the exit's condition: the run goes on.
    emit(&client, "r-v", "refunded", &vip, json!({ "full": false })).await;
    let shown: Value = client.get("/events/o-v", StatusCode::OK).await;
    assert_eq!(
        shown["runs"][0]["status"], "active",
        "waiting until ship_at"
    );
    let mail = stack
        .wait_for_messages(&vip, 1, Duration::from_secs(15))
        .await;
    assert!(
        postmesh_shared::db::now_unix() >= ship_at,
        "not before ship_at"
    );
    assert!(mail[0].contains("Subject: Your order ships"));
    runs_when(&client, "o-v", |r| r[0]["status"] == "completed").await;
}
