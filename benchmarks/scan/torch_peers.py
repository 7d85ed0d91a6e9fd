#!/usr/bin/python3
"""PyTorch CPU peers of the olmax scan benchmark: h_t = a_t * h_{t-1} + x_t written the ways PyTorch
users write it -- a Python loop over time, the original Olmax log-depth (Hillis-Steele) loop in torch
ops, and Heinsen's cumsum/logcumsumexp trick (sign-split so any real x works) -- forward and backward
(autograd), fp32, on the shapes of the C++ benchmark. Writes one JSON object per line with the same
fields as the C++ rows (backend "pytorch"); max_rel_err is measured on the first batch element against a float64
log-depth reference. Called by scan_strategies; runnable on its own:

    /usr/bin/python3 benchmarks/scan/torch_peers.py --threads 2 --triad 20 --r3w2 20 --out peers.jsonl --quick
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch


def loop_scan(a, x):
    # unbind, not a[:, t]: each indexing op's backward materialises a full-size zero gradient
    # (quadratic in T), while unbind's backward is one stack.
    h = torch.zeros_like(x[:, 0])
    out = []
    for a_t, x_t in zip(a.unbind(1), x.unbind(1)):
        h = a_t * h + x_t
        out.append(h)
    return torch.stack(out, dim=1)


def hillis_steele(a, x):
    """The original's log-depth loop with ceil(log2 T) steps (x += shift(x) * f; f *= shift(f))."""
    T = x.shape[1]
    d = 1
    while d < T:
        pad_x = torch.zeros_like(x[:, :d])
        pad_a = torch.ones_like(a[:, :d])
        x = x + a * torch.cat([pad_x, x[:, :-d]], dim=1)
        if 2 * d < T:
            a = a * torch.cat([pad_a, a[:, :-d]], dim=1)
        d *= 2
    return x


def heinsen(a, x):
    """log h_t = a*_t + logcumsumexp(log x_s - a*_s), a* = cumsum(log a); positive and negative x apart."""
    a_star = torch.cumsum(torch.log(a), dim=1)
    pos = torch.logcumsumexp(torch.log(torch.relu(x)) - a_star, dim=1)
    neg = torch.logcumsumexp(torch.log(torch.relu(-x)) - a_star, dim=1)
    return torch.exp(a_star + pos) - torch.exp(a_star + neg)


def reference(a, x):
    with torch.no_grad():
        return hillis_steele(a.double(), x.double())


def reverse_reference(a, dh):
    """g_t = dh_t + a_{t+1} g_{t+1}: the adjoint, i.e. the exact gradient of x."""
    with torch.no_grad():
        shifted = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], dim=1)
        return torch.flip(hillis_steele(torch.flip(shifted.double(), [1]), torch.flip(dh.double(), [1])), [1])


def normwise(got, ref):
    err = (got.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    return float("inf") if math.isnan(err) else (err / scale if scale > 0 else err)


def median_time(f, repeats):
    t0 = time.perf_counter()
    f()
    first = time.perf_counter() - t0
    if first > 2.0:
        return first
    times = []
    for _ in range(repeats if first < 0.5 else min(repeats, 3)):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--triad", type=float, required=True)
    p.add_argument("--r3w2", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = [(16, 4096, 1024), (1, 1 << 24, 1), (1, 4096, 256)]
    repeats = 3 if args.quick else 10
    rows = []
    for B, T, C in shapes:
        n = B * T * C
        a = torch.rand(B, T, C)
        x = torch.rand(B, T, C) * 2 - 1
        dh = torch.rand(B, T, C) * 2 - 1
        # Errors are measured on the first batch element (the fp64 reference of 2^26 elements costs
        # minutes), and the forward's on the first 2^20 steps (a prefix of a scan is the scan of the
        # prefix); the backward's reference is made only when a backward row needs it.
        t_ref = min(T, 1 << 20)
        h_ref = reference(a[:1, :t_ref], x[:1, :t_ref])
        g_ref = None
        big = n > (1 << 22)
        for name, fn in (("torch_loop", loop_scan), ("torch_hillis_steele", hillis_steele), ("torch_heinsen_cumsum", heinsen)):
            if name == "torch_loop" and T > 65536:
                continue  # a Python step per time index: minutes at T = 2^24
            if args.quick and big and name == "torch_heinsen_cumsum" and C > 1:
                continue  # --quick: logcumsumexp along a strided axis of 2^26 elements takes minutes on 2 cores
            if args.quick and big and name == "torch_hillis_steele":
                continue  # --quick: 24-26 full-size passes (~20-40 s per shape); the full run measures it
            with torch.no_grad():
                h = fn(a, x)
                fs = median_time(lambda: fn(a, x), repeats)
            rows.append(dict(strategy=name, backend="pytorch", direction="fwd", B=B, T=T, C=C, dtype="float32", seconds=fs,
                             gbps=12 * n / fs / 1e9, roofline_gbps=args.triad, roofline_fraction=12 * n / fs / 1e9 / args.triad,
                             gelem_per_s=n / fs / 1e9, max_rel_err=normwise(h[:1, :t_ref], h_ref)))
            del h
            print("  %s fwd %s: %.3f s" % (name, (B, T, C), fs), file=sys.stderr, flush=True)
            if (name == "torch_hillis_steele" and big) or (args.quick and big and name == "torch_heinsen_cumsum" and C > 1):
                # autograd keeps 2 log2(T) full-size intermediates (gigabytes); --quick skips the
                # strided logcumsumexp's backward at 2^26
                continue
            xg = x.clone().requires_grad_(True)
            ag = a.clone().requires_grad_(True)

            def fwd_bwd():
                xg.grad = None
                ag.grad = None
                fn(ag, xg).backward(dh)

            if g_ref is None:
                g_ref = reverse_reference(a[:1], dh[:1])
            total = median_time(fwd_bwd, repeats)
            bs = max(total - fs, 1e-9)  # backward alone: forward+backward minus the forward
            rows.append(dict(strategy=name, backend="pytorch", direction="bwd", B=B, T=T, C=C, dtype="float32", seconds=bs,
                             gbps=20 * n / bs / 1e9, roofline_gbps=args.r3w2, roofline_fraction=20 * n / bs / 1e9 / args.r3w2,
                             gelem_per_s=n / bs / 1e9, max_rel_err=normwise(xg.grad[:1], g_ref)))
            del xg, ag
        for r in rows[-6:]:
            if r["B"] == B and r["T"] == T and r["C"] == C:
                print("%-34s %-10s %-4s %5d %9d %5d %11.5f %8.2f %6.2f %8.3f %10.2e" % (
                    r["strategy"], "pytorch", r["direction"], B, T, C, r["seconds"], r["gbps"], r["roofline_fraction"],
                    r["gelem_per_s"], r["max_rel_err"]), flush=True)
        del a, x, dh, h_ref, g_ref
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
