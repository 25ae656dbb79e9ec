#!/bin/bash
# The agent's image, built by deploy/image/build.sh from Debian packages: the OCI
# archive unpacks with umoci, its config runs the agent, and inside its root file
# system (chroot) fuselink-agent --version names the release, two agents move a
# tensor with the image's fuselinkctl, and fuselink-health tells a serving agent from
# a missing one.
# Usage: image_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-image.XXXXXX)
root=""
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$root" ]; then umount "$root/proc" 2>/dev/null || true; fi
  rm -rf "$run"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: building the image (mmdebstrap, chroot) needs root"; exit 77; fi

BUILD_DIR=$build "$here/deploy/image/build.sh" "$run/build" >"$run/build.log" 2>&1 ||
  { cat "$run/build.log"; fail "deploy/image/build.sh"; }
version=$("$build/services/fuselink-agent" --version | awk '{print $2}')
archive="$run/build/fuselink-agent-$version.oci.tar"
[ -f "$archive" ] || fail "no $archive"

# The archive alone: unpack it as a user of it would.
mkdir "$run/oci"
tar -xf "$archive" -C "$run/oci"
umoci unpack --image "$run/oci:$version" "$run/bundle" >/dev/null || fail "umoci unpack"
root=$run/bundle/rootfs
manifest=$(jq -r '.manifests[0].digest' "$run/oci/index.json" | sed 's/sha256://')
config=$(jq -r '.config.digest' "$run/oci/blobs/sha256/$manifest" | sed 's/sha256://')
entry=$(jq -r '.config.Entrypoint | join(" ")' "$run/oci/blobs/sha256/$config")
[ "$entry" = /usr/bin/fuselink-agent ] || fail "entrypoint is '$entry'"
ports=$(jq -r '.config.ExposedPorts | keys | join(" ")' "$run/oci/blobs/sha256/$config")
[ "$ports" = "17350/tcp 17351/tcp" ] || fail "exposed ports are '$ports'"

mount -t proc proc "$root/proc"
in_image() { chroot "$root" "$@"; }
got=$(in_image /usr/bin/fuselink-agent --version)
[ "$got" = "fuselink-agent $version" ] || fail "--version in the image says '$got'"
echo "ok: the image's fuselink-agent --version says '$got'"

# Every agent here runs over mutual TLS: certificates made on this machine
# (scripts/certs.sh), read in the image from /tmp/pki.
for cert in node/img-k node/img-a node/img-b engine/e1 router/r1; do
  "$here/scripts/certs.sh" "$root/tmp/pki" "${cert%/*}" "${cert#*/}"
done
tls() { # KIND NAME: the --tls_* flags of certificate KIND-NAME, as the image sees them
  echo "--tls_cert=/tmp/pki/$1-$2.crt --tls_key=/tmp/pki/$1-$2.key --tls_ca=/tmp/pki/ca.crt"
}

# Kubernetes discovery over the image's libcurl: the agent gets as far as dialling the
# API server.
# shellcheck disable=SC2046  # tls: words
if in_image /usr/bin/fuselink-agent --node=img-k --topology=emulated --nics=1 --loopback_net=63 --gpu=off \
  $(tls node img-k) \
  --handle_socket=/tmp/img-k/img-k.sock --peer_discovery=kubernetes --k8s_service=fl \
  --k8s_namespace=gpu --k8s_api_server=https://127.0.0.1:1 >"$run/k8s.log" 2>&1; then
  fail "discovery against no API server did not fail"
fi
grep -q "GET https://127.0.0.1:1/apis/discovery.k8s.io" "$run/k8s.log" ||
  fail "discovery in the image did not reach its request: $(cat "$run/k8s.log")"
echo "ok: the image's agent dials the API server through libcurl"

# Two agents from the image, on loopback NICs 127.0.61.x and 127.0.62.x, over mutual
# TLS (certificates above).
start() { # NAME NET [PEER]
  rm -f "$root/tmp/$1.json"
  # shellcheck disable=SC2046  # tls: words
  chroot "$root" /usr/bin/fuselink-agent --node="$1" --topology=emulated --loopback_net="$2" --nics=2 $(tls node "$1") \
    --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --handle_socket="/tmp/$1/$1.sock" \
    --ready_file="/tmp/$1.json" --gpu=off ${3:+--peer="$3"} >"$run/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [ -s "$root/tmp/$1.json" ] && return 0
    sleep 0.1
  done
  cat "$run/$1.log"
  fail "agent $1 did not start in the image"
}
grpc() { sed -n 's/.*"grpc":"\([^"]*\)".*/\1/p' "$root/tmp/$1.json"; }
start img-b 62
start img-a 61 "img-b=$(grpc img-b)"
# shellcheck disable=SC2046  # tls: words
in_image /usr/bin/fuselinkctl --agent="$(grpc img-a)" --target_agent="$(grpc img-b)" \
  $(tls router r1) --engine_tls_cert=/tmp/pki/engine-e1.crt \
  --engine_tls_key=/tmp/pki/engine-e1.key \
  --source_socket=/tmp/img-a/img-a.sock --target_socket=/tmp/img-b/img-b.sock --demo_layers=2 \
  --demo_blocks=8 --demo_block_bytes=65536 demo >"$run/demo.out" 2>&1 ||
  { cat "$run/demo.out"; fail "fuselinkctl demo between two agents of the image"; }
grep -q "bytes match" "$run/demo.out" || fail "the tensor's bytes differ at the target"
echo "ok: two agents of the image moved a 1 MiB tensor; bytes match"

export FUSELINK_TLS_CA=/tmp/pki/ca.crt  # fuselink-health checks the agents' certificates
in_image /usr/bin/fuselink-health --address="$(grpc img-a)" >"$run/health.out" ||
  { cat "$run/health.out"; fail "fuselink-health on a serving agent"; }
grep -q SERVING "$run/health.out" || fail "fuselink-health did not say SERVING"
# The helm test's form: every address a name resolves to (here one: localhost, from
# the /etc/hosts a container runtime puts in every container).
echo "127.0.0.1 localhost" >"$root/etc/hosts"
port=$(grpc img-a | sed 's/.*://')
in_image /usr/bin/fuselink-health --all=localhost --port="$port" >"$run/health-all.out" ||
  { cat "$run/health-all.out"; fail "fuselink-health --all"; }
grep -q "1 of 1 agents SERVING" "$run/health-all.out" || fail "fuselink-health --all: $(cat "$run/health-all.out")"
kill "${pids[0]}"
wait "${pids[0]}" 2>/dev/null || true
if in_image /usr/bin/fuselink-health --all=localhost --port="$(grpc img-b | sed 's/.*://')" \
  --timeout_s=1 >"$run/health-all.out"; then
  fail "fuselink-health --all passed with the only agent stopped"
fi
if in_image /usr/bin/fuselink-health --address="$(grpc img-b)" --timeout_s=1 >"$run/health.out"; then
  fail "fuselink-health passed an agent that was stopped"
fi
echo "ok: fuselink-health (--address and the helm test's --all) says SERVING for a live agent and fails for a stopped one"
echo "PASS: image $(du -h "$archive" | cut -f1), runs and moves a tensor"
