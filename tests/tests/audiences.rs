//! Audience and campaign sends: each condition in include and exclude, saved audiences by
//! id, the recipient limit, a campaign's audience frozen by its first send (a contact added
//! later is not in a retry), a campaign made on the fly by `campaignName`, and a campaign's
//! template, topic and type as a send's defaults.

use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_shared::error::ErrorBody;
use postmesh_shared::{Success, TaskId};
use postmesh_tests::{Options, Stack};
use sender::audience::audiences;
use sender::audience::contacts::Upserted;
use sender::sending::campaigns;
use sender::sending::send::SendAnswer;
use sender::sending::status::TaskProgress;
use sender::sending::templates::Template;

/// Upserts the contacts of `rows`.
async fn contacts(stack: &Stack, key: &str, rows: &[Value]) {
    for row in rows {
        let _: Success<Upserted> = stack
            .client(key)
            .post("/contacts", row, StatusCode::CREATED)
            .await;
    }
}

/// Sends to `target` (`{audience}` or `{campaignKey}`, and more); the answer.
async fn send(stack: &Stack, key: &str, target: Value) -> SendAnswer {
    let mut body = json!({"subject": "Hello", "text": "Hi"});
    body.as_object_mut()
        .unwrap()
        .extend(target.as_object().cloned().unwrap());
    stack.sent(key, &body).await
}

/// The recipients of task `task`, sorted.
async fn recipients(stack: &Stack, key: &str, task: TaskId) -> Vec<String> {
    let progress: Success<TaskProgress> = stack
        .client(key)
        .get(&format!("/email-status/{task}?limit=1000"), StatusCode::OK)
        .await;
    let mut emails: Vec<String> = progress
        .body
        .recipients
        .into_iter()
        .map(|r| r.email)
        .collect();
    emails.sort();
    emails
}

/// Who an audience send to `audience` reaches, sorted.
async fn reached(stack: &Stack, key: &str, audience: Value) -> Vec<String> {
    let answer = send(stack, key, json!({ "audience": audience })).await;
    recipients(stack, key, answer.task_id.expect("a task")).await
}

fn names(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|n| format!("{n}@example.com")).collect();
    v.sort();
    v
}

#[tokio::test]
async fn each_condition_selects_and_excludes_what_it_says() {
    let stack = Stack::start().await;
    let key = stack.key(1000).await;
    contacts(
        &stack,
        &key,
        &[
            json!({"email": "ann@example.com", "tags": ["vip"], "topics": {"news": "subscribed"},
                   "attributes": {"plan": "pro", "age": 41, "city": "Oslo"}}),
            json!({"email": "bob@example.com", "tags": ["vip", "beta"],
                   "topics": {"news": "unsubscribed"}, "attributes": {"plan": "free", "age": 25}}),
            json!({"email": "cat@example.com", "tags": ["beta"], "topics": {"news": "subscribed"},
                   "attributes": {"plan": "team", "joined": "2026-03-01"}}),
            json!({"email": "dan@example.com", "attributes": {"joined": "2025-12-24"}}),
        ],
    )
    .await;
    let other = stack.key(0).await;
    contacts(
        &stack,
        &other,
        &[json!({"email": "eve@example.com", "tags": ["vip"]})],
    )
    .await;
    let cases = [
        (json!({"include": [{"tag": "vip"}]}), names(&["ann", "bob"])),
        (
            json!({"include": [{"topic": "news"}]}),
            names(&["ann", "cat"]),
        ),
        (
            json!({"include": [{"attribute": "plan", "op": "eq", "value": "pro"}]}),
            names(&["ann"]),
        ),
        (
            json!({"include": [{"attribute": "plan", "op": "neq", "value": "pro"}]}),
            names(&["bob", "cat", "dan"]),
        ),
        (
            json!({"include": [{"attribute": "plan", "op": "in", "value": ["free", "team"]}]}),
            names(&["bob", "cat"]),
        ),
        (
            json!({"include": [{"attribute": "joined", "op": "exists"}]}),
            names(&["cat", "dan"]),
        ),
        (
            json!({"include": [{"attribute": "age", "op": "gt", "value": 30}]}),
            names(&["ann"]),
        ),
        (
            json!({"include": [{"attribute": "age", "op": "lt", "value": 30}]}),
            names(&["bob"]),
        ),
        (
            json!({"include": [{"attribute": "joined", "op": "lt", "value": "2026-01-01"}]}),
            names(&["dan"]),
        ),
        (
            json!({"include": [{"email": "CAT@example.com"}, {"tag": "vip"}]}),
            names(&["ann", "bob", "cat"]),
        ),
        (
            json!({"include": [{"tag": "vip"}, {"tag": "beta"}],
                   "exclude": [{"topic": "news"}, {"email": "bob@example.com"}]}),
            Vec::new(),
        ),
        (
            json!({"include": [{"tag": "beta"}], "exclude": [{"attribute": "plan", "op": "eq", "value": "free"}]}),
            names(&["cat"]),
        ),
    ];
    for (audience, want) in cases {
        assert_eq!(
            reached(&stack, &key, audience.clone()).await,
            want,
            "{audience}"
        );
    }

    // A saved audience, named in include and in exclude.
    let saved: Success<audiences::One> = stack
        .client(&key)
        .post(
            "/audiences",
            &json!({"name": "VIPs", "include": [{"tag": "vip"}], "exclude": [{"email": "bob@example.com"}]}),
            StatusCode::CREATED,
        )
        .await;
    let id = saved.body.audience.id;
    assert_eq!(
        reached(
            &stack,
            &key,
            json!({"include": [{"audienceId": id}, {"email": "dan@example.com"}]})
        )
        .await,
        names(&["ann", "dan"])
    );
    assert_eq!(
        reached(
            &stack,
            &key,
            json!({"include": [{"tag": "beta"}], "exclude": [{"audienceId": id}]})
        )
        .await,
        names(&["bob", "cat"])
    );
    let listed: Success<audiences::AudienceList> =
        stack.client(&key).get("/audiences", StatusCode::OK).await;
    assert_eq!(listed.body.audiences.len(), 1);
    let _: ErrorBody = stack
        .client(&other)
        .get(&format!("/audiences/{id}"), StatusCode::NOT_FOUND)
        .await;
    // Another workspace cannot use it.
    let _: ErrorBody = stack
        .client(&other)
        .post(
            "/send-email",
            &json!({"audience": {"include": [{"audienceId": id}]}, "subject": "s", "text": "t"}),
            StatusCode::NOT_FOUND,
        )
        .await;
    let _: ErrorBody = stack
        .client(&key)
        .post(
            "/audiences",
            &json!({"name": "nested", "include": [{"audienceId": id}]}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    let _: Success<audiences::Deleted> = stack
        .client(&key)
        .delete(&format!("/audiences/{id}"), StatusCode::OK)
        .await;
    for bad in [
        json!({"audience": {"include": []}}),
        json!({"audience": {"include": [{"attribute": "age", "op": "gt", "value": [1]}]}}),
        json!({"audience": {"include": [{"tag": "vip"}]}, "to": "a@example.com"}),
        json!({"audience": {"include": [{"tag": "vip"}]}, "messageId": "<a@b>"}),
    ] {
        let mut body = json!({"subject": "s", "text": "t"});
        body.as_object_mut()
            .unwrap()
            .extend(bad.as_object().cloned().unwrap());
        let _: ErrorBody = stack
            .client(&key)
            .post("/send-email", &body, StatusCode::BAD_REQUEST)
            .await;
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn an_audience_over_the_limit_is_refused() {
    let stack = Stack::start_opts(Options {
        audience_max: 2,
        ..Options::default()
    })
    .await;
    let key = stack.key(100).await;
    let rows: Vec<Value> = (0..3)
        .map(|i| json!({"email": format!("n{i}@example.com"), "tags": ["all"]}))
        .collect();
    contacts(&stack, &key, &rows).await;
    let e: ErrorBody = stack
        .client(&key)
        .post(
            "/send-email",
            &json!({"audience": {"include": [{"tag": "all"}]}, "subject": "s", "text": "t"}),
            StatusCode::BAD_REQUEST,
        )
        .await;
    assert!(e.error.contains("more than 2"), "{}", e.error);
    let two = reached(
        &stack,
        &key,
        json!({"include": [{"tag": "all"}], "exclude": [{"email": "n0@example.com"}]}),
    )
    .await;
    assert_eq!(two.len(), 2);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_campaign_freezes_its_audience_at_its_first_send() {
    let mut stack = Stack::start().await;
    let key = stack.key(1000).await;
    contacts(
        &stack,
        &key,
        &[
            json!({"email": "ann@example.com", "tags": ["spring"]}),
            json!({"email": "bob@example.com", "tags": ["spring"]}),
        ],
    )
    .await;
    let _: Success<Template> = stack
        .client(&key)
        .post(
            "/templates",
            &json!({"key": "spring", "subject": "Spring is here", "text": "Sale!"}),
            StatusCode::OK,
        )
        .await;
    let made: Success<campaigns::One> = stack
        .client(&key)
        .post(
            "/campaigns",
            &json!({"key": "spring-sale", "name": "Spring sale", "templateKey": "spring",
                    "topic": "offers", "audience": {"include": [{"tag": "spring"}]}}),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!(made.body.campaign.frozen_at, None);
    let _: ErrorBody = stack
        .client(&key)
        .post(
            "/campaigns",
            &json!({"key": "spring-sale", "audience": {"include": [{"tag": "x"}]}}),
            StatusCode::CONFLICT,
        )
        .await;
    // A dry run resolves the audience and freezes nothing.
    let dry = send(
        &stack,
        &key,
        json!({"campaignKey": "spring-sale", "dryRun": true}),
    )
    .await;
    assert_eq!((dry.recipients.accepted, dry.task_id), (2, None));
    let read: Success<campaigns::One> = stack
        .client(&key)
        .get("/campaigns/spring-sale", StatusCode::OK)
        .await;
    assert_eq!(
        (read.body.campaign.frozen_at, read.body.campaign.members),
        (None, 0)
    );
    // The campaign's template, topic and type are the send's.
    let first: Success<SendAnswer> = stack
        .client(&key)
        .post(
            "/send-email",
            &json!({"campaignKey": "spring-sale"}),
            StatusCode::OK,
        )
        .await;
    let first = first.body;
    assert_eq!(first.template_key.as_deref(), Some("spring"));
    assert_eq!(first.campaign_key.as_deref(), Some("spring-sale"));
    assert_eq!(
        recipients(&stack, &key, first.task_id.unwrap()).await,
        names(&["ann", "bob"])
    );
    // A contact added later is not in the frozen audience; an unsubscribe of the
    // campaign's topic still applies to it (marketing mail of that topic).
    contacts(
        &stack,
        &key,
        &[json!({"email": "cat@example.com", "tags": ["spring"]})],
    )
    .await;
    let _: Success<Upserted> = stack
        .client(&key)
        .post(
            "/contacts",
            &json!({"email": "bob@example.com", "topics": {"offers": "unsubscribed"}}),
            StatusCode::OK,
        )
        .await;
    let retry = send(&stack, &key, json!({"campaignKey": "spring-sale"})).await;
    assert_eq!(
        recipients(&stack, &key, retry.task_id.unwrap()).await,
        names(&["ann"])
    );
    assert_eq!(retry.recipients.rejected[0].reason, "unsubscribed:offers");
    let read: Success<campaigns::One> = stack
        .client(&key)
        .get("/campaigns/spring-sale", StatusCode::OK)
        .await;
    assert_eq!(read.body.campaign.members, 2);
    assert!(read.body.campaign.frozen_at.is_some());
    let _: ErrorBody = stack
        .client(&key)
        .post(
            "/send-email",
            &json!({"campaignKey": "nope", "subject": "s", "text": "t"}),
            StatusCode::NOT_FOUND,
        )
        .await;

    // campaignName with an audience makes the campaign and freezes it.
    let named = send(
        &stack,
        &key,
        json!({"audience": {"include": [{"tag": "spring"}]}, "campaignName": "Autumn Sale"}),
    )
    .await;
    assert_eq!(named.campaign_key.as_deref(), Some("autumn-sale"));
    assert_eq!(named.recipients.accepted, 3);
    contacts(
        &stack,
        &key,
        &[json!({"email": "dan@example.com", "tags": ["spring"]})],
    )
    .await;
    let again = send(&stack, &key, json!({"campaignKey": "autumn-sale"})).await;
    assert_eq!(
        recipients(&stack, &key, again.task_id.unwrap()).await,
        names(&["ann", "bob", "cat"])
    );

    // A campaignName send that fails after making its campaign (billing is down) can be
    // repeated as is: the campaign it made, never sent, is taken again. Once a send of it
    // is stored, the name is taken.
    let winter = json!({"subject": "Hello", "text": "Hi", "campaignName": "Winter Sale",
                        "audience": {"include": [{"tag": "spring"}]}});
    stack.stop_billing().await;
    let _: ErrorBody = stack
        .client(&key)
        .post("/send-email", &winter, StatusCode::SERVICE_UNAVAILABLE)
        .await;
    stack.start_billing().await;
    let repeated: Success<SendAnswer> = stack
        .client(&key)
        .post("/send-email", &winter, StatusCode::OK)
        .await;
    assert_eq!(repeated.body.campaign_key.as_deref(), Some("winter-sale"));
    assert_eq!(repeated.body.recipients.accepted, 4);
    let _: ErrorBody = stack
        .client(&key)
        .post("/send-email", &winter, StatusCode::CONFLICT)
        .await;
    let list: Success<campaigns::CampaignList> =
        stack.client(&key).get("/campaigns", StatusCode::OK).await;
    assert_eq!(list.body.campaigns.len(), 3);
    stack.shutdown().await;
}
