//! Where a webhook may be sent: an `https://` URL whose host resolves only to public
//! addresses. Loopback, private, link-local (cloud metadata included), CGNAT, multicast,
//! unspecified, documentation and reserved ranges are refused, in IPv4 and IPv6 (IPv4-mapped
//! and NAT64 forms included), at creation and again by every delivery's own lookup.
//! `WEBHOOK_ALLOW_INSECURE` lifts both rules for local runs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;
use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, SchemaType, Type};

/// How long a lookup of a webhook's host may take.
const DNS_TIMEOUT: Duration = Duration::from_secs(2);

/// What `str::trim` takes off (Unicode `White_Space`) as an ECMA-262 character class: `\s`
/// is not the same (it has U+FEFF and lacks U+0085).
pub(crate) const TRIMMED: &str =
    r"[\x09-\x0d \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]";

/// The start of every URL [`Reach::check`] accepts, as an ECMA-262 pattern: after what
/// `str::trim` and then the URL parser (C0 controls and space) take off, the scheme `https`
/// or `http` (`http` only with `WEBHOOK_ALLOW_INSECURE`) in any case, the tabs and newlines
/// the parser ignores allowed in it.
fn url_pattern() -> String {
    [
        "^",
        TRIMMED,
        r"*[\x00-\x20]*[hH][\t\n\r]*[tT][\t\n\r]*[tT][\t\n\r]*[pP][\t\n\r]*(?:[sS][\t\n\r]*)?:",
    ]
    .concat()
}

/// The schema of a webhook URL as bodies give it: a URI of a scheme [`Reach::check`] takes
/// (its host must also resolve to public addresses, which no schema says).
pub(crate) fn url_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::Custom("uri".into())))
        .pattern(Some(url_pattern()))
}

/// [`url_schema`], or null.
pub(crate) fn nullable_url_schema() -> ObjectBuilder {
    url_schema().schema_type(SchemaType::from_iter([Type::String, Type::Null]))
}

/// A webhook URL that passed the checks.
#[derive(Clone, Debug)]
pub struct Target {
    pub url: Url,
}

/// Where webhooks may go: hosts are looked up with this resolver and must be public, unless
/// `WEBHOOK_ALLOW_INSECURE` allows anything. It is also the HTTP client's resolver, so a
/// delivery connects only to addresses checked by the lookup it made.
#[derive(Clone)]
pub struct Reach {
    resolver: TokioResolver,
    allow_insecure: bool,
}

impl Reach {
    /// Looks hosts up at `nameservers` (the system's when empty).
    pub fn new(nameservers: &[SocketAddr], allow_insecure: bool) -> anyhow::Result<Self> {
        Ok(Self {
            resolver: postmesh_shared::dns::resolver(nameservers, DNS_TIMEOUT)?,
            allow_insecure,
        })
    }

    /// Parses and checks `raw`, resolving its host; the reason when it may not be used.
    pub async fn check(&self, raw: &str) -> Result<Target, String> {
        let url = Url::parse(raw.trim()).map_err(|e| format!("url {raw:?} is not a URL: {e}"))?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_insecure => {}
            other => return Err(format!("url must be https:// (not {other}://)")),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("url must not carry credentials".into());
        }
        self.admit_literal(&url)?;
        if let Some(host) = url.domain() {
            self.addresses(host).await?;
        }
        Ok(Target { url })
    }

    /// Refuses a URL whose host is a literal address that is not public (a host name is
    /// checked by the lookup a connection makes).
    pub fn admit_literal(&self, url: &Url) -> Result<(), String> {
        let host = url.host_str().ok_or("url has no host")?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<IpAddr>() {
            Ok(ip) if !self.allow_insecure && !is_public(ip) => {
                Err(format!("{ip} is not a public address"))
            }
            _ => Ok(()),
        }
    }

    /// The addresses of `host`, every one of them public unless insecure hosts are allowed.
    async fn addresses(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        let ips: Vec<IpAddr> = self
            .resolver
            .lookup_ip(format!("{}.", host.trim_end_matches('.')))
            .await
            .map_err(|e| format!("{host} does not resolve: {e}"))?
            .iter()
            .collect();
        if ips.is_empty() {
            return Err(format!("{host} has no address"));
        }
        if !self.allow_insecure {
            if let Some(bad) = ips.iter().find(|ip| !is_public(**ip)) {
                return Err(format!(
                    "{host} resolves to {bad}, which is not a public address"
                ));
            }
        }
        Ok(ips)
    }
}

impl Resolve for Reach {
    fn resolve(&self, name: Name) -> Resolving {
        let reach = self.clone();
        Box::pin(async move {
            let ips = reach.addresses(name.as_str()).await?;
            // The connector puts the URL's port in place of 0.
            let addrs: Addrs = Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// Whether `ip` is a public unicast address a webhook may reach.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let refused = ip.is_unspecified()
        || a == 0 // "this network"
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16: cloud metadata lives here
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || ip.is_documentation()
        || (a == 198 && (18..20).contains(&b)) // benchmarking 198.18/15
        || ip.is_multicast()
        || a >= 240; // reserved and broadcast
    !refused
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    let refused = ip.is_unspecified()
        || ip.is_loopback()
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7 (AWS metadata fd00:ec2::254)
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || ip.is_multicast()
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || s[..6] == [0, 0, 0, 0, 0, 0]; // IPv4-compatible (deprecated) and the like
    !refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_unicast_addresses_pass() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2001:db8::1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} is refused");
        }
        for ip in [
            "93.184.216.34",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:93.184.216.34",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip} is public");
        }
    }

    #[tokio::test]
    async fn urls_must_be_https_to_public_hosts_unless_insecure_is_allowed() {
        let strict = Reach::new(&[], false).unwrap();
        for url in [
            "http://93.184.216.34/hook",
            "https://127.0.0.1/hook",
            "https://[::ffff:10.0.0.1]/hook",
            "https://169.254.169.254/latest/meta-data",
            "https://user:pw@93.184.216.34/hook",
            "ftp://93.184.216.34/hook",
            "not a url",
        ] {
            assert!(strict.check(url).await.is_err(), "{url}");
        }
        let ok = strict
            .check("https://93.184.216.34:8443/hook")
            .await
            .unwrap();
        assert_eq!(ok.url.as_str(), "https://93.184.216.34:8443/hook");
        let insecure = Reach::new(&[], true).unwrap();
        let local = insecure.check("http://127.0.0.1:9/hook").await.unwrap();
        assert_eq!(local.url.as_str(), "http://127.0.0.1:9/hook");
    }
}
