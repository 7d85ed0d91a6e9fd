#!/usr/bin/env python3
"""Step-time model for data-parallel training on N machines (issue 14 item 6), from measured figures.

    benchmarks/distributed/step_model.py STEP_SCALING_DIR/summary.json [--bandwidth_gbs 1.25 ...]

Inputs, all measured on one machine by benchmarks/distributed/step_scaling.sh: per preset, the
compute time of one step on one machine (the 1 process x all threads run, minus its exchange time,
which is ~0 for one process), and the gradient size (4 bytes per parameter).

Model (weak scaling: every machine keeps its own batch, so the global batch grows with N and the
compute per step stays that of one machine). One step on N machines takes

    t(N) = t_compute + t_allreduce(N)       (no overlap: olmax reduces after backward)
    t_allreduce(N) = 2 (N-1)/N * G / bandwidth + buckets * 2 (N-1) * latency

G the gradient bytes, buckets = ceil(G / 25 MiB) (allreduce_gradients' default; its has-gradient
flags travel in the first bucket), plus one more tiny collective per step (train_lm's loss and stop
flag, in double), each 2 (N-1) latencies. The first term is the
bandwidth-optimal volume every rank sends and receives (ring, or olmax's direct reduce-scatter +
allgather, which moves the same bytes); the second counts message rounds, which for olmax's direct
exchange are N-1 concurrent messages per phase (2 (N-1) latencies is the ring's count; olmax's
rounds overlap, so this is an upper bound for it). Communication dominates once
t_allreduce(N) > t_compute. Efficiency = t_compute / t(N).
"""
import argparse
import json
import math


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", help="summary.json written by step_scaling.sh")
    p.add_argument("--bandwidth_gbs", type=float, nargs="+", default=[1.25, 12.5],
                   help="per-machine link bandwidth in GB/s (default: 10 Gb/s and 100 Gb/s Ethernet)")
    p.add_argument("--latency_us", type=float, default=50.0, help="per-message latency in microseconds (default 50)")
    p.add_argument("--machines", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--bucket_mib", type=float, default=25.0)
    a = p.parse_args()

    s = json.load(open(a.summary))
    runs = s["runs"]
    full = max(r["threads_per_process"] for r in runs if r["processes"] == 1)
    print(f"Measured on: {s['cpu_model']}; compute per step from the 1 process x {full} threads runs.")
    print(f"Assumed: latency {a.latency_us:g} us per message, buckets of {a.bucket_mib:g} MiB, no overlap with backward.\n")
    header = "| preset | parameters | gradient MB | compute ms/step |"
    for bw in a.bandwidth_gbs:
        for n in a.machines:
            header += f" N={n} @ {bw:g} GB/s |"
    print(header)
    print("|---|---:|---:|---:|" + "---:|" * (len(a.bandwidth_gbs) * len(a.machines)))
    for r in runs:
        if r["processes"] != 1 or r["threads_per_process"] != full:
            continue
        compute_s = (r["train_seconds"] - r["exchange_seconds"]) * r["ms_per_step"] / 1e3 / r["train_seconds"]
        grad_bytes = 4 * r["parameters"]
        buckets = max(1, math.ceil(grad_bytes / (a.bucket_mib * 2**20)))
        row = f"| {r['preset']} | {r['parameters']:,} | {grad_bytes / 1e6:.2f} | {compute_s * 1e3:.1f} |"
        for bw in a.bandwidth_gbs:
            for n in a.machines:
                volume = 2 * (n - 1) / n * grad_bytes / (bw * 1e9)
                latency = (buckets + 1) * 2 * (n - 1) * a.latency_us * 1e-6
                comm = volume + latency
                share = comm / (compute_s + comm)
                mark = " **comm-bound**" if comm > compute_s else ""
                row += f" {1e3 * (compute_s + comm):.1f} ms ({100 * share:.0f}% comm){mark} |"
        print(row)


if __name__ == "__main__":
    main()
