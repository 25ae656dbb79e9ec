#!/bin/bash
# fuselinkctl top under tmux, against a running transfer: two agents on the namespace
# testbed (four 1 Gbit/s rails, the stripe policy so that GPU 0's chunks cross every
# rail), 2 GiB moved from node-a to node-b (about 5 s). While it runs, the pane (read
# with tmux capture-pane) must show rail0 sending own traffic and rails 1-3 borrowed
# traffic at a measured rate, a FOREIGN column (the rails are watched for traffic
# that is not fuselink's), and one outgoing transfer active; after it, one
# completed transfer and idle rails. Skips (77) where no testbed can be built.
# Usage: top_test.sh AGENT FUSELINKCTL
set -euo pipefail
agent=$1
ctl=$2
here=$(cd "$(dirname "$0")/../.." && pwd)

. "$here/scripts/lib/testbed.sh"
testbed_test_start flt
"$here/scripts/setup-k8s-tools.sh" terminal
session="fuselink-top-$$"
demo_pid=""
testbed_on_exit_hook() {
  [ -z "$demo_pid" ] || kill "$demo_pid" 2>/dev/null
  tmux kill-session -t "$session" 2>/dev/null
}

"$tb" up --name "$name" --nodes 2 --rails 4 --rate 1gbit
testbed_load "$name"
out=$TESTBED_STATE
pki_init "$out/pki"  # mutual TLS, as deployed: scripts/lib/agents.sh
testbed_start_agent 1 node-b "" --policy=stripe --chunk_bytes=1048576
testbed_start_agent 0 node-a "node-b=$(field "$out/node-b.json" grpc)" \
  --policy=stripe --chunk_bytes=1048576
a=$(field "$out/node-a.json" grpc)

tmux new-session -d -s "$session" -x 132 -y 30 \
  "$ctl --agent=$a ${viewer_tls[*]} --metrics=$(field "$out/node-a.json" metrics) top"
pane() { tmux capture-pane -p -t "$session"; }
for _ in $(seq 50); do
  pane | grep -q '^rail3 ' && break
  sleep 0.1
done
pane | grep -q '^rail3 ' || { pane; fail "top drew no NIC rows"; }

stdbuf -oL "$ctl" --agent="$a" --target_agent="$(field "$out/node-b.json" grpc)" \
  "${demo_tls[@]}" \
  --source_socket="$out/node-a.sock" --target_socket="$out/node-b.sock" \
  --demo_layers=32 --demo_blocks=64 --demo_block_bytes=1048576 --timeout_s=120 \
  demo >"$out/demo.out" 2>&1 &
demo_pid=$!
i=0
while kill -0 "$demo_pid" 2>/dev/null; do
  pane >"$out/during-$i.txt"
  i=$((i + 1))
  sleep 0.3
done
wait "$demo_pid" || fail "the transfer failed: $(tail -3 "$out/demo.out")"
demo_pid=""
grep -q "bytes match" "$out/demo.out" || fail "bytes differ at the target"
sleep 2.5
pane >"$out/after.txt"

# A frame seen during the transfer: rail0 own and rails 1-3 borrowed at a real rate,
# one transfer out. Columns: NIC GPU TX-OWN(2 words) TX-BORROWED(2) ...
rate_col() { awk -v nic="$1" -v col="$2" '$1 == nic { print $(col) " " $(col + 1) }' "$3"; }
moving() { case "$1" in *Mbit/s | *Gbit/s) return 0 ;; *) return 1 ;; esac; }
seen=""
for f in "$out"/during-*.txt; do
  grep -q "active 1 out" "$f" || continue
  moving "$(rate_col rail0 3 "$f")" || continue
  ok=1
  for r in rail1 rail2 rail3; do moving "$(rate_col "$r" 5 "$f")" || ok=""; done
  [ -n "$ok" ] && { seen=$f; break; }
done
[ -n "$seen" ] || { cat "$out/during-$((i / 2)).txt"; fail "no frame of $i showed own and borrowed traffic during the transfer"; }
# The testbed's rails are netdevs of their own: the agent watches them for foreign
# traffic, and top shows that column (last, so the columns above keep their places).
# Nothing but fuselink moves on the rails here, and the frame shows our own bytes on
# every rail: each rail's FOREIGN must be a well-formed rate, and under 1% of the
# 1 Gbit/s rail (our own bytes, headers and acknowledgements are not foreign).
head -n 3 "$seen" | grep -Eq 'FAILED +FOREIGN$' || fail "top shows no FOREIGN column"
for r in rail0 rail1 rail2 rail3; do
  f=$(awk -v nic="$r" '$1 == nic { print $(NF - 1) " " $NF }' "$seen")
  [[ "$f" =~ ^[0-9]+(\.[0-9]+)?\ (bit|kbit|Mbit|Gbit)/s$ ]] ||
    { cat "$seen"; fail "top's FOREIGN for $r is not a rate: '$f'"; }
  awk -v v="${f% *}" -v u="${f#* }" 'BEGIN {
    m = u == "Gbit/s" ? 1e9 : u == "Mbit/s" ? 1e6 : u == "kbit/s" ? 1e3 : 1
    exit !(v * m < 1e7) }' ||
    { cat "$seen"; fail "top counts $f of $r's traffic as foreign; only fuselink moves there"; }
done
echo "ok: during the transfer ($i frames captured), e.g.:"
sed -n '3,7p' "$seen"
grep -Eq "^ +completed +1 " "$out/after.txt" || { cat "$out/after.txt"; fail "top does not count the completed transfer"; }
grep -q "active 0 out" "$out/after.txt" || fail "top still shows a transfer running"
moving "$(rate_col rail0 3 "$out/after.txt")" && fail "rail0 still moving after the transfer"
echo "PASS: fuselinkctl top showed the transfer's own and borrowed rates live, then its completion"
