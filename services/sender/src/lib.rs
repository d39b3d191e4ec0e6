//! Sender: the sending service. Its HTTP routes (forwarded by the gateway) accept sends
//! (`/send-email`), keep templates and answer task status and SMTP credential checks; its
//! scheduler releases scheduled tasks; its workers deliver every job of the SEND work queue
//! (sends and the gateway's verification codes) through the configured transport.

pub mod audience;
pub mod delivery;
pub mod model;
pub mod overview;
pub mod sending;
pub mod settings;
pub mod workflows;

pub use delivery::transport::TransportKind;
pub use delivery::worker::WorkerConfig;

use delivery::{provider, transport, unsubscribe, worker};
use model::sandbox::Sandbox;
use sending::{events, schedule, settle, tracking, usage};
use settings::*;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;
use tokio_util::task::TaskTracker;

use postmesh_contracts::routes::sender as api;
use postmesh_ses::settings::{AWS_ACCESS_KEY_ID, AWS_REGION, AWS_SECRET_ACCESS_KEY, SES_ENDPOINT};
use postmesh_ses::SesConfig;
use postmesh_shared::clients::billing::BillingClient;
use postmesh_shared::config::{secs, PUBLIC_BASE_URL, TRACKING_BASE_URL, TRACKING_SECRET};
use postmesh_shared::dead_letters::DEAD_LETTER_MIGRATIONS;
use postmesh_shared::jetstream::outbox::Outbox;
use postmesh_shared::{
    db, ApiError, Common, EmailAddress, Namespace, Routes, Running, Runtime, Service,
};

/// This service.
pub const SERVICE: Service = Service::Sender;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// The sender's migrations: its own and the kit's (the outbox of released jobs).
pub const MIGRATIONS: [&sqlx::migrate::Migrator; 3] =
    [&MIGRATOR, &db::KIT_MIGRATIONS, &DEAD_LETTER_MIGRATIONS];

/// Database connections beyond one per job in progress.
const SPARE_CONNECTIONS: u32 = 4;

/// How often the message log is purged of what is past its retention.
const RETENTION_SWEEP: Duration = Duration::from_secs(300);

/// How often owed billing settlements are retried.
const SETTLE_POLL: Duration = Duration::from_secs(2);

/// Sender settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// `SEND_TRANSPORT`: `file` (default), `smtp` or `ses`.
    pub transport: TransportKind,
    /// Where the `file` transport writes `.eml` files.
    pub outbox_dir: PathBuf,
    /// Relay for the `smtp` transport, e.g. `smtp://127.0.0.1:25` or `smtp://h:587?tls=required`.
    pub smtp_url: String,
    /// Amazon SES, for the `ses` transport (`SES_ENDPOINT`, `AWS_*`).
    pub ses: SesConfig,
    /// The domain of the Message-IDs the sender makes (`MESSAGE_ID_DOMAIN`).
    pub message_id_domain: String,
    /// The sandbox domain (`SANDBOX_DOMAIN`): its addresses never reach a transport.
    pub sandbox_domain: String,
    /// The from-address of a send that names none (`SEND_DEFAULT_FROM`).
    pub default_from: String,
    /// How often the scheduler looks for due tasks (`SEND_SCHEDULE_POLL_SECS`, default 1).
    pub schedule_poll: Duration,
    /// Contacts an audience or campaign send may reach at most (`AUDIENCE_MAX_RECIPIENTS`,
    /// default 100,000).
    pub audience_max: usize,
    /// Signs unsubscribe tokens (`UNSUBSCRIBE_SECRET`); unset: marketing and lifecycle mail
    /// goes without `List-Unsubscribe` and `/unsubscribe` answers 503.
    pub unsubscribe_secret: Option<String>,
    /// How long an unsubscribe link works (`UNSUBSCRIBE_TOKEN_DAYS`, default 60).
    pub unsubscribe_token_days: i64,
    /// Where `/unsubscribe` is reached from outside (`PUBLIC_BASE_URL`).
    pub public_base_url: String,
    /// Signs tracking tokens (`TRACKING_SECRET`); unset: no mail is tracked.
    pub tracking_secret: Option<String>,
    /// Where tracked links and pixels point (`TRACKING_BASE_URL`; empty: `PUBLIC_BASE_URL`).
    pub tracking_base_url: String,
    /// Days a send's log is kept after its release (`EMAIL_RETENTION_DAYS`, default 30; at
    /// least one, so nothing in flight is purged).
    pub email_retention_days: std::num::NonZeroU16,
    /// A click this many seconds after sending, with no open before it, is a scanner's
    /// (`TRACKING_SCANNER_WINDOW_SECS`, default 5).
    pub tracking_scanner_window_secs: i64,
    /// What SNS's `SigningCertURL` and `SubscribeURL` must match (`SNS_URL_PATTERN`).
    pub sns_url_pattern: String,
    /// SNS topics whose notifications are taken (`SNS_TOPIC_ARNS`, comma list; empty: any).
    pub sns_topic_arns: Vec<String>,
    /// What a workspace may hold (`TEMPLATES_PER_WORKSPACE`, `AUDIENCES_PER_WORKSPACE`,
    /// `WORKFLOWS_PER_WORKSPACE`).
    pub quotas: Quotas,
    pub worker: WorkerConfig,
}

/// The most of each resource a workspace may hold; one more is a 403 that names the quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Template keys (`TEMPLATES_PER_WORKSPACE`, default 1,000).
    pub templates: i64,
    /// Saved audiences (`AUDIENCES_PER_WORKSPACE`, default 200).
    pub audiences: i64,
    /// Workflows (`WORKFLOWS_PER_WORKSPACE`, default 200).
    pub workflows: i64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            templates: TEMPLATES_PER_WORKSPACE.default_of(),
            audiences: AUDIENCES_PER_WORKSPACE.default_of(),
            workflows: WORKFLOWS_PER_WORKSPACE.default_of(),
        }
    }
}

impl Quotas {
    /// Takes the workspace's turn in `tx` and counts its rows of `table` that are `kept`
    /// (a condition: a deleted row kept for its history counts for nothing): 403 when they
    /// already fill `quota` (named by its setting), so the caller's insert keeps it.
    pub async fn hold(
        tx: &mut sqlx::PgConnection, (table, kept): (&str, &str),
        workspace: postmesh_shared::WorkspaceId, quota: i64, setting: &str,
    ) -> Result<(), ApiError> {
        db::take_turns(tx, db::Turns::Workspace, workspace).await?;
        let held: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE workspace_id = $1 AND {kept}"
        ))
        .bind(workspace)
        .fetch_one(&mut *tx)
        .await?;
        Self::check(held, quota, table, setting)
    }

    /// 403 when `held` already fills `quota` (named by its setting).
    pub fn check(held: i64, quota: i64, what: &str, setting: &str) -> Result<(), ApiError> {
        if held >= quota {
            return Err(ApiError::Forbidden(format!(
                "the workspace holds {held} {what}, its quota ({setting} = {quota})"
            )));
        }
        Ok(())
    }
}

impl Config {
    /// How SNS notifications are checked; in production, none without `SNS_TOPIC_ARNS`
    /// (`/provider-events/esp` answers 503), so no other AWS account's topic is taken.
    pub fn sns(&self) -> anyhow::Result<Option<provider::Sns>> {
        if self.common.production && self.sns_topic_arns.is_empty() {
            tracing::warn!(
                "SNS_TOPIC_ARNS is empty: in production /provider-events/esp answers 503"
            );
            return Ok(None);
        }
        let sns = provider::Sns::new(&self.sns_url_pattern, self.sns_topic_arns.clone())?;
        Ok(Some(sns))
    }

    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            common: Common::from_env(SERVICE)?,
            transport: SEND_TRANSPORT.parse()?,
            outbox_dir: OUTBOX_DIR.string().into(),
            smtp_url: SMTP_URL.string(),
            ses: SesConfig::from_env(),
            message_id_domain: MESSAGE_ID_DOMAIN.string(),
            sandbox_domain: SANDBOX_DOMAIN.string(),
            default_from: SEND_DEFAULT_FROM.string(),
            schedule_poll: SEND_SCHEDULE_POLL_SECS.secs()?,
            audience_max: AUDIENCE_MAX_RECIPIENTS.parse()?,
            unsubscribe_secret: UNSUBSCRIBE_SECRET.opt(),
            unsubscribe_token_days: UNSUBSCRIBE_TOKEN_DAYS.parse()?,
            public_base_url: PUBLIC_BASE_URL.string(),
            tracking_secret: TRACKING_SECRET.opt(),
            email_retention_days: EMAIL_RETENTION_DAYS.parse()?,
            tracking_base_url: TRACKING_BASE_URL.string(),
            tracking_scanner_window_secs: TRACKING_SCANNER_WINDOW_SECS.parse()?,
            sns_url_pattern: SNS_URL_PATTERN.string(),
            sns_topic_arns: SNS_TOPIC_ARNS
                .string()
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            quotas: Quotas {
                templates: TEMPLATES_PER_WORKSPACE.parse()?,
                audiences: AUDIENCES_PER_WORKSPACE.parse()?,
                workflows: WORKFLOWS_PER_WORKSPACE.parse()?,
            },
            worker: WorkerConfig {
                ack_wait: SEND_ACK_WAIT_SECS.secs()?,
                max_deliver: SEND_MAX_DELIVER.parse()?,
                retry_base: SEND_RETRY_BASE_SECS.secs()?,
                concurrency: SEND_CONCURRENCY.parse()?,
            },
        })
    }

    /// The environment that [`Config::from_env`] reads back as these settings.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.common.to_env();
        env.extend([
            (SEND_TRANSPORT.name, self.transport.to_string()),
            (OUTBOX_DIR.name, self.outbox_dir.display().to_string()),
            (SMTP_URL.name, self.smtp_url.clone()),
            (SES_ENDPOINT.name, self.ses.endpoint.clone()),
            (AWS_REGION.name, self.ses.region.clone()),
            (MESSAGE_ID_DOMAIN.name, self.message_id_domain.clone()),
            (SANDBOX_DOMAIN.name, self.sandbox_domain.clone()),
            (SEND_DEFAULT_FROM.name, self.default_from.clone()),
            (SEND_SCHEDULE_POLL_SECS.name, secs(self.schedule_poll)),
            (AUDIENCE_MAX_RECIPIENTS.name, self.audience_max.to_string()),
            (
                UNSUBSCRIBE_TOKEN_DAYS.name,
                self.unsubscribe_token_days.to_string(),
            ),
            (PUBLIC_BASE_URL.name, self.public_base_url.clone()),
            (TRACKING_BASE_URL.name, self.tracking_base_url.clone()),
            (
                EMAIL_RETENTION_DAYS.name,
                self.email_retention_days.to_string(),
            ),
            (
                TRACKING_SCANNER_WINDOW_SECS.name,
                self.tracking_scanner_window_secs.to_string(),
            ),
            (SNS_URL_PATTERN.name, self.sns_url_pattern.clone()),
            (SNS_TOPIC_ARNS.name, self.sns_topic_arns.join(",")),
            (
                TEMPLATES_PER_WORKSPACE.name,
                self.quotas.templates.to_string(),
            ),
            (
                AUDIENCES_PER_WORKSPACE.name,
                self.quotas.audiences.to_string(),
            ),
            (
                WORKFLOWS_PER_WORKSPACE.name,
                self.quotas.workflows.to_string(),
            ),
            (SEND_ACK_WAIT_SECS.name, secs(self.worker.ack_wait)),
            (SEND_MAX_DELIVER.name, self.worker.max_deliver.to_string()),
            (SEND_RETRY_BASE_SECS.name, secs(self.worker.retry_base)),
            (SEND_CONCURRENCY.name, self.worker.concurrency.to_string()),
        ]);
        if let Some(secret) = &self.unsubscribe_secret {
            env.push((UNSUBSCRIBE_SECRET.name, secret.clone()));
        }
        if let Some(secret) = &self.tracking_secret {
            env.push((TRACKING_SECRET.name, secret.clone()));
        }
        if let Some((id, secret)) = &self.ses.credentials {
            env.push((AWS_ACCESS_KEY_ID.name, id.clone()));
            env.push((AWS_SECRET_ACCESS_KEY.name, secret.clone()));
        }
        env
    }
}

impl Config {
    /// Tracking as these settings make it, if a secret is set.
    pub fn tracker(&self) -> Option<tracking::Tracker> {
        let base = match self.tracking_base_url.trim() {
            "" => &self.public_base_url,
            base => base,
        };
        self.tracking_secret
            .as_deref()
            .map(|secret| tracking::Tracker {
                key: postmesh_shared::tracking::TrackingKey::new(secret),
                base_url: base.trim_end_matches('/').to_owned(),
            })
    }

    /// The unsubscribe token signer these settings make, if a secret is set.
    pub fn unsubscribe(&self) -> Option<unsubscribe::Unsubscribe> {
        self.unsubscribe_secret.as_deref().map(|secret| {
            unsubscribe::Unsubscribe::new(
                secret,
                self.unsubscribe_token_days,
                &self.public_base_url,
            )
        })
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub nats: async_nats::Client,
    pub ns: Namespace,
    pub billing: BillingClient,
    pub outbox: Outbox,
    /// Background publishing of accepted jobs; a graceful stop waits for it.
    pub tracker: TaskTracker,
    /// The from-address of a send that names none.
    pub default_from: Arc<EmailAddress>,
    /// The sandbox domain's addresses, which never reach a transport.
    pub sandbox: Sandbox,
    /// Contacts an audience or campaign send may reach at most (`AUDIENCE_MAX_RECIPIENTS`).
    pub audience_max: usize,
    /// Unsubscribe tokens (none without `UNSUBSCRIBE_SECRET`: `/unsubscribe` answers 503).
    pub unsubscribe: Option<unsubscribe::Unsubscribe>,
    /// Where provider notifications may come from (none: `/provider-events/esp` is 503).
    pub sns: Option<provider::Sns>,
    /// Where delivery events are published.
    pub events: events::Outlet,
    /// What a workspace may hold.
    pub quotas: Quotas,
    /// The transport sends through the provider (SES): a custom from-domain must be
    /// verified for outbound there, or the send is a 400 at once.
    pub needs_outbound: bool,
    /// Passes over due workflow runs asked for by new runs: one at a time.
    pub wakes: Arc<workflows::wake::Wakes>,
}

impl AppState {
    /// State over `db`, `nats` and `outbox` in namespace `ns`; background work runs on
    /// `tracker`.
    pub fn new(
        db: PgPool, nats: async_nats::Client, ns: Namespace, tracker: TaskTracker, outbox: Outbox,
        default_from: EmailAddress,
    ) -> Self {
        Self {
            billing: BillingClient::new(nats.clone(), ns.clone(), tracker.clone()),
            events: events::Outlet {
                ns: ns.clone(),
                message_id_domain: MESSAGE_ID_DOMAIN.default.into(),
            },
            outbox,
            db,
            nats,
            ns,
            tracker,
            default_from: Arc::new(default_from),
            sandbox: Sandbox::new(SANDBOX_DOMAIN.default),
            audience_max: AUDIENCE_MAX_RECIPIENTS.default_of(),
            unsubscribe: None,
            sns: None,
            quotas: Quotas::default(),
            needs_outbound: false,
            wakes: Arc::default(),
        }
    }
}

/// Every route the service serves, with its handler and the JSON bodies it documents.
pub fn routes() -> Routes<AppState> {
    sending::routes()
        .merge(audience::routes())
        .merge(delivery::routes())
        .merge(workflows::routes())
        .merge(tracking::routes())
        .at(api::OPERATIONS_OVERVIEW, overview::overview)
}

/// The sender's HTTP router.
pub fn router(state: AppState) -> Router {
    routes().into_router(SERVICE.routes(), state)
}

/// Starts the sender: its routes and RPCs, the scheduler, the outbox relay, the transport
/// and the SEND consumer.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    // Each job in progress holds a connection while it claims and records; requests, the
    // relay and the scheduler need a few more.
    let common = Common {
        db_max_connections: config
            .common
            .db_max_connections
            .max(config.worker.concurrency as u32 + SPARE_CONNECTIONS),
        ..config.common.clone()
    };
    let rt = Runtime::boot(SERVICE, &common, &MIGRATIONS).await?;
    let default_from = EmailAddress::parse(&config.default_from)
        .ok_or_else(|| anyhow::anyhow!("SEND_DEFAULT_FROM is not an email address"))?;
    let transport = transport::Transport::new(&config).await?;
    let unsubscribe = config.unsubscribe();
    if unsubscribe.is_none() {
        tracing::warn!(
            "UNSUBSCRIBE_SECRET is not set: marketing and lifecycle mail goes without \
             List-Unsubscribe and /unsubscribe answers 503"
        );
    }
    let outlet = events::Outlet {
        ns: rt.common.namespace.clone(),
        message_id_domain: config.message_id_domain.clone(),
    };
    let sandbox = Sandbox::new(&config.sandbox_domain);
    let state = AppState {
        events: outlet.clone(),
        sandbox: sandbox.clone(),
        audience_max: config.audience_max,
        unsubscribe: unsubscribe.clone(),
        sns: config.sns()?,
        quotas: config.quotas,
        needs_outbound: config.transport == TransportKind::Ses,
        ..AppState::new(
            rt.db.clone(),
            rt.nats.clone(),
            rt.common.namespace.clone(),
            rt.tracker.clone(),
            rt.outbox(),
            default_from,
        )
    };
    rt.serve(usage::register(
        rt.host().http(router(state.clone())),
        state.clone(),
    ))
    .await?;
    let scheduler = state.clone();
    rt.every("scheduler", config.schedule_poll, move || {
        let state = scheduler.clone();
        async move { schedule::release_due(&state).await }
    });
    let runner = state.clone();
    rt.every("workflow runs", config.schedule_poll, move || {
        let state = runner.clone();
        async move { workflows::runs::advance_due(&state).await }
    });
    let (db, days) = (rt.db.clone(), i64::from(config.email_retention_days.get()));
    rt.every_later("email retention", RETENTION_SWEEP, move || {
        let db = db.clone();
        async move { sending::retention::purge(&db, days).await }
    });
    let settler = state.clone();
    rt.every("billing settlements", SETTLE_POLL, move || {
        let state = settler.clone();
        async move {
            let taken = settle::sweep(&state).await?;
            Ok::<_, ApiError>(taken as i64 == settle::BATCH)
        }
    });
    let tracker = config.tracker();
    if tracker.is_none() {
        tracing::warn!("TRACKING_SECRET is not set: no mail is tracked");
    }
    tracking::record::spawn(
        &rt,
        tracking::record::Recorder {
            db: rt.db.clone(),
            outlet: outlet.clone(),
            scanner_window: config.tracking_scanner_window_secs,
        },
    )
    .await?;
    let equipment = worker::Equipment {
        transport,
        outlet,
        unsubscribe,
        tracker,
        sandbox,
    };
    worker::spawn(&rt, equipment, config.worker.clone()).await?;
    tracing::info!(transport = %config.transport, "sender delivering");
    rt.running(None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_tried_for_hours_before_it_fails_for_good() {
        let worker = Config::from_env().unwrap().worker;
        let waited: Duration = (1..worker.max_deliver)
            .map(|attempt| postmesh_shared::queue::retry_delay(worker.retry_base, attempt))
            .sum();
        // A provider's outage (SES throttling or answering 5xx) of three hours fails no mail.
        assert!(waited >= Duration::from_secs(3 * 3600), "{waited:?}");
    }

    #[test]
    fn a_child_process_reads_back_the_same_settings() {
        let mut config = Config::from_env().unwrap();
        config.transport = TransportKind::Smtp;
        config.smtp_url = "smtp://127.0.0.1:2525".into();
        config.common.upstream_timeout = Duration::from_millis(1500);
        config.ses = SesConfig {
            endpoint: "http://127.0.0.1:4566".into(),
            region: "eu-west-1".into(),
            credentials: Some(("AKID".into(), "secret".into())),
        };
        config.message_id_domain = "mail.example.com".into();
        config.default_from = "hello@example.com".into();
        config.schedule_poll = Duration::from_millis(250);
        config.audience_max = 5000;
        config.unsubscribe_secret = Some("unsub-secret".into());
        config.unsubscribe_token_days = 30;
        config.public_base_url = "https://mail.example.com".into();
        config.tracking_secret = Some("track-secret".into());
        config.tracking_base_url = "https://t.example.com".into();
        config.tracking_scanner_window_secs = 9;
        config.email_retention_days = std::num::NonZeroU16::new(7).unwrap();
        config.sns_url_pattern = "^http://127\\.0\\.0\\.1:\\d+/".into();
        config.sns_topic_arns = vec!["arn:a".into(), "arn:b".into()];
        config.quotas = Quotas {
            templates: 7,
            audiences: 8,
            workflows: 9,
        };
        config.worker = WorkerConfig {
            ack_wait: Duration::from_secs(2),
            max_deliver: 5,
            retry_base: Duration::from_millis(200),
            concurrency: 8,
        };
        for (name, value) in config.to_env() {
            std::env::set_var(name, value);
        }
        let back = Config::from_env().unwrap();
        assert_eq!(format!("{back:?}"), format!("{config:?}"));
    }

    #[test]
    fn in_production_provider_events_need_their_topics() {
        let mut config = Config::from_env().unwrap();
        config.sns_topic_arns = Vec::new();
        assert!(
            config.sns().unwrap().is_some(),
            "any topic outside production"
        );
        config.common.production = true;
        assert!(
            config.sns().unwrap().is_none(),
            "no topics, no provider route"
        );
        config.sns_topic_arns = vec!["arn:aws:sns:us-east-1:123456789012:ses".into()];
        assert!(config.sns().unwrap().is_some());
    }
}
