#!/usr/bin/python3
"""Checks facts about a rendered chart: each argument after the file is a Python
expression that must be true. Names at hand:
  docs         every object, in order
  kinds        the set of "Kind" names rendered
  of(kind)     the objects of that kind
  ds           the DaemonSet; pod its pod spec; agent its container; args its args
  alerts_file  the plain rules file, parsed
  policy       the access-policy ConfigMap's policy.json, parsed (None if absent)
  proto_fields(message)  the field names of a message in api/proto/fuselink/v1/policy.proto
Prints each failed expression and exits 1 if any failed.
Usage: render_check.py RENDERED.yaml EXPR...
"""
import json
import os
import re
import sys

import yaml


def main() -> int:
    with open(sys.argv[1]) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    names = {"docs": docs, "kinds": {d["kind"] for d in docs}, "yaml": yaml, "json": json}
    names["of"] = lambda kind: [d for d in docs if d["kind"] == kind]
    daemonsets = names["of"]("DaemonSet")
    if daemonsets:
        ds = daemonsets[0]
        names["ds"] = ds
        names["pod"] = ds["spec"]["template"]["spec"]
        names["agent"] = names["pod"]["containers"][0]
        names["args"] = names["agent"]["args"]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "../../deploy/helm/fuselink/files/fuselink-alerts.yaml")) as f:
        names["alerts_file"] = yaml.safe_load(f)
    policies = [c for c in names["of"]("ConfigMap") if c["metadata"]["name"].endswith("-access-policy")]
    names["policy"] = json.loads(policies[0]["data"]["policy.json"]) if policies else None
    with open(os.path.join(here, "../../api/proto/fuselink/v1/policy.proto")) as f:
        proto = f.read()

    def proto_fields(message):
        body = re.search(r"message %s \{(.*?)\n\}" % message, proto, re.S).group(1)
        return set(re.findall(r"^\s*(?:repeated\s+)?\w+\s+(\w+)\s*=\s*\d+;", body, re.M))

    names["proto_fields"] = proto_fields
    failed = 0
    for expr in sys.argv[2:]:
        try:
            ok = eval(expr, names)  # the test's own expressions
        except Exception as e:  # a missing field is a failed check
            ok = False
            expr += "  (%s: %s)" % (type(e).__name__, e)
        if not ok:
            print("  not true: " + expr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
