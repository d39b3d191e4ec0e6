//! The sender's routes: sends, their status, templates and SMTP credentials.

use super::HttpMethod::{Delete, Get, Post};
use super::{keyed, Policy, RouteSpec};

/// `POST /send-email`: up to 1000 recipients and 10 MiB of attachments (base64), so 16 MiB.
pub const SEND_EMAIL: RouteSpec = RouteSpec {
    method: Post,
    path: "/send-email",
    policy: Policy::Key,
    body_limit: Some(16 * 1024 * 1024),
};
/// `DELETE /send-email/{task_id}`: cancels a scheduled send.
pub const SEND_CANCEL: RouteSpec = keyed(Delete, "/send-email/{task_id}");
/// `GET /email-status/{task_id}`.
pub const EMAIL_STATUS: RouteSpec = keyed(Get, "/email-status/{task_id}");
/// `POST /templates`.
pub const TEMPLATE_CREATE: RouteSpec = keyed(Post, "/templates");
/// `GET /templates`.
pub const TEMPLATES: RouteSpec = keyed(Get, "/templates");
/// `GET /templates/{key}`.
pub const TEMPLATE: RouteSpec = keyed(Get, "/templates/{key}");
/// `DELETE /templates/{key}`.
pub const TEMPLATE_DELETE: RouteSpec = keyed(Delete, "/templates/{key}");
/// `POST /smtp-auth`.
pub const SMTP_AUTH: RouteSpec = keyed(Post, "/smtp-auth");

/// Every route the sender serves.
pub const ROUTES: &[RouteSpec] = &[
    SEND_EMAIL,
    SEND_CANCEL,
    EMAIL_STATUS,
    TEMPLATE_CREATE,
    TEMPLATES,
    TEMPLATE,
    TEMPLATE_DELETE,
    SMTP_AUTH,
];
