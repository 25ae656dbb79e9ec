#!/bin/bash
# Builds fuselink-agent and the unit and integration tests with clang under the
# sanitizers, and runs those tests:
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (with LeakSanitizer) in
#         build-asan, with the libFuzzer targets of tests/fuzz, each run for a bounded
#         time by its ctest entry (label fuzz);
#   tsan  ThreadSanitizer in build-tsan.
# The tests that need hardware or a testbed (labels gpu, rdma, testbed) and the shell
# and Python tests (metrics, python) run in the plain build only. Extra arguments go
# to ctest (e.g. -R integration_stress_test).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/ccache.sh
mode=${1:-}
shift || true
case "$mode" in
  asan) build="build-asan"; sanitize="address;undefined"; fuzz=ON ;;
  tsan) build="build-tsan"; sanitize=thread; fuzz=OFF ;;
  *) echo "usage: $0 asan|tsan [ctest arguments]" >&2; exit 2 ;;
esac

if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DFUSELINK_SANITIZE="$sanitize" \
    -DFUSELINK_FUZZ="$fuzz" >/dev/null
fi
ninja -C "$build" build.ninja >/dev/null  # configure again if a CMakeLists.txt changed
# Only what the selected tests run (checked_tests: the test binaries, and with the
# integration tests fuselink-agent); tools and benches are not built.
ninja -C "$build" -j"$(nproc)" checked_tests
excluded=$(cat "$build/plain_only_labels.txt")
cd "$build"
ctest --output-on-failure -j2 --timeout 600 -LE "$excluded" "$@"
