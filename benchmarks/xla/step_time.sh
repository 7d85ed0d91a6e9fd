#!/usr/bin/env bash
# Step time of the main job's model on the whole-step XLA path against olmax's native CPU backend,
# at the same shapes and blocks, in one run: train_lm --device=xla (the xla-cpu-pjrt CPU plugin)
# and train_lm --device=cpu, alternating, REPEATS times each per block and shape; ms/step is
# train_lm's own figure (training steps only: no evaluation, checkpoint or compile time), peak
# memory the process's maximum resident set (for --device=xla it includes the plugin's compiler),
# and the step's own memory: olmax's tensor peak for the native run (its allocator's count) and,
# for XLA, what XLA planned for one step (arguments, outputs not aliased and temporaries, as the
# plugin reports them; without the plugin's runtime and compiler, which the resident set includes).
#
#     cmake --build build --target train_lm
#     benchmarks/xla/step_time.sh [build]
#
# Environment: BLOCKS (default: conv_mixer qrnn mamba moe), SHAPES (space-separated
# "features:depth:batch:sequence", default the main job's 64:2:8:64 and the small preset
# 128:4:16:128; the base preset 256:8:16:256 takes ~3 s per native step on 2 cores, so RESULTS.md
# ran it alone with fewer STEPS), STEPS (per run, 100), REPEATS (3),
# THREADS (the native run's threads, 2), OUT (default benchmarks/results/xla-step-time-<UTC time>,
# git-ignored), PLUGIN (default: the wheel's plugin in .venv), BASELINE (another train_lm binary,
# e.g. one built from an older commit: each repeat then also runs it, on BASELINE_DEVICES, default
# "cpu xla", for an A/B in the same run; a run the baseline refuses is left out), NATIVE (0: only
# the XLA runs, e.g. PLUGIN=<JAX's CUDA plugin> on a GPU machine), DATA (train_lm's --data; default
# its own corpus, Debian's fortunes), XLA_ARGS (more train_lm flags for the XLA runs, e.g.
# --xla_scan_form=hillis_steele_chunked), PRECISIONS (train_lm's --precision values, default fp32;
# "fp32 bf16" alternates both in every repeat, one table row each, for bf16 against fp32 on the same
# binary and shapes). Writes results.json and prints a markdown table with the CPU model and the
# load average.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
train_lm="$build/examples/train_lm"
[ -x "$train_lm" ] || { echo "xla/step_time.sh: no $train_lm; build it: cmake --build $build --target train_lm" >&2; exit 1; }
source "$here/cpu_plugin.sh" xla/step_time.sh
source "$here/defaults.sh"  # default_blocks, default_shapes
shapes="${SHAPES:-$default_shapes}"
blocks="${BLOCKS:-$default_blocks}"
steps="${STEPS:-100}" repeats="${REPEATS:-3}" threads="${THREADS:-2}" precisions="${PRECISIONS:-fp32}"
out="${OUT:-$repo/benchmarks/results/xla-step-time-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
timer=(/usr/bin/time -f "peak_kb %M")
[ -x /usr/bin/time ] || timer=()  # without GNU time (a bare image): no peak memory, reported as 0
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: > "$out/runs.txt"
for block in $blocks; do
  for shape in $shapes; do
    IFS=: read -r f d b s <<< "$shape"
    for r in $(seq "$repeats"); do
      runs="xla"
      [ "${NATIVE:-1}" = 0 ] || runs="cpu xla"
      [ -n "${BASELINE:-}" ] && for device in ${BASELINE_DEVICES:-cpu xla}; do runs="$runs baseline_$device"; done
      for precision in $precisions; do
        for run in $runs; do
          device=${run#baseline_} binary=$train_lm
          [ "$run" != "$device" ] && binary=$BASELINE
          dir="$out/run-$block-$run-$precision-$f-$d-$b-$s-$r"
          if ! "${timer[@]}" "$binary" --device=$device --xla_plugin="$plugin" --threads="$threads" --block="$block" --features="$f" \
            --depth="$d" --batch="$b" --sequence="$s" --steps="$steps" --eval_every=100000 --checkpoint_every=100000 --plot=false \
            --sample_bytes=0 --checkpoint_dir="$dir" --precision="$precision" ${DATA:+--data="$DATA"} \
            $([ "$device" = xla ] && echo ${XLA_ARGS:-}) > "$dir.log" 2>&1; then
            [ "$run" != "$device" ] && { echo "baseline refused $block $shape $precision $device: $(grep -v '^peak_kb' "$dir.log" | tail -1)"; rm -rf "$dir"; continue; }
            cat "$dir.log"
            exit 1
          fi
          ms=$(sed -n 's/.*tokens\/s, \([0-9.]*\) ms\/step.*/\1/p' "$dir.log")
          compile=$(sed -n 's/.*step compiled in \([0-9.]*\) s.*/\1/p' "$dir.log")
          peak=$(sed -n 's/^peak_kb \([0-9]*\)$/\1/p' "$dir.log")
          step_mib=$(sed -n 's/.*tensor memory at its peak: \([0-9.]*\) MiB.*/\1/p; s/.*step memory planned by XLA \([0-9.]*\) MiB.*/\1/p' "$dir.log")
          echo "$block $shape $precision $run $r $ms ${compile:-0} ${peak:-0} ${step_mib:-0}" | tee -a "$out/runs.txt"
          rm -rf "$dir"
        done
      done
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$load_before" "$load_after" "$threads" "$steps" <<'PY'
import json, os, statistics, sys
out, before, after, threads, steps = sys.argv[1:6]
rows = {}
for line in open(f"{out}/runs.txt"):
    block, shape, precision, device, _, ms, compile_s, peak_kb, step_mib = line.split()
    rows.setdefault((block, shape, precision), {}).setdefault(device, []).append((float(ms), float(compile_s), float(peak_kb) / 1024, float(step_mib)))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"\nCPU {cpu}; load average {before} -> {after}; native CPU backend on {threads} threads; {steps} steps per run; medians\n")
baseline = any("baseline_cpu" in by or "baseline_xla" in by for by in rows.values())
extra = " baseline native ms/step | baseline XLA ms/step | native / baseline | XLA / baseline |" if baseline else ""
print("| block | features x depth, batch x sequence | precision | native ms/step | XLA ms/step | XLA / native | XLA compile s | native peak MiB | XLA peak MiB |"
      " native tensor peak MiB | XLA step plan MiB | plan / tensor peak |" + extra)
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" * 4 if baseline else ""))
summary = []
for (block, shape, precision), by in rows.items():
    f, d, b, s = shape.split(":")
    med = lambda run, i: statistics.median(r[i] for r in by[run]) if run in by else float("nan")
    native, xla = med("cpu", 0), med("xla", 0)
    tensors, plan = med("cpu", 3), med("xla", 3)
    line = (f"| {block} | {f} x {d}, {b} x {s} | {precision} | {native:.2f} | {xla:.2f} | {xla / native:.2f} | {med('xla', 1):.2f} | {med('cpu', 2):.0f} | {med('xla', 2):.0f} |"
            f" {tensors:.1f} | {plan:.1f} | {plan / tensors if tensors else float('nan'):.2f} |")
    row = {"block": block, "features": int(f), "depth": int(d), "batch": int(b), "sequence": int(s), "precision": precision, "native_ms_median": native,
           "xla_ms_median": xla, "xla_over_native": xla / native, "xla_compile_s_median": med("xla", 1),
           "native_peak_mib_median": med("cpu", 2), "xla_peak_mib_median": med("xla", 2),
           "native_tensor_peak_mib_median": tensors, "xla_step_plan_mib_median": plan,
           "native_ms": [r[0] for r in by.get("cpu", [])], "xla_ms": [r[0] for r in by["xla"]]}
    if baseline:
        base_cpu, base_xla = med("baseline_cpu", 0), med("baseline_xla", 0)
        line += f" {base_cpu:.2f} | {base_xla:.2f} | {native / base_cpu:.2f} | {xla / base_xla:.2f} |"
        row.update({"baseline_native_ms_median": base_cpu, "baseline_xla_ms_median": base_xla,
                    "baseline_native_ms": [r[0] for r in by.get("baseline_cpu", [])], "baseline_xla_ms": [r[0] for r in by.get("baseline_xla", [])]})
    print(line)
    summary.append(row)
ratios = [(block, shape, statistics.median(r[0] for r in rows[(block, shape, "bf16")]["xla"]) /
           statistics.median(r[0] for r in rows[(block, shape, "fp32")]["xla"]))
          for block, shape, precision in rows if precision == "bf16" and (block, shape, "fp32") in rows and "xla" in rows[(block, shape, "bf16")]]
for block, shape, ratio in ratios:
    print(f"{block} {shape}: XLA step bf16 / fp32 {ratio:.3f}")
def nan_to_null(v):  # JSON has no NaN: a figure this run did not measure (NATIVE=0, no baseline) is null
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, dict):
        return {k: nan_to_null(x) for k, x in v.items()}
    if isinstance(v, list):
        return [nan_to_null(x) for x in v]
    return v
json.dump(nan_to_null({"cpu": cpu, "plugin": os.environ.get("PLUGIN", ""), "load_before": before, "load_after": after, "threads": int(threads),
                       "steps": int(steps), "baseline": os.environ.get("BASELINE", ""), "rows": summary}),
          open(f"{out}/results.json", "w"), indent=1, allow_nan=False)
PY
echo "xla/step_time.sh: results in $out"
