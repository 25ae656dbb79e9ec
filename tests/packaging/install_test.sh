#!/bin/bash
# `cmake --install` as a C++ engine's build uses it: the tree installed into a
# temporary prefix and moved elsewhere (the CMake package and the .pc file must not
# name where they were installed), every installed header including only installed
# headers, then tests/packaging/consumer built outside the tree twice, with
# find_package(fuselink) and with pkg-config, each run against two of the installed
# agents under mutual TLS, moving a tensor and checking its bytes.
# Usage: install_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-install.XXXXXX)
. "$here/scripts/lib/agents.sh"
trap 'stop_agents; rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in pkg-config g++; do
  command -v "$tool" >/dev/null || { echo "SKIP: no $tool"; exit 77; }
done

cmake --install "$build" --prefix "$run/stage" >"$run/install.log" || { cat "$run/install.log"; fail "cmake --install"; }
mv "$run/stage" "$run/prefix"
prefix=$run/prefix
for f in bin/fuselink-agent bin/fuselinkctl lib/libfuselink_client.a \
  lib/cmake/fuselink/fuselinkConfig.cmake lib/cmake/fuselink/fuselinkConfigVersion.cmake \
  lib/pkgconfig/fuselink-client.pc include/fuselink/clients/cpp/client.h \
  include/fuselink/fuselink/v1/agent.grpc.pb.h etc/fuselink/agent.flags \
  lib/systemd/system/fuselink-agent.service share/fuselink/grafana/fuselink-node.json \
  share/fuselink/grafana/fuselink-cluster.json share/fuselink/prometheus/fuselink-alerts.yaml \
  share/fuselink/certs.sh; do
  [ -e "$prefix/$f" ] || fail "cmake --install left out $f"
done
if grep -rl -e "$run/stage" -e "$here" -e "$build" "$prefix/lib/cmake" "$prefix/lib/pkgconfig"; then
  fail "the CMake package or the .pc file names the staging prefix or the source/build tree"
fi

# Each installed header's quoted includes: installed beside it, or the system's
# (gRPC, protobuf, abseil); never a file of the tree left behind.
inc=$prefix/include/fuselink
while IFS= read -r header; do
  while IFS= read -r name; do
    [ -f "$inc/$name" ] || [ -f "/usr/include/$name" ] ||
      fail "${header#"$inc"/} includes \"$name\", which is not installed"
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$header")
done < <(find "$inc" -name '*.h')

# Two agents from the prefix, as an operator runs them (scripts/lib/agents.sh).
agent=$prefix/bin/fuselink-agent
pki_init "$run/pki"
start_agent inst-b 142 "" --nics=2 --gpu=off
start_agent inst-a 141 "inst-b=$(field "$run/inst-b.json" grpc)" --nics=2 --gpu=off
consumer_args=("$run/pki" inst-a "$(field "$run/inst-a.json" grpc)" "$run/inst-a.sock"
  inst-b "$(field "$run/inst-b.json" grpc)" "$run/inst-b.sock")
launcher=() cxx=(g++)
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache) cxx=(ccache g++); fi

# find_package(fuselink): the prefix is all the consumer's build is told of.
cmake -S "$here/tests/packaging/consumer" -B "$run/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  "${launcher[@]}" >"$run/cmake.log" 2>&1 || { cat "$run/cmake.log"; fail "configure the consumer"; }
cmake --build "$run/cmake" >"$run/cmake-build.log" 2>&1 ||
  { cat "$run/cmake-build.log"; fail "build the consumer with find_package(fuselink)"; }
"$run/cmake/consumer" "${consumer_args[@]}" || fail "the CMake consumer's transfer"

# pkg-config: one compiler line, as a Makefile would have it.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs fuselink-client) || fail "pkg-config fuselink-client"
include_dir=$(pkg-config --variable=includedir fuselink-client)
[ "$(realpath "$include_dir")" = "$prefix/include/fuselink" ] ||
  fail "pkg-config's includedir is $include_dir, not under $prefix"
# shellcheck disable=SC2086  # pkg-config's flags are words
"${cxx[@]}" -O1 "$here/tests/packaging/consumer/main.cc" -o "$run/consumer-pc" $flags ||
  fail "build the consumer with pkg-config"
"$run/consumer-pc" "${consumer_args[@]}" || fail "the pkg-config consumer's transfer"
echo "install_test: cmake --install, find_package(fuselink) and pkg-config: OK"
