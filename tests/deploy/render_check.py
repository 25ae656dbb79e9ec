#!/usr/bin/python3
"""Checks facts about a rendered chart: each argument after the file is a Python
expression that must be true. Names at hand:
  docs         every object, in order
  kinds        the set of "Kind" names rendered
  of(kind)     the objects of that kind
  ds           the DaemonSet; pod its pod spec; agent its container; args its args
  alerts_file  the plain rules file, parsed
Prints each failed expression and exits 1 if any failed.
Usage: render_check.py RENDERED.yaml EXPR...
"""
import os
import sys

import yaml


def main() -> int:
    with open(sys.argv[1]) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    names = {"docs": docs, "kinds": {d["kind"] for d in docs}}
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
