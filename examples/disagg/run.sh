#!/bin/bash
# Disaggregated serving through fuselink, end to end on one machine: two agents on
# loopback over mutual TLS (node-a the prefill side, node-b the decode side, started
# as tests/python/client_test.sh starts them), a prefill engine lending its KV cache
# to node-a's agent, a decode engine lending its own to node-b's, and the router. Each
# prompt's K/V moves from one cache into the other through the agents; the run passes
# only when every request's tokens equal a single engine's (router.py --check).
#
# Usage: run.sh [AGENT_BINARY [PYTHON_DIR]]  the agents' run
#        run.sh --standin [PYTHON_DIR]       standin_test.py: both engines in one
#                                            process, a block copy for the agents
# AGENT_BINARY and PYTHON_DIR default to build/services/fuselink-agent and
# build/python (the client the build made). PROMPTS (8), SEED (1), MAX_LEN (80) and
# MAX_NEW (16) shape the run: random prompt lengths in 1..MAX_LEN from SEED.
# The router moves each prompt's K/V through node-a's agent with fuselink.aio
# (router.py --agent); ENGINE_SENDS=1 has the prefill engine move it instead.
# LAYER_BY_LAYER=1: each layer is sent as soon as the prefill engine computed it.
# IN_NODE=1: the decode engine lends its cache to node-a's agent too, and each move is
# an in-node one (the agent's own copy engines, no NIC).
# DEVICE (cpu) is where the engines keep the model, compute and their KV caches:
# DEVICE=cuda puts both engines (and the router's single-engine check) on cuda:0,
# each cache one CUDA tensor per layer lent by CUDA IPC; the agents then use the GPU
# (topology GPU i is CUDA device i: run everything with the same
# CUDA_VISIBLE_DEVICES). The stand-in runs on the CPU only.
# MODEL (tiny) is model.PRESETS' name: tiny, the example's own, or llama, transformers'
# LlamaForCausalLM (hf_model.py; needs the transformers package). BLOCKS: each engine's
# cache blocks (engine.py's default: 64).
# RAILS=R: the agents run in a testbed instead (scripts/testbed.sh: two namespaces, R
# rails shaped to RATE, default 10gbit; root), under POLICY (fuselink), so that the
# prompt's own rail is one of R and the policy decides which carry its K/V.
# ROUTER_ARGS: more flags for router.py (an on-off load: --poisson 4 --on_s 2 --off_s 2).
# Exit: 0 all tokens match, 1 otherwise, 77 (skipped) where no python3 has torch,
# grpc and protobuf, or with DEVICE=cuda where torch finds no CUDA GPU.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
standin=""
if [ "${1:-}" = --standin ]; then
  standin=1
  pydir=${2:-$here/build/python}
else
  # shellcheck disable=SC2034  # read by start_agent (scripts/lib/agents.sh)
  agent=${1:-$here/build/services/fuselink-agent}
  pydir=${2:-$here/build/python}
fi
example=$here/examples/disagg

# shellcheck source=scripts/lib/testbed.sh
. "$here/scripts/lib/testbed.sh"
find_python torch grpc google.protobuf
if [ -z "$python" ]; then
  echo "SKIP: no python3 with the torch, grpc and protobuf modules" \
    "(apt-get install python3-torch python3-grpcio python3-protobuf)"
  exit 77
fi
model=${MODEL:-tiny}
if [ "$model" = llama ] && ! "$python" -c 'import transformers' 2>/dev/null; then
  echo "SKIP: MODEL=llama, but $python has no transformers package"
  exit 77
fi
device=${DEVICE:-cpu}
case $device in
  cpu) echo "device: cpu" ;;
  cuda | cuda:0)
    if [ -n "$standin" ]; then
      echo "the stand-in runs on the CPU only: run it without DEVICE=$device" >&2
      exit 2
    fi
    device=cuda:0
    gpu=$("$python" -c 'import torch; print(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else exit(1)' 2>/dev/null) || {
      echo "SKIP: DEVICE=cuda, but $python's torch finds no CUDA GPU" \
        "(torch $("$python" -c 'import torch; print(torch.__version__, "CUDA build", torch.version.cuda)' 2>&1))"
      exit 77
    }
    echo "device: $device ($gpu; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})"
    export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
    ;;
  *)
    echo "DEVICE=$device: cpu or cuda (both engines on cuda:0)" >&2
    exit 2
    ;;
esac
export PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}"
[ -z "$standin" ] || exec "$python" "$example/standin_test.py" -v

run=$(mktemp -d /tmp/fuselink-disagg.XXXXXX)
engines=()
stop_all() {
  # Engines first: each unregisters its cache from an agent still there.
  for p in "${engines[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${engines[@]}"; do wait "$p" 2>/dev/null || true; done
  stop_agents
}
state=$run  # where the agents keep their logs and sockets (a testbed's own folder)
show_logs() {
  for f in "$state/node-a.log" "$state/node-b.log" "$run/prefill.log" "$run/decode.log"; do
    [ -f "$f" ] && { echo "--- ${f##*/}"; tail -n 30 "$f"; }
  done
}
tb_name=""
teardown() {
  stop_all
  if [ -n "$tb_name" ]; then "$here/scripts/testbed.sh" down --name "$tb_name" >/dev/null; fi
  rm -rf "$run"
}
trap teardown EXIT
pki_init "$run/pki"
# Each engine lends as an engine of its own, so each owns only its cache. The
# prefill engine also asks for the transfers, as router/prefill (engine.py says
# why); the caches grant reading and writing to that identity alone.
for id in engine/prefill engine/decode router/prefill; do
  "$here/scripts/certs.sh" "$run/pki" "${id%/*}" "${id#*/}"
done
mover=spiffe://fuselink/router/prefill

if [ -n "${RAILS:-}" ]; then
  # Two emulated nodes, each agent in its namespace with RAILS shaped rails: node-a is
  # namespace 0, node-b namespace 1. Engines stay in the root namespace and reach the
  # agents on their management addresses, their caches through the handle sockets.
  testbed_require
  tb_name=dsg
  "$here/scripts/testbed.sh" up --name "$tb_name" --nodes 2 --rails "$RAILS" \
    --rate "${RATE:-10gbit}" >/dev/null
  testbed_load "$tb_name"
  state=$TESTBED_STATE policy=${POLICY:-fuselink}
  echo "testbed: 2 nodes, $RAILS rails at ${RATE:-10gbit}, policy $policy"
  testbed_start_agent 1 node-b "" --policy="$policy"
  b=$(field "$state/node-b.json" grpc)
  testbed_start_agent 0 node-a "node-b=$b" --policy="$policy"
  a=$(field "$state/node-a.json" grpc)
else
  start_agent node-b 2 "" --nics=2
  b=$(field "$run/node-b.json" grpc)
  start_agent node-a 1 "node-b=$b" --nics=2
  a=$(field "$run/node-a.json" grpc)
fi
if [ "$device" != cpu ]; then
  # What each agent made of the GPUs, as it logs it at start (Node::OpenGpus).
  for n in node-a node-b; do
    gpus=$(grep -m1 -E "GPUs are CUDA devices here|^no GPUs|GPU paths off" "$state/$n.log" || true)
    echo "$n: ${gpus:-no GPU status in its log}"
    [[ $gpus =~ ^[1-9][0-9]*\ of\ the\ topology ]] || {
      echo "FAIL: agent $n has no CUDA device; it cannot import the caches" >&2
      exit 1
    }
  done
fi

# start_engine ROLE AGENT NODE [FLAGS...]: an engine.py in the background, waited
# for until its ready file names its URL.
start_engine() {
  local role=$1 address=$2 node=$3
  shift 3
  "$python" "$example/engine.py" --role "$role" --agent "$address" \
    --handle_socket "$state/$node.sock" --tls_dir "$run/pki" --model "$model" \
    ${BLOCKS:+--blocks "$BLOCKS"} --ready_file "$run/$role.json" --device "$device" \
    "$@" >"$run/$role.log" 2>&1 &
  engines+=($!)
  for _ in $(seq 1200); do
    [ -s "$run/$role.json" ] && return 0
    kill -0 "${engines[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "the $role engine did not start" >&2
  show_logs >&2
  return 1
}
if [ "${IN_NODE:-0}" = 1 ]; then
  # Prefill and decode on one machine: both lend to node-a, which moves each
  # prompt's blocks itself (GPU to GPU, or host to host; no NIC).
  start_engine decode "$a" node-a --writers "$mover"
else
  start_engine decode "$b" node-b --writers "$mover"
fi
start_engine prefill "$a" node-a --router_name prefill ${LAYER_BY_LAYER:+--layer_by_layer}
# The router moves the K/V as router/prefill, the identity both caches grant.
mover=(--agent "$a" --tls_dir "$run/pki" --router_name prefill ${LAYER_BY_LAYER:+--layer_by_layer})
[ "${ENGINE_SENDS:-0}" != 1 ] || mover=()

status=0
check=--check
[ "${CHECK:-1}" = 1 ] || check=""
# shellcheck disable=SC2086  # ROUTER_ARGS: several flags, split on purpose
"$python" "$example/router.py" --prefill "$(field "$run/prefill.json" url)" \
  --decode "$(field "$run/decode.json" url)" --prompts "${PROMPTS:-8}" \
  --seed "${SEED:-1}" --max_len "${MAX_LEN:-80}" --max_new "${MAX_NEW:-16}" \
  --device "$device" "${mover[@]}" ${ROUTER_ARGS:-} $check >"$run/summary.json" || status=$?
if [ -n "${SUMMARY:-}" ]; then cp "$run/summary.json" "$SUMMARY"; else cat "$run/summary.json"; fi
if [ "$status" -ne 0 ]; then
  echo "FAIL: a request failed or its tokens differ from the single engine's" >&2
  show_logs >&2
  exit 1
fi
"$python" -c 'import json, sys
s = json.load(open(sys.argv[1]))
print("served", s["served"], "TTFT ms", s.get("ttft_ms"), "share", s.get("share_of_ttft"))' \
  "$run/summary.json"
if [ -n "$check" ]; then
  echo "PASS: every request's tokens equal the single engine's (device: $device, model: $model)"
else
  echo "PASS: every request served (CHECK=0: tokens not compared; device: $device, model: $model)"
fi
