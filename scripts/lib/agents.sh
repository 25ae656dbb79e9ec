# shellcheck shell=bash
# shellcheck disable=SC2154  # $agent and $run are the caller's
# Shell helpers to run local agents; sourced by scripts and tests.
# Needs: $agent (the fuselink-agent binary) and $run (a scratch folder).
# start_agent NAME LOOPBACK_NET [PEER [EXTRA FLAGS...]] starts one in the background,
# waits until it serves, and appends its pid to the pids array.
# launch_agent NAME [FLAGS...] is the general form: --node, --handle_socket,
# --ready_file and the log are set (in ${agent_dir:-$run}), every other flag is the
# caller's; the command runs under the agent_prefix array when that is set (e.g.
# agent_prefix=(ip netns exec NS); scripts/lib/testbed.sh uses it).
pids=()
agent_prefix=()

stop_agents() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# field FILE KEY: a string value from an agent's ready file.
field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"; }

launch_agent() {
  local name=$1 dir=${agent_dir:-$run}
  shift
  rm -f "$dir/$name.json"
  "${agent_prefix[@]}" "$agent" --node="$name" --handle_socket="$dir/$name.sock" \
    --ready_file="$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 &
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

start_agent() {
  local name=$1 net=$2 peer=${3:-}
  shift $(($# < 3 ? $# : 3))
  launch_agent "$name" --loopback_net="$net" --listen=127.0.0.1:0 \
    --metrics_listen=127.0.0.1:0 ${peer:+--peer="$peer"} "$@"
}
