#!/usr/bin/python3
"""Writes rendered Kubernetes manifests as TypeScript, each object typed by its kind
(kubernetes-types for built-in kinds, @kubernetes-models/prometheus-operator for the
monitoring CRDs), so that `tsc --strict` refuses misspelled fields and wrong types.

Usage: manifest_types.py OUT.ts RENDERED.yaml   (exits 1 on a kind it cannot type)
"""
import json
import sys

import yaml

BUILTIN = {
    ("apps/v1", "DaemonSet"): ("kubernetes-types/apps/v1", "DaemonSet"),
    ("v1", "Service"): ("kubernetes-types/core/v1", "Service"),
    ("v1", "ServiceAccount"): ("kubernetes-types/core/v1", "ServiceAccount"),
    ("v1", "ConfigMap"): ("kubernetes-types/core/v1", "ConfigMap"),
    ("v1", "Secret"): ("kubernetes-types/core/v1", "Secret"),
    ("v1", "Pod"): ("kubernetes-types/core/v1", "Pod"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("kubernetes-types/rbac/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("kubernetes-types/rbac/v1", "RoleBinding"),
}
OPERATOR = "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/"
for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
    BUILTIN[("monitoring.coreos.com/v1", kind)] = (OPERATOR + kind, "I" + kind)
UNTYPED: set = set()  # kinds rendered without published types, listed as unchecked


def main() -> int:
    out, rendered = sys.argv[1], sys.argv[2]
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    imports, lines, untyped = {}, [], []
    for i, doc in enumerate(docs):
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in UNTYPED:
            untyped.append("%s/%s" % key)
            continue
        if key not in BUILTIN:
            print("manifest_types: no type for %s %s" % key, file=sys.stderr)
            return 1
        module, name = BUILTIN[key]
        alias = "T_" + name
        imports.setdefault(module, set()).add((name, alias))
        lines.append("export const o%d: %s = %s;" % (i, alias, json.dumps(doc, indent=1)))
    with open(out, "w") as f:
        for module, types in sorted(imports.items()):
            names = ", ".join("%s as %s" % t for t in sorted(types))
            f.write('import type { %s } from "%s";\n' % (names, module))
        f.write("\n".join(lines) + "\n")
    if untyped:
        print("manifest_types: not type-checked (no published types): %s" % ", ".join(untyped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
