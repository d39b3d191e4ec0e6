//! The security sweep: every route of the gateway's table called as an attacker would —
//! without a key, with a wrong key, with another workspace's key on this workspace's ids —
//! never gets data (401, 403 or 404, never 2xx or 5xx); malformed JSON and wrong types are
//! 400 and bodies over a route's limit are refused, never a 5xx; CR, LF and NUL in every
//! field of a send that becomes a header are refused.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use postmesh_contracts::{HttpMethod, Policy, RouteSpec, Service};
use postmesh_tests::{Stack, GATEWAY_BODY_LIMIT};

/// Every route of every service's manifest (the gateway's table is exactly these).
fn all_routes() -> Vec<RouteSpec> {
    Service::ALL
        .iter()
        .flat_map(|s| s.routes().iter().copied())
        .collect()
}

fn method(m: HttpMethod) -> Method {
    Method::from_bytes(m.as_str().as_bytes()).unwrap()
}

/// `path` with its parameters filled: ids with `id` (another workspace's, or random),
/// names with something that exists nowhere.
fn fill(path: &str, id: &str) -> String {
    path.replace("{id}", id)
        .replace("{task_id}", id)
        .replace("{event_id}", id)
        .replace("{attemptId}", &uuid::Uuid::now_v7().to_string())
        .replace("{key}", "no-such-key")
        .replace("{email}", "nobody@example.com")
}

/// Calls `route` on the stack: an empty JSON object as body where a body may go.
async fn call(
    stack: &Stack, route: &RouteSpec, path: &str, auth: Option<&str>, body: Option<Vec<u8>>,
) -> (StatusCode, String) {
    // Redirects are answers here, not to be followed.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut req = client.request(method(route.method), format!("{}{path}", stack.base));
    if let Some(key) = auth {
        req = req.bearer_auth(key);
    }
    if !matches!(route.method, HttpMethod::Get | HttpMethod::Delete) {
        req = req
            .header("content-type", "application/json")
            .body(body.unwrap_or_else(|| b"{}".to_vec()));
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    (status, res.text().await.unwrap_or_default())
}

/// The sweeps below, each with keys of its own, on one stack.
#[tokio::test]
async fn attacks_of_one_key_each_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            no_key_or_a_wrong_key_gets_nothing_anywhere,
            another_workspace_s_key_never_reaches_this_workspace_s_data,
            deep_json_is_a_400,
            malformed_wrong_and_oversized_bodies_are_refused_never_a_500,
            cr_lf_and_nul_in_any_header_bound_field_of_a_send_are_refused,
            a_nul_in_any_path_is_a_400,
            a_template_of_the_largest_bodies_passes_the_gateway
        ]
    );
}

/// A template of an html and a text of 500 KiB each, within its 512 KiB bounds, passes the
/// gateway (its body limit was the default 256 KiB: a 413).
async fn a_template_of_the_largest_bodies_passes_the_gateway(stack: &Stack) {
    let key = stack.key(1).await;
    let big = "x".repeat(500 * 1024);
    let full = json!({"key": "large", "subject": "s", "html": big, "text": big});
    let _: serde_json::Value = stack
        .client(&key)
        .post("/templates", &full, StatusCode::OK)
        .await;
}

/// A NUL in a path (`%00`) is a 400 on every route: no text column holds one, and a
/// parameter bound as it came was a 500 from the database.
async fn a_nul_in_any_path_is_a_400(stack: &Stack) {
    let key = stack.key(1).await;
    let mut checked = 0;
    for route in all_routes().iter().filter(|r| r.path.contains('{')) {
        // Every parameter, whatever its name.
        let path: Vec<&str> = route
            .path
            .split('/')
            .map(|s| if s.starts_with('{') { "a%00b" } else { s })
            .collect();
        let path = path.join("/");
        let (status, text) = call(stack, route, &path, Some(&key), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        checked += 1;
    }
    assert!(checked > 20, "{checked} routes");
}

async fn no_key_or_a_wrong_key_gets_nothing_anywhere(stack: &Stack) {
    let mut checked = 0;
    for route in all_routes() {
        let path = fill(route.path, &uuid::Uuid::now_v7().to_string());
        let expected = match route.policy {
            Policy::Public => continue,
            Policy::Key | Policy::Session | Policy::InboundSecret | Policy::ProviderSecret => {
                StatusCode::UNAUTHORIZED
            }
            Policy::Page => StatusCode::SEE_OTHER,
        };
        for auth in [None, Some("pm_live_0000000000000000000000000000")] {
            let (status, body) = call(stack, &route, &path, auth, None).await;
            let what = format!("{} {path} with {auth:?}", route.method.as_str());
            assert_eq!(status, expected, "{what}: {body}");
            if expected == StatusCode::UNAUTHORIZED {
                let answer: Value = serde_json::from_str(&body).expect(&what);
                assert_eq!(answer["success"], false, "{what}");
            }
            checked += 1;
        }
    }
    assert!(checked > 150, "{checked} calls");
}

async fn another_workspace_s_key_never_reaches_this_workspace_s_data(stack: &Stack) {
    let owner = stack.key(100).await;
    let intruder = stack.key(100).await;
    // Something of the owner's behind each kind of id.
    let client = stack.client(&owner);
    let contact: Value = client
        .post(
            "/contacts",
            &json!({"email": "ann@example.com"}),
            StatusCode::CREATED,
        )
        .await;
    let contact_id = contact["contact"]["id"].as_str().unwrap().to_owned();
    let sent: Value = client
        .post(
            "/send-email",
            &json!({"to": "bob@example.com", "subject": "s", "text": "t"}),
            StatusCode::OK,
        )
        .await;
    let task_id = sent["taskId"].as_str().unwrap().to_owned();
    let receiver = postmesh_tests::receiver::Receiver::start().await;
    let hook: Value = client
        .post(
            "/webhooks",
            &json!({"url": receiver.url("/x")}),
            StatusCode::CREATED,
        )
        .await;
    let webhook_id = hook["webhook"]["id"].as_str().unwrap().to_owned();
    let mut checked = 0;
    for route in all_routes() {
        if route.policy != Policy::Key || !route.path.contains('{') {
            continue;
        }
        let id = if route.path.starts_with("/contacts") {
            &contact_id
        } else if route.path.contains("{task_id}") {
            &task_id
        } else if route.path.starts_with("/webhooks") {
            &webhook_id
        } else {
            &uuid::Uuid::now_v7().to_string()
        };
        let path = fill(route.path, id);
        let (status, body) = call(stack, &route, &path, Some(&intruder), None).await;
        let what = format!("{} {path}: {status} {body}", route.method.as_str());
        assert!(
            matches!(
                status,
                StatusCode::NOT_FOUND | StatusCode::FORBIDDEN | StatusCode::BAD_REQUEST
            ),
            "{what}"
        );
        assert!(!body.contains(&owner), "{what}");
        checked += 1;
    }
    assert!(checked > 40, "{checked} calls");
    // And the owner's things are still there.
    let _: Value = client
        .get(&format!("/contacts/{contact_id}"), StatusCode::OK)
        .await;
    let _: Value = client
        .get(&format!("/webhooks/{webhook_id}"), StatusCode::OK)
        .await;
}

/// JSON nested 1,000 deep, as an object inside each field.
fn deep_json() -> Vec<u8> {
    let depth = 1_000;
    format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth)).into_bytes()
}

async fn deep_json_is_a_400(stack: &Stack) {
    let key = stack.key(100).await;
    let routes = [
        (HttpMethod::Post, "/send-email"),
        (HttpMethod::Post, "/contacts"),
        (HttpMethod::Post, "/contacts/import"),
        (HttpMethod::Post, "/events"),
        (HttpMethod::Post, "/templates"),
        (HttpMethod::Post, "/workflows"),
        (HttpMethod::Post, "/webhooks"),
    ];
    for (m, path) in routes {
        let route = all_routes()
            .into_iter()
            .find(|r| r.method == m && r.path == path)
            .expect("a declared route");
        let (status, text) = call(stack, &route, path, Some(&key), Some(deep_json())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        let answer: Value = serde_json::from_str(&text).expect("a JSON error");
        assert_eq!(answer["success"], false, "{path}: {text}");
    }
    // Every service still answers.
    let _: Value = stack.client(&key).get("/balance", StatusCode::OK).await;
}

async fn malformed_wrong_and_oversized_bodies_are_refused_never_a_500(stack: &Stack) {
    let key = stack.key(100).await;
    let mut refused = 0;
    for route in all_routes() {
        if route.policy != Policy::Key
            || matches!(route.method, HttpMethod::Get | HttpMethod::Delete)
        {
            continue;
        }
        let path = fill(route.path, &uuid::Uuid::now_v7().to_string());
        for body in [&b"{not json"[..], b"[1, 2", b"\"a string\"", b"{\"to\": 5}"] {
            let (status, text) = call(stack, &route, &path, Some(&key), Some(body.to_vec())).await;
            let what = format!(
                "{} {path} with {:?}: {status} {text}",
                route.method.as_str(),
                String::from_utf8_lossy(body)
            );
            assert!(!status.is_server_error(), "{what}");
            if status == StatusCode::BAD_REQUEST {
                let answer: Value = serde_json::from_str(&text).expect(&what);
                // /smtp-auth answers {authenticated, username, error}, as the spec says.
                if route.path == "/smtp-auth" {
                    assert_eq!(answer["authenticated"], false, "{what}");
                } else {
                    assert_eq!(answer["success"], false, "{what}");
                }
                assert!(answer["error"].is_string(), "{what}");
                refused += 1;
            }
        }
        // One byte over the route's limit (the test gateway's default otherwise).
        let limit = route.body_limit.unwrap_or(GATEWAY_BODY_LIMIT);
        let mut big = b"{\"pad\":\"".to_vec();
        big.resize(limit + 1 - 2, b'x');
        big.extend_from_slice(b"\"}");
        let (status, text) = call(stack, &route, &path, Some(&key), Some(big)).await;
        let what = format!(
            "{} {path} over its limit: {status} {text}",
            route.method.as_str()
        );
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{what}");
    }
    assert!(refused > 60, "{refused} bodies refused with 400");
    // Wrong types on the send itself.
    for body in [
        json!({"to": 5, "subject": "s", "text": "t"}),
        json!({"to": "a@example.com", "subject": ["s"], "text": "t"}),
        json!({"to": "a@example.com", "subject": "s", "text": "t", "scheduledAt": "soon"}),
    ] {
        let _: Value = stack
            .client(&key)
            .post("/send-email", &body, StatusCode::BAD_REQUEST)
            .await;
    }
}

async fn cr_lf_and_nul_in_any_header_bound_field_of_a_send_are_refused(stack: &Stack) {
    let key = stack.key(100).await;
    let base = json!({"to": "a@example.com", "subject": "s", "text": "t"});
    let fields = [
        "subject",
        "fromName",
        "fromEmail",
        "replyTo",
        "to",
        "cc",
        "bcc",
        "inReplyTo",
        "messageId",
        "references",
    ];
    for field in fields {
        for bad in [
            "x\r\nBcc: evil@example.com",
            "x\nX-Evil: 1",
            "x\rY",
            "x\u{0}y",
        ] {
            let mut body = base.clone();
            body[field] = match field {
                "references" => json!([bad]),
                _ => json!(bad),
            };
            let answer = stack
                .client(&key)
                .request(Method::POST, "/send-email", &body)
                .await;
            assert_eq!(
                answer.status,
                StatusCode::BAD_REQUEST,
                "{field} = {bad:?}: {}",
                String::from_utf8_lossy(&answer.body)
            );
        }
    }
    assert_eq!(stack.balance(&key).await, 100, "nothing was charged");
}
