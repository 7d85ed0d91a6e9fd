#!/usr/bin/env python3
"""The JAX peer of bench_xla_whole_step (issue 36): olmax's ByteLM training step (models/byte_lm.hpp)
for the conv_mixer, qrnn, mamba and moe recipes (models/recipes.hpp), written the idiomatic JAX way,
for compile times against depth.

    ids -> one_hot(ids) E -> two streams (x, x) -> depth reversible blocks -> a + b
        -> ScaleNorm (no scale) -> W_out -> mean cross-entropy + z-loss 0.01 (the value without it)
        (+ 0.01 x each MoE layer's balance loss, in the gradient only: nn::MoE seeds it itself)
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
  mamba       f = g = Sandwich<SelectiveSSM> (two independent ones): ScaleNorm [F] -> SSM -> ScaleNorm [F],
                  SSM with D = F, E = 2F, N = 16, K = 4, R = ceil(F / 16) (nn/selective_ssm.hpp):
                    [x, z] = u in_proj [D, 2E];  x = SiLU(depthwise causal conv [K, E] + bias [E])
                    [dt, B, C] = x x_proj [E, R + 2N];  delta = softplus(dt dt_proj [R, E] + dt_bias [E])
                    h_t = exp(delta_t A) h_{t-1} + delta_t B_t x_t,  y_t = C_t h_t + D x_t,  A = -exp(A_log [E, N])
                    out = (y SiLU(z)) out_proj [E, D]
                  no document resets (the benchmark's batches have none)
  moe         f = HierarchicalMixer<16> (as conv_mixer's g, the stride alternating with the layer index)
              g = Sandwich<MoE>: ScaleNorm [F] -> Switch MoE -> ScaleNorm [F] (nn/moe.hpp), 4 experts:
                    p = softmax(x router [F, 4]);  e_n = argmax p_n (lowest index on ties)
                    expert e takes at most C = ceil(1.25 S / 4) tokens per sequence, first come first
                    served in time order (slot = how many earlier tokens of the sequence chose e);
                    y_n = p_n[e_n] leaky_relu(x_n W_{e_n}) (experts [4, F, F]), 0 for a dropped token
                    balance = 4 sum_e f_e P_e (f_e: share of tokens choosing e, a constant; P_e: mean
                    p[:, e]), weight 0.01, added to the objective's gradient only (the reported loss
                    is without it, as olmax's)
                  Dispatch as olmax's traced program (the `slots` form): each expert's C slots per
                  sequence gathered from the tokens ([4, B C, F], an index scatter builds the slot map),
                  one batched matmul with the experts, each token gathering back its expert's row
                  times its gate; no one-hot dispatch/combine einsums.
Depth is a `lax.scan` over the per-layer parameters stacked [depth, ...]; its body is one period of
the layer index (2 layers for conv_mixer and moe at sequence 64, 1 for qrnn and mamba), wrapped in
`jax.checkpoint` so the backward recomputes each layer, like olmax's loop; depth % period layers run
after the loop, as olmax's do. The QRNN's recurrence over time is a `lax.scan` (sequential), the form olmax's
traced program takes on the CPU; so is the selective scan's (carry h [B, E, N]; exp(delta A), the
drive and the C contraction formed per step inside the body, no [B, T, E, N] tensor outside it).
Causal convolutions, the embedding and the target pick are written as olmax's lowering writes them
(K shifted copies side by side and one GEMM; one-hot matmuls; the SSM's depthwise convolution as K
shifted multiply-adds). The MoE balance losses ride in the depth scan's carry.

What differs from olmax (none of it changes the model's maths):
  - Backward memory: olmax's reversible backward rebuilds each layer's input from its output
    (nothing stored per layer); jax.checkpoint keeps the scan's carry (the two streams) per period,
    [depth / period, B, S, F] x 2. The recompute work per layer is the same (each function runs once
    forward and once more, with its VJP, in the backward).
  - The selective scan's backward: JAX differentiates the `lax.scan` over time, which keeps each
    step's residuals (the states, [T, B, E, N] for the layer being recomputed); olmax's scan op
    keeps a state every 64 steps and recomputes the rest in its own backward. Same maths.
  - The MoE (top-1) gathers back one row per token (its chosen expert's slot); olmax's traced
    program, written for top-k, gathers [N, E] rows and weights them with gates that are 0 but for
    the chosen expert. The expert matmul work (E B C F^2) and the values are the same. The MoE's
    routing counters (routing_stats) have no counterpart.
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
MOE_EXPERTS = 4
MOE_CAPACITY_FACTOR = 1.25
MOE_BALANCE = 0.01
SSM_STATE, SSM_KERNEL = 16, 4
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4
BLOCKS = ("conv_mixer", "qrnn", "mamba", "moe")
# Parameters no weight decay reaches (WeightDecayPolicy::matrices: norm scales, biases, Role::other).
NO_DECAY = ("scale", "mid_scale", "bias", "norm_in", "norm_out", "conv_bias", "dt_bias", "A_log", "D")


def fail(message):
    sys.exit(f"jax_byte_lm.py: {message}")


# ---- the ops, as olmax's lowering rules define them (olmax/trace/rules.hpp) ----

def scale_norm(x, scale=None):
    # x / max(||x||, eps) over the last axis, formed from the sum of squares as olmax's rule, and as
    # 1 / sqrt (not rsqrt, whose derivative -rsqrt(s) / 2s overflows at s = eps^2): a row of zeros
    # (a token every expert dropped, into the MoE's norm_out) then has a finite gradient.
    r = 1.0 / jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), NORM_EPS * NORM_EPS))
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


def sandwich(p, inner, x):
    # nn::Sandwich: ScaleNorm (scale norm_in) -> inner -> ScaleNorm (scale norm_out).
    return scale_norm(inner(scale_norm(x, p["norm_in"])), p["norm_out"])


def selective_ssm(p, x):
    B, T, _ = x.shape
    E, N = p["A_log"].shape
    R = p["dt_proj"].shape[0]
    K = p["conv_weight"].shape[0]
    xz = x @ p["in_proj"]  # [B, T, 2E]
    xi, z = xz[..., :E], xz[..., E:]
    # Depthwise causal conv: pre_t = bias + sum_k w[k] x_{t-(K-1)+k}, tap K-1 reading x_t.
    pre = xi * p["conv_weight"][K - 1] + p["conv_bias"]
    for j in range(1, min(K, T)):
        pre = pre + jnp.pad(xi, ((0, 0), (j, 0), (0, 0)))[:, :T] * p["conv_weight"][K - 1 - j]
    u = jax.nn.silu(pre)
    proj = u @ p["x_proj"]  # [B, T, R + 2N]
    delta = jax.nn.softplus(proj[..., :R] @ p["dt_proj"] + p["dt_bias"])
    A = -jnp.exp(p["A_log"])

    def step(h, inputs):
        u_t, d_t, b_t, c_t = inputs  # [B, E], [B, E], [B, N], [B, N]
        h = jnp.exp(d_t[..., None] * A) * h + (d_t * u_t)[..., None] * b_t[:, None, :]
        return h, jnp.sum(h * c_t[:, None, :], axis=-1)

    time_major = lambda t: jnp.swapaxes(t, 0, 1)
    _, ys = lax.scan(step, jnp.zeros((B, E, N), x.dtype),
                     (time_major(u), time_major(delta), time_major(proj[..., R:R + N]), time_major(proj[..., R + N:])))
    y = time_major(ys) + p["D"] * u  # the skip D u, inside olmax's scan op
    return (y * jax.nn.silu(z)) @ p["out_proj"]


def moe_capacity(sequence, experts):
    return int(np.ceil(MOE_CAPACITY_FACTOR * 1 * sequence / experts))  # C = ceil(factor k S / E), k = 1


def moe(p, x):
    """Top-1 MoE with per-sequence capacity; returns y [B, S, F] and the balance loss."""
    B, S, F = x.shape
    E = p["router"].shape[1]
    capacity = moe_capacity(S, E)
    C = min(capacity, S)  # slots per expert and sequence
    probs = jax.nn.softmax(x @ p["router"], axis=-1)  # [B, S, E]
    choice = jnp.argmax(probs, axis=-1)  # [B, S], the lowest index on ties
    chosen = jax.nn.one_hot(choice, E, dtype=jnp.int32)
    slot = jnp.sum((jnp.cumsum(chosen, axis=1) - chosen) * chosen, axis=-1)  # earlier choices of e in the sequence
    kept = slot < capacity
    gate = jnp.take_along_axis(probs, choice[..., None], axis=-1) * kept[..., None]  # [B, S, 1], 0 if dropped
    # Slot map: expert e's slot c of sequence b holds token row b S + s (row 0 when empty, never read back).
    rows_b = jnp.broadcast_to(jnp.arange(B)[:, None], (B, S))
    token = rows_b * S + jnp.arange(S)[None, :]
    slot_token = jnp.zeros((E, B, C), jnp.int32).at[choice, rows_b, slot].set(token, mode="drop")
    x_slots = jnp.take(x.reshape(B * S, F), slot_token.reshape(E, B * C), axis=0)  # [E, B C, F]
    h = leaky_relu(jnp.einsum("enf,efg->eng", x_slots, p["experts"])).reshape(E * B * C, F)
    token_slot = (choice * B + rows_b) * C + jnp.minimum(slot, C - 1)  # its row of h (gate 0 when dropped)
    y = jnp.take(h, token_slot.reshape(B * S), axis=0).reshape(B, S, F) * gate
    fraction = lax.stop_gradient(jnp.mean(chosen.astype(jnp.float32), axis=(0, 1)))  # before capacity
    balance = E * jnp.sum(fraction * jnp.mean(probs, axis=(0, 1)))
    return y, balance


def block(name, p, a, b, layer):
    """One reversible block (AdditiveCoupling twice): (a, b) -> (b, a + f(b)) -> (.., .. + g(..)).
    Returns the two streams and the block's MoE balance loss (0 for the other blocks)."""
    balance = jnp.float32(0)
    if name == "conv_mixer":
        f = lambda x: dense_conv(p["dense"], x)
        g = lambda x: hierarchical_mixer(p["mixer"], x, layer)
    elif name == "qrnn":
        f = lambda x: qrnn(p["qrnn"], x)
        g = lambda x: dense_conv(p["mlp"], x)
    elif name == "mamba":
        f = lambda x: sandwich(p["ssm0"], lambda h: selective_ssm(p["ssm0"], h), x)
        g = lambda x: sandwich(p["ssm1"], lambda h: selective_ssm(p["ssm1"], h), x)
    else:
        f = lambda x: hierarchical_mixer(p["mixer"], x, layer)

        def g(x):
            nonlocal balance
            y, balance = moe(p["moe"], scale_norm(x, p["moe"]["norm_in"]))
            return scale_norm(y, p["moe"]["norm_out"])
    a, b = b, a + f(b)
    a, b = b, a + g(b)
    return a, b, balance


# ---- parameters (olmax's shapes and initial distributions) ----

def init_params(name, key, F, depth, vocab):
    H = 2 * F
    keys = iter(jax.random.split(key, 32))
    normal = lambda shape, std: std * jax.random.normal(next(keys), shape, jnp.float32)
    uniform = lambda shape, bound: jax.random.uniform(next(keys), shape, jnp.float32, -bound, bound)
    fan_in = lambda K, C, O: normal((depth, K, C, O), 1.0 / (K * C) ** 0.5)
    ones = lambda n: jnp.ones((depth, n), jnp.float32)
    dense = lambda K: {"conv0": fan_in(K, F, H), "mid_scale": ones(H), "conv1": fan_in(K, H, F)}

    def ortho(*shape):
        # Per matrix over the last two axes. QR on the host (numpy): a PJRT plugin (--plugin) need
        # not have jax's LAPACK kernels.
        q, r = np.linalg.qr(np.asarray(normal((depth, *shape), 1.0)))
        return jnp.asarray(q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :])

    mixer = lambda: {"w0": ortho(MIXER_CHUNK, MIXER_CHUNK), "w1": ortho(MIXER_CHUNK, MIXER_CHUNK), "scale": ones(F)}

    def ssm():
        # nn::SelectiveSSM's initialisation; A = -(n + 1) (S4D-real), D = 1, softplus(dt_bias) log-uniform.
        E, N, K, R = 2 * F, SSM_STATE, SSM_KERNEL, -(-F // 16)
        dt = jnp.exp(jax.random.uniform(next(keys), (depth, E), jnp.float32, np.log(DT_MIN), np.log(DT_MAX)))
        dt = jnp.maximum(dt, DT_FLOOR)
        return {"norm_in": ones(F), "in_proj": normal((depth, F, 2 * E), F ** -0.5),
                "conv_weight": uniform((depth, K, E), K ** -0.5), "conv_bias": uniform((depth, E), K ** -0.5),
                "x_proj": normal((depth, E, R + 2 * N), E ** -0.5), "dt_proj": uniform((depth, R, E), R ** -0.5),
                "dt_bias": dt + jnp.log(-jnp.expm1(-dt)),  # softplus^-1(dt)
                "A_log": jnp.broadcast_to(jnp.log(jnp.arange(1, N + 1, dtype=jnp.float32)), (depth, E, N)),
                "D": ones(E), "out_proj": normal((depth, E, F), E ** -0.5), "norm_out": ones(F)}

    if name == "conv_mixer":
        layers = {"dense": dense(5), "mixer": mixer()}
    elif name == "qrnn":
        layers = {"qrnn": {"norm_in": ones(F), "weight": fan_in(5, F, H), "bias": jnp.zeros((depth, H), jnp.float32),
                           "norm_out": ones(F)}, "mlp": dense(1)}
    elif name == "mamba":
        layers = {"ssm0": ssm(), "ssm1": ssm()}
    else:
        layers = {"mixer": mixer(), "moe": {"norm_in": ones(F), "router": normal((depth, F, MOE_EXPERTS), F ** -0.5),
                                            "experts": ortho(MOE_EXPERTS, F, F), "norm_out": ones(F)}}
    return {"embedding": normal((vocab, F), 1.0 / F), "layers": layers, "w_out": normal((F, vocab), 1.0)}


def decays(params):
    # WeightDecayPolicy::matrices: weights and the embedding, not norm scales, biases, A_log or D.
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return [path[-1].key not in NO_DECAY for path, _ in flat]


# ---- the training step ----

def make_step(name, depth, sequence, vocab):
    period = mixer_levels(sequence) if name in ("conv_mixer", "moe") else 1
    loops, rest = divmod(depth, period)
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.0

    def loss_fn(params, ids, targets):
        x = jax.nn.one_hot(ids, vocab, dtype=jnp.float32) @ params["embedding"]
        layers = params["layers"]

        # One scan iteration runs `period` layers (the mixer's modes), as olmax's loop does.
        # The carry holds the two streams and the sum of the MoE layers' balance losses.
        @jax.checkpoint
        def body(state, per_period):
            a, b, balance = state
            for j in range(period):
                a, b, layer_balance = block(name, jax.tree.map(lambda t: t[j], per_period), a, b, j)
                balance = balance + layer_balance
            return (a, b, balance), None

        head = jax.tree.map(lambda t: t[: loops * period].reshape(loops, period, *t.shape[1:]), layers)
        (a, b, balance), _ = lax.scan(body, (x, x, jnp.float32(0)), head)
        for j in range(rest):
            layer = loops * period + j
            a, b, layer_balance = block(name, jax.tree.map(lambda t: t[layer], layers), a, b, layer)
            balance = balance + layer_balance

        F = x.shape[-1]
        logits = scale_norm(a + b).reshape(-1, F) @ params["w_out"]
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.sum(logits * jax.nn.one_hot(targets.reshape(-1), vocab, dtype=jnp.float32), axis=-1)
        plain = jnp.mean(lse - picked)
        full = jnp.mean(lse - picked + Z_LOSS * lse * lse) + MOE_BALANCE * balance
        return full + lax.stop_gradient(plain - full)  # value: the plain loss; gradient: with z-loss and balance

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
    mixed = [b for b in blocks if b in ("conv_mixer", "moe")]
    if mixed and z.sequence % MIXER_CHUNK:
        fail(f"--sequence {z.sequence}: {mixed[0]} needs a multiple of the mixer's chunk {MIXER_CHUNK}")
    if mixed:
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
