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
# shellcheck source=/dev/null  # written by setup-k8s-tools.sh at run time
. "${FUSELINK_CACHE:-/var/cache/fuselink}/k8s-tools/env.sh"
check=$here/tests/deploy/render_check.py
failures=0
passed=0
fail_case() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass_case() { passed=$((passed + 1)); }

MON=(--api-versions monitoring.coreos.com/v1/ServiceMonitor
  --api-versions monitoring.coreos.com/v1/PodMonitor
  --api-versions monitoring.coreos.com/v1/PrometheusRule)
WEB_TLS='metrics.webConfig={"tls_server_config":{"cert_file":"/etc/fuselink/tls/tls.crt","key_file":"/etc/fuselink/tls/tls.key","client_auth_type":"NoClientCert"}}'
# shellcheck disable=SC2016  # a bcrypt hash: its $ are literal
WEB_AUTH='metrics.webConfig={"basic_auth_users":{"prometheus":"$2y$10$5Wr8Jp6Y6DbEy4J1cZVv6uEw3k2l6kIqEo0gX8o5r3J0uEmRkq1aG"}}'

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
    "${!helm}" lint --strict "$chart" --set tls.enabled=false \
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
  "'--metrics_listen=\$(POD_IP):17351' in args" \
  "'--runtime_dir=/run/fuselink/agent' in args and '--handle_socket=/run/fuselink/agent/agent.sock' in args" \
  "{'name': 'handle-socket', 'hostPath': {'path': '/run/fuselink', 'type': 'DirectoryOrCreate'}} in pod['volumes']" \
  "{'name': 'handle-socket', 'mountPath': '/run/fuselink'} in agent['volumeMounts']" \
  "'--tls_cert=/etc/fuselink/tls/tls.crt' in args and '--tls_key=/etc/fuselink/tls/tls.key' in args and '--tls_ca=/etc/fuselink/tls/ca.crt' in args" \
  "'--tls_refresh_s=10' in args and '--access_policy=/etc/fuselink/policy/policy.json' in args and '--plaintext' not in args" \
  "{'name': 'tls', 'hostPath': {'path': '/etc/fuselink/tls', 'type': 'Directory'}} in pod['volumes']" \
  "{'name': 'tls', 'mountPath': '/etc/fuselink/tls', 'readOnly': True} in agent['volumeMounts']" \
  "{'name': 'access-policy', 'configMap': {'name': 'fl-fuselink-access-policy'}} in pod['volumes']" \
  "{'name': 'access-policy', 'mountPath': '/etc/fuselink/policy', 'readOnly': True} in agent['volumeMounts']" \
  "set(policy) == proto_fields('AccessPolicy') and all(set(b) == proto_fields('RoleBinding') for b in policy['bindings'])" \
  "policy['peer_identity'] == 'spiffe://fuselink/node/{node}'" \
  "{b['identity']: b['roles'] for b in policy['bindings']} == {'spiffe://fuselink/node/*': ['peer'], 'spiffe://fuselink/router/*': ['router', 'viewer'], 'spiffe://fuselink/engine/*': ['engine'], 'spiffe://fuselink/viewer/*': ['viewer']}" \
  "'checksum/access-policy' in ds['spec']['template']['metadata']['annotations']" \
  "agent['livenessProbe']['httpGet'] == {'path': '/metrics', 'port': 'metrics'} and agent['readinessProbe']['httpGet'] == {'path': '/metrics', 'port': 'metrics'}" \
  "not any(a.startswith('--metrics_web_config') for a in args) and 'Secret' not in kinds" \
  "'--topology=discover' in args and not any(a.startswith('--exclude_nics') for a in args)" \
  "not any(v['name'] == 'topology' for v in pod['volumes'])" \
  "not any(a.startswith('--peer=') for a in args)" \
  "'--peer_discovery=kubernetes' in args and '--k8s_service=fl-fuselink' in args and '--k8s_namespace=\$(POD_NAMESPACE)' in args" \
  "pod['automountServiceAccountToken'] is True and pod['serviceAccountName'] == 'fl-fuselink'" \
  "[e for e in agent['env'] if e['name'] == 'NODE_NAME'][0]['valueFrom']['fieldRef']['fieldPath'] == 'spec.nodeName'" \
  "ds['spec']['updateStrategy'] == {'type': 'RollingUpdate', 'rollingUpdate': {'maxUnavailable': 1}}" \
  "of('Service')[0]['spec']['clusterIP'] == 'None' and all(p['protocol'] == 'TCP' for p in of('Service')[0]['spec']['ports'])" \
  "sorted(p['port'] for p in of('Service')[0]['spec']['ports']) == [17350, 17351]" \
  "of('Role')[0]['rules'] == [{'apiGroups': ['discovery.k8s.io'], 'resources': ['endpointslices'], 'verbs': ['get', 'list', 'watch']}]" \
  "sorted(c['metadata']['name'] for c in of('ConfigMap')) == ['fl-fuselink-access-policy', 'fl-fuselink-dashboard-fuselink-cluster', 'fl-fuselink-dashboard-fuselink-node']" \
  "all(c['metadata']['labels']['grafana_dashboard'] == '1' for c in of('ConfigMap') if 'dashboard' in c['metadata']['name'])" \
  "of('Pod')[0]['metadata']['annotations']['helm.sh/hook'] == 'test'" \
  "of('Pod')[0]['spec']['containers'][0]['command'][:2] == ['python3', '-c'] and of('Pod')[0]['spec']['containers'][0]['command'][3:] == ['fl-fuselink.gpu.svc', '17351']" \
  "'--fabric_connections_per_peer=0' in args and '--max_layout_parts_per_engine=1048576' in args and '--incoming_idle_timeout_ms=30000' in args" \
  "'--metrics_auth_queue_depth=4' in args and '--ipc_close_wait_ms=5000' in args" \
  "'--transfer_drain_timeout_ms=10000' in args and pod['terminationGracePeriodSeconds'] == 10"
case_ok agent-bounds "--set agent.fabric.connectionsPerPeer=16 --set agent.incoming.idleTimeoutMs=3600000 --set agent.registrations.perCaller=4 --set metrics.authQueueDepth=64 --set agent.transferDrainTimeoutMs=30000" \
  "'--fabric_connections_per_peer=16' in args and '--incoming_idle_timeout_ms=3600000' in args" \
  "'--registrations_per_caller=4' in args and '--metrics_auth_queue_depth=64' in args" \
  "'--transfer_drain_timeout_ms=30000' in args"
case_ok plaintext "--set tls.enabled=false" \
  "'--plaintext' in args and not any(a.startswith(('--tls', '--access_policy')) for a in args)" \
  "not any(v['name'] in ('tls', 'access-policy') for v in pod['volumes'])" \
  "policy is None and '--runtime_dir=/run/fuselink/agent' in args" \
  "'--all=fl-fuselink.gpu.svc' in of('Pod')[0]['spec']['containers'][0]['command']"
case_ok kube-1.20 "--kube-version 1.20.0" \
  "'httpGet' in agent['livenessProbe'] and 'grpc' not in agent['readinessProbe']"
case_ok probes-tcp "--set probes.mode=tcp" \
  "agent['livenessProbe']['tcpSocket'] == {'port': 'grpc'} and agent['readinessProbe']['tcpSocket'] == {'port': 'grpc'}"
case_ok probes-grpc-plaintext "--kube-version 1.30.0 --set tls.enabled=false --set probes.mode=grpc" \
  "agent['livenessProbe']['grpc'] == {'port': 17350} and agent['readinessProbe']['grpc'] == {'port': 17350}"
case_ok probes-exec-plaintext "--set tls.enabled=false --set probes.mode=exec" "agent['livenessProbe']['exec'] == {'command': ['fuselink-health']}"
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
case_ok tls-host-dir "--set tls.hostPath.dir=/var/lib/pki/fuselink --set tls.certFile=node.pem --set tls.keyFile=node-key.pem --set tls.caFile=fleet-ca.pem --set tls.refreshSeconds=60" \
  "{'name': 'tls', 'hostPath': {'path': '/var/lib/pki/fuselink', 'type': 'Directory'}} in pod['volumes']" \
  "'--tls_cert=/etc/fuselink/tls/node.pem' in args and '--tls_key=/etc/fuselink/tls/node-key.pem' in args" \
  "'--tls_ca=/etc/fuselink/tls/fleet-ca.pem' in args and '--tls_refresh_s=60' in args"
case_ok tls-volume "--set tls.source=volume --set-json tls.volume={\"csi\":{\"driver\":\"spiffe.example.com\",\"readOnly\":true}}" \
  "{'name': 'tls', 'csi': {'driver': 'spiffe.example.com', 'readOnly': True}} in pod['volumes']" \
  "'--tls_cert=/etc/fuselink/tls/tls.crt' in args"
case_ok access-policy "--set accessPolicy.peerIdentity=spiffe://gpu.example/agent/{node} --set-json accessPolicy.bindings=[{\"identity\":\"spiffe://gpu.example/agent/*\",\"roles\":[\"peer\"]},{\"identity\":\"spiffe://gpu.example/vllm/router\",\"roles\":[\"router\",\"viewer\"]}]" \
  "policy == {'peer_identity': 'spiffe://gpu.example/agent/{node}', 'bindings': [{'identity': 'spiffe://gpu.example/agent/*', 'roles': ['peer']}, {'identity': 'spiffe://gpu.example/vllm/router', 'roles': ['router', 'viewer']}]}"
case_ok metrics-web-tls "${MON[*]} --set-json $WEB_TLS --set-json metrics.monitor.tlsConfig={\"insecureSkipVerify\":true}" \
  "'--metrics_web_config=/etc/fuselink/metrics/web-config.yml' in args" \
  "of('Secret')[0]['metadata']['name'] == 'fl-fuselink-metrics-web-config'" \
  "yaml.safe_load(of('Secret')[0]['stringData']['web-config.yml']) == {'tls_server_config': {'cert_file': '/etc/fuselink/tls/tls.crt', 'key_file': '/etc/fuselink/tls/tls.key', 'client_auth_type': 'NoClientCert'}}" \
  "{'name': 'metrics-web-config', 'secret': {'secretName': 'fl-fuselink-metrics-web-config'}} in pod['volumes']" \
  "{'name': 'metrics-web-config', 'mountPath': '/etc/fuselink/metrics', 'readOnly': True} in agent['volumeMounts']" \
  "of('ServiceMonitor')[0]['spec']['endpoints'][0]['scheme'] == 'https'" \
  "of('ServiceMonitor')[0]['spec']['endpoints'][0]['tlsConfig'] == {'insecureSkipVerify': True}" \
  "agent['livenessProbe']['tcpSocket'] == {'port': 'grpc'} and 'Pod' not in kinds"
case_ok metrics-web-auth "${MON[*]} --set-json $WEB_AUTH --set-json metrics.monitor.basicAuth={\"username\":{\"name\":\"scrape\",\"key\":\"user\"},\"password\":{\"name\":\"scrape\",\"key\":\"password\"}}" \
  "'scheme' not in of('ServiceMonitor')[0]['spec']['endpoints'][0]" \
  "of('ServiceMonitor')[0]['spec']['endpoints'][0]['basicAuth']['password'] == {'name': 'scrape', 'key': 'password'}" \
  "list(yaml.safe_load(of('Secret')[0]['stringData']['web-config.yml'])['basic_auth_users']) == ['prometheus']"
case_ok topology-per-node "--set topology.source=perNode --set-json topology.nodes={\"gpu-1\":{\"nics\":[{\"name\":\"rail0\",\"address\":\"10.0.0.1\",\"owner_gpu\":0}]}}" \
  "'--topology=/etc/fuselink/topology/\$(NODE_NAME).json' in args" \
  "[c for c in of('ConfigMap') if c['metadata']['name'] == 'fl-fuselink-topology'][0]['data']['gpu-1.json'].startswith('{')" \
  "'checksum/topology' in ds['spec']['template']['metadata']['annotations']"
case_ok topology-emulated "--set topology.source=emulated --set topology.emulatedNics=2" \
  "'--topology=emulated' in args and '--nics=2' in args and not any(v['name'] == 'topology' for v in pod['volumes'])"
case_ok topology-host-file "--set topology.source=hostPath" \
  "'--topology=/etc/fuselink/host/topology.json' in args and '--topology=discover' not in args" \
  "any(v['name'] == 'topology' for v in pod['volumes'])"
case_ok topology-discover-exclude "--set-json topology.excludeNics=[\"mlx5_4\",\"mlx5_5\"]" \
  "'--topology=discover' in args and '--exclude_nics=mlx5_4,mlx5_5' in args"
case_ok static-peers "--set peers.discovery=static --set-json peers.static=[{\"name\":\"gpu-2\",\"address\":\"10.0.0.2:17350\"},{\"name\":\"gpu-3\",\"address\":\"10.0.0.3:17350\"}]" \
  "'--peer=gpu-2=10.0.0.2:17350,gpu-3=10.0.0.3:17350' in args" \
  "not any(a.startswith('--peer_discovery') for a in args) and pod['automountServiceAccountToken'] is False"
case_ok operator-choices "--set priorityClassName=system-node-critical --set updateStrategy.maxUnavailable=25% --set gpu.runtimeClassName= --set dashboards.enabled=false --set test.enabled=false --set rbac.create=false --set agent.policy=static" \
  "pod['priorityClassName'] == 'system-node-critical' and 'runtimeClassName' not in pod" \
  "ds['spec']['updateStrategy']['rollingUpdate']['maxUnavailable'] == '25%'" \
  "[c['metadata']['name'] for c in of('ConfigMap')] == ['fl-fuselink-access-policy']" \
  "'Pod' not in kinds and 'Role' not in kinds and '--policy=static' in args"

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
  echo "ok: $(find "$run/ts" -maxdepth 1 -name '*.ts' | wc -l) renderings type-check"
else
  fail_case "tsc: $(head -40 "$run/tsc.out")"
fi

echo "== the template's own refusals"
case_refused same-ports "must differ" "--set ports.metrics=17350"
case_refused discovery-without-account "as a service account" "--set serviceAccount.create=false"
case_refused tls-volume-empty "set tls.volume" "--set tls.source=volume"
case_refused grpc-probe-under-tls "mutual TLS refuses" "--set probes.mode=grpc"
case_refused exec-probe-under-tls "mutual TLS refuses" "--set probes.mode=exec"
case_refused http-probe-with-web-config "cannot scrape" "--set-json $WEB_TLS --set probes.mode=http"
case_refused basic-auth-without-scrape-credentials "metrics.monitor.basicAuth" "${MON[*]} --set-json $WEB_AUTH"

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
bad fabric-stall-zero "--set agent.fabric.stallTimeoutMs=0"
bad fabric-ack-high "--set agent.fabric.ackTimeoutMs=3600001"
bad connections-per-peer-negative "--set agent.fabric.connectionsPerPeer=-1"
bad tensors-per-engine-high "--set agent.shares.tensorsPerEngine=65537"
bad prepare-threads-high "--set agent.prepare.threads=257"
bad incoming-idle-short "--set agent.incoming.idleTimeoutMs=999"
bad registrations-pending-zero "--set agent.registrations.pending=0"
bad grpc-streams-zero "--set agent.grpcMaxStreamsPerConnection=0"
bad ipc-close-wait-high "--set agent.ipcCloseWaitMs=60001"
bad drain-timeout-zero "--set agent.transferDrainTimeoutMs=0"
bad drain-timeout-string "--set-string agent.transferDrainTimeoutMs=10s"
bad fabric-unknown-key "--set agent.fabric.timeoutMs=5"
bad auth-queue-depth-high "--set metrics.authQueueDepth=1025"
bad extra-arg-not-a-flag "--set-json agent.extraArgs=[\"policy=static\"]"
bad agent-unknown-key "--set agent.chunkSize=4096"
bad topology-source "--set topology.source=file"
bad topology-path-relative "--set topology.hostPath=etc/fuselink/topology.json"
bad topology-path-not-json "--set topology.hostPath=/etc/fuselink/topology.yaml"
bad topology-per-node-empty "--set topology.source=perNode"
bad topology-nic-address "--set topology.source=perNode --set-json topology.nodes={\"g\":{\"nics\":[{\"name\":\"r\",\"address\":\"10.0.0.300\"}]}}"
bad topology-no-nics "--set topology.source=perNode --set-json topology.nodes={\"g\":{\"gpus\":[]}}"
bad emulated-nics-high "--set topology.emulatedNics=17"
bad topology-source-unknown "--set topology.source=guess"
bad_yaml topology-exclude-nic-space "topology: {excludeNics: ['mlx5 4']}"
bad handle-dir-relative "--set handleSocket.hostDir=run/fuselink"
bad handle-name-slash "--set handleSocket.name=a/b.sock"
bad host-ipc-string "--set-string hostIPC=true"
bad peers-discovery "--set peers.discovery=dns"
bad peer-address "--set-json peers.static=[{\"name\":\"a\",\"address\":\"10.0.0.2\"}]"
bad peer-no-name "--set-json peers.static=[{\"address\":\"10.0.0.2:17350\"}]"
bad tls-enabled-string "--set-string tls.enabled=on"
bad tls-source "--set tls.source=secret"
bad tls-old-secret-name "--set tls.secretName=agent-tls"
bad tls-old-agent-flags "--set tls.agentFlags=true"
bad tls-host-dir-relative "--set tls.hostPath.dir=etc/fuselink/tls"
bad tls-cert-file-path "--set tls.certFile=../tls.crt"
bad tls-refresh-zero "--set tls.refreshSeconds=0"
bad tls-volume-named "--set-json tls.volume={\"name\":\"x\",\"emptyDir\":{}}"
bad policy-peer-identity-no-node "--set accessPolicy.peerIdentity=spiffe://fuselink/node"
bad policy-unknown-role "--set-json accessPolicy.bindings=[{\"identity\":\"spiffe://x/*\",\"roles\":[\"admin\"]}]"
bad policy-binding-no-roles "--set-json accessPolicy.bindings=[{\"identity\":\"spiffe://x/*\",\"roles\":[]}]"
bad policy-binding-camel-case "--set-json accessPolicy.bindings=[{\"identity\":\"spiffe://x/*\",\"roles\":[\"peer\"],\"peerIdentity\":\"y\"}]"
bad runtime-subdir-dotdot "--set handleSocket.runtimeSubdir=.."
bad web-config-unknown-key "--set-json metrics.webConfig={\"http_server_config\":{}}"
bad web-config-plain-password "--set-json metrics.webConfig={\"basic_auth_users\":{\"p\":\"secret\"}}"
bad web-config-client-auth "--set-json metrics.webConfig={\"tls_server_config\":{\"cert_file\":\"/a\",\"key_file\":\"/b\",\"client_auth_type\":\"Sometimes\"}}"
bad probes-mode "--set probes.mode=https"
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
