# shellcheck shell=bash
# Sourced by the build scripts: compiles go through ccache (CMakeLists.txt picks it up
# where it is installed), its cache kept outside the checkout like the VM image and
# the API server ($FUSELINK_CACHE, default /var/cache/fuselink), so that a fresh clone
# on a machine that has built before compiles only what changed. Paths are hashed
# relative to the checkout, so two clones share entries.
if command -v ccache >/dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-${FUSELINK_CACHE:-/var/cache/fuselink}/ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-20G}
  mkdir -p "$CCACHE_DIR" 2>/dev/null || export CCACHE_DIR=$HOME/.cache/fuselink-ccache
fi
