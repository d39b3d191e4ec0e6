//! A whole Postmesh stack in a fresh namespace: started, reached and shut down.

mod accounts;
mod mail;
mod processes;
mod streams;

pub use mail::{extract_code, html_part, no_redirects};
pub use processes::{free_port, spawn_service, spawn_service_to, workspace_binary};

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use inbound_ingest::budget::ByteBudget;
use postmesh_shared::{Common, Namespace, Rpc, Running, Service};
use sender::TransportKind;

use crate::databases::remove_namespace;
use crate::settings::{
    admin_url, billing_config, common, dispatcher_config, domain_config, fresh_namespace,
    gateway_config, http_client, inbound_config, worker_config, DomainOptions, Options, SenderMode,
    FAKE_SNS_TOPIC, TRACKING_SECRET, UNSUBSCRIBE_SECRET,
};
use crate::wait::on_a_fresh_runtime;
use crate::TestClient;

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
        let mut common = Common {
            upstream_timeout: opts.upstream_timeout,
            ..common(fresh_namespace())
        };
        if let Some(url) = opts.nats_cluster {
            common.nats_url = url;
            common.stream_replicas = 3;
        }
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
            sandbox_domain: sender::settings::SANDBOX_DOMAIN.default.into(),
            default_from: "hello@postmesh.localhost".into(),
            schedule_poll: Duration::from_millis(200),
            audience_max: self.audience_max,
            unsubscribe_secret: Some(UNSUBSCRIBE_SECRET.into()),
            unsubscribe_token_days: 60,
            public_base_url: self.base.clone(),
            tracking_secret: Some(TRACKING_SECRET.into()),
            tracking_base_url: String::new(),
            tracking_scanner_window_secs: 5,
            email_retention_days: std::num::NonZeroU16::new(30).unwrap(),
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
