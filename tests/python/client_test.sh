#!/bin/bash
# Starts node-a and node-b, emulated nodes with two NICs each on their own loopback
# addresses, over mutual TLS (certificates from scripts/certs.sh), and runs a client
# test against them (client_test.py unless TEST names another, aio_test.py).
#
# Usage: client_test.sh AGENT_BINARY PYTHON_DIR|VENV [TEST [AGENT FLAGS...]]
# PYTHON_DIR: the client the build put there (build/python), on PYTHONPATH, run by the
# first python3 with the grpc and protobuf modules; skips (77) where none has them.
# VENV: a virtual environment the wheel was installed into (wheel_test.sh): its python
# runs the test from a scratch folder with no PYTHONPATH, and FL_INSTALLED_IN tells
# the test to check that fuselink came from there.
set -euo pipefail
agent=$(readlink -f "$1")
pydir=$(readlink -m "$2")
here=$(cd "$(dirname "$0")/../.." && pwd)
test=${3:-client_test.py}
shift $(($# < 3 ? $# : 3))

run=$(mktemp -d /tmp/fuselink-python.XXXXXX)
. "$here/scripts/lib/agents.sh"
trap 'stop_agents; rm -rf "$run"' EXIT
if [ ! -d "$pydir" ]; then
  # A venv that python_wheel_test did not make: it skipped, and said why.
  echo "SKIP: no client at $pydir (python_wheel_test skipped or failed)"
  exit 77
elif [ -x "$pydir/bin/python" ]; then
  python=$pydir/bin/python
  unset PYTHONPATH
  export FL_INSTALLED_IN=$pydir
  cd "$run"
else
  find_python grpc google.protobuf
  if [ -z "$python" ]; then
    echo "SKIP: no python3 with the grpc and protobuf modules" \
      "(apt-get install python3-grpcio python3-protobuf)"
    exit 77
  fi
  export PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}"
fi
pki_init "$run/pki"

start_agent node-b 2 "" --nics=2 "$@"
b=$(field "$run/node-b.json" grpc)
start_agent node-a 1 "node-b=$b" --nics=2 "$@"
a=$(field "$run/node-a.json" grpc)

FL_SOURCE_AGENT=$a FL_SOURCE_SOCKET=$run/node-a.sock \
  FL_TARGET_AGENT=$b FL_TARGET_SOCKET=$run/node-b.sock FL_TARGET_NODE=node-b \
  FL_PKI=$run/pki "$python" "$here/tests/python/$test" -v || {
  rc=$?
  for n in node-a node-b; do echo "--- $n.log"; tail -n 30 "$run/$n.log"; done
  exit "$rc"
}
