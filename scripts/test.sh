#!/bin/bash
# The test command: installs what is missing, builds everything, runs every test.
# Tests labelled gpu or rdma skip, saying why, where that hardware is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j2 --timeout 600
