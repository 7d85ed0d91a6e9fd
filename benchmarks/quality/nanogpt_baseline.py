#!/usr/bin/env python3
"""The PyTorch baseline of benchmarks/quality: a nanoGPT-style byte-level GPT trained for a wall-clock
budget on train_lm's training bytes and scored on train_lm's held-out evaluation batches.

    .venv-torch/bin/python benchmarks/quality/nanogpt_baseline.py --split DIR --threads 2 --time_budget_s 300 --json out.json

DIR is what `dump_split --out=DIR` wrote (benchmarks/quality/dump_split.cpp): train.bin (EOD doc EOD
doc ... EOD, EOD = byte 4), the held-out evaluation batches eval_{inputs,targets,mask}.bin (uint8
[rows, sequence], exactly the batches train_lm's evaluation reads) and split.json.

Model (written for this benchmark, after the GPT-2 architecture as nanoGPT configures it): vocabulary
256 (bytes), learned token and position embeddings, n_layer pre-LayerNorm blocks of causal multi-head
self-attention and a 4x GELU MLP, a final LayerNorm, the output head tied to the token embedding; no
biases (nanoGPT's train.py default bias=False), dropout 0; weights N(0, 0.02), the residual output
projections N(0, 0.02 / sqrt(2 n_layer)).
Config (nanoGPT's shakespeare_char recipe as its README runs it on a CPU): block_size 64, batch_size 12,
n_layer 4, n_head 4, n_embd 128, max_iters 2000, lr_decay_iters = max_iters, learning_rate 1e-3,
min_lr 1e-4, warmup_iters 100, AdamW betas (0.9, 0.99), weight_decay 0.1 on matrices and embeddings
(parameters with >= 2 dimensions), grad_clip 1.0, linear warmup then cosine decay to min_lr.
Batches: nanoGPT's get_batch, random windows of block_size + 1 bytes of the training stream.

Budget: training stops at max_iters or when --time_budget_s of training (excluding evaluation) have
passed, whichever is first. --fill_budget instead ignores max_iters and makes the cosine schedule
run on wall-clock time (progress = elapsed / budget), so the baseline uses the whole budget.

Held-out metric: mean nats per real target (mask 1) over all evaluation batches, the model seeing each
row of `sequence` bytes (the row's first input is the byte that ended the previous row, as in
train_lm), i.e. exactly the targets and contexts of train_lm's evaluation; bits/byte = nats / ln 2.
"""
import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, bias=False)
        self.attn = SelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd, bias=False)
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.fc_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.block_size = block_size
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn.proj.weight", "fc_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        t = idx.shape[1]
        assert t <= self.block_size, f"sequence {t} > block_size {self.block_size}"
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lr_at(progress_iter, args):
    """nanoGPT's get_lr: linear warmup, then cosine from learning_rate to min_lr over lr_decay_iters."""
    if progress_iter < args.warmup_iters:
        return args.learning_rate * (progress_iter + 1) / (args.warmup_iters + 1)
    if progress_iter > args.lr_decay_iters:
        return args.min_lr
    ratio = (progress_iter - args.warmup_iters) / max(1, args.lr_decay_iters - args.warmup_iters)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (args.learning_rate - args.min_lr)


def evaluate(model, split_dir, info):
    rows_shape = (-1, info["eval_sequence"])
    read = lambda name: np.fromfile(os.path.join(split_dir, name), dtype=np.uint8).reshape(rows_shape)
    inputs, targets, mask = read("eval_inputs.bin"), read("eval_targets.bin"), read("eval_mask.bin")
    assert int(mask.sum()) == info["eval_real_targets"], "eval_mask.bin does not match split.json"
    nll, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, inputs.shape[0], 64):
            x = torch.from_numpy(inputs[start:start + 64].astype(np.int64))
            y = torch.from_numpy(targets[start:start + 64].astype(np.int64))
            m = torch.from_numpy(mask[start:start + 64].astype(np.float64))
            logits = model(x).double()
            losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
            nll += float((losses * m.reshape(-1)).sum())
            count += int(m.sum())
    model.train()
    return nll / count, count


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", required=True, help="folder written by dump_split")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--time_budget_s", type=float, default=300.0)
    p.add_argument("--fill_budget", action="store_true", help="ignore max_iters; cosine schedule over the wall-clock budget")
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=12)
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--max_iters", type=int, default=2000)
    p.add_argument("--lr_decay_iters", type=int, default=None, help="default: max_iters")
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--min_lr", type=float, default=1e-4)
    p.add_argument("--warmup_iters", type=int, default=100)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compiled before the clock starts; the seconds are reported)")
    p.add_argument("--eval_every_s", type=float, default=0.0,
                   help="also evaluate every this many seconds of training (the evaluation's time is not counted): the curve gives the "
                        "time to a target")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.max_iters

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with open(os.path.join(args.split, "split.json")) as f:
        info = json.load(f)
    assert info["eval_sequence"] <= args.block_size, "the evaluation rows are longer than block_size"
    train = np.fromfile(os.path.join(args.split, "train.bin"), dtype=np.uint8)
    assert train.size == info["train_bytes"] + info["train_documents"] + 1, "train.bin does not match split.json"
    train_t = torch.from_numpy(train.astype(np.int64))

    model = GPT(256, args.block_size, args.n_layer, args.n_head, args.n_embd)
    params = sum(p.numel() for p in model.parameters())  # the tied head counted once
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.learning_rate, betas=(args.beta1, args.beta2))
    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(args.block_size + 1)
    compile_seconds = 0.0
    step_model = model
    if args.compile:
        # Compiled before the clock starts: one forward and backward on a batch the training does not
        # see compiles both graphs; the weights and gradients are restored, so training starts from
        # the same initialisation as eager.
        compile_start = time.perf_counter()
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        step_model = torch.compile(model)
        window = train_t[torch.arange(args.batch_size)[:, None] + offsets]
        F.cross_entropy(step_model(window[:, :-1]).reshape(-1, 256), window[:, 1:].reshape(-1)).backward()
        model.load_state_dict(initial)
        opt.zero_grad(set_to_none=True)
        compile_seconds = time.perf_counter() - compile_start
    curve = []  # (training seconds, tokens, held-out bits/byte) of the periodic evaluations
    eval_total = 0.0

    load_start = os.getloadavg()
    start = time.perf_counter()
    it, loss_value, elapsed, warm_end = 0, float("nan"), 0.0, None
    next_eval = args.eval_every_s
    while True:
        elapsed = time.perf_counter() - start - eval_total
        if args.eval_every_s > 0 and elapsed >= next_eval and elapsed < args.time_budget_s:
            eval_start = time.perf_counter()
            nats, _ = evaluate(model, args.split, info)
            curve.append((elapsed, it * args.batch_size * args.block_size, nats / math.log(2)))
            print(f"iter {it}: held-out {nats / math.log(2):.4f} bits/byte at {elapsed:.1f} s of training", flush=True)
            eval_total += time.perf_counter() - eval_start
            next_eval += args.eval_every_s
            continue
        if elapsed >= args.time_budget_s or (not args.fill_budget and it >= args.max_iters):
            break
        if args.fill_budget and it >= args.warmup_iters:  # cosine over the wall-clock left after warmup
            if warm_end is None:
                warm_end = elapsed
            ratio = (elapsed - warm_end) / max(1e-9, args.time_budget_s - warm_end)
            lr = args.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (args.learning_rate - args.min_lr)
        else:
            lr = lr_at(it, args)
        for group in opt.param_groups:
            group["lr"] = lr
        ix = torch.randint(0, train_t.numel() - args.block_size - 1, (args.batch_size,), generator=gen)
        window = train_t[ix[:, None] + offsets]
        logits = step_model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        it += 1
        if it % 100 == 0:
            loss_value = float(loss)
            print(f"iter {it}: train loss {loss_value:.4f} nats/byte, lr {lr:.2e}, {elapsed:.1f} s", flush=True)
    train_seconds = elapsed
    eval_start = time.perf_counter()
    held_out, count = evaluate(model, args.split, info)
    eval_seconds = time.perf_counter() - eval_start
    tokens = it * args.batch_size * args.block_size
    curve.append((train_seconds, tokens, held_out / math.log(2)))
    result = {
        "system": "pytorch-nanogpt",
        "block": "gpt (pre-LN attention + GELU MLP)",
        "framework": f"torch {torch.__version__}",
        "torch_config_blas": next((l.strip() for l in torch.__config__.show().splitlines() if "BLAS_INFO" in l), ""),
        "threads": args.threads,
        "params": params,
        "config": {k: v for k, v in vars(args).items() if k not in ("split", "json")},
        "iters": it,
        "tokens": tokens,
        "train_seconds": train_seconds,
        "tokens_per_s": tokens / train_seconds if train_seconds > 0 else float("nan"),
        "eval_seconds": eval_seconds,
        "compiled": args.compile,
        "compile_seconds": compile_seconds,
        "curve": [{"train_seconds": t, "tokens": n, "bits_per_byte": b} for t, n, b in curve],
        "held_out_nats_per_byte": held_out,
        "held_out_bits_per_byte": held_out / math.log(2),
        "held_out_targets": count,
        "eval_context": f"rows of {info['eval_sequence']} bytes (first input: the byte that ended the previous row), as train_lm",
        "split": info,
        "train_bin_sha256": sha256(os.path.join(args.split, "train.bin")),
        "eval_targets_sha256": sha256(os.path.join(args.split, "eval_targets.bin")),
        "cpu_model": cpu_model(),
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
        "stopped_by": "budget" if train_seconds >= args.time_budget_s else "max_iters",
    }
    print(f"pytorch-nanogpt: {params} parameters, {it} iters in {train_seconds:.1f} s ({result['tokens_per_s']:.0f} tokens/s), "
          f"held-out {held_out:.4f} nats/byte = {held_out / math.log(2):.4f} bits/byte over {count} targets", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
