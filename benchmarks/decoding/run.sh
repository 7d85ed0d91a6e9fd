#!/usr/bin/env bash
# Decoding speed: the bytes per second `generate` draws from a checkpoint with --decode=stepwise
# (each byte once through the layers, every block carrying its state: docs/GUIDE.md section 16)
# against --decode=window (the last `sequence` bytes through the whole model again for every byte),
# per block and window length, one run after the other on THREADS threads.
#
# For each block of BLOCKS and length of SEQUENCES it trains a checkpoint for STEPS steps
# (train_lm at FEATURES x DEPTH, batch 2: decoding's speed does not depend on what the weights are),
# then runs generate with each --decode value SEEDS times (--seed=1..SEEDS, temperature 1), each
# drawing up to BYTES bytes from the prompt "The " (a draw stops early at an end-of-document
# byte, so the rows count the bytes drawn). One JSON object per block, length and --decode, a list
# in OUT: block, features, depth, sequence, decode, seeds, bytes, seconds, bytes_per_s (their
# ratio), threads, cpu, load_average, command.
#
#     cmake --build build --target train_lm generate
#     benchmarks/decoding/run.sh build
#
# Environment: BLOCKS (default "hybrid mamba2 gated_deltanet attention qrnn mamba"), SEQUENCES
# ("128 512"), BYTES (300), SEEDS (5), STEPS (2), FEATURES (64), DEPTH (2), THREADS (2),
# OUT (default benchmarks/results/decoding-<UTC time>.json).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
out="${OUT:-$repo/benchmarks/results/decoding-$(date -u +%Y%m%dT%H%M%SZ).json}"
blocks="${BLOCKS:-hybrid mamba2 gated_deltanet attention qrnn mamba}"
sequences="${SEQUENCES:-128 512}"
bytes="${BYTES:-300}" seeds="${SEEDS:-5}" steps="${STEPS:-2}" features="${FEATURES:-64}" depth="${DEPTH:-2}" threads="${THREADS:-2}"
for program in train_lm generate; do
  [ -x "$build/examples/$program" ] || { echo "decoding: $build/examples/$program is missing; build it first (cmake --build $build --target train_lm generate)" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
rows="$work/rows.jsonl"
: > "$rows"
for block in $blocks; do
  for sequence in $sequences; do
    dir="$work/$block-$sequence"
    OMP_NUM_THREADS="$threads" "$build/examples/train_lm" --block="$block" --features="$features" --depth="$depth" --batch=2 \
      --sequence="$sequence" --steps="$steps" --checkpoint_dir="$dir" --sample_bytes=0 --plot=false --threads="$threads" \
      --eval_every=1000000 > "$dir.train.log" 2>&1 || { cat "$dir.train.log" >&2; exit 1; }
    for decode in stepwise window; do
      command="OMP_NUM_THREADS=$threads generate --checkpoint_dir=DIR --sample_bytes=$bytes --temperature=1 --seed=1..$seeds --decode=$decode"
      load="$(cut -d' ' -f1-3 /proc/loadavg)"
      : > "$dir.$decode.lines"
      for seed in $(seq 1 "$seeds"); do
        OMP_NUM_THREADS="$threads" "$build/examples/generate" --checkpoint_dir="$dir" --sample_bytes="$bytes" --temperature=1 \
          --seed="$seed" --decode="$decode" > "$dir.$decode.txt" 2> "$dir.$decode.log" || { cat "$dir.$decode.log" >&2; exit 1; }
        grep '^generate: ' "$dir.$decode.log" | tail -n 1 >> "$dir.$decode.lines"
      done
      # each line: "generate: N bytes in S s (R bytes/s, decode D, window W)"
      /usr/bin/python3 - "$dir.$decode.lines" "$block" "$features" "$depth" "$sequence" "$threads" "$cpu" "$load" "$command" >> "$rows" <<'PY'
import json, re, sys
lines, block, features, depth, sequence, threads, cpu, load, command = sys.argv[1:]
total_bytes, total_s, decode, seeds = 0, 0.0, None, 0
for line in open(lines):
    m = re.match(r"generate: (\d+) bytes in ([0-9.e+-]+) s \(([0-9.e+-]+) bytes/s, decode (\w+), window (\d+)\)", line)
    if not m:
        sys.exit("decoding: not a timing line of generate: " + repr(line))
    total_bytes += int(m.group(1)); total_s += float(m.group(2)); decode = m.group(4); seeds += 1
if seeds == 0 or total_s <= 0:
    sys.exit("decoding: generate printed no timing for " + block)
print(json.dumps({"block": block, "features": int(features), "depth": int(depth), "sequence": int(sequence), "decode": decode,
                  "seeds": seeds, "bytes": total_bytes, "seconds": total_s, "bytes_per_s": total_bytes / total_s, "threads": int(threads),
                  "cpu": cpu, "load_average": load, "command": command}))
PY
      tail -n 1 "$rows"
    done
  done
done
/usr/bin/python3 - "$rows" "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
json.dump(rows, open(sys.argv[2], "w"), indent=1)
print(f"\n{'block':<16} {'sequence':>8} {'stepwise B/s':>13} {'window B/s':>11} {'speed-up':>9}")
for r in rows:
    if r["decode"] != "stepwise":
        continue
    w = next((x for x in rows if x["block"] == r["block"] and x["sequence"] == r["sequence"] and x["decode"] == "window"), None)
    if w:
        print(f"{r['block']:<16} {r['sequence']:>8} {r['bytes_per_s']:>13.1f} {w['bytes_per_s']:>11.1f} {r['bytes_per_s'] / w['bytes_per_s']:>8.1f}x")
print(sys.argv[2])
PY
