#!/bin/bash
# The receiving half of owner priority on the namespace testbed: four nodes, four
# rails at 1 Gbit/s, fuselink agents (each every other's peer), driven by
# fuselink-bench --workload=owner_rx. Node A's GPU 0 streams to node B and borrows
# A's rail1 among others; then node C's GPU 1 sends to node B over its own rail1.
# B marks its rail1 busy for its sources while C's transfer is open there, so A's
# borrowed bytes on rail1 grow by at most what was in flight when the mark reached A
# (borrow_depth chunks, plus the credit notice's way: 8 MiB allowed, 32 seen on this
# testbed when the source ignores the mark), and every byte matches at B.
# Behaviour only: speeds belong to scripts/bench-testbed.sh. Skips (77) where no
# testbed can be built.
# Usage: receiver_test.sh AGENT_BINARY FUSELINK_BENCH_BINARY
set -euo pipefail
agent=$1
bench=$2
here=$(cd "$(dirname "$0")/../.." && pwd)

. "$here/scripts/lib/testbed.sh"
testbed_test_start flr

nodes=4
"$tb" up --name "$name" --nodes "$nodes" --rails 4 --rate 1gbit
testbed_load "$name"
out=$TESTBED_STATE
pki_init "$out/pki"  # mutual TLS, as deployed: scripts/lib/agents.sh
chunk=1048576
for ((i = 0; i < nodes; i++)); do
  peers=$(testbed_peers "$i" "$nodes" fuselink 7100)
  # shellcheck disable=SC2034  # read by launch_agent (scripts/lib/agents.sh)
  agent_prefix=(ip netns exec "$(testbed_ns "$i")")
  # shellcheck disable=SC2034
  agent_dir=$out
  # shellcheck disable=SC2034  # the address fuselink-bench dials, in the certificate
  agent_sans=("IP:$(testbed_mgmt "$i")")
  launch_agent "fuselink-n$i" --topology="$(testbed_var TOPOLOGY "$i")" \
    --listen="$(testbed_mgmt "$i"):7100" --metrics_listen="$(testbed_mgmt "$i"):7200" \
    --peer="$peers" --policy=fuselink --chunk_bytes="$chunk"
done
json() { # FILE KEY: a value of the JSON line in FILE
  sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" "$1" | head -n 1
}

# A: 8 x 48 MiB from GPU 0; 0.4 s later C's GPU 1 sends 64 MiB to B's GPU 1.
o=$out/owner_rx.json
"$bench" --workload=owner_rx --policies=fuselink --cluster_dir="$out" --json \
  "${demo_tls[@]}" --nodes="$nodes" --chunk_bytes="$chunk" \
  --rail_bytes_per_s="$TESTBED_RATE_BYTES_PER_S" --owner_borrower_bytes=402653184 \
  --owner_bytes=67108864 --owner_delay_s=0.4 >"$o" 2>&1 ||
  { cat "$o"; fail "fuselink-bench --workload=owner_rx"; }
cat "$o"
[ "$(json "$o" verified)" = yes ] || fail "owner_rx: bytes not verified"
borrowed=$(json "$o" a_borrowed_mib_on_nic1_while_owner)
[ -n "$borrowed" ] || fail "owner_rx: no a_borrowed_mib_on_nic1_while_owner in the row"
awk -v b="$borrowed" 'BEGIN { exit !(b <= 8) }' ||
  fail "owner_rx: A kept borrowing rail1 toward B while C's transfer was open: $borrowed MiB"
echo "ok: A's borrowed bytes on rail1 grew by $borrowed MiB while C sent to B on it"

# Two nodes are too few: the workload says so and names the flag.
if "$bench" --workload=owner_rx --policies=fuselink --cluster_dir="$out" "${demo_tls[@]}" \
  --nodes=2 --rail_bytes_per_s="$TESTBED_RATE_BYTES_PER_S" >"$out/two.txt" 2>&1; then
  fail "owner_rx ran on 2 nodes"
fi
grep -q "owner_rx needs --nodes=4" "$out/two.txt" ||
  { cat "$out/two.txt"; fail "owner_rx on 2 nodes: no clear error"; }
echo "PASS: a receiving NIC's direct traffic keeps another node's borrowed chunks off it"
