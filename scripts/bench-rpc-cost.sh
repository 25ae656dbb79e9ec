#!/usr/bin/env bash
# What one small transfer costs each agent, variant by variant: CPU time and context
# switches (all threads, from /proc) per 4 KiB transfer, over CALLS sequential
# transfers from one caller between two agents on loopback (4 emulated NICs, mutual
# TLS). Unlike a rate, these counts barely move with a busy machine, so they show a
# small regression that the noise of bench-ab.sh hides.
#   VARIANTS="before=/tmp/old/build after=build" scripts/bench-rpc-cost.sh
# BUILD holds services/fuselink-agent and tools/bench/fuselink-bench. Environment
# also: ROUNDS (3), CALLS (3000), NET (first of two loopback nets, 234).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-3000}
NET=${NET:-234}
read -r -a variants <<<"${VARIANTS:?set VARIANTS, e.g. VARIANTS=\"a=build b=/tmp/old/build\"}"
work=$(mktemp -d /tmp/fuselink-rpc-cost.XXXXXX)

# shellcheck disable=SC2034  # agent and run are scripts/lib/agents.sh's
agent=""
# shellcheck source=scripts/lib/agents.sh
. "$ROOT/scripts/lib/agents.sh"
trap stop_agents EXIT
pki_init "$work/pki" >/dev/null

# cost PID: "CPU_TICKS SWITCHES" of every thread of PID so far.
cost() {
  local ticks switches
  ticks=$(awk '{print $14 + $15}' "/proc/$1/stat")
  switches=$(cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}')
  echo "$ticks $switches"
}

hz=$(getconf CLK_TCK)
echo "| variant | round | source CPU us | target CPU us | source switches | target switches |"
echo "|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  for v in "${variants[@]}"; do
    name=${v%%=*} build=${v#*=}
    [[ $build == /* ]] || build=$ROOT/$build
    agent=$build/services/fuselink-agent
    run=$(mktemp -d "$work/pair.XXXX")
    chmod 0700 "$run"
    start_agent b $((NET + 1)) "" --nics=4 --policy=stripe
    start_agent a "$NET" "b=$(field "$run/b.json" grpc)" --nics=4 --policy=stripe
    bench=("$build/tools/bench/fuselink-bench" "${demo_tls[@]}" --workload=rpc
      --source_agent="$(field "$run/a.json" grpc)" --source_socket="$run/a.sock"
      --target_agent="$(field "$run/b.json" grpc)" --target_socket="$run/b.sock"
      --concurrency=1 --rpc_seconds=0.01)
    "${bench[@]}" --rpc_calls=300 >/dev/null 2>&1  # warm: sessions, connections
    read -r a_ticks a_sw < <(cost "${pids[1]}")
    read -r b_ticks b_sw < <(cost "${pids[0]}")
    "${bench[@]}" --rpc_calls="$CALLS" >/dev/null 2>>"$work/bench.stderr"
    read -r a_ticks2 a_sw2 < <(cost "${pids[1]}")
    read -r b_ticks2 b_sw2 < <(cost "${pids[0]}")
    stop_agents
    pids=()
    awk -v n="$name" -v r="$round" -v c="$CALLS" -v hz="$hz" \
      -v at=$((a_ticks2 - a_ticks)) -v bt=$((b_ticks2 - b_ticks)) \
      -v as=$((a_sw2 - a_sw)) -v bs=$((b_sw2 - b_sw)) \
      'BEGIN { printf "| %s | %d | %.0f | %.0f | %.1f | %.1f |\n", n, r,
               at * 1e6 / hz / c, bt * 1e6 / hz / c, as / c, bs / c }'
  done
done
