#!/usr/bin/env bash
# olmax's fp32 training step with its GEMMs on oneDNN (the default where built with olmax::onednn)
# against Eigen's (the backend's own), in one run (train_step/variants.sh: --fp32_gemm onednn and
# eigen in turn, REPEATS times each per shape and thread count); prints the medians side by side
# ("eigen speed-up" < 1: oneDNN faster) and writes OUT/results.json with the CPU model and the load
# average.
#
#     cmake --build build --target train_step
#     benchmarks/train_step/fp32_gemm.sh [build]
#
# Environment: as train_step/variants.sh (SHAPES, THREADS, REPEATS, MAX_SECONDS, OUT; default OUT
# benchmarks/results/fp32-gemm-<UTC time>, git-ignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
bin="$build/benchmarks/train_step/train_step"
[ -x "$bin" ] || { echo "train_step/fp32_gemm.sh: no $bin; build it: cmake --build $build --target train_step" >&2; exit 1; }
probe=$("$bin" --features 16 --depth 1 --batch 1 --sequence 16 --max_seconds 0 --json /dev/stdout 2>/dev/null || true)
grep -q '"fp32_gemm": "onednn' <<< "$probe" || { echo "train_step/fp32_gemm.sh: this train_step has no oneDNN (built without olmax::onednn)" >&2; exit 1; }
export OUT="${OUT:-$repo/benchmarks/results/fp32-gemm-$(date -u +%Y%m%dT%H%M%SZ)}"
exec "$here/variants.sh" "onednn=$bin --fp32_gemm onednn" "eigen=$bin --fp32_gemm eigen"
