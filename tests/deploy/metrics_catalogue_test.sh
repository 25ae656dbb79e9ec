#!/bin/bash
# docs/metrics.md against a live agent's /metrics, both ways (metrics_catalogue.py),
# after a small transfer so that every family has moved; the scrape also passes
# promtool check metrics. Then the checker itself is shown to catch drift: a catalogue
# with a row removed, one with a label renamed, one with an extra row, and a scrape
# with a GPU family in a CPU-only shape, and one with only one of the foreign-traffic
# families, all fail.
# Usage: metrics_catalogue_test.sh AGENT_BINARY FUSELINKCTL_BINARY
set -euo pipefail
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-catalogue.XXXXXX)
. "$here/scripts/lib/agents.sh"
trap 'stop_agents; rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pki_init "$run/pki"  # mutual TLS, as deployed: scripts/lib/agents.sh
cat_py=$here/tests/deploy/metrics_catalogue.py
doc=$here/docs/metrics.md
src=("$here/agent" "$here/services")  # where the families are declared

start_agent cat-b 74 "" --nics=2 --gpu=off
start_agent cat-a 73 "cat-b=$(field "$run/cat-b.json" grpc)" --nics=2 --gpu=off
"$ctl" --agent="$(field "$run/cat-a.json" grpc)" --target_agent="$(field "$run/cat-b.json" grpc)" \
  "${demo_tls[@]}" \
  --source_socket="$run/cat-a.sock" --target_socket="$run/cat-b.sock" --demo_layers=2 \
  --demo_blocks=4 --demo_block_bytes=65536 demo >"$run/demo.out" 2>&1 ||
  { cat "$run/demo.out"; fail "demo transfer"; }
curl -sf "$(field "$run/cat-a.json" metrics)" >"$run/scrape.txt" || fail "scrape"
promtool check metrics <"$run/scrape.txt" || fail "promtool check metrics"
"$cat_py" "$doc" "$run/scrape.txt" "${src[@]}" || fail "docs/metrics.md and the agent differ (see above)"

# The checker catches each kind of drift.
# shellcheck disable=SC2016  # markdown backticks, not command substitution
grep -v '^| `fuselink_tensors_registered`' "$doc" >"$run/missing.md"
# shellcheck disable=SC2016  # markdown backticks, not command substitution
sed 's/^| `fuselink_transfers_total` | counter | outcome |/| `fuselink_transfers_total` | counter | result |/' "$doc" >"$run/relabel.md"
# shellcheck disable=SC2016  # markdown backticks, not command substitution
{ cat "$doc"; echo '| `fuselink_imaginary_total` | counter | | things | all | Not exported. |'; } >"$run/extra.md"
# shellcheck disable=SC2016  # markdown backticks, not command substitution
sed 's/^| `fuselink_relay_paused` | gauge | gpu | 0 or 1 | GPU |/| `fuselink_relay_paused` | gauge | gpu | 0 or 1 | all |/' "$doc" >"$run/gpu.md"
# A GPU agent's scrape missing its other GPU families (and with a wrong label).
{ cat "$run/scrape.txt"; printf '# TYPE fuselink_relay_paused gauge
fuselink_relay_paused{device="0"} 0
'; } >"$run/gpu-scrape.txt"
cp "$doc" "$run/gpu-scrape.md"
# An agent that watches NIC counters but exports only one of their families.
{ cat "$run/scrape.txt"; printf '# TYPE fuselink_nic_foreign_busy gauge
fuselink_nic_foreign_busy{nic="rail0",owner_gpu="0",direction="tx"} 0
'; } >"$run/watched-scrape.txt"
cp "$doc" "$run/watched-scrape.md"
for drift in missing relabel extra gpu gpu-scrape watched-scrape; do
  scrape=$run/scrape.txt
  [ "$drift" = gpu-scrape ] && scrape=$run/gpu-scrape.txt
  [ "$drift" = watched-scrape ] && scrape=$run/watched-scrape.txt
  if "$cat_py" "$run/$drift.md" "$scrape" "${src[@]}" >"$run/$drift.out"; then
    fail "the checker passed a catalogue with drift '$drift'"
  fi
  grep -q "difference" "$run/$drift.out" || fail "no report for drift '$drift'"
done
echo "PASS: docs/metrics.md matches the live agent both ways; removed, relabelled, extra and mis-placed rows and partial GPU and foreign-traffic scrapes are caught"
