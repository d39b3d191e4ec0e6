//! Inbound mail. On inbound-ingest's router: parsing and storing, threads and their pages,
//! raw downloads, byte budgets. Through the gateway: inbox addresses and their rules, the
//! MTA's validate and ingest with its secret, sizes, authentication and duplicates,
//! deletion, and every stored copy announced once on the INBOUND stream.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use futures::StreamExt;
use prost::Message as _;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use billing::entitlements::EntitlementsPage;
use inbound_ingest::addresses::{AddressList, AddressView, Created, Deleted};
use inbound_ingest::budget::ByteBudget;
use inbound_ingest::ingest::{Ingested, Validated};
use inbound_ingest::threads::{Read, ThreadList, ThreadPage};
use postmesh_shared::error::ErrorBody;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::InboundReceived;
use postmesh_shared::Success;
use postmesh_tests::mta::{authentication, fixture, ingest, ingest_body, ingest_to, message, mta};
use postmesh_tests::{peek, InboundRouter, Stack, TestClient, INBOUND_DOMAIN, INBOUND_SECRET};

/// Creates `address` for `key`, expecting 201.
async fn create_address(stack: &Stack, key: &str, address: &str) -> AddressView {
    let created: Success<Created> = stack
        .client(key)
        .post(
            "/inbox/addresses",
            &json!({ "address": address }),
            StatusCode::CREATED,
        )
        .await;
    created.body.address
}

/// The threads of `client`'s workspace (`query` as given).
async fn threads(client: &TestClient, query: &str) -> ThreadList {
    let list: Success<ThreadList> = client
        .get(&format!("/inbox/threads{query}"), StatusCode::OK)
        .await;
    list.body
}

async fn addresses_are_on_the_platform_domain_or_a_verified_one_within_the_plan(stack: &Stack) {
    let (ann, bob) = (stack.key(1).await, stack.key(1).await);
    let ann_box = create_address(
        stack,
        &ann,
        &format!("Support@{}", "Inbound.Postmesh.Localhost"),
    )
    .await;
    assert_eq!(ann_box.address, format!("support@{INBOUND_DOMAIN}"));
    // Unique across the platform, whoever asks.
    for key in [&ann, &bob] {
        let taken: ErrorBody = stack
            .client(key)
            .post(
                "/inbox/addresses",
                &json!({ "address": format!("SUPPORT@{INBOUND_DOMAIN}") }),
                StatusCode::CONFLICT,
            )
            .await;
        assert!(!taken.success);
    }
    // The free tier holds one mailbox.
    let limit: ErrorBody = stack
        .client(&ann)
        .post(
            "/inbox/addresses",
            &json!({ "address": format!("sales@{INBOUND_DOMAIN}") }),
            StatusCode::FORBIDDEN,
        )
        .await;
    assert!(limit.error.contains("mailbox"), "{}", limit.error);
    let page: Success<EntitlementsPage> = stack
        .client(&ann)
        .get("/billing/entitlements", StatusCode::OK)
        .await;
    assert_eq!(
        (
            page.body.entitlements.mailboxes.used,
            page.body.entitlements.mailboxes.limit
        ),
        (1, 1)
    );
    // A domain of bob's that is not verified for inbound, or nobody's, is refused.
    let domain_db = stack.service_db(domain::SERVICE).await;
    let bob_ws = stack.workspace_of(&bob).await;
    peek::domain::insert_pending(&domain_db, uuid::Uuid::now_v7(), bob_ws, "pending.example").await;
    for address in [
        "hi@pending.example",
        "hi@nobody.example",
        "a+b@nobody.example",
        "nope",
    ] {
        let refused: ErrorBody = stack
            .client(&bob)
            .post(
                "/inbox/addresses",
                &json!({ "address": address }),
                StatusCode::BAD_REQUEST,
            )
            .await;
        assert!(!refused.error.is_empty(), "{address}");
    }
    // Bob's verified domain is his, not ann's.
    peek::domain::insert_inbound_verified(&domain_db, bob_ws, "bob.example").await;
    let not_hers: ErrorBody = stack
        .client(&ann)
        .post(
            "/inbox/addresses",
            &json!({ "address": "x@bob.example" }),
            StatusCode::BAD_REQUEST,
        )
        .await;
    assert!(not_hers.error.contains("bob.example"), "{}", not_hers.error);
    let bob_box = create_address(stack, &bob, "Help@Bob.Example").await;
    assert_eq!(bob_box.address, "help@bob.example");
    // Each workspace sees and deletes only its own.
    let listed: Success<AddressList> = stack
        .client(&ann)
        .get("/inbox/addresses", StatusCode::OK)
        .await;
    let ids: Vec<_> = listed.body.addresses.iter().map(|a| a.id).collect();
    assert_eq!(ids, [ann_box.id]);
    let other: ErrorBody = stack
        .client(&ann)
        .delete(
            &format!("/inbox/addresses/{}", bob_box.id),
            StatusCode::NOT_FOUND,
        )
        .await;
    assert!(!other.success);
    let threads_of_other: ErrorBody = stack
        .client(&ann)
        .get(
            &format!("/inbox/threads?addressId={}", bob_box.id),
            StatusCode::NOT_FOUND,
        )
        .await;
    assert!(!threads_of_other.success);
    let malformed: ErrorBody = stack
        .client(&ann)
        .delete("/inbox/addresses/not-a-uuid", StatusCode::BAD_REQUEST)
        .await;
    assert!(malformed.error.contains("not-a-uuid"));
}

async fn validate_accepts_inboxes_and_their_sub_addresses_behind_the_secret(stack: &Stack) {
    let key = stack.key(1).await;
    create_address(stack, &key, &format!("desk@{INBOUND_DOMAIN}")).await;
    for (address, accepted) in [
        (format!("desk@{INBOUND_DOMAIN}"), true),
        (format!("DESK@{}", INBOUND_DOMAIN.to_uppercase()), true),
        (format!("desk+billing-42@{INBOUND_DOMAIN}"), true),
        (format!("reception@{INBOUND_DOMAIN}"), false),
        ("desk@elsewhere.example".into(), false),
        ("not an address".into(), false),
    ] {
        let v: Success<Validated> = mta(stack)
            .post(
                "/inbound-email/validate",
                &json!({ "address": address }),
                StatusCode::OK,
            )
            .await;
        assert_eq!(v.body.accepted, accepted, "{address}");
    }
    // A wrong or missing secret is 401 on both routes, whatever the body.
    let raw = message(Some("s@x"), "hi", "", "hi");
    let body = ingest_body(&raw, &[&format!("desk@{INBOUND_DOMAIN}")]);
    for client in [
        TestClient::http(&stack.base, None),
        TestClient::http(&stack.base, None).with_header("x-service-inbound-secret", "wrong"),
        TestClient::http(&stack.base, Some(&key)),
    ] {
        for path in ["/inbound-email/validate", "/inbound-email/ingest"] {
            let answer = client.request(Method::POST, path, &body).await;
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{path}");
        }
    }
    assert!(threads(&stack.client(&key), "").await.threads.is_empty());

    // Without INBOUND_SECRET a gateway answers 503 on both routes.
    let (unset, base) = stack.another_gateway(|c| c.inbound_secret = None).await;
    for path in ["/inbound-email/validate", "/inbound-email/ingest"] {
        let answer = TestClient::http(&base, None)
            .with_header("x-service-inbound-secret", INBOUND_SECRET)
            .request(Method::POST, path, &body)
            .await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        let error: ErrorBody = serde_json::from_slice(&answer.body).unwrap();
        assert!(error.error.contains("INBOUND_SECRET"), "{}", error.error);
    }
    unset.stop().await;
}

#[tokio::test]
async fn a_message_is_stored_with_its_parts_threaded_and_downloadable_byte_for_byte() {
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let (inbox, client) = inbound.inbox(&format!("support@{INBOUND_DOMAIN}")).await;
    let mta = inbound.mta();
    let raw = fixture("attachments.eml");
    let to = format!("support+tickets@{INBOUND_DOMAIN}");
    let counts = ingest_to(&mta, &raw, &[&to, "stranger@elsewhere.example"]).await;
    assert_eq!((counts.stored, counts.duplicates), (1, 0));
    let list = threads(&client, "").await;
    assert_eq!(list.threads.len(), 1);
    let thread = &list.threads[0];
    assert_eq!(
        (
            thread.address_id,
            thread.subject.as_str(),
            thread.message_count,
            thread.unread
        ),
        (inbox, "Invoice and screenshot", 1, true)
    );
    assert_eq!(list.unread_threads, 1);
    let page: Success<ThreadPage> = client
        .get(&format!("/inbox/threads/{}", thread.id), StatusCode::OK)
        .await;
    let m = &page.body.messages[0];
    assert_eq!(
        m.content.from.as_deref(),
        Some("Ann Lee <ann@customer.example>")
    );
    assert_eq!(m.content.to, [format!("support@{INBOUND_DOMAIN}")]);
    assert_eq!(m.content.cc, ["billing@customer.example"]);
    assert_eq!(
        m.content.message_id.as_deref(),
        Some("attach-1@customer.example")
    );
    assert!(m
        .content
        .text
        .as_deref()
        .unwrap()
        .contains("invoice and a screenshot"));
    assert!(m
        .content
        .html
        .as_deref()
        .unwrap()
        .contains("<b>invoice</b>"));
    let files: Vec<(Option<&str>, &str, usize)> = m
        .attachments
        .iter()
        .map(|a| (a.filename.as_deref(), a.content_type.as_str(), a.size))
        .collect();
    assert_eq!(
        files,
        [
            (Some("invoice.pdf"), "application/pdf", 1020),
            (Some("screen.png"), "image/png", 2048)
        ]
    );
    assert_eq!(m.authentication, authentication());
    // The raw download is the message as it came.
    let download = client
        .send(Method::GET, &format!("/inbox/messages/{}/raw", m.id), None)
        .await;
    assert_eq!(download.status, StatusCode::OK);
    assert_eq!(download.headers["content-type"], "message/rfc822");
    assert_eq!(download.body, raw);
    // Another workspace sees none of it.
    let (_, other) = inbound.inbox(&format!("other@{INBOUND_DOMAIN}")).await;
    for path in [
        format!("/inbox/threads/{}", thread.id),
        format!("/inbox/threads/{}/read", thread.id),
        format!("/inbox/messages/{}/raw", m.id),
    ] {
        let method = if path.ends_with("/read") {
            Method::POST
        } else {
            Method::GET
        };
        let answer = other.send(method, &path, None).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
    }
    assert!(threads(&other, "").await.threads.is_empty());
}

/// A subject and a Message-ID too long for an index entry (random, so nothing compresses
/// them) are stored, never a 500 for the MTA to retry; the same message again is still
/// the same message, and a reply still joins its thread.
#[tokio::test]
async fn headers_too_long_for_an_index_are_stored() {
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let (_, client) = inbound.inbox(&format!("support@{INBOUND_DOMAIN}")).await;
    let mta = inbound.mta();
    let noise = |chars: usize| {
        let hex = (0..chars.div_ceil(32)).map(|_| uuid::Uuid::new_v4().simple().to_string());
        hex.collect::<String>()[..chars].to_owned()
    };
    let subject = noise(6000);
    let raw = message(
        Some(&format!("{}@x.example", noise(4000))),
        &subject,
        "",
        "hi",
    );
    let to = format!("support@{INBOUND_DOMAIN}");
    let first = ingest_to(&mta, &raw, &[&to]).await;
    assert_eq!((first.stored, first.duplicates), (1, 0));
    let again = ingest_to(&mta, &raw, &[&to]).await;
    assert_eq!((again.stored, again.duplicates), (0, 1));
    let reply = message(None, &format!("Re: {subject}"), "", "and again");
    assert_eq!(ingest_to(&mta, &reply, &[&to]).await.stored, 1);
    let list = threads(&client, "").await;
    assert_eq!(list.threads.len(), 1);
    assert_eq!(list.threads[0].message_count, 2);
}

#[tokio::test]
async fn a_legacy_charset_and_an_unreadable_message_are_kept() {
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let (_, client) = inbound.inbox(&format!("support@{INBOUND_DOMAIN}")).await;
    let mta = inbound.mta();
    let latin1 = fixture("latin1.eml");
    assert!(
        std::str::from_utf8(&latin1).is_err(),
        "the fixture is not UTF-8"
    );
    ingest_to(&mta, &latin1, &[&format!("support@{INBOUND_DOMAIN}")]).await;
    // Bytes that are no MIME message at all: stored raw, never a 500 for the MTA to retry.
    let garbage: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let counts = ingest_to(&mta, &garbage, &[&format!("support@{INBOUND_DOMAIN}")]).await;
    assert_eq!(counts.stored, 1);
    let list = threads(&client, "").await;
    assert_eq!(list.threads.len(), 2);
    let mut bodies = Vec::new();
    for thread in &list.threads {
        let page: Success<ThreadPage> = client
            .get(&format!("/inbox/threads/{}", thread.id), StatusCode::OK)
            .await;
        let m = page.body.messages.into_iter().next().unwrap();
        let raw = client
            .send(Method::GET, &format!("/inbox/messages/{}/raw", m.id), None)
            .await
            .body;
        bodies.push((m, raw));
    }
    let (legacy, raw) = bodies
        .iter()
        .find(|(m, _)| m.content.message_id.is_some())
        .unwrap();
    assert_eq!(legacy.content.subject, "Grüße aus Köln");
    assert_eq!(
        legacy.content.from.as_deref(),
        Some("Jürgen Müller <juergen@legacy.example>")
    );
    assert_eq!(
        legacy.content.text.as_deref().map(str::trim),
        Some("Grüße aus Köln, señor! Ça coûte 5 EUR?")
    );
    assert_eq!(raw, &latin1);
    let (_, raw) = bodies
        .iter()
        .find(|(m, _)| m.content.message_id.is_none())
        .unwrap();
    assert_eq!(raw, &garbage);
}

#[tokio::test]
async fn a_message_holding_nul_is_stored_with_u_fffd_in_its_text_and_kept_raw() {
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let to = format!("support@{INBOUND_DOMAIN}");
    let (_, client) = inbound.inbox(&to).await;
    let mta = inbound.mta();
    // Text columns hold no NUL: the message is stored, its text with U+FFFD, its raw bytes
    // as they came.
    let raw = message(Some("nul@customer.example"), "Hi\0there", "", "one\0two");
    assert_eq!(ingest_to(&mta, &raw, &[&to]).await.stored, 1);
    let list = threads(&client, "").await;
    let page: Success<ThreadPage> = client
        .get(
            &format!("/inbox/threads/{}", list.threads[0].id),
            StatusCode::OK,
        )
        .await;
    let m = &page.body.messages[0];
    assert_eq!(m.content.subject, "Hi\u{FFFD}there");
    assert_eq!(
        m.content.text.as_deref().map(str::trim),
        Some("one\u{FFFD}two")
    );
    let stored = client
        .send(Method::GET, &format!("/inbox/messages/{}/raw", m.id), None)
        .await
        .body;
    assert_eq!(stored, raw);
    // A NUL in the envelope (text, jsonb) is the MTA's error: 400, nothing stored.
    let mut body = ingest_body(&message(None, "s", "", "b"), &[&to]);
    body["from"] = json!("ann\u{0}@customer.example");
    let refused: ErrorBody = mta
        .post("/inbound-email/ingest", &body, StatusCode::BAD_REQUEST)
        .await;
    assert!(refused.error.contains("NUL"), "{}", refused.error);
    assert_eq!(threads(&client, "").await.threads.len(), 1);
}

#[tokio::test]
async fn bad_requests_are_refused_with_the_spec_statuses_and_store_nothing() {
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let to = format!("support@{INBOUND_DOMAIN}");
    let (_, client) = inbound.inbox(&to).await;
    let mta = inbound.mta();
    let raw = message(Some("bad@x"), "hello", "", "hello");
    let good = ingest_body(&raw, &[&to]);
    let with = |field: &str, value: Value| {
        let mut body = good.clone();
        body[field] = value;
        body
    };
    let without_auth = {
        let mut body = good.clone();
        body.as_object_mut().unwrap().remove("authentication");
        body
    };
    let mut bad_auth = authentication();
    bad_auth["sourceIp"] = json!("not an ip");
    let mut numeric_spf = authentication();
    numeric_spf["spf"] = json!(1);
    let mut no_dkim = authentication();
    no_dkim.as_object_mut().unwrap().remove("dkim");
    let cases: Vec<(&str, Value, StatusCode)> = vec![
        (
            "no authentication",
            without_auth,
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "authentication a string",
            with("authentication", json!("pass")),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "sourceIp not an IP",
            with("authentication", bad_auth),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "spf a number",
            with("authentication", numeric_spf),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "dkim missing",
            with("authentication", no_dkim),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "rawBase64 not base64",
            with("rawBase64", json!("***")),
            StatusCode::BAD_REQUEST,
        ),
        (
            "to not an array",
            with("to", json!(to)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "no inbox",
            with("to", json!(["nobody@elsewhere.example"])),
            StatusCode::NOT_FOUND,
        ),
        (
            "deleted-looking sub-address of nothing",
            with("to", json!([format!("sales+x@{INBOUND_DOMAIN}")])),
            StatusCode::NOT_FOUND,
        ),
    ];
    for (what, body, status) in cases {
        let answer = mta
            .request(Method::POST, "/inbound-email/ingest", &body)
            .await;
        assert_eq!(
            answer.status,
            status,
            "{what}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let error: ErrorBody = serde_json::from_slice(&answer.body).expect(what);
        assert!(!error.success && !error.error.is_empty(), "{what}");
    }
    let not_json = mta
        .send(
            Method::POST,
            "/inbound-email/ingest",
            Some(b"{not json".to_vec()),
        )
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert!(
        threads(&client, "").await.threads.is_empty(),
        "nothing stored"
    );
}

/// Addresses and their limits, the MTA's validate route and its secret, what size of message
/// the ingest route takes (by body and by declared length) and a message stored once per
/// inbox, each with keys and addresses of its own, on one stack.
#[tokio::test]
async fn addresses_and_the_mta_routes_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            messages_up_to_10_mib_are_taken_and_larger_ones_refused,
            a_declared_length_that_cannot_fit_is_refused_before_the_body_is_sent,
            addresses_are_on_the_platform_domain_or_a_verified_one_within_the_plan,
            validate_accepts_inboxes_and_their_sub_addresses_behind_the_secret,
            a_message_is_stored_once_per_inbox_whatever_the_retries
        ]
    );
}

async fn messages_up_to_10_mib_are_taken_and_larger_ones_refused(stack: &Stack) {
    let key = stack.key(1).await;
    let to = format!("large@{INBOUND_DOMAIN}");
    create_address(stack, &key, &to).await;
    // 9.9 MiB: stored, and downloadable whole through the gateway.
    let sized = |total: usize, id: &str| {
        let mut raw = message(Some(id), id, "", "");
        raw.resize(total, b'x');
        raw
    };
    let big = sized(10 * 1024 * 1024 - 100 * 1024, "big@x");
    assert_eq!(ingest(stack, &big, &[&to]).await.stored, 1);
    let list = threads(&stack.client(&key), "").await;
    let page: Success<ThreadPage> = stack
        .client(&key)
        .get(
            &format!("/inbox/threads/{}", list.threads[0].id),
            StatusCode::OK,
        )
        .await;
    // Its body is over the inline limit: read back from the raw message and cut to what a
    // stored body holds, which says so; the raw message has it whole.
    let shown = &page.body.messages[0];
    let text = shown.content.text.as_deref().unwrap();
    assert!(
        text.len() == inbound_ingest::mime::INLINE_BODY_BYTES
            && text.trim().bytes().all(|b| b == b'x'),
        "{} bytes: {:?}...",
        text.len(),
        &text[..40.min(text.len())]
    );
    assert!(shown.truncated);
    let raw = stack
        .client(&key)
        .send(
            Method::GET,
            &format!("/inbox/messages/{}/raw", page.body.messages[0].id),
            None,
        )
        .await;
    assert_eq!(raw.status, StatusCode::OK);
    assert!(
        raw.body == big,
        "the 9.9 MiB message comes back byte for byte"
    );
    // Exactly 10 MiB is taken; one byte more is 413.
    let at_limit = sized(10 * 1024 * 1024, "limit@x");
    assert_eq!(ingest(stack, &at_limit, &[&to]).await.stored, 1);
    let over = sized(10 * 1024 * 1024 + 1, "over@x");
    let answer = mta(stack)
        .request(
            Method::POST,
            "/inbound-email/ingest",
            &ingest_body(&over, &[&to]),
        )
        .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(threads(&stack.client(&key), "").await.threads.len(), 2);
}

async fn a_declared_length_that_cannot_fit_is_refused_before_the_body_is_sent(stack: &Stack) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let host = stack.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&host).await.unwrap();
    let head = format!(
        "POST /inbound-email/ingest HTTP/1.1\r\nHost: {host}\r\n\
         x-service-inbound-secret: {INBOUND_SECRET}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        64 * 1024 * 1024
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // Not a byte of the body is sent: the answer can only come from the declared length.
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut answer))
        .await
        .expect("answered without the body")
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
}

async fn a_message_is_stored_once_per_inbox_whatever_the_retries(stack: &Stack) {
    let (ann, bob) = (stack.key(1).await, stack.key(1).await);
    let ann_to = format!("intake@{INBOUND_DOMAIN}");
    create_address(stack, &ann, &ann_to).await;
    let domain_db = stack.service_db(domain::SERVICE).await;
    peek::domain::insert_inbound_verified(
        &domain_db,
        stack.workspace_of(&bob).await,
        "carol.example",
    )
    .await;
    create_address(stack, &bob, "help@carol.example").await;
    // Twice in a row: the second is a duplicate.
    let raw = message(Some("once@customer.example"), "once", "", "hello");
    assert_eq!(ingest(stack, &raw, &[&ann_to]).await.stored, 1);
    let again = ingest(stack, &raw, &[&ann_to]).await;
    assert_eq!((again.stored, again.duplicates), (0, 1));
    // Ten at once: stored once, nine duplicates.
    let raw = message(Some("burst@customer.example"), "burst", "", "hello");
    let body = ingest_body(&raw, &[&ann_to]);
    let client = mta(stack);
    let answers =
        join_all((0..10).map(|_| {
            client.post::<Success<Ingested>>("/inbound-email/ingest", &body, StatusCode::OK)
        }))
        .await;
    let stored: u32 = answers.iter().map(|a| a.body.stored).sum();
    let duplicates: u32 = answers.iter().map(|a| a.body.duplicates).sum();
    assert_eq!((stored, duplicates), (1, 9));
    // Without a Message-ID the bytes decide.
    let anonymous = message(None, "no id", "", "same bytes");
    assert_eq!(ingest(stack, &anonymous, &[&ann_to]).await.stored, 1);
    assert_eq!(ingest(stack, &anonymous, &[&ann_to]).await.duplicates, 1);
    // One message to inboxes of two workspaces: a copy each, and a retry adds none.
    let shared = message(Some("shared@customer.example"), "to both", "", "hi both");
    let to = [
        ann_to.as_str(),
        "HELP+x@carol.example",
        "intake+dup@inbound.postmesh.localhost",
    ];
    let both = ingest(stack, &shared, &to).await;
    assert_eq!((both.stored, both.duplicates), (2, 0));
    let retried = ingest(stack, &shared, &to).await;
    assert_eq!((retried.stored, retried.duplicates), (0, 2));
    assert_eq!(threads(&stack.client(&ann), "").await.threads.len(), 4);
    assert_eq!(threads(&stack.client(&bob), "").await.threads.len(), 1);

    // Every stored copy is announced on INBOUND exactly once: 5 copies in all.
    let copies = announced(stack, 5, &[&ann_to, "help@carol.example"]).await;
    let ids: HashSet<&str> = copies.iter().map(|c| c.message_id.as_str()).collect();
    assert_eq!(ids.len(), 5, "each copy once");
    let bob_copy = copies
        .iter()
        .find(|c| c.address == "help@carol.example")
        .unwrap();
    assert_eq!(bob_copy.subject, "to both");
    assert_eq!(bob_copy.envelope_from, "ann@customer.example");
}

/// Reads the namespace's INBOUND stream with a consumer of its own, until `count` messages
/// to `inboxes` came and a further second brings no more; fails on fewer.
async fn announced(stack: &Stack, count: usize, inboxes: &[&str]) -> Vec<InboundReceived> {
    let stream = stack
        .jetstream()
        .await
        .get_stream(Stream::Inbound.name(stack.ns()))
        .await
        .unwrap();
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut seen = Vec::new();
    loop {
        let wait = if seen.len() < count {
            Duration::from_secs(15)
        } else {
            Duration::from_secs(1)
        };
        match tokio::time::timeout(wait, messages.next()).await {
            Ok(Some(Ok(m))) => {
                let copy = InboundReceived::decode(m.payload.clone()).expect("an InboundReceived");
                if inboxes.contains(&copy.address.as_str()) {
                    seen.push(copy);
                }
                m.ack().await.unwrap();
            }
            _ if seen.len() < count => panic!("{} of {count} INBOUND messages", seen.len()),
            _ => break,
        }
    }
    assert_eq!(seen.len(), count, "no more than one per stored copy");
    seen
}

#[tokio::test]
async fn replies_join_their_thread_and_reading_clears_unread() {
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let to = format!("support@{INBOUND_DOMAIN}");
    let (_, client) = inbound.inbox(&to).await;
    let mta = inbound.mta();
    let replied = "In-Reply-To: <t1@customer.example>\r\nReferences: <t1@customer.example>\r\n";
    // (Message-ID, subject, headers, body), in the order they arrive.
    let arrivals = [
        ("t1", "Order 42 is late", "", "where is it?"),
        // By In-Reply-To, whatever the subject says.
        ("t2", "Something else entirely", replied, "any news?"),
        // By subject, without threading headers.
        ("t3", "RE: Fwd: order 42 is  LATE", "", "hello?"),
        // A new subject is a new thread.
        ("t4", "Invoice question", "", "hi"),
    ];
    for (id, subject, headers, body) in arrivals {
        let id = format!("{id}@customer.example");
        ingest_to(&mta, &message(Some(&id), subject, headers, body), &[&to]).await;
    }
    let list = threads(&client, "").await;
    let counts: Vec<(String, i32)> = list
        .threads
        .iter()
        .map(|t| (t.subject.clone(), t.message_count))
        .collect();
    assert_eq!(
        counts,
        [
            ("Invoice question".to_owned(), 1),
            ("Order 42 is late".to_owned(), 3)
        ],
        "newest first"
    );
    let order = list.threads[1].clone();
    let page: Success<ThreadPage> = client
        .get(&format!("/inbox/threads/{}", order.id), StatusCode::OK)
        .await;
    let ids: Vec<_> = page
        .body
        .messages
        .iter()
        .map(|m| m.content.message_id.clone().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "t1@customer.example",
            "t2@customer.example",
            "t3@customer.example"
        ]
    );
    assert_eq!(
        page.body.messages[1].content.in_reply_to.as_deref(),
        Some("t1@customer.example")
    );
    // Unread until read; a new message makes it unread again.
    assert_eq!(list.unread_threads, 2);
    let read: Success<Read> = client
        .act(&format!("/inbox/threads/{}/read", order.id), StatusCode::OK)
        .await;
    assert!(!read.body.thread.unread);
    let unread = threads(&client, "?unread=1").await;
    assert_eq!(
        unread.threads.iter().map(|t| t.id).collect::<Vec<_>>(),
        [list.threads[0].id]
    );
    assert_eq!(unread.unread_threads, 1);
    let later = message(
        Some("t5@customer.example"),
        "Re: Order 42 is late",
        "In-Reply-To: <t3@customer.example>\r\n",
        "still waiting",
    );
    ingest_to(&mta, &later, &[&to]).await;
    let unread = threads(&client, "?unread=1&limit=1").await;
    assert_eq!(unread.threads.len(), 1);
    assert_eq!(unread.threads[0].id, order.id, "back on top, unread");
    assert_eq!(unread.unread_threads, 2);
    let bad: ErrorBody = client
        .get("/inbox/threads?limit=0", StatusCode::BAD_REQUEST)
        .await;
    assert!(!bad.success);
}

#[tokio::test]
async fn a_deleted_address_takes_no_mail_and_its_messages_go() {
    let stack = Stack::start().await;
    let key = stack.key(1).await;
    let to = format!("support@{INBOUND_DOMAIN}");
    let inbox = create_address(&stack, &key, &to).await;
    ingest(&stack, &message(Some("d1@x.io"), "kept", "", "a"), &[&to]).await;
    let list = threads(&stack.client(&key), "").await;
    let thread = list.threads[0].id;
    let deleted: Success<Deleted> = stack
        .client(&key)
        .delete(&format!("/inbox/addresses/{}", inbox.id), StatusCode::OK)
        .await;
    assert!(deleted.body.deleted && !deleted.body.purged);
    let v: Success<Validated> = mta(&stack)
        .post(
            "/inbound-email/validate",
            &json!({ "address": to }),
            StatusCode::OK,
        )
        .await;
    assert!(!v.body.accepted);
    let refused = mta(&stack)
        .request(
            Method::POST,
            "/inbound-email/ingest",
            &ingest_body(&message(Some("d2@x.io"), "late", "", "b"), &[&to]),
        )
        .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let gone = threads(&stack.client(&key), "").await;
    assert!(gone.threads.is_empty() && gone.unread_threads == 0);
    let hidden = stack
        .client(&key)
        .send(Method::GET, &format!("/inbox/threads/{thread}"), None)
        .await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    // Kept for the retention: the sweep removes them once it has passed.
    let db = stack.service_db(inbound_ingest::SERVICE).await;
    assert_eq!(peek::inbound::messages(&db).await, 1);
    assert!(!inbound_ingest::addresses::purge_expired(&db, 30)
        .await
        .unwrap());
    assert_eq!(peek::inbound::messages(&db).await, 1);
    inbound_ingest::addresses::purge_expired(&db, 0)
        .await
        .unwrap();
    assert_eq!(peek::inbound::messages(&db).await, 0);
    // The name is free again; `?purge=1` removes at once.
    let again = create_address(&stack, &key, &to).await;
    ingest(&stack, &message(Some("d3@x.io"), "new", "", "c"), &[&to]).await;
    assert_eq!(peek::inbound::messages(&db).await, 1);
    let purged: Success<Deleted> = stack
        .client(&key)
        .delete(
            &format!("/inbox/addresses/{}?purge=1", again.id),
            StatusCode::OK,
        )
        .await;
    assert!(purged.body.purged);
    assert_eq!(peek::inbound::messages(&db).await, 0);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_stored_copy_is_in_the_outbox_when_its_transaction_commits() {
    // The router alone, with no publisher: what a crash right after the commit leaves.
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let db = &inbound.store;
    let to = format!("support@{INBOUND_DOMAIN}");
    inbound.inbox(&to).await;
    let mta = inbound.mta();
    let raw = message(Some("outbox@x.io"), "kept", "", "a");
    for expected in [(1, 0), (0, 1)] {
        let answer: Success<Ingested> = mta
            .post(
                "/inbound-email/ingest",
                &ingest_body(&raw, &[&to]),
                StatusCode::OK,
            )
            .await;
        assert_eq!((answer.body.stored, answer.body.duplicates), expected);
        // One row for the one copy, waiting for the relay; a duplicate adds none.
        assert_eq!(peek::kit::unpublished(&db.pool).await, 1);
    }
    assert_eq!(peek::inbound::messages(&db.pool).await, 1);
}

#[tokio::test]
async fn a_thread_is_read_a_page_of_messages_at_a_time() {
    let inbound = InboundRouter::new(ByteBudget::default()).await;
    let to = format!("support@{INBOUND_DOMAIN}");
    let (_, client) = inbound.inbox(&to).await;
    let mta = inbound.mta();
    for i in 0..3 {
        let replying = if i == 0 {
            String::new()
        } else {
            "In-Reply-To: <t-0@customer.example>\r\nReferences: <t-0@customer.example>\r\n".into()
        };
        let raw = message(
            Some(&format!("t-{i}@customer.example")),
            "Paged",
            &replying,
            &format!("m{i}"),
        );
        ingest_to(&mta, &raw, &[&to]).await;
    }
    let list = threads(&client, "").await;
    assert_eq!(list.threads.len(), 1);
    let path = format!("/inbox/threads/{}", list.threads[0].id);
    let page: Success<ThreadPage> = client
        .get(&format!("{path}?limit=1&offset=1"), StatusCode::OK)
        .await;
    let ids: Vec<_> = page
        .body
        .messages
        .iter()
        .map(|m| m.content.message_id.clone())
        .collect();
    assert_eq!(ids, [Some("t-1@customer.example".to_owned())]);
    assert_eq!(
        (page.body.total, page.body.limit, page.body.offset),
        (3, 1, 1)
    );
    let whole: Success<ThreadPage> = client.get(&path, StatusCode::OK).await;
    assert_eq!((whole.body.messages.len(), whole.body.limit), (3, 100));
    let _: ErrorBody = client
        .get(&format!("{path}?limit=501"), StatusCode::BAD_REQUEST)
        .await;
    // The thread list pages the same way: up to 500.
    let _: Value = client.get("/inbox/threads?limit=500", StatusCode::OK).await;
    let _: ErrorBody = client
        .get("/inbox/threads?limit=501", StatusCode::BAD_REQUEST)
        .await;
}

#[tokio::test]
async fn a_workspaces_inbound_mail_spends_a_byte_budget_then_waits() {
    // A budget that refills one byte a second: what is spent stays spent for the test.
    let inbound = InboundRouter::new(ByteBudget {
        bytes_per_sec: 1,
        burst_bytes: 1000,
    })
    .await;
    let db = &inbound.store;
    let [a, b, c] = ["budget-a", "budget-b", "budget-c"].map(|l| format!("{l}@{INBOUND_DOMAIN}"));
    for to in [&a, &b, &c] {
        // Each inbox in a workspace of its own.
        inbound.inbox(to).await;
    }
    let mta = inbound.mta();
    let mut n = 0;
    let mut send = |to: &[&str], size: usize| {
        n += 1;
        let mut raw = message(Some(&format!("budget-{n}@x.io")), "Budget", "", "");
        raw.resize(size, b'x');
        let body = ingest_body(&raw, to);
        let mta = &mta;
        async move {
            mta.request(Method::POST, "/inbound-email/ingest", &body)
                .await
        }
    };
    // Two messages of 400 bytes fit in A's 1,000; the third waits about 200 s.
    for _ in 0..2 {
        assert_eq!(send(&[&a], 400).await.status, StatusCode::OK);
    }
    let refused = send(&[&a], 400).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = refused.header("retry-after").parse().unwrap();
    assert!((199..=200).contains(&wait), "Retry-After {wait}");
    assert!(refused.json::<ErrorBody>().error.contains("bytes a second"));
    // B's budget is its own; a message to A and B that A has no room for (200 bytes left)
    // is refused whole and costs B nothing.
    assert_eq!(send(&[&b], 400).await.status, StatusCode::OK);
    assert_eq!(
        send(&[&a, &b], 300).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&[&b], 400).await.status, StatusCode::OK);
    assert_eq!(send(&[&b], 400).await.status, StatusCode::TOO_MANY_REQUESTS);
    // A message over the burst passes on a full budget, and empties it.
    assert_eq!(send(&[&c], 1500).await.status, StatusCode::OK);
    assert_eq!(send(&[&c], 100).await.status, StatusCode::TOO_MANY_REQUESTS);
    // A message to two inboxes of one workspace is stored twice, and costs twice: two of
    // 300 bytes fit in 1,000 alone, not together.
    let [d1, d2] = ["budget-d1", "budget-d2"].map(|l| format!("{l}@{INBOUND_DOMAIN}"));
    let workspace = uuid::Uuid::now_v7();
    for to in [&d1, &d2] {
        peek::inbound::insert_address(&db.pool, workspace, to).await;
    }
    assert_eq!(send(&[&d1, &d2], 300).await.status, StatusCode::OK);
    assert_eq!(
        send(&[&d1, &d2], 300).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(peek::inbound::messages(&db.pool).await, 7);
}
