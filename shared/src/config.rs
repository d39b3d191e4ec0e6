//! Configuration from environment variables. Every setting has a working local default;
//! secrets have none in production mode (`POSTMESH_ENV=production`).

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context};

use postmesh_contracts::{Namespace, Service};

/// Settings every service reads.
#[derive(Clone, Debug)]
pub struct Common {
    pub namespace: Namespace,
    /// The NATS server; the service signs in as the user named after it.
    pub nats_url: String,
    /// This service's NATS password (`NATS_PASSWORD`; development default `dev-<service>`,
    /// as `deploy/nats.conf` has it).
    pub nats_password: Option<String>,
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
        let admin_port = service.admin_port();
        let production = env_or("POSTMESH_ENV", "development") == "production";
        let nats_password = env_opt("NATS_PASSWORD");
        if production && nats_password.is_none() {
            bail!("NATS_PASSWORD must be set in production");
        }
        Ok(Self {
            namespace: Namespace::parse(&env_or("POSTMESH_NAMESPACE", "pm"))?,
            nats_url: env_or("NATS_URL", "nats://127.0.0.1:4223"),
            nats_password,
            redis_url: env_or("REDIS_URL", "redis://127.0.0.1:6379"),
            database_url: env_or("DATABASE_URL", "postgres://127.0.0.1:5432"),
            database_password: env_opt("DATABASE_PASSWORD"),
            db_max_connections: env_parse("DB_MAX_CONNECTIONS", 10)?,
            db_acquire_timeout: env_secs("DB_ACQUIRE_TIMEOUT_SECS", Duration::from_secs(5))?,
            upstream_timeout: env_secs("UPSTREAM_TIMEOUT_SECS", Duration::from_secs(10))?,
            drain_timeout: env_secs("SHUTDOWN_DRAIN_SECS", Duration::from_secs(30))?,
            outbox_poll: env_secs("OUTBOX_POLL_SECS", Duration::from_secs(1))?,
            max_deliver: env_parse("MAX_DELIVER", 5)?,
            admin_addr: env_parse("ADMIN_ADDR", SocketAddr::from(([127, 0, 0, 1], admin_port)))?,
            otlp_endpoint: std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .ok()
                .filter(|s| !s.is_empty()),
            production,
        })
    }

    /// The environment that [`Common::from_env`] reads back as these settings (a child
    /// process started with it runs with the same configuration).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("POSTMESH_NAMESPACE", self.namespace.as_str().to_owned()),
            ("NATS_URL", self.nats_url.clone()),
            ("REDIS_URL", self.redis_url.clone()),
            ("DATABASE_URL", self.database_url.clone()),
            ("DB_MAX_CONNECTIONS", self.db_max_connections.to_string()),
            ("DB_ACQUIRE_TIMEOUT_SECS", secs(self.db_acquire_timeout)),
            ("UPSTREAM_TIMEOUT_SECS", secs(self.upstream_timeout)),
            ("SHUTDOWN_DRAIN_SECS", secs(self.drain_timeout)),
            ("OUTBOX_POLL_SECS", secs(self.outbox_poll)),
            ("MAX_DELIVER", self.max_deliver.to_string()),
            ("ADMIN_ADDR", self.admin_addr.to_string()),
            (
                "POSTMESH_ENV",
                if self.production {
                    "production"
                } else {
                    "development"
                }
                .to_owned(),
            ),
        ];
        if let Some(endpoint) = &self.otlp_endpoint {
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()));
        }
        if let Some(password) = &self.nats_password {
            env.push(("NATS_PASSWORD", password.clone()));
        }
        if let Some(password) = &self.database_password {
            env.push(("DATABASE_PASSWORD", password.clone()));
        }
        env
    }

    /// A secret setting: required in production, `dev_default` otherwise.
    pub fn secret(&self, name: &str, dev_default: &str) -> anyhow::Result<String> {
        match std::env::var(name) {
            Ok(v) if !v.is_empty() => Ok(v),
            _ if self.production => bail!("{name} must be set in production"),
            _ => Ok(dev_default.to_owned()),
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

    #[test]
    fn the_configuration_table_lists_every_setting_the_code_reads_and_no_other() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["services", "shared/src", "cli/src", "clients"] {
            sources(&root.join(dir), &mut files);
        }
        let code: String = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect();
        let calls = [
            "env_or(\"",
            "env_parse(\"",
            "env_secs(\"",
            "env_opt(\"",
            "env::var(\"",
            "env::var_os(\"",
            // The CLI's: clap's env attribute and its key variable.
            "env = \"",
            "_ENV: &str = \"",
        ];
        // The CLI finds its credentials file through the user's own variables.
        let personal = ["HOME", "XDG_CONFIG_HOME"];
        let read: BTreeSet<String> = names_after(&code, &calls)
            .into_iter()
            .filter(|n| !personal.contains(&n.as_str()))
            .collect();
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
        let missing: Vec<_> = read.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "read by the code, not in docs/configuration.md: {missing:?}"
        );
        // Each listed name is read somewhere: by name, as a service's secret, or by the
        // log filter.
        let services = [
            "API_GATEWAY",
            "BILLING",
            "SENDER",
            "DOMAIN",
            "INBOUND_INGEST",
            "WEBHOOK_DISPATCHER",
        ];
        let stale: Vec<_> = listed
            .iter()
            .filter(|name| !code.contains(&format!("\"{name}\"")) && name.as_str() != "RUST_LOG")
            .filter(|name| {
                !services.iter().any(|s| {
                    name.strip_prefix(s).is_some_and(|rest| {
                        rest == "_DATABASE_PASSWORD" || rest == "_NATS_PASSWORD"
                    })
                })
            })
            .collect();
        assert!(
            stale.is_empty(),
            "in docs/configuration.md, read by nothing: {stale:?}"
        );
    }

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
