#!/usr/bin/env bash
# What mutual TLS and the fabric handshake cost: the same binaries, mTLS against
# --plaintext, interleaved round by round in one sitting (a shared machine is noisy;
# only the ratios side by side mean anything):
#   1. throughput: a 1 GiB transfer over 1, 2 and 4 emulated NICs (policy stripe);
#   2. the rpc workload: accepted-event latency at one caller, small transfers per
#      second at 4 and 16 callers.
# Prints one table of medians and the mTLS/plaintext ratios; raw JSON lines stay in
# $RESULTS. About 4 minutes with ROUNDS=3.
#
# Environment: ROUNDS (3), REPS (3), NET (first of two loopback nets, 232), BUILD
# (build: the binaries as they are; this script builds nothing).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
NET=${NET:-232}
RESULTS=$(mktemp -d /tmp/fuselink-bench-security.XXXXXX)
BENCH=$BUILD/tools/bench/fuselink-bench
log() { echo "== $(date +%T) $*" >&2; }

# shellcheck disable=SC2034
agent=$BUILD/services/fuselink-agent
. "$ROOT/scripts/lib/agents.sh"
trap stop_agents EXIT
pki_init "$RESULTS/pki"

# pair MODE NICS: agents a and b, ports from the kernel, mTLS or --plaintext.
pair() {
  local mode=$1 nics=$2 extra=()
  [ "$mode" = plaintext ] && extra=(--plaintext)
  run=$(mktemp -d "$RESULTS/pair.XXXX")
  chmod 0700 "$run"
  start_agent b $((NET + 1)) "" --nics="$nics" --policy=stripe "${extra[@]}"
  B_ADDR=$(field "$run/b.json" grpc) B_SOCK=$run/b.sock
  start_agent a "$NET" "b=$B_ADDR" --nics="$nics" --policy=stripe "${extra[@]}"
  A_ADDR=$(field "$run/a.json" grpc) A_SOCK=$run/a.sock
}

# bench MODE TAG ARGS...: fuselink-bench against the pair; appends JSON with tag and
# mode to $RESULTS/runs.jsonl.
bench() {
  local mode=$1 tag=$2 creds=("${demo_tls[@]}")
  shift 2
  [ "$mode" = plaintext ] && creds=(--plaintext)
  "$BENCH" --json "${creds[@]}" --source_agent="$A_ADDR" --target_agent="$B_ADDR" \
    --source_socket="$A_SOCK" --target_socket="$B_SOCK" "$@" 2>>"$RESULTS/bench.stderr" |
    jq -c --arg tag "$tag" --arg mode "$mode" '. + {tag: $tag, mode: $mode}' \
      >>"$RESULTS/runs.jsonl"
  stop_agents
  pids=()
}

for round in $(seq "$ROUNDS"); do
  # Alternate which mode goes first, so that neither always meets a warmer machine.
  modes=(mtls plaintext)
  ((round % 2 == 0)) && modes=(plaintext mtls)
  for mode in "${modes[@]}"; do
    for n in 1 2 4; do
      log "round $round/$ROUNDS: $mode, $n NICs"
      pair "$mode" "$n"
      bench "$mode" "n$n" --workload=transfer --warmup=1 --reps="$REPS"
    done
    log "round $round/$ROUNDS: $mode, rpc"
    pair "$mode" 4
    bench "$mode" rpc --workload=rpc --rpc_calls=1000 --concurrency=1,4,16 --rpc_seconds=3
  done
done

# median FILTER: the median of the numbers jq FILTER picks from the runs.
median() {
  jq -s "[.[] | $1] | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end" \
    "$RESULTS/runs.jsonl"
}
row() { # NAME UNIT FILTER_MTLS FILTER_PLAIN
  local m p
  m=$(median "$3") p=$(median "$4")
  awk -v n="$1" -v u="$2" -v m="$m" -v p="$p" \
    'BEGIN {printf "| %s | %s | %.3g | %.3g | %.2fx |\n", n, u, m, p, m / p}'
}
echo
echo "code: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), rounds: $ROUNDS, $(date -u +%F)"
echo "| what | unit | mTLS | plaintext | mTLS / plaintext |"
echo "|---|---|---|---|---|"
for n in 1 2 4; do
  row "1 GiB transfer, $n NICs" GB/s \
    "select(.mode == \"mtls\" and .tag == \"n$n\") | .gbps_median" \
    "select(.mode == \"plaintext\" and .tag == \"n$n\") | .gbps_median"
done
for field in accepted_p50_us accepted_p99_us; do
  row "rpc, 1 caller: $field" us \
    "select(.mode == \"mtls\" and .kind == \"rpc_latency\") | .$field" \
    "select(.mode == \"plaintext\" and .kind == \"rpc_latency\") | .$field"
done
for c in 1 4 16; do
  row "rpc, $c callers: transfers_per_s" "1/s" \
    "select(.mode == \"mtls\" and .kind == \"rpc_rate\" and .callers == $c) | .transfers_per_s" \
    "select(.mode == \"plaintext\" and .kind == \"rpc_rate\" and .callers == $c) | .transfers_per_s"
done
echo
echo "raw: $RESULTS/runs.jsonl"
