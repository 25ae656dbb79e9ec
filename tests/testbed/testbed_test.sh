#!/bin/bash
# The network-namespace testbed, end to end: two nodes, four rails shaped to 1 Gbit/s
# each way (scripts/testbed.sh). iperf3 over one rail shows the shaping holds and the
# rail works; then agents in both namespaces move a 64 MiB KV cache with the stripe
# policy, fuselinkctl in the root namespace verifies the bytes, and the transfer must
# use all four rails at a rate four shaped rails allow. Skips (77) where the machine
# cannot host a testbed (not root, no namespaces, ...), saying why.
# Usage: testbed_test.sh AGENT_BINARY FUSELINKCTL_BINARY
set -euo pipefail
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)

. "$here/scripts/lib/testbed.sh"
command -v iperf3 >/dev/null || { echo "SKIP: iperf3 is not installed"; exit 77; }
testbed_test_start flt

rails=4
rate_gbit=1
iperf_pid=""
testbed_on_exit_hook() { [ -z "$iperf_pid" ] || kill "$iperf_pid" 2>/dev/null; }

"$tb" up --name "$name" --nodes 2 --rails "$rails" --rate "${rate_gbit}gbit"
testbed_load "$name"
out="$TESTBED_STATE"

# iperf3 over rail0 alone, node 0 -> node 1, bound to the rail addresses.
server=10.232.0.2
testbed_exec 1 iperf3 -s -1 -B "$server" -p 5201 >"$out/iperf3-server.log" 2>&1 &
iperf_pid=$!
for _ in $(seq 50); do
  testbed_exec 1 ss -Hltn "src $server:5201" | grep -q . && break
  sleep 0.1
done
testbed_exec 0 iperf3 -c "$server" -B 10.232.0.1 -p 5201 -t 2 -J >"$out/iperf3.json" ||
  { cat "$out/iperf3.json"; fail "iperf3 over rail0"; }
wait "$iperf_pid" || true
iperf_pid=""
bps=$(awk '/"sum_received"/ { f = 1 } f && /"bits_per_second"/ { gsub(/[^0-9.e+]/, "", $2); print $2; exit }' \
  "$out/iperf3.json")
[ -n "$bps" ] || { cat "$out/iperf3.json"; fail "no rate in iperf3's output"; }
iperf_gbit=$(awk -v b="$bps" 'BEGIN { printf "%.3f", b / 1e9 }')
echo "iperf3 over one rail (rail0, shaped to ${rate_gbit} Gbit/s): $iperf_gbit Gbit/s"
awk -v g="$iperf_gbit" -v r="$rate_gbit" 'BEGIN { exit !(g < 1.15 * r) }' ||
  fail "rail0 carried $iperf_gbit Gbit/s: the ${rate_gbit} Gbit/s shaping does not hold"
awk -v g="$iperf_gbit" -v r="$rate_gbit" 'BEGIN { exit !(g > 0.5 * r) }' ||
  fail "rail0 carried only $iperf_gbit Gbit/s"

# Agents: node-b in node 1's namespace, node-a (stripe, peer node-b) in node 0's,
# over mutual TLS (scripts/lib/agents.sh).
pki_init "$out/pki"
testbed_start_agent 1 node-b "" --policy=stripe
b=$(field "$out/node-b.json" grpc)
testbed_start_agent 0 node-a "node-b=$b" --policy=stripe
a=$(field "$out/node-a.json" grpc)
echo "node-a at $a, node-b at $b"
"$ctl" --agent="$a" "${viewer_tls[@]}" topology

demo() { # LAYERS OUTPUT: a demo KV cache of LAYERS x 16 blocks x 256 KiB
  "$ctl" --agent="$a" --target_agent="$b" "${demo_tls[@]}" --source_socket="$out/node-a.sock" \
    --target_socket="$out/node-b.sock" --demo_layers="$1" --demo_blocks=16 \
    --demo_block_bytes=262144 demo >"$2" 2>&1 || { cat "$2"; fail "demo"; }
  grep -q "bytes match" "$2" || { cat "$2"; fail "demo did not verify"; }
}
# Warm-up (4 MiB): the first transfer also connects the peers, which would blur the
# rate; unshaped, this machine moves 64 MiB at 6-9 Gbit/s once connected.
demo 1 "$out/warmup.out"

rail_tx() { # bytes node 0's rail<r> has sent
  testbed_exec 0 cat "/sys/class/net/rail$1/statistics/tx_bytes"
}
tbf_sent() { # bytes the tbf on node 0's rail<r> has passed
  tc -n "$TESTBED_NS_0" -s qdisc show dev "rail$1" |
    awk '$1 == "qdisc" { f = ($2 == "tbf") } f && $1 == "Sent" { print $2; exit }'
}
declare -a tx0 tbf0
for ((r = 0; r < rails; r++)); do
  tx0[r]=$(rail_tx "$r")
  tbf0[r]=$(tbf_sent "$r")
  [ -n "${tbf0[r]}" ] || fail "no tbf qdisc on node 0's rail$r"
done

# 16 layers x 16 blocks x 256 KiB = 64 MiB, from the root namespace.
total=$((16 * 16 * 262144))
demo 16 "$out/demo.out"
tr '\r' '\n' <"$out/demo.out" | grep -v '^\[' || true

# Each rail's share of the transfer (fuselinkctl's per-NIC split: "  railN  X MiB").
for ((r = 0; r < rails; r++)); do
  mib=$(awk -v n="rail$r" 'BEGIN { u["B"] = 2^-20; u["KiB"] = 2^-10; u["MiB"] = 1; u["GiB"] = 2^10 }
    $1 == n && ($3 in u) { print $2 * u[$3] }' "$out/demo.out")
  [ -n "$mib" ] || fail "rail$r is not in the per-NIC split above"
  awk -v m="$mib" -v t="$total" -v k="$rails" 'BEGIN { exit !(m * 1048576 >= 0.5 * t / k) }' ||
    fail "rail$r carried only $mib MiB of $((total >> 20)) MiB"
  # The interface, through its tbf, carried the rail's bytes (plus headers).
  sent=$(($(rail_tx "$r") - tx0[r]))
  shaped=$(($(tbf_sent "$r") - tbf0[r]))
  awk -v s="$sent" -v q="$shaped" -v m="$mib" \
    'BEGIN { exit !(s >= 0.99 * m * 1048576 && q >= 0.99 * m * 1048576) }' ||
    fail "rail$r: fuselink reports $mib MiB; the interface sent $sent bytes, its tbf $shaped"
done

seconds=$(sed -n 's/^completed: .* in \([0-9.]*\) s,.*/\1/p' "$out/demo.out")
[ -n "$seconds" ] || fail "no completion time in the demo's output"
gbit=$(awk -v b="$total" -v s="$seconds" 'BEGIN { printf "%.3f", b * 8 / s / 1e9 }')
echo "fuselink over $rails rails (each shaped to ${rate_gbit} Gbit/s): $total bytes in $seconds s = $gbit Gbit/s"
awk -v g="$gbit" -v r="$rate_gbit" -v k="$rails" 'BEGIN { exit !(g < 1.1 * r * k) }' ||
  fail "$gbit Gbit/s is above $rails x ${rate_gbit} Gbit/s: the shaping does not hold"
awk -v g="$gbit" -v r="$rate_gbit" 'BEGIN { exit !(g > 1.2 * r) }' ||
  fail "$gbit Gbit/s is no more than one rail's rate: striping does not add up"
echo "PASS: iperf3 $iperf_gbit Gbit/s on one rail; fuselink $gbit Gbit/s over $rails rails, bytes match"
