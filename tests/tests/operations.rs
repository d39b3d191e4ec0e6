//! What operators rely on: health, readiness, metrics, request ids.

use reqwest::StatusCode;

use postmesh_tests::Stack;

#[tokio::test]
async fn every_service_serves_health_readiness_and_metrics() {
    let stack = Stack::start().await;
    let key = stack.key(1).await;
    assert_eq!(stack.balance(&key).await, 1);
    let admins = stack.admin_addrs();
    assert_eq!(admins.len(), 4, "gateway, billing, domain, sender");
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
        let metrics = stack
            .http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("postmesh_http_requests_total{"),
            "{metrics}"
        );
        assert!(
            metrics.contains("postmesh_nats_requests_total{"),
            "{metrics}"
        );
        assert!(metrics.contains("rpc.billing.grant"), "{metrics}");
    }
    stack.shutdown().await;
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated() {
    let stack = Stack::start().await;
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
    stack.shutdown().await;
}
