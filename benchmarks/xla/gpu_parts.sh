# Sourced by the GPU benchmark scripts (gpu_figures.sh, gpu_scan_forms.sh) after build_folder.sh,
# with the script's arguments: sets `out` (the script's second argument, or
# benchmarks/results/<results_name>-<UTC time>; created), `cuda` (CUDA_PLUGIN, or JAX's CUDA PJRT
# plugin beside the python3 on PATH; exits when there is none) and defines `part`, which runs one
# part of a run within the script's time budget (`budget`: BUDGET_S, or the script's
# `default_budget`).
out="${2:-$repo/benchmarks/results/${results_name:-gpu}-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
cuda="${CUDA_PLUGIN:-$(python3 -c 'import glob, site
hits = [h for p in site.getsitepackages() for h in glob.glob(p + "/jax_plugins/xla_cuda*/xla_cuda_plugin.so")]
print(hits[0] if hits else "")' 2>/dev/null)}"
[ -n "$cuda" ] || { echo "$(basename "$0"): no CUDA plugin; set CUDA_PLUGIN" >&2; exit 1; }
budget=${BUDGET_S:-${default_budget:-480}}
part() {  # part NAME LIMIT_S COMMAND...: runs COMMAND under a time limit unless the budget is spent
  local name=$1 limit=$2; shift 2  # (its own lines go to stderr: stdout is the command's alone)
  if [ "$SECONDS" -ge "$budget" ]; then echo "== $name: skipped (budget of $budget s spent)" >&2; return; fi
  [ "$limit" -le $((budget - SECONDS)) ] || limit=$((budget - SECONDS))  # the whole run ends within the budget
  echo "== $name (at ${SECONDS} s, limit $limit s)" >&2
  timeout "$limit" "$@" || echo "== $name: exit $?" >&2
}
echo "$(basename "$0"): CUDA plugin $cuda"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
