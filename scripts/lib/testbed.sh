# shellcheck shell=bash
# Shell helpers to run agents in a testbed (scripts/testbed.sh up); sourced by scripts
# and tests. Uses scripts/lib/agents.sh (sourced here if it is not yet): pids,
# stop_agents, field. Needs $agent (the fuselink-agent binary).
#
# testbed_load NAME [STATE]      reads the testbed's testbed.env: TESTBED_NAME,
#                                TESTBED_STATE, TESTBED_NODES, TESTBED_RAILS,
#                                TESTBED_RATE(_BYTES_PER_S), TESTBED_NS_<i>,
#                                TESTBED_MGMT_<i>, TESTBED_TOPOLOGY_<i>, ...
# testbed_ns I / testbed_mgmt I  node I's namespace / management address
# testbed_start_agent I NODE [PEER [EXTRA FLAGS...]]
#     starts agent NODE in node I's namespace with node I's topology, gRPC and
#     metrics on its management address (the kernel picks the ports), its handle
#     socket, ready file (NODE.json: grpc, metrics, handle_socket) and log
#     (NODE.log) in the state folder, and PEER (name=host:port[,...]) if given;
#     waits until it serves and appends its pid to pids. The handle socket is a
#     path: processes in the root namespace reach it, and pass memfds through it.
#     With mutual TLS (pki_init, scripts/lib/agents.sh) its certificate also names
#     the management address.
# testbed_exec I COMMAND...      runs COMMAND in node I's namespace.

if ! declare -F launch_agent >/dev/null; then
  # shellcheck source=scripts/lib/agents.sh
  . "$(dirname "${BASH_SOURCE[0]}")/agents.sh"
fi

testbed_load() {
  local env="${2:-/tmp/fuselink-testbed/$1}/testbed.env"
  if [ ! -f "$env" ]; then
    echo "testbed $1 is not up ($env is missing)" >&2
    return 1
  fi
  # shellcheck source=/dev/null
  . "$env"
}

testbed_var() {
  local v="TESTBED_$1_$2"
  if [ -z "${!v:-}" ]; then
    echo "testbed ${TESTBED_NAME:-?}: no node $2" >&2
    return 1
  fi
  printf '%s\n' "${!v}"
}
testbed_ns() { testbed_var NS "$1"; }
testbed_mgmt() { testbed_var MGMT "$1"; }
# testbed_peers I N PREFIX PORT: an agent's --peer value on node I of N: every other
# node J as PREFIX-nJ at its management address and PORT.
testbed_peers() {
  local j peers=""
  for ((j = 0; j < $2; j++)); do
    [ "$j" -eq "$1" ] || peers="$peers${peers:+,}$3-n$j=$(testbed_mgmt "$j"):$4"
  done
  echo "$peers"
}

testbed_exec() {
  local ns
  ns=$(testbed_ns "$1") || return 1
  shift
  ip netns exec "$ns" "$@"
}

testbed_start_agent() {
  local i=$1 name=$2 peer=${3:-} ns mgmt topology
  shift $(($# < 3 ? $# : 3))
  ns=$(testbed_ns "$i") || return 1
  mgmt=$(testbed_mgmt "$i") || return 1
  topology=$(testbed_var TOPOLOGY "$i") || return 1
  # Clients dial the management address: the agent's certificate names it.
  local agent_prefix=(ip netns exec "$ns") agent_dir=$TESTBED_STATE
  local agent_sans=("IP:$mgmt")
  launch_agent "$name" --topology="$topology" --listen="$mgmt:0" \
    --metrics_listen="$mgmt:0" ${peer:+--peer="$peer"} "$@"
}

# testbed_require: returns when this machine can host a testbed; otherwise exits 77
# (a test's skip) saying why, or 1 when the check itself failed.
testbed_require() {
  local reason rc=0
  reason=$("$(dirname "${BASH_SOURCE[0]}")/../testbed.sh" check 2>&1) || rc=$?
  [ "$rc" -eq 0 ] && return 0
  if [ "$rc" -eq 77 ]; then
    echo "SKIP: $reason"
    exit 77
  fi
  echo "FAIL: testbed check: $reason" >&2
  exit 1
}

# testbed_test_start PREFIX: the start of a test on a testbed. Exits 77 (a skip,
# saying why) where this machine cannot host one; else names the test's testbed
# PREFIX<pid> ($name), sets $tb to scripts/testbed.sh and takes the testbed down when
# the script exits (testbed_down_on_exit).
testbed_test_start() {
  testbed_require
  # shellcheck disable=SC2034  # the result, read by the caller
  tb="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/testbed.sh"
  name="$1$$"
  testbed_down_on_exit "$name"
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# testbed_down_on_exit NAME: when the script exits, shows the tail of every log in the
# testbed's state folder if it failed, runs testbed_on_exit_hook if the script defines
# one (to stop processes of its own), stops the agents and takes testbed NAME down;
# INT and TERM exit 130.
testbed_down_on_exit() {
  _testbed_down_name=$1
  trap _testbed_exit EXIT
  trap 'exit 130' INT TERM
}
_testbed_exit() {
  local rc=$? log
  set +e
  if [ "$rc" -ne 0 ] && [ -n "${TESTBED_STATE:-}" ]; then
    for log in "$TESTBED_STATE"/*.log "$TESTBED_STATE"/*.out; do
      [ -f "$log" ] && { echo "--- $log"; tail -n 30 "$log" | tr '\r' '\n' | tail -n 30; }
    done
  fi
  declare -F testbed_on_exit_hook >/dev/null && testbed_on_exit_hook
  stop_agents
  "$(dirname "${BASH_SOURCE[0]}")/../testbed.sh" down --name "$_testbed_down_name" \
    >/dev/null || rc=1
  exit "$rc"
}
