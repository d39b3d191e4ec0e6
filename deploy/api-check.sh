#!/usr/bin/env bash
# The API against its own document: starts every service (namespace `apicheck`, the gateway
# on 127.0.0.1:18080, admin ports 19090-19095) and runs schemathesis over every operation of
# /openapi.json with an API key. Fails on any 5xx and on any answer the document does not
# allow (status code, content type, schema, headers). Stripe's API is the tests' fake
# (`fake_stripe`). The mail provider's secret goes with
# every call, so its route is fuzzed too; the MTA's does not: an ingest without the MTA's
# authentication results is a 503 by design (the MTA retries), which the 5xx check refuses. schemathesis is installed with pip
# into the tools cache outside the checkout when missing (deploy/pytool.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/deps.sh
# shellcheck source=deploy/pytool.sh
. deploy/pytool.sh
pytool schemathesis "${SCHEMATHESIS_VERSION:-4.32.5}"
st="$PYTOOL_BIN/schemathesis"
cargo build -q --workspace --bins
bin="${CARGO_TARGET_DIR:-target}/debug"
mkdir -p var/outbox

# No rate limit in the way: the key's far above what schemathesis sends, and the per-address
# limit of failed authentications (its requests without a key count) off. An answer then
# depends on the request, not on how fast the machine ran the ones before it: 429s had
# left 92 operations untested and made the stateful phase's path differ from run to run.
export POSTMESH_NAMESPACE=apicheck RUST_LOG=error GATEWAY_ADDR=127.0.0.1:18080
export KEY_RATE_PER_SEC=100000 KEY_RATE_BURST=100000 AUTH_FAILURES_PER_IP_PER_MINUTE=0
export INBOUND_SECRET=apicheck-inbound PROVIDER_SECRET=apicheck-provider
export UNSUBSCRIBE_SECRET=apicheck-unsubscribe WEBHOOK_ALLOW_INSECURE=1
export TRACKING_SECRET=apicheck-tracking
# Configured, so its route checks signatures (unset, it is 503 by design).
export STRIPE_WEBHOOK_SECRET=whsec_apicheck
pids=()
stop() { [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null || true; wait || true; }
trap stop EXIT
# Stripe's API is the tests' strict fake (unset, top-ups and plans are 503 by design).
rm -f var/fake-stripe.url
"$bin/fake_stripe" > var/fake-stripe.url &
pids+=($!)
for _ in $(seq 1 100); do [ -s var/fake-stripe.url ] && break; sleep 0.1; done
STRIPE_API_BASE="$(head -1 var/fake-stripe.url)"
[ -n "$STRIPE_API_BASE" ] || { echo "api-check: the fake Stripe did not start" >&2; exit 1; }
export STRIPE_API_BASE STRIPE_SECRET_KEY=sk_test_postmesh_fake

"$bin/api-gateway" bootstrap

port=19090
for svc in billing domain inbound-ingest webhook-dispatcher sender api-gateway; do
  ADMIN_ADDR="127.0.0.1:$port" "$bin/$svc" &
  pids+=($!)
  port=$((port + 1))
done
for port in 19090 19091 19092 19093 19094 19095; do
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
    sleep 0.5
  done
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { echo "api-check: admin port $port not ready" >&2; exit 1; }
done
key="$("$bin/api-gateway" create-key --email "apicheck-$(date +%s%N)@example.com" --credits 100000 | tail -1)"
check() {
  "$st" run http://127.0.0.1:18080/openapi.json \
    -H "Authorization: Bearer $key" \
    -H "x-service-provider-secret: $PROVIDER_SECRET" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
    --max-examples 20 --seed 1 --no-color 2>&1 | tee var/api-check.log
  return "${PIPESTATUS[0]}"
}
# A run that failed only because schemathesis could not generate a case ("Schema Error":
# in its stateful phase, a value a link carries that an array parameter's schema cannot
# place; seen once in CI with every case passing) says nothing of the API: it runs once more.
# Any failed check fails at once.
if ! check; then
  grep -q 'Schema Error' var/api-check.log && ! grep -q 'FAILURES' var/api-check.log \
    && grep -qE '^ *([0-9]+) generated, \1 passed$' var/api-check.log || exit 1
  echo "api-check: schemathesis could not generate a case and no check failed; once more" >&2
  check
fi

