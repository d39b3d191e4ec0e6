//! What operators rely on: health, readiness, metrics, request ids.

use std::time::Duration;

use reqwest::StatusCode;

use postmesh_tests::{eventually, Stack};

/// What the admin server at `addr` serves on `/metrics`.
async fn metrics_of(stack: &Stack, addr: std::net::SocketAddr) -> String {
    let res = stack.http.get(format!("http://{addr}/metrics")).send();
    res.await.unwrap().text().await.unwrap()
}

/// What every service serves, and request ids, on one stack.
#[tokio::test]
async fn health_and_request_ids_side_by_side() {
    postmesh_tests::side_by_side!(
        Stack::start().await,
        [
            every_service_serves_health_readiness_and_metrics,
            request_ids_are_echoed_or_generated
        ]
    );
}

async fn every_service_serves_health_readiness_and_metrics(stack: &Stack) {
    let key = stack.key(1).await;
    assert_eq!(stack.balance(&key).await, 1);
    let admins = stack.admin_addrs();
    assert_eq!(
        admins.len(),
        6,
        "gateway, billing, domain, inbound, dispatcher, sender"
    );
    for addr in admins {
        for path in ["/healthz", "/readyz"] {
            let res = stack
                .http
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{addr}{path}");
        }
        let metrics = metrics_of(stack, addr).await;
        // In one process the services share a registry; what each counts on its own is
        // checked with one process per service below.
        assert!(metrics.contains("# TYPE postmesh_"), "{metrics}");
    }
}

async fn request_ids_are_echoed_or_generated(stack: &Stack) {
    let key = stack.key(1).await;
    let res = stack
        .http
        .get(format!("{}/balance", stack.base))
        .bearer_auth(&key)
        .header("x-request-id", "req-from-client-42")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-request-id"], "req-from-client-42");
    let res = stack
        .http
        .get(format!("{}/balance", stack.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let generated = res.headers()["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(generated).is_ok(), "{generated}");
}

/// Each service in its own process, as in production: every admin endpoint shows the
/// counters of the work its own service did, and none of another's (in one process the
/// services would share one registry and could not be told apart).
#[tokio::test]
async fn each_service_process_counts_its_own_work() {
    use postmesh_shared::Service;
    use postmesh_tests::{common, free_port, fresh_namespace, spawn_service, Stack};

    let common = common(fresh_namespace());
    let outbox = tempfile::tempdir().unwrap();
    let gateway_addr = free_port();
    let mut children = Vec::new();
    let mut admins = Vec::new();
    for service in [
        Service::Billing,
        Service::Domain,
        Service::InboundIngest,
        Service::WebhookDispatcher,
        Service::Sender,
        Service::ApiGateway,
    ] {
        let admin = free_port();
        let mut env = postmesh_shared::Common {
            admin_addr: admin,
            ..common.clone()
        }
        .to_env();
        env.push(("GATEWAY_ADDR", gateway_addr.to_string()));
        env.push(("OUTBOX_DIR", outbox.path().display().to_string()));
        env.push(("SEND_TRANSPORT", "file".into()));
        children.push(spawn_service(service, env));
        admins.push((service, admin));
    }
    // A stack over the same namespace, for its helpers only (it starts no services).
    let stack = Stack::attach(common.clone(), format!("http://{gateway_addr}"));
    for ((_, admin), child) in admins.iter().zip(&children) {
        stack.wait_ready(*admin, child).await;
    }
    let key = stack.key(5).await;
    assert_eq!(stack.balance(&key).await, 5);
    stack.send_code_ok(&key, "ops@example.com").await;
    // One forwarded request for each of the domain, inbound and dispatcher services.
    for path in [
        "/sender-domains",
        "/inbox/addresses",
        "/inbox/webhook/endpoints",
    ] {
        let res = stack
            .http
            .get(format!("http://{gateway_addr}{path}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    let outbox_dir = outbox.path();
    eventually(Duration::from_secs(20), || async move {
        match std::fs::read_dir(outbox_dir).unwrap().count() {
            0 => Err("the code was never sent"),
            _ => Ok(()),
        }
    })
    .await;

    let ns = common.namespace.as_str();
    let own: [(Service, &[String], &[String]); 6] = [
        (
            Service::ApiGateway,
            &[
                "postmesh_http_requests_total{route=\"/balance\"".into(),
                // Buckets: the alert rules take a p99 across replicas from them.
                "postmesh_http_request_seconds_bucket{route=\"/balance\"".into(),
                "postmesh_codes_sent_total".into(),
            ],
            &["postmesh_nats_requests_total".into()],
        ),
        (
            Service::Billing,
            &[
                format!("subject=\"{ns}.rpc.billing.grant\""),
                format!("subject=\"{ns}.rpc.billing.charge\""),
                format!("subject=\"{ns}.svc.billing.http\""),
            ],
            &[
                "postmesh_http_requests_total".into(),
                "svc.domain.http".into(),
            ],
        ),
        (
            Service::Domain,
            &[format!("subject=\"{ns}.svc.domain.http\"")],
            &["rpc.billing".into(), "postmesh_http_requests_total".into()],
        ),
        (
            Service::InboundIngest,
            &[format!("subject=\"{ns}.svc.inbound-ingest.http\"")],
            &[
                "svc.domain.http".into(),
                "postmesh_http_requests_total".into(),
            ],
        ),
        (
            Service::WebhookDispatcher,
            &[format!("subject=\"{ns}.svc.webhook-dispatcher.http\"")],
            &[
                "svc.inbound-ingest.http".into(),
                "postmesh_http_requests_total".into(),
            ],
        ),
        (
            Service::Sender,
            &["postmesh_queue_items_total{queue=\"sender\",result=\"done\"}".into()],
            &["rpc.billing".into(), "postmesh_http_requests_total".into()],
        ),
    ];
    for (service, present, absent) in own {
        let admin = admins.iter().find(|(s, _)| *s == service).unwrap().1;
        // A counter may be recorded just after the answer it counts: wait for it, within bounds.
        let stack = &stack;
        let metrics = eventually(Duration::from_secs(10), || async move {
            let metrics = metrics_of(stack, admin).await;
            match present.iter().find(|s| !metrics.contains(s.as_str())) {
                None => Ok(metrics),
                Some(series) => Err(format!("{service} lacks {series}:\n{metrics}")),
            }
        })
        .await;
        for series in absent {
            assert!(
                !metrics.contains(series.as_str()),
                "{service} shows {series}:\n{metrics}"
            );
        }
    }
    drop(children);
    stack.shutdown().await;
}
