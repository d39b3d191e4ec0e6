#!/usr/bin/env bash
# A local three-node NATS cluster with JetStream, on loopback, with the users and permissions
# of deploy/nats.conf: what `make soak NATS_CLUSTER=3` runs against.
#
#   nats-cluster.sh start          start the nodes that are not running; wait until each is current with the meta leader
#   nats-cluster.sh stop           stop every node (their data stays under var/nats-cluster/)
#   nats-cluster.sh clean          stop every node and remove its data: the next start forms a new cluster
#   nats-cluster.sh stop-node N    stop node N (1-3) with SIGKILL
#   nats-cluster.sh start-node N   start node N again
#   nats-cluster.sh url            the NATS_URL listing every node
#   nats-cluster.sh partition S    cuts node 3 off from the other two and from every client
#                                  for S seconds, then heals it
#
# Node N listens for clients on 423N, for routes on 623N, serves monitoring (/varz, /jsz)
# on 823N and keeps its JetStream data in var/nats-cluster/nN. Nodes 1 and 2 listen on
# 127.0.0.1; node 3 runs in a network namespace of its own (pm-nats3), joined to this one by
# a veth pair (10.231.0.1 here, 10.231.0.2 there), so that taking its end of the pair down
# partitions it. Making the namespace needs root; without it node 3 listens on 127.0.0.1
# too and `partition` refuses.
set -euo pipefail
cd "$(dirname "$0")/.."

VAR="$PWD/var/nats-cluster"
NODES=(1 2 3)

log() { echo "nats-cluster: $*" >&2; }

NETNS=pm-nats3
HOST_IP=10.231.0.1
NODE3_IP=10.231.0.2

# Node 3's namespace and its veth pair, unless they are there; false when they cannot be.
ensure_netns() {
  if ip netns list 2>/dev/null | grep -qw "$NETNS"; then return 0; fi
  [ "$(id -u)" = 0 ] || return 1
  ip netns add "$NETNS" 2>/dev/null || return 1
  ip link add pm-nats3h type veth peer name pm-nats3n &&
    ip link set pm-nats3n netns "$NETNS" &&
    ip addr add "$HOST_IP/24" dev pm-nats3h && ip link set pm-nats3h up &&
    ip netns exec "$NETNS" ip addr add "$NODE3_IP/24" dev pm-nats3n &&
    ip netns exec "$NETNS" ip link set pm-nats3n up &&
    ip netns exec "$NETNS" ip link set lo up || { ip netns del "$NETNS"; return 1; }
}

isolated() { ip netns list 2>/dev/null | grep -qw "$NETNS"; }

# The address node N is reached at, by clients and by the other nodes.
addr() { if [ "$1" = 3 ] && isolated; then echo "$NODE3_IP"; else echo 127.0.0.1; fi; }
# Where nodes reach each other's routes: through the pair when node 3 is isolated.
route_addr() {
  if ! isolated; then echo 127.0.0.1; elif [ "$1" = 3 ]; then echo "$NODE3_IP"; else echo "$HOST_IP"; fi
}

client_port() { echo "423$1"; }
route_port() { echo "623$1"; }
monitor_port() { echo "823$1"; }

url() {
  local urls=()
  for n in "${NODES[@]}"; do urls+=("nats://$(addr "$n"):$(client_port "$n")"); done
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
  local bin
  bin="$(deploy/nats-bin.sh)"
  if running "$n"; then
    # A node left by an earlier run of another nats-server is started again as this one.
    [ "$(readlink "/proc/$(pid_of "$n")/exe" 2>/dev/null)" = "$(command -v "$bin")" ] && return
    log "node $n runs another nats-server: restarting it"
    stop_node "$n"
  fi
  command -v "$bin" >/dev/null || { log "nats-server is not installed (deploy/deps.sh installs it)"; exit 1; }
  mkdir -p "$VAR/n$n"
  local routes=() run=() listen
  for m in "${NODES[@]}"; do
    [ "$m" = "$n" ] || routes+=("nats-route://$(route_addr "$m"):$(route_port "$m")")
  done
  # Nodes 1 and 2 take routes on every address (node 3 comes through the pair).
  listen="$(route_addr "$n")"
  [ "$listen" = "$HOST_IP" ] && listen=0.0.0.0
  if [ "$n" = 3 ] && isolated; then run=(ip netns exec "$NETNS"); fi
  setsid "${run[@]}" "$bin" -c "$PWD/deploy/nats.conf" -n "n$n" -a "$(addr "$n")" \
    -p "$(client_port "$n")" -m "$(monitor_port "$n")" -js -sd "$VAR/n$n" \
    --cluster_name postmesh-local --cluster "nats://$listen:$(route_port "$n")" \
    --cluster_advertise "$(route_addr "$n"):$(route_port "$n")" \
    --routes "$(IFS=,; echo "${routes[*]}")" \
    -P "$VAR/n$n.pid" >>"$VAR/n$n.log" 2>&1 </dev/null &
  for _ in $(seq 1 100); do
    curl -sf "http://$(addr "$n"):$(monitor_port "$n")/varz" >/dev/null 2>&1 && return
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

# Whether node $1 is healthy. A consumer it reports "not found" is an ephemeral one (a KV
# watch of a killed service) deleted while the node was away: nats-server 2.9 keeps
# reporting its assignment for good, and waiting cannot bring it current.
healthy() {
  local body
  body="$(curl -s "http://$(addr "$1"):$(monitor_port "$1")/healthz" 2>/dev/null)" || return 1
  case "$body" in
    *'"status":"ok"'*) return 0 ;;
    *'is not current: consumer not found'*) return 0 ;;
    *) return 1 ;;
  esac
}

# Waits until every running node is healthy: in contact with a JetStream meta leader and
# current with it, so that a stream of three replicas finds its three peers. A node back
# from a kill under load may take tens of seconds to bring each of its consumers current.
wait_leader() {
  for _ in $(seq 1 600); do
    local all=1
    for n in "${NODES[@]}"; do
      if running "$n" && ! healthy "$n"; then
        all=0
      fi
    done
    [ "$all" = 1 ] && return
    sleep 0.1
  done
  log "the nodes were not all healthy within 60 s"
  for n in "${NODES[@]}"; do
    running "$n" || continue
    log "node $n /healthz: $(curl -s "http://$(addr "$n"):$(monitor_port "$n")/healthz" 2>&1)"
    grep -v "Healthcheck failed" "$VAR/n$n.log" | tail -n 15 | sed "s/^/  n$n: /" >&2
  done
  exit 1
}

case "${1:-}" in
  start)
    mkdir -p "$VAR"
    ensure_netns || log "no network namespace (needs root): node 3 on 127.0.0.1, no partition"
    for n in "${NODES[@]}"; do start_node "$n"; done
    wait_leader
    log "three nodes up: $(url)"
    ;;
  stop) for n in "${NODES[@]}"; do stop_node "$n"; done ;;
  clean) for n in "${NODES[@]}"; do stop_node "$n"; rm -rf "${VAR:?}/n$n"; done ;;
  stop-node) stop_node "${2:?node 1-3}" ;;
  start-node) start_node "${2:?node 1-3}"; wait_leader ;;
  url) url ;;
  partition)
    isolated || { log "node 3 is not in a namespace of its own: no partition here"; exit 1; }
    ip netns exec "$NETNS" ip link set pm-nats3n down
    sleep "${2:?seconds}"
    ip netns exec "$NETNS" ip link set pm-nats3n up
    wait_leader
    ;;
  can-partition) isolated ;;
  *) echo "usage: $0 start|stop|clean|stop-node N|start-node N|url|partition S|can-partition" >&2; exit 2 ;;
esac
