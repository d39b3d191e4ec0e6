//! Through the real gateway → NATS → billing path: authentication, unknown routes and
//! oversized bodies, the key cache under a flood of made-up keys, and a log download as
//! large as a NATS message allows.

use reqwest::{Method, StatusCode};
use serde_json::json;

use postmesh_shared::error::ErrorBody;
use postmesh_tests::{peek, Stack};

/// Bad keys, error bodies, a large log and a flood of made-up keys, each with keys of its own, on one stack.
#[tokio::test]
async fn keys_logs_and_errors_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            requests_without_or_with_a_bad_key_are_401,
            unknown_routes_and_oversized_bodies_get_json_errors,
            a_large_log_downloads_within_the_message_size_limit,
            a_flood_of_made_up_keys_does_not_evict_real_ones
        ]
    );
}

async fn requests_without_or_with_a_bad_key_are_401(stack: &Stack) {
    let key = stack.key(5).await;
    for path in ["/balance", "/logs/download"] {
        let e: ErrorBody = stack.anonymous().get(path, StatusCode::UNAUTHORIZED).await;
        assert!(!e.success && !e.error.is_empty());
    }
    // Well-formed but unknown, tampered secret, and garbage tokens.
    let mut tampered = key.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == '0' { '1' } else { '0' });
    let unknown =
        api_gateway::keys::generate(postmesh_contracts::answers::gateway::KeyMode::Live).text;
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
}

async fn unknown_routes_and_oversized_bodies_get_json_errors(stack: &Stack) {
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
}

async fn a_large_log_downloads_within_the_message_size_limit(stack: &Stack) {
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
}

async fn a_flood_of_made_up_keys_does_not_evict_real_ones(stack: &Stack) {
    use api_gateway::keys::{generate, KeyStore};

    let key = stack.key(1).await;
    let key_id = stack.key_id(&key).await;
    let db = stack.service_db(api_gateway::SERVICE).await;
    let store = KeyStore::new(db.clone(), std::time::Duration::from_secs(60), 8);
    store.authenticate(&key).await.expect("a real key");
    // Revoked in the database, the key keeps working only while it stays cached.
    peek::gateway::revoke_key(&db, key_id).await;
    for _ in 0..40 {
        let made_up = generate(postmesh_contracts::answers::gateway::KeyMode::Live).text;
        assert!(store.authenticate(&made_up).await.is_err());
    }
    store
        .authenticate(&key)
        .await
        .expect("still cached after the flood");
    // A fresh store reads the revocation.
    let fresh = KeyStore::new(db, std::time::Duration::from_secs(60), 8);
    assert!(fresh.authenticate(&key).await.is_err());
}
