//! CLI device authorization over the real stack: every row of the spec's state table and
//! rules 5-6, and the approval page with its user code, deny and CSRF checks.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_tests::web::{text, WebUser};
use postmesh_tests::{Answer, Stack, TestClient, DEVICE_POLL_INTERVAL_SECS};

fn token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn fresh_email() -> String {
    format!("dev-{}@example.com", uuid::Uuid::new_v4().simple())
}

async fn init(client: &TestClient, token: &str) -> Answer {
    client
        .request(
            Method::POST,
            "/cli/auth/init",
            &json!({ "deviceToken": token, "deviceName": "test-box" }),
        )
        .await
}

async fn poll(client: &TestClient, token: &str) -> (StatusCode, Value) {
    let answer = client
        .request(
            Method::POST,
            "/cli/auth/poll",
            &json!({ "deviceToken": token }),
        )
        .await;
    let body = serde_json::from_slice(&answer.body).expect("JSON poll answer");
    (answer.status, body)
}

/// `POST /cli/auth/approve` of `token` from the web app's signed-in `user`.
async fn approve(user: &mut WebUser, token: &str) -> Answer {
    user.json(
        Method::POST,
        "/cli/auth/approve",
        &json!({ "deviceToken": token }),
    )
    .await
}

/// Waits out the poll interval so the next poll is on time.
async fn wait_interval() {
    tokio::time::sleep(Duration::from_secs(DEVICE_POLL_INTERVAL_SECS)).await;
}

#[tokio::test]
async fn device_authorization_follows_the_state_table() {
    let stack = Stack::start().await;
    let cli = stack.anonymous();
    let email = fresh_email();
    let mut user = WebUser::login(&stack, &email, 0).await;

    // Malformed tokens: 400 on init, poll and approve.
    for bad in [
        "abc".to_owned(),
        "g".repeat(40),
        "a".repeat(129),
        "a".repeat(31),
    ] {
        assert_eq!(
            init(&cli, &bad).await.status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
        let (status, body) = poll(&cli, &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(body["success"], false);
        let refused = approve(&mut user, &bad).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
    }

    // (none) → pending.
    let t = token();
    let started: Value = init(&cli, &t).await.expect(StatusCode::OK, "init");
    assert_eq!(started["success"], true);
    assert_eq!(started["deviceToken"], t.as_str());
    assert_eq!(started["expiresIn"], 600);
    assert_eq!(started["interval"], DEVICE_POLL_INTERVAL_SECS);
    let user_code = started["userCode"].as_str().expect("userCode");
    assert_eq!(user_code.len(), 9, "{user_code}");
    assert_eq!(&user_code[4..5], "-");
    let url = started["verificationUrl"]
        .as_str()
        .expect("verificationUrl");
    assert!(
        url.starts_with(&format!("{}/app/device?request=", stack.base)),
        "{url}"
    );
    // Rule 6: a used token is refused, even while its request is pending.
    assert_eq!(init(&cli, &t).await.status, StatusCode::CONFLICT);
    // The token is stored hashed only, and the request lives 600 s.
    let stored = stack.redis_keys("device:*").await;
    assert!(stored.iter().all(|k| !k.contains(&t)), "{stored:?}");
    let record = stack.redis_keys("device:req:*").await;
    assert_eq!(record.len(), 1);
    let ttl: i64 = redis::cmd("TTL")
        .arg(&record[0])
        .query_async(&mut stack.redis().await)
        .await
        .expect("TTL");
    assert!((590..=600).contains(&ttl), "{ttl}");

    // pending --poll--> pending (202); too fast --> 429 slow_down.
    let (status, body) = poll(&cli, &t).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "pending");
    assert_eq!(body["success"], true);
    assert!(body.get("apiKey").is_none());
    let (status, body) = poll(&cli, &t).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["status"], "slow_down");

    // approve without a session: 401; with one: the account's email.
    let anonymous = cli
        .request(
            Method::POST,
            "/cli/auth/approve",
            &json!({ "deviceToken": t }),
        )
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let approved: Value = approve(&mut user, &t)
        .await
        .expect(StatusCode::OK, "approve");
    assert_eq!(approved, json!({ "success": true, "email": email }));
    // A second approve of a handled request: 409.
    let twice = approve(&mut user, &t).await;
    assert_eq!(twice.status, StatusCode::CONFLICT);

    // approved --poll--> consumed: the key, once, even to two polls at once.
    wait_interval().await;
    let (first, second) = tokio::join!(poll(&cli, &t), poll(&cli, &t));
    let (status, body) = if first.0 == StatusCode::OK {
        first.clone()
    } else {
        second.clone()
    };
    assert_eq!(status, StatusCode::OK, "{first:?} {second:?}");
    let other = if first.0 == StatusCode::OK {
        second
    } else {
        first
    };
    assert_ne!(
        other.0,
        StatusCode::OK,
        "one poll alone gets the key: {other:?}"
    );
    assert_eq!(body["status"], "approved");
    assert_eq!(body["email"], email.as_str());
    let db = stack.service_db(api_gateway::SERVICE).await;
    let minted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE a.email = $1",
    )
    .bind(&email)
    .fetch_one(&db)
    .await
    .expect("count keys");
    assert_eq!(minted, 2, "the primary key and one CLI key");
    let key = body["apiKey"].as_str().expect("apiKey").to_owned();
    let me: Value = stack.client(&key).get("/account", StatusCode::OK).await;
    assert_eq!(me["email"], email.as_str());
    assert_eq!(me["key"]["name"], "CLI: test-box");
    let (status, body) = poll(&cli, &t).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(body["success"], false);
    let after = approve(&mut user, &t).await;
    assert_eq!(after.status, StatusCode::GONE);
    assert_eq!(
        init(&cli, &t).await.status,
        StatusCode::CONFLICT,
        "still used"
    );

    // pending, then expired: poll and approve answer 410.
    let late = token();
    let _: Value = init(&cli, &late).await.expect(StatusCode::OK, "init");
    let mut redis = stack.redis().await;
    for key in stack.redis_keys("device:req:*").await {
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .expect("DEL");
    }
    let (status, _) = poll(&cli, &late).await;
    assert_eq!(status, StatusCode::GONE);
    let expired = approve(&mut user, &late).await;
    assert_eq!(expired.status, StatusCode::GONE);
    // Never started: 410 as well.
    let (status, _) = poll(&cli, &token()).await;
    assert_eq!(status, StatusCode::GONE);

    // An account without an API key: approve is a 500.
    let keyless = token();
    let _: Value = init(&cli, &keyless).await.expect(StatusCode::OK, "init");
    sqlx::query("UPDATE accounts SET primary_key_id = NULL WHERE email = $1")
        .bind(&email)
        .execute(&db)
        .await
        .expect("drop primary");
    let no_key = approve(&mut user, &keyless).await;
    assert_eq!(no_key.status, StatusCode::INTERNAL_SERVER_ERROR);
    stack.shutdown().await;
}

/// The request id in a verification URL.
fn request_id(started: &Value) -> String {
    let url = started["verificationUrl"]
        .as_str()
        .expect("verificationUrl");
    url.split("request=").nth(1).expect("request id").to_owned()
}

/// The approval page and the key pages, each with a user of its own, on one stack.
#[tokio::test]
async fn web_pages_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            the_approval_page_checks_the_user_code_denies_and_refuses_forged_forms,
            key_pages_create_and_revoke_with_csrf,
            two_gateways_share_device_logins_and_sessions,
            typed_codes_that_match_no_sign_in_count_as_failed_authentications
        ]
    );
}

/// Typing codes that match no pending sign-in into `/app/device` is guessing another's code,
/// as polling made-up device tokens is: each miss counts against the address, and past the
/// limit even the right code waits.
async fn typed_codes_that_match_no_sign_in_count_as_failed_authentications(stack: &Stack) {
    let (gateway, base) = stack.five_failures_a_minute().await;
    let mut user = WebUser::login(stack, &fresh_email(), 0).await;
    user.base = base;
    assert_eq!(user.page("/app/device").await.status, StatusCode::OK);
    for _ in 0..5 {
        let missed = user
            .form("/app/device", &[("user_code", "ZZZZ-ZZZZ")])
            .await;
        assert_eq!(missed.status, StatusCode::NOT_FOUND);
    }
    let t = token();
    let started: Value = init(&stack.anonymous(), &t)
        .await
        .expect(StatusCode::OK, "init");
    let code = started["userCode"].as_str().expect("userCode").to_owned();
    let refused = user.form("/app/device", &[("user_code", &code)]).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        text(&refused)
    );
    assert!(!text(&refused).contains(&code), "{}", text(&refused));
    gateway.stop().await;
}

/// A second gateway replica shares device-login requests, their poll pace and their one
/// key, and web sessions: driven through both alternately, they behave as through one.
async fn two_gateways_share_device_logins_and_sessions(stack: &Stack) {
    let (replica, other) = stack.another_gateway(|_| {}).await;
    let (here, there) = (stack.anonymous(), TestClient::http(&other, None));
    let email = fresh_email();
    let mut user = WebUser::login(stack, &email, 0).await;
    let t = token();
    let _: Value = init(&here, &t).await.expect(StatusCode::OK, "init");
    assert_eq!(init(&there, &t).await.status, StatusCode::CONFLICT);
    let (status, body) = poll(&there, &t).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, body) = poll(&here, &t).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["status"], "slow_down");
    // The session made through the first gateway approves through the second.
    user.base = other.clone();
    let approved: Value = approve(&mut user, &t)
        .await
        .expect(StatusCode::OK, "approve");
    assert_eq!(approved["email"], email.as_str());
    wait_interval().await;
    let (status, body) = poll(&here, &t).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["apiKey"].is_string(), "{body}");
    wait_interval().await;
    let (status, body) = poll(&there, &t).await;
    assert_eq!(status, StatusCode::GONE, "the key is given once: {body}");
    // A session ended through one gateway is refused by the other.
    let session = user.session.clone();
    let _: Value = user
        .json(Method::POST, "/logout", &json!({}))
        .await
        .expect(StatusCode::OK, "logout");
    user.session = session;
    user.base = stack.base.clone();
    let after = user.json(Method::GET, "/api-keys", &json!({})).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED, "the ended session");
    replica.stop().await;
}

async fn the_approval_page_checks_the_user_code_denies_and_refuses_forged_forms(stack: &Stack) {
    let cli = stack.anonymous();
    let mut user = WebUser::login(stack, &fresh_email(), 0).await;

    // Signed out, the page sends the browser to the login page and back.
    let mut stranger = WebUser::new(&stack.base, "nobody@example.com");
    let redirected = stranger.page("/app/device?request=abc").await;
    assert_eq!(redirected.status, StatusCode::SEE_OTHER);
    assert_eq!(
        redirected.headers["location"],
        "/app/login?next=%2Fapp%2Fdevice%3Frequest%3Dabc"
    );

    // By link: the page shows when and where the request started, and wants the code.
    let t = token();
    let started: Value = init(&cli, &t).await.expect(StatusCode::OK, "init");
    let rid = request_id(&started);
    let user_code = started["userCode"].as_str().expect("userCode").to_owned();
    let page = user.page(&format!("/app/device?request={rid}")).await;
    assert_eq!(page.status, StatusCode::OK);
    let html = text(&page);
    assert_eq!(page.headers["cache-control"], "no-store");
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert!(html.contains("127.0.0.1"), "{html}");
    assert!(html.contains("name=\"user_code\""), "{html}");
    assert!(
        !html.contains(&user_code),
        "the link's page must not show the code to compare"
    );

    // A forged form (no or another CSRF token) is refused and changes nothing.
    let forged = user
        .form_with_csrf(
            "/app/device",
            "0".repeat(64).as_str(),
            &[
                ("request", &rid),
                ("user_code", &user_code),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let forged = user
        .form_with_csrf(
            "/app/device",
            "",
            &[
                ("request", &rid),
                ("user_code", &user_code),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let (status, _) = poll(&cli, &t).await;
    assert_eq!(status, StatusCode::ACCEPTED, "still pending");

    // Approving from the link without typing the code is a wrong code, not an approval.
    let empty = user
        .form(
            "/app/device",
            &[
                ("request", &rid),
                ("user_code", ""),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST, "{}", text(&empty));

    // Three more wrong codes leave it pending; the fifth voids it.
    for attempt in 2..=5 {
        let wrong = user
            .form(
                "/app/device",
                &[
                    ("request", &rid),
                    ("user_code", "BBBB-BBBB"),
                    ("decision", "approve"),
                ],
            )
            .await;
        assert_eq!(wrong.status, StatusCode::BAD_REQUEST, "attempt {attempt}");
        let said = if attempt < 5 {
            "does not match"
        } else {
            "void"
        };
        assert!(
            text(&wrong).contains(said),
            "attempt {attempt}: {}",
            text(&wrong)
        );
    }
    wait_interval().await;
    let (status, _) = poll(&cli, &t).await;
    assert_eq!(status, StatusCode::GONE, "the voided request is gone");

    // By typed code: the page shows the device's code; deny ends the request.
    let denied = token();
    let started: Value = init(&cli, &denied).await.expect(StatusCode::OK, "init");
    let code = started["userCode"]
        .as_str()
        .expect("userCode")
        .to_lowercase();
    let page = user.form("/app/device", &[("user_code", &code)]).await;
    assert_eq!(page.status, StatusCode::OK);
    let html = text(&page);
    assert_eq!(page.headers["cache-control"], "no-store");
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert!(html.contains(&code.to_uppercase()), "{html}");
    // A link cannot arrive with the code filled in: the lookup is a form POST only.
    let linked = user.page(&format!("/app/device?code={code}")).await;
    assert!(!text(&linked).contains(&code.to_uppercase()));
    let rid = request_id(&started);
    let no = user
        .form(
            "/app/device",
            &[("request", &rid), ("user_code", ""), ("decision", "deny")],
        )
        .await;
    assert_eq!(no.status, StatusCode::OK);
    assert!(text(&no).contains("Denied"));
    let (status, body) = poll(&cli, &denied).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(body["status"], "denied");

    // An unknown code: 404 page.
    let unknown = user
        .form("/app/device", &[("user_code", "ZZZZ-ZZZZ")])
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    // Approve with the right code typed (any case, with or without the dash).
    let ok = token();
    let started: Value = init(&cli, &ok).await.expect(StatusCode::OK, "init");
    let typed = started["userCode"]
        .as_str()
        .expect("userCode")
        .replace('-', "")
        .to_lowercase();
    let rid = request_id(&started);
    let yes = user
        .form(
            "/app/device",
            &[
                ("request", &rid),
                ("user_code", &typed),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(yes.status, StatusCode::OK, "{}", text(&yes));
    assert!(text(&yes).contains("Approved"));
    let (status, body) = poll(&cli, &ok).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["apiKey"]
        .as_str()
        .is_some_and(|k| k.starts_with("pm_")));
}

async fn key_pages_create_and_revoke_with_csrf(stack: &Stack) {
    let mut user = WebUser::login(stack, &fresh_email(), 0).await;
    let page = user.page("/app/keys").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!user.csrf.is_empty(), "the page set the CSRF cookie");
    let html = text(&page);
    assert_eq!(page.headers["cache-control"], "no-store");
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert!(
        html.contains("<label for=\"name\">"),
        "inputs are labelled: {html}"
    );
    assert!(html.contains("name=\"viewport\""));

    let forged = user
        .form_with_csrf("/app/keys", &"1".repeat(64), &[("name", "forged")])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    // A CSRF cookie planted by another site (a subdomain may set one) with a form that
    // matches it: refused, the token is bound to the session.
    let planted = "2".repeat(64);
    user.csrf = planted.clone();
    let tossed = user
        .form_with_csrf("/app/keys", &planted, &[("name", "tossed")])
        .await;
    assert_eq!(tossed.status, StatusCode::FORBIDDEN);
    assert_eq!(user.page("/app/keys").await.status, StatusCode::OK);
    assert_ne!(user.csrf, planted, "the page set the session's token again");
    // A name with a NUL (a form's `%00`) is refused as any bad name is, not a 500.
    let nul = user.form("/app/keys", &[("name", "a\0b")]).await;
    assert_eq!(nul.status, StatusCode::BAD_REQUEST, "{}", text(&nul));
    let created = user.form("/app/keys", &[("name", "laptop")]).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let html = text(&created);
    let key = html
        .split("value=\"")
        .find_map(|rest| {
            rest.strip_prefix("pm_")
                .map(|k| format!("pm_{}", &k[..k.find('"').unwrap()]))
        })
        .expect("the new key is shown once");
    let _: Value = stack.client(&key).get("/balance", StatusCode::OK).await;
    // The form's mode: a test key, shown as one.
    let test = user
        .form("/app/keys", &[("name", "ci"), ("mode", "test")])
        .await;
    assert_eq!(test.status, StatusCode::CREATED);
    assert!(text(&test).contains("value=\"pm_test_"), "{}", text(&test));
    assert!(text(&user.page("/app/keys").await).contains("pm_test_"));
    assert_eq!(user.page("/app/keys").await.status, StatusCode::OK);
    assert!(
        !text(&user.page("/app/keys").await).contains(&key),
        "never shown again"
    );

    // A path id that is no id is a 400 that says so, as everywhere.
    let malformed = user.form("/app/keys/not-an-id/revoke", &[]).await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        user.page("/app/emails/not-an-id").await.status,
        StatusCode::BAD_REQUEST
    );
    // What the sender refuses is shown as it says it; a message that is not there is a 404.
    let filtered = user.page("/app/emails?tag=no-colon").await;
    assert!(
        text(&filtered).contains("tag must be written name:value"),
        "{}",
        text(&filtered)
    );
    let missing = format!("/app/emails/{}", uuid::Uuid::now_v7());
    assert_eq!(user.page(&missing).await.status, StatusCode::NOT_FOUND);
    let id = stack.key_id(&key).await;
    let forged = user
        .form_with_csrf(&format!("/app/keys/{id}/revoke"), "", &[])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let _: Value = stack.client(&key).get("/balance", StatusCode::OK).await;
    let revoked = user.form(&format!("/app/keys/{id}/revoke"), &[]).await;
    assert_eq!(revoked.status, StatusCode::OK);
    let refused = stack.client(&key).send(Method::GET, "/balance", None).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);

    let usage = user.page("/app/usage").await;
    assert_eq!(usage.status, StatusCode::OK);
    assert!(text(&usage).contains("id=\"balance\""), "{}", text(&usage));
}
