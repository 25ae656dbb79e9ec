#!/bin/bash
# The dashboards and alerts without a server: tsc --strict against Grafana's published
# types (@grafana/schema, @grafana/grafana-foundation-sdk), shown to refuse a
# misspelled field; units, datasource, $__rate_interval and catalogued metrics on every
# panel (dashboard_queries.py lint); promtool check rules on the plain rules file and on
# the chart's PrometheusRule; promtool test rules (alerts_test.yaml): every alert fires
# on its cause and stays quiet otherwise.
# Usage: dashboards_static_test.sh   (tools: scripts/setup-k8s-tools.sh helm typecheck)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-dash.XXXXXX)
trap 'rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$here/scripts/setup-k8s-tools.sh" helm typecheck
# shellcheck source=/dev/null  # written by setup-k8s-tools.sh at run time
. "${FUSELINK_CACHE:-/var/cache/fuselink}/k8s-tools/env.sh"
t=$here/tests/deploy
dashboards=("$here"/dashboards/*.json)
[ ${#dashboards[@]} -ge 2 ] || fail "dashboards/ lacks its dashboards"

tsc_check() { # OUT_DIR DASHBOARD...: 0 when they type-check
  local dir=$1
  shift
  mkdir -p "$dir"
  "$t/dashboard_types.py" "$dir/dashboards.ts" "$@"
  echo '{"compilerOptions": {"strict": true, "noEmit": true, "module": "nodenext",
    "moduleResolution": "nodenext", "skipLibCheck": true, "typeRoots": []},
    "include": ["*.ts"]}' >"$dir/tsconfig.json"
  ln -sfn "$TSC_DIR/node_modules" "$dir/node_modules"
  (cd "$dir" && node "$TSC_DIR/node_modules/typescript/bin/tsc" -p .) >"$dir/tsc.out" 2>&1
}
tsc_check "$run/ts" "${dashboards[@]}" || { cat "$run/ts/tsc.out"; fail "dashboards do not type-check"; }
sed 's/"legendFormat"/"legendFromat"/' "${dashboards[0]}" >"$run/misspelled.json"
if tsc_check "$run/ts-bad" "$run/misspelled.json"; then
  fail "tsc passed a dashboard with a misspelled field"
fi
echo "ok: ${#dashboards[@]} dashboards type-check; a misspelled field is refused"

"$t/dashboard_queries.py" lint "$here/docs/metrics.md" "$here/deploy/prometheus/fuselink-alerts.yaml" \
  "${dashboards[@]}" || fail "dashboard lint"

promtool check rules "$here/deploy/prometheus/fuselink-alerts.yaml" || fail "promtool check rules"
"$HELM3" template fl "$here/deploy/helm/fuselink" \
  --api-versions monitoring.coreos.com/v1/PrometheusRule --show-only templates/prometheusrule.yaml |
  /usr/bin/python3 -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(sys.stdin)["spec"], sys.stdout)' \
    >"$run/chart-rules.yaml"
promtool check rules "$run/chart-rules.yaml" || fail "promtool check rules on the chart's PrometheusRule"
promtool test rules "$t/alerts_test.yaml" || fail "promtool test rules"
echo "PASS: dashboards type-check and lint clean; rules check and fire as tested"
