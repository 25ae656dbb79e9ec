#!/bin/bash
# The FuseLink scheduler on the namespace testbed: two nodes, four rails at 1 Gbit/s,
# a pair of fuselink agents (each the other's peer), driven by fuselink-bench.
# (a) A hot sender (home GPU 0) borrows the idle rails: its completed event shows
#     rails 1-3 carried data, node A's metrics count it as traffic="borrowed" there,
#     and the target holds the source's bytes.
# (b) The owner of rail1 (home GPU 1) returns while GPU 0 streams: borrowed bytes on
#     rail1, read 12 chunk times (~100 ms) after the owner's transfer is accepted and again
#     when 80% of it has landed, are equal; rail1 counted a give-back; every transfer's
#     bytes match at the target.
# Behaviour only: speeds belong to scripts/bench-testbed.sh. Skips (77) where no
# testbed can be built.
# Usage: scheduler_test.sh AGENT_BINARY FUSELINK_BENCH_BINARY
set -euo pipefail
agent=$1
bench=$2
here=$(cd "$(dirname "$0")/../.." && pwd)

. "$here/scripts/lib/testbed.sh"
testbed_test_start fls

"$tb" up --name "$name" --nodes 2 --rails 4 --rate 1gbit
testbed_load "$name"
out=$TESTBED_STATE
pki_init "$out/pki"  # mutual TLS, as deployed: scripts/lib/agents.sh
chunk=1048576
for i in 0 1; do
  j=$((1 - i))
  # shellcheck disable=SC2034  # read by launch_agent (scripts/lib/agents.sh)
  agent_prefix=(ip netns exec "$(testbed_ns "$i")")
  # shellcheck disable=SC2034
  agent_dir=$out
  # shellcheck disable=SC2034  # the address fuselink-bench dials, in the certificate
  agent_sans=("IP:$(testbed_mgmt "$i")")
  launch_agent "fuselink-n$i" --topology="$(testbed_var TOPOLOGY "$i")" \
    --listen="$(testbed_mgmt "$i"):7100" --metrics_listen="$(testbed_mgmt "$i"):7200" \
    --peer="fuselink-n$j=$(testbed_mgmt "$j"):7100" --policy=fuselink \
    --chunk_bytes="$chunk"
done
run_bench() { # WORKLOAD OUTPUT [FLAGS...]
  local w=$1 o=$2
  shift 2
  "$bench" --workload="$w" --policies=fuselink --cluster_dir="$out" --json "${demo_tls[@]}" \
    --chunk_bytes="$chunk" --rail_bytes_per_s="$TESTBED_RATE_BYTES_PER_S" "$@" \
    >"$o" 2>&1 || { cat "$o"; fail "fuselink-bench --workload=$w"; }
  cat "$o"
}
json() { # FILE KEY: a value of the JSON line in FILE
  sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" "$1" | head -n 1
}

# (a) 256 MiB from GPU 0 of node A to GPU 0 of node B.
run_bench hot "$out/hot.json" --hot_bytes=268435456
[ "$(json "$out/hot.json" verified)" = yes ] || fail "hot: bytes not verified"
IFS=/ read -r -a nic_mib <<<"$(json "$out/hot.json" nic_mib)"
IFS=/ read -r -a borrowed_mib <<<"$(json "$out/hot.json" borrowed_mib)"
if [ "${#nic_mib[@]}" -ne 4 ] || [ "${#borrowed_mib[@]}" -ne 4 ]; then
  fail "hot: want 4 NICs in nic_mib and borrowed_mib"
fi
for r in 1 2 3; do
  [ "${nic_mib[r]}" -gt 0 ] || fail "hot: rail$r carried nothing (nic_mib ${nic_mib[*]})"
  [ "${borrowed_mib[r]}" -gt 0 ] ||
    fail "hot: no traffic=\"borrowed\" bytes on rail$r (borrowed_mib ${borrowed_mib[*]})"
done
[ "${borrowed_mib[0]}" -eq 0 ] || fail "hot: GPU 0's own rail0 counted borrowed bytes"
echo "ok (a): rails 1-3 carried ${nic_mib[1]}/${nic_mib[2]}/${nic_mib[3]} MiB, all borrowed"

# (b) GPU 0 streams 8 x 64 MiB; 0.5 s later GPU 1 sends 96 MiB over its own rail1.
run_bench owner "$out/owner.json" --owner_borrower_bytes=536870912 \
  --owner_bytes=100663296 --owner_delay_s=0.5
[ "$(json "$out/owner.json" verified)" = yes ] || fail "owner: bytes not verified"
after_bound=$(json "$out/owner.json" probe_after_bound)
near_end=$(json "$out/owner.json" probe_near_end)
give_backs=$(json "$out/owner.json" give_backs)
if [ "${after_bound:--1}" -lt 0 ] || [ "${near_end:--1}" -lt 0 ]; then
  fail "owner: the borrowed-bytes probes did not read rail1 ($after_bound, $near_end)"
fi
[ "$after_bound" = "$near_end" ] ||
  fail "owner: borrowed bytes on rail1 grew while the owner sent: $after_bound -> $near_end"
[ "${give_backs:-0}" -ge 1 ] || fail "owner: rail1 counted no give-back"
echo "ok (b): borrowed bytes on rail1 stayed at $after_bound while the owner sent; $give_backs give-back(s)"
echo "PASS: a hot sender borrows the idle rails and gives rail1 back to its owner"
