//! `/send-email` end to end: every field reaching the delivered MIME, prices and charges,
//! dry runs and test sends, recipient limits, variables, templates, schedules and
//! cancellation, task status, the SMTP and SES transports, `/smtp-auth`, the plan's quota,
//! and a sender killed mid-batch.

use std::time::{Duration, Instant};

use base64::Engine as _;
use mail_parser::{MessageParser, MimeHeaders};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_tests::fake_ses::FakeSes;
use postmesh_tests::fake_smtp::{Behaviour, FakeSmtp};
use postmesh_tests::{peek, FakeStripe, Options, SenderMode, Stack};

fn now() -> i64 {
    postmesh_shared::db::now_unix()
}

/// Restarts the stack's sender on the SMTP relay `relay`.
async fn deliver_to(stack: &mut Stack, relay: &FakeSmtp) {
    stack.kill_sender().await;
    stack.use_smtp(&relay.url());
    stack.start_sender().await;
}

/// `GET /email-status/{task}` until `done(status)` holds; returns the last answer.
async fn wait_status(stack: &Stack, key: &str, task: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, v) = stack
            .get(&format!("/email-status/{task}?limit=1000"), key)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "task never got there: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the task has no recipient left queued; returns its status.
async fn wait_finished(stack: &Stack, key: &str, task: &str) -> Value {
    wait_status(stack, key, task, |v| v["queued"] == 0).await
}

/// `POST /send-email` with `key`.
async fn send(stack: &Stack, key: &str, body: Value) -> (StatusCode, Value) {
    stack.post("/send-email", key, body).await
}

/// Sends a plain message to `to` alone and waits until it is finished; returns its status.
async fn send_one_and_wait(stack: &Stack, key: &str, to: &str) -> Value {
    let (s, v) = send(stack, key, json!({"to": to, "subject": "s", "text": "t"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_finished(stack, key, v["taskId"].as_str().expect("a task id")).await
}

#[tokio::test]
async fn every_field_reaches_the_delivered_message() {
    let mut stack = Stack::start().await;
    let relay = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::ZERO,
    })
    .await;
    deliver_to(&mut stack, &relay).await;
    let key = stack.key(10).await;
    let pdf = b"%PDF-1.4 not really a pdf \x00\x01\x02".to_vec();
    let body = json!({
        "to": [{"email": "Ann@Example.com", "externalId": "crm-1"}],
        "subject": "Hello {{name}}",
        "html": "<p>Hi {{name}}</p><a href=\"https://shop.example/x?a=1\">shop</a><a href=\"mailto:s@example.com\">m</a>",
        "text": "Hi {{ name }}",
        "variables": {"name": "Ann & <Co>"},
        "fromEmail": "news@postmesh.localhost",
        "fromName": "Postmesh News",
        "replyTo": "support@example.com",
        "cc": "cc@example.com",
        "bcc": ["bcc@example.com"],
        "messageId": "custom-1@example.com",
        "inReplyTo": "<parent@example.com>",
        "references": ["<root@example.com>", "parent@example.com"],
        "attachments": [{
            "filename": "invoice.pdf",
            "content": base64::engine::general_purpose::STANDARD.encode(&pdf),
            "contentType": "application/pdf"
        }],
        "utm": {"source": "newsletter", "utm_campaign": "nov"},
        "emailType": "lifecycle",
        "topic": "billing",
        "sourceApp": "crm",
        "businessGoal": "retention",
        "recipientReason": "customer",
        "someFutureField": {"accepted": "and ignored"}
    });
    let (s, v) = send(&stack, &key, body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["success"], true);
    assert_eq!(v["status"], "queued");
    assert_eq!(v["cost"], 3, "the recipient, the cc and the bcc");
    assert_eq!(v["dryRun"], false);
    assert_eq!(v["recipients"], json!({"accepted": 1, "rejected": []}));
    let task = v["taskId"].as_str().expect("a task id").to_owned();
    let status = wait_finished(&stack, &key, &task).await;
    assert_eq!(status["status"], "sent", "{status}");
    assert_eq!(
        (status["total"].as_i64(), status["sent"].as_i64()),
        (Some(1), Some(1))
    );
    let recipient = &status["recipients"][0];
    assert_eq!(recipient["email"], "Ann@example.com");
    assert_eq!(recipient["externalId"], "crm-1");
    assert_eq!(recipient["providerMessageId"], "<custom-1@example.com>");
    assert_eq!(stack.balance(&key).await, 7);

    let received = relay.received();
    assert_eq!(received.len(), 1, "one message for the one recipient");
    let envelope = &received[0];
    assert_eq!(envelope.from, "<news@postmesh.localhost>");
    let mut to = envelope.to.clone();
    to.sort();
    assert_eq!(
        to,
        ["<Ann@example.com>", "<bcc@example.com>", "<cc@example.com>"]
    );

    let mime = MessageParser::default()
        .parse(envelope.data.as_bytes())
        .expect("parsable MIME");
    assert_eq!(mime.subject(), Some("Hello Ann & <Co>"));
    let from = mime.from().and_then(|a| a.first()).expect("From");
    assert_eq!(from.name(), Some("Postmesh News"));
    assert_eq!(from.address(), Some("news@postmesh.localhost"));
    let first = |a: Option<&mail_parser::Address>| {
        a.and_then(|a| a.first())
            .and_then(|a| a.address())
            .map(str::to_owned)
    };
    assert_eq!(first(mime.to()).as_deref(), Some("Ann@example.com"));
    assert_eq!(
        first(mime.reply_to()).as_deref(),
        Some("support@example.com")
    );
    assert_eq!(first(mime.cc()).as_deref(), Some("cc@example.com"));
    assert!(mime.bcc().is_none(), "Bcc stays out of the headers");
    assert_eq!(mime.message_id(), Some("custom-1@example.com"));
    assert_eq!(mime.in_reply_to().as_text(), Some("parent@example.com"));
    let references: Vec<String> = mime
        .references()
        .as_text_list()
        .map(|l| l.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default();
    assert_eq!(references, ["root@example.com", "parent@example.com"]);
    assert!(mime.date().is_some(), "a Date header");
    let html = mime.body_html(0).expect("an HTML part");
    assert!(html.contains("<p>Hi Ann &amp; &lt;Co&gt;</p>"), "{html}");
    assert!(
        html.contains("https://shop.example/x?a=1&amp;utm_source=newsletter&amp;utm_campaign=nov"),
        "{html}"
    );
    assert!(html.contains("href=\"mailto:s@example.com\""), "{html}");
    assert_eq!(
        mime.body_text(0).expect("a text part").trim(),
        "Hi Ann & <Co>"
    );
    let attachment = mime.attachments().next().expect("an attachment");
    assert_eq!(attachment.attachment_name(), Some("invoice.pdf"));
    assert_eq!(attachment.contents(), &pdf[..]);
    let ctype = attachment.content_type().expect("a content type");
    assert_eq!(
        (ctype.ctype(), ctype.subtype()),
        ("application", Some("pdf"))
    );

    let db = stack.sender_db().await;
    let stored = peek::sender::task_labels(&db).await;
    assert_eq!(
        stored,
        (
            "lifecycle".into(),
            Some("billing".into()),
            Some("crm".into()),
            Some("retention".into()),
            Some("customer".into())
        )
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn dry_runs_and_refused_sends_charge_and_queue_nothing() {
    let stack = Stack::start().await;
    let key = stack.key(2).await;
    let db = stack.sender_db().await;
    let three = json!(["a@example.com", "b@example.com", "c@example.com"]);
    let two = json!(["a@example.com", "b@example.com"]);
    // A dry run checks and prices, and nothing else.
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": two, "subject": "s", "text": "t", "dryRun": true}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["dryRun"].as_bool(), v["cost"].as_i64()),
        (Some(true), Some(2))
    );
    assert!(v["taskId"].is_null(), "{v}");
    // The balance is one of its checks: three recipients with two credits is 402.
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": three, "subject": "s", "text": "t", "dryRun": true}),
    )
    .await;
    assert_eq!(s, StatusCode::PAYMENT_REQUIRED, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("insufficient balance"),
        "{v}"
    );
    // A dry run still refuses what a send would refuse.
    let (s, _) = send(
        &stack,
        &key,
        json!({"to": three, "subject": "s", "text": "{{x}}", "dryRun": true}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Three recipients with two credits: 402, nothing stored or queued.
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": three, "subject": "s", "text": "t"}),
    )
    .await;
    assert_eq!(s, StatusCode::PAYMENT_REQUIRED, "{v}");
    assert_eq!(v["success"], false);
    // Refusals of bad input.
    for (body, needle) in [
        (
            json!({"to": "nope", "subject": "s", "text": "t"}),
            "\"nope\"",
        ),
        (
            json!({"to": "a@example.com", "subject": "s", "text": "t", "fromEmail": "me@elsewhere.example"}),
            "fromEmail",
        ),
        (
            json!({"to": "a@example.com", "audience": {"include": []}, "subject": "s", "text": "t"}),
            "only one",
        ),
        (json!({"subject": "s", "text": "t"}), "exactly one"),
        (json!({"to": "a@example.com", "subject": "s"}), "no content"),
        (
            json!({"to": "a@example.com", "templateKey": "missing"}),
            "no template",
        ),
        (
            json!({"to": "a@example.com", "subject": "s", "text": "t", "scheduledAt": now() - 5}),
            "future",
        ),
    ] {
        let (s, v) = send(&stack, &key, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body} → {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(needle),
            "{body} → {error:?}, wanted {needle:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stack.balance(&key).await, 2, "nothing was charged");
    assert_eq!(peek::sender::stored_rows(&db).await, (0, 0, 0));
    stack.shutdown().await;
}

#[tokio::test]
async fn a_thousand_recipients_are_accepted_deduplicated_and_delivered() {
    let stack = Stack::start().await;
    let key = stack.key(2000).await;
    let mut to: Vec<Value> = (0..998)
        .map(|i| json!(format!("r{i}@example.com")))
        .collect();
    to.push(json!({"email": "R5@EXAMPLE.com", "externalId": "dup"}));
    to.push(json!("r7@Example.COM"));
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": to, "subject": "Big", "text": "Hello"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["recipients"]["accepted"], 998);
    let rejected = v["recipients"]["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 2, "{v}");
    assert!(rejected[0]["reason"]
        .as_str()
        .unwrap()
        .contains("duplicate"));
    assert_eq!(v["cost"], 998);
    assert_eq!(stack.balance(&key).await, 1002);
    let task = v["taskId"].as_str().unwrap().to_owned();

    let too_many: Vec<String> = (0..1001).map(|i| format!("x{i}@example.com")).collect();
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": too_many, "subject": "s", "text": "t"}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("at most 1000"), "{v}");
    assert_eq!(stack.balance(&key).await, 1002);

    // Progress, paged, up to `sent`.
    let done = wait_finished(&stack, &key, &task).await;
    assert_eq!(done["status"], "sent");
    assert_eq!(done["sent"], 998);
    let (_, page) = stack
        .get(&format!("/email-status/{task}?limit=10&offset=990"), &key)
        .await;
    let emails: Vec<&str> = page["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["email"].as_str().unwrap())
        .collect();
    assert_eq!(
        emails,
        (990..998)
            .map(|i| format!("r{i}@example.com"))
            .collect::<Vec<_>>()
    );
    assert_eq!(stack.messages_to("r997@example.com").len(), 1);
    assert_eq!(
        stack.messages_to("r5@example.com").len(),
        1,
        "a duplicate is sent once"
    );
    // Another key cannot see the task.
    let other = stack.key(0).await;
    let (s, _) = stack.get(&format!("/email-status/{task}"), &other).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = stack.get("/email-status/not-a-task", &key).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    stack.shutdown().await;
}

#[tokio::test]
async fn test_sends_go_to_the_account_alone_at_the_price_of_one() {
    let stack = Stack::start().await;
    let key = stack.key(5).await;
    let own = stack.account_email(&key).await;
    let (s, v) = send(&stack, &key, json!({"to": ["ann.launch@example.com", "bo.launch@example.com"], "subject": "Launch", "text": "t", "testSend": true, "cc": "boss@example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["cost"].as_i64(), v["testSend"].as_bool()),
        (Some(1), Some(true))
    );
    let task = v["taskId"].as_str().unwrap().to_owned();
    wait_finished(&stack, &key, &task).await;
    let mail = stack
        .wait_for_messages(&own, 1, Duration::from_secs(10))
        .await;
    assert_eq!(mail.len(), 1);
    let mime = MessageParser::default().parse(mail[0].as_bytes()).unwrap();
    assert_eq!(mime.subject(), Some("[Test] Launch"));
    assert!(
        !mail[0].contains("boss@example.com"),
        "a test send has no copies"
    );
    assert_eq!(
        mime.header("X-Postmesh-Test").and_then(|h| h.as_text()),
        Some("true")
    );
    assert!(stack.messages_to("ann.launch@example.com").is_empty());
    assert!(stack.messages_to("bo.launch@example.com").is_empty());
    assert_eq!(stack.balance(&key).await, 4);
    stack.shutdown().await;
}

#[tokio::test]
async fn variables_fill_placeholders_and_a_missing_one_is_named() {
    let stack = Stack::start().await;
    let key = stack.key(5).await;
    let (s, v) = send(&stack, &key, json!({"to": "v@example.com", "subject": "Hi {{first}}", "text": "{{first}} owes {{amount}}", "variables": {"first": "Vi"}}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("\"amount\""), "{v}");
    let (s, v) = send(&stack, &key, json!({"to": "v@example.com", "subject": "Hi {{first}}", "text": "{{first}} owes {{amount}}", "variables": {"first": "Vi", "amount": 12.5}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mail = stack
        .wait_for_messages("v@example.com", 1, Duration::from_secs(10))
        .await;
    let mime = MessageParser::default().parse(mail[0].as_bytes()).unwrap();
    assert_eq!(mime.subject(), Some("Hi Vi"));
    assert_eq!(mime.body_text(0).unwrap().trim(), "Vi owes 12.5");
    assert_eq!(stack.balance(&key).await, 4);
    stack.shutdown().await;
}

#[tokio::test]
async fn templates_are_versioned_and_a_send_pins_its_version() {
    let stack = Stack::start().await;
    let key = stack.key(5).await;
    let (s, v1) = stack
        .post(
            "/templates",
            &key,
            json!({"key": "welcome", "subject": "Welcome v1", "text": "one {{name}}"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v1}");
    assert_eq!(v1["version"], 1);
    let (_, v2) = stack
        .post(
            "/templates",
            &key,
            json!({"key": "welcome", "subject": "Welcome {{name}}", "html": "<b>two {{name}}</b>"}),
        )
        .await;
    assert_eq!(v2["version"], 2);
    let (_, list) = stack.get("/templates", &key).await;
    assert_eq!(list["templates"].as_array().unwrap().len(), 1);
    assert_eq!(list["templates"][0]["version"], 2);
    let (_, old) = stack.get("/templates/welcome?version=1", &key).await;
    assert_eq!(old["subject"], "Welcome v1");
    let (s, _) = stack.get("/templates/welcome?version=9", &key).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = stack
        .post(
            "/templates",
            &key,
            json!({"key": "bad key!", "subject": "s", "text": "t"}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let (s, latest) = send(
        &stack,
        &key,
        json!({"to": "t1@example.com", "templateKey": "welcome", "variables": {"name": "Tam"}}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{latest}");
    assert_eq!(latest["templateVersion"], 2);
    let (s, pinned) = send(&stack, &key, json!({"to": "t2@example.com", "templateKey": "welcome", "templateVersion": 1, "variables": {"name": "Tia"}}))
        .await;
    assert_eq!(s, StatusCode::OK, "{pinned}");
    assert_eq!(pinned["templateVersion"], 1);
    let parse = |eml: &str| {
        let m = MessageParser::default().parse(eml.as_bytes()).unwrap();
        (
            m.subject().unwrap_or_default().to_owned(),
            m.body_html(0).map(|h| h.to_string()),
            m.body_text(0).map(|t| t.trim().to_owned()),
        )
    };
    let t1 = stack
        .wait_for_messages("t1@example.com", 1, Duration::from_secs(10))
        .await;
    let (subject, html, _) = parse(&t1[0]);
    assert_eq!(subject, "Welcome Tam");
    assert!(html.unwrap().contains("<b>two Tam</b>"));
    let t2 = stack
        .wait_for_messages("t2@example.com", 1, Duration::from_secs(10))
        .await;
    let (subject, _, text) = parse(&t2[0]);
    assert_eq!(
        (subject.as_str(), text.as_deref()),
        ("Welcome v1", Some("one Tia"))
    );

    let (s, _, _) = stack
        .call(Method::DELETE, "/templates/welcome", Some(&key), None)
        .await;
    assert!(s.is_success());
    let (s, _) = stack.get("/templates/welcome", &key).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": "t3@example.com", "templateKey": "welcome", "variables": {"name": "x"}}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // Another workspace does not see the templates.
    let other = stack.key(0).await;
    let (_, list) = stack.get("/templates", &other).await;
    assert_eq!(list["templates"], json!([]));
    assert_eq!(stack.balance(&key).await, 3);
    stack.shutdown().await;
}

#[tokio::test]
async fn scheduled_sends_are_released_on_time_or_cancelled_and_refunded() {
    let stack = Stack::start().await;
    let key = stack.key(10).await;
    let at = now() + 2;
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": "later@example.com", "subject": "s", "text": "t", "scheduledAt": at}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["scheduledAt"].as_i64()),
        (Some("scheduled"), Some(at))
    );
    let task = v["taskId"].as_str().unwrap().to_owned();
    let (_, early) = stack.get(&format!("/email-status/{task}"), &key).await;
    assert_eq!(early["status"], "scheduled");
    assert!(stack.messages_to("later@example.com").is_empty());
    let done = wait_finished(&stack, &key, &task).await;
    assert_eq!(done["status"], "sent");
    assert!(now() >= at, "not released early");

    let (s, v) = send(&stack, &key, json!({"to": ["c1@example.com", "c2@example.com"], "subject": "s", "text": "t", "scheduledAt": now() + 3600}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let cancelled = v["taskId"].as_str().unwrap().to_owned();
    assert_eq!(stack.balance(&key).await, 7);
    let path = format!("/send-email/{cancelled}");
    let (s, _, v) = stack.call(Method::DELETE, &path, Some(&key), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["refunded"].as_i64()),
        (Some("cancelled"), Some(2))
    );
    assert_eq!(stack.balance(&key).await, 9);
    let (s, _, _) = stack.call(Method::DELETE, &path, Some(&key), None).await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "a cancelled task cannot be cancelled again"
    );
    let (s, _, _) = stack
        .call(
            Method::DELETE,
            &format!("/send-email/{task}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "a released task cannot be cancelled"
    );
    let other = stack.key(0).await;
    let (s, _, _) = stack.call(Method::DELETE, &path, Some(&other), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, status) = stack.get(&format!("/email-status/{cancelled}"), &key).await;
    assert_eq!(status["status"], "cancelled");
    let (s, v) = send(&stack, &key, json!({"to": "x@example.com", "subject": "s", "text": "t", "scheduledAt": now() + 31 * 86400}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(stack.balance(&key).await, 9);
    stack.shutdown().await;
}

#[tokio::test]
async fn smtp_auth_accepts_the_keys_own_address_only() {
    let stack = Stack::start().await;
    let key = stack.key(0).await;
    let own = stack.account_email(&key).await;
    let (s, v) = stack
        .post("/smtp-auth", &key, json!({"username": own.to_uppercase()}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["authenticated"], true);
    assert_eq!(v["error"], "");
    let (s, v) = stack
        .post(
            "/smtp-auth",
            &key,
            json!({"username": "someone-else@example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(
        (v["authenticated"].as_bool(), v["username"].as_str()),
        (Some(false), Some("someone-else@example.com"))
    );
    assert!(!v["error"].as_str().unwrap().is_empty());
    let (s, v) = stack
        .post("/smtp-auth", &key, json!({"username": "not an address"}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["authenticated"], false);
    let (s, _) = stack.post("/smtp-auth", &key, json!({})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    stack.shutdown().await;
}

#[tokio::test]
async fn the_ses_transport_sends_raw_mime_and_records_provider_ids() {
    let mut stack = Stack::start().await;
    let ses = FakeSes::start().await;
    ses.verify_sender_domain("postmesh.localhost");
    stack.kill_sender().await;
    stack.use_ses(ses.config());
    stack.start_sender().await;
    let key = stack.key(100).await;
    let (s, v) = send(&stack, &key, json!({"to": ["s1@example.com", "s2@example.com"], "subject": "Via SES", "html": "<p>hi</p>", "bcc": "audit@example.com"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let task = v["taskId"].as_str().unwrap().to_owned();
    let done = wait_finished(&stack, &key, &task).await;
    assert_eq!(done["status"], "sent", "{done}");
    let sent = ses.sent();
    assert_eq!(sent.len(), 2);
    for r in done["recipients"].as_array().unwrap() {
        let email = r["email"].as_str().unwrap();
        let message = sent
            .iter()
            .find(|m| m.destinations.iter().any(|d| d == email))
            .expect("sent through SES");
        assert_eq!(r["providerMessageId"], message.message_id.as_str());
        assert!(message
            .destinations
            .iter()
            .any(|d| d == "audit@example.com"));
        let mime = MessageParser::default().parse(&message.raw).unwrap();
        assert_eq!(mime.subject(), Some("Via SES"));
        assert!(mime.bcc().is_none());
    }
    // SES throttles one message of a send that spans two SEND jobs: that message alone is
    // tried again, with backoff; every recipient is sent exactly once.
    ses.fail_next(
        StatusCode::TOO_MANY_REQUESTS,
        "TooManyRequestsException",
        "Maximum sending rate exceeded.",
    );
    let to: Vec<String> = (0..60).map(|i| format!("t{i}@example.com")).collect();
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": to, "subject": "Throttled", "text": "t"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let task = v["taskId"].as_str().unwrap().to_owned();
    let done = wait_finished(&stack, &key, &task).await;
    assert_eq!(done["status"], "sent", "{done}");
    let task_id = uuid::Uuid::parse_str(&task).unwrap();
    let attempts = peek::sender::delivery_attempts(&stack.sender_db().await, task_id).await;
    let mut expected = vec![1; 59];
    expected.push(2);
    assert_eq!(attempts, expected, "one throttled attempt, then each sent");
    let sent = ses.sent();
    for t in &to {
        let copies = sent.iter().filter(|m| m.destinations == [t.as_str()]);
        assert_eq!(copies.count(), 1, "{t} sent once");
    }
    // SES refuses the next message for good: the recipient is failed, with the reason.
    ses.fail_next(
        StatusCode::BAD_REQUEST,
        "MessageRejected",
        "Email address is on the suppression list",
    );
    let done = send_one_and_wait(&stack, &key, "s3@example.com").await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(
        done["recipients"][0]["error"]
            .as_str()
            .unwrap()
            .contains("MessageRejected"),
        "{done}"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn the_plans_monthly_emails_bound_sends_and_usage_counts_them() {
    let stripe = FakeStripe::start().await;
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.json");
    let mut plans: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/catalog.json"
        ))
        .unwrap(),
    )
    .unwrap();
    for plan in plans["plans"].as_array_mut().unwrap() {
        plan["monthly_emails"] = json!(3);
    }
    std::fs::write(&catalog, plans.to_string()).unwrap();
    let stack = Stack::start_opts(Options {
        stripe: stripe.config(),
        catalog: Some(catalog),
        ..Options::default()
    })
    .await;
    let batch = |n: usize| {
        let to: Vec<String> = (0..n)
            .map(|i| format!("q{i}-{}@example.com", uuid::Uuid::new_v4().simple()))
            .collect();
        json!({"to": to, "subject": "s", "text": "t"})
    };
    // Without a plan there is no quota, only credits.
    let free = stack.key(10).await;
    let (s, v) = send(&stack, &free, batch(4)).await;
    assert_eq!(s, StatusCode::OK, "{v}");

    let key = stack.key(20).await;
    stripe.subscribe(&stack, &key, "starter").await;
    let used = || async {
        let (_, ent) = stack.get("/billing/entitlements", &key).await;
        assert_eq!(ent["entitlements"]["emails"]["quota"], 3, "{ent}");
        ent["entitlements"]["emails"]["used"]
            .as_i64()
            .expect("usage emails")
    };
    assert_eq!(used().await, 0);
    let (s, v) = send(&stack, &key, batch(2)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_finished(&stack, &key, v["taskId"].as_str().unwrap()).await;
    assert_eq!(used().await, 2, "usage counts the emails sent");
    // Two more would make 4 of 3; one more fits.
    let (s, v) = send(&stack, &key, batch(2)).await;
    assert_eq!(s, StatusCode::PAYMENT_REQUIRED, "{v}");
    let (s, v) = send(&stack, &key, batch(1)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let balance = stack.balance(&key).await;
    let (s, v) = send(&stack, &key, batch(1)).await;
    assert_eq!(s, StatusCode::PAYMENT_REQUIRED, "{v}");
    assert!(v["error"].as_str().unwrap().contains("quota"), "{v}");
    let (s, _) = send(
        &stack,
        &key,
        json!({"to": "dry@example.com", "subject": "s", "text": "t", "dryRun": true}),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::PAYMENT_REQUIRED,
        "a dry run checks the quota too"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        stack.balance(&key).await,
        balance,
        "a refused send is refunded"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_sender_killed_mid_batch_delivers_every_recipient_exactly_once() {
    let mut stack = Stack::start_with(SenderMode::ChildProcess).await;
    // The first relay takes 2 s per message: the sender is killed with a wave in flight.
    let slow = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::from_secs(2),
    })
    .await;
    deliver_to(&mut stack, &slow).await;
    let key = stack.key(100).await;
    // Two SEND jobs' worth of recipients (tasks::RECIPIENTS_PER_JOB is 50).
    let to: Vec<String> = (0..60).map(|i| format!("k{i}@example.com")).collect();
    let (s, v) = send(
        &stack,
        &key,
        json!({"to": to, "subject": "Batch", "text": "t"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let task = v["taskId"].as_str().unwrap().to_owned();
    // The first wave is delivered and recorded; the second is at the relay.
    wait_status(&stack, &key, &task, |v| v["sent"].as_i64() >= Some(1)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = slow.received().len();
    assert!(before < 60, "the batch was not cut short");
    stack.kill_sender().await;

    let fast = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::ZERO,
    })
    .await;
    deliver_to(&mut stack, &fast).await;
    let done = wait_finished(&stack, &key, &task).await;
    assert_eq!(done["status"], "sent", "{done}");
    tokio::time::sleep(Duration::from_secs(3)).await; // room for a duplicate to show up
    let mut delivered: Vec<String> = slow
        .received()
        .into_iter()
        .chain(fast.received())
        .flat_map(|m| m.to)
        .collect();
    delivered.sort();
    let mut expected: Vec<String> = to.iter().map(|t| format!("<{t}>")).collect();
    expected.sort();
    assert_eq!(delivered, expected, "each recipient exactly once");
    assert!(
        !fast.received().is_empty(),
        "the restarted sender finished the batch"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn attachments_up_to_ten_mib_are_delivered_and_more_is_refused() {
    let stack = Stack::start().await;
    let key = stack.key(5).await;
    let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![0x5au8; n]);
    let body = |content: String| {
        json!({"to": "big@example.com", "subject": "Big", "text": "see attached",
               "attachments": [{"filename": "data.bin", "content": content}]})
    };
    let limit = 10 * 1024 * 1024;
    let (s, v) = send(&stack, &key, body(b64(limit + 1))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("10 MiB"), "{v}");
    let (s, v) = send(&stack, &key, body(b64(limit))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let task = v["taskId"].as_str().unwrap().to_owned();
    assert_eq!(wait_finished(&stack, &key, &task).await["status"], "sent");
    let mail = stack.messages_to("big@example.com");
    assert_eq!(mail.len(), 1);
    let mime = MessageParser::default().parse(mail[0].as_bytes()).unwrap();
    let attachment = mime.attachments().next().expect("the attachment");
    assert_eq!(attachment.attachment_name(), Some("data.bin"));
    assert_eq!(attachment.contents().len(), limit);
    assert!(attachment.contents().iter().all(|b| *b == 0x5a));
    assert_eq!(
        stack.balance(&key).await,
        4,
        "the refused send cost nothing"
    );
    stack.shutdown().await;
}

#[tokio::test]
async fn a_cancel_while_billing_is_down_is_refunded_once_billing_is_back() {
    let mut stack = Stack::start().await;
    let key = stack.key(10).await;
    let (s, v) = send(&stack, &key, json!({"to": ["d1@example.com", "d2@example.com"], "subject": "s", "text": "t", "scheduledAt": now() + 3600}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let task = v["taskId"].as_str().unwrap().to_owned();
    assert_eq!(stack.balance(&key).await, 8);
    stack.stop_billing().await;
    let (s, _, v) = stack
        .call(
            Method::DELETE,
            &format!("/send-email/{task}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["refunded"], 2);
    let db = stack.sender_db().await;
    assert_eq!(
        peek::sender::owed_refunds(&db).await,
        1,
        "the refund is owed"
    );
    stack.start_billing().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while stack.balance(&key).await != 10 {
        assert!(Instant::now() < deadline, "the refund never arrived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(peek::sender::owed_refunds(&db).await, 0);
    stack.shutdown().await;
}
