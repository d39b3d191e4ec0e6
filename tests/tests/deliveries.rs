//! Inbox webhook deliveries through the whole path — the MTA's ingest, INBOUND, the
//! dispatcher, a signed POST — to local receivers that check every signature as Standard
//! Webhooks says: who gets what, body formats and quote stripping on real clients' replies,
//! retries, Retry-After, failure, retry and replay by hand, a slow receiver, a host whose DNS
//! turns private, and a dispatcher killed mid-delivery.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_shared::error::ErrorBody;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::{AddressId, Success};
use postmesh_tests::attempts::Of;
use postmesh_tests::fake_dns::FakeDns;
use postmesh_tests::mta::{fixture, ingest, key_with_inbox, message};
use postmesh_tests::receiver::{received, Delivery, Receiver, Reply};
use postmesh_tests::{eventually, peek, ServiceDb, Stack, INBOUND_DOMAIN};
use webhook_dispatcher::attempt::Status;
use webhook_dispatcher::routes::attempts::{AttemptList, AttemptView, Replayed, Tested};
use webhook_dispatcher::routes::defaults::DefaultPage;
use webhook_dispatcher::routes::endpoints::{Created, EndpointPage, Subscribed};

/// Creates an endpoint of `inbox` posting to `receiver` (with `extra` fields), which trusts
/// its secret; the endpoint's id.
async fn endpoint(
    stack: &Stack, key: &str, inbox: AddressId, receiver: &Receiver, extra: Value,
) -> uuid::Uuid {
    let mut body = json!({ "addressId": inbox, "url": receiver.url("/hook") });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let created: Success<Created> = stack
        .client(key)
        .post("/inbox/webhook/endpoints", &body, StatusCode::CREATED)
        .await;
    receiver.trust(&created.body.signing_secret);
    created.body.endpoint.id
}

/// The endpoint's attempts (the newest 100), newest first.
async fn attempts(stack: &Stack, key: &str, id: uuid::Uuid) -> Vec<AttemptView> {
    postmesh_tests::attempts::list(stack, key, Of::Endpoint(id)).await
}

/// Waits until one of the endpoint's attempts was last answered `code`; that attempt.
async fn answered(
    stack: &Stack, key: &str, id: uuid::Uuid, code: i32, within: Duration,
) -> AttemptView {
    eventually(within, || async {
        let mut list = attempts(stack, key, id).await;
        match list.iter().position(|a| a.last_status_code == Some(code)) {
            Some(at) => Ok(list.swap_remove(at)),
            None => Err(format!("{list:?}")),
        }
    })
    .await
}

/// Waits until the endpoint's attempts are `count`, all with `status`.
async fn settled(
    stack: &Stack, key: &str, id: uuid::Uuid, count: usize, status: Status,
) -> Vec<AttemptView> {
    postmesh_tests::attempts::settled(stack, key, Of::Endpoint(id), count, status).await
}

fn inbox_address(local: &str) -> String {
    format!("{local}@{INBOUND_DOMAIN}")
}

/// The MTA hands in a message `subject` with `body` for inbox `local`.
async fn mail_to(stack: &Stack, local: &str, subject: &str, body: &str) {
    ingest(
        stack,
        &message(None, subject, "", body),
        &[&inbox_address(local)],
    )
    .await;
}

/// The webhook dispatcher's database alone.
async fn dispatcher_db() -> ServiceDb {
    ServiceDb::create(
        webhook_dispatcher::SERVICE,
        &[&webhook_dispatcher::MIGRATOR],
    )
    .await
}

/// `POST /inbox/webhook/endpoints/{e}/replay` of every message since 0, as `key`.
async fn replay<T: serde::de::DeserializeOwned>(
    stack: &Stack, key: &str, e: uuid::Uuid, expected: StatusCode,
) -> T {
    let path = format!("/inbox/webhook/endpoints/{e}/replay");
    stack
        .client(key)
        .post(&path, &json!({ "since": 0 }), expected)
        .await
}

/// A fresh key with inbox `local` and an endpoint of it to a new receiver: the key, the
/// endpoint's id and the receiver.
async fn key_and_endpoint(stack: &Stack, local: &str) -> (String, uuid::Uuid, Receiver) {
    let (key, inbox) = key_with_inbox(stack, local).await;
    let receiver = Receiver::start().await;
    let e = endpoint(stack, &key, inbox, &receiver, json!({})).await;
    (key, e, receiver)
}

/// For the crash tests: a stack whose dispatcher is a child process (and its settings, for a
/// restart), a fresh key, and an endpoint of its inbox `local` to a receiver answering
/// `reply`.
async fn child_dispatcher_and_endpoint(
    local: &str, reply: Reply,
) -> (
    Stack,
    webhook_dispatcher::Config,
    String,
    uuid::Uuid,
    Receiver,
) {
    let mut stack = Stack::start().await;
    let config = stack.dispatcher_config();
    stack.spawn_dispatcher(config.clone()).await;
    let (key, e, receiver) = key_and_endpoint(&stack, local).await;
    receiver.answer(reply);
    (stack, config, key, e, receiver)
}

/// The receiver got two deliveries, both under attempt `id`'s webhook-id.
fn delivered_twice_as(receiver: &Receiver, id: uuid::Uuid) {
    let got = receiver.deliveries();
    assert_eq!(got.len(), 2, "tried again, once");
    let id = format!("msg_{}", id.simple());
    assert!(
        got.iter().all(|d| d.id == id),
        "the same webhook-id both times"
    );
}

async fn each_active_endpoint_gets_its_own_signed_delivery_and_the_default_the_rest(stack: &Stack) {
    let (key, sales) = key_with_inbox(stack, "sales").await;
    // A second address of the workspace, past the free tier's one mailbox.
    let inbound_db = stack.service_db(inbound_ingest::SERVICE).await;
    let workspace = stack.workspace_of(&key).await;
    let info = peek::inbound::insert_address(&inbound_db, workspace, &inbox_address("info")).await;
    let quiet_box =
        peek::inbound::insert_address(&inbound_db, workspace, &inbox_address("quiet")).await;
    let (r1, r2, off, fallback) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let e1 = endpoint(stack, &key, sales, &r1, json!({})).await;
    endpoint(stack, &key, sales, &r2, json!({})).await;
    endpoint(stack, &key, sales, &off, json!({ "active": false })).await;
    // An address whose only endpoint is inactive has no active endpoint: the default's.
    let quiet_box = AddressId::from(quiet_box);
    endpoint(stack, &key, quiet_box, &off, json!({ "active": false })).await;
    let default: Success<DefaultPage> = stack
        .client(&key)
        .put(
            "/inbox/webhook/default",
            &json!({ "url": fallback.url("/default") }),
            StatusCode::OK,
        )
        .await;
    fallback.trust(default.body.signing_secret.as_deref().expect("the secret"));

    let raw = message(Some("hello-1@customer.example"), "Hello", "", "Hi there.");
    let to = [
        inbox_address("sales"),
        inbox_address("info"),
        inbox_address("quiet"),
    ];
    ingest(stack, &raw, &[&to[0], &to[1], &to[2]]).await;

    let (d1, d2) = (
        received(&r1, 1, Duration::from_secs(10)).await,
        received(&r2, 1, Duration::from_secs(10)).await,
    );
    let mut fell = received(&fallback, 2, Duration::from_secs(10)).await;
    fell.sort_by_key(|d| d.body["data"]["address"].as_str().map(str::to_owned));
    stack.handled(&[Stream::Inbound, Stream::Webhook]).await;
    assert_eq!((r1.count(), r2.count(), off.count()), (1, 1, 0));
    assert_eq!(
        fallback.count(),
        2,
        "the default gets only the addresses without active endpoints"
    );
    assert_ne!(d1[0].id, d2[0].id, "each endpoint its own delivery");
    assert!(d1[0].id.starts_with("msg_"), "{}", d1[0].id);
    let event = &d1[0].body;
    assert_eq!(event["type"], "inbound.received");
    assert!(event["timestamp"].as_str().unwrap().ends_with('Z'));
    let data = &event["data"];
    assert_eq!(data["address"], to[0]);
    assert_eq!(data["addressId"], json!(sales));
    assert_eq!(data["emailId"], "hello-1@customer.example");
    assert_eq!(
        data["from"],
        json!({"address": "ann@customer.example", "name": "Ann"})
    );
    assert_eq!(data["subject"], "Hello");
    assert_eq!(data["to"], json!([format!("support@{INBOUND_DOMAIN}")]));
    assert_eq!(data["bodyFormat"], "text");
    assert_eq!(
        data["body"], "Hi there.\n",
        "the text part, with LF line ends"
    );
    assert_eq!(data["strippedQuotes"], false);
    assert_eq!(data["truncated"], false);
    assert_eq!(data["attachments"], json!([]));
    assert_eq!(
        data["authentication"],
        json!({"spf": "pass", "dkim": "pass", "dmarc": "none"})
    );
    assert!(data["threadId"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(d2[0].body["data"]["messageId"], data["messageId"]);
    assert_eq!(fell[0].body["data"]["address"], to[1]);
    assert_eq!(fell[0].body["data"]["addressId"], json!(info));
    assert_ne!(fell[0].body["data"]["messageId"], data["messageId"]);
    assert_eq!(fell[1].body["data"]["address"], to[2]);

    let done = settled(stack, &key, e1, 1, Status::Succeeded).await;
    assert_eq!(
        (done[0].attempt_count, done[0].last_status_code),
        (1, Some(200))
    );
    assert_eq!(format!("msg_{}", done[0].id.simple()), d1[0].id);
    // The list filters by status, a word of three.
    let path = format!("/inbox/webhook/endpoints/{e1}/attempts?status=");
    let client = stack.client(&key);
    let only: Success<AttemptList> = client
        .get(&format!("{path}succeeded"), StatusCode::OK)
        .await;
    assert_eq!(only.body.attempts.len(), 1);
    let none: Success<AttemptList> = client.get(&format!("{path}failed"), StatusCode::OK).await;
    assert!(none.body.attempts.is_empty());
    let _: Value = client
        .get(&format!("{path}done"), StatusCode::BAD_REQUEST)
        .await;

    // The test route signs a sample at once and answers what the receiver said.
    let tested: Success<Tested> = stack
        .client(&key)
        .act(
            &format!("/inbox/webhook/endpoints/{e1}/test"),
            StatusCode::OK,
        )
        .await;
    assert_eq!(
        (tested.body.status_code, tested.body.delivered),
        (Some(200), true)
    );
    let sample = received(&r1, 2, Duration::from_secs(5)).await;
    assert_eq!(
        sample[1].body["data"]["subject"],
        "A test delivery from Postmesh"
    );

    // A deleted endpoint's deliveries go with it; the others' stay.
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    assert!(peek::dispatcher::attempt_ids_of(&db, workspace)
        .await
        .contains(&done[0].id));
    let _: serde_json::Value = stack
        .client(&key)
        .delete(&format!("/inbox/webhook/endpoints/{e1}"), StatusCode::OK)
        .await;
    let left = peek::dispatcher::attempt_ids_of(&db, workspace).await;
    assert!(
        !left.contains(&done[0].id),
        "the deleted endpoint's attempt"
    );
    assert_eq!(left.len(), 3, "the other endpoint's and the default's");
}

/// Inbox webhooks of one key and inbox each, side by side on one stack.
#[tokio::test]
async fn inbox_webhooks_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            a_rotated_secret_signs_beside_the_new_one,
            bodies_come_in_each_format_with_quotes_stripped_on_request,
            a_receiver_streaming_an_endless_error_body_is_read_to_4_kib_and_dropped,
            a_failing_receiver_is_retried_on_the_schedule_and_retry_after_is_honoured,
            a_dead_receiver_ends_failed_then_retry_and_replay_send_again_and_410_disables,
            each_active_endpoint_gets_its_own_signed_delivery_and_the_default_the_rest,
            a_delivery_answered_at_once_is_written_once_with_its_outcome
        ]
    );
}

async fn a_rotated_secret_signs_beside_the_new_one(stack: &Stack) {
    let (key, inbox) = key_with_inbox(stack, "rotate").await;
    let receiver = Receiver::start().await;
    let put = |rotate: bool| {
        let (stack, key, url) = (&stack, &key, receiver.url("/legacy"));
        async move {
            let answer: Success<Subscribed> = stack
                .client(key)
                .put(
                    &format!("/inbox/webhook/addresses/{inbox}"),
                    &json!({ "url": url, "rotateSecret": rotate }),
                    StatusCode::OK,
                )
                .await;
            answer.body.signing_secret.expect("a secret")
        }
    };
    let old = put(false).await;
    let new = put(true).await;
    assert_ne!(old, new);
    receiver.trust(&old);
    receiver.trust(&new);
    mail_to(stack, "rotate", "Rotated", "x").await;
    let got = received(&receiver, 1, Duration::from_secs(10)).await;
    assert_eq!(got[0].signatures.len(), 2, "{:?}", got[0].signatures);
    assert_eq!(
        got[0].signed_by,
        [0, 1],
        "signed by the old and the new secret"
    );
}

/// The delivery of the message whose Message-ID is `email_id`.
fn of<'a>(got: &'a [Delivery], email_id: &str) -> &'a Value {
    &got.iter()
        .find(|d| d.body["data"]["emailId"] == email_id)
        .unwrap_or_else(|| panic!("no delivery of {email_id}"))
        .body["data"]
}

async fn bodies_come_in_each_format_with_quotes_stripped_on_request(stack: &Stack) {
    let (key, inbox) = key_with_inbox(stack, "support").await;
    let shapes = [
        ("text", true),
        ("text", false),
        ("html", true),
        ("markdown", false),
        ("markdown", true),
    ];
    let mut receivers = Vec::new();
    for (format, strip) in shapes {
        let receiver = Receiver::start().await;
        let extra = json!({ "bodyFormat": format, "stripQuotes": strip });
        endpoint(stack, &key, inbox, &receiver, extra).await;
        receivers.push(receiver);
    }
    for name in ["gmail_reply.eml", "outlook_reply.eml", "apple_reply.eml"] {
        ingest(stack, &fixture(name), &[&inbox_address("support")]).await;
    }
    let mut got = Vec::new();
    for receiver in &receivers {
        got.push(received(receiver, 3, Duration::from_secs(15)).await);
    }
    let (gmail, outlook, apple) = (
        "gmail-reply@mail.gmail.com",
        "outlook-reply@EUR01.prod.outlook.com",
        "apple-reply@customer.example",
    );
    let body = |i: usize, id: &str| of(&got[i], id)["body"].as_str().unwrap().to_owned();
    let stripped = |i: usize, id: &str| of(&got[i], id)["strippedQuotes"].clone();
    // text, quotes stripped: only the new text, from the text part.
    assert_eq!(body(0, gmail), "Thanks, Thursday works.");
    assert_eq!(body(0, outlook), "Yes, see the list below.");
    assert_eq!(body(0, apple), "Sounds great.");
    for id in [gmail, outlook, apple] {
        assert_eq!(stripped(0, id), true, "{id}");
        assert_eq!(of(&got[0], id)["bodyFormat"], "text");
        // text, quotes kept.
        assert!(body(1, id).contains("Can we meet on Thursday?"), "{id}");
        assert_eq!(stripped(1, id), false);
        // html, quotes stripped: the HTML part without the client's quote container.
        let html = body(2, id);
        assert!(!html.contains("Can we meet"), "{id}: {html}");
        assert_eq!(stripped(2, id), true);
        // markdown, quotes kept.
        assert!(body(3, id).contains("Can we meet on Thursday?"), "{id}");
        // markdown, quotes stripped.
        assert!(
            !body(4, id).contains("Can we meet"),
            "{id}: {}",
            body(4, id)
        );
    }
    assert!(body(2, gmail).contains("<b>Thursday</b>"));
    assert!(body(2, outlook).contains("<table>") && !body(2, outlook).contains("divRplyFwdMsg"));
    assert!(body(2, apple).contains("<i>great</i>"));
    let md = body(3, outlook);
    assert!(
        md.contains("[the agenda](https://example.com/agenda)"),
        "{md}"
    );
    // The table as a Markdown table: a header row, its rule, a row.
    let row = |cells: &[&str]| {
        md.lines()
            .any(|l| l.starts_with('|') && cells.iter().all(|c| l.contains(c)))
    };
    assert!(
        row(&["Item", "Owner"]) && row(&["---"]) && row(&["Budget", "Ann"]),
        "{md}"
    );
    assert!(
        md.lines()
            .any(|l| l.trim_start().starts_with(['*', '-']) && l.contains("Hiring")),
        "{md}"
    );
    assert!(
        body(3, gmail).contains("**Thursday**"),
        "{}",
        body(3, gmail)
    );
    assert!(body(3, apple).contains("*great*") || body(3, apple).contains("_great_"));
}

async fn a_failing_receiver_is_retried_on_the_schedule_and_retry_after_is_honoured(stack: &Stack) {
    let (key, e, receiver) = key_and_endpoint(stack, "flaky").await;
    receiver.script([Reply::Status(500), Reply::Status(500)]);
    mail_to(stack, "flaky", "One", "1").await;
    let got = received(&receiver, 3, Duration::from_secs(15)).await;
    assert!(got.iter().all(|d| d.id == got[0].id), "one webhook-id");
    // The test stack's schedule: 1 s, then 2 s.
    assert!(got[1].arrived - got[0].arrived >= Duration::from_millis(900));
    assert!(got[2].arrived - got[1].arrived >= Duration::from_millis(1900));
    let done = settled(stack, &key, e, 1, Status::Succeeded).await;
    assert_eq!(
        (done[0].attempt_count, done[0].last_status_code),
        (3, Some(200))
    );

    // A 429 with Retry-After: 4 waits 4 s, not the schedule's 1 s.
    receiver.script([Reply::RetryAfter(429, 4)]);
    let asked = Instant::now();
    mail_to(stack, "flaky", "Two", "2").await;
    let got = received(&receiver, 4, Duration::from_secs(10)).await;
    assert_eq!(got[3].answered, 429);
    let waiting = answered(stack, &key, e, 429, Duration::from_secs(3)).await;
    // A job for it before its time (a redelivery, a repeat) posts nothing.
    let early = [(waiting.id, 0)];
    let js = stack.jetstream().await;
    webhook_dispatcher::delivery::worker::queue_each(&js, stack.ns(), &early, "early")
        .await
        .unwrap();
    let waiting = waiting.next_attempt_at;
    let now = postmesh_shared::db::now_unix();
    assert!(
        waiting.is_some_and(|at| at >= now + 2),
        "{waiting:?} vs {now}"
    );
    let got = received(&receiver, 5, Duration::from_secs(10)).await;
    assert!(got[4].arrived - got[3].arrived >= Duration::from_millis(3900));
    assert_eq!(got[4].id, got[3].id);
    assert!(asked.elapsed() >= Duration::from_secs(4));
    settled(stack, &key, e, 2, Status::Succeeded).await;
}

async fn a_dead_receiver_ends_failed_then_retry_and_replay_send_again_and_410_disables(
    stack: &Stack,
) {
    let (key, inbox) = key_with_inbox(stack, "dead").await;
    let (receiver, gone) = (Receiver::start().await, Receiver::start().await);
    let e = endpoint(stack, &key, inbox, &receiver, json!({})).await;
    let g = endpoint(stack, &key, inbox, &gone, json!({})).await;
    receiver.answer(Reply::Status(503));
    gone.answer(Reply::Status(410));
    mail_to(stack, "dead", "Dead", "d").await;
    let failed = settled(stack, &key, e, 1, Status::Failed).await;
    assert_eq!(
        (failed[0].attempt_count, failed[0].last_status_code),
        (3, Some(503)),
        "the first try and the schedule's two retries"
    );
    assert!(failed[0].last_error.as_deref().unwrap().contains("503"));
    assert_eq!(receiver.count(), 3);
    // 410: failed at once, the endpoint disabled.
    let dropped = settled(stack, &key, g, 1, Status::Failed).await;
    assert_eq!(dropped[0].attempt_count, 1);
    let page: Success<EndpointPage> = stack
        .client(&key)
        .get(&format!("/inbox/webhook/endpoints/{g}"), StatusCode::OK)
        .await;
    assert!(!page.body.endpoint.active, "a 410 disables the endpoint");
    // A disabled endpoint takes no retry or replay, which could only fail: 409.
    let disabled: ErrorBody = replay(stack, &key, g, StatusCode::CONFLICT).await;
    assert!(disabled.error.contains("disabled"), "{disabled:?}");
    let retry_gone = format!(
        "/inbox/webhook/endpoints/{g}/attempts/{}/retry",
        dropped[0].id
    );
    let _: ErrorBody = stack
        .client(&key)
        .act(&retry_gone, StatusCode::CONFLICT)
        .await;

    // Retried by hand: the same delivery (webhook-id) again, now answered, at once even
    // while a try still holds it (its outcome, written later, no longer counts).
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    peek::dispatcher::lease_attempt(&db, failed[0].id, 60_000).await;
    receiver.answer(Reply::Status(200));
    let path = format!(
        "/inbox/webhook/endpoints/{e}/attempts/{}/retry",
        failed[0].id
    );
    let _: Value = stack.client(&key).act(&path, StatusCode::ACCEPTED).await;
    let got = received(&receiver, 4, Duration::from_secs(10)).await;
    assert_eq!(got[3].id, got[0].id);
    settled(stack, &key, e, 1, Status::Succeeded).await;
    // Replayed: every message since then, as a new delivery.
    let replayed: Success<Replayed> = replay(stack, &key, e, StatusCode::ACCEPTED).await;
    assert_eq!(replayed.body.queued, 1);
    let got = received(&receiver, 5, Duration::from_secs(10)).await;
    assert_ne!(got[4].id, got[0].id);
    assert_eq!(
        got[4].body["data"]["messageId"],
        got[0].body["data"]["messageId"]
    );
    settled(stack, &key, e, 2, Status::Succeeded).await;
    // Another workspace's endpoint is 404; a malformed attempt id 400.
    let (other, _) = key_with_inbox(stack, "other").await;
    let missing: ErrorBody = replay(stack, &other, e, StatusCode::NOT_FOUND).await;
    assert!(!missing.success);
    let _: ErrorBody = stack
        .client(&key)
        .act(
            &format!("/inbox/webhook/endpoints/{e}/attempts/nope/retry"),
            StatusCode::BAD_REQUEST,
        )
        .await;
}

/// An endpoint disabled after failing, long bodies and redirects, and a slow receiver
/// beside a fast one, each with a key and inbox of its own, on one stack whose dispatcher
/// disables after 2 s of failures, retries every second, cuts bodies at 100 bytes and waits
/// 10 s for an answer.
#[tokio::test]
async fn a_tuned_dispatcher_side_by_side() {
    let mut stack = Stack::start().await;
    let mut config = stack.dispatcher_config();
    config.delivery.disable_after = Duration::from_secs(2);
    config.delivery.retry_schedule = vec![Duration::from_secs(1); 4];
    config.delivery.max_body_bytes = 100;
    config.delivery.timeout = Duration::from_secs(10);
    stack.restart_dispatcher(config).await;
    postmesh_tests::side_by_side!(
        stack,
        [
            an_endpoint_failing_for_the_disable_period_is_disabled,
            long_bodies_are_cut_and_redirects_are_not_followed,
            a_slow_receiver_does_not_hold_up_a_fast_one
        ]
    );
}

async fn an_endpoint_failing_for_the_disable_period_is_disabled(stack: &Stack) {
    let (key, e, receiver) = key_and_endpoint(stack, "failing").await;
    receiver.answer(Reply::Status(500));
    mail_to(stack, "failing", "Fail", "f").await;
    eventually(Duration::from_secs(15), || async {
        let page: Success<EndpointPage> = stack
            .client(&key)
            .get(&format!("/inbox/webhook/endpoints/{e}"), StatusCode::OK)
            .await;
        if page.body.endpoint.active {
            Err(receiver.count())
        } else {
            Ok(())
        }
    })
    .await;
    // Not before it had failed for the 2 s, from its first failed try to the one that
    // disabled it (in whole seconds, as the times are kept: more than 1 s).
    let tries = receiver.deliveries();
    assert!(tries.len() >= 2, "{} tries", tries.len());
    let failing_for = tries[tries.len() - 1].arrived - tries[0].arrived;
    assert!(failing_for > Duration::from_secs(1), "{failing_for:?}");
    // Disabled: new mail is not sent to it.
    mail_to(stack, "failing", "After", "a").await;
    stack.handled(&[Stream::Inbound, Stream::Webhook]).await;
    assert_eq!(attempts(stack, &key, e).await.len(), 1);
    // A new URL is a new receiver: the old one's failures are not held against it.
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    assert!(peek::dispatcher::failing_since(&db, e).await.is_some());
    let fixed = Receiver::start().await;
    let _: Success<EndpointPage> = stack
        .client(&key)
        .patch(
            &format!("/inbox/webhook/endpoints/{e}"),
            &json!({"url": fixed.url("/fixed")}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(peek::dispatcher::failing_since(&db, e).await, None);
}

async fn long_bodies_are_cut_and_redirects_are_not_followed(stack: &Stack) {
    let (key, inbox) = key_with_inbox(stack, "long").await;
    let (receiver, elsewhere) = (Receiver::start().await, Receiver::start().await);
    let html = json!({ "bodyFormat": "html" });
    let e = endpoint(stack, &key, inbox, &receiver, html).await;
    // As HTML the text is escaped into <pre>: longer than the text the message had.
    let long = "é<".repeat(200);
    mail_to(stack, "long", "Long", &long).await;
    let got = received(&receiver, 1, Duration::from_secs(10)).await;
    let data = &got[0].body["data"];
    let body = data["body"].as_str().unwrap();
    assert!((95..=100).contains(&body.len()), "{}", body.len());
    assert!(
        body.starts_with("<pre>é&lt;é&lt;"),
        "cut at a character boundary: {body}"
    );
    assert_eq!(data["truncated"], true);

    // A 3xx is an answer like any other non-2xx: retried, never followed.
    receiver.answer(Reply::Redirect(elsewhere.url("/stolen")));
    mail_to(stack, "long", "Moved", "m").await;
    let moved = answered(stack, &key, e, 302, Duration::from_secs(10))
        .await
        .status;
    assert_ne!(moved, Status::Succeeded);
    // A try that followed would have ended on the other host's answer, not the 302, and
    // reached it before its outcome was written: no wait needed.
    assert_eq!(elsewhere.count(), 0, "the redirect was not followed");
    assert!(elsewhere.refused().is_empty());
}

async fn a_slow_receiver_does_not_hold_up_a_fast_one(stack: &Stack) {
    let (key, inbox) = key_with_inbox(stack, "busy").await;
    let (slow, fast) = (Receiver::start().await, Receiver::start().await);
    let s = endpoint(stack, &key, inbox, &slow, json!({})).await;
    endpoint(stack, &key, inbox, &fast, json!({})).await;
    slow.answer(Reply::Slow(Duration::from_secs(30), 200));
    // More messages than the slow endpoint's delivery slots (8).
    let count = 12;
    for i in 0..count {
        let raw = message(None, &format!("Busy {i}"), "", "b");
        ingest(stack, &raw, &[&inbox_address("busy")]).await;
    }
    let started = Instant::now();
    received(&fast, count, Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "before any slow POST timed out"
    );
    // The slow one's deliveries time out and wait for a retry.
    let list = eventually(Duration::from_secs(20), || async {
        let list = attempts(stack, &key, s).await;
        let timed_out = list
            .iter()
            .filter(|a| {
                a.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("timed out"))
            })
            .count();
        if timed_out > 0 {
            Ok(list)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await;
    assert!(list.iter().all(|a| a.status != Status::Succeeded));
}

#[tokio::test]
async fn a_failing_and_a_stalled_receivers_backlogs_do_not_hold_up_a_healthy_one() {
    let mut stack = Stack::start().await;
    // A small worker: its consumer hands out at most 2 × 2 jobs at once, so a backlog that
    // waited as jobs in JetStream would soon fill it.
    let mut config = stack.dispatcher_config();
    config.delivery.concurrency = 2;
    config.delivery.endpoint_concurrency = 1;
    config.delivery.timeout = Duration::from_secs(10);
    config.delivery.retry_schedule = vec![Duration::from_secs(60), Duration::from_secs(60)];
    stack.kill_dispatcher().await;
    // The consumer is durable: made again with this worker's limits.
    let webhooks = stack
        .jetstream()
        .await
        .get_stream(Stream::Webhook.name(stack.ns()))
        .await
        .unwrap();
    webhooks
        .delete_consumer("webhook-dispatcher")
        .await
        .unwrap();
    stack.restart_dispatcher(config).await;
    let (key, inbox) = key_with_inbox(&stack, "backlog").await;
    let (failing, stalled, healthy) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let f = endpoint(&stack, &key, inbox, &failing, json!({})).await;
    let s = endpoint(&stack, &key, inbox, &stalled, json!({})).await;
    endpoint(&stack, &key, inbox, &healthy, json!({})).await;
    failing.answer(Reply::Status(500));
    stalled.answer(Reply::Slow(Duration::from_secs(30), 200));
    let count = 12;
    for i in 0..count {
        let raw = message(None, &format!("Backlog {i}"), "", "b");
        ingest(&stack, &raw, &[&inbox_address("backlog")]).await;
    }
    // Before the failing receiver's first retry (60 s) and the stalled one's timeout (10 s).
    let started = Instant::now();
    received(&healthy, count, Duration::from_secs(8)).await;
    assert!(started.elapsed() < Duration::from_secs(8));
    // Their deliveries wait in the database: the failing one's for its retry, the stalled
    // one's for a free slot.
    // (Each attempt is written once its first try is answered, or a second on without one.)
    let now = postmesh_shared::db::now_unix();
    let list = postmesh_tests::attempts::counted(&stack, &key, Of::Endpoint(f), count).await;
    assert!(
        list.iter().all(|a| a.status == Status::Pending
            && a.last_status_code == Some(500)
            && a.next_attempt_at.is_some_and(|at| at >= now + 45)),
        "{list:?}"
    );
    let list = postmesh_tests::attempts::counted(&stack, &key, Of::Endpoint(s), count).await;
    assert!(list.iter().all(|a| a.status == Status::Pending), "{list:?}");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_host_whose_dns_turns_private_is_refused_at_delivery() {
    let mut stack = Stack::start().await;
    let dns = FakeDns::start().await;
    dns.zone("hooks.example");
    dns.set_a("hook.hooks.example", &[Ipv4Addr::new(93, 184, 216, 34)]);
    dns.set_a("inside.hooks.example", &[Ipv4Addr::new(10, 1, 2, 3)]);
    let mut config = stack.dispatcher_config();
    config.allow_insecure = false;
    config.nameservers = vec![dns.addr];
    stack.restart_dispatcher(config).await;
    let (key, inbox) = key_with_inbox(&stack, "dns").await;
    for (url, why) in [
        ("http://hook.hooks.example/in", "https://"),
        ("https://127.0.0.1/in", "127.0.0.1"),
        ("https://[::ffff:192.168.0.1]/in", "192.168.0.1"),
        ("https://inside.hooks.example/in", "10.1.2.3"),
    ] {
        let refused: ErrorBody = stack
            .client(&key)
            .post(
                "/inbox/webhook/endpoints",
                &json!({ "addressId": inbox, "url": url }),
                StatusCode::BAD_REQUEST,
            )
            .await;
        assert!(refused.error.contains(why), "{url}: {}", refused.error);
    }
    let created: Success<Created> = stack
        .client(&key)
        .post(
            "/inbox/webhook/endpoints",
            &json!({ "addressId": inbox, "url": "https://hook.hooks.example/in" }),
            StatusCode::CREATED,
        )
        .await;
    // The name now points inside; the delivery's own lookup refuses it.
    dns.set_a("hook.hooks.example", &[Ipv4Addr::new(10, 9, 8, 7)]);
    mail_to(&stack, "dns", "Inside", "x").await;
    let e = created.body.endpoint.id;
    let refused = eventually(Duration::from_secs(10), || async {
        let list = attempts(&stack, &key, e).await;
        match list.first().and_then(|a| a.last_error.clone()) {
            Some(error) => Ok((error, list[0].last_status_code)),
            None => Err(format!("{list:?}")),
        }
    })
    .await;
    assert!(
        refused.0.contains("10.9.8.7") && refused.0.contains("not a public address"),
        "{}",
        refused.0
    );
    assert_eq!(refused.1, None, "no connection was made");
    stack.shutdown().await;
}

#[tokio::test]
async fn a_dispatcher_killed_mid_delivery_delivers_every_message_once() {
    // Each answer takes 1.5 s: the dispatcher is killed with deliveries in flight.
    let (mut stack, config, key, e, receiver) =
        child_dispatcher_and_endpoint("crash", Reply::Slow(Duration::from_millis(1500), 200)).await;
    let count = 20;
    for i in 0..count {
        let raw = message(None, &format!("Crash {i}"), "", "c");
        ingest(&stack, &raw, &[&inbox_address("crash")]).await;
    }
    let before = postmesh_tests::attempts::some_succeeded(&stack, &key, Of::Endpoint(e)).await;
    stack.kill_dispatcher().await; // SIGKILL
    let arrived_before_kill = receiver.count();
    assert!(before.len() < count, "the kill came mid-delivery");
    // Every job comes again, as it would had the kill beaten each ack (a redelivery).
    postmesh_tests::attempts::publish_every_job_again(&stack).await;
    receiver.answer(Reply::Status(200));
    stack.restart_dispatcher(config).await;
    // Within the dispatcher's ack wait (3 s in tests) and the time to deliver the rest.
    let all = settled(&stack, &key, e, count, Status::Succeeded).await;
    stack.handled(&[Stream::Inbound, Stream::Webhook]).await;
    let got = receiver.deliveries();
    postmesh_tests::attempts::delivered_once(&got, &all, &before);
    assert!(
        got.len() > arrived_before_kill,
        "the restarted dispatcher finished the rest"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn the_scheduler_takes_due_attempts_once_and_a_few_of_each_target_per_pass() {
    let store = dispatcher_db().await;
    let now = postmesh_shared::db::now_unix();
    let (workspace, a, b, c) = (
        uuid::Uuid::now_v7(),
        uuid::Uuid::now_v7(),
        uuid::Uuid::now_v7(),
        uuid::Uuid::now_v7(),
    );
    // (target, requeue_at, status, leased): A has five due, B two, C one not yet due; one of
    // B's is leased, one of A's succeeded.
    let rows = [
        (a, now - 50, "pending", false),
        (a, now - 40, "pending", false),
        (a, now - 30, "pending", false),
        (a, now - 20, "pending", false),
        (a, now - 10, "pending", false),
        (a, now - 60, "succeeded", false),
        (b, now - 45, "pending", false),
        (b, now - 5, "pending", false),
        (b, now - 70, "pending", true),
        (c, now + 100, "pending", false),
    ];
    let mut ids = Vec::new();
    for (target, requeue_at, status, leased) in rows {
        let id = uuid::Uuid::now_v7();
        sqlx::query(
            "INSERT INTO attempts (id, workspace_id, endpoint_id, message_id, origin, status,
                                   created_at, updated_at, requeue_at, leased_until_ms)
             VALUES ($1, $2, $3, $4, 'inbound', $5, $6, $6, $7,
                     CASE WHEN $8 THEN (extract(epoch FROM now()) * 1000)::bigint + 60000 ELSE 0 END)",
        )
        .bind(id)
        .bind(workspace)
        .bind(target)
        .bind(uuid::Uuid::now_v7())
        .bind(status)
        .bind(now)
        .bind(requeue_at)
        .bind(leased)
        .execute(&store.pool)
        .await
        .unwrap();
        ids.push(id);
    }
    let taken = |list: Vec<(uuid::Uuid, i64)>| -> HashSet<uuid::Uuid> {
        list.into_iter().map(|(id, _)| id).collect()
    };
    // Two of each target, the earliest first.
    let first = taken(
        webhook_dispatcher::routes::attempts::due(&store.pool, 2, 500)
            .await
            .unwrap(),
    );
    assert_eq!(first, HashSet::from([ids[0], ids[1], ids[6], ids[7]]));
    // Taken ones wait their five minutes; A's next two come in the next pass.
    let second = taken(
        webhook_dispatcher::routes::attempts::due(&store.pool, 2, 500)
            .await
            .unwrap(),
    );
    assert_eq!(second, HashSet::from([ids[2], ids[3]]));
    // At most `limit` in all.
    let third = webhook_dispatcher::routes::attempts::due(&store.pool, 2, 1)
        .await
        .unwrap();
    assert_eq!(taken(third), HashSet::from([ids[4]]));
    assert!(
        webhook_dispatcher::routes::attempts::due(&store.pool, 2, 500)
            .await
            .unwrap()
            .is_empty()
    );
    let requeue: i64 = sqlx::query_scalar("SELECT requeue_at FROM attempts WHERE id = $1")
        .bind(ids[0])
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert!(
        (now + 299..=now + 302).contains(&requeue),
        "{requeue} vs {now}"
    );
}

/// An attempt the scheduler takes again after a busy target's pause (its attempt count as
/// it was) is queued as a new job, not dropped as a repeat of the first within JetStream's
/// duplicate window (it waited five minutes more).
#[tokio::test]
async fn an_attempt_taken_again_after_a_pause_is_a_new_job() {
    use webhook_dispatcher::delivery::worker::queue_each;
    use webhook_dispatcher::routes::attempts::due;
    let store = dispatcher_db().await;
    let nats = postmesh_tests::ops_nats(&store.common.nats_url)
        .await
        .unwrap();
    let js = async_nats::jetstream::new(nats);
    let ns = &store.common.namespace;
    let mut stream = Stream::Webhook.ensure(&js, ns, 1).await.unwrap();
    let (id, now) = (uuid::Uuid::now_v7(), postmesh_shared::db::now_unix());
    sqlx::query(
        "INSERT INTO attempts (id, workspace_id, endpoint_id, message_id, origin, status,
                               created_at, updated_at, requeue_at, leased_until_ms)
         VALUES ($1, $1, $1, $1, 'inbound', 'pending', $2, $2, $2 - 10, 0)",
    )
    .bind(id)
    .bind(now)
    .execute(&store.pool)
    .await
    .unwrap();
    for pause in [now - 5, now - 4] {
        let taken = due(&store.pool, 3, 10).await.unwrap();
        assert_eq!(taken.iter().map(|(a, _)| *a).collect::<Vec<_>>(), [id]);
        queue_each(&js, ns, &taken, "due").await.unwrap();
        // The worker finds the target busy: the attempt waits a pause, its count unchanged.
        sqlx::query("UPDATE attempts SET requeue_at = $2 WHERE id = $1")
            .bind(id)
            .bind(pause)
            .execute(&store.pool)
            .await
            .unwrap();
    }
    let taken = due(&store.pool, 3, 10).await.unwrap();
    queue_each(&js, ns, &taken, "due").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 3, "three jobs");
    postmesh_tests::remove_namespace(&store.common).await;
}

/// Two dispatcher replicas' scheduler passes at once over 300 due attempts of 30 targets:
/// each attempt is taken by one of them, once.
#[tokio::test]
async fn two_scheduler_passes_at_once_take_each_due_attempt_once() {
    let store = dispatcher_db().await;
    let (workspace, now) = (uuid::Uuid::now_v7(), postmesh_shared::db::now_unix());
    let targets: Vec<uuid::Uuid> = (0..30).map(|_| uuid::Uuid::now_v7()).collect();
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
        "INSERT INTO attempts (id, workspace_id, endpoint_id, message_id, origin, status,
                               created_at, updated_at, requeue_at, leased_until_ms)
         SELECT gen_random_uuid(), $1, ($2::uuid[])[1 + n % 30], gen_random_uuid(), 'inbound',
                'pending', $3, $3, $3 - 10 - n, 0
         FROM generate_series(0, 299) AS n
         RETURNING id",
    )
    .bind(workspace)
    .bind(&targets)
    .bind(now)
    .fetch_all(&store.pool)
    .await
    .unwrap();
    let mut taken: Vec<uuid::Uuid> = Vec::new();
    loop {
        let pass = || webhook_dispatcher::routes::attempts::due(&store.pool, 3, 40);
        let (a, b) = tokio::join!(pass(), pass());
        let (a, b) = (a.unwrap(), b.unwrap());
        if a.is_empty() && b.is_empty() {
            break;
        }
        taken.extend(a.into_iter().chain(b).map(|(id, _)| id));
    }
    let once: HashSet<uuid::Uuid> = taken.iter().copied().collect();
    assert_eq!(once.len(), taken.len(), "an attempt was taken twice");
    assert_eq!(once, ids.into_iter().collect::<HashSet<_>>());
}

#[tokio::test]
async fn the_retention_sweep_deletes_what_is_old_and_finished_and_keeps_what_a_delivery_needs() {
    let store = dispatcher_db().await;
    let db = &store.pool;
    let now = postmesh_shared::db::now_unix();
    let (old, recent, cutoff) = (now - 40 * 86_400, now - 86_400, now - 30 * 86_400);
    let workspace = uuid::Uuid::now_v7();
    // A row of `sql` (its id, the workspace, the time as $1, $2, $3) made at `at`.
    let row = |sql: &'static str, at: i64| async move {
        let id = uuid::Uuid::now_v7();
        let done = sqlx::query(sql).bind(id).bind(workspace).bind(at);
        done.execute(db).await.unwrap();
        id
    };
    let event = |at| {
        let sql = "INSERT INTO events (id, workspace_id, type, occurred_at, data)
                   VALUES ($1, $2, 'email.sent', $3, '{}')";
        row(sql, at)
    };
    let received = |at| {
        let sql = "INSERT INTO received (message_id, workspace_id, address_id, received_at)
                   VALUES ($1, $2, $2, $3)";
        row(sql, at)
    };
    let attempt = |message: uuid::Uuid, status: &'static str, at: i64| async move {
        let id = uuid::Uuid::now_v7();
        sqlx::query(
            "INSERT INTO attempts (id, workspace_id, webhook_id, message_id, origin, status,
                                   created_at, updated_at)
             VALUES ($1, $2, $2, $3, 'event', $4, $5, $5)",
        )
        .bind(id)
        .bind(workspace)
        .bind(message)
        .bind(status)
        .bind(at)
        .execute(db)
        .await
        .unwrap();
        id
    };
    // Old and done: gone. Old but still pending: kept, with what it carries. Recent: kept.
    let (old_event, old_pending_event, recent_event) =
        (event(old).await, event(old).await, event(recent).await);
    let (old_message, old_pending_message) = (received(old).await, received(old).await);
    let recent_message = received(recent).await;
    let old_done = attempt(old_event, "succeeded", old).await;
    let old_failed = attempt(old_message, "failed", old).await;
    let old_pending = attempt(old_pending_event, "pending", old).await;
    let old_pending_inbound = attempt(old_pending_message, "pending", old).await;
    let recent_done = attempt(recent_event, "succeeded", recent).await;
    let recent_inbound = attempt(recent_message, "failed", recent).await;

    // Batches of 1: each table gives one row a pass, and says when a batch came back full.
    let first = webhook_dispatcher::routes::attempts::prune(db, cutoff, 1)
        .await
        .unwrap();
    assert_eq!(
        (first.attempts, first.events, first.received),
        (1, 1, 1),
        "{first:?}"
    );
    let mut rest = webhook_dispatcher::routes::attempts::prune(db, cutoff, 100)
        .await
        .unwrap();
    assert_eq!((rest.attempts, rest.events, rest.received), (1, 0, 0));
    rest = webhook_dispatcher::routes::attempts::prune(db, cutoff, 100)
        .await
        .unwrap();
    assert_eq!(rest, Default::default(), "nothing left to prune");

    let ids = |table: &'static str, column: &'static str| async move {
        let ids: Vec<uuid::Uuid> = sqlx::query_scalar(&format!("SELECT {column} FROM {table}"))
            .fetch_all(db)
            .await
            .unwrap();
        ids.into_iter().collect::<HashSet<_>>()
    };
    assert_eq!(
        ids("attempts", "id").await,
        HashSet::from([
            old_pending,
            old_pending_inbound,
            recent_done,
            recent_inbound
        ])
    );
    assert!(!ids("attempts", "id").await.contains(&old_done));
    assert!(!ids("attempts", "id").await.contains(&old_failed));
    assert_eq!(
        ids("events", "id").await,
        HashSet::from([old_pending_event, recent_event])
    );
    assert_eq!(
        ids("received", "message_id").await,
        HashSet::from([old_pending_message, recent_message])
    );
}

async fn a_delivery_answered_at_once_is_written_once_with_its_outcome(stack: &Stack) {
    let (key, e, receiver) = key_and_endpoint(stack, "once").await;
    let count = 3;
    for i in 0..count {
        let raw = message(None, &format!("Once {i}"), "", "o");
        ingest(stack, &raw, &[&inbox_address("once")]).await;
    }
    let list = settled(stack, &key, e, count, Status::Succeeded).await;
    // Each attempt's row is the one its fan-out's transaction wrote beside the received
    // message (same xmin), never updated since: no claim, no separate outcome write.
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM attempts a JOIN received r USING (message_id)
         WHERE a.endpoint_id = $1 AND a.xmin = r.xmin AND a.attempt_count = 1
           AND a.lease_owner IS NULL",
    )
    .bind(e)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(untouched, count as i64);
    // Its id, so its webhook-id, comes from the message and the endpoint alone; and it was
    // sent once.
    stack.handled(&[Stream::Inbound, Stream::Webhook]).await;
    let got = receiver.deliveries();
    assert_eq!(got.len(), count);
    for a in &list {
        assert_eq!(
            a.id,
            webhook_dispatcher::delivery::direct::attempt_id(a.message_id, e)
        );
        let id = format!("msg_{}", a.id.simple());
        assert_eq!(got.iter().filter(|d| d.id == id).count(), 1, "{id}");
    }
}

#[tokio::test]
async fn a_delivery_cut_off_by_a_crash_before_it_was_written_comes_again_under_its_webhook_id() {
    // The answer takes 0.9 s: the dispatcher is killed after the POST arrived and before
    // its attempt was written.
    let (mut stack, config, key, e, receiver) =
        child_dispatcher_and_endpoint("cut", Reply::Slow(Duration::from_millis(900), 200)).await;
    let raw = message(None, "Cut off", "", "c");
    ingest(&stack, &raw, &[&inbox_address("cut")]).await;
    received(&receiver, 1, Duration::from_secs(10)).await;
    stack.kill_dispatcher().await;
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE endpoint_id = $1")
        .bind(e)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(written, 0, "the kill came before the attempt was written");
    receiver.answer(Reply::Status(200));
    stack.restart_dispatcher(config).await;
    // INBOUND hands the unacknowledged message out again once its ack wait (30 s) is over.
    let id = eventually(Duration::from_secs(60), || async {
        let list = attempts(&stack, &key, e).await;
        match list.as_slice() {
            [a] if a.status == Status::Succeeded => Ok(a.id),
            _ => Err(format!("{list:?}")),
        }
    })
    .await;
    delivered_twice_as(&receiver, id);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_fan_out_whose_write_keeps_failing_posts_once_and_leaves_the_rest_to_the_worker() {
    let stack = Stack::start().await;
    let (key, e, receiver) = key_and_endpoint(&stack, "refused").await;
    // Every write of the fan-out fails, after its first tries were made.
    let db = stack.service_db(webhook_dispatcher::SERVICE).await;
    for statement in [
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql
         AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
        "CREATE TRIGGER refuse BEFORE INSERT ON received
         FOR EACH ROW EXECUTE FUNCTION refuse()",
    ] {
        sqlx::query(statement).execute(&db).await.unwrap();
    }
    let raw = message(None, "Refused", "", "r");
    ingest(&stack, &raw, &[&inbox_address("refused")]).await;
    received(&receiver, 1, Duration::from_secs(10)).await;
    // INBOUND hands it out again every 2 s meanwhile: none of those runs posts.
    let first = stack.handed_out(Stream::Inbound).await;
    eventually(Duration::from_secs(20), || async {
        match stack.handed_out(Stream::Inbound).await {
            n if n >= first + 3 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    assert_eq!(
        receiver.count(),
        1,
        "only the first hand-out made a first try"
    );
    sqlx::query("DROP TRIGGER refuse ON received")
        .execute(&db)
        .await
        .unwrap();
    // The next run writes the attempt pending, and the worker delivers it.
    let list = settled(&stack, &key, e, 1, Status::Succeeded).await;
    delivered_twice_as(&receiver, list[0].id);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_first_try_left_waiting_by_a_crash_is_tried_again_once_its_lease_is_over() {
    // The answer takes 1.8 s: a second in, the attempt is written leased, waiting for it;
    // the dispatcher is killed before it comes.
    let (mut stack, config, key, e, receiver) =
        child_dispatcher_and_endpoint("waiting", Reply::Slow(Duration::from_millis(1800), 200))
            .await;
    let raw = message(None, "Waiting", "", "w");
    ingest(&stack, &raw, &[&inbox_address("waiting")]).await;
    eventually(Duration::from_secs(10), || async {
        let list = attempts(&stack, &key, e).await;
        match list.as_slice() {
            [a] if a.status == Status::Pending && a.attempt_count == 1 => Ok(()),
            _ => Err(format!("{list:?}")),
        }
    })
    .await;
    stack.kill_dispatcher().await;
    receiver.answer(Reply::Status(200));
    stack.restart_dispatcher(config).await;
    // Its lease (the 2 s timeout and 2 s more) over, the scheduler queues it: well before
    // INBOUND would hand the message out again (30 s), or a lost job's five minutes.
    let started = Instant::now();
    let list = settled(&stack, &key, e, 1, Status::Succeeded).await;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(list[0].attempt_count, 2);
    delivered_twice_as(&receiver, list[0].id);
    stack.shutdown().await;
}

async fn a_receiver_streaming_an_endless_error_body_is_read_to_4_kib_and_dropped(stack: &Stack) {
    let (key, e, receiver) = key_and_endpoint(stack, "endless").await;
    receiver.answer(Reply::Endless(500));
    let started = Instant::now();
    mail_to(stack, "endless", "Endless", "e").await;
    // Recorded long before the 15 s answer timeout: the body was not read to its end.
    let tried = eventually(Duration::from_secs(10), || async {
        match attempts(stack, &key, e).await.pop() {
            Some(a) if a.last_status_code == Some(500) => Ok(a),
            other => Err(other.map(|a| a.status)),
        }
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    let error = tried.last_error.expect("the answer's excerpt");
    assert!(error.starts_with("HTTP 500: xxx"), "{error}");
    assert!(error.len() < 300, "{} bytes", error.len());
    // Attempts are listed up to 500 a page.
    let path = format!("/inbox/webhook/endpoints/{e}/attempts");
    let _: Value = stack
        .client(&key)
        .get(&format!("{path}?limit=500"), StatusCode::OK)
        .await;
    let _: ErrorBody = stack
        .client(&key)
        .get(&format!("{path}?limit=501"), StatusCode::BAD_REQUEST)
        .await;
}
