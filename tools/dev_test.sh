#!/usr/bin/env bash
# Fast single-file edit/compile/run loop for developers (CMake builds everything; this builds one
# test file). Usage: tools/dev_test.sh tests/unit/test_x.cpp [Catch2 arguments...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OLMAX_DEV_DIR:-/tmp/olmax-dev}
mkdir -p "$out"
common=(-std=c++20 -fopenmp -I"$root/include" -I"$root/tests" -isystem /usr/include/eigen3)
if [ ! -f "$out/catch_main.o" ]; then
  g++ "${common[@]}" -O1 -c "$root/tests/catch_main.cpp" -o "$out/catch_main.o.$$"
  mv "$out/catch_main.o.$$" "$out/catch_main.o"
fi
src=$1; shift
name=$(basename "$src" .cpp)
g++ "${common[@]}" ${OLMAX_DEV_FLAGS:--O1 -g} -Wall -Wextra -Wpedantic -Werror -Wno-use-after-free "$src" "$out/catch_main.o" -o "$out/$name"
"$out/$name" "$@"
