//! The namespace that isolates one Postmesh stack from another on shared servers.

use anyhow::bail;

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

    /// `{ns}_{NAME}`: a JetStream stream or bucket name.
    pub fn stream(&self, name: &str) -> String {
        format!("{}_{name}", self.0)
    }

    /// `{ns}:{rest}`: a Redis key in this namespace.
    pub fn redis_key(&self, rest: &str) -> String {
        format!("{}:{rest}", self.0)
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
        assert_eq!(ns.stream("SEND"), "t_42_SEND");
        assert_eq!(ns.redis_key("code:x"), "t_42:code:x");
    }
}
