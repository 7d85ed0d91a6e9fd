#!/usr/bin/env bash
# Runs the training-step benchmark side by side: olmax (train_step) and PyTorch (torch_train_step.py,
# plain autograd and with torch.utils.checkpoint) on the same configurations and thread counts, each
# measurement in a fresh process (peak RSS never goes down within a process), interleaved so that
# machine load hits all three alike. Writes one merged JSON and prints the ratio table.
#
#     benchmarks/train_step/run.sh                          # build/benchmarks/train_step/train_step
#     benchmarks/train_step/run.sh build-trainbench         # another CMake build folder
#     QUICK=1 benchmarks/train_step/run.sh build-trainbench # tiny sizes, seconds (checks the plumbing)
#     WIDE=1 THREADS=2 benchmarks/train_step/run.sh          # features 512, depth 8, B 8, S 256 (42 M parameters)
#     SWEEP=1 THREADS=2 benchmarks/train_step/run.sh         # widths 64 128 256 512 1024 at depth 4, B 8, S 256
#     KEPT=8 WIDE=1 ...                                      # also olmax rows whose first 8 layers keep their activations
#     FUSED=1 ...                                            # also rows without gradient clipping (--max_grad_norm 0): olmax bf16
#                                                            # updating during backward (--update_in_backward 1), PyTorch bf16
#                                                            # autocast eager, compiled, and with its optimizer-in-backward hooks
# olmax rows keep AdamW's moments in float32 (train_step --adam_moments fp32, the main job's default),
# as torch.optim.AdamW does for float parameters; ADAM_MOMENTS=fp64 runs them with double moments
# (label suffix "-adam64"; rows recorded before 2026-11-26 had double moments, unlabelled).
# Rows "olmax-bf16" (train_step --precision bf16: every GEMM bf16 x bf16 -> fp32, on oneDNN's bf16 kernels
# where built with it) and "pytorch-bf16autocast-2.x" (the forward under torch.autocast("cpu", bfloat16))
# come beside the fp32 rows; BF16=0 leaves them out.
#
# Output: benchmarks/results/train_step-<UTC time>.json, a git-ignored folder (OUT=path to change it;
# the tracked results*.json beside this script are recorded runs, never overwritten by default). Each measurement stops repeating
# after MAX_SECONDS (default 20) of timed steps, at least 3 steps, so a run on an overloaded machine
# (where OpenMP fork-join with more threads than free cores can take seconds per step) stays bounded.
#
# Debian's python3-torch 1.13 does its matmuls through libblas.so.3, which is the unoptimised reference
# BLAS unless OpenBLAS is installed. When OpenBLAS is found in OPENBLAS_DIR (default: Debian's
# /usr/lib/x86_64-linux-gnu/openblas-pthread) and the system BLAS is not already OpenBLAS, PyTorch also
# runs with it on LD_LIBRARY_PATH (rows "pytorch-1.13+openblas", OPENBLAS_NUM_THREADS = threads). Without
# installing it system-wide:
#     apt-get download libopenblas0-pthread && dpkg -x libopenblas0-pthread_*.deb /tmp/openblas
#     OPENBLAS_DIR=/tmp/openblas/usr/lib/x86_64-linux-gnu/openblas-pthread benchmarks/train_step/run.sh
#
# PyTorch 2.x from PyPI (benchmarks/quality/setup_torch_venv.sh makes <repo>/.venv-torch) adds rows
# "pytorch-2.x+mkl" and "pytorch-checkpoint-2.x+mkl" when that venv (or TORCH2_PYTHON=path) imports
# torch; TORCH2_PYTHON=none leaves them out. With it come "pytorch-compiled-2.x" rows (torch.compile, fp32 and
# bf16 autocast; their compile_s is the first step's time, which compiles); COMPILE=0 leaves them out, and a
# compilation that fails (exit 3: no C++ toolchain or Python headers) leaves its row out with a note. Debian's 1.13 stays as the historical rows. Row labels
# name torch's major.minor version and the BLAS it computes with (BLAS_INFO of
# torch.__config__.show(); for Debian's generic build, the libblas.so.3 actually loaded).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
binary="$build/benchmarks/train_step/train_step"
python=/usr/bin/python3  # Debian's python3-torch lives here, not in a pyenv python
out="${OUT:-$repo/benchmarks/results/train_step-$(date -u +%Y%m%dT%H%M%SZ).json}"
mkdir -p "$(dirname "$out")"
torch2="${TORCH2_PYTHON:-$repo/.venv-torch/bin/python}"
if [ "$torch2" = none ] || ! "$torch2" -c "import torch" 2>/dev/null; then torch2=""; fi
openblas="${OPENBLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-pthread}"
if [ ! -e "$openblas/libblas.so.3" ] || readlink -f /lib/x86_64-linux-gnu/libblas.so.3 | grep -q openblas; then openblas=""; fi
debian_torch=1  # DEBIAN_TORCH=0 leaves Debian's 1.13 rows out (slow at large widths on the reference BLAS)
{ [ "${DEBIAN_TORCH:-1}" = 1 ] && "$python" -c "import torch" 2>/dev/null; } || debian_torch=""
if [ -z "$debian_torch" ] && [ -z "$torch2" ]; then
  echo "run.sh: neither $python (apt-get install python3-torch) nor .venv-torch (benchmarks/quality/setup_torch_venv.sh) imports torch" >&2
  exit 77
fi
[ -n "$debian_torch" ] || openblas=""
[ -x "$binary" ] || { echo "run.sh: no $binary; build it: cmake --build $build --target train_step" >&2; exit 1; }

# name batch sequence features depth repeats. "default" is TrainConfig's (examples/train_lm);
# the deeper ones are where the reversible stack's constant activation memory should show.
if [ -n "${QUICK:-}" ]; then
  configs=("quick 2 32 16 2 2" "quick-deep 2 32 16 4 2")
elif [ -n "${WIDE:-}" ]; then  # a realistic width (42 M parameters), where GEMMs dominate and bf16 pays
  configs=("wide 8 256 512 8 5")
elif [ -n "${SWEEP:-}" ]; then  # where bf16 and the matrix units start to pay, and how the ratio to PyTorch moves with width
  configs=("sweep-64 8 256 64 4 10" "sweep-128 8 256 128 4 10" "sweep-256 8 256 256 4 5" "sweep-512 8 256 512 4 5" "sweep-1024 8 256 1024 4 3")
else
  configs=("default 8 64 64 2 30" "deep 8 64 64 16 10" "deep-long 8 256 64 16 6")
fi
threads_list=(${THREADS:-1 2})

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
echo "# $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg); OpenBLAS rows: ${openblas:-none};" \
  "Debian torch: ${debian_torch:+$("$python" -c 'import torch; print(torch.__version__)')}${debian_torch:-none}; PyPI torch: ${torch2:-none}"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
i=0
for config in "${configs[@]}"; do
  read -r name batch sequence features depth repeats <<<"$config"
  for threads in "${threads_list[@]}"; do
    flags=(--batch "$batch" --sequence "$sequence" --features "$features" --depth "$depth" --threads "$threads" --repeats "$repeats"
           --max_seconds "${MAX_SECONDS:-20}")
    olmax_flags=("${flags[@]}" --adam_moments "${ADAM_MOMENTS:-fp32}")
    "$binary" "${olmax_flags[@]}" --json "$scratch/$i-a-olmax.json"
    [ "${BF16:-1}" = 1 ] && "$binary" "${olmax_flags[@]}" --precision bf16 --json "$scratch/$i-a1-olmax-bf16.json"
    if [ -n "${KEPT:-}" ]; then  # recompute as a budget: the first KEPT reversible layers keep their activations
      "$binary" "${olmax_flags[@]}" --kept_layers "$KEPT" --json "$scratch/$i-a2-olmax-kept.json"
      [ "${BF16:-1}" = 1 ] && "$binary" "${olmax_flags[@]}" --precision bf16 --kept_layers "$KEPT" --json "$scratch/$i-a3-olmax-bf16-kept.json"
    fi
    if [ "${FUSED:-}" = 1 ]; then  # no clipping: one backward (with clipping the update inside backward runs it twice)
      "$binary" "${olmax_flags[@]}" --precision bf16 --max_grad_norm 0 --update_in_backward 1 --json "$scratch/$i-a4-olmax-bf16-fused.json"
      [ -n "${KEPT:-}" ] && "$binary" "${olmax_flags[@]}" --precision bf16 --max_grad_norm 0 --update_in_backward 1 --kept_layers "$KEPT" \
        --json "$scratch/$i-a5-olmax-bf16-kept-fused.json"
      if [ -n "$torch2" ]; then
        "$torch2" "$here/torch_train_step.py" "${flags[@]}" --autocast_bf16 --max_grad_norm 0 --json "$scratch/$i-b02-pytorch2-bf16-clip0.json"
        "$torch2" "$here/torch_train_step.py" "${flags[@]}" --autocast_bf16 --max_grad_norm 0 --optimizer_in_backward \
          --json "$scratch/$i-b03-pytorch2-bf16-optinbwd.json"
        [ "${COMPILE:-1}" = 1 ] && { "$torch2" "$here/torch_train_step.py" "${flags[@]}" --compile --autocast_bf16 --max_grad_norm 0 \
          --json "$scratch/$i-b22-pytorch2-compiled-bf16-clip0.json" || echo "# torch.compile bf16 clip0 row left out (exit $?)"; }
      fi
    fi
    if [ -n "$torch2" ]; then
      "$torch2" "$here/torch_train_step.py" "${flags[@]}" --json "$scratch/$i-b0-pytorch2.json"
      [ "${BF16:-1}" = 1 ] && "$torch2" "$here/torch_train_step.py" "${flags[@]}" --autocast_bf16 --json "$scratch/$i-b01-pytorch2-bf16.json"
      "$torch2" "$here/torch_train_step.py" "${flags[@]}" --checkpoint --json "$scratch/$i-b1-pytorch2-checkpoint.json"
      if [ "${COMPILE:-1}" = 1 ]; then
        "$torch2" "$here/torch_train_step.py" "${flags[@]}" --compile --json "$scratch/$i-b2-pytorch2-compiled.json" ||
          echo "# torch.compile row left out (exit $?)"
        if [ "${BF16:-1}" = 1 ]; then
          "$torch2" "$here/torch_train_step.py" "${flags[@]}" --compile --autocast_bf16 --json "$scratch/$i-b21-pytorch2-compiled-bf16.json" ||
            echo "# torch.compile bf16 row left out (exit $?)"
        fi
      fi
    fi
    [ -n "$debian_torch" ] && "$python" "$here/torch_train_step.py" "${flags[@]}" --json "$scratch/$i-b-pytorch.json"
    if [ -n "$openblas" ]; then
      LD_LIBRARY_PATH="$openblas" OPENBLAS_NUM_THREADS="$threads" "$python" "$here/torch_train_step.py" "${flags[@]}" \
        --json "$scratch/$i-c-pytorch-openblas.json"
      LD_LIBRARY_PATH="$openblas" OPENBLAS_NUM_THREADS="$threads" "$python" "$here/torch_train_step.py" "${flags[@]}" \
        --checkpoint --json "$scratch/$i-d-pytorch-checkpoint.json"
      if [ "$threads" -gt 1 ]; then  # PyTorch's threads with single-threaded OpenBLAS (no oversubscription)
        LD_LIBRARY_PATH="$openblas" OPENBLAS_NUM_THREADS=1 "$python" "$here/torch_train_step.py" "${flags[@]}" \
          --json "$scratch/$i-e-pytorch-openblas1.json"
      fi
    elif [ -n "$debian_torch" ]; then
      "$python" "$here/torch_train_step.py" "${flags[@]}" --checkpoint --json "$scratch/$i-d-pytorch-checkpoint.json"
    fi
    for f in "$scratch/$i"-*.json; do
      "$python" -c 'import json, sys; r = json.load(open(sys.argv[1])); r["config"] = sys.argv[2]; json.dump(r, open(sys.argv[1], "w"))' \
        "$f" "$name"
    done
    i=$((i + 1))
  done
done
echo "# end $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"

LOAD_START="$load_start" LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)" "$python" - "$out" "$scratch" <<'EOF'
import glob, json, os, platform, sys
out, scratch = sys.argv[1], sys.argv[2]
order = lambda f: (int(os.path.basename(f).split("-")[0]), f)
rows = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(scratch, "*.json")), key=order)]
key = lambda r: (r["config"], r["batch"], r["sequence"], r["features"], r["depth"], r["threads"])
mib = lambda b: float("nan") if b is None else b / 2**20
tensor_peak = lambda r: f"{mib(r['peak_bytes']):.1f}" if "peak_bytes" in r else "-"
ratio = lambda a, b: float("nan") if a is None or not b else a / b
ok = True
print(f"\n{'config':10} {'B':>2} {'S':>4} {'F':>3} {'L':>3} {'thr':>3} {'params':>8} {'framework':40} {'ms/step':>8} {'tokens/s':>8}"
      f" {'olmax/this':>10} | {'step peak RSS MiB':>17} {'this/olmax':>10} | {'olmax tensor peak MiB':>21}")
for k in dict.fromkeys(key(r) for r in rows):
    group = [r for r in rows if key(r) == k]
    olmax = next(r for r in group if r["framework"] == "olmax")
    name, batch, sequence, features, depth, threads = k
    for r in group:
        if r["params"] != olmax["params"]:
            print(f"PARAMETER COUNTS DIFFER for {k}: olmax {olmax['params']}, {r['framework']} {r['params']}")
            ok = False
        print(f"{name:10} {batch:>2} {sequence:>4} {features:>3} {depth:>3} {threads:>3} {r['params']:>8} {r['framework']:40}"
              f" {r['seconds_median'] * 1e3:>8.2f} {r['tokens_per_s']:>8.0f} {ratio(olmax['tokens_per_s'], r['tokens_per_s']):>10.2f} |"
              f" {mib(r['peak_rss_bytes']):>17.1f} {ratio(r['peak_rss_bytes'], olmax['peak_rss_bytes']):>10.2f} |"
              f" {tensor_peak(r):>21}")
print("\nolmax/this: olmax tokens/s over the row's (> 1: olmax faster); this/olmax: the row's step peak RSS over olmax's"
      " (> 1: olmax smaller). Step peak RSS: VmHWM growth over one steady-state step after malloc_trim + clear_refs,"
      " fresh process per row. checkpoint: torch.utils.checkpoint per block. Tensor peak: olmax::memory::stats() in that step.")
json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_average_start": os.environ["LOAD_START"],
           "load_average_end": os.environ["LOAD_END"], "results": rows}, open(out, "w"), indent=1)
print(f"wrote {out}")
sys.exit(0 if ok else 1)
EOF
