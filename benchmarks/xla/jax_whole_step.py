#!/usr/bin/env python3
"""The same whole training step as bench_xla_whole_step (olmax/backend/xla/graph/residual_lm.hpp),
written in jax, for compile times measured in the same run:

    h_0 = onehot(ids) E,  h_{l+1} = h_l + s * tanh(h_l W_l + b_l) * (1 + l / depth),  logits = h_L W_out
    mean cross-entropy, its gradient and AdamW (lr 1e-3, betas 0.9 / 0.999, eps 1e-8), jitted as one.

Two forms: layers in a `lax.scan` over stacked weights, and layers unrolled in Python (up to
--unrolled_max layers: it grows quickly). Prints one JSON document: per depth and form, the seconds
to trace and lower (`jit(...).lower`), to compile (`.compile()`, XLA's part), and the step's median.
"""
import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax


def make_step(V, F, L, N, unrolled):
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 1e-3

    def loss_fn(params, ids, targets):
        E, W, b, s, Wo = params
        h = jax.nn.one_hot(ids, V, dtype=jnp.float32) @ E

        def layer(h, x):
            Wl, bl, l = x
            return h + s * jnp.tanh(h @ Wl + bl) * (l / L + 1.0), None

        if unrolled:
            for l in range(L):
                h, _ = layer(h, (W[l], b[l], jnp.float32(l)))
        else:
            h, _ = lax.scan(layer, h, (W, b, jnp.arange(L, dtype=jnp.float32)))
        logits = h @ Wo
        picked = jnp.take_along_axis(logits, targets[:, None], axis=1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    def step(t, params, m, v, ids, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, targets)
        t1 = t + 1.0
        c1, c2 = 1 - b1 ** t1, 1 - b2 ** t1
        new_m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grads)]
        new_v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grads)]
        new_p = [p - lr * (mi / c1) / (jnp.sqrt(vi / c2) + eps) for p, mi, vi in zip(params, new_m, new_v)]
        return loss, t1, new_p, new_m, new_v

    return jax.jit(step, donate_argnums=(0, 1, 2, 3))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="4,16,64,256")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--unrolled_max", type=int, default=16)
    args = ap.parse_args()
    V, F, N = args.vocab, args.features, args.tokens
    rows = []
    for L in [int(d) for d in args.depths.split(",")]:
        for unrolled in (False, True):
            if unrolled and L > args.unrolled_max:
                continue
            key = jax.random.PRNGKey(0)
            ks = jax.random.split(key, 4)
            params = [jax.random.normal(ks[0], (V, F)) * 0.3, jax.random.normal(ks[1], (L, F, F)) * 0.3 / F ** 0.5,
                      jnp.zeros((L, F)), jnp.full((F,), 0.05), jax.random.normal(ks[2], (F, V)) * 0.3 / F ** 0.5]
            m = [jnp.zeros_like(p) for p in params]
            v = [jnp.zeros_like(p) for p in params]
            ids = jnp.arange(N, dtype=jnp.int32) * 31 % V
            targets = (ids + 1) % V
            t = jnp.float32(0)
            step = make_step(V, F, L, N, unrolled)
            t0 = time.perf_counter()
            lowered = step.lower(t, params, m, v, ids, targets)
            t1 = time.perf_counter()
            compiled = lowered.compile()
            t2 = time.perf_counter()
            hlo_bytes = len(lowered.as_text())
            loss, t, params, m, v = compiled(t, params, m, v, ids, targets)  # warm-up
            times = []
            for _ in range(args.steps):
                s0 = time.perf_counter()
                loss, t, params, m, v = compiled(t, params, m, v, ids, targets)
                loss.block_until_ready()
                times.append(time.perf_counter() - s0)
            rows.append({"depth": L, "form": "unrolled" if unrolled else "lax.scan", "lower_s": t1 - t0, "compile_s": t2 - t1,
                         "module_bytes": hlo_bytes, "step_s_median": statistics.median(times), "final_loss": float(loss)})
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"benchmark": "jax_whole_step", "jax": jax.__version__, "vocab": V, "features": F, "tokens": N, "rows": rows}))


if __name__ == "__main__":
    main()
