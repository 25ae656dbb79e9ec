#!/bin/bash
# Runs the GPU tests and benchmarks on the lent GPU machine, whose image lacks libabsl-dev,
# libgrpc++-dev and prometheus-cpp-dev (so the project does not configure there):
#   here:  tests/gpu/device_carry.sh pack [BUILD_DIR=build-gpu]
#          -> .gpu-carry/ (git-ignored): stripped binaries, the Debian libraries they
#             need, the generated Python package, and iproute2's .deb files
#   there: run tool, carry [".gpu-carry"], command `bash .gpu-carry/run.sh [size_mib]`
#          -> logs under $OUT (env.txt, one .txt per test binary, bench.txt,
#             relay.txt, topo.txt, cluster.txt, disagg.txt); RUN= picks parts:
#             unit,bench,relay,topo,cluster,disagg (the last not by default)
# And for scripts/bench-ab.sh on that machine's 16 quiet cores:
#   here:  tests/gpu/device_carry.sh pack-bench NAME=BUILD_DIR:MODE...
#          -> .bench-carry/: each build's agent and fuselink-bench, their libraries, jq
#   there: carry [".bench-carry"], command `bash .bench-carry/run.sh` (ROUNDS, PARTS as
#          bench-ab.sh takes them) -> the table on stdout and in $OUT/ab.txt
# And for scripts/bench-loopback.sh (fuselink beside iperf3) on those cores:
#   here:  tests/gpu/device_carry.sh pack-loopback [BUILD_DIR=build]
#          -> .loop-carry/: the agent, fuselink-bench, the planner's bench, copy_rate,
#             their libraries, jq, openssl and iperf3
#   there: carry [".loop-carry"], command `bash .loop-carry/run.sh` (ROUNDS as
#          bench-loopback.sh takes it) -> $OUT/loopback.txt, copy_rate.txt, raw/
# Binaries built on Debian 12 (glibc 2.36) run on the machine's Ubuntu 24.04 (glibc 2.39).
set -euo pipefail
top=$(git rev-parse --show-toplevel)

# copy_libs CARRY BINARY...: the Debian libraries the binaries link into CARRY/lib,
# and the build's libstdc++ into CARRY/lib-cxx (used only where the machine's is
# older).
copy_libs() {
  local carry=$1
  shift
  mkdir -p "$carry/lib" "$carry/lib-cxx"
  ldd "$@" | awk '/=>/{print $3}' | sort -u |
    grep -vE 'libc.so|libm.so|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl.so|librt.so' |
    while read -r lib; do cp -L "$lib" "$carry/lib/"; done
  cp -L "$(g++ -print-file-name=libstdc++.so.6)" "$(g++ -print-file-name=libgcc_s.so.1)" \
    "$carry/lib-cxx/"
}

# bench_run_sh CARRY BENCH: the start of CARRY/run.sh, which unpacks the carried .deb
# files and finds the libraries that BENCH (a carried fuselink-bench) runs with.
bench_run_sh() {
  cat >"$1/run.sh" <<RUN
#!/bin/bash
C=\$(cd "\$(dirname "\$0")" && pwd)
mkdir -p /tmp/debs && for f in \$C/*.deb; do dpkg -x "\$f" /tmp/debs; done
export PATH=/tmp/debs/usr/bin:\$PATH
export LD_LIBRARY_PATH=\$C/lib:/tmp/debs/usr/lib/x86_64-linux-gnu
\$C/$2 --help >/dev/null 2>&1 || export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:\$C/lib-cxx
{ nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; uptime; } | tee \$OUT/env.txt
RUN
  chmod +x "$1/run.sh"
}

if [ "${1:-}" = pack-loopback ]; then
  build=${2:-$top/build}
  carry=$top/.loop-carry
  grep -qx '/.loop-carry/' "$top/.git/info/exclude" 2>/dev/null ||
    echo '/.loop-carry/' >>"$top/.git/info/exclude"
  rm -rf "$carry" && mkdir -p "$carry"
  bins=(services/fuselink-agent tools/bench/fuselink-bench tools/bench/fuselink_plan_bench
    tools/bench/copy_rate)
  for b in "${bins[@]}"; do
    mkdir -p "$carry/build/$(dirname "$b")"
    cp "$build/$b" "$carry/build/$b" && strip "$carry/build/$b"
  done
  copy_libs "$carry" "${bins[@]/#/$carry/build/}"
  (cd "$carry" && { apt-get download -q=2 jq libjq1 libonig5 openssl iperf3 libiperf0 \
    libsctp1 2>&1 | grep -v "^W: Download is performed unsandboxed" || true; })
  git -C "$top" rev-parse --short HEAD >"$carry/rev"
  bench_run_sh "$carry" build/tools/bench/fuselink-bench
  cat >>"$carry/run.sh" <<'RUN'
BUILD=$C/build SKIP_BUILD=1 CODE_REV="$(cat $C/rev) (carried build)" \
  bash scripts/bench-loopback.sh 2>&1 | tee $OUT/loopback.txt
mkdir -p $OUT/raw && cp /tmp/fuselink-bench.*/*.jsonl $OUT/raw/ 2>/dev/null
$C/build/tools/bench/copy_rate 3 2>&1 | tee $OUT/copy_rate.txt
RUN
  du -sh "$carry"
  exit 0
fi

if [ "${1:-}" = pack-bench ]; then
  shift
  carry=$top/.bench-carry variants=()
  grep -qx '/.bench-carry/' "$top/.git/info/exclude" 2>/dev/null ||
    echo '/.bench-carry/' >>"$top/.git/info/exclude"
  rm -rf "$carry" && mkdir -p "$carry"
  for v in "$@"; do
    name=${v%%=*} build=${v#*=} mode=${v##*:}
    build=${build%:*}
    for b in services/fuselink-agent tools/bench/fuselink-bench; do
      mkdir -p "$carry/$name/$(dirname "$b")"
      cp "$build/$b" "$carry/$name/$b" && strip "$carry/$name/$b"
    done
    variants+=("$name=.bench-carry/$name:$mode")
  done
  copy_libs "$carry" "$carry"/*/services/fuselink-agent "$carry"/*/tools/bench/fuselink-bench
  (cd "$carry" && { apt-get download -q=2 jq libjq1 libonig5 openssl 2>&1 |
    grep -v "^W: Download is performed unsandboxed" || true; })
  bench_run_sh "$carry" "${variants[0]%%=*}/tools/bench/fuselink-bench"
  cat >>"$carry/run.sh" <<RUN
VARIANTS="\${VARIANTS:-${variants[*]}}" bash scripts/bench-ab.sh 2>&1 | tee \$OUT/ab.txt
RUN
  du -sh "$carry"
  exit 0
fi

[ "${1:-}" = pack ] || {
  echo "usage: $0 pack [BUILD_DIR] | pack-bench NAME=BUILD_DIR:MODE... |" \
    "pack-loopback [BUILD_DIR]" >&2
  exit 2
}
build=${2:-$top/build-gpu}
carry=$top/.gpu-carry
rm -rf "$carry" && mkdir -p "$carry"
for b in gpu_unit_test gpu_test gpu_peer_test gpu_dmabuf_test gpu_verbs_staging_test \
  gpu_relay_bound_test \
  gpu_child gpu_bench; do
  cp "$build/tests/gpu/$b" "$carry/" && strip "$carry/$b"
done
for b in services/fuselink-agent tools/bench/fuselink-relay-bench tools/fuselinkctl/fuselinkctl; do
  cp "$build/$b" "$carry/" && strip "$carry/$(basename "$b")"
done
cp -r "$build/python" "$carry/python"
# The GPU machine has no ip/tc: Debian's iproute2 (and what it links) goes along.
(cd "$carry" && { apt-get download -q=2 iproute2 libbpf1 libmnl0 libxtables12 libelf1 \
  2>&1 | grep -v "^W: Download is performed unsandboxed" || true; })
copy_libs "$carry" "$carry"/gpu_* "$carry"/fuselink-*
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
export PYTHONPATH=$C/python
python3 -c 'import grpc, google.protobuf as p; print("python: grpc", grpc.__version__, "protobuf", p.__version__)' 2>&1 | tee -a $OUT/env.txt
mkdir -p /tmp/debs && for f in $C/*.deb; do dpkg -x "$f" /tmp/debs; done
export PATH=/tmp/debs/sbin:/tmp/debs/usr/sbin:/tmp/debs/usr/bin:/tmp/debs/bin:$PATH
run=${RUN:-unit,bench,relay,topo,cluster}
cd $C
if [[ $run == *unit* ]]; then
  for t in gpu_unit_test gpu_test gpu_peer_test gpu_dmabuf_test gpu_verbs_staging_test \
    gpu_relay_bound_test; do
    ./$t >$OUT/$t.txt 2>&1; echo "$t rc=$?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^GPU |^  P2P|bogus|import of|import with|needs|^dma-buf|^staging|^bench: staging|^path" \
      $OUT/$t.txt | head -40
  done
fi
[[ $run == *bench* ]] && ./gpu_bench ${1:-1024} 2>&1 | tee $OUT/bench.txt
[[ $run == *relay* ]] && ./fuselink-relay-bench 2>&1 | tee $OUT/relay.txt
if [[ $run == *topo* ]]; then
  # Discovery with the real driver, as the agent sees the node; then, for each
  # CUDA_VISIBLE_DEVICES form, the driver's answer (fuselinkctl, CUDA probe) beside
  # discovery's own reading of the variable (the agent with --gpu=off: sysfs probe).
  uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
  mkdir -p -m 0700 /tmp/probe-rt
  {
    ./fuselinkctl topology --sysfs_root=/sys --time
    echo "rc=$?"
    for cvd in 0 "${uuid:0:12}" "" 99 MIG-x 0,0 0abc "gpu-${uuid:4:8}" 2abc,0 0,mig-x; do
      # The first GPU row (an empty node lists one placeholder, named none).
      driver=$(CUDA_VISIBLE_DEVICES=$cvd ./fuselinkctl topology --sysfs_root=/sys 2>&1 |
        grep -m1 -A2 -E "^GPUs|error" | tail -1)
      parsed=$(CUDA_VISIBLE_DEVICES=$cvd timeout 5 ./fuselink-agent --node=probe \
        --plaintext --gpu=off --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
        --handle_socket=/tmp/probe-rt/p.sock --runtime_dir=/tmp/probe-rt 2>&1 |
        grep -m1 -A2 -E "^GPUs|error|INVALID|FAILED" | tail -1)
      echo "CUDA_VISIBLE_DEVICES='$cvd': driver: $driver | discovery: $parsed"
    done
  } 2>&1 | tee $OUT/topo.txt
  nvidia-smi topo -m 2>&1 | tee -a $OUT/topo.txt
fi
# The agent with the carried libraries; python and ip with the machine's own.
printf '#!/bin/bash\nLD_LIBRARY_PATH=%s exec %s/fuselink-agent "$@"\n' "$LD_LIBRARY_PATH" "$C" \
  >$C/agent.sh && chmod +x $C/agent.sh
if [[ $run == *cluster* ]]; then
  LD_LIBRARY_PATH=/tmp/debs/usr/lib/x86_64-linux-gnu:/tmp/debs/lib/x86_64-linux-gnu \
    BENCH=${BENCH:-1} timeout 420 bash $C/../tests/gpu/gpu_cluster_test.sh $C/agent.sh \
    $C/python 2>&1 | tee $OUT/cluster.txt
fi
if [[ $run == *disagg* ]]; then
  # examples/disagg with transformers' Llama on this GPU: one engine's tokens first
  # (hf_model.py on its own), then token-exact through two agents, pushed, layer by
  # layer and in-node (DISAGG_EXACT=0 skips these); DISAGG_BENCH=1 then the TTFT
  # table on a testbed (bench.sh).
  ex=$C/../examples/disagg
  if [ "${DISAGG_EXACT:-1}" = 1 ]; then
    (cd $ex && timeout 120 python3 -c 'import time; t = time.time()
from engine import reference_generate; from model import PRESETS
print("llama alone:", reference_generate(PRESETS["llama"], [[1, 2, 3], [4, 5, 6, 7]], 4, "cuda"), round(time.time() - t, 1), "s")') 2>&1 | tee $OUT/disagg.txt
    for v in "" LAYER_BY_LAYER=1 IN_NODE=1; do
      echo "== ${v:-pushed whole}"
      env MODEL=llama DEVICE=cuda PROMPTS=${DISAGG_PROMPTS:-16} MAX_LEN=${DISAGG_MAX_LEN:-1024} \
        BLOCKS=1024 $v timeout 300 bash $ex/run.sh $C/agent.sh $C/python 2>&1 | grep -v '^{'
    done 2>&1 | tee -a $OUT/disagg.txt
  fi
  if [ "${DISAGG_BENCH:-0}" = 1 ]; then
    LD_LIBRARY_PATH=/tmp/debs/usr/lib/x86_64-linux-gnu:/tmp/debs/lib/x86_64-linux-gnu \
      OUT_DIR=$OUT/disagg-bench timeout 560 bash $ex/bench.sh $C/agent.sh $C/python 2>&1 |
      tee $OUT/disagg-bench.txt
  fi
fi
RUN
chmod +x "$carry/run.sh"
du -sh "$carry"
