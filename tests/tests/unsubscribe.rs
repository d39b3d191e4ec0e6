//! One-click unsubscribe and delivery events: the List-Unsubscribe headers and the
//! `{{unsubscribe_url}}` link on marketing mail and their absence on transactional mail, the
//! confirmation page, the one-click POST as form, JSON and query (idempotent), the bad-token
//! pages, the suppression it writes stopping the next marketing send, and the `sent` and
//! `unsubscribed` events (joined to the message the link came in) in `/email-status` and on
//! the DELIVERY stream.

use std::time::Duration;

use mail_parser::MessageParser;
use prost::Message as _;
use reqwest::StatusCode;
use serde_json::json;

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::DeliveryEvents;
use postmesh_shared::{Success, TaskId};
use postmesh_tests::{eventually, Stack, UNSUBSCRIBE_SECRET};
use sender::audience::suppressions::{Reason, SuppressionPage};
use sender::delivery::unsubscribe::Unsubscribe;
use sender::sending::events::Kind;
use sender::sending::send::SendAnswer;
use sender::sending::status::TaskProgress;

/// Sends `body` with `key`; the answer.
async fn send(stack: &Stack, key: &str, body: serde_json::Value) -> SendAnswer {
    stack.sent(key, &body).await
}

/// The unsubscribe link of a delivered message: its List-Unsubscribe header's URL.
fn header_link(raw: &str) -> Option<String> {
    let message = MessageParser::default().parse(raw.as_bytes())?;
    let value = message.header_raw("List-Unsubscribe")?;
    Some(
        value
            .trim()
            .trim_start_matches('<')
            .trim_end_matches('>')
            .to_owned(),
    )
}

/// The task's events of its first recipient, once its first event came.
async fn events_of(stack: &Stack, key: &str, task: TaskId) -> Vec<Kind> {
    eventually(Duration::from_secs(20), || async move {
        let progress: Success<TaskProgress> = stack
            .client(key)
            .get(&format!("/email-status/{task}"), StatusCode::OK)
            .await;
        let kinds: Vec<Kind> = progress.body.recipients[0]
            .events
            .iter()
            .map(|e| e.kind)
            .collect();
        if kinds.is_empty() {
            Err("no event yet")
        } else {
            Ok(kinds)
        }
    })
    .await
}

/// The unsubscribe scenarios below, each with a key of its own, on one stack.
#[tokio::test]
async fn unsubscribes_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            marketing_mail_unsubscribes_in_one_click_and_events_are_recorded,
            bad_tokens_get_an_html_page_and_change_nothing
        ]
    );
}

async fn marketing_mail_unsubscribes_in_one_click_and_events_are_recorded(stack: &Stack) {
    let key = stack.key(100).await;
    let marketing = send(
        stack,
        &key,
        json!({"to": "ann@example.com", "subject": "News", "emailType": "marketing",
               "topic": "news", "text": "Read on. Leave: {{unsubscribe_url}}",
               "html": "<p><a href=\"{{ unsubscribe_url }}\">Leave</a></p>"}),
    )
    .await;
    let raw = stack
        .wait_for_messages("ann@example.com", 1, Duration::from_secs(20))
        .await
        .remove(0);
    let link = header_link(&raw).expect("a List-Unsubscribe header");
    assert!(
        link.starts_with(&format!("{}/unsubscribe?token=", stack.base)),
        "{link}"
    );
    assert!(raw.contains("List-Unsubscribe-Post: List-Unsubscribe=One-Click"));
    let parsed = MessageParser::default().parse(raw.as_bytes()).unwrap();
    assert_eq!(
        parsed.body_text(0).unwrap().trim(),
        format!("Read on. Leave: {link}")
    );
    assert!(parsed
        .body_html(0)
        .unwrap()
        .contains(&format!("href=\"{}\"", link.replace('&', "&amp;"))));
    assert_eq!(
        events_of(stack, &key, marketing.task_id.unwrap()).await,
        [Kind::Sent]
    );

    // Transactional mail: neither header, and the placeholder is empty.
    send(
        stack,
        &key,
        json!({"to": "bob@example.com", "subject": "Receipt", "text": "Paid.{{unsubscribe_url}}"}),
    )
    .await;
    let receipt = stack
        .wait_for_messages("bob@example.com", 1, Duration::from_secs(20))
        .await
        .remove(0);
    assert_eq!(header_link(&receipt), None);
    assert!(!receipt.contains("List-Unsubscribe"));
    let parsed = MessageParser::default().parse(receipt.as_bytes()).unwrap();
    assert_eq!(parsed.body_text(0).unwrap().trim(), "Paid.");

    // The confirmation page names the address and topic and posts the token back.
    let http = reqwest::Client::new();
    let page = http.get(&link).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let html = page.text().await.unwrap();
    assert!(
        html.contains("ann@example.com") && html.contains("news"),
        "{html}"
    );
    assert!(html.contains("<form method=\"post\" action=\"/unsubscribe\">"));
    assert!(!html.contains("<script"));

    // RFC 8058 one-click: the token in the URL, List-Unsubscribe=One-Click in the body.
    let done = http
        .post(&link)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("List-Unsubscribe=One-Click")
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    assert!(done.text().await.unwrap().contains("unsubscribed"));
    // The unsubscribe joins the events of the message it came in.
    let task = marketing.task_id.unwrap();
    eventually(Duration::from_secs(10), || async {
        match events_of(stack, &key, task).await.as_slice() {
            [Kind::Sent, Kind::Unsubscribed] => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let token = link.split_once("token=").unwrap().1.to_owned();
    // Again, as a form field and as JSON, also with white space around the token: nothing
    // more is written.
    let url = format!("{}/unsubscribe", stack.base);
    for token in [token.clone(), format!("{token} ")] {
        let form = http.post(&url).form(&[("token", token)]).send().await;
        assert_eq!(form.unwrap().status(), StatusCode::OK);
    }
    for token in [token.clone(), format!(" {token}\t")] {
        let as_json = http.post(&url).json(&json!({ "token": token })).send();
        assert_eq!(as_json.await.unwrap().status(), StatusCode::OK);
    }
    let entries = stack.suppressions(&key, "ann@example.com").await;
    assert_eq!(entries, [(Reason::Unsubscribed, Some("news".to_owned()))]);

    // The next marketing mail of the topic does not go to her.
    let next = send(
        stack,
        &key,
        json!({"to": "ann@example.com", "subject": "More", "emailType": "marketing",
               "topic": "news", "text": "Hi"}),
    )
    .await;
    assert_eq!(next.recipients.rejected[0].reason, "unsubscribed:news");

    // The DELIVERY stream has her sent event and exactly one unsubscribed event (of this
    // workspace's: the stream holds every workspace's).
    let workspace = stack.workspace_of(&key).await.to_string();
    let seen = eventually(Duration::from_secs(10), || async {
        let messages = stack.stream_messages(Stream::Delivery).await;
        let mut seen = Vec::new();
        for (subject, payload) in messages {
            let kind = subject.rsplit('.').next().unwrap().to_owned();
            let batch = DeliveryEvents::decode(payload).unwrap();
            let common = batch.common.unwrap_or_default();
            for event in batch.events {
                let of = if event.kind.is_empty() {
                    &common.kind
                } else {
                    &event.kind
                };
                assert_eq!(&kind, of);
                let of = if event.workspace_id.is_empty() {
                    &common.workspace_id
                } else {
                    &event.workspace_id
                };
                if *of == workspace {
                    seen.push((kind.clone(), event.email));
                }
            }
        }
        seen.sort();
        if seen.iter().any(|(k, _)| k == "unsubscribed") && seen.len() >= 5 {
            Ok(seen)
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    let pair = |k: &str, e: &str| (k.to_owned(), e.to_owned());
    assert_eq!(
        seen,
        [
            pair("queued", "ann@example.com"),
            pair("queued", "bob@example.com"),
            pair("sent", "ann@example.com"),
            pair("sent", "bob@example.com"),
            pair("unsubscribed", "ann@example.com"),
        ]
    );
}

async fn bad_tokens_get_an_html_page_and_change_nothing(stack: &Stack) {
    let key = stack.key(0).await;
    let workspace = stack.workspace_of(&key).await;
    let url = format!("{}/unsubscribe", stack.base);
    let ours = Unsubscribe::new(UNSUBSCRIBE_SECRET, 60, &stack.base);
    let expired = ours.token(workspace, "ann@example.com", None, None, 1_000_000);
    let forged = Unsubscribe::new("another secret", 60, &stack.base).token(
        workspace,
        "ann@example.com",
        None,
        None,
        postmesh_shared::db::now_unix(),
    );
    let http = reqwest::Client::new();
    for token in [expired.as_str(), forged.as_str(), "nonsense", ""] {
        let page = http
            .get(&url)
            .query(&[("token", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), StatusCode::BAD_REQUEST, "GET {token}");
        assert!(page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
        let posted = http
            .post(&url)
            .form(&[("token", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(posted.status(), StatusCode::BAD_REQUEST, "POST {token}");
        assert!(posted.text().await.unwrap().contains("<html"));
    }
    // A query that is no token at all (two of them): the same page, not a plain-text error.
    let twice = format!("{url}?token={expired}&token={forged}");
    for request in [http.get(&twice), http.post(&twice)] {
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
        assert!(answer.text().await.unwrap().contains("<html"));
    }
    let listed: Success<SuppressionPage> = stack
        .client(&key)
        .get("/suppressions", StatusCode::OK)
        .await;
    assert!(listed.body.suppressions.is_empty());
    // A good one works without a key, one naming no message (as made before tokens did) too.
    let good = ours.token(
        workspace,
        "ann@example.com",
        None,
        None,
        postmesh_shared::db::now_unix(),
    );
    let posted = http
        .post(format!("{url}?token={good}"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::OK);
    let listed: Success<SuppressionPage> = stack
        .client(&key)
        .get("/suppressions", StatusCode::OK)
        .await;
    assert_eq!(listed.body.suppressions.len(), 1);
    assert_eq!(listed.body.suppressions[0].topic, None);
}
