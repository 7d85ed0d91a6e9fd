#!/usr/bin/env python3
"""The JAX peer of bench_xla_whole_step (issue 36): olmax's ByteLM training step (models/byte_lm.hpp)
for the conv_mixer and qrnn recipes, written the idiomatic JAX way, for compile times against depth.

    ids -> one_hot(ids) E -> two streams (x, x) -> depth reversible blocks -> a + b
        -> ScaleNorm (no scale) -> W_out -> mean cross-entropy + z-loss 0.01 (the value without it)
    jax.grad of that, then AdamW (lr 1e-3, betas 0.9 / 0.999, eps 1e-8, weight decay 0: the
    benchmark's AdamWConfig), all in one jax.jit.

Blocks (additive coupling, nn/reversible.hpp: (a, b) -> (b, a + f(b)), then the same with g):
  conv_mixer  f = DenseConv<5>: causal conv [5, F, 2F] -> ScaleNorm [2F] + leaky-ReLU 0.01 -> causal conv [5, 2F, F]
              g = HierarchicalMixer<16>: [16, 16] upper-triangular token mixing within groups of 16
                  positions, ScaleNorm [F] + leaky-ReLU, a second mixing; the stride alternates with the
                  layer index (sequence 64: local at even layers, stride 4 at odd ones)
  qrnn        f = ScaleNorm [F] -> QRNN (causal conv [5, F, 2F] + bias, candidate z and forget gate
                  hard_sigmoid; h_t = f_t h_{t-1} + z_t, the original pooling) -> ScaleNorm [F]
              g = DenseConv<1> (the position-wise MLP F -> 2F -> F)
Depth is a `lax.scan` over the per-layer parameters stacked [depth, ...]; its body is one period of
the layer index (2 layers for conv_mixer at sequence 64, 1 for qrnn), wrapped in `jax.checkpoint` so
the backward recomputes each layer, like olmax's loop; depth % period layers run after the loop,
as olmax's do. The QRNN's recurrence over time is a `lax.scan` (sequential), the form olmax's
traced program takes on the CPU. Causal convolutions, the embedding and the target pick are written
as olmax's lowering writes them (K shifted copies side by side and one GEMM; one-hot matmuls).

What differs from olmax (none of it changes the model's maths):
  - Backward memory: olmax's reversible backward rebuilds each layer's input from its output
    (nothing stored per layer); jax.checkpoint keeps the scan's carry (the two streams) per period,
    [depth / period, B, S, F] x 2. The recompute work per layer is the same (each function runs once
    forward and once more, with its VJP, in the backward).
  - Initial values are drawn with jax.random, not olmax's generator (same distributions), so the
    losses are not identical.
  - AdamW's learning rate and bias corrections are computed in the program from a step counter;
    olmax's traced step takes them as per-call host inputs. Moments are float32 in both programs.
  - The XLA is jaxlib's own CPU backend, not the xla-cpu-pjrt plugin olmax's benchmark loads, unless
    --plugin PATH names that plugin: jax then runs on it (a PJRT plugin), the same compiler as olmax's.

Measured per block and depth, each repeat on a new jit of a new closure after jax.clear_caches():
`jit(step).lower(...)` (tracing + StableHLO) and `.compile()` (XLA) separately, medians; the step is
the median of --steps executions after one warm-up (block_until_ready), state donated.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

MIXER_CHUNK = 16
NORM_EPS = 1e-16
LEAKY_SLOPE = 0.01
Z_LOSS = 0.01
BLOCKS = ("conv_mixer", "qrnn")


def fail(message):
    sys.exit(f"jax_byte_lm.py: {message}")


# ---- the ops, as olmax's lowering rules define them (olmax/trace/rules.hpp) ----

def scale_norm(x, scale=None):
    # x / max(||x||, eps) over the last axis, formed from the sum of squares as olmax's rule.
    r = lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), NORM_EPS * NORM_EPS))
    return x * r if scale is None else x * r * scale


def leaky_relu(x):
    return jnp.where(x < 0, LEAKY_SLOPE * x, x)


def causal_conv(x, w, bias=None):
    # out[t] = sum_k x[t - (K-1-k)] w[k]: the K shifted copies side by side, one GEMM.
    K, C, O = w.shape
    B, T, _ = x.shape
    taps = [jnp.pad(x, ((0, 0), (K - 1 - k, 0), (0, 0)))[:, :T] for k in range(K)]
    cols = taps[0] if K == 1 else jnp.concatenate(taps, axis=2)
    y = (cols.reshape(B * T, K * C) @ w.reshape(K * C, O)).reshape(B, T, O)
    return y if bias is None else y + bias


def dense_conv(p, x):
    h = causal_conv(x, p["conv0"])
    return causal_conv(leaky_relu(scale_norm(h, p["mid_scale"])), p["conv1"])


def mixer_levels(sequence):
    levels, span = 1, MIXER_CHUNK
    while span < sequence:
        span, levels = span * MIXER_CHUNK, levels + 1
    return levels


def mixer_stride(sequence, layer):
    s = min(MIXER_CHUNK ** (layer % mixer_levels(sequence)), sequence // MIXER_CHUNK)
    if sequence % (MIXER_CHUNK * s):
        fail(f"--sequence {sequence} is not a multiple of {MIXER_CHUNK} * stride {s} (the mixer's layer {layer})")
    return s


def hierarchical_mixer(p, x, layer):
    B, S, F = x.shape
    s = mixer_stride(S, layer)
    mask = jnp.triu(jnp.ones((MIXER_CHUNK, MIXER_CHUNK), jnp.float32))  # output g sees inputs k <= g
    g = x.reshape(B, S // (MIXER_CHUNK * s), MIXER_CHUNK, s, F)
    mix = lambda h, w: jnp.einsum("bckjf,kg->bcgjf", h, w * mask)
    h = leaky_relu(scale_norm(mix(g, p["w0"]), p["scale"]))
    return mix(h, p["w1"]).reshape(B, S, F)


def qrnn(p, x):
    F = x.shape[-1]
    z = causal_conv(scale_norm(x, p["norm_in"]), p["weight"], p["bias"])
    cand, forget = z[..., :F], jnp.clip(z[..., F:] / 6 + 0.5, 0.0, 1.0)  # hard_sigmoid

    def step(h, af):
        a, u = af
        h = a * h + u
        return h, h

    _, hs = lax.scan(step, jnp.zeros_like(cand[:, 0]), (jnp.swapaxes(forget, 0, 1), jnp.swapaxes(cand, 0, 1)))
    return scale_norm(jnp.swapaxes(hs, 0, 1), p["norm_out"])


def block(name, p, a, b, layer):
    """One reversible block (AdditiveCoupling twice): (a, b) -> (b, a + f(b)) -> (.., .. + g(..))."""
    if name == "conv_mixer":
        f = lambda x: dense_conv(p["dense"], x)
        g = lambda x: hierarchical_mixer(p["mixer"], x, layer)
    else:
        f = lambda x: qrnn(p["qrnn"], x)
        g = lambda x: dense_conv(p["mlp"], x)
    a, b = b, a + f(b)
    return b, a + g(b)


# ---- parameters (olmax's shapes and initial distributions) ----

def init_params(name, key, F, depth, vocab):
    H = 2 * F
    keys = iter(jax.random.split(key, 16))
    normal = lambda shape, std: std * jax.random.normal(next(keys), shape, jnp.float32)
    fan_in = lambda K, C, O: normal((depth, K, C, O), 1.0 / (K * C) ** 0.5)
    ones = lambda n: jnp.ones((depth, n), jnp.float32)
    dense = lambda K: {"conv0": fan_in(K, F, H), "mid_scale": ones(H), "conv1": fan_in(K, H, F)}
    if name == "conv_mixer":
        def ortho():
            # QR on the host (numpy): a PJRT plugin (--plugin) need not have jax's LAPACK kernels.
            q, r = np.linalg.qr(np.asarray(normal((depth, MIXER_CHUNK, MIXER_CHUNK), 1.0)))
            return jnp.asarray(q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :])

        layers = {"dense": dense(5), "mixer": {"w0": ortho(), "w1": ortho(), "scale": ones(F)}}
    else:
        layers = {"qrnn": {"norm_in": ones(F), "weight": fan_in(5, F, H), "bias": jnp.zeros((depth, H), jnp.float32),
                           "norm_out": ones(F)}, "mlp": dense(1)}
    return {"embedding": normal((vocab, F), 1.0 / F), "layers": layers, "w_out": normal((F, vocab), 1.0)}


def decays(params):
    # WeightDecayPolicy::matrices: weights and the embedding, not norm scales or biases.
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    names = [jax.tree_util.keystr(path) for path, _ in flat]
    return [not any(k in n for k in ("scale", "bias", "norm_in", "norm_out")) for n in names]


# ---- the training step ----

def make_step(name, depth, sequence, vocab):
    period = mixer_levels(sequence) if name == "conv_mixer" else 1
    loops, rest = divmod(depth, period)
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.0

    def loss_fn(params, ids, targets):
        x = jax.nn.one_hot(ids, vocab, dtype=jnp.float32) @ params["embedding"]
        layers = params["layers"]

        # One scan iteration runs `period` layers (the mixer's modes), as olmax's loop does.
        @jax.checkpoint
        def body(state, per_period):
            a, b = state
            for j in range(period):
                a, b = block(name, jax.tree.map(lambda t: t[j], per_period), a, b, j)
            return (a, b), None

        head = jax.tree.map(lambda t: t[: loops * period].reshape(loops, period, *t.shape[1:]), layers)
        (a, b), _ = lax.scan(body, (x, x), head)
        for j in range(rest):
            a, b = block(name, jax.tree.map(lambda t: t[loops * period + j], layers), a, b, loops * period + j)

        F = x.shape[-1]
        logits = scale_norm(a + b).reshape(-1, F) @ params["w_out"]
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.sum(logits * jax.nn.one_hot(targets.reshape(-1), vocab, dtype=jnp.float32), axis=-1)
        plain = jnp.mean(lse - picked)
        full = jnp.mean(lse - picked + Z_LOSS * lse * lse)
        return full + lax.stop_gradient(plain - full)  # value: the plain loss; gradient: with the z-loss

    def step(t, params, m, v, ids, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, targets)
        t = t + 1.0
        step_size, correction2 = lr / (1 - b1 ** t), jnp.sqrt(1 - b2 ** t)
        leaves, tree = jax.tree.flatten(params)
        gs, ms, vs = jax.tree.leaves(grads), jax.tree.leaves(m), jax.tree.leaves(v)
        grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in gs))
        out_p, out_m, out_v = [], [], []
        for p, g, mi, vi, decayed in zip(leaves, gs, ms, vs, decays(params)):
            if decayed:
                p = p * (1 - lr * wd)
            mi = mi * b1 + (1 - b1) * g
            vi = vi * b2 + ((1 - b2) * g) * g
            p = p - step_size * (mi / (jnp.sqrt(vi) / correction2 + eps))
            out_p.append(p), out_m.append(mi), out_v.append(vi)
        unflat = lambda xs: jax.tree.unflatten(tree, xs)
        return loss, grad_norm, t, unflat(out_p), unflat(out_m), unflat(out_v)

    return step


def positive_list(flag, text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        fail(f"{flag} takes a comma-separated list of positive integers, got '{text}'")
    return values


def positive(flag, text):
    values = positive_list(flag, text)
    if len(values) != 1:
        fail(f"{flag} takes one positive integer, got '{text}'")
    return values[0]


def cpu_model():
    try:
        return next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def measure(name, depth, z, repeats, steps):
    params = init_params(name, jax.random.PRNGKey(1), z.features, depth, z.vocab)
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    n = jnp.arange(z.batch * z.sequence, dtype=jnp.int32)  # the olmax benchmark's bytes
    ids, targets = (n * 31 % 256).reshape(z.batch, z.sequence), ((n * 31 + 1) % 256).reshape(z.batch, z.sequence)
    t = jnp.float32(0)
    lower_s, compile_s = [], []
    for _ in range(repeats):
        jax.clear_caches()
        jitted = jax.jit(make_step(name, depth, z.sequence, z.vocab), donate_argnums=(0, 1, 2, 3))  # a new closure
        t0 = time.perf_counter()
        lowered = jitted.lower(t, params, m, v, ids, targets)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        lower_s.append(t1 - t0)
        compile_s.append(t2 - t1)
    module_bytes = len(lowered.as_text())
    loss, _, t, params, m, v = compiled(t, params, m, v, ids, targets)  # warm-up
    step_s = []
    for _ in range(steps):
        s0 = time.perf_counter()
        loss, _, t, params, m, v = compiled(t, params, m, v, ids, targets)
        loss.block_until_ready()
        step_s.append(time.perf_counter() - s0)
    row = {"block": name, "depth": depth, "module_bytes": module_bytes, "lower_s_median": statistics.median(lower_s),
           "compile_s_median": statistics.median(compile_s), "step_s_median": statistics.median(step_s),
           "lower_s": lower_s, "compile_s": compile_s, "final_loss": float(loss)}
    print(f"{name:<11} {depth:6d} {module_bytes:12d} {row['lower_s_median']:10.3f} {row['compile_s_median']:12.3f} "
          f"{row['step_s_median'] * 1e3:10.2f}   (loss {row['final_loss']:.4f})", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="conv_mixer,qrnn")
    ap.add_argument("--depths", default="4,16,64")
    ap.add_argument("--repeats", default="3")
    ap.add_argument("--steps", default="5")
    ap.add_argument("--features", default="64")
    ap.add_argument("--batch", default="8")
    ap.add_argument("--sequence", default="64")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plugin", default=None, help="a PJRT plugin (.so) to run on instead of jaxlib's CPU backend")
    a = ap.parse_args()
    if a.plugin:
        # Registered before the first backend use (nothing above touched one).
        if not os.path.isfile(a.plugin):
            fail(f"--plugin: no file '{a.plugin}'")
        os.environ["PJRT_NAMES_AND_LIBRARY_PATHS"] = f"olmax_plugin:{os.path.abspath(a.plugin)}"
        jax.config.update("jax_platforms", "olmax_plugin")
    blocks = a.blocks.split(",")
    for b in blocks:
        if b not in BLOCKS:
            fail(f"--blocks: unknown block '{b}' (this peer has {', '.join(BLOCKS)})")
    depths = positive_list("--depths", a.depths)
    repeats, steps = positive("--repeats", a.repeats), positive("--steps", a.steps)
    z = argparse.Namespace(features=positive("--features", a.features), batch=positive("--batch", a.batch),
                           sequence=positive("--sequence", a.sequence), vocab=256)
    if "conv_mixer" in blocks and z.sequence % MIXER_CHUNK:
        fail(f"--sequence {z.sequence}: conv_mixer needs a multiple of the mixer's chunk {MIXER_CHUNK}")
    if "conv_mixer" in blocks:
        for layer in range(mixer_levels(z.sequence)):
            mixer_stride(z.sequence, layer)
    print(f"jax {jax.__version__} on {jax.devices()[0].client.platform} ({'plugin ' + a.plugin if a.plugin else 'jaxlib'})")
    print(f"{'block':<11} {'depth':>6} {'module_B':>12} {'lower_s':>10} {'compile_s':>12} {'step_ms':>10}")
    rows = [measure(b, d, z, repeats, steps) for b in blocks for d in depths]
    backend = f"PJRT plugin {a.plugin}" if a.plugin else f"jaxlib {jax.default_backend()}"
    doc = {"benchmark": "jax_byte_lm", "model": "ByteLM", "jax": jax.__version__, "backend": backend,
           "cpu": cpu_model(), "features": z.features, "batch": z.batch, "sequence": z.sequence, "vocab": z.vocab,
           "depth_form": "lax.scan + jax.checkpoint", "time_scan": "lax.scan (sequential)", "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
