#!/usr/bin/env python3
"""PyTorch reference of Mamba's selective scan, the peer of selective_scan.cpp: forward + backward
time and peak memory against T, same shapes and input distributions (not the same random numbers).

    .venv-torch/bin/python benchmarks/ssm/torch_selective_scan.py [--quick] [--threads 2] [--out FILE]

The computation (per channel e and state n, as scan::selective_scan):
    abar_t = exp(delta_t A),  h_t = abar_t h_{t-1} + delta_t B_t u_t,  y_t = sum_n C_t h_t + D u_t
u, delta [B, T, E]; A [E, N]; B, C [B, T, N]; D [E]. It is written the way the reference Mamba
repository's selective_scan_ref computes it: discretise into [B, T, E, N] tensors (deltaA, deltaB_u),
then a sequential loop over T in Python (x = deltaA[:, t] x + deltaB_u[:, t]; y_t = x . C[:, t]; the
slices taken once by unbind, see selective_scan()),
torch.stack of the outputs, plain autograd for the backward (every step's state is kept).

Memory: each T runs in a fresh process (peak RSS never goes down within one). Peak = VmHWM growth
over one forward + backward after the inputs exist, with freed heap given back (malloc_trim) and the
peak restarted (/proc/self/clear_refs = 5), as benchmarks/train_step/torch_train_step.py does; so,
like olmax's figure, it includes the input gradients. Time: median of `repeats` forward + backward.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {"batch": 1, "E": 64, "N": 16, "times": [256, 1024, 4096, 16384], "repeats": 5}
QUICK = {"batch": 1, "E": 8, "N": 16, "times": [64, 128], "repeats": 3}


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def restart_peak():
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def selective_scan(u, delta, A, B, C, D):
    import torch
    batch, time_steps, channels = u.shape
    x = u.new_zeros(batch, channels, A.shape[1])
    ys = []
    # Per-step slices through unbind (its backward is one stack): indexing x[:, t] in the loop, as
    # selective_scan_ref does, makes autograd add a full-size zero gradient per step, O(T^2).
    delta_a = torch.exp(delta.unsqueeze(-1) * A).unbind(1)  # T x [B, E, N]
    delta_b_u = ((delta * u).unsqueeze(-1) * B.unsqueeze(2)).unbind(1)  # T x [B, E, N]
    for t, c in enumerate(C.unbind(1)):
        x = delta_a[t] * x + delta_b_u[t]
        ys.append(torch.einsum("ben,bn->be", x, c))
    return torch.stack(ys, dim=1) + u * D


def measure_one(args):
    """Runs in the child: one T, prints one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    s = QUICK if args.quick else SIZES
    b, e, n, t = s["batch"], s["E"], s["N"], args.child
    g = torch.Generator().manual_seed(1)
    leaf = lambda x: x.requires_grad_()
    u = leaf(torch.randn(b, t, e, generator=g))
    delta = leaf(torch.rand(b, t, e, generator=g) * (0.1 - 0.001) + 0.001)
    A = leaf(torch.rand(e, n, generator=g) * (-1 + 16) - 16)
    B = leaf(torch.randn(b, t, n, generator=g))
    C = leaf(torch.randn(b, t, n, generator=g))
    D = leaf(torch.rand(e, generator=g) + 0.5)
    dy = torch.randn(b, t, e, generator=torch.Generator().manual_seed(2))
    inputs = [u, delta, A, B, C, D]

    def step():
        for x in inputs:
            x.grad = None
        start = time.perf_counter()
        y = selective_scan(*inputs, )
        y.backward(dy)
        return time.perf_counter() - start

    # One-time costs (autograd engine threads, kernel and MKL initialisation) must not count: warm up
    # on a short copy first, then free its memory and restart the peak.
    warm = [x.detach()[:, :8].clone().requires_grad_() if x.dim() == 3 else x.detach().clone().requires_grad_() for x in inputs]
    selective_scan(*warm, ).backward(dy[:, :8])
    del warm
    restart_ok = restart_peak()
    before = status_bytes("VmRSS")
    first = step()
    peak = status_bytes("VmHWM") - before if restart_ok else None
    times = [step() for _ in range(s["repeats"])]
    print(json.dumps({"T": t, "seconds": statistics.median(times), "first_seconds": first, "peak_rss_bytes": peak}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="E 8, T 64 and 128, 3 repeats (checks the plumbing)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write the JSON here too")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        measure_one(args)
        return 0
    import torch
    s = QUICK if args.quick else SIZES
    rows = []
    for t in s["times"]:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(t), "--threads", str(args.threads)]
        if args.quick:
            cmd.append("--quick")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"T {t:>6}: {rows[-1]['seconds'] * 1e3:9.1f} ms, peak RSS growth "
              f"{(rows[-1]['peak_rss_bytes'] or 0) / 1e6:8.1f} MB", file=sys.stderr, flush=True)
    result = {
        "op": f"PyTorch selective scan reference (selective_scan_ref form: [B, T, E, N] discretisation, sequential loop over T), forward + backward, float32",
        "framework": f"torch {torch.__version__}", "batch": s["batch"], "E": s["E"], "N": s["N"], "threads": args.threads,
        "repeats": s["repeats"], "load_average": list(os.getloadavg()), "results": rows,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
