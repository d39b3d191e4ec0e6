//! The domain service's routes: sender domains, their checks and the admin review.

use super::HttpMethod::{Delete, Get, Post, Put};
use super::{keyed, RouteSpec};

/// `GET /sender-domains`.
pub const DOMAINS: RouteSpec = keyed(Get, "/sender-domains");
/// `POST /sender-domains`.
pub const DOMAIN_SUBMIT: RouteSpec = keyed(Post, "/sender-domains");
/// `GET /sender-domains/{id}`.
pub const DOMAIN: RouteSpec = keyed(Get, "/sender-domains/{id}");
/// `DELETE /sender-domains/{id}`.
pub const DOMAIN_DELETE: RouteSpec = keyed(Delete, "/sender-domains/{id}");
/// `POST /sender-domains/{id}/verify-ownership`.
pub const DOMAIN_VERIFY_OWNERSHIP: RouteSpec = keyed(Post, "/sender-domains/{id}/verify-ownership");
/// `POST /sender-domains/{id}/verify-inbound`.
pub const DOMAIN_VERIFY_INBOUND: RouteSpec = keyed(Post, "/sender-domains/{id}/verify-inbound");
/// `POST /sender-domains/{id}/setup-outbound`.
pub const DOMAIN_SETUP_OUTBOUND: RouteSpec = keyed(Post, "/sender-domains/{id}/setup-outbound");
/// `POST /sender-domains/{id}/verify-outbound`.
pub const DOMAIN_VERIFY_OUTBOUND: RouteSpec = keyed(Post, "/sender-domains/{id}/verify-outbound");
/// `POST /sender-domains/{id}/apply-dns`.
pub const DOMAIN_APPLY_DNS: RouteSpec = keyed(Post, "/sender-domains/{id}/apply-dns");
/// `PUT /sender-domains/dns-provider`.
pub const DNS_PROVIDER: RouteSpec = keyed(Put, "/sender-domains/dns-provider");
/// `GET /admin/sender-domains` (admins only).
pub const ADMIN_DOMAINS: RouteSpec = keyed(Get, "/admin/sender-domains");
/// `POST /admin/sender-domains/{id}/approve` (admins only).
pub const ADMIN_DOMAIN_APPROVE: RouteSpec = keyed(Post, "/admin/sender-domains/{id}/approve");
/// `POST /admin/sender-domains/{id}/reject` (admins only).
pub const ADMIN_DOMAIN_REJECT: RouteSpec = keyed(Post, "/admin/sender-domains/{id}/reject");

/// Every route the domain service serves.
pub const ROUTES: &[RouteSpec] = &[
    DOMAINS,
    DOMAIN_SUBMIT,
    DOMAIN,
    DOMAIN_DELETE,
    DOMAIN_VERIFY_OWNERSHIP,
    DOMAIN_VERIFY_INBOUND,
    DOMAIN_SETUP_OUTBOUND,
    DOMAIN_VERIFY_OUTBOUND,
    DOMAIN_APPLY_DNS,
    DNS_PROVIDER,
    ADMIN_DOMAINS,
    ADMIN_DOMAIN_APPROVE,
    ADMIN_DOMAIN_REJECT,
];
