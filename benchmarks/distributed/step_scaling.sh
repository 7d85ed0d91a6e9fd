#!/usr/bin/env bash
# Training-step scaling from 1 to N processes (issue 14 item 6), measured with the main job itself:
# examples/train_lm at a preset, a fixed number of steps, the same global batch in every run.
#
#     cmake --build build --target train_lm
#     benchmarks/distributed/step_scaling.sh [build]       # N = 2; presets tiny small base
#
# Per preset, three runs one after another (never concurrently):
#   1 process  x 1 thread      the single-core step
#   1 process  x N threads     threads share the batch inside one process (data_parallel_backward)
#   N processes x 1 thread     tools/launch_local.sh: Gloo over 127.0.0.1, gradients averaged per step
# From train_lm's summary line (rank 0): the seconds of training steps, tokens/s, ms/step,
# and the seconds spent in the gradient exchange (allreduce_gradients plus the loss exchange).
# speedup = tokens/s over the 1 x 1 run; efficiency = speedup / N.
#
# Environment: RANKS (2), STEPS (200; tiny runs 5x as many), PRESETS ("tiny small base"),
# OUT (default benchmarks/results/step-scaling-<UTC time>, git-ignored), SUMMARY_ONLY=1 (tabulate
# the logs already in OUT, run nothing). Writes one log per run,
# summary.json, and prints a markdown table with the CPU model and the load average.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
train_lm="$build/examples/train_lm"
[ -x "$train_lm" ] || { echo "step_scaling: no $train_lm; build it: cmake --build $build --target train_lm" >&2; exit 1; }
ranks="${RANKS:-2}"
steps="${STEPS:-200}"
presets="${PRESETS:-tiny small base}"
out="${OUT:-$repo/benchmarks/results/step-scaling-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"

common=(--resume=false --plot=false --sample_bytes=0 --eval_every=1000000000000 --checkpoint_every=1000000000000
        --eval_batches=1 --log_every=1000000)
run() {  # name, then the command; the log is $out/$name.log
  local name=$1; shift
  echo "step_scaling: $name" >&2
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  "$@" --checkpoint_dir="$out/$name-run" > "$out/$name.log" 2>&1 || { echo "step_scaling: $name failed, see $out/$name.log" >&2; exit 1; }
  echo "load_average $load" >> "$out/$name.log"
  rm -rf "$out/$name-run"
}
for preset in $presets; do
  [ "${SUMMARY_ONLY:-0}" = 1 ] && break  # only tabulate the logs already in OUT
  n=$steps
  [ "$preset" = tiny ] && n=$(( steps * 5 ))
  run "$preset-1x1" "$train_lm" --preset="$preset" --steps="$n" --threads=1 "${common[@]}"
  run "$preset-1x$ranks" "$train_lm" --preset="$preset" --steps="$n" --threads="$ranks" "${common[@]}"
  run "$preset-${ranks}x1" bash "$repo/tools/launch_local.sh" "$ranks" "$train_lm" --preset="$preset" --steps="$n" --threads=1 "${common[@]}"
done

/usr/bin/python3 - "$out" "$ranks" "$presets" <<'EOF'
import json, os, re, subprocess, sys
out, ranks, presets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
rows = []
for preset in presets:
    base = None
    for layout, processes, threads in (("1x1", 1, 1), (f"1x{ranks}", 1, ranks), (f"{ranks}x1", ranks, 1)):
        text = open(os.path.join(out, f"{preset}-{layout}.log")).read()
        m = re.search(r"^trained (\d+) tokens in ([\d.]+) s (?:of training steps|without evaluations) \(([\d.]+) tokens/s, ([\d.]+) ms/step\); "
                      r"gradient exchange ([\d.]+) s \(([\d.]+)%\)", text, re.M)
        model = re.search(r"^model: (.*), (\d+) parameters", text, re.M)
        cfg = dict(re.findall(r"^(batch|sequence|features|depth) = (\S+)", text, re.M))
        load = re.search(r"^load_average (.*)$", text, re.M).group(1)
        r = {"preset": preset, "processes": processes, "threads_per_process": threads, "tokens": int(m.group(1)),
             "train_seconds": float(m.group(2)), "tokens_per_s": float(m.group(3)), "ms_per_step": float(m.group(4)),
             "exchange_seconds": float(m.group(5)), "exchange_percent": float(m.group(6)), "parameters": int(model.group(2)),
             "gradient_mib": int(model.group(2)) * 4 / 2**20, "batch": int(cfg["batch"]), "sequence": int(cfg["sequence"]),
             "features": int(cfg["features"]), "depth": int(cfg["depth"]), "load_average_start": load, "cpu_model": cpu}
        base = base or r["tokens_per_s"]
        r["speedup_vs_1x1"] = r["tokens_per_s"] / base
        rows.append(r)
json.dump({"ranks": ranks, "cpu_model": cpu, "runs": rows}, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(f"\nCPU: {cpu}; load average (1/5/15 min) at each run's start in the table; written to {out}\n")
print("| preset | parameters (gradient MiB) | batch x sequence | processes x threads | ms/step | tokens/s | speedup vs 1x1 | exchange share | load avg |")
print("|---|---:|---|---|---:|---:|---:|---:|---|")
for r in rows:
    print(f"| {r['preset']} | {r['parameters']:,} ({r['gradient_mib']:.2f}) | {r['batch']} x {r['sequence']} | "
          f"{r['processes']} x {r['threads_per_process']} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:,.0f} | "
          f"{r['speedup_vs_1x1']:.2f} | {r['exchange_percent']:.1f}% | {r['load_average_start']} |")
EOF
