//! The API gateway: terminates HTTP, authenticates API keys, serves verification codes, and
//! forwards every other route to its service over NATS as an HTTP envelope.

pub mod codes;
pub mod keys;
pub mod observe;
pub mod ratelimit;
pub mod routes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use axum::extract::DefaultBodyLimit;
use redis::aio::ConnectionManager;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use postmesh_shared::config::{env_or, env_parse};
use postmesh_shared::{db, telemetry, Common, EmailAddress, Namespace, Running};

pub use codes::CodeConfig;
pub use ratelimit::RateConfig;

/// The name of this service in its database name.
pub const SERVICE: &str = "api-gateway";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Gateway settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// Public HTTP listener (`GATEWAY_ADDR`, default `127.0.0.1:8080`).
    pub http_addr: SocketAddr,
    /// Largest request body accepted, in bytes (`GATEWAY_BODY_LIMIT`, default 256 KiB).
    pub body_limit: usize,
    /// How long a looked-up API key is trusted before it is read again.
    pub key_cache_ttl: Duration,
    /// How long a forwarded request or RPC may take.
    pub upstream_timeout: Duration,
    /// Per-key request rate (`KEY_RATE_PER_SEC`, default 100; `KEY_RATE_BURST`, default 300).
    pub rate: RateConfig,
    pub codes: CodeConfig,
}

impl Config {
    /// Reads the settings from the environment (admin port 9090).
    pub fn from_env() -> anyhow::Result<Self> {
        let common = Common::from_env(9090)?;
        let codes = CodeConfig {
            secret: common.secret("CODE_SECRET", "dev-code-secret")?,
            ttl_secs: 300,
            max_attempts: 5,
            cooldown_secs: env_parse("CODE_COOLDOWN_SECS", 60)?,
            hourly_cap: env_parse("CODE_HOURLY_CAP", 10)?,
            from_email: env_or("CODE_FROM_EMAIL", "no-reply@postmesh.localhost"),
        };
        Ok(Self {
            http_addr: env_parse("GATEWAY_ADDR", SocketAddr::from(([127, 0, 0, 1], 8080)))?,
            body_limit: env_parse("GATEWAY_BODY_LIMIT", 256 * 1024)?,
            key_cache_ttl: Duration::from_secs(env_parse("KEY_CACHE_TTL_SECS", 30)?),
            upstream_timeout: Duration::from_secs(env_parse("UPSTREAM_TIMEOUT_SECS", 10)?),
            rate: RateConfig {
                per_sec: env_parse("KEY_RATE_PER_SEC", 100)?,
                burst: env_parse("KEY_RATE_BURST", 300)?,
            },
            common,
            codes,
        })
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub ns: Namespace,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub redis: ConnectionManager,
    pub keys: Arc<keys::KeyStore>,
    pub rate: Arc<ratelimit::RateLimit>,
    pub codes: Arc<CodeConfig>,
    pub body_limit: usize,
}

/// The gateway's public router with its outer layers.
pub fn app(state: AppState) -> axum::Router {
    let limit = state.body_limit;
    routes::router(state)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(observe::observe))
}

async fn connect_db(c: &Common) -> anyhow::Result<PgPool> {
    db::connect(c, SERVICE, &MIGRATOR).await
}

/// Starts the gateway: database, Redis, NATS, the public listener and the admin server.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let c = &config.common;
    telemetry::init(SERVICE, c.otlp_endpoint.as_deref());
    let db = connect_db(c).await?;
    let redis_client = redis::Client::open(c.redis_url.as_str())?;
    let redis = ConnectionManager::new(redis_client).await?;
    let nats =
        postmesh_shared::nats::connect(&c.nats_url, SERVICE, config.upstream_timeout).await?;
    let js = jetstream::new(nats.clone());
    postmesh_shared::jetstream::send_stream(&js, &c.namespace).await?;
    let state = AppState {
        ns: c.namespace.clone(),
        nats: nats.clone(),
        js,
        redis: redis.clone(),
        keys: Arc::new(keys::KeyStore::new(
            db.clone(),
            config.key_cache_ttl,
            keys::DEFAULT_CACHE_CAPACITY,
        )),
        rate: Arc::new(ratelimit::RateLimit::new(config.rate)),
        codes: Arc::new(config.codes.clone()),
        body_limit: config.body_limit,
    };
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let listener = tokio::net::TcpListener::bind(config.http_addr).await?;
    let http_addr = listener.local_addr()?;
    let app = app(state);
    let stop = shutdown.clone();
    tracker.spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    let ready: telemetry::ReadyCheck = Arc::new(move || {
        let (db, nats, mut redis) = (db.clone(), nats.clone(), redis.clone());
        Box::pin(async move {
            let redis_ok = redis::cmd("PING")
                .query_async::<String>(&mut redis)
                .await
                .is_ok();
            redis_ok
                && db::ping(&db).await
                && nats.connection_state() == async_nats::connection::State::Connected
        })
    });
    let admin = telemetry::serve_admin(c.admin_addr, ready, shutdown.clone()).await?;
    tracing::info!(http = %http_addr, admin = %admin, namespace = c.namespace.as_str(), "gateway started");
    Ok(Running::new(admin, Some(http_addr), shutdown, tracker))
}

/// Runs the gateway until Ctrl-C or SIGTERM, then drains in-flight requests.
pub async fn run(config: Config) -> anyhow::Result<()> {
    start(config).await?.until_signal().await
}

/// Creates the account for `email` if needed and a new key with `credits` (billing must be
/// running); returns the key text.
pub async fn create_key(common: &Common, email: &str, credits: i64) -> anyhow::Result<String> {
    let email = EmailAddress::parse(email)
        .ok_or_else(|| anyhow::anyhow!("invalid email address {email:?}"))?;
    let db = connect_db(common).await?;
    let nats =
        postmesh_shared::nats::connect(&common.nats_url, SERVICE, Duration::from_secs(10)).await?;
    keys::create_key(&db, &nats, &common.namespace, &email, credits).await
}
