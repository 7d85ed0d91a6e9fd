#!/usr/bin/env python3
"""Summarises benchmarks/ab/run.sh: per figure, B / A in each round and the median of those ratios.

Ratios are oriented so that > 1 means B (the second build) is better: throughput B / A, time A / B.
"""
import glob
import json
import os
import statistics
import sys

scratch, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def load(path):
    with open(path) as f:
        return json.load(f)


def core_figures(path):
    figures = {}
    for b in load(path)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        if "FLOP/s" in b:
            figures[f"core {name} FLOP/s"] = b["FLOP/s"]
        elif "bytes_per_second" in b:
            figures[f"core {name} B/s"] = b["bytes_per_second"]
    return figures


def scan_figures(path):
    figures = {}
    for r in load(path)["rows"]:
        key = f"scan {r['strategy']} {r['backend']} {r['direction']} B={r['B']} T={r['T']} C={r['C']}"
        while key in figures:  # the same strategy and shape measured twice (e.g. other gates): keep both
            key += "'"
        figures[key] = 1.0 / r["seconds"]  # throughput: higher is better
    return figures


def train_figures(tag):
    figures = {}
    for path in glob.glob(f"{tag}_train_*.json"):
        r = load(path)
        name = os.path.basename(path)[len(os.path.basename(tag)) + len("_train_"):-len(".json")]
        figures[f"train_step {name} tokens/s"] = r["tokens_per_s"]
    return figures


def figures_of(round_, side):
    tag = os.path.join(scratch, f"r{round_}_{side}")
    f = {}
    f.update(core_figures(f"{tag}_core.json"))
    f.update(scan_figures(f"{tag}_scan.json"))
    f.update(train_figures(tag))
    return f


ratios, raw = {}, []
for r in range(1, rounds + 1):
    a, b = figures_of(r, "A"), figures_of(r, "B")
    raw.append({"round": r, "A": a, "B": b})
    for k in a:
        if k in b and a[k] > 0:
            ratios.setdefault(k, []).append(b[k] / a[k])
summary = {k: {"median_B_over_A": statistics.median(v), "min": min(v), "max": max(v), "rounds": len(v)} for k, v in sorted(ratios.items())}
with open(out, "w") as f:
    json.dump({"summary": summary, "raw": raw}, f, indent=1)
worst = sorted(summary.items(), key=lambda kv: kv[1]["median_B_over_A"])
print(f"{len(summary)} figures; median B/A over all: {statistics.median(s['median_B_over_A'] for s in summary.values()):.3f}")
for k, s in worst:
    print(f"{s['median_B_over_A']:6.3f}  [{s['min']:.3f}, {s['max']:.3f}]  {k}")
