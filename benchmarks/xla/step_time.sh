#!/usr/bin/env bash
# Step time of the main job's model on the whole-step XLA path against olmax's native CPU backend,
# at the same shapes, in one run: train_lm --device=xla (the xla-cpu-pjrt CPU plugin) and
# train_lm --device=cpu, alternating, REPEATS times each per shape; ms/step is train_lm's own
# figure (training steps only: no evaluation, checkpoint or compile time).
#
#     cmake --build build --target train_lm
#     benchmarks/xla/step_time.sh [build]
#
# Environment: SHAPES (space-separated "features:depth:batch:sequence", default the main job's
# 64:2:8:64 and the small preset 128:4:16:128; the base preset 256:8:16:256 takes ~3 s per native
# step on 2 cores, so RESULTS.md ran it alone with STEPS=10), STEPS (per run, 100), REPEATS (3),
# THREADS (the native run's threads, 2), OUT (default benchmarks/results/xla-step-time-<UTC time>,
# git-ignored), PLUGIN (default: the wheel's plugin in .venv). Writes results.json and prints a
# markdown table with the CPU model and the load average.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
train_lm="$build/examples/train_lm"
[ -x "$train_lm" ] || { echo "xla/step_time.sh: no $train_lm; build it: cmake --build $build --target train_lm" >&2; exit 1; }
plugin="${PLUGIN:-$(ls "$repo"/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so 2>/dev/null | head -1)}"
[ -n "$plugin" ] || { echo "xla/step_time.sh: no CPU plugin; run tools/setup_jax_venv.sh or set PLUGIN" >&2; exit 1; }
shapes="${SHAPES:-64:2:8:64 128:4:16:128}"
steps="${STEPS:-100}" repeats="${REPEATS:-3}" threads="${THREADS:-2}"
out="${OUT:-$repo/benchmarks/results/xla-step-time-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: > "$out/runs.txt"
for shape in $shapes; do
  IFS=: read -r f d b s <<< "$shape"
  for r in $(seq "$repeats"); do
    for device in cpu xla; do
      dir="$out/run-$device-$f-$d-$b-$s-$r"
      "$train_lm" --device=$device --xla_plugin="$plugin" --threads="$threads" --features="$f" --depth="$d" --batch="$b" --sequence="$s" \
        --steps="$steps" --eval_every=100000 --checkpoint_every=100000 --plot=false --sample_bytes=0 --checkpoint_dir="$dir" > "$dir.log" 2>&1 \
        || { cat "$dir.log"; exit 1; }
      ms=$(sed -n 's/.*tokens\/s, \([0-9.]*\) ms\/step.*/\1/p' "$dir.log")
      compile=$(sed -n 's/.*step compiled in \([0-9.]*\) s.*/\1/p' "$dir.log")
      echo "$shape $device $r $ms ${compile:-0}" | tee -a "$out/runs.txt"
      rm -rf "$dir"
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$load_before" "$load_after" "$threads" "$steps" <<'PY'
import json, statistics, sys
out, before, after, threads, steps = sys.argv[1:6]
rows = {}
for line in open(f"{out}/runs.txt"):
    shape, device, _, ms, compile_s = line.split()
    rows.setdefault(shape, {}).setdefault(device, []).append((float(ms), float(compile_s)))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"\nCPU {cpu}; load average {before} -> {after}; native CPU backend on {threads} threads; {steps} steps per run; medians\n")
print("| features x depth, batch x sequence | native CPU ms/step | XLA CPU plugin ms/step | XLA / native | XLA compile s |")
print("|---|---:|---:|---:|---:|")
summary = []
for shape, by in rows.items():
    f, d, b, s = shape.split(":")
    native = statistics.median(m for m, _ in by["cpu"])
    xla = statistics.median(m for m, _ in by["xla"])
    compile_s = statistics.median(c for _, c in by["xla"])
    print(f"| {f} x {d}, {b} x {s} | {native:.2f} | {xla:.2f} | {xla / native:.2f} | {compile_s:.2f} |")
    summary.append({"features": int(f), "depth": int(d), "batch": int(b), "sequence": int(s), "native_ms_median": native,
                    "xla_ms_median": xla, "xla_compile_s_median": compile_s, "native_ms": [m for m, _ in by["cpu"]],
                    "xla_ms": [m for m, _ in by["xla"]]})
json.dump({"cpu": cpu, "load_before": before, "load_after": after, "threads": int(threads), "steps": int(steps), "rows": summary},
          open(f"{out}/results.json", "w"), indent=1)
PY
echo "xla/step_time.sh: results in $out"
