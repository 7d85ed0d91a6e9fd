#!/usr/bin/env bash
# A/B: the same benchmarks from two builds (e.g. main before and after a change), interleaved
# A, B, A, B, ... so that machine load hits both alike, each measurement in a fresh process.
# Writes every raw result and, per figure, the median of B / A over the rounds (> 1: B faster for
# throughputs; the script states the direction of each figure).
#
#     benchmarks/ab/run.sh OLD_BUILD NEW_BUILD [OUT.json]      # build folders with the benchmark targets
#     ROUNDS=3 QUICK=1 benchmarks/ab/run.sh ...                # fewer / smaller measurements
#
# Figures: bench_core (olmax matmul 1024^3 FLOP/s; fused map chain and map_into GB/s; Eigen GEMM and
# STREAM triad as controls), scan_strategies --quick --no-peers (every row's forward / backward
# time), train_step (default, deep, deep-long models; 1 and 2 threads; tokens/s).
set -euo pipefail
old=${1:?usage: run.sh OLD_BUILD NEW_BUILD [OUT.json]}
new=${2:?usage: run.sh OLD_BUILD NEW_BUILD [OUT.json]}
out=${3:-ab.json}
rounds=${ROUNDS:-4}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "A = $old, B = $new, $rounds rounds; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); nproc $(nproc)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
train_configs=("default 8 64 64 2" "deep 8 64 64 16" "deep-long 8 256 64 16")
[ -n "${QUICK:-}" ] && train_configs=("default 8 64 64 2")
for round in $(seq 1 "$rounds"); do
  for side in A B; do
    build=$old; [ "$side" = B ] && build=$new
    tag="$scratch/r${round}_${side}"
    "$build/benchmarks/bench_core" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_out="${tag}_core.json" --benchmark_out_format=json > /dev/null
    "$build/benchmarks/scan/scan_strategies" --quick --no-peers --json "${tag}_scan.json" > /dev/null
    for cfg in "${train_configs[@]}"; do
      read -r name b s f d <<< "$cfg"
      for threads in 1 2; do
        "$build/benchmarks/train_step/train_step" --batch "$b" --sequence "$s" --features "$f" --depth "$d" --threads "$threads" \
          --max_seconds 8 --json "${tag}_train_${name}_t${threads}.json" > /dev/null
      done
    done
  done
  echo "round $round done, load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
python3 "$(dirname "$0")/summarize.py" "$scratch" "$rounds" "$out"
