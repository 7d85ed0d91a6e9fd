#!/usr/bin/python3
"""PyTorch peer of train_step.cpp: one training step (forward + backward + AdamW with global-norm
clipping) of the same byte-level model as olmax::models::ByteLM (include/olmax/models/byte_lm.hpp), on random byte batches.

    /usr/bin/python3 benchmarks/train_step/torch_train_step.py --batch 8 --sequence 64 --features 64 --depth 2 --threads 1

The model is written from the olmax layer definitions (include/olmax/nn/*.hpp), same sizes and
parameter count:
  Embedding [256, F]  ->  two streams (x, x)
  depth x Reversible(DenseConv<5>, HierarchicalMixer<16>) with the additive coupling
      (a, b) -> (b, a + f(b)) for f = DenseConv, then for f = HierarchicalMixer (RevNet)
      DenseConv: causal conv K=5 F->2F (no bias) -> ScaleNorm(2F, scale) -> leaky ReLU(0.01) -> causal conv 2F->F
      HierarchicalMixer<16>: positions grouped [B, S/(16 s), 16, s, F] with stride s = min(16^m, S/16),
          m = layer mod ceil(log16 S); mix along the 16 with upper-triangular (causal) W0, ScaleNorm(F, scale),
          leaky ReLU, mix with W1
  merge (a + b) -> ScaleNorm without scale -> logits = h W_out [F, 256] -> cross-entropy + z-loss 0.01 * mean(lse^2)
      (the loss value excludes the z-loss term, its gradient includes it, as olmax's chunked loss)
ScaleNorm is x / max(||x||_2, eps) * w (eps 1e-16), not RMSNorm.
Optimiser: torch.optim.AdamW(lr 3e-3, betas (0.9, 0.99), eps 1e-8, weight decay 0.01 on matrices and
the embedding only), torch.nn.utils.clip_grad_norm_(1.0), linear warmup over 50 steps (TrainConfig defaults);
--max_grad_norm 0 --optimizer_in_backward updates each parameter from its gradient hook instead.

Backward is plain autograd (every activation kept, PyTorch's normal way); --checkpoint wraps every block in
torch.utils.checkpoint (recompute in backward), the usual PyTorch way to trade time for memory.

Memory (the same method as train_step.cpp): peak_rss_bytes is the growth of the process's peak resident
set over one steady-state step after warm-up: freed heap pages go back to the OS (glibc malloc_trim),
the peak is restarted from the current RSS (writing 5 to /proc/self/clear_refs, Linux >= 4.0), then
VmHWM after the step minus VmRSS before it (/proc/self/status). first_step_rss_bytes is VmHWM growth over
the first step from just after the model and optimiser are built (includes one-time costs such as lazy
library initialisation and AdamW's lazily created moments). footprint_rss_bytes is VmHWM at exit minus
VmRSS after `import torch`, before the model is built. Each configuration runs in a fresh process. (Linux
counts RSS per thread in batches, so RSS figures are good to ~0.25 MiB.)
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

VOCAB = 256
CONV_KERNEL = 5
MIXER_CHUNK = 16
NORM_EPS = 1e-16
LEAKY_SLOPE = 0.01
Z_LOSS = 0.01


def proc_status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def blas_label(loaded):
    """The BLAS torch computes with, for the row's label: BLAS_INFO of torch.__config__.show() ("mkl" in
    PyPI's torch 2.x, where numpy's bundled OpenBLAS may be mapped into the process but unused);
    for "generic" builds (Debian's python3-torch calls libblas.so.3) the library actually loaded:
    "openblas" or "refblas" (the unoptimised reference BLAS)."""
    import re
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    info = m.group(1) if m else "unknown"
    if info != "generic":
        return info
    return "openblas" if "openblas" in loaded else "refblas"


def loaded_blas():
    """Path of the BLAS library this process loaded (Debian's python3-torch calls whatever libblas.so.3
    resolves to: the reference BLAS by default, OpenBLAS when installed or put on LD_LIBRARY_PATH)."""
    torch.randn(64, 64) @ torch.randn(64, 64)
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "blas" in line.split()[-1]}
    return ",".join(sorted(paths)) or "none"


def restart_peak_rss():
    """Gives freed heap pages back to the OS and restarts VmHWM from the current RSS; False where unsupported."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def scale_norm(x, scale):
    """x / max(||x||_2, eps) * scale over the last axis (olmax::scale_norm)."""
    y = x / x.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS)
    return y if scale is None else y * scale


class CausalConv(torch.nn.Module):
    """out[t] = sum_k x[t - (K-1) + k] w[k]: left zero-padding K-1 then conv1d (weight [Cout, Cin, K])."""

    def __init__(self, cin, cout):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(cout, cin, CONV_KERNEL) / math.sqrt(CONV_KERNEL * cin))

    def forward(self, x):  # [B, T, C]
        h = F.pad(x.transpose(1, 2), (CONV_KERNEL - 1, 0))
        return F.conv1d(h, self.weight).transpose(1, 2)


class DenseConv(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.conv0 = CausalConv(features, 2 * features)
        self.scale = torch.nn.Parameter(torch.ones(2 * features))
        self.conv1 = CausalConv(2 * features, features)

    def forward(self, x):
        return self.conv1(F.leaky_relu(scale_norm(self.conv0(x), self.scale), LEAKY_SLOPE))


def mixer_levels(sequence):
    levels, span = 1, MIXER_CHUNK
    while span < sequence:
        levels, span = levels + 1, span * MIXER_CHUNK
    return levels


class HierarchicalMixer(torch.nn.Module):
    def __init__(self, features, layer_index):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.nn.init.orthogonal_(torch.empty(MIXER_CHUNK, MIXER_CHUNK)))
        self.w1 = torch.nn.Parameter(torch.nn.init.orthogonal_(torch.empty(MIXER_CHUNK, MIXER_CHUNK)))
        self.scale = torch.nn.Parameter(torch.ones(features))
        self.register_buffer("mask", torch.triu(torch.ones(MIXER_CHUNK, MIXER_CHUNK)))  # mask[k, g] = k <= g
        self.layer_index = layer_index

    def mix(self, grouped, w):  # [B, G, K, s, F]: out[.., g, ..] = sum_{k <= g} in[.., k, ..] W[k, g]
        return torch.matmul(grouped.permute(0, 1, 3, 4, 2), w * self.mask).permute(0, 1, 4, 2, 3)

    def forward(self, x):
        batch, sequence, features = x.shape
        stride = min(MIXER_CHUNK ** (self.layer_index % mixer_levels(sequence)), sequence // MIXER_CHUNK)
        h = self.mix(x.reshape(batch, sequence // (MIXER_CHUNK * stride), MIXER_CHUNK, stride, features), self.w0)
        h = F.leaky_relu(scale_norm(h, self.scale), LEAKY_SLOPE)
        return self.mix(h, self.w1).reshape(x.shape)


class Reversible(torch.nn.Module):
    """RevNet coupling: (a, b) -> (b, a + f(b)) with f = dense, then with f = mixer."""

    def __init__(self, features, layer_index):
        super().__init__()
        self.dense = DenseConv(features)
        self.mixer = HierarchicalMixer(features, layer_index)

    def forward(self, a, b):
        a, b = b, a + self.dense(b)
        return b, a + self.mixer(b)


class ByteLM(torch.nn.Module):
    def __init__(self, features, depth, checkpoint):
        super().__init__()
        self.embedding = torch.nn.Parameter(torch.randn(VOCAB, features) / features)  # N(0, (1/F)^2), olmax's init
        self.blocks = torch.nn.ModuleList(Reversible(features, l) for l in range(depth))
        self.w_out = torch.nn.Parameter(torch.randn(features, VOCAB))
        self.checkpoint = checkpoint

    def forward(self, inputs, targets):
        x = F.embedding(inputs, self.embedding)
        a, b = x, x
        for block in self.blocks:
            if self.checkpoint:
                a, b = torch.utils.checkpoint.checkpoint(block, a, b, use_reentrant=False)
            else:
                a, b = block(a, b)
        logits = scale_norm(a + b, None).reshape(-1, self.w_out.shape[0]) @ self.w_out
        flat_targets = targets.reshape(-1)
        lse = torch.logsumexp(logits, dim=-1)
        cross_entropy = (lse - logits.gather(1, flat_targets[:, None])[:, 0]).mean()
        return cross_entropy, cross_entropy + Z_LOSS * (lse * lse).mean()


def median_ms(repeats, f):
    f()
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def profile(a, model, targets):
    """Each part of the model alone, forward only and forward + backward (train_step --profile prints the same rows)."""
    torch.manual_seed(7)
    dense, mixer = DenseConv(a.features), HierarchicalMixer(a.features, 0)
    x = torch.randn(a.batch, a.sequence, a.features)

    def forward_only(f):
        def run():
            with torch.no_grad():
                f(x)
        return median_ms(a.repeats, run)

    def forward_backward(f):
        def run():
            leaf = x.detach().requires_grad_(True)
            y = f(leaf)
            y.backward(torch.ones_like(y))
        return median_ms(a.repeats, run)

    def stack(a_b):
        a_, b_ = a_b, a_b
        for block in model.blocks:
            a_, b_ = block(a_, b_)
        return a_ + b_

    def head(h):
        logits = scale_norm(h, None).reshape(-1, h.shape[-1]) @ model.w_out
        lse = torch.logsumexp(logits, dim=-1)
        return (lse - logits.gather(1, targets.reshape(-1)[:, None])[:, 0]).mean() + Z_LOSS * (lse * lse).mean()

    print(f"pytorch profile B={a.batch} S={a.sequence} F={a.features} depth={a.depth} threads={a.threads} (median of {a.repeats})")
    for what, f in (("DenseConv<5> F->2F->F", dense), ("HierarchicalMixer<16> layer 0", mixer),
                    ("Stack of depth Reversible blocks", stack), ("OutputHead: norm + W_out + loss", head)):
        print(f"  {what:34} forward {forward_only(f):8.3f} ms   forward+backward {forward_backward(f):8.3f} ms")


def check(folder):
    """Loads the parameters and batch that `train_step --dump folder` wrote, computes the loss and the
    gradients in float64 and compares them with olmax's (float32). Returns the process exit status."""
    import numpy as np

    load = lambda name: torch.from_numpy(np.load(os.path.join(folder, name))).double()
    conv0 = load("stack__dense__conv0__weight.npy")  # [L, K, F, 2F], olmax's tap-first layout
    depth, features = conv0.shape[0], conv0.shape[2]
    model = ByteLM(features, depth, checkpoint=False).double()
    olmax_names = {"embedding": "embedding__table", "w_out": "head__w_out"}
    for l, block in enumerate(model.blocks):
        olmax_names.update({f"blocks.{l}.dense.conv0.weight": ("stack__dense__conv0__weight", l),
                            f"blocks.{l}.dense.scale": ("stack__dense__norm__scale", l),
                            f"blocks.{l}.dense.conv1.weight": ("stack__dense__conv1__weight", l),
                            f"blocks.{l}.mixer.w0": ("stack__mixer__w0", l), f"blocks.{l}.mixer.w1": ("stack__mixer__w1", l),
                            f"blocks.{l}.mixer.scale": ("stack__mixer__norm__scale", l)})

    def olmax_tensor(name, suffix):
        source = olmax_names[name]
        t = load(source + suffix) if isinstance(source, str) else load(source[0] + suffix)[source[1]]
        return t.permute(2, 1, 0) if name.endswith("conv0.weight") or name.endswith("conv1.weight") else t  # -> [Cout, Cin, K]

    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(olmax_tensor(name, ".npy"))
    inputs = torch.from_numpy(np.load(os.path.join(folder, "inputs.npy"))).long()
    targets = torch.from_numpy(np.load(os.path.join(folder, "targets.npy"))).long()
    loss, with_z = model(inputs, targets)
    with_z.backward()
    olmax_loss = float(open(os.path.join(folder, "loss.txt")).read())
    worst, ok = 0.0, abs(loss.item() - olmax_loss) <= 1e-5 * abs(loss.item())
    print(f"loss: pytorch (float64) {loss.item():.8f}, olmax (float32) {olmax_loss:.8f}")
    for name, p in named.items():
        g = olmax_tensor(name, ".grad.npy")
        error = ((p.grad - g).abs().max() / p.grad.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, error)
        if error > 1e-4:
            print(f"gradient of {name}: max |difference| / max |gradient| = {error:.2e}")
            ok = False
    print(f"{len(named)} parameter gradients, worst max |difference| / max |gradient| = {worst:.2e}: {'match' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def decayed(name):
    """Weight decay on matrices and the embedding, not on norm scales (olmax's `matrices` policy)."""
    return not name.endswith("scale")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sequence", type=int, default=64)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max_seconds", type=float, default=60, help="stop repeating once the timed steps took this long (>= 3 steps)")
    p.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around every block")
    p.add_argument("--autocast_bf16", action="store_true",
                   help='the forward (and loss) under torch.autocast("cpu", dtype=torch.bfloat16): bf16 GEMMs, fp32 master weights')
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (Inductor's CPU code generation); the first step's time, which compiles, "
                        "is reported as compile_s; exit 3 when compilation fails")
    p.add_argument("--max_grad_norm", type=float, default=1.0, help="global-norm clip (TrainConfig's max_grad_norm); 0: off")
    p.add_argument("--optimizer_in_backward", action="store_true",
                   help="AdamW per parameter in a post-accumulate-grad hook, applied as soon as that gradient is ready and the "
                        "gradient then freed (PyTorch's optimizer-in-backward recipe; the peer of train_step --update_in_backward 1); "
                        "needs --max_grad_norm 0")
    p.add_argument("--json", default="")
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds")
    p.add_argument("--profile", action="store_true", help="per-layer timings instead of the step benchmark")
    p.add_argument("--check", metavar="DIR", help="compare loss and gradients with `train_step --dump DIR` and exit")
    a = p.parse_args()
    if a.check:
        sys.exit(check(a.check))
    if a.quick:
        a.batch, a.sequence, a.features, a.depth, a.repeats, a.warmup = 2, 32, 16, 2, 2, 1
    if a.optimizer_in_backward and a.max_grad_norm:
        sys.exit("torch_train_step: --optimizer_in_backward needs --max_grad_norm 0 (clipping reads every gradient first)")
    if a.sequence % MIXER_CHUNK:
        sys.exit(f"torch_train_step: --sequence must be a multiple of {MIXER_CHUNK}, got {a.sequence}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rss_at_start = proc_status_bytes("VmRSS")

    model = ByteLM(a.features, a.depth, a.checkpoint)
    named = list(model.named_parameters())
    forward = model
    if a.compile:
        forward = torch.compile(model)
    params = sum(t.numel() for _, t in named)
    opt = torch.optim.AdamW(
        [{"params": [t for n, t in named if decayed(n)], "weight_decay": 0.01},
         {"params": [t for n, t in named if not decayed(n)], "weight_decay": 0.0}],
        lr=3e-3, betas=(0.9, 0.99), eps=1e-8)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 50))
    steps_taken = [0]
    if a.optimizer_in_backward:  # one AdamW per parameter, stepped from its gradient hook (same schedule)
        for name, tensor in named:
            own = torch.optim.AdamW([tensor], lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01 if decayed(name) else 0.0)

            def update(param, own=own):
                own.param_groups[0]["lr"] = 3e-3 * min(1.0, (steps_taken[0] + 1) / 50)
                own.step()
                own.zero_grad(set_to_none=True)
            tensor.register_post_accumulate_grad_hook(update)

    gen = torch.Generator().manual_seed(1234)
    batches = [(torch.randint(0, VOCAB, (a.batch, a.sequence), generator=gen),
                torch.randint(0, VOCAB, (a.batch, a.sequence), generator=gen)) for _ in range(4)]
    if a.profile:
        profile(a, model, batches[0][1])
        return
    last_loss = [0.0]
    phases = {"forward_s": [], "backward_s": [], "optimizer_s": []}

    def step(batch):  # phases as in train_step.cpp: forward incl. loss, backward, optimiser incl. clipping
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            loss, with_z = forward(*batch)
        last_loss[0] = loss.item()
        t1 = time.perf_counter()
        with_z.backward()
        t2 = time.perf_counter()
        if not a.optimizer_in_backward:
            if a.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
            opt.step()
            schedule.step()
            opt.zero_grad(set_to_none=True)
        steps_taken[0] += 1
        t3 = time.perf_counter()
        for key, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
            phases[key].append(value)

    hwm_before_first = proc_status_bytes("VmHWM")
    first_start = time.perf_counter()
    try:
        step(batches[0])
    except Exception as e:  # Inductor needs a working C++ toolchain and Python headers
        if not a.compile:
            raise
        print(f"torch_train_step: torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        sys.exit(3)
    first_step_s = time.perf_counter() - first_start
    first_step_rss = proc_status_bytes("VmHWM") - hwm_before_first
    for i in range(1, a.warmup):
        step(batches[i % len(batches)])
    rss_restarted = restart_peak_rss()
    rss_before = proc_status_bytes("VmRSS")
    step(batches[1])
    peak_rss = proc_status_bytes("VmHWM") - rss_before if rss_restarted else None
    for values in phases.values():
        values.clear()
    seconds = []
    for r in range(a.repeats):
        if r >= 3 and sum(seconds) >= a.max_seconds:
            break
        t0 = time.perf_counter()
        step(batches[r % len(batches)])
        seconds.append(time.perf_counter() - t0)
    a.repeats = len(seconds)
    median = statistics.median(seconds)
    footprint = proc_status_bytes("VmHWM") - rss_at_start
    blas = loaded_blas()
    label = blas_label(blas)
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    framework = (("pytorch-checkpoint" if a.checkpoint else "pytorch") + ("-compiled" if a.compile else "")
                 + ("-bf16autocast" if a.autocast_bf16 else "") + ("-optinbwd" if a.optimizer_in_backward else "")
                 + ("" if a.max_grad_norm == 1.0 else f"-clip{a.max_grad_norm:g}") + f"-{version}+{label}")
    if label == "openblas" and a.threads > 1 and os.environ.get("OPENBLAS_NUM_THREADS") == "1":
        framework += "(1 blas thread)"  # torch's threads only: OpenBLAS's own would oversubscribe the cores
    result = dict(framework=framework, torch_version=torch.__version__, blas=blas, blas_label=label, batch=a.batch, sequence=a.sequence, features=a.features,
                  depth=a.depth, threads=a.threads, repeats=a.repeats, seconds_median=median, seconds_min=min(seconds),
                  seconds_max=max(seconds), **{k: statistics.median(v) for k, v in phases.items()},
                  tokens_per_s=a.batch * a.sequence / median, max_grad_norm=a.max_grad_norm,
                  optimizer_in_backward=a.optimizer_in_backward, peak_rss_bytes=peak_rss, first_step_rss_bytes=first_step_rss,
                  footprint_rss_bytes=footprint, params=params, last_loss=last_loss[0],
                  compile_s=first_step_s if a.compile else None)
    print(f"{framework} B={a.batch} S={a.sequence} F={a.features} depth={a.depth} threads={a.threads} params={params}: "
          f"{median * 1e3:.3f} ms/step (median of {a.repeats}), {result['tokens_per_s']:.0f} tokens/s (forward "
          f"{result['forward_s'] * 1e3:.2f}, backward {result['backward_s'] * 1e3:.2f}, optimiser {result['optimizer_s'] * 1e3:.2f} ms), "
          f"peak RSS growth of a step {(peak_rss or 0) / 2**20:.2f} MiB (first step {first_step_rss / 2**20:.2f} MiB), "
          f"footprint {footprint / 2**20:.2f} MiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
            f.write("\n")


if __name__ == "__main__":
    main()
