//! Test harness, one layer at a time: a service's database alone ([`ServiceDb`], for its
//! router and queries), or a whole Postmesh stack — the real gateway, billing and sender,
//! started in this process against the real PostgreSQL, Redis and NATS, isolated under a
//! fresh namespace ([`Stack`]). The sender can instead run as its own OS process, so a test
//! can kill it. [`TestClient`] is the one typed client for both.

pub mod attempts;
pub mod client;
pub mod fake_cloudflare;
pub mod fake_dns;
pub mod fake_ses;
pub mod fake_smtp;
pub mod fake_sns;
pub mod fake_stripe;
pub mod hostile;
pub mod mta;
pub mod openapi_bodies;
pub mod peek;
pub mod receiver;
pub mod web;
pub mod webdriver;

pub use client::{Answer, TestClient};
pub use fake_stripe::FakeStripe;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::{Method, StatusCode};

use api_gateway::create_key::CreateKey;
use inbound_ingest::budget::ByteBudget;
use postmesh_shared::config::env_or;
use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::Role;
use postmesh_shared::{Common, Namespace, Rpc, Running, Service};
use sender::TransportKind;

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
}

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
            audience_max: sender::DEFAULT_AUDIENCE_MAX,
            inbound_secret: Some(INBOUND_SECRET.into()),
            inbound_budget: ByteBudget::default(),
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
        nameservers: opts.nameservers,
        ses: opts.ses,
        cloudflare_api_base: opts.cloudflare_api_base,
        secrets_key: "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0".into(),
    }
}

/// Polls `probe` every 50 ms until it answers `Ok`, and fails the test with the last `Err`
/// (what it saw instead) once `within` has passed.
pub async fn eventually<T, E: std::fmt::Debug, F: Future<Output = Result<T, E>>>(
    within: Duration, mut probe: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match probe().await {
            Ok(done) => return done,
            Err(seen) => assert!(Instant::now() < deadline, "not within {within:?}: {seen:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fake of an outside system: where it listens and its books. Cloning shares the books.
pub struct Fake<B> {
    /// `http://127.0.0.1:<port>` and the API's root path: what a client is pointed at.
    pub base: String,
    books: Arc<Mutex<B>>,
}

impl<B> Clone for Fake<B> {
    fn clone(&self) -> Self {
        Self {
            base: self.base.clone(),
            books: self.books.clone(),
        }
    }
}

impl<B: Default + Send + 'static> Fake<B> {
    /// Serves the router `app` builds (given the fake, for its state) on a free local port;
    /// `root` is the API's path under the port (empty for the host's root).
    async fn serve(root: &str, app: impl FnOnce(Self) -> axum::Router) -> Self {
        let fake = Self {
            base: String::new(),
            books: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("a local port");
        let addr = listener.local_addr().expect("address");
        let app = app(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serves") });
        Self {
            base: format!("http://{addr}{root}"),
            ..fake
        }
    }

    /// The books, locked.
    fn books(&self) -> MutexGuard<'_, B> {
        self.books.lock().expect("books")
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

/// A running test stack. Call [`Stack::shutdown`] at the end to drop its databases.
pub struct Stack {
    pub common: Common,
    /// `http://127.0.0.1:<port>` of the gateway.
    pub base: String,
    pub http: reqwest::Client,
    outbox: tempfile::TempDir,
    gateway: Option<Running>,
    billing: Option<Running>,
    /// Billing's settings, for a restart.
    billing_config: billing::Config,
    domain: Option<Running>,
    inbound: Option<Running>,
    /// Inbound-ingest's byte budget at its next start.
    pub inbound_budget: ByteBudget,
    dispatcher: Option<Running>,
    dispatcher_child: Option<tokio::process::Child>,
    sender: Option<Running>,
    sender_child: Option<tokio::process::Child>,
    mode: SenderMode,
    /// The sender's `SEND_CONCURRENCY`.
    send_concurrency: usize,
    /// The sender's `AUDIENCE_MAX_RECIPIENTS`.
    audience_max: usize,
    /// `SEND_TRANSPORT` and `SMTP_URL` of the next sender start.
    transport: (TransportKind, String),
    /// SES of the next sender start (the `ses` transport).
    ses: postmesh_ses::SesConfig,
    /// Set once `shutdown` removed the stack's data.
    cleaned: bool,
    /// Settings of the verification-code flow, as the gateway was started with.
    pub codes: api_gateway::CodeConfig,
    /// The gateway's settings, for another one (the bench's, as its own process).
    gateway_config: api_gateway::Config,
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
    env_or("NATS_URL", "nats://127.0.0.1:4223")
}

/// The operator's NATS user of `deploy/nats.conf` (`NATS_OPS_PASSWORD`, default its
/// development password): every subject, for a test that publishes or inspects what no one
/// service may.
pub async fn ops_nats(url: &str) -> Result<async_nats::Client, async_nats::ConnectError> {
    async_nats::ConnectOptions::with_user_and_password(
        "ops".into(),
        env_or("NATS_OPS_PASSWORD", "dev-ops"),
    )
    .connect(url)
    .await
}

/// The PostgreSQL administrator's connection of the tests (`DATABASE_ADMIN_URL`): it makes
/// and drops each namespace's roles and databases, as `api-gateway bootstrap` does.
pub fn admin_url() -> String {
    env_or(
        "DATABASE_ADMIN_URL",
        api_gateway::bootstrap::DEFAULT_ADMIN_URL,
    )
}

/// Shared settings of a test stack in namespace `ns`, whose services' roles and databases
/// this makes (dropped again by [`remove_namespace`]).
pub fn common(ns: Namespace) -> Common {
    let made = ns.clone();
    on_a_fresh_runtime(move || async move {
        let admin = admin_url();
        let each = Service::ALL
            .map(|service| postmesh_shared::db::bootstrap(&admin, &made, service, None));
        for made in futures::future::join_all(each).await {
            made.expect("bootstrap of a test namespace's databases");
        }
    })
    .expect("bootstrap of a test namespace's databases");
    Common {
        namespace: ns,
        nats_url: nats_url(),
        nats_password: None,
        redis_url: env_or("REDIS_URL", "redis://127.0.0.1:6379"),
        database_url: env_or("DATABASE_URL", "postgres://127.0.0.1:5432"),
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
fn worker_config(concurrency: usize) -> sender::WorkerConfig {
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
        replay_max: webhook_dispatcher::DEFAULT_REPLAY_MAX,
    }
}

/// The gateway's body limit of a test stack, for routes without one of their own.
pub const GATEWAY_BODY_LIMIT: usize = 64 * 1024;

/// The platform inbound domain of a test stack.
pub const INBOUND_DOMAIN: &str = "inbound.postmesh.localhost";

/// One service's database in a fresh namespace, migrated, and nothing else running: for
/// testing a service's router (`oneshot`) and queries with only Postgres. Dropped with it.
pub struct ServiceDb {
    pub common: Common,
    pub pool: sqlx::PgPool,
}

impl ServiceDb {
    /// Creates `service`'s database in a fresh namespace and runs `migrations`.
    pub async fn create(service: Service, migrations: &[&sqlx::migrate::Migrator]) -> Self {
        let common = common(fresh_namespace());
        let pool = postmesh_shared::db::connect(&common, service, migrations)
            .await
            .expect("service database");
        Self { common, pool }
    }
}

impl Drop for ServiceDb {
    fn drop(&mut self) {
        // No `pool.close()` here: its connections belong to the test's runtime, which is
        // blocked in this drop, so closing them could wait forever. `DROP DATABASE ... WITH
        // (FORCE)` ends them from the server side instead.
        let ns = self.common.namespace.clone();
        on_a_fresh_runtime(move || async move { drop_databases(&ns).await });
    }
}

/// Drops the roles and databases of every service in `ns`.
async fn drop_databases(ns: &Namespace) {
    let admin = admin_url();
    for service in Service::ALL {
        let _ = postmesh_shared::db::drop_database(&admin, &service.database(ns)).await;
    }
}

/// The context the gateway attaches for a fresh account with `role` (its workspace is its
/// account, as the gateway makes them), for calling a service's router directly.
pub fn caller(role: Role) -> postmesh_shared::proto::AuthContext {
    let account = uuid::Uuid::now_v7().to_string();
    let key = uuid::Uuid::now_v7().to_string();
    postmesh_shared::proto::AuthContext {
        workspace_id: account.clone(),
        account_id: account,
        api_key_id: key.clone(),
        key_id: key,
        role: role.into(),
        email: "owner@example.com".into(),
    }
}

/// Runs `work` to completion on a runtime of its own (for cleanup in `Drop`, or setup in a
/// plain function); none if it panicked.
fn on_a_fresh_runtime<T: Send + 'static, F: Future<Output = T>>(
    work: impl FnOnce() -> F + Send + 'static,
) -> Option<T> {
    let cleanup = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
            .map(|rt| rt.block_on(work()))
    });
    cleanup.join().ok().flatten()
}

impl Stack {
    /// Starts gateway, billing and an in-process sender.
    pub async fn start() -> Self {
        Self::start_with(SenderMode::InProcess).await
    }

    /// Starts gateway, billing and a sender run as `mode` says.
    pub async fn start_with(mode: SenderMode) -> Self {
        Self::start_opts(Options {
            sender: mode,
            ..Options::default()
        })
        .await
    }

    /// Starts gateway, billing and a sender as `opts` say.
    pub async fn start_opts(opts: Options) -> Self {
        let common = Common {
            upstream_timeout: opts.upstream_timeout,
            ..common(fresh_namespace())
        };
        let mut billing_config = billing_config(&common, opts.stripe);
        if let Some(catalog) = opts.catalog {
            billing_config.catalog_file = catalog;
        }
        let billing = billing::start(billing_config.clone())
            .await
            .expect("billing starts");
        let domain = domain::start(domain_config(&common, opts.domain))
            .await
            .expect("domain service starts");
        let inbound = inbound_ingest::start(inbound_ingest::Config {
            budget: opts.inbound_budget,
            ..inbound_config(&common)
        })
        .await
        .expect("inbound service starts");
        let dispatcher = webhook_dispatcher::start(dispatcher_config(&common))
            .await
            .expect("webhook dispatcher starts");
        // Its address is chosen first, so device verification links point at it; another
        // test may take a free port before the gateway binds it, so a failed start tries a
        // new one.
        let mut tries = 0;
        let (gateway, gateway_settings) = loop {
            let addr = free_port();
            let gateway_config = api_gateway::Config {
                inbound_secret: opts.inbound_secret.clone(),
                http_addr: addr,
                public_base_url: format!("http://{addr}"),
                ..gateway_config(&common, opts.rate)
            };
            let settings = gateway_config.clone();
            match api_gateway::start(gateway_config).await {
                Ok(gateway) => break (gateway, settings),
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("gateway start failed ({e:#}); another port");
                }
                Err(e) => panic!("gateway starts: {e:#}"),
            }
        };
        let base = format!("http://{}", gateway.http_addr.expect("gateway listens"));
        let mut stack = Self {
            common,
            base,
            http: http_client(),
            outbox: tempfile::tempdir().expect("temp dir"),
            gateway: Some(gateway),
            billing: Some(billing),
            billing_config,
            domain: Some(domain),
            inbound: Some(inbound),
            inbound_budget: opts.inbound_budget,
            dispatcher: Some(dispatcher),
            dispatcher_child: None,
            sender: None,
            sender_child: None,
            mode: opts.sender,
            send_concurrency: opts.send_concurrency,
            audience_max: opts.audience_max,
            transport: (TransportKind::File, String::new()),
            ses: DomainOptions::default().ses,
            cleaned: false,
            codes: gateway_settings.codes.clone(),
            gateway_config: gateway_settings,
        };
        stack.start_sender().await;
        stack
    }

    /// A stack over services started elsewhere (child processes) in `common`'s namespace,
    /// whose gateway is at `base`: its helpers and cleanup, no services of its own.
    pub fn attach(common: Common, base: String) -> Self {
        let opts = Options::default();
        Self {
            billing_config: billing_config(&common, opts.stripe),
            codes: gateway_config(&common, opts.rate).codes,
            gateway_config: gateway_config(&common, opts.rate),
            common,
            base,
            http: http_client(),
            outbox: tempfile::tempdir().expect("temp dir"),
            gateway: None,
            billing: None,
            domain: None,
            inbound: None,
            inbound_budget: opts.inbound_budget,
            dispatcher: None,
            dispatcher_child: None,
            sender: None,
            sender_child: None,
            mode: SenderMode::ChildProcess,
            send_concurrency: opts.send_concurrency,
            audience_max: opts.audience_max,
            transport: (TransportKind::File, String::new()),
            ses: DomainOptions::default().ses,
            cleaned: false,
        }
    }

    /// The namespace of this stack.
    pub fn ns(&self) -> &Namespace {
        &self.common.namespace
    }

    /// Admin servers (`/healthz`, `/readyz`, `/metrics`) of the in-process services.
    pub fn admin_addrs(&self) -> Vec<SocketAddr> {
        [
            &self.gateway,
            &self.billing,
            &self.domain,
            &self.inbound,
            &self.dispatcher,
            &self.sender,
        ]
        .into_iter()
        .flatten()
        .map(|r| r.admin_addr)
        .collect()
    }

    /// Where the sender writes delivered messages.
    pub fn outbox(&self) -> &Path {
        self.outbox.path()
    }

    /// Makes the next sender start write `.eml` files (the default).
    pub fn use_file(&mut self) {
        self.transport = (TransportKind::File, String::new());
    }

    /// Restarts the sender delivering to the SMTP relay at `smtp_url`.
    pub async fn deliver_by_smtp(&mut self, smtp_url: &str) {
        self.kill_sender().await;
        self.transport = (TransportKind::Smtp, smtp_url.to_owned());
        self.start_sender().await;
    }

    /// Makes the next sender start deliver through SES at `ses`.
    pub fn use_ses(&mut self, ses: postmesh_ses::SesConfig) {
        self.transport = (TransportKind::Ses, String::new());
        self.ses = ses;
    }

    /// The sender's database, to observe delivery records.
    pub async fn sender_db(&self) -> sqlx::PgPool {
        self.service_db(sender::SERVICE).await
    }

    /// A service's database in this stack, as the administrator (to observe, or to break).
    pub async fn service_db(&self, service: Service) -> sqlx::PgPool {
        let url = format!("{}/{}", admin_url(), service.database(self.ns()));
        sqlx::PgPool::connect(&url).await.expect("service database")
    }

    /// A connection to the stack's Redis.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.common.redis_url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis connection")
    }

    /// The stack's Redis keys matching `pattern` under its namespace (`*` for all).
    pub async fn redis_keys(&self, pattern: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(self.ns().redis_key(pattern))
            .query_async(&mut self.redis().await)
            .await
            .expect("KEYS")
    }

    /// Calls a service's typed RPC, as another service would.
    pub async fn rpc<R: Rpc>(&self, req: &R) -> Result<R::Reply, postmesh_shared::ApiError> {
        use postmesh_shared::nats;
        let client = nats::connect(&self.common, Service::ApiGateway, Duration::from_secs(5))
            .await
            .expect("nats");
        nats::call(&client, self.ns(), req).await
    }

    /// A typed client of the gateway, calling with `key`.
    pub fn client(&self, key: &str) -> TestClient {
        TestClient::http(&self.base, Some(key))
    }

    /// The sender settings of this stack.
    pub fn sender_config(&self) -> sender::Config {
        sender::Config {
            common: self.common.clone(),
            transport: self.transport.0,
            outbox_dir: self.outbox.path().to_owned(),
            smtp_url: self.transport.1.clone(),
            ses: self.ses.clone(),
            message_id_domain: "postmesh.test".into(),
            default_from: "hello@postmesh.localhost".into(),
            schedule_poll: Duration::from_millis(200),
            audience_max: self.audience_max,
            unsubscribe_secret: Some(UNSUBSCRIBE_SECRET.into()),
            unsubscribe_token_days: 60,
            public_base_url: self.base.clone(),
            // Test SNS servers are local (`postmesh_tests::fake_sns`).
            sns_url_pattern: r"^http://127\.0\.0\.1:\d+/".into(),
            sns_topic_arns: vec![FAKE_SNS_TOPIC.into()],
            quotas: sender::Quotas::default(),
            worker: worker_config(self.send_concurrency),
        }
    }

    /// The id of an API key, as stored by the gateway.
    pub async fn key_id(&self, key: &str) -> uuid::Uuid {
        let prefix = key.split('_').nth(1).expect("key prefix");
        sqlx::query_scalar("SELECT id FROM api_keys WHERE prefix = $1")
            .bind(prefix)
            .fetch_one(&self.service_db(api_gateway::SERVICE).await)
            .await
            .expect("key row")
    }

    /// Stops billing (gracefully): its RPCs and routes get no answer until it starts again.
    pub async fn stop_billing(&mut self) {
        if let Some(running) = self.billing.take() {
            running.stop().await;
        }
    }

    /// Stops the domain service (gracefully): its RPCs and routes get no answer.
    pub async fn stop_domain(&mut self) {
        if let Some(running) = self.domain.take() {
            running.stop().await;
        }
    }

    /// Billing and a second gateway as child processes with this stack's settings (the
    /// bench's `/balance`, measuring each process): billing's process, the gateway's, and
    /// the gateway's base URL. Stop the in-process billing first, or it shares the requests.
    pub async fn spawn_gateway_and_billing(
        &mut self,
    ) -> (tokio::process::Child, tokio::process::Child, String) {
        let mut billing = self.billing_config.clone();
        billing.common.admin_addr = free_port();
        let billing_child = spawn_service(billing::SERVICE, billing.to_env());
        self.wait_ready(billing.common.admin_addr).await;
        let mut gateway = self.gateway_config.clone();
        gateway.common.admin_addr = free_port();
        gateway.http_addr = free_port();
        let gateway_child = spawn_service(api_gateway::SERVICE, gateway.to_env());
        self.wait_ready(gateway.common.admin_addr).await;
        (
            billing_child,
            gateway_child,
            format!("http://{}", gateway.http_addr),
        )
    }

    /// The sender and inbound-ingest as child processes with this stack's settings, in
    /// place of the in-process ones (the bench's hostile load: the services its corpus
    /// reaches share no runtime with the clients that measure). Returns their processes;
    /// [`Stack::start_sender_and_inbound`] brings the in-process ones back.
    pub async fn spawn_sender_and_inbound(
        &mut self,
    ) -> (tokio::process::Child, tokio::process::Child) {
        self.kill_sender().await;
        if let Some(running) = self.inbound.take() {
            running.stop().await;
        }
        let mut sender = self.sender_config();
        sender.common.admin_addr = free_port();
        let sender_child = spawn_service(sender::SERVICE, sender.to_env());
        self.wait_ready(sender.common.admin_addr).await;
        let mut inbound = self.inbound_config();
        inbound.common.admin_addr = free_port();
        let inbound_child = spawn_service(inbound_ingest::SERVICE, inbound.to_env());
        self.wait_ready(inbound.common.admin_addr).await;
        (sender_child, inbound_child)
    }

    /// Inbound-ingest's settings in this stack.
    fn inbound_config(&self) -> inbound_ingest::Config {
        inbound_ingest::Config {
            budget: self.inbound_budget,
            ..inbound_config(&self.common)
        }
    }

    /// Starts the sender and inbound-ingest in process again.
    pub async fn start_sender_and_inbound(&mut self) {
        self.start_sender().await;
        let running = inbound_ingest::start(self.inbound_config())
            .await
            .expect("inbound service starts");
        self.inbound = Some(running);
    }

    /// Starts billing again with the settings it had.
    pub async fn start_billing(&mut self) {
        let running = billing::start(self.billing_config.clone())
            .await
            .expect("billing starts");
        self.billing = Some(running);
    }

    /// Starts the sender (again).
    pub async fn start_sender(&mut self) {
        let mut config = self.sender_config();
        match self.mode {
            SenderMode::InProcess => {
                let running = sender::start(config).await.expect("sender starts");
                self.sender = Some(running);
            }
            SenderMode::ChildProcess => {
                // The same settings as in process, through the environment.
                let admin = free_port();
                config.common.admin_addr = admin;
                let child = spawn_service(sender::SERVICE, config.to_env());
                self.sender_child = Some(child);
                self.wait_ready(admin).await;
            }
        }
    }

    /// Waits until the admin server at `addr` reports ready.
    pub async fn wait_ready(&self, addr: SocketAddr) {
        eventually(Duration::from_secs(30), || async move {
            let ready = self.http.get(format!("http://{addr}/readyz")).send().await;
            match ready.map(|r| r.status()) {
                Ok(status) if status.is_success() => Ok(()),
                other => Err(format!("service at {addr} not ready: {other:?}")),
            }
        })
        .await
    }

    /// The webhook dispatcher's settings in this stack.
    pub fn dispatcher_config(&self) -> webhook_dispatcher::Config {
        dispatcher_config(&self.common)
    }

    /// Stops the webhook dispatcher: gracefully in process, with SIGKILL as a child process.
    pub async fn kill_dispatcher(&mut self) {
        if let Some(running) = self.dispatcher.take() {
            running.stop().await;
        }
        if let Some(mut child) = self.dispatcher_child.take() {
            child.kill().await.expect("dispatcher killed");
        }
    }

    /// Restarts the webhook dispatcher in process with `config`.
    pub async fn restart_dispatcher(&mut self, config: webhook_dispatcher::Config) {
        self.kill_dispatcher().await;
        let running = webhook_dispatcher::start(config)
            .await
            .expect("webhook dispatcher starts");
        self.dispatcher = Some(running);
    }

    /// Restarts the webhook dispatcher as a child process with `config` (to be killed).
    pub async fn spawn_dispatcher(&mut self, mut config: webhook_dispatcher::Config) {
        self.kill_dispatcher().await;
        let admin = free_port();
        config.common.admin_addr = admin;
        let child = spawn_service(webhook_dispatcher::SERVICE, config.to_env());
        self.dispatcher_child = Some(child);
        self.wait_ready(admin).await;
    }

    /// The webhook dispatcher's process id, when it runs as a child process.
    pub fn dispatcher_pid(&self) -> Option<u32> {
        self.dispatcher_child
            .as_ref()
            .and_then(tokio::process::Child::id)
    }

    /// Stops the sender: gracefully in process, with SIGKILL as a child process.
    pub async fn kill_sender(&mut self) {
        if let Some(running) = self.sender.take() {
            running.stop().await;
        }
        if let Some(mut child) = self.sender_child.take() {
            child.kill().await.expect("sender killed");
        }
    }

    /// The workspace of `key`.
    pub async fn workspace_of(&self, key: &str) -> uuid::Uuid {
        let db = self.service_db(api_gateway::SERVICE).await;
        peek::gateway::workspace_of(&db, self.key_id(key).await).await
    }

    /// The email address of the account that owns `key`.
    pub async fn account_email(&self, key: &str) -> String {
        sqlx::query_scalar(
            "SELECT a.email FROM accounts a JOIN api_keys k ON k.account_id = a.id WHERE k.id = $1",
        )
        .bind(self.key_id(key).await)
        .fetch_one(&self.service_db(api_gateway::SERVICE).await)
        .await
        .expect("account row")
    }

    /// Creates an account with a fresh address and a key holding `credits`.
    pub async fn key(&self, credits: i64) -> String {
        self.key_with_role(credits, Role::Member).await
    }

    /// Creates an account with a fresh address and an admin key.
    pub async fn admin_key(&self) -> String {
        self.key_with_role(0, Role::Admin).await
    }

    async fn key_with_role(&self, credits: i64, role: Role) -> String {
        let email = format!("dev-{}@example.com", uuid::Uuid::new_v4().simple());
        let email = postmesh_shared::EmailAddress::parse(&email).expect("address");
        CreateKey {
            email,
            credits,
            role,
        }
        .create(&self.common)
        .await
        .expect("key created")
    }

    /// A client of the gateway without a key.
    pub fn anonymous(&self) -> TestClient {
        TestClient::http(&self.base, None)
    }

    /// `POST /send-code` with `key`; the whole answer.
    pub async fn send_code(&self, key: &str, email: impl serde::Serialize) -> Answer {
        self.client(key)
            .request(
                Method::POST,
                "/send-code",
                &serde_json::json!({ "email": email }),
            )
            .await
    }

    /// `POST /send-code` with `key`, which must succeed.
    pub async fn send_code_ok(&self, key: &str, email: &str) {
        let sent: postmesh_shared::Success<postmesh_shared::response::Message> = self
            .send_code(key, email)
            .await
            .expect(StatusCode::OK, &format!("send-code to {email}"));
        assert!(sent.success);
    }

    /// `POST /verify-code` with `key`, which must succeed.
    pub async fn verify_ok(&self, key: &str, email: &str, code: &str) {
        let checked: postmesh_shared::Success<postmesh_shared::response::Message> = self
            .verify(key, email, code)
            .await
            .expect(StatusCode::OK, &format!("verify-code for {email}"));
        assert!(checked.success);
    }

    /// The first page of the key's consumption log, newest first.
    pub async fn logs(&self, key: &str) -> Vec<billing::logs::LogEntry> {
        let page: postmesh_shared::Success<billing::logs::LogPage> =
            self.client(key).get("/logs", StatusCode::OK).await;
        page.body.logs
    }

    /// `POST /verify-code` with `key`; the whole answer.
    pub async fn verify(
        &self, key: &str, email: impl serde::Serialize, code: impl serde::Serialize,
    ) -> Answer {
        let body = serde_json::json!({ "email": email, "code": code });
        self.client(key)
            .request(Method::POST, "/verify-code", &body)
            .await
    }

    /// The key's balance, read through the API.
    pub async fn balance(&self, key: &str) -> i64 {
        self.client(key)
            .get::<postmesh_shared::Success<billing::balance::Balance>>("/balance", StatusCode::OK)
            .await
            .body
            .balance
    }

    /// The balance of `key`, or what the gateway answered instead (a 503 while billing
    /// comes back): for probes that wait on a service being restarted.
    pub async fn try_balance(&self, key: &str) -> Result<i64, String> {
        let answer = self
            .client(key)
            .send(reqwest::Method::GET, "/balance", None)
            .await;
        if answer.status != StatusCode::OK {
            return Err(format!(
                "{}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ));
        }
        let body: postmesh_shared::Success<billing::balance::Balance> =
            serde_json::from_slice(&answer.body).map_err(|e| e.to_string())?;
        Ok(body.body.balance)
    }

    /// Delivered messages addressed to `to` (compared without regard to case), oldest
    /// first.
    pub fn messages_to(&self, to: &str) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(self.outbox())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "eml") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let to = to.to_lowercase();
                let addressed = |l: &str| l.starts_with("To:") && l.to_lowercase().contains(&to);
                if text.lines().any(addressed) {
                    let written = entry.metadata().and_then(|m| m.modified()).ok();
                    found.push((written, text));
                }
            }
        }
        found.sort_by_key(|(written, _)| *written);
        found.into_iter().map(|(_, text)| text).collect()
    }

    /// Waits until `count` messages to `to` were delivered; returns them. Fails the test
    /// when fewer arrive within `timeout`.
    pub async fn wait_for_messages(
        &self, to: &str, count: usize, timeout: Duration,
    ) -> Vec<String> {
        eventually(timeout, || async move {
            let found = self.messages_to(to);
            if found.len() >= count {
                Ok(found)
            } else {
                Err(format!("{} of {count} emails to {to}", found.len()))
            }
        })
        .await
    }

    /// Fails the test if any message to `to` is delivered within `quiet`.
    pub async fn assert_no_messages(&self, to: &str, quiet: Duration) {
        let deadline = Instant::now() + quiet;
        while Instant::now() < deadline {
            let found = self.messages_to(to);
            assert!(found.is_empty(), "delivered to {to}: {found:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The code in the latest of `count` delivered code emails to `to`.
    pub async fn code_sent_to(&self, to: &str, count: usize) -> String {
        let messages = self
            .wait_for_messages(to, count, Duration::from_secs(15))
            .await;
        let codes: Vec<String> = messages.iter().filter_map(|m| extract_code(m)).collect();
        assert_eq!(
            codes.len(),
            messages.len(),
            "every code email carries a code"
        );
        codes.last().cloned().expect("a code")
    }

    /// Stops every service and drops the stack's databases, stream and Redis keys.
    pub async fn shutdown(mut self) {
        self.kill_sender().await;
        self.kill_dispatcher().await;
        for running in [
            self.gateway.take(),
            self.billing.take(),
            self.domain.take(),
            self.inbound.take(),
            self.dispatcher.take(),
        ]
        .into_iter()
        .flatten()
        {
            running.stop().await;
        }
        self.cleaned = true;
        remove_namespace(&self.common).await;
    }
}

impl Drop for Stack {
    /// A test that panicked never reached `shutdown`: remove its data anyway.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let common = self.common.clone();
        on_a_fresh_runtime(move || async move { remove_namespace(&common).await });
    }
}

/// Drops a namespace's databases, streams, object-store bucket and Redis keys.
pub async fn remove_namespace(common: &Common) {
    let ns = &common.namespace;
    drop_databases(ns).await;
    if let Ok(client) = crate::ops_nats(&common.nats_url).await {
        let js = async_nats::jetstream::new(client);
        for stream in Stream::ALL {
            let _ = js.delete_stream(stream.name(ns)).await;
        }
        let _ = js
            .delete_object_store(postmesh_shared::nats::bodies_bucket(ns))
            .await;
    }
    if let Ok(client) = redis::Client::open(common.redis_url.as_str()) {
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(ns.redis_key("*"))
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
            }
        }
    }
}

/// Starts `service`'s binary as a child process with only `env` (and `RUST_LOG=warn` unless
/// `env` sets it; killed when dropped).
pub fn spawn_service(service: Service, env: Vec<(&'static str, String)>) -> tokio::process::Child {
    spawn_service_to(service, env, Stdio::null())
}

/// [`spawn_service`] with the service's log lines (its stdout) going to `log`.
pub fn spawn_service_to(
    service: Service, env: Vec<(&'static str, String)>, log: impl Into<Stdio>,
) -> tokio::process::Child {
    tokio::process::Command::new(workspace_binary(service.name()))
        .env_clear()
        .env("RUST_LOG", "warn")
        .envs(env)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stdout(log)
        .kill_on_drop(true)
        .spawn()
        .expect("service binary runs (build the workspace first)")
}

/// A local port that was free a moment ago.
pub fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// The 6-digit code in a delivered code email (verification or login).
pub fn extract_code(eml: &str) -> Option<String> {
    let at = eml.find(" code is ")? + " code is ".len();
    let code: String = eml[at..].chars().take(6).collect();
    (code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit())).then_some(code)
}

/// A binary built by this workspace in the profile of the running executable: a test
/// (`target/<profile>/deps/<test>`) or a binary such as the bench (`target/<profile>/bench`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let mut dir = exe.parent().expect("target dir");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("profile dir");
    }
    dir.join(name)
}
