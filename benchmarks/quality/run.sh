#!/usr/bin/env bash
# Quality against the baseline users know (issue 15 item 5): held-out bits/byte of olmax's main job
# (examples/train_lm, every block choice) and of a PyTorch 2.x nanoGPT-style byte transformer
# (nanogpt_baseline.py, nanoGPT's shakespeare_char CPU recipe), same corpus, same held-out split and
# evaluation rows, same wall-clock budget, same thread count. See docs/QUALITY.md.
#
#     benchmarks/quality/setup_torch_venv.sh               # once: PyTorch from PyPI into .venv-torch
#     cmake --build build --target train_lm dump_split
#     benchmarks/quality/run.sh                            # build/; 5 minutes per run, 2 threads
#     BUDGET_S=20 TORCH_MODES=recipe benchmarks/quality/run.sh build   # a functional check (seconds)
#
# Environment: BUDGET_S (300), THREADS (2), BLOCKS (comma/space separated train_lm --block values;
# default: every choice train_lm --help lists, or its one model when it has no --block flag; none:
# only the baseline, on the rows train_lm's flags give),
# TORCH_MODES ("fill fill_compiled": cosine over the whole budget, eager and torch.compile'd; "recipe":
# nanoGPT's max_iters 2000 or the budget, whichever ends first), CORPUS (fortunes, the default, or
# python_docs: the reStructuredText sources of Python 3.11's documentation, 512 files, 11 MB, from
# Debian's python3.11-doc package, fetched with apt-get download into benchmarks/results/corpora/, no
# root needed; perl_docs: Perl 5.36's POD documentation, 206 files, 8.8 MB, from Debian's perl-doc, the
# same way), DATA (any other corpus for train_lm --data), EVAL_EVERY_S (30: both systems also
# evaluate every so many seconds of training, which gives the time to TARGET_BITS (2.6); 0: only at
# the end), TRAIN_LM_FLAGS (more train_lm flags, e.g. --preset=small), TORCH_BLOCK_SIZE (the baseline's
# context, nanoGPT's block_size: 64, its recipe's; give train_lm's --sequence to score both on the same
# rows), TORCH_PYTHON (default
# .venv-torch/bin/python), OUT (default benchmarks/results/quality-<UTC time>, git-ignored).
# Writes one JSON per run and summary.json into OUT, and prints a markdown table.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
train_lm="$build/examples/train_lm"
dump_split="$build/benchmarks/quality/dump_split"
torch_python="${TORCH_PYTHON:-$repo/.venv-torch/bin/python}"
out="${OUT:-$repo/benchmarks/results/quality-$(date -u +%Y%m%dT%H%M%SZ)}"
for binary in "$train_lm" "$dump_split"; do
  [ -x "$binary" ] || { echo "run.sh: no $binary; build it: cmake --build $build --target train_lm dump_split" >&2; exit 1; }
done
"$torch_python" -c "import torch, numpy" 2>/dev/null ||
  { echo "run.sh: $torch_python cannot import torch and numpy; run benchmarks/quality/setup_torch_venv.sh" >&2; exit 77; }
corpus="${CORPUS:-fortunes}"
data="${DATA:-}"
# A corpus from a Debian package: extracts package $1 into benchmarks/results/corpora/$1 (apt-get
# download: no root) unless it is there, and prints the first path under it that matches $2.
debian_corpus() {
  local corpora="$repo/benchmarks/results/corpora"
  if ! compgen -G "$corpora/$1/$2" > /dev/null; then
    mkdir -p "$corpora"
    (cd "$corpora" && apt-get download "$1" >/dev/null && dpkg-deb -x "$1"_*.deb "$1") ||
      { echo "run.sh: could not fetch Debian's $1 (apt-get download $1)" >&2; exit 1; }
  fi
  compgen -G "$corpora/$1/$2" | head -1
}
case "$corpus" in
  fortunes) ;;
  python_docs) data="$(debian_corpus python3.11-doc usr/share/doc/python3.11/html/_sources)" ;;
  perl_docs) data="$(debian_corpus perl-doc 'usr/share/perl/*/pod')" ;;
  *) echo "run.sh: CORPUS must be fortunes, python_docs or perl_docs (or give DATA=path), got '$corpus'" >&2; exit 2 ;;
esac
[ -z "${DATA:-}" ] || corpus="$(basename "$DATA")"
command="BUDGET_S=${BUDGET_S:-300} THREADS=${THREADS:-2}${BLOCKS:+ BLOCKS=\"$BLOCKS\"} TORCH_MODES=\"${TORCH_MODES-fill fill_compiled}\"${TORCH_BLOCK_SIZE:+ TORCH_BLOCK_SIZE=$TORCH_BLOCK_SIZE} CORPUS=$corpus${DATA:+ DATA=$DATA}${TRAIN_LM_FLAGS:+ TRAIN_LM_FLAGS=\"$TRAIN_LM_FLAGS\"} EVAL_EVERY_S=${EVAL_EVERY_S:-30} benchmarks/quality/run.sh ${1:-}"
exec /usr/bin/python3 "$here/compare.py" --train_lm "$train_lm" --dump_split "$dump_split" --torch_python "$torch_python" \
  --out "$out" --budget_s "${BUDGET_S:-300}" --threads "${THREADS:-2}" --blocks "${BLOCKS:-}" \
  --torch_modes="${TORCH_MODES-fill fill_compiled}" --torch_block_size="${TORCH_BLOCK_SIZE:-64}" --data="$data" --extra="${TRAIN_LM_FLAGS:-}" \
  --corpus_name="$corpus" --eval_every_s="${EVAL_EVERY_S:-30}" --target_bits="${TARGET_BITS:-2.6}" --command="$command"
