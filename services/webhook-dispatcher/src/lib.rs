//! The webhook dispatcher: inbox webhook endpoints, the workspace default webhook and
//! workspace webhooks of delivery events, and the delivery of every received message and
//! delivery event to them — fanned out from the INBOUND and DELIVERY streams into durable
//! attempts, each a signed POST on the WEBHOOK stream, retried on a schedule.

pub mod attempt;
pub mod content;
pub mod delivery;
pub mod routes;
pub mod secret;
pub mod settings;
pub mod target;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;

use postmesh_shared::config::{secs, DNS_NAMESERVERS, SECRETS_KEY};
use postmesh_shared::dead_letters::DEAD_LETTER_MIGRATIONS;
use postmesh_shared::secrets::{SecretBox, DEV_SECRETS_KEY};
use postmesh_shared::{Common, Namespace, Running, Runtime, Service};

use delivery::worker::{self as deliver, Sender};
use delivery::{direct, events, fanout};
use routes::attempts;
use routes::routes;
use settings::*;
use target::Reach;

/// This service.
pub const SERVICE: Service = Service::WebhookDispatcher;

/// The service's own migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Its migrations and the kit's dead letters.
pub const MIGRATIONS: [&sqlx::migrate::Migrator; 2] = [&MIGRATOR, &DEAD_LETTER_MIGRATIONS];

/// How deliveries are made and retried.
#[derive(Clone, Debug)]
pub struct DeliveryConfig {
    /// `WEBHOOK_TIMEOUT_SECS`: a receiver's answer must come within this.
    pub timeout: Duration,
    /// `WEBHOOK_RETRY_SCHEDULE`: the pauses before each retry; then the attempt fails.
    pub retry_schedule: Vec<Duration>,
    /// `WEBHOOK_DISABLE_AFTER_SECS`: a target failing every delivery this long is disabled.
    pub disable_after: Duration,
    /// `WEBHOOK_MAX_BODY_BYTES`: a longer body is cut, with `truncated: true`.
    pub max_body_bytes: usize,
    /// `WEBHOOK_CONCURRENCY`: deliveries in flight at once.
    pub concurrency: usize,
    /// `WEBHOOK_ENDPOINT_CONCURRENCY`: deliveries in flight to one target at once.
    pub endpoint_concurrency: usize,
    /// `WEBHOOK_ACK_WAIT_SECS`: how long a WEBHOOK job's ack deadline and its attempts'
    /// leases last (renewed while a POST runs), and an INBOUND or DELIVERY batch's ack
    /// deadline (renewed while its fan-out runs); a dead dispatcher's work is taken after it.
    pub ack_wait: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            timeout: WEBHOOK_TIMEOUT_SECS.default_secs(),
            retry_schedule: parse_schedule(WEBHOOK_RETRY_SCHEDULE.default)
                .expect("the default parses"),
            disable_after: WEBHOOK_DISABLE_AFTER_SECS.default_secs(),
            max_body_bytes: WEBHOOK_MAX_BODY_BYTES.default_of(),
            concurrency: WEBHOOK_CONCURRENCY.default_of(),
            endpoint_concurrency: WEBHOOK_ENDPOINT_CONCURRENCY.default_of(),
            ack_wait: WEBHOOK_ACK_WAIT_SECS.default_secs(),
        }
    }
}

/// The largest `WEBHOOK_MAX_BODY_BYTES`: the message's bodies must fit one NATS reply.
const MAX_BODY_LIMIT: usize = 384 * 1024;

/// Parses a comma list of seconds.
fn parse_schedule(raw: &str) -> anyhow::Result<Vec<Duration>> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|_| anyhow::anyhow!("WEBHOOK_RETRY_SCHEDULE: {s:?} is not seconds"))
        })
        .collect()
}

/// Dispatcher settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub common: Common,
    /// Seals signing secrets (`SECRETS_KEY`: 64 hex digits; required in production).
    pub secrets_key: String,
    /// `WEBHOOK_ALLOW_INSECURE=1`: `http://` and private hosts allowed (local runs, tests).
    pub allow_insecure: bool,
    /// `DNS_NAMESERVERS`: where webhook hosts are looked up; empty: the system's resolvers.
    pub nameservers: Vec<SocketAddr>,
    pub delivery: DeliveryConfig,
    /// `WEBHOOK_RETENTION_DAYS` (default 30; 0 keeps everything): finished attempts, stored
    /// events and received messages older than this are deleted (replay reaches no further).
    pub retention_days: u32,
    /// `WEBHOOK_REPLAY_MAX` (default 10,000): the most deliveries one replay queues; the
    /// rest are left out and the answer says `truncated`.
    pub replay_max: usize,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let common = Common::from_env(SERVICE)?;
        let allow_insecure = WEBHOOK_ALLOW_INSECURE.flag();
        anyhow::ensure!(
            !(allow_insecure && common.production),
            "WEBHOOK_ALLOW_INSECURE=1 is refused in production"
        );
        let delivery = DeliveryConfig {
            timeout: WEBHOOK_TIMEOUT_SECS.secs()?,
            retry_schedule: parse_schedule(&WEBHOOK_RETRY_SCHEDULE.string())?,
            disable_after: WEBHOOK_DISABLE_AFTER_SECS.secs()?,
            max_body_bytes: WEBHOOK_MAX_BODY_BYTES.parse()?,
            concurrency: WEBHOOK_CONCURRENCY.parse()?,
            endpoint_concurrency: WEBHOOK_ENDPOINT_CONCURRENCY.parse()?,
            ack_wait: WEBHOOK_ACK_WAIT_SECS.secs()?,
        };
        anyhow::ensure!(
            delivery.ack_wait >= Duration::from_secs(1),
            "WEBHOOK_ACK_WAIT_SECS is at least 1"
        );
        anyhow::ensure!(
            (1..=MAX_BODY_LIMIT).contains(&delivery.max_body_bytes),
            "WEBHOOK_MAX_BODY_BYTES is 1 to {MAX_BODY_LIMIT}"
        );
        Ok(Self {
            secrets_key: common.secret(&SECRETS_KEY)?,
            allow_insecure,
            nameservers: postmesh_shared::dns::parse_nameservers(&DNS_NAMESERVERS.string())?,
            delivery,
            retention_days: WEBHOOK_RETENTION_DAYS.parse()?,
            replay_max: WEBHOOK_REPLAY_MAX.parse()?,
            common,
        })
    }

    /// The same settings as environment variables (to start the binary with them).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let d = &self.delivery;
        let list = |v: &[Duration]| {
            v.iter()
                .map(|d| d.as_secs().to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let nameservers = self
            .nameservers
            .iter()
            .map(SocketAddr::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut env = self.common.to_env();
        env.extend([
            (SECRETS_KEY.name, self.secrets_key.clone()),
            (
                WEBHOOK_ALLOW_INSECURE.name,
                u8::from(self.allow_insecure).to_string(),
            ),
            (DNS_NAMESERVERS.name, nameservers),
            (WEBHOOK_TIMEOUT_SECS.name, secs(d.timeout)),
            (WEBHOOK_RETRY_SCHEDULE.name, list(&d.retry_schedule)),
            (WEBHOOK_DISABLE_AFTER_SECS.name, secs(d.disable_after)),
            (WEBHOOK_MAX_BODY_BYTES.name, d.max_body_bytes.to_string()),
            (WEBHOOK_CONCURRENCY.name, d.concurrency.to_string()),
            (
                WEBHOOK_ENDPOINT_CONCURRENCY.name,
                d.endpoint_concurrency.to_string(),
            ),
            (WEBHOOK_ACK_WAIT_SECS.name, secs(d.ack_wait)),
            (WEBHOOK_RETENTION_DAYS.name, self.retention_days.to_string()),
            (WEBHOOK_REPLAY_MAX.name, self.replay_max.to_string()),
        ]);
        env
    }
}

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub ns: Namespace,
    pub secrets: SecretBox,
    /// Where webhooks may go, and how their hosts are looked up.
    pub reach: Reach,
    /// Where the inbound service is asked about addresses and messages, and jobs are
    /// published; without it, routes that need them answer 503.
    pub nats: Option<async_nats::Client>,
    /// Makes the signed POSTs (the test route's, and the worker's).
    pub sender: Sender,
    /// The most deliveries one replay queues (`WEBHOOK_REPLAY_MAX`).
    pub replay_max: usize,
}

impl AppState {
    /// State over `db` alone, for the router: the development key, the URL rules on, no NATS.
    pub fn new(db: PgPool, ns: Namespace) -> anyhow::Result<Self> {
        let reach = Reach::new(&[], false)?;
        Ok(Self {
            sender: Sender::new(reach.clone(), &DeliveryConfig::default())?,
            db,
            ns,
            secrets: SecretBox::from_hex(DEV_SECRETS_KEY)?,
            reach,
            nats: None,
            replay_max: WEBHOOK_REPLAY_MAX.default_of(),
        })
    }
}

/// The dispatcher's HTTP router.
pub fn router(state: AppState) -> Router {
    routes().into_router(SERVICE.routes(), state)
}

/// Starts the dispatcher: its routes on NATS, the INBOUND and DELIVERY fan-outs, the
/// delivery worker and the scheduler that queues attempts when they are due.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let rt = Runtime::boot(SERVICE, &config.common, &MIGRATIONS).await?;
    if config.allow_insecure {
        tracing::warn!(
            "WEBHOOK_ALLOW_INSECURE=1: webhooks may go to http:// and private hosts; never in production"
        );
    }
    let reach = Reach::new(&config.nameservers, config.allow_insecure)?;
    let state = AppState {
        db: rt.db.clone(),
        ns: config.common.namespace.clone(),
        secrets: SecretBox::from_hex(&config.secrets_key)?,
        sender: Sender::new(reach.clone(), &config.delivery)?,
        replay_max: config.replay_max,
        reach,
        nats: Some(rt.nats.clone()),
    };
    let slots = Arc::new(deliver::Slots::new(config.delivery.endpoint_concurrency));
    let direct = Arc::new(direct::Direct {
        state: state.clone(),
        js: rt.js.clone(),
        ns: rt.common.namespace.clone(),
        slots: slots.clone(),
        config: config.delivery.clone(),
        tracker: rt.tracker.clone(),
    });
    let inbound = fanout::Inbound {
        direct: direct.clone(),
    };
    let ack_wait = config.delivery.ack_wait;
    fanout::spawn(&rt, inbound, ack_wait).await?;
    fanout::spawn(&rt, events::Deliveries { direct }, ack_wait).await?;
    deliver::spawn(&rt, state.clone(), &config.delivery, slots).await?;
    attempts::schedule(&rt);
    attempts::prune_periodically(&rt, config.retention_days);
    rt.serve(rt.host().http(router(state))).await?;
    rt.running(None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_schedule_is_a_list_of_seconds() {
        let schedule = parse_schedule(WEBHOOK_RETRY_SCHEDULE.default).unwrap();
        assert_eq!(schedule.len(), 7);
        assert_eq!(schedule[0], Duration::from_secs(5));
        assert_eq!(schedule[6], Duration::from_secs(36000));
        assert!(parse_schedule("5,x").is_err());
        assert!(parse_schedule("").unwrap().is_empty());
    }

    #[test]
    fn a_child_process_reads_back_the_same_settings() {
        let mut config = Config::from_env().unwrap();
        config.allow_insecure = true;
        config.nameservers = vec!["127.0.0.1:5353".parse().unwrap()];
        config.delivery = DeliveryConfig {
            timeout: Duration::from_millis(2500),
            retry_schedule: vec![Duration::from_secs(1), Duration::from_secs(2)],
            disable_after: Duration::from_secs(60),
            max_body_bytes: 1024,
            concurrency: 3,
            endpoint_concurrency: 2,
            ack_wait: Duration::from_millis(3500),
        };
        config.retention_days = 7;
        config.replay_max = 5;
        for (name, value) in config.to_env() {
            std::env::set_var(name, value);
        }
        let back = Config::from_env().unwrap();
        assert_eq!(format!("{back:?}"), format!("{config:?}"));
        std::env::set_var(WEBHOOK_ACK_WAIT_SECS.name, "0.5");
        assert!(Config::from_env().is_err(), "a lease under a second");
    }
}
