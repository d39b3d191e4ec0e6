//! `/send-email` end to end: every field reaching the delivered MIME, prices and charges,
//! dry runs and test sends, recipient limits, variables, templates, schedules and
//! cancellation, task status, the SMTP and SES transports, `/smtp-auth`, the plan's quota,
//! and a sender killed mid-batch; sending over SMTP through the submission service (`smtp`);
//! test keys (`test_keys`).

#[path = "sending/engagement.rs"]
mod engagement;
#[path = "sending/smtp.rs"]
mod smtp;
#[path = "sending/test_keys.rs"]
mod test_keys;

use std::time::Duration;

use base64::Engine as _;
use mail_parser::{MessageParser, MimeHeaders};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use billing::entitlements::EntitlementsPage;
use postmesh_shared::error::ErrorBody;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::{Success, TaskId};
use postmesh_tests::fake_ses::FakeSes;
use postmesh_tests::fake_smtp::{Behaviour, FakeSmtp};
use postmesh_tests::receiver::{received, Receiver};
use postmesh_tests::{eventually, peek, Answer, FakeStripe, Options, SenderMode, Stack};
use sender::audience::suppressions::Reason;
use sender::sending::events::Kind;
use sender::sending::send::{Cancelled, SendAnswer};
use sender::sending::smtp_auth::SmtpAuth;
use sender::sending::status::{Progress, TaskProgress};
use sender::sending::tasks::TaskStatus;
use sender::sending::templates::{Deleted, Template, TemplateList};

fn now() -> i64 {
    postmesh_shared::db::now_unix()
}

/// `GET /email-status/{task}` until `done(progress)` holds; returns the last answer.
async fn wait_status(
    stack: &Stack, key: &str, task: TaskId, done: impl Fn(&TaskProgress) -> bool,
) -> TaskProgress {
    let done = &done;
    eventually(Duration::from_secs(30), || async move {
        let progress = status(stack, key, task, "?limit=1000").await;
        if done(&progress) {
            Ok(progress)
        } else {
            Err(progress)
        }
    })
    .await
}

/// `GET /email-status/{task}{query}` with `key`.
async fn status(stack: &Stack, key: &str, task: TaskId, query: &str) -> TaskProgress {
    let path = format!("/email-status/{task}{query}");
    let progress: Success<TaskProgress> = stack.client(key).get(&path, StatusCode::OK).await;
    progress.body
}

/// Waits until the task has no recipient left queued; returns its status.
async fn wait_finished(stack: &Stack, key: &str, task: TaskId) -> TaskProgress {
    wait_status(stack, key, task, |p| p.queued == 0).await
}

/// `POST /send-email` with `key`; the whole answer.
async fn send(stack: &Stack, key: &str, body: Value) -> Answer {
    stack
        .client(key)
        .request(Method::POST, "/send-email", &body)
        .await
}

/// A send that is accepted; its answer.
async fn accepted(stack: &Stack, key: &str, body: Value) -> SendAnswer {
    let answer: Success<SendAnswer> = send(stack, key, body)
        .await
        .expect(StatusCode::OK, "POST /send-email");
    assert!(answer.success);
    answer.body
}

/// A send refused with `status`; its error.
async fn refused(stack: &Stack, key: &str, body: Value, status: StatusCode) -> String {
    let error: ErrorBody = send(stack, key, body)
        .await
        .expect(status, "POST /send-email");
    assert!(!error.success);
    error.error
}

/// Sends a plain message to `to` alone and waits until it is finished; returns its status.
async fn send_one_and_wait(stack: &Stack, key: &str, to: &str) -> TaskProgress {
    let v = accepted(stack, key, json!({"to": to, "subject": "s", "text": "t"})).await;
    wait_finished(stack, key, v.task_id.expect("a task id")).await
}

#[tokio::test]
async fn every_field_reaches_the_delivered_message() {
    let mut stack = Stack::start().await;
    let relay = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::ZERO,
    })
    .await;
    stack.deliver_by_smtp(&relay.url()).await;
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
        "emailType": "transactional",
        "topic": "billing",
        "sourceApp": "crm",
        "businessGoal": "retention",
        "recipientReason": "customer",
        "someFutureField": {"accepted": "and ignored"}
    });
    let v = accepted(&stack, &key, body).await;
    assert_eq!(v.status, TaskStatus::Queued);
    assert_eq!(v.cost, 3, "the recipient, the cc and the bcc");
    assert!(!v.dry_run);
    assert_eq!(v.recipients.accepted, 1);
    assert!(v.recipients.rejected.is_empty());
    let task = v.task_id.expect("a task id");
    let status = wait_finished(&stack, &key, task).await;
    assert_eq!(status.status, Progress::Sent, "{status:?}");
    assert_eq!((status.total, status.sent), (1, 1));
    let recipient = &status.recipients[0];
    assert_eq!(recipient.email, "Ann@example.com");
    assert_eq!(recipient.external_id.as_deref(), Some("crm-1"));
    assert_eq!(
        recipient.provider_message_id.as_deref(),
        Some("<custom-1@example.com>")
    );
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
            "transactional".into(),
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
    let v = accepted(
        &stack,
        &key,
        json!({"to": two, "subject": "s", "text": "t", "dryRun": true}),
    )
    .await;
    assert_eq!((v.dry_run, v.cost), (true, 2));
    assert!(v.task_id.is_none(), "{v:?}");
    // The balance is one of its checks: three recipients with two credits is 402.
    let error = refused(
        &stack,
        &key,
        json!({"to": three, "subject": "s", "text": "t", "dryRun": true}),
        StatusCode::PAYMENT_REQUIRED,
    )
    .await;
    assert!(error.contains("insufficient balance"), "{error}");
    // A dry run still refuses what a send would refuse.
    refused(
        &stack,
        &key,
        json!({"to": three, "subject": "s", "text": "{{x}}", "dryRun": true}),
        StatusCode::BAD_REQUEST,
    )
    .await;
    // Three recipients with two credits: 402, nothing stored or queued.
    refused(
        &stack,
        &key,
        json!({"to": three, "subject": "s", "text": "t"}),
        StatusCode::PAYMENT_REQUIRED,
    )
    .await;
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
        let error = refused(&stack, &key, body.clone(), StatusCode::BAD_REQUEST).await;
        let error = error.as_str();
        assert!(
            error.contains(needle),
            "{body} → {error:?}, wanted {needle:?}"
        );
    }
    assert_eq!(stack.settled_balance(&key).await, 2, "nothing was charged");
    assert_eq!(peek::sender::stored_rows(&db).await, (0, 0, 0));
    stack.shutdown().await;
}

/// A scheduled task whose release fails every time (here: a trigger refuses to queue it) is
/// tried `RELEASE_TRIES` times, then set aside as failed and refunded; a task due after it
/// goes out meanwhile, never held up behind it.
async fn a_scheduled_task_that_keeps_failing_is_set_aside_while_the_others_go_out(stack: &Stack) {
    let key = stack.key(10).await;
    // The release of the task with this subject fails, whenever it comes: the trigger is in
    // place before the sends.
    let poison = format!("poisoned {}", uuid::Uuid::now_v7());
    let db = stack.sender_db().await;
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.message->>'subject' = '{poison}' AND NEW.status = 'queued' THEN
             RAISE EXCEPTION 'poisoned task';
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER poison BEFORE UPDATE ON tasks FOR EACH ROW EXECUTE FUNCTION poison();"
    ))
    .execute(&db)
    .await
    .expect("the trigger");
    // Each send is due 2 s after it is made (a busy machine may take longer than that
    // between the two), the fine one no sooner than the poisoned one; both are charged
    // (the balance ends at 9 of 10 once the poisoned one is refunded).
    let body = |to: &str, subject: &str, at: i64| json!({"to": to, "subject": subject, "text": "t", "scheduledAt": at});
    let first = now() + 2;
    let poisoned = accepted(stack, &key, body("poisoned@example.com", &poison, first))
        .await
        .task_id
        .expect("a task id");
    // Charged at acceptance: its refund comes only after its releases fail, seconds on.
    assert_eq!(stack.balance(&key).await, 9);
    let fine = accepted(
        stack,
        &key,
        body("fine@example.com", "s", first.max(now() + 2)),
    )
    .await
    .task_id
    .expect("a task id");

    let done = wait_finished(stack, &key, fine).await;
    assert_eq!(done.status, Progress::Sent);
    let failed = wait_status(stack, &key, poisoned, |p| p.status == Progress::Failed).await;
    assert_eq!(failed.sent, 0);
    let (tries, error): (i32, Option<String>) =
        sqlx::query_as("SELECT release_failures, last_error FROM tasks WHERE id = $1")
            .bind(poisoned)
            .fetch_one(&db)
            .await
            .expect("the task");
    assert_eq!(tries, sender::sending::schedule::RELEASE_TRIES);
    // What the release answered (the details are in the sender's log).
    assert_eq!(error.as_deref(), Some("database error"));
    assert!(stack.messages_to("poisoned@example.com").is_empty());
    // Set aside like a cancelled send: no quota or cap counts it, its recipient failed.
    let (unfinished, capped): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM unfinished_deliveries WHERE delivery_id IN
                     (SELECT delivery_id FROM task_recipients WHERE task_id = $1)),
                (SELECT count(*) FROM sends_to WHERE task_id = $1)",
    )
    .bind(poisoned)
    .fetch_one(&db)
    .await
    .expect("the counts");
    assert_eq!((unfinished, capped), (0, 0));
    let kinds: Vec<Kind> = failed.recipients[0].events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [Kind::Failed], "{failed:?}");
    eventually(Duration::from_secs(30), || async {
        match stack.balance(&key).await {
            9 => Ok(()),
            other => Err(other),
        }
    })
    .await;
}

async fn a_thousand_recipients_are_accepted_deduplicated_and_delivered(stack: &Stack) {
    let key = stack.key(2000).await;
    let mut to: Vec<Value> = (0..998)
        .map(|i| json!(format!("r{i}@example.com")))
        .collect();
    to.push(json!({"email": "R5@EXAMPLE.com", "externalId": "dup"}));
    to.push(json!("r7@Example.COM"));
    let v = accepted(
        stack,
        &key,
        json!({"to": to, "subject": "Big", "text": "Hello"}),
    )
    .await;
    assert_eq!(v.recipients.accepted, 998);
    let rejected = &v.recipients.rejected;
    assert_eq!(rejected.len(), 2, "{v:?}");
    assert!(rejected[0].reason.contains("duplicate"));
    assert_eq!(v.cost, 998);
    assert_eq!(stack.balance(&key).await, 1002);
    let task = v.task_id.expect("a task id");

    let too_many: Vec<String> = (0..1001).map(|i| format!("x{i}@example.com")).collect();
    let error = refused(
        stack,
        &key,
        json!({"to": too_many, "subject": "s", "text": "t"}),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(error.contains("at most 1000"), "{error}");
    assert_eq!(stack.balance(&key).await, 1002);

    // Progress, paged, up to `sent`.
    let done = wait_finished(stack, &key, task).await;
    assert_eq!((done.status.as_str(), done.sent), ("sent", 998));
    let page = status(stack, &key, task, "?limit=10&offset=990").await;
    let emails: Vec<&str> = page.recipients.iter().map(|r| r.email.as_str()).collect();
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
    let _: ErrorBody = stack
        .client(&other)
        .get(&format!("/email-status/{task}"), StatusCode::NOT_FOUND)
        .await;
    let _: ErrorBody = stack
        .client(&key)
        .get("/email-status/not-a-task", StatusCode::BAD_REQUEST)
        .await;
}

/// Sends of one key each, to recipients of their own, side by side on one stack.
#[tokio::test]
async fn sends_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            test_sends_go_to_the_account_alone_at_the_price_of_one,
            variables_fill_placeholders_and_a_missing_one_is_named,
            templates_are_versioned_and_a_send_pins_its_version,
            scheduled_sends_are_released_on_time_or_cancelled_and_refunded,
            smtp_auth_accepts_the_keys_own_address_only,
            an_idempotency_key_makes_a_retried_send_answer_the_same_and_send_once,
            a_scheduled_task_that_keeps_failing_is_set_aside_while_the_others_go_out,
            a_thousand_recipients_are_accepted_deduplicated_and_delivered,
            attachments_up_to_ten_mib_are_delivered_and_more_is_refused,
            a_send_carries_the_stored_external_id_unless_the_recipient_gives_one,
            sandbox_addresses_behave_as_their_names_say_and_cost_nothing,
            smtp::python_smtplib_sends_with_starttls_login_and_plain,
            smtp::lettre_sends_over_implicit_tls_and_a_blind_copy_stays_blind,
            smtp::a_retried_message_is_sent_and_charged_once,
            smtp::sandbox_addresses_work_over_smtp,
            smtp::each_refusal_has_its_smtp_answer,
            smtp::a_client_that_misbehaves_is_cut_off,
            smtp::a_workspace_that_tracks_has_its_smtp_messages_tracked,
            test_keys::a_test_key_prices_stores_and_shows_but_delivers_and_charges_nothing,
            engagement::a_tagged_tracked_send_reports_opens_and_clicks_with_its_labels,
            engagement::a_sends_log_is_purged_a_retention_after_its_release_and_not_before,
            engagement::a_hit_recorded_twice_at_once_is_one_event_counted_once,
            a_send_cancelled_before_its_confirm_is_settled_is_never_charged
        ]
    );
}

/// Sandbox addresses: nothing reaches the transport and nothing is charged; each behaves
/// at once as its name says in `/email-status` and the suppression list; another local part
/// on the sandbox domain, or a sandbox copy, is a 400.
async fn sandbox_addresses_behave_as_their_names_say_and_cost_nothing(stack: &Stack) {
    let key = stack.key(1).await;
    let client = stack.client(&key);
    let at = |local: &str| format!("{local}@sandbox.postmesh.test");
    let receiver = Receiver::start().await;
    let events = ["email.bounced", "email.complained", "email.delayed"];
    receiver.subscribe(stack, &key, &events).await;
    let to = [
        "delivered",
        "bounced+signup",
        "complained",
        "delayed",
        "suppressed",
    ]
    .map(at);
    let sent: Success<SendAnswer> = client
        .post(
            "/send-email",
            &json!({ "to": to, "subject": "Hi", "text": "Hello" }),
            StatusCode::OK,
        )
        .await;
    assert_eq!(sent.body.cost, 0);
    assert_eq!(sent.body.recipients.accepted, 4);
    let rejected: Vec<(String, String)> = sent
        .body
        .recipients
        .rejected
        .iter()
        .map(|r| (r.email.clone(), r.reason.clone()))
        .collect();
    assert_eq!(rejected, [(at("suppressed"), "suppressed:sandbox".into())]);
    let task = sent.body.task_id.expect("a task");
    let expected = [
        (at("delivered"), vec![Kind::Sent, Kind::Delivered]),
        (at("bounced+signup"), vec![Kind::Sent, Kind::Bounced]),
        (
            at("complained"),
            vec![Kind::Sent, Kind::Delivered, Kind::Complained],
        ),
        (
            at("delayed"),
            vec![Kind::Sent, Kind::Delayed, Kind::Delivered],
        ),
    ];
    let (client, expected) = (&client, &expected);
    eventually(Duration::from_secs(30), || async move {
        let p: Success<TaskProgress> = client
            .get(&format!("/email-status/{task}"), StatusCode::OK)
            .await;
        let seen: Vec<(String, Vec<Kind>)> = p
            .body
            .recipients
            .iter()
            .map(|r| {
                let kinds = r.events.iter().map(|e| e.kind);
                let kinds = kinds.filter(|k| *k != Kind::Queued).collect();
                (r.email.clone(), kinds)
            })
            .collect();
        if expected.iter().all(|want| seen.contains(want)) && seen.len() == expected.len() {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    for (local, reasons) in [
        ("delivered", vec![]),
        ("bounced+signup", vec![(Reason::Bounce, None)]),
        ("complained", vec![(Reason::Complaint, None)]),
        ("delayed", vec![]),
    ] {
        assert_eq!(
            stack.suppressions(&key, &at(local)).await,
            reasons,
            "{local}"
        );
        assert!(
            stack.messages_to(&at(local)).is_empty(),
            "{local} reached the transport"
        );
    }
    assert_eq!(stack.settled_balance(&key).await, 1);
    // The webhooks see them as any provider's events.
    let mut posted: Vec<(String, String)> = received(&receiver, 3, Duration::from_secs(30))
        .await
        .iter()
        .map(|d| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (text(&d.body["type"]), text(&d.body["data"]["email"]))
        })
        .collect();
    posted.sort();
    let want = [
        ("email.bounced", "bounced+signup"),
        ("email.complained", "complained"),
        ("email.delayed", "delayed"),
    ]
    .map(|(t, local)| (t.to_owned(), at(local)));
    assert_eq!(posted, want);
    for body in [
        json!({ "to": [at("someone")], "subject": "Hi", "text": "Hello" }),
        json!({ "to": ["a@example.com"], "cc": [at("delivered")], "subject": "Hi", "text": "Hello" }),
    ] {
        let refused: ErrorBody = client
            .post("/send-email", &body, StatusCode::BAD_REQUEST)
            .await;
        assert!(refused.error.contains("sandbox"), "{}", refused.error);
    }
}

async fn a_send_carries_the_stored_external_id_unless_the_recipient_gives_one(stack: &Stack) {
    let key = stack.key(10).await;
    let client = stack.client(&key);
    for (email, id) in [
        ("ann@example.com", "stored-a"),
        ("bob@example.com", "stored-b"),
    ] {
        let _: Success<sender::audience::contacts::Upserted> = client
            .post(
                "/contacts",
                &json!({"email": email, "externalId": id}),
                StatusCode::CREATED,
            )
            .await;
    }
    let sent: Success<SendAnswer> = client
        .post(
            "/send-email",
            &json!({"to": ["ANN@example.com", {"email": "bob@example.com", "externalId": "given"},
                           "cat@example.com"],
                    "subject": "Hi", "text": "Hello", "scheduledAt": postmesh_shared::db::now_unix() + 3600}),
            StatusCode::OK,
        )
        .await;
    let task = sent.body.task_id.unwrap();
    let progress: Success<TaskProgress> = client
        .get(&format!("/email-status/{task}"), StatusCode::OK)
        .await;
    let ids: Vec<Option<&str>> = progress
        .body
        .recipients
        .iter()
        .map(|r| r.external_id.as_deref())
        .collect();
    assert_eq!(ids, [Some("stored-a"), Some("given"), None]);
}

async fn test_sends_go_to_the_account_alone_at_the_price_of_one(stack: &Stack) {
    let key = stack.key(5).await;
    let own = stack.account_email(&key).await;
    let v = accepted(stack, &key, json!({"to": ["ann.launch@example.com", "bo.launch@example.com"], "subject": "Launch", "text": "t", "testSend": true, "cc": "boss@example.com"}),
        )
        .await;
    assert_eq!((v.cost, v.test_send), (1, true));
    let task = v.task_id.expect("a task id");
    wait_finished(stack, &key, task).await;
    let mail = stack
        .wait_for_messages(&own, 1, Duration::from_secs(30))
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
}

async fn variables_fill_placeholders_and_a_missing_one_is_named(stack: &Stack) {
    let key = stack.key(5).await;
    let error = refused(stack, &key, json!({"to": "v@example.com", "subject": "Hi {{first}}", "text": "{{first}} owes {{amount}}", "variables": {"first": "Vi"}}),
        StatusCode::BAD_REQUEST).await;
    assert!(error.contains("\"amount\""), "{error}");
    accepted(stack, &key, json!({"to": "v@example.com", "subject": "Hi {{first}}", "text": "{{first}} owes {{amount}}", "variables": {"first": "Vi", "amount": 12.5}}),
        )
        .await;
    let mail = stack
        .wait_for_messages("v@example.com", 1, Duration::from_secs(30))
        .await;
    let mime = MessageParser::default().parse(mail[0].as_bytes()).unwrap();
    assert_eq!(mime.subject(), Some("Hi Vi"));
    assert_eq!(mime.body_text(0).unwrap().trim(), "Vi owes 12.5");
    assert_eq!(stack.balance(&key).await, 4);
}

async fn templates_are_versioned_and_a_send_pins_its_version(stack: &Stack) {
    let key = stack.key(5).await;
    let client = stack.client(&key);
    let body = json!({"key": "welcome", "subject": "Welcome v1", "text": "one {{name}}"});
    let v1: Success<Template> = client.post("/templates", &body, StatusCode::OK).await;
    assert_eq!(v1.body.version, 1);
    let body =
        json!({"key": "welcome", "subject": "Welcome {{name}}", "html": "<b>two {{name}}</b>"});
    let v2: Success<Template> = client.post("/templates", &body, StatusCode::OK).await;
    assert_eq!(v2.body.version, 2);
    let list: Success<TemplateList> = client.get("/templates", StatusCode::OK).await;
    let versions: Vec<i32> = list.body.templates.iter().map(|t| t.version).collect();
    assert_eq!(versions, [2]);
    let old: Success<Template> = client
        .get("/templates/welcome?version=1", StatusCode::OK)
        .await;
    assert_eq!(old.body.subject, "Welcome v1");
    let _: ErrorBody = client
        .get("/templates/welcome?version=9", StatusCode::NOT_FOUND)
        .await;
    let bad = json!({"key": "bad key!", "subject": "s", "text": "t"});
    let _: ErrorBody = client
        .post("/templates", &bad, StatusCode::BAD_REQUEST)
        .await;

    let latest = accepted(
        stack,
        &key,
        json!({"to": "t1@example.com", "templateKey": "welcome", "variables": {"name": "Tam"}}),
    )
    .await;
    assert_eq!(latest.template_version, Some(2));
    let pinned = accepted(stack, &key, json!({"to": "t2@example.com", "templateKey": "welcome", "templateVersion": 1, "variables": {"name": "Tia"}})).await;
    assert_eq!(pinned.template_version, Some(1));
    let parse = |eml: &str| {
        let m = MessageParser::default().parse(eml.as_bytes()).unwrap();
        (
            m.subject().unwrap_or_default().to_owned(),
            m.body_html(0).map(|h| h.to_string()),
            m.body_text(0).map(|t| t.trim().to_owned()),
        )
    };
    let t1 = stack
        .wait_for_messages("t1@example.com", 1, Duration::from_secs(30))
        .await;
    let (subject, html, _) = parse(&t1[0]);
    assert_eq!(subject, "Welcome Tam");
    assert!(html.unwrap().contains("<b>two Tam</b>"));
    let t2 = stack
        .wait_for_messages("t2@example.com", 1, Duration::from_secs(30))
        .await;
    let (subject, _, text) = parse(&t2[0]);
    assert_eq!(
        (subject.as_str(), text.as_deref()),
        ("Welcome v1", Some("one Tia"))
    );

    let deleted: Success<Deleted> = client.delete("/templates/welcome", StatusCode::OK).await;
    assert!(deleted.success);
    let _: ErrorBody = client
        .get("/templates/welcome", StatusCode::NOT_FOUND)
        .await;
    refused(
        stack,
        &key,
        json!({"to": "t3@example.com", "templateKey": "welcome", "variables": {"name": "x"}}),
        StatusCode::BAD_REQUEST,
    )
    .await;
    // Another workspace does not see the templates.
    let other = stack.key(0).await;
    let list: Success<TemplateList> = stack.client(&other).get("/templates", StatusCode::OK).await;
    assert!(list.body.templates.is_empty());
    assert_eq!(stack.balance(&key).await, 3);
}

async fn scheduled_sends_are_released_on_time_or_cancelled_and_refunded(stack: &Stack) {
    let key = stack.key(10).await;
    // Far enough ahead that the status is read before the release, on a stack busy with
    // every other scenario of this file.
    let at = now() + 6;
    let v = accepted(
        stack,
        &key,
        json!({"to": "later@example.com", "subject": "s", "text": "t", "scheduledAt": at}),
    )
    .await;
    assert_eq!(
        (v.status, v.scheduled_at),
        (TaskStatus::Scheduled, Some(at))
    );
    let task = v.task_id.expect("a task id");
    let early = status(stack, &key, task, "").await;
    assert_eq!(early.status, Progress::Scheduled);
    assert!(stack.messages_to("later@example.com").is_empty());
    let done = wait_finished(stack, &key, task).await;
    assert_eq!(done.status, Progress::Sent);
    assert!(now() >= at, "not released early");

    let v = accepted(stack, &key, json!({"to": ["c1@example.com", "c2@example.com"], "subject": "s", "text": "t", "scheduledAt": now() + 3600}),
        )
        .await;
    let cancelled = v.task_id.expect("a task id");
    assert_eq!(stack.balance(&key).await, 7);
    let path = format!("/send-email/{cancelled}");
    let client = stack.client(&key);
    let c: Success<Cancelled> = client.delete(&path, StatusCode::OK).await;
    assert_eq!((c.body.status, c.body.refunded), (TaskStatus::Cancelled, 2));
    assert_eq!(stack.balance(&key).await, 9);
    // A cancelled task cannot be cancelled again, nor a released one.
    let _: ErrorBody = client.delete(&path, StatusCode::CONFLICT).await;
    let released = format!("/send-email/{task}");
    let _: ErrorBody = client.delete(&released, StatusCode::CONFLICT).await;
    let other = stack.key(0).await;
    let _: ErrorBody = stack
        .client(&other)
        .delete(&path, StatusCode::NOT_FOUND)
        .await;
    let after = status(stack, &key, cancelled, "").await;
    assert_eq!(after.status, Progress::Cancelled);
    for recipient in &after.recipients {
        let kinds: Vec<_> = recipient.events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [sender::sending::events::Kind::Cancelled],
            "{after:?}"
        );
    }
    assert_eq!(after.recipients.len(), 2);
    let late = now() + 31 * 86400;
    let late = json!({"to": "x@example.com", "subject": "s", "text": "t", "scheduledAt": late});
    refused(stack, &key, late, StatusCode::BAD_REQUEST).await;
    assert_eq!(stack.balance(&key).await, 9);
}

async fn smtp_auth_accepts_the_keys_own_address_only(stack: &Stack) {
    let key = stack.key(0).await;
    let own = stack.account_email(&key).await;
    let client = stack.client(&key);
    let body = json!({"username": own.to_uppercase()});
    let v: SmtpAuth = client.post("/smtp-auth", &body, StatusCode::OK).await;
    assert!(v.authenticated);
    assert_eq!(v.error, "");
    let body = json!({"username": "someone-else@example.com"});
    let v: SmtpAuth = client
        .post("/smtp-auth", &body, StatusCode::FORBIDDEN)
        .await;
    assert_eq!(
        (v.authenticated, v.username.as_str()),
        (false, "someone-else@example.com")
    );
    assert!(!v.error.is_empty());
    let body = json!({"username": "not an address"});
    let v: SmtpAuth = client
        .post("/smtp-auth", &body, StatusCode::BAD_REQUEST)
        .await;
    assert!(!v.authenticated);
    let _: SmtpAuth = client
        .post("/smtp-auth", &json!({}), StatusCode::BAD_REQUEST)
        .await;
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
    let v = accepted(&stack, &key, json!({"to": ["s1@example.com", "s2@example.com"], "subject": "Via SES", "html": "<p>hi</p>", "bcc": "audit@example.com"}),
        )
        .await;
    let task = v.task_id.expect("a task id");
    let done = wait_finished(&stack, &key, task).await;
    assert_eq!(done.status, Progress::Sent, "{done:?}");
    let sent = ses.sent();
    assert_eq!(sent.len(), 2);
    for r in &done.recipients {
        let email = r.email.as_str();
        let message = sent
            .iter()
            .find(|m| m.destinations.iter().any(|d| d == email))
            .expect("sent through SES");
        assert_eq!(r.provider_message_id.as_ref(), Some(&message.message_id));
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
    let v = accepted(
        &stack,
        &key,
        json!({"to": to, "subject": "Throttled", "text": "t"}),
    )
    .await;
    let task = v.task_id.expect("a task id");
    let done = wait_finished(&stack, &key, task).await;
    assert_eq!(done.status, Progress::Sent, "{done:?}");
    let attempts = peek::sender::delivery_attempts(&stack.sender_db().await, task.as_uuid()).await;
    let mut expected = vec![1; 59];
    expected.push(2);
    assert_eq!(attempts, expected, "one throttled attempt, then each sent");
    let sent = ses.sent();
    for t in &to {
        let copies = sent.iter().filter(|m| m.destinations == [t.as_str()]);
        assert_eq!(copies.count(), 1, "{t} sent once");
    }
    // The largest raw message taken is one SES takes; a byte more is refused before it is
    // charged.
    let max = sender::sending::raw_mime::MAX_RAW_BYTES;
    let raw = |size: usize| {
        let head = "From: s@postmesh.localhost\r\nTo: big@example.com\r\nSubject: Big\r\n\r\n";
        let mut mime = head.as_bytes().to_vec();
        let line = [b"a".repeat(996), b"\r\n".to_vec()].concat();
        while mime.len() + line.len() <= size {
            mime.extend_from_slice(&line);
        }
        mime.resize(size, b'a');
        base64::engine::general_purpose::STANDARD.encode(mime)
    };
    let body = |size| json!({"mailFrom": "s@postmesh.localhost", "rcptTo": ["big@example.com"], "raw": raw(size)});
    let balance = stack.balance(&key).await;
    let _: ErrorBody = stack
        .client(&key)
        .post("/send-raw", &body(max + 1), StatusCode::PAYLOAD_TOO_LARGE)
        .await;
    assert_eq!(stack.balance(&key).await, balance, "nothing charged");
    // Another account: each may send 4 MiB of large bodies a second.
    let other = stack.key(10).await;
    let taken: Success<SendAnswer> = stack
        .client(&other)
        .post("/send-raw", &body(max), StatusCode::OK)
        .await;
    let task = taken.body.task_id.expect("a task id");
    let done = wait_finished(&stack, &other, task).await;
    assert_eq!(done.status, Progress::Sent, "{done:?}");
    // SES refuses the next message for good: the recipient is failed, with the reason.
    ses.fail_next(
        StatusCode::BAD_REQUEST,
        "MessageRejected",
        "Email address is on the suppression list",
    );
    let done = send_one_and_wait(&stack, &key, "s3@example.com").await;
    assert_eq!(done.status, Progress::Failed, "{done:?}");
    let error = done.recipients[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("MessageRejected"), "{done:?}");
    let failed = &done.recipients[0].events;
    assert_eq!(failed.len(), 1, "{done:?}");
    assert_eq!(failed[0].kind, sender::sending::events::Kind::Failed);
    assert!(failed[0].detail["reason"]
        .as_str()
        .unwrap_or_default()
        .contains("MessageRejected"));
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
    accepted(&stack, &free, batch(4)).await;

    let key = stack.key(20).await;
    stripe.subscribe(&stack, &key, "starter").await;
    let used = || async {
        let page: Success<EntitlementsPage> = stack
            .client(&key)
            .get("/billing/entitlements", StatusCode::OK)
            .await;
        let emails = page.body.entitlements.emails.expect("a plan's email quota");
        assert_eq!(emails.quota, 3);
        emails.used
    };
    assert_eq!(used().await, 0);
    let v = accepted(&stack, &key, batch(2)).await;
    wait_finished(&stack, &key, v.task_id.expect("a task id")).await;
    assert_eq!(used().await, 2, "usage counts the emails sent");
    // Two more would make 4 of 3; one more fits.
    refused(&stack, &key, batch(2), StatusCode::PAYMENT_REQUIRED).await;
    accepted(&stack, &key, batch(1)).await;
    let balance = stack.balance(&key).await;
    let error = refused(&stack, &key, batch(1), StatusCode::PAYMENT_REQUIRED).await;
    assert!(error.contains("quota"), "{error}");
    // A dry run checks the quota too.
    let dry = json!({"to": "dry@example.com", "subject": "s", "text": "t", "dryRun": true});
    refused(&stack, &key, dry, StatusCode::PAYMENT_REQUIRED).await;
    assert_eq!(
        stack.settled_balance(&key).await,
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
    stack.deliver_by_smtp(&slow.url()).await;
    let key = stack.key(100).await;
    // Two SEND jobs' worth of recipients (tasks::RECIPIENTS_PER_JOB is 50).
    let to: Vec<String> = (0..60).map(|i| format!("k{i}@example.com")).collect();
    let v = accepted(
        &stack,
        &key,
        json!({"to": to, "subject": "Batch", "text": "t"}),
    )
    .await;
    let task = v.task_id.expect("a task id");
    // The first wave is delivered and recorded; the second is at the relay.
    wait_status(&stack, &key, task, |p| p.sent >= 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = slow.received().len();
    assert!(before < 60, "the batch was not cut short");
    stack.kill_sender().await;

    let fast = FakeSmtp::start(Behaviour::Accept {
        accept_delay: Duration::ZERO,
    })
    .await;
    stack.deliver_by_smtp(&fast.url()).await;
    let done = wait_finished(&stack, &key, task).await;
    assert_eq!(done.status, Progress::Sent, "{done:?}");
    // A duplicate would have reached a relay by the time SEND's consumer has none left.
    stack.handled(&[Stream::Send]).await;
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

async fn attachments_up_to_ten_mib_are_delivered_and_more_is_refused(stack: &Stack) {
    let key = stack.key(5).await;
    let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![0x5au8; n]);
    let body = |content: String| {
        json!({"to": "big@example.com", "subject": "Big", "text": "see attached",
               "attachments": [{"filename": "data.bin", "content": content}]})
    };
    let limit = 10 * 1024 * 1024;
    let error = refused(stack, &key, body(b64(limit + 1)), StatusCode::BAD_REQUEST).await;
    assert!(error.contains("10 MiB"), "{error}");
    let v = accepted(stack, &key, body(b64(limit))).await;
    let task = v.task_id.expect("a task id");
    assert_eq!(
        wait_finished(stack, &key, task).await.status,
        Progress::Sent
    );
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
}

#[tokio::test]
async fn a_cancel_while_billing_is_down_is_refunded_once_billing_is_back() {
    let mut stack = Stack::start().await;
    let key = stack.key(10).await;
    let v = accepted(&stack, &key, json!({"to": ["d1@example.com", "d2@example.com"], "subject": "s", "text": "t", "scheduledAt": now() + 3600}),
        )
        .await;
    let task = v.task_id.expect("a task id");
    assert_eq!(stack.balance(&key).await, 8);
    stack.stop_billing().await;
    let cancelled: Success<Cancelled> = stack
        .client(&key)
        .delete(&format!("/send-email/{task}"), StatusCode::OK)
        .await;
    assert_eq!(cancelled.body.refunded, 2);
    let db = stack.sender_db().await;
    assert_eq!(
        peek::sender::owed_refunds(&db).await,
        1,
        "the refund is owed"
    );
    stack.start_billing().await;
    let (stack_ref, key_ref) = (&stack, &key);
    // The gateway may answer 503 for a moment while billing comes back.
    eventually(Duration::from_secs(30), || async move {
        match stack_ref.try_balance(key_ref).await {
            Ok(10) => Ok(()),
            other => Err(format!("the refund has not arrived: {other:?}")),
        }
    })
    .await;
    // The sender marks the refund done after billing has answered, so a moment later.
    let db_ref = &db;
    eventually(Duration::from_secs(30), || async move {
        match peek::sender::owed_refunds(db_ref).await {
            0 => Ok(()),
            n => Err(format!("{n} refunds still owed")),
        }
    })
    .await;
    assert_eq!(stack.balance(&key).await, 10, "refunded once");
    stack.shutdown().await;
}

/// A send cancelled while its charge's confirm is still owed (billing was out when it was
/// tried) is never charged: the refund waits for the confirm, and a confirm that finds the
/// charge given back makes no late charge for a send that was withdrawn.
async fn a_send_cancelled_before_its_confirm_is_settled_is_never_charged(stack: &Stack) {
    let key = stack.key(10).await;
    let body = json!({"to": ["c1@example.com", "c2@example.com"], "subject": "s", "text": "t", "scheduledAt": now() + 3600});
    let task = accepted(stack, &key, body)
        .await
        .task_id
        .expect("a task id");
    assert_eq!(stack.balance(&key).await, 8);
    // As if the confirm had met billing out: owed still, its next try later.
    let db = stack.sender_db().await;
    let owed = "UPDATE settlements SET done_at = NULL, outcome = NULL, next_at = $2
                WHERE task_id = $1 AND action = 'confirm'";
    sqlx::query(owed)
        .bind(task.as_uuid())
        .bind(now() + 3)
        .execute(&db)
        .await
        .unwrap();
    let cancelled: Success<Cancelled> = stack
        .client(&key)
        .delete(&format!("/send-email/{task}"), StatusCode::OK)
        .await;
    assert_eq!(cancelled.body.refunded, 2);
    let db_ref = &db;
    eventually(Duration::from_secs(30), || async move {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM settlements WHERE task_id = $1 AND done_at IS NULL",
        )
        .bind(task.as_uuid())
        .fetch_one(db_ref)
        .await
        .unwrap();
        (open == 0).then_some(()).ok_or(open)
    })
    .await;
    assert_eq!(
        stack.balance(&key).await,
        10,
        "the cancelled send costs nothing"
    );
}

/// `POST /send-email` with `key` and an `Idempotency-Key`; the whole answer.
async fn send_keyed(stack: &Stack, key: &str, idem: &str, body: &Value) -> Answer {
    stack
        .client(key)
        .with_header("idempotency-key", idem)
        .request(Method::POST, "/send-email", body)
        .await
}

async fn an_idempotency_key_makes_a_retried_send_answer_the_same_and_send_once(stack: &Stack) {
    let key = stack.key(10).await;
    let body = json!({"to": "once@example.com", "subject": "s", "text": "t", "variables": {"a": 1, "b": 2}});
    let first: Success<SendAnswer> = send_keyed(stack, &key, "order-2026-11-26-0001", &body)
        .await
        .expect(StatusCode::OK, "keyed send");
    let task = first.body.task_id.expect("a task");
    // The same body again, its object keys in another order: the same answer, no charge.
    let again = json!({"text": "t", "variables": {"b": 2, "a": 1}, "subject": "s", "to": "once@example.com"});
    let second: Success<SendAnswer> = send_keyed(stack, &key, "order-2026-11-26-0001", &again)
        .await
        .expect(StatusCode::OK, "repeat");
    assert_eq!(second.body.task_id, Some(task));
    assert_eq!(second.body.cost, 1);
    // Another body under the key is refused; a malformed key is a 400.
    let other = json!({"to": "other@example.com", "subject": "s", "text": "t"});
    let e: ErrorBody = send_keyed(stack, &key, "order-2026-11-26-0001", &other)
        .await
        .expect(StatusCode::CONFLICT, "reused key");
    assert!(e.error.contains("Idempotency-Key"), "{}", e.error);
    send_keyed(stack, &key, "short", &other)
        .await
        .expect::<ErrorBody>(StatusCode::BAD_REQUEST, "bad key");
    // Five at once under a new key: one task, one charge, one email.
    let racing = json!({"to": "race@example.com", "subject": "s", "text": "t"});
    let answers = futures::future::join_all(
        (0..5).map(|_| send_keyed(stack, &key, "order-2026-11-26-0002", &racing)),
    )
    .await;
    let tasks: std::collections::HashSet<_> = answers
        .iter()
        .map(|a| {
            a.expect::<Success<SendAnswer>>(StatusCode::OK, "racing")
                .body
                .task_id
        })
        .collect();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    // Another workspace's key of the same name is its own.
    let other_key = stack.key(1).await;
    let theirs: Success<SendAnswer> =
        send_keyed(stack, &other_key, "order-2026-11-26-0001", &other)
            .await
            .expect(StatusCode::OK, "other workspace");
    assert_ne!(theirs.body.task_id, Some(task));
    stack
        .wait_for_messages("once@example.com", 1, Duration::from_secs(15))
        .await;
    stack
        .wait_for_messages("race@example.com", 1, Duration::from_secs(15))
        .await;
    // A second copy would have been delivered by the time SEND has none left.
    stack.sends_done().await;
    assert_eq!(stack.messages_to("once@example.com").len(), 1);
    assert_eq!(stack.messages_to("race@example.com").len(), 1);
    assert_eq!(stack.balance(&key).await, 8, "one credit per keyed send");
}
