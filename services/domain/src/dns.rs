//! DNS lookups (TXT for ownership, MX for inbound, CNAME for tracking) with hickory-resolver, against
//! `DNS_NAMESERVERS` or the system's resolvers. Answers are never cached here: a user who
//! just fixed a record wants the next check to see it.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;

use postmesh_shared::ApiError;

/// One MX record: preference (lower wins) and host, lower-cased without the final dot.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Mx {
    pub priority: u16,
    pub host: String,
}

/// A lookup that could not be answered (timeout, SERVFAIL, refused).
#[derive(Debug, thiserror::Error)]
#[error("DNS lookup of {name} failed: {reason}")]
pub struct LookupError {
    name: String,
    reason: String,
}

impl From<LookupError> for ApiError {
    fn from(e: LookupError) -> Self {
        tracing::warn!(error = %e, "DNS lookup failed");
        ApiError::Unavailable(format!("{e}; retry later"))
    }
}

/// The resolver the service asks.
#[derive(Clone)]
pub struct Dns {
    resolver: TokioResolver,
}

impl Dns {
    /// A resolver asking `nameservers`, or the system's when empty.
    pub fn new(nameservers: &[SocketAddr], timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            resolver: postmesh_shared::dns::resolver(nameservers, timeout)?,
        })
    }

    /// The TXT strings at `name` (each record's parts joined); none when the name or the
    /// type does not exist.
    pub async fn txt(&self, name: &str) -> Result<Vec<String>, LookupError> {
        let lookup = match self.resolver.txt_lookup(fqdn(name)).await {
            Ok(lookup) => lookup,
            Err(e) if e.is_no_records_found() => return Ok(Vec::new()),
            Err(e) => return Err(failed(name, e)),
        };
        Ok(lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::TXT(txt) => Some(
                    txt.txt_data
                        .iter()
                        .map(|part| String::from_utf8_lossy(part))
                        .collect::<String>(),
                ),
                _ => None,
            })
            .collect())
    }

    /// The target of the CNAME at `name`, lower-cased without the final dot; none when
    /// there is none.
    pub async fn cname(&self, name: &str) -> Result<Option<String>, LookupError> {
        let lookup = match self.resolver.lookup(fqdn(name), RecordType::CNAME).await {
            Ok(lookup) => lookup,
            Err(e) if e.is_no_records_found() => return Ok(None),
            Err(e) => return Err(failed(name, e)),
        };
        Ok(lookup.answers().iter().find_map(|r| match &r.data {
            RData::CNAME(target) => Some(host_name(&target.0.to_ascii())),
            _ => None,
        }))
    }

    /// The MX records of `name`, best first; none when there are none.
    pub async fn mx(&self, name: &str) -> Result<Vec<Mx>, LookupError> {
        let lookup = match self.resolver.mx_lookup(fqdn(name)).await {
            Ok(lookup) => lookup,
            Err(e) if e.is_no_records_found() => return Ok(Vec::new()),
            Err(e) => return Err(failed(name, e)),
        };
        let mut records: Vec<Mx> = lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::MX(mx) => Some(Mx {
                    priority: mx.preference,
                    host: host_name(&mx.exchange.to_ascii()),
                }),
                _ => None,
            })
            .collect();
        records.sort_by(|a, b| (a.priority, &a.host).cmp(&(b.priority, &b.host)));
        Ok(records)
    }
}

/// `name` lower-cased without its final dot.
pub fn host_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The absolute form of `name`, so no search domain is ever appended.
fn fqdn(name: &str) -> String {
    format!("{}.", name.trim_end_matches('.'))
}

fn failed(name: &str, e: impl std::fmt::Display) -> LookupError {
    LookupError {
        name: name.to_owned(),
        reason: e.to_string(),
    }
}
