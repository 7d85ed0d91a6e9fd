# Sourced by the benchmark scripts with their first argument (`source .../build_folder.sh "${1:-}"`):
# sets `repo` (this checkout) and `build` (the build folder: the argument, a relative path taken
# from the checkout, default <repo>/build).
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
# A folder configured by tools/test.sh compiles the benchmarks at -O0 (OLMAX_BENCHMARKS_SMOKE_ONLY):
# figures from it would mean nothing, so only smoke runs (QUICK=1) may use it.
if [ -f "$build/CMakeCache.txt" ] && grep -q '^OLMAX_BENCHMARKS_SMOKE_ONLY:BOOL=ON' "$build/CMakeCache.txt" && [ "${QUICK:-0}" != 1 ]; then
  echo "$(basename "$0"): $build compiles the benchmarks at -O0 (OLMAX_BENCHMARKS_SMOKE_ONLY=ON, as tools/test.sh configures it); name another build folder (e.g. build-bench) or reconfigure this one with -DOLMAX_BENCHMARKS_SMOKE_ONLY=OFF" >&2
  exit 2
fi
