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
# smallest (the target: at most 1.1). Then, if $repo/.venv/bin/python (or PYTHON) imports jax, the
# JAX peer (jax_byte_lm.py: the same ByteLM with depth as lax.scan) for the same depths and the
# blocks it has (conv_mixer, qrnn), on jaxlib's CPU backend (jax.json) and on the same plugin
# (jax_plugin.json), beside olmax.json, and a table of olmax's and jax's compile and step times.
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
python="${PYTHON:-$repo/.venv/bin/python}"
peer_blocks=$(tr ',' '\n' <<<"${BLOCKS:-conv_mixer,qrnn,mamba}" | grep -xE 'conv_mixer|qrnn' | paste -sd, || true)
if [ -z "$peer_blocks" ]; then
  echo "xla/run.sh: no block the jax peer has (conv_mixer, qrnn) in BLOCKS; jax peer skipped"
elif ! "$python" -c "import jax" 2>/dev/null; then
  echo "xla/run.sh: $python cannot import jax (tools/setup_jax_venv.sh); jax peer skipped"
else
  # The peer twice: on jaxlib's own CPU backend (jax.json), and on olmax's plugin (jax_plugin.json),
  # which separates the two programs from the two XLA builds. TF_CPP_MIN_LOG_LEVEL=3 there: the
  # plugin logs an error line per unmatched fusion, which is not a failure.
  peer=("$python" "$here/jax_byte_lm.py" --blocks "$peer_blocks" --depths "${DEPTHS:-4,16,64}" --repeats "${REPEATS:-3}")
  jax_before=$(cut -d' ' -f1-3 /proc/loadavg)
  JAX_PLATFORMS=cpu "${peer[@]}" --json "$out/jax.json"
  TF_CPP_MIN_LOG_LEVEL=3 "${peer[@]}" --plugin "$plugin" --json "$out/jax_plugin.json" 2> >(grep -v "is experimental" >&2)
  jax_after=$(cut -d' ' -f1-3 /proc/loadavg)
  "$python" - "$out" "$jax_before" "$jax_after" <<'PY'
import json, sys
out, before, after = sys.argv[1:4]
o, j, jp = (json.load(open(f"{out}/{name}.json")) for name in ("olmax", "jax", "jax_plugin"))
find = lambda doc, r: next((x for x in doc["rows"] if x["block"] == r["block"] and x["depth"] == r["depth"]), None)
print(f"\nolmax (traced eager step) against jax {j['jax']} (lax.scan over depth, jax.checkpoint), jax on jaxlib's CPU "
      f"backend and on olmax's {o['platform']} plugin; CPU {j['cpu']}; load average during the jax runs {before} -> {after}; medians\n")
print("| block | depth | olmax compile s | jax lower s | jax compile s | olmax / jax | jax compile s, plugin | olmax / jax, plugin "
      "| olmax step ms | jax step ms | jax step ms, plugin |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in j["rows"]:
    mine, p = find(o, r), find(jp, r)
    if mine is None or p is None:
        continue
    c = mine["compile_s_median"]
    print(f"| {r['block']} | {r['depth']} | {c:.3f} | {r['lower_s_median']:.3f} | {r['compile_s_median']:.3f} | "
          f"{c / r['compile_s_median']:.2f} | {p['compile_s_median']:.3f} | {c / p['compile_s_median']:.2f} | "
          f"{mine['step_s_median'] * 1e3:.1f} | {r['step_s_median'] * 1e3:.1f} | {p['step_s_median'] * 1e3:.1f} |")
for name, doc in (("olmax", o), ("jax", j), ("jax on the plugin", jp)):
    for block in dict.fromkeys(r["block"] for r in j["rows"]):
        rows = sorted((r for r in doc["rows"] if r["block"] == block), key=lambda r: r["depth"])
        print(f"{name}, {block}: compile time at depth {rows[-1]['depth']} / depth {rows[0]['depth']} = "
              f"{rows[-1]['compile_s_median'] / rows[0]['compile_s_median']:.2f}")
PY
fi
echo "xla/run.sh: results in $out"
