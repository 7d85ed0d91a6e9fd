#!/usr/bin/python3
"""Plot train and held-out loss against tokens seen from a metrics CSV written by examples/train_lm
(columns step,tokens,split,loss,bits_per_byte; split is "train" or "eval").

    /usr/bin/python3 scripts/plot_loss.py runs/train_lm/metrics.csv -o runs/train_lm/loss.png [--baseline 4.5]
"""
import argparse
import csv
import pathlib

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=pathlib.Path)
    parser.add_argument("-o", "--output", type=pathlib.Path, default=None, help="PNG path (default: loss.png next to the CSV)")
    parser.add_argument("--baseline", type=float, default=None, help="draw a horizontal line at this loss (e.g. the unigram entropy)")
    args = parser.parse_args()

    series = {}
    with args.metrics.open() as f:
        for row in csv.DictReader(f):
            series.setdefault(row["split"], ([], []))
            series[row["split"]][0].append(float(row["tokens"]))
            series[row["split"]][1].append(float(row["loss"]))
    if not series:
        raise SystemExit(f"{args.metrics}: no rows")

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    styles = {"train": dict(alpha=0.6, linewidth=1), "eval": dict(marker="o", linewidth=2)}
    for split, (tokens, loss) in sorted(series.items()):
        ax.plot(tokens, loss, label=f"{split} loss", **styles.get(split, {}))
    if args.baseline is not None:
        ax.axhline(args.baseline, color="gray", linestyle="--", label=f"unigram baseline {args.baseline:.3f}")
    ax.set_xlabel("tokens (bytes) seen")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title("olmax byte-level LM")
    ax.grid(True, alpha=0.3)
    ax.legend()
    out = args.output or args.metrics.with_name("loss.png")
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
