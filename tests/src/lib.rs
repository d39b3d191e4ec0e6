//! Test harness, one layer at a time: a service's database alone ([`ServiceDb`], for its
//! router and queries), or a whole Postmesh stack — the real gateway, billing and sender,
//! started in this process against the real PostgreSQL, Redis and NATS, isolated under a
//! fresh namespace ([`Stack`]). The sender can instead run as its own OS process, so a test
//! can kill it. [`TestClient`] is the one typed client for both.

pub mod attempts;
pub mod client;
pub mod cluster;
mod databases;
mod fake;
pub mod fake_cloudflare;
pub mod fake_dns;
pub mod fake_ses;
pub mod fake_smtp;
pub mod fake_sns;
pub mod fake_stripe;
pub mod hostile;
pub mod mta;
pub mod openapi_bodies;
pub mod peek;
pub mod receiver;
mod routers;
mod settings;
pub mod smtp;
mod stack;
mod wait;
pub mod web;
pub mod webdriver;

pub use client::{retry_after, Answer, TestClient};
pub use databases::{caller, remove_namespace, ServiceDb};
pub use fake::Fake;
pub use fake_stripe::FakeStripe;
pub use routers::{
    balance_of, sender_router, sender_state, BillingAlone, BillingRouter, InboundRouter,
};
pub use settings::{
    admin_url, billing_config, common, dispatcher_config, domain_config, fresh_namespace,
    gateway_config, http_client, inbound_config, nats_url, ops_nats, DomainOptions, Options,
    SenderMode, DEVICE_POLL_INTERVAL_SECS, FAKE_SNS_TOPIC, GATEWAY_BODY_LIMIT, INBOUND_DOMAIN,
    INBOUND_SECRET, PROVIDER_SECRET, TRACKING_SECRET, UNSUBSCRIBE_SECRET,
};
pub use stack::{
    extract_code, free_port, html_part, no_redirects, spawn_service, spawn_service_to,
    workspace_binary, Stack,
};
pub use wait::{eventually, lock_waiters, lock_waiters_reach, passes_at_once};

/// Runs `scenarios` (async fns of `&Stack`, each with keys, recipients and addresses of its
/// own) side by side on `stack`, then shuts the stack down.
#[macro_export]
macro_rules! side_by_side {
    ($stack:expr, [$($scenario:path),+ $(,)?]) => {{
        let stack = $stack;
        tokio::join!($($scenario(&stack)),+);
        stack.shutdown().await;
    }};
}
