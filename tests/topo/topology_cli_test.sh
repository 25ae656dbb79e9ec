#!/bin/bash
# fuselinkctl topology and the agent's --topology flag, end to end:
#  - offline discovery (--sysfs_root) on a sysfs tree built here: two PCIe switches, each
#    with a GPU and a ConnectX, and a management ConnectX on a host bridge of its own;
#  - an agent started with --topology=discover on that tree serves the discovered
#    matrix, owners and exclusions over GetTopology, read with a viewer's certificate;
#  - an agent that discovers no data NIC refuses to start and names the reasons, and
#    --nics without --topology=emulated is refused;
#  - an emulated agent's topology through the same command; discovery on this
#    machine's /sys runs.
# The tree's RDMA ports carry their data on "lo": the one interface with an IPv4
# address on every machine. So mlx5_1 has mlx5_0's address and is left out as
# DUPLICATE_ADDRESS: one address cannot be two rails. Usage: topology_cli_test.sh AGENT FUSELINKCTL
set -euo pipefail
# The fixture's GPUs must be the fixture's: the CUDA probe is used only for /sys, and
# no inherited variable may change what the sysfs probe sees.
unset CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-topo-cli.XXXXXX)
# shellcheck source=scripts/lib/agents.sh
. "$here/scripts/lib/agents.sh"
trap 'stop_agents; rm -rf "$run"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
pki_init "$run/pki"

fx=$run/sys
# pci ROOT BRIDGES... FUNCTION VENDOR CLASS: one PCI function and its bridges.
pci() {
  local root=$1 vendor=${*: -2:1} class=${*: -1} dir n
  local path=("${@:2:$#-3}")
  dir=devices/$root
  for n in "${path[@]}"; do
    dir=$dir/$n
    mkdir -p "$fx/$dir" "$fx/bus/pci/devices"
    echo 0 >"$fx/$dir/numa_node"
    [ -e "$fx/$dir/vendor" ] || echo 0x8086 >"$fx/$dir/vendor"
    [ -e "$fx/$dir/class" ] || echo 0x060400 >"$fx/$dir/class"
    ln -sfn "../../../$dir" "$fx/bus/pci/devices/$n"
  done
  echo "$vendor" >"$fx/$dir/vendor"
  echo "$class" >"$fx/$dir/class"
  echo "$dir"
}
# rdma DEVICE_DIR NAME: an active InfiniBand port 1 whose netdev is lo.
rdma() {
  local d=$fx/$1/infiniband/$2
  mkdir -p "$d/ports/1/gid_attrs/ndevs" "$fx/class/infiniband"
  echo "4: ACTIVE" >"$d/ports/1/state"
  echo "5: LinkUp" >"$d/ports/1/phys_state"
  echo InfiniBand >"$d/ports/1/link_layer"
  echo "400 Gb/sec (4X NDR)" >"$d/ports/1/rate"
  echo lo >"$d/ports/1/gid_attrs/ndevs/0"
  ln -sfn ../.. "$d/device"
  ln -sfn "../../$1/infiniband/$2" "$fx/class/infiniband/$2"
}
for s in 1 2; do
  pci pci0000:${s}0 0000:${s}0:01.0 0000:${s}1:00.0 0000:${s}2:00.0 0000:${s}3:00.0 0x10de 0x030200 >/dev/null
  rdma "$(pci pci0000:${s}0 0000:${s}0:01.0 0000:${s}1:00.0 0000:${s}2:01.0 0000:${s}4:00.0 0x15b3 0x020700)" mlx5_$((s - 1))
done
rdma "$(pci pci0000:30 0000:30:01.0 0000:31:00.0 0x15b3 0x020700)" mlx5_2

echo "== offline discovery on the tree"
"$ctl" topology --sysfs_root="$fx" >"$run/offline.txt" || fail "offline topology: $(cat "$run/offline.txt")"
cat "$run/offline.txt"
grep -q "^node -, transport -, 2 GPUs, 1 NICs, 2 excluded, source discovered$" "$run/offline.txt" || fail "wrong summary"
grep -Eq "^  mlx5_0 +PIX\* +NODE" "$run/offline.txt" || fail "mlx5_0's row is not PIX (owner) / NODE"
grep -Eq "^  mlx5_1 .*DUPLICATE_ADDRESS +lo's address 127.0.0.1 is mlx5_0's too" "$run/offline.txt" ||
  fail "mlx5_1 (on mlx5_0's address) is not left out as DUPLICATE_ADDRESS"
grep -Eq "^  mlx5_2 .*MANAGEMENT" "$run/offline.txt" || fail "mlx5_2 is not left out as MANAGEMENT"
"$ctl" topology --sysfs_root="$fx" --exclude_nics=mlx5_1 --json >"$run/offline.json"
grep -q '"name":"mlx5_1","rdma_device":"mlx5_1","rdma_port":1,"netdev":"lo","pci_bus_id":"0000:24:00.0","reason":"OPERATOR_EXCLUDED"' \
  "$run/offline.json" || fail "--exclude_nics=mlx5_1 not in the JSON: $(cat "$run/offline.json")"
CUDA_VISIBLE_DEVICES=1 "$ctl" topology --sysfs_root="$fx" >"$run/visible.txt"
grep -q "^node -, transport -, 1 GPUs, 1 NICs" "$run/visible.txt" ||
  fail "CUDA_VISIBLE_DEVICES=1 on the tree: $(cat "$run/visible.txt")"
grep -q "applied by discovery to the GPUs in sysfs" "$run/visible.txt" ||
  fail "the tree's GPUs did not come from the tree: $(cat "$run/visible.txt")"
echo "ok: offline discovery prints the matrix, owners and reasons"

echo "== an agent discovering the tree"
launch_agent disc --topology=discover --sysfs_root="$fx" --gpu=off \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0
grep -q "source discovered$" "$run/disc.log" || fail "the agent did not print its discovered topology"
"$ctl" --agent="$(field "$run/disc.json" grpc)" "${viewer_tls[@]}" topology >"$run/online.txt" ||
  fail "fuselinkctl topology as a viewer: $(cat "$run/online.txt")"
cat "$run/online.txt"
grep -q "^node disc, transport tcp, 2 GPUs, 1 NICs, 2 excluded, source discovered$" "$run/online.txt" || fail "wrong summary over gRPC"
grep -Eq "^  mlx5_0 +PIX\* +NODE" "$run/online.txt" || fail "the matrix did not come over GetTopology"
grep -Eq "^  mlx5_2 .*MANAGEMENT" "$run/online.txt" || fail "the exclusions did not come over GetTopology"
echo "ok: the agent serves the discovered topology"

echo "== refusals"
mkdir -p "$run/empty-sys"
if "$agent" --node=none --plaintext --runtime_dir="$run/rt" --gpu=off --sysfs_root="$run/empty-sys" \
  >"$run/none.log" 2>&1; then
  fail "an agent without data NICs started"
fi
grep -q "NO_DATA_NIC" "$run/none.log" || fail "no NO_DATA_NIC: $(cat "$run/none.log")"
if "$agent" --node=ex --plaintext --runtime_dir="$run/rt" --gpu=off --sysfs_root="$fx" \
  --exclude_nics=mlx5_0,mlx5_1 >"$run/ex.log" 2>&1; then
  fail "an agent whose every NIC is excluded started"
fi
grep -q "mlx5_0: OPERATOR_EXCLUDED.*mlx5_2: MANAGEMENT" "$run/ex.log" || fail "reasons not named: $(cat "$run/ex.log")"
if "$agent" --node=old --plaintext --runtime_dir="$run/rt" --gpu=off --nics=2 >"$run/old.log" 2>&1; then
  fail "--nics without --topology=emulated started"
fi
grep -q "add --topology=emulated" "$run/old.log" || fail "--nics refusal unclear: $(cat "$run/old.log")"
if "$agent" --node=empty --plaintext --runtime_dir="$run/rt" --gpu=off --topology= >"$run/empty.log" 2>&1; then
  fail "--topology= (the old emulated default) started"
fi
grep -q "topology is empty" "$run/empty.log" || fail "--topology= refusal unclear: $(cat "$run/empty.log")"
echo "ok: no data NIC, every NIC excluded, --nics without emulated and an empty --topology are refused, with reasons"

echo "== an emulated agent, and this machine"
start_agent emu 57 "" --nics=2
"$ctl" --agent="$(field "$run/emu.json" grpc)" "${viewer_tls[@]}" topology >"$run/emu.txt"
if ! grep -q "source emulated" "$run/emu.txt" || ! grep -Eq "^  rail1 +127.0.57.2" "$run/emu.txt"; then
  fail "emulated topology: $(cat "$run/emu.txt")"
fi
"$ctl" topology --sysfs_root=/sys >"$run/here.txt" || fail "discovery on /sys: $(cat "$run/here.txt")"
grep -q "source discovered" "$run/here.txt" || fail "discovery on /sys printed nothing"
echo "PASS: fuselinkctl topology offline and over gRPC; the agent's --topology modes"
