#!/bin/bash
# Installs the Debian 12 packages fuselink builds, tests and runs with. Idempotent:
# installs only what is missing, and touches apt only then. Needs root (or sudo).
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  clang-format shellcheck python3  # scripts/lint.sh
  ccache  # compiles cached outside the checkout (scripts/lib/ccache.sh)
  clang libclang-rt-14-dev  # the sanitizer and fuzz builds (scripts/sanitize.sh)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libibverbs-dev libcurl4-openssl-dev
  libssl-dev libcrypt-dev openssl  # TLS, HMAC for the fabric handshake, bcrypt; certificates
  libyaml-dev  # the /metrics web-config file
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus iperf3 iproute2 gnuplot-nox curl jq procps
  nftables  # integration_soak_test takes a rail down with a drop rule
  python3-grpcio python3-protobuf
  python3-setuptools python3-wheel python3-pip python3-venv  # the Python client's wheel (python_wheel_test)
  python3-torch  # examples/disagg: the model its engines serve (CPU)
  qemu-system-x86 debootstrap
  dpkg-dev file systemd  # tests/packaging: dpkg-shlibdeps and file (CPack's Depends), systemd-analyze
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}"
$sudo apt-get update -q=2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q=2 --no-install-recommends \
  "${missing[@]}" >/dev/null
