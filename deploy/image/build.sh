#!/bin/bash
# Builds the agent's container image offline from Debian 12 packages: no base image is
# pulled. mmdebstrap assembles a root file system of Debian's packages (the runtime
# libraries the binaries link, from runtime-packages.txt) and the built binaries;
# umoci writes it as an OCI image layout, archived as one tar (oci-archive).
#
# Usage: deploy/image/build.sh [OUT_DIR]   (default build/image)
#   BUILD_DIR   where the binaries are (build)
#   IMAGE_TAG   the tag (the agent's version)
# Writes OUT_DIR/fuselink-agent-TAG.oci.tar and leaves OUT_DIR/rootfs (what the image
# holds, for smoke tests). Load it with:
#   skopeo copy oci-archive:OUT_DIR/fuselink-agent-TAG.oci.tar docker-daemon:fuselink/fuselink-agent:TAG
#   podman load -i OUT_DIR/fuselink-agent-TAG.oci.tar
# Needs root, mmdebstrap and umoci (scripts/setup-k8s-tools.sh image) and the Debian
# mirror this machine's apt uses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${BUILD_DIR:-$repo/build}
out=$(mkdir -p "${1:-$repo/build/image}" && cd "${1:-$repo/build/image}" && pwd)
"$repo/scripts/setup-k8s-tools.sh" image

agent="$build/services/fuselink-agent"
ctl="$build/tools/fuselinkctl/fuselinkctl"
for b in "$agent" "$ctl"; do
  [ -x "$b" ] || { echo "build: $b is missing (run scripts/build.sh)" >&2; exit 1; }
done
tag=${IMAGE_TAG:-$("$agent" --version | awk '{print $2}')}

. "$repo/scripts/lib/debian-mirror.sh"
mirror=$(debian_mirror)

packages=$(grep -v '^#' "$here/runtime-packages.txt" | xargs | tr ' ' ',')
rootfs=$out/rootfs
rm -rf "$rootfs" "$out/oci" "$out/bundle"
echo "image: assembling the root file system from Debian bookworm"
# Essential packages plus the runtime ones; no documentation, manuals or locales.
# shellcheck disable=SC2016  # the hook's $1 (the root) is mmdebstrap's to expand
mmdebstrap --quiet --variant=essential --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
  bookworm "$rootfs" "deb $mirror bookworm main"
install -m 0755 "$agent" "$ctl" "$here/fuselink-health" "$rootfs/usr/bin/"
strip --strip-debug "$rootfs/usr/bin/fuselink-agent" "$rootfs/usr/bin/fuselinkctl"
# shellcheck disable=SC2174  # only run/fuselink is meant private; run/ is the image's own
mkdir -p "$rootfs/etc/fuselink" && mkdir -p -m 0700 "$rootfs/run/fuselink"
# Every library the binaries load is in the image.
if chroot "$rootfs" ldd /usr/bin/fuselink-agent /usr/bin/fuselinkctl | grep 'not found'; then
  echo "build: the image lacks libraries: add their packages to runtime-packages.txt" >&2
  exit 1
fi

echo "image: writing the OCI image fuselink/fuselink-agent:$tag"
umoci init --layout "$out/oci"
umoci new --image "$out/oci:$tag"
umoci unpack --image "$out/oci:$tag" "$out/bundle" >/dev/null
rmdir "$out/bundle/rootfs"
mv "$rootfs" "$out/bundle/rootfs"
umoci repack --image "$out/oci:$tag" "$out/bundle"
umoci config --image "$out/oci:$tag" \
  --config.entrypoint=/usr/bin/fuselink-agent \
  --config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env=NVIDIA_DRIVER_CAPABILITIES=compute,utility \
  --config.exposedports=17350/tcp --config.exposedports=17351/tcp \
  --config.workingdir=/ \
  --config.label=org.opencontainers.image.title=fuselink-agent \
  --config.label=org.opencontainers.image.version="$tag" \
  --config.label=org.opencontainers.image.description="fuselink: one agent per GPU node" \
  --history.comment="deploy/image/build.sh: Debian bookworm packages and the fuselink binaries"
umoci gc --layout "$out/oci"
mv "$out/bundle/rootfs" "$rootfs"
rm -rf "$out/bundle"
archive=$out/fuselink-agent-$tag.oci.tar
tar -C "$out/oci" -cf "$archive" .
echo "image: $archive ($(du -h "$archive" | cut -f1)); root file system in $rootfs"
