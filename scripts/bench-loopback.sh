#!/usr/bin/env bash
# Loopback benchmarks of fuselink on one machine, side by side with iperf3:
#   1. throughput: two agents with 1, 2 and 4 emulated NICs (policy stripe) move a
#      1 GiB tensor; iperf3 with as many TCP streams runs right after, each round,
#      then a fresh 4-NIC pair moves 4 KiB (its first transfer is the peer bootstrap);
#   2. agent memory: VmRSS split into RssAnon (the agent's own heap and stacks) and
#      RssShmem/RssFile (mapped tensor pages and the binary), idle, peak, after;
#   3. chunk-size sweep at 4 NICs;
#   4. the rpc workload (small-transfer latency and rate);
#   5. the planner's micro-benchmark.
# Prints tables; raw results (JSON lines) stay in $RESULTS, printed at the end.
#
# A shared machine is noisy. Each run records bg_pct: the share of the machine's CPU
# that other processes used while it ran (busy time minus the agents', the bench's or
# iperf3's own, the samplers' and ksoftirqd's). Tables take the median of the clean
# runs (bg_pct < CLEAN_PCT) and say how many there were; a cell with no clean run uses
# every run and is marked '!'. About 6 minutes on a quiet machine.
#
# Environment: ROUNDS (3), REPS (transfers per bench run, 3), IPERF_SECONDS (2),
# NET (first of two loopback nets for the agents' NICs, 230), BUILD (build-bench),
# SKIP_BUILD=1 (measure the binaries already in BUILD), CODE_REV (what to print as
# the code measured; the checkout's HEAD by default), CLEAN_PCT (10), NICE (-10 as
# root, else 0: the agents, the bench and iperf3 alike run at this nice level, so
# that other work on the machine disturbs them less), and QUIET_PCT (15) /
# QUIET_WAIT_S (10):
# before each run, wait up to QUIET_WAIT_S seconds for other work to use less than
# QUIET_PCT of the CPU. SHMEM_HUGE (never, advise, within_size or always; unset: leave
# it): the node's transparent_hugepage/shmem_enabled for this run (root), put back at
# the end; whether the tensors' memfds may be made of huge pages (docs/benchmarks.md,
# "Huge pages"). The value in force is printed either way.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
IPERF_SECONDS=${IPERF_SECONDS:-2}
NET=${NET:-230}
CLEAN_PCT=${CLEAN_PCT:-10}
QUIET_PCT=${QUIET_PCT:-15}
QUIET_WAIT_S=${QUIET_WAIT_S:-10}
NICE=${NICE:-$([[ $(id -u) == 0 ]] && echo -10 || echo 0)}
RUN=(nice -n "$NICE")
NIC_COUNTS=(1 2 4)
CHUNKS_KIB=(256 1024 4096 16384)
RESULTS=$(mktemp -d /tmp/fuselink-bench.XXXXXX)
AGENT=$BUILD/services/fuselink-agent
BENCH=$BUILD/tools/bench/fuselink-bench
PLAN_BENCH=$BUILD/tools/bench/fuselink_plan_bench
FL=$RESULTS/fuselink.jsonl
IP=$RESULTS/iperf3.jsonl

log() { echo "== $(date +%T) $*" >&2; }

# --- build -------------------------------------------------------------------------
if [[ ${SKIP_BUILD:-0} == 1 ]]; then
  log "SKIP_BUILD=1: using the binaries in $BUILD as they are"
else
  log "building (Release) in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C "$BUILD" -j2 fuselink-agent fuselink-bench fuselink_plan_bench >/dev/null
fi

# --- helpers -----------------------------------------------------------------------
# A fork-free sleep for the samplers: read with a timeout on a pipe no one writes.
exec {SLEEP_FD}<> <(:)
nap() { read -r -t "$1" -u "$SLEEP_FD" || true; }

# Reads a process's VmRSS RssAnon RssFile RssShmem (KiB) into MEM; no fork.
read_mem() {
  local key value _unit
  MEM=(0 0 0 0)
  while read -r key value _unit; do
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

# CPU clock ticks (USER_HZ): a process's utime + stime; this shell's reaped
# children's; the machine's "busy total" over every CPU.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Loopback's receive work that the kernel defers runs in ksoftirqd: ours, too.
mapfile -t KSOFTIRQD < <(pgrep '^ksoftirqd/' || true)
softirqd_ticks() {
  local p sum=0
  for p in "${KSOFTIRQD[@]}"; do sum=$((sum + $(cpu_ticks "$p"))); done
  echo "$sum"
}
children_ticks() { awk '{print $16 + $17}' "/proc/$$/stat"; }
machine_ticks() {
  local _c u n sy id io irq sirq st _rest
  read -r _c u n sy id io irq sirq st _rest </proc/stat
  echo "$((u + n + sy + irq + sirq + st)) $((u + n + sy + irq + sirq + st + id + io))"
}

# Percent of the machine busy over the next $1 seconds.
busy_pct() {
  local b0 t0 b1 t1
  read -r b0 t0 < <(machine_ticks)
  nap "$1"
  read -r b1 t1 < <(machine_ticks)
  echo $((100 * (b1 - b0) / (t1 - t0 > 0 ? t1 - t0 : 1)))
}

# Waits, up to QUIET_WAIT_S seconds, until others use less than QUIET_PCT of the CPU.
wait_quiet() {
  local start=$SECONDS pct
  while pct=$(busy_pct 0.5) && ((pct >= QUIET_PCT && SECONDS - start < QUIET_WAIT_S)); do :; done
  ((pct < QUIET_PCT)) || log "machine ${pct}% busy with other work; measuring anyway"
}

# others_pct BUSY0 TOTAL0 OWN_TICKS: the share of the machine that processes other
# than ours used since machine_ticks said "BUSY0 TOTAL0".
others_pct() {
  local b1 t1
  read -r b1 t1 < <(machine_ticks)
  local others=$((b1 - $1 - $3))
  echo $((100 * (others > 0 ? others : 0) / (t1 - $2 > 0 ? t1 - $2 : 1)))
}

# Median of numbers on stdin.
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Agents run through the project's helpers: start_agent, stop_agents, field, pids;
# they read $agent, $run and $agent_prefix.
# shellcheck disable=SC2034
agent=$AGENT
. "$ROOT/scripts/lib/agents.sh"
# shellcheck disable=SC2034
agent_prefix=("${RUN[@]}")
SHMEM_KNOB=/sys/kernel/mm/transparent_hugepage/shmem_enabled
shmem_mode() { sed -n 's/.*\[\(.*\)\].*/\1/p' "$SHMEM_KNOB" 2>/dev/null || echo unknown; }
SHMEM_BEFORE=$(shmem_mode)
restore_shmem() { [[ -z ${SHMEM_HUGE:-} ]] || echo "$SHMEM_BEFORE" >"$SHMEM_KNOB" || true; }
trap 'stop_agents; restore_shmem' EXIT
if [[ -n ${SHMEM_HUGE:-} ]]; then
  echo "$SHMEM_HUGE" >"$SHMEM_KNOB" || { log "cannot set $SHMEM_KNOB to $SHMEM_HUGE"; exit 1; }
fi
# Mutual TLS, as deployed (what a measurement should include): certificates per
# agent, and the router's and engine's for the bench (scripts/lib/agents.sh).
pki_init "$RESULTS/pki"

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
# agents' memory. Appends the bench's JSON with tag, CPU, memory and bg_pct fields
# to $FL.
run_bench() {
  local tag=$1 idle_a idle_b peak_a peak_b after_a after_b cpu0 cpu1 kids0 kids1 out m0 t0
  local own0 own1
  shift
  wait_quiet
  idle_a=$(mem_of "$A_PID") idle_b=$(mem_of "$B_PID")
  rm -f "$RESULTS/peak.a"* "$RESULTS/peak.b"*
  sample_peak "$A_PID" "$RESULTS/peak.a" &
  local sampler_a=$!
  sample_peak "$B_PID" "$RESULTS/peak.b" &
  local sampler_b=$!
  cpu0=$(($(cpu_ticks "$A_PID") + $(cpu_ticks "$B_PID")))
  kids0=$(children_ticks)
  own0=$(($(softirqd_ticks) + $(cpu_ticks "$sampler_a") + $(cpu_ticks "$sampler_b")))
  read -r m0 t0 < <(machine_ticks)
  out=$("${RUN[@]}" "$BENCH" --json "${demo_tls[@]}" --source_agent="$A_ADDR" --target_agent="$B_ADDR" \
    --source_socket="$A_SOCK" --target_socket="$B_SOCK" "$@" 2>>"$RESULTS/bench.stderr")
  cpu1=$(($(cpu_ticks "$A_PID") + $(cpu_ticks "$B_PID")))
  kids1=$(children_ticks) # the bench, reaped
  own1=$(($(softirqd_ticks) + $(cpu_ticks "$sampler_a") + $(cpu_ticks "$sampler_b")))
  local bg
  bg=$(others_pct "$m0" "$t0" $((cpu1 - cpu0 + kids1 - kids0 + own1 - own0)))
  touch "$RESULTS/peak.a.stop" "$RESULTS/peak.b.stop"
  wait "$sampler_a" "$sampler_b"
  peak_a=$(cat "$RESULTS/peak.a") peak_b=$(cat "$RESULTS/peak.b")
  after_a=$(mem_of "$A_PID") after_b=$(mem_of "$B_PID")
  echo "$out" | jq -c --arg tag "$tag" --argjson cpu_ticks $((cpu1 - cpu0)) \
    --argjson hz "$(getconf CLK_TCK)" --argjson bg "$bg" \
    --arg idle_a "$idle_a" --arg idle_b "$idle_b" --arg peak_a "$peak_a" \
    --arg peak_b "$peak_b" --arg after_a "$after_a" --arg after_b "$after_b" \
    '. + {tag: $tag, agents_cpu_s: ($cpu_ticks / $hz), bg_pct: $bg,
          mem_kib: {idle_a: $idle_a, idle_b: $idle_b, peak_a: $peak_a, peak_b: $peak_b,
                    after_a: $after_a, after_b: $after_b}}' >>"$FL"
}

# run_iperf TAG STREAMS ARGS...: one iperf3 server for this run, the client with
# -P STREAMS; appends {tag, streams, gbps, cpu_s, bg_pct} to $IP.
run_iperf() {
  local tag=$1 streams=$2 port m0 t0 json cpu_ticks
  shift 2
  wait_quiet
  port=$(free_port)
  timeout $((IPERF_SECONDS + 20)) "${RUN[@]}" iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
  local server=$!
  nap 0.3
  local soft0
  soft0=$(softirqd_ticks)
  read -r m0 t0 < <(machine_ticks)
  json=$("${RUN[@]}" iperf3 -c 127.0.0.1 -B 127.0.0.1 -p "$port" -P "$streams" -t "$IPERF_SECONDS" -J "$@")
  # iperf3's own CPU, client and server, from its report.
  cpu_ticks=$(echo "$json" | jq --argjson hz "$(getconf CLK_TCK)" \
    '((.end.cpu_utilization_percent.host_total + .end.cpu_utilization_percent.remote_total)
      / 100 * .end.sum_received.seconds * $hz) | floor')
  local bg
  bg=$(others_pct "$m0" "$t0" $((cpu_ticks + $(softirqd_ticks) - soft0)))
  echo "$json" | jq -c --arg tag "$tag" --argjson streams "$streams" --argjson bg "$bg" \
    '{tag: $tag, streams: $streams, bg_pct: $bg,
      gbps: (.end.sum_received.bits_per_second / 8e9),
      seconds: .end.sum_received.seconds,
      cpu_s: ((.end.cpu_utilization_percent.host_total
               + .end.cpu_utilization_percent.remote_total) / 100
              * .end.sum_received.seconds)}' >>"$IP"
  wait "$server" || true
}

TRANSFER=(--workload=transfer --warmup=1 --reps="$REPS")
# The default pair's runs add transfers into newly registered tensors over the warm
# connections: the first transfer's cost of new memory apart from a new agent's.
NEW_MEMORY_REPS=2
# GB moved by one bench run (warmup included), for CPU seconds per GB.
RUN_GB=$(awk -v r="$REPS" 'BEGIN {print (r + 1) * 1073741824 / 1e9}')
RUN_GB_C2=$(awk -v r="$REPS" -v m="$NEW_MEMORY_REPS" 'BEGIN {print (r + 1 + m) * 1073741824 / 1e9}')

# --- 1. throughput, and memory at each NIC count -----------------------------------
for round in $(seq "$ROUNDS"); do
  for n in "${NIC_COUNTS[@]}"; do
    log "round $round/$ROUNDS: $n NICs"
    start_pair "$n" --connections_per_nic=1
    run_bench "fl-c1-n$n" "${TRANSFER[@]}"
    stop_pair
    start_pair "$n" # the default, --connections_per_nic=2
    run_bench "fl-c2-n$n" "${TRANSFER[@]}" --new_memory_reps="$NEW_MEMORY_REPS"
    stop_pair
    run_iperf "ip-n$n" "$n"
    run_iperf "ip1m-n$n" "$n" -l 1M
    run_iperf "ip-n$((2 * n))" "$((2 * n))"
  done
  # A fresh pair's first 4 KiB transfer: the peer session's bootstrap, nearly alone.
  start_pair 4
  run_bench boot-n4 --workload=transfer --layers=1 --blocks=1 --block_bytes=4096 \
    --warmup=1 --reps=9
  stop_pair
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
RPC_IDLE_A=$(mem_of "$A_PID") RPC_IDLE_B=$(mem_of "$B_PID")
rpc_cpu0=$(($(cpu_ticks "$A_PID") + $(cpu_ticks "$B_PID")))
rpc_kids0=$(children_ticks)
rpc_soft0=$(softirqd_ticks)
read -r rpc_m0 rpc_t0 < <(machine_ticks)
"${RUN[@]}" "$BENCH" --json "${demo_tls[@]}" --workload=rpc --rpc_calls=2000 --concurrency=1,4,16 --rpc_seconds=3 \
  --source_agent="$A_ADDR" --target_agent="$B_ADDR" --source_socket="$A_SOCK" \
  --target_socket="$B_SOCK" 2>>"$RESULTS/bench.stderr" >"$RESULTS/rpc.jsonl"
rpc_own=$(($(cpu_ticks "$A_PID") + $(cpu_ticks "$B_PID") - rpc_cpu0 + $(children_ticks) - rpc_kids0 +
  $(softirqd_ticks) - rpc_soft0))
RPC_BG=$(others_pct "$rpc_m0" "$rpc_t0" "$rpc_own")
RPC_AFTER_A=$(mem_of "$A_PID") RPC_AFTER_B=$(mem_of "$B_PID")
# The agent's CPU while idle again, with the finished transfers it keeps.
t0=$(cpu_ticks "$A_PID")
nap 3
RPC_IDLE_CPU_PCT=$(((($(cpu_ticks "$A_PID") - t0) * 100 / $(getconf CLK_TCK)) / 3))
stop_pair

# --- 5. planner ----------------------------------------------------------------------
log "planner micro-benchmark"
wait_quiet
"${RUN[@]}" "$PLAN_BENCH" --benchmark_min_time=0.2 --benchmark_format=console \
  >"$RESULTS/plan_bench.txt" 2>/dev/null

# --- tables --------------------------------------------------------------------------
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; } # KiB -> MiB
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

# pick FILE TAG: the runs of TAG that a table uses, one JSON object a line: the clean
# ones, or all of them (each marked "all": true) when none was clean.
pick() {
  jq -c --arg t "$2" --argjson clean "$CLEAN_PCT" -s \
    '[.[] | select(.tag == $t)] as $runs
     | [$runs[] | select(.bg_pct < $clean)] as $ok
     | if ($ok | length) > 0 then $ok[] else ($runs[] | . + {all: true}) end' "$1"
}
# of FILE TAG JQ_EXPR: the median of JQ_EXPR over pick FILE TAG.
of() { pick "$1" "$2" | jq -r "$3" | median; }
# clean FILE TAG: "k/n" clean runs, or "!0/n".
clean() {
  local n k
  n=$(jq -r --arg t "$2" 'select(.tag == $t) | .tag' "$1" | wc -l)
  k=$(jq -r --arg t "$2" --argjson c "$CLEAN_PCT" 'select(.tag == $t and .bg_pct < $c) | .tag' "$1" | wc -l)
  ((k > 0)) && echo "$k/$n" || echo "!0/$n"
}
# cell TAG: "median [min-max] k/n" of a fuselink tag's picked runs, min and max from
# the runs' own gbps_min and gbps_max.
cell() {
  local med lo hi
  med=$(of "$FL" "$1" .gbps_median)
  lo=$(pick "$FL" "$1" | jq -r .gbps_min | sort -g | head -1)
  hi=$(pick "$FL" "$1" | jq -r .gbps_max | sort -g | tail -1)
  printf '%.2f [%.2f-%.2f] %s' "$med" "$lo" "$hi" "$(clean "$FL" "$1")"
}
ipcell() { printf '%.2f %s' "$(of "$IP" "$1" .gbps)" "$(clean "$IP" "$1")"; }

echo
if [[ -n ${CODE_REV:-} ]]; then
  code=$CODE_REV
elif git -C "$ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
  code="$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || echo ' + uncommitted changes')"
else
  code="not a git checkout"
fi
echo "code: $code; binaries built $(date -u -r "$AGENT" +%H:%MZ)"
echo "machine: $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')), $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); agents, bench and iperf3 at nice $NICE"
echo "huge pages for shared memory (shmem_enabled): $(shmem_mode); the tensors' memfds ask for them"
echo "rounds: $ROUNDS. A fuselink run: 1 warm-up + $REPS transfers of 1 GiB, its median; iperf3: -t $IPERF_SECONDS."
echo "Cells: median over clean runs (others used < $CLEAN_PCT% of the CPU meanwhile), k/n = clean/all;"
echo "'!' = no clean run, all used. [min-max] = slowest and fastest single transfer of those runs."
echo
echo "Throughput, GB/s (1e9 B/s), policy stripe. Same number of TCP streams on both sides:"
echo "fuselink --connections_per_nic=1 (N streams) vs iperf3 -P N, 128 KiB writes (default) and -l 1M."
printf "%-4s | %-26s | %-12s | %-5s | %-12s | %-5s\n" \
  "NICs" "fuselink c=1" "iperf3 -P N" "ratio" "iperf3 -l 1M" "ratio"
for n in "${NIC_COUNTS[@]}"; do
  fl=$(of "$FL" "fl-c1-n$n" .gbps_median)
  printf "%-4s | %-26s | %-12s | %-5s | %-12s | %-5s\n" "$n" "$(cell "fl-c1-n$n")" \
    "$(ipcell "ip-n$n")" "$(ratio "$fl" "$(of "$IP" "ip-n$n" .gbps)")" \
    "$(ipcell "ip1m-n$n")" "$(ratio "$fl" "$(of "$IP" "ip1m-n$n" .gbps)")"
done
echo
echo "The agent's default --connections_per_nic=2 (2N streams) vs iperf3 -P 2N (128 KiB writes)."
printf "%-4s | %-26s | %-12s | %-5s\n" "NICs" "fuselink c=2" "iperf3 -P 2N" "ratio"
for n in "${NIC_COUNTS[@]}"; do
  fl=$(of "$FL" "fl-c2-n$n" .gbps_median)
  printf "%-4s | %-26s | %-12s | %-5s\n" "$n" "$(cell "fl-c2-n$n")" \
    "$(ipcell "ip-n$((2 * n))")" "$(ratio "$fl" "$(of "$IP" "ip-n$((2 * n))" .gbps)")"
done
echo
echo "The first transfer (each run's warm-up: new agents, their peer link not yet up, tensors"
echo "just registered) and transfers into newly registered tensors over the warm link (median"
echo "of $NEW_MEMORY_REPS, after the others) against the later ones of the same run, fuselink c=2, GB/s."
printf "%-4s | %-8s | %-10s | %-8s | %-11s | %-9s\n" "NICs" "first" "new memory" "later" \
  "later/first" "later/new"
for n in "${NIC_COUNTS[@]}"; do
  first=$(of "$FL" "fl-c2-n$n" .cold_gbps)
  fresh=$(of "$FL" "fl-c2-n$n" .new_memory_gbps)
  later=$(of "$FL" "fl-c2-n$n" .gbps_median)
  printf "%-4s | %-8.2f | %-10.2f | %-8.2f | %-11s | %-9s\n" "$n" "$first" "$fresh" "$later" \
    "$(ratio "$later" "$first")" "$(ratio "$later" "$fresh")"
done
ms_of() { of "$FL" boot-n4 "4096 / 1e9 / $1 * 1000"; }
printf "A fresh pair's first 4 KiB transfer (its peer session's bootstrap: the Hello RPC over\n"
printf "mutual TLS, then the fabric's connections), 4 NICs: %.1f ms; the later ones %.2f ms %s.\n" \
  "$(ms_of .cold_gbps)" "$(ms_of .gbps_median)" "$(clean "$FL" boot-n4)"
echo
echo "CPU seconds per GB moved, both ends (fuselink: both agents' utime+stime over a run,"
echo "warm-up included; iperf3: client + server as it reports them)."
printf "%-4s | %-12s | %-12s | %-11s | %-12s\n" "NICs" "fuselink c=1" "fuselink c=2" "iperf3 -P N" "iperf3 -l 1M"
for n in "${NIC_COUNTS[@]}"; do
  printf "%-4s | %-12.3f | %-12.3f | %-11.3f | %-12.3f\n" "$n" \
    "$(of "$FL" "fl-c1-n$n" ".agents_cpu_s / $RUN_GB")" \
    "$(of "$FL" "fl-c2-n$n" ".agents_cpu_s / $RUN_GB_C2")" \
    "$(of "$IP" "ip-n$n" '.cpu_s / (.gbps * .seconds)')" \
    "$(of "$IP" "ip1m-n$n" '.cpu_s / (.gbps * .seconds)')"
done

echo
echo "Agent memory, MiB, 4 NICs, default flags (last round). RssAnon is the agent's own memory;"
echo "RssShmem counts tensor pages (the engine's memfd, mapped) once the agent touched them."
printf "%-6s | %-5s | %-7s | %-7s | %-7s | %-8s\n" "agent" "when" "VmRSS" "RssAnon" "RssFile" "RssShmem"
row=$(jq -c 'select(.tag == "fl-c2-n4")' "$FL" | tail -1)
for side in a b; do
  for when in idle peak after; do
    read -r r a f s < <(echo "$row" | jq -r --arg k "${when}_$side" '.mem_kib[$k]')
    printf "%-6s | %-5s | %-7s | %-7s | %-7s | %-8s\n" \
      "$([[ $side == a ]] && echo source || echo target)" "$when" \
      "$(mib "$r")" "$(mib "$a")" "$(mib "$f")" "$(mib "$s")"
  done
done
echo "(peak: 20 ms samples during the run: 1 warm-up + $REPS transfers of 1 GiB; after: once it exited)"
in_use=$(grep -c TENSOR_IN_USE "$RESULTS/bench.stderr" || true)
if ((in_use > 0)); then
  echo "note: $in_use UnregisterTensor calls after finished transfers failed TENSOR_IN_USE, so the"
  echo "tensors stay mapped in the agents and 'after' still counts their pages in RssShmem."
fi

echo
echo "Chunk-size sweep, 4 NICs, default flags otherwise (window 16 chunks, 2 connections per NIC)"
printf "%-9s | %-26s | %-8s | %-18s | %-18s\n" "chunk" "GB/s" "cpu s/GB" \
  "peak RssAnon src" "peak RssAnon dst"
for kib in "${CHUNKS_KIB[@]}"; do
  pa=$(jq -r --arg t "chunk-$kib" 'select(.tag == $t) | .mem_kib.peak_a | split(" ")[1]' "$FL" | sort -g | tail -1)
  pb=$(jq -r --arg t "chunk-$kib" 'select(.tag == $t) | .mem_kib.peak_b | split(" ")[1]' "$FL" | sort -g | tail -1)
  printf "%-9s | %-26s | %-8.3f | %-18s | %-18s\n" "$kib KiB" "$(cell "chunk-$kib")" \
    "$(of "$FL" "chunk-$kib" ".agents_cpu_s / $RUN_GB")" "$(mib "$pa") MiB" "$(mib "$pb") MiB"
done

echo
echo "rpc workload, 4 NICs, default flags: 1 block of 4 KiB per transfer (others used ${RPC_BG}% of the CPU meanwhile)"
jq -r 'select(.kind == "rpc_latency") |
  "sequential \(.calls) calls: accepted p50 \(.accepted_p50_us | floor) us, p99 \(.accepted_p99_us | floor) us, max \(.accepted_max_us | floor) us; completed p50 \(.completed_p50_us | floor) us, p99 \(.completed_p99_us | floor) us"' \
  "$RESULTS/rpc.jsonl"
printf "%-7s | %-9s | %-11s | %-16s | %-16s\n" "callers" "transfers" "transfers/s" "completed p50 us" "completed p99 us"
jq -r 'select(.kind == "rpc_rate") | [.callers, .transfers, .transfers_per_s, .completed_p50_us, .completed_p99_us] | @tsv' \
  "$RESULTS/rpc.jsonl" | while IFS=$'\t' read -r k t r p50 p99; do
  printf "%-7s | %-9s | %-11.0f | %-16.0f | %-16.0f\n" "$k" "$t" "$r" "$p50" "$p99"
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
