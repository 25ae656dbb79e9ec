#!/usr/bin/env bash
# Runs fuselink-sim's scenarios and draws them: docs/bench/sim/paper-curve.png,
# pcie-tree.png and cluster64.png, beside the tables as printed (paper-curve.txt,
# pcie-tree.txt, cluster64.txt), and the all-to-alls past two nodes (alltoall.txt, a
# table only).
# Usage: tools/sim/plot.sh [BUILD_DIR]   (default: build). Needs gnuplot
# (gnuplot-nox: scripts/setup.sh installs it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
sim="$build/tools/sim/fuselink-sim"
out="$root/docs/bench/sim"
command -v gnuplot >/dev/null || { echo "gnuplot missing: apt-get install -y gnuplot-nox" >&2; exit 1; }
[[ -x "$sim" ]] || { echo "no $sim: ninja -C $build fuselink-sim" >&2; exit 1; }
mkdir -p "$out"
dat="$(mktemp -d)"
trap 'rm -rf "$dat"' EXIT

"$sim" --scenario=paper_curve --dat="$dat" | tee "$out/paper-curve.txt"
"$sim" --scenario=cluster64 --dat="$dat" | tee "$out/cluster64.txt"
"$sim" --scenario=pcie_tree --dat="$dat" | tee "$out/pcie-tree.txt"
"$sim" --scenario=alltoall | tee "$out/alltoall.txt"

gnuplot <<GNUPLOT
set terminal pngcairo size 900,560 font "sans,11" noenhanced
set datafile missing "-"
set output "$out/paper-curve.png"
set title "One GPU, 1..8 NICs of 400 Gbit/s: fuselink-sim against the paper"
set xlabel "NICs"
set ylabel "GB/s"
set xrange [0.5:8.5]
set yrange [0:280]
set xtics 1
set grid
set key left top
plot "$dat/paper-curve.dat" using 1:3 with linespoints lw 2 pt 7 title "sim, NVLink 200 GB/s (nominal)", \
     "" using 1:4 with linespoints lw 2 pt 5 title "sim, NVLink 163.1 GB/s (fitted at 6 NICs)", \
     "" using 1:2 with points pt 9 ps 2.5 lc rgb "black" title "paper (1 NIC; 6 NICs; flat after)"

set output "$out/pcie-tree.png"
set title "One GPU, 1..8 NICs of 400 Gbit/s, by what carries the relay (fuselink-sim --scenario=pcie_tree)"
plot "$dat/pcie-tree.dat" using 1:2 with linespoints lw 2 pt 7 title "NVLink 163.1 GB/s (the paper's node)", \
     "" using 1:3 with linespoints lw 2 pt 5 title "no NVLink: relay over PCIe, bridges, socket link", \
     "" using 1:4 with linespoints lw 2 pt 9 title "tensor in host memory (socket 0): bridges, socket link"

set output "$out/cluster64.png"
set terminal pngcairo size 1100,500 font "sans,11" noenhanced
set multiplot layout 1,2 title "64 nodes x 8 GPUs x 8 NICs, disaggregated serving (fuselink-sim --scenario=cluster64)"
unset xlabel
unset xrange
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics nomirror
set grid ytics
set key right top
set title "KV-cache transfer time from arrival (TTFT part)"
set ylabel "ms"
set yrange [0:*]
plot "$dat/cluster64.dat" using 2:xtic(1) title "p50", "" using 3 title "p99"
set title "NICs of the prefill nodes"
set ylabel "utilisation, %"
plot "$dat/cluster64.dat" using 4:xtic(1) title "mean", "" using 5 title "busiest NIC"
unset multiplot
GNUPLOT
echo "wrote $out/paper-curve.png $out/pcie-tree.png $out/cluster64.png"
