#!/bin/bash
# The test command: installs what is missing, builds everything, runs every test.
# Tests labelled gpu or rdma skip, saying why, where that hardware is absent.
# Then the agent and the unit and integration tests again, built with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer (with the fuzz targets) and under
# ThreadSanitizer (scripts/sanitize.sh asan, tsan). SANITIZE=0 skips those two
# stages (a quicker local run; CI runs them). Prints each stage's time at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

stages=()
current=""
stage() {
  local start=$SECONDS
  current=$1
  shift
  "$@"
  stages+=("$(printf '%-16s %5d s' "$current" $((SECONDS - start)))")
  current=""
}
report() {
  local status=$?
  echo "test.sh: stage times"
  for s in "${stages[@]}"; do echo "  $s"; done
  printf '  %-16s %5d s\n' total "$SECONDS"
  [ $status -eq 0 ] || echo "test.sh: FAILED${current:+ in stage $current}"
}
trap report EXIT

plain_tests() (
  cd "${BUILD_DIR:-build}"
  ctest --output-on-failure -j2 --timeout 600
)

stage setup ./scripts/setup.sh
stage build ./scripts/build.sh
stage tests plain_tests
if [ "${SANITIZE:-1}" != 0 ]; then
  stage "asan+ubsan+fuzz" ./scripts/sanitize.sh asan
  stage tsan ./scripts/sanitize.sh tsan
fi
