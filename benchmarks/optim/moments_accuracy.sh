#!/usr/bin/env bash
# AdamW's bfloat16 moments against float32 ones on the main job: train_lm at its defaults (the tiny
# conv_mixer on Debian's fortunes) for STEPS steps with --adam_moments=fp32 and =bf16, for each seed
# of SEEDS, evaluating every EVAL_EVERY steps; prints the held-out losses side by side and writes
# them to OUT/results.json with the CPU model and the load average. The seeds show how far two fp32
# runs differ on their own, the yardstick for the moments' difference.
#
#     cmake --build build --target train_lm
#     benchmarks/optim/moments_accuracy.sh [build]
#
# Environment: STEPS (10000), EVAL_EVERY (1000), SEEDS ("0 1"), OUT (default
# benchmarks/results/moments-accuracy-<UTC time>, git-ignored), ARGS (more train_lm flags).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
train_lm="$build/examples/train_lm"
[ -x "$train_lm" ] || { echo "optim/moments_accuracy.sh: no $train_lm; build it: cmake --build $build --target train_lm" >&2; exit 1; }
steps="${STEPS:-10000}" every="${EVAL_EVERY:-1000}" seeds="${SEEDS:-0 1}"
out="${OUT:-$repo/benchmarks/results/moments-accuracy-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for seed in $seeds; do
  for moments in fp32 bf16; do
    dir="$out/run-$moments-$seed"
    rm -rf "$dir"
    "$train_lm" --steps="$steps" --eval_every="$every" --checkpoint_every=100000000 --plot=false --sample_bytes=0 --seed="$seed" \
      --adam_moments="$moments" --checkpoint_dir="$dir" ${ARGS:-} > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
    echo "seed $seed $moments: $(grep -oE 'step [0-9]+: held-out loss [0-9.]+' "$dir.log" | tail -1)"
  done
done
OUT="$out" SEEDS="$seeds" LOAD_BEFORE="$load_before" /usr/bin/python3 - <<'PY'
import json, os, re, platform
out, seeds = os.environ["OUT"], os.environ["SEEDS"].split()
def losses(moments, seed):
    text = open(f"{out}/run-{moments}-{seed}.log").read()
    return {int(s): float(l) for s, l in re.findall(r"step (\d+): held-out loss ([0-9.]+)", text)}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
runs = {f"{m}-seed{s}": losses(m, s) for s in seeds for m in ("fp32", "bf16")}
steps = sorted(runs[f"fp32-seed{seeds[0]}"])
print(f"\nheld-out loss (nats/byte), {cpu}, load {os.environ['LOAD_BEFORE']} -> {open('/proc/loadavg').read().split()[:3]}")
print("| step | " + " | ".join(runs) + " | " + " | ".join(f"bf16 - fp32, seed {s}" for s in seeds) + " |")
print("|---:|" + "---:|" * (len(runs) + len(seeds)))
for step in steps:
    print(f"| {step} | " + " | ".join(f"{runs[r][step]:.4f}" for r in runs) + " | " +
          " | ".join(f"{runs[f'bf16-seed{s}'][step] - runs[f'fp32-seed{s}'][step]:+.4f}" for s in seeds) + " |")
worst = max(abs(runs[f"bf16-seed{s}"][k] - runs[f"fp32-seed{s}"][k]) for s in seeds for k in steps)
seed_gap = max(abs(runs[f"fp32-seed{a}"][k] - runs[f"fp32-seed{b}"][k]) for a in seeds for b in seeds for k in steps)
print(f"largest |bf16 - fp32| at one evaluation: {worst:.4f}; largest gap between fp32 seeds: {seed_gap:.4f}")
json.dump({"cpu": cpu, "load_before": os.environ["LOAD_BEFORE"], "held_out_nats_per_byte": {r: {str(k): v for k, v in runs[r].items()} for r in runs},
           "largest_bf16_minus_fp32": worst, "largest_fp32_seed_gap": seed_gap}, open(f"{out}/results.json", "w"), indent=1)
print(f"wrote {out}/results.json")
PY
