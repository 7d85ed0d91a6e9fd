#!/usr/bin/env bash
# Threads under contention: the training step (benchmarks/train_step) and scan kernels
# (scan_contention.cpp here) at 1 and 2 threads, while 0, 1 and 2 background `stress-ng --cpu N`
# processes compete for the cores. Each measurement is a fresh process, repeated REPS times; the
# summary gives, per load level and build, the median over the repetitions, their spread (max/min)
# and the 2-thread / 1-thread ratio of the medians (< 1: two threads faster).
#
#     benchmarks/contention/run.sh BUILD [BUILD2 ...]
#
# BUILD: a CMake build folder with the train_step target built (cmake --build BUILD --target
# train_step). The scan program is BUILD/benchmarks/contention/scan_contention when CMake built it,
# else it is compiled here with g++ against the include/ folder next to BUILD's CMakeCache source
# (CMAKE_HOME_DIRECTORY), into BUILD/contention/scan_contention. Several builds (e.g. before/after a
# change) are measured interleaved, so load changes hit them alike.
#
# Environment: OUT (JSON, default benchmarks/contention/results.json), REPS (5), LOADS ("0 1 2"),
# THREADS ("1 2"), STEPS (train_step --repeats, 30), SCAN_REPEATS (scan_contention --repeats, 3),
# WAIT_IDLE (seconds, default 0): before each measurement wait up to this long until no compiler
# (cc1plus) is running, for a shared machine where others build; every run records the 1-minute load
# average and the compilers running when it started.
# Installs stress-ng with apt-get when missing (sudo when not root). The background load is always
# stopped on exit, error or interrupt (trap).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 BUILD [BUILD2 ...]" >&2; exit 2; }
out="${OUT:-$here/results.json}"
reps="${REPS:-5}"
loads=(${LOADS:-0 1 2})
threads_list=(${THREADS:-1 2})
steps="${STEPS:-30}"
scan_repeats="${SCAN_REPEATS:-3}"

if ! command -v stress-ng >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y stress-ng >/dev/null
fi

# Compilers running now (stopped ones not counted).
compilers() { ps -C cc1plus -o stat= 2>/dev/null | grep -vc '^T' || true; }
wait_idle() {
  local waited=0
  while [ "$waited" -lt "${WAIT_IDLE:-0}" ] && [ "$(compilers)" -gt 0 ]; do sleep 1; waited=$((waited + 1)); done
}

stress_pids=()
stop_load() {
  local pid
  # The stressor workers first (children of each stress-ng we started), then stress-ng itself.
  for pid in "${stress_pids[@]}"; do pkill -TERM -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  for pid in "${stress_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  stress_pids=()
}
scratch="$(mktemp -d)"
trap 'stop_load; rm -rf "$scratch"' EXIT
trap 'exit 130' INT TERM

builds=() trains=() scans=()
for b in "$@"; do
  case "$b" in /*) ;; *) b="$PWD/$b" ;; esac
  train="$b/benchmarks/train_step/train_step"
  [ -x "$train" ] || { echo "run.sh: no $train; build it: cmake --build $b --target train_step" >&2; exit 1; }
  scan="$b/benchmarks/contention/scan_contention"
  if [ ! -x "$scan" ]; then
    src="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$b/CMakeCache.txt")"
    scan="$b/contention/scan_contention"
    if [ ! -x "$scan" ] || [ "$here/scan_contention.cpp" -nt "$scan" ]; then
      mkdir -p "$b/contention"
      echo "# compiling $scan against $src/include"
      g++ -std=c++20 -O3 -march=native -fopenmp -Wno-maybe-uninitialized -I"$src/include" -isystem /usr/include/eigen3 \
        "$here/scan_contention.cpp" -o "$scan"
    fi
  fi
  builds+=("$b") trains+=("$train") scans+=("$scan")
done

model="$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "# $(date -u +%FT%TZ) $model, $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg), compilers running: $(compilers)"
start=$SECONDS
for load in "${loads[@]}"; do
  if [ "$load" -gt 0 ]; then
    for ((s = 0; s < load; ++s)); do
      stress-ng --cpu 1 --timeout 1200s --quiet &
      stress_pids+=($!)
    done
    sleep 2
  fi
  for ((rep = 0; rep < reps; ++rep)); do
    for threads in "${threads_list[@]}"; do
      for i in "${!builds[@]}"; do
        tag="$load-$rep-$threads-$i"
        wait_idle
        loadavg="$(cut -d' ' -f1 /proc/loadavg)" ncc="$(compilers)"
        OMP_NUM_THREADS="$threads" "${trains[$i]}" --threads "$threads" --repeats "$steps" --max_seconds 10 \
          --json "$scratch/$tag-train.json" >/dev/null
        OMP_NUM_THREADS="$threads" "${scans[$i]}" --threads "$threads" --repeats "$scan_repeats" --json "$scratch/$tag-scan.json" >/dev/null
        printf '{"build": "%s", "load": %s, "rep": %s, "threads": %s, "loadavg": %s, "compilers": %s}\n' \
          "${builds[$i]}" "$load" "$rep" "$threads" "$loadavg" "${ncc:-0}" >"$scratch/$tag-meta.json"
      done
    done
    echo "# load $load, repetition $((rep + 1))/$reps done ($((SECONDS - start)) s, load average $(cut -d' ' -f1 /proc/loadavg))"
  done
  stop_load
done

/usr/bin/python3 - "$scratch" "$out" "$model" <<'EOF'
import glob, json, os, statistics, sys
scratch, out, model = sys.argv[1:4]
runs = []
for meta in sorted(glob.glob(os.path.join(scratch, "*-meta.json"))):
    base = meta[: -len("-meta.json")]
    m = json.load(open(meta))
    m["train_step"] = json.load(open(base + "-train.json"))
    m["scan"] = json.load(open(base + "-scan.json"))["rows"]
    runs.append(m)
# metric name -> seconds, per run
def metrics(r):
    yield "train_step ms/step", r["train_step"]["seconds_median"] * 1e3
    for row in r["scan"]:
        yield f"{row['strategy']} {row['direction']} [{row['B']},{row['T']},{row['C']}] ms", row["seconds"] * 1e3
table = {}
for r in runs:
    for name, v in metrics(r):
        table.setdefault((r["build"], r["load"], name), {}).setdefault(r["threads"], []).append(v)
summary = []
for (build, load, name), by_threads in sorted(table.items()):
    row = {"build": build, "load": load, "metric": name}
    for t, vs in sorted(by_threads.items()):
        row[f"median_t{t}"] = statistics.median(vs)
        row[f"spread_t{t}"] = max(vs) / min(vs)
    if "median_t1" in row and "median_t2" in row:
        row["ratio_t2_t1"] = row["median_t2"] / row["median_t1"]
    summary.append(row)
loadavg = {}
for r in runs:
    loadavg.setdefault(r["load"], []).append(r["loadavg"])
json.dump({"cpu": model, "runs": runs, "summary": summary}, open(out, "w"), indent=1)
for build in sorted({s["build"] for s in summary}):
    print(f"\n## {build}")
    print(f"{'stress':>6} {'metric':<44} {'t1 median':>10} {'spread':>7} {'t2 median':>10} {'spread':>7} {'t2/t1':>6}")
    for s in summary:
        if s["build"] != build:
            continue
        f = lambda k, fmt: format(s[k], fmt) if k in s else "-"
        print(f"{s['load']:>6} {s['metric']:<44} {f('median_t1', '10.3f')} {f('spread_t1', '7.2f')} {f('median_t2', '10.3f')} "
              f"{f('spread_t2', '7.2f')} {f('ratio_t2_t1', '6.2f')}")
for load, v in sorted(loadavg.items()):
    print(f"stress {load}: load average (1 min) during the runs {min(v):.2f}-{max(v):.2f}; compilers seen in "
          f"{sum(1 for r in runs if r['load'] == load and r['compilers'])} of {sum(1 for r in runs if r['load'] == load)} runs")
print(f"JSON: {out}")
EOF
