#!/usr/bin/env bash
# A local three-node NATS cluster with JetStream, on loopback, with the users and permissions
# of deploy/nats.conf: what `make soak NATS_CLUSTER=3` runs against.
#
#   nats-cluster.sh start          start the nodes that are not running; wait for a meta leader
#   nats-cluster.sh stop           stop every node (their data stays under var/nats-cluster/)
#   nats-cluster.sh stop-node N    stop node N (1-3) with SIGKILL
#   nats-cluster.sh start-node N   start node N again
#   nats-cluster.sh url            the NATS_URL listing every node
#
# Node N listens for clients on 127.0.0.1:423N, for routes on 623N, serves monitoring
# (/varz, /jsz) on 823N and keeps its JetStream data in var/nats-cluster/nN.
set -euo pipefail
cd "$(dirname "$0")/.."

VAR="$PWD/var/nats-cluster"
NODES=(1 2 3)

log() { echo "nats-cluster: $*" >&2; }

client_port() { echo "423$1"; }
route_port() { echo "623$1"; }
monitor_port() { echo "823$1"; }

url() {
  local urls=()
  for n in "${NODES[@]}"; do urls+=("nats://127.0.0.1:$(client_port "$n")"); done
  (IFS=,; echo "${urls[*]}")
}

pid_of() { cat "$VAR/n$1.pid" 2>/dev/null || true; }

running() {
  local pid
  pid="$(pid_of "$1")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

start_node() {
  local n="$1"
  if running "$n"; then return; fi
  command -v nats-server >/dev/null || { log "nats-server is not installed (deploy/deps.sh installs it)"; exit 1; }
  mkdir -p "$VAR/n$n"
  local routes=()
  for m in "${NODES[@]}"; do
    [ "$m" = "$n" ] || routes+=("nats-route://127.0.0.1:$(route_port "$m")")
  done
  setsid nats-server -c "$PWD/deploy/nats.conf" -n "n$n" -a 127.0.0.1 -p "$(client_port "$n")" \
    -m "$(monitor_port "$n")" -js -sd "$VAR/n$n" --cluster_name postmesh-local \
    --cluster "nats://127.0.0.1:$(route_port "$n")" --routes "$(IFS=,; echo "${routes[*]}")" \
    -P "$VAR/n$n.pid" >>"$VAR/n$n.log" 2>&1 </dev/null &
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$(monitor_port "$n")/varz" >/dev/null 2>&1 && return
    sleep 0.1
  done
  log "node $n did not come up; see $VAR/n$n.log"
  exit 1
}

stop_node() {
  local n="$1" pid
  pid="$(pid_of "$n")"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$VAR/n$n.pid"
}

# Waits until some running node reports a JetStream meta leader.
wait_leader() {
  for _ in $(seq 1 200); do
    for n in "${NODES[@]}"; do
      if running "$n" && curl -sf "http://127.0.0.1:$(monitor_port "$n")/jsz" 2>/dev/null \
        | grep -q '"leader": *"n[0-9]"'; then
        return
      fi
    done
    sleep 0.1
  done
  log "no JetStream meta leader within 20 s"
  exit 1
}

case "${1:-}" in
  start)
    mkdir -p "$VAR"
    for n in "${NODES[@]}"; do start_node "$n"; done
    wait_leader
    log "three nodes up: $(url)"
    ;;
  stop) for n in "${NODES[@]}"; do stop_node "$n"; done ;;
  stop-node) stop_node "${2:?node 1-3}" ;;
  start-node) start_node "${2:?node 1-3}"; wait_leader ;;
  url) url ;;
  *) echo "usage: $0 start|stop|stop-node N|start-node N|url" >&2; exit 2 ;;
esac
