#!/usr/bin/env bash
# The traced linear scan's forms on an NVIDIA GPU through JAX's CUDA PJRT plugin, in one command:
# each form's bandwidth against a copy (bench_xla_scan_bandwidth, 65,536 rows x 1,024 steps), and the main job's
# step for the blocks whose step scans (qrnn; mamba, whose selective scan is one linear scan on
# devices other than the CPU) with the device's default form (doubling) and then with each of
# FORMS, on the same machine (benchmarks/xla/step_time.sh with NATIVE=0 and XLA_ARGS=--xla_scan_form=F).
#
#     cmake --build build --target train_lm bench_xla_scan_bandwidth
#     CUDA_PLUGIN=<.../jax_plugins/xla_cuda13/xla_cuda_plugin.so> benchmarks/xla/gpu_scan_forms.sh [build] [out]
#
# Environment: CUDA_PLUGIN (default: the one beside the python3 on PATH), FORMS (default "hillis_steele_chunked"),
# SHAPES (step_time.sh's, default the small and base presets), BLOCKS (default "qrnn mamba"), STEPS
# (30), DATA (train_lm --data), BUDGET_S (the whole run's seconds, default 420; every part has its
# own time limit, cut to what is left; a failed part does not stop the rest).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
results_name=gpu-scan-forms default_budget=420
source "$here/gpu_parts.sh"  # out, cuda, budget, part
bandwidth="$build/benchmarks/xla/bench_xla_scan_bandwidth"
part "scan bandwidth, 65536 rows x 1024 steps" 60 "$bandwidth" --plugin="$cuda" --rows=65536 --steps=1024 --runs=10 | tee "$out/bandwidth.json"
common=(NATIVE=0 REPEATS=1 STEPS="${STEPS:-30}" BLOCKS="${BLOCKS:-qrnn mamba}" SHAPES="${SHAPES:-128:4:16:128 256:8:16:256}" PLUGIN="$cuda")
part "steps, the device's form" 160 env "${common[@]}" OUT="$out/steps_auto" "$here/step_time.sh" "$build"
for form in ${FORMS:-hillis_steele_chunked}; do
  part "steps, $form" 160 env "${common[@]}" OUT="$out/steps_$form" XLA_ARGS="--xla_scan_form=$form" "$here/step_time.sh" "$build"
done
echo "gpu_scan_forms.sh: done in ${SECONDS} s; results in $out"
