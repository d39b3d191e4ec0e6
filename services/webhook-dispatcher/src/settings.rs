//! The dispatcher's settings (its rows of `docs/configuration.md`).

use postmesh_shared::settings;

settings! {
    WEBHOOK_ALLOW_INSECURE = "0", "webhook-dispatcher: `1` lets webhooks go to `http://` and private or loopback hosts (local runs and tests; refused with `POSTMESH_ENV=production`, logged at start)";
    WEBHOOK_TIMEOUT_SECS = "15", "webhook-dispatcher: a receiver must answer within this; later is a failure";
    WEBHOOK_RETRY_SCHEDULE = "5,300,1800,7200,18000,36000,36000", "webhook-dispatcher: seconds before each retry of a failed delivery; after the last, the attempt is `failed`";
    WEBHOOK_DISABLE_AFTER_SECS = "432000" shown "`432000` (5 days)", "webhook-dispatcher: an endpoint (or default webhook) whose every delivery failed for this long is disabled";
    WEBHOOK_MAX_BODY_BYTES = "262144", "webhook-dispatcher: a longer `body` is cut (`truncated: true`); at most 393216";
    WEBHOOK_CONCURRENCY = "256" | WEBHOOK_ENDPOINT_CONCURRENCY = "8",
        "webhook-dispatcher: the WEBHOOK worker's deliveries in flight at once (retries, and what the fan-outs' first tries left to it), and deliveries to one endpoint, first tries and worker together (more are handed back, so a slow endpoint never holds up another)";
    WEBHOOK_ACK_WAIT_SECS = "30", "webhook-dispatcher: how long a WEBHOOK job's ack deadline and its attempts' leases last (renewed every half while a POST runs), and an INBOUND or DELIVERY batch's ack deadline (renewed every third while its fan-out runs); a dispatcher that died holding them has its work taken up again this long after; the consumers take a changed value when the dispatcher starts; at least 1";
    WEBHOOK_RETENTION_DAYS = "30", "webhook-dispatcher: finished attempts, stored delivery events and received-message records older than this are deleted by an hourly sweep (attempt listings and replay reach no further back); `0` keeps everything";
    WEBHOOK_REPLAY_MAX = "10000", "webhook-dispatcher: the most deliveries one `POST .../replay` queues, oldest first; beyond it the answer says `truncated: true` (replay from a later `since` for the rest); the same replay asked again while its deliveries wait queues nothing new";
}
