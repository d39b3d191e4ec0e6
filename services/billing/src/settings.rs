//! Billing's settings (its rows of `docs/configuration.md`).

use postmesh_shared::settings;

settings! {
    BILLING_HOLD_SWEEP_SECS = "5", "billing: how often unconfirmed held charges are refunded (and checkouts never opened for a day expired)";
    BILLING_CATALOG_FILE = "deploy/catalog.json", "billing: packs, plans (limits, Stripe price ids) and free limits, loaded into its database at start";
    STRIPE_SECRET_KEY = "", "billing: Stripe API key; unset turns top-ups, plans and the portal off (503)";
    STRIPE_API_BASE = "https://api.stripe.com", "billing: Stripe API address (tests point it at a fake)";
    STRIPE_WEBHOOK_SECRET = "", "billing: signing secret of the webhook endpoint (`whsec_...`); unset answers webhooks 503";
    BILLING_USAGE_TIMEOUT_SECS = "0.5", "billing: how long each owning service may take to count usage for `/billing/entitlements`";
}
