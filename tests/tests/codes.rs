//! Verification codes end to end: gateway → billing charge → JetStream → sender → .eml.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use postmesh_shared::error::ErrorBody;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::response::Message;
use postmesh_shared::Success;
use postmesh_tests::{eventually, peek, SenderMode, Stack, TestClient};

async fn a_delivered_code_verifies_once(stack: &Stack) {
    let key = stack.key(10).await;
    let to = "alice@example.com";
    let sent: Success<Message> = stack
        .send_code(&key, to)
        .await
        .expect(StatusCode::OK, "send_code");
    assert!(sent.success && !sent.body.message.is_empty());
    let code = stack.code_sent_to(to, 1).await;
    let eml = &stack.messages_to(to)[0];
    assert!(eml.contains("From: codes@postmesh.test"), "{eml}");
    assert_eq!(stack.balance(&key).await, 9);

    stack.verify_ok(&key, to, &code).await;
    assert_eq!(stack.balance(&key).await, 8);
    // Both charges were confirmed once their work was done: no hold is left to expire.
    let billing = stack.service_db(billing::SERVICE).await;
    let key_id = stack.key_id(&key).await;
    assert_eq!(peek::billing::open_holds(&billing, key_id).await, 0);
    // A used code is gone: the same code again is 404, and refunded.
    let e: ErrorBody = stack
        .verify(&key, to, &code)
        .await
        .expect(StatusCode::NOT_FOUND, "verify");
    assert!(!e.success);
    assert_eq!(stack.balance(&key).await, 8);
    // The code never rests in Redis in plain text.
    let mut conn = stack.redis().await;
    let s = stack.send_code(&key, "bob@example.com").await.status;
    assert_eq!(s, StatusCode::OK);
    let code = stack.code_sent_to("bob@example.com", 1).await;
    let keys = stack.redis_keys("*").await;
    assert!(!keys.is_empty());
    for k in keys {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&dump).contains(&code),
            "{k} holds the code"
        );
        assert!(!k.contains(&code));
    }
}

/// The Redis Cluster hash tag of a key: the text between its first `{` and the next `}`.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

async fn all_keys_of_one_recipient_share_a_cluster_slot(stack: &Stack) {
    let key = stack.key(5).await;
    let to = "Slot@Example.com";
    let s = stack.send_code(&key, to).await.status;
    assert_eq!(s, StatusCode::OK);
    stack.code_sent_to(to, 1).await;
    let keys = stack.redis_keys("code:*slot@example.com*").await;
    // The code, its cooldown and the hourly counter, all under one tag: the scripts and the
    // pending-code swap touch them together, which Redis Cluster allows within one slot only.
    assert_eq!(keys.len(), 3, "{keys:?}");
    let tags: std::collections::HashSet<_> = keys.iter().map(|k| hash_tag(k)).collect();
    assert_eq!(tags.len(), 1, "{keys:?}");
    assert!(tags
        .iter()
        .all(|t| t.is_some_and(|t| t.contains("slot@example.com"))));
}

/// Rules of one code at a time, each on its own key and recipients, on one stack.
#[tokio::test]
async fn code_rules() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            wrong_and_malformed_codes_are_400,
            five_wrong_attempts_void_the_code,
            codes_cost_credits_and_402_at_zero,
            recipients_are_matched_without_regard_to_case,
            a_delivered_code_verifies_once,
            all_keys_of_one_recipient_share_a_cluster_slot,
            resends_are_limited_with_retry_after,
            a_charge_that_outlives_the_gateway_timeout_never_takes_credits,
            two_gateways_share_a_codes_cooldown_tries_and_use
        ]
    );
}

async fn wrong_and_malformed_codes_are_400(stack: &Stack) {
    let key = stack.key(20).await;
    let to = "carol@example.com";
    stack.send_code(&key, to).await;
    let code = stack.code_sent_to(to, 1).await;
    let wrong = format!("{:06}", (code.parse::<u32>().unwrap() + 1) % 1_000_000);
    let e: ErrorBody = stack
        .verify(&key, to, wrong)
        .await
        .expect(StatusCode::BAD_REQUEST, "verify");
    assert!(!e.success);
    for bad in [
        json!("12345"),
        json!("1234567"),
        json!("12a456"),
        json!(123456),
        json!(null),
    ] {
        let e: ErrorBody = stack
            .verify(&key, to, &bad)
            .await
            .expect(StatusCode::BAD_REQUEST, &format!("verify {bad}"));
        assert!(!e.success);
    }
    let s = stack.verify(&key, "nope", &code).await.status;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    for bad in [
        json!({ "email": "not an email" }),
        json!({}),
        json!({ "email": 5 }),
    ] {
        let _: ErrorBody = stack
            .client(&key)
            .post("/send-code", &bad, StatusCode::BAD_REQUEST)
            .await;
    }
    let _: ErrorBody = stack
        .client(&key)
        .call(Method::POST, "/send-code", None, StatusCode::BAD_REQUEST)
        .await;
    // Malformed input costs nothing; the one wrong guess and the send did.
    assert_eq!(stack.balance(&key).await, 18);
    // One wrong guess does not void the code.
    stack.verify_ok(&key, to, &code).await;
    // A code for another address is not found.
    let s = stack.verify(&key, "dave@example.com", &code).await.status;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

async fn five_wrong_attempts_void_the_code(stack: &Stack) {
    let key = stack.key(20).await;
    let to = "eve@example.com";
    stack.send_code(&key, to).await;
    let code = stack.code_sent_to(to, 1).await;
    let n: u32 = code.parse().unwrap();
    for i in 1..=5 {
        let wrong = format!("{:06}", (n + i) % 1_000_000);
        let _: ErrorBody = stack
            .verify(&key, to, wrong)
            .await
            .expect(StatusCode::BAD_REQUEST, &format!("attempt {i}"));
    }
    // The right code no longer works: the code is void.
    let _: ErrorBody = stack
        .verify(&key, to, &code)
        .await
        .expect(StatusCode::NOT_FOUND, "verify");
}

async fn codes_cost_credits_and_402_at_zero(stack: &Stack) {
    let key = stack.key(1).await;
    let s = stack.send_code(&key, "frank@example.com").await.status;
    assert_eq!(s, StatusCode::OK);
    let code = stack.code_sent_to("frank@example.com", 1).await;
    assert_eq!(stack.balance(&key).await, 0);
    let e: ErrorBody = stack
        .verify(&key, "frank@example.com", &code)
        .await
        .expect(StatusCode::PAYMENT_REQUIRED, "verify");
    assert!(!e.success);
    let _: ErrorBody = stack
        .send_code(&key, "grace@example.com")
        .await
        .expect(StatusCode::PAYMENT_REQUIRED, "send_code");
    // A refused send sends nothing and is not counted against the recipient's cooldown:
    // asking again is another 402, not a 429.
    assert!(stack.messages_to("grace@example.com").is_empty());
    let s = stack.send_code(&key, "grace@example.com").await.status;
    assert_eq!(s, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(stack.logs(&key).await.len(), 1);
}

async fn resends_are_limited_with_retry_after(stack: &Stack) {
    let key = stack.key(10).await;
    let to = "heidi@example.com";
    let s = stack.send_code(&key, to).await.status;
    assert_eq!(s, StatusCode::OK);
    let refused = stack.send_code(&key, to).await;
    let e: ErrorBody = refused.expect(StatusCode::TOO_MANY_REQUESTS, "a resend");
    assert!(!e.success);
    let wait: u64 = refused.header("retry-after").parse().unwrap();
    assert!((1..=stack.codes.cooldown_secs).contains(&wait), "{wait}");
    // The refused resend was not charged; other recipients are unaffected.
    assert_eq!(stack.balance(&key).await, 9);
    let s = stack.send_code(&key, "ivan@example.com").await.status;
    assert_eq!(s, StatusCode::OK);
    // Once the cooldown is over, the hourly cap still stops a flood to one address.
    let mut conn = stack.redis().await;
    let keys = stack.redis_keys("code:*").await;
    let hourly = keys
        .iter()
        .find(|k| k.contains(":hourly:") && k.ends_with(&format!("{to}}}")))
        .expect("hourly counter");
    let cooldown = hourly.replace(":hourly:", ":cooldown:");
    let _: () = redis::cmd("SET")
        .arg(hourly)
        .arg(stack.codes.hourly_cap)
        .arg("EX")
        .arg(1800)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&cooldown)
        .query_async(&mut conn)
        .await
        .unwrap();
    let refused = stack.send_code(&key, to).await;
    let _: ErrorBody = refused.expect(StatusCode::TOO_MANY_REQUESTS, "a flood");
    let wait: u64 = refused.header("retry-after").parse().unwrap();
    assert!((1700..=1800).contains(&wait), "{wait}");
}

#[tokio::test]
async fn a_code_queued_while_the_sender_is_down_is_delivered_when_it_returns() {
    let mut stack = Stack::start_with(SenderMode::ChildProcess).await;
    let key = stack.key(5).await;
    // Warm-up: the sender process is up and delivering.
    stack.send_code(&key, "warm@example.com").await;
    stack.code_sent_to("warm@example.com", 1).await;

    stack.kill_sender().await;
    let to = "judy@example.com";
    stack.send_code_ok(&key, to).await;
    // With no sender running, its job waits on SEND and nothing is delivered.
    eventually(std::time::Duration::from_secs(10), || async {
        match stack.waiting(Stream::Send).await {
            0 => Err("SEND is empty"),
            _ => Ok(()),
        }
    })
    .await;
    assert!(stack.messages_to(to).is_empty());

    stack.start_sender().await;
    let code = stack.code_sent_to(to, 1).await;
    stack.verify_ok(&key, to, &code).await;
    // Delivered exactly once.
    stack.sends_done().await;
    assert_eq!(stack.messages_to(to).len(), 1);
    stack.shutdown().await;
}

/// A second gateway replica shares each code's cooldown, its tries and its use: driven
/// through both alternately, a recipient gets the limits of one gateway.
async fn two_gateways_share_a_codes_cooldown_tries_and_use(stack: &Stack) {
    let (replica, other) = stack.another_gateway(|_| {}).await;
    let key = stack.key(20).await;
    let (here, there) = (stack.client(&key), TestClient::http(&other, Some(&key)));
    let send = |client: &TestClient, to: &str| {
        let (client, body) = (client.clone(), json!({ "email": to }));
        async move { client.request(Method::POST, "/send-code", &body).await }
    };
    let verify = |client: &TestClient, to: &str, code: &str| {
        let (client, body) = (client.clone(), json!({ "email": to, "code": code }));
        async move { client.request(Method::POST, "/verify-code", &body).await }
    };
    let to = "judy@example.com";
    assert_eq!(send(&here, to).await.status, StatusCode::OK);
    let _: ErrorBody = send(&there, to).await.expect(
        StatusCode::TOO_MANY_REQUESTS,
        "a resend through the other gateway",
    );
    // Five wrong tries, through each gateway in turn, void the code for both.
    let code = stack.code_sent_to(to, 1).await;
    let n: u32 = code.parse().unwrap();
    for i in 1..=5 {
        let client = if i % 2 == 0 { &here } else { &there };
        let wrong = format!("{:06}", (n + i) % 1_000_000);
        let _: ErrorBody = verify(client, to, &wrong)
            .await
            .expect(StatusCode::BAD_REQUEST, &format!("wrong try {i}"));
    }
    for client in [&here, &there] {
        let _: ErrorBody = verify(client, to, &code)
            .await
            .expect(StatusCode::NOT_FOUND, "the voided code");
    }
    // A code sent through one and used through the other is gone for both.
    let to = "kim@example.com";
    assert_eq!(send(&there, to).await.status, StatusCode::OK);
    let code = stack.code_sent_to(to, 1).await;
    assert_eq!(verify(&here, to, &code).await.status, StatusCode::OK);
    let _: ErrorBody = verify(&there, to, &code)
        .await
        .expect(StatusCode::NOT_FOUND, "the used code");
    replica.stop().await;
}

async fn recipients_are_matched_without_regard_to_case(stack: &Stack) {
    let key = stack.key(10).await;
    let s = stack.send_code(&key, "Olivia@Example.com").await.status;
    assert_eq!(s, StatusCode::OK);
    // The same mailbox in other case shares the cooldown...
    let s = stack.send_code(&key, "oLIVIA@example.COM").await.status;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    // ...and the code.
    let code = stack.code_sent_to("Olivia@Example.com", 1).await;
    stack.verify_ok(&key, "olivia@example.com", &code).await;
}

/// Lifts the resend cooldown of every recipient in the stack (as if a minute passed).
async fn end_cooldowns(stack: &Stack) {
    let mut conn = stack.redis().await;
    let keys = stack.redis_keys("code:cooldown:*").await;
    let _: () = redis::cmd("DEL")
        .arg(keys)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_resend_replaces_the_code_and_a_failed_resend_keeps_it() {
    let stack = Stack::start().await;
    let key = stack.key(10).await;
    let to = "peggy@example.com";
    stack.send_code(&key, to).await;
    let first = stack.code_sent_to(to, 1).await;
    end_cooldowns(&stack).await;
    let s = stack.send_code(&key, to).await.status;
    assert_eq!(s, StatusCode::OK);
    let messages = stack
        .wait_for_messages(to, 2, Duration::from_secs(15))
        .await;
    assert_eq!(messages.len(), 2, "one message per send");
    let codes: Vec<String> = messages
        .iter()
        .map(|m| postmesh_tests::extract_code(m).expect("a code in each message"))
        .collect();
    assert!(codes.contains(&first), "{codes:?}");
    // Two random 6-digit codes are equal once in a million runs; then the resend did not
    // replace anything visible, and this fails loudly rather than skipping the check.
    let second = codes
        .iter()
        .find(|c| **c != first)
        .expect("the resend carries a new code");
    // The first code was replaced.
    let s = stack.verify(&key, to, &first).await.status;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    stack.verify_ok(&key, to, second).await;

    // A send whose email cannot be queued is a 503 (retry), refunded, and the code before it
    // stays.
    let to = "rupert@example.com";
    stack.send_code(&key, to).await;
    let code = stack.code_sent_to(to, 1).await;
    let before = stack.balance(&key).await;
    let nats = postmesh_tests::ops_nats(&stack.common.nats_url)
        .await
        .unwrap();
    async_nats::jetstream::new(nats)
        .delete_stream(stack.ns().stream("SEND"))
        .await
        .unwrap();
    end_cooldowns(&stack).await;
    let e: ErrorBody = stack
        .send_code(&key, to)
        .await
        .expect(StatusCode::SERVICE_UNAVAILABLE, "send_code");
    assert!(!e.success);
    assert_eq!(stack.balance(&key).await, before);
    // Not counted against the cooldown either.
    let s = stack.send_code(&key, to).await.status;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    stack.verify_ok(&key, to, &code).await;
    stack.shutdown().await;
}

async fn a_charge_that_outlives_the_gateway_timeout_never_takes_credits(stack: &Stack) {
    // A gateway that waits 1 s for an RPC.
    let (impatient, base) = stack
        .another_gateway(|c| c.common.upstream_timeout = Duration::from_secs(1))
        .await;
    let key = stack.key(3).await;
    let key_id = stack.key_id(&key).await;
    let billing = stack.service_db(billing::SERVICE).await;
    // Hold the balance row so billing's charge blocks past the gateway's timeout.
    let mut lock = billing.begin().await.unwrap();
    peek::billing::lock_balance(&mut lock, key_id).await;
    let to = "late@example.com";
    let e: ErrorBody = TestClient::http(&base, Some(&key))
        .request(Method::POST, "/send-code", &json!({ "email": to }))
        .await
        .expect(StatusCode::BAD_GATEWAY, "send_code");
    assert!(!e.success);
    // The gateway gave up on the charge and voided its key while billing still waits.
    let billing_db = &billing;
    eventually(Duration::from_secs(20), || async move {
        match peek::billing::ledger_rows(billing_db, key_id, "void").await {
            1 => Ok(()),
            voids => Err(format!("the charge is not voided: {voids} voids")),
        }
    })
    .await;
    lock.rollback().await.unwrap();
    // The late charge now runs into the void and takes nothing.
    eventually(Duration::from_secs(10), || async move {
        match peek::billing::charges_running(billing_db).await {
            0 => Ok(()),
            running => Err(format!("the late charge is still running: {running}")),
        }
    })
    .await;
    assert_eq!(
        peek::billing::ledger_rows(&billing, key_id, "charge").await,
        0
    );
    assert_eq!(stack.balance(&key).await, 3);
    assert!(stack.messages_to(to).is_empty());
    // The failure lifted the cooldown: a retry goes through and costs one credit.
    stack.send_code_ok(&key, to).await;
    let code = stack.code_sent_to(to, 1).await;
    stack.verify_ok(&key, to, &code).await;
    assert_eq!(stack.balance(&key).await, 1);
    assert_eq!(stack.logs(&key).await.len(), 2);
    impatient.stop().await;
}
