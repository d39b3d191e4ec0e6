//! Billing's RPCs on NATS with billing running alone (no gateway, no other service):
//! refunds once and voids, part refunds, held charges given back unless confirmed, and the
//! sender's settlement sweeps asking it.

use reqwest::StatusCode;

use billing::ledger::EntryKind;
use billing::logs::LogPage;
use postmesh_shared::proto::{
    ChargeReply, ChargeRequest, ConfirmReply, ConfirmRequest, RefundReply, RefundRequest,
};
use postmesh_shared::{ApiError, ApiKeyId, Success, TaskId};
use postmesh_tests::{
    balance_of, eventually, passes_at_once, peek, sender_state, BillingAlone, ServiceDb,
};

/// A charge of `cost` to `key` under `idem`, held `hold_secs` (0: not held).
fn charge(key: ApiKeyId, idem: &str, cost: i64, hold_secs: i64) -> ChargeRequest {
    ChargeRequest {
        api_key_id: key.to_string(),
        caller_email: "t@example.com".into(),
        cost,
        idempotency_key: idem.into(),
        hold_secs,
        ..Default::default()
    }
}

/// A refund of `credits` (0: the whole charge) of `key`'s charge `idem`.
fn refund(key: ApiKeyId, idem: &str, credits: i64) -> RefundRequest {
    RefundRequest {
        api_key_id: key.to_string(),
        charge_idempotency_key: idem.into(),
        reason: "test".into(),
        credits,
    }
}

/// Confirms `key`'s held charge `idem`.
fn confirm(key: ApiKeyId, idem: &str) -> ConfirmRequest {
    ConfirmRequest {
        api_key_id: key.to_string(),
        charge_idempotency_key: idem.into(),
    }
}

#[tokio::test]
async fn refunds_happen_once_and_void_a_charge_that_comes_late() {
    let alone = BillingAlone::start().await;
    let (key, client) = alone.billing.key(5).await;
    let charge = |idem: &str| charge(key, idem, 2, 0);
    let refund = |idem: &str| refund(key, idem, 0);
    let c: ChargeReply = alone.rpc(&charge("a")).await.unwrap();
    assert_eq!(c.balance, 3);
    for expected in [true, false] {
        let r: RefundReply = alone.rpc(&refund("a")).await.unwrap();
        assert_eq!((r.refunded, r.balance), (expected, 5));
    }
    // A refund that arrives before its charge voids the key: the charge then fails, twice.
    let r: RefundReply = alone.rpc(&refund("b")).await.unwrap();
    assert_eq!((r.refunded, r.balance), (false, 5));
    for _ in 0..2 {
        let late: Result<ChargeReply, ApiError> = alone.rpc(&charge("b")).await;
        assert!(matches!(late, Err(ApiError::Conflict(_))), "{late:?}");
    }
    assert_eq!(balance_of(&client).await, 5);
    // The consumption log shows the charge and its refund, not the void.
    let logs: Success<LogPage> = client.get("/logs", StatusCode::OK).await;
    let kinds: Vec<EntryKind> = logs.body.logs.iter().map(|l| l.kind).collect();
    assert_eq!(kinds, [EntryKind::Refund, EntryKind::Charge]);
    alone.shutdown().await;
}

#[tokio::test]
async fn a_part_refund_gives_back_that_much_once_and_a_whole_refund_only_the_rest() {
    let alone = BillingAlone::start().await;
    let (key, client) = alone.billing.key(20).await;
    let charge = |idem: &str, hold_secs: i64| charge(key, idem, 4, hold_secs);
    let refund = |idem: &str, credits: i64| refund(key, idem, credits);
    let refunded = |idem: &'static str, credits: i64| {
        let (alone, req) = (&alone, refund(idem, credits));
        async move {
            let r: RefundReply = alone.rpc(&req).await.unwrap();
            (r.refunded, r.balance)
        }
    };
    let _: ChargeReply = alone.rpc(&charge("a", 0)).await.unwrap();
    assert_eq!(balance_of(&client).await, 16);
    // One part per charge: a repeat, or another amount, moves nothing.
    assert_eq!(refunded("a", 1).await, (true, 17));
    assert_eq!(refunded("a", 1).await, (false, 17));
    assert_eq!(refunded("a", 2).await, (false, 17));
    // The whole refund gives back the rest, once; no part after it.
    assert_eq!(refunded("a", 0).await, (true, 20));
    assert_eq!(refunded("a", 0).await, (false, 20));
    assert_eq!(refunded("a", 1).await, (false, 20));
    // More than the charge is refused; a part of no charge is nothing (no void either).
    let _: ChargeReply = alone.rpc(&charge("b", 0)).await.unwrap();
    let too_much: Result<RefundReply, ApiError> = alone.rpc(&refund("b", 5)).await;
    assert!(
        matches!(too_much, Err(ApiError::BadRequest(_))),
        "{too_much:?}"
    );
    assert_eq!(refunded("none", 1).await, (false, 16));
    let _: ChargeReply = alone.rpc(&charge("none", 0)).await.unwrap();
    assert_eq!(balance_of(&client).await, 12);
    // A held charge stays confirmable after a part refund.
    let _: ChargeReply = alone.rpc(&charge("held", 3600)).await.unwrap();
    assert_eq!(refunded("held", 3).await, (true, 11));
    let c: ConfirmReply = alone.rpc(&confirm(key, "held")).await.unwrap();
    assert!(c.confirmed);
    // A hold that runs out after a part refund gives back only the rest.
    let _: ChargeReply = alone.rpc(&charge("lapsed", 2)).await.unwrap();
    assert_eq!(refunded("lapsed", 1).await, (true, 8));
    let client_ref = &client;
    eventually(std::time::Duration::from_secs(20), || async move {
        match balance_of(client_ref).await {
            11 => Ok(()),
            other => Err(format!("the lapsed hold is not refunded: {other}")),
        }
    })
    .await;
    // A part and a whole refund of one charge at once give back the charge, no more.
    for i in 0..5 {
        let idem = format!("race-{i}");
        let _: ChargeReply = alone.rpc(&charge(&idem, 0)).await.unwrap();
        let (part, whole) = (refund(&idem, 1), refund(&idem, 0));
        let (p, w) = tokio::join!(alone.rpc(&part), alone.rpc(&whole));
        assert!(w.unwrap().refunded);
        p.unwrap();
        assert_eq!(balance_of(&client).await, 11, "race {i}");
    }
    alone.shutdown().await;
}

#[tokio::test]
async fn a_held_charge_is_refunded_unless_confirmed() {
    let alone = BillingAlone::start().await;
    let (key, client) = alone.billing.key(5).await;
    let held = |idem: &str| charge(key, idem, 2, 3);
    let confirm = |idem: &str| confirm(key, idem);
    // "lost" stands for a caller that died before its work was queued; "kept" was confirmed.
    for idem in ["lost", "kept"] {
        let _: ChargeReply = alone.rpc(&held(idem)).await.unwrap();
    }
    let c: ConfirmReply = alone.rpc(&confirm("kept")).await.unwrap();
    assert!(c.confirmed);
    assert_eq!(balance_of(&client).await, 1);
    let client_ref = &client;
    eventually(std::time::Duration::from_secs(20), || async move {
        match balance_of(client_ref).await {
            3 => Ok(()),
            other => Err(format!("the unconfirmed charge is not refunded: {other}")),
        }
    })
    .await;
    // Too late for the lost one; confirming the kept one again changes nothing.
    for (idem, expected) in [("lost", false), ("kept", true)] {
        let c: ConfirmReply = alone.rpc(&confirm(idem)).await.unwrap();
        assert_eq!(c.confirmed, expected, "{idem}");
    }
    // No hold is left running, so the sweep has nothing more to give back.
    assert_eq!(
        peek::billing::running_holds(&alone.billing.store.pool).await,
        0
    );
    assert_eq!(balance_of(&client).await, 3);
    let logs: Success<LogPage> = client.get("/logs", StatusCode::OK).await;
    assert_eq!(logs.body.logs.len(), 3);
    alone.shutdown().await;
}

/// Two sender replicas' settlement sweeps at once (four passes a round) over 120 due
/// settlements of held charges, half confirms and half refunds: billing is asked about each
/// once, and each is settled.
#[tokio::test]
async fn settlement_sweeps_at_once_settle_each_due_settlement_once() {
    use sender::sending::settle::{self, Action, Charge};
    let alone = BillingAlone::start().await;
    let (key, client) = alone.billing.key(200).await;
    let store = ServiceDb::within(
        alone.billing.store.common.namespace.clone(),
        sender::SERVICE,
        &sender::MIGRATIONS,
    )
    .await;
    let state = sender_state(&store).await;
    for i in 0..120 {
        let task = TaskId::new();
        let _: ChargeReply = alone
            .rpc(&charge(key, &task.to_string(), 1, 3600))
            .await
            .unwrap();
        let action = if i % 2 == 0 {
            Action::Confirm
        } else {
            Action::Refund
        };
        let owed = Charge {
            task_id: task,
            action,
            api_key_id: key.into(),
            account_id: String::new(),
            caller_email: "t@example.com".into(),
            cost: 1,
        };
        settle::owe(&mut store.pool.acquire().await.unwrap(), &owed)
            .await
            .unwrap();
        if action == Action::Refund {
            // A refund waits for its send's confirm: here, one settled before.
            let confirmed = Charge {
                action: Action::Confirm,
                ..owed
            };
            settle::owe(&mut store.pool.acquire().await.unwrap(), &confirmed)
                .await
                .unwrap();
            sqlx::query(
                "UPDATE settlements SET done_at = 1, outcome = 'confirmed'
                 WHERE task_id = $1 AND action = 'confirm'",
            )
            .bind(task)
            .execute(&store.pool)
            .await
            .unwrap();
        }
    }
    assert_eq!(balance_of(&client).await, 80);
    let settled = passes_at_once(4, || settle::sweep(&state)).await;
    assert_eq!(settled, 120);
    let rows: Vec<(String, i32, Option<i64>, Option<String>)> = sqlx::query_as(
        "SELECT action, attempts, done_at, outcome FROM settlements WHERE done_at IS DISTINCT FROM 1",
    )
    .fetch_all(&store.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 120);
    for (action, attempts, done_at, outcome) in rows {
        assert_eq!(attempts, 1, "a {action} was tried {attempts} times");
        assert!(done_at.is_some(), "a {action} is not settled: {outcome:?}");
        let expected = if action == "confirm" {
            "confirmed"
        } else {
            "refunded"
        };
        assert_eq!(outcome.as_deref(), Some(expected));
    }
    assert_eq!(balance_of(&client).await, 140);
    alone.shutdown().await;
}
