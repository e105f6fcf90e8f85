#!/usr/bin/env bash
# A real multi-node Ray cluster on this machine, with token authentication:
# one head and N worker nodes, each its own `ray start` (own raylet, object
# store and CPUs), so a simulation spreads its actors over several nodes as
# on a cluster of machines. For trying `--address` and the cluster code
# paths; a cluster of one machine is no faster than a plain local Ray.
#
#   cluster/local.sh up [N]   start a head and N worker nodes (default 1)
#   cluster/local.sh status   the nodes and their resources
#   cluster/local.sh kill-node I   SIGKILL worker node I (0: the head) whole, every
#                             process of it at once, as when a machine vanishes
#   cluster/local.sh down     stop every process this script started
#
# Each node runs in its own session (setsid), led by its `ray start --block`: its
# raylet, agents and workers (which Ray puts in process groups of their own) all keep
# that session, so signalling the session's processes reaches all of the node, and
# nothing else.
#
# Settings (environment variables):
#   PERFED_CLUSTER_DIR     state, logs and Ray's session files (default /tmp/perfed-ray-cluster;
#                          keep it short: Ray's Unix sockets live under it)
#   PERFED_CLUSTER_PORT    the head's GCS port (default 6390); the Ray Client server takes
#                          PORT+1, the dashboard PORT+2, node i's dashboard agent PORT+10+i
#   PERFED_CLUSTER_CPUS    CPUs each node declares (default 1)
#   PERFED_CLUSTER_OBJECT_STORE_BYTES   each node's object store (default 500000000)
#   RAY_health_check_period_ms, RAY_health_check_timeout_ms,
#   RAY_health_check_failure_threshold   how soon the head declares a silent node dead
#                          (Ray's defaults: 3000, 10000, 5); read by the head as it starts
#   RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token   the cluster's token, in Ray's
#                          order; when none is set, `ray get-auth-token --generate` makes
#                          ~/.ray/auth_token (readable by you only)
#
# The dashboard listens on 127.0.0.1 only; Ray's other ports (GCS, Ray Client,
# raylets) listen on this machine's address, as always, and refuse any client
# without the token.
set -euo pipefail

DIR=${PERFED_CLUSTER_DIR:-/tmp/perfed-ray-cluster}
PORT=${PERFED_CLUSTER_PORT:-6390}
CPUS=${PERFED_CLUSTER_CPUS:-1}
OBJECT_STORE=${PERFED_CLUSTER_OBJECT_STORE_BYTES:-500000000}
READY_TIMEOUT_S=120

# Token authentication on every node and for every client started from here.
export RAY_AUTH_MODE=token
# A stopped node exits at once: nothing on a local test cluster needs draining.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0

die() { echo "local.sh: $*" >&2; exit 1; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# kill_session SIGNAL SID: signal every process of session SID (a node, all of it).
kill_session() {
  ps -eo pid=,sid= | awk -v s="$2" '$2 == s {print $1}' | xargs -r kill "-$1" 2>/dev/null || true
}

ensure_token() {
  if [ -n "${RAY_AUTH_TOKEN:-}" ]; then
    echo "token: \$RAY_AUTH_TOKEN"
  elif [ -n "${RAY_AUTH_TOKEN_PATH:-}" ]; then
    [ -s "$RAY_AUTH_TOKEN_PATH" ] || die "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH is empty or missing"
    echo "token: $RAY_AUTH_TOKEN_PATH"
  else
    if [ ! -s "$HOME/.ray/auth_token" ]; then
      (umask 077 && ray get-auth-token --generate >/dev/null 2>&1) \
        || die "could not generate a token with 'ray get-auth-token --generate'"
    fi
    echo "token: $HOME/.ray/auth_token"
  fi
}

# start_node NAME ARGS...: one `ray start --block` in the background, in a session of its
# own (so its pid is its process group's id), its pid in $DIR/pids.
start_node() {
  local name=$1; shift
  nohup setsid ray start --block --num-cpus="$CPUS" --num-gpus=0 \
    --object-store-memory="$OBJECT_STORE" --temp-dir="$DIR/ray" --disable-usage-stats \
    "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo "$! $name" >>"$DIR/pids"
}

# wait_started NAME: until the node's log says it runs; fails if its process died.
wait_started() {
  local name=$1 pid
  pid=$(awk -v n="$name" '$2 == n {print $1}' "$DIR/pids")
  for _ in $(seq "$READY_TIMEOUT_S"); do
    grep -q "Ray runtime started" "$DIR/$name.log" 2>/dev/null && return 0
    alive "$pid" || { tail -n 20 "$DIR/$name.log" >&2; return 1; }
    sleep 1
  done
  echo "local.sh: $name did not start within ${READY_TIMEOUT_S}s; see $DIR/$name.log" >&2
  return 1
}

# active_nodes: how many nodes the head counts as alive.
active_nodes() {
  ray status --address "127.0.0.1:$PORT" 2>/dev/null | grep -c '^ *1 node_' || true
}

up() {
  local workers=${1:-1}
  [[ "$workers" =~ ^[0-9]+$ ]] || die "usage: local.sh up [NUMBER_OF_WORKER_NODES]"
  if [ -f "$DIR/pids" ]; then
    while read -r pid _; do
      alive "$pid" && die "a cluster from $DIR is running; 'local.sh down' first"
    done <"$DIR/pids"
  fi
  command -v ray >/dev/null || die "'ray' is not on PATH: activate the environment where perfed-ray is installed"
  mkdir -p "$DIR"
  rm -rf "$DIR/ray" "$DIR"/*.log
  ensure_token
  trap 'echo "local.sh: start failed; stopping what was started" >&2; down >&2' ERR
  start_node head --head --port="$PORT" --ray-client-server-port=$((PORT + 1)) \
    --dashboard-host=127.0.0.1 --dashboard-port=$((PORT + 2)) \
    --dashboard-agent-listen-port=$((PORT + 10))
  wait_started head
  # One node after the other: nodes starting together on one machine can draw the same
  # free port for their raylets. One log monitor per machine is enough: the head's.
  for i in $(seq "$workers"); do
    start_node "worker$i" --address="127.0.0.1:$PORT" \
      --dashboard-agent-listen-port=$((PORT + 10 + i)) --include-log-monitor=False
    wait_started "worker$i"
  done
  for _ in $(seq "$READY_TIMEOUT_S"); do
    [ "$(active_nodes)" -ge $((workers + 1)) ] && break
    sleep 1
  done
  [ "$(active_nodes)" -ge $((workers + 1)) ] || { echo "local.sh: not every node joined" >&2; false; }
  trap - ERR
  cat <<EOF
Ray cluster up: a head and $workers worker node(s), $CPUS CPU(s) each, token authentication on.
  address    127.0.0.1:$PORT  (Ray Client: ray://127.0.0.1:$((PORT + 1)))
  dashboard  http://127.0.0.1:$((PORT + 2))  (this machine only)
  logs       $DIR/*.log
Run a simulation on it (this shell needs RAY_AUTH_MODE=token and the token too):
  export RAY_AUTH_MODE=token
  perfed-ray run CONFIG.yaml --address 127.0.0.1:$PORT
Stop it:
  cluster/local.sh down
EOF
}

down() {
  [ -f "$DIR/pids" ] || { echo "no cluster started from $DIR"; return 0; }
  # Workers first, the head last; `ray start --block` stops its node's processes on SIGTERM.
  local pids
  pids=$(awk '{pid[NR] = $1} END {for (i = NR; i > 0; i--) print pid[i]}' "$DIR/pids")
  for pid in $pids; do alive "$pid" && kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 30); do
    local left=0
    for pid in $pids; do alive "$pid" && left=1; done
    [ "$left" -eq 0 ] && break
    sleep 1
  done
  # Whatever is left in each node's session (its `ray start --block` may itself be
  # gone): raylets, agents, workers.
  for pid in $pids; do kill_session KILL "$pid"; done
  rm -f "$DIR/pids"
  echo "Ray cluster from $DIR stopped"
}

kill_node() {
  local i=${1:-} name pid
  [[ "$i" =~ ^[0-9]+$ ]] || die "usage: local.sh kill-node I (0: the head, I: worker I)"
  [ -f "$DIR/pids" ] || die "no cluster started from $DIR"
  name=$([ "$i" -eq 0 ] && echo head || echo "worker$i")
  pid=$(awk -v n="$name" '$2 == n {print $1}' "$DIR/pids")
  [ -n "$pid" ] || die "no node $name in $DIR/pids"
  ps -o pid= -s "$pid" >/dev/null || die "$name (session $pid) is not running"
  kill_session KILL "$pid"
  echo "killed $name (session $pid)"
}

status() {
  [ -f "$DIR/pids" ] || { echo "no cluster started from $DIR"; return 0; }
  while read -r pid name; do
    if alive "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: stopped"; fi
  done <"$DIR/pids"
  ray status --address "127.0.0.1:$PORT"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  kill-node) shift; kill_node "$@" ;;
  status) status ;;
  *) die "usage: local.sh up [N] | status | kill-node I | down" ;;
esac
