#!/bin/bash
# The chart on a real Kubernetes API server: kube-apiserver, kube-controller-manager
# and kube-scheduler 1.20 (built once from Debian's source package and cached by
# scripts/setup-k8s-tools.sh) over Debian's etcd, token authentication and RBAC. No
# kubelet: Node objects stand in for two GPU nodes and one CPU node. For helm 3.17 and
# helm 4.1 in turn:
#  - helm install gives a DaemonSet that wants exactly the two GPU nodes, and the
#    scheduler binds one agent pod to each; the probes are HTTP GET /metrics (a gRPC
#    probe has no client certificate for mutual TLS); no ServiceMonitor or
#    PrometheusRule while their CRDs are absent;
#  - the agents' service-account token may read EndpointSlices in the release's
#    namespace and nothing else (kubectl auth can-i, and a real request with the token);
#  - after the CRDs are applied, helm upgrade makes the ServiceMonitor and the
#    PrometheusRule; the default DaemonSet runs mutual TLS from each node's own
#    certificate directory with the access-policy ConfigMap, and an upgrade to
#    tls.enabled=false gives --plaintext and removes the policy; a third GPU node
#    raises the DaemonSet's count to three;
#  - helm uninstall leaves no object of the release behind.
# Then agents run outside the cluster with exactly the arguments of the DaemonSet the
# server stored ($(NODE_NAME), $(POD_IP), $(POD_NAMESPACE) filled in as the kubelet
# would; the runtime dir and emulated NIC addresses made distinct because all share
# this host; plaintext (tls.enabled=false), the chart's explicit open mode; the TLS default is checked below), each with its own token
# bound to its pod, while the test reports their pods running at their addresses as a
# kubelet would: they pass the chart's probe, find
# each other through the EndpointSlices and move a tensor; a third node's agent joins
# and is found; when its pod goes, the others drop it. Last, an agent starts with the
# default (mutual TLS) DaemonSet's TLS, policy and runtime-dir arguments, over
# certificates made here for its node, and answers the probe.
# Usage: apiserver_test.sh AGENT FUSELINKCTL
set -euo pipefail
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-apiserver.XXXXXX)
pids=()
cleanup() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for l in "$run"/*.log; do [ -f "$l" ] && { echo "--- $l"; tail -n 15 "$l"; }; done
  exit 1
}
"$here/scripts/setup-k8s-tools.sh" helm apiserver
# shellcheck source=/dev/null  # written by setup-k8s-tools.sh at run time
. "${FUSELINK_CACHE:-/var/cache/fuselink}/k8s-tools/env.sh"
chart=$here/deploy/helm/fuselink
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { # SECONDS WHAT COMMAND...: until COMMAND succeeds
  local t=$1 what=$2
  shift 2
  for _ in $(seq "$((t * 2))"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  fail "$what (after ${t}s)"
}

echo "== etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
etcd_port=$(free_port)
etcd_peer=$(free_port)
etcd --data-dir "$run/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "default=http://127.0.0.1:$etcd_peer" >"$run/etcd.log" 2>&1 &
pids+=($!)
openssl genrsa -out "$run/sa.key" 2048 2>/dev/null
openssl rsa -in "$run/sa.key" -pubout -out "$run/sa.pub" 2>/dev/null
admin_token=$(openssl rand -hex 16)
echo "$admin_token,admin,admin,system:masters" >"$run/tokens.csv"
api_port=$(free_port)
mkdir -p "$run/certs"
"$K8S_BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
  --cert-dir="$run/certs" --token-auth-file="$run/tokens.csv" --authorization-mode=RBAC \
  --service-account-key-file="$run/sa.pub" --service-account-signing-key-file="$run/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true >"$run/apiserver.log" 2>&1 &
pids+=($!)
cat >"$run/kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: "$admin_token"}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
YAML
export KUBECONFIG=$run/kubeconfig
k() { "$KUBECTL" "$@"; }
wait_for 60 "the API server is not ready" k get --raw /readyz
"$K8S_BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG" --controllers='*,-nodelifecycle' \
  --service-account-private-key-file="$run/sa.key" --root-ca-file="$run/certs/apiserver.crt" \
  --leader-elect=false --port=0 --secure-port=0 >"$run/controller-manager.log" 2>&1 &
pids+=($!)
"$K8S_BIN/kube-scheduler" --kubeconfig="$KUBECONFIG" --leader-elect=false --port=0 \
  --secure-port=0 >"$run/scheduler.log" 2>&1 &
pids+=($!)
echo "ok: Kubernetes $(k version -o json 2>/dev/null | jq -r .serverVersion.gitVersion) on 127.0.0.1:$api_port"

# add_node NAME GPU(true|false): a Node as a kubelet would register it, made Ready.
add_node() {
  local labels="" taints="[]"
  if [ "$2" = true ]; then
    labels='"nvidia.com/gpu.present": "true",'
    taints='[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]'
  fi
  k apply -f - >/dev/null <<JSON
{"apiVersion": "v1", "kind": "Node",
 "metadata": {"name": "$1", "labels": {$labels "kubernetes.io/hostname": "$1", "kubernetes.io/os": "linux"}},
 "spec": {"taints": $taints}}
JSON
  k patch node "$1" --subresource=status --type=merge -p '{"status": {
    "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "rdma/rdma_shared_device_a": "1k"},
    "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "rdma/rdma_shared_device_a": "1k"},
    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
      "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}' >/dev/null
  # The server taints new nodes not-ready until a kubelet says otherwise.
  k taint node "$1" node.kubernetes.io/not-ready- >/dev/null 2>&1 || true
}
add_node gpu-node-1 true
add_node gpu-node-2 true
add_node cpu-node-1 false
k create namespace gpu-system >/dev/null
# What NVIDIA's GPU operator (or the container toolkit's setup) makes on GPU clusters;
# pods naming a missing runtime class are refused.
k apply -f - >/dev/null <<YAML
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
YAML

ds_field() { k -n gpu-system get daemonset "$1" -o jsonpath="{$2}"; }
scheduled_nodes() { # RELEASE: the nodes its agent pods are bound to, sorted
  k -n gpu-system get pods -l "app.kubernetes.io/instance=$1" \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort | xargs
}
crds_applied=""
apply_monitoring_crds() {
  for kind in ServiceMonitor:servicemonitors PodMonitor:podmonitors PrometheusRule:prometheusrules; do
    k apply -f - >/dev/null <<YAML
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: ${kind#*:}.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ${kind%:*}, plural: ${kind#*:}, singular: $(echo "${kind%:*}" | tr '[:upper:]' '[:lower:]'), listKind: ${kind%:*}List}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
YAML
  done
  wait_for 30 "the monitoring CRDs are not served" k get --raw /apis/monitoring.coreos.com/v1
  crds_applied=1
}

lifecycle() { # HELM RELEASE
  local helm=$1 rel=$2 ds=$2-fuselink
  echo "== $("$helm" version --short) : release $rel"
  "$helm" install "$rel" "$chart" -n gpu-system --set topology.source=emulated \
    --set-json 'peers.static=[{"name":"gpu-node-1","address":"127.0.81.1:17350"},{"name":"gpu-node-2","address":"127.0.82.1:17350"}]' \
    >"$run/$rel-install.log" 2>&1 || fail "helm install $rel: $(cat "$run/$rel-install.log")"
  wait_for 60 "$rel: the DaemonSet does not want 2 nodes" \
    test "$(ds_field "$ds" .status.desiredNumberScheduled)" = 2
  wait_for 60 "$rel: agent pods are not bound to both GPU nodes" \
    test "$(scheduled_nodes "$rel")" = "gpu-node-1 gpu-node-2"
  echo "ok: the DaemonSet wants exactly the GPU nodes; pods bound to $(scheduled_nodes "$rel")"
  [ "$(ds_field "$ds" '.spec.template.spec.containers[0].livenessProbe.httpGet.path')" = /metrics ] ||
    fail "$rel: the liveness probe is not HTTP GET /metrics"
  if [ -z "$crds_applied" ]; then
    for kind in ServiceMonitor PrometheusRule; do
      ! "$helm" get manifest "$rel" -n gpu-system | grep -q "^kind: $kind" ||
        fail "$rel rendered a $kind without its CRD"
    done
    echo "ok: no ServiceMonitor or PrometheusRule without their CRDs"
  fi

  # The agents' own service-account token: EndpointSlices here, nothing else.
  local sa="system:serviceaccount:gpu-system:$ds"
  [ "$(k auth can-i watch endpointslices.discovery.k8s.io -n gpu-system --as="$sa")" = yes ] ||
    fail "$rel: the agents may not watch EndpointSlices"
  local verb what
  for verb_what in "list pods" "get secrets" "list nodes" "create endpointslices.discovery.k8s.io"; do
    verb=${verb_what% *}
    what=${verb_what#* }
    [ "$(k auth can-i "$verb" "$what" -n gpu-system --as="$sa" || true)" = no ] ||
      fail "$rel: the agents may $verb $what"
  done
  [ "$(k auth can-i list endpointslices.discovery.k8s.io -n default --as="$sa" || true)" = no ] ||
    fail "$rel: the agents may read EndpointSlices in other namespaces"
  local secret token
  wait_for 30 "$rel: no token for the agents' service account" \
    test -n "$(k -n gpu-system get sa "$ds" -o jsonpath='{.secrets[0].name}')"
  secret=$(k -n gpu-system get sa "$ds" -o jsonpath='{.secrets[0].name}')
  token=$(k -n gpu-system get secret "$secret" -o jsonpath='{.data.token}' | base64 -d)
  "$KUBECTL" --token="$token" -n gpu-system get endpointslices >/dev/null ||
    fail "$rel: the agents' token cannot list EndpointSlices"
  ! "$KUBECTL" --token="$token" -n gpu-system get pods >/dev/null 2>&1 ||
    fail "$rel: the agents' token can list pods"
  echo "ok: the agents' token reads EndpointSlices in gpu-system and nothing else"

  [ -n "$crds_applied" ] || apply_monitoring_crds
  "$helm" upgrade "$rel" "$chart" -n gpu-system --reuse-values >"$run/$rel-upgrade.log" 2>&1 ||
    fail "helm upgrade $rel: $(cat "$run/$rel-upgrade.log")"
  k -n gpu-system get servicemonitor "$ds" >/dev/null || fail "$rel: no ServiceMonitor after the upgrade"
  k -n gpu-system get prometheusrule "$ds" >/dev/null || fail "$rel: no PrometheusRule after the upgrade"
  [ "$(k -n gpu-system get prometheusrule "$ds" -o jsonpath='{.spec.groups[0].rules[1].alert}')" = FuselinkNicFailed ] ||
    fail "$rel: the PrometheusRule lacks the rules"
  echo "ok: with the CRDs, helm upgrade made the ServiceMonitor and the PrometheusRule"

  # Mutual TLS by default: each node's certificate directory and the policy; the
  # stored DaemonSet and policy are kept for the TLS agent at the end.
  k get daemonset "$ds" -n gpu-system -o json >"$run/$rel-tls-daemonset.json"
  k -n gpu-system get configmap "$ds-access-policy" -o jsonpath='{.data.policy\.json}' >"$run/$rel-policy.json" ||
    fail "$rel: no access-policy ConfigMap"
  jq -e '.spec.template.spec.containers[0].args | index("--tls_cert=/etc/fuselink/tls/tls.crt") and index("--access_policy=/etc/fuselink/policy/policy.json")' \
    "$run/$rel-tls-daemonset.json" >/dev/null || fail "$rel: the default DaemonSet has no TLS flags"
  [ "$(ds_field "$ds" '.spec.template.spec.volumes[?(@.name=="tls")].hostPath.path')" = /etc/fuselink/tls ] ||
    fail "$rel: the DaemonSet does not mount the node's certificate directory"
  "$helm" upgrade "$rel" "$chart" -n gpu-system --reuse-values --set tls.enabled=false \
    >"$run/$rel-plain.log" 2>&1 || fail "helm upgrade $rel to plaintext: $(cat "$run/$rel-plain.log")"
  grep -q "WARNING: tls.enabled=false" "$run/$rel-plain.log" || fail "$rel: no plaintext warning in NOTES"
  ds_field "$ds" '.spec.template.spec.containers[0].args' | grep -q -- '"--plaintext"' ||
    fail "$rel: tls.enabled=false did not give --plaintext"
  ! k -n gpu-system get configmap "$ds-access-policy" >/dev/null 2>&1 || fail "$rel: the policy outlived TLS"
  echo "ok: mutual TLS and the access policy by default; tls.enabled=false gave --plaintext and a warning"

  add_node "gpu-node-3-$rel" true
  wait_for 60 "$rel: a third GPU node did not raise the count" \
    test "$(ds_field "$ds" .status.desiredNumberScheduled)" = 3
  echo "ok: a third GPU node raised the DaemonSet to 3"
  k get daemonset "$ds" -n gpu-system -o json >"$run/$rel-daemonset.json"

  "$helm" uninstall "$rel" -n gpu-system --wait >"$run/$rel-uninstall.log" 2>&1 ||
    fail "helm uninstall $rel: $(cat "$run/$rel-uninstall.log")"
  left() {
    k -n gpu-system get daemonsets,pods,services,configmaps,serviceaccounts,roles,rolebindings,secrets,servicemonitors,prometheusrules,endpointslices \
      -l "app.kubernetes.io/instance=$rel" -o name
    k -n gpu-system get serviceaccounts,secrets,endpointslices -o name | grep -- "$ds" || true
  }
  # The garbage collector marks the agent pods for deletion; with no kubelet to stop
  # their containers and confirm, the test does the kubelet's part once they are marked.
  terminating() {
    k -n gpu-system get pods -l "app.kubernetes.io/instance=$rel" \
      -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}'
  }
  wait_for 60 "$rel: the agent pods were not marked for deletion: $(terminating | xargs)" \
    test -z "$(terminating | awk 'NF < 2')"
  terminating | awk '{print $1}' | xargs -r "$KUBECTL" -n gpu-system delete pod --grace-period=0 --force >/dev/null 2>&1
  wait_for 60 "$rel: helm uninstall left $(left | xargs)" test -z "$(left)"
  echo "ok: helm uninstall left nothing of $rel"
  k delete node "gpu-node-3-$rel" >/dev/null
  # The next helm starts again from a cluster without the optional CRDs.
  k delete crd servicemonitors.monitoring.coreos.com podmonitors.monitoring.coreos.com \
    prometheusrules.monitoring.coreos.com >/dev/null
  wait_for 60 "the CRDs are still served" sh -c "! \"$KUBECTL\" get --raw /apis/monitoring.coreos.com/v1 >/dev/null 2>&1"
  crds_applied=""
}

lifecycle "$HELM3" fl3
lifecycle "$HELM4" fl4

echo "== agents with the DaemonSet's own arguments discover each other through the API server"
rel=fld
ds=$rel-fuselink
"$HELM3" install "$rel" "$chart" -n gpu-system --set topology.source=emulated --set tls.enabled=false \
  >"$run/$rel-install.log" 2>&1 || fail "helm install $rel: $(cat "$run/$rel-install.log")"
wait_for 60 "$rel: agent pods are not bound to both GPU nodes" \
  test "$(scheduled_nodes "$rel")" = "gpu-node-1 gpu-node-2"
k get daemonset "$ds" -n gpu-system -o json >"$run/$rel-daemonset.json"
pod_on() { # NODE: the release's pod bound to NODE
  k -n gpu-system get pods -l "app.kubernetes.io/instance=$rel" \
    -o jsonpath="{range .items[?(@.spec.nodeName=='$1')]}{.metadata.name}{end}"
}
# What the kubelet would report once the agent runs: the node's address, Ready.
pod_running() { # NODE IP
  k -n gpu-system patch pod "$(pod_on "$1")" --subresource=status --type=merge -p "{\"status\": {
    \"phase\": \"Running\", \"hostIP\": \"$2\", \"podIP\": \"$2\", \"podIPs\": [{\"ip\": \"$2\"}],
    \"conditions\": [{\"type\": \"Ready\", \"status\": \"True\"}, {\"type\": \"ContainersReady\", \"status\": \"True\"}]}}" >/dev/null
}
# args_for NODE POD_IP: the stored container args as a kubelet would expand them.
args_for() {
  jq -r '.spec.template.spec.containers[0].args[]' "$run/$rel-daemonset.json" |
    sed "s/\$(NODE_NAME)/$1/g; s/\$(POD_IP)/$2/g; s/\$(POD_NAMESPACE)/gpu-system/g" |
    sed "s|^--runtime_dir=/run/fuselink/|--runtime_dir=$run/rt-$1/|; s|^--handle_socket=/run/fuselink/|--handle_socket=$run/rt-$1/|"
}
# start_agent_as NODE POD_IP LOOPBACK_NET: outside the cluster, with a token of its
# own bound to its pod (what the kubelet mounts), and the API server's address and CA
# (what a pod finds in its environment and service-account volume).
start_agent_as() {
  mkdir -m 0755 "$run/rt-$1" # what the kubelet makes of the hostPath
  k -n gpu-system create token "$ds" --bound-object-kind=Pod --bound-object-name="$(pod_on "$1")" \
    >"$run/$1.token" || fail "no token for $1's pod"
  mapfile -t args < <(args_for "$1" "$2")
  POD_IP=$2 "$agent" "${args[@]}" --loopback_net="$3" --ready_file="$run/$1.json" \
    --k8s_api_server="https://127.0.0.1:$api_port" --k8s_token_file="$run/$1.token" \
    --k8s_ca_file="$run/certs/apiserver.crt" >"$run/$1-agent.log" 2>&1 &
  pids+=($!)
  wait_for 10 "agent $1 did not start with the DaemonSet's arguments" test -s "$run/$1.json"
  curl -sf "http://$2:17351/metrics" >/dev/null || fail "the probe (GET /metrics) fails on $1"
  [ "$(stat -c %a "$run/rt-$1/agent")" = 700 ] || fail "$1: the agent did not make its runtime dir 0700"
  POD_IP=$2 FUSELINK_GRPC_PORT=17350 "$here/deploy/image/fuselink-health" >"$run/$1-health.out" ||
    fail "fuselink-health (the plaintext helm test) fails on $1: $(cat "$run/$1-health.out")"
}
knows() { grep -q "peer $2 at $3" "$run/$1-agent.log"; } # NODE PEER ADDRESS
demo() { # FROM_NODE FROM_IP TO_NODE TO_IP
  "$ctl" --plaintext --agent="$2:17350" --target_agent="$4:17350" --source_socket="$run/rt-$1/agent/agent.sock" \
    --target_socket="$run/rt-$3/agent/agent.sock" --demo_layers=2 --demo_blocks=8 --demo_block_bytes=65536 \
    demo >"$run/demo-$1-$3.out" 2>&1 && grep -q "bytes match" "$run/demo-$1-$3.out"
}
pod_running gpu-node-1 127.0.81.1
pod_running gpu-node-2 127.0.82.1
start_agent_as gpu-node-1 127.0.81.1 81
start_agent_as gpu-node-2 127.0.82.1 82
echo "ok: both agents serve and pass the probe (GET /metrics): $(args_for gpu-node-1 127.0.81.1 | xargs)"
wait_for 30 "gpu-node-1 did not discover gpu-node-2" knows gpu-node-1 gpu-node-2 127.0.82.1:17350
wait_for 30 "gpu-node-2 did not discover gpu-node-1" knows gpu-node-2 gpu-node-1 127.0.81.1:17350
demo gpu-node-1 127.0.81.1 gpu-node-2 127.0.82.1 || fail "gpu-node-1 -> gpu-node-2: $(tail -3 "$run/demo-gpu-node-1-gpu-node-2.out")"
echo "ok: each found the other through the API server; they moved a tensor, bytes match"

add_node gpu-node-3 true
wait_for 60 "no agent pod on gpu-node-3" test -n "$(pod_on gpu-node-3)"
pod_running gpu-node-3 127.0.83.1
start_agent_as gpu-node-3 127.0.83.1 83
wait_for 30 "gpu-node-1 did not discover gpu-node-3" knows gpu-node-1 gpu-node-3 127.0.83.1:17350
wait_for 30 "gpu-node-3 did not discover gpu-node-1" knows gpu-node-3 gpu-node-1 127.0.81.1:17350
demo gpu-node-1 127.0.81.1 gpu-node-3 127.0.83.1 || fail "gpu-node-1 -> gpu-node-3: $(tail -3 "$run/demo-gpu-node-1-gpu-node-3.out")"
demo gpu-node-3 127.0.83.1 gpu-node-2 127.0.82.1 || fail "gpu-node-3 -> gpu-node-2: $(tail -3 "$run/demo-gpu-node-3-gpu-node-2.out")"
echo "ok: a third node's agent joined, was found by the others and found them; tensors moved"

# gpu-node-3's pod goes away (its replacement has no address yet): the others drop it.
k -n gpu-system delete pod "$(pod_on gpu-node-3)" --grace-period=0 --force >/dev/null 2>&1
wait_for 30 "gpu-node-1 did not drop gpu-node-3" grep -q "peer gpu-node-3 left" "$run/gpu-node-1-agent.log"
if demo gpu-node-1 127.0.81.1 gpu-node-3 127.0.83.1; then
  fail "gpu-node-1 still sends to the departed gpu-node-3"
fi
grep -q "UNKNOWN_NODE\|unknown node" "$run/demo-gpu-node-1-gpu-node-3.out" ||
  fail "a transfer to the departed node failed otherwise: $(tail -2 "$run/demo-gpu-node-1-gpu-node-3.out")"
echo "ok: when gpu-node-3's pod left, gpu-node-1 dropped it (transfers to it: UNKNOWN_NODE)"
echo "== an agent with the default DaemonSet's mutual-TLS arguments"
pki=$run/pki
mkdir -p "$pki/gpu-node-9" "$run/rt-gpu-node-9"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=fleet-ca \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
  -keyout "$pki/ca.key" -out "$pki/gpu-node-9/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=gpu-node-9 \
  -keyout "$pki/gpu-node-9/tls.key" -out "$pki/node.csr" 2>/dev/null
printf 'subjectAltName=URI:spiffe://fuselink/node/gpu-node-9\nextendedKeyUsage=serverAuth,clientAuth\n' >"$pki/ext"
openssl x509 -req -in "$pki/node.csr" -CA "$pki/gpu-node-9/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 1 -extfile "$pki/ext" -out "$pki/gpu-node-9/tls.crt" 2>/dev/null
# The TLS, policy and runtime-dir arguments as stored, at this host's paths; discovery
# is left out (it was tested above, and this node has no pod).
mapfile -t args < <(jq -r '.spec.template.spec.containers[0].args[]' "$run/fl3-tls-daemonset.json" |
  grep -v -- '^--peer\|^--k8s_' |
  sed "s/\$(NODE_NAME)/gpu-node-9/g; s/\$(POD_IP)/127.0.89.1/g; s#^--tls_\(cert\|key\|ca\)=/etc/fuselink/tls/#--tls_\1=$pki/gpu-node-9/#" |
  sed "s|^--access_policy=.*|--access_policy=$run/fl3-policy.json|; s|=/run/fuselink/|=$run/rt-gpu-node-9/|")
"$agent" "${args[@]}" --loopback_net=89 --ready_file="$run/gpu-node-9.json" >"$run/gpu-node-9-agent.log" 2>&1 &
pids+=($!)
wait_for 10 "the agent did not start with the default DaemonSet's TLS arguments" test -s "$run/gpu-node-9.json"
curl -sf http://127.0.89.1:17351/metrics >/dev/null || fail "the TLS agent fails the probe (GET /metrics)"
grep -q mtls "$run/gpu-node-9-agent.log" || fail "the agent does not say it serves mutual TLS"
echo "ok: the default DaemonSet's arguments start an agent serving mutual TLS; the probe passes"
echo "PASS: the chart installs, upgrades, scales and uninstalls on Kubernetes 1.20 with helm 3 and 4; its agents discover each other there"
