#!/usr/bin/env bash
# The CPU speedrun in one command (docs/QUALITY.md, "The CPU speedrun"): held-out bits/byte after
# BUDGET_S (300) seconds of training on THREADS (2) threads, on any corpus, for olmax's speedrun
# recipe against the nanoGPT-recipe transformer at its best. Two passes of run.sh:
#   1. olmax's BLOCKS (default: hybrid and mamba2) with RECIPE (default `--preset=speedrun`:
#      train_lm's tiny sizes with rows of 128 bytes and a cosine decay from lr 0.008 over the budget)
#      and the baseline at block_size 128 (cosine over the budget, eager and torch.compile'd), all
#      scored on the same 128-byte held-out rows;
#   2. the baseline alone at its recipe's block_size 64, scored on 64-byte rows of the same held-out
#      bytes (on some corpora its better length; BASELINE_64=0 skips this pass).
# Then one summary: the best olmax run, the best baseline run at either length, and the margin.
# About 35 minutes at the defaults: six runs of BUDGET_S, plus evaluations and one compile.
#
#     benchmarks/quality/setup_torch_venv.sh                    # once: PyTorch into .venv-torch
#     cmake --build build --target train_lm dump_split
#     benchmarks/quality/speedrun.sh build                      # fortunes
#     DATA=/path/to/text benchmarks/quality/speedrun.sh build   # a file or a folder of text files
#     BUDGET_S=10 BASELINE_64=0 benchmarks/quality/speedrun.sh build   # a functional check (~2 minutes)
#
# Environment: as run.sh (BUDGET_S, THREADS, CORPUS, DATA, EVAL_EVERY_S, TARGET_BITS, TORCH_PYTHON),
# and BLOCKS, RECIPE, BASELINE_64 above; SUMMARY_ONLY (1: only the summary of an earlier OUT); OUT
# (default benchmarks/results/speedrun-<UTC time>: the passes write OUT/rows128 and OUT/rows64, each
# with run.sh's JSON per run, and OUT/summary.json).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
out="${OUT:-$repo/benchmarks/results/speedrun-$(date -u +%Y%m%dT%H%M%SZ)}"
recipe="${RECIPE:---preset=speedrun}"

# Functions, then one compound command that ends in exit: bash has read all of it before anything
# runs, so an edit of this file during a 35-minute run cannot change what the run does.
passes() {
  mkdir -p "$out"
  OUT="$out/rows128" BLOCKS="${BLOCKS:-hybrid mamba2}" TRAIN_LM_FLAGS="$recipe" TORCH_BLOCK_SIZE=128 \
    TORCH_MODES="fill fill_compiled" "$here/run.sh" "$build"
  if [ "${BASELINE_64:-1}" != 0 ]; then
    OUT="$out/rows64" BLOCKS=none TRAIN_LM_FLAGS="$recipe" TORCH_BLOCK_SIZE=64 TORCH_MODES="fill fill_compiled" "$here/run.sh" "$build"
  fi
}

summarize() {
/usr/bin/python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = []
for path in sorted(glob.glob(os.path.join(out, "rows*", "*.json"))):
    with open(path) as f:
        r = json.load(f)
    if "bits_per_byte" in r:
        r["rows"] = os.path.basename(os.path.dirname(path))
        runs.append(r)
olmax = [r for r in runs if r["system"].startswith("olmax")]
base = [r for r in runs if r["system"].startswith("pytorch")]
if not olmax or not base:
    sys.exit("speedrun: a pass wrote no results (see the logs under " + out + ")")
best_o = min(olmax, key=lambda r: r["bits_per_byte"])
best_b = min(base, key=lambda r: r["bits_per_byte"])
summary = {
    "corpus": best_o["corpus"], "budget_s": best_o["budget_s"], "threads": best_o["threads"], "cpu": best_o["cpu"],
    "best_olmax": {"block": best_o["block"], "bits_per_byte": best_o["bits_per_byte"], "tokens_per_s": best_o["tokens_per_s"],
                   "command": best_o["run_command"]},
    "best_baseline": {"system": best_b["system"], "rows": best_b["rows"], "bits_per_byte": best_b["bits_per_byte"],
                      "tokens_per_s": best_b["tokens_per_s"]},
    "margin_bits_per_byte": best_b["bits_per_byte"] - best_o["bits_per_byte"],
    "runs": [{"system": r["system"], "block": r["block"], "rows": r["rows"], "bits_per_byte": r["bits_per_byte"],
              "tokens_per_s": r["tokens_per_s"], "time_to_target_s": r.get("time_to_target_s")} for r in runs],
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(f"\nSpeedrun on {summary['corpus']} ({summary['budget_s']:g} s, {summary['threads']} threads, {summary['cpu']}):")
for r in summary["runs"]:
    name = r["system"] + (f" --block={r['block']}" if r["system"].startswith("olmax") else "")
    print(f"  {name:<40} {r['rows']:<7} {r['bits_per_byte']:.3f} bits/byte  {r['tokens_per_s']:.0f} tokens/s")
print(f"best olmax: {best_o['block']} {best_o['bits_per_byte']:.3f}; best baseline: {best_b['system']} on {best_b['rows']} "
      f"{best_b['bits_per_byte']:.3f}; olmax ahead by {summary['margin_bits_per_byte']:.3f} bits/byte. {os.path.join(out, 'summary.json')}")
PY
}

{ [ "${SUMMARY_ONLY:-0}" != 0 ] || passes; summarize; exit; }
