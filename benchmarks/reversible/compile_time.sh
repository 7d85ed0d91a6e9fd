#!/usr/bin/env bash
# Compile time of nn::Stack<Block> at depth 4 vs 256, and of 64 distinct nested / flat layer types.
# Usage: benchmarks/reversible/compile_time.sh [output.json]   (run from anywhere; -O2, one job)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-std=c++20 -O2 -fopenmp -I"$root/include" -isystem /usr/include/eigen3 -Wall -Wextra -Wpedantic -Werror -Wno-use-after-free -c)
seconds() {  # wall seconds of one compile
  local start end
  start=$(date +%s.%N)
  g++ "${flags[@]}" "$1" -o "$work/out.o"
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l | xargs printf '%.2f'
}
for depth in 4 256; do
  sed "s/@DEPTH@/$depth/" "$here/compile_stack.cpp" > "$work/stack_$depth.cpp"
done
stack4=$(seconds "$work/stack_4.cpp")
stack256=$(seconds "$work/stack_256.cpp")
sed "s/@NET@/Nest<0>::type/" "$here/compile_nested.cpp" > "$work/one.cpp"
sed "s/@NET@/Nest<63>::type/" "$here/compile_nested.cpp" > "$work/nested.cpp"
sed "s/@NET@/Flat/" "$here/compile_nested.cpp" > "$work/flat.cpp"
one=$(seconds "$work/one.cpp")
nested=$(seconds "$work/nested.cpp")
flat=$(seconds "$work/flat.cpp")
json=$(printf '{"compiler": "%s", "flags": "-O2", "stack_depth_4_seconds": %s, "stack_depth_256_seconds": %s, "ratio_256_vs_4": %s, "one_layer_seconds": %s, "nested_64_types_seconds": %s, "flat_sequential_64_types_seconds": %s}\n' \
  "$(g++ --version | head -1)" "$stack4" "$stack256" "$(echo "$stack256 / $stack4" | bc -l | xargs printf '%.3f')" "$one" "$nested" "$flat")
echo "$json"
if [ $# -ge 1 ]; then echo "$json" > "$1"; fi
