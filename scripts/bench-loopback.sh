#!/usr/bin/env bash
# Loopback benchmarks of fuselink on one machine, side by side with iperf3:
#   1. throughput: two agents with 1, 2 and 4 emulated NICs (policy stripe) move a
#      1 GiB tensor; iperf3 with as many TCP streams runs right after, each round;
#   2. agent memory: VmRSS split into RssAnon (the agent's own heap and stacks) and
#      RssShmem/RssFile (mapped tensor pages and the binary), idle, peak, after;
#   3. chunk-size sweep at 4 NICs;
#   4. the rpc workload (small-transfer latency and rate);
#   5. the planner's micro-benchmark.
# Prints tables; raw results stay in $RESULTS (printed at the end).
#
# Environment: ROUNDS (3), REPS (transfers per bench run, 3), IPERF_SECONDS (2),
# NET (first of two loopback nets for the agents' NICs, 230), BUILD (build-bench),
# QUIET_PCT (15) and QUIET_WAIT_S (20): before each measurement, wait up to that
# long for other work to use less than that share of the CPU. Every result records
# the background load measured just before it (bg_pct), and the tables show it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
IPERF_SECONDS=${IPERF_SECONDS:-2}
NET=${NET:-230}
QUIET_PCT=${QUIET_PCT:-15}
QUIET_WAIT_S=${QUIET_WAIT_S:-20}
NIC_COUNTS=(1 2 4)
CHUNKS_KIB=(256 1024 4096 16384)
RESULTS=$(mktemp -d /tmp/fuselink-bench.XXXXXX)
AGENT=$BUILD/services/fuselink-agent
BENCH=$BUILD/tools/bench/fuselink-bench
PLAN_BENCH=$BUILD/tools/bench/fuselink_plan_bench

log() { echo "== $(date +%T) $*" >&2; }

# --- build -------------------------------------------------------------------------
log "building (Release) in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$BUILD" -j2 fuselink-agent fuselink-bench fuselink_plan_bench >/dev/null

# --- helpers -----------------------------------------------------------------------
# A fork-free sleep for the sampler: read with a timeout on a pipe no one writes.
exec {SLEEP_FD}<> <(:)
nap() { read -r -t "$1" -u "$SLEEP_FD" || true; }

# Reads a process's VmRSS RssAnon RssFile RssShmem (KiB) into MEM; no fork.
read_mem() {
  local key value unit
  MEM=(0 0 0 0)
  while read -r key value unit; do
    case $key in
      VmRSS:) MEM[0]=$value ;; RssAnon:) MEM[1]=$value ;;
      RssFile:) MEM[2]=$value ;; RssShmem:) MEM[3]=$value ;;
    esac
  done <"/proc/$1/status"
}
mem_of() { read_mem "$1"; echo "${MEM[*]}"; }

# Samples a process every 20 ms until $2.stop exists; writes each field's peak to $2.
sample_peak() {
  local pid=$1 out=$2 i peak=(0 0 0 0)
  while [[ ! -e $out.stop && -e /proc/$pid/status ]]; do
    read_mem "$pid"
    for i in 0 1 2 3; do
      if ((MEM[i] > peak[i])); then peak[i]=${MEM[i]}; fi
    done
    nap 0.02
  done
  echo "${peak[*]}" >"$out"
}

# Percent of the machine's CPU time busy over the next $1 seconds: while our own
# processes are idle, this is the load others put on the machine.
busy_pct() {
  local _c u n sy id io irq sirq st u2 n2 sy2 id2 io2 irq2 sirq2 st2
  read -r _c u n sy id io irq sirq st _ </proc/stat
  nap "$1"
  read -r _c u2 n2 sy2 id2 io2 irq2 sirq2 st2 _ </proc/stat
  local busy=$(((u2 + n2 + sy2 + irq2 + sirq2 + st2) - (u + n + sy + irq + sirq + st)))
  local idle=$(((id2 + io2) - (id + io)))
  echo $((100 * busy / (busy + idle > 0 ? busy + idle : 1)))
}

# Waits, up to QUIET_WAIT_S seconds, until others use less than QUIET_PCT of the CPU.
wait_quiet() {
  local start=$SECONDS pct
  while pct=$(busy_pct 0.5) && ((pct >= QUIET_PCT && SECONDS - start < QUIET_WAIT_S)); do :; done
  ((pct < QUIET_PCT)) || log "machine still ${pct}% busy with other work; measuring anyway"
}

# utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Median of numbers on stdin.
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Agents run through the project's helpers: start_agent, stop_agents, field, pids.
agent=$AGENT
. "$ROOT/scripts/lib/agents.sh"
trap stop_agents EXIT

# start_pair NICS AGENT_FLAGS...: agents a (source) and b (target), ports from the
# kernel. Sets A_PID B_PID A_ADDR B_ADDR A_SOCK B_SOCK.
start_pair() {
  local nics=$1
  shift
  run=$(mktemp -d "$RESULTS/pair.XXXX")
  start_agent b $((NET + 1)) "" --nics="$nics" --policy=stripe "$@"
  B_PID=${pids[-1]} B_ADDR=$(field "$run/b.json" grpc) B_SOCK=$run/b.sock
  start_agent a "$NET" "b=$B_ADDR" --nics="$nics" --policy=stripe "$@"
  A_PID=${pids[-1]} A_ADDR=$(field "$run/a.json" grpc) A_SOCK=$run/a.sock
}

stop_pair() {
  stop_agents
  pids=()
}

# run_bench TAG ARGS...: fuselink-bench against the current pair, sampling both
# agents' memory. Appends the bench's JSON (with tag, CPU and memory fields) to
# $RESULTS/fuselink.jsonl.
run_bench() {
  local tag=$1 idle_a idle_b peak_a peak_b after_a after_b cpu0 cpu1 out bg
  shift
  wait_quiet
  bg=$(busy_pct 0.3)  # agents idle: this is others' load
  idle_a=$(mem_of "$A_PID") idle_b=$(mem_of "$B_PID")
  rm -f "$RESULTS/peak.a"* "$RESULTS/peak.b"*
  sample_peak "$A_PID" "$RESULTS/peak.a" &
  local sampler_a=$!
  sample_peak "$B_PID" "$RESULTS/peak.b" &
  local sampler_b=$!
  cpu0=$(($(cpu_ticks "$A_PID") + $(cpu_ticks "$B_PID")))
  out=$("$BENCH" --json --source_agent="$A_ADDR" --target_agent="$B_ADDR" \
    --source_socket="$A_SOCK" --target_socket="$B_SOCK" "$@" 2>>"$RESULTS/bench.stderr")
  cpu1=$(($(cpu_ticks "$A_PID") + $(cpu_ticks "$B_PID")))
  touch "$RESULTS/peak.a.stop" "$RESULTS/peak.b.stop"
  wait "$sampler_a" "$sampler_b"
  peak_a=$(cat "$RESULTS/peak.a") peak_b=$(cat "$RESULTS/peak.b")
  after_a=$(mem_of "$A_PID") after_b=$(mem_of "$B_PID")
  echo "$out" | jq -c --arg tag "$tag" --argjson cpu_ticks $((cpu1 - cpu0)) \
    --argjson hz "$(getconf CLK_TCK)" \
    --arg idle_a "$idle_a" --arg idle_b "$idle_b" --arg peak_a "$peak_a" \
    --arg peak_b "$peak_b" --arg after_a "$after_a" --arg after_b "$after_b" \
    --argjson bg "$bg" \
    '. + {tag: $tag, agents_cpu_s: ($cpu_ticks / $hz), bg_pct: $bg,
          mem_kib: {idle_a: $idle_a, idle_b: $idle_b, peak_a: $peak_a, peak_b: $peak_b,
                    after_a: $after_a, after_b: $after_b}}' >>"$RESULTS/fuselink.jsonl"
}

# run_iperf TAG STREAMS ARGS...: one iperf3 server for this run, the client with
# -P STREAMS; appends {tag, streams, gbps, cpu_s} to $RESULTS/iperf3.jsonl.
run_iperf() {
  local tag=$1 streams=$2 port bg
  shift 2
  wait_quiet
  bg=$(busy_pct 0.3)
  port=$(free_port)
  timeout $((IPERF_SECONDS + 20)) iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
  local server=$!
  nap 0.3
  iperf3 -c 127.0.0.1 -B 127.0.0.1 -p "$port" -P "$streams" -t "$IPERF_SECONDS" -J "$@" |
    jq -c --arg tag "$tag" --argjson streams "$streams" --argjson bg "$bg" \
      '{tag: $tag, streams: $streams, bg_pct: $bg,
        gbps: (.end.sum_received.bits_per_second / 8e9),
        seconds: .end.sum_received.seconds,
        cpu_s: ((.end.cpu_utilization_percent.host_total
                 + .end.cpu_utilization_percent.remote_total) / 100
                * .end.sum_received.seconds)}' >>"$RESULTS/iperf3.jsonl"
  wait "$server" || true
}

# Stats over the rounds of one tag: field -> "median min max".
stat_of() {  # FILE TAG FIELD
  local values
  values=$(jq -r --arg tag "$2" "select(.tag == \$tag) | $3" "$1")
  echo "$(echo "$values" | median) $(echo "$values" | sort -g | head -1) $(echo "$values" | sort -g | tail -1)"
}

TRANSFER=(--workload=transfer --warmup=1 --reps="$REPS")
# GB moved by one bench run (warmup included), for CPU seconds per GB.
RUN_GB=$(awk -v r="$REPS" 'BEGIN {print (r + 1) * 1073741824 / 1e9}')

# --- 1. throughput, and memory at each NIC count -----------------------------------
for round in $(seq "$ROUNDS"); do
  for n in "${NIC_COUNTS[@]}"; do
    log "round $round/$ROUNDS: $n NICs"
    start_pair "$n" --connections_per_nic=1
    run_bench "fl-c1-n$n" "${TRANSFER[@]}"
    stop_pair
    start_pair "$n"  # the default, --connections_per_nic=2
    run_bench "fl-c2-n$n" "${TRANSFER[@]}"
    stop_pair
    run_iperf "ip-n$n" "$n"
    run_iperf "ip1m-n$n" "$n" -l 1M
    run_iperf "ip-n$((2 * n))" "$((2 * n))"
  done
done

# --- 3. chunk sweep, 4 NICs, default flags otherwise ---------------------------------
for round in $(seq "$ROUNDS"); do
  for kib in "${CHUNKS_KIB[@]}"; do
    log "round $round/$ROUNDS: chunk $kib KiB"
    start_pair 4 --chunk_bytes=$((kib * 1024))
    run_bench "chunk-$kib" "${TRANSFER[@]}"
    stop_pair
  done
done

# --- 4. rpc --------------------------------------------------------------------------
log "rpc workload (4 NICs, default flags)"
start_pair 4
wait_quiet
RPC_BG=$(busy_pct 0.3)
RPC_IDLE_A=$(mem_of "$A_PID") RPC_IDLE_B=$(mem_of "$B_PID")
"$BENCH" --json --workload=rpc --rpc_calls=2000 --concurrency=1,4,16 --rpc_seconds=3 \
  --source_agent="$A_ADDR" --target_agent="$B_ADDR" --source_socket="$A_SOCK" \
  --target_socket="$B_SOCK" 2>>"$RESULTS/bench.stderr" >"$RESULTS/rpc.jsonl"
RPC_AFTER_A=$(mem_of "$A_PID") RPC_AFTER_B=$(mem_of "$B_PID")
# The agent's CPU while idle again, with the finished transfers it keeps.
t0=$(cpu_ticks "$A_PID")
nap 3
RPC_IDLE_CPU_PCT=$(((($(cpu_ticks "$A_PID") - t0) * 100 / $(getconf CLK_TCK)) / 3))
stop_pair

# --- 5. planner ----------------------------------------------------------------------
log "planner micro-benchmark"
"$PLAN_BENCH" --benchmark_min_time=0.2 --benchmark_format=console \
  >"$RESULTS/plan_bench.txt" 2>/dev/null

# --- tables --------------------------------------------------------------------------
FL=$RESULTS/fuselink.jsonl IP=$RESULTS/iperf3.jsonl
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }       # KiB -> MiB

echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "machine: $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')), $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "rounds: $ROUNDS; each fuselink cell: median over rounds of the per-run median of $REPS x 1 GiB transfers (after 1 warm-up); iperf3: -t $IPERF_SECONDS, median over rounds"
echo
# cell TAG FIELD_MEDIAN: "median [min-max]" over rounds, min and max from the
# runs' own gbps_min / gbps_max.
cell() {
  local med lo hi
  med=$(stat_of "$FL" "$1" .gbps_median | awk '{print $1}')
  lo=$(stat_of "$FL" "$1" .gbps_min | awk '{print $2}')
  hi=$(stat_of "$FL" "$1" .gbps_max | awk '{print $3}')
  printf '%.2f [%.2f-%.2f]' "$med" "$lo" "$hi"
}
med_of() { stat_of "$1" "$2" "$3" | awk '{print $1}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
# Highest background load measured before any run of these tags.
bg_max() {
  local tag
  for tag in "$@"; do jq -r --arg t "$tag" 'select(.tag == $t) | .bg_pct' "$FL" "$IP"; done |
    sort -g | tail -1
}

echo "Throughput, GB/s (1e9 B/s), policy stripe. Same number of TCP streams on both sides:"
echo "fuselink --connections_per_nic=1 (N streams) vs iperf3 -P N, default 128 KiB writes and -l 1M."
printf "%-5s | %-22s | %-11s | %-5s | %-14s | %-5s | %-6s\n" \
  "NICs" "fuselink [min-max]" "iperf3 -P N" "ratio" "iperf3 -l 1M" "ratio" "bg% max"
for n in "${NIC_COUNTS[@]}"; do
  fl=$(med_of "$FL" "fl-c1-n$n" .gbps_median)
  ip=$(med_of "$IP" "ip-n$n" .gbps)
  ip1=$(med_of "$IP" "ip1m-n$n" .gbps)
  printf "%-5s | %-22s | %-11.2f | %-5s | %-14.2f | %-5s | %-6s\n" "$n" "$(cell "fl-c1-n$n")" \
    "$ip" "$(ratio "$fl" "$ip")" "$ip1" "$(ratio "$fl" "$ip1")" \
    "$(bg_max "fl-c1-n$n" "ip-n$n" "ip1m-n$n")"
done
echo
echo "The agent's default, --connections_per_nic=2 (2N streams), vs iperf3 -P 2N (128 KiB writes)."
printf "%-5s | %-22s | %-12s | %-5s | %-6s\n" "NICs" "fuselink [min-max]" "iperf3 -P 2N" "ratio" "bg% max"
for n in "${NIC_COUNTS[@]}"; do
  fl=$(med_of "$FL" "fl-c2-n$n" .gbps_median)
  ip=$(med_of "$IP" "ip-n$((2 * n))" .gbps)
  printf "%-5s | %-22s | %-12.2f | %-5s | %-6s\n" "$n" "$(cell "fl-c2-n$n")" "$ip" \
    "$(ratio "$fl" "$ip")" "$(bg_max "fl-c2-n$n" "ip-n$((2 * n))")"
done
echo
echo "CPU seconds per GB moved (both ends; fuselink: both agents' utime+stime over the bench run; iperf3: its own client+server report)"
printf "%-5s | %-14s | %-14s | %-14s | %-16s\n" "NICs" "fuselink c=1" "fuselink c=2" "iperf3 -P N" "iperf3 -P N -l1M"
for n in "${NIC_COUNTS[@]}"; do
  f1=$(jq -r --arg t "fl-c1-n$n" --argjson gb "$RUN_GB" 'select(.tag == $t) | .agents_cpu_s / $gb' "$FL" | median)
  f2=$(jq -r --arg t "fl-c2-n$n" --argjson gb "$RUN_GB" 'select(.tag == $t) | .agents_cpu_s / $gb' "$FL" | median)
  i1=$(jq -r --arg t "ip-n$n" 'select(.tag == $t) | .cpu_s / (.gbps * .seconds)' "$IP" | median)
  i1m=$(jq -r --arg t "ip1m-n$n" 'select(.tag == $t) | .cpu_s / (.gbps * .seconds)' "$IP" | median)
  printf "%-5s | %-14.3f | %-14.3f | %-14.3f | %-16.3f\n" "$n" "$f1" "$f2" "$i1" "$i1m"
done

echo
echo "Agent memory, MiB, 4 NICs, default flags (last round). RssAnon is the agent's own memory;"
echo "RssShmem counts tensor pages (the engine's memfd, mapped) once the agent touched them."
printf "%-8s | %-7s | %-8s | %-8s | %-8s | %-8s\n" "agent" "when" "VmRSS" "RssAnon" "RssFile" "RssShmem"
row=$(jq -c 'select(.tag == "fl-c2-n4")' "$FL" | tail -1)
for side in a b; do
  for when in idle peak after; do
    read -r r a f s < <(echo "$row" | jq -r --arg k "${when}_$side" '.mem_kib[$k]')
    printf "%-8s | %-7s | %-8s | %-8s | %-8s | %-8s\n" "$([[ $side == a ]] && echo source || echo target)" \
      "$when" "$(mib "$r")" "$(mib "$a")" "$(mib "$f")" "$(mib "$s")"
  done
done
echo "(peak: 20 ms samples during the bench run: 1 warm-up + $REPS transfers of 1 GiB; after: once it exited)"
in_use=$(grep -c TENSOR_IN_USE "$RESULTS/bench.stderr" || true)
if ((in_use > 0)); then
  echo "note: $in_use UnregisterTensor calls after finished transfers failed TENSOR_IN_USE, so the"
  echo "tensors stay mapped in the agents and 'after' still counts their pages in RssShmem."
fi

echo
echo "Chunk-size sweep, 4 NICs, default flags otherwise (window 16 chunks, 2 connections per NIC)"
printf "%-10s | %-22s | %-8s | %-20s | %-20s | %-6s\n" "chunk" "GB/s [min-max]" "cpu s/GB" \
  "peak RssAnon src MiB" "peak RssAnon dst MiB" "bg% max"
for kib in "${CHUNKS_KIB[@]}"; do
  cpu=$(jq -r --arg t "chunk-$kib" --argjson gb "$RUN_GB" 'select(.tag == $t) | .agents_cpu_s / $gb' "$FL" | median)
  pa=$(jq -r --arg t "chunk-$kib" 'select(.tag == $t) | .mem_kib.peak_a | split(" ")[1]' "$FL" | sort -g | tail -1)
  pb=$(jq -r --arg t "chunk-$kib" 'select(.tag == $t) | .mem_kib.peak_b | split(" ")[1]' "$FL" | sort -g | tail -1)
  printf "%-10s | %-22s | %-8.3f | %-20s | %-20s | %-6s\n" "$kib KiB" "$(cell "chunk-$kib")" \
    "$cpu" "$(mib "$pa")" "$(mib "$pb")" "$(bg_max "chunk-$kib")"
done

echo
echo "rpc workload, 4 NICs, default flags: 1 block of 4 KiB per transfer (bg ${RPC_BG}%)"
jq -r 'select(.kind == "rpc_latency") |
  "sequential \(.calls) calls: accepted p50 \(.accepted_p50_us | floor) us, p99 \(.accepted_p99_us | floor) us, max \(.accepted_max_us | floor) us; completed p50 \(.completed_p50_us | floor) us, p99 \(.completed_p99_us | floor) us"' \
  "$RESULTS/rpc.jsonl"
printf "%-8s | %-10s | %-16s | %-18s | %-18s\n" "callers" "transfers" "transfers/s" "completed p50 us" "completed p99 us"
jq -r 'select(.kind == "rpc_rate") | [.callers, .transfers, .transfers_per_s, .completed_p50_us, .completed_p99_us] | @tsv' \
  "$RESULTS/rpc.jsonl" | while IFS=$'\t' read -r k t r p50 p99; do
  printf "%-8s | %-10s | %-16.0f | %-18.0f | %-18.0f\n" "$k" "$t" "$r" "$p50" "$p99"
done

read -r r0 a0 _ _ <<<"$RPC_IDLE_A"
read -r r1 a1 _ _ <<<"$RPC_AFTER_A"
read -r rb0 ab0 _ _ <<<"$RPC_IDLE_B"
read -r rb1 ab1 _ _ <<<"$RPC_AFTER_B"
echo "agent memory before -> after the rpc workload, MiB: source VmRSS $(mib "$r0") -> $(mib "$r1")" \
  "(RssAnon $(mib "$a0") -> $(mib "$a1")); target VmRSS $(mib "$rb0") -> $(mib "$rb1")" \
  "(RssAnon $(mib "$ab0") -> $(mib "$ab1"))"
echo "source agent CPU when idle again afterwards: ${RPC_IDLE_CPU_PCT}% of one core"

echo
echo "Planner (fuselink_plan_bench; 32 layers x 1024 blocks of 64 KiB)"
grep -E '^BM_' "$RESULTS/plan_bench.txt"
echo
echo "raw results: $RESULTS"
