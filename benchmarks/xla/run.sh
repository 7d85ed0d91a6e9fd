#!/usr/bin/env bash
# Compile time, module size and step time of the main job's whole training step (ByteLM's eager
# step traced once, as train::XlaTrainer traces it) against depth, for each block, on the
# xla-cpu-pjrt CPU plugin (or PLUGIN), and the same against the JAX peer (jax_byte_lm.py: the same
# ByteLM with depth as lax.scan), on jaxlib's own CPU backend and on the same plugin.
#
#     cmake --build build --target bench_xla_whole_step
#     benchmarks/xla/run.sh [build]
#
# Environment: DEPTHS (4,16,64), BLOCKS (conv_mixer,qrnn,mamba,moe), REPEATS (3 compiles per depth,
# median), ROUNDS (1), OUT (default benchmarks/results/xla-whole-step-<UTC time>, git-ignored),
# PLUGIN (default: the wheel's plugin in .venv), PYTHON (default $repo/.venv/bin/python; without
# jax the peer is skipped).
#
# The three measurements run interleaved, one process each, for every round, block and depth:
# olmax, then jax on jaxlib, then jax on the plugin. So all three see the same load (run one after
# another, a load change in between decided the ratios: benchmarks/RESULTS.md, "Compile time
# against depth"). Writes olmax.json, jax.json, jax_plugin.json (every row, with its round) and
# summary.json, and prints markdown tables with the CPU model, the load average, each block's
# compile time at its largest depth over its smallest (the target: at most 1.1), and olmax against
# jax: XLA compile alone, and the whole time to an executable (olmax: trace + compile; jax: lower
# + compile).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../build_folder.sh" "${1:-}"  # repo, build
bench="$build/benchmarks/xla/bench_xla_whole_step"
[ -x "$bench" ] || { echo "xla/run.sh: no $bench; build it: cmake --build $build --target bench_xla_whole_step" >&2; exit 1; }
source "$here/cpu_plugin.sh" xla/run.sh
source "$here/defaults.sh"  # default_blocks
out="${OUT:-$repo/benchmarks/results/xla-whole-step-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=2
python="${PYTHON:-$repo/.venv/bin/python}"
peer=1
if ! "$python" -c "import jax" 2>/dev/null; then
  echo "xla/run.sh: $python cannot import jax (tools/setup_jax_venv.sh); jax peer skipped"
  peer=0
fi
IFS=: read -r features batch sequence <<< "${SHAPE:-64:8:64}"
shape=(--features "$features" --batch "$batch" --sequence "$sequence" --steps "${STEPS:-5}")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "${ROUNDS:-1}"); do
  for block in $(tr ',' ' ' <<<"${BLOCKS:-$default_blocks}"); do
    for depth in $(tr ',' ' ' <<<"${DEPTHS:-4,16,64}"); do
      tag="$block-$depth-$round"
      "$bench" --plugin "$plugin" --depths "$depth" --blocks "$block" --repeats "${REPEATS:-3}" "${shape[@]}" --json "$out/olmax-$tag.json"
      [ "$peer" = 1 ] || continue
      # TF_CPP_MIN_LOG_LEVEL=3 on the plugin: it logs an error line per unmatched fusion, which is
      # not a failure.
      jax=("$python" "$here/jax_byte_lm.py" --blocks "$block" --depths "$depth" --repeats "${REPEATS:-3}" "${shape[@]}")
      JAX_PLATFORMS=cpu "${jax[@]}" --json "$out/jax-$tag.json"
      TF_CPP_MIN_LOG_LEVEL=3 "${jax[@]}" --plugin "$plugin" --json "$out/jax_plugin-$tag.json" 2> >(grep -v "is experimental" >&2)
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$load_before" "$load_after" <<'PY'
import glob, json, os, platform, statistics, sys
out, before, after = sys.argv[1:4]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())

def merged(name):  # every row of name-<block>-<depth>-<round>.json, with its round
    doc, rows = None, []
    for path in sorted(glob.glob(f"{out}/{name}-*.json")):
        d = json.load(open(path))
        for r in d["rows"]:
            r["round"] = int(path.rsplit("-", 1)[1].split(".")[0])
            rows.append(r)
        doc = d
    if doc is None:
        return None
    doc["rows"] = rows
    json.dump(doc, open(f"{out}/{name}.json", "w"), indent=1)
    return doc

o, j, jp = merged("olmax"), merged("jax"), merged("jax_plugin")
rounds = sorted({r["round"] for r in o["rows"]})
print(f"\nCPU {cpu}; load average {before} -> {after}; {o['platform']} plugin; features {o['features']}, batch {o['batch']} x "
      f"{o['sequence']}; {len(rounds)} round(s); compile s: medians of the repeats\n")
print("| block | depth | round | module bytes | trace ms | XLA compile s | step ms |")
print("|---|---:|---:|---:|---:|---:|---:|")
for r in o["rows"]:
    print(f"| {r['block']} | {r['depth']} | {r['round']} | {r['module_bytes']} | {r['trace_s']*1e3:.1f} | {r['compile_s_median']:.3f} | "
          f"{r['step_s_median']*1e3:.1f} |")
blocks = list(dict.fromkeys(r["block"] for r in o["rows"]))

def flat_ratio(doc, block):  # largest depth over smallest, each the median over rounds
    by = {}
    for r in doc["rows"]:
        if r["block"] == block:
            by.setdefault(r["depth"], []).append(r["compile_s_median"])
    d = sorted(by)
    return d[0], d[-1], statistics.median(by[d[-1]]) / statistics.median(by[d[0]])

summary = {"cpu": cpu, "load_before": before, "load_after": after, "olmax": o, "compile_ratio_largest_over_smallest": {}}
for name, doc in (("olmax", o), ("jax", j), ("jax on the plugin", jp)):
    if doc is None:
        continue
    for block in dict.fromkeys(r["block"] for r in doc["rows"]):
        lo, hi, ratio = flat_ratio(doc, block)
        summary["compile_ratio_largest_over_smallest"][f"{name}, {block}"] = ratio
        print(f"{name}, {block}: compile time at depth {hi} / depth {lo} = {ratio:.2f}")
if j is not None and jp is not None:
    find = lambda doc, r: next((x for x in doc["rows"] if (x["block"], x["depth"], x["round"]) == (r["block"], r["depth"], r["round"])), None)
    print(f"\nolmax against jax {j['jax']} (lax.scan over depth, jax.checkpoint), run interleaved; XLA compile s, and to an "
          "executable: olmax trace + compile, jax lower + compile\n")
    print("| block | depth | round | olmax compile s | jax compile s | olmax / jax | jax compile s, plugin | olmax / jax, plugin | "
          "olmax trace + compile s | jax lower + compile s | olmax / jax | olmax step ms | jax step ms | jax step ms, plugin |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = {}
    for r in o["rows"]:
        a, b = find(j, r), find(jp, r)
        if a is None or b is None:
            continue
        c, total = r["compile_s_median"], r["trace_s"] + r["compile_s_median"]
        jtotal = a["lower_s_median"] + a["compile_s_median"]
        ratios.setdefault(r["block"], []).append((c / a["compile_s_median"], c / b["compile_s_median"], total / jtotal,
                                                  r["step_s_median"] / a["step_s_median"], r["step_s_median"] / b["step_s_median"]))
        print(f"| {r['block']} | {r['depth']} | {r['round']} | {c:.3f} | {a['compile_s_median']:.3f} | {c / a['compile_s_median']:.2f} | "
              f"{b['compile_s_median']:.3f} | {c / b['compile_s_median']:.2f} | {total:.3f} | {jtotal:.3f} | {total / jtotal:.2f} | "
              f"{r['step_s_median'] * 1e3:.1f} | {a['step_s_median'] * 1e3:.1f} | {b['step_s_median'] * 1e3:.1f} |")
    summary["olmax_over_jax_median"] = {}
    for block, rs in ratios.items():
        med = [statistics.median(x[i] for x in rs) for i in range(5)]
        summary["olmax_over_jax_median"][block] = {"compile": med[0], "compile_plugin": med[1], "to_executable": med[2],
                                                   "step": med[3], "step_plugin": med[4]}
        print(f"{block}: olmax / jax, medians over depths and rounds: compile {med[0]:.2f}, compile on the plugin {med[1]:.2f}, "
              f"to an executable {med[2]:.2f}; step time {med[3]:.2f}, on the plugin {med[4]:.2f}")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
echo "xla/run.sh: results in $out"
