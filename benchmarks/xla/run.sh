#!/usr/bin/env bash
# Compile time, module size and step time of the whole training step against depth: olmax's traced
# step on the xla-cpu-pjrt CPU plugin beside the same model in jax (lax.scan over stacked weights,
# and unrolled layers up to depth 16), one after the other in the same run.
#
#     cmake --build build --target bench_xla_whole_step
#     benchmarks/xla/run.sh [build]
#
# Environment: DEPTHS (4,16,64,256), REPEATS (3 compiles per depth, median), OUT (default
# benchmarks/results/xla-whole-step-<UTC time>, git-ignored), PLUGIN (default: the wheel's plugin in
# .venv), PYTHON (default .venv/bin/python, which tools/setup_jax_venv.sh makes). Writes olmax.json,
# jax.json and prints a markdown table with the CPU model and the load average.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
bench="$build/benchmarks/xla/bench_xla_whole_step"
[ -x "$bench" ] || { echo "xla/run.sh: no $bench; build it: cmake --build $build --target bench_xla_whole_step" >&2; exit 1; }
python="${PYTHON:-$repo/.venv/bin/python}"
plugin="${PLUGIN:-$(ls "$repo"/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so 2>/dev/null | head -1)}"
[ -n "$plugin" ] || { echo "xla/run.sh: no CPU plugin; run tools/setup_jax_venv.sh or set PLUGIN" >&2; exit 1; }
depths="${DEPTHS:-4,16,64,256}"
out="${OUT:-$repo/benchmarks/results/xla-whole-step-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=2 JAX_PLATFORMS=cpu
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
"$bench" --plugin "$plugin" --depths "$depths" --repeats "${REPEATS:-3}" --json "$out/olmax.json"
"$python" "$here/jax_whole_step.py" --depths "$depths" | tail -1 > "$out/jax.json"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
"$python" - "$out" "$load_before" "$load_after" <<'PY'
import json, sys, platform
out, before, after = sys.argv[1:4]
o = json.load(open(f"{out}/olmax.json"))
j = json.load(open(f"{out}/jax.json"))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
print(f"\nCPU {cpu}; load average {before} -> {after}; vocab {o['vocab']}, features {o['features']}, tokens {o['tokens']}; medians\n")
print("| depth | olmax module bytes | olmax XLA compile s | olmax step ms | jax lax.scan compile s | jax lax.scan step ms | jax unrolled compile s |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for r in o["rows"]:
    d = r["depth"]
    scan = next((x for x in j["rows"] if x["depth"] == d and x["form"] == "lax.scan"), None)
    unr = next((x for x in j["rows"] if x["depth"] == d and x["form"] == "unrolled"), None)
    f = lambda x, k, s=1: f"{x[k]*s:.3f}" if x else "-"
    print(f"| {d} | {r['module_bytes']} | {r['compile_s_median']:.3f} | {r['step_s_median']*1e3:.1f} | {f(scan,'compile_s')} | "
          f"{f(scan,'step_s_median',1e3)} | {f(unr,'compile_s')} |")
json.dump({"cpu": cpu, "load_before": before, "load_after": after, "olmax": o, "jax": j}, open(f"{out}/summary.json", "w"), indent=1)
PY
echo "xla/run.sh: results in $out"
