#!/usr/bin/env bash
# What mutual TLS and the fabric handshake cost: the same binaries under --plaintext
# and under mTLS, interleaved round by round in one sitting by scripts/bench-ab.sh
# (its header says the workloads and the table). About 4 minutes with ROUNDS=3.
#
# Environment: BUILD (build: the binaries as they are; this script builds nothing),
# and ROUNDS, REPS, NET, PARTS as bench-ab.sh takes them.
set -euo pipefail
BUILD=${BUILD:-build}
VARIANTS="plaintext=$BUILD:plaintext mtls=$BUILD:mtls" exec "$(dirname "$0")/bench-ab.sh"
