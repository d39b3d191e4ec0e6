//! The gateway's settings (its rows of `docs/configuration.md`), and the bootstrap's.

use postmesh_shared::settings;

settings! {
    DATABASE_ADMIN_URL = "postgres://postgres@127.0.0.1:5432", "`api-gateway bootstrap` only: a role that may CREATEROLE and CREATEDB, to make each service's role and database";
    API_GATEWAY_DATABASE_PASSWORD /
    BILLING_DATABASE_PASSWORD /
    SENDER_DATABASE_PASSWORD /
    DOMAIN_DATABASE_PASSWORD /
    INBOUND_INGEST_DATABASE_PASSWORD /
    WEBHOOK_DISPATCHER_DATABASE_PASSWORD = "" shown "none (required in production)",
        "`api-gateway bootstrap`: the password it gives each service's role; on Kubernetes also the Secret keys each service's `DATABASE_PASSWORD` comes from";
    API_GATEWAY_NATS_PASSWORD /
    BILLING_NATS_PASSWORD /
    SENDER_NATS_PASSWORD /
    DOMAIN_NATS_PASSWORD /
    INBOUND_INGEST_NATS_PASSWORD /
    WEBHOOK_DISPATCHER_NATS_PASSWORD = "" shown "—",
        "Kubernetes: the Secret keys each service's `NATS_PASSWORD` comes from";
    GATEWAY_ADDR = "127.0.0.1:8080", "gateway: the public HTTP listener";
    GATEWAY_BODY_LIMIT = "262144", "gateway: larger bodies get 413 (a route may declare its own limit in its manifest, e.g. `/send-email` 16 MiB, `/inbound-email/ingest` 14 MiB); a declared `Content-Length` over the limit is refused before the body is read";
    KEY_CACHE_TTL_SECS = "30", "gateway: how long a looked-up key is trusted";
    KEY_RATE_PER_SEC = "100" | KEY_RATE_BURST = "300",
        "gateway: requests per API key, and per account (all its keys together), all replicas together; 429 beyond; `0` turns it off";
    ACCOUNT_BODY_BYTES_PER_SEC = "4194304" | ACCOUNT_BODY_BURST_BYTES = "67108864",
        "gateway: bytes of request bodies over 64 KiB an account may send, all replicas together (a body larger than the burst costs the burst); 429 with `Retry-After` beyond, before the body is read when its length is declared; `0` turns it off";
    CODE_SECRET = "dev-code-secret" shown "dev value (required in production)", "gateway: pepper of stored code hashes";
    CODE_COOLDOWN_SECS = "60" | CODE_HOURLY_CAP = "10",
        "gateway: `/send-code` limits per recipient";
    CODE_FROM_EMAIL = "no-reply@postmesh.localhost", "gateway: sender of code emails (verification and login)";
    LOGIN_IP_HOURLY_LIMIT = "30", "gateway: login codes one client IP may ask for an hour (`/login/code`, `/app/login`), and as many code checks (`/verify-code-login`, `/app/login/verify`); 429 with `Retry-After` beyond. Apart from it, an address that entered 5 wrong login codes in an hour (across its codes) is refused with 429 until the hour ends";
    DEVICE_POLL_INTERVAL_SECS = "5", "gateway: seconds a CLI waits between device-login polls (`/cli/auth/poll`); a poll sooner than that (less 250 ms) answers 429 `slow_down`";
    API_KEYS_PER_ACCOUNT = "50", "gateway: live API keys one account may hold; one more is a 403 that names the setting";
    AUTH_FAILURES_PER_IP_PER_MINUTE = "60", "gateway: failed authentications (missing, unknown or wrong keys) one client address (IPv6: its /56) may have in a minute on one replica; past it, 429 with `Retry-After` for the rest of the minute before any key lookup; `0` turns it off";
    GATEWAY_TRUST_FORWARDED_FOR = "0", "gateway: `1` takes the client IP (login limit, device page) from the last `X-Forwarded-For` entry; set it only behind a proxy that appends one";
    INBOUND_SECRET = "" shown "unset (`make run`: `dev-inbound-secret`)", "gateway: what the upstream MTA sends in `x-service-inbound-secret` (compared in constant time); unset makes `/inbound-email/*` answer 503";
    PROVIDER_SECRET = "" shown "unset (`make run`: `dev-provider-secret`)", "gateway: what the mail provider sends in `x-service-provider-secret` on `/provider-events/esp` (constant time); unset makes it answer 503";
    PROVIDER_SECRET_IN_QUERY = "0", "gateway: `1` also takes the secret as `?token=` (for SNS subscriptions, which cannot send headers; access logs keep it, so it is warned at start); otherwise a `token` in the query is a 401";
}
