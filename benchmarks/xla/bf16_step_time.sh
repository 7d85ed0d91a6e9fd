#!/usr/bin/env bash
# bf16 against fp32 on the whole-step XLA path: train_lm --device=xla on the CPU plugin (or PLUGIN),
# --precision=fp32 and --precision=bf16 alternating, REPEATS times each per block, same binary and
# shapes; prints one line per run and the medians (ms/step is train_lm's own figure: training steps
# only, no compile time).
#
#     cmake --build build --target train_lm
#     benchmarks/xla/bf16_step_time.sh [build]
#
# Environment: BLOCKS (conv_mixer qrnn), SHAPE ("features:depth:batch:sequence", 128:4:16:128),
# STEPS (60), REPEATS (3), THREADS (2), PLUGIN (default: the wheel's plugin in .venv).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
train_lm="$build/examples/train_lm"
[ -x "$train_lm" ] || { echo "xla/bf16_step_time.sh: no $train_lm; build it: cmake --build $build --target train_lm" >&2; exit 1; }
source "$here/cpu_plugin.sh" xla/bf16_step_time.sh
IFS=: read -r f d b s <<< "${SHAPE:-128:4:16:128}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "cpu: $(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for block in ${BLOCKS:-conv_mixer qrnn}; do
  for r in $(seq "${REPEATS:-3}"); do
    for precision in fp32 bf16; do
      "$train_lm" --device=xla --xla_plugin="$plugin" --threads="${THREADS:-2}" --block="$block" --features="$f" --depth="$d" --batch="$b" \
        --sequence="$s" --steps="${STEPS:-60}" --eval_every=100000 --checkpoint_every=100000 --plot=false --sample_bytes=0 \
        --checkpoint_dir="$tmp/run" --precision="$precision" > "$tmp/log" 2>&1 || { tail -3 "$tmp/log"; exit 1; }
      rm -rf "$tmp/run"
      echo "$block $precision $r $(sed -n 's/.*tokens\/s, \([0-9.]*\) ms\/step.*/\1/p' "$tmp/log" | tail -1)" | tee -a "$tmp/rows"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$tmp/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for block in dict.fromkeys(r[0] for r in rows):
    m = {p: statistics.median(float(r[3]) for r in rows if r[0] == block and r[1] == p) for p in ("fp32", "bf16")}
    print(f"{block}: fp32 {m['fp32']:.1f} ms/step, bf16 {m['bf16']:.1f} ms/step, bf16 / fp32 {m['bf16'] / m['fp32']:.3f}")
PY
