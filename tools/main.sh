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
# The ladder the README walks through (tests/package/check_readme_commands.py reads this list), built
# as one target, olmax_main_job_programs (examples/CMakeLists.txt), so that its programs compile side
# by side: a Makefile build runs the goals of `cmake --build --target a b c` one after another.
ladder=(quickstart train_mlp compare_scans generate train_lm)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "-DOLMAX_MAIN_JOB_TARGETS=$(IFS=';'; echo "${ladder[*]}")"
program=train_mlp
targets=$(cmake --build build --target help)  # captured first: grep -q closing a pipe early would trip pipefail
if grep -qw train_lm <<<"$targets"; then program=train_lm; fi
cmake --build build --target olmax_main_job_programs --parallel "$jobs"
echo "main: running build/examples/$program $*"
exec "build/examples/$program" "$@"
