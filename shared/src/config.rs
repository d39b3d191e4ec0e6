//! Configuration from environment variables. Every setting has a working local default;
//! secrets have none in production mode (`POSTMESH_ENV=production`).

use std::net::SocketAddr;
use std::str::FromStr;

use anyhow::{bail, Context};

/// The namespace that prefixes every NATS subject, stream, Redis key and database name,
/// so isolated stacks can share one NATS/Redis/Postgres. Lowercase letters, digits and `_`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace(String);

impl Namespace {
    /// Parses a namespace: 1-32 chars, starting with a lowercase letter, then `[a-z0-9_]`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let ok = (1..=32).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            bail!("invalid namespace {s:?}: use 1-32 chars of [a-z0-9_], starting with a letter");
        }
        Ok(Self(s.to_owned()))
    }

    /// The namespace itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `{ns}.{rest}`: a NATS subject in this namespace.
    pub fn subject(&self, rest: &str) -> String {
        format!("{}.{rest}", self.0)
    }

    /// `{ns}_{service}`: the Postgres database owned by `service` (dashes become `_`).
    pub fn database(&self, service: &str) -> String {
        format!("{}_{}", self.0, service.replace('-', "_"))
    }

    /// `{ns}_{NAME}`: a JetStream stream or bucket name.
    pub fn stream(&self, name: &str) -> String {
        format!("{}_{name}", self.0)
    }

    /// `{ns}:{rest}`: a Redis key in this namespace.
    pub fn redis_key(&self, rest: &str) -> String {
        format!("{}:{rest}", self.0)
    }
}

/// Settings every service reads.
#[derive(Clone, Debug)]
pub struct Common {
    pub namespace: Namespace,
    pub nats_url: String,
    pub redis_url: String,
    /// Postgres server URL without a database; each service appends its own `{ns}_{service}`.
    pub database_url: String,
    pub db_max_connections: u32,
    /// Where `/healthz`, `/readyz` and `/metrics` are served.
    pub admin_addr: SocketAddr,
    pub otlp_endpoint: Option<String>,
    pub production: bool,
}

impl Common {
    /// Reads the shared settings; `admin_port` is the service's default admin port.
    pub fn from_env(admin_port: u16) -> anyhow::Result<Self> {
        Ok(Self {
            namespace: Namespace::parse(&env_or("POSTMESH_NAMESPACE", "pm"))?,
            nats_url: env_or("NATS_URL", "nats://127.0.0.1:4222"),
            redis_url: env_or("REDIS_URL", "redis://127.0.0.1:6379"),
            database_url: env_or("DATABASE_URL", "postgres://postgres@127.0.0.1:5432"),
            db_max_connections: env_parse("DB_MAX_CONNECTIONS", 10)?,
            admin_addr: env_parse("ADMIN_ADDR", SocketAddr::from(([127, 0, 0, 1], admin_port)))?,
            otlp_endpoint: std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .ok()
                .filter(|s| !s.is_empty()),
            production: env_or("POSTMESH_ENV", "development") == "production",
        })
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

/// The variable's value, or `default` when unset or empty.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_rejects_unsafe_names() {
        for bad in ["", "Pm", "1pm", "pm-x", "pm.x", "pm x", &"a".repeat(33)] {
            assert!(Namespace::parse(bad).is_err(), "{bad:?} accepted");
        }
        let ns = Namespace::parse("t_42").unwrap();
        assert_eq!(ns.subject("svc.billing.http"), "t_42.svc.billing.http");
        assert_eq!(ns.database("api-gateway"), "t_42_api_gateway");
        assert_eq!(ns.stream("SEND"), "t_42_SEND");
        assert_eq!(ns.redis_key("code:x"), "t_42:code:x");
    }
}
