#!/usr/bin/env bash
# Builds olmax's benchmark programs for another x86-64 Linux machine, one without olmax's Debian
# packages (a cloud host with a GPU, say), and bundles them with what they load that such a machine
# may lack: oneDNN (Debian's 2.6 and, where tools/setup_onednn3.sh can fetch it, 3.2), GNU OpenMP,
# OpenCL's loader (Debian's oneDNN links it) and the default training corpus (fortunes).
#
#     bash tools/bundle_benchmarks.sh [DEST]      # default DEST: bundle/ in this checkout (git-ignored)
#
# DEST/build has a build folder's layout, so the benchmark scripts take it as their build folder on
# the other machine, from a checkout of the same commit. The programs find the bundled libraries
# through their RPATH (relative to themselves), so nothing else on that machine is affected:
#     benchmarks/train_step/variants.sh "onednn2.6=bundle/build/benchmarks/train_step/train_step --precision bf16" \
#                                       "onednn3.2=bundle/onednn3/train_step --precision bf16"
#     DATA=bundle/fortunes CUDA_PLUGIN=... benchmarks/xla/gpu_figures.sh bundle/build
# Environment: MARCH (the target's -march, default x86-64-v3: AVX2, which every x86-64 server of
# the last decade has; sapphirerapids for an AMX Xeon), JOBS (build parallelism, default nproc),
# ARCHIVE=1 (also DEST.tar.xz, ~20 MB: the libraries make DEST ~90 MB), PROGRAMS (which of
# train_lm, train_step, bench_xla_scan_bandwidth and bench_xla_selective_scan to build and bundle;
# default all), WITH_CPU_PLUGIN=1 (also the xla-cpu-pjrt plugin of .venv, stripped, as
# DEST/lib/xla_cpu_pjrt.so: gpu_figures.sh's CPU-plugin part then runs on the GPU's host; 180 MB,
# ~35 MB in the archive).
# For a machine that takes at most 64 MiB along (the project's device machine), the XLA step of
# every block through the GPU's and the CPU's plugins needs only this (an archive of ~44 MB):
#     ARCHIVE=1 PROGRAMS=train_lm WITH_CPU_PLUGIN=1 bash tools/bundle_benchmarks.sh
# The build trees are build-bundle/ and build-bundle-onednn3/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dest=${1:-$root/bundle}
case "$dest" in /*) ;; *) dest="$root/$dest" ;; esac
march=${MARCH:-x86-64-v3} jobs=${JOBS:-$(nproc)}
# RPATH: DEST/lib seen from DEST/build/examples, DEST/build/benchmarks/* and DEST/onednn3, and the
# program's own folder.
common=(-DCMAKE_BUILD_TYPE=Release -DOLMAX_NATIVE=OFF "-DCMAKE_CXX_FLAGS=-march=$march -Wno-maybe-uninitialized"
        -DOLMAX_BUILD_TESTS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
        '-DCMAKE_BUILD_RPATH=$ORIGIN/../../lib;$ORIGIN/../../../lib;$ORIGIN/../lib;$ORIGIN'
        -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags)  # RPATH, not RUNPATH: also for libdnnl's own needs (OpenCL)
cmake -S . -B build-bundle "${common[@]}" > /dev/null
folder_of() {  # a program's folder in a build tree
  case "$1" in
    train_lm) echo examples ;;
    train_step) echo benchmarks/train_step ;;
    bench_xla_scan_bandwidth | bench_xla_selective_scan) echo benchmarks/xla ;;
    *) echo "bundle_benchmarks: PROGRAMS names '$1'; choose among train_lm, train_step, bench_xla_scan_bandwidth, bench_xla_selective_scan" >&2
       return 1 ;;
  esac
}
targets=()
known=$(cmake --build build-bundle --target help)
for program in ${PROGRAMS:-train_lm train_step bench_xla_scan_bandwidth bench_xla_selective_scan}; do
  folder_of "$program" > /dev/null || exit 1
  # the XLA benchmarks exist where olmax::pjrt is defined (the PJRT header found)
  if grep -qw "$program" <<< "$known"; then targets+=("$program"); else echo "bundle_benchmarks: no target $program here; bundled without it" >&2; fi
done
[ ${#targets[@]} -gt 0 ] || { echo "bundle_benchmarks: nothing to build" >&2; exit 1; }
cmake --build build-bundle --parallel "$jobs" --target "${targets[@]}"

rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/fortunes"
bundled=()
for program in "${targets[@]}"; do
  folder=$(folder_of "$program")
  mkdir -p "$dest/build/$folder"
  strip --strip-unneeded -o "$dest/build/$folder/$program" "build-bundle/$folder/$program"
  bundled+=("$dest/build/$folder/$program")
done
# The shared libraries they load beyond the C and C++ runtimes, under their sonames.
ldd "${bundled[@]}" | awk '/=> \// {print $1, $3}' | sort -u |
  grep -E '^lib(dnnl|gomp|OpenCL)\.so' | while read -r soname path; do cp -L "$path" "$dest/lib/$soname"; done
if [ -d /usr/share/games/fortunes ]; then cp -r /usr/share/games/fortunes/. "$dest/fortunes/"; fi
if [ "${WITH_CPU_PLUGIN:-0}" = 1 ]; then  # the wheel's plugin is not stripped: 259 -> 183 MB
  cpu_plugin=$(ls "$root"/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so 2> /dev/null | head -1 || true)
  [ -n "$cpu_plugin" ] || { echo "bundle_benchmarks: WITH_CPU_PLUGIN=1 but no CPU plugin in .venv; run tools/setup_jax_venv.sh" >&2; exit 1; }
  strip --strip-unneeded -o "$dest/lib/xla_cpu_pjrt.so" "$cpu_plugin"
fi

# train_step against oneDNN 3.2 as well, where it can be fetched; libdnnl.so.3 goes beside it.
if [[ " ${targets[*]} " != *" train_step "* ]]; then
  :  # no train_step bundled
elif onednn3=$(bash tools/setup_onednn3.sh --cmake-flags 2> /dev/null); then
  # shellcheck disable=SC2086  # the flags split at spaces
  cmake -S . -B build-bundle-onednn3 "${common[@]}" $onednn3 > /dev/null
  cmake --build build-bundle-onednn3 --parallel "$jobs" --target train_step
  mkdir -p "$dest/onednn3"
  cp build-bundle-onednn3/benchmarks/train_step/train_step "$dest/onednn3/"
  cp -L "$root/third_party_local/onednn-3.2/lib/libdnnl.so.3" "$dest/onednn3/"
  strip --strip-unneeded "$dest/onednn3/libdnnl.so.3"  # PyPI's is not stripped: 54 -> 44 MB
else
  echo "bundle_benchmarks: oneDNN 3.2 not fetched (tools/setup_onednn3.sh failed); bundled without it" >&2
fi
echo "bundle_benchmarks: $(du -sh "$dest" | cut -f1) in $dest (-march=$march)"
if [ "${ARCHIVE:-0}" = 1 ]; then  # one file to copy: unpack with mkdir DEST && tar -xJf DEST.tar.xz -C DEST
  tar -cf - -C "$dest" . | xz -T0 -6 > "$dest.tar.xz"
  echo "bundle_benchmarks: $(du -sh "$dest.tar.xz" | cut -f1) in $dest.tar.xz"
fi
