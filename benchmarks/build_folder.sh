# Sourced by the benchmark scripts with their first argument (`source .../build_folder.sh "${1:-}"`):
# sets `repo` (this checkout) and `build` (the build folder: the argument, a relative path taken
# from the checkout, default <repo>/build).
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
