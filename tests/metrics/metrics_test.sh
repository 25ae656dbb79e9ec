#!/bin/bash
# Metrics, checked by the real tools: two agents move a KV cache; each /metrics
# passes `promtool check metrics`; a real Prometheus server scrapes both and its
# query API shows the bytes per NIC that the transfer moved. Then a third agent with
# --metrics_web_config serves TLS with a required client certificate and basic auth
# (a throwaway CA made by openssl, a bcrypt hash by Python's crypt), checked by curl;
# a fourth with Kubernetes discovery against a fake API server exports its watch ends
# and failed lists; and a web config with a mistake keeps the agent from starting,
# naming the line.
# Usage: metrics_test.sh AGENT_BINARY FUSELINKCTL_BINARY
set -euo pipefail
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-metrics.XXXXXX)
. "$here/scripts/lib/agents.sh"
prom_pid=""
api_pid=""
trap 'for p in $prom_pid $api_pid; do kill $p 2>/dev/null || true; done; stop_agents; wait; rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pki_init "$run/pki"  # mutual TLS, as deployed: scripts/lib/agents.sh

start_agent node-b 12 "" --nics=4
start_agent node-a 11 "node-b=$(field "$run/node-b.json" grpc)" --nics=4 --policy=stripe
a=$(field "$run/node-a.json" grpc)
b=$(field "$run/node-b.json" grpc)

# 4 layers x 16 blocks x 64 KiB = 4 MiB
"$ctl" --agent="$a" --target_agent="$b" "${demo_tls[@]}" --source_socket="$run/node-a.sock" \
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

# TLS with a verified client certificate, and basic auth.
# Its own PKI, apart from $pki, the gRPC one that launch_agent issues from.
web=$run/web-pki
mkdir -p "$web"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca \
  -keyout "$web/ca.key" -out "$web/ca.crt" 2>/dev/null
sign() {  # sign NAME SUBJECT EXTENSION
  echo "$3" >"$web/$1.ext"
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$web/$1.key" -out "$web/$1.csr" 2>/dev/null
  openssl x509 -req -in "$web/$1.csr" -CA "$web/ca.crt" -CAkey "$web/ca.key" -CAcreateserial \
    -days 2 -extfile "$web/$1.ext" -out "$web/$1.crt" 2>/dev/null
}
sign server /CN=127.0.0.1 subjectAltName=IP:127.0.0.1
sign client /CN=prometheus extendedKeyUsage=clientAuth
hash=$(python3 -W ignore -c 'import crypt; print(crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))')
cat >"$web/web.yml" <<YAML
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_ca_file: ca.crt
  client_auth_type: RequireAndVerifyClientCert
basic_auth_users:
  prometheus: '$hash'
YAML
start_agent node-t 13 "" --nics=1 --metrics_web_config="$web/web.yml"
url=$(field "$run/node-t.json" metrics)
case "$url" in https://*) ;; *) fail "the TLS agent announces $url" ;; esac
tls=(--cacert "$web/ca.crt" --cert "$web/client.crt" --key "$web/client.key")
curl -s --cacert "$web/ca.crt" -u prometheus:s3cret "$url" >/dev/null 2>&1 &&
  fail "a scrape without a client certificate succeeded"
code=$(curl -s -o /dev/null -w '%{http_code}' "${tls[@]}" "$url")
[ "$code" = 401 ] || fail "no credentials: HTTP $code, want 401"
code=$(curl -s -o /dev/null -w '%{http_code}' "${tls[@]}" -u prometheus:wrong "$url")
[ "$code" = 401 ] || fail "a wrong password: HTTP $code, want 401"
curl -sf "${tls[@]}" -u prometheus:s3cret "$url" >"$run/node-t.metrics" ||
  fail "scrape over TLS with the right credentials"
promtool check metrics <"$run/node-t.metrics" || fail "promtool check metrics over TLS"
grep -q '^fuselink_metrics_http_refusals_total{reason="unauthorized"} 2' "$run/node-t.metrics" ||
  fail "the two 401s are not counted"
grep -q '^fuselink_metrics_http_refusals_total{reason="tls"} [1-9]' "$run/node-t.metrics" ||
  fail "the handshake without a client certificate is not counted"

# Kubernetes discovery's counters, against a fake API server (python3): the first list
# answers, every watch and every later list fails 500. The agent's scrape then has
# its watch ends and failed lists, and matches docs/metrics.md's kubernetes rows.
cat >"$run/fake-api.py" <<'PY'
import http.server, sys
lists = 0
class Api(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global lists
        lists += "watch=1" not in self.path
        if "watch=1" in self.path or lists > 1:
            self.send_response(500); self.end_headers(); return
        body = b'{"metadata": {"resourceVersion": "7"}, "items": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
server = http.server.HTTPServer(("127.0.0.1", 0), Api)
open(sys.argv[1], "w").write(str(server.server_port))
server.serve_forever()
PY
python3 "$run/fake-api.py" "$run/api.port" &
api_pid=$!
for _ in $(seq 50); do [ -s "$run/api.port" ] && break; sleep 0.1; done
[ -s "$run/api.port" ] || fail "the fake API server did not start"
start_agent node-k 14 "" --nics=1 --peer_discovery=kubernetes \
  --k8s_api_server="http://127.0.0.1:$(cat "$run/api.port")" --k8s_service=fl \
  --k8s_namespace=ns --k8s_token_file=/dev/null --k8s_watch_backoff_min_ms=20 \
  --k8s_watch_backoff_max_ms=100
scrape_k8s() { curl -sf "$(field "$run/node-k.json" metrics)" >"$run/node-k.metrics"; }
for _ in $(seq 100); do
  scrape_k8s && grep -q '^fuselink_k8s_list_failures_total [1-9]' "$run/node-k.metrics" && break
  sleep 0.1
done
kill $api_pid && api_pid=""
grep -q '^fuselink_k8s_list_failures_total [1-9]' "$run/node-k.metrics" ||
  fail "the failed lists are not counted: $(grep fuselink_k8s "$run/node-k.metrics")"
grep -q '^fuselink_k8s_watch_ends_total{reason="error"} 1$' "$run/node-k.metrics" ||
  fail "the failed watch is not counted once: $(grep fuselink_k8s "$run/node-k.metrics")"
for reason in renewed gone; do
  grep -q "^fuselink_k8s_watch_ends_total{reason=\"$reason\"} 0$" "$run/node-k.metrics" ||
    fail "no $reason series at 0: $(grep fuselink_k8s "$run/node-k.metrics")"
done
promtool check metrics <"$run/node-k.metrics" || fail "promtool check metrics with discovery"
"$here/tests/deploy/metrics_catalogue.py" "$here/docs/metrics.md" "$run/node-k.metrics" \
  "$here/agent" "$here/services" || fail "docs/metrics.md and the discovering agent differ"
grep -q '^fuselink_k8s' "$run/node-a.metrics" && fail "an agent with static peers exports discovery series"

# A mistake in the web config: the agent refuses to start and names the line.
printf 'tls_server_config:\n  cert_file: server.crt\n  keyfile: server.key\n' >"$web/bad.yml"
if "$agent" --node=bad --topology=emulated --plaintext --handle_socket="$run/bad.sock" --metrics_web_config="$web/bad.yml" \
  >"$run/bad.log" 2>&1; then
  fail "an agent started with a bad web config"
fi
grep -q "bad.yml: web config line 3: keyfile: unknown key" "$run/bad.log" ||
  { cat "$run/bad.log"; fail "the bad web config's error does not name its line"; }
echo "PASS: promtool clean on both agents; Prometheus scraped $got bytes over $nics NICs; TLS with a client certificate and basic auth through the agent; Kubernetes discovery's watch ends and failed lists exported; a bad web config names its line"
