#!/bin/bash
# The chart under real helm, both major versions (3.17 and 4.1): helm lint --strict;
# helm template over a matrix of values, each rendering checked for what it must (and
# must not) contain and type-checked by tsc against the published Kubernetes and
# prometheus-operator types; the template's own refusals; and every bad value refused
# by values.schema.json, each its own case.
# Usage: helm_test.sh   (tools: scripts/setup-k8s-tools.sh helm typecheck)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
chart=$here/deploy/helm/fuselink
run=$(mktemp -d /tmp/fuselink-helm.XXXXXX)
trap 'rm -rf "$run"' EXIT
"$here/scripts/setup-k8s-tools.sh" helm typecheck
. "${FUSELINK_CACHE:-/var/cache/fuselink}/k8s-tools/env.sh"
check=$here/tests/deploy/render_check.py
failures=0
passed=0
fail_case() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass_case() { passed=$((passed + 1)); }

MON=(--api-versions monitoring.coreos.com/v1/ServiceMonitor
  --api-versions monitoring.coreos.com/v1/PodMonitor
  --api-versions monitoring.coreos.com/v1/PrometheusRule)
CERT=(--api-versions cert-manager.io/v1/Certificate)

# render HELM CASE [HELM ARGS...]: renders into $run/HELM-CASE.yaml
render() {
  local helm=$1 name=$2
  shift 2
  "$helm" template fl "$chart" --namespace gpu "$@" >"$run/$name.yaml" 2>"$run/$name.err"
}

# case_ok CASE "HELM ARGS" EXPR...: renders, then checks each expression.
case_ok() {
  local name=$1 args=$2 tag
  shift 2
  for v in 3 4; do
    local helm=HELM$v
    tag="helm$v-$name"
    # shellcheck disable=SC2086  # args are words
    if ! render "${!helm}" "$tag" $args; then
      fail_case "$tag: helm template failed: $(cat "$run/$tag.err")"
      continue
    fi
    if "$check" "$run/$tag.yaml" "$@"; then pass_case; else fail_case "$tag ($args)"; fi
  done
}

# case_refused CASE WANT "HELM ARGS": helm template must fail, saying WANT.
case_refused() {
  local name=$1 want=$2 args=$3
  for v in 3 4; do
    local helm=HELM$v tag="helm$v-refuse-$name"
    # shellcheck disable=SC2086
    if render "${!helm}" "$tag" $args; then
      fail_case "$tag: accepted $args"
    elif ! grep -q -- "$want" "$run/$tag.err"; then
      fail_case "$tag: refused, but not for '$want': $(head -3 "$run/$tag.err")"
    else
      pass_case
    fi
  done
}

for v in 3 4; do
  helm=HELM$v
  if "${!helm}" lint --strict "$chart" >"$run/lint$v.out" 2>&1 &&
    "${!helm}" lint --strict "$chart" --set tls.enabled=true --set tls.secretName=agent-tls \
      --set rdma.enabled=false >>"$run/lint$v.out" 2>&1; then
    pass_case
  else
    fail_case "helm$v lint --strict: $(cat "$run/lint$v.out")"
  fi
done

echo "== helm template over the values matrix"
case_ok defaults "" \
  "kinds == {'ServiceAccount', 'Role', 'RoleBinding', 'Service', 'DaemonSet', 'ConfigMap', 'Pod'}" \
  "pod['nodeSelector'] == {'nvidia.com/gpu.present': 'true'}" \
  "pod['tolerations'][0]['key'] == 'nvidia.com/gpu'" \
  "pod['hostNetwork'] is True and pod['dnsPolicy'] == 'ClusterFirstWithHostNet'" \
  "pod['runtimeClassName'] == 'nvidia'" \
  "{'name': 'NVIDIA_VISIBLE_DEVICES', 'value': 'all'} in agent['env']" \
  "not any('nvidia.com/gpu' in r for r in agent['resources'].values())" \
  "agent['resources']['limits']['rdma/rdma_shared_device_a'] == '1'" \
  "agent['securityContext']['capabilities'] == {'drop': ['ALL'], 'add': ['IPC_LOCK']}" \
  "agent['securityContext']['allowPrivilegeEscalation'] is False" \
  "not any('/dev' in str(v.get('hostPath', {}).get('path', '')) for v in pod['volumes'])" \
  "'--node=\$(NODE_NAME)' in args and '--listen=\$(POD_IP):17350' in args" \
  "'--metrics_listen=\$(POD_IP):17351' in args and '--handle_socket=/run/fuselink/agent.sock' in args" \
  "'--topology=/etc/fuselink/host/topology.json' in args" \
  "not any(a.startswith(('--tls', '--peer=')) for a in args)" \
  "'--peer_discovery=kubernetes' in args and '--k8s_service=fl-fuselink' in args and '--k8s_namespace=\$(POD_NAMESPACE)' in args" \
  "pod['automountServiceAccountToken'] is True and pod['serviceAccountName'] == 'fl-fuselink'" \
  "[e for e in agent['env'] if e['name'] == 'NODE_NAME'][0]['valueFrom']['fieldRef']['fieldPath'] == 'spec.nodeName'" \
  "ds['spec']['updateStrategy'] == {'type': 'RollingUpdate', 'rollingUpdate': {'maxUnavailable': 1}}" \
  "of('Service')[0]['spec']['clusterIP'] == 'None' and all(p['protocol'] == 'TCP' for p in of('Service')[0]['spec']['ports'])" \
  "sorted(p['port'] for p in of('Service')[0]['spec']['ports']) == [17350, 17351]" \
  "of('Role')[0]['rules'] == [{'apiGroups': ['discovery.k8s.io'], 'resources': ['endpointslices'], 'verbs': ['get', 'list', 'watch']}]" \
  "sorted(c['metadata']['name'] for c in of('ConfigMap')) == ['fl-fuselink-dashboard-fuselink-cluster', 'fl-fuselink-dashboard-fuselink-node']" \
  "all(c['metadata']['labels']['grafana_dashboard'] == '1' for c in of('ConfigMap'))" \
  "of('Pod')[0]['metadata']['annotations']['helm.sh/hook'] == 'test'" \
  "'--all=fl-fuselink.gpu.svc' in of('Pod')[0]['spec']['containers'][0]['command']"
case_ok kube-1.20 "--kube-version 1.20.0" \
  "agent['livenessProbe']['exec']['command'] == ['fuselink-health'] and 'grpc' not in agent['readinessProbe']"
case_ok kube-1.30 "--kube-version 1.30.0" \
  "agent['livenessProbe']['grpc'] == {'port': 17350} and agent['readinessProbe']['grpc'] == {'port': 17350}"
case_ok probes-exec "--kube-version 1.30.0 --set probes.mode=exec" "'exec' in agent['livenessProbe']"
case_ok no-monitoring-crds "--set metrics.monitor.enabled=true --set metrics.prometheusRule.enabled=true" \
  "'ServiceMonitor' not in kinds and 'PodMonitor' not in kinds and 'PrometheusRule' not in kinds"
case_ok monitoring-crds "${MON[*]}" \
  "len(of('ServiceMonitor')) == 1 and 'PodMonitor' not in kinds" \
  "of('ServiceMonitor')[0]['spec']['endpoints'][0]['port'] == 'metrics'" \
  "of('ServiceMonitor')[0]['spec']['jobLabel'] == 'app.kubernetes.io/name'" \
  "of('ServiceMonitor')[0]['spec']['endpoints'][0]['relabelings'][0]['targetLabel'] == 'instance'" \
  "of('PrometheusRule')[0]['spec'] == alerts_file"
case_ok podmonitor "${MON[*]} --set metrics.monitor.kind=PodMonitor" \
  "len(of('PodMonitor')) == 1 and 'ServiceMonitor' not in kinds" \
  "of('PodMonitor')[0]['spec']['podMetricsEndpoints'][0]['port'] == 'metrics'"
case_ok monitoring-off "${MON[*]} --set metrics.monitor.enabled=false --set metrics.prometheusRule.enabled=false" \
  "'ServiceMonitor' not in kinds and 'PrometheusRule' not in kinds"
case_ok rdma-off "--set rdma.enabled=false" \
  "not any('rdma' in k for r in agent['resources'].values() for k in r)" \
  "agent['securityContext']['capabilities'] == {'drop': ['ALL']}"
case_ok tls-secret "--set tls.enabled=true --set tls.secretName=agent-tls" \
  "'Certificate' not in kinds" \
  "{'name': 'tls', 'secret': {'secretName': 'agent-tls'}} in pod['volumes']" \
  "{'name': 'tls', 'mountPath': '/etc/fuselink/tls', 'readOnly': True} in agent['volumeMounts']" \
  "not any(a.startswith('--tls') for a in args)"
case_ok tls-cert-manager "${CERT[*]} --set tls.enabled=true --set tls.certManager.issuerRef.name=fleet-ca" \
  "of('Certificate')[0]['spec']['secretName'] == 'fl-fuselink-tls'" \
  "of('Certificate')[0]['spec']['issuerRef'] == {'name': 'fleet-ca', 'kind': 'ClusterIssuer', 'group': 'cert-manager.io'}" \
  "'fl-fuselink.gpu.svc' in of('Certificate')[0]['spec']['dnsNames']" \
  "{'name': 'tls', 'secret': {'secretName': 'fl-fuselink-tls'}} in pod['volumes']"
case_ok tls-cert-manager-off "${CERT[*]} --set tls.enabled=true --set tls.certManager.enabled=false --set tls.secretName=mine" \
  "'Certificate' not in kinds" "{'name': 'tls', 'secret': {'secretName': 'mine'}} in pod['volumes']"
case_ok tls-agent-flags "--set tls.enabled=true --set tls.secretName=agent-tls --set tls.agentFlags=true" \
  "'--tls_cert=/etc/fuselink/tls/tls.crt' in args and '--tls_key=/etc/fuselink/tls/tls.key' in args and '--tls_ca=/etc/fuselink/tls/ca.crt' in args"
case_ok topology-per-node "--set topology.source=perNode --set-json topology.nodes={\"gpu-1\":{\"nics\":[{\"name\":\"rail0\",\"address\":\"10.0.0.1\",\"owner_gpu\":0}]}}" \
  "'--topology=/etc/fuselink/topology/\$(NODE_NAME).json' in args" \
  "[c for c in of('ConfigMap') if c['metadata']['name'] == 'fl-fuselink-topology'][0]['data']['gpu-1.json'].startswith('{')" \
  "'checksum/topology' in ds['spec']['template']['metadata']['annotations']"
case_ok topology-emulated "--set topology.source=emulated --set topology.emulatedNics=2" \
  "'--nics=2' in args and not any(v['name'] == 'topology' for v in pod['volumes'])"
case_ok static-peers "--set peers.discovery=static --set-json peers.static=[{\"name\":\"gpu-2\",\"address\":\"10.0.0.2:17350\"},{\"name\":\"gpu-3\",\"address\":\"10.0.0.3:17350\"}]" \
  "'--peer=gpu-2=10.0.0.2:17350,gpu-3=10.0.0.3:17350' in args" \
  "not any(a.startswith('--peer_discovery') for a in args) and pod['automountServiceAccountToken'] is False"
case_ok operator-choices "--set priorityClassName=system-node-critical --set updateStrategy.maxUnavailable=25% --set gpu.runtimeClassName= --set dashboards.enabled=false --set test.enabled=false --set rbac.create=false --set agent.policy=static" \
  "pod['priorityClassName'] == 'system-node-critical' and 'runtimeClassName' not in pod" \
  "ds['spec']['updateStrategy']['rollingUpdate']['maxUnavailable'] == '25%'" \
  "'ConfigMap' not in kinds and 'Pod' not in kinds and 'Role' not in kinds and '--policy=static' in args"

echo "== type-check of every rendering (tsc --strict)"
mkdir -p "$run/ts"
for f in "$run"/helm?-*.yaml; do
  case "$f" in *refuse*) continue ;; esac
  "$here/tests/deploy/manifest_types.py" "$run/ts/$(basename "$f" .yaml).ts" "$f" | sort -u
done
cat >"$run/ts/tsconfig.json" <<JSON
{"compilerOptions": {"strict": true, "noEmit": true, "module": "nodenext",
  "moduleResolution": "nodenext", "skipLibCheck": true, "typeRoots": [],
  "baseUrl": "$TSC_DIR/node_modules", "paths": {"*": ["$TSC_DIR/node_modules/*"]}},
 "include": ["*.ts"]}
JSON
ln -sfn "$TSC_DIR/node_modules" "$run/ts/node_modules"
if (cd "$run/ts" && node "$TSC_DIR/node_modules/typescript/bin/tsc" -p . >"$run/tsc.out" 2>&1); then
  pass_case
  echo "ok: $(ls "$run"/ts/*.ts | wc -l) renderings type-check"
else
  fail_case "tsc: $(head -40 "$run/tsc.out")"
fi

echo "== the template's own refusals"
case_refused same-ports "must differ" "--set ports.metrics=17350"
case_refused discovery-without-account "as a service account" "--set serviceAccount.create=false"
case_refused tls-without-secret "tls.secretName must name" "--set tls.enabled=true"
case_refused cert-manager-without-issuer "issuerRef.name" "${CERT[*]} --set tls.enabled=true"

echo "== bad values, each refused by values.schema.json"
S="schema"
bad() { case_refused "$1" "$S" "$2"; }
# bad_yaml CASE YAML: a bad value that --set cannot spell (spaces, commas), as a file.
bad_yaml() {
  printf '%s\n' "$2" >"$run/values-$1.yaml"
  case_refused "$1" "$S" "-f $run/values-$1.yaml"
}
bad unknown-top-level-key "--set colour=blue"
bad image-pull-policy "--set image.pullPolicy=Sometimes"
bad image-repository-empty "--set image.repository="
bad image-repository-upper "--set image.repository=Fuselink/Agent"
bad_yaml image-tag-space "image: {tag: 'bad tag'}"
bad image-unknown-key "--set image.digest=sha256:00"
bad pull-secret-no-name "--set-json imagePullSecrets=[{}]"
bad name-override-long "--set nameOverride=$(printf 'x%.0s' $(seq 60))"
bad node-selector-number "--set-json nodeSelector={\"gpu\":1}"
bad_yaml node-selector-bad-key "nodeSelector: {'bad key': x}"
bad toleration-operator "--set-json tolerations=[{\"key\":\"a\",\"operator\":\"Sometimes\"}]"
bad toleration-effect "--set-json tolerations=[{\"key\":\"a\",\"operator\":\"Exists\",\"effect\":\"Never\"}]"
bad port-zero "--set ports.grpc=0"
bad port-too-high "--set ports.metrics=70000"
bad port-string "--set-string ports.grpc=grpc"
bad listen-address-name "--set listenAddress=localhost"
bad gpu-mode "--set gpu.mode=on"
bad_yaml gpu-visible-devices "gpu: {visibleDevices: 'all,,'}"
bad_yaml gpu-driver-capabilities "gpu: {driverCapabilities: 'compute,magic'}"
bad runtime-class-upper "--set gpu.runtimeClassName=NVIDIA"
bad rdma-enabled-string "--set-string rdma.enabled=yes"
bad rdma-resource-no-slash "--set rdma.resource=rdma_shared_device_a"
bad rdma-count-zero "--set rdma.count=0"
bad agent-policy "--set agent.policy=roundrobin"
bad agent-transport "--set agent.transport=udp"
bad direct-depth-zero "--set agent.directDepth=0"
bad direct-depth-high "--set agent.directDepth=2000"
bad borrow-depth-negative "--set agent.borrowDepth=-1"
bad chunk-bytes-small "--set agent.chunkBytes=1024"
bad chunk-bytes-large "--set agent.chunkBytes=134217728"
bad window-chunks-zero "--set agent.windowChunks=0"
bad max-transfers-zero "--set agent.maxTransfers=0"
bad connections-per-nic-zero "--set agent.connectionsPerNic=0"
bad qps-per-nic-high "--set agent.qpsPerNic=100"
bad relay-stage "--set agent.relay.stage=d3"
bad relay-cap-negative "--set agent.relay.capMiB=-1"
bad relay-idle-fraction "--set agent.relay.idleMs=1.5"
bad extra-arg-not-a-flag "--set-json agent.extraArgs=[\"policy=static\"]"
bad agent-unknown-key "--set agent.chunkSize=4096"
bad topology-source "--set topology.source=file"
bad topology-path-relative "--set topology.hostPath=etc/fuselink/topology.json"
bad topology-path-not-json "--set topology.hostPath=/etc/fuselink/topology.yaml"
bad topology-per-node-empty "--set topology.source=perNode"
bad topology-nic-address "--set topology.source=perNode --set-json topology.nodes={\"g\":{\"nics\":[{\"name\":\"r\",\"address\":\"10.0.0.300\"}]}}"
bad topology-no-nics "--set topology.source=perNode --set-json topology.nodes={\"g\":{\"gpus\":[]}}"
bad emulated-nics-high "--set topology.emulatedNics=17"
bad handle-dir-relative "--set handleSocket.hostDir=run/fuselink"
bad handle-name-slash "--set handleSocket.name=a/b.sock"
bad host-ipc-string "--set-string hostIPC=true"
bad peers-discovery "--set peers.discovery=dns"
bad peer-address "--set-json peers.static=[{\"name\":\"a\",\"address\":\"10.0.0.2\"}]"
bad peer-no-name "--set-json peers.static=[{\"address\":\"10.0.0.2:17350\"}]"
bad tls-enabled-string "--set-string tls.enabled=on"
bad tls-secret-name "--set tls.secretName=Agent_TLS"
bad tls-duration "--set tls.certManager.duration=90days"
bad tls-issuer-kind-empty "--set tls.certManager.issuerRef.kind="
bad probes-mode "--set probes.mode=http"
bad probe-period-zero "--set probes.liveness.periodSeconds=0"
bad probe-unknown-key "--set probes.readiness.successThreshold=2"
bad resources-quantity "--set resources.requests.cpu=lots"
bad resources-unknown-key "--set resources.claims=x"
bad priority-class "--set priorityClassName=Critical"
bad max-unavailable-zero "--set updateStrategy.maxUnavailable=0"
bad max-unavailable-percent "--set updateStrategy.maxUnavailable=150%"
bad pod-label-value-long "--set podLabels.a=$(printf 'v%.0s' $(seq 70))"
bad service-account-name "--set serviceAccount.name=Agent"
bad monitor-kind "--set metrics.monitor.kind=Probe"
bad monitor-interval "--set metrics.monitor.interval=15"
bad_yaml dashboards-label "dashboards: {label: 'bad label'}"
bad dashboards-namespace "--set dashboards.namespace=Monitoring"
bad test-enabled-string "--set-string test.enabled=yes"

echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
