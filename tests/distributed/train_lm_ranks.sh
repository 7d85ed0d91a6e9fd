#!/usr/bin/env bash
# The main job across processes (issue: data parallelism in train_lm). Usage:
#     train_lm_ranks.sh TRAIN_LM LAUNCHER
# 1. Two ranks of one thread each (tools/launch_local.sh) log the same losses, to the printed
#    digits, as one process whose two threads each take half of every batch.
# 2. The two-rank run resumes from its own checkpoint (rank 0 hands it to rank 1) and goes on.
# 3. A rank that dies makes the launcher stop the other and fail; the last checkpoint stays valid.
# 4. --overlap_allreduce=true (the exchange during backward) logs the same losses as without it,
#    with one thread per rank and with two (data_parallel_backward shards), in tiny buckets; a bad
#    value is a usage error.
# 5. SIGTERM to the launcher reaches both ranks: they finish the same step, rank 0 writes a
#    checkpoint, every process exits 143.
set -euo pipefail
train_lm=$1
launcher=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/olmax-train-lm-ranks.XXXXXX")
trap 'rm -rf "$work"' EXIT
printf 'A fortune a day keeps the doctor away.\n%%\nThe quick brown fox jumps over the lazy dog.\n%%\n' > "$work/seed.txt"
for i in $(seq 1 200); do cat "$work/seed.txt"; echo "line $i of the corpus, with some words to learn."; echo "%"; done > "$work/corpus.txt"
common=(--data="$work/corpus.txt" --steps=6 --eval_every=3 --eval_batches=4 --sample_bytes=0 --plot=false --checkpoint_every=3
        --batch=4 --sequence=32 --features=16 --collective_timeout_s=30)

"$train_lm" "${common[@]}" --threads=2 --checkpoint_dir="$work/one" > "$work/one.log"
bash "$launcher" 2 "$train_lm" "${common[@]}" --threads=1 --checkpoint_dir="$work/two" > "$work/two.log" 2>&1 ||
  { cat "$work/two.log"; echo "FAIL: the two-rank run failed"; exit 1; }
if ! diff "$work/one/metrics.csv" "$work/two/metrics.csv"; then
  echo "FAIL: two ranks and one process with two shards logged different losses"; exit 1
fi
grep -q "rank 1 of 2 (gloo): rows 2..3 of each batch" "$work/two.log" || { cat "$work/two.log"; echo "FAIL: no rank 1 report"; exit 1; }
grep -Eq "^trained 768 tokens in [0-9.]+ s of training steps .*gradient exchange [0-9.]+ s \([0-9.]+%\) across 2 process" "$work/two.log" ||
  { cat "$work/two.log"; echo "FAIL: no training summary with the exchange time of 2 processes"; exit 1; }
[ ! -e "$work/two/rank1" ] && [ "$(ls "$work/two" | grep -c '^ckpt-')" -eq 2 ] || { ls -la "$work/two"; echo "FAIL: checkpoints"; exit 1; }
echo "ok: two ranks equal one process with two shards (metrics.csv identical)"

bash "$launcher" 2 "$train_lm" "${common[@]}" --steps=8 --threads=1 --checkpoint_dir="$work/two" > "$work/resume.log" 2>&1 ||
  { cat "$work/resume.log"; echo "FAIL: the resumed two-rank run failed"; exit 1; }
grep -q "resumed from .*ckpt-0000000006.olmax at step 6" "$work/resume.log" || { cat "$work/resume.log"; echo "FAIL: no resume"; exit 1; }
grep -q "^8,.*,eval," "$work/two/metrics.csv" || { cat "$work/two/metrics.csv"; echo "FAIL: no step 8"; exit 1; }
echo "ok: two ranks resume from rank 0's checkpoint"

# Rank 1 gets a corpus path that does not exist: it fails at start; rank 0 must not hang.
start=$(date +%s)
set +e
"$train_lm" "${common[@]}" --threads=1 --checkpoint_dir="$work/fault" --world_size=2 --rank=0 --rendezvous="file:$work/store" \
  --collective_timeout_s=5 > "$work/rank0.log" 2>&1 &
rank0=$!
"$train_lm" "${common[@]}" --data="$work/missing.txt" --threads=1 --checkpoint_dir="$work/fault" --world_size=2 --rank=1 \
  --rendezvous="file:$work/store" --collective_timeout_s=5 > "$work/rank1.log" 2>&1
code1=$?
wait $rank0
code0=$?
set -e
elapsed=$(( $(date +%s) - start ))
if [ "$code0" -eq 0 ] || [ "$code1" -eq 0 ] || [ "$elapsed" -gt 40 ]; then
  cat "$work/rank0.log" "$work/rank1.log"; echo "FAIL: exit codes $code0 / $code1 after $elapsed s"; exit 1
fi
grep -q "^train_lm: rendezvous (rank 0 of 2, gloo).*timeout" "$work/rank0.log" ||
  { cat "$work/rank0.log"; echo "FAIL: rank 0's error does not say which collective of which rank timed out"; exit 1; }
echo "ok: a rank that fails at start stops the other within $elapsed s (exit codes $code0, $code1)"

# The exchange overlapped with backward: the same losses, to the printed digits.
bash "$launcher" 2 "$train_lm" "${common[@]}" --threads=1 --overlap_allreduce=true --bucket_mb=0.001 \
  --checkpoint_dir="$work/overlap" > "$work/overlap.log" 2>&1 || { cat "$work/overlap.log"; echo "FAIL: the overlapped run failed"; exit 1; }
diff "$work/one/metrics.csv" "$work/overlap/metrics.csv" ||
  { echo "FAIL: two ranks with --overlap_allreduce=true logged other losses than one process with two shards"; exit 1; }
grep -Eq "^overlapped exchange: [0-9]+ bucket" "$work/overlap.log" || { cat "$work/overlap.log"; echo "FAIL: no overlap report"; exit 1; }
for overlap in false true; do
  bash "$launcher" 2 "$train_lm" "${common[@]}" --threads=2 --overlap_allreduce=$overlap --bucket_mb=0.001 \
    --checkpoint_dir="$work/shards-$overlap" > "$work/shards-$overlap.log" 2>&1 ||
    { cat "$work/shards-$overlap.log"; echo "FAIL: the two-rank two-thread run (overlap $overlap) failed"; exit 1; }
done
diff "$work/shards-false/metrics.csv" "$work/shards-true/metrics.csv" ||
  { echo "FAIL: with two thread shards per rank, --overlap_allreduce=true logged other losses"; exit 1; }
set +e
"$train_lm" "${common[@]}" --overlap_allreduce=maybe --checkpoint_dir="$work/bad" > "$work/bad.log" 2>&1
code=$?
set -e
[ "$code" -eq 2 ] && grep -q "overlap_allreduce.*expects true or false, got 'maybe'" "$work/bad.log" ||
  { cat "$work/bad.log"; echo "FAIL: --overlap_allreduce=maybe gave exit status $code"; exit 1; }
echo "ok: --overlap_allreduce=true logs the same losses (1 and 2 threads per rank); a bad value is a usage error"

# SIGTERM to the launcher (what a batch scheduler sends): both ranks stop after the same step.
bash "$launcher" 2 "$train_lm" "${common[@]}" --steps=100000 --eval_every=100000 --checkpoint_every=100000 --log_every=10 \
  --threads=1 --checkpoint_dir="$work/term" > "$work/term.log" 2>&1 &
launched=$!
for _ in $(seq 1 600); do grep -q "^step 20/" "$work/term.log" && break; sleep 0.1; done
kill -TERM "$launched"
set +e
wait "$launched"
code=$?
set -e
step=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\); checkpoint: .*$/\1/p' "$work/term.log")
# Rank 1's lines pass through the launcher's sed, which may still be writing them.
for _ in $(seq 1 50); do grep -q "^\[rank 1\] rank 1: stopped by SIGTERM" "$work/term.log" && break; sleep 0.1; done
if [ "$code" -ne 143 ] || [ -z "$step" ] || ! grep -q "^\[rank 1\] rank 1: stopped by SIGTERM after step $step " "$work/term.log" ||
   [ ! -e "$work/term/ckpt-$(printf %010d "$step").olmax" ]; then
  cat "$work/term.log"; ls -la "$work/term"; echo "FAIL: SIGTERM to the launcher: exit status $code, stopped after step '$step'"; exit 1
fi
echo "ok: SIGTERM to the launcher stops both ranks after step $step with rank 0's checkpoint (exit 143)"
