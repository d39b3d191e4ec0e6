//! Billing's routes: balances, the consumption log, top-ups, plans and Stripe's webhooks.

use super::HttpMethod::{Get, Post};
use super::{keyed, public, RouteSpec};

/// `GET /balance`.
pub const BALANCE: RouteSpec = keyed(Get, "/balance");
/// `POST /deduct`.
pub const DEDUCT: RouteSpec = keyed(Post, "/deduct");
/// `GET /logs`.
pub const LOGS: RouteSpec = keyed(Get, "/logs");
/// `GET /logs/download`.
pub const LOGS_DOWNLOAD: RouteSpec = keyed(Get, "/logs/download");
/// `GET /billing/catalog`.
pub const CATALOG: RouteSpec = public(Get, "/billing/catalog");
/// `POST /billing/checkout`.
pub const CHECKOUT: RouteSpec = keyed(Post, "/billing/checkout");
/// `GET /billing/purchases`.
pub const PURCHASES: RouteSpec = keyed(Get, "/billing/purchases");
/// `GET /billing/purchases/{id}`.
pub const PURCHASE: RouteSpec = keyed(Get, "/billing/purchases/{id}");
/// `POST /billing/purchases/{id}/reconcile`.
pub const PURCHASE_RECONCILE: RouteSpec = keyed(Post, "/billing/purchases/{id}/reconcile");
/// `POST /billing/subscription/checkout`.
pub const SUBSCRIPTION_CHECKOUT: RouteSpec = keyed(Post, "/billing/subscription/checkout");
/// `POST /billing/subscription/checkouts/{id}/reconcile`.
pub const SUBSCRIPTION_RECONCILE: RouteSpec =
    keyed(Post, "/billing/subscription/checkouts/{id}/reconcile");
/// `POST /billing/subscription/portal`.
pub const SUBSCRIPTION_PORTAL: RouteSpec = keyed(Post, "/billing/subscription/portal");
/// `GET /billing/entitlements`.
pub const ENTITLEMENTS: RouteSpec = keyed(Get, "/billing/entitlements");
/// `POST /billing/webhooks/stripe` (signed by Stripe, no key).
pub const STRIPE_WEBHOOK: RouteSpec = public(Post, "/billing/webhooks/stripe");

/// Every route billing serves.
pub const ROUTES: &[RouteSpec] = &[
    BALANCE,
    DEDUCT,
    LOGS,
    LOGS_DOWNLOAD,
    CATALOG,
    CHECKOUT,
    PURCHASES,
    PURCHASE,
    PURCHASE_RECONCILE,
    SUBSCRIPTION_CHECKOUT,
    SUBSCRIPTION_RECONCILE,
    SUBSCRIPTION_PORTAL,
    ENTITLEMENTS,
    STRIPE_WEBHOOK,
];
