//! Billing's router and queries with only Postgres behind them: no NATS, no gateway. The
//! router is called as the gateway forwards requests, with the caller's `AuthContext`.

use reqwest::StatusCode;
use serde_json::json;

use billing::balance::Balance;
use billing::deduct::Deducted;
use billing::ledger::{self, EntryKind};
use billing::logs::LogPage;
use postmesh_shared::error::ErrorBody;
use postmesh_shared::proto::{AuthContext, ChargeRequest, GrantRequest};
use postmesh_shared::{ApiKeyId, Success};
use postmesh_tests::{ServiceDb, TestClient};

/// Billing's database with a key holding `credits`; its router called by that key.
async fn billing_with_key(credits: i64) -> (ServiceDb, ApiKeyId, TestClient) {
    let store = ServiceDb::create(billing::SERVICE, &[&billing::MIGRATOR]).await;
    let key = ApiKeyId::new();
    let account = uuid::Uuid::now_v7().to_string();
    ledger::grant(
        &mut store.pool.acquire().await.unwrap(),
        &GrantRequest {
            api_key_id: key.to_string(),
            account_id: account.clone(),
            email: "owner@example.com".into(),
            credits,
            idempotency_key: format!("grant:{key}"),
        },
    )
    .await
    .unwrap();
    let auth = AuthContext {
        account_id: account.clone(),
        workspace_id: account,
        api_key_id: key.to_string(),
        key_id: key.to_string(),
        role: postmesh_shared::proto::Role::Member.into(),
        email: "owner@example.com".into(),
    };
    let router = billing::router(billing::AppState::new(store.pool.clone()));
    (store, key, TestClient::router(router, Some(auth)))
}

#[tokio::test]
async fn balance_deduct_and_logs_answer_in_the_spec_shapes() {
    let (_store, _key, client) = billing_with_key(3).await;
    let b: Success<Balance> = client.get("/balance", StatusCode::OK).await;
    assert!(b.success);
    assert_eq!(b.body.balance, 3);
    let body = json!({ "idempotencyKey": "order-1", "targetEmail": "a@example.com" });
    for _ in 0..2 {
        let d: Success<Deducted> = client.post("/deduct", &body, StatusCode::OK).await;
        assert_eq!(d.body.balance, 2);
    }
    let page: Success<LogPage> = client.get("/logs?limit=500", StatusCode::OK).await;
    assert_eq!((page.body.limit, page.body.offset), (100, 0));
    assert_eq!(page.body.logs.len(), 1);
    let entry = &page.body.logs[0];
    assert_eq!(entry.kind, EntryKind::Charge);
    assert_eq!(entry.amount_deducted, 1.0);
    assert_eq!(entry.target_email.as_deref(), Some("a@example.com"));
    for bad in ["/logs?limit=0", "/logs?offset=-1"] {
        let e: ErrorBody = client.get(bad, StatusCode::BAD_REQUEST).await;
        assert!(!e.success);
    }
    let e: ErrorBody = client.get("/nope", StatusCode::NOT_FOUND).await;
    assert_eq!(e.error, "no such endpoint");
}

#[tokio::test]
async fn a_request_without_its_caller_is_a_500() {
    let (store, _key, _) = billing_with_key(1).await;
    let router = billing::router(billing::AppState::new(store.pool.clone()));
    let anonymous = TestClient::router(router, None);
    let e: ErrorBody = anonymous
        .get("/balance", StatusCode::INTERNAL_SERVER_ERROR)
        .await;
    assert_eq!(e.error, "authentication context missing");
}

#[tokio::test]
async fn concurrent_charges_of_one_key_never_overdraw() {
    let (store, key, _) = billing_with_key(5).await;
    let charges = (0..20).map(|i| {
        let db = store.pool.clone();
        async move {
            let req = ChargeRequest {
                api_key_id: key.to_string(),
                caller_email: "owner@example.com".into(),
                cost: 1,
                idempotency_key: format!("c{i}"),
                ..Default::default()
            };
            ledger::charge(&db, &req).await
        }
    });
    let results = futures::future::join_all(charges).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 5);
    assert!(results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .all(|e| matches!(e, ledger::LedgerError::InsufficientBalance)));
    assert_eq!(ledger::current_balance(&store.pool, key).await.unwrap(), 0);
}

#[tokio::test]
async fn balance_reads_waiting_together_share_one_query_and_each_gets_its_own_key() {
    let (store, first, _) = billing_with_key(1).await;
    let mut keys = vec![(first, 1)];
    for credits in 2..=6 {
        let key = ApiKeyId::new();
        ledger::grant(
            &mut store.pool.acquire().await.unwrap(),
            &GrantRequest {
                api_key_id: key.to_string(),
                account_id: uuid::Uuid::now_v7().to_string(),
                email: "owner@example.com".into(),
                credits,
                idempotency_key: format!("grant:{key}"),
            },
        )
        .await
        .unwrap();
        keys.push((key, credits));
    }
    keys.push((ApiKeyId::new(), 0)); // never granted
    let reads = billing::balance::BalanceReads::new(store.pool.clone());
    let mut watch = store.pool.acquire().await.unwrap();
    // Every query waits behind this lock until it is released.
    let mut lock = store.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE balances IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let waiting: Vec<_> = (0..100)
        .map(|i| {
            let (reads, (key, credits)) = (reads.clone(), keys[i % keys.len()]);
            tokio::spawn(async move { (reads.read(key).await.unwrap(), credits) })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while blocked(&mut watch).await < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "no query reached the lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // 100 reads wait, in one query: the rest share the next one.
    assert_eq!(blocked(&mut watch).await, 1);
    lock.commit().await.unwrap();
    for read in waiting {
        let (balance, credits) = read.await.unwrap();
        assert_eq!(balance, credits);
    }
    // A read after a write sees it.
    let charge = ChargeRequest {
        api_key_id: first.to_string(),
        caller_email: "owner@example.com".into(),
        cost: 1,
        idempotency_key: "after".into(),
        ..Default::default()
    };
    ledger::charge(&store.pool, &charge).await.unwrap();
    assert_eq!(reads.read(first).await.unwrap(), 0);
}

/// Queries of this database waiting for a lock.
async fn blocked(watch: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(watch)
    .await
    .unwrap()
}
