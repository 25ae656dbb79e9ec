#!/bin/bash
# The Debian packages as an operator meets them: cpack builds them from the build;
# dpkg-deb shows each one's files, conffiles, maintainer scripts and dependencies,
# checked against what must be there (deps_cover.py: the declared Depends cover every
# library ldd says the binaries load, and hold on this machine); systemd-analyze
# verifies the unit (and its offline security score stays low); then the agent from
# the unpacked package runs the unit's own ExecStart with the packaged flag file (its
# paths moved into a temporary directory) and certificates made by the packaged
# certs.sh, under what the unit's sandbox can be imitated with here: an unprivileged
# user, CAP_IPC_LOCK alone, no new privileges, and (as root) a read-only file system
# but for its runtime directory and private /tmp. The packaged fuselinkctl must get
# its topology from it. Real systemd is not PID 1 here; README.md says what only a
# real start shows.
# Usage: deb_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-deb.XXXXXX)
agent_pid=""
cleanup() {
  if [ -n "$agent_pid" ]; then kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true; fi
  rm -rf "$run"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in cpack dpkg-deb dpkg-shlibdeps systemd-analyze ldd openssl; do
  command -v "$tool" >/dev/null || { echo "SKIP: no $tool (scripts/setup.sh installs it)"; exit 77; }
done

cpack -G DEB --config "$build/CPackConfig.cmake" -B "$run/pkg" >"$run/cpack.log" 2>&1 ||
  { cat "$run/cpack.log"; fail "cpack -G DEB"; }
deb=$(echo "$run"/pkg/fuselink_*.deb)
dev=$(echo "$run"/pkg/libfuselink-client-dev_*.deb)
if [ ! -f "$deb" ] || [ ! -f "$dev" ]; then fail "cpack made $(ls "$run/pkg")"; fi

# has_files DEB PATH...: each PATH is in DEB's file list; lacks_files: none is.
dpkg-deb -c "$deb" | awk '{print $6}' >"$run/files"
dpkg-deb -c "$dev" | awk '{print $6}' >"$run/dev-files"
has_files() {
  local list=$1 f
  shift
  for f in "$@"; do grep -qx "./$f" "$list" || fail "$(basename "$list") lacks $f"; done
}
has_files "$run/files" usr/bin/fuselink-agent usr/bin/fuselinkctl \
  usr/lib/systemd/system/fuselink-agent.service etc/fuselink/agent.flags \
  usr/share/fuselink/grafana/fuselink-node.json usr/share/fuselink/grafana/fuselink-cluster.json \
  usr/share/fuselink/prometheus/fuselink-alerts.yaml usr/share/fuselink/certs.sh
has_files "$run/dev-files" usr/lib/libfuselink_client.a usr/include/fuselink/clients/cpp/client.h \
  usr/include/fuselink/fuselink/v1/agent.grpc.pb.h usr/lib/cmake/fuselink/fuselinkConfig.cmake \
  usr/lib/pkgconfig/fuselink-client.pc
if grep -E '^\./usr/(include|lib/cmake|lib/pkgconfig)/|\.a$' "$run/files"; then
  fail "the agent's package holds the client's development files"
fi
if grep -E '/bin/' "$run/dev-files"; then fail "the -dev package holds programs"; fi

# Control data: conffiles, maintainer scripts that parse, the dependencies.
dpkg-deb -e "$deb" "$run/control"
grep -qx /etc/fuselink/agent.flags "$run/control/conffiles" || fail "agent.flags is no conffile"
for script in postinst prerm postrm; do
  [ -x "$run/control/$script" ] || fail "$script is missing or not executable"
  sh -n "$run/control/$script" || fail "$script does not parse"
done
depends=$(dpkg-deb -f "$deb" Depends)
for need in adduser libc6 libgrpc++1.51 libibverbs1 libssl3; do
  [[ ", $depends," == *", $need "* || ", $depends," == *", $need,"* ]] ||
    fail "Depends lacks $need: $depends"
done
dpkg-deb -x "$deb" "$run/root"
"$here/tests/packaging/deps_cover.py" "$deb" "$run/root" || fail "Depends does not cover ldd"
if "$here/tests/packaging/deps_cover.py" "$deb" "$run/root" --without libyaml-0-2 >/dev/null; then
  fail "deps_cover.py passed a Depends without libyaml-0-2"
fi
"$here/tests/packaging/deps_cover.py" "$dev" "$run/root" --without fuselink >/dev/null 2>&1 &&
  fail "deps_cover.py passed the -dev package's Depends for the agent's binaries"
dev_depends=$(dpkg-deb -f "$dev" Depends)
for need in libgrpc++-dev libprotobuf-dev libabsl-dev; do
  [[ $dev_depends == *"$need ("* ]] || fail "the -dev package's Depends lacks $need: $dev_depends"
done
version=$("$run/root/usr/bin/fuselink-agent" --version | awk '{print $2}')
[ "$(dpkg-deb -f "$deb" Version)" = "$version-1" ] ||
  fail "package version $(dpkg-deb -f "$deb" Version), agent $version"
# The unit's flag file names flags an operator looks up with --help.
help=$("$run/root/usr/bin/fuselink-agent" --help 2>&1 || true)
for flag in --node --tls_cert --max_transfers; do
  grep -q -- "$flag " <<<"$help" || fail "fuselink-agent --help does not list $flag"
done

# The unit: systemd-analyze verify, with ExecStart at the unpacked binary (verify
# wants it to exist), quiet: it exits 0 on unknown keys and bad values, so any line
# it prints fails. A misspelt copy shows that it would.
unit=$run/root/usr/lib/systemd/system/fuselink-agent.service
sed "s|=/usr/bin/|=$run/root/usr/bin/|" "$unit" >"$run/fuselink-agent.service"
out=$(systemd-analyze verify "$run/fuselink-agent.service" 2>&1) || fail "verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify: $out"
sed 's/^ProtectSystem=strict/ProtectSystem=strickt/' "$run/fuselink-agent.service" >"$run/bad.service"
[ -n "$(systemd-analyze verify "$run/bad.service" 2>&1)" ] || fail "verify passed a bad value"
exposure=$(systemd-analyze security --offline=yes "$run/fuselink-agent.service" 2>&1 |
  sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "no exposure level from systemd-analyze security"
awk -v e="$exposure" 'BEGIN { exit !(e <= 4.0) }' || fail "exposure $exposure > 4.0"

# The certificates as README.md tells an operator to make them: the packaged
# certs.sh, the node's pair under the flag file's names, the key root:<group> 0640.
user=nobody group=nogroup
getent group "$group" >/dev/null || group=nobody
certs=$run/root/usr/share/fuselink/certs.sh
"$certs" "$run/ca" ca
"$certs" "$run/ca" node deb-node
"$certs" "$run/ca" viewer v1
install -d -m 0750 "$run/pki"
install -m 0644 "$run/ca/ca.crt" "$run/pki/ca.crt"
install -m 0644 "$run/ca/node-deb-node.crt" "$run/pki/node.crt"
install -m 0640 "$run/ca/node-deb-node.key" "$run/pki/node.key"

# The packaged flag file with its paths in $run, ports chosen by the kernel, and an
# emulated topology (this machine's NICs are not a GPU node's); the ready file tells
# the test where it listens (in the runtime directory: the rest is read-only).
sed -e "s|/etc/fuselink/pki|$run/pki|" -e "s|/run/fuselink|$run/rt|" \
  -e 's|0\.0\.0\.0:[0-9]*|127.0.0.1:0|' -e 's|^--topology=discover$|--topology=emulated|' \
  "$run/root/etc/fuselink/agent.flags" >"$run/agent.flags"
grep -q "^--tls_key=$run/pki/node.key$" "$run/agent.flags" || fail "the flag file names no key"
printf -- '--nics=1\n--loopback_net=143\n--gpu=off\n--ready_file=%s\n' "$run/rt/ready.json" >>"$run/agent.flags"
mapfile -t exec_start < <(sed -n 's/^ExecStart=//p' "$unit" | tr ' ' '\n')
[ "${exec_start[0]}" = /usr/bin/fuselink-agent ] || fail "ExecStart runs ${exec_start[0]}"
command=("$run/root${exec_start[0]}")
for arg in "${exec_start[@]:1}"; do
  arg=${arg//%H/deb-node}
  command+=("${arg/=\/etc\/fuselink\/agent.flags/=$run/agent.flags}")
done
[[ " ${command[*]} " == *" --flagfile=$run/agent.flags "* ]] || fail "ExecStart: ${exec_start[*]}"

# The sandbox, imitated where this process may (root): the unit's user and its one
# capability, RuntimeDirectory (theirs, 0700), PrivateTmp (TMPDIR), ProtectSystem=
# strict (every mount read-only but those two), LimitMEMLOCK= where this process may
# raise its hard limit (CAP_SYS_RESOURCE).
mkdir -m 0700 "$run/rt" "$run/tmp"
sandbox=() memlock=() sandbox_note="none"
if prlimit --memlock=unlimited:unlimited true 2>/dev/null; then
  memlock=(prlimit --memlock=unlimited:unlimited --)
fi
caps=-all,+ipc_lock
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
  chmod 0755 "$run"
  chown "$user:$group" "$run/rt" "$run/tmp"
  chgrp "$group" "$run/pki" "$run/pki/node.key"
  # shellcheck disable=SC2016  # expanded by the inner shell
  sandbox=(unshare -m --propagation private bash -c '
    mount --bind "$1" "$1" && mount --bind "$2" "$2"
    findmnt -rn -o TARGET | while read -r m; do
      case $m in "$1"|"$2"|/proc|/proc/*|/dev|/dev/*|/sys|/sys/*) ;;
        *) mount -o remount,bind,ro "$m" 2>/dev/null || true ;; esac
    done
    shift 2; exec "$@"' sandbox "$run/rt" "$run/tmp"
    "${memlock[@]}"
    setpriv --reuid="$user" --regid="$group" --clear-groups --no-new-privs
    --inh-caps="$caps" --ambient-caps="$caps" --bounding-set="$caps" --)
else
  echo "deb_test: not root: the agent runs as this user, without the sandbox's mounts"
fi
TMPDIR=$run/tmp "${sandbox[@]}" "${command[@]}" >"$run/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do
  [ -s "$run/rt/ready.json" ] && break
  kill -0 "$agent_pid" 2>/dev/null || break
  sleep 0.1
done
[ -s "$run/rt/ready.json" ] || { cat "$run/agent.log"; fail "the packaged agent did not start"; }
grpc=$(sed -n 's/.*"grpc":"\([^"]*\)".*/\1/p' "$run/rt/ready.json")
[ -S "$run/rt/deb-node.sock" ] || fail "no handle socket in the runtime directory"
if [ ${#sandbox[@]} -gt 0 ]; then
  pid=$(pgrep -P "$agent_pid" -x fuselink-agent || echo "$agent_pid")
  [ "$(stat -c %U "/proc/$pid")" = "$user" ] || fail "the agent runs as $(stat -c %U "/proc/$pid")"
  [ "$(sed -n 's/^CapEff:\s*//p' "/proc/$pid/status")" = 0000000000004000 ] ||
    fail "the agent's capabilities: $(grep Cap "/proc/$pid/status")"
  [[ $(awk '$5 == "/" {print $6}' "/proc/$pid/mountinfo") == ro* ]] ||
    fail "the agent's / is not read-only"
  sandbox_note="imitated"
fi
"$run/root/usr/bin/fuselinkctl" --agent="$grpc" --tls_cert="$run/ca/viewer-v1.crt" \
  --tls_key="$run/ca/viewer-v1.key" --tls_ca="$run/pki/ca.crt" topology >"$run/topology.txt" 2>&1 ||
  { cat "$run/topology.txt" "$run/agent.log"; fail "fuselinkctl topology"; }
grep -q deb-node "$run/topology.txt" || { cat "$run/topology.txt"; fail "topology names no deb-node"; }
echo "deb_test: $(basename "$deb") and $(basename "$dev"): OK (sandbox: $sandbox_note)"
