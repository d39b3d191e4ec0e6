//! Test keys (`pm_test_…`): everything a test key does is validated, priced, stored and shown,
//! over the API and over SMTP, but nothing reaches a transport and nothing is charged.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_shared::TaskId;
use postmesh_tests::receiver::{received, Receiver};
use postmesh_tests::smtp::SmtpServer;
use postmesh_tests::web::WebUser;
use postmesh_tests::Stack;

use super::smtp::kinds;
use super::wait_status;
use sender::sending::events::Kind;
use sender::sending::status::TaskProgress;

/// Waits until each of the `count` recipients of `task` is `sent` then `delivered`.
async fn delivered(stack: &Stack, key: &str, task: TaskId, count: usize) -> TaskProgress {
    let sent = vec![Kind::Sent, Kind::Delivered];
    wait_status(stack, key, task, |p| {
        let kinds = kinds(p);
        kinds.len() == count && kinds.iter().all(|(_, k)| *k == sent)
    })
    .await
}

/// A test key made in the API (`POST /api-keys {mode: "test"}`) sends over the API: the
/// answer prices it, `/email-status` shows it `test: true` with `sent` and `delivered`, a
/// delivery-event webhook carries `test: true`, `/balance` through it is the account's,
/// and no message is written and no credit taken. Over SMTP (a test key by `create-key
/// --mode test`) the same.
pub(crate) async fn a_test_key_prices_stores_and_shows_but_delivers_and_charges_nothing(
    stack: &Stack,
) {
    let live = stack.key(5).await;
    let email = stack.account_email(&live).await;
    let mut user = WebUser::login(stack, &email, 0).await;
    let created: Value = user
        .json(
            Method::POST,
            "/api-keys",
            &json!({ "name": "tests", "mode": "test" }),
        )
        .await
        .expect(StatusCode::CREATED, "a test key");
    assert_eq!(created["key"]["mode"], "test");
    let test = created["apiKey"].as_str().expect("apiKey").to_owned();
    assert!(test.starts_with("pm_test_"), "{test}");
    let bad = user
        .json(
            Method::POST,
            "/api-keys",
            &json!({ "name": "x", "mode": "demo" }),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(stack.balance(&test).await, 5, "the account's balance");
    // What would charge or deliver outside a send says it needs a live key.
    for (path, body) in [
        ("/deduct", json!({ "idempotencyKey": "test-key-deduct" })),
        (
            "/send-code",
            json!({ "email": "test-key-code@example.com" }),
        ),
    ] {
        let refused: Value = stack
            .client(&test)
            .post(path, &body, StatusCode::FORBIDDEN)
            .await;
        assert!(refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("live key"));
    }

    let receiver = Receiver::start().await;
    receiver.subscribe(stack, &test, &["email.delivered"]).await;
    let to = ["test-key-a@example.com", "test-key-b@example.com"];
    let sent = stack
        .sent(
            &test,
            &json!({ "to": to, "subject": "Hi", "text": "Hello" }),
        )
        .await;
    assert_eq!(sent.cost, 2, "priced as a live send");
    let task = sent.task_id.expect("stored");
    let progress = delivered(stack, &test, task, 2).await;
    assert!(progress.test, "shown as a test send");
    for post in received(&receiver, 2, Duration::from_secs(30)).await {
        assert_eq!(post.body["type"], "email.delivered");
        assert_eq!(post.body["data"]["test"], true, "{}", post.body);
    }

    // Over SMTP, with a test key made by the operator's command.
    let smtp_key = stack.test_key_of(&live).await;
    assert!(smtp_key.starts_with("pm_test_"));
    let smtp = SmtpServer::start(stack, |c| c.allow_plaintext_auth = true).await;
    let mut conn = smtp.connect().await;
    conn.login(&email, &smtp_key).await;
    conn.expect("MAIL FROM:<t@postmesh.localhost>", 250).await;
    conn.expect("RCPT TO:<test-key-c@example.com>", 250).await;
    conn.expect("DATA", 354).await;
    conn.write(b"From: t@postmesh.localhost\r\nSubject: test\r\n\r\nhi\r\n")
        .await;
    let reply = conn.send(".").await;
    assert_eq!(reply.0, 250, "{reply:?}");
    let task = TaskId::parse(
        reply
            .1
            .split("queued as ")
            .nth(1)
            .unwrap_or_default()
            .trim(),
    )
    .expect("a task");
    assert!(delivered(stack, &smtp_key, task, 1).await.test);
    smtp.stop().await;

    for to in [
        "test-key-a@example.com",
        "test-key-b@example.com",
        "test-key-c@example.com",
    ] {
        assert!(stack.delivered_to(to).is_empty(), "{to} got a message");
    }
    assert_eq!(stack.settled_balance(&live).await, 5, "nothing charged");
}
