#!/usr/bin/env bash
# Compile time, module size and step time of the main job's whole training step (ByteLM's eager
# step traced once) against depth, for each block, on the xla-cpu-pjrt CPU plugin (or PLUGIN).
#
#     cmake --build build --target bench_xla_whole_step
#     benchmarks/xla/run.sh [build]
#
# Environment: DEPTHS (4,16,64), BLOCKS (conv_mixer,qrnn,mamba), REPEATS (3 compiles per depth,
# median), OUT (default benchmarks/results/xla-whole-step-<UTC time>, git-ignored), PLUGIN (default:
# the wheel's plugin in .venv). Writes olmax.json and summary.json and prints a markdown table with
# the CPU model, the load average and each block's compile time at its largest depth over its
# smallest (the target: at most 1.1).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
bench="$build/benchmarks/xla/bench_xla_whole_step"
[ -x "$bench" ] || { echo "xla/run.sh: no $bench; build it: cmake --build $build --target bench_xla_whole_step" >&2; exit 1; }
plugin="${PLUGIN:-$(ls "$repo"/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so 2>/dev/null | head -1)}"
[ -n "$plugin" ] || { echo "xla/run.sh: no CPU plugin; run tools/setup_jax_venv.sh or set PLUGIN" >&2; exit 1; }
out="${OUT:-$repo/benchmarks/results/xla-whole-step-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=2
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
"$bench" --plugin "$plugin" --depths "${DEPTHS:-4,16,64}" --blocks "${BLOCKS:-conv_mixer,qrnn,mamba}" --repeats "${REPEATS:-3}" \
  --json "$out/olmax.json"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$load_before" "$load_after" <<'PY'
import json, sys, platform
out, before, after = sys.argv[1:4]
o = json.load(open(f"{out}/olmax.json"))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
print(f"\nCPU {cpu}; load average {before} -> {after}; {o['platform']} plugin; features {o['features']}, batch {o['batch']} x {o['sequence']}; medians\n")
print("| block | depth | module bytes | trace ms | XLA compile s | step ms |")
print("|---|---:|---:|---:|---:|---:|")
for r in o["rows"]:
    print(f"| {r['block']} | {r['depth']} | {r['module_bytes']} | {r['trace_s']*1e3:.1f} | {r['compile_s_median']:.3f} | {r['step_s_median']*1e3:.1f} |")
flat = {}
for block in dict.fromkeys(r["block"] for r in o["rows"]):
    rows = sorted((r for r in o["rows"] if r["block"] == block), key=lambda r: r["depth"])
    flat[block] = rows[-1]["compile_s_median"] / rows[0]["compile_s_median"]
    print(f"\n{block}: compile time at depth {rows[-1]['depth']} / depth {rows[0]['depth']} = {flat[block]:.2f}")
json.dump({"cpu": cpu, "load_before": before, "load_after": after, "olmax": o, "compile_ratio_largest_over_smallest": flat},
          open(f"{out}/summary.json", "w"), indent=1)
PY
echo "xla/run.sh: results in $out"
