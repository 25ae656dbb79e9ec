#!/bin/bash
# Configures and builds fuselink into build/ (or $BUILD_DIR). Extra arguments are
# ninja targets; none builds everything.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/ccache.sh
build="${BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
fi
ninja -C "$build" -j"$(nproc)" "$@"
