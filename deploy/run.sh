#!/usr/bin/env bash
# Starts the local dependencies, builds, and runs every service with local defaults until
# Ctrl-C. Logs (JSON) go to the terminal. The gateway listens on 127.0.0.1:8080.
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/deps.sh
cargo build --workspace --bins
bin="${CARGO_TARGET_DIR:-target}/debug"
mkdir -p var/outbox

pids=()
stop() {
  trap - INT TERM EXIT
  [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null || true
  wait || true
}
trap stop INT TERM EXIT

# The upstream MTA's secret for /inbound-email/* (unset, those routes answer 503).
export INBOUND_SECRET="${INBOUND_SECRET:-dev-inbound-secret}"
# The mail provider's secret for /provider-events/esp (unset, that route answers 503).
export PROVIDER_SECRET="${PROVIDER_SECRET:-dev-provider-secret}"
# Signs one-click unsubscribe links (unset, marketing mail has none and /unsubscribe is 503).
export UNSUBSCRIBE_SECRET="${UNSUBSCRIBE_SECRET:-dev-unsubscribe-secret}"
# Signs open and click tracking links (unset, no mail is tracked and /t/* answers 404).
export TRACKING_SECRET="${TRACKING_SECRET:-dev-tracking-secret}"
# Local webhook receivers (http://, localhost) are allowed; never in production.
export WEBHOOK_ALLOW_INSECURE="${WEBHOOK_ALLOW_INSECURE:-1}"

# The SMTP submission service's TLS: a self-signed pair under var/ unless one is given.
if [ -z "${SMTP_TLS_CERT:-}" ]; then
  ./deploy/smtp-cert.sh var/smtp-tls
  export SMTP_TLS_CERT="$PWD/var/smtp-tls/cert.pem" SMTP_TLS_KEY="$PWD/var/smtp-tls/key.pem"
fi

# Each service's PostgreSQL role and database (the services cannot create them).
"$bin/api-gateway" bootstrap

# Services first, then the gateway that forwards to them.
for svc in billing domain inbound-ingest webhook-dispatcher sender api-gateway smtp-submission; do
  "$bin/$svc" &
  pids+=($!)
done
echo "postmesh: gateway on http://127.0.0.1:8080 (web app /app/login), outbox in var/outbox; Ctrl-C stops" >&2
echo "postmesh: SMTP submission on 127.0.0.1:2587 (STARTTLS; user: your account's email, password: an API key)" >&2
echo "postmesh: CLI at $bin/postmesh (postmesh login)" >&2
# If any service exits, stop the rest.
wait -n
