//! The domain service's settings (its rows of `docs/configuration.md`).

use postmesh_shared::settings;

settings! {
    DOMAIN_RECHECK_SECS = "300", "domain: how often pending domains' ownership TXT, and every set-up tracking host's CNAME, are checked again (a tracking host whose CNAME went is pending again, and mail stops linking through it)";
    PLATFORM_DOMAINS = "postmesh.localhost", "domain: comma list of domains every workspace may send from; they and their subdomains cannot be submitted";
    INBOUND_MX_HOST = "mx.postmesh.localhost", "domain: the MX host a domain must point at to receive through Postmesh";
    TRACKING_HOST = "track.postmesh.localhost", "domain: the host a domain's `track.<domain>` must be a CNAME of for its tracked links to go through it (the gateway answers tracking paths on any host, there only links made for that host)";
    CLOUDFLARE_API_BASE = "https://api.cloudflare.com/client/v4", "domain: Cloudflare API address for apply-dns";
}
