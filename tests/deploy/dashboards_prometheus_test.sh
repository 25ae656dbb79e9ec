#!/bin/bash
# The dashboards against a real Prometheus scraping real agents: two agents on the
# namespace testbed (four 1 Gbit/s rails, the fuselink policy) run a workload with
# borrowing (a hot sender), a give-back (the owner of rail1 returns) and a failed rail
# (rail1 of node 0 goes down mid-transfer). Prometheus scrapes both every second and
# evaluates deploy/prometheus/fuselink-alerts.yaml. Then every query of every panel
# must return data over the workload's span (dashboard_queries.py check; GPU-only
# queries are reported as not checked when no agent has GPUs), the traffic panels
# must show what the workload did, and the rail-down drill must fire FuselinkNicFailed
# for rail1 (/api/v1/alerts). Skips (77) where no testbed can be built.
# Usage: dashboards_prometheus_test.sh AGENT FUSELINKCTL FUSELINK_BENCH
set -euo pipefail
agent=$1
ctl=$2
bench=$3
here=$(cd "$(dirname "$0")/../.." && pwd)

. "$here/scripts/lib/testbed.sh"
testbed_test_start fld
prom_pid=""
demo_pid=""
testbed_on_exit_hook() {
  [ -z "$demo_pid" ] || kill "$demo_pid" 2>/dev/null
  [ -z "$prom_pid" ] || { kill "$prom_pid" 2>/dev/null; wait "$prom_pid" 2>/dev/null; }
}

"$tb" up --name "$name" --nodes 2 --rails 4 --rate 1gbit
testbed_load "$name"
out=$TESTBED_STATE
pki_init "$out/pki"  # mutual TLS, as deployed: scripts/lib/agents.sh
chunk=1048576
for i in 0 1; do
  j=$((1 - i))
  # shellcheck disable=SC2034  # read by launch_agent (scripts/lib/agents.sh)
  agent_prefix=(ip netns exec "$(testbed_ns "$i")")
  # shellcheck disable=SC2034
  agent_dir=$out
  # shellcheck disable=SC2034  # the address fuselinkctl dials, in the certificate
  agent_sans=("IP:$(testbed_mgmt "$i")")
  launch_agent "fuselink-n$i" --topology="$(testbed_var TOPOLOGY "$i")" \
    --listen="$(testbed_mgmt "$i"):17350" --metrics_listen="$(testbed_mgmt "$i"):17351" \
    --peer="fuselink-n$j=$(testbed_mgmt "$j"):17350" --policy=fuselink --chunk_bytes="$chunk"
done
agent_prefix=() agent_sans=()

# Prometheus as an operator without the operator runs it: job "fuselink", the rules file.
cat >"$out/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $here/deploy/prometheus/fuselink-alerts.yaml
scrape_configs:
  - job_name: fuselink
    static_configs:
      - targets: ['$(testbed_mgmt 0):17351', '$(testbed_mgmt 1):17351']
YAML
promtool check config "$out/prometheus.yml" >/dev/null || fail "promtool check config"
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 20000))
  prometheus --config.file="$out/prometheus.yml" --storage.tsdb.path="$out/tsdb" \
    --web.listen-address="127.0.0.1:$port" >"$out/prometheus.log" 2>&1 &
  prom_pid=$!
  sleep 1
  kill -0 "$prom_pid" 2>/dev/null && break
  prom_pid=""
done
[ -n "$prom_pid" ] || fail "prometheus did not start"
prom=http://127.0.0.1:$port
value() { # QUERY: the first result's value, or empty
  curl -sf "$prom/api/v1/query" --data-urlencode "query=$1" |
    /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
for _ in $(seq 30); do
  [ "$(value 'sum(up{job="fuselink"})')" = 2 ] && break
  sleep 1
done
[ "$(value 'sum(up{job="fuselink"})')" = 2 ] || fail "Prometheus does not scrape both agents"
start=$(date +%s)
sleep 3

bench_run() { # WORKLOAD OUTPUT [FLAGS...]
  local w=$1 o=$2
  shift 2
  "$bench" --workload="$w" --policies=fuselink --cluster_dir="$out" --json "${demo_tls[@]}" \
    --chunk_bytes="$chunk" --rail_bytes_per_s="$TESTBED_RATE_BYTES_PER_S" "$@" >"$o" 2>&1 ||
    { cat "$o"; fail "fuselink-bench --workload=$w"; }
}
echo "workload: a hot sender borrows the idle rails"
bench_run hot "$out/hot.json" --hot_bytes=268435456
echo "workload: the owner of rail1 returns while GPU 0 streams (a give-back)"
bench_run owner "$out/owner.json" --owner_borrower_bytes=536870912 --owner_bytes=100663296 \
  --owner_delay_s=0.5
echo "workload: rail1 of node 0 goes down mid-transfer"
a=$(field "$out/fuselink-n0.json" grpc)
stdbuf -oL "$ctl" --agent="$a" --target_agent="$(field "$out/fuselink-n1.json" grpc)" \
  "${demo_tls[@]}" \
  --source_socket="$out/fuselink-n0.sock" --target_socket="$out/fuselink-n1.sock" \
  --demo_layers=16 --demo_blocks=64 --demo_block_bytes=1048576 --timeout_s=120 \
  demo >"$out/demo.out" 2>&1 &
demo_pid=$!
for _ in $(seq 100); do
  grep -q accepted "$out/demo.out" && break
  sleep 0.1
done
sleep 0.5
testbed_exec 0 ip link set rail1 down
rc=0
wait "$demo_pid" || rc=$?
demo_pid=""
[ "$rc" -eq 0 ] || fail "the transfer with a failed rail did not complete"
sleep 4
end=$(date +%s)

echo "== every panel's query over the workload ($((end - start)) s)"
"$here/tests/deploy/dashboard_queries.py" check "$prom" "$start" "$end" "$here/docs/metrics.md" \
  "$here"/dashboards/*.json || fail "a panel's query returned no data"

span="$((end - start + 5))s"
want_positive() { # WHAT QUERY
  local v
  v=$(value "$2")
  /usr/bin/python3 -c "import sys; sys.exit(0 if float('${v:-0}') > 0 else 1)" ||
    fail "$1: '$2' is '${v}'"
  echo "ok: $1 ($v)"
}
want_positive "borrowed bytes on node 0's rails 1-3" \
  "sum(increase(fuselink_nic_transmitted_bytes_total{job=\"fuselink\", traffic=\"borrowed\", nic=~\"rail[123]\"}[$span]))"
want_positive "give-backs counted" "sum(increase(fuselink_nic_give_back_events_total{job=\"fuselink\"}[$span]))"
want_positive "give-back latency observed" "sum(increase(fuselink_nic_give_back_seconds_count{job=\"fuselink\"}[$span]))"
want_positive "failed writes on rail1" \
  "sum(increase(fuselink_nic_failed_writes_total{job=\"fuselink\", nic=\"rail1\"}[$span]))"
want_positive "completed transfers" "sum(increase(fuselink_transfers_total{job=\"fuselink\", outcome=\"completed\"}[$span]))"

echo "== the rail-down drill: FuselinkNicFailed fires"
firing=""
for _ in $(seq 30); do
  firing=$(curl -sf "$prom/api/v1/alerts" | /usr/bin/python3 -c '
import json, sys
for a in json.load(sys.stdin)["data"]["alerts"]:
    l = a["labels"]
    if l["alertname"] == "FuselinkNicFailed" and l.get("nic") == "rail1" and a["state"] == "firing":
        print(l["instance"], l["nic"], a["activeAt"])')
  [ -n "$firing" ] && break
  sleep 1
done
[ -n "$firing" ] || fail "FuselinkNicFailed did not fire for rail1"
echo "ok: FuselinkNicFailed firing: $firing"
others=$(curl -sf "$prom/api/v1/alerts" | /usr/bin/python3 -c '
import json, sys
print(" ".join(sorted({a["labels"]["alertname"] for a in json.load(sys.stdin)["data"]["alerts"]} - {"FuselinkNicFailed"})))')
[ -z "$others" ] || fail "alerts other than FuselinkNicFailed are active: $others"
echo "PASS: every panel's query returned data from real agents; FuselinkNicFailed fired on the rail-down drill, and no other alert"
