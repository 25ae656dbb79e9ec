#!/usr/bin/env bash
# Variants of the agent side by side, interleaved round by round in one sitting (a
# shared machine is noisy; only the ratios side by side mean anything):
#   1. transfer: a 1 GiB transfer over 1, 2 and 4 emulated NICs (policy stripe);
#   2. rpc: accepted-event latency at one caller, 4 KiB transfers per second at 1, 4
#      and 16 callers.
# Prints one table of medians and each variant's ratio to the first; raw JSON lines
# stay in $RESULTS.
#
# VARIANTS (required): space-separated NAME=BUILD:MODE. BUILD holds
# services/fuselink-agent and tools/bench/fuselink-bench (each variant runs its own
# of both); MODE is how agents and bench speak: mtls (certificates from
# scripts/certs.sh, as deployed), plaintext (--plaintext), or none (no security flags
# at all, for builds from before them). E.g.
#   VARIANTS="mtls=build:mtls plaintext=build:plaintext" (scripts/bench-security.sh)
#   VARIANTS="before=/tmp/old/build-bench:none after=build-bench:plaintext"
# Environment also: ROUNDS (3), REPS (3), NET (first of two loopback nets, 232),
# PARTS (transfer,rpc). About 2 minutes per variant and round with both parts.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
NET=${NET:-232}
PARTS=${PARTS:-transfer,rpc}
RESULTS=$(mktemp -d /tmp/fuselink-bench-ab.XXXXXX)
log() { echo "== $(date +%T) $*" >&2; }
read -r -a variants <<<"${VARIANTS:?set VARIANTS, e.g. VARIANTS=\"a=build:mtls b=build:plaintext\"}"
for v in "${variants[@]}"; do
  [[ $v =~ ^[A-Za-z0-9_-]+=[^:]+:(mtls|plaintext|none)$ ]] || {
    echo "bad variant '$v': want NAME=BUILD:mtls|plaintext|none" >&2
    exit 2
  }
done

# shellcheck disable=SC2034  # agent, pki and pids are scripts/lib/agents.sh's
agent=""
# shellcheck source=scripts/lib/agents.sh
. "$ROOT/scripts/lib/agents.sh"
trap stop_agents EXIT
pki_init "$RESULTS/pki"

# use VARIANT: sets name, build, mode, agent and the flag arrays for it.
# shellcheck disable=SC2034
use() {
  name=${1%%=*} build=${1#*=} mode=${build##*:} build=${build%:*}
  [[ $build == /* ]] || build=$ROOT/$build
  agent=$build/services/fuselink-agent
  agent_flags=() bench_flags=()
  case $mode in
    mtls) bench_flags=("${demo_tls[@]}") ;;
    plaintext) agent_flags=(--plaintext) bench_flags=(--plaintext) ;;
    none) ;;
  esac
  # A build from before TLS takes no TLS flags: launch_agent adds none without a pki.
  pki=$RESULTS/pki
  [ "$mode" != none ] || pki=""
}

# pair NICS: agents a and b of the current variant, ports from the kernel.
pair() {
  run=$(mktemp -d "$RESULTS/pair.XXXX")
  chmod 0700 "$run"
  start_agent b $((NET + 1)) "" --nics="$1" --policy=stripe "${agent_flags[@]}"
  B_ADDR=$(field "$run/b.json" grpc) B_SOCK=$run/b.sock
  start_agent a "$NET" "b=$B_ADDR" --nics="$1" --policy=stripe "${agent_flags[@]}"
  A_ADDR=$(field "$run/a.json" grpc) A_SOCK=$run/a.sock
}

# bench TAG ARGS...: the variant's fuselink-bench against the pair; appends its JSON,
# with tag and variant, to $RESULTS/runs.jsonl; stops the pair.
bench() {
  local tag=$1
  shift
  "$build/tools/bench/fuselink-bench" --json "${bench_flags[@]}" \
    --source_agent="$A_ADDR" --target_agent="$B_ADDR" \
    --source_socket="$A_SOCK" --target_socket="$B_SOCK" "$@" \
    2>>"$RESULTS/bench.stderr" |
    jq -c --arg tag "$tag" --arg v "$name" '. + {tag: $tag, variant: $v}' \
      >>"$RESULTS/runs.jsonl"
  stop_agents
  # shellcheck disable=SC2034
  pids=()
}

for round in $(seq "$ROUNDS"); do
  # Rotate which variant goes first, so that none always meets a warmer machine.
  order=()
  for i in "${!variants[@]}"; do
    order+=("${variants[(i + round - 1) % ${#variants[@]}]}")
  done
  for v in "${order[@]}"; do
    use "$v"
    if [[ $PARTS == *transfer* ]]; then
      for n in 1 2 4; do
        log "round $round/$ROUNDS: $name, $n NICs"
        pair "$n"
        bench "n$n" --workload=transfer --warmup=1 --reps="$REPS"
      done
    fi
    if [[ $PARTS == *rpc* ]]; then
      log "round $round/$ROUNDS: $name, rpc"
      pair 4
      bench rpc --workload=rpc --rpc_calls=1000 --concurrency=1,4,16 --rpc_seconds=3
    fi
  done
done

# median FILTER: the median of the numbers jq FILTER picks from the runs.
median() {
  jq -s "[.[] | $1] | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end" \
    "$RESULTS/runs.jsonl"
}
# row NAME UNIT FILTER: one line, the FILTER's median for each variant (FILTER sees
# $v as the variant's name), then each later variant's ratio to the first.
row() {
  local cells=() v
  for v in "${variants[@]}"; do cells+=("$(median "select(.variant == \"${v%%=*}\") | $3")"); done
  printf '| %s | %s |' "$1" "$2"
  printf ' %.3g |' "${cells[@]}"
  for v in "${cells[@]:1}"; do awk -v a="$v" -v b="${cells[0]}" 'BEGIN {printf " %.2fx |", a / b}'; done
  echo
}
names=() ratios=()
for v in "${variants[@]}"; do names+=("${v%%=*}"); done
for v in "${names[@]:1}"; do ratios+=("$v / ${names[0]}"); done
echo
echo "code: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), rounds: $ROUNDS, $(date -u +%F)"
echo "variants: ${variants[*]}"
printf '| what | unit |'
printf ' %s |' "${names[@]}" "${ratios[@]}"
echo
printf '|---|---|'
printf -- '---|%.0s' "${names[@]}" "${ratios[@]}"
echo
if [[ $PARTS == *transfer* ]]; then
  for n in 1 2 4; do
    row "1 GiB transfer, $n NICs" GB/s "select(.tag == \"n$n\") | .gbps_median"
  done
fi
if [[ $PARTS == *rpc* ]]; then
  for field in accepted_p50_us accepted_p99_us; do
    row "rpc, 1 caller: $field" us "select(.kind == \"rpc_latency\") | .$field"
  done
  for c in 1 4 16; do
    row "rpc, $c callers: transfers_per_s" "1/s" \
      "select(.kind == \"rpc_rate\" and .callers == $c) | .transfers_per_s"
  done
fi
echo
echo "raw: $RESULTS/runs.jsonl"
