#!/bin/bash
# The scheduler benchmarks on the namespace testbed: builds (Release, its
# own build folder), brings up N nodes (default 2) with four shaped rails, starts an
# agent per node and policy (static, stripe, fuselink; each agent every other node's
# agent of its policy as peer, on fixed ports of its node's management address),
# runs every fuselink-bench scheduler
# workload under each policy in turn, runs scheduler_bench (the cost of a pick), and
# tears everything down. Needs root (scripts/testbed.sh check); exits 77 otherwise.
#
#   scripts/bench-testbed.sh [--out DIR] [--results DIR] [--rate RATE]
#                            [--chunk_bytes N] [--build DIR] [--workloads LIST]
#                            [--nodes N] [--quick]
#
# --out DIR        the PNGs (default docs/bench; docs/benchmarks.md shows each run's from
#                  docs/bench/scheduler/<date>/, where a kept run's plots are moved)
# --results DIR    tables, timelines, logs (default /tmp/fuselink-bench-testbed)
# --rate RATE      each rail's rate, each way (default 1gbit: the rate, not the two
#                  cores of a developer machine, is the limit)
# --chunk_bytes N  the agents' --chunk_bytes (default 1 MiB)
# --workloads LIST comma-separated, default hot,serving,expert,dlrm,owner, and owner_rx
#                  with 4 nodes or more (an owner receiving while another node
#                  borrows toward its node: nodes 0, 1 and 2)
# --nodes N        even, default 2. hot and owner run between nodes 0 and 1; expert
#                  and dlrm are all-to-alls over every node (expert's bytes grow with
#                  N, so that each GPU sends as much as with 2); serving has N/2
#                  prefill nodes, each request going to a decode node drawn at random
# --quick          smaller workloads (a check that everything runs, not numbers)
# Extra agent flags for every agent: FUSELINK_AGENT_FLAGS (e.g. --borrow_depth=4);
# extra fuselink-bench flags for every workload: FUSELINK_BENCH_FLAGS (e.g.
# --serving_arrivals_per_s=0.75, to keep serving's load with a lower --rate).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$here/docs/bench
results=/tmp/fuselink-bench-testbed
rate=1gbit
chunk_bytes=1048576
build=$here/build-bench-testbed
workloads=""
nodes=2
quick=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?}; shift 2 ;;
    --results) results=${2:?}; shift 2 ;;
    --rate) rate=${2:?}; shift 2 ;;
    --chunk_bytes) chunk_bytes=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    --workloads) workloads=${2:?}; shift 2 ;;
    --nodes) nodes=${2:?}; shift 2 ;;
    --quick) quick=1; shift ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
if [ -z "$workloads" ]; then
  workloads=hot,serving,expert,dlrm,owner
  [ "$nodes" -lt 4 ] || workloads=$workloads,owner_rx
fi
tb=$here/scripts/testbed.sh
policies=(static stripe fuselink)

reason=$("$tb" check 2>&1) || {
  rc=$?
  echo "bench-testbed: ${reason:-testbed check failed}" >&2
  exit "$rc"
}
command -v gnuplot >/dev/null || echo "bench-testbed: gnuplot is missing; no PNGs" >&2

echo "== build ($build)"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" fuselink-agent fuselink-bench scheduler_bench | tail -n 1
agent=$build/services/fuselink-agent
bench=$build/tools/bench/fuselink-bench
sched_bench=$build/tests/sched/scheduler_bench

mkdir -p "$out" "$results"
results=$(cd "$results" && pwd)
out=$(cd "$out" && pwd)
name="flb$$"
# shellcheck source=scripts/lib/testbed.sh
. "$here/scripts/lib/testbed.sh"
testbed_down_on_exit "$name"

case $nodes in
  *[!0-9]* | '' | *[13579]) echo "bench-testbed: --nodes must be even and >= 2" >&2; exit 2 ;;
esac
[ "$nodes" -ge 2 ] || { echo "bench-testbed: --nodes must be even and >= 2" >&2; exit 2; }
"$tb" up --name "$name" --nodes "$nodes" --rails 4 --rate "$rate"
testbed_load "$name"
state=$TESTBED_STATE
# Mutual TLS, as deployed: certificates per agent and for the bench, unless
# FUSELINK_AGENT_FLAGS runs the agents with --plaintext (scripts/lib/agents.sh).
pki_init "$state/pki"
bench_tls=("${demo_tls[@]}")
case " ${FUSELINK_AGENT_FLAGS:-} " in *" --plaintext "*) bench_tls=(--plaintext) ;; esac

# Agents: <policy>-n<i> in node i's namespace; gRPC on port 7100+p, metrics on
# 7200+p of node i's management address, peers: the same policy's other nodes.
for p in "${!policies[@]}"; do
  policy=${policies[p]}
  for ((i = 0; i < nodes; i++)); do
    peers=$(testbed_peers "$i" "$nodes" "$policy" $((7100 + p)))
    # shellcheck disable=SC2034  # read by launch_agent (scripts/lib/agents.sh)
    agent_prefix=(ip netns exec "$(testbed_ns "$i")")
    # shellcheck disable=SC2034
    agent_dir=$state
    # shellcheck disable=SC2034  # the address fuselink-bench dials, in the certificate
    agent_sans=("IP:$(testbed_mgmt "$i")")
    # The bench is the one router: its share of transfers is all of --max_transfers
    # (a share over it leaves --max_transfers the only bound).
    # shellcheck disable=SC2086  # FUSELINK_AGENT_FLAGS: words
    launch_agent "$policy-n$i" --topology="$(testbed_var TOPOLOGY "$i")" \
      --listen="$(testbed_mgmt "$i"):$((7100 + p))" \
      --metrics_listen="$(testbed_mgmt "$i"):$((7200 + p))" \
      --peer="$peers" --max_transfers_per_router=4096 \
      --policy="$policy" --chunk_bytes="$chunk_bytes" ${FUSELINK_AGENT_FLAGS:-}
  done
done

expert_bytes=$((1073741824 * nodes / 2))
sizes=()
if [ "$quick" = 1 ]; then
  expert_bytes=$((268435456 * nodes / 2))
  sizes=(--hot_bytes=268435456 --serving_seconds=4 --dlrm_bytes=16777216
    --dlrm_iterations=1 --owner_borrower_bytes=268435456 --owner_bytes=33554432
    --owner_delay_s=0.3)
fi
sizes+=(--nodes="$nodes" --expert_bytes="$expert_bytes")
# shellcheck disable=SC2206  # FUSELINK_BENCH_FLAGS: words
sizes+=(${FUSELINK_BENCH_FLAGS:-})
{
  echo "# scripts/bench-testbed.sh $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(uname -r)"
  echo "# testbed: $nodes nodes, 4 rails at $rate each way; agents --chunk_bytes=$chunk_bytes ${FUSELINK_AGENT_FLAGS:-}; bench ${FUSELINK_BENCH_FLAGS:-}"
} >"$results/sched-tables.txt"
IFS=, read -r -a list <<<"$workloads"
for w in "${list[@]}"; do
  echo "== $w"
  start=$(date +%s)
  "$bench" --workload="$w" --cluster_dir="$state" --out_dir="$results" "${bench_tls[@]}" \
    --png="$out/sched-$w.png" --rail_bytes_per_s="$TESTBED_RATE_BYTES_PER_S" \
    --chunk_bytes="$chunk_bytes" "${sizes[@]}" | tee "$results/$w.txt"
  {
    echo
    echo "## $w ($(($(date +%s) - start)) s): fuselink-bench --workload=$w ${sizes[*]}"
    cat "$results/$w.txt"
  } >>"$results/sched-tables.txt"
done

if [ -n "$sched_bench" ]; then
  echo "== scheduler_bench"
  "$sched_bench" --benchmark_min_time=0.2 2>&1 | tee "$results/scheduler_bench.txt"
  { echo; echo "## scheduler_bench"; cat "$results/scheduler_bench.txt"; } \
    >>"$results/sched-tables.txt"
fi
echo "tables: $results/sched-tables.txt; plots: $out/sched-*.png"
