#!/usr/bin/env bash
# Restarts one local dependency in place, keeping its data: `restart-dep.sh postgres|redis|nats`
# (make soak's outage of each). PostgreSQL restarts with pg_ctlcluster or pg_ctl (fast
# shutdown: connections are cut, committed data stays); Redis saves a snapshot on shutdown
# and starts again from it in the same directory; NATS stops with SIGTERM and starts again
# with the command line it ran with (JetStream's file store keeps the streams). Prints how
# long the dependency was away.
set -euo pipefail
cd "$(dirname "$0")/.."

LOG_PREFIX=restart-dep
# shellcheck source=deploy/local.sh
. deploy/local.sh

restart_postgres() {
  local dir bin owner as=()
  dir="$(psql -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -Atc 'SHOW data_directory')"
  if command -v pg_lsclusters >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | awk '{print $3}' | grep -qx "$PG_PORT"; then
    read -r ver name _ < <(pg_lsclusters -h | awk -v p="$PG_PORT" '$3 == p')
    pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" restart -m fast >&2 \
      || pg_ctlcluster "$ver" "$name" restart -m fast >&2
  else
    bin="$(pg_bin)"
    owner="$(stat -c %U "$dir")"
    if [ "$(id -u)" = 0 ] && [ "$owner" != root ]; then as=(runuser -u "$owner" --); fi
    "${as[@]}" "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w restart -m fast >&2
  fi
  wait_for PostgreSQL "$PG_PORT"
  for _ in $(seq 1 150); do
    pg_isready -q -h 127.0.0.1 -p "$PG_PORT" && return 0
    sleep 0.2
  done
  log "PostgreSQL does not accept connections"
  exit 1
}

restart_redis() {
  local dir
  dir="$(redis-cli -p "$REDIS_PORT" config get dir | sed -n 2p)"
  redis-cli -p "$REDIS_PORT" shutdown save >/dev/null 2>&1 || true
  for _ in $(seq 1 100); do listening "$REDIS_PORT" || break; sleep 0.1; done
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$dir" \
    --save "" --appendonly no --logfile "$dir/redis.log" >&2
  wait_for Redis "$REDIS_PORT"
}

restart_nats() {
  local pid cmd=()
  pid="$(cat var/nats/nats.pid 2>/dev/null || true)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || pid="$(pgrep -f "nats-server.* -p $NATS_PORT" | head -n1)"
  [ -n "$pid" ] || { log "no nats-server process on port $NATS_PORT"; exit 1; }
  mapfile -d '' cmd <"/proc/$pid/cmdline"
  kill -TERM "$pid"
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  mkdir -p var/nats
  setsid "${cmd[@]}" >>var/nats/nats.log 2>&1 </dev/null &
  wait_for NATS "$NATS_PORT"
}

start=$(date +%s%N)
case "${1:-}" in
  postgres) restart_postgres ;;
  redis) restart_redis ;;
  nats) restart_nats ;;
  *) echo "usage: $0 postgres|redis|nats" >&2; exit 2 ;;
esac
log "$1 back after $(( ($(date +%s%N) - start) / 1000000 )) ms"
