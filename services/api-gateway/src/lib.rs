//! The API gateway: terminates HTTP, authenticates API keys and web sessions, serves
//! verification codes, web login, API keys, CLI device authorization and the web app, and
//! forwards every other route to its service over NATS as an HTTP envelope.

pub mod accounts;
pub mod bootstrap;
pub mod codes;
pub mod create_key;
pub mod dead_letters;
pub mod device;
pub mod keys;
pub mod login;
pub mod observe;
pub mod openapi;
pub mod preauth;
pub mod ratelimit;
pub mod reference;
pub mod routes;
pub mod sessions;
pub mod settings;
pub mod table;
pub mod tracking;
pub mod web;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use redis::aio::ConnectionManager;
use sqlx::PgPool;

use postmesh_shared::clients::billing::BillingClient;

use postmesh_shared::config::{secs, PUBLIC_BASE_URL, TRACKING_BASE_URL, TRACKING_SECRET};
use postmesh_shared::jetstream::outbox::Outbox;
use postmesh_shared::tracking_hosts::VerifiedHosts;
use postmesh_shared::{db, Common, Namespace, Running, Runtime, Service};

pub use codes::CodeConfig;
pub use ratelimit::{BodyRateConfig, RateConfig};
use settings::*;

/// This service.
pub const SERVICE: Service = Service::ApiGateway;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// The gateway's migrations: its own and the kit's (the outbox of code emails).
pub const MIGRATIONS: [&sqlx::migrate::Migrator; 2] = [&MIGRATOR, &db::KIT_MIGRATIONS];

/// Gateway settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// Public HTTP listener (`GATEWAY_ADDR`, default `127.0.0.1:8080`).
    pub http_addr: SocketAddr,
    /// Largest request body accepted, in bytes (`GATEWAY_BODY_LIMIT`, default 256 KiB), on
    /// routes that declare no limit of their own (`Routes::body_limit`).
    pub body_limit: usize,
    /// How long a looked-up API key is trusted before it is read again.
    pub key_cache_ttl: Duration,
    /// Per-key request rate (`KEY_RATE_PER_SEC`, default 100; `KEY_RATE_BURST`, default 300).
    pub rate: RateConfig,
    /// Per-account bytes of request bodies over 64 KiB (`ACCOUNT_BODY_BYTES_PER_SEC`,
    /// default 4 MiB; `ACCOUNT_BODY_BURST_BYTES`, default 64 MiB).
    pub body_rate: BodyRateConfig,
    pub codes: CodeConfig,
    /// What the upstream MTA sends in `x-service-inbound-secret` (`INBOUND_SECRET`); unset:
    /// `/inbound-email/*` answer 503.
    pub inbound_secret: Option<String>,
    /// What the cloud mail provider sends in `x-service-provider-secret`
    /// (`PROVIDER_SECRET`); unset: `/provider-events/esp` answers 503.
    pub provider_secret: Option<String>,
    /// `PROVIDER_SECRET_IN_QUERY=1`: `?token=` is taken too, for SNS subscriptions that
    /// cannot send headers (it lands in access logs; warned at start). Default: 401.
    pub provider_secret_in_query: bool,
    /// Where browsers reach the gateway (`PUBLIC_BASE_URL`, default
    /// `http://127.0.0.1:8080`): device verification links; cookies are `Secure` unless it
    /// is `http://`.
    pub public_base_url: String,
    /// Login codes one IP may ask for an hour (`LOGIN_IP_HOURLY_LIMIT`, default 30).
    pub login_ip_hourly_limit: u32,
    /// Seconds a CLI waits between device-login polls (`DEVICE_POLL_INTERVAL_SECS`,
    /// default 5; faster polls are `slow_down`).
    pub device_poll_interval_secs: u64,
    /// Live API keys one account may hold (`API_KEYS_PER_ACCOUNT`, default 50).
    pub api_keys_per_account: i64,
    /// Failed authentications a client address may have in a minute before it is answered
    /// 429 without a key lookup (`AUTH_FAILURES_PER_IP_PER_MINUTE`, default 60; 0 is off).
    pub auth_failures_per_ip_per_minute: u32,
    /// Whether the client IP is the last `X-Forwarded-For` entry
    /// (`GATEWAY_TRUST_FORWARDED_FOR=1`, behind a proxy that appends it), not the peer.
    pub trust_forwarded_for: bool,
    /// Checks tracking tokens (`TRACKING_SECRET`); unset: every tracking path is a 404.
    pub tracking_secret: Option<String>,
    /// The shared tracking base (`TRACKING_BASE_URL`; empty: `PUBLIC_BASE_URL`): on its host
    /// and `PUBLIC_BASE_URL`'s, tokens made for the shared hosts are answered; on any
    /// other, only tokens bound to that host.
    pub tracking_base_url: String,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let common = Common::from_env(SERVICE)?;
        let codes = CodeConfig {
            secret: common.secret(&CODE_SECRET)?,
            ttl_secs: 300,
            max_attempts: 5,
            cooldown_secs: CODE_COOLDOWN_SECS.parse()?,
            hourly_cap: CODE_HOURLY_CAP.parse()?,
            from_email: CODE_FROM_EMAIL.string(),
        };
        Ok(Self {
            http_addr: GATEWAY_ADDR.parse()?,
            body_limit: GATEWAY_BODY_LIMIT.parse()?,
            key_cache_ttl: KEY_CACHE_TTL_SECS.secs()?,
            rate: RateConfig {
                per_sec: KEY_RATE_PER_SEC.parse()?,
                burst: KEY_RATE_BURST.parse()?,
            },
            body_rate: BodyRateConfig {
                bytes_per_sec: ACCOUNT_BODY_BYTES_PER_SEC.parse()?,
                burst_bytes: ACCOUNT_BODY_BURST_BYTES.parse()?,
            },
            inbound_secret: INBOUND_SECRET.opt(),
            provider_secret: PROVIDER_SECRET.opt(),
            provider_secret_in_query: PROVIDER_SECRET_IN_QUERY.flag(),
            public_base_url: PUBLIC_BASE_URL.string(),
            login_ip_hourly_limit: LOGIN_IP_HOURLY_LIMIT.parse()?,
            device_poll_interval_secs: DEVICE_POLL_INTERVAL_SECS.parse()?,
            api_keys_per_account: API_KEYS_PER_ACCOUNT.parse()?,
            auth_failures_per_ip_per_minute: AUTH_FAILURES_PER_IP_PER_MINUTE.parse()?,
            trust_forwarded_for: GATEWAY_TRUST_FORWARDED_FOR.flag(),
            tracking_secret: TRACKING_SECRET.opt(),
            tracking_base_url: TRACKING_BASE_URL.string(),
            common,
            codes,
        })
    }

    /// The same settings as environment variables (to start the binary with them).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.common.to_env();
        env.extend([
            (GATEWAY_ADDR.name, self.http_addr.to_string()),
            (GATEWAY_BODY_LIMIT.name, self.body_limit.to_string()),
            (KEY_CACHE_TTL_SECS.name, secs(self.key_cache_ttl)),
            (KEY_RATE_PER_SEC.name, self.rate.per_sec.to_string()),
            (KEY_RATE_BURST.name, self.rate.burst.to_string()),
            (
                ACCOUNT_BODY_BYTES_PER_SEC.name,
                self.body_rate.bytes_per_sec.to_string(),
            ),
            (
                ACCOUNT_BODY_BURST_BYTES.name,
                self.body_rate.burst_bytes.to_string(),
            ),
            (CODE_SECRET.name, self.codes.secret.clone()),
            (
                CODE_COOLDOWN_SECS.name,
                self.codes.cooldown_secs.to_string(),
            ),
            (CODE_HOURLY_CAP.name, self.codes.hourly_cap.to_string()),
            (CODE_FROM_EMAIL.name, self.codes.from_email.clone()),
            (
                INBOUND_SECRET.name,
                self.inbound_secret.clone().unwrap_or_default(),
            ),
            (
                PROVIDER_SECRET.name,
                self.provider_secret.clone().unwrap_or_default(),
            ),
            (
                PROVIDER_SECRET_IN_QUERY.name,
                u8::from(self.provider_secret_in_query).to_string(),
            ),
            (PUBLIC_BASE_URL.name, self.public_base_url.clone()),
            (
                LOGIN_IP_HOURLY_LIMIT.name,
                self.login_ip_hourly_limit.to_string(),
            ),
            (
                DEVICE_POLL_INTERVAL_SECS.name,
                self.device_poll_interval_secs.to_string(),
            ),
            (
                API_KEYS_PER_ACCOUNT.name,
                self.api_keys_per_account.to_string(),
            ),
            (
                AUTH_FAILURES_PER_IP_PER_MINUTE.name,
                self.auth_failures_per_ip_per_minute.to_string(),
            ),
            (
                GATEWAY_TRUST_FORWARDED_FOR.name,
                u8::from(self.trust_forwarded_for).to_string(),
            ),
            (TRACKING_BASE_URL.name, self.tracking_base_url.clone()),
        ]);
        if let Some(secret) = &self.tracking_secret {
            env.push((TRACKING_SECRET.name, secret.clone()));
        }
        env
    }
}

/// What request handlers share, behind one `Arc`: every extractor clones it, so a clone is
/// one reference count, not one per field.
pub type AppState = Arc<Gateway>;

/// The gateway's shared state.
pub struct Gateway {
    pub ns: Namespace,
    pub nats: async_nats::Client,
    /// The connection claim-checked bodies travel on.
    pub bulk: async_nats::Client,
    pub db: PgPool,
    pub redis: ConnectionManager,
    pub outbox: Outbox,
    pub billing: BillingClient,
    pub keys: keys::KeyStore,
    pub rate: ratelimit::RateLimit,
    /// Per-account bytes of large request bodies.
    pub body_rate: ratelimit::BodyRate,
    /// The settings it started with.
    pub config: Config,
    /// Failed authentications per client address (`AUTH_FAILURES_PER_IP_PER_MINUTE`).
    pub failed_auths: preauth::FailedAuths,
    /// Publishes tracking hits to JetStream.
    pub hits: tracking::Hits,
    /// Checks tracking tokens (`TRACKING_SECRET`); none: every tracking path is a 404.
    pub tracking: Option<tracking::Tokens>,
}

/// The gateway's public router with its outer layers. `GATEWAY_BODY_LIMIT` is the default
/// body limit; a route with its own limit overrides it with a route layer.
pub fn app(state: AppState) -> axum::Router {
    let limit = state.config.body_limit;
    routes::router(state)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(refuse_nul_paths))
        .layer(axum::middleware::from_fn(observe::observe))
}

/// 400 for a path holding a NUL (`%00`): no text column holds one, and a path parameter
/// bound as it came was a 500 from the database.
async fn refuse_nul_paths(
    req: axum::extract::Request, next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if req.uri().path().as_bytes().windows(3).any(|w| w == b"%00") {
        return postmesh_shared::ApiError::BadRequest(
            "invalid path: it holds a NUL character".into(),
        )
        .into_response();
    }
    next.run(req).await
}

/// Starts the gateway: its public listener, the outbox relay, Redis in readiness.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let mut rt = Runtime::boot(SERVICE, &config.common, &MIGRATIONS).await?;
    let redis = rt.redis().await?;
    let ns = rt.common.namespace.clone();
    let hosts = VerifiedHosts::watch(rt.tracking_hosts.clone(), rt.shutdown.clone()).await?;
    let state = Arc::new(Gateway {
        billing: BillingClient::new(rt.nats.clone(), ns.clone(), rt.tracker.clone()),
        outbox: rt.outbox(),
        ns,
        nats: rt.nats.clone(),
        bulk: rt.bulk.clone(),
        db: rt.db.clone(),
        redis,
        keys: keys::KeyStore::new(
            rt.db.clone(),
            config.key_cache_ttl,
            keys::DEFAULT_CACHE_CAPACITY,
        ),
        rate: ratelimit::RateLimit::new(config.rate),
        body_rate: ratelimit::BodyRate::new(config.body_rate),
        failed_auths: preauth::FailedAuths::new(config.auth_failures_per_ip_per_minute),
        hits: tracking::Hits::start(
            rt.js.clone(),
            &rt.common.namespace,
            config.common.upstream_timeout,
        ),
        tracking: tracking::Tokens::from_config(&config, hosts),
        config,
    });
    postmesh_shared::jetstream::Stream::Tracking
        .ensure(&rt.js, &state.ns, rt.common.stream_replicas)
        .await?;
    if state.config.tracking_secret.is_none() {
        tracing::warn!("TRACKING_SECRET is not set: the tracking paths answer 404");
    }
    if state.config.inbound_secret.is_none() {
        tracing::warn!("INBOUND_SECRET is not set: /inbound-email/* answer 503");
    }
    if state.config.provider_secret.is_none() {
        tracing::warn!("PROVIDER_SECRET is not set: /provider-events/esp answers 503");
    }
    if state.config.provider_secret_in_query {
        tracing::warn!(
            "PROVIDER_SECRET_IN_QUERY=1: /provider-events/esp takes ?token=, which access logs keep"
        );
    }
    let http = rt
        .listen(state.config.http_addr, app(state.clone()))
        .await?;
    rt.running(Some(http)).await
}
