//! The webhook dispatcher: inbox webhook endpoints and the workspace default webhook (this
//! far: the endpoints and defaults themselves, with their URL safety rules and sealed signing
//! secrets; deliveries come next).

pub mod defaults;
pub mod endpoints;
pub mod secret;
pub mod target;

use axum::Router;
use sqlx::PgPool;

use postmesh_contracts::routes::webhooks as api;
use postmesh_shared::config::env_or;
use postmesh_shared::secrets::{SecretBox, DEV_SECRETS_KEY};
use postmesh_shared::{Common, Namespace, Routes, Running, Runtime, Service};

/// This service.
pub const SERVICE: Service = Service::WebhookDispatcher;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Dispatcher settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// Seals signing secrets (`SECRETS_KEY`: 64 hex digits; required in production).
    pub secrets_key: String,
    /// `WEBHOOK_ALLOW_INSECURE=1`: `http://` and private hosts allowed (local runs, tests).
    pub allow_insecure: bool,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let common = Common::from_env(SERVICE)?;
        let allow_insecure = env_or("WEBHOOK_ALLOW_INSECURE", "0") == "1";
        anyhow::ensure!(
            !(allow_insecure && common.production),
            "WEBHOOK_ALLOW_INSECURE=1 is refused in production"
        );
        Ok(Self {
            secrets_key: common.secret("SECRETS_KEY", DEV_SECRETS_KEY)?,
            allow_insecure,
            common,
        })
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub ns: Namespace,
    pub secrets: SecretBox,
    pub allow_insecure: bool,
    /// Where the inbound service is asked about addresses; without it, creating an
    /// endpoint answers 503.
    pub nats: Option<async_nats::Client>,
}

impl AppState {
    /// State over `db` alone, for the router: the development key, the URL rules on, no NATS.
    pub fn new(db: PgPool, ns: Namespace) -> anyhow::Result<Self> {
        Ok(Self {
            db,
            ns,
            secrets: SecretBox::from_hex(DEV_SECRETS_KEY)?,
            allow_insecure: false,
            nats: None,
        })
    }
}

/// Every route the service serves, with its handler.
fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::ENDPOINTS, endpoints::list)
        .at(api::ENDPOINT_CREATE, endpoints::create)
        .at(api::ENDPOINT, endpoints::show)
        .at(api::ENDPOINT_UPDATE, endpoints::update)
        .at(api::ENDPOINT_DELETE, endpoints::remove)
        .at(api::ADDRESS_SUBSCRIPTION, endpoints::subscribe)
        .at(api::DEFAULT_SET, defaults::put)
        .at(api::DEFAULT, defaults::show)
        .at(api::DEFAULT_DELETE, defaults::remove)
}

/// The dispatcher's HTTP router.
pub fn router(state: AppState) -> Router {
    routes().into_router(SERVICE.routes(), state)
}

/// Starts the dispatcher: its routes on NATS.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let rt = Runtime::boot(SERVICE, &config.common, &[&MIGRATOR]).await?;
    if config.allow_insecure {
        tracing::warn!(
            "WEBHOOK_ALLOW_INSECURE=1: webhooks may go to http:// and private hosts; never in production"
        );
    }
    let state = AppState {
        db: rt.db.clone(),
        ns: config.common.namespace.clone(),
        secrets: SecretBox::from_hex(&config.secrets_key)?,
        allow_insecure: config.allow_insecure,
        nats: Some(rt.nats.clone()),
    };
    rt.serve(rt.host().http(router(state))).await?;
    rt.running(None).await
}

/// Runs the service until Ctrl-C or SIGTERM, then drains in-flight work.
pub async fn run(config: Config) -> anyhow::Result<()> {
    start(config).await?.until_signal().await
}
