"""PyTorch references of olmax's new sequence mixers (bench_mixers.cpp), on the same shapes and thread
count: forward and forward + backward, eager and torch.compile, fp32 and bf16 autocast.

- causal attention: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) on
  [B, H, T, Dh] (on the CPU, PyTorch's flash-attention kernel with its tiled backward);
- the gated delta rule: `gated_delta_chunked` below, the chunked WY / UT form written from the maths
  (Yang et al., "Gated Delta Networks", arXiv:2412.06464; the same form as the "naive chunk" references),
  chunk 64, autograd for the backward; or transformers' `torch_chunk_gated_delta_rule` when
  `transformers` is importable;
- Mamba-2's SSD: `ssd_minimal_discrete` and `segsum`, vendored from state-spaces/mamba's
  mamba_ssm/modules/ssd_minimal.py (rewritten without einops), y = ssd(x dt, A dt, B, C) + D x.

One timed run: fresh leaves (every input requires grad), out = f(inputs) [forward_ms],
loss = sum(out * dout), loss.backward() [forward_backward_ms]; medians of --runs runs after
--warmups. Under bf16 the whole run (loss included) is inside torch.autocast("cpu", torch.bfloat16).
torch.compile variants run in a child process each, under --compile-timeout seconds; a failure or a
timeout is recorded as the row's "error" and the script goes on.

Memory (SDPA at T = 1k, 4k, 16k, B = 1, H = 2, Dh = 64; SSD at T = 16k, B = 1, H = 8, P = N = 64; fp32 eager):
PyTorch's CPU allocator does not go through Python's, so tracemalloc would see nothing; peak_rss_bytes is
the rise of the resident set over one forward + backward (VmHWM after, reset through
/proc/self/clear_refs, minus VmRSS before), each T in a fresh child process.

Output: one JSON object per line, to stdout and appended to --json FILE when given.
Usage: peer.py [--quick] [--runs N] [--warmups N] [--json FILE] [--only attention|gated_delta|ssd]
               [--variants eager_fp32,eager_bf16,compile_fp32,compile_bf16] [--no-memory] [--check]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "quality"))
from compare import cpu_model  # noqa: E402  (the quality driver's: the CPU's model name from /proc/cpuinfo)


# ---- the references ----------------------------------------------------------------------------


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gated_delta_chunked(q, k, v, g, beta, chunk=64, scale=None):
    """o [B, T, H, V] of the gated delta rule S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,
    o_t = scale S_t^T q_t, S_{-1} = 0; q, k [B, T, H, K], v [B, T, H, V], g, beta [B, T, H]; T a multiple of
    chunk. Chunked WY form: within a chunk, gamma = cumsum(g), Gamma_ij = exp(gamma_i - gamma_j) (i >= j),
    A = strict_tril(diag(beta) K K^T . Gamma), W = (I + A)^-1 diag(beta)(K . e^gamma), U = (I + A)^-1 diag(beta) V;
    across chunks V_new = U - W S, O = (Q . e^gamma) S + tril(Q K^T . Gamma) V_new,
    S' = e^{gamma_L} S + (K . e^{gamma_L - gamma})^T V_new."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    assert t % chunk == 0, "T must be a multiple of the chunk"
    n = t // chunk
    scale = dk ** -0.5 if scale is None else scale

    def split(x):  # [B, T, H, ...] -> [B, H, n, C, ...]
        return x.transpose(1, 2).reshape(b, h, n, chunk, *x.shape[3:])

    acc = q.dtype  # the leaves' dtype (fp32 here; float64 in --check): the solve and the state stay in it under autocast
    q, k, v, g, beta = split(q) * scale, split(k), split(v), split(g), split(beta)
    gamma = g.to(acc).cumsum(-1)  # [B, H, n, C]
    incl = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    strict = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~incl, float("-inf")).exp()  # Gamma
    kb = k * beta[..., None]
    a = ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0)
    unit = torch.eye(chunk, dtype=acc) + a.to(acc)
    rhs = torch.cat([kb * gamma.exp()[..., None], v * beta[..., None]], dim=-1).to(acc)
    wu = torch.linalg.solve_triangular(unit, rhs, upper=False, unitriangular=True)  # forward substitution
    w, u = wu[..., :dk], wu[..., dk:]
    qk = (q @ k.transpose(-1, -2)) * decay  # tril(Q K^T . Gamma): decay is 0 above the diagonal
    q_decayed = q * gamma.exp()[..., None]
    k_decayed = k * (gamma[..., -1:] - gamma).exp()[..., None]
    state = q.new_zeros(b, h, dk, dv, dtype=acc)
    outs = []
    for c in range(n):
        v_new = u[:, :, c] - w[:, :, c] @ state.to(w.dtype)
        outs.append(q_decayed[:, :, c] @ state.to(q_decayed.dtype) + qk[:, :, c] @ v_new.to(qk.dtype))
        state = state * gamma[:, :, c, -1].exp()[..., None, None] + k_decayed[:, :, c].transpose(-1, -2) @ v_new.to(k_decayed.dtype)
    return torch.stack(outs, dim=2).reshape(b, h, t, dv).transpose(1, 2)


def gated_delta_recurrent(q, k, v, g, beta, scale=None):
    """The step-by-step recurrence, for --check."""
    b, t, h, dk = q.shape
    scale = dk ** -0.5 if scale is None else scale
    state = q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for s in range(t):
        kt, vt, qt = k[:, s], v[:, s], q[:, s]  # [B, H, *]
        state = state * g[:, s].exp()[..., None, None]
        u = beta[:, s, :, None] * (vt - torch.einsum("bhkv,bhk->bhv", state, kt))
        state = state + kt[..., :, None] * u[..., None, :]
        outs.append(scale * torch.einsum("bhkv,bhk->bhv", state, qt))
    return torch.stack(outs, dim=1)


try:  # transformers' pure-torch chunked gated delta rule, when installed
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as _hf_gdr
except Exception:  # noqa: BLE001 - any import failure means: use ours
    _hf_gdr = None


def gated_delta(q, k, v, g, beta, chunk=64):
    if _hf_gdr is not None:
        return _hf_gdr(q, k, v, g=g, beta=beta, chunk_size=chunk)[0]
    return gated_delta_chunked(q, k, v, g, beta, chunk)


GATED_DELTA_IMPL = ("transformers.torch_chunk_gated_delta_rule" if _hf_gdr is not None
                    else "gated_delta_chunked (peer.py, chunked WY form from the maths)")


# Vendored (rewritten without einops) from state-spaces/mamba, mamba_ssm/modules/ssd_minimal.py:
# segsum and ssd_minimal_discrete.
def segsum(x):
    """[..., T] -> [..., T, T] with out[i, j] = sum_{j < s <= i} x[s] for i >= j, -inf above the diagonal
    (the stable form: a masked cumulative sum, no difference of sums)."""
    t = x.size(-1)
    x = x[..., None].expand(*x.shape, t)  # x[..., i, j] = x[i]
    x = x.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(-1), 0)
    x_segsum = torch.cumsum(x, dim=-2)
    return x_segsum.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(0), float("-inf"))


def ssd_minimal_discrete(X, A, B, C, block_len, initial_states=None):
    """X [b, T, h, p], A [b, T, h], B, C [b, T, h, n] -> Y [b, T, h, p], final state [b, h, p, n]."""
    b, t, h, p = X.shape
    c, l = t // block_len, block_len
    assert t % block_len == 0
    X, A, B, C = [x.reshape(b, c, l, *x.shape[2:]) for x in (X, A, B, C)]
    A = A.permute(0, 3, 1, 2)  # b h c l
    A_cumsum = torch.cumsum(A, dim=-1)
    # 1. intra-chunk outputs (diagonal blocks)
    L = torch.exp(segsum(A))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)
    # 2. the state of each chunk
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)
    # 3. inter-chunk recurrence
    if initial_states is None:
        initial_states = torch.zeros_like(states[:, :1])
    states = torch.cat([initial_states, states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    # 4. state -> output
    state_decay_out = torch.exp(A_cumsum)
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, state_decay_out)
    return (Y_diag + Y_off).reshape(b, t, h, p), final_state


def ssd(x, dt, A, B, C, D, chunk=64):
    h = x.shape[2]
    Bh = B.expand(-1, -1, h, -1) if B.shape[2] == 1 else B.repeat_interleave(h // B.shape[2], dim=2)
    Ch = C.expand(-1, -1, h, -1) if C.shape[2] == 1 else C.repeat_interleave(h // C.shape[2], dim=2)
    y, _ = ssd_minimal_discrete(x * dt[..., None], A * dt, Bh, Ch, chunk)
    return y + D[:, None] * x


def ssd_sequential(x, dt, A, B, C, D):
    """The recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t (G = 1), for --check."""
    b, t, h, p = x.shape
    state = x.new_zeros(b, h, p, B.shape[-1])
    ys = []
    for s in range(t):
        state = state * (dt[:, s] * A).exp()[..., None, None] + (dt[:, s, :, None] * x[:, s])[..., None] * B[:, s, 0][:, None, None, :]
        ys.append(torch.einsum("bhpn,bn->bhp", state, C[:, s, 0]) + D[:, None] * x[:, s])
    return torch.stack(ys, dim=1)


# ---- the cases -----------------------------------------------------------------------------------


def attention_case(b, t, h, dh):
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(b, h, t, dh, generator=gen) for _ in range(3)]
    return dict(op="causal_attention", shape=dict(B=b, T=t, H=h, Dh=dh), fn=sdpa, inputs=inputs,
                dout=torch.randn(b, h, t, dh, generator=gen), impl_name="F.scaled_dot_product_attention(is_causal=True)")


def gated_delta_case(b, t, h, dk, dv, chunk):
    gen = torch.Generator().manual_seed(2)
    q = F.normalize(torch.randn(b, t, h, dk, generator=gen), dim=-1)
    k = F.normalize(torch.randn(b, t, h, dk, generator=gen), dim=-1)
    v = torch.randn(b, t, h, dv, generator=gen)
    g = -0.01 - 0.09 * torch.rand(b, t, h, generator=gen)
    beta = 0.1 + 0.8 * torch.rand(b, t, h, generator=gen)
    return dict(op="gated_delta_rule", shape=dict(B=b, T=t, H=h, K=dk, V=dv, chunk=chunk),
                fn=lambda *x: gated_delta(*x, chunk=chunk), inputs=[q, k, v, g, beta],
                dout=torch.randn(b, t, h, dv, generator=gen), impl_name=GATED_DELTA_IMPL)


def ssd_case(b, t, h, p, n, groups, chunk):
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(b, t, h, p, generator=gen), 0.001 + 0.099 * torch.rand(b, t, h, generator=gen),
              -1 - 15 * torch.rand(h, generator=gen), torch.randn(b, t, groups, n, generator=gen),
              torch.randn(b, t, groups, n, generator=gen), 0.5 + torch.rand(h, generator=gen)]
    return dict(op="ssd", shape=dict(B=b, T=t, H=h, P=p, N=n, G=groups, chunk=chunk),
                fn=lambda *x: ssd(*x, chunk=chunk), inputs=inputs, dout=torch.randn(b, t, h, p, generator=gen),
                impl_name="ssd_minimal_discrete (mamba_ssm/modules/ssd_minimal.py, vendored) + D x")


def cases(op_filter, quick):
    s = 16 if quick else 1
    out = []
    if op_filter in (None, "attention"):
        out += [attention_case(1, t // s, 8, 64) for t in (1024, 2048, 4096)]
    if op_filter in (None, "gated_delta"):
        out += [gated_delta_case(1, 2048 // s, 8, d, d, 64) for d in (64, 128)]
    if op_filter in (None, "ssd"):
        out.append(ssd_case(1, 2048 // s, 8, 64, 64, 1, 64))
    return out


# ---- measuring ---------------------------------------------------------------------------------------


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_once(fn, inputs, dout, bf16):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        t0 = time.perf_counter()
        out = fn(*leaves)
        fwd = time.perf_counter() - t0
        (out * dout).sum().backward()
    return fwd, time.perf_counter() - t0


def median(xs):
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def time_case(case, variant, runs, warmups):
    compile_, bf16 = variant.startswith("compile"), variant.endswith("bf16")
    row = dict(kind="time", impl="torch", variant=variant, op=case["op"], shape=case["shape"], threads=torch.get_num_threads(),
               cpu=cpu_model(), torch=torch.__version__, reference=case["impl_name"], runs=runs, warmups=warmups)
    fn = torch.compile(case["fn"]) if compile_ else case["fn"]
    try:
        t0 = time.perf_counter()
        run_once(fn, case["inputs"], case["dout"], bf16)  # the first call compiles
        if compile_:
            row["compile_s"] = round(time.perf_counter() - t0, 2)
        for _ in range(warmups):
            run_once(fn, case["inputs"], case["dout"], bf16)
        times = [run_once(fn, case["inputs"], case["dout"], bf16) for _ in range(runs)]
        row["forward_ms"] = 1e3 * median([t[0] for t in times])
        row["forward_backward_ms"] = 1e3 * median([t[1] for t in times])
    except Exception as e:  # noqa: BLE001 - record and go on
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    row["loadavg"] = loadavg()
    return row


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


MEMORY_CASES = {  # the shapes of bench_mixers' memory rows
    "causal_attention": lambda t: attention_case(1, t, 2, 64),
    "ssd": lambda t: ssd_case(1, t, 8, 64, 64, 1, 64),
}


def memory_row(op, t):
    """One forward + backward of `op` (SDPA at B = 1, H = 2, Dh = 64; SSD at bench_mixers' memory
    shape), fp32 eager: the rise of the resident set."""
    case = MEMORY_CASES[op](t)
    leaves = [x.detach().clone().requires_grad_(True) for x in case["inputs"]]
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        method = "VmHWM after (reset via /proc/self/clear_refs) - VmRSS before, fresh process"
    except OSError as e:
        method = f"unavailable: {e}"
    before = status_bytes("VmRSS")
    t0 = time.perf_counter()
    out = case["fn"](*leaves)
    (out * case["dout"]).sum().backward()
    seconds = time.perf_counter() - t0
    peak = status_bytes("VmHWM") - before if not method.startswith("unavailable") else 0
    return dict(kind="memory", impl="torch", variant="eager_fp32", op=case["op"], shape=case["shape"],
                threads=torch.get_num_threads(), cpu=cpu_model(), torch=torch.__version__, reference=case["impl_name"],
                peak_rss_bytes=peak, rss_method=method, input_bytes=sum(x.numel() * 4 for x in case["inputs"]),
                seconds=seconds, loadavg=loadavg())


def check():
    """The references against their sequential recurrences (small sizes, float64)."""
    torch.manual_seed(0)
    with torch.no_grad():
        c = gated_delta_case(2, 128, 3, 16, 8, 32)
        x = [t.double() for t in c["inputs"]]
        err = (gated_delta_chunked(*x, chunk=32) - gated_delta_recurrent(*x)).abs().max().item()
        print(f"gated delta chunked vs recurrent: max abs diff {err:.2e}")
        assert err < 1e-9
        c = ssd_case(2, 128, 4, 8, 6, 1, 32)
        x = [t.double() for t in c["inputs"]]
        err = (ssd(*x, chunk=32) - ssd_sequential(*x)).abs().max().item()
        print(f"ssd_minimal_discrete vs sequential: max abs diff {err:.2e}")
        assert err < 1e-9


def emit(row, json_path):
    line = json.dumps(row)
    print(line, flush=True)
    if json_path:
        with open(json_path, "a") as f:
            f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmups", type=int, default=1)
    ap.add_argument("--json", default="")
    ap.add_argument("--only", choices=["attention", "gated_delta", "ssd"])
    ap.add_argument("--variants", default="eager_fp32,eager_bf16,compile_fp32,compile_bf16")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--compile-timeout", type=float, default=600)
    ap.add_argument("--check", action="store_true", help="check the references against their recurrences, then exit")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # "case_index:variant" or "memory:op:T"
    args = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    if args.check:
        check()
        return
    all_cases = cases(args.only, args.quick)
    if args.child:  # one row in this process, printed as the last line
        what, arg = args.child.split(":", 1)
        if what == "memory":
            op, t = arg.split(":")
            row = memory_row(op, int(t))
        else:
            row = time_case(all_cases[int(what)], arg, args.runs, args.warmups)
        print(json.dumps(row), flush=True)
        return

    def child(spec, timeout, fallback):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", spec, "--runs", str(args.runs), "--warmups", str(args.warmups)]
        cmd += (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode == 0 and lines:
                return json.loads(lines[-1])
            fallback["error"] = f"child exited {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:300]}"
        except subprocess.TimeoutExpired:
            fallback["error"] = f"timed out after {timeout:.0f} s (compile + runs)"
        fallback["loadavg"] = loadavg()
        return fallback

    if not args.no_memory:
        runs = []
        if args.only in (None, "attention"):
            runs += [("causal_attention", t) for t in (1024, 4096, 16384)]
        if args.only in (None, "ssd"):
            runs += [("ssd", 16384)]
        for op, t in runs:
            t //= 16 if args.quick else 1
            emit(child(f"memory:{op}:{t}", 1200, dict(kind="memory", impl="torch", op=op, shape=MEMORY_CASES[op](t)["shape"])),
                 args.json)
    variants = [v for v in args.variants.split(",") if v]
    for i, case in enumerate(all_cases):
        for variant in variants:
            if variant.startswith("compile"):
                row = child(f"{i}:{variant}", args.compile_timeout,
                            dict(kind="time", impl="torch", variant=variant, op=case["op"], shape=case["shape"],
                                 threads=torch.get_num_threads(), cpu=cpu_model(), torch=torch.__version__,
                                 reference=case["impl_name"]))
            else:
                row = time_case(case, variant, args.runs, args.warmups)
            emit(row, args.json)


if __name__ == "__main__":
    main()
