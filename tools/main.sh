#!/usr/bin/env bash
# The main job: installs missing Debian packages, builds olmax (Release, out of source in build/) with
# the README's ladder of examples (build/examples/quickstart, train_mlp, compare_scans, generate and
# train_lm), and runs the training example build/examples/train_lm when it exists, else the smaller
# example build/examples/train_mlp (a small model fitting sin(x), printing the falling loss).
# Extra arguments are passed to the program. Usage: bash tools/main.sh [args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)

bash tools/install_deps.sh
# The ladder the README walks through (tests/package/check_readme_commands.py reads this list).
ladder=(quickstart train_mlp compare_scans generate train_lm)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
program=train_mlp
targets=$(cmake --build build --target help)  # captured first: grep -q closing a pipe early would trip pipefail
if grep -qw train_lm <<<"$targets"; then program=train_lm; fi
# The programs compile side by side, train_lm first: it is the longest compile (about 3.5 minutes
# on one core), and the others fit beside it on a second core. A Makefile build would run them in
# another order: `cmake --build --target a b c` makes its goals one after another (the top-level
# Makefile is .NOTPARALLEL) and a custom target's dependencies go in an order CMake picks, which
# put train_lm last and made the build ~1.5 minutes longer on 2 cores. So with Makefiles one make
# runs CMake's per-target goals (<folder>/CMakeFiles/<name>.dir/all in CMakeFiles/Makefile2) in
# this order; other generators (Ninja) take the targets as they are.
order=()
for name in "$program" "${ladder[@]}"; do
  if grep -qw "$name" <<<"$targets" && [[ " ${order[*]} " != *" $name "* ]]; then order+=("$name"); fi
done
goals=()
if [ -f build/CMakeFiles/Makefile2 ]; then
  for name in "${order[@]}"; do
    if grep -q "^examples/CMakeFiles/$name.dir/all:" build/CMakeFiles/Makefile2; then goals+=("examples/CMakeFiles/$name.dir/all"); fi
  done
fi
if [ ${#goals[@]} -eq ${#order[@]} ]; then
  make --no-print-directory -C build -f CMakeFiles/Makefile2 -j"$jobs" "${goals[@]}"
else
  cmake --build build --parallel "$jobs" --target "${order[@]}"
fi
echo "main: running build/examples/$program $*"
exec "build/examples/$program" "$@"
