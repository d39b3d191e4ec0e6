# Sourced by deps.sh and restart-dep.sh: the local ports of PostgreSQL, Redis and NATS, and
# how to wait for one. The sourcing script sets LOG_PREFIX first.
PG_PORT=${PG_PORT:-5432}
REDIS_PORT=${REDIS_PORT:-6379}
# Postmesh runs a NATS of its own (deploy/nats.conf: users and permissions per service), on
# 4223 so that a NATS already on the standard port is left alone.
NATS_PORT=${NATS_PORT:-4223}

log() { echo "$LOG_PREFIX: $*" >&2; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name port: up to 30 s
  for _ in $(seq 1 150); do
    if listening "$2"; then return 0; fi
    sleep 0.2
  done
  log "$1 did not come up on port $2"
  return 1
}

pg_bin() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1
}
