#!/usr/bin/env bash
# olmax's training step in several variants side by side, in one run: each variant is a train_step
# binary with its own flags (another build, another --precision or --fp32_gemm, ...), run in turn
# for every shape, thread count and repeat, so that machine load hits them alike; prints each
# variant's median ms/step and its speed-up over the first variant (> 1: faster), and writes OUT/results.json with
# the CPU model, the load average and what each run reported it computed with (bf16_gemm, fp32_gemm).
#
#     benchmarks/train_step/variants.sh LABEL=BINARY [FLAGS...] LABEL=BINARY [FLAGS...] ...
#     # oneDNN 2.6 (Debian) against 3.2 (tools/setup_onednn3.sh), bf16 step:
#     benchmarks/train_step/variants.sh "2.6=build/benchmarks/train_step/train_step --precision bf16" \
#                                       "3.2=build-onednn3/benchmarks/train_step/train_step --precision bf16"
#
# Each argument is one variant: a label, '=', the binary and its flags (split at spaces).
# Environment: SHAPES (space-separated "features:depth:batch:sequence"; default the main job's
# 64:2:8:64, the small preset 128:4:16:128 and the wide row 512:8:8:256), THREADS ("1 2"), REPEATS
# (3), MAX_SECONDS (timed steps per run, 5), OUT (default benchmarks/results/train-step-variants-<UTC
# time>, git-ignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
[ $# -ge 2 ] || { echo "usage: train_step/variants.sh LABEL=BINARY [FLAGS...] LABEL=BINARY [FLAGS...] ..." >&2; exit 2; }
labels=() commands=()
for variant in "$@"; do
  label=${variant%%=*} command=${variant#*=}
  [ "$label" != "$variant" ] && [ -n "$label" ] && [[ "$label" =~ ^[A-Za-z0-9._+]+$ ]] \
    || { echo "train_step/variants.sh: '$variant' is not LABEL=BINARY [FLAGS...] (label: letters, digits, . _ +)" >&2; exit 2; }
  binary=${command%% *}
  [ -x "$binary" ] || { echo "train_step/variants.sh: $label: no executable $binary" >&2; exit 1; }
  labels+=("$label") commands+=("$command")
done
shapes="${SHAPES:-64:2:8:64 128:4:16:128 512:8:8:256}" threads_list="${THREADS:-1 2}" repeats="${REPEATS:-3}"
out="${OUT:-$repo/benchmarks/results/train-step-variants-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for shape in $shapes; do
  IFS=: read -r f d b s <<< "$shape"
  for threads in $threads_list; do
    for r in $(seq "$repeats"); do
      for i in "${!labels[@]}"; do
        json="$out/$f-$d-$b-$s-t$threads-${labels[$i]}-$r.json"
        # shellcheck disable=SC2086  # the variant's flags split at spaces
        ${commands[$i]} --features "$f" --depth "$d" --batch "$b" --sequence "$s" --threads "$threads" \
          --max_seconds "${MAX_SECONDS:-5}" --json "$json" > "$out/last.log" 2>&1 || { cat "$out/last.log"; exit 1; }
        echo "$shape threads $threads ${labels[$i]}: $(grep -o '[0-9.]* ms/step' "$out/last.log")"
      done
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$load_before" "$load_after" "${labels[@]}" <<'PY'
import glob, json, os, statistics, sys
out, before, after, labels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
runs, computed = {}, {}
for label in labels:
    for path in glob.glob(f"{out}/*-t*-{label}-*.json"):
        f, d, b, s, t = os.path.basename(path)[:-5].split("-")[:5]
        row = json.load(open(path))
        runs.setdefault((int(f), int(d), int(b), int(s), int(t[1:])), {}).setdefault(label, []).append(row["seconds_median"] * 1e3)
        computed[label] = {"bf16_gemm": row.get("bf16_gemm"), "fp32_gemm": row.get("fp32_gemm"), "precision": row.get("precision")}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"\nCPU {cpu}; load average {before} -> {after}; medians of each run's median step")
for label in labels:
    print(f"  {label}: {computed.get(label)}")
print("\n| features x depth, batch x sequence | threads | " + " | ".join(f"{l} ms/step" for l in labels) + " | "
      + " | ".join(f"{l} speed-up ({labels[0]} ms / {l} ms)" for l in labels[1:]) + " |")
print("|---|---:|" + "---:|" * (2 * len(labels) - 1))
rows = []
for key in sorted(runs):
    f, d, b, s, t = key
    med = {l: statistics.median(runs[key][l]) for l in labels}
    print(f"| {f} x {d}, {b} x {s} | {t} | " + " | ".join(f"{med[l]:.2f}" for l in labels) + " | "
          + " | ".join(f"{med[labels[0]] / med[l]:.2f}" for l in labels[1:]) + " |")
    rows.append({"features": f, "depth": d, "batch": b, "sequence": s, "threads": t, "ms_median": med, "ms": runs[key]})
json.dump({"cpu": cpu, "load_before": before, "load_after": after, "variants": {l: c for l, c in computed.items()}, "rows": rows},
          open(f"{out}/results.json", "w"), indent=1)
PY
echo "train_step/variants.sh: results in $out"
