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
use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, Type};

use postmesh_shared::ApiError;

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

/// What the start of [`Reach::check`] takes.
fn url_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::Custom("uri".into())))
        .max_length(Some(MAX_URL))
        .pattern(Some(url_pattern()))
}

postmesh_shared::text_input! {
    /// A webhook URL as a body gives it, before [`Reach::check`] looks at it; its schema says
    /// what the check's start takes (a URI of a scheme the check accepts; that its host must
    /// resolve to public addresses no schema says).
    #[derive(Debug)]
    pub struct WebhookUrl as "WebhookUrl" = url_schema();
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

    /// Parses and checks `raw`, resolving its host; a 400 with the reason when it may not
    /// be used.
    pub async fn check(&self, raw: &str) -> Result<Target, ApiError> {
        let url = admit(raw, self.allow_insecure).map_err(ApiError::BadRequest)?;
        if let Some(host) = url.domain() {
            self.addresses(host).await.map_err(ApiError::BadRequest)?;
        }
        Ok(Target { url })
    }

    /// A change's URL checked as [`Reach::check`] does, or `current` when it has none.
    pub async fn changed(&self, raw: Option<&str>, current: String) -> Result<String, ApiError> {
        match raw {
            Some(raw) => Ok(self.check(raw).await?.url.to_string()),
            None => Ok(current),
        }
    }

    /// Refuses a URL whose host is a literal address that is not public (a host name is
    /// checked by the lookup a connection makes).
    pub fn admit_literal(&self, url: &Url) -> Result<(), String> {
        admit_literal(url, self.allow_insecure)
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

/// Bytes of a webhook URL at most, as given and as stored (percent-encoded): one that the
/// indexes over `url` can hold, and that every failed delivery's error can quote.
pub const MAX_URL: usize = 2048;

/// The checks of a webhook URL that need no lookup: at most [`MAX_URL`] bytes, a URL, https
/// (http too when insecure targets are allowed), no credentials, and no literal address
/// that is not public.
pub fn admit(raw: &str, allow_insecure: bool) -> Result<Url, String> {
    let too_long = || format!("url is over {MAX_URL} bytes");
    if raw.trim().len() > MAX_URL {
        return Err(too_long());
    }
    let url = Url::parse(raw.trim()).map_err(|e| format!("url {raw:?} is not a URL: {e}"))?;
    if url.as_str().len() > MAX_URL {
        return Err(too_long());
    }
    match url.scheme() {
        "https" => {}
        "http" if allow_insecure => {}
        other => return Err(format!("url must be https:// (not {other}://)")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("url must not carry credentials".into());
    }
    admit_literal(&url, allow_insecure)?;
    Ok(url)
}

fn admit_literal(url: &Url, allow_insecure: bool) -> Result<(), String> {
    let host = url.host_str().ok_or("url has no host")?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) if !allow_insecure && !is_public(ip) => Err(format!("{ip} is not a public address")),
        _ => Ok(()),
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
    let refused = a == 0 // "this network", 0/8
        || a == 10 // private 10/8
        || a == 127 // loopback 127/8
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 169 && b == 254) // link-local 169.254/16: cloud metadata lives here
        || (a == 172 && (16..32).contains(&b)) // private 172.16/12
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments 192.0.0/24
        || (a == 192 && b == 0 && c == 2) // documentation 192.0.2/24
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast 192.88.99/24
        || (a == 192 && b == 168) // private 192.168/16
        || (a == 198 && (18..20).contains(&b)) // benchmarking 198.18/15
        || (a == 198 && b == 51 && c == 100) // documentation 198.51.100/24
        || (a == 203 && b == 0 && c == 113) // documentation 203.0.113/24
        || a >= 224; // multicast 224/4, reserved 240/4 and broadcast
    !refused
}

/// Only global unicast (2000::/3) is public, and within it not the special-purpose blocks.
/// Everything else is refused, so every form that embeds or reaches an IPv4 address
/// (IPv4-mapped ::ffff:0:0/96, -compatible ::/96, -translated ::ffff:0:0:0/96, NAT64
/// 64:ff9b::/96 and 64:ff9b:1::/48) is, along with loopback, unique local, site-local,
/// link-local and multicast.
fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let global_unicast = (s[0] & 0xe000) == 0x2000;
    let refused = !global_unicast
        || (s[0] == 0x2001 && s[1] < 0x0200) // IETF 2001::/23: Teredo 2001::/32, benchmarking 2001:2::/48, ORCHID
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation 2001:db8::/32
        || s[0] == 0x2002 // 6to4 2002::/16
        || (s[0] == 0x3fff && s[1] < 0x1000); // documentation 3fff::/20
    !refused
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every non-public range, by its first and last address (and one inside where the
    /// edges alone would not show it).
    const REFUSED: &[(&str, &[&str])] = &[
        ("this network 0/8", &["0.0.0.0", "0.255.255.255"]),
        ("private 10/8", &["10.0.0.0", "10.255.255.255"]),
        ("CGNAT 100.64/10", &["100.64.0.0", "100.127.255.255"]),
        ("loopback 127/8", &["127.0.0.0", "127.255.255.255"]),
        (
            "link-local 169.254/16",
            &["169.254.0.0", "169.254.169.254", "169.254.255.255"],
        ),
        ("private 172.16/12", &["172.16.0.0", "172.31.255.255"]),
        ("IETF 192.0.0/24", &["192.0.0.0", "192.0.0.255"]),
        ("documentation 192.0.2/24", &["192.0.2.0", "192.0.2.255"]),
        ("6to4 relay 192.88.99/24", &["192.88.99.0", "192.88.99.255"]),
        ("private 192.168/16", &["192.168.0.0", "192.168.255.255"]),
        ("benchmarking 198.18/15", &["198.18.0.0", "198.19.255.255"]),
        (
            "documentation 198.51.100/24",
            &["198.51.100.0", "198.51.100.255"],
        ),
        (
            "documentation 203.0.113/24",
            &["203.0.113.0", "203.0.113.255"],
        ),
        ("multicast 224/4", &["224.0.0.0", "239.255.255.255"]),
        (
            "reserved 240/4 and broadcast",
            &["240.0.0.0", "255.255.255.255"],
        ),
        ("unspecified ::", &["::"]),
        ("loopback ::1", &["::1"]),
        (
            "IPv4-compatible ::/96",
            &["::0.0.0.1", "::93.184.216.34", "::255.255.255.255"],
        ),
        (
            "IPv4-mapped ::ffff:0:0/96",
            &["::ffff:0.0.0.0", "::ffff:93.184.216.34", "::ffff:127.0.0.1"],
        ),
        (
            "IPv4-translated ::ffff:0:0:0/96",
            &["::ffff:0:0.0.0.0", "::ffff:0:93.184.216.34"],
        ),
        (
            "NAT64 64:ff9b::/96",
            &["64:ff9b::", "64:ff9b::93.184.216.34", "64:ff9b::ffff:ffff"],
        ),
        (
            "local NAT64 64:ff9b:1::/48",
            &["64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff"],
        ),
        ("discard 100::/64", &["100::", "100::ffff:ffff:ffff:ffff"]),
        (
            "IETF 2001::/23",
            &["2001::", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff"],
        ),
        (
            "Teredo 2001::/32",
            &["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
        ),
        (
            "benchmarking 2001:2::/48",
            &["2001:2::", "2001:2:0:ffff:ffff:ffff:ffff:ffff"],
        ),
        (
            "documentation 2001:db8::/32",
            &["2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"],
        ),
        (
            "6to4 2002::/16",
            &[
                "2002::",
                "2002:5db8:d822::1",
                "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
        ),
        (
            "documentation 3fff::/20",
            &["3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff"],
        ),
        (
            "unique local fc00::/7",
            &[
                "fc00::",
                "fd00:ec2::254",
                "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
        ),
        (
            "link-local fe80::/10",
            &["fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
        ),
        (
            "site-local fec0::/10",
            &["fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
        ),
        (
            "multicast ff00::/8",
            &[
                "ff00::",
                "ff02::1",
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
        ),
    ];

    #[test]
    fn every_non_public_range_is_refused_and_public_unicast_passes() {
        for (range, ips) in REFUSED {
            for ip in *ips {
                assert!(!is_public(ip.parse().unwrap()), "{ip} ({range}) is refused");
            }
        }
        for ip in [
            "1.1.1.1",
            "9.255.255.255",
            "11.0.0.0",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.88.98.255",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2001:200::1",
            "2001:4860:4860::8888",
            "2600::",
            "2606:4700:4700::1111",
            "3ffe:ffff::1",
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
