//! Billing's router and queries with only Postgres behind them: no NATS, no gateway. The
//! router is called as the gateway forwards requests, with the caller's `AuthContext`:
//! balance, deducts (idempotent, never overdrawn), logs paged and as CSV.

use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::json;

use billing::balance::Balance;
use billing::deduct::Deducted;
use billing::ledger::{self, EntryKind};
use billing::logs::LogPage;
use postmesh_shared::error::ErrorBody;
use postmesh_shared::proto::ChargeRequest;
use postmesh_shared::{ApiKeyId, Success};
use postmesh_tests::{balance_of, passes_at_once, BillingRouter};

#[tokio::test]
async fn balance_deduct_and_logs_answer_in_the_spec_shapes() {
    let billing = BillingRouter::new().await;
    let (_, client) = billing.key(3).await;
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
    let nul: ErrorBody = client
        .post(
            "/deduct",
            &json!({ "idempotencyKey": "a\u{0}b" }),
            StatusCode::BAD_REQUEST,
        )
        .await;
    assert!(nul.error.contains("NUL"), "{}", nul.error);
    for bad in ["/logs?limit=0", "/logs?offset=-1"] {
        let e: ErrorBody = client.get(bad, StatusCode::BAD_REQUEST).await;
        assert!(!e.success);
    }
    let e: ErrorBody = client.get("/nope", StatusCode::NOT_FOUND).await;
    assert_eq!(e.error, "no such endpoint");
}

#[tokio::test]
async fn a_request_without_its_caller_is_a_500() {
    let anonymous = BillingRouter::new().await.anonymous();
    let e: ErrorBody = anonymous
        .get("/balance", StatusCode::INTERNAL_SERVER_ERROR)
        .await;
    assert_eq!(e.error, "authentication context missing");
}

#[tokio::test]
async fn concurrent_charges_of_one_key_never_overdraw() {
    let billing = BillingRouter::new().await;
    let (key, _) = billing.key(5).await;
    let store = &billing.store;
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
    let billing = BillingRouter::new().await;
    let first = billing.key(1).await.0;
    let mut keys = vec![(first, 1)];
    for credits in 2..=6 {
        keys.push((billing.key(credits).await.0, credits));
    }
    let store = &billing.store;
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

#[tokio::test]
async fn deduct_takes_one_credit_and_402s_at_zero() {
    let billing = BillingRouter::new().await;
    let (_, client) = billing.key(2).await;
    assert_eq!(balance_of(&client).await, 2);
    let body = json!({ "targetEmail": "a@example.com" });
    let d: Success<Deducted> = client.post("/deduct", &body, StatusCode::OK).await;
    assert!(d.success);
    assert_eq!(d.body.balance, 1);
    // The body is optional.
    let d: Success<Deducted> = client
        .call(Method::POST, "/deduct", None, StatusCode::OK)
        .await;
    assert_eq!(d.body.balance, 0);
    let e: ErrorBody = client
        .post("/deduct", &json!({}), StatusCode::PAYMENT_REQUIRED)
        .await;
    assert!(!e.success);
    assert_eq!(balance_of(&client).await, 0);
    let bad = json!({ "targetEmail": "not-an-email" });
    let _: ErrorBody = client.post("/deduct", &bad, StatusCode::BAD_REQUEST).await;
}

#[tokio::test]
async fn an_idempotency_key_deducts_once() {
    let billing = BillingRouter::new().await;
    let (_, client) = billing.key(10).await;
    let body = json!({ "idempotencyKey": "order-7f3a-0001", "targetEmail": "a@example.com" });
    for _ in 0..2 {
        let d: Success<Deducted> = client.post("/deduct", &body, StatusCode::OK).await;
        assert_eq!(d.body.balance, 9);
    }
    // Concurrent retries of one key still charge once.
    let retry = json!({ "idempotencyKey": "order-7f3a-0002" });
    let retries = join_all((0..10).map(|_| client.request(Method::POST, "/deduct", &retry))).await;
    assert!(
        retries.iter().all(|a| a.status == StatusCode::OK),
        "{retries:?}"
    );
    assert_eq!(balance_of(&client).await, 8);
    let empty = json!({ "idempotencyKey": "" });
    let _: ErrorBody = client
        .post("/deduct", &empty, StatusCode::BAD_REQUEST)
        .await;
    // Keys are per API key: another key's same idempotency key is its own charge.
    let (_, other) = billing.key(1).await;
    let d: Success<Deducted> = other.post("/deduct", &body, StatusCode::OK).await;
    assert_eq!(d.body.balance, 0);
    assert_eq!(balance_of(&client).await, 8);
}

#[tokio::test]
async fn concurrent_deducts_never_overdraw() {
    let billing = BillingRouter::new().await;
    let (_, client) = billing.key(20).await;
    let empty = json!({});
    let results = join_all((0..60).map(|_| client.request(Method::POST, "/deduct", &empty))).await;
    let count = |status| results.iter().filter(|a| a.status == status).count();
    let (ok, broke) = (count(StatusCode::OK), count(StatusCode::PAYMENT_REQUIRED));
    assert_eq!((ok, broke), (20, 40), "{results:?}");
    assert_eq!(balance_of(&client).await, 0);
    let logs: Success<LogPage> = client.get("/logs?limit=100", StatusCode::OK).await;
    assert_eq!(logs.body.logs.len(), 20);
}

#[tokio::test]
async fn logs_page_and_download_as_csv() {
    let billing = BillingRouter::new().await;
    let (_, client) = billing.key(130).await;
    for i in 0..120 {
        let body = json!({ "targetEmail": format!("r{i}@example.com") });
        let _: Success<Deducted> = client.post("/deduct", &body, StatusCode::OK).await;
    }
    let answer = client.send(Method::GET, "/logs", None).await;
    let page: Success<LogPage> = answer.expect(StatusCode::OK, "GET /logs");
    assert_eq!((page.body.limit, page.body.offset), (50, 0));
    assert_eq!(page.body.logs.len(), 50);
    // Newest first, with the spec's fields.
    let newest = &page.body.logs[0];
    assert_eq!(newest.target_email.as_deref(), Some("r119@example.com"));
    assert_eq!(newest.amount_deducted, 1.0);
    assert!(newest.caller_email.ends_with("@example.com"));
    assert!(!newest.log_id.is_empty() && !newest.timestamp.is_empty());
    // Fields without a value are still there, as null (the wire format, not the type).
    let raw: serde_json::Value = answer.json();
    let newest = &raw["logs"][0];
    for field in [
        "from_email",
        "subject",
        "send_mode",
        "recipient_count",
        "task_id",
    ] {
        assert!(newest.get(field).is_some(), "{field} missing");
    }
    let rest: Success<LogPage> = client
        .get("/logs?limit=500&offset=100", StatusCode::OK)
        .await;
    assert_eq!(rest.body.limit, 100);
    let rest = rest.body.logs;
    assert_eq!(rest.len(), 20);
    assert_eq!(rest[19].target_email.as_deref(), Some("r0@example.com"));
    for bad in ["/logs?limit=0", "/logs?offset=-1", "/logs?limit=abc"] {
        let _: ErrorBody = client.get(bad, StatusCode::BAD_REQUEST).await;
    }
    let res = client.send(Method::GET, "/logs/download", None).await;
    assert_eq!(res.status, StatusCode::OK);
    assert!(res.header("content-type").starts_with("text/csv"));
    let mut reader = csv::Reader::from_reader(res.body.as_slice());
    let headers = reader.headers().unwrap().clone();
    assert!(headers.iter().any(|h| h == "target_email"), "{headers:?}");
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 120);
}

/// Four billing replicas' hold sweeps at once over 200 lapsed holds: each hold is taken by
/// one sweep and given back once.
#[tokio::test]
async fn hold_sweeps_at_once_give_each_lapsed_hold_back_once() {
    let billing = BillingRouter::new().await;
    let (key, client) = billing.key(200).await;
    let db = &billing.store.pool;
    for i in 0..200 {
        let held = ChargeRequest {
            api_key_id: key.to_string(),
            caller_email: "t@example.com".into(),
            cost: 1,
            idempotency_key: format!("held-{i}"),
            hold_secs: 60,
            ..Default::default()
        };
        ledger::charge(db, &held).await.expect("a held charge");
    }
    assert_eq!(balance_of(&client).await, 0);
    // Every hold lapsed a second ago.
    sqlx::query("UPDATE ledger SET hold_until = $1 WHERE hold_until > 0")
        .bind(postmesh_shared::db::now_unix() - 1)
        .execute(db)
        .await
        .expect("holds lapsed");
    let released = passes_at_once(4, || async {
        ledger::release_expired_holds(db).await.map(|n| n as u64)
    })
    .await;
    assert_eq!(released, 200, "each hold taken once");
    assert_eq!(balance_of(&client).await, 200);
    let refunds = postmesh_tests::peek::billing::ledger_rows(db, key.into(), "refund").await;
    assert_eq!(refunds, 200);
}

/// Four billing replicas' checkout expiry at once over 1,000 checkouts never opened: each is
/// expired by one of them, once.
#[tokio::test]
async fn checkout_expiries_at_once_expire_each_unopened_checkout_once() {
    let billing = BillingRouter::new().await;
    let db = &billing.store.pool;
    let key = ApiKeyId::new();
    let made = sqlx::query(
        "INSERT INTO checkouts (id, api_key_id, idempotency_key, request, created_at)
         SELECT gen_random_uuid(), $1, 'checkout-' || n, '{}', $2
         FROM generate_series(1, 1000) AS n",
    )
    .bind(key)
    .bind(postmesh_shared::db::now_unix() - billing::checkout::UNOPENED_SECS - 10)
    .execute(db)
    .await
    .expect("checkouts");
    assert_eq!(made.rows_affected(), 1000);
    let expired = passes_at_once(4, || billing::checkout::expire_unopened(db)).await;
    assert_eq!(expired, 1000, "each checkout expired once");
}
