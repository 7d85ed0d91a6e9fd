#!/usr/bin/env bash
# olmax's new sequence mixers against their PyTorch references, side by side in one run: builds
# bench_mixers (Release), runs it and peer.py with the same OMP_NUM_THREADS, and writes
# benchmarks/mixers/results_<cpu>.json (every row, the command, the ratios) and prints a table of
# olmax / best-peer ratios.
#
#     benchmarks/quality/setup_torch_venv.sh       # once: PyTorch from PyPI into .venv-torch
#     benchmarks/mixers/run.sh [BUILD_DIR]         # default build/; e.g. build-bench
#
# Environment: OMP_NUM_THREADS (2), RUNS (5 timed runs after 1 warm-up), VARIANTS (peer.py's, default
# eager_fp32,eager_bf16,compile_fp32,compile_bf16), COMPILE_TIMEOUT (seconds per torch.compile row,
# compile included; default 300), ONLY (attention, gated_delta or ssd: that op alone; MEMORY=0 skips the
# memory rows), TORCH_PYTHON (default .venv-torch/bin/python), OUT (the JSON path),
# OLMAX_BF16_GEMM_FORM (amx, dot or rounded: the form of olmax's bf16 rows' products; default the CPU's fastest one).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
torch_python="${TORCH_PYTHON:-$repo/.venv-torch/bin/python}"
"$torch_python" -c "import torch" 2>/dev/null ||
  { echo "run.sh: $torch_python cannot import torch; run benchmarks/quality/setup_torch_venv.sh" >&2; exit 77; }

[ -f "$build/CMakeCache.txt" ] || cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --target bench_mixers -j1

cpu="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1 | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '_' | sed 's/^_*//; s/_*$//')"
out="${OUT:-$here/results_${cpu:-unknown}.json}"
only=(${ONLY:+--only "$ONLY"})
[ "${MEMORY:-1}" = 1 ] || only+=(--no-memory)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "run.sh: OMP_NUM_THREADS=$OMP_NUM_THREADS, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$build/benchmarks/mixers/bench_mixers" --runs "${RUNS:-5}" --json "$tmp/olmax.jsonl" ${only[@]+"${only[@]}"}
"$torch_python" "$here/peer.py" --runs "${RUNS:-5}" --json "$tmp/peer.jsonl" \
  --variants "${VARIANTS:-eager_fp32,eager_bf16,compile_fp32,compile_bf16}" --compile-timeout "${COMPILE_TIMEOUT:-300}" ${only[@]+"${only[@]}"}
/usr/bin/python3 "$here/summarize.py" --out "$out" \
  --command "OMP_NUM_THREADS=$OMP_NUM_THREADS RUNS=${RUNS:-5}${ONLY:+ ONLY=$ONLY}${MEMORY:+ MEMORY=$MEMORY}${OLMAX_BF16_GEMM_FORM:+ OLMAX_BF16_GEMM_FORM=$OLMAX_BF16_GEMM_FORM} benchmarks/mixers/run.sh ${1:-}" "$tmp/olmax.jsonl" "$tmp/peer.jsonl"
