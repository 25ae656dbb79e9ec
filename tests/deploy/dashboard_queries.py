#!/usr/bin/python3
"""The dashboards' queries, for the tests.

  dashboard_queries.py lint CATALOGUE.md RULES.yaml DASHBOARD.json...
      Every panel has a unit and the ${datasource} datasource; every range in a
      panel's query is [$__rate_interval]; every metric a query or an alert rule
      names is in the catalogue; the variables are there (datasource, job, node; nic
      on the cluster view). Exits 1 on any problem.
  dashboard_queries.py check PROMETHEUS_URL START END CATALOGUE.md DASHBOARD.json...
      Runs every panel's query over [START, END] (query_range, 1 s steps) with the
      variables set (job=fuselink, every node and NIC, $__rate_interval 4s). A query
      with no series or no finite value fails, unless every metric it names is
      GPU-only in the catalogue and no agent exported GPU metrics (reported as not
      checked). Prints one line per query; exits 1 if any failed.
"""
import json
import math
import re
import sys
import urllib.parse
import urllib.request

METRIC = re.compile(r"\b((?:fuselink|exposer)_[a-z0-9_]+|up)\b")
ROW = re.compile(
    r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(\w+)\s*\|[^|]*\|[^|]*\|\s*(all|GPU|watched)\s*\|")
VARS = {"$job": "fuselink", "$node": ".+", "$nic": ".+", "$__rate_interval": "4s",
        "$nic_rate_gbps": "1"}


def catalogue(path):
    rows = {}
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                rows[m.group(1)] = m.group(3)
    return rows


def family(metric, rows):
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric[: -len(suffix)] in rows:
            return metric[: -len(suffix)]
    return metric


def queries(paths):
    for path in paths:
        with open(path) as f:
            board = json.load(f)
        for panel in board["panels"]:
            for t in panel.get("targets", []):
                yield board, panel, t


def substitute(expr, node_single):
    out = expr
    if node_single:
        out = out.replace('instance="$node"', 'instance=~".+"')
    for k in sorted(VARS, key=len, reverse=True):
        out = out.replace(k, VARS[k])
    return out


def lint(catalogue_path, rules_path, paths):
    rows = catalogue(catalogue_path)
    problems = []
    for path in paths:
        with open(path) as f:
            board = json.load(f)
        names = [v["name"] for v in board["templating"]["list"]]
        want = ["datasource", "job", "node"] + (["nic"] if "cluster" in path else [])
        for w in want:
            if w not in names:
                problems.append("%s: no variable %s" % (path, w))
        ids = [p["id"] for p in board["panels"]]
        if len(ids) != len(set(ids)):
            problems.append("%s: panel ids repeat" % path)
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            where = "%s: %s" % (path, panel["title"])
            if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                problems.append(where + ": no unit")
            if panel.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(where + ": datasource is not ${datasource}")
            if not panel.get("targets"):
                problems.append(where + ": no query")
            for t in panel.get("targets", []):
                for r in re.findall(r"\[([^\]]*)\]", t["expr"]):
                    if r != "$__rate_interval":
                        problems.append("%s: range [%s], want [$__rate_interval]" % (where, r))
                for m in METRIC.findall(t["expr"]):
                    if m != "up" and family(m, rows) not in rows:
                        problems.append("%s: %s is not in the catalogue" % (where, m))
    with open(rules_path) as f:
        for m in METRIC.findall(f.read()):
            if m != "up" and family(m, rows) not in rows:
                problems.append("%s: %s is not in the catalogue" % (rules_path, m))
    for p in problems:
        print("  " + p)
    print("lint: %d problem(s)" % len(problems))
    return 1 if problems else 0


def query_range(url, expr, start, end):
    data = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    with urllib.request.urlopen(url + "/api/v1/query_range?" + data, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(body)
    return body["data"]["result"]


def check(url, start, end, catalogue_path, paths):
    rows = catalogue(catalogue_path)
    gpu_families = [f for f, n in rows.items() if n == "GPU"]
    gpu_present = any(query_range(url, f, start, end) for f in gpu_families)
    failed = unchecked = passed = 0
    for board, panel, t in queries(paths):
        node_single = not any(v["name"] == "node" and v.get("multi") for v in board["templating"]["list"])
        expr = substitute(t["expr"], node_single)
        where = "%s / %s / %s" % (board["uid"], panel["title"], t["refId"])
        fams = {family(m, rows) for m in METRIC.findall(t["expr"]) if m != "up"}
        gpu_only = bool(fams) and all(rows.get(f) == "GPU" for f in fams)
        result = query_range(url, expr, start, end)
        finite = [s for s in result if any(math.isfinite(float(v)) for _, v in s["values"])]
        if finite:
            passed += 1
            print("ok    %s: %d series" % (where, len(finite)))
        elif gpu_only and not gpu_present:
            unchecked += 1
            print("GPU   %s: not checked, no agent here has GPUs" % where)
        else:
            failed += 1
            print("FAIL  %s: %s series, none with a finite value\n      %s"
                  % (where, len(result), expr))
    print("panel queries: %d returned data, %d failed, %d GPU-only not checked"
          % (passed, failed, unchecked))
    return 1 if failed else 0


def main() -> int:
    if sys.argv[1] == "lint":
        return lint(sys.argv[2], sys.argv[3], sys.argv[4:])
    if sys.argv[1] == "check":
        return check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
