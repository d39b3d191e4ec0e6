//! Billing: credit balances and the append-only ledger behind them, the consumption log,
//! and the `charge`, `refund`, `confirm` and `grant` RPCs other services call. Held charges
//! that nobody confirms are refunded by a periodic sweep.

pub mod balance;
pub mod deduct;
pub mod ledger;
pub mod logs;
pub mod rpc;

use std::time::Duration;

use axum::Router;
use sqlx::PgPool;

use postmesh_shared::config::env_secs;
use postmesh_shared::{Common, Routes, Running, Runtime, Service};

/// This service.
pub const SERVICE: Service = Service::Billing;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Billing settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// How often expired charge holds are refunded (`BILLING_HOLD_SWEEP_SECS`, default 5).
    pub hold_sweep: Duration,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            common: Common::from_env(SERVICE)?,
            hold_sweep: env_secs("BILLING_HOLD_SWEEP_SECS", Duration::from_secs(5))?,
        })
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
}

/// Billing's HTTP routes with their auth policy, as the gateway forwards them.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .merge(balance::routes())
        .merge(deduct::routes())
        .merge(logs::routes())
}

/// Billing's HTTP router.
pub fn router(state: AppState) -> Router {
    routes().into_router(state)
}

/// Starts billing: its routes and RPCs on NATS, and the hold sweep.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let rt = Runtime::boot(SERVICE, &config.common, &[&MIGRATOR]).await?;
    let state = AppState { db: rt.db.clone() };
    rt.serve(rpc::register(
        rt.host().http(router(state.clone())),
        state.clone(),
    ))
    .await?;
    rt.every("charge hold sweep", config.hold_sweep, move || {
        let db = state.db.clone();
        async move {
            let released = ledger::release_expired_holds(&db).await?;
            Ok::<_, ledger::LedgerError>(released == ledger::HOLD_BATCH)
        }
    });
    rt.running(None).await
}

/// Runs the service until Ctrl-C or SIGTERM, then drains in-flight work.
pub async fn run(config: Config) -> anyhow::Result<()> {
    start(config).await?.until_signal().await
}
