#!/usr/bin/python3
"""Plot the scan strategy benchmark: useful GB/s vs T per strategy (forward and backward panels),
with the in-run rooflines (triad for the forward, 3-read/2-write for the backward) drawn.

    /usr/bin/python3 benchmarks/scan_strategies_plot.py scan.json scan.png
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    with open(argv[1]) as f:
        report = json.load(f)
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
    fig.savefig(argv[2], dpi=130)
    print("wrote", argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
