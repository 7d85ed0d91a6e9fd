#!/usr/bin/env bash
# The GPU figures in one command, on a machine with an NVIDIA GPU and JAX's CUDA PJRT plugin (pip:
# jax-cuda13-pjrt), in parts: `steps`, the main job's step through the CUDA plugin for each block
# (compile time and ms/step, benchmarks/xla/step_time.sh with NATIVE=0); `scan_bandwidth`, the
# traced scan's bandwidth against a copy (bench_xla_scan_bandwidth); `selective_scan`, Mamba's
# selective scan in its CPU (loop over time) and GPU (materialised doubling) forms
# (bench_xla_selective_scan); `base`, the base preset's step; `kept`, the small step with every
# layer kept; `cpu_steps`, the `steps` part through the xla-cpu-pjrt CPU plugin on the same host.
#
#     cmake --build build --target train_lm bench_xla_scan_bandwidth bench_xla_selective_scan
#     CUDA_PLUGIN=<.../jax_plugins/xla_cuda13/xla_cuda_plugin.so> benchmarks/xla/gpu_figures.sh [build] [out]
# On a GPU host without olmax's Debian packages: `tools/bundle_benchmarks.sh` here, then
# `DATA=bundle/fortunes benchmarks/xla/gpu_figures.sh bundle/build` there.
#
# Environment: CUDA_PLUGIN (default: the one beside the python3 on PATH), CPU_PLUGIN (default the
# bundle's lib/xla_cpu_pjrt.so beside the build folder, when `WITH_CPU_PLUGIN=1
# tools/bundle_benchmarks.sh` put it there; without one, cpu_steps is skipped), DATA (train_lm
# --data; default its own corpus), BUDGET_S (the whole run's seconds, default 600: every part has
# its own time limit, cut to what is left; a failed part does not stop the rest), PARTS (which
# parts run, always in the order above; default all), and step_time.sh's BLOCKS (default the four
# 2023 blocks), SHAPES (of steps and cpu_steps; default tiny and small) and PRECISIONS. For the 2026
# mixers on both plugins, fp32 and bf16, from a bundle unpacked in /tmp/b:
#     PARTS="steps cpu_steps" BLOCKS="mamba2 gated_deltanet attention hybrid" SHAPES=128:4:16:128 \
#       PRECISIONS="fp32 bf16" DATA=/tmp/b/fortunes benchmarks/xla/gpu_figures.sh /tmp/b/build /tmp/figures
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
all_parts="steps scan_bandwidth selective_scan base kept cpu_steps"
parts=" ${PARTS:-$all_parts} "
for p in $parts; do
  case " $all_parts " in *" $p "*) ;; *) echo "gpu_figures.sh: unknown part '$p' in PARTS (choose among: $all_parts)" >&2; exit 1 ;; esac
done
wanted() { [[ "$parts" == *" $1 "* ]]; }
source "$here/../build_folder.sh" "${1:-}"  # repo, build
results_name=gpu-figures default_budget=600
source "$here/gpu_parts.sh"  # out, cuda, budget, part
grep -m1 "model name" /proc/cpuinfo; nproc

step_time=("$here/step_time.sh" "$build")  # with NATIVE=0: the plugin's runs only
source "$here/defaults.sh"  # default_blocks, default_shapes (step_time.sh's)
shapes=${SHAPES:-$default_shapes}
cpu_plugin=${CPU_PLUGIN:-}
[ -z "$cpu_plugin" ] && [ -f "$build/../lib/xla_cpu_pjrt.so" ] && cpu_plugin=$(cd "$build/../lib" && pwd)/xla_cpu_pjrt.so
# about 45 s a run on the GPU (its compile time is most of that), at least 240 s for the part
runs=$(($(wc -w <<< "${BLOCKS:-$default_blocks}") * $(wc -w <<< "$shapes") * $(wc -w <<< "${PRECISIONS:-fp32}")))
wanted steps && part "cuda plugin, $shapes" $((runs * 45 > 240 ? runs * 45 : 240)) env OUT="$out/cuda_steps" PLUGIN="$cuda" NATIVE=0 REPEATS=1 STEPS=60 \
  SHAPES="$shapes" "${step_time[@]}"
wanted scan_bandwidth && part "scan bandwidth" 60 "$build/benchmarks/xla/bench_xla_scan_bandwidth" --plugin="$cuda" --rows=65536 --steps=1024 --runs=10
wanted selective_scan && part "selective scan, T 1024" 60 "$build/benchmarks/xla/bench_xla_selective_scan" --plugin="$cuda" --batch=16 \
  --steps=1024 --channels=256 --states=16
wanted base && part "cuda plugin, base" 150 env OUT="$out/cuda_base" PLUGIN="$cuda" NATIVE=0 REPEATS=1 STEPS=20 SHAPES="256:8:16:256" "${step_time[@]}"
# XLA keeps every layer's activations (--kept_layers: a forward loop that stores what the backward
# reads, instead of rebuilding each layer): on the CPU plugin it did not pay (RESULTS.md "Kept layers
# on XLA"); whether it pays where the recompute is a larger share of a step, on a GPU, is measured here.
wanted kept && part "cuda plugin, small, every layer kept" 150 env OUT="$out/cuda_small_kept" PLUGIN="$cuda" NATIVE=0 REPEATS=1 STEPS=60 \
  SHAPES="128:4:16:128" XLA_ARGS=--kept_layers=64 "${step_time[@]}"
if wanted cpu_steps; then
  if [ -n "$cpu_plugin" ]; then
    part "cpu plugin, $shapes" 150 env OUT="$out/cpu_steps" PLUGIN="$cpu_plugin" NATIVE=0 REPEATS=1 STEPS=20 SHAPES="$shapes" "${step_time[@]}"
  else
    echo "== cpu plugin: skipped (no CPU_PLUGIN)" >&2
  fi
fi
echo "gpu_figures.sh: done in ${SECONDS} s; results in $out"
