//! Authentication and credits through the real gateway → NATS → billing path.

use reqwest::{Method, StatusCode};
use serde_json::json;

use billing::ledger::EntryKind;
use billing::logs::LogPage;
use postmesh_shared::error::ErrorBody;
use postmesh_shared::Success;
use postmesh_tests::{eventually, peek, Stack};

#[tokio::test]
async fn requests_without_or_with_a_bad_key_are_401() {
    let stack = Stack::start().await;
    let key = stack.key(5).await;
    for path in ["/balance", "/logs/download"] {
        let e: ErrorBody = stack.anonymous().get(path, StatusCode::UNAUTHORIZED).await;
        assert!(!e.success && !e.error.is_empty());
    }
    // Well-formed but unknown, tampered secret, and garbage tokens.
    let mut tampered = key.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == '0' { '1' } else { '0' });
    let unknown = api_gateway::keys::generate().text;
    for bad in [tampered.as_str(), unknown.as_str(), "nonsense"] {
        let e: ErrorBody = stack
            .client(bad)
            .get("/balance", StatusCode::UNAUTHORIZED)
            .await;
        assert!(!e.success, "{bad}");
    }
    for path in ["/deduct", "/send-code", "/verify-code"] {
        let _: ErrorBody = stack
            .anonymous()
            .post(path, &json!({}), StatusCode::UNAUTHORIZED)
            .await;
    }
    // The real key still works after the failures (and from the cache).
    assert_eq!(stack.balance(&key).await, 5);
    assert_eq!(stack.balance(&key).await, 5);
    stack.shutdown().await;
}

#[tokio::test]
async fn unknown_routes_and_oversized_bodies_get_json_errors() {
    let stack = Stack::start().await;
    let key = stack.key(1).await;
    let client = stack.client(&key);
    let nope = client.send(Method::GET, "/nope", None).await;
    let e: ErrorBody = nope.expect(StatusCode::NOT_FOUND, "GET /nope");
    assert!(!e.success);
    assert!(nope.headers.contains_key("x-request-id"));
    // Wrong methods, on a gateway route and on a forwarded one.
    for (method, path) in [(Method::GET, "/send-code"), (Method::POST, "/balance")] {
        let e: ErrorBody = client
            .call(method, path, None, StatusCode::METHOD_NOT_ALLOWED)
            .await;
        assert!(!e.success, "{path}");
    }
    let big = "x".repeat(100 * 1024);
    let e: ErrorBody = client
        .post(
            "/deduct",
            &json!({ "targetEmail": big }),
            StatusCode::PAYLOAD_TOO_LARGE,
        )
        .await;
    assert!(!e.success);
    let _: ErrorBody = client
        .post(
            "/send-code",
            &json!({ "email": big }),
            StatusCode::PAYLOAD_TOO_LARGE,
        )
        .await;
    // Nothing was charged by the rejected requests.
    assert_eq!(stack.balance(&key).await, 1);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_large_log_downloads_within_the_message_size_limit() {
    let stack = Stack::start().await;
    let key = stack.key(1).await;
    let key_id = stack.key_id(&key).await;
    // 4000 entries with long addresses: well over 1 MiB of CSV if all were sent.
    let long = format!("{}@example.com", "a".repeat(230));
    let billing = stack.service_db(billing::SERVICE).await;
    peek::billing::insert_charges(&billing, key_id, 4000, &long).await;
    let res = stack
        .http
        .get(format!("{}/logs/download", stack.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let text = res.text().await.unwrap();
    assert!(text.len() < 1024 * 1024, "{} bytes", text.len());
    let rows: Vec<csv::StringRecord> = csv::Reader::from_reader(text.as_bytes())
        .records()
        .map(Result::unwrap)
        .collect();
    assert!(rows.len() > 2000, "{} rows", rows.len());
    stack.shutdown().await;
}

#[tokio::test]
async fn refunds_happen_once_and_void_a_charge_that_comes_late() {
    use postmesh_shared::proto::{ChargeReply, ChargeRequest, RefundReply, RefundRequest};
    use postmesh_shared::ApiError;

    let stack = Stack::start().await;
    let key = stack.key(5).await;
    let key_id = stack.key_id(&key).await.to_string();
    let charge = |idem: &str| ChargeRequest {
        api_key_id: key_id.clone(),
        caller_email: "t@example.com".into(),
        cost: 2,
        idempotency_key: idem.into(),
        ..Default::default()
    };
    let refund = |idem: &str| RefundRequest {
        api_key_id: key_id.clone(),
        charge_idempotency_key: idem.into(),
        reason: "test".into(),
        credits: 0,
    };
    let c: ChargeReply = stack.rpc(&charge("a")).await.unwrap();
    assert_eq!(c.balance, 3);
    for expected in [true, false] {
        let r: RefundReply = stack.rpc(&refund("a")).await.unwrap();
        assert_eq!((r.refunded, r.balance), (expected, 5));
    }
    // A refund that arrives before its charge voids the key: the charge then fails, twice.
    let r: RefundReply = stack.rpc(&refund("b")).await.unwrap();
    assert_eq!((r.refunded, r.balance), (false, 5));
    for _ in 0..2 {
        let late: Result<ChargeReply, ApiError> = stack.rpc(&charge("b")).await;
        assert!(matches!(late, Err(ApiError::Conflict(_))), "{late:?}");
    }
    assert_eq!(stack.balance(&key).await, 5);
    // The consumption log shows the charge and its refund, not the void.
    let logs: Success<LogPage> = stack.client(&key).get("/logs", StatusCode::OK).await;
    let kinds: Vec<EntryKind> = logs.body.logs.iter().map(|l| l.kind).collect();
    assert_eq!(kinds, [EntryKind::Refund, EntryKind::Charge]);
    stack.shutdown().await;
}

#[tokio::test]
async fn a_part_refund_gives_back_that_much_once_and_a_whole_refund_only_the_rest() {
    use postmesh_shared::proto::{
        ChargeReply, ChargeRequest, ConfirmReply, ConfirmRequest, RefundReply, RefundRequest,
    };
    use postmesh_shared::ApiError;

    let stack = Stack::start().await;
    let key = stack.key(20).await;
    let key_id = stack.key_id(&key).await.to_string();
    let charge = |idem: &str, hold_secs: i64| ChargeRequest {
        api_key_id: key_id.clone(),
        caller_email: "t@example.com".into(),
        cost: 4,
        idempotency_key: idem.into(),
        hold_secs,
        ..Default::default()
    };
    let refund = |idem: &str, credits: i64| RefundRequest {
        api_key_id: key_id.clone(),
        charge_idempotency_key: idem.into(),
        reason: "test".into(),
        credits,
    };
    let refunded = |idem: &'static str, credits: i64| {
        let (stack, req) = (&stack, refund(idem, credits));
        async move {
            let r: RefundReply = stack.rpc(&req).await.unwrap();
            (r.refunded, r.balance)
        }
    };
    let _: ChargeReply = stack.rpc(&charge("a", 0)).await.unwrap();
    assert_eq!(stack.balance(&key).await, 16);
    // One part per charge: a repeat, or another amount, moves nothing.
    assert_eq!(refunded("a", 1).await, (true, 17));
    assert_eq!(refunded("a", 1).await, (false, 17));
    assert_eq!(refunded("a", 2).await, (false, 17));
    // The whole refund gives back the rest, once; no part after it.
    assert_eq!(refunded("a", 0).await, (true, 20));
    assert_eq!(refunded("a", 0).await, (false, 20));
    assert_eq!(refunded("a", 1).await, (false, 20));
    // More than the charge is refused; a part of no charge is nothing (no void either).
    let _: ChargeReply = stack.rpc(&charge("b", 0)).await.unwrap();
    let too_much: Result<RefundReply, ApiError> = stack.rpc(&refund("b", 5)).await;
    assert!(
        matches!(too_much, Err(ApiError::BadRequest(_))),
        "{too_much:?}"
    );
    assert_eq!(refunded("none", 1).await, (false, 16));
    let _: ChargeReply = stack.rpc(&charge("none", 0)).await.unwrap();
    assert_eq!(stack.balance(&key).await, 12);
    // A held charge stays confirmable after a part refund.
    let _: ChargeReply = stack.rpc(&charge("held", 3600)).await.unwrap();
    assert_eq!(refunded("held", 3).await, (true, 11));
    let confirm = ConfirmRequest {
        api_key_id: key_id.clone(),
        charge_idempotency_key: "held".into(),
    };
    let c: ConfirmReply = stack.rpc(&confirm).await.unwrap();
    assert!(c.confirmed);
    // A hold that runs out after a part refund gives back only the rest.
    let _: ChargeReply = stack.rpc(&charge("lapsed", 2)).await.unwrap();
    assert_eq!(refunded("lapsed", 1).await, (true, 8));
    let (stack_ref, key_ref) = (&stack, &key);
    eventually(std::time::Duration::from_secs(20), || async move {
        match stack_ref.balance(key_ref).await {
            11 => Ok(()),
            other => Err(format!("the lapsed hold is not refunded: {other}")),
        }
    })
    .await;
    // A part and a whole refund of one charge at once give back the charge, no more.
    for i in 0..5 {
        let idem = format!("race-{i}");
        let _: ChargeReply = stack.rpc(&charge(&idem, 0)).await.unwrap();
        let (part, whole) = (refund(&idem, 1), refund(&idem, 0));
        let (p, w) = tokio::join!(stack.rpc(&part), stack.rpc(&whole));
        assert!(w.unwrap().refunded);
        p.unwrap();
        assert_eq!(stack.balance(&key).await, 11, "race {i}");
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn a_flood_of_made_up_keys_does_not_evict_real_ones() {
    use api_gateway::keys::{generate, KeyStore};

    let stack = Stack::start().await;
    let key = stack.key(1).await;
    let key_id = stack.key_id(&key).await;
    let db = stack.service_db(api_gateway::SERVICE).await;
    let store = KeyStore::new(db.clone(), std::time::Duration::from_secs(60), 8);
    store.authenticate(&key).await.expect("a real key");
    // Revoked in the database, the key keeps working only while it stays cached.
    peek::gateway::revoke_key(&db, key_id).await;
    for _ in 0..40 {
        let made_up = generate().text;
        assert!(store.authenticate(&made_up).await.is_err());
    }
    store
        .authenticate(&key)
        .await
        .expect("still cached after the flood");
    // A fresh store reads the revocation.
    let fresh = KeyStore::new(db, std::time::Duration::from_secs(60), 8);
    assert!(fresh.authenticate(&key).await.is_err());
    stack.shutdown().await;
}

#[tokio::test]
async fn a_held_charge_is_refunded_unless_confirmed() {
    use postmesh_shared::proto::{ChargeReply, ChargeRequest, ConfirmReply, ConfirmRequest};

    let stack = Stack::start().await;
    let key = stack.key(5).await;
    let key_id = stack.key_id(&key).await.to_string();
    let held = |idem: &str| ChargeRequest {
        api_key_id: key_id.clone(),
        caller_email: "t@example.com".into(),
        cost: 2,
        idempotency_key: idem.into(),
        hold_secs: 3,
        ..Default::default()
    };
    let confirm = |idem: &str| ConfirmRequest {
        api_key_id: key_id.clone(),
        charge_idempotency_key: idem.into(),
    };
    // "lost" stands for a caller that died before its work was queued; "kept" was confirmed.
    for idem in ["lost", "kept"] {
        let _: ChargeReply = stack.rpc(&held(idem)).await.unwrap();
    }
    let c: ConfirmReply = stack.rpc(&confirm("kept")).await.unwrap();
    assert!(c.confirmed);
    assert_eq!(stack.balance(&key).await, 1);
    let (stack_ref, key_ref) = (&stack, &key);
    eventually(std::time::Duration::from_secs(20), || async move {
        match stack_ref.balance(key_ref).await {
            3 => Ok(()),
            other => Err(format!("the unconfirmed charge is not refunded: {other}")),
        }
    })
    .await;
    // Too late for the lost one; confirming the kept one again changes nothing.
    for (idem, expected) in [("lost", false), ("kept", true)] {
        let c: ConfirmReply = stack.rpc(&confirm(idem)).await.unwrap();
        assert_eq!(c.confirmed, expected, "{idem}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(stack.balance(&key).await, 3);
    assert_eq!(stack.logs(&key).await.len(), 3);
    stack.shutdown().await;
}
