//! Billing: credit balances and the append-only ledger behind them, the consumption log,
//! top-ups and plans over Stripe, entitlements, and the `charge`, `refund`, `confirm`,
//! `grant` and `entitlements` RPCs other services call. Held charges that nobody confirms
//! are refunded by a periodic sweep.

pub mod balance;
pub mod catalog;
pub mod checkout;
pub mod deduct;
pub mod entitlements;
pub mod ledger;
pub mod logs;
pub mod purchases;
pub mod reversals;
pub mod rpc;
pub mod settings;
pub mod stripe;
pub mod subscriptions;
pub mod webhooks;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;

use postmesh_contracts::routes::billing as api;
use postmesh_shared::config::{secs, PUBLIC_BASE_URL};
use postmesh_shared::{ApiError, Common, Routes, Running, Runtime, Service};

use crate::catalog::{CatalogFile, FreeLimits};
use crate::entitlements::UsageCounter;
use crate::settings::*;
use crate::stripe::{PaymentProvider, StripeClient};

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
    /// Packs and plans (`BILLING_CATALOG_FILE`, default `deploy/catalog.json`).
    pub catalog_file: PathBuf,
    /// Stripe's settings.
    pub stripe: StripeConfig,
    /// Where Checkout and the portal send the buyer back (`PUBLIC_BASE_URL`).
    pub public_base_url: String,
    /// How long each owning service may take to count usage (`BILLING_USAGE_TIMEOUT_SECS`).
    pub usage_timeout: Duration,
}

/// Stripe's settings; without a secret key, payments are off (503).
#[derive(Clone, Debug)]
pub struct StripeConfig {
    /// `STRIPE_API_BASE`, default `https://api.stripe.com`.
    pub api_base: String,
    /// `STRIPE_SECRET_KEY`.
    pub secret_key: Option<String>,
    /// `STRIPE_WEBHOOK_SECRET`: the endpoint's signing secret (`whsec_...`).
    pub webhook_secret: Option<String>,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            common: Common::from_env(SERVICE)?,
            hold_sweep: BILLING_HOLD_SWEEP_SECS.secs()?,
            catalog_file: BILLING_CATALOG_FILE.string().into(),
            stripe: StripeConfig {
                api_base: STRIPE_API_BASE.string(),
                secret_key: STRIPE_SECRET_KEY.opt(),
                webhook_secret: STRIPE_WEBHOOK_SECRET.opt(),
            },
            public_base_url: PUBLIC_BASE_URL.string(),
            usage_timeout: BILLING_USAGE_TIMEOUT_SECS.secs()?,
        })
    }

    /// The same settings as environment variables (to start the binary with them).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.common.to_env();
        env.extend([
            (BILLING_HOLD_SWEEP_SECS.name, secs(self.hold_sweep)),
            (
                BILLING_CATALOG_FILE.name,
                self.catalog_file.display().to_string(),
            ),
            (STRIPE_API_BASE.name, self.stripe.api_base.clone()),
            (
                STRIPE_SECRET_KEY.name,
                self.stripe.secret_key.clone().unwrap_or_default(),
            ),
            (
                STRIPE_WEBHOOK_SECRET.name,
                self.stripe.webhook_secret.clone().unwrap_or_default(),
            ),
            (PUBLIC_BASE_URL.name, self.public_base_url.clone()),
            (BILLING_USAGE_TIMEOUT_SECS.name, secs(self.usage_timeout)),
        ]);
        env
    }
}

/// The payment processor and where it sends buyers back.
pub struct Payments {
    pub stripe: Box<dyn PaymentProvider>,
    /// `PUBLIC_BASE_URL`, without a trailing slash.
    pub public_base_url: String,
}

impl Payments {
    /// The address of `path` (with its query) under the public base URL.
    pub fn return_url(&self, path: &str) -> String {
        format!("{}{path}", self.public_base_url)
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    /// `GET /balance` reads, batched.
    pub balances: balance::BalanceReads,
    /// Stripe, when configured.
    pub payments: Option<Arc<Payments>>,
    /// The webhook signing secret, when configured.
    pub webhook_secret: Option<Arc<str>>,
    /// Limits of a workspace without a plan.
    pub free: FreeLimits,
    /// Asks the owning services for usage; without it every count is 0.
    pub usage: Option<UsageCounter>,
}

impl AppState {
    /// State over `db` alone: no payment processor, no usage counts, no free allowance.
    pub fn new(db: PgPool) -> Self {
        Self {
            balances: balance::BalanceReads::new(db.clone()),
            db,
            payments: None,
            webhook_secret: None,
            free: FreeLimits::default(),
            usage: None,
        }
    }

    /// The payment processor, or 503 when none is configured.
    pub fn payments(&self) -> Result<&Payments, ApiError> {
        self.payments
            .as_deref()
            .ok_or_else(|| ApiError::Unavailable("payments are not configured".into()))
    }
}

/// Every route the service serves, with its handler.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::BALANCE, balance::get_balance)
        .at(api::DEDUCT, deduct::deduct)
        .takes_optional::<deduct::DeductBody>()
        .at(api::LOGS, logs::list)
        .at(api::LOGS_DOWNLOAD, logs::download)
        .at(api::CATALOG, catalog::catalog)
        .at(api::CHECKOUT, purchases::create)
        .at(api::PURCHASES, purchases::list)
        .at(api::PURCHASE, purchases::show)
        .at(api::PURCHASE_RECONCILE, purchases::reconcile)
        .at(api::SUBSCRIPTION_CHECKOUT, subscriptions::create_checkout)
        .at(api::SUBSCRIPTION_RECONCILE, subscriptions::reconcile)
        .at(api::SUBSCRIPTION_PORTAL, subscriptions::portal)
        .at(api::ENTITLEMENTS, entitlements::show)
        .at(api::STRIPE_WEBHOOK, webhooks::receive)
}

/// Billing's HTTP router.
pub fn router(state: AppState) -> Router {
    routes().into_router(SERVICE.routes(), state)
}

/// Billing's state as `config` says, over `db`: the catalog stored, Stripe when its key is
/// set, usage asked of the owning services through `usage` when given.
pub async fn state(
    config: &Config, db: PgPool, usage: Option<UsageCounter>,
) -> anyhow::Result<AppState> {
    let catalog = CatalogFile::read(&config.catalog_file)?;
    catalog.store(&db).await?;
    let payments = match &config.stripe.secret_key {
        Some(key) => Some(Arc::new(Payments {
            stripe: Box::new(StripeClient::new(
                &config.stripe.api_base,
                key,
                config.common.upstream_timeout,
            )?),
            public_base_url: config.public_base_url.trim_end_matches('/').to_owned(),
        })),
        None => {
            tracing::warn!("STRIPE_SECRET_KEY is not set: top-ups and plans answer 503");
            None
        }
    };
    if payments.is_some() && config.stripe.webhook_secret.is_none() {
        tracing::warn!("STRIPE_WEBHOOK_SECRET is not set: Stripe webhooks answer 503; only reconcile settles purchases");
    }
    Ok(AppState {
        balances: balance::BalanceReads::new(db.clone()),
        db,
        payments,
        webhook_secret: config.stripe.webhook_secret.as_deref().map(Arc::from),
        free: catalog.free,
        usage,
    })
}

/// Starts billing: its routes and RPCs on NATS, and the hold sweep.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let rt = Runtime::boot(SERVICE, &config.common, &[&MIGRATOR]).await?;
    let usage = UsageCounter {
        nats: rt.nats.clone(),
        ns: config.common.namespace.clone(),
        timeout: config.usage_timeout,
    };
    let state = state(&config, rt.db.clone(), Some(usage)).await?;
    rt.serve(rpc::register(
        rt.host().http(router(state.clone())),
        state.clone(),
    ))
    .await?;
    rt.every("charge hold sweep", config.hold_sweep, move || {
        let db = state.db.clone();
        async move {
            let released = ledger::release_expired_holds(&db).await?;
            let expired = checkout::expire_unopened(&db).await?;
            Ok::<_, ledger::LedgerError>(
                released == ledger::HOLD_BATCH || expired == checkout::EXPIRE_BATCH,
            )
        }
    });
    rt.running(None).await
}
