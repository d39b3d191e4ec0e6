//! The settings a test stack starts its services with: fast retries, local fakes, the
//! shared secrets and names tests refer to.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;

use inbound_ingest::budget::ByteBudget;
use postmesh_shared::config::{self, env_or};
use postmesh_shared::{Common, Namespace, Service};

use crate::wait::on_a_fresh_runtime;

/// How the sender of a stack runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SenderMode {
    /// Inside the test process.
    InProcess,
    /// As the `sender` binary, a child process the test may kill.
    ChildProcess,
}

/// How a test stack is started.
pub struct Options {
    pub sender: SenderMode,
    /// How long the gateway waits for a service's answer.
    pub upstream_timeout: Duration,
    /// The gateway's per-key request rate.
    pub rate: api_gateway::RateConfig,
    /// Billing's Stripe settings (none: payments off).
    pub stripe: billing::StripeConfig,
    /// The domain service's outside systems.
    pub domain: DomainOptions,
    /// Billing's plan and pack catalog (default: `deploy/catalog.json`).
    pub catalog: Option<PathBuf>,
    /// Jobs the sender works on at once (`SEND_CONCURRENCY`; default 8).
    pub send_concurrency: usize,
    /// The sender's `AUDIENCE_MAX_RECIPIENTS` (default: the service's).
    pub audience_max: usize,
    /// The gateway's `INBOUND_SECRET` (default [`INBOUND_SECRET`]; none: unset).
    pub inbound_secret: Option<String>,
    /// Inbound-ingest's per-workspace byte budget (default: the service's).
    pub inbound_budget: ByteBudget,
    /// The `NATS_URL` of a three-node cluster to run on, with every stream at three
    /// replicas (default: `NATS_URL` and `NATS_STREAM_REPLICAS` as set).
    pub nats_cluster: Option<String>,
}

/// The gateway's and sender's `TRACKING_SECRET` in a test stack.
pub const TRACKING_SECRET: &str = "test-tracking-secret";

/// The sender's `UNSUBSCRIBE_SECRET` in a test stack.
pub const UNSUBSCRIBE_SECRET: &str = "test-unsubscribe-secret";

/// The SNS topic a test stack's sender takes notifications of (`SNS_TOPIC_ARNS`).
pub const FAKE_SNS_TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:postmesh-test";

/// The `PROVIDER_SECRET` of a test stack's gateway.
pub const PROVIDER_SECRET: &str = "test-provider-secret";

/// The `INBOUND_SECRET` of a test stack's gateway.
pub const INBOUND_SECRET: &str = "test-inbound-secret";
/// Seconds between device-login polls in test stacks (5 in production).
pub const DEVICE_POLL_INTERVAL_SECS: u64 = 1;

/// Where a test stack's domain service finds DNS, SES and Cloudflare.
pub struct DomainOptions {
    /// `DNS_NAMESERVERS` (default: a closed local port, so nothing leaves the machine).
    pub nameservers: Vec<SocketAddr>,
    /// SES (default: no credentials, so SES answers 503).
    pub ses: postmesh_ses::SesConfig,
    /// `CLOUDFLARE_API_BASE`.
    pub cloudflare_api_base: String,
    /// `DOMAIN_RECHECK_SECS`.
    pub recheck: Duration,
}

impl Default for DomainOptions {
    fn default() -> Self {
        Self {
            nameservers: vec![SocketAddr::from(([127, 0, 0, 1], 9))],
            ses: postmesh_ses::SesConfig {
                endpoint: "http://127.0.0.1:9".into(),
                region: "us-east-1".into(),
                credentials: None,
            },
            cloudflare_api_base: "http://127.0.0.1:9/client/v4".into(),
            recheck: Duration::from_secs(300),
        }
    }
}

impl Options {
    /// Default options with the gateway's per-key rate set to `per_sec`, bursts of `burst`.
    pub fn with_rate(per_sec: u32, burst: u32) -> Self {
        Self {
            rate: api_gateway::RateConfig { per_sec, burst },
            ..Self::default()
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            sender: SenderMode::InProcess,
            upstream_timeout: Duration::from_secs(10),
            rate: api_gateway::RateConfig {
                per_sec: 1000,
                burst: 1000,
            },
            stripe: billing::StripeConfig {
                api_base: "http://127.0.0.1:9".into(),
                secret_key: None,
                webhook_secret: None,
            },
            domain: DomainOptions::default(),
            catalog: None,
            send_concurrency: 8,
            audience_max: sender::settings::AUDIENCE_MAX_RECIPIENTS.default_of(),
            inbound_secret: Some(INBOUND_SECRET.into()),
            inbound_budget: ByteBudget::default(),
            nats_cluster: None,
        }
    }
}

/// Domain service settings of a test stack.
pub fn domain_config(common: &Common, opts: DomainOptions) -> domain::Config {
    domain::Config {
        common: common.clone(),
        recheck: opts.recheck,
        platform_domains: domain::parse_platform_domains("postmesh.localhost").expect("valid"),
        inbound_mx_host: "mx.postmesh.localhost".into(),
        tracking_host: domain::settings::TRACKING_HOST.default.into(),
        nameservers: opts.nameservers,
        ses: opts.ses,
        cloudflare_api_base: opts.cloudflare_api_base,
        secrets_key: "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0".into(),
    }
}

/// Billing settings of a test stack: the repository's catalog, `stripe` as given.
pub fn billing_config(common: &Common, stripe: billing::StripeConfig) -> billing::Config {
    billing::Config {
        common: common.clone(),
        hold_sweep: Duration::from_millis(500),
        catalog_file: Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/catalog.json"),
        stripe,
        public_base_url: "https://app.postmesh.test".into(),
        usage_timeout: Duration::from_millis(500),
    }
}

/// An HTTP client for tests (TLS set up as the services set it up).
pub fn http_client() -> reqwest::Client {
    postmesh_shared::tls::install_provider();
    reqwest::Client::new()
}

/// A fresh namespace: `t` plus random letters and digits.
pub fn fresh_namespace() -> Namespace {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let tail: String = (0..12)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect();
    Namespace::parse(&format!("t{tail}")).expect("valid namespace")
}

/// The tests' NATS server (`NATS_URL`, default Postmesh's own on port 4223).
pub fn nats_url() -> String {
    config::NATS_URL.string()
}

/// The operator's NATS user of `deploy/nats.conf` (`NATS_OPS_PASSWORD`, default its
/// development password): every subject, for a test that publishes or inspects what no one
/// service may.
pub async fn ops_nats(url: &str) -> Result<async_nats::Client, async_nats::ConnectError> {
    async_nats::ConnectOptions::with_user_and_password(
        "ops".into(),
        env_or("NATS_OPS_PASSWORD", "dev-ops"),
    )
    .connect(postmesh_shared::nats::servers(url).expect("NATS_URL"))
    .await
}

/// The PostgreSQL administrator's connection of the tests (`DATABASE_ADMIN_URL`): it makes
/// and drops each namespace's roles and databases, as `api-gateway bootstrap` does.
pub fn admin_url() -> String {
    api_gateway::settings::DATABASE_ADMIN_URL.string()
}

/// Shared settings of a test stack in namespace `ns`, whose services' roles and databases
/// this makes (dropped again by [`remove_namespace`]).
pub fn common(ns: Namespace) -> Common {
    common_of(ns, &Service::ALL)
}

/// [`common`] with the roles and databases of `services` alone made.
pub fn common_of(ns: Namespace, services: &[Service]) -> Common {
    let made = ns.clone();
    let services = services.to_vec();
    // One service after another: four tests starting stacks at once would otherwise open
    // a burst of administrator connections against PostgreSQL's 100.
    on_a_fresh_runtime(move || async move {
        let admin = admin_url();
        for &service in &services {
            postmesh_shared::db::bootstrap(&admin, &made, service, None)
                .await
                .expect("bootstrap of a test namespace's databases");
        }
    })
    .expect("bootstrap of a test namespace's databases");
    Common {
        namespace: ns,
        nats_url: nats_url(),
        nats_password: None,
        stream_replicas: config::NATS_STREAM_REPLICAS
            .parse()
            .expect("NATS_STREAM_REPLICAS"),
        redis_url: config::REDIS_URL.string(),
        database_url: config::DATABASE_URL.string(),
        database_password: None,
        db_max_connections: 10,
        db_acquire_timeout: Duration::from_secs(5),
        upstream_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(30),
        outbox_poll: Duration::from_millis(200),
        max_deliver: 5,
        admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        otlp_endpoint: std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok(),
        production: false,
    }
}

/// Retry settings that keep tests fast, with `concurrency` jobs at once.
pub(crate) fn worker_config(concurrency: usize) -> sender::WorkerConfig {
    sender::WorkerConfig {
        ack_wait: Duration::from_secs(2),
        max_deliver: 5,
        retry_base: Duration::from_millis(200),
        concurrency,
    }
}

/// The gateway settings of a test stack.
pub fn gateway_config(common: &Common, rate: api_gateway::RateConfig) -> api_gateway::Config {
    api_gateway::Config {
        common: common.clone(),
        http_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        body_limit: GATEWAY_BODY_LIMIT,
        key_cache_ttl: Duration::from_secs(30),
        rate,
        body_rate: api_gateway::BodyRateConfig::default(),
        codes: api_gateway::CodeConfig {
            secret: "test-code-secret".into(),
            ttl_secs: 300,
            max_attempts: 5,
            cooldown_secs: 60,
            hourly_cap: 10,
            from_email: "codes@postmesh.test".into(),
        },
        inbound_secret: Some(INBOUND_SECRET.into()),
        provider_secret: Some(PROVIDER_SECRET.into()),
        provider_secret_in_query: false,
        public_base_url: "http://127.0.0.1".into(),
        login_ip_hourly_limit: 30,
        device_poll_interval_secs: DEVICE_POLL_INTERVAL_SECS,
        api_keys_per_account: 50,
        // The sweeps call every route with wrong keys from one address: off here, and on
        // in the test of the limit itself.
        auth_failures_per_ip_per_minute: 0,
        trust_forwarded_for: false,
        tracking_secret: Some(TRACKING_SECRET.into()),
        tracking_base_url: String::new(),
    }
}

/// The inbound service's settings of a test stack: the default platform inbound domain.
pub fn inbound_config(common: &Common) -> inbound_ingest::Config {
    inbound_ingest::Config {
        common: common.clone(),
        inbound_domain: inbound_ingest::addresses::Domain::parse(INBOUND_DOMAIN).expect("valid"),
        retention_days: 30,
        budget: ByteBudget::default(),
    }
}

/// The webhook dispatcher's settings of a test stack: local receivers allowed.
pub fn dispatcher_config(common: &Common) -> webhook_dispatcher::Config {
    webhook_dispatcher::Config {
        common: common.clone(),
        secrets_key: postmesh_shared::secrets::DEV_SECRETS_KEY.into(),
        allow_insecure: true,
        nameservers: Vec::new(),
        // Retries within a test's patience: 1 s, then 2 s, then the attempt fails.
        delivery: webhook_dispatcher::DeliveryConfig {
            timeout: Duration::from_secs(2),
            retry_schedule: vec![Duration::from_secs(1), Duration::from_secs(2)],
            // A killed dispatcher's leases run out within a test's patience.
            ack_wait: Duration::from_secs(3),
            ..Default::default()
        },
        retention_days: 30,
        replay_max: webhook_dispatcher::settings::WEBHOOK_REPLAY_MAX.default_of(),
    }
}

/// The gateway's body limit of a test stack, for routes without one of their own.
pub const GATEWAY_BODY_LIMIT: usize = 64 * 1024;

/// The platform inbound domain of a test stack.
pub const INBOUND_DOMAIN: &str = "inbound.postmesh.localhost";
