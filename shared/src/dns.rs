//! The DNS resolver services ask (hickory-resolver): `DNS_NAMESERVERS` or the system's
//! resolvers, with no cache, so each lookup sees the current answer.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;

/// A resolver asking `nameservers` (UDP, then TCP), or the system's when empty; answers are
/// never cached here.
pub fn resolver(nameservers: &[SocketAddr], timeout: Duration) -> anyhow::Result<TokioResolver> {
    let mut builder = if nameservers.is_empty() {
        TokioResolver::builder_tokio()?
    } else {
        let servers = nameservers
            .iter()
            .map(|addr| {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
            })
            .collect();
        TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(servers),
            TokioRuntimeProvider::default(),
        )
    };
    let opts = builder.options_mut();
    opts.cache_size = 0;
    opts.timeout = timeout;
    opts.attempts = 2;
    Ok(builder.build()?)
}

/// Parses `DNS_NAMESERVERS`: a comma list of `ip:port` (or `ip`, port 53).
pub fn parse_nameservers(raw: &str) -> anyhow::Result<Vec<SocketAddr>> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<SocketAddr>()
                .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| anyhow::anyhow!("DNS_NAMESERVERS: {s:?} is not ip:port"))
        })
        .collect()
}
