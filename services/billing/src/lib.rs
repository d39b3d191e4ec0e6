//! Billing: credit balances and the append-only ledger behind them, the consumption log,
//! and the `charge`, `refund`, `confirm` and `grant` RPCs other services call. Held charges
//! that nobody confirms are refunded by a periodic sweep.

pub mod balance;
pub mod deduct;
pub mod ledger;
pub mod logs;

use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use postmesh_shared::config::env_parse;
use postmesh_shared::nats::{rpc, ServiceHost};
use postmesh_shared::proto::AuthContext;
use postmesh_shared::{db, telemetry, ApiError, Common, Running};

/// The name of this service on NATS and in its database name.
pub const SERVICE: &str = "billing";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Billing settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// How often expired charge holds are refunded (`BILLING_HOLD_SWEEP_SECS`, default 5).
    pub hold_sweep: Duration,
}

impl Config {
    /// Reads the settings from the environment (admin port 9091).
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            common: Common::from_env(9091)?,
            hold_sweep: Duration::from_secs(env_parse("BILLING_HOLD_SWEEP_SECS", 5)?),
        })
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
}

/// The API key id of the caller, as a uuid.
pub(crate) fn key_id(auth: &AuthContext) -> Result<Uuid, ApiError> {
    Uuid::parse_str(&auth.api_key_id)
        .map_err(|_| ApiError::Internal("authentication context missing".into()))
}

/// Billing's HTTP routes, as forwarded by the gateway.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/balance", get(balance::get_balance))
        .route("/deduct", post(deduct::deduct))
        .route("/logs", get(logs::list))
        .route("/logs/download", get(logs::download))
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// Starts billing: database, NATS endpoints, admin server.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let c = &config.common;
    telemetry::init(SERVICE, c.otlp_endpoint.as_deref());
    let db = db::connect(c, SERVICE, &MIGRATOR).await?;
    let nats =
        postmesh_shared::nats::connect(&c.nats_url, SERVICE, Duration::from_secs(10)).await?;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let state = AppState { db: db.clone() };
    let (d1, d2, d3, d4) = (db.clone(), db.clone(), db.clone(), db.clone());
    ServiceHost::new(nats.clone(), c.namespace.clone(), SERVICE)
        .http(router(state))
        .rpc(rpc("charge", move |r| {
            let db = d1.clone();
            async move { Ok(ledger::charge(&db, &r).await?) }
        }))
        .rpc(rpc("refund", move |r| {
            let db = d2.clone();
            async move { Ok(ledger::refund(&db, &r).await?) }
        }))
        .rpc(rpc("confirm", move |r| {
            let db = d3.clone();
            async move { Ok(ledger::confirm(&db, &r).await?) }
        }))
        .rpc(rpc("grant", move |r| {
            let db = d4.clone();
            async move { Ok(ledger::grant(&db, &r).await?) }
        }))
        .start(shutdown.clone(), &tracker)
        .await?;
    tracker.spawn(sweep_holds(db.clone(), config.hold_sweep, shutdown.clone()));
    let ready = telemetry::ready_when_db_and_nats(db, nats);
    let admin = telemetry::serve_admin(c.admin_addr, ready, shutdown.clone()).await?;
    tracing::info!(admin = %admin, namespace = c.namespace.as_str(), "billing started");
    Ok(Running::new(admin, None, shutdown, tracker))
}

/// Refunds expired charge holds every `every` until `shutdown`.
async fn sweep_holds(db: PgPool, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A full batch means more may be waiting: go on without waiting for the next tick.
        loop {
            match ledger::release_expired_holds(&db).await {
                Ok(n) if n == ledger::HOLD_BATCH => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "could not release expired charge holds");
                    break;
                }
            }
        }
    }
}

/// Runs the service until Ctrl-C or SIGTERM, then drains in-flight work.
pub async fn run(config: Config) -> anyhow::Result<()> {
    start(config).await?.until_signal().await
}
