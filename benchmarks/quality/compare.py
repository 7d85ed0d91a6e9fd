#!/usr/bin/env python3
"""Held-out bits/byte of olmax's main job (examples/train_lm, every block choice) against a PyTorch
nanoGPT-style baseline (nanogpt_baseline.py) on the same corpus, the same held-out split and
evaluation rows, the same wall-clock budget and the same thread count. Run through run.sh (which
finds the binaries and the venv); see docs/QUALITY.md.

Steps:
 1. `train_lm --dry_run` with the run's flags, for each block: train_lm's resolved config (data,
    seed, held_out_fraction, batch, sequence).
 2. `dump_split` with those settings: the split and evaluation rows train_lm uses (by the same
    library calls), and split.json with counts and fingerprints. The counts train_lm prints are
    checked against it (documents, bytes, held-out documents and bytes); a mismatch is an error.
 3. The PyTorch baseline on the default block's split, for each mode in TORCH_MODES (recipe: nanoGPT's
    max_iters 2000 or the budget, whichever ends first; fill: cosine over the whole budget;
    fill_compiled: fill with torch.compile, compiled before the clock starts).
 4. train_lm for each block: with --time_budget_s when train_lm has that flag, otherwise with a
    step count calibrated from a short run (steps = measured steps/s x budget); --eval_batches large
    enough to score every held-out evaluation row once, only at the end.
With --eval_every_s, both systems also evaluate on the whole held-out part every so many seconds of
training (train_lm: every N steps, N from a calibration run's rate; its evaluations are not counted
as training time, nor are the baseline's): each run's curve gives the training seconds to reach
--target_bits (interpolated between evaluations).
One JSON per run in the output folder, then a markdown table.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

HUGE = 10**12  # train_lm's largest step count: "never" for eval_every / checkpoint_every


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def loadavg():
    return list(os.getloadavg())


def run(cmd, log_path, check=True):
    """Runs cmd, its output teed into log_path; returns (stdout text, seconds)."""
    print("+ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    seconds = time.perf_counter() - start
    with open(log_path, "w") as f:
        f.write(proc.stdout)
    if check and proc.returncode != 0:
        sys.exit(f"compare: {cmd[0]} exited with {proc.returncode}; its output is in {log_path}:\n{proc.stdout[-3000:]}")
    return proc.stdout, seconds


def train_lm_flags(help_text):
    """{flag: (default, choices)} from `train_lm --help`."""
    flags = {}
    for line in help_text.splitlines():
        m = re.match(r"\s+--(\w+)=(\S*)\s+(.*)$", line)
        if m:
            choices = re.search(r"\(([\w|-]+)\)\s*$", m.group(3))
            flags[m.group(1)] = (m.group(2), choices.group(1).split("|") if choices and "|" in choices.group(1) else [])
    return flags


def resolved_config(text):
    """The `key = value` lines train_lm prints under '# resolved config'."""
    config, inside = {}, False
    for line in text.splitlines():
        if line.startswith("# resolved config"):
            inside = True
            continue
        if inside:
            m = re.match(r"(\w+) = (.*)$", line)
            if not m:
                break
            value = m.group(2)
            config[m.group(1)] = value[1:-1] if value.startswith('"') and value.endswith('"') else value
    return config


def parse_count(text):
    """'57.1k' -> 57100."""
    scale = {"k": 1e3, "M": 1e6}.get(text[-1], 1)
    return float(text[:-1] if text[-1] in "kM" else text) * scale


def parse_seconds(text):
    """'1m05s' / '42s' / '1h02m' -> seconds."""
    total = 0
    for value, unit in re.findall(r"(\d+)([hms])", text):
        total += int(value) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def progress_lines(text):
    """[(step, total, tok/s, elapsed s)] from train_lm's plain progress lines."""
    out = []
    for m in re.finditer(r"^step (\d+)/(\d+)\s+loss \S+\s+(\S+) tok/s\s+elapsed (\S+)", text, re.M):
        out.append((int(m.group(1)), int(m.group(2)), parse_count(m.group(3)), parse_seconds(m.group(4))))
    return out


def time_to_target(curve, target):
    """Training seconds at which the held-out bits/byte first reach `target`, linear between evaluations
    (None if never)."""
    before = None
    for point in curve:
        if point["bits_per_byte"] <= target:
            if before is None or before["bits_per_byte"] <= point["bits_per_byte"]:
                return point["train_seconds"]
            frac = (before["bits_per_byte"] - target) / (before["bits_per_byte"] - point["bits_per_byte"])
            return before["train_seconds"] + frac * (point["train_seconds"] - before["train_seconds"])
        before = point
    return None


def check_split(text, split, where):
    """The counts train_lm printed against split.json."""
    m = re.search(r"^corpus .*: (\d+) files, (\d+) documents, (\d+) bytes; held out (?:(\d+) documents \((\d+) bytes\)|the last (\d+) bytes)",
                  text, re.M)
    if not m:
        sys.exit(f"compare: no 'corpus ...: held out ...' line in {where}; cannot verify the split")
    files, docs, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
    held_docs = int(m.group(4)) if m.group(4) else 1
    held_bytes = int(m.group(5) or m.group(6))
    got = (files, docs, total, held_docs, held_bytes)
    want = (split["files"], split["documents"], split["corpus_bytes"], split["held_out_documents"], split["held_out_bytes"])
    if got != want:
        sys.exit(f"compare: train_lm's split {got} differs from dump_split's {want} (files, documents, bytes, held-out documents, "
                 f"held-out bytes); see {where}")
    return {"files": files, "documents": docs, "corpus_bytes": total, "held_out_documents": held_docs, "held_out_bytes": held_bytes}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train_lm", required=True)
    p.add_argument("--dump_split", required=True)
    p.add_argument("--torch_python", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--budget_s", type=float, default=300)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--blocks", default="", help="comma/space separated; empty: every --block choice train_lm lists (or its one model); "
                                                 "none: only the baseline")
    p.add_argument("--torch_modes", default="recipe fill")
    p.add_argument("--torch_block_size", type=int, default=64,
                   help="the baseline's context (nanoGPT's block_size; its recipe's is 64); it is evaluated on rows of "
                        "min(this, the first olmax block's sequence) bytes")
    p.add_argument("--data", default="")
    p.add_argument("--extra", default="", help="more train_lm flags, space separated (e.g. --preset=small)")
    p.add_argument("--calibration_steps", type=int, default=400)
    p.add_argument("--eval_every_s", type=float, default=0.0, help="evaluate every this many seconds of training too (0: only at the end)")
    p.add_argument("--target_bits", type=float, default=2.6, help="the held-out bits/byte whose time to reach is reported")
    p.add_argument("--corpus_name", default="", help="the corpus's name in the JSON (default: the data path, or fortunes)")
    p.add_argument("--command", default="", help="the command that ran this comparison, recorded in every JSON")
    a = p.parse_args()
    corpus = a.corpus_name or (os.path.basename(os.path.normpath(a.data)) if a.data else "fortunes")
    os.makedirs(a.out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    cpu, load_start = cpu_model(), loadavg()

    help_text, _ = run([a.train_lm, "--help"], os.path.join(a.out, "train_lm-help.txt"))
    flags = train_lm_flags(help_text)
    has_budget = "time_budget_s" in flags
    blocks = a.blocks.replace(",", " ").split()
    # "none": the baseline alone, on the rows of train_lm's default block with the run's flags
    baseline_only = blocks == ["none"]
    if baseline_only:
        if not a.torch_modes.split():
            sys.exit("compare: BLOCKS=none runs only the baseline, but TORCH_MODES is empty: nothing to run")
        blocks = ["default"]
    if not blocks:
        blocks = flags["block"][1] or [flags["block"][0]] if "block" in flags else ["default"]
    if "block" not in flags and blocks != ["default"]:
        sys.exit(f"compare: train_lm has no --block flag; cannot run blocks {blocks} (leave BLOCKS empty)")
    common = [f"--threads={a.threads}", "--resume=false", "--plot=false", "--sample_bytes=0", f"--eval_every={HUGE}",
              f"--checkpoint_every={HUGE}"] + ([f"--data={a.data}"] if a.data else []) + a.extra.split()

    def block_flags(block):
        return [] if block == "default" else [f"--block={block}"]

    # 1-2: resolved config and split of every block
    splits, block_cfg = {}, {}
    for block in blocks:
        text, _ = run([a.train_lm, *common, *block_flags(block), "--dry_run=true", f"--checkpoint_dir={a.out}/dry-run"],
                      os.path.join(a.out, f"olmax-{block}-dry-run.txt"))
        cfg = resolved_config(text)
        key = (cfg["data"], cfg["seed"], cfg["held_out_fraction"], cfg["batch"], cfg["sequence"])
        if key not in splits:
            d = os.path.join(a.out, f"split-b{cfg['batch']}-s{cfg['sequence']}-seed{cfg['seed']}-f{cfg['held_out_fraction']}")
            run([a.dump_split, f"--out={d}", f"--held_out_fraction={cfg['held_out_fraction']}", f"--seed={cfg['seed']}",
                 f"--batch={cfg['batch']}", f"--sequence={cfg['sequence']}"] + ([f"--data={cfg['data']}"] if cfg["data"] else []),
                d + ".log")
            with open(os.path.join(d, "split.json")) as f:
                splits[key] = (d, json.load(f))
        check_split(text, splits[key][1], os.path.join(a.out, f"olmax-{block}-dry-run.txt"))
        block_cfg[block] = (cfg, key)
    # The baseline's rows: the first block's split and evaluation batch, rows of at most its block_size
    # (64 unless --torch_block_size) bytes; an olmax block with other rows is marked in the table.
    cfg0 = block_cfg[blocks[0]][0]
    base_key = (cfg0["data"], cfg0["seed"], cfg0["held_out_fraction"], cfg0["batch"], str(min(int(cfg0["sequence"]), a.torch_block_size)))
    if base_key not in splits:
        d = os.path.join(a.out, f"split-b{base_key[3]}-s{base_key[4]}-seed{base_key[1]}-f{base_key[2]}")
        run([a.dump_split, f"--out={d}", f"--held_out_fraction={base_key[2]}", f"--seed={base_key[1]}", f"--batch={base_key[3]}",
             f"--sequence={base_key[4]}"] + ([f"--data={base_key[0]}"] if base_key[0] else []), d + ".log")
        with open(os.path.join(d, "split.json")) as f:
            splits[base_key] = (d, json.load(f))
    base_dir, base_split = splits[base_key]

    results = []
    # 3: the PyTorch baseline
    for mode in a.torch_modes.split():
        path = os.path.join(a.out, f"pytorch-nanogpt-{mode}.json")
        if mode not in ("recipe", "fill", "fill_compiled"):
            sys.exit(f"compare: unknown torch mode '{mode}' (recipe, fill, fill_compiled)")
        cmd = [a.torch_python, os.path.join(here, "nanogpt_baseline.py"), "--split", base_dir, "--threads", str(a.threads),
               "--time_budget_s", str(a.budget_s), "--json", path, "--eval_every_s", str(a.eval_every_s),
               "--block_size", str(a.torch_block_size)]
        cmd += (["--fill_budget"] if mode.startswith("fill") else []) + (["--compile"] if mode.endswith("compiled") else [])
        run(cmd, os.path.join(a.out, f"pytorch-nanogpt-{mode}.log"))
        with open(path) as f:
            r = json.load(f)
        r["mode"] = mode
        r["run_command"] = " ".join(cmd)
        r["eval_rows_match_baseline"] = True
        with open(path, "w") as f:
            json.dump(r, f, indent=1)
        results.append(r)

    # 4: olmax, every block
    for block in [] if baseline_only else blocks:
        cfg, key = block_cfg[block]
        split_dir, split = splits[key]
        tokens_per_step = int(cfg["batch"]) * int(cfg["sequence"]) * int(cfg.get("grad_accumulation", 1))
        eval_flag = f"--eval_batches={split['eval_batches'] + 1}"  # + 1: the loader's end is reached, every row scored
        note = ""
        eval_every = HUGE
        if has_budget:
            steps = HUGE
            extra = [f"--time_budget_s={a.budget_s:g}"]
            note = "train_lm --time_budget_s"
            if a.eval_every_s > 0:  # evaluations every so many steps, from a short run's rate
                cal = a.calibration_steps
                text, _ = run([a.train_lm, *common, *block_flags(block), f"--steps={cal}", f"--log_every={max(1, cal // 4)}",
                               "--eval_batches=1", f"--checkpoint_dir={a.out}/olmax-{block}-calibration"],
                              os.path.join(a.out, f"olmax-{block}-calibration.txt"))
                reported = re.search(r"^trained \d+ tokens in [\d.]+ s of training steps \(([\d.]+) tokens/s", text, re.M)
                rate = float(reported.group(1)) if reported else progress_lines(text)[-1][2]
                eval_every = max(1, int(rate * a.eval_every_s / tokens_per_step))
        else:
            cal = a.calibration_steps
            text, _ = run([a.train_lm, *common, *block_flags(block), f"--steps={cal}", f"--log_every={max(1, cal // 4)}",
                           "--eval_batches=1", f"--checkpoint_dir={a.out}/olmax-{block}-calibration"],
                          os.path.join(a.out, f"olmax-{block}-calibration.txt"))
            lines = [l for l in progress_lines(text) if l[0] < cal]
            rate = lines[-1][2]  # cumulative tokens/s before the final evaluation
            steps = max(1, int(rate * a.budget_s / tokens_per_step))
            extra = []
            note = f"no --time_budget_s in train_lm: steps calibrated from a {cal}-step run at {rate:.0f} tokens/s"
        log_every = 50 if has_budget else max(1, steps // 40)  # progress lines give tokens/s and training time
        load0 = loadavg()
        cmd = [a.train_lm, *common, *block_flags(block), f"--steps={steps}", f"--log_every={log_every}", eval_flag,
               f"--checkpoint_dir={a.out}/olmax-{block}-run", *extra] + ([f"--eval_every={eval_every}"] if eval_every < HUGE else [])
        text, seconds = run(cmd, os.path.join(a.out, f"olmax-{block}.txt"))
        verified = check_split(text, split, os.path.join(a.out, f"olmax-{block}.txt"))
        evals = re.findall(r"^step (\d+): held-out loss ([\d.]+) nats/byte", text, re.M)
        params = re.search(r"^model: .*, (\d+) parameters", text, re.M)
        lines = progress_lines(text)
        last_step = int(evals[-1][0]) if evals else (lines[-1][0] if lines else 0)
        before_eval = [l for l in lines if l[0] < last_step]
        # The progress line at the last step is printed after the final evaluation; the one before
        # it is not: training seconds extrapolated from it.
        train_s = before_eval[-1][3] * last_step / before_eval[-1][0] if before_eval and before_eval[-1][3] > 0 else float("nan")
        rate = before_eval[-1][2] if before_eval else float("nan")
        # train_lm's own summary (newer builds): the seconds of training steps, measured.
        reported = re.search(r"^trained (\d+) tokens in ([\d.]+) s (?:of training steps|without evaluations) \(([\d.]+) tokens/s", text, re.M)
        if reported:
            train_s, rate = float(reported.group(2)), float(reported.group(3))
        nats = float(evals[-1][1]) if evals else float("nan")
        # The periodic evaluations' training seconds: the step's share of the run's measured steps time.
        curve = [{"train_seconds": int(n) * train_s / last_step, "tokens": int(n) * tokens_per_step, "bits_per_byte": float(v) / math.log(2)}
                 for n, v in evals] if last_step > 0 else []
        r = {
            "system": "olmax train_lm", "block": block, "params": int(params.group(1)) if params else None, "threads": a.threads,
            "steps": last_step, "tokens": last_step * tokens_per_step, "tokens_per_s": rate, "train_seconds": train_s,
            "process_seconds": seconds, "budget_s": a.budget_s, "budget_method": note,
            "train_lm_summary_line": reported.group(0) if reported else None,
            "held_out_nats_per_byte": nats, "held_out_bits_per_byte": nats / math.log(2),
            "eval_context": f"rows of {cfg['sequence']} bytes (first input: the byte that ended the previous row), batch {cfg['batch']}",
            "eval_rows_match_baseline": split_dir == base_dir, "split_checked_against_train_lm": verified, "split": split,
            "resolved_config": cfg, "cpu_model": cpu, "load_average_start": load0, "load_average_end": loadavg(),
            "run_command": " ".join(cmd), "curve": curve,
            "curve_note": "training seconds of each evaluation: its step x the run's mean seconds per step",
        }
        if not evals:
            r["error"] = "train_lm printed no held-out loss line (a budget-stopped run must still evaluate at its end)"
        with open(os.path.join(a.out, f"olmax-{block}.json"), "w") as f:
            json.dump(r, f, indent=1)
        results.append(r)

    # The issue-54 fields, the same in every JSON: system, block, corpus, budget_s, threads, cpu,
    # tokens_per_s, bits_per_byte, parameters, command; and the time to the target.
    for r in results:
        r.update({"corpus": corpus, "budget_s": a.budget_s, "threads": a.threads, "cpu": r["cpu_model"], "bits_per_byte": r["held_out_bits_per_byte"],
                  "parameters": r["params"], "command": a.command or r.get("run_command", ""), "target_bits_per_byte": a.target_bits,
                  "time_to_target_s": time_to_target(r.get("curve", []), a.target_bits)})
        if r["system"] == "pytorch-nanogpt":
            r["system"] = f"pytorch-nanogpt ({r['mode']})"
            name = f"pytorch-nanogpt-{r['mode']}.json"
        else:
            name = f"olmax-{r['block']}.json"
        with open(os.path.join(a.out, name), "w") as f:
            json.dump(r, f, indent=1)

    # table
    load_end = loadavg()
    print(f"\nCorpus {base_split['corpus']}: {base_split['documents']} documents, {base_split['corpus_bytes']} bytes; held out "
          f"{base_split['held_out_documents']} documents ({base_split['held_out_bytes']} bytes, fingerprint "
          f"{base_split['held_out_fingerprint']}), scored as {base_split['eval_real_targets']} targets in "
          f"{base_split['eval_batches']} batches of {base_split['eval_batch']} x {base_split['eval_sequence']} bytes. "
          f"Budget {a.budget_s:g} s, {a.threads} threads. CPU: {cpu}. Load average {load_start} at start, {load_end} at end.\n")
    print(f"| system | block | parameters | tokens/s | wall-clock (train) s | steps | held-out bits/byte | s to {a.target_bits:g} | CPU | load avg (1/5/15) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        name = r["system"] + (f" ({r['framework']})" if "framework" in r else "")
        steps = r.get("iters", r.get("steps"))
        mark = "" if r.get("eval_rows_match_baseline", True) else " (other eval rows)"
        load = "/".join(f"{x:.2f}" for x in r["load_average_start"])
        reach = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
        print(f"| {name} | {r['block']} | {r['params']} | {r['tokens_per_s']:.0f} | {r['train_seconds']:.1f} | {steps} | "
              f"{r['held_out_bits_per_byte']:.4f}{mark} | {reach} | {r['cpu_model']} | {load} |")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"corpus": corpus, "command": a.command, "cpu_model": cpu, "load_average_start": load_start, "load_average_end": load_end, "budget_s": a.budget_s,
                   "threads": a.threads, "train_lm_has_time_budget_s": has_budget, "results": results}, f, indent=1)
    print(f"\nwrote {a.out}/*.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
