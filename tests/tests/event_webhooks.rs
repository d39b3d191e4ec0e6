//! Workspace webhooks of delivery events through the whole path — a send, the sender's
//! outbox, DELIVERY, the dispatcher, a signed POST — to local receivers that check every
//! signature as Standard Webhooks says: who gets which types, in sequence order, with
//! reasons; the resource's rules; retries, retry by hand and replay by type; a slow webhook
//! beside a fast one; and a dispatcher killed mid-fan-out.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use prost::Message as _;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use postmesh_shared::error::ErrorBody;
use postmesh_shared::jetstream::{self, Stream};
use postmesh_shared::proto::DeliveryEvents;
use postmesh_shared::{Success, TaskId};
use postmesh_tests::attempts::Of;
use postmesh_tests::fake_sns::FakeSns;
use postmesh_tests::mta::{ingest, message};
use postmesh_tests::receiver::{received, Delivery, Receiver, Reply};
use postmesh_tests::{eventually, Stack, INBOUND_DOMAIN, PROVIDER_SECRET};
use webhook_dispatcher::attempt::Status;
use webhook_dispatcher::routes::attempts::{AttemptView, Replayed, Tested};
use webhook_dispatcher::routes::endpoints::Deleted;
use webhook_dispatcher::routes::webhooks::{Created, EventTypes, WebhookList, WebhookPage};

/// Creates a webhook posting to `receiver` taking `events` (none: all), which trusts its
/// secret; its id.
async fn webhook(stack: &Stack, key: &str, receiver: &Receiver, events: &[&str]) -> Uuid {
    receiver.subscribe(stack, key, events).await
}

/// The webhook's attempts (the newest 100), newest first.
async fn attempts(stack: &Stack, key: &str, id: Uuid) -> Vec<AttemptView> {
    postmesh_tests::attempts::list(stack, key, Of::Webhook(id)).await
}

/// Waits until the webhook's attempts are `count`, all with `status`.
async fn settled(
    stack: &Stack, key: &str, id: Uuid, count: usize, status: Status,
) -> Vec<AttemptView> {
    postmesh_tests::attempts::settled(stack, key, Of::Webhook(id), count, status).await
}

/// The types of `got`, in arrival order.
fn types(got: &[Delivery]) -> Vec<String> {
    got.iter()
        .map(|d| d.body["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Sends `body` (a send request); the task.
async fn send(stack: &Stack, key: &str, body: Value) -> TaskId {
    stack.sent(key, &body).await.task_id.expect("a task")
}

/// The provider's message id of the task's first recipient, once it was sent.
async fn provider_id(stack: &Stack, key: &str, task: TaskId) -> String {
    let sent = stack.first_recipient(key, task, |r| r.provider_message_id.is_some());
    sent.await.provider_message_id.expect("sent")
}

/// Posts an SES event about `ses_id` for `to` through the fake SNS; it must be matched.
async fn notify(stack: &Stack, sns: &FakeSns, sns_id: &str, kind: &str, ses_id: &str, part: Value) {
    let name = kind.to_lowercase();
    let mut event = json!({
        "eventType": kind,
        "mail": {"timestamp": "2026-11-25T07:00:00.000Z", "messageId": ses_id,
                 "source": "hello@postmesh.localhost", "destination": ["x@example.com"]},
    });
    event[name] = part;
    let res = reqwest::Client::new()
        .post(format!("{}/provider-events/esp", stack.base))
        .header("content-type", "text/plain; charset=UTF-8")
        .header("x-service-provider-secret", PROVIDER_SECRET)
        .body(sns.notification(sns_id, &event, 2).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["matched"], 1, "{body}");
}

/// The scenarios below, each with a key, receivers and SNS ids of its own, on one stack.
#[tokio::test]
async fn event_webhooks_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            webhooks_get_exactly_their_types_in_sequence_order_and_no_filter_gets_everything,
            webhooks_follow_their_rules,
            bounces_complaints_and_unsubscribes_carry_their_reason
        ]
    );
}

async fn webhooks_get_exactly_their_types_in_sequence_order_and_no_filter_gets_everything(
    stack: &Stack,
) {
    let key = stack.key(100).await;
    let (picky, all) = (Receiver::start().await, Receiver::start().await);
    webhook(stack, &key, &picky, &["email.sent", "email.delivered"]).await;
    webhook(stack, &key, &all, &[]).await;
    let task = send(
        stack,
        &key,
        json!({"to": "x@example.com", "subject": "Hello there", "text": "Body text",
               "fromEmail": "team@postmesh.localhost", "fromName": "Team",
               "emailType": "lifecycle",
               "topic": "onboarding", "sourceApp": "signup", "businessGoal": "activation"}),
    )
    .await;
    let ses_id = provider_id(stack, &key, task).await;
    let sns = FakeSns::start().await;
    notify(
        stack,
        &sns,
        "sns-d1",
        "Delivery",
        &ses_id,
        json!({"recipients": ["x@example.com"], "smtpResponse": "250 ok"}),
    )
    .await;

    let mut got = received(&picky, 2, Duration::from_secs(15)).await;
    got.sort_by_key(|d| d.body["data"]["sequence"].as_i64());
    assert_eq!(types(&got), ["email.sent", "email.delivered"]);
    let (sent, delivered) = (&got[0].body["data"], &got[1].body["data"]);
    assert!(sent["sequence"].as_i64() < delivered["sequence"].as_i64());
    assert_eq!(sent["taskId"], task.to_string());
    assert_eq!(sent["deliveryId"], delivered["deliveryId"]);
    assert_eq!(sent["email"], "x@example.com");
    assert_eq!(sent["subject"], "Hello there");
    assert_eq!(
        sent["from"],
        json!({"address": "team@postmesh.localhost", "name": "Team"})
    );
    assert_eq!(
        (&sent["emailType"], &sent["topic"]),
        (&json!("lifecycle"), &json!("onboarding"))
    );
    assert_eq!(
        (&sent["sourceApp"], &sent["businessGoal"]),
        (&json!("signup"), &json!("activation"))
    );
    let delivery = sent["deliveryId"].as_str().unwrap();
    assert!(
        sent["messageId"]
            .as_str()
            .unwrap()
            .starts_with(&format!("<{delivery}@")),
        "{sent}"
    );
    assert_eq!(delivered["providerMessageId"], ses_id.as_str());
    assert!(sent["occurredAt"].as_i64().unwrap() > 1_700_000_000);
    for d in &got {
        let data = d.body["data"].as_object().unwrap();
        assert!(
            !data.contains_key("text") && !data.contains_key("html") && !data.contains_key("body"),
            "never the message's body: {data:?}"
        );
        assert!(d.body["timestamp"].is_string());
    }

    // No filter: every event of the send, and a received message too.
    let inbox = format!("all@{INBOUND_DOMAIN}");
    let _: Value = stack
        .client(&key)
        .post(
            "/inbox/addresses",
            &json!({ "address": inbox }),
            StatusCode::CREATED,
        )
        .await;
    ingest(stack, &message(None, "Inbound one", "", "hi"), &[&inbox]).await;
    let got = received(&all, 4, Duration::from_secs(15)).await;
    let mut seen = types(&got);
    seen.sort();
    assert_eq!(
        seen,
        [
            "email.delivered",
            "email.queued",
            "email.sent",
            "inbound.received"
        ]
    );
    let inbound = got
        .iter()
        .find(|d| d.body["type"] == "inbound.received")
        .unwrap();
    assert_eq!(inbound.body["data"]["subject"], "Inbound one");
    assert_eq!(inbound.body["data"]["bodyFormat"], "text");
    let mut by_sequence: Vec<&Delivery> = got
        .iter()
        .filter(|d| d.body["type"] != "inbound.received")
        .collect();
    by_sequence.sort_by_key(|d| d.body["data"]["sequence"].as_i64());
    assert_eq!(
        by_sequence
            .iter()
            .map(|d| d.body["type"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["email.queued", "email.sent", "email.delivered"]
    );
    // The queued event, published without a row of its own, carries the same labels.
    let queued = &by_sequence[0].body["data"];
    assert_eq!(
        (
            &queued["subject"],
            &queued["deliveryId"],
            &queued["messageId"]
        ),
        (&sent["subject"], &sent["deliveryId"], &sent["messageId"])
    );
    assert_eq!(queued["from"], sent["from"]);
    stack
        .handled(&[Stream::Inbound, Stream::Delivery, Stream::Webhook])
        .await;
    assert_eq!(picky.count(), 2, "{:?}", types(&picky.deliveries()));
    assert_eq!(all.count(), 4, "{:?}", types(&all.deliveries()));
    assert!(picky.refused().is_empty() && all.refused().is_empty());
}

async fn webhooks_follow_their_rules(stack: &Stack) {
    let key = stack.key(0).await;
    let client = stack.client(&key);
    let listed: Success<EventTypes> = client.get("/webhooks/event-types", StatusCode::OK).await;
    let names: Vec<&str> = listed
        .body
        .event_types
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(names.len(), 14);
    for name in [
        "email.queued",
        "email.scheduled",
        "email.failed",
        "email.cancelled",
        "inbound.received",
    ] {
        assert!(names.contains(&name), "{names:?}");
    }
    assert!(listed
        .body
        .event_types
        .iter()
        .all(|t| !t.description.is_empty()));

    let receiver = Receiver::start().await;
    let url = |n: usize| receiver.url(&format!("/hook/{n}"));
    // An unknown type, a bad secret, a private URL without the flag's effect elsewhere.
    let unknown: ErrorBody = client
        .post(
            "/webhooks",
            &json!({"url": url(0), "events": ["email.viewed"]}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    assert!(unknown.error.contains("email.viewed"), "{}", unknown.error);
    let _: ErrorBody = client
        .post(
            "/webhooks",
            &json!({"url": url(0), "signingSecret": "whsec_short"}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    let _: ErrorBody = client
        .post(
            "/webhooks",
            &json!({"url": "ftp://example.com/x"}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    // Twenty, then 409; a URL twice is 409.
    let mut ids = Vec::new();
    for n in 0..20 {
        let created: Success<Created> = client
            .post(
                "/webhooks",
                &json!({"url": url(n), "events": ["email.sent", "email.sent"]}),
                StatusCode::CREATED,
            )
            .await;
        assert!(created.body.signing_secret.starts_with("whsec_"));
        if n == 0 {
            receiver.trust(&created.body.signing_secret);
        }
        assert_eq!(created.body.webhook.events, ["email.sent"]);
        assert!(created.body.webhook.active);
        ids.push(created.body.webhook.id);
    }
    let _: ErrorBody = client
        .post("/webhooks", &json!({"url": url(20)}), StatusCode::CONFLICT)
        .await;
    let _: Success<Deleted> = client
        .delete(&format!("/webhooks/{}", ids[19]), StatusCode::OK)
        .await;
    let dup: ErrorBody = client
        .post("/webhooks", &json!({"url": url(0)}), StatusCode::CONFLICT)
        .await;
    assert!(dup.error.contains("already"), "{}", dup.error);
    // Shown, listed without the secret, changed.
    let page: Success<WebhookPage> = client
        .get(&format!("/webhooks/{}", ids[0]), StatusCode::OK)
        .await;
    assert_eq!(page.body.webhook.url, url(0));
    let raw: Value = client.get("/webhooks", StatusCode::OK).await;
    assert!(!raw.to_string().contains("whsec_"));
    let list: Success<WebhookList> = client.get("/webhooks", StatusCode::OK).await;
    assert_eq!(list.body.webhooks.len(), 19);
    let changed: Success<WebhookPage> = client
        .patch(
            &format!("/webhooks/{}", ids[0]),
            &json!({"events": ["email.bounced", "inbound.received"], "active": false}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(
        changed.body.webhook.events,
        ["email.bounced", "inbound.received"]
    );
    assert!(!changed.body.webhook.active);
    let _: ErrorBody = client
        .patch(
            &format!("/webhooks/{}", ids[0]),
            &json!({"events": ["nope"]}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    let _: ErrorBody = client
        .patch(
            &format!("/webhooks/{}", ids[0]),
            &json!({"url": url(1)}),
            StatusCode::CONFLICT,
        )
        .await;
    // Another workspace sees none of it.
    let other = stack.key(0).await;
    let theirs = stack.client(&other);
    let id = ids[0];
    for path in [
        format!("/webhooks/{id}"),
        format!("/webhooks/{id}/attempts"),
    ] {
        let _: ErrorBody = theirs.get(&path, StatusCode::NOT_FOUND).await;
    }
    let _: ErrorBody = theirs
        .patch(
            &format!("/webhooks/{id}"),
            &json!({"active": true}),
            StatusCode::NOT_FOUND,
        )
        .await;
    let _: ErrorBody = theirs
        .post(
            &format!("/webhooks/{id}/replay"),
            &json!({"since": 0}),
            StatusCode::NOT_FOUND,
        )
        .await;
    let _: ErrorBody = theirs
        .act(&format!("/webhooks/{id}/test"), StatusCode::NOT_FOUND)
        .await;
    let _: ErrorBody = theirs
        .delete(&format!("/webhooks/{id}"), StatusCode::NOT_FOUND)
        .await;
    let mine: Success<WebhookList> = theirs.get("/webhooks", StatusCode::OK).await;
    assert!(mine.body.webhooks.is_empty());
    // A test delivery, disabled or not: signed, of a type the webhook takes.
    let tested: Success<Tested> = client
        .act(&format!("/webhooks/{id}/test"), StatusCode::OK)
        .await;
    assert_eq!(tested.body.status_code, Some(200));
    assert!(tested.body.delivered);
    let got = receiver.deliveries();
    assert_eq!(types(&got), ["email.bounced"]);
    assert_eq!(got[0].body["data"]["email"], "sample@postmesh.test");
    let removed: Success<Deleted> = client
        .delete(&format!("/webhooks/{id}"), StatusCode::OK)
        .await;
    assert!(removed.body.deleted);
    let _: ErrorBody = client
        .get(&format!("/webhooks/{id}"), StatusCode::NOT_FOUND)
        .await;
}

async fn bounces_complaints_and_unsubscribes_carry_their_reason(stack: &Stack) {
    let key = stack.key(100).await;
    let receiver = Receiver::start().await;
    let types_wanted = ["email.bounced", "email.complained", "email.unsubscribed"];
    webhook(stack, &key, &receiver, &types_wanted).await;
    let sns = FakeSns::start().await;
    let mail = |to: &str| json!({"to": to, "subject": "Hi", "text": "Hello", "emailType": "marketing", "topic": "news"});
    let bounced = send(stack, &key, mail("gone@example.com")).await;
    let id = provider_id(stack, &key, bounced).await;
    notify(
        stack,
        &sns,
        "sns-b",
        "Bounce",
        &id,
        json!({"bounceType": "Permanent", "bounceSubType": "General",
               "bouncedRecipients": [{"emailAddress": "gone@example.com",
                                      "diagnosticCode": "smtp; 550 5.1.1 user unknown"}]}),
    )
    .await;
    let complained = send(stack, &key, mail("angry@example.com")).await;
    let id = provider_id(stack, &key, complained).await;
    notify(
        stack,
        &sns,
        "sns-c",
        "Complaint",
        &id,
        json!({"complaintFeedbackType": "abuse",
               "complainedRecipients": [{"emailAddress": "angry@example.com"}]}),
    )
    .await;
    let left = send(stack, &key, mail("done@example.com")).await;
    let id = provider_id(stack, &key, left).await;
    notify(
        stack,
        &sns,
        "sns-u",
        "Subscription",
        &id,
        json!({"newTopicPreferences": {"unsubscribeAll": false, "topicSubscriptionStatus":
               [{"topicName": "news", "subscriptionStatus": "OptOut"}]}}),
    )
    .await;
    let got = received(&receiver, 3, Duration::from_secs(15)).await;
    let by_type: HashMap<String, &Value> = got
        .iter()
        .map(|d| (d.body["type"].as_str().unwrap().to_owned(), &d.body["data"]))
        .collect();
    let bounce = by_type["email.bounced"];
    assert_eq!(bounce["reason"], "smtp; 550 5.1.1 user unknown");
    assert_eq!(bounce["bounceType"], "Permanent");
    assert_eq!(bounce["taskId"], bounced.to_string());
    assert_eq!(by_type["email.complained"]["reason"], "complaint (abuse)");
    assert_eq!(by_type["email.complained"]["email"], "angry@example.com");
    let unsubscribed = by_type["email.unsubscribed"];
    assert_eq!(
        unsubscribed["reason"],
        "unsubscribed from topic news at the provider"
    );
    assert_eq!(unsubscribed["topic"], "news");
    stack
        .handled(&[Stream::Inbound, Stream::Delivery, Stream::Webhook])
        .await;
    assert_eq!(receiver.count(), 3, "{:?}", types(&receiver.deliveries()));
}

/// Retries and replays, and a slow webhook beside a fast one, each with a key of its own,
/// on one stack whose dispatcher queues 3 deliveries a replay at most and waits 10 s for an
/// answer.
#[tokio::test]
async fn a_tuned_dispatcher_side_by_side() {
    let mut stack = Stack::start().await;
    let mut config = stack.dispatcher_config();
    config.replay_max = 3;
    config.delivery.timeout = Duration::from_secs(10);
    stack.restart_dispatcher(config).await;
    postmesh_tests::side_by_side!(
        stack,
        [
            deliveries_are_retried_then_sent_again_by_hand_and_replayed_by_type,
            a_slow_webhook_does_not_hold_up_a_fast_one
        ]
    );
}

async fn deliveries_are_retried_then_sent_again_by_hand_and_replayed_by_type(stack: &Stack) {
    let key = stack.key(100).await;
    let receiver = Receiver::start().await;
    let w = webhook(stack, &key, &receiver, &["email.sent"]).await;
    let gone = Receiver::start().await;
    let g = webhook(stack, &key, &gone, &["email.sent"]).await;
    gone.answer(Reply::Status(410));
    // 500 twice, then 200: three tries of one delivery (one webhook-id).
    receiver.script([Reply::Status(500), Reply::Status(500)]);
    let first = send(
        stack,
        &key,
        json!({"to": "a@example.com", "subject": "One", "text": "1"}),
    )
    .await;
    provider_id(stack, &key, first).await;
    let done = settled(stack, &key, w, 1, Status::Succeeded).await;
    assert_eq!(
        (done[0].attempt_count, done[0].last_status_code),
        (3, Some(200))
    );
    assert_eq!(done[0].event_type, "email.sent");
    // A 410: failed at once, and the webhook disabled.
    let dropped = settled(stack, &key, g, 1, Status::Failed).await;
    assert_eq!(dropped[0].attempt_count, 1);
    let page: Success<WebhookPage> = stack
        .client(&key)
        .get(&format!("/webhooks/{g}"), StatusCode::OK)
        .await;
    assert!(!page.body.webhook.active, "a 410 disables the webhook");
    let got = received(&receiver, 3, Duration::from_secs(15)).await;
    assert!(got.iter().all(|d| d.id == got[0].id), "one webhook-id");
    assert_eq!(
        got.iter().map(|d| d.answered).collect::<Vec<_>>(),
        [500, 500, 200]
    );
    let _: Success<WebhookPage> = stack
        .client(&key)
        .patch(
            &format!("/webhooks/{w}"),
            &json!({"events": ["email.sent", "email.queued"]}),
            StatusCode::OK,
        )
        .await;

    // A dead receiver: both deliveries end failed after the schedule's retries.
    receiver.answer(Reply::Status(503));
    let second = send(
        stack,
        &key,
        json!({"to": "b@example.com", "subject": "Two", "text": "2"}),
    )
    .await;
    provider_id(stack, &key, second).await;
    let failed: Vec<AttemptView> = eventually(Duration::from_secs(30), || async {
        let list = attempts(stack, &key, w).await;
        let failed: Vec<AttemptView> = list
            .into_iter()
            .filter(|a| a.status == Status::Failed)
            .collect();
        if failed.len() == 2 {
            Ok(failed)
        } else {
            Err(format!("{failed:?}"))
        }
    })
    .await;
    assert!(failed
        .iter()
        .all(|a| a.attempt_count == 3 && a.last_status_code == Some(503)));
    // One retried by hand: the same delivery again.
    receiver.answer(Reply::Status(200));
    let before = receiver.count();
    let _: Value = stack
        .client(&key)
        .act(
            &format!("/webhooks/{w}/attempts/{}/retry", failed[0].id),
            StatusCode::ACCEPTED,
        )
        .await;
    let got = received(&receiver, before + 1, Duration::from_secs(10)).await;
    assert_eq!(got[before].id, format!("msg_{}", failed[0].id.simple()));
    assert_eq!(got[before].answered, 200);
    // Replayed by type: each sent event since then, as a new delivery; a type the
    // webhook does not take replays nothing; an unknown type is 400.
    let replay = |types: Value| {
        let client = stack.client(&key);
        async move {
            let r: Success<Replayed> = client
                .post(
                    &format!("/webhooks/{w}/replay"),
                    &json!({"since": 0, "types": types}),
                    StatusCode::ACCEPTED,
                )
                .await;
            r.body.queued
        }
    };
    assert_eq!(replay(json!(["email.delivered"])).await, 0);
    // While the receiver holds a replay's deliveries they wait (pending), and the same
    // replay again (a retried call) queues nothing more.
    let hold = || vec![Reply::Slow(Duration::from_secs(2), 200); 2];
    let none_waiting = || async {
        eventually(Duration::from_secs(10), || async {
            let list = attempts(stack, &key, w).await;
            match list.iter().any(|a| a.status == Status::Pending) {
                false => Ok(list),
                true => Err(format!("{list:?}")),
            }
        })
        .await
    };
    let listed = attempts(stack, &key, w).await;
    let before = receiver.count();
    receiver.script(hold());
    assert_eq!(replay(json!(["email.sent"])).await, 2);
    assert_eq!(replay(json!(["email.sent"])).await, 0);
    let got = received(&receiver, before + 2, Duration::from_secs(10)).await;
    let replayed = &got[before..];
    assert!(replayed.iter().all(|d| d.body["type"] == "email.sent"));
    let subjects: HashSet<&str> = replayed
        .iter()
        .map(|d| d.body["data"]["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, HashSet::from(["One", "Two"]));
    // Delivered, they may be replayed again; while that replay waits, the earlier one's
    // attempt is not sent again by hand (409).
    let first_replay: Vec<Uuid> = none_waiting()
        .await
        .into_iter()
        .filter(|a| !listed.iter().any(|l| l.id == a.id))
        .map(|a| a.id)
        .collect();
    assert_eq!(first_replay.len(), 2);
    let before = receiver.count();
    receiver.script(hold());
    assert_eq!(replay(json!(["email.sent"])).await, 2);
    let waiting: ErrorBody = stack
        .client(&key)
        .act(
            &format!("/webhooks/{w}/attempts/{}/retry", first_replay[0]),
            StatusCode::CONFLICT,
        )
        .await;
    assert!(waiting.error.contains("waiting"), "{}", waiting.error);
    received(&receiver, before + 2, Duration::from_secs(10)).await;
    none_waiting().await;
    // Every type since then is 4 events (queued and sent of each send), over the cap: the
    // oldest 3 are queued and the answer says it was cut; asked again while they wait,
    // nothing new.
    let listed = attempts(stack, &key, w).await.len();
    let before = receiver.count();
    receiver.script(vec![Reply::Slow(Duration::from_secs(2), 200); 3]);
    let everything = || async {
        let r: Success<Replayed> = stack
            .client(&key)
            .post(
                &format!("/webhooks/{w}/replay"),
                &json!({"since": 0}),
                StatusCode::ACCEPTED,
            )
            .await;
        (r.body.queued, r.body.truncated)
    };
    assert_eq!(everything().await, (3, true));
    assert_eq!(everything().await, (0, true));
    received(&receiver, before + 3, Duration::from_secs(10)).await;
    none_waiting().await;
    assert_eq!(attempts(stack, &key, w).await.len(), listed + 3);
    let _: ErrorBody = stack
        .client(&key)
        .post(
            &format!("/webhooks/{w}/replay"),
            &json!({"since": 0, "types": ["email.viewed"]}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    // The first send's queued event was stored although no webhook took it then.
    let before = receiver.count();
    assert_eq!(replay(json!(["email.queued"])).await, 2);
    received(&receiver, before + 2, Duration::from_secs(10)).await;
    stack
        .handled(&[Stream::Inbound, Stream::Delivery, Stream::Webhook])
        .await;
    assert_eq!(receiver.count(), before + 2);
}

async fn a_slow_webhook_does_not_hold_up_a_fast_one(stack: &Stack) {
    let key = stack.key(100).await;
    let (slow, fast) = (Receiver::start().await, Receiver::start().await);
    webhook(stack, &key, &slow, &["email.queued"]).await;
    webhook(stack, &key, &fast, &["email.queued"]).await;
    slow.answer(Reply::Slow(Duration::from_secs(30), 200));
    // More events than the slow webhook's delivery slots (8).
    let count = 12;
    let to: Vec<String> = (0..count).map(|i| format!("r{i}@example.com")).collect();
    let started = Instant::now();
    send(
        stack,
        &key,
        json!({"to": to, "subject": "Busy", "text": "b"}),
    )
    .await;
    received(&fast, count, Duration::from_secs(8)).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "before any slow POST timed out"
    );
    assert!(slow.count() < count);
    // The slow webhook answers at once from now on, so its deliveries end within a timeout
    // and a retry (three 10 s timeouts each, eight at a time, outlasted the stack's drain).
    slow.answer(Reply::Status(200));
}

/// Every message of the namespace's DELIVERY stream: its subject and events.
async fn published_events(stack: &Stack) -> Vec<(String, DeliveryEvents)> {
    let messages = stack.stream_messages(Stream::Delivery).await;
    let events = |(subject, payload)| (subject, DeliveryEvents::decode(payload).unwrap());
    messages.into_iter().map(events).collect()
}

#[tokio::test]
async fn a_dispatcher_killed_mid_fan_out_delivers_every_event_once() {
    let mut stack = Stack::start().await;
    let config = stack.dispatcher_config();
    let key = stack.key(1000).await;
    let receiver = Receiver::start().await;
    let w = webhook(&stack, &key, &receiver, &["email.queued"]).await;
    // The events wait on DELIVERY while the dispatcher is down; it is started as a child
    // process and killed once the first of them got their 2xx.
    stack.kill_dispatcher().await;
    let count = 90;
    let to: Vec<String> = (0..count).map(|i| format!("k{i}@example.com")).collect();
    send(
        &stack,
        &key,
        json!({"to": to, "subject": "Crash", "text": "c"}),
    )
    .await;
    receiver.answer(Reply::Slow(Duration::from_millis(400), 200));
    stack.spawn_dispatcher(config.clone()).await;
    let before = postmesh_tests::attempts::some_succeeded(&stack, &key, Of::Webhook(w)).await;
    stack.kill_dispatcher().await; // SIGKILL
    assert!(before.len() < count, "the kill came mid-delivery");
    // As if the kill had beaten every ack: each event and each job comes again.
    let js = stack.jetstream().await;
    let stack_ref = &stack;
    let events = eventually(Duration::from_secs(20), || async move {
        let messages = published_events(stack_ref).await;
        let events: usize = messages.iter().map(|(_, m)| m.events.len()).sum();
        // Each recipient's queued and sent.
        if events == 2 * count {
            Ok(messages)
        } else {
            Err(events)
        }
    })
    .await;
    for (n, (subject, batch)) in events.into_iter().enumerate() {
        let msg_id = format!("{n}:again");
        jetstream::publish(&js, subject, &msg_id, batch.encode_to_vec().into())
            .await
            .expect("published");
    }
    postmesh_tests::attempts::publish_every_job_again(&stack).await;
    receiver.answer(Reply::Status(200));
    stack.restart_dispatcher(config).await;
    let all = settled(&stack, &key, w, count, Status::Succeeded).await;
    stack
        .handled(&[Stream::Inbound, Stream::Delivery, Stream::Webhook])
        .await;
    let got = receiver.deliveries();
    postmesh_tests::attempts::delivered_once(&got, &all, &before);
    let recipients: HashSet<&str> = got
        .iter()
        .map(|d| d.body["data"]["email"].as_str().unwrap())
        .collect();
    assert_eq!(recipients.len(), count, "one event per recipient");
    stack.shutdown().await;
}
