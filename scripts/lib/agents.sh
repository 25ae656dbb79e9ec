# Shell helpers to run local agents; sourced by scripts and tests.
# Needs: $agent (the fuselink-agent binary) and $run (a scratch folder).
# start_agent NAME LOOPBACK_NET [PEER [EXTRA FLAGS...]] starts one in the background,
# waits until it serves, and appends its pid to the pids array.
pids=()

stop_agents() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# field FILE KEY: a string value from an agent's ready file.
field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"; }

start_agent() {
  local name=$1 net=$2 peer=${3:-}
  shift $(($# < 3 ? $# : 3))
  "$agent" --node="$name" --loopback_net="$net" --listen=127.0.0.1:0 \
    --metrics_listen=127.0.0.1:0 --handle_socket="$run/$name.sock" \
    --ready_file="$run/$name.json" ${peer:+--peer="$peer"} "$@" \
    >"$run/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [ -s "$run/$name.json" ] && return 0
    sleep 0.1
  done
  echo "agent $name did not start; its log:" >&2
  cat "$run/$name.log" >&2
  return 1
}
