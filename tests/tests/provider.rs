//! `POST /provider-events/esp` with a local SNS (its own key and certificate): subscription
//! confirmation and a failing SubscribeURL, a certificate URL off the pattern (nothing
//! fetched), a bad signature, SES bounce, complaint and delivery events in both forms and
//! both signature versions, a duplicate, an unknown message, the provider secret, bad
//! payloads; and a complaint stopping the next marketing send.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_shared::{Success, TaskId};
use postmesh_tests::fake_sns::FakeSns;
use postmesh_tests::{Stack, PROVIDER_SECRET};
use sender::audience::suppressions::{Reason, SuppressionPage};
use sender::delivery::provider::Handled;
use sender::sending::events::Kind;
use sender::sending::send::SendAnswer;
use sender::sending::status::RecipientStatus;

/// Posts `body` to the provider endpoint with the right secret; status and JSON answer.
async fn post(stack: &Stack, body: &Value) -> (StatusCode, Value) {
    post_as(
        stack,
        body.to_string(),
        "text/plain; charset=UTF-8",
        Some(PROVIDER_SECRET),
        "",
    )
    .await
}

async fn post_as(
    stack: &Stack, body: String, content_type: &str, secret: Option<&str>, query: &str,
) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/provider-events/esp{query}", stack.base))
        .header("content-type", content_type)
        .body(body);
    if let Some(secret) = secret {
        req = req.header("x-service-provider-secret", secret);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Sends one message to `to` of `email_type`; its recipient once delivered.
async fn delivered(
    stack: &Stack, key: &str, to: &str, email_type: &str,
) -> (TaskId, RecipientStatus) {
    let answer: Success<SendAnswer> = stack
        .client(key)
        .post(
            "/send-email",
            &json!({"to": to, "subject": "Hi", "text": "Hello", "emailType": email_type}),
            StatusCode::OK,
        )
        .await;
    let task = answer.body.task_id.unwrap();
    let recipient = stack
        .first_recipient(key, task, |r| r.provider_message_id.is_some())
        .await;
    (task, recipient)
}

fn kinds(r: &RecipientStatus) -> Vec<Kind> {
    r.events.iter().map(|e| e.kind).collect()
}

/// An SES event of the event-publishing form.
fn ses_event(kind: &str, ses_id: &str, to: &str, part: Value) -> Value {
    let mut event = json!({
        "eventType": kind,
        "mail": {"timestamp": "2026-11-25T07:00:00.000Z", "messageId": ses_id,
                 "source": "hello@postmesh.localhost", "destination": [to]},
    });
    let name = match kind {
        "DeliveryDelay" => "deliveryDelay".to_owned(),
        other => other.to_lowercase(),
    };
    event[name] = part;
    event
}

/// SNS subscriptions and SES events, each with a fake SNS of its own, on one stack.
#[tokio::test]
async fn provider_notifications_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            subscriptions_are_confirmed_and_only_signed_sns_messages_are_taken,
            ses_events_become_delivery_events_and_suppressions
        ]
    );
}

async fn subscriptions_are_confirmed_and_only_signed_sns_messages_are_taken(stack: &Stack) {
    let sns = FakeSns::start().await;
    let (status, body) = post(stack, &sns.confirmation("tok-1")).await;
    assert_eq!(
        (status, body["confirmed"].clone()),
        (StatusCode::OK, json!(true))
    );
    assert_eq!(sns.confirmed(), ["tok-1"]);

    sns.set_failing(true);
    let (status, _) = post(stack, &sns.confirmation("tok-2")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    sns.set_failing(false);

    // A certificate off the pattern: refused before anything is fetched.
    let elsewhere = FakeSns::start().await;
    let mut env = elsewhere.confirmation("tok-3");
    env["SigningCertURL"] = json!(elsewhere.cert_url().replace("127.0.0.1", "localhost"));
    elsewhere.sign(&mut env);
    let (status, body) = post(stack, &env).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        elsewhere.requests().is_empty(),
        "{:?}",
        elsewhere.requests()
    );
    // A SubscribeURL off the pattern too.
    let mut env = sns.confirmation("tok-4");
    env["SubscribeURL"] = json!("https://attacker.example/confirm");
    sns.sign(&mut env);
    let (status, _) = post(stack, &env).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(!sns.confirmed().contains(&"tok-4".to_owned()));

    // A bad signature: a Message changed after signing, a signature of another key.
    let mut env = sns.notification("m-1", &json!({"notificationType": "Delivery"}), 2);
    env["Message"] = json!("{\"notificationType\": \"Bounce\"}");
    let (status, body) = post(stack, &env).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("signature"));
    let mut env = sns.notification("m-2", &json!({"notificationType": "Delivery"}), 2);
    env["Signature"] = json!(base64_of(&[7u8; 256]));
    assert_eq!(post(stack, &env).await.0, StatusCode::BAD_REQUEST);
    // Another topic.
    let mut env = sns.notification("m-3", &json!({"notificationType": "Delivery"}), 2);
    env["TopicArn"] = json!("arn:aws:sns:eu-west-1:123456789012:other");
    sns.sign(&mut env);
    assert_eq!(post(stack, &env).await.0, StatusCode::BAD_REQUEST);

    // The provider secret: wrong → 401, in the query → 401 (access logs keep queries; only
    // PROVIDER_SECRET_IN_QUERY=1 takes it), in the header → taken; bad payloads → 400.
    let good = sns.confirmation("tok-5").to_string();
    let (status, _) = post_as(stack, good.clone(), "text/plain", Some("wrong"), "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = post_as(stack, good.clone(), "text/plain", None, "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let query = format!("?token={PROVIDER_SECRET}");
    let (status, body) = post_as(stack, good.clone(), "application/json", None, &query).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let secret = Some(PROVIDER_SECRET);
    let (status, body) = post_as(stack, good, "application/json", secret, "").await;
    assert_eq!(
        (status, body["confirmed"].clone()),
        (StatusCode::OK, json!(true))
    );
    for bad in ["not json", "{\"Type\": \"Notification\"}", "[]"] {
        let (status, _) = post_as(stack, bad.into(), "text/plain", Some(PROVIDER_SECRET), "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn ses_events_become_delivery_events_and_suppressions(stack: &Stack) {
    let sns = FakeSns::start().await;
    let key = stack.key(100).await;

    // A permanent bounce (event-publishing form, SignatureVersion 1).
    let (task, r) = delivered(stack, &key, "gone@example.com", "transactional").await;
    let ses_id = r.provider_message_id.clone().unwrap();
    let bounce = ses_event(
        "Bounce",
        &ses_id,
        "gone@example.com",
        json!({"bounceType": "Permanent", "bounceSubType": "General",
               "bouncedRecipients": [{"emailAddress": "gone@example.com", "diagnosticCode": "550 5.1.1"}]}),
    );
    let (status, body) = post(stack, &sns.notification("sns-1", &bounce, 1)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let handled: Handled = serde_json::from_value(body).unwrap();
    assert_eq!((handled.matched, handled.duplicates), (1, 0));
    // Again: a duplicate, nothing new.
    let (_, body) = post(stack, &sns.notification("sns-1", &bounce, 1)).await;
    assert_eq!(
        (body["matched"].clone(), body["duplicates"].clone()),
        (json!(1), json!(1))
    );
    let r = stack
        .first_recipient(&key, task, |r| r.events.len() >= 2)
        .await;
    assert_eq!(kinds(&r), [Kind::Sent, Kind::Bounced]);
    assert_eq!(r.events[1].detail["bounceType"], "Permanent");
    assert_eq!(r.events[1].detail["reason"], "550 5.1.1");

    // A transient bounce: an event, no suppression. A delivery (notification form).
    let (task, r) = delivered(stack, &key, "busy@example.com", "transactional").await;
    let ses_id = r.provider_message_id.clone().unwrap();
    let soft = ses_event(
        "Bounce",
        &ses_id,
        "busy@example.com",
        json!({"bounceType": "Transient", "bouncedRecipients": [{"emailAddress": "busy@example.com"}]}),
    );
    assert_eq!(
        post(stack, &sns.notification("sns-2", &soft, 2)).await.0,
        StatusCode::OK
    );
    let delivery = json!({"notificationType": "Delivery",
        "mail": {"messageId": ses_id, "destination": ["busy@example.com"]},
        "delivery": {"recipients": ["busy@example.com"], "smtpResponse": "250 ok"}});
    let (_, body) = post(stack, &sns.notification("sns-3", &delivery, 2)).await;
    assert_eq!(body["matched"], 1, "{body}");
    let delay = ses_event(
        "DeliveryDelay",
        &ses_id,
        "busy@example.com",
        json!({"delayType": "MailboxFull", "delayedRecipients": [{"emailAddress": "busy@example.com"}]}),
    );
    assert_eq!(
        post(stack, &sns.notification("sns-7", &delay, 2)).await.0,
        StatusCode::OK
    );
    let reject = ses_event(
        "Reject",
        &ses_id,
        "busy@example.com",
        json!({"reason": "Bad content"}),
    );
    assert_eq!(
        post(stack, &sns.notification("sns-8", &reject, 2)).await.0,
        StatusCode::OK
    );
    let r = stack
        .first_recipient(&key, task, |r| r.events.len() >= 5)
        .await;
    assert_eq!(
        kinds(&r),
        [
            Kind::Sent,
            Kind::Bounced,
            Kind::Delivered,
            Kind::Delayed,
            Kind::Rejected
        ]
    );

    // A bounce of a copy suppresses the address that bounced, not the recipient.
    let copied: Success<SendAnswer> = stack
        .client(&key)
        .post(
            "/send-email",
            &json!({"to": "main@example.com", "cc": "copy@example.com", "subject": "Hi",
                    "text": "Hello"}),
            StatusCode::OK,
        )
        .await;
    let r = stack
        .first_recipient(&key, copied.body.task_id.unwrap(), |r| {
            r.provider_message_id.is_some()
        })
        .await;
    let copy_bounce = ses_event(
        "Bounce",
        r.provider_message_id.as_deref().unwrap(),
        "copy@example.com",
        json!({"bounceType": "Permanent",
               "bouncedRecipients": [{"emailAddress": "copy@example.com"}]}),
    );
    assert_eq!(
        post(stack, &sns.notification("sns-10", &copy_bounce, 2))
            .await
            .0,
        StatusCode::OK
    );
    let page: Success<SuppressionPage> = stack
        .client(&key)
        .get("/suppressions?email=copy@example.com", StatusCode::OK)
        .await;
    assert_eq!(page.body.suppressions.len(), 1);
    let page: Success<SuppressionPage> = stack
        .client(&key)
        .get("/suppressions?email=main@example.com", StatusCode::OK)
        .await;
    assert!(
        page.body.suppressions.is_empty(),
        "the recipient is not suppressed"
    );
    // The copy's bounce is the send's event, not the recipient's message's.
    let main = stack
        .first_recipient(&key, copied.body.task_id.unwrap(), |_| true)
        .await;
    assert!(!kinds(&main).contains(&Kind::Bounced), "{:?}", kinds(&main));

    // A recipient saying the message is not spam makes no complaint and no suppression.
    let (_, r) = delivered(stack, &key, "fan@example.com", "marketing").await;
    let not_spam = ses_event(
        "Complaint",
        r.provider_message_id.as_deref().unwrap(),
        "fan@example.com",
        json!({"complainedRecipients": [{"emailAddress": "fan@example.com"}], "complaintFeedbackType": "not-spam"}),
    );
    let (status, body) = post(stack, &sns.notification("sns-12", &not_spam, 2)).await;
    assert_eq!(
        (status, body["matched"].clone()),
        (StatusCode::OK, json!(1))
    );
    assert!(stack.suppressions(&key, "fan@example.com").await.is_empty());

    // A sign-in code's message belongs to no workspace: its events are taken and ignored,
    // not asked for again.
    let mut user = postmesh_tests::web::WebUser::new(&stack.base, "code@example.com");
    let asked = user
        .json(
            Method::POST,
            "/login/code",
            &json!({"email": "code@example.com"}),
        )
        .await;
    let _: Value = asked.expect(StatusCode::OK, "login code");
    let db = stack.sender_db().await;
    let code_id = postmesh_tests::eventually(std::time::Duration::from_secs(20), || async {
        postmesh_tests::peek::sender::provider_id_to(&db, "code@example.com")
            .await
            .ok_or("not sent yet")
    })
    .await;
    let mut code_delivered = ses_event("Delivery", &code_id, "code@example.com", json!({}));
    code_delivered["mail"]["timestamp"] =
        json!(webhook_dispatcher::delivery::worker::now_rfc3339());
    let (status, body) = post(stack, &sns.notification("sns-13", &code_delivered, 2)).await;
    assert_eq!(
        (status, body["ignored"].clone(), body["matched"].clone()),
        (StatusCode::OK, json!(true), json!(1))
    );

    // A complaint stops the next marketing send to that address.
    let (_, r) = delivered(stack, &key, "angry@example.com", "marketing").await;
    let complaint = ses_event(
        "Complaint",
        r.provider_message_id.as_deref().unwrap(),
        "angry@example.com",
        json!({"complainedRecipients": [{"emailAddress": "angry@example.com"}], "complaintFeedbackType": "abuse"}),
    );
    assert_eq!(
        post(stack, &sns.notification("sns-4", &complaint, 2))
            .await
            .0,
        StatusCode::OK
    );
    let next: Success<SendAnswer> = stack
        .client(&key)
        .post(
            "/send-email",
            &json!({"to": ["angry@example.com", "gone@example.com", "busy@example.com"],
                    "subject": "Sale", "text": "Buy", "emailType": "marketing"}),
            StatusCode::OK,
        )
        .await;
    let mut rejected: Vec<_> = next
        .body
        .recipients
        .rejected
        .iter()
        .map(|r| (r.email.as_str(), r.reason.as_str()))
        .collect();
    rejected.sort();
    assert_eq!(
        rejected,
        [
            ("angry@example.com", "suppressed:complaint"),
            ("gone@example.com", "suppressed:bounce"),
        ]
    );
    let page: Success<SuppressionPage> = stack
        .client(&key)
        .get("/suppressions", StatusCode::OK)
        .await;
    let mut reasons: Vec<Reason> = page.body.suppressions.iter().map(|s| s.reason).collect();
    reasons.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(reasons, [Reason::Bounce, Reason::Bounce, Reason::Complaint]);

    // A Subscription event (SES list management): the opted-out topic is unsubscribed.
    let (task, r) = delivered(stack, &key, "reader@example.com", "marketing").await;
    let subscription = ses_event(
        "Subscription",
        r.provider_message_id.as_deref().unwrap(),
        "reader@example.com",
        json!({"contactList": "main", "newTopicPreferences": {"unsubscribeAll": false,
               "topicSubscriptionStatus": [{"topicName": "news", "subscriptionStatus": "OptOut"},
                                           {"topicName": "tips", "subscriptionStatus": "OptIn"}]}}),
    );
    assert_eq!(
        post(stack, &sns.notification("sns-9", &subscription, 2))
            .await
            .0,
        StatusCode::OK
    );
    let r = stack
        .first_recipient(&key, task, |r| r.events.len() >= 2)
        .await;
    assert_eq!(kinds(&r), [Kind::Sent, Kind::Unsubscribed]);
    let entries = stack.suppressions(&key, "reader@example.com").await;
    assert_eq!(entries, [(Reason::Unsubscribed, Some("news".to_owned()))]);

    // An unknown message, and an event we do not act on.
    let unknown = ses_event("Delivery", "no-such-id", "x@example.com", json!({}));
    let (status, body) = post(stack, &sns.notification("sns-5", &unknown, 2)).await;
    assert_eq!(
        (status, body["ignored"].clone()),
        (StatusCode::OK, json!(true))
    );
    assert_eq!(body["matched"], 0);
    // One SES accepted moments ago may overtake the worker's record of its id: SNS is
    // asked to deliver it again (503), and nothing is kept of it, so the delivery again
    // (same SNS message id) counts once the id is known.
    let mut early = ses_event("Delivery", "not-yet-known", "x@example.com", json!({}));
    early["mail"]["timestamp"] = json!(webhook_dispatcher::delivery::worker::now_rfc3339());
    let (status, body) = post(stack, &sns.notification("sns-11", &early, 2)).await;
    assert_eq!(
        (status, body["success"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!(false))
    );
    early["mail"]["messageId"] = json!(r.provider_message_id.as_deref().unwrap());
    let (status, body) = post(stack, &sns.notification("sns-11", &early, 2)).await;
    assert_eq!(
        (status, body["matched"].clone(), body["duplicates"].clone()),
        (StatusCode::OK, json!(1), json!(0))
    );
    let opened = ses_event(
        "Open",
        r.provider_message_id.as_deref().unwrap(),
        "angry@example.com",
        json!({}),
    );
    let (_, body) = post(stack, &sns.notification("sns-6", &opened, 2)).await;
    assert_eq!(
        (body["matched"].clone(), body["ignored"].clone()),
        (json!(1), json!(true))
    );
}
