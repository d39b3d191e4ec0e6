//! Accounts over the real stack: web login with emailed codes, sessions, API keys billing to
//! the primary key, revocation seen by two gateways, and the per-IP login limit.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_shared::error::ErrorBody;
use postmesh_tests::web::{set_cookie_header, WebUser};
use postmesh_tests::{eventually, retry_after, Answer, Stack, TestClient};

fn fresh_email() -> String {
    format!("user-{}@example.com", uuid::Uuid::new_v4().simple())
}

async fn set_ttl(stack: &Stack, pattern: &str, secs: i64) -> Vec<String> {
    let keys = stack.redis_keys(pattern).await;
    assert!(!keys.is_empty(), "no Redis key matches {pattern}");
    let mut redis = stack.redis().await;
    for key in &keys {
        let _: () = redis::cmd("EXPIRE")
            .arg(key)
            .arg(secs)
            .query_async(&mut redis)
            .await
            .expect("EXPIRE");
    }
    keys
}

/// `POST /verify-code-login` of `code` for `email`, as `user`.
async fn verify_login(user: &mut WebUser, email: &str, code: &str) -> Answer {
    let body = json!({ "email": email, "code": code });
    user.json(Method::POST, "/verify-code-login", &body).await
}

/// The Redis key (without the namespace) of `user`'s session: its id's SHA-256, so that a
/// test finds its own among the stack's.
fn session_key(user: &WebUser) -> String {
    use sha2::Digest;
    assert!(!user.session.is_empty(), "signed in");
    format!(
        "session:{}",
        hex::encode(sha2::Sha256::digest(&user.session))
    )
}

/// `DELETE /api-keys/{id}` as `user`.
async fn revoke(user: &mut WebUser, id: &str) -> Answer {
    let path = format!("/api-keys/{id}");
    user.json(Method::DELETE, &path, &json!({})).await
}

async fn ttl(stack: &Stack, key: &str) -> i64 {
    redis::cmd("TTL")
        .arg(key)
        .query_async(&mut stack.redis().await)
        .await
        .expect("TTL")
}

async fn login_codes_sign_up_sign_in_and_sessions_slide_expire_and_end(stack: &Stack) {
    let email = fresh_email();
    let mut user = WebUser::new(&stack.base, &email);

    // A code for an address nobody used yet: the same answer as for any other.
    let asked = user
        .json(Method::POST, "/login/code", &json!({ "email": email }))
        .await;
    let asked: Value = asked.expect(StatusCode::OK, "login code");
    assert_eq!(asked["success"], true);
    let mail = stack
        .wait_for_messages(&email, 1, Duration::from_secs(15))
        .await;
    assert!(
        mail[0].contains("Subject: Your Postmesh login code"),
        "{}",
        mail[0]
    );
    let code = stack.code_sent_to(&email, 1).await;

    // A second code at once is within the per-address cooldown.
    let again = user
        .json(Method::POST, "/login/code", &json!({ "email": email }))
        .await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(again.headers.get("retry-after").is_some());

    // Wrong code 400, another address's (none) 404, malformed 400.
    let wrong = if code == "000000" { "111111" } else { "000000" };
    let answer = verify_login(&mut user, &email, wrong).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    let answer = verify_login(&mut user, &fresh_email(), &code).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{answer:?}");
    let answer = verify_login(&mut user, &email, "12ab56").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");

    // The right code signs the address up and in.
    let signed = verify_login(&mut user, &email, &code).await;
    let body: Value = signed.expect(StatusCode::OK, "verify-code-login");
    assert_eq!(body["success"], true);
    assert!(body["message"].is_string());
    let cookie = set_cookie_header(&signed.headers, "pm_session").expect("session cookie");
    // As long as a session may live (30 days): the store ends one unused for 7 days.
    for part in ["HttpOnly", "SameSite=Lax", "Max-Age=2592000", "Path=/"] {
        assert!(cookie.contains(part), "{cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "PUBLIC_BASE_URL is http://: {cookie}"
    );
    let keys: Value = user
        .json(Method::GET, "/api-keys", &json!({}))
        .await
        .expect(StatusCode::OK, "keys");
    let keys = keys["keys"].as_array().expect("keys").clone();
    assert_eq!(keys.len(), 1, "sign-up made the primary key: {keys:?}");
    assert_eq!(keys[0]["primary"], true);

    // A code is used once.
    let reused = verify_login(&mut WebUser::new(&stack.base, &email), &email, &code).await;
    assert_eq!(reused.status, StatusCode::NOT_FOUND);

    // The session slides: each use pushes its expiry back 7 days.
    let session_keys = set_ttl(stack, &session_key(&user), 100).await;
    assert_eq!(session_keys.len(), 1);
    user.json(Method::GET, "/api-keys", &json!({}))
        .await
        .expect::<Value>(StatusCode::OK, "keys");
    assert!(ttl(stack, &session_keys[0]).await > 604_000);

    // Once expired it is gone: 401.
    let mut redis = stack.redis().await;
    let _: () = redis::cmd("DEL")
        .arg(&session_keys[0])
        .query_async(&mut redis)
        .await
        .expect("DEL");
    let expired = user.json(Method::GET, "/api-keys", &json!({})).await;
    assert_eq!(expired.status, StatusCode::UNAUTHORIZED);

    // An address with an account gets the same answer as one without.
    let known: Value = WebUser::new(&stack.base, &email)
        .json(
            Method::POST,
            "/login/code",
            &json!({ "email": stack.account_email(&stack.key(0).await).await }),
        )
        .await
        .expect(StatusCode::OK, "login code for a known address");
    assert_eq!(known, asked);

    // Sign in again (the address now has an account: no second sign-up), then log out. The
    // cooldown's minute is skipped.
    for key in stack
        .redis_keys(&format!("code:cooldown:{{login:{email}}}"))
        .await
    {
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .expect("DEL");
    }
    let mut user = WebUser::login(stack, &email, 1).await;
    let keys: Value = user
        .json(Method::GET, "/api-keys", &json!({}))
        .await
        .expect(StatusCode::OK, "keys");
    assert_eq!(keys["keys"].as_array().expect("keys").len(), 1);
    let old_session = user.session.clone();
    let out = user.json(Method::POST, "/logout", &json!({})).await;
    let _: Value = out.expect(StatusCode::OK, "logout");
    assert!(set_cookie_header(&out.headers, "pm_session")
        .expect("cleared")
        .contains("Max-Age=0"));
    user.session = old_session;
    let after = user.json(Method::GET, "/api-keys", &json!({})).await;
    assert_eq!(
        after.status,
        StatusCode::UNAUTHORIZED,
        "the ended session is refused"
    );
    let again = user.json(Method::POST, "/logout", &json!({})).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);
}

/// Asks a login code for `email` and enters `wrong` wrong ones, each a 400; the right code.
async fn code_then_wrong(stack: &Stack, user: &mut WebUser, email: &str, wrong: u32) -> String {
    let _: Value = user
        .json(Method::POST, "/login/code", &json!({ "email": email }))
        .await
        .expect(StatusCode::OK, "login code");
    let code = stack.code_sent_to(email, 1).await;
    let other = if code == "000000" { "111111" } else { "000000" };
    for attempt in 1..=wrong {
        let answer = verify_login(user, email, other).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "attempt {attempt}");
    }
    code
}

/// Past the per-address cooldown, a second login code for `email`; that code.
async fn second_code(stack: &Stack, user: &mut WebUser, email: &str) -> String {
    set_ttl(stack, &format!("code:cooldown:{{login:{email}}}"), 1).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _: Value = user
        .json(Method::POST, "/login/code", &json!({ "email": email }))
        .await
        .expect(StatusCode::OK, "a second login code");
    stack.code_sent_to(email, 2).await
}

async fn five_wrong_login_codes_stop_the_address_for_the_hour_and_an_expired_code_is_404(
    stack: &Stack,
) {
    let email = fresh_email();
    let mut user = WebUser::new(&stack.base, &email);
    let code = code_then_wrong(stack, &mut user, &email, 5).await;
    let late = verify_login(&mut user, &email, &code).await;
    assert_eq!(
        late.status,
        StatusCode::TOO_MANY_REQUESTS,
        "five wrong codes this hour: not even the right one is tried"
    );
    // Nor a new code: the wrong ones count per address, across its codes.
    let fresh = second_code(stack, &mut user, &email).await;
    let refused = verify_login(&mut user, &email, &fresh).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let wait = retry_after(&refused.headers);
    assert!((3000..=3600).contains(&wait), "{wait}");

    // A code past its 5 minutes: 404.
    let other = fresh_email();
    let _: Value = user
        .json(Method::POST, "/login/code", &json!({ "email": other }))
        .await
        .expect(StatusCode::OK, "login code");
    let code = stack.code_sent_to(&other, 1).await;
    let hashed = stack
        .redis_keys(&format!("code:hash:{{login:{other}}}"))
        .await;
    assert_eq!(hashed.len(), 1, "{hashed:?}");
    let mut redis = stack.redis().await;
    let _: () = redis::cmd("PEXPIRE")
        .arg(&hashed[0])
        .arg(1)
        .query_async(&mut redis)
        .await
        .expect("PEXPIRE");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = verify_login(&mut user, &other, &code).await;
    assert_eq!(expired.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn login_codes_are_limited_per_ip() {
    let stack = Stack::start().await;
    let (gateway, base) = stack.another_gateway(|c| c.login_ip_hourly_limit = 2).await;
    let client = TestClient::http(&base, None);
    let mut answers = Vec::new();
    for _ in 0..3 {
        let body = json!({ "email": fresh_email() });
        answers.push(client.request(Method::POST, "/login/code", &body).await);
    }
    let statuses: Vec<StatusCode> = answers.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "{answers:?}"
    );
    let third = &answers[2];
    let retry = retry_after(&third.headers);
    assert!((1..=3600).contains(&retry), "{retry}");
    gateway.stop().await;
    stack.shutdown().await;
}

/// Sign-in, sessions, keys, and failed authentications counted by gateways of their own,
/// each with an address and keys of its own, side by side on one stack (the per-IP login
/// limit, which every sign-in from here counts toward, keeps a stack of its own).
#[tokio::test]
async fn keys_and_gateways_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            every_key_bills_to_the_primary_and_revocation_reaches_both_gateways,
            an_account_holds_at_most_its_quota_of_keys_listed_in_pages,
            an_address_failing_to_authenticate_is_refused_before_any_key_lookup,
            polls_of_unknown_device_tokens_count_as_failed_authentications,
            login_codes_sign_up_sign_in_and_sessions_slide_expire_and_end,
            five_wrong_login_codes_stop_the_address_for_the_hour_and_an_expired_code_is_404,
            a_session_ends_30_days_after_sign_in_however_it_is_used,
            an_address_lowered_unlike_the_database_signs_in_again,
            wrong_codes_at_once_get_no_more_tries_than_one_after_another
        ]
    );
}

/// An address's five wrong codes an hour hold for codes tried at once: four wrong one after
/// another, then five at once against a new code, and only one of the five is tried.
async fn wrong_codes_at_once_get_no_more_tries_than_one_after_another(stack: &Stack) {
    let email = fresh_email();
    let mut user = WebUser::new(&stack.base, &email);
    code_then_wrong(stack, &mut user, &email, 4).await;
    let fresh = second_code(stack, &mut user, &email).await;
    let wrong = if fresh == "000000" {
        "111111"
    } else {
        "000000"
    };
    let guesses = (0..5).map(|_| {
        let (base, email) = (stack.base.clone(), email.clone());
        async move {
            verify_login(&mut WebUser::new(&base, &email), &email, wrong)
                .await
                .status
        }
    });
    let mut answers = futures::future::join_all(guesses).await;
    answers.sort();
    let mut expected = vec![StatusCode::BAD_REQUEST];
    expected.extend([StatusCode::TOO_MANY_REQUESTS; 4]);
    assert_eq!(answers, expected);
}

/// An address whose lowercase the database's `lower()` makes otherwise (a final sigma) signs
/// up, then in again to the same account: one key, no 500.
async fn an_address_lowered_unlike_the_database_signs_in_again(stack: &Stack) {
    let email = format!("ΟΔΟΣ-{}@example.com", uuid::Uuid::new_v4().simple());
    for round in 1..=2 {
        let mut user = WebUser::new(&stack.base, &email);
        let asked = user
            .json(Method::POST, "/login/code", &json!({ "email": email }))
            .await;
        let _: Value = asked.expect(StatusCode::OK, "login code");
        let code = stack.code_sent_to(&email.to_lowercase(), round).await;
        let signed = verify_login(&mut user, &email, &code).await;
        let _: Value = signed.expect(StatusCode::OK, "verify-code-login");
        let keys: Value = user
            .json(Method::GET, "/api-keys", &json!({}))
            .await
            .expect(StatusCode::OK, "keys");
        assert_eq!(keys["keys"].as_array().map(Vec::len), Some(1), "{keys}");
        // The next code is past the per-address cooldown.
        let cooldown = format!("code:cooldown:{{login:{}}}", email.to_lowercase());
        set_ttl(stack, &cooldown, 1).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
}

async fn every_key_bills_to_the_primary_and_revocation_reaches_both_gateways(stack: &Stack) {
    // The account's first key, with 50 credits: its primary key.
    let primary = stack.key(50).await;
    let email = stack.account_email(&primary).await;
    let mut user = WebUser::login(stack, &email, 0).await;

    let bad = user
        .json(Method::POST, "/api-keys", &json!({ "name": "  " }))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let created: Value = user
        .json(Method::POST, "/api-keys", &json!({ "name": "ci runner" }))
        .await
        .expect(StatusCode::CREATED, "create key");
    let second = created["apiKey"].as_str().expect("apiKey").to_owned();
    let second_id = created["key"]["id"].as_str().expect("id").to_owned();
    assert_eq!(created["key"]["name"], "ci runner");
    assert_eq!(created["key"]["primary"], false);
    let listed: Value = user
        .json(Method::GET, "/api-keys", &json!({}))
        .await
        .expect(StatusCode::OK, "keys");
    let listed = listed["keys"].as_array().expect("keys").clone();
    assert_eq!(listed.len(), 2);
    assert!(listed
        .iter()
        .all(|k| k.get("apiKey").is_none() && k.get("hash").is_none()));

    // One balance: the primary's, whichever key asks or pays.
    assert_eq!(stack.balance(&second).await, 50);
    let _: Value = stack
        .client(&second)
        .post(
            "/deduct",
            &json!({ "idempotencyKey": "from-second-key" }),
            StatusCode::OK,
        )
        .await;
    assert_eq!(stack.balance(&primary).await, 49);
    assert_eq!(stack.balance(&second).await, 49);
    let me: Value = stack.client(&second).get("/account", StatusCode::OK).await;
    assert_eq!(me["email"], email.as_str());
    assert_eq!(me["key"]["name"], "ci runner");

    // Revocation: this gateway refuses at once; a second one within KEY_CACHE_TTL_SECS.
    let (other, other_base) = stack
        .another_gateway(|c| c.key_cache_ttl = Duration::from_secs(1))
        .await;
    let via_other = TestClient::http(&other_base, Some(&second));
    let _: Value = via_other.get("/balance", StatusCode::OK).await;
    let _: Value = revoke(&mut user, &second_id.to_string())
        .await
        .expect(StatusCode::OK, "revoke");
    let refused = stack
        .client(&second)
        .send(Method::GET, "/balance", None)
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    eventually(Duration::from_secs(5), || async {
        match via_other.send(Method::GET, "/balance", None).await.status {
            StatusCode::UNAUTHORIZED => Ok(()),
            other => Err(other),
        }
    })
    .await;
    let _: Value = stack.client(&primary).get("/balance", StatusCode::OK).await;
    let twice = revoke(&mut user, &second_id.to_string()).await;
    assert_eq!(twice.status, StatusCode::NOT_FOUND);

    // Someone else's key is not found, and not revoked.
    let stranger = stack.key(0).await;
    let stranger_id = stack.key_id(&stranger).await;
    let theirs = revoke(&mut user, &stranger_id.to_string()).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    // A malformed id is a 400 naming it, as every path id.
    let malformed = revoke(&mut user, "nope").await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    let error: ErrorBody = malformed.json();
    assert!(error.error.contains("\"nope\""), "{}", error.error);
    let _: Value = stack
        .client(&stranger)
        .get("/balance", StatusCode::OK)
        .await;
    other.stop().await;
}

async fn an_account_holds_at_most_its_quota_of_keys_listed_in_pages(stack: &Stack) {
    let primary = stack.key(0).await;
    let email = stack.account_email(&primary).await;
    let mut user = WebUser::login(stack, &email, 0).await;
    // The primary and 49 more fill API_KEYS_PER_ACCOUNT (50 in the test stack).
    for i in 1..50 {
        let made = user
            .json(
                Method::POST,
                "/api-keys",
                &json!({ "name": format!("k{i}") }),
            )
            .await;
        assert_eq!(made.status, StatusCode::CREATED, "key {i}");
    }
    let over = user
        .json(Method::POST, "/api-keys", &json!({ "name": "one more" }))
        .await;
    assert_eq!(over.status, StatusCode::FORBIDDEN);
    let error: Value = over.expect(StatusCode::FORBIDDEN, "over the quota");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("API_KEYS_PER_ACCOUNT = 50"),
        "{error}"
    );
    // The web form says so on its page.
    assert_eq!(user.page("/app/keys").await.status, StatusCode::OK);
    let refused = user.form("/app/keys", &[("name", "one more")]).await;
    let html = String::from_utf8_lossy(&refused.body);
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{html}");
    assert!(
        html.contains("<html") && html.contains("API_KEYS_PER_ACCOUNT = 50"),
        "{html}"
    );
    let page: Value = user
        .json(Method::GET, "/api-keys?limit=10&offset=45", &json!({}))
        .await
        .expect(StatusCode::OK, "a page");
    let names: Vec<&str> = page["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["k45", "k46", "k47", "k48", "k49"]);
    let bad = user
        .json(Method::GET, "/api-keys?limit=501", &json!({}))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

async fn an_address_failing_to_authenticate_is_refused_before_any_key_lookup(stack: &Stack) {
    let key = stack.key(1).await;
    let (gateway, base) = stack.five_failures_a_minute().await;
    let call = |key: String| {
        let base = base.clone();
        async move {
            reqwest::Client::new()
                .get(format!("{base}/balance"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(call(key.clone()).await.status(), StatusCode::OK);
    for _ in 0..5 {
        let made_up = format!("pm_{}_{}", uuid::Uuid::new_v4().simple(), "0".repeat(64));
        assert_eq!(call(made_up).await.status(), StatusCode::UNAUTHORIZED);
    }
    // Now even the right key waits for the minute's end.
    let refused = call(key.clone()).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait = retry_after(refused.headers());
    assert!((1..=60).contains(&wait), "{wait}");
    // Other gateways (and addresses) count their own.
    assert_eq!(stack.balance(&key).await, 1);
    gateway.stop().await;
}

/// Polling `/cli/auth/poll` with device tokens no one started is guessing, as made-up keys
/// are: each counts against the address, and past the limit even a real poll waits.
async fn polls_of_unknown_device_tokens_count_as_failed_authentications(stack: &Stack) {
    let (gateway, base) = stack.five_failures_a_minute().await;
    let post = |path: &'static str, token: String| {
        let base = base.clone();
        async move {
            let answer = reqwest::Client::new()
                .post(format!("{base}{path}"))
                .json(&json!({ "deviceToken": token }))
                .send()
                .await
                .unwrap();
            let status = answer.status();
            (status, answer.text().await.unwrap())
        }
    };
    let token = || uuid::Uuid::new_v4().simple().to_string();
    let started = token();
    assert_eq!(
        post("/cli/auth/init", started.clone()).await.0,
        StatusCode::OK
    );
    assert_eq!(
        post("/cli/auth/poll", started).await.0,
        StatusCode::ACCEPTED
    );
    for _ in 0..5 {
        assert_eq!(post("/cli/auth/poll", token()).await.0, StatusCode::GONE);
    }
    // A device started now, polled for the first time (on time: not a slow_down), waits too.
    let later = token();
    assert_eq!(
        post("/cli/auth/init", later.clone()).await.0,
        StatusCode::OK
    );
    let (status, body) = post("/cli/auth/poll", later).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body.contains("failed authentications"), "{body}");
    gateway.stop().await;
}

async fn a_session_ends_30_days_after_sign_in_however_it_is_used(stack: &Stack) {
    let primary = stack.key(0).await;
    let email = stack.account_email(&primary).await;
    let mut user = WebUser::login(stack, &email, 0).await;
    let listed = user.json(Method::GET, "/api-keys", &json!({})).await;
    assert_eq!(listed.status, StatusCode::OK);
    // Used every day since, but signed in 30 days ago.
    let own = session_key(&user);
    let stored = stack.redis_keys(&own).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let mut redis = stack.redis().await;
    let raw: String = redis::cmd("GET")
        .arg(&stored[0])
        .query_async(&mut redis)
        .await
        .unwrap();
    let mut session: Value = serde_json::from_str(&raw).unwrap();
    let month_ago = postmesh_shared::db::now_unix() - 30 * 24 * 3600;
    session["started_at"] = json!(month_ago);
    let _: () = redis::cmd("SET")
        .arg(&stored[0])
        .arg(session.to_string())
        .arg("KEEPTTL")
        .query_async(&mut redis)
        .await
        .unwrap();
    let later = user.json(Method::GET, "/api-keys", &json!({})).await;
    assert_eq!(later.status, StatusCode::UNAUTHORIZED);
    assert!(
        stack.redis_keys(&own).await.is_empty(),
        "ended, not left to expire"
    );
}
