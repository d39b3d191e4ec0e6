//! The sender's settings (its rows of `docs/configuration.md`).

use postmesh_shared::settings;

settings! {
    SNS_URL_PATTERN = r"^https://sns\.[a-z]{2}(-gov)?-[a-z]+-[0-9]+\.amazonaws\.com(\.cn)?/", "sender: what an SNS message's `SigningCertURL` and `SubscribeURL` must match before anything is fetched (else 400): SNS's regional hosts, not an S3 bucket's (`sns.s3-…`)";
    SNS_TOPIC_ARNS = "" shown "empty (any; in production none: `/provider-events/esp` answers 503)", "sender: comma list of the SNS topics whose notifications are taken (others 400)";
    SEND_TRANSPORT = "file", "sender: `file`, `smtp` or `ses` (SES v2 `SendEmail`, raw MIME)";
    OUTBOX_DIR = "var/outbox", "sender: where `file` writes `.eml` files";
    SMTP_URL = "smtp://127.0.0.1:25", "sender: lettre relay URL, e.g. `smtps://user:pass@host:465`";
    SEND_ACK_WAIT_SECS = "30" | SEND_MAX_DELIVER = "20" | SEND_RETRY_BASE_SECS = "5" | SEND_CONCURRENCY = "16",
        "sender: redelivery and retry schedule (a message failing for a passing reason is tried `SEND_MAX_DELIVER` times, `SEND_RETRY_BASE_SECS` apart doubling to 15 minutes: about 3 hours by default, so a provider outage that long fails no mail); messages in the transport's hands at once";
    SANDBOX_DOMAIN = "sandbox.postmesh.test", "sender: the sandbox domain: `delivered@`, `bounced@`, `complained@`, `delayed@` and `suppressed@` it (with an optional `+label`) are never handed to a transport, cost nothing and behave at once as their names say; other local parts are a 400";
    MESSAGE_ID_DOMAIN = "postmesh.localhost", "sender: domain of the Message-IDs it makes (`<delivery id@domain>`)";
    SEND_DEFAULT_FROM = "no-reply@postmesh.localhost", "sender: from-address of a `/send-email` without `fromEmail`";
    SEND_SCHEDULE_POLL_SECS = "1", "sender: how often the scheduler releases due scheduled sends and the workflow timer pass takes due runs";
    UNSUBSCRIBE_SECRET = "" shown "unset (`make run`: `dev-unsubscribe-secret`)", "sender: signs one-click unsubscribe tokens (HMAC-SHA256); unset, marketing and lifecycle mail has no `List-Unsubscribe` and `/unsubscribe` answers 503";
    UNSUBSCRIBE_TOKEN_DAYS = "60", "sender: how long an unsubscribe link works";
    TRACKING_SCANNER_WINDOW_SECS = "5", "sender: a click this soon after its message was sent, with no open before it, is a link scanner's (`machine: true`)";
    EMAIL_RETENTION_DAYS = "30", "sender: days after a send's release (or cancellation) that its deliveries and their events (the message log), attachments, raw message and tags are purged; a scheduled send keeps them until then; at least 1";
    AUDIENCE_MAX_RECIPIENTS = "100000", "sender: contacts an audience or campaign send may reach at most (more is a 400)";
    TEMPLATES_PER_WORKSPACE = "1000" | AUDIENCES_PER_WORKSPACE = "200" | WORKFLOWS_PER_WORKSPACE = "200",
        "sender: what one workspace may hold (a template keeps at most 100 versions); one more is a 403 that names the setting";
}
