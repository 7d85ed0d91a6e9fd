"""Merges bench_mixers' and peer.py's JSON lines into one JSON document and prints the ratio table
(run.sh calls it). Time rows: each olmax variant (fp32, and bf16 under its bf16 policy) against the fastest PyTorch variant of the same op and
shape (eager or torch.compile, fp32 or bf16 autocast) and against the fastest fp32 one. Memory rows:
olmax's peak tensor bytes and resident-set rise against PyTorch's resident-set rise."""

import argparse
import json


def key(row):
    return row["op"], json.dumps(row["shape"], sort_keys=True)


def shape_text(shape):
    return " ".join(f"{k}={v}" for k, v in shape.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args()
    rows = [json.loads(line) for path in args.inputs for line in open(path) if line.strip()]
    olmax = [r for r in rows if r["impl"] == "olmax"]
    peers = [r for r in rows if r["impl"] == "torch"]
    ratios, lines = [], []
    lines.append("| op | shape | olmax variant | olmax fwd ms | olmax fwd+bwd ms | best peer fwd+bwd ms (variant) | olmax / best peer | "
                 "best fp32 peer ms (variant) | olmax / best fp32 peer |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for o in (r for r in olmax if r["kind"] == "time"):
        same = [p for p in peers if p["kind"] == "time" and key(p) == key(o) and "forward_backward_ms" in p]
        best = min(same, key=lambda p: p["forward_backward_ms"], default=None)
        best32 = min((p for p in same if p["variant"].endswith("fp32")), key=lambda p: p["forward_backward_ms"], default=None)
        variant = o.get("variant", "fp32")
        entry = dict(op=o["op"], shape=o["shape"], olmax_variant=variant, olmax_forward_ms=o["forward_ms"],
                     olmax_forward_backward_ms=o["forward_backward_ms"])
        cells = [o["op"], shape_text(o["shape"]), variant, f"{o['forward_ms']:.1f}", f"{o['forward_backward_ms']:.1f}"]
        for name, p in (("best_peer", best), ("best_fp32_peer", best32)):
            if p is None:
                cells += ["-", "-"]
                continue
            ratio = o["forward_backward_ms"] / p["forward_backward_ms"]
            entry[name] = dict(variant=p["variant"], forward_backward_ms=p["forward_backward_ms"], olmax_over_peer=ratio)
            cells += [f"{p['forward_backward_ms']:.1f} ({p['variant']})", f"{ratio:.2f}"]
        ratios.append(entry)
        lines.append("| " + " | ".join(cells) + " |")
    mem = [r for r in olmax if r["kind"] == "memory"]
    if mem:
        lines += ["", "| op | shape | olmax peak tensor MiB | olmax RSS rise MiB | PyTorch RSS rise MiB |", "|---|---|---|---|---|"]
        for o in mem:
            p = next((p for p in peers if p["kind"] == "memory" and key(p) == key(o) and "peak_rss_bytes" in p), None)
            mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
            lines.append(f"| {o['op']} | {shape_text(o['shape'])} | {mib(o['peak_tensor_bytes'])} | {mib(o['peak_rss_bytes'])} | "
                         f"{mib(p['peak_rss_bytes']) if p else '-'} |")
    errors = [p for p in peers if "error" in p]
    for p in errors:
        lines.append(f"\npeer error: {p['op']} {shape_text(p['shape'])} {p.get('variant', '')}: {p['error']}")
    table = "\n".join(lines)
    cpu = next((r["cpu"] for r in rows if "cpu" in r), "unknown")
    doc = dict(command=args.command, cpu=cpu, threads=next((r["threads"] for r in olmax), None),
               ratio="olmax forward+backward ms / peer forward+backward ms (< 1: olmax faster)",
               ratios=ratios, table=table, rows=rows)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(table)
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
