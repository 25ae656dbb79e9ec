#!/bin/bash
# Builds the Python client as a user would and installs it into a fresh virtual
# environment, OUT/venv, for python_installed_client_test and python_aio_test, which
# run against that installed package. Offline, from Debian's tools: an sdist from a
# copy of clients/python beside the repository's protos, a wheel from that sdist alone
# (protogen.py then reads the protos the sdist carries), `pip install --no-index` of
# the wheel into a venv whose grpcio and protobuf are Debian's (--system-site-packages).
# Also that a source without protos fails with the message that says where they go.
# Skips (77) only where no python3 has grpc, protobuf, setuptools, wheel, pip and venv.
# Usage: wheel_test.sh OUT
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$out"  # first: a skip must not leave the last run's venv for the tests after
. "$here/scripts/lib/agents.sh"
find_python grpc google.protobuf setuptools wheel pip venv ensurepip
if [ -z "$python" ]; then
  echo "SKIP: no python3 with grpc, protobuf, setuptools, wheel, pip and venv" \
    "(apt-get install python3-grpcio python3-protobuf python3-setuptools python3-wheel" \
    "python3-pip python3-venv)"
  exit 77
fi
command -v grpc_python_plugin >/dev/null || {
  echo "SKIP: no grpc_python_plugin (apt-get install protobuf-compiler-grpc)"
  exit 77
}
tmp=$(mktemp -d /tmp/fuselink-wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The source as a checkout holds it (clients/python two levels below api/proto), in a
# scratch folder: pip builds in the tree, and the checkout stays untouched.
mkdir -p "$tmp/repo/clients" "$tmp/repo/api"
cp -r "$here/clients/python" "$tmp/repo/clients/python"
rm -rf "$tmp/repo/clients/python/build" "$tmp/repo/clients/python/"*.egg-info
ln -s "$here/api/proto" "$tmp/repo/api/proto"
(cd "$tmp/repo/clients/python" && "$python" setup.py -q sdist -d "$tmp/sdist" 2>/dev/null)
sdist=$(echo "$tmp"/sdist/fuselink-*.tar.gz)
[ -f "$sdist" ] || fail "no sdist"
tar -C "$tmp" -xzf "$sdist"
unpacked=$(echo "$tmp"/fuselink-*/)
[ -f "$unpacked/proto/fuselink/v1/agent.proto" ] || fail "the sdist carries no protos"

mkdir -p "$out"
unset FUSELINK_PROTO_ROOT PYTHONPATH
"$python" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$out/dist" "$unpacked"
wheel=$(echo "$out"/dist/fuselink-*-py3-none-any.whl)
[ -f "$wheel" ] || fail "no wheel in $out/dist"
listing=$("$python" -m zipfile -l "$wheel")
for f in fuselink/py.typed fuselink/aio.py fuselink/v1/agent_pb2.py \
  fuselink/v1/agent_pb2_grpc.py fuselink/_rpc/status_pb2.py; do
  grep -q " *$f " <<<"$listing" || fail "the wheel lacks $f"
done
if grep -q "google/" <<<"$listing"; then fail "the wheel owns google/ files"; fi

"$python" -m venv --system-site-packages "$out/venv"
"$out/venv/bin/python" -m pip install -q --no-index --no-cache-dir "$wheel"
(cd "$tmp" && "$out/venv/bin/python" - "$out/venv" <<'PY')
import importlib.metadata as md, os, sys
import fuselink, fuselink.aio
from fuselink.v1 import agent_pb2_grpc
venv = os.path.realpath(sys.argv[1]) + os.sep
for m in (fuselink, fuselink.aio, agent_pb2_grpc):
    assert os.path.realpath(m.__file__).startswith(venv), m.__file__
requires = [r.translate({ord(c): None for c in " ()"}).replace('"', "'")
            for r in md.requires("fuselink")]
assert "grpcio>=1.51" in requires and "protobuf>=3.21" in requires, requires
assert any(r.startswith("torch") and r.endswith("extra=='torch'") for r in requires), requires
print("installed", md.version("fuselink"), "from", os.path.dirname(fuselink.__file__))
PY

# Without protos (an sdist stripped of them, no checkout around it): the build stops
# and says where they go.
rm -rf "$unpacked/proto" "$unpacked/build"
if "$python" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$tmp/none" \
  "$unpacked" >"$tmp/none.log" 2>&1; then
  fail "a wheel built without the .proto files"
fi
grep -q "the fuselink .proto files are not here" "$tmp/none.log" ||
  fail "no clear error without protos: $(tail -n 5 "$tmp/none.log")"
echo "PASS: sdist, wheel and venv install; fuselink $wheel"
