//! The billing client other services use, against the real billing service: a refund or
//! confirm billing misses is retried until it lands, and a charge whose outcome is unknown
//! never takes credits.

use std::time::{Duration, Instant};

use tokio_util::task::TaskTracker;

use postmesh_shared::clients::billing::BillingClient;
use postmesh_shared::proto::{ChargeRequest, GrantRequest};
use postmesh_shared::{ApiError, ApiKeyId, Running};
use postmesh_tests::{common, eventually, fresh_namespace, remove_namespace};

async fn start_billing(common: &postmesh_shared::Common) -> Running {
    billing::start(postmesh_tests::billing_config(
        common,
        postmesh_tests::Options::default().stripe,
    ))
    .await
    .expect("billing starts")
}

fn charge(key: ApiKeyId, idem: &str) -> ChargeRequest {
    ChargeRequest {
        api_key_id: key.to_string(),
        caller_email: "t@example.com".into(),
        cost: 2,
        idempotency_key: idem.into(),
        ..Default::default()
    }
}

/// A client and a key holding 10 credits.
async fn funded(common: &postmesh_shared::Common) -> (BillingClient, TaskTracker, ApiKeyId) {
    let nats = postmesh_tests::ops_nats(&common.nats_url).await.unwrap();
    let retries = TaskTracker::new();
    let client = BillingClient::new(nats, common.namespace.clone(), retries.clone());
    let key = ApiKeyId::new();
    let grant = GrantRequest {
        api_key_id: key.to_string(),
        account_id: uuid::Uuid::now_v7().to_string(),
        email: "t@example.com".into(),
        credits: 10,
        idempotency_key: "grant".into(),
    };
    assert_eq!(client.grant(&grant).await.unwrap().balance, 10);
    (client, retries, key)
}

async fn balance(common: &postmesh_shared::Common, key: ApiKeyId) -> i64 {
    let db = sqlx::PgPool::connect(&format!(
        "{}/{}",
        common.database_url,
        billing::SERVICE.database(&common.namespace)
    ))
    .await
    .unwrap();
    billing::ledger::current_balance(&db, key).await.unwrap()
}

#[tokio::test]
async fn a_refund_billing_misses_is_retried_until_it_lands() {
    let common = common(fresh_namespace());
    let running = start_billing(&common).await;
    let (client, retries, key) = funded(&common).await;
    let held = client.hold(charge(key, "job-1")).await.unwrap();
    assert_eq!(balance(&common, key).await, 8);
    // Billing goes away: the refund's first attempt finds no responder.
    running.stop().await;
    let started = Instant::now();
    held.refund("work failed").await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the caller does not wait"
    );
    // Billing comes back; a background retry lands the refund.
    let running = start_billing(&common).await;
    let common_ref = &common;
    eventually(Duration::from_secs(10), || async move {
        match balance(common_ref, key).await {
            10 => Ok(()),
            other => Err(format!("the refund has not landed: {other}")),
        }
    })
    .await;
    retries.close();
    retries.wait().await;
    running.stop().await;
    remove_namespace(&common).await;
}

#[tokio::test]
async fn a_charge_with_an_unknown_outcome_never_takes_credits() {
    let common = common(fresh_namespace());
    let running = start_billing(&common).await;
    let (client, retries, key) = funded(&common).await;
    running.stop().await;
    // No answer: the charge may or may not have happened, so the client voids its key.
    let lost = client.charge(charge(key, "job-2")).await;
    assert!(matches!(lost, Err(ApiError::Unavailable(_))), "{lost:?}");
    let running = start_billing(&common).await;
    retries.close();
    retries.wait().await;
    // The void landed: the same charge arriving late takes nothing.
    let late = client.charge(charge(key, "job-2")).await;
    assert!(matches!(late, Err(ApiError::Conflict(_))), "{late:?}");
    assert_eq!(balance(&common, key).await, 10);
    // Other charges go through.
    assert_eq!(
        client.charge(charge(key, "job-3")).await.unwrap().balance,
        8
    );
    running.stop().await;
    remove_namespace(&common).await;
}
