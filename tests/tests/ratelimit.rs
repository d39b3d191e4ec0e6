//! The per-key request rate at the gateway: shared by replicas through Redis, 429 with
//! `Retry-After` beyond it, and allowance taken in batches without exceeding it.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use postmesh_tests::{retry_after, Options, Stack};

#[tokio::test]
async fn each_key_has_a_request_rate_shared_by_all_gateways() {
    let stack = Stack::start_opts(Options::with_rate(1, 4)).await;
    // A second gateway replica on the same namespace counts against the same allowance.
    let (replica, other) = stack.another_gateway(|_| {}).await;
    let (key, calm) = (stack.key(10).await, stack.key(10).await);
    let started = Instant::now();
    let get = |base: String, key: String| {
        let http = stack.http.clone();
        async move {
            http.get(format!("{base}/balance"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
        }
    };
    for base in [&stack.base, &other, &stack.base, &other] {
        let r = get(base.clone(), key.clone()).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    for base in [&stack.base, &other] {
        let r = get(base.clone(), key.clone()).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait = retry_after(r.headers());
        assert_eq!(wait, 1);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["success"], json!(false));
        assert!(body["error"].is_string());
    }
    // Another key is not affected, and the first one recovers at the set pace.
    assert_eq!(get(stack.base.clone(), calm).await.status(), StatusCode::OK);
    // One second after the burst began, exactly one more request is due.
    let due = started + Duration::from_millis(1100);
    tokio::time::sleep(due.saturating_duration_since(Instant::now())).await;
    assert_eq!(
        get(other.clone(), key.clone()).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        get(other, key).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    replica.stop().await;
    stack.shutdown().await;
}

#[tokio::test]
async fn allowance_taken_in_batches_never_exceeds_the_rate() {
    // 100/s with bursts of 200: each gateway takes allowance from Redis 10 requests at a time.
    let stack = Stack::start_opts(Options::with_rate(100, 200)).await;
    let key = stack.key(10).await;
    let started = Instant::now();
    let mut allowed = 0u64;
    let mut limited = 0u64;
    let client = stack.client(&key);
    for _ in 0..400 {
        match client.send(Method::GET, "/balance", None).await.status {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ceiling = 200.0 + 100.0 * elapsed + 1.0;
    assert!(
        (allowed as f64) <= ceiling,
        "{allowed} allowed in {elapsed:.2}s, at most {ceiling:.0} may be"
    );
    assert!(
        allowed >= 190,
        "{allowed} allowed: the burst was not available"
    );
    if elapsed < 1.5 {
        // 400 requests in under 1.5 s is more than 200 + 100/s allows.
        assert!(limited > 0, "the limit never applied in {elapsed:.2}s");
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn concurrent_requests_within_the_burst_all_pass() {
    let stack = Stack::start_opts(Options::with_rate(100, 100)).await;
    let key = stack.key(10).await;
    // One request first, so the key has steady traffic and the gateway fetches a batch.
    let client = stack.client(&key);
    assert_eq!(stack.balance(&key).await, 10);
    let answers = join_all((0..60).map(|_| client.send(Method::GET, "/balance", None))).await;
    let limited = answers
        .iter()
        .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(limited, 0, "61 requests in a burst of 100");
    stack.shutdown().await;
}

#[tokio::test]
async fn an_accounts_keys_share_one_rate() {
    let stack = Stack::start_opts(Options::with_rate(1, 4)).await;
    let first = stack.key(10).await;
    let email = stack.account_email(&first).await;
    let mut user = postmesh_tests::web::WebUser::login(&stack, &email, 0).await;
    let made: serde_json::Value = user
        .json(Method::POST, "/api-keys", &json!({ "name": "second" }))
        .await
        .expect(StatusCode::CREATED, "a second key");
    let second = made["apiKey"].as_str().unwrap().to_owned();
    let get = |key: &str| {
        let (http, url) = (stack.http.clone(), format!("{}/balance", stack.base));
        let key = key.to_owned();
        async move {
            http.get(url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    // The signed-in request that made the second key took one of the account's 4.
    for key in [&first, &first, &second] {
        assert_eq!(get(key).await, StatusCode::OK);
    }
    // The second key has used 1 of its own 4, but the account's 4 are gone, for its
    // session's pages too.
    assert_eq!(get(&second).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        user.page("/app/keys").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another account is not affected.
    assert_eq!(get(&stack.key(10).await).await, StatusCode::OK);
    stack.shutdown().await;
}

#[tokio::test]
async fn an_accounts_large_bodies_spend_a_byte_budget() {
    let stack = Stack::start().await;
    // A gateway whose accounts may send 64 KiB of large bodies a second, 1 MiB at once.
    let (gateway, base) = stack
        .another_gateway(|c| {
            c.body_rate = api_gateway::BodyRateConfig {
                bytes_per_sec: 64 * 1024,
                burst_bytes: 1024 * 1024,
            }
        })
        .await;
    let addr = base.trim_start_matches("http://").to_owned();
    let (key, other) = (stack.key(10).await, stack.key(10).await);
    // A dry-run send of about `kib` KiB.
    let send = |key: &str, kib: usize| {
        let html = format!("<p>{}</p>", "x".repeat(kib * 1024));
        let body = json!({ "to": "a@example.com", "subject": "s", "html": html, "dryRun": true });
        let request = stack
            .http
            .post(format!("{base}/send-email"))
            .bearer_auth(key)
            .json(&body);
        async move { request.send().await.unwrap() }
    };
    for _ in 0..3 {
        assert_eq!(send(&key, 300).await.status(), StatusCode::OK);
    }
    // 900 KiB spent: 300 more do not fit, and wait for the ~3 s it takes to earn them.
    let refused = send(&key, 300).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait = retry_after(refused.headers());
    assert!((2..=4).contains(&wait), "Retry-After {wait}");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["success"], json!(false));
    // Small bodies cost nothing of it; another account has its own.
    assert_eq!(send(&key, 10).await.status(), StatusCode::OK);
    assert_eq!(send(&other, 300).await.status(), StatusCode::OK);
    // A body larger than the whole burst costs the burst, so a full budget lets it pass.
    assert_ne!(
        send(&stack.key(10).await, 1500).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // A body sent in chunks, its length undeclared, is counted once it has been read.
    let html = format!("<p>{}</p>", "x".repeat(300 * 1024));
    let payload = serde_json::to_vec(
        &json!({ "to": "a@example.com", "subject": "s", "html": html, "dryRun": true }),
    )
    .unwrap();
    let head = format!(
        "POST /send-email HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    let mut request = head.into_bytes();
    for chunk in payload.chunks(64 * 1024) {
        request.extend(format!("{:x}\r\n", chunk.len()).into_bytes());
        request.extend(chunk);
        request.extend(b"\r\n");
    }
    request.extend(b"0\r\n\r\n");
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 429"),
        "a chunked 300 KiB body over the budget: {}",
        answer.lines().next().unwrap_or_default()
    );
    gateway.stop().await;
    stack.shutdown().await;
}
