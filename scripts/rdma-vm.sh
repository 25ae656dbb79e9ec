#!/bin/bash
# Runs the rdma-labelled tests for real over Soft-RoCE (the kernel's rdma_rxe) inside a
# Debian 12 VM, ib_write_bw on the same rxe link for comparison, and the agent-level
# checks (tests/rdma/agent_vm_checks.sh: two fuselink-agents and fuselinkctl demo over
# verbs, a rail taken down mid-transfer, tcp when told).
#
#   scripts/rdma-vm.sh BUILD_DIR
#   scripts/rdma-vm.sh --fabric-only BUILD_DIR
#                      (the fabric test and ib_write_bw only: no agents needed, no agent
#                      checks; its verdict says so)
#   scripts/rdma-vm.sh --image-only    (builds or finds the cached image, nothing else)
#
# FUSELINK_RDMA_GTEST_FILTER, if set, is passed to the fabric test as --gtest_filter.
#
# The VM image is built once with debootstrap and cached outside the repository in
# /var/cache/fuselink/rdma-vm/<hash of the image recipe> (override the root with
# FUSELINK_VM_CACHE). The recipe is everything that goes into the image: suite, mirror,
# package list, initramfs modules and the boot stub below; the test steps run from a
# 9p share instead, so editing them does not rebuild the image.
#
# The guest boots with -kernel/-initrd from that root, -nic none, -serial stdio. Its
# boot stub mounts two read-only 9p shares: BUILD_DIR (the test binary) and a control
# folder holding the test steps this script writes. The steps: modprobe rdma_rxe, one
# veth pair per rail with accept_local=1 and an IPv4 and an IPv6 (ULA) address on each
# end (FUSELINK_RDMA_RAILS, FUSELINK_RDMA_RAILS6), an rxe device on each end, the rdma
# test binary, then ib_write_bw over rail 0, then the agent checks; then power off.
# Before the boot, on this machine: an agent with --transport=auto on loopback must say
# tcp. The guest prints "FUSELINK-RDMA-RESULT: PASS|FAIL rc=N" (N: 0 only when the
# fabric test and every agent check passed); this script exits with N (1 if the host
# check failed).
#
# Exit 77 (ctest SKIP_RETURN_CODE) where it cannot run: no qemu/debootstrap and no way to
# install them, no network for debootstrap, not root, the test binary, fuselink-agent or
# fuselinkctl not built.
# FUSELINK_VM_ACCEL=tcg (default; what CI machines have) or kvm.
set -euo pipefail

skip() { echo "rdma-vm: SKIP: $*"; exit 77; }
log() { echo "rdma-vm: $*" >&2; }

fabric_only=0
if [ "${1:-}" = --fabric-only ]; then fabric_only=1; shift; fi
[ $# -eq 1 ] || { echo "usage: $0 [--fabric-only] BUILD_DIR|--image-only" >&2; exit 2; }
test_bin_rel=tests/rdma/rdma_test
agent_rel=services/fuselink-agent
ctl_rel=tools/fuselinkctl/fuselinkctl
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "$1" != --image-only ]; then
  build_dir=$(realpath "$1")
  needed=$test_bin_rel
  [ $fabric_only -eq 1 ] || needed="$needed $agent_rel $ctl_rel"
  for rel in $needed; do
    [ -x "$build_dir/$rel" ] || skip "$build_dir/$rel is not built"
  done
fi
[ "$(id -u)" -eq 0 ] || skip "debootstrap, mke2fs -d and qemu's 9p need root"

suite=bookworm
mirror=http://deb.debian.org/debian
# The guest's packages: kernel with rdma_rxe, the verbs stack and tools, and the shared
# libraries that the rdma test, fuselink-agent and fuselinkctl link (from `ldd` + `dpkg -S`
# on a bookworm host; libc, libstdc++, libgcc and zlib are in minbase).
packages=(linux-image-amd64 initramfs-tools rdma-core ibverbs-providers ibverbs-utils
  rdmacm-utils perftest iproute2 kmod libabsl20220623 libibverbs1 libgrpc++1.51
  libgrpc29 libprotobuf32 libre2-9 libc-ares2 libssl3 libprometheus-cpp-core1.0
  libprometheus-cpp-pull1.0 libcivetweb1 libcurl4 libyaml-0-2)
initramfs_modules=(virtio_pci virtio_blk ext4 9p 9pnet 9pnet_virtio)
image_bytes=2G

# The boot stub, baked into the image as /sbin/fuselink-init. Kept small and stable:
# everything else the guest does lives in the control share's steps.sh.
read -r -d '' boot_stub <<'STUB' || true
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mkdir -p /mnt/build /mnt/ctl
mount -t 9p -o trans=virtio,version=9p2000.L,ro build /mnt/build
mount -t 9p -o trans=virtio,version=9p2000.L,ro ctl /mnt/ctl
sh /mnt/ctl/steps.sh
echo o > /proc/sysrq-trigger
sleep 60
STUB

recipe="v1 $suite $mirror ${packages[*]} | ${initramfs_modules[*]} | $image_bytes | $boot_stub"
hash=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)
cache=${FUSELINK_VM_CACHE:-/var/cache/fuselink/rdma-vm}/$hash

install_tools() {
  local missing=()
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  if ! { apt-get update -q=2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q=2 \
      --no-install-recommends "${missing[@]}" >/dev/null; }; then
    skip "cannot install ${missing[*]} (no network or no apt)"
  fi
}

build_image() {
  local work
  work=$(mktemp -d /var/tmp/fuselink-rdma-vm.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  local root=$work/root
  local started=$SECONDS
  log "building the VM image in $cache (once; ~4 min)"
  if ! debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
      "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2
    if ! getent hosts "${mirror#http://}" >/dev/null 2>&1; then
      skip "debootstrap cannot reach $mirror (no network)"
    fi
    echo "rdma-vm: debootstrap failed (log above)" >&2
    exit 1
  fi
  printf '%s\n' "${initramfs_modules[@]}" >>"$root/etc/initramfs-tools/modules"
  chroot "$root" update-initramfs -u -k all >"$work/initramfs.log" 2>&1 ||
    { cat "$work/initramfs.log" >&2; exit 1; }
  printf '%s\n' "$boot_stub" >"$root/sbin/fuselink-init"
  chmod 755 "$root/sbin/fuselink-init"
  rm -rf "$root/var/cache/apt/archives"/*.deb
  mkdir -p "$work/out"
  cp "$(printf '%s\n' "$root"/boot/vmlinuz-* | tail -1)" "$work/out/vmlinuz"
  cp "$(printf '%s\n' "$root"/boot/initrd.img-* | tail -1)" "$work/out/initrd.img"
  mke2fs -q -t ext4 -d "$root" "$work/out/root.img" "$image_bytes"
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache.tmp" && mv "$work/out" "$cache.tmp" && mv "$cache.tmp" "$cache"
  log "image built in $((SECONDS - started)) s"
}

install_tools
[ -f "$cache/root.img" ] || build_image
[ "$1" = --image-only ] && { echo "rdma-vm: image in $cache"; exit 0; }

ctl=$(mktemp -d /var/tmp/fuselink-rdma-ctl.XXXXXX)
host_pid=""
trap '[ -z "$host_pid" ] || kill "$host_pid" 2>/dev/null; rm -rf "$ctl"' EXIT

# On this machine (no RDMA device on loopback): --transport=auto must pick tcp.
host_check() {
  local dir=$ctl/host
  # shellcheck disable=SC2174  # only $dir is meant private; $ctl exists (mktemp)
  mkdir -p -m 0700 "$dir"  # the handle socket's directory must be private
  echo '{"nics":[{"name":"lo","address":"127.0.0.1"}]}' >"$dir/topology.json"
  "$build_dir/$agent_rel" --node=host-check --topology="$dir/topology.json" \
    --tls_cert="$ctl/pki/node-host-check.crt" --tls_key="$ctl/pki/node-host-check.key" \
    --tls_ca="$ctl/pki/ca.crt" \
    --transport=auto --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    --handle_socket="$dir/agent.sock" --ready_file="$dir/ready" >"$dir/log" 2>&1 &
  host_pid=$!
  for _ in $(seq 100); do
    [ -s "$dir/ready" ] && break
    kill -0 "$host_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$host_pid" 2>/dev/null; wait "$host_pid" 2>/dev/null; host_pid=""
  local got
  got=$(sed -n 's/^fuselink-agent node=.* transport=\([a-z]*\) .*/\1/p' "$dir/log")
  if [ "$got" = tcp ]; then
    echo "agent-check: host PASS --transport=auto on 127.0.0.1 outside the VM picks tcp"
  else
    echo "agent-check: host FAIL --transport=auto on 127.0.0.1 outside the VM: '$got'"
    sed 's/^/    /' "$dir/log"
    return 1
  fi
}
# The agents' and clients' certificates, made here: the guest has no openssl. The
# guest reads them from the control share (agent_vm_checks.sh's PKI_DIR).
for cert in node/host-check node/node-a node/node-b node/node-c engine/e1 router/r1; do
  "$here/scripts/certs.sh" "$ctl/pki" "${cert%/*}" "${cert#*/}"
done
host_rc=0
if [ $fabric_only -eq 0 ]; then
  host_check || host_rc=1
fi
gtest_filter=""
[ -z "${FUSELINK_RDMA_GTEST_FILTER:-}" ] ||
  gtest_filter="--gtest_filter=$FUSELINK_RDMA_GTEST_FILTER"
cp "$here/tests/rdma/agent_vm_checks.sh" "$ctl/agent_vm_checks.sh"
cat >"$ctl/steps.sh" <<STEPS
#!/bin/sh
# Runs inside the guest, from the control share.
set -u
echo "guest: kernel \$(uname -r), up \$(cut -d' ' -f1 /proc/uptime) s"
modprobe rdma_rxe || { echo "FUSELINK-RDMA-RESULT: FAIL rc=1 (no rdma_rxe)"; exit 0; }
ip link set lo up
echo 1 >/proc/sys/net/ipv4/conf/all/accept_local
# IPv6 addresses survive a rail taken down and up again (the tests do), as IPv4 ones do.
echo 1 >/proc/sys/net/ipv6/conf/all/keep_addr_on_down
echo 1 >/proc/sys/net/ipv6/conf/default/keep_addr_on_down
for rail in 0 1; do
  a=vA\$rail; b=vB\$rail
  ip link add \$a type veth peer name \$b
  ip addr add 10.\$rail.0.1/24 dev \$a
  ip addr add 10.\$rail.0.2/24 dev \$b
  # A unique local address on each end too (nodad: usable at once, not tentative),
  # which rxe lists as a RoCE v2 GID of its own: the IPv6 rails of the fabric test.
  ip -6 addr add fd00:fe:\$rail::1/64 dev \$a nodad
  ip -6 addr add fd00:fe:\$rail::2/64 dev \$b nodad
  for dev in \$a \$b; do
    echo 1 >/proc/sys/net/ipv4/conf/\$dev/accept_local
    # RoCE RC is go-back-N: it needs one QP's packets in order, as a real fabric keeps
    # them. A veth hands each packet to the backlog of the CPU that sent it, and rxe
    # sends one QP's packets from whichever CPU posts or takes its ACK, so with two
    # vCPUs two backlogs drain one QP in parallel and reorder it (rxeB0 counted
    # out_of_seq_request 1-25 per 3 s of 1 MiB writes); each reorder costs a NAK and
    # a retry, and now and then rxe 6.1's responder takes the retried write for an
    # invalid request and errors the QP (the source then sees REM_INV_REQ, or
    # retry exceeded when that NAK is lost). RPS queues each flow (rxe: one UDP source
    # port per QP) on one CPU's backlog: in order, and still both CPUs busy.
    printf '%x' \$(( (1 << \$(nproc)) - 1 )) >/sys/class/net/\$dev/queues/rx-0/rps_cpus
    ip link set \$dev up
  done
  rdma link add rxeA\$rail type rxe netdev \$a
  rdma link add rxeB\$rail type rxe netdev \$b
done
# rxe sends with the kernel's output route lookup for (its netdev, source, destination).
# Both ends of a rail live in this one namespace, so the destination is a local address:
# IPv4's lookup honours the netdev and skips the local route (hence accept_local), but
# IPv6's does not once a source is given, and picks the local route, through lo, where
# no rxe device listens: the packets are dropped. A rule for packets bound to one end's
# netdev (rxe's and its address resolution's; not the control TCP's, which go through
# lo as on IPv4) to the other end, ahead of the local table, looks them up in main,
# whose prefix route on that netdev sends them over the veth. (Across two hosts there
# is no local route to find: this is the single-host testbed's.)
echo "guest: ipv6 route before: \$(ip -6 route get fd00:fe:0::2 from fd00:fe:0::1 oif vA0)"
ip -6 rule add pref 1000 lookup local
ip -6 rule del pref 0 lookup local
for rail in 0 1; do
  ip -6 rule add pref 100 iif lo oif vA\$rail from fd00:fe:\$rail::1 to fd00:fe:\$rail::2 \\
    lookup main
  ip -6 rule add pref 100 iif lo oif vB\$rail from fd00:fe:\$rail::2 to fd00:fe:\$rail::1 \\
    lookup main
done
echo "guest: ipv6 route after: \$(ip -6 route get fd00:fe:0::2 from fd00:fe:0::1 oif vA0)"
sleep 1
rdma link show
export FUSELINK_RDMA_RAILS="10.0.0.1,10.0.0.2;10.1.0.1,10.1.0.2"
export FUSELINK_RDMA_RAILS6="fd00:fe:0::1,fd00:fe:0::2;fd00:fe:1::1,fd00:fe:1::2"
for g in /sys/class/infiniband/rxe*/ports/1/gids/*; do
  case "\$(cat \$g)" in fd00:*) t=\${g%/gids/*}/gid_attrs/types/\${g##*/}
    echo "guest: ipv6 gid \${g#/sys/class/infiniband/} \$(cat \$g) \$(cat \$t)";; esac
done
export FUSELINK_RDMA_VETHS="vA0,vB0;vA1,vB1"
cd /tmp
started=\$(cut -d' ' -f1 /proc/uptime)
/mnt/build/$test_bin_rel --gtest_color=no $gtest_filter
rc=\$?
fabric_rc=\$rc
# rxe's own warnings (the console is quiet): timeouts, QP errors.
dmesg | grep -i -E 'rxe|rdma' | grep -v -E 'loaded|set active|added' | tail -20 |
  sed 's/^/guest-dmesg: /'
# rxe's view of the rails: a reordered or lost packet shows as out_of_seq_request at the
# target and a retry at the source (rails taken down by the tests lose some).
for d in /sys/class/infiniband/rxe*; do
  c=\$d/ports/1/hw_counters
  echo "guest: \${d##*/} out_of_seq_request \$(cat \$c/out_of_seq_request)" \
    "duplicate_request \$(cat \$c/duplicate_request)" \
    "completer_retry_err \$(cat \$c/completer_retry_err)" \
    "retry_exceeded_err \$(cat \$c/retry_exceeded_err)"
done
echo "guest: rdma test took \$(echo "\$(cut -d' ' -f1 /proc/uptime) \$started" | awk '{print \$1-\$2}') s"
# The reference: ib_write_bw on rail 0 (rails are back up: the test restores them).
gid_index() {
  for g in /sys/class/infiniband/\$1/ports/1/gids/*; do
    case "\$(cat \$g)" in *ffff:\$2) basename \$g; return;; esac
  done
}
ia=\$(gid_index rxeA0 0a00:0001); ib=\$(gid_index rxeB0 0a00:0002)
for size in 65536 1048576; do
  ib_write_bw -d rxeB0 -x "\$ib" -s \$size -D 5 -F >/tmp/server.log 2>&1 &
  sleep 2
  echo "guest: ib_write_bw -d rxeA0 -x \$ia -s \$size -D 5 -F 10.0.0.2"
  ib_write_bw -d rxeA0 -x "\$ia" -s \$size -D 5 -F 10.0.0.2 2>&1 | tail -4
  wait
done
# The agent-level checks (rails up again: ib_write_bw leaves them as they were).
if [ $fabric_only -eq 1 ]; then
  echo "agent-check: all SKIP --fabric-only: the agents were not run"
  agents_rc=0
else
  bash /mnt/ctl/agent_vm_checks.sh /mnt/build /mnt/ctl/pki
  agents_rc=\$?
fi
echo "guest: fabric test rc=\$fabric_rc, agent checks rc=\$agents_rc"
rc=\$((fabric_rc != 0 ? fabric_rc : agents_rc))
if [ \$rc -eq 0 ]; then verdict=PASS; else verdict=FAIL; fi
[ $fabric_only -eq 0 ] || [ \$rc -ne 0 ] || verdict=PASS-FABRIC-ONLY
echo "FUSELINK-RDMA-RESULT: \$verdict rc=\$rc"
STEPS

accel=${FUSELINK_VM_ACCEL:-tcg}
# shellcheck disable=SC2054  # tcg,thread=multi: the comma is inside one qemu argument
case $accel in
  tcg) accel_args=(-accel tcg,thread=multi) ;;
  kvm) accel_args=(-accel kvm -cpu host) ;;
  *) echo "rdma-vm: FUSELINK_VM_ACCEL must be tcg or kvm" >&2; exit 2 ;;
esac
log "booting ($accel) with $build_dir shared read-only"
started=$SECONDS
console=$ctl/console.log
set +e
timeout 840 qemu-system-x86_64 "${accel_args[@]}" -m 2G -smp 2 -nographic -nic none \
  -no-reboot -serial stdio -monitor none \
  -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" \
  -append "root=/dev/vda rw console=ttyS0 init=/sbin/fuselink-init panic=-1 quiet" \
  -drive "file=$cache/root.img,format=raw,if=virtio,snapshot=on" \
  -virtfs "local,path=$build_dir,mount_tag=build,security_model=none,readonly=on" \
  -virtfs "local,path=$ctl,mount_tag=ctl,security_model=none,readonly=on" \
  </dev/null 2>&1 | tee "$console"
qemu_rc=${PIPESTATUS[0]}
set -e
log "VM ran $((SECONDS - started)) s (qemu exit $qemu_rc)"
result=$(grep -ao 'FUSELINK-RDMA-RESULT: [A-Z-]* rc=[0-9]*' "$console" | tail -1 || true)
if [ -z "$result" ]; then
  echo "rdma-vm: FAIL: the guest printed no result (qemu exit $qemu_rc)"
  exit 1
fi
grep -a '^agent-check: ' "$console" | tr -d '\r' || true
# Last, where a log's tail shows them: each failed test's assertion and name, each
# failed agent check, and a crash's first stack lines.
{
  grep -a -A4 ': Failure.\?$' "$console"
  grep -a '^\[  FAILED  \] [A-Za-z]' "$console"
  grep -a '^agent-check: [^ ]* FAIL' "$console"
  grep -a -A8 '^\*\*\* SIG' "$console" | head -30
} | tr -d '\r' | sed 's/^/rdma-vm: failed: /' || true
echo "rdma-vm: $result"
[ "$host_rc" -eq 0 ] || { echo "rdma-vm: FAIL: the host check failed"; exit 1; }
exit "${result##*rc=}"
