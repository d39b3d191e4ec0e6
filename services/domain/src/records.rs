//! The DNS records a domain publishes for us: Easy DKIM CNAMEs, the custom MAIL FROM's MX
//! and SPF (outbound), the MX that brings its mail to us (inbound), and the CNAME of its
//! tracking host.

use serde::{Deserialize, Serialize};

/// The preference we ask users to publish for our MX.
pub const MX_PRIORITY: u16 = 10;
/// The subdomain SES sends from (bounces come back there).
pub const MAIL_FROM_LABEL: &str = "mail";
/// The SPF record of the MAIL FROM domain.
pub const SPF: &str = "v=spf1 include:amazonses.com ~all";
/// Characters of an SES Easy DKIM token.
const DKIM_TOKEN_LEN: usize = 32;
/// The longest sender domain: its longest record name, `<DKIM token>._domainkey.<domain>`,
/// must fit DNS's 253 characters.
pub const MAX_DOMAIN_LEN: usize = 253 - DKIM_TOKEN_LEN - "._domainkey.".len();

/// One record to publish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SenderDomainDnsRecord)]
pub struct DnsRecord {
    /// `CNAME`, `MX` or `TXT`.
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub value: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u16>,
    /// True for a record found at the DNS host that the host proxies: it answers with its
    /// own addresses instead, so a proxied CNAME publishes no CNAME.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proxied: bool,
}

impl DnsRecord {
    fn new(kind: &str, name: String, value: String, priority: Option<u16>) -> Self {
        Self {
            kind: kind.into(),
            name,
            value,
            priority,
            proxied: false,
        }
    }
}

/// The label of a domain's own tracking host.
pub const TRACKING_LABEL: &str = "track";

/// `track.<domain>`: where a domain's tracked links and pixels go once verified.
pub fn tracking_host(domain: &str) -> String {
    format!("{TRACKING_LABEL}.{domain}")
}

/// What tracking through `domain`'s own host needs: `track.<domain>` a CNAME of `target`
/// (`TRACKING_HOST`).
pub fn tracking(domain: &str, target: &str) -> DnsRecord {
    DnsRecord::new("CNAME", tracking_host(domain), target.to_owned(), None)
}

/// The MAIL FROM domain of `domain`.
pub fn mail_from(domain: &str) -> String {
    format!("{MAIL_FROM_LABEL}.{domain}")
}

/// What sending as `domain` through SES in `region` needs: one CNAME per DKIM token, then
/// the MAIL FROM MX and SPF TXT.
pub fn outbound(domain: &str, dkim_tokens: &[String], region: &str) -> Vec<DnsRecord> {
    let mut records: Vec<DnsRecord> = dkim_tokens
        .iter()
        .map(|t| {
            DnsRecord::new(
                "CNAME",
                format!("{t}._domainkey.{domain}"),
                format!("{t}.dkim.amazonses.com"),
                None,
            )
        })
        .collect();
    records.push(DnsRecord::new(
        "MX",
        mail_from(domain),
        format!("feedback-smtp.{region}.amazonses.com"),
        Some(10),
    ));
    records.push(DnsRecord::new("TXT", mail_from(domain), SPF.into(), None));
    records
}

/// What receiving mail for `domain` needs: our MX at the apex.
pub fn inbound(domain: &str, mx_host: &str) -> Vec<DnsRecord> {
    vec![DnsRecord::new(
        "MX",
        domain.to_owned(),
        mx_host.to_owned(),
        Some(MX_PRIORITY),
    )]
}
