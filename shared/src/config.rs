//! Configuration from environment variables. Every setting has a working local default;
//! secrets have none in production mode (`POSTMESH_ENV=production`).

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context};

use postmesh_contracts::{Namespace, Service};

/// An environment variable Postmesh reads: its name, its default as the variable's own
/// text, and what it sets — one row of `docs/configuration.md`, which is written from these.
#[derive(Debug)]
pub struct Setting {
    /// The variable's name.
    pub name: &'static str,
    /// The value taken when the variable is unset or empty (empty: none).
    pub default: &'static str,
    /// The default as the table shows it, where the text alone would not say it.
    pub shown: Option<&'static str>,
    /// Who reads it and what it sets (`gateway: …`), the table's last column.
    pub about: &'static str,
}

impl Setting {
    /// The variable's value, or the default when unset or empty.
    pub fn string(&self) -> String {
        env_or(self.name, self.default)
    }

    /// The variable's value, or the default; none when both are empty.
    pub fn opt(&self) -> Option<String> {
        Some(self.string()).filter(|v| !v.is_empty())
    }

    /// Whether the variable (or the default) is `1`.
    pub fn flag(&self) -> bool {
        self.string() == "1"
    }

    /// The variable (or the default) parsed as `T`.
    pub fn parse<T: FromStr>(&self) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let raw = self.string();
        raw.parse()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("invalid {}={raw:?}", self.name))
    }

    /// The variable parsed as `T`, or `default` when unset or empty: for a default
    /// computed at start (the service's own admin port, the region's endpoint).
    pub fn parse_or<T: FromStr>(&self, default: T) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        env_parse(self.name, default)
    }

    /// The variable (or the default) as seconds, fractions allowed (`0.2`).
    pub fn secs(&self) -> anyhow::Result<Duration> {
        let raw = self.string();
        parse_secs(&raw).with_context(|| format!("invalid {}={raw:?}", self.name))
    }

    /// The default parsed as `T`, for a `Default` that must agree with the table (the
    /// settings test parses every default, so this cannot fail on a released build).
    pub fn default_of<T: FromStr>(&self) -> T
    where
        T::Err: std::fmt::Debug,
    {
        self.default.parse().expect("a setting's default parses")
    }

    /// The default as seconds, for a `Default` that must agree with the table.
    pub fn default_secs(&self) -> Duration {
        parse_secs(self.default).expect("a setting's default parses as seconds")
    }
}

/// Declares settings as constants, and `SETTINGS` listing them in order: `NAME = "default",
/// "who: what";`, with `shown "…"` after the default where the table should say more. Settings
/// of one row share the text: `A = "1" | B = "2", "…";`, and with one default too:
/// `A / B = "", "…";`.
#[macro_export]
macro_rules! settings {
    ($($($($name:ident)/+ = $default:literal $(shown $shown:literal)?)|+, $about:literal;)+) => {
        $($(
            $crate::settings!(@entry [$($name)/+] $default [$($shown)?] $about);
        )+)+
        /// Every setting declared here, in the order of the configuration table.
        pub const SETTINGS: &[&$crate::config::Setting] = &[$($($(&$name,)+)+)+];
    };
    (@entry [$($name:ident)/+] $default:literal $shown:tt $about:literal) => {
        $(
            #[doc = $about]
            pub const $name: $crate::config::Setting = $crate::config::Setting {
                name: stringify!($name),
                default: $default,
                shown: $crate::settings!(@shown $shown),
                about: $about,
            };
        )+
    };
    (@shown []) => { None };
    (@shown [$shown:literal]) => { Some($shown) };
}

/// The rows of the configuration table for `settings`: consecutive settings with the same
/// `about` share a row, their names listed together and their defaults too (once when all
/// are the same).
pub fn table(settings: &[&Setting]) -> String {
    let mut out = String::from("| variable | default | used by |\n|---|---|---|\n");
    let mut rest = settings;
    while let Some(first) = rest.first() {
        let n = rest.iter().take_while(|s| s.about == first.about).count();
        let (row, after) = rest.split_at(n);
        let names: Vec<String> = row.iter().map(|s| format!("`{}`", s.name)).collect();
        let mut defaults: Vec<String> = row.iter().map(|s| shown(s)).collect();
        if defaults.iter().all(|d| *d == defaults[0]) {
            defaults.truncate(1);
        }
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            names.join(", "),
            defaults.join(", "),
            first.about
        ));
        rest = after;
    }
    out
}

/// A setting's default as the table shows it.
fn shown(setting: &Setting) -> String {
    match (setting.shown, setting.default) {
        (Some(shown), _) => shown.to_owned(),
        (None, "") => "unset".to_owned(),
        (None, default) => format!("`{default}`"),
    }
}

settings! {
    POSTMESH_NAMESPACE = "pm", "all: prefixes NATS subjects, streams, Redis keys, database names";
    POSTMESH_ENV = "development", "all: `production` makes secrets mandatory";
    DATABASE_URL = "postgres://127.0.0.1:5432", "all: the server (host, port, options); each service signs in as its own role `{ns}_{service}` to its own database of that name";
    DATABASE_PASSWORD = "" shown "none (a developer's server trusts local connections)", "all: the service's own role's password";
    NATS_URL = "nats://127.0.0.1:4223", "all: Postmesh's own NATS (`deploy/nats.conf`); each service signs in as the user named after it";
    NATS_STREAM_REPLICAS = "1", "all: replicas of each JetStream stream and of the request-body bucket, set when a service creates or finds them (3 on a three-node NATS cluster; at most the cluster's size)";
    NATS_PASSWORD = "" shown "`dev-<service>` (required in production)", "all: the service's own NATS user's password";
    REDIS_URL = "redis://127.0.0.1:6379", "gateway; smtp-submission (failed logins)";
    ADMIN_ADDR = "" shown "`127.0.0.1:9090/9091/9092/9093/9094/9095/9096`", "all: where `/healthz`, `/readyz` and `/metrics` are served";
    DB_MAX_CONNECTIONS = "10", "all: the most connections of a service's database pool";
    DB_ACQUIRE_TIMEOUT_SECS = "5", "all: longest wait for a pooled database connection";
    UPSTREAM_TIMEOUT_SECS = "10", "all: NATS request/RPC timeout (the gateway answers 502 after it)";
    SHUTDOWN_DRAIN_SECS = "30", "all: longest wait for work in progress on SIGTERM";
    OUTBOX_POLL_SECS = "1", "services with an outbox (gateway, sender, inbound-ingest): how often the relay publishes what is left";
    MAX_DELIVER = "5", "sender, webhook-dispatcher: failures (panics, errors) of a stream message before it is kept aside as a dead letter; one that cannot be decoded goes aside at once";
    OTEL_EXPORTER_OTLP_ENDPOINT = "", "all: OTLP/HTTP trace export when set";
    RUST_LOG = "info", "all: JSON log filter";
    PUBLIC_BASE_URL = "http://127.0.0.1:8080", "gateway: the base of device verification links; cookies are `Secure` unless it is `http://`; billing: where Checkout and the portal send the buyer back (`/billing/checkout/success`, `/billing/subscription/success`, `/billing`, served by the web app); sender: the base of one-click unsubscribe links";
    TRACKING_SECRET = "" shown "unset (`make run`: `dev-tracking-secret`)", "gateway, sender: signs open and click tracking tokens (HMAC-SHA256); unset, no mail is tracked and the tracking paths `/t/o/…` and `/t/c/…` answer 404";
    TRACKING_BASE_URL = "" shown "`PUBLIC_BASE_URL`", "sender: where tracked links and pixels point (`{base}/t/c/…`, `{base}/t/o/…`) for mail from a domain without a verified tracking domain; gateway: on its host and `PUBLIC_BASE_URL`'s it answers tokens made for them, on any other host only tokens bound to that host (a domain's own `track.<domain>`)";
    DNS_NAMESERVERS = "" shown "the system's resolvers", "domain, webhook-dispatcher: comma list of `ip:port` name servers for TXT and MX checks and webhook hosts";
    SECRETS_KEY = "6465762d6f6e6c792d6b65792d6e6f742d666f722d70726f64756374696f6e21" shown "dev value (required in production)", "domain, webhook-dispatcher: 64 hex digits; seals saved DNS provider tokens and webhook signing secrets (ChaCha20-Poly1305)";
}

/// Settings every service reads.
#[derive(Clone, Debug)]
pub struct Common {
    pub namespace: Namespace,
    /// The NATS server; the service signs in as the user named after it.
    pub nats_url: String,
    /// This service's NATS password (`NATS_PASSWORD`; development default `dev-<service>`,
    /// as `deploy/nats.conf` has it).
    pub nats_password: Option<String>,
    /// Replicas of each JetStream stream and of the request-body bucket
    /// (`NATS_STREAM_REPLICAS`, default 1).
    pub stream_replicas: usize,
    pub redis_url: String,
    /// Postgres server URL (host, port, options); each service signs in as its own role
    /// `{ns}_{service}` to its own database of that name.
    pub database_url: String,
    /// This service's PostgreSQL password (`DATABASE_PASSWORD`; none: the server's own rule,
    /// trust on a developer's machine).
    pub database_password: Option<String>,
    pub db_max_connections: u32,
    /// How long a query waits for a free connection (`DB_ACQUIRE_TIMEOUT_SECS`, default 5).
    pub db_acquire_timeout: Duration,
    /// How long a NATS request or RPC may take (`UPSTREAM_TIMEOUT_SECS`, default 10).
    pub upstream_timeout: Duration,
    /// How long a stopping service waits for work in progress (`SHUTDOWN_DRAIN_SECS`, default 30).
    pub drain_timeout: Duration,
    /// How often the outbox relay looks for unpublished messages (`OUTBOX_POLL_SECS`, default 1).
    pub outbox_poll: Duration,
    /// Failures of a stream message before it is kept aside as a dead letter
    /// (`MAX_DELIVER`, default 5).
    pub max_deliver: u32,
    /// Where `/healthz`, `/readyz` and `/metrics` are served.
    pub admin_addr: SocketAddr,
    pub otlp_endpoint: Option<String>,
    pub production: bool,
}

impl Common {
    /// Reads the shared settings; the admin port defaults to the service's own.
    pub fn from_env(service: Service) -> anyhow::Result<Self> {
        let production = POSTMESH_ENV.string() == "production";
        let nats_password = NATS_PASSWORD.opt();
        if production && nats_password.is_none() {
            bail!("NATS_PASSWORD must be set in production");
        }
        Ok(Self {
            namespace: Namespace::parse(&POSTMESH_NAMESPACE.string())?,
            nats_url: NATS_URL.string(),
            nats_password,
            stream_replicas: NATS_STREAM_REPLICAS.parse()?,
            redis_url: REDIS_URL.string(),
            database_url: DATABASE_URL.string(),
            database_password: DATABASE_PASSWORD.opt(),
            db_max_connections: DB_MAX_CONNECTIONS.parse()?,
            db_acquire_timeout: DB_ACQUIRE_TIMEOUT_SECS.secs()?,
            upstream_timeout: UPSTREAM_TIMEOUT_SECS.secs()?,
            drain_timeout: SHUTDOWN_DRAIN_SECS.secs()?,
            outbox_poll: OUTBOX_POLL_SECS.secs()?,
            max_deliver: MAX_DELIVER.parse()?,
            admin_addr: ADMIN_ADDR
                .parse_or(SocketAddr::from(([127, 0, 0, 1], service.admin_port())))?,
            otlp_endpoint: OTEL_EXPORTER_OTLP_ENDPOINT.opt(),
            production,
        })
    }

    /// The environment that [`Common::from_env`] reads back as these settings (a child
    /// process started with it runs with the same configuration).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (POSTMESH_NAMESPACE.name, self.namespace.as_str().to_owned()),
            (NATS_URL.name, self.nats_url.clone()),
            (NATS_STREAM_REPLICAS.name, self.stream_replicas.to_string()),
            (REDIS_URL.name, self.redis_url.clone()),
            (DATABASE_URL.name, self.database_url.clone()),
            (DB_MAX_CONNECTIONS.name, self.db_max_connections.to_string()),
            (DB_ACQUIRE_TIMEOUT_SECS.name, secs(self.db_acquire_timeout)),
            (UPSTREAM_TIMEOUT_SECS.name, secs(self.upstream_timeout)),
            (SHUTDOWN_DRAIN_SECS.name, secs(self.drain_timeout)),
            (OUTBOX_POLL_SECS.name, secs(self.outbox_poll)),
            (MAX_DELIVER.name, self.max_deliver.to_string()),
            (ADMIN_ADDR.name, self.admin_addr.to_string()),
            (
                POSTMESH_ENV.name,
                if self.production {
                    "production"
                } else {
                    "development"
                }
                .to_owned(),
            ),
        ];
        if let Some(endpoint) = &self.otlp_endpoint {
            env.push((OTEL_EXPORTER_OTLP_ENDPOINT.name, endpoint.clone()));
        }
        if let Some(password) = &self.nats_password {
            env.push((NATS_PASSWORD.name, password.clone()));
        }
        if let Some(password) = &self.database_password {
            env.push((DATABASE_PASSWORD.name, password.clone()));
        }
        env
    }

    /// A secret setting: required in production, its development default otherwise.
    pub fn secret(&self, setting: &Setting) -> anyhow::Result<String> {
        match env_opt(setting.name) {
            Some(v) => Ok(v),
            None if self.production => bail!("{} must be set in production", setting.name),
            None => Ok(setting.default.to_owned()),
        }
    }
}

/// A connection URL fit for errors and logs: its password (`user:***@`) and any
/// `password`, `token` or `secret` query value hidden.
pub fn redacted(url: &str) -> String {
    let (before_query, query) = url
        .split_once('?')
        .map_or((url, None), |(a, q)| (a, Some(q)));
    let mut out = match before_query.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
            let authority = match authority.rsplit_once('@') {
                Some((user_info, host)) => {
                    let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
                    if user_info.contains(':') {
                        format!("{user}:***@{host}")
                    } else {
                        format!("***@{host}")
                    }
                }
                None => authority.to_owned(),
            };
            format!("{scheme}://{authority}{path}")
        }
        None => before_query.to_owned(),
    };
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _))
                    if ["password", "token", "secret"]
                        .iter()
                        .any(|s| k.to_ascii_lowercase().contains(s)) =>
                {
                    format!("{k}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

/// The variable's value, or `default` when unset or empty.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// The variable's value, or none when unset or empty.
pub fn env_opt(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The variable parsed as `T`, or `default` when unset or empty.
pub fn env_parse<T: FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("invalid {name}={v:?}")),
    }
}

/// A duration in seconds, fractions allowed (`0.2`), or `default` when unset or empty.
pub fn env_secs(name: &str, default: Duration) -> anyhow::Result<Duration> {
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => parse_secs(&v).with_context(|| format!("invalid {name}={v:?}")),
    }
}

/// Seconds as text (`30`, `0.2`) as a duration.
fn parse_secs(raw: &str) -> anyhow::Result<Duration> {
    let secs: f64 = raw.parse()?;
    Ok(Duration::try_from_secs_f64(secs)?)
}

/// A duration as [`env_secs`] reads it back.
pub fn secs(d: Duration) -> String {
    d.as_secs_f64().to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    /// The `.rs` files under `dir`, recursively.
    fn sources(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, into);
            } else if path.extension().is_some_and(|e| e == "rs") {
                into.push(path);
            }
        }
    }

    /// The names between `"` after each of `calls` in `text`.
    fn names_after(text: &str, calls: &[&str]) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for call in calls {
            for (at, _) in text.match_indices(call) {
                let rest = &text[at + call.len()..];
                if let Some(end) = rest.find('"') {
                    names.insert(rest[..end].to_owned());
                }
            }
        }
        names
    }

    /// The names of the settings `settings!` declares in `text` (`    NAME = "default", …`).
    fn declared(text: &str) -> BTreeSet<String> {
        let setting = |name: &str| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        };
        // `A = "1" | B = "2", …` and `A / B = "", …`, whose names may go on over lines.
        text.replace(" /\n", " / ")
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .flat_map(|line| line.split(" | "))
            .filter_map(|part| part.trim_start().split_once(" = "))
            .filter(|(_, rest)| rest.starts_with('"') || rest.starts_with("r\""))
            .flat_map(|(names, _)| names.split(" / ").map(str::trim))
            .filter(|name| setting(name) && !name.starts_with("TEST_"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_setting_is_declared_read_and_in_the_configuration_table() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["services", "shared/src", "cli/src", "clients"] {
            sources(&root.join(dir), &mut files);
        }
        let code: String = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect();
        // Variables read by name rather than through a declared setting: the CLI's (clap's
        // env attribute and its key variable) and the user's own, where the CLI finds its
        // credentials file. Any other read by name would miss the table's generator.
        let by_name = names_after(
            &code,
            &[
                "env_or(\"",
                "env_parse(\"",
                "env_secs(\"",
                "env_opt(\"",
                "env::var(\"",
                "env::var_os(\"",
            ],
        );
        let personal: BTreeSet<String> = ["HOME", "XDG_CONFIG_HOME"].map(String::from).into();
        assert_eq!(
            by_name, personal,
            "read by name instead of through a setting declared with settings!"
        );
        let cli = names_after(&code, &["env = \"", "_ENV: &str = \""]);
        let declared = declared(&code);
        let table = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
        let listed: BTreeSet<String> = table
            .lines()
            .filter_map(|line| line.strip_prefix("| "))
            .filter_map(|row| row.split(" | ").next())
            .flat_map(|cell| cell.split(", "))
            .filter_map(|name| name.strip_prefix('`')?.strip_suffix('`'))
            .filter(|name| {
                name.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
            .map(str::to_owned)
            .collect();
        let read: BTreeSet<String> = declared.union(&cli).cloned().collect();
        assert_eq!(
            read, listed,
            "docs/configuration.md lists other settings than the code declares"
        );
        // Each declared setting is read: `NAME.secs()` and the like (its `.name` alone is no
        // read) or `&NAME`; the
        // per-service NATS passwords are Secret keys Kubernetes maps to `NATS_PASSWORD`.
        let unread: Vec<_> = declared
            .iter()
            .filter(|name| !name.ends_with("_NATS_PASSWORD"))
            .filter(|name| {
                let read = code.match_indices(name.as_str()).any(|(at, _)| {
                    let whole =
                        !code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
                    let after = code[at + name.len()..].trim_start();
                    whole && after.starts_with('.') && !after.starts_with(".name")
                });
                !read && !code.contains(&format!("&{name}"))
            })
            .collect();
        assert!(unread.is_empty(), "declared, read by nothing: {unread:?}");
    }

    #[test]
    fn settings_of_one_meaning_share_a_row() {
        let two = table(&[&DB_MAX_CONNECTIONS, &MAX_DELIVER]);
        assert_eq!(two.lines().count(), 4, "two meanings, two rows: {two}");
        assert_eq!(
            table(&[&TEST_ONE, &TEST_OTHER]).lines().nth(2),
            Some("| `TEST_ONE`, `TEST_OTHER` | `1`, two | test: one meaning |")
        );
        // Only neighbours share a row; a group declares each of its names, in order.
        let names: Vec<&str> = example::SETTINGS.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "TEST_ONE",
                "TEST_OTHER",
                "TEST_NONE",
                "TEST_AGAIN",
                "TEST_LEFT",
                "TEST_RIGHT"
            ]
        );
        let rows = table(example::SETTINGS);
        assert_eq!(rows.lines().count(), 2 + 4);
        assert_eq!(
            rows.lines().last(),
            Some("| `TEST_LEFT`, `TEST_RIGHT` | four | test: one default |")
        );
        assert_eq!((TEST_OTHER.default, TEST_RIGHT.default), ("2", "4"));
        let same = table(&[&TEST_NONE, &TEST_ONE, &TEST_OTHER, &TEST_AGAIN]);
        assert_eq!(
            same.lines().nth(3),
            Some("| `TEST_ONE`, `TEST_OTHER`, `TEST_AGAIN` | `1`, two, two | test: one meaning |")
        );
        assert_eq!(
            table(&[&TEST_NONE, &TEST_NONE]).lines().nth(2),
            Some("| `TEST_NONE`, `TEST_NONE` | unset | test: none |"),
            "one default shown once when all are the same"
        );
    }

    /// Settings for the table's test (`TEST_` names are not looked for in the table).
    mod example {
        settings! {
            TEST_ONE = "1" | TEST_OTHER = "2" shown "two", "test: one meaning";
            TEST_NONE = "", "test: none";
            TEST_AGAIN = "3" shown "two", "test: one meaning";
            TEST_LEFT / TEST_RIGHT = "4" shown "four", "test: one default";
        }
    }
    use example::{TEST_AGAIN, TEST_NONE, TEST_ONE, TEST_OTHER, TEST_RIGHT};

    #[test]
    fn connection_urls_lose_their_secrets() {
        assert_eq!(
            redacted("postgres://app:s3cret@db:5432/x?sslmode=require&password=p"),
            "postgres://app:***@db:5432/x?sslmode=require&password=***"
        );
        assert_eq!(
            redacted("nats://tok@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("smtps://u:p@w@host:465"), "smtps://u:***@host:465");
    }
    use super::*;

    #[test]
    fn durations_round_trip_through_the_environment() {
        for d in [Duration::from_millis(200), Duration::from_secs(30)] {
            assert_eq!(parse_secs(&secs(d)).unwrap(), d);
        }
        for bad in ["-1", "soon", "NaN"] {
            assert!(parse_secs(bad).is_err(), "{bad:?} accepted");
        }
    }
}
