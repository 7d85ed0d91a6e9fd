#!/usr/bin/python3
"""Plot the scan strategy benchmark: useful GB/s vs T per strategy (forward and backward panels),
with the in-run rooflines (triad for the forward, 3-read/2-write for the backward) drawn.

One command, from the repository root after `cmake --build build --target scan_strategies`:

    /usr/bin/python3 benchmarks/scan_strategies_plot.py scan.png

runs build/benchmarks/scan/scan_strategies --quick --no-peers (under a minute) and plots it. Or plot
a run you have (`scan_strategies --json run.json`, e.g. benchmarks/scan/results_quick.json):

    /usr/bin/python3 benchmarks/scan_strategies_plot.py --json run.json scan.png

Options: --program PATH (the benchmark to run), --peers (run the PyTorch peers too), --full (the full
run instead of --quick: minutes).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def run_benchmark(program, peers, full):
    """Runs the benchmark into a temporary JSON file and returns the report."""
    if not os.path.isfile(program):
        sys.exit(f"{program} does not exist: build it with `cmake --build build --target scan_strategies` (or pass --program)")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "scan.json")
        command = [program, "--json", path] + ([] if full else ["--quick"]) + ([] if peers else ["--no-peers"])
        print("running", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        with open(path) as f:
            return json.load(f)


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("inputs", nargs="+", metavar="[RUN.json] OUT.png", help="the picture to write (after an optional JSON run)")
    parser.add_argument("--json", help="plot this run instead of running the benchmark")
    parser.add_argument("--program", default=os.path.join(here, "..", "build", "benchmarks", "scan", "scan_strategies"))
    parser.add_argument("--peers", action="store_true", help="also run the PyTorch peers")
    parser.add_argument("--full", action="store_true", help="the full run (minutes) instead of --quick")
    args = parser.parse_args(argv[1:])
    if len(args.inputs) > 2:
        parser.error("at most a run and a picture")
    json_path = args.json or (args.inputs[0] if len(args.inputs) == 2 else None)
    out = args.inputs[-1]
    if json_path:
        with open(json_path) as f:
            report = json.load(f)
    else:
        report = run_benchmark(os.path.normpath(args.program), args.peers, args.full)
    fig, axes = plt.subplots(1, 2, figsize=(15, 9))
    for ax, direction, roof_key, roof_name in ((axes[0], "fwd", "triad_gbps", "triad (2R1W)"),
                                               (axes[1], "bwd", "r3w2_gbps", "3R2W")):
        series = defaultdict(list)
        for r in report["rows"]:
            if r["direction"] != direction:
                continue
            key = "%s / %s, B=%d C=%d" % (r["strategy"], r["backend"], r["B"], r["C"])
            series[key].append((r["T"], r["gbps"]))
        for key, points in sorted(series.items()):
            points.sort()
            ts, gbps = zip(*points)
            style = "--" if "pytorch" in key else "-"
            ax.plot(ts, gbps, style, marker="o", markersize=4, label=key)
        ax.axhline(report[roof_key], color="black", linewidth=2, label="roofline: %s %.1f GB/s" % (roof_name, report[roof_key]))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (time steps)")
        ax.set_ylabel("useful GB/s (fwd 12 B/elt, bwd 20 B/elt)")
        ax.set_title("scan %s, fp32, %d threads" % (direction, report["threads"]))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)  # below: the quick run has few T values
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
