#!/bin/bash
# A testbed of emulated nodes on one machine: one network namespace per node, a
# management network for gRPC and metrics, and R rails shaped with tc tbf, so that
# agents move bytes over real (if virtual) NICs at a real line rate.
#
#   scripts/testbed.sh check
#   scripts/testbed.sh up --name NAME [--nodes N] [--rails R] [--rate RATE]
#                         [--burst BYTES] [--latency TIME] [--state DIR]
#   scripts/testbed.sh down --name NAME [--state DIR]
#
# check  exits 0 if this machine can host a testbed; else 77 (ctest's skip code) with
#        a one-line reason: not root, ip or tc missing, namespaces/veth/bridges/tbf
#        refused by the kernel or the container.
# up     runs check (refusing with its message and 77), then creates:
#        - namespaces NAME-n0 .. NAME-n{N-1} (N default 2), lo up in each;
#        - management: bridge NAME-mgmt in the root namespace at 10.231.0.254/24;
#          node i's end `mgmt` at 10.231.0.<i+1>/24; unshaped (gRPC, metrics);
#        - rail r (R default 4): bridge NAME-r<r>; node i's end `rail<r>` at
#          10.232.<r>.<i+1>/24; tc tbf at RATE (default 1gbit, any rate tc takes) on
#          the egress of both ends of the veth: the node's end shapes what it sends,
#          the bridge's end what it receives;
#        - in the state folder (default /tmp/fuselink-testbed/NAME): NAME-n<i>.json,
#          node i's fuselink topology (one GPU per rail, NIC r owned by GPU r,
#          rate_bytes_per_s from RATE), and testbed.env (TESTBED_* variables: the
#          namespaces, the mgmt addresses, ...; sourceable by sh).
#        Root-side veth ends are named NAMEn<i>m and NAMEn<i>r<r> (interface names
#        have at most 15 characters, which bounds NAME's length). A failure part way
#        tears down what was built. Only one testbed can be up at a time: they share
#        the management subnet in the root namespace. If br_netfilter is loaded, up
#        sets the root namespace's net.bridge.bridge-nf-call-{ip,ip6,arp}tables to 0
#        (bridged frames skip iptables) and leaves them so. rp_filter and
#        accept_local need no change (each rail is its own subnet).
# down   removes the namespaces (stopping processes still in them), the bridges, the
#        root-side veths and the state folder. Idempotent.
#
# Agents in a testbed: scripts/lib/testbed.sh.
set -euo pipefail

readonly MGMT_NET=10.231.0 RAIL_NET=10.232 MGMT_HOST=254
readonly STATE_ROOT=/tmp/fuselink-testbed
readonly MARKER=.fuselink-testbed

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "testbed: $*" >&2
  exit 1
}

# One line from a command's error output.
oneline() { tr '\n' ' ' | sed 's/  */ /g; s/ $//'; }

# On exit: the probe namespace goes; a failed up tears down what it built.
probe_ns="" up_name="" up_state=""
on_exit() {
  local rc=$?
  if [ -n "$probe_ns" ]; then ip netns del "$probe_ns" 2>/dev/null || true; fi
  if [ "$rc" -ne 0 ] && [ -n "$up_name" ]; then
    echo "testbed: up failed; tearing down $up_name" >&2
    teardown "$up_name" "$up_state" || true
  fi
}

# check_host: prints the reason and returns 77 if this machine cannot host a testbed.
check_host() {
  local tool err
  for tool in ip tc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "testbed: '$tool' is not installed (Debian package iproute2)" >&2
      return 77
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    echo "testbed: needs root for network namespaces, veth and tc (uid is $(id -u))" >&2
    return 77
  fi
  local probe="tbprobe$$"
  probe_ns=$probe
  if ! err=$(ip netns add "$probe" 2>&1); then
    probe_ns=""
    echo "testbed: cannot create network namespaces here: $(oneline <<<"$err")" >&2
    return 77
  fi
  # Everything else is probed inside the probe namespace: the root one is untouched.
  local step=""
  if ! err=$(ip netns exec "$probe" true 2>&1); then
    step="cannot enter network namespaces (ip netns exec)"
  elif ! err=$(ip -n "$probe" link add tbpa type veth peer name tbpb 2>&1); then
    step="cannot create veth pairs here"
  elif ! err=$(ip -n "$probe" link add tbpbr type bridge 2>&1); then
    step="cannot create bridges here"
  elif ! err=$(tc -n "$probe" qdisc add dev tbpa root tbf rate 1gbit burst 500kb \
    latency 20ms 2>&1); then
    step="cannot shape with tc tbf here"
  fi
  ip netns del "$probe" 2>/dev/null || true
  probe_ns=""
  if [ -n "$step" ]; then
    echo "testbed: $step: $(oneline <<<"$err")" >&2
    return 77
  fi
  return 0
}

# rate_bytes RATE: a tc rate (1gbit, 500mbit, 100mbps, 2gibit, a bare number of
# bits/s) in bytes per second, as tc reads it.
rate_bytes() {
  awk -v r="$1" 'BEGIN {
    s = tolower(r)
    if (!match(s, /^[0-9]+(\.[0-9]+)?/)) exit 1
    n = substr(s, 1, RLENGTH); u = substr(s, RLENGTH + 1)
    m[""] = 1 / 8; m["bit"] = 1 / 8
    m["kbit"] = 1e3 / 8; m["mbit"] = 1e6 / 8; m["gbit"] = 1e9 / 8; m["tbit"] = 1e12 / 8
    m["kibit"] = 2^10 / 8; m["mibit"] = 2^20 / 8; m["gibit"] = 2^30 / 8; m["tibit"] = 2^40 / 8
    m["bps"] = 1; m["kbps"] = 1e3; m["mbps"] = 1e6; m["gbps"] = 1e9; m["tbps"] = 1e12
    m["kibps"] = 2^10; m["mibps"] = 2^20; m["gibps"] = 2^30; m["tibps"] = 2^40
    if (!(u in m)) exit 1
    v = n * m[u]
    if (v < 1000) exit 1
    printf "%.0f\n", v
  }'
}

valid_name() {
  [[ $1 =~ ^[A-Za-z][A-Za-z0-9_]*$ ]] ||
    die "--name '$1': want letters, digits and _ (starting with a letter)"
}

# Root-namespace links of testbed NAME (bridges and root-side veth ends).
root_links() {
  ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' |
    grep -E "^($1-mgmt|$1-r[0-9]+|$1n[0-9]+(m|r[0-9]+))\$" || true
}

namespaces() {
  ip netns list | awk '{ print $1 }' | grep -E "^$1-n[0-9]+\$" || true
}

# Processes in testbed NAME's namespaces.
ns_pids() {
  local ns
  for ns in $(namespaces "$1"); do ip netns pids "$ns" 2>/dev/null || true; done | tr '\n' ' '
}

# teardown NAME STATE: removes whatever of testbed NAME exists.
teardown() {
  local name=$1 state=$2 ns link pids
  command -v ip >/dev/null 2>&1 || return 0
  # Processes still in the namespaces first (all at once: an agent may take 2 s to
  # stop), while their peers can still hear their connections close.
  pids=$(ns_pids "$name")
  if [ -n "$pids" ]; then
    echo "testbed: stopping processes still in $name's namespaces: $pids" >&2
    # shellcheck disable=SC2086  # a list of pids
    kill $pids 2>/dev/null || true
    for _ in $(seq 50); do
      pids=$(ns_pids "$name")
      [ -z "$pids" ] && break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  fi
  # Then the root-side veth ends: deleting one deletes its namespace end at once.
  for link in $(root_links "$name" | grep -v -- "-" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  for link in $(root_links "$name"); do
    ip link del "$link" 2>/dev/null || true
  done
  for ns in $(namespaces "$name"); do
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ -f "$state/$MARKER" ]; then
    rm -rf "$state"
  elif [ -d "$state" ]; then
    rmdir "$state" 2>/dev/null || true # made, killed before the marker
  fi
  local left
  left="$(namespaces "$name") $(root_links "$name")"
  if [ -n "${left// /}" ]; then
    echo "testbed: could not remove: $(oneline <<<"$left")" >&2
    return 1
  fi
  return 0
}

# Topology of node i: one GPU per rail, NIC r owned by GPU r.
write_topology() {
  local i=$1 rails=$2 bytes=$3 file=$4 r sep=""
  {
    printf '{"gpus": ['
    for ((r = 0; r < rails; r++)); do
      printf '%s{"index": %d}' "$sep" "$r"
      sep=", "
    done
    printf '],\n "nics": ['
    sep=""
    for ((r = 0; r < rails; r++)); do
      printf '%s\n  {"name": "rail%d", "address": "%s.%d.%d", "owner_gpu": %d, "rate_bytes_per_s": "%s"}' \
        "$sep" "$r" "$RAIL_NET" "$r" "$((i + 1))" "$r" "$bytes"
      sep=","
    done
    printf ']}\n'
  } >"$file"
}

shape() { # [tc -n NS ...] DEV: tbf on DEV's egress
  "$@" root tbf rate "$rate" burst "$burst" latency "$latency"
}

cmd_up() {
  local name="" nodes=2 rails=4 rate=1gbit burst="" latency=20ms state=""
  while [ $# -gt 0 ]; do
    case $1 in
      --name) name=${2:?}; shift 2 ;;
      --nodes) nodes=${2:?}; shift 2 ;;
      --rails) rails=${2:?}; shift 2 ;;
      --rate) rate=${2:?}; shift 2 ;;
      --burst) burst=${2:?}; shift 2 ;;
      --latency) latency=${2:?}; shift 2 ;;
      --state) state=${2:?}; shift 2 ;;
      *) usage ;;
    esac
  done
  [ -n "$name" ] || usage
  valid_name "$name"
  if ! [[ $nodes =~ ^[0-9]{1,3}$ ]] || ((nodes < 1 || nodes > 253)); then
    die "--nodes: 1 to 253"
  fi
  if ! [[ $rails =~ ^[0-9]{1,3}$ ]] || ((rails < 1 || rails > 256)); then
    die "--rails: 1 to 256"
  fi
  local longest="${name}n$((nodes - 1))r$((rails - 1))"
  ((${#longest} <= 15 && ${#name} + 5 <= 15)) ||
    die "--name '$name' is too long: interface $longest has over 15 characters"
  local bytes
  bytes=$(rate_bytes "$rate") || die "--rate '$rate': want a tc rate such as 1gbit or 500mbit"
  # Burst: 4 ms at the rate, at least 64 KiB (a GSO segment); what the kernel needs.
  [ -n "$burst" ] || burst=$((bytes / 250 > 65536 ? bytes / 250 : 65536))
  state=${state:-$STATE_ROOT/$name}

  check_host || exit 77
  if [ -n "$(namespaces "$name")$(root_links "$name")" ]; then
    die "'$name' is already up (scripts/testbed.sh down --name $name)"
  fi
  if [ -n "$(ip -4 route show "$MGMT_NET.0/24" 2>/dev/null)" ]; then
    die "$MGMT_NET.0/24 is in use in the root namespace (another testbed? $(ip -4 -o route show "$MGMT_NET.0/24" | oneline))"
  fi
  if [ -e "$state" ] && [ ! -f "$state/$MARKER" ] && ! rmdir "$state" 2>/dev/null; then
    die "state folder $state exists and is not a testbed's"
  fi

  # From here on, a failure tears down what was built.
  up_name=$name up_state=$state

  rm -rf "$state"
  mkdir -p "$state"
  # The agents' handle sockets live here, and an agent refuses a runtime directory
  # that group or others may enter (RUNTIME_DIR_UNSAFE); so do the private keys.
  chmod 0700 "$state"
  touch "$state/$MARKER"

  # Bridge netfilter would send every bridged frame through iptables: off.
  local f
  for f in /proc/sys/net/bridge/bridge-nf-call-iptables \
    /proc/sys/net/bridge/bridge-nf-call-ip6tables /proc/sys/net/bridge/bridge-nf-call-arptables; do
    if [ -w "$f" ] && [ "$(cat "$f")" != 0 ]; then
      echo "testbed: setting ${f#/proc/sys/} to 0 (was $(cat "$f"); left so by down)" >&2
      echo 0 >"$f"
    fi
  done

  local r i ns dev
  ip link add "$name-mgmt" type bridge
  ip link set "$name-mgmt" up
  ip addr add "$MGMT_NET.$MGMT_HOST/24" dev "$name-mgmt"
  for ((r = 0; r < rails; r++)); do
    ip link add "$name-r$r" type bridge
    ip link set "$name-r$r" up
  done

  local namespaces_list="" mgmt_list=""
  for ((i = 0; i < nodes; i++)); do
    ns="$name-n$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    dev="${name}n${i}m"
    ip link add "$dev" type veth peer name mgmt netns "$ns"
    ip link set "$dev" master "$name-mgmt" up
    ip -n "$ns" addr add "$MGMT_NET.$((i + 1))/24" dev mgmt
    ip -n "$ns" link set mgmt up
    for ((r = 0; r < rails; r++)); do
      dev="${name}n${i}r${r}"
      ip link add "$dev" type veth peer name "rail$r" netns "$ns"
      ip link set "$dev" master "$name-r$r" up
      ip -n "$ns" addr add "$RAIL_NET.$r.$((i + 1))/24" dev "rail$r"
      ip -n "$ns" link set "rail$r" up
      shape tc -n "$ns" qdisc add dev "rail$r"
      shape tc qdisc add dev "$dev"
    done
    write_topology "$i" "$rails" "$bytes" "$state/$ns.json"
    namespaces_list+="${namespaces_list:+ }$ns"
    mgmt_list+="${mgmt_list:+ }$MGMT_NET.$((i + 1))"
  done

  cat >"$state/testbed.env" <<EOF
# scripts/testbed.sh up --name $name --nodes $nodes --rails $rails --rate $rate
TESTBED_NAME=$name
TESTBED_STATE=$state
TESTBED_NODES=$nodes
TESTBED_RAILS=$rails
TESTBED_RATE=$rate
TESTBED_RATE_BYTES_PER_S=$bytes
TESTBED_BURST=$burst
TESTBED_LATENCY=$latency
TESTBED_MGMT_HOST=$MGMT_NET.$MGMT_HOST
TESTBED_NAMESPACES="$namespaces_list"
TESTBED_MGMT_ADDRESSES="$mgmt_list"
EOF
  for ((i = 0; i < nodes; i++)); do
    echo "TESTBED_NS_$i=$name-n$i"
    echo "TESTBED_MGMT_$i=$MGMT_NET.$((i + 1))"
    echo "TESTBED_TOPOLOGY_$i=$state/$name-n$i.json"
  done >>"$state/testbed.env"

  up_name=""
  echo "testbed $name: $nodes nodes ($namespaces_list), mgmt $MGMT_NET.0/24 (root at $MGMT_NET.$MGMT_HOST), $rails rails at $rate each way (tbf burst $burst latency $latency); state in $state"
}

cmd_down() {
  local name="" state=""
  while [ $# -gt 0 ]; do
    case $1 in
      --name) name=${2:?}; shift 2 ;;
      --state) state=${2:?}; shift 2 ;;
      *) usage ;;
    esac
  done
  [ -n "$name" ] || usage
  valid_name "$name"
  [ "$(id -u)" -eq 0 ] || die "down needs root"
  teardown "$name" "${state:-$STATE_ROOT/$name}"
}

trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

case ${1:-} in
  check) [ $# -eq 1 ] || usage; check_host || exit 77 ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  *) usage ;;
esac
