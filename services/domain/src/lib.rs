//! Sender domains: submission within the plan's limits, the ownership review (TXT record,
//! periodic sweep, admin decision), inbound MX checks, the SES identity for sending, writing
//! the records at Cloudflare, and the `sendable`, `inbound_domain` and `usage` RPCs.

pub mod apply_dns;
pub mod cloudflare;
pub mod dns;
pub mod domains;
pub mod inbound;
pub mod name;
pub mod outbound;
pub mod ownership;
pub mod records;
pub mod rpc;
pub mod settings;
pub mod tracking;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;

use postmesh_contracts::routes::domain as api;
use postmesh_ses::settings::{AWS_REGION, SES_ENDPOINT};
use postmesh_ses::{SesClient, SesConfig};
use postmesh_shared::config::{DNS_NAMESERVERS, SECRETS_KEY};
use postmesh_shared::{ApiError, Common, Namespace, Routes, Running, Runtime, Service};

use crate::cloudflare::Cloudflare;
use crate::dns::Dns;
use crate::name::DomainName;
use crate::settings::*;
use postmesh_shared::secrets::{SecretBox, DEV_SECRETS_KEY};
use postmesh_shared::tracking_hosts::HostsWriter;

/// This service.
pub const SERVICE: Service = Service::Domain;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// How long one DNS query may take (each lookup tries twice).
const DNS_TIMEOUT: Duration = Duration::from_secs(2);

/// Domain service settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// How often pending ownership is re-checked (`DOMAIN_RECHECK_SECS`, default 300).
    pub recheck: Duration,
    /// Domains every workspace may send from (`PLATFORM_DOMAINS`, default `postmesh.localhost`).
    pub platform_domains: Vec<DomainName>,
    /// Where inbound mail must be routed (`INBOUND_MX_HOST`, default `mx.postmesh.localhost`).
    pub inbound_mx_host: String,
    /// What `track.<domain>` must be a CNAME of (`TRACKING_HOST`).
    pub tracking_host: String,
    /// Name servers to ask (`DNS_NAMESERVERS`, `host:port,...`); empty: the system's.
    pub nameservers: Vec<SocketAddr>,
    /// Amazon SES (`SES_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`).
    pub ses: SesConfig,
    /// Cloudflare's API (`CLOUDFLARE_API_BASE`, default `https://api.cloudflare.com/client/v4`).
    pub cloudflare_api_base: String,
    /// Seals saved DNS tokens (`SECRETS_KEY`: 64 hex digits; required in production).
    pub secrets_key: String,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let common = Common::from_env(SERVICE)?;
        Ok(Self {
            recheck: DOMAIN_RECHECK_SECS.secs()?,
            platform_domains: parse_platform_domains(&PLATFORM_DOMAINS.string())?,
            inbound_mx_host: INBOUND_MX_HOST.string(),
            tracking_host: TRACKING_HOST.string(),
            nameservers: postmesh_shared::dns::parse_nameservers(&DNS_NAMESERVERS.string())?,
            ses: SesConfig::from_env(),
            cloudflare_api_base: CLOUDFLARE_API_BASE.string(),
            secrets_key: common.secret(&SECRETS_KEY)?,
            common,
        })
    }

    /// The environment that [`Config::from_env`] reads back as these settings (SES
    /// credentials left out, as the sender's are).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let join = |names: Vec<String>| names.join(",");
        let mut env = self.common.to_env();
        env.extend([
            (DOMAIN_RECHECK_SECS.name, self.recheck.as_secs().to_string()),
            (
                PLATFORM_DOMAINS.name,
                join(
                    self.platform_domains
                        .iter()
                        .map(|d| d.to_string())
                        .collect(),
                ),
            ),
            (INBOUND_MX_HOST.name, self.inbound_mx_host.clone()),
            (TRACKING_HOST.name, self.tracking_host.clone()),
            (
                DNS_NAMESERVERS.name,
                join(self.nameservers.iter().map(SocketAddr::to_string).collect()),
            ),
            (SES_ENDPOINT.name, self.ses.endpoint.clone()),
            (AWS_REGION.name, self.ses.region.clone()),
            (CLOUDFLARE_API_BASE.name, self.cloudflare_api_base.clone()),
            (SECRETS_KEY.name, self.secrets_key.clone()),
        ]);
        env
    }
}

/// Parses `PLATFORM_DOMAINS`: a comma list of domain names.
pub fn parse_platform_domains(raw: &str) -> anyhow::Result<Vec<DomainName>> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| DomainName::parse(s).map_err(|e| anyhow::anyhow!("PLATFORM_DOMAINS: {e}")))
        .collect()
}

/// Settings the handlers read.
#[derive(Debug)]
pub struct Settings {
    pub platform_domains: Vec<DomainName>,
    pub inbound_mx_host: String,
    /// What `track.<domain>` must be a CNAME of.
    pub tracking_host: String,
    /// The SES region, for the MAIL FROM MX record.
    pub ses_region: String,
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub settings: Arc<Settings>,
    pub dns: Dns,
    /// SES, when credentials are configured.
    pub ses: Option<SesClient>,
    pub cloudflare: Cloudflare,
    pub secrets: SecretBox,
    /// Where billing's `entitlements` is asked; without it, submissions answer 503.
    pub billing: Option<(async_nats::Client, Namespace)>,
    /// Where verified tracking hosts are announced to the gateway; none for the router alone.
    pub hosts: Option<HostsWriter>,
}

impl AppState {
    /// State over `db` alone, for the router: no billing, no SES, no reachable DNS host or
    /// name server.
    pub fn new(db: PgPool) -> anyhow::Result<Self> {
        let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
        Ok(Self {
            db,
            settings: Arc::new(Settings {
                platform_domains: parse_platform_domains("postmesh.localhost")?,
                inbound_mx_host: "mx.postmesh.localhost".into(),
                tracking_host: TRACKING_HOST.default.into(),
                ses_region: "us-east-1".into(),
            }),
            dns: Dns::new(&[nowhere], DNS_TIMEOUT)?,
            ses: None,
            cloudflare: Cloudflare::new(&format!("http://{nowhere}"), DNS_TIMEOUT)?,
            secrets: SecretBox::from_hex(DEV_SECRETS_KEY)?,
            billing: None,
            hosts: None,
        })
    }

    /// SES, or 503 when it is not configured.
    pub fn ses(&self) -> Result<&SesClient, ApiError> {
        self.ses.as_ref().ok_or_else(|| {
            ApiError::Unavailable(
                "the mail provider is not configured (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
                    .into(),
            )
        })
    }
}

/// Every route the service serves, with its handler.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::DOMAINS, domains::list)
        .at(api::DOMAIN_SUBMIT, domains::submit)
        .at(api::DOMAIN, domains::show)
        .at(api::DOMAIN_DELETE, domains::remove)
        .at(api::DOMAIN_VERIFY_OWNERSHIP, ownership::verify)
        .at(api::ADMIN_DOMAINS, ownership::pending)
        .at(api::ADMIN_DOMAIN_APPROVE, ownership::approve)
        .at(api::ADMIN_DOMAIN_REJECT, ownership::reject)
        .at(api::DOMAIN_VERIFY_INBOUND, inbound::verify)
        .at(api::DOMAIN_SETUP_OUTBOUND, outbound::setup)
        .at(api::DOMAIN_VERIFY_OUTBOUND, outbound::verify)
        .at(api::DOMAIN_SETUP_TRACKING, tracking::setup)
        .at(api::DOMAIN_VERIFY_TRACKING, tracking::verify)
        .at(api::DOMAIN_APPLY_DNS, apply_dns::apply)
        .takes_optional::<apply_dns::ApplyRequest>()
        .at(api::DNS_PROVIDER, apply_dns::save_token)
}

/// The domain service's HTTP router.
pub fn router(state: AppState) -> Router {
    routes().into_router(SERVICE.routes(), state)
}

/// Starts the domain service: its routes and RPCs on NATS, and the ownership sweep.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let rt = Runtime::boot(SERVICE, &config.common, &[&MIGRATOR]).await?;
    let ses = SesClient::new(&config.ses, config.common.upstream_timeout)?;
    if ses.is_none() {
        tracing::warn!(
            "AWS credentials are not set: setup-outbound and verify-outbound answer 503"
        );
    }
    let state = AppState {
        db: rt.db.clone(),
        settings: Arc::new(Settings {
            platform_domains: config.platform_domains.clone(),
            inbound_mx_host: config.inbound_mx_host.clone(),
            tracking_host: config.tracking_host.clone(),
            ses_region: config.ses.region.clone(),
        }),
        dns: Dns::new(&config.nameservers, DNS_TIMEOUT)?,
        ses,
        cloudflare: Cloudflare::new(&config.cloudflare_api_base, config.common.upstream_timeout)?,
        secrets: SecretBox::from_hex(&config.secrets_key)?,
        billing: Some((rt.nats.clone(), config.common.namespace.clone())),
        hosts: Some(HostsWriter::new(rt.tracking_hosts.clone())),
    };
    rt.serve(rpc::register(
        rt.host().http(router(state.clone())),
        state.clone(),
    ))
    .await?;
    let recheck = config.recheck.as_secs().max(1) as i64;
    let tracked = state.clone();
    rt.every("ownership sweep", config.recheck, move || {
        let (db, dns) = (state.db.clone(), state.dns.clone());
        async move {
            let taken = ownership::sweep(&db, &dns, recheck).await?;
            Ok::<_, ownership::LookupErrorOrDb>(taken as i64 == ownership::SWEEP_BATCH)
        }
    });
    let target = dns::host_name(&config.tracking_host);
    rt.every("tracking sweep", config.recheck, move || {
        let (state, target) = (tracked.clone(), target.clone());
        async move {
            let taken = tracking::sweep(&state, &target, recheck).await?;
            Ok::<_, sqlx::Error>(taken as i64 == tracking::SWEEP_BATCH)
        }
    });
    rt.running(None).await
}
