#!/usr/bin/env bash
# One --block of the main job on the whole-step XLA path against the CPU: train_lm --device=xla on a
# real PJRT plugin and --device=cpu, 5 steps of the default (tiny) model each, the training losses
# compared step by step (CTest xla.train_lm_block_<block>, one per block added after
# tests/xla/train_lm_xla.sh's four).
#   tests/xla/train_lm_block_xla.sh <train_lm> <PJRT plugin .so> <work folder> <block> [relative tolerance]
#
# Tolerance 3e-6 relative over steps 1-5 by default, as for --block=moe in train_lm_xla.sh: float32
# on both sides, XLA's fused kernels and olmax's GEMMs summing in different orders (train_lm_xla.sh
# has the measured scale of that rounding).
set -euo pipefail
train_lm=$1 plugin=$2 work=$3 block=$4 tolerance=${5:-3e-6}
rm -rf "$work"
mkdir -p "$work"
export OLMAX_PJRT_PLUGIN=
run() {  # run <folder> <flags...>
  local dir=$1
  shift
  if ! "$train_lm" --block="$block" --steps=5 --eval_every=5 --checkpoint_every=5 --plot=false --sample_bytes=0 \
      --checkpoint_dir="$work/$dir" "$@" > "$work/$dir.log" 2>&1; then
    cat "$work/$dir.log"
    echo "FAIL: train_lm --block=$block $* exited with an error"
    exit 1
  fi
}
run cpu --threads=2
run xla --device=xla --xla_plugin="$plugin"
grep -q "step compiled in" "$work/xla.log" || { cat "$work/xla.log"; echo "FAIL: the XLA run did not report its compiled step"; exit 1; }
/usr/bin/python3 - "$work" "$block" "$tolerance" <<'PY'
import csv, sys
work, block, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
def losses(name):
    with open(f"{work}/{name}/metrics.csv") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r["split"] == "train"}
cpu, xla = losses("cpu"), losses("xla")
worst = max(abs(cpu[s] - xla[s]) / cpu[s] for s in range(1, 6))
print(f"--block={block}: xla vs cpu, training loss, steps 1-5: {worst:.2e} (limit {limit:.0e})")
for s in range(1, 6):
    print(f"  step {s}: cpu {cpu[s]:.7f}  xla {xla[s]:.7f}")
if not worst <= limit:
    sys.exit(f"FAIL: --block={block} on XLA parts from the CPU by {worst:.2e}")
PY
