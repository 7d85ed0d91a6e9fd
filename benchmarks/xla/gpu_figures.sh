#!/usr/bin/env bash
# Issue 36's GPU figures in one command, on a machine with an NVIDIA GPU and JAX's CUDA PJRT plugin
# (pip: jax-cuda13-pjrt): the main job's step through the CUDA plugin for every block (compile time
# and ms/step, benchmarks/xla/step_time.sh with NATIVE=0), the traced scan's bandwidth against a copy
# (bench_xla_scan_bandwidth), Mamba's selective scan in its CPU (loop over time) and GPU
# (materialised doubling) forms (bench_xla_selective_scan), the small steps with every layer kept,
# and, when CPU_PLUGIN names the xla-cpu-pjrt plugin, the same steps through it on the same host.
#
#     cmake --build build --target train_lm bench_xla_scan_bandwidth bench_xla_selective_scan
#     CUDA_PLUGIN=<.../jax_plugins/xla_cuda13/xla_cuda_plugin.so> benchmarks/xla/gpu_figures.sh [build] [out]
# On a GPU host without olmax's Debian packages: `tools/bundle_benchmarks.sh` here, then
# `DATA=bundle/fortunes benchmarks/xla/gpu_figures.sh bundle/build` there.
#
# Environment: CUDA_PLUGIN (default: the one beside the python3 on PATH), CPU_PLUGIN (optional),
# DATA (train_lm --data; default its own corpus), BUDGET_S (the whole run's seconds, default 600:
# every part has its own time limit, cut to what is left; a failed part does not stop the rest).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
results_name=gpu-figures default_budget=600
source "$here/gpu_parts.sh"  # out, cuda, budget, part
grep -m1 "model name" /proc/cpuinfo; nproc

step_time=("$here/step_time.sh" "$build")  # with NATIVE=0: the plugin's runs only
part "cuda plugin, tiny and small" 240 env OUT="$out/cuda_tiny_small" PLUGIN="$cuda" NATIVE=0 REPEATS=1 STEPS=60 \
  SHAPES="64:2:8:64 128:4:16:128" "${step_time[@]}"
part "scan bandwidth" 60 "$build/benchmarks/xla/bench_xla_scan_bandwidth" --plugin="$cuda" --rows=65536 --steps=1024 --runs=10
part "selective scan, T 1024" 60 "$build/benchmarks/xla/bench_xla_selective_scan" --plugin="$cuda" --batch=16 --steps=1024 --channels=256 --states=16
part "cuda plugin, base" 150 env OUT="$out/cuda_base" PLUGIN="$cuda" NATIVE=0 REPEATS=1 STEPS=20 SHAPES="256:8:16:256" "${step_time[@]}"
# XLA keeps every layer's activations (--kept_layers: a forward loop that stores what the backward
# reads, instead of rebuilding each layer): on the CPU plugin it did not pay (RESULTS.md "Kept layers
# on XLA"); whether it pays where the recompute is a larger share of a step, on a GPU, is measured here.
part "cuda plugin, small, every layer kept" 150 env OUT="$out/cuda_small_kept" PLUGIN="$cuda" NATIVE=0 REPEATS=1 STEPS=60 \
  SHAPES="128:4:16:128" XLA_ARGS=--kept_layers=64 "${step_time[@]}"
[ -n "${CPU_PLUGIN:-}" ] && part "cpu plugin, tiny and small" 150 env OUT="$out/cpu_tiny_small" PLUGIN="$CPU_PLUGIN" NATIVE=0 REPEATS=1 \
  STEPS=20 SHAPES="64:2:8:64 128:4:16:128" "${step_time[@]}"
echo "gpu_figures.sh: done in ${SECONDS} s; results in $out"
