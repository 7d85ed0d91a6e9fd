#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this):
#  1. installs missing Debian packages (tools/install_deps.sh),
#  2. Release build in build-test/ of everything but the unit tests (programs, XLA plugin, distributed,
#     packaging and docs tests, examples, benchmarks) and `ctest -LE slow` (all but the tests labelled
#     slow), as many tests at once as the build's jobs,
#  3. tests/onednn built and run again against oneDNN 3.x in build-onednn3/ (tools/setup_onednn3.sh),
#  4. AddressSanitizer + UndefinedBehaviorSanitizer build of the tests in build-asan/ and its
#     `ctest -LE "slow|packaging|compile_fail"` (those compile-only checks do not depend on sanitizers
#     and already ran in step 2). The unit tests (tests/unit) are compiled and run here only: once,
#     with the sanitizers, instead of in both builds.
# Usage: bash tools/test.sh      (OLMAX_TEST_JOBS=N to change the build parallelism, default nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${OLMAX_TEST_JOBS:-$(nproc)}
start=$SECONDS

bash tools/install_deps.sh

echo "== test: Release build (build-test/)"
# OLMAX_BENCHMARKS_SMOKE_ONLY: the benchmarks at -O0, since here they only have to build and pass
# their seconds-long smoke runs (about 800 s of CPU less than at -O3; benchmarks/CMakeLists.txt).
# A folder of its own, not the main job's build/: the benchmark commands of benchmarks/RESULTS.md
# run build/'s binaries, which must stay fully optimised.
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DOLMAX_BUILD_UNIT_TESTS=OFF -DOLMAX_BENCHMARKS_SMOKE_ONLY=ON
cmake --build build-test --parallel "$jobs"
# --parallel: most tests use one core; those that fill the machine or measure time are RUN_SERIAL.
(cd build-test && ctest --output-on-failure --parallel "$jobs" -LE slow)
echo "== test: Release done after $((SECONDS - start)) s"

# olmax::onednn speaks oneDNN's 2.x API (Debian 12's, used above) and its 3.x API: the oneDNN tests
# again against 3.2 (tools/setup_onednn3.sh, from PyPI; a failed fetch is a warning, not an error).
echo "== test: oneDNN 3.x build of tests/onednn (build-onednn3/)"
if onednn3=$(bash tools/setup_onednn3.sh --cmake-flags); then
  cmake -S . -B build-onednn3 -DCMAKE_BUILD_TYPE=Release -DOLMAX_BUILD_BENCHMARKS=OFF -DOLMAX_BUILD_EXAMPLES=OFF $onednn3
  cmake --build build-onednn3 --parallel "$jobs" --target olmax_onednn_tests
  (cd build-onednn3 && ctest --output-on-failure -L onednn)
else
  echo "test: WARNING: tools/setup_onednn3.sh failed; oneDNN 3.x not tested" >&2
fi

echo "== test: ASan + UBSan build (build-asan/)"
# -g1 (line tables and function names: all a sanitizer report prints) compiles about a third faster than -g.
# The unit tests compile at -O0 in this build (tests/CMakeLists.txt), the programs at -O1.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DOLMAX_SANITIZE=ON \
  -DOLMAX_BUILD_BENCHMARKS=OFF -DOLMAX_BUILD_EXAMPLES=OFF
cmake --build build-asan --parallel "$jobs"
# halt_on_error/abort: any report fails the test; UBSan prints a stack for each report.
# allocator_may_return_null: the tests ask for impossible buffers and expect olmax::allocation_error.
(cd build-asan && OMP_NUM_THREADS=2 \
  ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_stack_use_after_return=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  ctest --output-on-failure --parallel "$jobs" -LE "slow|packaging|compile_fail")
echo "== test: all passed in $((SECONDS - start)) s"
