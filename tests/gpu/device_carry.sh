#!/bin/bash
# Runs the GPU tests and gpu_bench on the lent GPU machine, whose image lacks libabsl-dev,
# libgrpc++-dev and prometheus-cpp-dev (so the project does not configure there):
#   here:  tests/gpu/device_carry.sh pack [BUILD_DIR=build-gpu]
#          -> .gpu-carry/ (git-ignored): stripped binaries + the Debian abseil libraries
#   there: run tool, carry [".gpu-carry"], command `bash .gpu-carry/run.sh [size_mib]`
#          -> logs under $OUT (env.txt, one .txt per test binary, bench.txt)
# Binaries built on Debian 12 (glibc 2.36) run on the machine's Ubuntu 24.04 (glibc 2.39).
set -euo pipefail
[ "${1:-}" = pack ] || { echo "usage: $0 pack [BUILD_DIR]" >&2; exit 2; }
top=$(git rev-parse --show-toplevel)
build=${2:-$top/build-gpu}
carry=$top/.gpu-carry
exclude=$(git -C "$top" rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-carry/' "$exclude" 2>/dev/null || echo '/.gpu-carry/' >>"$exclude"
rm -rf "$carry" && mkdir -p "$carry/lib" "$carry/lib-cxx"
for b in gpu_unit_test gpu_test gpu_peer_test gpu_child gpu_bench; do
  cp "$build/tests/gpu/$b" "$carry/" && strip "$carry/$b"
done
ldd "$carry"/gpu_* | awk '/=>/{print $3}' | sort -u |
  grep -vE 'libc.so|libm.so|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl.so|librt.so' |
  while read -r lib; do cp -L "$lib" "$carry/lib/"; done
# Used only where the machine's libstdc++ is older than the build's.
cp -L "$(g++ -print-file-name=libstdc++.so.6)" "$(g++ -print-file-name=libgcc_s.so.1)" \
  "$carry/lib-cxx/"
cat >"$carry/run.sh" <<'RUN'
#!/bin/bash
C=$(cd "$(dirname "$0")" && pwd)
{ head -2 /etc/os-release; ldd --version | head -1; nvidia-smi -L; which cmake ninja nvcc
  for p in libabsl-dev libgtest-dev libbenchmark-dev libgrpc++-dev libprotobuf-dev \
    prometheus-cpp-dev libibverbs-dev; do
    dpkg -s $p >/dev/null 2>&1 && echo "$p: installed" || echo "$p: missing"; done
} >$OUT/env.txt 2>&1
cat $OUT/env.txt
export LD_LIBRARY_PATH=$C/lib
if ! $C/gpu_unit_test --gtest_list_tests >/dev/null 2>&1; then
  echo "using carried libstdc++"; export LD_LIBRARY_PATH=$C/lib:$C/lib-cxx; fi
cd $C
for t in gpu_unit_test gpu_test gpu_peer_test; do
  ./$t >$OUT/$t.txt 2>&1; echo "$t rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^GPU |^  P2P|bogus|import of|import with|needs" \
    $OUT/$t.txt | head -40
done
./gpu_bench ${1:-1024} 2>&1 | tee $OUT/bench.txt
RUN
chmod +x "$carry/run.sh"
du -sh "$carry"
