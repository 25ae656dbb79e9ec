#!/bin/bash
# The GPU tests on a GPU machine: two agents in network namespaces (scripts/testbed.sh),
# each using all the GPUs as its node's GPUs, one rail per GPU shaped to RATE; PyTorch
# engines lend GPU tensors through the Python client and gpu_cluster.py checks them
# (its `check` mode), once with the D2 relay stage and once with D1 (CHECKS=0 skips
# them). With BENCH=1 it then draws the curve: for R = MIN_RAILS (default 1) to G rails
# (GPUs 0 .. R-1, so R - 1 NICs to borrow), one hot GPU 0 sends GIB GiB (default 4) to
# the other node under static, stripe and fuselink (D1, D2), and NCCL point-to-point
# crosses the same rails (tools/bench/nccl_p2p.py).
# Skips (77) without a GPU, torch, or a testbed, saying why.
# Usage: gpu_cluster_test.sh AGENT_BINARY PYTHONPATH_DIR
#        (env: RATE, CHECKS, BENCH, MIN_RAILS, GIB)
set -euo pipefail
agent=$1
export PYTHONPATH=$2${PYTHONPATH:+:$PYTHONPATH}
here=$(cd "$(dirname "$0")/../.." && pwd)
rate=${RATE:-10gbit}
. "$here/scripts/lib/testbed.sh"

gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) ||
  { echo "SKIP: python3 cannot import torch"; exit 77; }
[ "$gpus" -ge 1 ] || { echo "SKIP: no CUDA GPU visible to torch"; exit 77; }
python3 -c 'import fuselink' || fail "the fuselink Python package does not import"
testbed_test_start flg
# Mutual TLS under the default policy: certificates per agent (with its management
# address) and for the engines (e1) and the router (r1) the drivers speak as.
pki_init "$(mktemp -d /tmp/fuselink-gpu-pki.XXXXXX)"
testbed_on_exit_hook() { rm -rf "$pki"; }


# up RAILS: (re)builds the testbed with RAILS rails, one per GPU 0 .. RAILS-1.
up() {
  stop_agents
  pids=()
  if [ -n "${out:-}" ]; then "$tb" down --name "$name" >/dev/null; fi
  "$tb" up --name "$name" --nodes 2 --rails "$1" --rate "$rate"
  testbed_load "$name"
  out="$TESTBED_STATE"
}

# agents FLAGS...: (re)starts node-b and node-a with FLAGS; sets $addrs for the driver.
agents() {
  stop_agents
  pids=()
  testbed_start_agent 1 node-b "" "$@"
  local b
  b=$(field "$out/node-b.json" grpc)
  testbed_start_agent 0 node-a "node-b=$b" "$@"
  addrs=(--tls_dir "$pki" --a "$(field "$out/node-a.json" grpc)" --a_socket "$out/node-a.sock"
    --a_metrics "$(field "$out/node-a.json" metrics)"
    --b "$b" --b_socket "$out/node-b.sock" --b_metrics "$(field "$out/node-b.json" metrics)")
  grep -h "GPU\|relay" "$out/node-a.log" | head -5
}

driver="$here/tests/gpu/gpu_cluster.py"
if [ "${CHECKS:-1}" = 1 ]; then
  up "$gpus"
  for stage in d2 d1; do
    echo "== checks, relay stage $stage, $gpus GPUs, rails at $rate"
    agents --policy=fuselink --relay_stage="$stage" --relay_cap_mib=64
    python3 "$driver" check "${addrs[@]}" --stage "$stage"
  done
  # How each GPU's memory crosses each NIC (TCP rails: staged).
  paths=$(curl -s "$(field "$out/node-a.json" metrics)" | grep '^fuselink_gpu_nic_path' || true)
  echo "$paths" | head -4
  grep -q 'path="staged"' <<<"$paths" || { echo "FAIL: no fuselink_gpu_nic_path"; exit 1; }
  echo "== in-node moves against a plain copy of the same bytes (${LOCAL_GIB:-1} GiB)"
  python3 "$driver" local "${addrs[@]}" --gib "${LOCAL_GIB:-1}" --rounds 5
  echo "== the Python client's example"
  python3 "$here/clients/python/examples/gpu_kv_transfer.py" --tls_dir "$pki" \
    --source_agent "${addrs[3]}" --source_socket "${addrs[5]}" \
    --target_agent "${addrs[9]}" --target_socket "${addrs[11]}" \
    --source_gpu 0 --target_gpu $((gpus - 1))
fi

if [ "${BENCH:-0}" != 1 ]; then
  [ "${CHECKS:-1}" = 1 ] || { echo "SKIP: CHECKS=0 and no BENCH=1: nothing to run"; exit 77; }
  exit 0
fi
# The curve: GPU 0 sends; with R rails the node has GPUs 0 .. R-1 and each NIC's own
# GPU idle, so fuselink may borrow R - 1 NICs. R from ${MIN_RAILS:-1} to every GPU.
gib=${GIB:-4}
for rails in $(seq "${MIN_RAILS:-1}" "$gpus"); do
  up "$rails"
  echo "== end to end, one hot GPU, $rails rails at $rate ($((rails - 1)) to borrow), $gib GiB"
  for spec in static:d2 stripe:d2 fuselink:d2 fuselink:d1; do
    policy=${spec%%:*}
    agents --policy="$policy" --relay_stage="${spec#*:}"
    python3 "$driver" bench "${addrs[@]}" --gib "$gib" --rounds 3 --label "$spec rails=$rails"
    if [ "$policy" = fuselink ]; then
      curl -s "$(field "$out/node-a.json" metrics)" |
        grep -E "^fuselink_(relay_(remaps|staged|device)|stage_)" || true
    fi
  done
  stop_agents
  pids=()
  echo "== NCCL point-to-point over the same $rails rails"
  if [ "$gpus" -lt 2 ]; then
    echo "skipped: NCCL refuses two ranks on one GPU, and this machine has 1"
    continue
  fi
  nccl=(env NCCL_SOCKET_IFNAME="$(seq -s, -f 'rail%g' 0 $((rails - 1)))" NCCL_IB_DISABLE=1
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 MASTER_ADDR=10.232.0.1
    MASTER_PORT=29511 WORLD_SIZE=2 python3 "$here/tools/bench/nccl_p2p.py"
    --bytes $((gib << 30)))
  # NCCL refuses two ranks on one GPU: the receiver uses the last GPU.
  testbed_exec 1 "${nccl[@]}" --rank 1 --gpu $((gpus - 1)) >"$out/nccl1.log" 2>&1 &
  nccl1=$!
  testbed_exec 0 "${nccl[@]}" --rank 0 --gpu 0 2>&1 | tail -3
  wait "$nccl1" || true
  tail -1 "$out/nccl1.log"
done
