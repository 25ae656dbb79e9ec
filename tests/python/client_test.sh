#!/bin/bash
# Starts node-a and node-b, emulated nodes with two NICs each on their own loopback
# addresses, and runs client_test.py against them with the Python client the build
# put in PYTHON_DIR, over mutual TLS (certificates from scripts/certs.sh). Skips (77) where no python3 has the grpc and protobuf modules.
# Usage: client_test.sh AGENT_BINARY PYTHON_DIR
set -euo pipefail
agent=$1
pydir=$2
here=$(cd "$(dirname "$0")/../.." && pwd)

# The first interpreter with both modules: $FUSELINK_PYTHON, the one on PATH, then
# Debian's (which the apt packages install into, whatever PATH puts first).
python=""
for p in ${FUSELINK_PYTHON:-} python3 /usr/bin/python3; do
  if "$p" -c 'import grpc, google.protobuf' 2>/dev/null; then
    python=$p
    break
  fi
done
if [ -z "$python" ]; then
  echo "SKIP: no python3 with the grpc and protobuf modules" \
    "(apt-get install python3-grpcio python3-protobuf)"
  exit 77
fi

run=$(mktemp -d /tmp/fuselink-python.XXXXXX)
. "$here/scripts/lib/agents.sh"
trap 'stop_agents; rm -rf "$run"' EXIT
pki_init "$run/pki"

start_agent node-b 2 "" --nics=2
b=$(field "$run/node-b.json" grpc)
start_agent node-a 1 "node-b=$b" --nics=2
a=$(field "$run/node-a.json" grpc)

FL_SOURCE_AGENT=$a FL_SOURCE_SOCKET=$run/node-a.sock \
  FL_TARGET_AGENT=$b FL_TARGET_SOCKET=$run/node-b.sock FL_TARGET_NODE=node-b \
  FL_PKI=$run/pki \
  PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}" \
  "$python" "$here/tests/python/client_test.py" -v || {
  rc=$?
  for n in node-a node-b; do echo "--- $n.log"; tail -n 30 "$run/$n.log"; done
  exit "$rc"
}
