#!/bin/bash
# Metrics, checked by the real tools: two agents move a KV cache; each /metrics
# passes `promtool check metrics`; a real Prometheus server scrapes both and its
# query API shows the bytes per NIC that the transfer moved.
# Usage: metrics_test.sh AGENT_BINARY FUSELINKCTL_BINARY
set -euo pipefail
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-metrics.XXXXXX)
. "$here/scripts/lib/agents.sh"
prom_pid=""
trap '[ -n "$prom_pid" ] && kill $prom_pid 2>/dev/null; stop_agents; wait; rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

start_agent node-b 12 "" --nics=4
start_agent node-a 11 "node-b=$(field "$run/node-b.json" grpc)" --nics=4 --policy=stripe
a=$(field "$run/node-a.json" grpc)
b=$(field "$run/node-b.json" grpc)

# 4 layers x 16 blocks x 64 KiB = 4 MiB
"$ctl" --agent="$a" --target_agent="$b" --source_socket="$run/node-a.sock" \
  --target_socket="$run/node-b.sock" --demo_layers=4 --demo_blocks=16 \
  --demo_block_bytes=65536 demo >"$run/demo.out" 2>&1 || { cat "$run/demo.out"; fail "demo"; }
grep -q "bytes match" "$run/demo.out" || fail "demo did not verify"
total=4194304

for n in node-a node-b; do
  curl -sf "$(field "$run/$n.json" metrics)" >"$run/$n.metrics" || fail "scrape $n"
  promtool check metrics <"$run/$n.metrics" || fail "promtool check metrics on $n"
  for family in fuselink_nic_transmitted_bytes_total fuselink_nic_received_bytes_total \
    fuselink_transfers_total fuselink_transfer_duration_seconds_bucket \
    fuselink_fabric_malformed_frames_total fuselink_transfers_active; do
    grep -q "^$family" "$run/$n.metrics" || fail "$n lacks $family"
  done
done
sent=$(awk '/^fuselink_nic_transmitted_bytes_total/ {s += $2} END {printf "%d", s}' "$run/node-a.metrics")
[ "$sent" = "$total" ] || fail "node-a transmitted $sent bytes, want $total"
grep -q '^fuselink_transfers_total{outcome="completed"} 1' "$run/node-a.metrics" ||
  fail "node-a does not count its completed transfer"

# A real Prometheus server scrapes both agents.
strip() { field "$run/$1.json" metrics | sed 's|http://||; s|/metrics||'; }
cat >"$run/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: fuselink
    static_configs:
      - targets: ['$(strip node-a)', '$(strip node-b)']
YAML
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 20000))
  prometheus --config.file="$run/prometheus.yml" --storage.tsdb.path="$run/tsdb" \
    --web.listen-address="127.0.0.1:$port" >"$run/prometheus.log" 2>&1 &
  prom_pid=$!
  sleep 1
  kill -0 $prom_pid 2>/dev/null && break
  prom_pid=""
done
[ -n "$prom_pid" ] || { cat "$run/prometheus.log"; fail "prometheus did not start"; }

query='sum(fuselink_nic_received_bytes_total{job="fuselink"})'
got=""
for _ in $(seq 30); do
  got=$(curl -sf "http://127.0.0.1:$port/api/v1/query" --data-urlencode "query=$query" |
    sed -n 's/.*"value":\[[^,]*,"\([0-9.e+]*\)"\].*/\1/p')
  [ "$got" = "$total" ] && break
  sleep 1
done
[ "$got" = "$total" ] || { tail "$run/prometheus.log"; fail "Prometheus reports '$got' received bytes, want $total"; }
nics=$(curl -sf "http://127.0.0.1:$port/api/v1/query" \
  --data-urlencode 'query=count(fuselink_nic_received_bytes_total > 0)' |
  sed -n 's/.*"value":\[[^,]*,"\([0-9]*\)"\].*/\1/p')
[ "$nics" = "4" ] || fail "Prometheus sees bytes on $nics NICs, want 4"
echo "PASS: promtool clean on both agents; Prometheus scraped $got bytes over $nics NICs"
