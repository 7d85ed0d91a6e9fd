#!/usr/bin/env bash
# olmax's fp32 training step with its GEMMs on oneDNN (the default where built with olmax::onednn)
# against Eigen's (the backend's own), in one run: train_step --fp32_gemm onednn and eigen,
# alternating, REPEATS times each per shape and thread count; prints the medians side by side and
# writes OUT/results.json with the CPU model and the load average.
#
#     cmake --build build --target train_step
#     benchmarks/train_step/fp32_gemm.sh [build]
#
# Environment: SHAPES (space-separated "features:depth:batch:sequence"; default the main job's
# 64:2:8:64, the small preset 128:4:16:128 and the wide row 512:8:8:256), THREADS ("1 2"), REPEATS
# (3), MAX_SECONDS (timed steps per run, 5), OUT (default benchmarks/results/fp32-gemm-<UTC time>,
# git-ignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
bin="$build/benchmarks/train_step/train_step"
[ -x "$bin" ] || { echo "train_step/fp32_gemm.sh: no $bin; build it: cmake --build $build --target train_step" >&2; exit 1; }
shapes="${SHAPES:-64:2:8:64 128:4:16:128 512:8:8:256}" threads_list="${THREADS:-1 2}" repeats="${REPEATS:-3}"
out="${OUT:-$repo/benchmarks/results/fp32-gemm-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for shape in $shapes; do
  IFS=: read -r f d b s <<< "$shape"
  for threads in $threads_list; do
    for r in $(seq "$repeats"); do
      for gemm in onednn eigen; do
        json="$out/$f-$d-$b-$s-t$threads-$gemm-$r.json"
        "$bin" --features "$f" --depth "$d" --batch "$b" --sequence "$s" --threads "$threads" --fp32_gemm "$gemm" \
          --max_seconds "${MAX_SECONDS:-5}" --json "$json" > "$out/last.log" 2>&1 || { cat "$out/last.log"; exit 1; }
        grep -q '"fp32_gemm": "onednn"' "$json" || [ "$gemm" = eigen ] || { echo "train_step/fp32_gemm.sh: this train_step has no oneDNN (built without olmax::onednn)" >&2; exit 1; }
        echo "$shape threads $threads $gemm: $(grep -o '[0-9.]* ms/step' "$out/last.log")"
      done
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$load_before" "$load_after" <<'PY'
import glob, json, os, statistics, sys
out, before, after = sys.argv[1:4]
runs = {}
for path in glob.glob(f"{out}/*-t*-*-*.json"):
    f, d, b, s, t, gemm, _ = os.path.basename(path)[:-5].split("-")
    row = json.load(open(path))
    runs.setdefault((int(f), int(d), int(b), int(s), int(t[1:])), {}).setdefault(gemm, []).append(row["seconds_median"] * 1e3)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"\nCPU {cpu}; load average {before} -> {after}; medians of each run's median step\n")
print("| features x depth, batch x sequence | threads | oneDNN ms/step | Eigen ms/step | Eigen / oneDNN |")
print("|---|---:|---:|---:|---:|")
rows = []
for key in sorted(runs):
    f, d, b, s, t = key
    onednn, eigen = statistics.median(runs[key]["onednn"]), statistics.median(runs[key]["eigen"])
    print(f"| {f} x {d}, {b} x {s} | {t} | {onednn:.2f} | {eigen:.2f} | {eigen / onednn:.2f} |")
    rows.append({"features": f, "depth": d, "batch": b, "sequence": s, "threads": t, "onednn_ms_median": onednn, "eigen_ms_median": eigen,
                 "eigen_over_onednn": eigen / onednn, "onednn_ms": runs[key]["onednn"], "eigen_ms": runs[key]["eigen"]})
json.dump({"cpu": cpu, "load_before": before, "load_after": after, "rows": rows}, open(f"{out}/results.json", "w"), indent=1)
PY
echo "train_step/fp32_gemm.sh: results in $out"
