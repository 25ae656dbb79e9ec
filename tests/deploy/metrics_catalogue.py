#!/usr/bin/python3
"""Compares docs/metrics.md with what a live (CPU-only) agent exports, both ways.

Usage: metrics_catalogue.py CATALOGUE.md SCRAPE.txt SOURCE_DIR...
For every family in the scrape: listed, same type, same label names (le aside).
For every family listed for all nodes: in the scrape. Families of a class of agents
(GPU: agents with GPUs; watched: agents that read some NIC's kernel counters for
foreign traffic; kubernetes: agents with Kubernetes peer discovery): when the scrape
has any family of the class, every one of it must be there like the others; when it
has none, each must be named in the sources (the .cc and .h files under the
SOURCE_DIRs: each part of the agent declares its own families). Prints each difference; exits 1 if there
is any.
"""
import os
import re
import sys

ROW = re.compile(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(\w+)\s*\|([^|]*)\|[^|]*\|\s*(all|GPU|watched|kubernetes)\s*\|")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def catalogue(path):
    rows = {}
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                name, kind, labels, nodes = m.groups()
                if name in rows:
                    raise SystemExit("catalogue lists %s twice" % name)
                rows[name] = (kind, {l.strip() for l in labels.split(",") if l.strip()}, nodes)
    return rows


def scrape(path):
    families, labels = {}, {}
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        m = re.match(r"^# TYPE (\S+) (\S+)$", line)
        if m:
            families[m.group(1)] = m.group(2)
            labels[m.group(1)] = set()
    for line in lines:
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if not m:
            continue
        sample = m.group(1)
        family = next((f for f in families if sample == f or
                       any(sample == f + s for s in SUFFIXES.get(families[f], ()) if s)), None)
        if family is None:
            labels.setdefault("?" + sample, set())
            continue
        for pair in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""):
            if pair != "le":
                labels[family].add(pair)
    return families, labels


def main() -> int:
    rows = catalogue(sys.argv[1])
    families, labels = scrape(sys.argv[2])
    source = ""
    for top in sys.argv[3:]:
        for folder, _, files in os.walk(top):
            for name in files:
                if name.endswith((".cc", ".h")):
                    with open(os.path.join(folder, name)) as f:
                        source += f.read()
    problems = []
    present = {rows[name][2] for name in families if name in rows}
    gpu_agent = "GPU" in present
    for name in sorted(labels):
        if name.startswith("?"):
            problems.append("sample %s belongs to no # TYPE family" % name[1:])
    for name, kind in sorted(families.items()):
        if name not in rows:
            problems.append("exported but not in the catalogue: %s (%s, labels %s)"
                            % (name, kind, ", ".join(sorted(labels[name])) or "none"))
            continue
        want_kind, want_labels, nodes = rows[name]
        if kind != want_kind:
            problems.append("%s: exported as %s, catalogued as %s" % (name, kind, want_kind))
        if labels[name] != want_labels:
            problems.append("%s: exported labels {%s}, catalogued {%s}" % (
                name, ", ".join(sorted(labels[name])), ", ".join(sorted(want_labels))))
    for name, (kind, _, nodes) in sorted(rows.items()):
        if (nodes == "all" or nodes in present) and name not in families:
            problems.append("catalogued but not exported: %s" % name)
        if nodes != "all" and nodes not in present and '"%s"' % name not in source:
            problems.append("catalogued %s-only, but %s is not named under %s" % (nodes, name, " ".join(sys.argv[3:])))
    for p in problems:
        print("  " + p)
    gpu = sum(1 for r in rows.values() if r[2] == "GPU")
    print("catalogue: %d families (%d GPU-only), %s agent exports %d; %d difference(s)"
          % (len(rows), gpu, "a GPU" if gpu_agent else "a CPU", len(families), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
