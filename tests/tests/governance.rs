//! Who a send may reach: each suppression rule against each email type, a contact's topic
//! unsubscription, frequency caps and topic exclusions (two concurrent sends against a cap
//! of 1 included), filtered recipients neither charged nor sent and listed with their
//! reason, in a dry run too; cc and bcc addresses filtered by the same suppressions; a
//! scheduled send checked again at its release; and the suppression list's routes.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_shared::error::ErrorBody;
use postmesh_shared::Success;
use postmesh_tests::Stack;
use sender::audience::contacts::Upserted;
use sender::audience::suppressions::{Added, Reason, Removed, SuppressionPage};
use sender::sending::send::SendAnswer;
use sender::sending::status::{Progress, TaskProgress};

/// Seconds ahead a scheduled send is due in these scenarios: time for its sends and the
/// unsubscribes meant to come before its release, on a stack busy with every other scenario.
const RELEASE_AFTER: i64 = 5;

/// A send of `email_type` (and `topic`) to `to`, with `extra` fields.
fn mail(to: &[&str], email_type: &str, topic: Option<&str>, extra: Value) -> Value {
    let mut body = json!({"to": to, "subject": "Hello", "text": "Hi", "emailType": email_type});
    if let Some(topic) = topic {
        body["topic"] = json!(topic);
    }
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    body
}

/// Sends `body`; the answer.
async fn send(stack: &Stack, key: &str, body: &Value) -> SendAnswer {
    stack.sent(key, body).await
}

/// Suppresses `email` by hand (`POST /suppressions`, reason `manual`).
async fn suppress(stack: &Stack, key: &str, email: &str) -> Added {
    let body = json!({"email": email, "reason": "manual"});
    let added: Success<Added> = stack
        .client(key)
        .post("/suppressions", &body, StatusCode::OK)
        .await;
    added.body
}

/// The rejected recipients of an answer as (email, reason), sorted.
fn rejected(answer: &SendAnswer) -> Vec<(String, String)> {
    let mut list: Vec<_> = answer
        .recipients
        .rejected
        .iter()
        .map(|r| (r.email.clone(), r.reason.clone()))
        .collect();
    list.sort();
    list
}

/// Unsubscribes `addresses` of `workspace` from the topic `news`, straight in the sender's
/// database (as a one-click unsubscribe would).
async fn unsubscribe_from_news(db: &sqlx::PgPool, workspace: uuid::Uuid, addresses: &[&str]) {
    for address in addresses {
        let email = postmesh_shared::EmailAddress::parse(address).unwrap();
        sender::audience::suppressions::add(
            db,
            workspace.into(),
            &email,
            Reason::Unsubscribed,
            Some("news"),
        )
        .await
        .unwrap();
    }
}

/// The progress of `task` once it is `sent` (within 30 s).
async fn sent_task(stack: &Stack, key: &str, task: impl std::fmt::Display) -> TaskProgress {
    let client = stack.client(key);
    postmesh_tests::eventually(Duration::from_secs(30), || async {
        let p: Success<TaskProgress> = client
            .get(&format!("/email-status/{task}"), StatusCode::OK)
            .await;
        if p.body.status == Progress::Sent {
            Ok(p.body)
        } else {
            Err(p.body.status)
        }
    })
    .await
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(e, r)| (e.to_string(), r.to_string()))
        .collect()
}

/// Suppressions, caps and exclusions of one key each, to recipients of their own, side by side on one stack.
#[tokio::test]
async fn governance_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            each_suppression_rule_blocks_what_it_says_and_filtered_recipients_cost_nothing,
            caps_and_topic_exclusions_hold_even_for_concurrent_sends,
            the_suppression_list_is_listed_added_to_and_removed_from,
            a_scheduled_send_leaves_off_who_unsubscribed_before_its_release,
            a_part_refund_comes_from_the_charge_that_stands,
            a_scheduled_send_leaves_off_copies_suppressed_before_its_release_and_refunds_them,
            a_recipient_left_off_beside_a_sandbox_address_is_given_back
        ]
    );
}

async fn each_suppression_rule_blocks_what_it_says_and_filtered_recipients_cost_nothing(
    stack: &Stack,
) {
    let key = stack.key(100).await;
    let db = stack.service_db(sender::SERVICE).await;
    let workspace = stack.workspace_of(&key).await;
    let add = |email: &str, reason: Reason, topic: Option<&str>| {
        let (db, email, topic) = (db.clone(), email.to_owned(), topic.map(str::to_owned));
        async move {
            let email = postmesh_shared::EmailAddress::parse(&email).unwrap();
            sender::audience::suppressions::add(
                &db,
                workspace.into(),
                &email,
                reason,
                topic.as_deref(),
            )
            .await
            .unwrap();
        }
    };
    add("bounced@example.com", Reason::Bounce, None).await;
    add("complained@example.com", Reason::Complaint, None).await;
    add("unsub-all@example.com", Reason::Unsubscribed, None).await;
    add("unsub-news@example.com", Reason::Unsubscribed, Some("news")).await;
    // A manual entry through the API: every email type.
    let added = suppress(stack, &key, "Blocked@Example.com").await;
    assert_eq!(added.suppression.reason, Reason::Manual);
    // A contact unsubscribed from the topic.
    let _: Success<Upserted> = stack
        .client(&key)
        .post(
            "/contacts",
            &json!({"email": "contact-off@example.com", "topics": {"news": "unsubscribed"}}),
            StatusCode::CREATED,
        )
        .await;
    let everyone = [
        "bounced@example.com",
        "complained@example.com",
        "unsub-all@example.com",
        "unsub-news@example.com",
        "blocked@example.com",
        "contact-off@example.com",
        "fine@example.com",
    ];
    let hard = [
        ("blocked@example.com", "suppressed:manual"),
        ("bounced@example.com", "suppressed:bounce"),
        ("complained@example.com", "suppressed:complaint"),
    ];
    let balance = stack.balance(&key).await;

    // Transactional mail ignores unsubscribes, never bounces, complaints or manual blocks.
    let answer = send(
        stack,
        &key,
        &mail(&everyone, "transactional", Some("news"), json!({})),
    )
    .await;
    assert_eq!(rejected(&answer), pairs(&hard));
    assert_eq!((answer.recipients.accepted, answer.cost), (4, 4));
    // Marketing of the topic: the topic's and the topicless unsubscribes too.
    for kind in ["marketing", "lifecycle"] {
        let answer = send(stack, &key, &mail(&everyone, kind, Some("news"), json!({}))).await;
        let mut want = hard.to_vec();
        want.extend([
            ("contact-off@example.com", "unsubscribed:news"),
            ("unsub-all@example.com", "unsubscribed"),
            ("unsub-news@example.com", "unsubscribed:news"),
        ]);
        want.sort();
        assert_eq!(rejected(&answer), pairs(&want), "{kind}");
        assert_eq!((answer.recipients.accepted, answer.cost), (1, 1), "{kind}");
    }
    // Marketing of another topic: the news unsubscribes do not apply.
    let answer = send(
        stack,
        &key,
        &mail(&everyone, "marketing", Some("tips"), json!({})),
    )
    .await;
    let mut want = hard.to_vec();
    want.push(("unsub-all@example.com", "unsubscribed"));
    want.sort();
    assert_eq!(rejected(&answer), pairs(&want));
    assert_eq!(answer.cost, 3);
    // A dry run answers the same and charges nothing.
    let dry = send(
        stack,
        &key,
        &mail(
            &everyone,
            "marketing",
            Some("tips"),
            json!({"dryRun": true}),
        ),
    )
    .await;
    assert_eq!(rejected(&dry), rejected(&answer));
    assert_eq!((dry.cost, dry.task_id), (3, None));
    assert_eq!(stack.balance(&key).await, balance - 4 - 1 - 1 - 3);

    // The task's status lists them with their reasons.
    let task = answer.task_id.expect("a task");
    let progress: Success<TaskProgress> = stack
        .client(&key)
        .get(&format!("/email-status/{task}"), StatusCode::OK)
        .await;
    let mut listed: Vec<_> = progress
        .body
        .rejected
        .iter()
        .map(|r| (r.email.clone(), r.reason.clone()))
        .collect();
    listed.sort();
    assert_eq!(listed, rejected(&answer));
    assert_eq!(progress.body.total, 3);

    // Every recipient filtered out: stored for its status, nothing charged.
    let none = send(
        stack,
        &key,
        &mail(&["bounced@example.com"], "transactional", None, json!({})),
    )
    .await;
    assert_eq!((none.recipients.accepted, none.cost), (0, 0));
    assert!(none.task_id.is_some());
    assert_eq!(stack.balance(&key).await, balance - 9);

    // Copies obey the same rules: a suppressed cc or bcc address is left off the message,
    // rejected with its reason, and not charged.
    let copies = json!({
        "cc": ["bounced@example.com", "cc-fine@example.com"],
        "bcc": ["bcc-fine@example.com"],
    });
    let copied = send(
        stack,
        &key,
        &mail(
            &["copied@example.com"],
            "transactional",
            None,
            copies.clone(),
        ),
    )
    .await;
    assert_eq!(
        rejected(&copied),
        pairs(&[("bounced@example.com", "suppressed:bounce")])
    );
    assert_eq!((copied.recipients.accepted, copied.cost), (1, 3));
    // Mail with an unsubscribe link takes no copies: each would carry the recipient's link.
    let marketing = mail(&["copied@example.com"], "marketing", Some("news"), copies);
    let refused: ErrorBody = stack
        .client(&key)
        .post("/send-email", &marketing, StatusCode::BAD_REQUEST)
        .await;
    assert!(
        refused.error.contains("only with transactional"),
        "{refused:?}"
    );
    assert_eq!(stack.balance(&key).await, balance - 12);
    let cc = cc_of(stack, "copied@example.com").await;
    assert!(
        cc.contains("cc-fine@example.com") && !cc.contains("bounced"),
        "{cc}"
    );

    // One key for an address everywhere, whatever the database's locale: a Greek capital
    // sigma lowers to a final sigma at the end of a word (Postgres' lower() says σ).
    suppress(stack, &key, "ΟΔΟΣ@example.com").await;
    let greek = send(
        stack,
        &key,
        &mail(&["ΟΔΟΣ@example.com"], "transactional", None, json!({})),
    )
    .await;
    assert_eq!(
        rejected(&greek),
        pairs(&[("ΟΔΟΣ@example.com", "suppressed:manual")])
    );
}

async fn caps_and_topic_exclusions_hold_even_for_concurrent_sends(stack: &Stack) {
    let key = stack.key(100).await;
    let capped = |to: &[&str]| {
        mail(
            to,
            "marketing",
            None,
            json!({"frequencyCapDays": 7, "frequencyCapMax": 2}),
        )
    };
    let first = send(stack, &key, &capped(&["ann@example.com"])).await;
    assert_eq!(first.recipients.accepted, 1);
    // A lifecycle send does not count against the marketing cap.
    send(
        stack,
        &key,
        &mail(&["ann@example.com"], "lifecycle", None, json!({})),
    )
    .await;
    let second = send(
        stack,
        &key,
        &capped(&["ann@example.com", "bob@example.com"]),
    )
    .await;
    assert_eq!(
        second.recipients.accepted, 2,
        "two sends in 7 days: at the cap"
    );
    let third = send(
        stack,
        &key,
        &capped(&["ann@example.com", "bob@example.com"]),
    )
    .await;
    assert_eq!(
        rejected(&third),
        pairs(&[("ann@example.com", "frequency_cap")])
    );
    assert_eq!(third.cost, 1);

    // Topic exclusion: no mail of the topic within the days.
    let news = |extra: Value| mail(&["cat@example.com"], "marketing", Some("news"), extra);
    send(stack, &key, &news(json!({}))).await;
    let again = send(stack, &key, &news(json!({"topicExclusionDays": 3}))).await;
    assert_eq!(
        rejected(&again),
        pairs(&[("cat@example.com", "topic_exclusion")])
    );
    let other = send(
        stack,
        &key,
        &mail(
            &["cat@example.com"],
            "marketing",
            Some("tips"),
            json!({"topicExclusionDays": 3}),
        ),
    )
    .await;
    assert_eq!(other.recipients.accepted, 1, "another topic");

    // Ten sends at once against a cap of 1: exactly one passes.
    let once = mail(
        &["dan@example.com"],
        "marketing",
        None,
        json!({"frequencyCapDays": 1, "frequencyCapMax": 1}),
    );
    let sends = (0..10).map(|_| send(stack, &key, &once));
    let answers = futures::future::join_all(sends).await;
    let passed = answers
        .iter()
        .filter(|a| a.recipients.accepted == 1)
        .count();
    assert_eq!(passed, 1, "one of ten concurrent sends passes a cap of 1");
    assert!(answers
        .iter()
        .filter(|a| a.recipients.accepted == 0)
        .all(|a| rejected(a) == pairs(&[("dan@example.com", "frequency_cap")])));

    let bad: ErrorBody = stack
        .client(&key)
        .post(
            "/send-email",
            &mail(
                &["x@example.com"],
                "marketing",
                None,
                json!({"frequencyCapDays": 1}),
            ),
            StatusCode::BAD_REQUEST,
        )
        .await;
    assert!(bad.error.contains("frequencyCapMax"), "{}", bad.error);
}

async fn the_suppression_list_is_listed_added_to_and_removed_from(stack: &Stack) {
    let (key, other) = (stack.key(0).await, stack.key(0).await);
    let client = stack.client(&key);
    for body in [
        json!({"email": "a@example.com"}),
        json!({"email": "a@example.com", "topic": "news"}),
        json!({"email": "b@example.com", "reason": "manual"}),
        // Again: nothing changes.
        json!({"email": "B@example.com"}),
    ] {
        let _: Success<Added> = client.post("/suppressions", &body, StatusCode::OK).await;
    }
    for body in [
        json!({"email": "c@example.com", "reason": "bounce"}),
        json!({"email": "not an address"}),
        json!({"email": "c@example.com", "topic": ""}),
    ] {
        let _: ErrorBody = client
            .post("/suppressions", &body, StatusCode::BAD_REQUEST)
            .await;
    }
    let page: Success<SuppressionPage> = client.get("/suppressions", StatusCode::OK).await;
    assert_eq!(page.body.suppressions.len(), 3);
    let a: Success<SuppressionPage> = client
        .get("/suppressions?email=A@example.com", StatusCode::OK)
        .await;
    let mut topics: Vec<_> = a
        .body
        .suppressions
        .iter()
        .map(|s| s.topic.clone())
        .collect();
    topics.sort();
    assert_eq!(topics, [None, Some("news".to_owned())]);
    let theirs: Success<SuppressionPage> = stack
        .client(&other)
        .get("/suppressions", StatusCode::OK)
        .await;
    assert!(theirs.body.suppressions.is_empty());

    let removed: Success<Removed> = client
        .delete("/suppressions/a@example.com?topic=news", StatusCode::OK)
        .await;
    assert_eq!(removed.body.removed, 1);
    let removed: Success<Removed> = client
        .delete("/suppressions/A@example.com", StatusCode::OK)
        .await;
    assert_eq!(removed.body.removed, 1);
    let _: ErrorBody = client
        .delete("/suppressions/a@example.com", StatusCode::NOT_FOUND)
        .await;
    let page: Success<SuppressionPage> = client.get("/suppressions", StatusCode::OK).await;
    assert_eq!(page.body.suppressions.len(), 1);
}

async fn a_scheduled_send_leaves_off_who_unsubscribed_before_its_release(stack: &Stack) {
    let key = stack.key(10).await;
    let db = stack.service_db(sender::SERVICE).await;
    let workspace = stack.workspace_of(&key).await;
    let at = postmesh_shared::db::now_unix() + RELEASE_AFTER;
    let later = json!({ "scheduledAt": at });
    let both = ["stay@example.com", "leave@example.com"];
    let first = send(
        stack,
        &key,
        &mail(&both, "marketing", Some("news"), later.clone()),
    )
    .await;
    let alone = ["gone@example.com"];
    let second = send(stack, &key, &mail(&alone, "marketing", Some("news"), later)).await;
    assert_eq!(stack.balance(&key).await, 7);
    // Both unsubscribe after the sends were accepted, before their release.
    unsubscribe_from_news(&db, workspace, &["Leave@example.com", "gone@example.com"]).await;
    let first = sent_task(stack, &key, first.task_id.unwrap()).await;
    assert!(postmesh_shared::db::now_unix() >= at, "released early");
    let sent: Vec<&str> = first.recipients.iter().map(|r| r.email.as_str()).collect();
    assert_eq!(
        (first.total, first.sent, sent),
        (1, 1, vec!["stay@example.com"])
    );
    let left_off: Vec<(&str, &str)> = first
        .rejected
        .iter()
        .map(|r| (r.email.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(left_off, [("leave@example.com", "unsubscribed:news")]);
    let second = sent_task(stack, &key, second.task_id.unwrap()).await;
    assert_eq!((second.total, second.rejected.len()), (0, 1));
    assert_eq!(stack.messages_to("stay@example.com").len(), 1);
    assert!(stack.messages_to("leave@example.com").is_empty());
    assert!(stack.messages_to("gone@example.com").is_empty());
    // Each left-off message is a `rejected` event with its reason.
    let events: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT email, kind, detail->>'reason' FROM delivery_events
         WHERE email IN ('leave@example.com', 'gone@example.com') ORDER BY email",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    let reason = Some("unsubscribed:news".to_owned());
    assert_eq!(
        events,
        [
            ("gone@example.com".into(), "rejected".into(), reason.clone()),
            ("leave@example.com".into(), "rejected".into(), reason),
        ]
    );
    // The send left with no recipient is refunded whole, the other for the recipient it
    // left off: 10 - 2 - 1 + 1 + 1.
    postmesh_tests::eventually(Duration::from_secs(10), || async {
        match stack.balance(&key).await {
            9 => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert_eq!(stack.settled_balance(&key).await, 9);
}

/// A scheduled send to a paying address and a sandbox one (free) costs 1; the paying one
/// left off at its release is given back, since what is kept costs nothing.
async fn a_recipient_left_off_beside_a_sandbox_address_is_given_back(stack: &Stack) {
    let key = stack.key(10).await;
    let db = stack.service_db(sender::SERVICE).await;
    let workspace = stack.workspace_of(&key).await;
    let at = postmesh_shared::db::now_unix() + RELEASE_AFTER;
    let to = ["pays@example.com", "delivered@sandbox.postmesh.test"];
    let later = json!({ "scheduledAt": at });
    let answer = send(stack, &key, &mail(&to, "marketing", Some("news"), later)).await;
    assert_eq!(answer.cost, 1);
    assert_eq!(stack.balance(&key).await, 9);
    unsubscribe_from_news(&db, workspace, &["pays@example.com"]).await;
    let released = sent_task(stack, &key, answer.task_id.unwrap()).await;
    assert_eq!(released.rejected.len(), 1, "{released:?}");
    postmesh_tests::eventually(Duration::from_secs(20), || async {
        match stack.balance(&key).await {
            10 => Ok(()),
            other => Err(other),
        }
    })
    .await;
}

async fn a_part_refund_comes_from_the_charge_that_stands(stack: &Stack) {
    use postmesh_shared::proto::{ChargeReply, ChargeRequest, RefundReply, RefundRequest};

    let key = stack.key(10).await;
    let key_id = stack.key_id(&key).await.to_string();
    let db = stack.service_db(sender::SERVICE).await;
    let workspace = stack.workspace_of(&key).await;
    let at = postmesh_shared::db::now_unix() + RELEASE_AFTER;
    let both = ["stays@example.com", "leaves@example.com"];
    let later = json!({ "scheduledAt": at });
    let answer = send(stack, &key, &mail(&both, "marketing", Some("news"), later)).await;
    let task = answer.task_id.unwrap();
    // As if billing had been out past the hold: the sweep gave the send's charge back, and
    // the sender's confirm charged it again under `{task}:late`.
    let refunded: RefundReply = stack
        .rpc(&RefundRequest {
            api_key_id: key_id.clone(),
            charge_idempotency_key: task.to_string(),
            reason: "hold ran out".into(),
            credits: 0,
        })
        .await
        .unwrap();
    assert!(refunded.refunded);
    let _: ChargeReply = stack
        .rpc(&ChargeRequest {
            api_key_id: key_id.clone(),
            caller_email: "t@example.com".into(),
            cost: 2,
            idempotency_key: format!("{task}:late"),
            ..Default::default()
        })
        .await
        .unwrap();
    sqlx::query(
        "UPDATE settlements SET outcome = 'charged after the hold ran out'
         WHERE task_id = $1 AND action = 'confirm'",
    )
    .bind(task.as_uuid())
    .execute(&db)
    .await
    .unwrap();
    assert_eq!(stack.balance(&key).await, 8);
    unsubscribe_from_news(&db, workspace, &["leaves@example.com"]).await;
    // The recipient left off at the release is given back from the late charge.
    postmesh_tests::eventually(Duration::from_secs(20), || async {
        match stack.balance(&key).await {
            9 => Ok(()),
            other => Err(other),
        }
    })
    .await;
    // Recorded by the sender once billing answered.
    postmesh_tests::eventually(Duration::from_secs(10), || async {
        let (outcome,): (Option<String>,) = sqlx::query_as(
            "SELECT outcome FROM settlements WHERE task_id = $1 AND action = 'refund_part'",
        )
        .bind(task.as_uuid())
        .fetch_one(&db)
        .await
        .unwrap();
        match outcome.as_deref() {
            Some("refunded") => Ok(()),
            _ => Err(outcome),
        }
    })
    .await;
    assert_eq!(stack.balance(&key).await, 9);
}

async fn a_scheduled_send_leaves_off_copies_suppressed_before_its_release_and_refunds_them(
    stack: &Stack,
) {
    let key = stack.key(10).await;
    let db = stack.service_db(sender::SERVICE).await;
    let at = postmesh_shared::db::now_unix() + RELEASE_AFTER;
    let extra = json!({
        "scheduledAt": at,
        "cc": ["cc-stays@example.com", "cc-leaves@example.com"],
        "bcc": ["bcc-leaves@example.com"],
    });
    let to = ["one@example.com", "two@example.com"];
    let answer = send(stack, &key, &mail(&to, "transactional", None, extra)).await;
    // Each recipient's message and its three copies.
    assert_eq!(answer.cost, 8);
    assert_eq!(stack.balance(&key).await, 2);
    for copy in ["cc-leaves@example.com", "BCC-leaves@example.com"] {
        suppress(stack, &key, copy).await;
    }
    let task = answer.task_id.unwrap();
    let progress = sent_task(stack, &key, task).await;
    assert_eq!((progress.total, progress.sent), (2, 2));
    let mut left_off: Vec<(&str, &str)> = progress
        .rejected
        .iter()
        .map(|r| (r.email.as_str(), r.reason.as_str()))
        .collect();
    left_off.sort();
    assert_eq!(
        left_off,
        [
            ("bcc-leaves@example.com", "suppressed:manual"),
            ("cc-leaves@example.com", "suppressed:manual"),
        ]
    );
    for recipient in to {
        let cc = cc_of(stack, recipient).await;
        assert!(
            cc.contains("cc-stays@example.com") && !cc.contains("cc-leaves"),
            "{cc}"
        );
    }
    let (bcc,): (Value,) = sqlx::query_as("SELECT message->'bcc' FROM tasks WHERE id = $1")
        .bind(task.as_uuid())
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(bcc, json!([]));
    // The two copies left off each message come back: 10 - 2 × (1 + 1).
    postmesh_tests::eventually(Duration::from_secs(10), || async {
        match stack.balance(&key).await {
            6 => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert_eq!(stack.settled_balance(&key).await, 6);
}

/// The `Cc:` header line of the first email delivered to `to` (waited for).
async fn cc_of(stack: &Stack, to: &str) -> String {
    let sent = stack
        .wait_for_messages(to, 1, Duration::from_secs(15))
        .await;
    let cc = sent[0].lines().find(|l| l.starts_with("Cc:"));
    cc.expect("a Cc header").to_owned()
}
