#!/usr/bin/python3
"""Writes Grafana dashboards as TypeScript for `tsc --strict`: the dashboard against
@grafana/schema's Dashboard, and each panel's Prometheus queries, options and field
config against @grafana/grafana-foundation-sdk (which @grafana/schema leaves open).
Object literals get TypeScript's excess-property checks: a misspelled field or a
wrong type fails. Enum-typed fields take their string values (Lit below).

Usage: dashboard_types.py OUT.ts DASHBOARD.json...
"""
import json
import os
import re
import sys

HEADER = """import type { Dashboard } from "@grafana/schema";
import type * as prometheus from "@grafana/grafana-foundation-sdk/prometheus";
import type * as timeseries from "@grafana/grafana-foundation-sdk/timeseries";
import type * as stat from "@grafana/grafana-foundation-sdk/stat";
// Enums as their values; methods (the SDK's type markers) dropped.
type Lit<T> = T extends (...args: never[]) => unknown ? never
  : T extends string ? `${T}`
  : T extends Array<infer U> ? Lit<U>[]
  : T extends object ? { [K in keyof T as T[K] extends (...args: never[]) => unknown ? never : K]: Lit<T[K]> }
  : T;
type PanelTypes = {
  timeseries: { options: Lit<timeseries.Options>; custom: Lit<timeseries.FieldConfig> };
  stat: { options: Lit<stat.Options>; custom: Record<string, never> };
};
"""
KINDS = ("timeseries", "stat")


def main() -> int:
    out = sys.argv[1]
    lines = [HEADER]
    for path in sys.argv[2:]:
        with open(path) as f:
            board = json.load(f)
        name = re.sub(r"\W", "_", os.path.basename(path).removesuffix(".json"))
        lines.append("export const %s: Lit<Dashboard> = %s;" % (name, json.dumps(board, indent=1)))
        for panel in board.get("panels", []):
            kind = panel["type"]
            if kind == "row":
                continue
            if kind not in KINDS:
                print("dashboard_types: %s: panel type %s has no types here" % (path, kind))
                return 1
            p = "%s_%d" % (name, panel["id"])
            lines.append("export const %s_options: PanelTypes['%s']['options'] = %s;"
                         % (p, kind, json.dumps(panel.get("options", {}))))
            custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
            lines.append("export const %s_custom: PanelTypes['%s']['custom'] = %s;"
                         % (p, kind, json.dumps(custom)))
            for t in panel.get("targets", []):
                lines.append("export const %s_%s: Lit<Omit<prometheus.Dataquery, '_implementsDataqueryVariant'>> = %s;"
                             % (p, t["refId"], json.dumps(t)))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
