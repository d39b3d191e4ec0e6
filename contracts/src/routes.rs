//! Each service's HTTP routes as the gateway must know them: method, path, who may call and
//! how large a body may be. The gateway builds its table from these manifests; each service
//! builds its router from them and its handlers, and refuses to start when the two disagree.

use crate::service::Service;

/// Who may call a route; the gateway enforces it before anything else runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Anyone.
    Public,
    /// A bearer API key (`Authorization: Bearer <key>`).
    Key,
    /// The upstream MTA: `x-service-inbound-secret` equal to the gateway's `INBOUND_SECRET`.
    InboundSecret,
    /// The cloud mail provider: `x-service-provider-secret` equal to the gateway's
    /// `PROVIDER_SECRET` (`?token=` only with `PROVIDER_SECRET_IN_QUERY=1`).
    ProviderSecret,
    /// A signed-in web session (the `pm_session` cookie); 401 without one.
    Session,
    /// A page of the web app: a signed-in web session, else a redirect to `/app/login`.
    Page,
}

/// The HTTP methods routes are declared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    /// Every method a route may be declared with.
    pub const ALL: [HttpMethod; 5] = [
        HttpMethod::Get,
        HttpMethod::Post,
        HttpMethod::Put,
        HttpMethod::Patch,
        HttpMethod::Delete,
    ];

    /// The method as it appears on the wire (`GET`).
    pub const fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Delete => "DELETE",
        }
    }
}

/// One method on one path of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub method: HttpMethod,
    /// The path in axum's syntax (`/sender-domains/{id}`).
    pub path: &'static str,
    pub policy: Policy,
    /// The route's own largest request body in bytes; `None`: the gateway's default
    /// (`GATEWAY_BODY_LIMIT`).
    pub body_limit: Option<usize>,
}

/// Declares a service's manifest: a `const` per route (`NAME = Method "/path" Policy`,
/// `, limit <bytes>` for a body limit of its own) and `ROUTES`, all of them in order.
macro_rules! manifest {
    ($($name:ident = $method:ident $path:literal $policy:ident $(, limit $limit:expr)?;)*) => {
        use $crate::routes::{HttpMethod, Policy, RouteSpec};
        $(
            #[doc = concat!("`", stringify!($method), " ", $path, "`")]
            pub const $name: RouteSpec = RouteSpec {
                method: HttpMethod::$method,
                path: $path,
                policy: Policy::$policy,
                body_limit: manifest!(@limit $($limit)?),
            };
        )*
        /// Every route the service serves.
        pub const ROUTES: &[RouteSpec] = &[$($name),*];
    };
    (@limit) => { None };
    (@limit $limit:expr) => { Some($limit) };
}

/// The gateway's own routes: verification codes, web login, API keys, CLI device
/// authorization, the web app and the API's OpenAPI document.
pub mod gateway {
    manifest! {
        SEND_CODE = Post "/send-code" Key;
        VERIFY_CODE = Post "/verify-code" Key;
        LOGIN_CODE = Post "/login/code" Public;
        VERIFY_CODE_LOGIN = Post "/verify-code-login" Public;
        LOGOUT = Post "/logout" Session;
        ACCOUNT = Get "/account" Key;
        API_KEYS = Get "/api-keys" Session;
        API_KEY_CREATE = Post "/api-keys" Session;
        API_KEY_REVOKE = Delete "/api-keys/{id}" Session;
        CLI_AUTH_INIT = Post "/cli/auth/init" Public;
        CLI_AUTH_POLL = Post "/cli/auth/poll" Public;
        CLI_AUTH_APPROVE = Post "/cli/auth/approve" Session;
        APP = Get "/app" Public;
        APP_LOGIN = Get "/app/login" Public;
        APP_LOGIN_SEND = Post "/app/login" Public;
        APP_LOGIN_VERIFY = Post "/app/login/verify" Public;
        APP_LOGOUT = Post "/app/logout" Page;
        APP_DEVICE = Get "/app/device" Page;
        APP_DEVICE_DECIDE = Post "/app/device" Page;
        APP_KEYS = Get "/app/keys" Page;
        APP_KEY_CREATE = Post "/app/keys" Page;
        APP_KEY_REVOKE = Post "/app/keys/{id}/revoke" Page;
        APP_USAGE = Get "/app/usage" Page;
        APP_EMAILS = Get "/app/emails" Page;
        APP_EMAIL = Get "/app/emails/{delivery_id}" Page;
        // Operators (admin keys): stream messages the consumers kept aside.
        DEAD_LETTERS = Get "/admin/dead-letters" Key;
        DEAD_LETTER_REQUEUE = Post "/admin/dead-letters/{id}/requeue" Key;
        OPENAPI = Get "/openapi.json" Public;
        // Open and click tracking: signed tokens, answered without a database.
        TRACK_OPEN = Get "/t/o/{token}" Public;
        TRACK_CLICK = Get "/t/c/{token}" Public;
        DOCS = Get "/docs" Public;
    }
}

/// Billing's routes: balances, the consumption log, top-ups, plans and Stripe's webhooks.
pub mod billing {
    manifest! {
        BALANCE = Get "/balance" Key;
        DEDUCT = Post "/deduct" Key;
        LOGS = Get "/logs" Key;
        LOGS_DOWNLOAD = Get "/logs/download" Key;
        CATALOG = Get "/billing/catalog" Public;
        CHECKOUT = Post "/billing/checkout" Key;
        PURCHASES = Get "/billing/purchases" Key;
        PURCHASE = Get "/billing/purchases/{id}" Key;
        PURCHASE_RECONCILE = Post "/billing/purchases/{id}/reconcile" Key;
        SUBSCRIPTION_CHECKOUT = Post "/billing/subscription/checkout" Key;
        SUBSCRIPTION_RECONCILE = Post "/billing/subscription/checkouts/{id}/reconcile" Key;
        SUBSCRIPTION_PORTAL = Post "/billing/subscription/portal" Key;
        ENTITLEMENTS = Get "/billing/entitlements" Key;
        STRIPE_WEBHOOK = Post "/billing/webhooks/stripe" Public;
    }
}

/// The domain service's routes: sender domains, their checks and the admin review.
pub mod domain {
    manifest! {
        DOMAINS = Get "/sender-domains" Key;
        DOMAIN_SUBMIT = Post "/sender-domains" Key;
        DOMAIN = Get "/sender-domains/{id}" Key;
        DOMAIN_DELETE = Delete "/sender-domains/{id}" Key;
        DOMAIN_VERIFY_OWNERSHIP = Post "/sender-domains/{id}/verify-ownership" Key;
        DOMAIN_VERIFY_INBOUND = Post "/sender-domains/{id}/verify-inbound" Key;
        DOMAIN_SETUP_OUTBOUND = Post "/sender-domains/{id}/setup-outbound" Key;
        DOMAIN_VERIFY_OUTBOUND = Post "/sender-domains/{id}/verify-outbound" Key;
        DOMAIN_SETUP_TRACKING = Post "/sender-domains/{id}/setup-tracking" Key;
        DOMAIN_VERIFY_TRACKING = Post "/sender-domains/{id}/verify-tracking" Key;
        DOMAIN_APPLY_DNS = Post "/sender-domains/{id}/apply-dns" Key;
        DNS_PROVIDER = Put "/sender-domains/dns-provider" Key;
        ADMIN_DOMAINS = Get "/admin/sender-domains" Key;
        ADMIN_DOMAIN_APPROVE = Post "/admin/sender-domains/{id}/approve" Key;
        ADMIN_DOMAIN_REJECT = Post "/admin/sender-domains/{id}/reject" Key;
    }
}

/// The sender's routes: sends, their status, templates, SMTP credentials, contacts, suppressions, audiences and campaigns.
pub mod sender {
    manifest! {
        // Up to 1000 recipients and 10 MiB of attachments (base64): 16 MiB.
        SEND_EMAIL = Post "/send-email" Key, limit 16 * 1024 * 1024;
        SEND_CANCEL = Delete "/send-email/{task_id}" Key;
        EMAIL_STATUS = Get "/email-status/{task_id}" Key;
        EMAILS = Get "/emails" Key;
        EMAIL = Get "/emails/{delivery_id}" Key;
        EMAIL_STATS = Get "/email-stats" Key;
        // An html and a text of 512 KiB each, with room for their JSON escapes.
        TEMPLATE_CREATE = Post "/templates" Key, limit 3 * 1024 * 1024;
        TEMPLATES = Get "/templates" Key;
        TEMPLATE = Get "/templates/{key}" Key;
        TEMPLATE_DELETE = Delete "/templates/{key}" Key;
        SMTP_AUTH = Post "/smtp-auth" Key;
        // What an SMTP relay asks at MAIL FROM and RCPT TO, before the message.
        SMTP_ENVELOPE = Post "/smtp-envelope" Key;
        // A message as its client wrote it (RFC 5322), base64: 28 MiB of MIME, 1,000
        // recipients and the envelope around them.
        SEND_RAW = Post "/send-raw" Key, limit 48 * 1024 * 1024;
        CONTACTS = Get "/contacts" Key;
        CONTACT_UPSERT = Post "/contacts" Key;
        // Up to 10,000 contacts as a JSON array or a CSV file.
        CONTACT_IMPORT = Post "/contacts/import" Key, limit 16 * 1024 * 1024;
        CONTACT = Get "/contacts/{id}" Key;
        CONTACT_UPDATE = Patch "/contacts/{id}" Key;
        CONTACT_DELETE = Delete "/contacts/{id}" Key;
        SUPPRESSIONS = Get "/suppressions" Key;
        SUPPRESSION_CREATE = Post "/suppressions" Key;
        SUPPRESSION_DELETE = Delete "/suppressions/{email}" Key;
        AUDIENCES = Get "/audiences" Key;
        AUDIENCE_CREATE = Post "/audiences" Key;
        AUDIENCE = Get "/audiences/{id}" Key;
        AUDIENCE_DELETE = Delete "/audiences/{id}" Key;
        CAMPAIGNS = Get "/campaigns" Key;
        CAMPAIGN_CREATE = Post "/campaigns" Key;
        CAMPAIGN = Get "/campaigns/{key}" Key;
        // One-click unsubscribe (RFC 8058): signed tokens, HTML answers.
        TRACKING = Get "/tracking" Key;
        TRACKING_SET = Put "/tracking" Key;
        UNSUBSCRIBE_PAGE = Get "/unsubscribe" Public;
        UNSUBSCRIBE = Post "/unsubscribe" Public;
        // SES notifications through SNS (their SNS signature is checked by the sender).
        // properties up to 64 KiB, other fields and JSON escapes beside them.
        EVENT_REPORT = Post "/events" Key, limit 256 * 1024;
        EVENT = Get "/events/{event_id}" Key;
        WORKFLOWS = Get "/workflows" Key;
        WORKFLOW_CREATE = Post "/workflows" Key;
        WORKFLOW = Get "/workflows/{id}" Key;
        WORKFLOW_UPDATE = Patch "/workflows/{id}" Key;
        WORKFLOW_DELETE = Delete "/workflows/{id}" Key;
        OPERATIONS_OVERVIEW = Get "/operations-overview" Key;
        PROVIDER_EVENTS = Post "/provider-events/esp" ProviderSecret;
    }
}

/// Inbound mail's routes: inbox addresses, the MTA's validate and ingest, threads.
pub mod inbound {
    manifest! {
        ADDRESSES = Get "/inbox/addresses" Key;
        ADDRESS_CREATE = Post "/inbox/addresses" Key;
        ADDRESS_DELETE = Delete "/inbox/addresses/{id}" Key;
        VALIDATE = Post "/inbound-email/validate" InboundSecret;
        // 10 MiB of MIME as base64 (13,981,016 bytes) and the envelope around it.
        INGEST = Post "/inbound-email/ingest" InboundSecret, limit 14 * 1024 * 1024;
        THREADS = Get "/inbox/threads" Key;
        THREAD = Get "/inbox/threads/{id}" Key;
        THREAD_READ = Post "/inbox/threads/{id}/read" Key;
        MESSAGE_RAW = Get "/inbox/messages/{id}/raw" Key;
    }
}

/// The webhook dispatcher's routes: inbox webhook endpoints.
pub mod webhooks {
    manifest! {
        ENDPOINTS = Get "/inbox/webhook/endpoints" Key;
        ENDPOINT_CREATE = Post "/inbox/webhook/endpoints" Key;
        ENDPOINT = Get "/inbox/webhook/endpoints/{id}" Key;
        ENDPOINT_UPDATE = Patch "/inbox/webhook/endpoints/{id}" Key;
        ENDPOINT_DELETE = Delete "/inbox/webhook/endpoints/{id}" Key;
        // Legacy (spec §4.7 rules 4-5): the address's first endpoint, or its oldest.
        ADDRESS_SUBSCRIPTION = Put "/inbox/webhook/addresses/{id}" Key;
        // The workspace's default: mail of addresses without an active endpoint.
        DEFAULT_SET = Put "/inbox/webhook/default" Key;
        DEFAULT = Get "/inbox/webhook/default" Key;
        DEFAULT_DELETE = Delete "/inbox/webhook/default" Key;
        // Deliveries: each (message, endpoint) attempt, retried by hand, replayed, tested.
        ATTEMPTS = Get "/inbox/webhook/endpoints/{id}/attempts" Key;
        ATTEMPT_RETRY = Post "/inbox/webhook/endpoints/{id}/attempts/{attemptId}/retry" Key;
        REPLAY = Post "/inbox/webhook/endpoints/{id}/replay" Key;
        TEST = Post "/inbox/webhook/endpoints/{id}/test" Key;
        // Workspace webhooks: delivery events (and inbound.received), by type.
        WEBHOOKS = Get "/webhooks" Key;
        WEBHOOK_CREATE = Post "/webhooks" Key;
        EVENT_TYPES = Get "/webhooks/event-types" Key;
        WEBHOOK = Get "/webhooks/{id}" Key;
        WEBHOOK_UPDATE = Patch "/webhooks/{id}" Key;
        WEBHOOK_DELETE = Delete "/webhooks/{id}" Key;
        // The same delivery engine and handlers as inbox endpoints'.
        WEBHOOK_ATTEMPTS = Get "/webhooks/{id}/attempts" Key;
        WEBHOOK_ATTEMPT_RETRY = Post "/webhooks/{id}/attempts/{attemptId}/retry" Key;
        WEBHOOK_REPLAY = Post "/webhooks/{id}/replay" Key;
        WEBHOOK_TEST = Post "/webhooks/{id}/test" Key;
    }
}

impl Service {
    /// The HTTP routes the service serves (the gateway's own for [`Service::ApiGateway`]).
    pub const fn routes(self) -> &'static [RouteSpec] {
        match self {
            Service::ApiGateway => gateway::ROUTES,
            Service::Billing => billing::ROUTES,
            Service::Domain => domain::ROUTES,
            Service::Sender => sender::ROUTES,
            Service::InboundIngest => inbound::ROUTES,
            Service::WebhookDispatcher => webhooks::ROUTES,
            // SMTP, not HTTP: its clients reach the API through the gateway like any other.
            Service::SmtpSubmission => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_method_and_path_is_declared_twice() {
        let mut seen = std::collections::HashSet::new();
        for service in Service::ALL {
            for r in service.routes() {
                assert!(
                    seen.insert((r.method, r.path)),
                    "{} {} is declared twice",
                    r.method.as_str(),
                    r.path
                );
            }
        }
        assert!(seen.contains(&(HttpMethod::Get, "/balance")));
        assert_eq!(sender::SEND_EMAIL.body_limit, Some(16 << 20));
        // The ingest route carries 10 MiB of MIME as base64.
        let base64_of_10_mib = (10usize << 20).div_ceil(3) * 4;
        assert!(inbound::INGEST.body_limit.unwrap() > base64_of_10_mib + 4096);
        // A raw send carries 28 MiB of MIME as base64 and 1,000 recipients.
        let base64_of_28_mib = (28usize << 20).div_ceil(3) * 4;
        assert!(sender::SEND_RAW.body_limit.unwrap() > base64_of_28_mib + 1000 * 260);
    }
}
