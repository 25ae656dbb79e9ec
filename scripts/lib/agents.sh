# shellcheck shell=bash
# shellcheck disable=SC2154  # $agent and $run are the caller's
# Shell helpers to run local agents; sourced by scripts and tests.
# Needs: $agent (the fuselink-agent binary) and $run (a scratch folder).
# start_agent NAME LOOPBACK_NET [PEER [EXTRA FLAGS...]] starts an emulated node
# (--topology=emulated, NICs on 127.0.LOOPBACK_NET.x) in the background,
# waits until it serves, and appends its pid to the pids array.
# launch_agent NAME [FLAGS...] is the general form: --node, --handle_socket,
# --ready_file and the log are set (in ${agent_dir:-$run}), every other flag is the
# caller's; the command runs under the agent_prefix array when that is set (e.g.
# agent_prefix=(ip netns exec NS); scripts/lib/testbed.sh uses it).
#
# Mutual TLS, as an operator runs it: pki_init DIR makes a CA in DIR with
# scripts/certs.sh, and certificates for the clients: router r1, engine e1 and
# viewer v1, whose fuselinkctl/fuselink-bench flags it puts in the arrays router_tls,
# engine_tls and viewer_tls; demo_tls is the router's plus --engine_tls_* for the
# tools that register tensors and move them (fuselinkctl demo, fuselink-bench).
# From then on launch_agent gives each agent NAME a certificate of its own
# (node-NAME, identity spiffe://fuselink/node/NAME, with the extra SANs in the
# agent_sans array, e.g. agent_sans=(IP:10.0.0.1) for an address clients dial) and
# the --tls_* flags, unless the caller passes --plaintext. Without pki_init the
# agents get no TLS flags: pass --plaintext, or they refuse to start.
pids=()
agent_prefix=()
agent_sans=()
pki=""
router_tls=()
engine_tls=()
viewer_tls=()
demo_tls=()
_fl_certs="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/certs.sh"

# tls_flags KIND NAME: the --tls_* flags of certificate KIND-NAME in $pki.
tls_flags() {
  printf '%s\n' "--tls_cert=$pki/$1-$2.crt" "--tls_key=$pki/$1-$2.key" "--tls_ca=$pki/ca.crt"
}

# shellcheck disable=SC2034  # the *_tls arrays are the callers'
pki_init() {
  pki=$1
  "$_fl_certs" "$pki" ca
  local kind name
  for kind in router/r1 engine/e1 viewer/v1; do
    name=${kind#*/} kind=${kind%/*}
    [ -f "$pki/$kind-$name.crt" ] || "$_fl_certs" "$pki" "$kind" "$name"
  done
  mapfile -t router_tls < <(tls_flags router r1)
  mapfile -t engine_tls < <(tls_flags engine e1)
  mapfile -t viewer_tls < <(tls_flags viewer v1)
  demo_tls=("${router_tls[@]}" "--engine_tls_cert=$pki/engine-e1.crt"
    "--engine_tls_key=$pki/engine-e1.key")
}

# agent_tls NAME [FLAGS...]: the --tls_* flags agent NAME runs with (none under
# --plaintext or without pki_init), making its certificate first.
agent_tls() {
  local name=$1 f
  shift
  [ -n "$pki" ] || return 0
  for f in "$@"; do [ "$f" = --plaintext ] && return 0; done
  "$_fl_certs" "$pki" node "$name" "${agent_sans[@]}"
  tls_flags node "$name"
}

stop_agents() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# field FILE KEY: a string value from an agent's ready file.
field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"; }

launch_agent() {
  local name=$1 dir=${agent_dir:-$run} tls
  shift
  rm -f "$dir/$name.json"
  mapfile -t tls < <(agent_tls "$name" "$@")
  "${agent_prefix[@]}" "$agent" --node="$name" --handle_socket="$dir/$name.sock" \
    --ready_file="$dir/$name.json" "${tls[@]}" "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [ -s "$dir/$name.json" ] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "agent $name did not start; its log:" >&2
  cat "$dir/$name.log" >&2
  return 1
}

# --topology=emulated where $agent has it: builds from before topology discovery
# (issue 13) were emulated by default and read "emulated" as a file's name, and
# scripts/bench-ab.sh runs such builds beside new ones.
emulated_flag() {
  local help
  help=$("$agent" --helpfull 2>&1 || true)
  [[ $help != *topology=emulated* ]] || echo --topology=emulated
}

start_agent() {
  local name=$1 net=$2 peer=${3:-}
  shift $(($# < 3 ? $# : 3))
  # shellcheck disable=SC2046  # emulated_flag: one word or none
  launch_agent "$name" $(emulated_flag) --loopback_net="$net" --listen=127.0.0.1:0 \
    --metrics_listen=127.0.0.1:0 ${peer:+--peer="$peer"} "$@"
}

# find_python MODULE...: sets `python` to the first interpreter that imports every
# MODULE: $FUSELINK_PYTHON, the one on PATH, then Debian's (where the apt packages
# install, whatever PATH puts first); empty when none does.
# shellcheck disable=SC2034  # $python is the result, read by the caller
find_python() {
  python=""
  local p
  for p in ${FUSELINK_PYTHON:-} python3 /usr/bin/python3; do
    if "$p" -c "import $(IFS=,; echo "$*")" 2>/dev/null; then
      python=$p
      return 0
    fi
  done
}
