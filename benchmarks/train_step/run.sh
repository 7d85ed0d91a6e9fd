#!/usr/bin/env bash
# Runs the training-step benchmark side by side: olmax (train_step) and PyTorch (torch_train_step.py,
# plain autograd and with torch.utils.checkpoint) on the same configurations and thread counts, each
# measurement in a fresh process (peak RSS never goes down within a process), interleaved so that
# machine load hits all three alike. Writes one merged JSON and prints the ratio table.
#
#     benchmarks/train_step/run.sh                          # build/benchmarks/train_step/train_step
#     benchmarks/train_step/run.sh build-trainbench         # another CMake build folder
#     QUICK=1 benchmarks/train_step/run.sh build-trainbench # tiny sizes, seconds (checks the plumbing)
#
# Output: benchmarks/train_step/results.json (OUT=path to change it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${1:-$repo/build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
binary="$build/benchmarks/train_step/train_step"
python=/usr/bin/python3  # Debian's python3-torch lives here, not in a pyenv python
out="${OUT:-$here/results.json}"
[ -x "$binary" ] || { echo "run.sh: no $binary; build it: cmake --build $build --target train_step" >&2; exit 1; }

# name batch sequence features depth repeats. "default" is TrainConfig's (examples/train_lm);
# the deeper ones are where the reversible stack's constant activation memory should show.
if [ -n "${QUICK:-}" ]; then
  configs=("quick 2 32 16 2 2" "quick-deep 2 32 16 4 2")
else
  configs=("default 8 64 64 2 30" "deep 8 64 64 16 10" "deep-long 8 256 64 16 6")
fi
threads_list=(${THREADS:-1 2})

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
echo "# $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
i=0
for config in "${configs[@]}"; do
  read -r name batch sequence features depth repeats <<<"$config"
  for threads in "${threads_list[@]}"; do
    flags=(--batch "$batch" --sequence "$sequence" --features "$features" --depth "$depth" --threads "$threads" --repeats "$repeats")
    "$binary" "${flags[@]}" --json "$scratch/$i-olmax.json"
    "$python" "$here/torch_train_step.py" "${flags[@]}" --json "$scratch/$i-pytorch.json"
    "$python" "$here/torch_train_step.py" "${flags[@]}" --checkpoint --json "$scratch/$i-pytorch-checkpoint.json"
    for f in "$scratch/$i"-*.json; do
      "$python" -c 'import json, sys; r = json.load(open(sys.argv[1])); r["config"] = sys.argv[2]; json.dump(r, open(sys.argv[1], "w"))' \
        "$f" "$name"
    done
    i=$((i + 1))
  done
done
echo "# end $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$out" "$scratch" <<'EOF'
import glob, json, os, platform, sys
out, scratch = sys.argv[1], sys.argv[2]
order = lambda f: (int(os.path.basename(f).split("-")[0]), f)
rows = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(scratch, "*.json")), key=order)]
key = lambda r: (r["config"], r["batch"], r["sequence"], r["features"], r["depth"], r["threads"])
by = {(key(r), r["framework"]): r for r in rows}
mib = lambda b: float("nan") if b is None else b / 2**20
ratio = lambda a, b: float("nan") if a is None or not b else a / b
ok = True
print(f"\n{'config':10} {'B':>2} {'S':>4} {'F':>3} {'L':>3} {'thr':>3} {'params':>8} | tokens/s: {'olmax':>7} {'pytorch':>7} {'ckpt':>7} |"
      f" {'ol/pt':>5} {'ol/ck':>5} | step peak RSS MiB: {'olmax':>6} {'pytorch':>7} {'ckpt':>6} | {'ol/pt':>5} {'ol/ck':>5} |"
      f" olmax tensor peak MiB")
for k in dict.fromkeys(key(r) for r in rows):
    o, p, c = by[(k, "olmax")], by[(k, "pytorch")], by[(k, "pytorch-checkpoint")]
    if not (o["params"] == p["params"] == c["params"]):
        print(f"PARAMETER COUNTS DIFFER for {k}: olmax {o['params']}, pytorch {p['params']}, checkpoint {c['params']}")
        ok = False
    name, batch, sequence, features, depth, threads = k
    print(f"{name:10} {batch:>2} {sequence:>4} {features:>3} {depth:>3} {threads:>3} {o['params']:>8} |"
          f"           {o['tokens_per_s']:>7.0f} {p['tokens_per_s']:>7.0f} {c['tokens_per_s']:>7.0f} |"
          f" {ratio(o['tokens_per_s'], p['tokens_per_s']):>5.2f} {ratio(o['tokens_per_s'], c['tokens_per_s']):>5.2f} |"
          f"                    {mib(o['peak_rss_bytes']):>6.1f} {mib(p['peak_rss_bytes']):>7.1f} {mib(c['peak_rss_bytes']):>6.1f} |"
          f" {ratio(o['peak_rss_bytes'], p['peak_rss_bytes']):>5.2f} {ratio(o['peak_rss_bytes'], c['peak_rss_bytes']):>5.2f} |"
          f" {mib(o['peak_bytes']):>8.1f}")
print("\nstep peak RSS: VmHWM growth over one steady-state step after malloc_trim + clear_refs (fresh process per row);"
      " ckpt: PyTorch with torch.utils.checkpoint per block; tensor peak: olmax::memory::stats() during that step")
json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} cores", "results": rows}, open(out, "w"), indent=1)
print(f"wrote {out}")
sys.exit(0 if ok else 1)
EOF
