//! Inbound mail: inbox addresses within the plan's mailbox limit, the upstream MTA's
//! validate (RCPT TO) and ingest (DATA) calls, messages stored once per inbox and grouped
//! into threads, each new copy published on the INBOUND stream through the outbox, and the
//! `address` and `usage` (mailboxes) RPCs.

pub mod addresses;
pub mod budget;
pub mod ingest;
pub mod mime;
pub mod rpc;
pub mod settings;
pub mod threads;

use std::time::Duration;

use axum::Router;
use sqlx::PgPool;

use postmesh_contracts::routes::inbound as api;
use postmesh_shared::jetstream::outbox::Outbox;
use postmesh_shared::{db, Common, Namespace, Routes, Running, Runtime, Service};

use crate::addresses::Domain;
use crate::budget::ByteBudget;
use crate::settings::{INBOUND_DOMAIN, INBOUND_RETENTION_DAYS};

/// This service.
pub const SERVICE: Service = Service::InboundIngest;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Its migrations and the kit's (the outbox of INBOUND messages).
pub const MIGRATIONS: [&sqlx::migrate::Migrator; 2] = [&MIGRATOR, &db::KIT_MIGRATIONS];

/// How often deleted addresses past their retention are purged.
const RETENTION_SWEEP: Duration = Duration::from_secs(3600);

/// Inbound settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// The platform's inbound domain: any workspace may take a local part of it
    /// (`INBOUND_DOMAIN`, default `inbound.postmesh.localhost`).
    pub inbound_domain: Domain,
    /// How long a deleted address's messages are kept (`INBOUND_RETENTION_DAYS`, default 30).
    pub retention_days: u32,
    /// Each workspace's inbound byte budget (`INBOUND_WORKSPACE_BYTES_PER_SEC`,
    /// `INBOUND_WORKSPACE_BURST_BYTES`).
    pub budget: ByteBudget,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let raw = INBOUND_DOMAIN.string();
        Ok(Self {
            common: Common::from_env(SERVICE)?,
            inbound_domain: Domain::parse(&raw)
                .ok_or_else(|| anyhow::anyhow!("INBOUND_DOMAIN {raw:?} is not a domain name"))?,
            retention_days: INBOUND_RETENTION_DAYS.parse()?,
            budget: ByteBudget::from_env()?,
        })
    }

    /// The settings as environment variables (to run the service as a child process).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.common.to_env();
        env.push((INBOUND_DOMAIN.name, self.inbound_domain.to_string()));
        env.push((INBOUND_RETENTION_DAYS.name, self.retention_days.to_string()));
        env.extend(self.budget.to_env());
        env
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub ns: Namespace,
    pub inbound_domain: Domain,
    /// Each workspace's inbound byte budget.
    pub budget: ByteBudget,
    /// Where stored copies are announced; without it (router tests) nothing is published
    /// at once and the relay of a running service picks the rows up.
    pub outbox: Option<Outbox>,
    /// Where billing (`entitlements`) and the domain service (`inbound_domain`) are asked;
    /// without it, creating an address answers 503.
    pub nats: Option<async_nats::Client>,
}

impl AppState {
    /// State over `db` alone, for the router: the default inbound domain and budget, no NATS.
    pub fn new(db: PgPool, ns: Namespace) -> Self {
        Self {
            db,
            ns,
            inbound_domain: Domain::parse("inbound.postmesh.localhost").expect("a domain"),
            budget: ByteBudget::default(),
            outbox: None,
            nats: None,
        }
    }
}

/// Every route the service serves, with its handler.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::ADDRESSES, addresses::list)
        .at(api::ADDRESS_CREATE, addresses::create)
        .at(api::ADDRESS_DELETE, addresses::remove)
        .at(api::VALIDATE, ingest::validate)
        .at(api::INGEST, ingest::ingest)
        .takes::<ingest::IngestBody<'static>>()
        .at(api::THREADS, threads::list)
        .at(api::THREAD, threads::show)
        .at(api::THREAD_READ, threads::read)
        .at(api::MESSAGE_RAW, threads::raw)
}

/// The inbound service's HTTP router.
pub fn router(state: AppState) -> Router {
    routes().into_router(SERVICE.routes(), state)
}

/// Starts the service: its routes and the `usage` RPC on NATS, the outbox relay and the
/// retention sweep.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let rt = Runtime::boot(SERVICE, &config.common, &MIGRATIONS).await?;
    let state = AppState {
        db: rt.db.clone(),
        ns: config.common.namespace.clone(),
        inbound_domain: config.inbound_domain.clone(),
        budget: config.budget,
        outbox: Some(rt.outbox()),
        nats: Some(rt.nats.clone()),
    };
    rt.serve(rpc::register(rt.host().http(router(state.clone())), state))
        .await?;
    let (db, days) = (rt.db.clone(), config.retention_days);
    rt.every("retention sweep", RETENTION_SWEEP, move || {
        let db = db.clone();
        async move { addresses::purge_expired(&db, days).await }
    });
    rt.running(None).await
}
