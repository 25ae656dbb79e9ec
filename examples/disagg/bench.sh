#!/bin/bash
# Time to first token of the example under an on-off load, for each scheduling policy
# with and without layer-by-layer transfer, all in one run: the same prompts and the
# same arrival times each time (router.py --poisson, from SEED), the agents in a
# testbed of two emulated nodes with RAILS rails shaped to RATE (run.sh RAILS=...), so
# that the prefill GPU's own rail is one of RAILS and the policy decides how many carry
# its K/V. Prints a markdown table (one row per run) and keeps each run's summary in
# OUT_DIR.
#
# Usage: bench.sh [AGENT_BINARY [PYTHON_DIR]]   (as run.sh takes them; root)
# Env (defaults): MODEL (llama), DEVICE (cuda), RAILS (4), RATE (10gbit), PROMPTS (64),
#   MIN_LEN (128), MAX_LEN (2048), MAX_NEW (4), RPS (6: arrivals per second while on),
#   ON_S (2), OFF_S (2), BLOCKS (2048 per engine), POLICIES ("static stripe fuselink"),
#   SEED (1), OUT_DIR (a new /tmp folder).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT_DIR:-$(mktemp -d /tmp/fuselink-disagg-bench.XXXXXX)}
mkdir -p "$out"
export MODEL=${MODEL:-llama} DEVICE=${DEVICE:-cuda} RAILS=${RAILS:-4} RATE=${RATE:-10gbit}
export PROMPTS=${PROMPTS:-64} MAX_LEN=${MAX_LEN:-2048} MAX_NEW=${MAX_NEW:-4}
export BLOCKS=${BLOCKS:-2048} SEED=${SEED:-1} CHECK=0
export ROUTER_ARGS="--min_len ${MIN_LEN:-128} --poisson ${RPS:-6} --on_s ${ON_S:-2} --off_s ${OFF_S:-2}"
echo "model $MODEL on $DEVICE; $RAILS rails at $RATE; $PROMPTS prompts of" \
  "${MIN_LEN:-128}..$MAX_LEN tokens, $MAX_NEW new; Poisson ${RPS:-6}/s, on ${ON_S:-2} s," \
  "off ${OFF_S:-2} s; summaries in $out"
echo "| policy | layer by layer | served | TTFT p50 ms | TTFT p99 ms | mean ms | queue | prefill | transfer |"
echo "|---|---|---|---|---|---|---|---|---|"
for layered in "" 1; do
  for policy in ${POLICIES:-static stripe fuselink}; do
    summary="$out/$policy${layered:+-layered}.json"
    rc=0
    POLICY=$policy LAYER_BY_LAYER=$layered SUMMARY=$summary "$here/run.sh" "$@" \
      >"$out/$policy${layered:+-layered}.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] || [ ! -s "$summary" ]; then
      echo "| $policy | ${layered:+yes}${layered:-no} | run failed (rc $rc): see $out/$policy${layered:+-layered}.log |"
      tail -n 20 "$out/$policy${layered:+-layered}.log" >&2
      continue
    fi
    python3 - "$summary" "$policy" "${layered:+yes}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
t, share = s.get("ttft_ms", {}), s.get("share_of_ttft", {})
row = [sys.argv[2], sys.argv[3] or "no", f"{s['served']}/{len(s['requests'])}",
       t.get("p50"), t.get("p99"), t.get("mean"),
       *(f"{share.get(k, 0):.0%}" for k in ("queue", "prefill", "transfer"))]
print("| " + " | ".join(str(v) for v in row) + " |")
PY
  done
done
