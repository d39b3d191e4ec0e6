//! Services trust only what they must: NATS refuses anonymous clients and holds each
//! service's user to its own subjects (`deploy/nats.conf`), and PostgreSQL holds each
//! service's role to its own database (`api-gateway bootstrap`).

use std::str::FromStr;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use postmesh_shared::{nats, Common, Service};
use postmesh_tests::{common, fresh_namespace, ops_nats, remove_namespace};

/// A connection as `service` with its development password that reports the server's
/// errors (permission violations) on the returned channel.
async fn watched(
    common: &Common, service: Service,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_user_and_password(
        service.name().into(),
        format!("dev-{}", service.name()),
    )
    .event_callback(move |event| {
        let tx = tx.clone();
        async move {
            if let async_nats::Event::ServerError(e) = event {
                let _ = tx.send(e.to_string());
            }
        }
    })
    .connect(&common.nats_url)
    .await
    .expect("the service's user signs in");
    (client, rx)
}

/// The server's next error on `errors`, within 5 s.
async fn next_error(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .expect("the server reported no error within 5 s")
        .expect("the connection is open")
}

#[tokio::test]
async fn nats_refuses_anonymous_clients_and_wrong_passwords() {
    let url = postmesh_tests::nats_url();
    let anonymous = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(&url)).await;
    assert!(
        matches!(anonymous, Ok(Err(_))),
        "an anonymous client was let in"
    );
    let wrong =
        async_nats::ConnectOptions::with_user_and_password("billing".into(), "guess".into())
            .connect(&url);
    let wrong = tokio::time::timeout(Duration::from_secs(5), wrong).await;
    assert!(matches!(wrong, Ok(Err(_))), "a wrong password was let in");
    // The right one is: the refusals above are about the credentials, not the server.
    let common = common(fresh_namespace());
    nats::connect(&common, Service::Billing, Duration::from_secs(5))
        .await
        .expect("billing signs in with its own password");
    remove_namespace(&common).await;
}

/// The sender may call billing's `charge` but not `grant` (the gateway's alone); the
/// operator's subscription sees the charge first, so the grant published before it never
/// reached the server's subscribers.
#[tokio::test]
async fn a_service_cannot_publish_another_services_rpc_it_does_not_use() {
    let common = common(fresh_namespace());
    let ns = &common.namespace;
    let ops = ops_nats(&common.nats_url).await.expect("ops");
    let mut seen = ops
        .subscribe(ns.subject("rpc.billing.>"))
        .await
        .expect("subscribe");
    ops.flush().await.expect("flush");

    let sender = nats::connect(&common, Service::Sender, Duration::from_secs(5))
        .await
        .expect("sender");
    let grant = Service::Billing.rpc_subject(ns, "grant");
    let charge = Service::Billing.rpc_subject(ns, "charge");
    sender
        .publish(grant.clone(), "forged".into())
        .await
        .expect("publish");
    sender
        .publish(charge.clone(), "ok".into())
        .await
        .expect("publish");
    sender.flush().await.expect("flush");
    let first = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .expect("the charge arrives")
        .expect("subscription open");
    assert_eq!(
        first.subject.as_str(),
        charge,
        "the sender's grant got through"
    );

    // The gateway may call grant.
    let gateway = nats::connect(&common, Service::ApiGateway, Duration::from_secs(5))
        .await
        .expect("gateway");
    gateway
        .publish(grant.clone(), "granted".into())
        .await
        .expect("publish");
    gateway.flush().await.expect("flush");
    let next = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .expect("the gateway's grant arrives")
        .expect("subscription open");
    assert_eq!(next.subject.as_str(), grant);
    remove_namespace(&common).await;
}

/// Only the gateway publishes the forwarded HTTP requests that carry a caller's AuthContext;
/// every other service is refused, and may not listen on another service's subjects.
#[tokio::test]
async fn only_the_gateway_sends_requests_carrying_an_auth_context() {
    let common = common(fresh_namespace());
    let ns = &common.namespace;
    let target = Service::Sender.http_subject(ns);
    let ops = ops_nats(&common.nats_url).await.expect("ops");
    let mut seen = ops.subscribe(target.clone()).await.expect("subscribe");
    ops.flush().await.expect("flush");

    for service in Service::ALL {
        if matches!(service, Service::ApiGateway) {
            continue;
        }
        let (client, mut errors) = watched(&common, service).await;
        client
            .publish(target.clone(), "forged".into())
            .await
            .expect("publish");
        client.flush().await.expect("flush");
        let error = next_error(&mut errors).await;
        assert!(
            error.contains("Permissions Violation for Publish") && error.contains(&target),
            "{service}: {error}"
        );
        if service != Service::Sender {
            client
                .subscribe(Service::Sender.rpc_subject(ns, "usage"))
                .await
                .expect("subscribe is sent");
            client.flush().await.expect("flush");
            let error = next_error(&mut errors).await;
            assert!(
                error.contains("Permissions Violation for Subscription"),
                "{service}: {error}"
            );
        }
    }
    assert!(
        seen.next().now_or_never().is_none(),
        "a forged request reached the sender's subject"
    );

    let (gateway, mut errors) = watched(&common, Service::ApiGateway).await;
    gateway
        .publish(target.clone(), "forwarded".into())
        .await
        .expect("publish");
    gateway.flush().await.expect("flush");
    let forwarded = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .expect("the gateway's request arrives")
        .expect("subscription open");
    assert_eq!(forwarded.payload.as_ref(), b"forwarded");
    assert!(errors.try_recv().is_err(), "the gateway was refused");
    remove_namespace(&common).await;
}

/// Each service's role may use its own database only: billing's cannot connect to the
/// sender's, and none may create databases.
#[tokio::test]
async fn the_billing_role_cannot_read_the_senders_database() {
    let common = common(fresh_namespace());
    let ns = &common.namespace;
    let billing = Service::Billing.database(ns);
    let server = PgConnectOptions::from_str(&common.database_url).expect("url");
    let as_billing = |database: String| server.clone().username(&billing).database(&database);

    let mut own = as_billing(billing.clone())
        .connect()
        .await
        .expect("billing's role connects to its own database");
    let refused = as_billing(Service::Sender.database(ns)).connect().await;
    let code = match refused {
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
        other => panic!(
            "billing's role reached the sender's database: {:?}",
            other.map(|_| ())
        ),
    };
    assert_eq!(code.as_deref(), Some("42501"), "insufficient_privilege");

    let create = sqlx::query(&format!("CREATE DATABASE \"{billing}_more\""))
        .execute(&mut own)
        .await;
    assert!(
        matches!(&create, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501")),
        "billing's role may create databases: {create:?}"
    );
    own.close().await.ok();
    remove_namespace(&common).await;
}
