#!/usr/bin/env bash
# A/B: train_lm's gradient exchange after backward (allreduce_gradients) against overlapped with
# it (--overlap_allreduce=true, distributed::OverlappedAllreduce), RANKS processes x THREADS
# threads on this machine (tools/launch_local.sh, Gloo over 127.0.0.1), the same global batch.
#
#     cmake --build build --target train_lm
#     benchmarks/distributed/overlap_ab.sh [build]
#
# Per preset and round the two runs go one after the other, alternating which goes first (round 1:
# off then on, round 2: on then off, ...), never concurrently. From train_lm's summary (rank 0):
# ms/step without evaluations and the exchange seconds per step (with overlap: what finish() still
# waited after backward, plus the loss exchange); the medians over the rounds are tabulated.
#
# Environment: RANKS (2), THREADS (1), ROUNDS (3), STEPS (200; tiny runs 5x as many), PRESETS
# ("tiny small"), BUCKET_MB (25), OUT (default benchmarks/results/overlap-ab-<UTC time>,
# git-ignored). Prints a markdown table with the CPU model and load averages; writes summary.json.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
train_lm="$build/examples/train_lm"
[ -x "$train_lm" ] || { echo "overlap_ab: no $train_lm; build it: cmake --build $build --target train_lm" >&2; exit 1; }
ranks="${RANKS:-2}"
threads="${THREADS:-1}"
rounds="${ROUNDS:-3}"
steps="${STEPS:-200}"
presets="${PRESETS:-tiny small}"
bucket_mb="${BUCKET_MB:-25}"
out="${OUT:-$repo/benchmarks/results/overlap-ab-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"

common=(--resume=false --plot=false --sample_bytes=0 --eval_every=1000000000000 --checkpoint_every=1000000000000
        --eval_batches=1 --log_every=1000000 --threads="$threads" --bucket_mb="$bucket_mb")
run() {  # preset, round, overlap (true|false)
  local name="$1-r$2-overlap_$3" n=$steps
  [ "$1" = tiny ] && n=$(( steps * 5 ))
  echo "overlap_ab: $name" >&2
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  bash "$repo/tools/launch_local.sh" "$ranks" "$train_lm" --preset="$1" --steps="$n" "${common[@]}" --overlap_allreduce="$3" \
    --checkpoint_dir="$out/$name-run" > "$out/$name.log" 2>&1 || { echo "overlap_ab: $name failed, see $out/$name.log" >&2; exit 1; }
  echo "load_average $load" >> "$out/$name.log"
  rm -rf "$out/$name-run"
}
for preset in $presets; do
  for (( r = 1; r <= rounds; ++r )); do
    if (( r % 2 )); then run "$preset" "$r" false; run "$preset" "$r" true
    else run "$preset" "$r" true; run "$preset" "$r" false; fi
  done
done

/usr/bin/python3 - "$out" "$rounds" "$presets" "$ranks" "$threads" "$bucket_mb" <<'EOF'
import json, os, re, statistics, sys
out, rounds, presets, ranks, threads, bucket_mb = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5], sys.argv[6]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
runs = []
for preset in presets:
    for r in range(1, rounds + 1):
        for overlap in ("false", "true"):
            text = open(os.path.join(out, f"{preset}-r{r}-overlap_{overlap}.log")).read()
            m = re.search(r"^trained (\d+) tokens in ([\d.]+) s (?:of training steps|without evaluations) \(([\d.]+) tokens/s, ([\d.]+) ms/step\); "
                          r"gradient exchange ([\d.]+) s", text, re.M)
            o = re.search(r"^overlapped exchange: (\d+) bucket\(s\).*?(\d+) sent before backward ended", text, re.M)
            runs.append({"preset": preset, "round": r, "overlap": overlap == "true", "ms_per_step": float(m.group(4)),
                         "exchange_ms_per_step": float(m.group(5)) / float(m.group(2)) * float(m.group(4)),
                         "buckets": int(o.group(1)) if o else None, "sent_during_backward": int(o.group(2)) if o else None,
                         "load_average_start": re.search(r"^load_average (.*)$", text, re.M).group(1)})
json.dump({"cpu_model": cpu, "ranks": ranks, "threads": threads, "bucket_mb": bucket_mb, "runs": runs},
          open(os.path.join(out, "summary.json"), "w"), indent=1)
print(f"\nCPU: {cpu}; {ranks} processes x {threads} thread(s), bucket cap {bucket_mb} MiB, {rounds} rounds alternating; {out}\n")
print("| preset | exchange | ms/step (median) | runs | exchange ms/step (median) | buckets, sent during backward | load avg at starts |")
print("|---|---|---:|---|---:|---|---|")
for preset in presets:
    for overlap in (False, True):
        rs = [x for x in runs if x["preset"] == preset and x["overlap"] == overlap]
        ms = [x["ms_per_step"] for x in rs]
        ex = [x["exchange_ms_per_step"] for x in rs]
        b = ", ".join(f"{x['buckets']}/{x['sent_during_backward']}" for x in rs) if overlap else "-"
        print(f"| {preset} | {'overlapped' if overlap else 'after backward'} | {statistics.median(ms):.2f} | "
              f"{' / '.join(f'{v:.2f}' for v in ms)} | {statistics.median(ex):.2f} | {b} | "
              f"{'; '.join(x['load_average_start'] for x in rs)} |")
EOF
