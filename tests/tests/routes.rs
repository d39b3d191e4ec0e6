//! One owner per route: each service's served router answers exactly its manifest, and the
//! gateway's table is the manifests. And a body too large for a NATS message still reaches
//! its route.

use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use api_gateway::table::{table, Target};
use postmesh_contracts::routes::sender::SEND_EMAIL;
use postmesh_contracts::{HttpMethod, Policy, RouteSpec};
use postmesh_shared::nats::{self, ServiceHost, CLAIM_CHECK_THRESHOLD};
use postmesh_shared::proto::{Header, HttpRequest, HttpResponse};
use postmesh_shared::routes::NO_SUCH_ENDPOINT;
use postmesh_shared::{Routes, Service};
use postmesh_tests::{openapi_bodies, Stack};

/// What `router` answers `method path`: `None` when no handler took it (its own "no such
/// endpoint" 404 or a 405), else the status (a handler may answer 404 itself, or fail for
/// want of a caller or a database).
async fn served(router: &axum::Router, method: HttpMethod, path: &str) -> Option<u16> {
    let path = path
        .replace("{id}", &uuid::Uuid::now_v7().to_string())
        .replace("{task_id}", &uuid::Uuid::now_v7().to_string())
        .replace("{key}", "welcome");
    let req = axum::http::Request::builder()
        .method(method.as_str())
        .uri(&path)
        .body(Body::empty())
        .unwrap();
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    let unrouted = status == 404 && String::from_utf8_lossy(&body).contains(NO_SUCH_ENDPOINT);
    (!unrouted && status != 405).then_some(status)
}

/// Each service with HTTP routes and the router it serves (`start` serves this same
/// `router(state)`). Keyed handlers stop at the missing auth context; a public one that
/// reaches for the database fails fast.
async fn served_routers() -> Vec<(Service, axum::Router)> {
    let idle = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_millis(200))
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let nats = postmesh_tests::ops_nats(&postmesh_tests::nats_url())
        .await
        .expect("NATS");
    let sender_state = sender::AppState::new(
        idle.clone(),
        nats.clone(),
        postmesh_tests::fresh_namespace(),
        tokio_util::task::TaskTracker::new(),
        postmesh_shared::jetstream::outbox::Outbox::new(
            idle.clone(),
            async_nats::jetstream::new(nats),
        ),
        postmesh_shared::EmailAddress::parse("no-reply@postmesh.localhost").unwrap(),
    );
    vec![
        (Service::Sender, sender::router(sender_state)),
        (
            Service::Billing,
            billing::router(billing::AppState::new(idle.clone())),
        ),
        (
            Service::Domain,
            domain::router(domain::AppState::new(idle.clone()).unwrap()),
        ),
        (
            Service::InboundIngest,
            inbound_ingest::router(inbound_ingest::AppState::new(
                idle.clone(),
                postmesh_tests::fresh_namespace(),
            )),
        ),
        (
            Service::WebhookDispatcher,
            webhook_dispatcher::router(
                webhook_dispatcher::AppState::new(idle, postmesh_tests::fresh_namespace()).unwrap(),
            ),
        ),
    ]
}

/// Every service's served router answers exactly the methods its manifest declares on each
/// declared path, and 405 for the others; the gateway forwards exactly the manifests.
#[tokio::test]
async fn served_routers_and_the_gateway_table_match_the_manifests() {
    let routers = served_routers().await;
    for service in Service::ALL {
        let manifest = service.routes();
        if service == Service::ApiGateway || manifest.is_empty() {
            continue;
        }
        let (_, router) = routers
            .iter()
            .find(|(s, _)| *s == service)
            .unwrap_or_else(|| panic!("{service} serves routes but is not checked here"));
        for spec in manifest {
            for method in HttpMethod::ALL {
                let declared = manifest
                    .iter()
                    .any(|d| d.path == spec.path && d.method == method);
                let status = served(router, method, spec.path).await;
                assert_eq!(
                    status.is_some(),
                    declared,
                    "{service}: {} {} answered {status:?}",
                    method.as_str(),
                    spec.path
                );
            }
        }
    }
    // The gateway's table is every manifest, each route once, with its owner.
    let table = table();
    let expected: usize = Service::ALL.iter().map(|s| s.routes().len()).sum();
    assert_eq!(table.len(), expected);
    for service in Service::ALL {
        for spec in service.routes() {
            let owners: Vec<_> = table
                .iter()
                .filter(|e| e.spec.method == spec.method && e.spec.path == spec.path)
                .collect();
            assert_eq!(owners.len(), 1, "{} {}", spec.method.as_str(), spec.path);
            assert_eq!(owners[0].spec, *spec);
            let target = match service {
                Service::ApiGateway => Target::Gateway,
                other => Target::Service(other),
            };
            assert_eq!(owners[0].target, target);
        }
    }
}

/// The length and SHA-256 of the body it received.
async fn digest(body: Bytes) -> String {
    format!("{} {}", body.len(), hex::encode(Sha256::digest(&body)))
}

/// A 2 MiB body, over NATS's 1 MiB `max_payload`, forwarded as the gateway forwards it,
/// travels by claim check through the namespace's object store to a route that accepts it,
/// and is deleted once handled; the body travels on the bulk connections of both sides,
/// never on the ones that carry requests; a body whose object is gone is a 502, not a panic.
#[tokio::test]
async fn a_body_too_large_for_nats_travels_by_claim_check() {
    let common = postmesh_tests::common(postmesh_tests::fresh_namespace());
    let ns = common.namespace.clone();
    // Serves as the domain service and forwards as the gateway: the operator's user may do
    // both. Each side has its two connections.
    let connect = || async {
        postmesh_tests::ops_nats(&common.nats_url)
            .await
            .expect("nats")
    };
    let (client, bulk) = (connect().await, connect().await);
    let (host, host_bulk) = (connect().await, connect().await);
    // The bucket every service makes at its start.
    let js = async_nats::jetstream::new(client.clone());
    nats::ensure_bodies(&js, &ns, 1)
        .await
        .expect("the body bucket");
    let upload_route = RouteSpec {
        method: HttpMethod::Post,
        path: "/upload",
        policy: Policy::Public,
        body_limit: Some(4 * 1024 * 1024),
    };
    let router = Routes::new()
        .at(upload_route, digest)
        .into_router(&[upload_route], ());
    let (shutdown, tracker) = (CancellationToken::new(), TaskTracker::new());
    ServiceHost::new(host.clone(), host_bulk.clone(), ns.clone(), Service::Domain)
        .http(router)
        .start(shutdown.clone(), &tracker)
        .await
        .expect("service host starts");

    let upload = |body: Vec<u8>| HttpRequest {
        method: "POST".into(),
        path: "/upload".into(),
        headers: vec![Header {
            name: "content-type".into(),
            value: "application/octet-stream".into(),
        }],
        body: body.into(),
        ..Default::default()
    };
    let text = |reply: &HttpResponse| String::from_utf8_lossy(&reply.body).into_owned();

    let body: Vec<u8> = (0..2 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    assert!(body.len() > CLAIM_CHECK_THRESHOLD);
    let expected = format!("{} {}", body.len(), hex::encode(Sha256::digest(&body)));
    let reply = nats::forward(&client, &bulk, &ns, Service::Domain, &upload(body))
        .await
        .expect("forwarded");
    assert_eq!((reply.status, text(&reply)), (200, expected));
    let bytes = |c: &async_nats::Client| {
        let stats = c.statistics();
        (
            stats.out_bytes.load(Ordering::Relaxed),
            stats.in_bytes.load(Ordering::Relaxed),
        )
    };
    const MIB: u64 = 1 << 20;
    assert!(
        bytes(&bulk).0 >= 2 * MIB,
        "sent on bulk: {:?}",
        bytes(&bulk)
    );
    assert!(
        bytes(&host_bulk).1 >= 2 * MIB,
        "read on bulk: {:?}",
        bytes(&host_bulk)
    );
    assert!(
        bytes(&client).0 < MIB,
        "sent with the request: {:?}",
        bytes(&client)
    );
    assert!(
        bytes(&host).1 < MIB,
        "read with the request: {:?}",
        bytes(&host)
    );

    // The service deleted the body once it had answered.
    let js = async_nats::jetstream::new(client.clone());
    let store = js
        .get_object_store(nats::bodies_bucket(&ns))
        .await
        .expect("the claim-check bucket exists");
    let left: Vec<_> = store.list().await.expect("list").collect().await;
    assert!(left.is_empty(), "bodies left in the bucket: {left:?}");

    // Over the route's own limit, the service answers 413.
    let reply = nats::forward(
        &client,
        &bulk,
        &ns,
        Service::Domain,
        &upload(vec![7; 5 << 20]),
    )
    .await
    .expect("forwarded");
    assert_eq!(reply.status, 413, "{}", text(&reply));

    // A claim check whose object is gone is an error answer.
    let reply = nats::forward(
        &client,
        &bulk,
        &ns,
        Service::Domain,
        &HttpRequest {
            body_key: "no-such-body".into(),
            ..upload(Vec::new())
        },
    )
    .await
    .expect("forwarded");
    assert_eq!(reply.status, 502, "{}", text(&reply));
    assert!(
        text(&reply).contains("no longer stored"),
        "{}",
        text(&reply)
    );

    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    postmesh_tests::remove_namespace(&common).await;
}

/// The gateway's own limits and documents, on one stack.
#[tokio::test]
async fn gateway_documents_and_limits_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            a_route_with_its_own_limit_takes_large_bodies_through_the_gateway,
            the_openapi_document_covers_exactly_the_gateway_table_and_is_served_with_its_page
        ]
    );
}

/// Through the real gateway: a route with its own body limit (`/send-email`) takes a body far
/// over `GATEWAY_BODY_LIMIT` (64 KiB in tests) and over the claim-check threshold, which
/// reaches the service whole; over the route's limit the gateway answers 413 in the standard
/// body; a route without its own limit still stops at `GATEWAY_BODY_LIMIT`.
async fn a_route_with_its_own_limit_takes_large_bodies_through_the_gateway(stack: &Stack) {
    let limit = SEND_EMAIL
        .body_limit
        .expect("/send-email declares its own body limit");
    assert!(limit > 2 * CLAIM_CHECK_THRESHOLD);
    let key = stack.key(10).await;
    let post = |path: &str, body: Vec<u8>| {
        let req = stack
            .http
            .post(format!("{}{path}", stack.base))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body);
        async move {
            let res = req.send().await.expect("gateway answers");
            let status = res.status().as_u16();
            let json: serde_json::Value = res.json().await.unwrap_or_default();
            (status, json)
        }
    };

    // 2 MiB of blanks and then a stray `x`: the sender's JSON parser reports the column of
    // the `x`, so it read every byte.
    let mut body = vec![b' '; 2 * 1024 * 1024];
    body.push(b'x');
    let (status, json) = post("/send-email", body).await;
    assert_eq!(status, 400, "{json}");
    assert_eq!(json["success"], false, "{json}");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(error.contains("column 2097153"), "{error}");
    let js = stack.jetstream().await;
    let store = js
        .get_object_store(nats::bodies_bucket(stack.ns()))
        .await
        .expect("the claim-check bucket exists");
    let left: Vec<_> = store.list().await.expect("list").collect().await;
    assert!(left.is_empty(), "bodies left in the bucket: {left:?}");

    let (status, json) = post("/send-email", vec![b' '; limit + 1]).await;
    assert_eq!(status, 413, "{json}");
    assert_eq!(json["success"], false, "{json}");
    assert_eq!(
        json["error"],
        format!("request body over {limit} bytes"),
        "{json}"
    );

    let (status, json) = post("/deduct", vec![b' '; 100 * 1024]).await;
    assert_eq!(status, 413, "{json}");
    assert_eq!(json["success"], false, "{json}");

    // The gateway routes only declared methods: `POST /balance` is 405 before any auth.
    let (status, json) = post("/balance", Vec::new()).await;
    assert_eq!(status, 405, "{json}");
    assert_eq!(json["success"], false, "{json}");
}

/// The gateway includes the body schemas as a checked-in file: it must be what the
/// services' types say now. `make openapi` (`UPDATE_OPENAPI=1`) writes it.
#[test]
fn the_body_schemas_the_gateway_includes_are_current() {
    let current = openapi_bodies::render();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(openapi_bodies::PATH, &current).unwrap();
    }
    let included = std::fs::read_to_string(openapi_bodies::PATH).unwrap();
    assert!(
        included == current,
        "services/api-gateway/src/openapi_bodies.json is not what the services' types say: \
         run `make openapi`"
    );
}

/// Every setting the services read, in the order of the configuration table.
fn settings() -> Vec<&'static postmesh_shared::config::Setting> {
    [
        postmesh_shared::config::SETTINGS,
        postmesh_ses::settings::SETTINGS,
        api_gateway::settings::SETTINGS,
        billing::settings::SETTINGS,
        domain::settings::SETTINGS,
        inbound_ingest::settings::SETTINGS,
        webhook_dispatcher::settings::SETTINGS,
        sender::settings::SETTINGS,
        smtp_submission::settings::SETTINGS,
    ]
    .concat()
}

#[test]
fn the_configuration_table_in_docs_is_written_from_the_settings() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
    let kept = std::fs::read_to_string(path).unwrap();
    let start = kept
        .find("| variable | default | used by |")
        .expect("docs/configuration.md has the table");
    let end = kept[start..]
        .find("\n\n")
        .map_or(kept.len(), |at| start + at + 1);
    let current = postmesh_shared::config::table(&settings());
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        let written = format!("{}{current}{}", &kept[..start], &kept[end..]);
        std::fs::write(path, written).unwrap();
        return;
    }
    assert!(
        kept[start..end] == current,
        "docs/configuration.md's table is not what the settings say: run `make openapi`"
    );
}

#[test]
fn the_api_reference_in_docs_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md");
    let current = api_gateway::reference::markdown();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(path, &current).unwrap();
    }
    let kept = std::fs::read_to_string(path).unwrap();
    assert!(
        kept == current,
        "docs/api.md is not what the OpenAPI document says: run `make openapi`"
    );
    // Every operation and every body schema is in it.
    let doc = api_gateway::openapi::document();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let heading = format!("### `{} {path}`", method.to_uppercase());
            assert!(kept.contains(&heading), "{heading} is missing");
        }
    }
    for name in doc["components"]["schemas"].as_object().unwrap().keys() {
        assert!(
            kept.contains(&format!("\n### {name}\n")),
            "schema {name} is missing"
        );
    }
}

async fn the_openapi_document_covers_exactly_the_gateway_table_and_is_served_with_its_page(
    stack: &Stack,
) {
    let doc = api_gateway::openapi::document();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = std::collections::HashSet::new();
    let mut operation_ids = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            documented.insert((method.to_uppercase(), path.clone()));
            let id = operation["operationId"].as_str().unwrap().to_owned();
            assert!(operation_ids.insert(id.clone()), "{id} is not unique");
        }
    }
    let routes: std::collections::HashSet<(String, String)> = table()
        .iter()
        .map(|e| (e.spec.method.as_str().to_owned(), e.spec.path.to_owned()))
        .collect();
    assert_eq!(
        documented, routes,
        "the document and the route table differ"
    );
    // Who may call and which parameters a route takes come from its manifest row.
    for e in table() {
        let operation = &doc["paths"][e.spec.path][e.spec.method.as_str().to_lowercase()];
        let schemes: Vec<&str> = operation["security"]
            .as_array()
            .map(|list| {
                list.iter()
                    .flat_map(|s| s.as_object().unwrap().keys().map(String::as_str))
                    .collect()
            })
            .unwrap_or_default();
        let expected: &[&str] = match e.spec.policy {
            Policy::Public => &[],
            Policy::Key => &["apiKey"],
            Policy::InboundSecret => &["inboundSecret"],
            Policy::ProviderSecret => &["providerSecret"],
            Policy::Session => &["session"],
            Policy::Page => &["pageSession"],
        };
        assert_eq!(
            schemes,
            expected,
            "{} {}",
            e.spec.method.as_str(),
            e.spec.path
        );
        let params: Vec<&str> = operation["parameters"]
            .as_array()
            .map(|list| {
                list.iter()
                    .filter(|p| p["in"] == "path")
                    .map(|p| p["name"].as_str().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        let in_path: Vec<&str> = e
            .spec
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        assert_eq!(params, in_path, "{}", e.spec.path);
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["apiKey"]["scheme"],
        "bearer"
    );
    // A send may carry an Idempotency-Key.
    let send_params = &doc["paths"]["/send-email"]["post"]["parameters"];
    assert_eq!(send_params[0]["name"], "idempotency-key");
    assert_eq!(send_params[0]["in"], "header");
    assert_eq!(send_params[0]["required"], false);
    // Errors are the JSON error body, except on pages (HTML, and a redirect without a
    // session).
    let error_of =
        |method: &str, path: &str| doc["paths"][path][method]["responses"]["4XX"].clone();
    assert_eq!(
        error_of("get", "/balance")["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/Error"
    );
    assert_eq!(
        error_of("post", "/smtp-auth")["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/SmtpAuthAnswer"
    );
    assert!(error_of("get", "/app/keys").get("content").is_none());
    assert!(error_of("get", "/unsubscribe").get("content").is_none());
    assert!(doc["paths"]["/app/keys"]["get"]["responses"]["303"].is_object());
    assert!(doc["paths"]["/balance"]["get"]["responses"]["303"].is_null());
    // Bodies come from the services' types: `/balance` answers `{success, balance}`, a
    // deduct's body may be left out, a send's may not.
    let schema_of = |content: &serde_json::Value| {
        let reference = content["application/json"]["schema"]["$ref"].as_str();
        let name = reference.and_then(|r| r.strip_prefix("#/components/schemas/"));
        doc["components"]["schemas"][name.unwrap_or("")].clone()
    };
    let balance = schema_of(&doc["paths"]["/balance"]["get"]["responses"]["2XX"]["content"]);
    assert_eq!(
        balance["allOf"][0]["required"],
        serde_json::json!(["success"])
    );
    assert_eq!(balance["allOf"][1]["$ref"], "#/components/schemas/Balance");
    let fields = &doc["components"]["schemas"]["Balance"];
    assert_eq!(
        fields["properties"]["balance"]["type"], "integer",
        "{fields}"
    );
    assert_eq!(fields["required"], serde_json::json!(["balance"]));
    let deduct = &doc["paths"]["/deduct"]["post"]["requestBody"];
    assert_eq!(deduct["required"], false, "{deduct}");
    let properties = schema_of(&deduct["content"])["properties"].clone();
    assert!(properties["idempotencyKey"].is_object(), "{properties}");
    let send = &doc["paths"]["/send-email"]["post"]["requestBody"];
    assert_eq!(send["required"], true, "{send}");
    assert!(schema_of(&send["content"])["properties"]["subject"].is_object());
    // Query parameters come from the handlers' query types, with serde's names.
    let query = |method: &str, path: &str| -> Vec<String> {
        doc["paths"][path][method]["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(query("get", "/logs"), ["limit", "offset"]);
    assert_eq!(
        query("get", "/inbox/threads"),
        ["addressId", "unread", "limit", "offset"]
    );
    // Ids in paths are uuids.
    let id = &doc["paths"]["/contacts/{id}"]["get"]["parameters"][0];
    assert_eq!(id["schema"]["format"], "uuid", "{id}");
    // Every reference resolves.
    let mut pending = vec![&doc];
    while let Some(value) = pending.pop() {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(target) = map.get("$ref").and_then(|r| r.as_str()) {
                    let name = target.strip_prefix("#/components/schemas/").unwrap();
                    assert!(
                        doc["components"]["schemas"][name].is_object(),
                        "{target} is not in the document"
                    );
                }
                pending.extend(map.values());
            }
            serde_json::Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }

    // Served as it is built, and the reference page lists every path.
    let res = stack
        .http
        .get(format!("{}/openapi.json", stack.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/json");
    let served: serde_json::Value = res.json().await.unwrap();
    assert_eq!(served, doc);
    let res = stack
        .http
        .get(format!("{}/docs", stack.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = res.text().await.unwrap();
    // Every operation, and every body schema with its fields, where the links point.
    assert!(
        page.contains("<a href=\"#sendbody\">SendBody</a>"),
        "a body links its schema"
    );
    for e in table() {
        let operation = format!("<code>{} {}</code>", e.spec.method.as_str(), e.spec.path);
        assert!(page.contains(&operation), "{operation}");
    }
    for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
        let anchor = format!("<h3 id=\"{}\">{name}</h3>", name.to_lowercase());
        assert!(page.contains(&anchor), "{anchor}");
        for field in schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(f, _)| f)
        {
            assert!(
                page.contains(&format!("<code>{field}</code>")),
                "{name}.{field}"
            );
        }
    }
}

#[test]
fn every_paged_list_documents_the_bounds_it_enforces() {
    let doc = api_gateway::openapi::document();
    let mut unbounded = Vec::new();
    let mut pages = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for param in operation["parameters"].as_array().into_iter().flatten() {
                let least = match param["name"].as_str() {
                    Some("limit") => 1,
                    Some("offset") => 0,
                    _ => continue,
                };
                pages += 1;
                if param["schema"]["minimum"] != least {
                    unbounded.push(format!("{method} {path} {}", param["name"]));
                }
            }
        }
    }
    assert!(pages > 20, "only {pages} paging parameters found");
    assert!(
        unbounded.is_empty(),
        "paging parameters documented without the minimum the list enforces: {unbounded:?}"
    );
}

/// The ingress in front of the gateway lets the largest body any route takes through, so a
/// body too large gets the gateway's JSON 413, and a body a route takes is never refused by
/// the proxy first.
#[test]
fn the_ingress_lets_the_largest_route_body_through() {
    let ingress = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../k8s/base/ingress.yaml"
    ))
    .expect("the ingress");
    let size = ingress
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("nginx.ingress.kubernetes.io/proxy-body-size:")
        })
        .expect("a proxy-body-size annotation")
        .trim();
    let mib: usize = size
        .strip_suffix('m')
        .and_then(|n| n.parse().ok())
        .expect("a size in megabytes");
    let largest = Service::ALL
        .iter()
        .flat_map(|s| s.routes())
        .filter_map(|r| r.body_limit)
        .max()
        .expect("routes with body limits");
    assert!(mib << 20 >= largest, "{size} < {largest} bytes");
}
