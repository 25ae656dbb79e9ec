#!/bin/bash
# The main job: a local cluster of two agents, node-a and node-b, each an emulated
# node with four GPUs and four NICs on its own loopback addresses (rail i of node-a
# talks to rail i of node-b; GPU i owns rail i). Registers a synthetic KV cache of
# GPU 0 on each and asks node-a over gRPC to move every block to node-b: under the
# fuselink policy GPU 0 borrows the idle rails 1-3 beside its own rail0. Once it is
# under way, GPU 1 moves a KV cache of its own over rail1, and the hot transfer gives
# rail1 back. Shows the progress with the per-NIC split, what the hot transfer still
# sent on rail1 while its owner's ran, verifies the bytes in node-b's memory, shows
# what node-b's watchers saw and the per-NIC own/borrowed metrics, and stops the
# agents. Everything speaks mutual TLS, under the default access policy:
# a CA and certificates made with scripts/certs.sh in the run's folder, one per agent,
# an engine's (e1) that registers the KV caches, a router's (r1) that moves them and
# a viewer's (v1) that looks and watches node-b.
#   LAYERS, BLOCKS, BLOCK_BYTES  size of the KV cache (default 32 x 64 x 256 KiB)
#   OWNER_BLOCKS                 blocks per layer of GPU 1's (default 16; 0: none)
#   POLICY                       fuselink, stripe or static (default fuselink)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh fuselink-agent fuselinkctl
bin="${BUILD_DIR:-build}"
agent="$bin/services/fuselink-agent"
ctl="$bin/tools/fuselinkctl/fuselinkctl"

run=$(mktemp -d /tmp/fuselink-cluster.XXXXXX)
. scripts/lib/agents.sh
trap 'stop_agents; rm -rf "$run"' EXIT
pki_init "$run/pki"

start_agent node-b 2 "" --nics=4 --policy="${POLICY:-fuselink}"
cat "$run/node-b.log"
b=$(field "$run/node-b.json" grpc)
start_agent node-a 1 "node-b=$b" --nics=4 --policy="${POLICY:-fuselink}"
cat "$run/node-a.log"
a=$(field "$run/node-a.json" grpc)

echo
"$ctl" --agent="$a" "${viewer_tls[@]}" topology
echo
# A watcher on node-b learns when blocks are ready: a viewer, since an engine may
# watch only the tensors it registered, and the demo's does not exist yet.
"$ctl" --agent="$b" "${viewer_tls[@]}" watch >"$run/watch.out" 2>&1 &
pids+=($!)
sleep 0.2

"$ctl" --agent="$a" --target_agent="$b" "${demo_tls[@]}" \
  --source_socket="$run/node-a.sock" --target_socket="$run/node-b.sock" \
  --demo_layers="${LAYERS:-32}" --demo_blocks="${BLOCKS:-64}" \
  --demo_block_bytes="${BLOCK_BYTES:-262144}" --demo_owner_blocks="${OWNER_BLOCKS:-16}" demo

sleep 0.2
echo
echo "node-b's watcher saw:"
sed 's/^/  /' "$run/watch.out"
echo
for n in node-a node-b; do
  url=$(field "$run/$n.json" metrics)
  echo "$n metrics at $url:"
  curl -s "$url" | grep -E '^fuselink_(nic_(transmitted|received)_bytes|nic_give_back_(seconds_(sum|count)|events_total)|transfers_total)' \
    | grep -v ' 0$' | sed 's/^/  /'
done
echo
echo "stopping the agents"
