//! Top-ups and plans with a fake Stripe speaking Stripe's wire protocol. On billing's
//! router (or billing running alone, for its sweeps and RPCs): checkouts' input,
//! idempotency and ownership, expired and failed sessions, outages, a plan from checkout to
//! deletion. Through the real gateway → NATS → billing path: a paid top-up's signed webhooks
//! on the public endpoint, and usage counted by the owning services.

use std::time::Duration;

use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use billing::catalog::{CatalogPage, PackKind};
use billing::checkout::Opened;
use billing::entitlements::EntitlementsPage;
use billing::purchases::{PurchaseList, PurchaseStatus, PurchaseView};
use billing::subscriptions::{CheckoutStatus, CheckoutView, PortalLink};
use postmesh_shared::error::ErrorBody;
use postmesh_shared::proto::EntitlementsRequest;
use postmesh_shared::Success;
use postmesh_tests::fake_stripe::{self, FakeStripe};
use postmesh_tests::{
    balance_of, eventually, lock_waiters, lock_waiters_reach, BillingAlone, BillingRouter, Options,
    Stack, TestClient,
};

/// Billing's router alone, talking to a fresh fake Stripe.
async fn billing_with_stripe() -> (BillingRouter, FakeStripe) {
    let stripe = FakeStripe::start().await;
    (BillingRouter::with_stripe(stripe.config()).await, stripe)
}

/// A unique, valid idempotency key.
fn idem() -> String {
    format!("test_{}", uuid::Uuid::new_v4().simple())
}

/// `client`, sending `idem` as its `Idempotency-Key`.
fn keyed(client: &TestClient, idem: &str) -> TestClient {
    client.clone().with_header("idempotency-key", idem)
}

/// `POST /billing/subscription/checkout` for `plan` (a new idempotency key), expecting
/// `expected`.
async fn subscribe<T: serde::de::DeserializeOwned>(
    client: &TestClient, plan: &str, expected: StatusCode,
) -> T {
    keyed(client, &idem())
        .post(
            "/billing/subscription/checkout",
            &json!({ "plan_id": plan }),
            expected,
        )
        .await
}

/// `POST /billing/checkout` expecting 200.
async fn top_up(client: &TestClient, body: Value) -> Opened {
    let opened: Success<Opened> = keyed(client, &idem())
        .post("/billing/checkout", &body, StatusCode::OK)
        .await;
    opened.body
}

async fn purchase(client: &TestClient, id: uuid::Uuid) -> billing::purchases::Purchase {
    let view: Success<PurchaseView> = client
        .get(&format!("/billing/purchases/{id}"), StatusCode::OK)
        .await;
    view.body.purchase
}

async fn entitlements(client: &TestClient) -> EntitlementsPage {
    let page: Success<EntitlementsPage> = client.get("/billing/entitlements", StatusCode::OK).await;
    page.body
}

#[tokio::test]
async fn the_catalog_is_public_and_says_whether_payments_are_on() {
    let off = BillingRouter::new().await;
    let anyone = off.anonymous();
    let page: Success<CatalogPage> = anyone.get("/billing/catalog", StatusCode::OK).await;
    assert!(!page.body.enabled);
    let ids: Vec<&str> = page.body.packs.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        ["credits-1k", "credits-10k", "credits-100k", "usage-20"]
    );
    assert_eq!(page.body.packs[3].kind, PackKind::Usage);
    // Without Stripe, whatever needs it is 503 in the standard body.
    let (_, client) = off.key(0).await;
    let e: ErrorBody = keyed(&client, &idem())
        .post(
            "/billing/checkout",
            &json!({"pack_id": "credits-1k"}),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
    assert!(!e.success);
    let _: ErrorBody = subscribe(&client, "starter", StatusCode::SERVICE_UNAVAILABLE).await;
    let event = json!({"id": "evt_1", "type": "invoice.paid", "data": {"object": {}}});
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &event).await,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let (on, _stripe) = billing_with_stripe().await;
    let page: Success<CatalogPage> = on.anonymous().get("/billing/catalog", StatusCode::OK).await;
    assert!(page.body.enabled);
    assert_eq!(page.body.packs.len(), 4);
}

#[tokio::test]
async fn checkouts_open_stripe_sessions_for_packs_and_custom_amounts() {
    let (billing, stripe) = billing_with_stripe().await;
    let (key_id, client) = billing.key(0).await;
    let idem_key = idem();
    let opened: Success<Opened> = keyed(&client, &idem_key)
        .post(
            "/billing/checkout",
            &json!({"pack_id": "credits-1k"}),
            StatusCode::OK,
        )
        .await;
    let session = stripe.session(&stripe.session_by_url(&opened.body.url));
    let id = opened.body.id.to_string();
    assert_eq!(session["mode"], "payment");
    assert_eq!(session["client_reference_id"], id.as_str());
    assert_eq!(session["metadata"]["purchase_id"], id.as_str());
    assert_eq!(session["amount_total"], 1000);
    assert_eq!(session["currency"], "usd");
    assert!(session["success_url"]
        .as_str()
        .unwrap()
        .starts_with("https://app.postmesh.test/"));
    // Our idempotency key reached Stripe, namespaced by the API key.
    let created: Vec<_> = stripe
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/checkout/sessions")
        .collect();
    assert_eq!(created.len(), 1);
    assert_eq!(
        created[0].idempotency_key.as_deref(),
        Some(format!("{key_id}:{idem_key}").as_str())
    );
    let p = purchase(&client, opened.body.id).await;
    assert_eq!(
        (
            p.pack_name.as_str(),
            p.credits,
            p.amount,
            p.kind,
            p.status,
            p.paid_at
        ),
        (
            "1,000 credits",
            1000,
            1000,
            PackKind::Credits,
            PurchaseStatus::Pending,
            None
        )
    );

    let custom = top_up(&client, json!({"amount": 2500})).await;
    let session = stripe.session(&stripe.session_by_url(&custom.url));
    assert_eq!(session["amount_total"], 2500);
    let p = purchase(&client, custom.id).await;
    assert_eq!((p.credits, p.amount, p.kind), (0, 2500, PackKind::Usage));

    let list: Success<PurchaseList> = client.get("/billing/purchases", StatusCode::OK).await;
    let ids: Vec<_> = list.body.purchases.iter().map(|p| p.id).collect();
    assert_eq!(ids, [custom.id, opened.body.id], "newest first");

    // Reconciles in a loop ask Stripe once in a while, not once each.
    let sid = stripe.session_by_url(&custom.url);
    let reconcile = format!("/billing/purchases/{}/reconcile", custom.id);
    for _ in 0..5 {
        let shown: Success<PurchaseView> = client.act(&reconcile, StatusCode::OK).await;
        assert_eq!(shown.body.purchase.status, PurchaseStatus::Pending);
    }
    let asked = stripe
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == format!("/v1/checkout/sessions/{sid}"))
        .count();
    assert_eq!(asked, 1);
}

#[tokio::test]
async fn an_idempotency_key_stands_for_one_request() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    let idem_key = idem();
    let body = json!({"pack_id": "credits-10k"});
    let first: Success<Opened> = keyed(&client, &idem_key)
        .post("/billing/checkout", &body, StatusCode::OK)
        .await;
    let again: Success<Opened> = keyed(&client, &idem_key)
        .post("/billing/checkout", &body, StatusCode::OK)
        .await;
    assert_eq!(first.body, again.body);
    let other: ErrorBody = keyed(&client, &idem_key)
        .post(
            "/billing/checkout",
            &json!({"amount": 5000}),
            StatusCode::CONFLICT,
        )
        .await;
    assert!(!other.success);
    // Another API key may use the same idempotency key for its own purchase.
    let (_, other) = billing.key(0).await;
    let theirs: Success<Opened> = keyed(&other, &idem_key)
        .post("/billing/checkout", &body, StatusCode::OK)
        .await;
    assert_ne!(theirs.body.id, first.body.id);

    // 20 identical requests at once: one purchase; each answer is it or a 409.
    let (_, racer) = billing.key(0).await;
    let shared = idem();
    let clients: Vec<_> = (0..20).map(|_| keyed(&racer, &shared)).collect();
    let answers = join_all(clients.iter().map(|c| {
        c.send(
            Method::POST,
            "/billing/checkout",
            Some(serde_json::to_vec(&body).unwrap()),
        )
    }))
    .await;
    let mut ids = Vec::new();
    for answer in &answers {
        match answer.status {
            StatusCode::OK => ids.push(answer.json::<Opened>().id),
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert!(!ids.is_empty());
    assert!(ids.iter().all(|id| *id == ids[0]));
    let list: Success<PurchaseList> = racer.get("/billing/purchases", StatusCode::OK).await;
    assert_eq!(list.body.purchases.len(), 1);
    assert_eq!(list.body.purchases[0].id, ids[0]);
    let sessions = stripe
        .requests()
        .iter()
        .filter(|r| {
            r.idempotency_key
                .as_deref()
                .is_some_and(|k| k.ends_with(&shared))
        })
        .count();
    assert_eq!(sessions, 1, "one Stripe session for the raced key");
}

#[tokio::test]
async fn bad_checkout_input_is_a_400_and_opens_nothing() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    let good = json!({"pack_id": "credits-1k"});
    // Missing, short, long and badly formed idempotency keys.
    let _: ErrorBody = client
        .post("/billing/checkout", &good, StatusCode::BAD_REQUEST)
        .await;
    let long = "k".repeat(101);
    for bad in ["short-key-15chr", long.as_str(), "has spaces in it ok?"] {
        let e: ErrorBody = keyed(&client, bad)
            .post("/billing/checkout", &good, StatusCode::BAD_REQUEST)
            .await;
        assert!(e.error.contains("idempotency-key"), "{bad}: {}", e.error);
    }
    let too_long_id = "p".repeat(41);
    for body in [
        json!({}),
        json!({"pack_id": "credits-1k", "amount": 5000}),
        json!({"pack_id": ""}),
        json!({"pack_id": too_long_id}),
        json!({"pack_id": "no-such-pack"}),
        json!({"pack_id": 7}),
        json!({"amount": 499}),
        json!({"amount": 100001}),
        json!({"amount": "5000"}),
        json!({"amount": 500.5}),
    ] {
        let e: ErrorBody = keyed(&client, &idem())
            .post("/billing/checkout", &body, StatusCode::BAD_REQUEST)
            .await;
        assert!(!e.success, "{body}");
    }
    // The bounds themselves are fine.
    for amount in [500, 100_000] {
        top_up(&client, json!({ "amount": amount })).await;
    }
    let _: ErrorBody = client
        .get("/billing/purchases/not-a-uuid", StatusCode::BAD_REQUEST)
        .await;
    let unknown = uuid::Uuid::now_v7();
    let _: ErrorBody = client
        .get(
            &format!("/billing/purchases/{unknown}"),
            StatusCode::NOT_FOUND,
        )
        .await;
    let _: ErrorBody = client
        .act(
            &format!("/billing/purchases/{unknown}/reconcile"),
            StatusCode::NOT_FOUND,
        )
        .await;
    let sessions = stripe
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/checkout/sessions")
        .count();
    assert_eq!(sessions, 2, "only the two good requests reached Stripe");
}

/// A paid top-up and the usage counts, each with a key of its own, on one stack whose
/// billing talks to a fake Stripe.
#[tokio::test]
async fn stack_scenarios_side_by_side() {
    let stripe = FakeStripe::start().await;
    let stack = Stack::start_opts(Options {
        stripe: stripe.config(),
        ..Options::default()
    })
    .await;
    tokio::join!(
        a_paid_top_up_credits_once_across_redeliveries_and_reconcile(&stack, &stripe),
        usage_counts_come_from_the_owning_services(&stack),
    );
    stack.shutdown().await;
}

async fn a_paid_top_up_credits_once_across_redeliveries_and_reconcile(
    stack: &Stack, stripe: &FakeStripe,
) {
    let key = stack.key(5).await;
    let opened = top_up(&stack.client(&key), json!({"pack_id": "credits-1k"})).await;
    let session = stripe.session_by_url(&opened.url);
    let completed = stripe.complete(&session, true);

    // Unsigned, wrongly signed and stale deliveries change nothing.
    let url = format!("{}/billing/webhooks/stripe", stack.base);
    let now = postmesh_shared::db::now_unix();
    let no_signature = postmesh_tests::http_client()
        .post(&url)
        .json(&completed)
        .send()
        .await
        .unwrap();
    assert_eq!(no_signature.status(), StatusCode::BAD_REQUEST);
    let wrong = FakeStripe::deliver_signed(&url, &completed, "whsec_wrong", now).await;
    assert_eq!(wrong, StatusCode::BAD_REQUEST);
    let stale =
        FakeStripe::deliver_signed(&url, &completed, fake_stripe::WEBHOOK_SECRET, now - 600).await;
    assert_eq!(stale, StatusCode::BAD_REQUEST);
    assert_eq!(
        purchase(&stack.client(&key), opened.id).await.status,
        PurchaseStatus::Pending
    );
    assert_eq!(stack.balance(&key).await, 5);

    // Three deliveries of the event and a reconcile, all at once.
    let client = stack.client(&key);
    let reconcile_path = format!("/billing/purchases/{}/reconcile", opened.id);
    let deliveries = join_all((0..3).map(|_| FakeStripe::deliver(&stack.base, &completed)));
    let reconcile = client.send(Method::POST, &reconcile_path, None);
    let (statuses, answer) = tokio::join!(deliveries, reconcile);
    let (reconciled, body) = (answer.status, answer.body);
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(
        reconciled,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(stack.balance(&key).await, 1005);
    // Once more, later: still once.
    assert_eq!(
        FakeStripe::deliver(&stack.base, &completed).await,
        StatusCode::OK
    );
    let _: Success<PurchaseView> = client.act(&reconcile_path, StatusCode::OK).await;
    assert_eq!(stack.balance(&key).await, 1005);
    let p = purchase(&stack.client(&key), opened.id).await;
    assert_eq!(p.status, PurchaseStatus::Paid);
    assert!(p.paid_at.is_some_and(|t| t >= p.created_at));

    // A usage top-up lands on the usage balance in nano-USD.
    let usage = top_up(&stack.client(&key), json!({"amount": 2500})).await;
    let event = stripe.complete(&stripe.session_by_url(&usage.url), true);
    assert_eq!(
        FakeStripe::deliver(&stack.base, &event).await,
        StatusCode::OK
    );
    assert_eq!(
        FakeStripe::deliver(&stack.base, &event).await,
        StatusCode::OK
    );
    let model = entitlements(&stack.client(&key)).await.entitlements.model;
    assert_eq!(model.balance_nano, 2500 * 10_000_000);
    assert_eq!(
        stack.balance(&key).await,
        1005,
        "usage top-ups add no credits"
    );
}

#[tokio::test]
async fn expired_and_failed_sessions_end_their_purchases_for_good() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    let anyone = billing.anonymous();
    let expiring = top_up(&client, json!({"pack_id": "credits-1k"})).await;
    let expired = stripe.expire(&stripe.session_by_url(&expiring.url));
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &expired).await,
        StatusCode::OK
    );
    assert_eq!(
        purchase(&client, expiring.id).await.status,
        PurchaseStatus::Expired
    );

    // An async payment: completed but unpaid stays pending, then fails.
    let failing = top_up(&client, json!({"pack_id": "credits-10k"})).await;
    let session = stripe.session_by_url(&failing.url);
    let completed = stripe.complete(&session, false);
    let failed = stripe.settle_async(&session, false);
    // Delivered out of order: the failure first, then the completion.
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &failed).await,
        StatusCode::OK
    );
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &completed).await,
        StatusCode::OK
    );
    let p = purchase(&client, failing.id).await;
    assert_eq!((p.status, p.paid_at), (PurchaseStatus::Failed, None));

    // An async payment that succeeds is paid.
    let slow = top_up(&client, json!({"pack_id": "credits-1k"})).await;
    let session = stripe.session_by_url(&slow.url);
    let completed = stripe.complete(&session, false);
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &completed).await,
        StatusCode::OK
    );
    assert_eq!(
        purchase(&client, slow.id).await.status,
        PurchaseStatus::Pending
    );
    let succeeded = stripe.settle_async(&session, true);
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &succeeded).await,
        StatusCode::OK
    );
    assert_eq!(
        purchase(&client, slow.id).await.status,
        PurchaseStatus::Paid
    );
    assert_eq!(balance_of(&client).await, 1000);
}

#[tokio::test]
async fn a_stripe_outage_loses_no_purchase() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    // Stripe down while opening: 503, and the same key later opens the same purchase.
    stripe.set_down(true);
    let idem_key = idem();
    let body = json!({"pack_id": "credits-1k"});
    let _: ErrorBody = keyed(&client, &idem_key)
        .post("/billing/checkout", &body, StatusCode::SERVICE_UNAVAILABLE)
        .await;
    let list: Success<PurchaseList> = client.get("/billing/purchases", StatusCode::OK).await;
    assert_eq!(list.body.purchases.len(), 1);
    assert_eq!(list.body.purchases[0].status, PurchaseStatus::Pending);
    stripe.set_down(false);
    let opened: Success<Opened> = keyed(&client, &idem_key)
        .post("/billing/checkout", &body, StatusCode::OK)
        .await;
    assert_eq!(opened.body.id, list.body.purchases[0].id);

    // Paid while our webhook endpoint heard nothing, and Stripe down at reconcile: 503, pending.
    let session = stripe.session_by_url(&opened.body.url);
    stripe.complete(&session, true);
    stripe.set_down(true);
    let path = format!("/billing/purchases/{}/reconcile", opened.body.id);
    let e: ErrorBody = client.act(&path, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(!e.success);
    assert_eq!(
        purchase(&client, opened.body.id).await.status,
        PurchaseStatus::Pending
    );
    stripe.set_down(false);
    let view: Success<PurchaseView> = client.act(&path, StatusCode::OK).await;
    assert_eq!(view.body.purchase.status, PurchaseStatus::Paid);
    assert_eq!(balance_of(&client).await, 1000);
}

#[tokio::test]
async fn a_checkout_never_opened_expires_a_day_on_and_its_key_is_spent() {
    let stripe = FakeStripe::start().await;
    let alone = BillingAlone::with_stripe(stripe.config()).await;
    let billing = &alone.billing;
    let (_, client) = billing.key(0).await;
    let db = billing.store.pool.clone();
    // Stripe down: three checkouts stored, none opened.
    stripe.set_down(true);
    let (stale, fresh, plan) = (idem(), idem(), idem());
    let pack = json!({"pack_id": "credits-1k"});
    for k in [&stale, &fresh] {
        let _: ErrorBody = keyed(&client, k)
            .post("/billing/checkout", &pack, StatusCode::SERVICE_UNAVAILABLE)
            .await;
    }
    let starter = json!({"plan_id": "starter"});
    let _: ErrorBody = keyed(&client, &plan)
        .post(
            "/billing/subscription/checkout",
            &starter,
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await;
    stripe.set_down(false);
    let id_of = |k: &str| {
        sqlx::query_scalar::<_, uuid::Uuid>("SELECT id FROM checkouts WHERE idempotency_key = $1")
            .bind(k.to_owned())
            .fetch_one(&db)
    };
    let (stale_id, fresh_id, plan_id) = (
        id_of(&stale).await.unwrap(),
        id_of(&fresh).await.unwrap(),
        id_of(&plan).await.unwrap(),
    );
    // Two of them were stored a day and a second ago, the third a little less than a day.
    let age = |ids: Vec<uuid::Uuid>, secs: i64| {
        sqlx::query("UPDATE checkouts SET created_at = created_at - $2 WHERE id = ANY($1)")
            .bind(ids)
            .bind(secs)
            .execute(&db)
    };
    age(vec![stale_id, plan_id], 86_401).await.unwrap();
    age(vec![fresh_id], 86_000).await.unwrap();
    let client_ref = &client;
    eventually(Duration::from_secs(10), || async move {
        match purchase(client_ref, stale_id).await.status {
            PurchaseStatus::Expired => Ok(()),
            other => Err(other),
        }
    })
    .await;
    let view: Success<CheckoutView> = client
        .act(
            &format!("/billing/subscription/checkouts/{plan_id}/reconcile"),
            StatusCode::OK,
        )
        .await;
    assert_eq!(view.body.checkout.status, CheckoutStatus::Expired);
    // A checkout made stale only now is expired by a later sweep, which passes the younger
    // one by.
    stripe.set_down(true);
    let marker = idem();
    let _: ErrorBody = keyed(&client, &marker)
        .post("/billing/checkout", &pack, StatusCode::SERVICE_UNAVAILABLE)
        .await;
    stripe.set_down(false);
    let marker_id = id_of(&marker).await.unwrap();
    age(vec![marker_id], 86_401).await.unwrap();
    eventually(Duration::from_secs(10), || async move {
        match purchase(client_ref, marker_id).await.status {
            PurchaseStatus::Expired => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert_eq!(
        purchase(&client, fresh_id).await.status,
        PurchaseStatus::Pending
    );
    // An expired checkout's key is spent; the fresh one still opens its checkout.
    let e: ErrorBody = keyed(&client, &stale)
        .post("/billing/checkout", &pack, StatusCode::CONFLICT)
        .await;
    assert!(e.error.contains("expired"), "{}", e.error);
    let _: ErrorBody = keyed(&client, &plan)
        .post(
            "/billing/subscription/checkout",
            &starter,
            StatusCode::CONFLICT,
        )
        .await;
    let opened: Success<Opened> = keyed(&client, &fresh)
        .post("/billing/checkout", &pack, StatusCode::OK)
        .await;
    assert_eq!(opened.body.id, fresh_id);
    assert_eq!(
        purchase(&client, stale_id).await.status,
        PurchaseStatus::Expired
    );
    alone.shutdown().await;
}

#[tokio::test]
async fn one_key_never_sees_anothers_purchases() {
    let (billing, _stripe) = billing_with_stripe().await;
    let ((_, alice), (_, bobs)) = (billing.key(0).await, billing.key(0).await);
    let opened = top_up(&alice, json!({"pack_id": "credits-1k"})).await;
    let _: ErrorBody = bobs
        .get(
            &format!("/billing/purchases/{}", opened.id),
            StatusCode::NOT_FOUND,
        )
        .await;
    let _: ErrorBody = bobs
        .act(
            &format!("/billing/purchases/{}/reconcile", opened.id),
            StatusCode::NOT_FOUND,
        )
        .await;
    let list: Success<PurchaseList> = bobs.get("/billing/purchases", StatusCode::OK).await;
    assert!(list.body.purchases.is_empty());
}

#[tokio::test]
async fn a_plan_follows_stripe_from_checkout_to_deletion() {
    let stripe = FakeStripe::start().await;
    let alone = BillingAlone::with_stripe(stripe.config()).await;
    let billing = &alone.billing;
    let (_, client) = billing.key(3).await;
    let anyone = billing.anonymous();
    let before = entitlements(&client).await;
    assert_eq!(before.entitlements.plan, None);
    assert_eq!(before.entitlements.emails, None);
    assert_eq!(
        (
            before.entitlements.mailboxes.limit,
            before.entitlements.custom_domains.limit
        ),
        (1, 0),
        "the free limits of the catalog"
    );
    assert_eq!(before.entitlements.legacy_credits, 3);
    let plans: Vec<&str> = before.plans.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(plans, ["starter", "pro"]);

    // No subscription yet: no portal. Unknown and malformed plans.
    let _: ErrorBody = client
        .act("/billing/subscription/portal", StatusCode::NOT_FOUND)
        .await;
    let _: ErrorBody = subscribe(&client, "gold", StatusCode::NOT_FOUND).await;
    let _: ErrorBody = subscribe(&client, &"p".repeat(41), StatusCode::BAD_REQUEST).await;

    // A plan checkout left open is expired at Stripe when a newer one opens: only the
    // newest can be paid (two paid would be two subscriptions).
    let abandoned: Success<Opened> = subscribe(&client, "pro", StatusCode::OK).await;
    let abandoned = stripe.session_by_url(&abandoned.body.url);
    let opened: Success<Opened> = subscribe(&client, "starter", StatusCode::OK).await;
    let session_id = stripe.session_by_url(&opened.body.url);
    assert_eq!(
        (
            stripe.session(&abandoned)["status"].clone(),
            stripe.session(&session_id)["status"].clone()
        ),
        (json!("expired"), json!("open"))
    );
    let session = stripe.session(&session_id);
    let checkout_id = opened.body.id.to_string();
    assert_eq!(session["mode"], "subscription");
    assert_eq!(session["client_reference_id"], checkout_id.as_str());
    assert_eq!(session["metadata"]["checkout_id"], checkout_id.as_str());
    let form = stripe.requests().last().unwrap().form.clone();
    assert!(form.contains(&(
        "line_items[0][price]".into(),
        "price_postmesh_starter_monthly".into()
    )));
    let workspace = form
        .iter()
        .find(|(k, _)| k == "subscription_data[metadata][workspace_id]")
        .map(|(_, v)| v.clone())
        .expect("workspace in the subscription's metadata");

    let completed = stripe.complete(&session_id, true);
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &completed).await,
        StatusCode::OK
    );
    let reconciled: Success<CheckoutView> = client
        .act(
            &format!("/billing/subscription/checkouts/{checkout_id}/reconcile"),
            StatusCode::OK,
        )
        .await;
    assert_eq!(reconciled.body.checkout.status, CheckoutStatus::Complete);
    let sub_id = stripe.session(&session_id)["subscription"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        stripe.subscription(&sub_id)["metadata"]["workspace_id"],
        workspace.as_str()
    );

    let now = entitlements(&client).await.entitlements;
    let plan = now.plan.expect("a plan");
    assert_eq!(
        (plan.id.as_str(), plan.name.as_str(), plan.status.as_str()),
        ("starter", "Starter", "active")
    );
    assert!(!plan.cancel_at_period_end);
    assert!(plan.period_end > plan.period_start && plan.period_start > 0);
    assert_eq!(now.emails.map(|e| e.quota), Some(10_000));
    assert_eq!((now.mailboxes.limit, now.custom_domains.limit), (3, 1));
    assert_eq!(now.model.period_start, plan.period_start);
    // Other services get the same limits over the entitlements RPC.
    let rpc = alone
        .rpc(&EntitlementsRequest {
            workspace_id: workspace.clone(),
        })
        .await
        .unwrap();
    assert_eq!(
        (
            rpc.plan_id.as_str(),
            rpc.plan_in_force,
            rpc.mailboxes,
            rpc.custom_domains,
            rpc.monthly_emails
        ),
        ("starter", true, 3, 1, Some(10_000))
    );

    // A second plan for the workspace is a conflict.
    let _: ErrorBody = subscribe(&client, "pro", StatusCode::CONFLICT).await;

    let portal: Success<PortalLink> = client
        .act("/billing/subscription/portal", StatusCode::OK)
        .await;
    assert!(portal
        .body
        .url
        .starts_with("https://billing.stripe.com/p/session/"));

    // Renewal and cancel-at-period-end, delivered out of order.
    let renewed = stripe.renew(&sub_id);
    let cancelling = stripe.cancel_at_period_end(&sub_id);
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &cancelling).await,
        StatusCode::OK
    );
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &renewed).await,
        StatusCode::OK
    );
    let later = entitlements(&client)
        .await
        .entitlements
        .plan
        .expect("a plan");
    assert!(later.cancel_at_period_end);
    assert_eq!(later.period_start, plan.period_end, "the period moved on");

    // Deleted: no plan, free limits again; a late update does not bring it back.
    let deleted = stripe.delete_subscription(&sub_id);
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &deleted).await,
        StatusCode::OK
    );
    // The event's own object ends it, though read before the stored state was.
    assert_eq!(entitlements(&client).await.entitlements.plan, None);
    let mut late = cancelling.clone();
    late["id"] = json!("evt_late_update_after_deletion");
    assert_eq!(FakeStripe::deliver_to(&anyone, &late).await, StatusCode::OK);
    let after = entitlements(&client).await.entitlements;
    assert_eq!(after.plan, None);
    assert_eq!(after.emails, None);
    assert_eq!((after.mailboxes.limit, after.custom_domains.limit), (1, 0));
    // The customer can still reach the portal (invoices), and may subscribe again.
    let _: Success<PortalLink> = client
        .act("/billing/subscription/portal", StatusCode::OK)
        .await;
    let again: Success<Opened> = subscribe(&client, "pro", StatusCode::OK).await;
    // Paid at Stripe before its event arrived: a newer checkout is a conflict, not a second
    // subscription.
    stripe.complete(&stripe.session_by_url(&again.body.url), true);
    let _: ErrorBody = subscribe(&client, "starter", StatusCode::CONFLICT).await;
    alone.shutdown().await;
}

async fn usage_counts_come_from_the_owning_services(stack: &Stack) {
    let key = stack.key(0).await;
    // Nothing owned yet: every count is 0, and entitlements answer.
    let none = entitlements(&stack.client(&key)).await.entitlements;
    assert_eq!(
        (
            none.mailboxes.used,
            none.custom_domains.used,
            none.model.executions.used
        ),
        (0, 0, 0)
    );

    // The inbound service counts the workspace's mailboxes.
    let _: Success<inbound_ingest::addresses::Created> = stack
        .client(&key)
        .post(
            "/inbox/addresses",
            &json!({ "address": format!("usage@{}", postmesh_tests::INBOUND_DOMAIN) }),
            StatusCode::CREATED,
        )
        .await;
    let counted = entitlements(&stack.client(&key)).await.entitlements;
    assert_eq!(counted.mailboxes.used, 1);
    assert_eq!(
        counted.custom_domains.used, 0,
        "the domain service's own count"
    );
}

#[tokio::test]
async fn plan_checkouts_opened_at_once_leave_one_session_open() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    // Each session takes a while at Stripe, so the two requests overlap there.
    stripe.set_session_latency(Duration::from_millis(500));
    let open = |plan: &'static str| {
        let client = keyed(&client, &idem());
        async move {
            let opened: Success<Opened> = client
                .post(
                    "/billing/subscription/checkout",
                    &json!({ "plan_id": plan }),
                    StatusCode::OK,
                )
                .await;
            opened.body.url
        }
    };
    let (a, b) = tokio::join!(open("starter"), open("pro"));
    let mut statuses: Vec<String> = [a, b]
        .iter()
        .map(|url| {
            let session = stripe.session(&stripe.session_by_url(url));
            session["status"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    statuses.sort();
    assert_eq!(statuses, ["expired", "open"]);
}

/// A plan checkout retried (its first try met Stripe down) after the workspace got its plan
/// through another checkout is a 409: no second session to pay, no second subscription.
#[tokio::test]
async fn a_plan_checkout_retried_after_a_plan_arrived_is_refused() {
    let stripe = FakeStripe::start().await;
    let alone = BillingAlone::with_stripe(stripe.config()).await;
    let billing = &alone.billing;
    let (_, client) = billing.key(0).await;
    let starter = json!({"plan_id": "starter"});
    let first = keyed(&client, &idem());
    stripe.set_down(true);
    let path = "/billing/subscription/checkout";
    let _: ErrorBody = first
        .post(path, &starter, StatusCode::SERVICE_UNAVAILABLE)
        .await;
    stripe.set_down(false);
    let opened: Success<Opened> = subscribe(&client, "starter", StatusCode::OK).await;
    let session = stripe.session_by_url(&opened.body.url);
    let completed = stripe.complete(&session, true);
    let anyone = billing.anonymous();
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &completed).await,
        StatusCode::OK
    );
    let reconcile = format!(
        "/billing/subscription/checkouts/{}/reconcile",
        opened.body.id
    );
    let _: Success<CheckoutView> = client.act(&reconcile, StatusCode::OK).await;
    assert!(entitlements(&client).await.entitlements.plan.is_some());
    let sessions = stripe.requests().len();
    let _: ErrorBody = first.post(path, &starter, StatusCode::CONFLICT).await;
    assert_eq!(stripe.requests().len(), sessions, "nothing asked of Stripe");
}

/// Plan checkouts of one workspace opened at once, more of them than the pool has
/// connections, take their turns without holding a connection while they wait: each opens,
/// and a charge made meanwhile is answered.
#[tokio::test]
async fn plan_checkouts_waiting_their_turn_hold_no_connection() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(5).await;
    stripe.set_session_latency(Duration::from_millis(300));
    let body = serde_json::to_vec(&json!({"plan_id": "starter"})).unwrap();
    let open = |_| {
        let (client, body) = (keyed(&client, &idem()), body.clone());
        async move {
            let path = "/billing/subscription/checkout";
            client.send(Method::POST, path, Some(body)).await.status
        }
    };
    // More than the pool's ten connections.
    let checkouts = join_all((0..12).map(open));
    let charge = async {
        // Once the checkouts are waiting.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let once = json!({"idempotencyKey": "during-checkouts"});
        let _: Value = client.post("/deduct", &once, StatusCode::OK).await;
    };
    let (statuses, ()) = tokio::join!(checkouts, charge);
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
}

/// Two events of one subscription handled at once: a read of Stripe asked first and answered
/// last does not overwrite what a read asked after it found (the renewal's read, held on the
/// way back, answers the subscription as it was before the cancellation).
#[tokio::test]
async fn a_subscription_read_answered_late_leaves_the_later_one() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    let anyone = billing.anonymous();
    let opened: Success<Opened> = subscribe(&client, "starter", StatusCode::OK).await;
    let session = stripe.session_by_url(&opened.body.url);
    let completed = stripe.complete(&session, true);
    assert_eq!(
        FakeStripe::deliver_to(&anyone, &completed).await,
        StatusCode::OK
    );
    let sub_id = stripe.session(&session)["subscription"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = entitlements(&client).await.entitlements.plan.unwrap();

    let renewed = stripe.renew(&sub_id);
    let held = stripe.hold_next_subscription_read();
    let meanwhile = async {
        held.arrived
            .await
            .expect("the renewal reads the subscription");
        let cancelling = stripe.cancel_at_period_end(&sub_id);
        assert_eq!(
            FakeStripe::deliver_to(&anyone, &cancelling).await,
            StatusCode::OK
        );
        let plan = entitlements(&client).await.entitlements.plan.unwrap();
        assert!(plan.cancel_at_period_end);
        held.release.send(()).unwrap();
    };
    let (late, ()) = tokio::join!(FakeStripe::deliver_to(&anyone, &renewed), meanwhile);
    assert_eq!(late, StatusCode::OK);
    let plan = entitlements(&client).await.entitlements.plan.unwrap();
    assert!(plan.cancel_at_period_end, "the later read stands");
    assert_eq!(plan.period_start, first.period_end, "the period moved on");
}

/// Delivers `event` as Stripe would: answered 200.
async fn delivered(anyone: &TestClient, event: Value) {
    assert_eq!(FakeStripe::deliver_to(anyone, &event).await, StatusCode::OK);
}

/// A refund or chargeback takes back what its payment bought, in proportion and as far as
/// it is left (never below zero), once however often and in whatever order Stripe tells it,
/// even when Stripe tells it before the payment itself; a refund and a dispute of one
/// payment add up.
#[tokio::test]
async fn money_given_back_takes_back_what_it_bought_as_far_as_it_is_left() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    let anyone = billing.anonymous();
    let deliver = |event: Value| delivered(&anyone, event);
    // 10,000 credits for 8,000 cents: a cent is 1.25 credits.
    let bought = top_up(&client, json!({"pack_id": "credits-10k"})).await;
    let session = stripe.session_by_url(&bought.url);
    deliver(stripe.complete(&session, true)).await;
    assert_eq!(balance_of(&client).await, 10_000);
    // A partial refund takes its part back, once however often it is delivered; a later
    // refund's total delivered before the earlier's counts once too.
    let first = stripe.refund(&session, 2000);
    deliver(first.clone()).await;
    deliver(first.clone()).await;
    assert_eq!(balance_of(&client).await, 7500);
    let second = stripe.refund(&session, 1000);
    deliver(second).await;
    let mut stale = first;
    stale["id"] = json!(format!("{}_late", stale["id"].as_str().unwrap()));
    deliver(stale).await;
    assert_eq!(balance_of(&client).await, 6250);
    // A credit spent, then the bank disputes the rest: refunds and the dispute together gave
    // back the whole payment, and the dispute takes what is left.
    let spend = json!({"idempotencyKey": "spent"});
    let _: Value = client.post("/deduct", &spend, StatusCode::OK).await;
    assert_eq!(balance_of(&client).await, 6249);
    deliver(stripe.dispute(&session, 5000)).await;
    assert_eq!(balance_of(&client).await, 0);

    // A refund heard of before its payment: the payment's credits come and go together.
    let second = top_up(&client, json!({"pack_id": "credits-1k"})).await;
    let session = stripe.session_by_url(&second.url);
    let paid = stripe.complete(&session, true);
    deliver(stripe.refund(&session, 1000)).await;
    deliver(paid).await;
    assert_eq!(balance_of(&client).await, 0);

    // Usage money likewise.
    let usage = top_up(&client, json!({"amount": 2500})).await;
    let session = stripe.session_by_url(&usage.url);
    deliver(stripe.complete(&session, true)).await;
    let model = entitlements(&client).await.entitlements.model;
    assert_eq!(model.balance_nano, 2500 * 10_000_000);
    deliver(stripe.dispute(&session, 1000)).await;
    assert_eq!(
        entitlements(&client).await.entitlements.model.balance_nano,
        1500 * 10_000_000
    );
}

/// An inquiry takes nothing; a chargeback takes its credits when it is opened and gives them
/// back when the seller wins it, once however often and in whatever order Stripe tells it.
#[tokio::test]
async fn a_dispute_won_gives_back_what_it_took_and_an_inquiry_takes_nothing() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    let anyone = billing.anonymous();
    let deliver = |event: Value| delivered(&anyone, event);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let bought = top_up(&client, json!({"pack_id": "credits-1k"})).await;
        let session = stripe.session_by_url(&bought.url);
        deliver(stripe.complete(&session, true)).await;
        sessions.push(session);
    }
    assert_eq!(balance_of(&client).await, 2000);
    deliver(stripe.inquiry(&sessions[0], 1000)).await;
    assert_eq!(balance_of(&client).await, 2000, "an inquiry took credits");
    let opened = stripe.dispute(&sessions[1], 1000);
    let mut withdrawn = opened.clone();
    withdrawn["id"] = json!(format!("{}_w", opened["id"].as_str().unwrap()));
    withdrawn["type"] = json!("charge.dispute.funds_withdrawn");
    deliver(opened).await;
    deliver(withdrawn.clone()).await;
    assert_eq!(balance_of(&client).await, 1000);
    let (reinstated, closed) = stripe.win_dispute(&sessions[1]);
    deliver(reinstated).await;
    assert_eq!(balance_of(&client).await, 2000);
    deliver(closed).await;
    // The withdrawal told again after the win is an older state.
    withdrawn["id"] = json!(format!("{}_late", withdrawn["id"].as_str().unwrap()));
    deliver(withdrawn).await;
    assert_eq!(balance_of(&client).await, 2000);
}

/// A refund handled while its payment is being settled is taken back all the same: the two
/// settle one after the other, the later reading what the earlier wrote.
#[tokio::test]
async fn a_refund_handled_beside_its_payment_is_taken_back() {
    let (billing, stripe) = billing_with_stripe().await;
    let (_, client) = billing.key(0).await;
    let anyone = billing.anonymous();
    let pool = billing.store.pool.clone();
    let bought = top_up(&client, json!({"pack_id": "credits-1k"})).await;
    let session = stripe.session_by_url(&bought.url);
    let paid = stripe.complete(&session, true);
    let refund = stripe.refund(&session, 1000);
    // The payment's commit is held back (a deferred trigger waits for a lock the test holds)
    // while the refund is handled.
    sqlx::raw_sql(
        "CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_lock(4242); PERFORM pg_advisory_unlock(4242); RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER hold_commit AFTER UPDATE ON purchases
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_commit();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut gate = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut *gate)
        .await
        .unwrap();
    let payment = tokio::spawn({
        let anyone = anyone.clone();
        async move { FakeStripe::deliver_to(&anyone, &paid).await }
    });
    lock_waiters_reach(&pool, 1).await;
    let refunding = tokio::spawn({
        let anyone = anyone.clone();
        async move { FakeStripe::deliver_to(&anyone, &refund).await }
    });
    // The refund is done, or waits for the payment.
    eventually(Duration::from_secs(10), || async {
        match (refunding.is_finished(), lock_waiters(&pool).await) {
            (true, _) | (_, 2) => Ok(()),
            seen => Err(seen),
        }
    })
    .await;
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut *gate)
        .await
        .unwrap();
    assert_eq!(payment.await.unwrap(), StatusCode::OK);
    assert_eq!(refunding.await.unwrap(), StatusCode::OK);
    assert_eq!(balance_of(&client).await, 0);
}
