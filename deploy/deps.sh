#!/usr/bin/env bash
# Makes PostgreSQL and Redis reachable on their local default ports, and Postmesh's own NATS
# (JetStream, the users of deploy/nats.conf) on 127.0.0.1:4223.
# A server that already answers is left alone. A missing one is started: an existing Debian
# PostgreSQL cluster is started in place; otherwise data lives under var/. Missing programs
# are installed from Debian's packages when running as root.
set -euo pipefail

cd "$(dirname "$0")/.."
VAR="$PWD/var"
mkdir -p "$VAR"

LOG_PREFIX=deps
# shellcheck source=deploy/local.sh
. deploy/local.sh

apt_updated=0
apt_install() { # package...
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}
ensure_package() { # command package
  if command -v "$1" >/dev/null 2>&1 || [ -x "$1" ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    log "$1 is missing; install the Debian package $2 (or run as root)"
    exit 1
  fi
  log "installing $2"
  apt_install "$2"
}

start_postgres() {
  if listening "$PG_PORT"; then return 0; fi
  if [ -z "$(pg_bin)" ]; then ensure_package pg_ctlcluster postgresql; fi
  if command -v pg_lsclusters >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | awk '{print $3}' | grep -qx "$PG_PORT"; then
    read -r ver name _ < <(pg_lsclusters -h | awk -v p="$PG_PORT" '$3 == p')
    log "starting PostgreSQL cluster $ver/$name"
    pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2 || pg_ctlcluster "$ver" "$name" start >&2
  else
    local bin data="$VAR/postgres" as=()
    bin="$(pg_bin)"
    if [ "$(id -u)" = 0 ]; then as=(runuser -u postgres --); fi
    if [ ! -s "$data/PG_VERSION" ]; then
      log "creating a PostgreSQL data directory in $data"
      mkdir -p "$data"
      [ "$(id -u)" = 0 ] && chown postgres: "$data"
      "${as[@]}" "$bin/initdb" -D "$data" -U postgres --auth=trust >&2
    fi
    log "starting PostgreSQL from $data"
    "${as[@]}" "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $data -c max_connections=300" start >&2
  fi
  wait_for PostgreSQL "$PG_PORT"
  if command -v pg_isready >/dev/null 2>&1; then
    for _ in $(seq 1 100); do
      pg_isready -q -h 127.0.0.1 -p "$PG_PORT" && return 0
      sleep 0.2
    done
  fi
}

start_redis() {
  if listening "$REDIS_PORT"; then return 0; fi
  ensure_package redis-server redis-server
  mkdir -p "$VAR/redis"
  log "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$VAR/redis" \
    --save "" --appendonly no --logfile "$VAR/redis/redis.log" >&2
  wait_for Redis "$REDIS_PORT"
}

# The version a NATS server on `port` announces in its INFO line (empty when none answers).
nats_version() { # port
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && head -n 1 <&3" 2>/dev/null |
    grep -o '"version":"[^"]*"' | cut -d'"' -f4 || true
}

# The hash of the deploy/nats.conf the server on :NATS_PORT was started with, kept outside
# the checkout: a clean clone (CI) finds a server another checkout started, and restarts it
# when its permissions are not this checkout's.
NATS_CONF_RECORD="${XDG_CACHE_HOME:-$HOME/.cache}/postmesh-nats/port-$NATS_PORT.conf.sha256"

start_nats() {
  local conf_sum bin want pid
  conf_sum="$(sha256sum deploy/nats.conf | cut -d' ' -f1)"
  bin="$(deploy/nats-bin.sh)"
  if [ "$bin" = nats-server ]; then ensure_package nats-server nats-server; fi
  want="$("$bin" --version | sed 's/.* v//')"
  if listening "$NATS_PORT"; then
    # One started with another deploy/nats.conf (by any checkout, or by hand) restarts, so
    # changed permissions take effect (a reload cannot: the storage directory is given on
    # the command line); one of another version than deploy/nats-bin.sh's restarts as that
    # version.
    local running
    running="$(nats_version "$NATS_PORT")"
    if [ -n "$running" ] && [ "$running" != "$want" ]; then
      log "NATS $running answers on :$NATS_PORT: restarting it as $want"
    elif [ "$(cat "$NATS_CONF_RECORD" 2>/dev/null)" != "$conf_sum" ]; then
      log "NATS on :$NATS_PORT was not started with this deploy/nats.conf: restarting it"
    else
      return 0
    fi
    pid="$(cat "$VAR/nats/nats.pid" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || pid="$(pgrep -f "nats-server.* -p $NATS_PORT" | head -n1 || true)"
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do listening "$NATS_PORT" || break; sleep 0.1; done
  fi
  mkdir -p "$VAR/nats"
  log "starting NATS $want with JetStream and the users of deploy/nats.conf"
  setsid "$bin" -c "$PWD/deploy/nats.conf" -a 127.0.0.1 -p "$NATS_PORT" -sd "$VAR/nats" \
    -P "$VAR/nats/nats.pid" >"$VAR/nats/nats.log" 2>&1 < /dev/null &
  mkdir -p "$(dirname "$NATS_CONF_RECORD")"
  echo "$conf_sum" > "$NATS_CONF_RECORD"
  wait_for NATS "$NATS_PORT"
}

# The browser test's headless Chromium and its WebDriver, with WITH_BROWSER=1 (`make test`).
# Optional: without root they are not installed and the test says loudly that it skipped.
install_browser() {
  if [ "${WITH_BROWSER:-0}" != 1 ]; then return 0; fi
  if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then return 0; fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "chromium/chromium-driver missing and not root: the browser test will be skipped"
    return 0
  fi
  log "installing chromium and chromium-driver (browser test)"
  apt_install chromium chromium-driver fonts-dejavu-core \
    || log "could not install chromium: the browser test will be skipped"
}

start_postgres
start_redis
start_nats
install_browser
# The SMTP submission service's local TLS pair (deploy/smtp-cert.sh) is made with openssl.
ensure_package openssl openssl
log "PostgreSQL :$PG_PORT, Redis :$REDIS_PORT, NATS :$NATS_PORT are up"
