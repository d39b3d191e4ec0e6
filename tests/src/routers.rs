//! A service's router on its own database, called as the gateway forwards requests: no
//! gateway, no other service.

use std::time::Duration;

use reqwest::StatusCode;

use inbound_ingest::budget::ByteBudget;
use postmesh_shared::jetstream::outbox::Outbox;
use postmesh_shared::proto::{AuthContext, GrantRequest, Role};
use postmesh_shared::{
    nats, AddressId, ApiError, ApiKeyId, EmailAddress, Rpc, Running, Service, Success,
};

use crate::{billing_config, caller, Options, ServiceDb, TestClient};

/// The sender's database and its router with `quotas`, called by two fresh members of
/// different workspaces.
pub async fn sender_router(quotas: sender::Quotas) -> (ServiceDb, TestClient, TestClient) {
    let store = ServiceDb::create(sender::SERVICE, &sender::MIGRATIONS).await;
    let state = sender_state(&store).await;
    let router = sender::router(sender::AppState { quotas, ..state });
    let client = |role| TestClient::router(router.clone(), Some(caller(role)));
    (store, client(Role::Member), client(Role::Member))
}

/// The sender's state on `store` (the sender's database), connected to NATS as the
/// operator, so its RPCs reach whatever runs in the namespace.
pub async fn sender_state(store: &ServiceDb) -> sender::AppState {
    let nats = crate::ops_nats(&store.common.nats_url).await.expect("NATS");
    sender::AppState::new(
        store.pool.clone(),
        nats.clone(),
        store.common.namespace.clone(),
        tokio_util::task::TaskTracker::new(),
        Outbox::new(store.pool.clone(), async_nats::jetstream::new(nats)),
        EmailAddress::parse("no-reply@postmesh.localhost").unwrap(),
    )
}

/// Billing's database and its router.
pub struct BillingRouter {
    pub store: ServiceDb,
    router: axum::Router,
}

impl BillingRouter {
    /// Billing's database in a fresh namespace and its router, payments off.
    pub async fn new() -> Self {
        Self::with_stripe(Options::default().stripe).await
    }

    /// Billing's database and its router, talking to Stripe as `stripe` says; the
    /// catalog stored as at a start.
    pub async fn with_stripe(stripe: billing::StripeConfig) -> Self {
        let store = ServiceDb::create(billing::SERVICE, &[&billing::MIGRATOR]).await;
        let config = billing_config(&store.common, stripe);
        let state = billing::state(&config, store.pool.clone(), None)
            .await
            .expect("billing's state");
        let router = billing::router(state);
        Self { store, router }
    }

    /// A new key of a new account granted `credits`, and a client calling as that key.
    pub async fn key(&self, credits: i64) -> (ApiKeyId, TestClient) {
        let key = ApiKeyId::new();
        let auth = AuthContext {
            api_key_id: key.to_string(),
            key_id: key.to_string(),
            ..caller(Role::Member)
        };
        billing::ledger::grant(
            &mut self.store.pool.acquire().await.expect("a connection"),
            &GrantRequest {
                api_key_id: key.to_string(),
                account_id: auth.account_id.clone(),
                email: auth.email.clone(),
                credits,
                idempotency_key: format!("grant:{key}"),
            },
        )
        .await
        .expect("credits granted");
        (key, TestClient::router(self.router.clone(), Some(auth)))
    }

    /// The router called by nobody (no caller attached).
    pub fn anonymous(&self) -> TestClient {
        TestClient::router(self.router.clone(), None)
    }
}

/// Billing running alone in a fresh namespace (its RPCs on NATS, its hold sweep), its
/// router beside it on the same database: no gateway, no other service.
pub struct BillingAlone {
    pub billing: BillingRouter,
    running: Option<Running>,
}

impl BillingAlone {
    /// Starts billing in a fresh namespace, payments off.
    pub async fn start() -> Self {
        Self::with_stripe(Options::default().stripe).await
    }

    /// Starts billing in a fresh namespace, talking to Stripe as `stripe` says.
    pub async fn with_stripe(stripe: billing::StripeConfig) -> Self {
        let billing = BillingRouter::with_stripe(stripe.clone()).await;
        let config = billing_config(&billing.store.common, stripe);
        let running = billing::start(config).await.expect("billing starts");
        Self {
            billing,
            running: Some(running),
        }
    }

    /// Calls billing's RPC `req` as another service does.
    pub async fn rpc<R: Rpc>(&self, req: &R) -> Result<R::Reply, ApiError> {
        let common = &self.billing.store.common;
        let client = nats::connect(common, Service::ApiGateway, Duration::from_secs(5))
            .await
            .expect("NATS");
        nats::call(&client, &common.namespace, req).await
    }

    /// Stops billing and removes the namespace's streams and databases.
    pub async fn shutdown(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await;
        }
        crate::remove_namespace(&self.billing.store.common).await;
    }
}

/// The balance of the key `client` calls billing's router with.
pub async fn balance_of(client: &TestClient) -> i64 {
    let b: Success<billing::balance::Balance> = client.get("/balance", StatusCode::OK).await;
    b.body.balance
}

/// Inbound-ingest's database and its router: no NATS, so nothing is published at once and
/// creating an address through the API answers 503 (tests write address rows instead).
pub struct InboundRouter {
    pub store: ServiceDb,
    router: axum::Router,
}

impl InboundRouter {
    /// Inbound-ingest's database in a fresh namespace and its router with `budget`.
    pub async fn new(budget: ByteBudget) -> Self {
        let store = ServiceDb::create(inbound_ingest::SERVICE, &inbound_ingest::MIGRATIONS).await;
        let state = inbound_ingest::AppState {
            budget,
            ..inbound_ingest::AppState::new(store.pool.clone(), store.common.namespace.clone())
        };
        let router = inbound_ingest::router(state);
        Self { store, router }
    }

    /// The upstream MTA, as the gateway forwards it once the inbound secret matched.
    pub fn mta(&self) -> TestClient {
        TestClient::router(self.router.clone(), None)
    }

    /// The inbox `address` of a fresh workspace: its id and a member's client.
    pub async fn inbox(&self, address: &str) -> (AddressId, TestClient) {
        let auth = caller(Role::Member);
        let workspace = auth.workspace_id.parse().expect("a workspace id");
        let id = crate::peek::inbound::insert_address(&self.store.pool, workspace, address).await;
        (
            id.into(),
            TestClient::router(self.router.clone(), Some(auth)),
        )
    }
}
