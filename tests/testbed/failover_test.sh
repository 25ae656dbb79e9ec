#!/bin/bash
# A rail that goes down mid-transfer: its writes fail (TCP gives up on unacknowledged
# bytes after a few seconds), their chunks move to the other rails, and the transfer
# completes with every byte in place; once the rail is up again, the next transfer uses
# it. Two nodes, four rails at 1 Gbit/s, stripe policy
# so that every rail carries chunks. Skips (77) where no testbed can be built.
# Usage: failover_test.sh AGENT_BINARY FUSELINKCTL_BINARY
set -euo pipefail
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)

. "$here/scripts/lib/testbed.sh"
testbed_test_start flf

demo_pid=""
testbed_on_exit_hook() { [ -z "$demo_pid" ] || kill "$demo_pid" 2>/dev/null; }

"$tb" up --name "$name" --nodes 2 --rails 4 --rate 1gbit
testbed_load "$name"
out="$TESTBED_STATE"
pki_init "$out/pki"  # mutual TLS, as deployed: scripts/lib/agents.sh
testbed_start_agent 1 node-b "" --policy=stripe --chunk_bytes=1048576
testbed_start_agent 0 node-a "node-b=$(field "$out/node-b.json" grpc)" \
  --policy=stripe --chunk_bytes=1048576
a=$(field "$out/node-a.json" grpc)

# 1 GiB: about 2.3 s over four 1 Gbit/s rails, long enough to cut one mid-way.
stdbuf -oL "$ctl" --agent="$a" --target_agent="$(field "$out/node-b.json" grpc)" \
  "${demo_tls[@]}" \
  --source_socket="$out/node-a.sock" --target_socket="$out/node-b.sock" \
  --demo_layers=16 --demo_blocks=64 --demo_block_bytes=1048576 --timeout_s=120 \
  demo >"$out/demo.out" 2>&1 &
demo_pid=$!
for _ in $(seq 100); do
  grep -q accepted "$out/demo.out" && break
  sleep 0.1
done
grep -q accepted "$out/demo.out" || fail "the transfer was not accepted"
sleep 0.5
testbed_exec 0 ip link set rail1 down
echo "rail1 of node-a is down"
rc=0
wait "$demo_pid" || rc=$?
demo_pid=""
tr '\r' '\n' <"$out/demo.out" | grep -E "completed|verify|failed|error|rail" | tail -n 8
[ "$rc" -eq 0 ] || fail "the transfer did not complete (exit $rc)"
grep -q "bytes match" "$out/demo.out" || fail "bytes differ at the target"
failed=$(curl -sf "$(field "$out/node-a.json" metrics)" |
  awk '/^fuselink_nic_failed_writes_total\{nic="rail1"/ { print $2 }')
[ "${failed:-0}" != "0" ] || fail "no write failed on rail1: the rail went down too late?"
echo "PASS: rail1 failed $failed write(s); the transfer completed on the other rails, bytes match"

# The rail comes back: the agent re-opens its connections (every 5 s) and the next
# transfer uses it again.
testbed_exec 0 ip link set rail1 up
sleep 7
"$ctl" --agent="$a" --target_agent="$(field "$out/node-b.json" grpc)" "${demo_tls[@]}" \
  --source_socket="$out/node-a.sock" --target_socket="$out/node-b.sock" \
  --demo_layers=4 --demo_blocks=16 --demo_block_bytes=1048576 demo >"$out/again.out" 2>&1 ||
  { cat "$out/again.out"; fail "the transfer after the rail came back"; }
grep -q "bytes match" "$out/again.out" || fail "bytes differ after the rail came back"
rail1=$(awk '$1 == "rail1" { print $2 }' "$out/again.out")
if [ -z "$rail1" ] || [ "$rail1" = "0.0" ]; then
  fail "rail1 carried nothing after coming back"
fi
echo "PASS: rail1 is back and carried $rail1 MiB of the next transfer"
