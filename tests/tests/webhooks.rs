//! Inbox webhook endpoints: their rules (address of the workspace, 10 per address, a URL
//! once, the secret's form, shown once and sealed), and URL safety at creation.

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use postmesh_shared::error::ErrorBody;
use postmesh_shared::proto::Role;
use postmesh_shared::{AddressId, Service, Success};
use postmesh_tests::mta::key_with_inbox;
use postmesh_tests::{caller, peek, ServiceDb, Stack, TestClient};
use webhook_dispatcher::content::quotes::BodyFormat;
use webhook_dispatcher::routes::defaults::DefaultPage;
use webhook_dispatcher::routes::endpoints::{
    Created, Deleted, EndpointList, EndpointPage, Subscribed, MAX_PER_ADDRESS,
};

/// `POST /inbox/webhook/endpoints` with `body`, expecting `status`.
async fn create<T: serde::de::DeserializeOwned>(
    stack: &Stack, key: &str, body: Value, status: StatusCode,
) -> T {
    stack
        .client(key)
        .post("/inbox/webhook/endpoints", &body, status)
        .await
}

/// The resource scenarios below, each with keys of its own, on one stack.
#[tokio::test]
async fn webhook_resources_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            endpoints_follow_their_rules_and_show_the_secret_once,
            the_legacy_put_creates_the_first_endpoint_then_updates_the_oldest,
            the_workspace_default_webhook_is_set_shown_rotated_and_removed
        ]
    );
}

async fn endpoints_follow_their_rules_and_show_the_secret_once(stack: &Stack) {
    let (ann, inbox) = key_with_inbox(stack, "ann").await;
    let (bob, bob_inbox) = key_with_inbox(stack, "bob").await;
    // Defaults, and a generated secret shown once.
    let first: Success<Created> = create(
        stack,
        &ann,
        json!({ "addressId": inbox, "url": "http://127.0.0.1:9/hook-0" }),
        StatusCode::CREATED,
    )
    .await;
    let e = &first.body.endpoint;
    assert_eq!(
        (e.address_id, e.active, e.body_format, e.strip_quotes),
        (inbox, true, BodyFormat::Text, false)
    );
    let key = first
        .body
        .signing_secret
        .strip_prefix("whsec_")
        .expect("whsec_");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(key)
            .unwrap()
            .len(),
        32
    );
    let shown: Value = stack
        .client(&ann)
        .get(
            &format!("/inbox/webhook/endpoints/{}", e.id),
            StatusCode::OK,
        )
        .await;
    assert!(
        !shown.to_string().contains("whsec_"),
        "never shown again: {shown}"
    );
    // Sealed at rest: the key is not in the database in clear.
    let db = stack.service_db(Service::WebhookDispatcher).await;
    let sealed = peek::dispatcher::sealed_secret(&db, e.id).await;
    let raw_key = base64::engine::general_purpose::STANDARD
        .decode(key)
        .unwrap();
    assert!(!sealed
        .windows(raw_key.len())
        .any(|w| w == raw_key.as_slice()));
    // A secret given is kept; a malformed one is 400.
    let given = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([9u8; 24])
    );
    let second: Success<Created> = create(
        stack,
        &ann,
        json!({ "addressId": inbox, "url": "http://127.0.0.1:9/hook-1", "signingSecret": given,
                "active": false, "bodyFormat": "markdown", "stripQuotes": true }),
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(second.body.signing_secret, given);
    assert_eq!(second.body.endpoint.body_format, BodyFormat::Markdown);
    for secret in [
        "whsec_short",
        "no-prefix",
        &format!("whsec_{}", "A".repeat(120)),
    ] {
        let bad: ErrorBody = create(
            stack,
            &ann,
            json!({ "addressId": inbox, "url": "http://127.0.0.1:9/x", "signingSecret": secret }),
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert!(
            bad.error.contains("signingSecret"),
            "{secret}: {}",
            bad.error
        );
    }
    // A URL once per address (another address may use it), at most 10 per address.
    let dup: ErrorBody = create(
        stack,
        &ann,
        json!({ "addressId": inbox, "url": "http://127.0.0.1:9/hook-0" }),
        StatusCode::CONFLICT,
    )
    .await;
    assert!(!dup.success);
    let _: Success<Created> = create(
        stack,
        &bob,
        json!({ "addressId": bob_inbox, "url": "http://127.0.0.1:9/hook-0" }),
        StatusCode::CREATED,
    )
    .await;
    for i in 2..MAX_PER_ADDRESS {
        let _: Success<Created> = create(
            stack,
            &ann,
            json!({ "addressId": inbox, "url": format!("http://127.0.0.1:9/hook-{i}") }),
            StatusCode::CREATED,
        )
        .await;
    }
    let eleventh: ErrorBody = create(
        stack,
        &ann,
        json!({ "addressId": inbox, "url": "http://127.0.0.1:9/hook-11" }),
        StatusCode::CONFLICT,
    )
    .await;
    assert!(eleventh.error.contains("10"), "{}", eleventh.error);
    // Another workspace's address, or none, is 404; so are its endpoints.
    for address in [bob_inbox, AddressId::new()] {
        let other: ErrorBody = create(
            stack,
            &ann,
            json!({ "addressId": address, "url": "http://127.0.0.1:9/other" }),
            StatusCode::NOT_FOUND,
        )
        .await;
        assert!(!other.success);
    }
    let answer = stack
        .client(&bob)
        .send(
            reqwest::Method::GET,
            &format!("/inbox/webhook/endpoints/{}", e.id),
            None,
        )
        .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    // Listing, by address; changing; deleting.
    let all: Success<EndpointList> = stack
        .client(&ann)
        .get("/inbox/webhook/endpoints", StatusCode::OK)
        .await;
    assert_eq!(all.body.endpoints.len(), MAX_PER_ADDRESS as usize);
    let of_bob: Success<EndpointList> = stack
        .client(&ann)
        .get(
            &format!("/inbox/webhook/endpoints?addressId={bob_inbox}"),
            StatusCode::OK,
        )
        .await;
    assert!(of_bob.body.endpoints.is_empty());
    let changed: Success<EndpointPage> = stack
        .client(&ann)
        .call(
            reqwest::Method::PATCH,
            &format!("/inbox/webhook/endpoints/{}", e.id),
            Some(serde_json::to_vec(&json!({ "active": false, "bodyFormat": "html" })).unwrap()),
            StatusCode::OK,
        )
        .await;
    assert_eq!(
        (
            changed.body.endpoint.active,
            changed.body.endpoint.body_format,
            changed.body.endpoint.url.as_str()
        ),
        (false, BodyFormat::Html, "http://127.0.0.1:9/hook-0")
    );
    let taken = stack
        .client(&ann)
        .send(
            reqwest::Method::PATCH,
            &format!("/inbox/webhook/endpoints/{}", e.id),
            Some(serde_json::to_vec(&json!({ "url": "http://127.0.0.1:9/hook-1" })).unwrap()),
        )
        .await;
    assert_eq!(taken.status, StatusCode::CONFLICT);
    let deleted: Success<Deleted> = stack
        .client(&ann)
        .delete(
            &format!("/inbox/webhook/endpoints/{}", e.id),
            StatusCode::OK,
        )
        .await;
    assert!(deleted.body.deleted);
    let again = stack
        .client(&ann)
        .send(
            reqwest::Method::DELETE,
            &format!("/inbox/webhook/endpoints/{}", e.id),
            None,
        )
        .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn unsafe_urls_are_refused_without_the_insecure_flag() {
    let db = ServiceDb::create(Service::WebhookDispatcher, &[&webhook_dispatcher::MIGRATOR]).await;
    let state =
        webhook_dispatcher::AppState::new(db.pool.clone(), db.common.namespace.clone()).unwrap();
    let client = TestClient::router(
        webhook_dispatcher::router(state),
        Some(caller(Role::Member)),
    );
    for url in [
        "http://93.184.216.34/hook",
        "https://127.0.0.1/hook",
        "https://10.0.0.8/hook",
        "https://192.168.1.20/hook",
        "https://100.64.1.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",
        "https://[fd00:ec2::254]/hook",
        "https://localhost/hook",
        // Over 2,048 bytes, as given or once its path is percent-encoded.
        &format!("https://93.184.216.34/{}", "a".repeat(2100)),
        &format!("https://93.184.216.34/{}", "é".repeat(400)),
    ] {
        let refused: ErrorBody = client
            .post(
                "/inbox/webhook/endpoints",
                &json!({ "addressId": AddressId::new(), "url": url }),
                StatusCode::BAD_REQUEST,
            )
            .await;
        assert!(!refused.success, "{url}");
    }
    // A public address passes the URL rules (and then needs the inbound service: 503 here).
    let later: ErrorBody = client
        .post(
            "/inbox/webhook/endpoints",
            &json!({ "addressId": AddressId::new(), "url": "https://93.184.216.34/hook" }),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
    assert!(later.error.contains("inbound"), "{}", later.error);
}

/// `PUT /inbox/webhook/addresses/{address}` with `body`, expecting `status`.
async fn subscribe<T: serde::de::DeserializeOwned>(
    stack: &Stack, key: &str, address: AddressId, body: Value, status: StatusCode,
) -> T {
    let body = serde_json::to_vec(&body).unwrap();
    stack
        .client(key)
        .call(
            reqwest::Method::PUT,
            &format!("/inbox/webhook/addresses/{address}"),
            Some(body),
            status,
        )
        .await
}

async fn the_legacy_put_creates_the_first_endpoint_then_updates_the_oldest(stack: &Stack) {
    let (ann, inbox) = key_with_inbox(stack, "legacy").await;
    let (bob, bob_inbox) = key_with_inbox(stack, "legacy-bob").await;
    // Nothing to update yet: creating needs a url.
    let no_url: ErrorBody = subscribe(stack, &ann, inbox, json!({}), StatusCode::BAD_REQUEST).await;
    assert!(no_url.error.contains("url"), "{}", no_url.error);
    let created: Success<Subscribed> = subscribe(
        stack,
        &ann,
        inbox,
        json!({ "url": "http://127.0.0.1:9/legacy", "bodyFormat": "html" }),
        StatusCode::OK,
    )
    .await;
    let first = created.body.subscription.clone();
    assert_eq!(
        (first.address_id, first.body_format),
        (inbox, BodyFormat::Html)
    );
    let secret = created.body.signing_secret.expect("shown on creation");
    // A second endpoint through the new API; the PUT keeps updating the oldest.
    let _: Success<Created> = create(
        stack,
        &ann,
        json!({ "addressId": inbox, "url": "http://127.0.0.1:9/newer" }),
        StatusCode::CREATED,
    )
    .await;
    let updated: Success<Subscribed> = subscribe(
        stack,
        &ann,
        inbox,
        json!({ "active": false, "stripQuotes": true }),
        StatusCode::OK,
    )
    .await;
    assert_eq!(updated.body.subscription.id, first.id);
    assert!(!updated.body.subscription.active && updated.body.subscription.strip_quotes);
    assert_eq!(
        updated.body.signing_secret, None,
        "not shown on a plain update"
    );
    let db = stack.service_db(Service::WebhookDispatcher).await;
    assert_eq!(
        peek::dispatcher::previous_secret(&db, first.id).await,
        (None, None)
    );
    // rotateSecret: a new secret, shown; the old one kept to sign beside it for 24 hours.
    let sealed_before = peek::dispatcher::sealed_secret(&db, first.id).await;
    let rotated: Success<Subscribed> = subscribe(
        stack,
        &ann,
        inbox,
        json!({ "rotateSecret": true }),
        StatusCode::OK,
    )
    .await;
    let new_secret = rotated.body.signing_secret.expect("shown on rotation");
    assert_ne!(new_secret, secret);
    let (previous, until) = peek::dispatcher::previous_secret(&db, first.id).await;
    assert_eq!(previous, Some(sealed_before));
    let left = until.unwrap() - postmesh_shared::db::now_unix();
    assert!((86_390..=86_400).contains(&left), "{left}");
    // Another workspace's address is 404.
    let other: ErrorBody = subscribe(
        stack,
        &bob,
        inbox,
        json!({ "url": "http://127.0.0.1:9/x" }),
        StatusCode::NOT_FOUND,
    )
    .await;
    assert!(!other.success);
    let bobs: ErrorBody = subscribe(
        stack,
        &ann,
        bob_inbox,
        json!({ "url": "http://127.0.0.1:9/x" }),
        StatusCode::NOT_FOUND,
    )
    .await;
    assert!(!bobs.success);
}

async fn the_workspace_default_webhook_is_set_shown_rotated_and_removed(stack: &Stack) {
    let (ann, bob) = (stack.key(0).await, stack.key(0).await);
    let none: ErrorBody = stack
        .client(&ann)
        .get("/inbox/webhook/default", StatusCode::NOT_FOUND)
        .await;
    assert!(!none.success);
    let put = |key: &str, body: Value, status: StatusCode| {
        let client = stack.client(key);
        let body = serde_json::to_vec(&body).unwrap();
        async move {
            client
                .call::<Value>(
                    reqwest::Method::PUT,
                    "/inbox/webhook/default",
                    Some(body),
                    status,
                )
                .await
        }
    };
    let first = put(
        &ann,
        json!({ "url": "http://127.0.0.1:9/default" }),
        StatusCode::OK,
    )
    .await;
    let secret = first["signingSecret"]
        .as_str()
        .expect("shown when first set")
        .to_owned();
    assert_eq!(first["webhook"]["bodyFormat"], "text");
    // Changing it keeps the secret and does not show it; rotating shows a new one.
    let changed = put(
        &ann,
        json!({ "url": "http://127.0.0.1:9/default-2", "bodyFormat": "markdown", "stripQuotes": true }),
        StatusCode::OK,
    )
    .await;
    assert!(changed.get("signingSecret").is_none(), "{changed}");
    let shown: Success<DefaultPage> = stack
        .client(&ann)
        .get("/inbox/webhook/default", StatusCode::OK)
        .await;
    assert_eq!(
        (
            shown.body.webhook.url.as_str(),
            shown.body.webhook.body_format,
            shown.body.webhook.strip_quotes
        ),
        ("http://127.0.0.1:9/default-2", BodyFormat::Markdown, true)
    );
    assert_eq!(shown.body.signing_secret, None);
    let rotated = put(
        &ann,
        json!({ "url": "http://127.0.0.1:9/default-2", "rotateSecret": true }),
        StatusCode::OK,
    )
    .await;
    let new_secret = rotated["signingSecret"]
        .as_str()
        .expect("shown on rotation");
    assert_ne!(new_secret, secret);
    // The same rules as endpoints.
    let bad = put(
        &ann,
        json!({ "url": "http://127.0.0.1:9/x", "signingSecret": "nope" }),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(bad["success"], false);
    // Each workspace its own.
    let none: ErrorBody = stack
        .client(&bob)
        .get("/inbox/webhook/default", StatusCode::NOT_FOUND)
        .await;
    assert!(!none.success);
    let removed: Value = stack
        .client(&ann)
        .delete("/inbox/webhook/default", StatusCode::OK)
        .await;
    assert_eq!(removed["deleted"], true);
    let gone = stack
        .client(&ann)
        .send(reqwest::Method::DELETE, "/inbox/webhook/default", None)
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
}
