#!/bin/bash
# What registering a per-layer KV cache costs: one agent on loopback (mutual TLS), an
# engine lending LAYERS layers as K and V buffers of PART_KIB x BLOCKS each (2 x LAYERS
# memfd regions) with register_kv_layers, ROUNDS times. Prints the time of each call
# (descriptors over the handle socket, RegisterTensor, the watch) and the agent's
# own (anonymous) memory before and after, as one JSON line.
# Usage: register_layers.sh AGENT_BINARY PYTHON_DIR
set -euo pipefail
agent=$1
pydir=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-register.XXXXXX)
. "$here/scripts/lib/agents.sh"
trap 'stop_agents; rm -rf "$run"' EXIT
pki_init "$run/pki"
start_agent node-a 1 "" --nics=2
a=$(field "$run/node-a.json" grpc)
LAYERS=${LAYERS:-64} BLOCKS=${BLOCKS:-256} PART_KIB=${PART_KIB:-64} ROUNDS=${ROUNDS:-5} \
  AGENT_PID=${pids[0]} FL_AGENT=$a FL_SOCKET=$run/node-a.sock FL_PKI=$run/pki \
  PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}" "${FUSELINK_PYTHON:-/usr/bin/python3}" - <<'PY'
import json, os, time
import fuselink

def rss_kib(pid, kind):
    """RssAnon: the agent's own memory; RssShmem: the lent memfd pages it maps (the
    engine's memory, faulted in at registration, not a copy)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(kind + ":"))

layers, blocks = int(os.environ["LAYERS"]), int(os.environ["BLOCKS"])
part = int(os.environ["PART_KIB"]) << 10
pid = int(os.environ["AGENT_PID"])
engine = fuselink.Agent(os.environ["FL_AGENT"], handle_socket=os.environ["FL_SOCKET"],
                        tls=fuselink.Tls.from_dir(os.environ["FL_PKI"], "engine", "e1"))
buffers = [(fuselink.HostBuffer(blocks * part), fuselink.HostBuffer(blocks * part))
           for _ in range(layers)]
before = rss_kib(pid, "RssAnon")
seconds = []
for r in range(int(os.environ["ROUNDS"])):
    start = time.perf_counter()
    engine.register_kv_layers(f"kv{r}", buffers, blocks, watch=False)
    seconds.append(time.perf_counter() - start)
held, shared = rss_kib(pid, "RssAnon"), rss_kib(pid, "RssShmem")
for r in range(len(seconds)):
    engine.unregister(f"kv{r}")
print(json.dumps({"layers": layers, "regions": 2 * layers, "blocks": blocks,
                  "part_bytes": part, "gib_lent": round(2 * layers * blocks * part / 2**30, 2),
                  "register_ms": [round(s * 1e3, 1) for s in seconds],
                  "agent_anon_kib_before": before, "agent_anon_kib_holding": held,
                  "agent_anon_kib_per_cache": round((held - before) / len(seconds), 1),
                  "lent_pages_mapped_kib": shared}))
PY
